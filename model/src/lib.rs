//! A model-checked lock protocol: the Lua scripts and the client's state
//! machine of `lock-runtime`, explored over every interleaving of clients,
//! Redis, expiry, crashes, pauses and lost messages with
//! [stateright](https://docs.rs/stateright).
//!
//! * [`lock`]: one Redis server: the plain `SET NX` and compare-and-delete
//!   of the uncontended path, the acquire / extend / mint / release scripts
//!   with the waiter queue, the owner's deadline in the key's value and the
//!   pin that keeps the key while a line exists, hand-over leases and
//!   notices, and the fencing counter of the key's hash slot (which other
//!   keys raise too); the client's acquire steps (with the stale hand-over
//!   rule), watchdog, fencing token minted on first use and release
//!   outcomes; tasks of one process in line, handing the lease on
//!   with fencing tokens reserved by reserve.lua.
//! * [`shared`]: read-write locks and semaphores (shared.lua: a writer, a
//!   set of holders by lease end, a FIFO queue granted from its head with
//!   hand-over leases and notices) under the same client, with their
//!   exclusion, limit and FIFO properties.
//! * [`redlock`]: three masters, majority two, fencing by the quorum's highest
//!   counter.
//! * [`records`]: the idempotency record's claim / renew / complete / release,
//!   and with a commit store the look before a handler runs and the work
//!   committed with its record in one step (exactly once across crashes);
//!   with the lock server as the store (`commit_on_lock_server`), no look,
//!   and the work's writes committed in the record itself, which that one
//!   step completes (idempotency_commit_record.lua).
//! * [`scripts`]: the scripts mirrored, with the hash each model was written
//!   against (a test fails when a script changes without the model).
//! * [`check`]: running a check and printing counterexamples as traces.
//!
//! A step of a script is cited by the script's file and a quoted fragment
//! of the step's comment or command that occurs exactly once in it, as in
//! acquire.lua, "Ours already", never by line number (tests/scripts.rs
//! checks both).
//!
//! `cargo test -p model` runs the CI configurations; `cargo run --release
//! -p model -- --exhaustive` the larger ones (see FAULTS.md, "What is
//! model-checked").

pub mod check;
pub mod configs;
pub mod lock;
pub mod records;
pub mod redlock;
pub mod reply;
pub mod scripts;
pub mod shared;
