//! The configurations CI checks (`cargo test -p model`) and the longer
//! exhaustive ones (`cargo run --release -p model -- --exhaustive`).

use crate::lock::{Faults, LockConfig};
use crate::records::{RecordsConfig, StoreConfig};
use crate::redlock::RedlockConfig;
use crate::shared::Mode;

/// Two clients waiting 4 ticks; every fault kind possible, at most two in a
/// run.
pub fn lock_two_clients_two_faults() -> LockConfig {
    LockConfig::new(2, 4, Faults::each_once(2))
}

/// Two clients waiting 4 ticks, one pause: a holder paused past its lease
/// asks for its fencing token when it resumes (the Kleppmann case).
pub fn lock_two_clients_one_pause() -> LockConfig {
    LockConfig::new(
        2,
        4,
        Faults {
            pause: 1,
            total: 1,
            ..Faults::NONE
        },
    )
}

/// Three clients, no faults.
pub fn lock_three_clients_no_faults() -> LockConfig {
    LockConfig::new(3, 4, Faults::NONE)
}

/// The smallest configuration that shows the stale hand-over grant (see
/// FAULTS.md), fixed in commit 18d4a5a: three clients starting together,
/// one pause. With [`LockConfig::check_stale_grants`] off (the client before
/// the fix) it finds the counterexample.
pub fn lock_three_clients_one_pause() -> LockConfig {
    let mut cfg = LockConfig::new(
        3,
        4,
        Faults {
            pause: 1,
            total: 1,
            ..Faults::NONE
        },
    );
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg
}

/// Three clients starting together, holding at most a tick, one crash; A
/// and C wait 4 ticks, B one. A holder that dies with two clients queued
/// behind it (its lease runs out: the key goes to the head of the line, as
/// the crashed holder), and a waiter that dies in line (its entry is
/// skipped once its wait is over, so it cannot stall the line). With
/// [`LockConfig::fifo_on_expiry`] or [`LockConfig::skip_ended_waits`] off
/// (the scripts before commit 7dbf470) the model finds the overtaking and
/// the stalled line.
pub fn lock_three_clients_one_crash() -> LockConfig {
    let mut cfg = LockConfig::new(3, 4, Faults::ONE_CRASH);
    cfg.waits[1] = 1;
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg
}

/// Exhaustive: [`lock_three_clients_one_crash`] with every fault kind
/// possible, one in a run (a lost request, reply or notice, or a pause,
/// around an expiry with a line behind it).
pub fn lock_three_clients_one_fault_one_waiting_a_tick() -> LockConfig {
    let mut cfg = lock_three_clients_one_crash();
    cfg.faults = Faults::each_once(1);
    cfg
}

/// Exhaustive: two clients waiting 4 ticks and a try-once newcomer (C),
/// starting by tick 3, holds of a tick, one crash: a newcomer that comes
/// after a dead holder's lease ran out finds the key still there, pinned by
/// the line (its plain `SET NX` answers nil), and acquire.lua hands it to
/// the head of the line and answers the newcomer busy. With
/// [`LockConfig::line_pins_key`] off the model finds the newcomer's `SET
/// NX` passing the line.
pub fn lock_two_waiters_and_a_try_once_newcomer_one_crash() -> LockConfig {
    let mut cfg = lock_three_clients_one_crash();
    cfg.waits = vec![4, 4, 0];
    cfg.start_by = 3;
    cfg
}

/// Two clients; every fault kind possible, at most one in a run; another key
/// of the slot takes a token once, anywhere between this key's round trips
/// (a gap in this key's tokens, and a re-entered acquire answering a counter
/// above the token it was issued).
pub fn lock_two_clients_one_fault_other_key() -> LockConfig {
    let mut cfg = LockConfig::new(2, 4, Faults::each_once(1));
    cfg.other_keys = 1;
    cfg
}

/// Exhaustive: [`lock_three_clients_one_pause`] with another key of the slot
/// taking a token once.
pub fn lock_three_clients_one_pause_other_key() -> LockConfig {
    let mut cfg = lock_three_clients_one_pause();
    cfg.other_keys = 1;
    cfg
}

/// Exhaustive: three clients, every fault kind possible, one in a run.
pub fn lock_three_clients_one_fault() -> LockConfig {
    LockConfig::new(3, 4, Faults::each_once(1))
}

/// Redlock: two clients, two lost messages and a pause.
pub fn redlock_two_clients() -> RedlockConfig {
    RedlockConfig {
        clients: 2,
        ttl: 3,
        faults: 2,
        pauses: 1,
        pause_len: 4,
    }
}

/// Redlock exhaustive: three clients.
pub fn redlock_three_clients() -> RedlockConfig {
    RedlockConfig {
        clients: 3,
        ..redlock_two_clients()
    }
}

/// Idempotency records: two requests, two faults, each request sent again
/// once by its client after a 409 or a failure.
pub fn records_two_requests() -> RecordsConfig {
    RecordsConfig {
        requests: 2,
        lease: 2,
        run_max: 3,
        faults: 2,
        pause_len: 3,
        retries: 1,
        store: None,
    }
}

/// Idempotency records committed with their work in a commit store (as
/// `commit_with_redis`, `commit_with_postgres` and the layer's `Commit` use
/// it): two requests, two faults (a crash between the commit and the
/// record's completion, a pause past the lease before the commit, lost
/// replies of the look and the commit), each request sent again once by
/// its client after a 409 or a failure.
pub fn records_two_requests_commit_store() -> RecordsConfig {
    RecordsConfig {
        store: Some(StoreConfig::TODAY),
        ..records_two_requests()
    }
}

/// Idempotency records committed with their work on the lock server itself
/// (`commit_on_lock_server`: the record is the committed copy, no look
/// before the handler, no completion after the commit), as
/// [`records_two_requests_commit_store`]: two requests, two faults, each
/// sent again once by its client after a 409 or a failure.
pub fn records_two_requests_commit_on_lock_server() -> RecordsConfig {
    RecordsConfig {
        store: Some(StoreConfig::LOCK_SERVER),
        ..records_two_requests()
    }
}

/// Idempotency records exhaustive: three requests, three faults, no
/// retries (with a retry each, the check had not ended after 2 minutes).
pub fn records_three_requests() -> RecordsConfig {
    RecordsConfig {
        requests: 3,
        faults: 3,
        retries: 0,
        ..records_two_requests()
    }
}

/// Records with a commit store exhaustive: two requests, three faults.
pub fn records_two_requests_three_faults_commit_store() -> RecordsConfig {
    RecordsConfig {
        faults: 3,
        ..records_two_requests_commit_store()
    }
}

/// Exhaustive: two tasks of one process (A and B, one line) and a client
/// of another process (C), no faults: local hand-overs, and a release to
/// the server's queue when C queued first (reserve.lua answers 0).
pub fn lock_line_of_two_and_another_process() -> LockConfig {
    let mut cfg = LockConfig::new(3, 4, Faults::NONE);
    cfg.process = vec![0, 0, 1];
    cfg
}

/// [`lock_line_of_two_and_another_process`] with the three starting
/// together, holding at most a tick, and C waiting a tick (for CI).
pub fn lock_line_of_two_and_another_process_starting_together() -> LockConfig {
    let mut cfg = lock_line_of_two_and_another_process();
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg.waits[2] = 1;
    cfg
}

/// Two tasks of one process (one line): every fault kind possible, at most
/// `faults` in a run (a crash or a pause is the process's).
pub fn lock_line_of_two(faults: u8) -> LockConfig {
    let mut cfg = LockConfig::new(2, 4, Faults::each_once(faults));
    cfg.process = vec![0, 0];
    cfg
}

/// Exhaustive: [`lock_line_of_two_and_another_process`] with every fault
/// kind possible, one in a run.
pub fn lock_line_of_two_and_another_process_one_fault() -> LockConfig {
    let mut cfg = lock_line_of_two_and_another_process();
    cfg.faults = Faults::each_once(1);
    cfg
}

/// A read-write lock: a reader, a writer and a reader, starting together
/// and holding at most a tick; no faults. Readers share, the writer waits
/// for them, and a reader that comes while the writer waits queues behind
/// it (FIFO).
pub fn rw_reader_writer_reader() -> LockConfig {
    let mut cfg = LockConfig::new_shared(
        vec![Mode::Read, Mode::Write, Mode::Read],
        0,
        4,
        Faults::NONE,
    );
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg
}

/// [`rw_reader_writer_reader`] with one pause: a paused waiter's grant
/// runs out, and the stale hand-over is ignored (as for a mutex, see
/// [`lock_three_clients_one_pause`]).
pub fn rw_reader_writer_reader_one_pause() -> LockConfig {
    let mut cfg = rw_reader_writer_reader();
    cfg.faults = Faults {
        pause: 1,
        total: 1,
        ..Faults::NONE
    };
    cfg
}

/// Exhaustive: [`rw_reader_writer_reader`] with every fault kind possible,
/// one in a run.
pub fn rw_reader_writer_reader_one_fault() -> LockConfig {
    let mut cfg = rw_reader_writer_reader();
    cfg.faults = Faults::each_once(1);
    cfg
}

/// Exhaustive: a reader, a writer and a reader starting by tick 1 and
/// holding up to two ticks; no faults.
pub fn rw_reader_writer_reader_longer() -> LockConfig {
    LockConfig::new_shared(
        vec![Mode::Read, Mode::Write, Mode::Read],
        0,
        4,
        Faults::NONE,
    )
}

/// A read-write lock: two writers, one pause. A writer takes the free lock
/// without a token and is paused past its lease; on resuming it asks for
/// its token (the Kleppmann case, on shared.lua).
pub fn rw_two_writers_one_pause() -> LockConfig {
    LockConfig::new_shared(
        vec![Mode::Write, Mode::Write],
        0,
        4,
        Faults {
            pause: 1,
            total: 1,
            ..Faults::NONE
        },
    )
}

/// A read-write lock: a writer and a reader; every fault kind possible, at
/// most `faults` in a run.
pub fn rw_writer_and_reader(faults: u8) -> LockConfig {
    LockConfig::new_shared(
        vec![Mode::Write, Mode::Read],
        0,
        4,
        Faults::each_once(faults),
    )
}

/// A semaphore of two permits and three takers, starting together and
/// holding at most a tick; every fault kind possible, at most `faults` in a
/// run.
pub fn semaphore_three_takers_of_two(faults: u8) -> LockConfig {
    let mut cfg = LockConfig::new_shared(vec![Mode::Permit; 3], 2, 4, Faults::each_once(faults));
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg
}

/// A semaphore of one permit and three takers starting together, holding
/// at most a tick, one crash; A and C wait 4 ticks, B one: a waiter that
/// dies in line has its entry skipped once its wait is over, as a mutex's
/// (shared.lua, "if who ~= token and ends and tonumber(ends) <= now then"). With
/// [`LockConfig::skip_ended_waits`] off the model finds a permit handed to
/// the dead waiter.
pub fn semaphore_one_permit_one_crash() -> LockConfig {
    let mut cfg = LockConfig::new_shared(vec![Mode::Permit; 3], 1, 4, Faults::ONE_CRASH);
    cfg.waits[1] = 1;
    cfg.start_by = 0;
    cfg.hold_max = 1;
    cfg
}
