//! One lock operation of a worker, for each synchronizer [`Kind`]: take the
//! lock, touch the record in the store, think, release, logging every step.
//!
//! * a mutex, `hold_at_least`, a read-write lock's writer: a fenced
//!   read-modify-write of the record ([`exclusive`]);
//! * a read-write lock's reader, a semaphore's holder: a shared read, think,
//!   an exit, both in the store's access log ([`shared`]);
//! * `lock_all`: a fenced read-modify-write of each key's record with that
//!   key's own token ([`all`]);
//! * a mutex whose token is asked for after the think (the lazy token's
//!   scenario): the grant, think, the token, then the fenced read and write
//!   ([`token_after_think`]).

use lock_runtime::{LockAllGuard, LockError, LockGuard};

use super::{TokenTiming, Worker, ms};
use crate::kind::{Kind, Side};
use crate::log::{Event, ReleaseOutcome, WriteOutcome};
use crate::store::{ReadResult, WriteResult};

use super::acquiring::{acquire, attempt, granted, request};

/// Draws a key (and, for a read-write lock, a side) and does one operation.
pub(super) async fn one_operation(w: &mut Worker, op: u64) {
    let kind = w.config.kind;
    if let Kind::All { keys } = kind {
        return all(w, op, keys).await;
    }
    let key = pick_key(w);
    match kind {
        Kind::Rw { reads_per_mille } if w.rng.chance(reads_per_mille) => {
            shared(w, op, key, Some(Side::Read)).await
        }
        Kind::Rw { .. } => exclusive(w, op, key, Some(Side::Write)).await,
        Kind::Semaphore { .. } => shared(w, op, key, None).await,
        _ => exclusive(w, op, key, None).await,
    }
}

fn pick_key(w: &mut Worker) -> String {
    let (home, affinity) = w.config.affinity;
    let index = if affinity > 0 && w.rng.chance(affinity) {
        home
    } else {
        w.rng.range(0, w.config.keys.len() as u64 - 1)
    };
    w.config.keys[index as usize].clone()
}

/// Logs the attempt on `key`, acquires it (one lock of any kind) and logs
/// the grant: the guard and its fencing token, or `None` (logged).
async fn acquire_one(
    w: &mut Worker,
    op: u64,
    key: &str,
    side: Option<Side>,
) -> Option<(LockGuard, u64)> {
    if w.config.try_once_per_mille.is_some() {
        return super::fifo::acquire_one(w, op, key).await;
    }
    let started = attempt(w, op, &[key.to_owned()], side);
    let guard = acquire(w, op, started, |w, left| {
        request(w, key, side).wait(left).acquire()
    })
    .await?;
    granted(w, op, guard).await
}

/// A mutex, `hold_at_least` or a writer: fenced read, think, fenced write of
/// `counter + 1`, release.
async fn exclusive(w: &mut Worker, op: u64, key: String, side: Option<Side>) {
    if w.config.token != TokenTiming::AtGrant {
        return token_after_think(w, op, key, side).await;
    }
    let Some((guard, fence)) = acquire_one(w, op, &key, side).await else {
        return;
    };
    let Some((version, counter)) = read(w, op, &key, None, fence, false).await else {
        release(w, op, Release::One(guard)).await;
        return;
    };
    think(w, op, &guard).await;
    write(w, op, &key, None, fence, &guard, (version, counter)).await;
    release(w, op, Release::One(guard)).await;
}

/// The lazy token (Kleppmann's paused holder): the grant logged without a
/// token, the strike mark set, think (the pause that a `SIGSTOP` stretches
/// past the lease), and only then the token, asked of the guard
/// ([`TokenTiming::AfterThink`]: minted now, if the lock was taken on the
/// plain path, by a step that checks the lease) or minted by the worker
/// itself ([`TokenTiming::Unchecked`], the control). With a token, a fenced
/// read and a fenced write; a token refused ends the operation without
/// touching the record, as it would end an application's.
async fn token_after_think(w: &mut Worker, op: u64, key: String, side: Option<Side>) {
    let started = attempt(w, op, std::slice::from_ref(&key), side);
    let Some(guard) = acquire(w, op, started, |w, left| {
        request(w, &key, side).wait(left).acquire()
    })
    .await
    else {
        return;
    };
    let t = w.clock.now();
    w.log(Event::Acquired {
        op,
        fence: 0,
        more_fences: vec![],
        t,
    });
    if let Err(e) = w.store.mark(&key).await {
        eprintln!("worker {}: store mark: {e}", w.id);
    }
    think(w, op, &guard).await;
    let sent = w.clock.now();
    let token = match w.config.token {
        TokenTiming::Unchecked => unchecked_token(w, &key).await,
        _ => guard.fencing_token().await,
    };
    let t = w.clock.now();
    let fence = match token {
        Ok(fence) => {
            w.log(Event::Token { op, fence, sent, t });
            Some(fence)
        }
        Err(e) => {
            w.log(Event::TokenRefused {
                op,
                lost: matches!(e, LockError::Lost { .. }),
                error: e.to_string(),
                sent,
                t,
            });
            None
        }
    };
    let read = match fence {
        Some(fence) => read(w, op, &key, None, fence, false).await,
        None => None,
    };
    match (fence, read) {
        (Some(fence), Some(record)) => {
            write(w, op, &key, None, fence, &guard, record).await;
        }
        // No write: the mark must not outlive the operation (the harness
        // would strike the worker's next one before it holds).
        _ => {
            if let Err(e) = w.store.unmark(&key).await {
                eprintln!("worker {}: store unmark: {e}", w.id);
            }
        }
    }
    release(w, op, Release::One(guard)).await;
}

/// The control's token: the next value of the key's fencing counter on the
/// lock server, `INCR`ed with no look at the lease, which is what mint.lua
/// would hand out without its check.
async fn unchecked_token(w: &mut Worker, key: &str) -> Result<u64, LockError> {
    let Some(conn) = &mut w.counters else {
        return Err(LockError::Config("no connection to the lock server".into()));
    };
    redis::cmd("INCR")
        .arg(lock_runtime::__private::testing::fence_counter(
            "lock:", key,
        ))
        .query_async(conn)
        .await
        .map_err(|e| LockError::Config(format!("INCR of the fencing counter: {e}")))
}

/// A reader or a semaphore's holder: shared read (the entry), think, exit,
/// release.
async fn shared(w: &mut Worker, op: u64, key: String, side: Option<Side>) {
    let Some((guard, fence)) = acquire_one(w, op, &key, side).await else {
        return;
    };
    if read(w, op, &key, None, fence, true).await.is_some() {
        think(w, op, &guard).await;
        if let Err(e) = w.store.exit(&key, fence, op).await {
            eprintln!("worker {}: store exit: {e}", w.id);
        }
    }
    release(w, op, Release::One(guard)).await;
}

/// `lock_all`: `n` distinct keys in a random order; a fenced read of each
/// with its own token, think, a fenced write of each, release.
async fn all(w: &mut Worker, op: u64, n: usize) {
    let mut pool = w.config.keys.clone();
    let mut keys = Vec::new();
    while keys.len() < n.min(w.config.keys.len()) {
        let i = w.rng.range(0, pool.len() as u64 - 1) as usize;
        keys.push(pool.swap_remove(i));
    }
    let started = attempt(w, op, &keys, None);
    let Some(all) = acquire(w, op, started, |w, left| {
        w.client
            .lock_all(keys.clone())
            .ttl(ms(w.config.ttl_ms))
            .wait(left)
            .acquire()
    })
    .await
    else {
        return;
    };
    // The guards come in the order they were taken; log the tokens in
    // the order the attempt named the keys.
    let guard_of = |key: &str| all.guards().iter().position(|g| g.key() == key);
    let Some(order) = keys.iter().map(|k| guard_of(k)).collect::<Option<Vec<_>>>() else {
        eprintln!("worker {}: lock_all returned other keys than asked", w.id);
        release(w, op, Release::All(all)).await;
        return;
    };
    // The grant's time before the tokens are asked for (see `granted`).
    let t = w.clock.now();
    let mut fences: Vec<u64> = Vec::with_capacity(order.len());
    for &i in &order {
        match all.guards()[i].fencing_token().await {
            Ok(fence) => fences.push(fence),
            Err(e) => {
                let t = w.clock.now();
                w.log(Event::GaveUp {
                    op,
                    error: format!("no fencing token: {e}"),
                    t,
                });
                return;
            }
        }
    }
    w.log(Event::Acquired {
        op,
        fence: fences[0],
        more_fences: fences[1..].to_vec(),
        t,
    });
    let mut read_all = Vec::new();
    for (key, &fence) in keys.iter().zip(&fences) {
        match read(w, op, key, Some(key.clone()), fence, false).await {
            Some(record) => read_all.push(record),
            None => break,
        }
    }
    if read_all.len() == keys.len() {
        think(w, op, &all.guards()[order[0]]).await;
        for (((key, record), &i), &fence) in keys.iter().zip(read_all).zip(&order).zip(&fences) {
            let guard = &all.guards()[i];
            write(w, op, key, Some(key.clone()), fence, guard, record).await;
        }
    }
    release(w, op, Release::All(all)).await;
}

/// The fenced read (`shared`: a shared one), logged; `None` when refused.
async fn read(
    w: &mut Worker,
    op: u64,
    key: &str,
    logged_key: Option<String>,
    fence: u64,
    shared: bool,
) -> Option<(u64, u64)> {
    let read = if shared {
        w.store.shared_read(key, fence, op).await
    } else {
        w.store.read(key, fence, op).await
    };
    let t = w.clock.now();
    let (ok, version, counter) = match read {
        Ok(ReadResult::Ok { version, counter }) => (true, version, counter),
        other => {
            if let Err(e) = other {
                eprintln!("worker {}: store read: {e}", w.id);
            }
            (false, 0, 0)
        }
    };
    w.log(Event::Read {
        op,
        key: logged_key,
        ok,
        version,
        counter,
        t,
    });
    ok.then_some((version, counter))
}

/// The fenced write of `counter + 1` after reading `(version, counter)`,
/// with `guard`'s token `fence`, logged.
async fn write(
    w: &mut Worker,
    op: u64,
    key: &str,
    logged_key: Option<String>,
    fence: u64,
    guard: &LockGuard,
    (version, counter): (u64, u64),
) {
    // Write whatever `lost()` says: a real process may have been paused right
    // after checking it. Fencing has to make this harmless.
    let lost_before = guard.is_lost();
    let sent = w.clock.now();
    let write = w.store.write(key, fence, op, version, counter + 1).await;
    let t = w.clock.now();
    let (outcome, seq) = match write {
        Ok(WriteResult::Accepted(seq)) => (WriteOutcome::Accepted, seq),
        Ok(WriteResult::Rejected) => (WriteOutcome::Rejected, 0),
        Err(e) => {
            eprintln!("worker {}: store write: {e}", w.id);
            (WriteOutcome::Error, 0)
        }
    };
    w.log(Event::Write {
        op,
        key: logged_key,
        outcome,
        seq,
        lost_before,
        sent,
        t,
    });
}

/// The slow part of the read-modify-write: sleep, or (scenario 7) block the
/// runtime thread.
async fn think(w: &mut Worker, op: u64, guard: &LockGuard) {
    if w.config.block_per_mille > 0 && w.rng.chance(w.config.block_per_mille) {
        w.blocks += 1;
        let block = if w.blocks % 2 == 1 {
            w.config.block_keep_ms
        } else {
            w.config.block_lose_ms
        };
        // Blocks the only runtime thread: the watchdog cannot run either.
        std::thread::sleep(ms(block));
        let after = tokio::time::Instant::now();
        let lost_after_ms = if block > w.config.ttl_ms {
            match tokio::time::timeout(ms(2000), guard.lost()).await {
                Ok(()) => Some(after.elapsed().as_millis() as u64),
                Err(_) => None,
            }
        } else {
            // Let the watchdog catch up (a renewal round trip), then look.
            tokio::time::sleep(ms(w.config.ttl_ms / 10)).await;
            guard.is_lost().then(|| after.elapsed().as_millis() as u64)
        };
        let t = w.clock.now();
        w.log(Event::Blocked {
            op,
            ms: block,
            ttl_ms: w.config.ttl_ms,
            lost_after_ms,
            t,
        });
        return;
    }
    let (lo, hi) = w.think_ms;
    let think = w.rng.range(lo, hi);
    if think > 0 {
        tokio::time::sleep(ms(think)).await;
    }
}

/// What an operation releases.
enum Release {
    One(LockGuard),
    All(LockAllGuard),
}

/// Releases; `lock_all`'s outcome is `Ok` only if every key's was.
async fn release(w: &mut Worker, op: u64, held: Release) {
    let t = w.clock.now();
    w.log(Event::ReleaseSent { op, t });
    let released = match held {
        Release::One(guard) => guard.release().await,
        Release::All(all) => all.release().await,
    };
    let outcome = match released {
        Ok(()) => ReleaseOutcome::Ok,
        Err(LockError::Lost { .. }) => ReleaseOutcome::Lost,
        Err(e) => {
            eprintln!("worker {}: release: {e}", w.id);
            ReleaseOutcome::Error
        }
    };
    let t = w.clock.now();
    w.log(Event::Released { op, outcome, t });
}
