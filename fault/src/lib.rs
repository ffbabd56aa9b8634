//! A Jepsen-style fault-injection harness for `lock_runtime`, with a
//! mutual-exclusion checker.
//!
//! * [`worker`]: a client process that repeatedly takes a lock and does a slow
//!   read-modify-write of a shared record, logging every step ([`log`]).
//! * [`store`]: the record, on a redis-server of its own: exclusive reads and
//!   writes fenced by `lock_runtime::fence::redis`, shared reads by a Lua
//!   script against the highest exclusive token (or, to prove the checker,
//!   neither).
//! * [`postgres`]: the same record in PostgreSQL, fenced by
//!   `lock_runtime::fence::postgres` (or, to prove the checker, not).
//! * [`scenario`]: the scenarios and the harness that runs one: it starts the
//!   servers, re-executes the `fault` binary as the workers, injects the fault
//!   (SIGSTOP/SIGKILL of a holder, SIGSTOP/kill -9 of redis-server,
//!   `CLIENT KILL`), then runs the checker.
//! * [`checker`]: reads the logs and the store and counts violations.
//! * [`kind`]: which synchronizer the workers take (a mutex, a read-write
//!   lock, a semaphore, `hold_at_least`, `lock_all`) and what the checker
//!   allows of each.
//! * [`orders`]: exactly once across crashes: the example order service's
//!   instances SIGKILLed under retrying clients, and the count of orders
//!   per key at the end.
//!
//! Run everything with `cargo run --release -p fault -- all --ops 10000`
//! (see FAULTS.md at the repository root); CI runs short versions as tests.

pub mod checker;
pub mod kind;
pub mod log;
pub mod orders;
pub mod postgres;
pub mod record;
pub mod rng;
pub mod scenario;
pub mod server;
pub mod spread;
pub mod store;
pub mod timeline;
pub mod worker;
