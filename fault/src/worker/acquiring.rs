//! The steps every operation's acquire shares (the plain operations in
//! `operation.rs`, scenario 12's in `fifo.rs`): the request for a key, the
//! logged attempt, and the acquire loop that retries backend errors.

use std::future::Future;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockRequest};

use super::{Worker, ms};
use crate::kind::{Kind, Side};
use crate::log::Event;

/// The request for `key` (and `side`) as the worker's kind takes it.
pub(super) fn request(w: &Worker, key: &str, side: Option<Side>) -> LockRequest {
    let client = &w.client;
    let request = match (w.config.kind, side) {
        (Kind::Rw { .. }, Some(Side::Read)) => client.rw_lock(key).read(),
        (Kind::Rw { .. }, _) => client.rw_lock(key).write(),
        (Kind::Semaphore { permits }, _) => client.semaphore(key, permits),
        (Kind::HoldAtLeast { ms: min }, _) => client.lock(key).hold_at_least(ms(min)),
        _ => client.lock(key),
    };
    // Scenario 12 (FIFO): fixed leases, so that a crashed holder's key goes
    // on when its lease runs out.
    request
        .ttl(ms(w.config.ttl_ms))
        .renew(w.config.try_once_per_mille.is_none())
}

pub(super) fn attempt(w: &mut Worker, op: u64, keys: &[String], side: Option<Side>) -> u64 {
    let t = w.clock.now();
    w.log(Event::Attempt {
        op,
        key: keys[0].clone(),
        more_keys: keys[1..].to_vec(),
        side,
        t,
    });
    t
}

/// Acquires within the wait, retrying backend errors; `None` (logged) when
/// not. `request(worker, wait left)` makes one attempt.
pub(super) async fn acquire<G, F>(
    w: &mut Worker,
    op: u64,
    started: u64,
    mut request: impl FnMut(&Worker, Duration) -> F,
) -> Option<G>
where
    F: Future<Output = Result<G, LockError>>,
{
    let deadline = started + w.config.wait_ms * 1000;
    let cancel = w.config.cancel_per_mille > 0 && w.rng.chance(w.config.cancel_per_mille);
    let cancel_after = ms(w.rng.range(0, w.config.cancel_max_ms));
    let cancel_at = tokio::time::Instant::now() + cancel_after;
    loop {
        let now = w.clock.now();
        let left = Duration::from_micros(deadline.saturating_sub(now));
        if left.is_zero() {
            w.log(Event::GaveUp {
                op,
                error: "wait exhausted after errors".into(),
                t: now,
            });
            return None;
        }
        let attempt = request(w, left);
        let result = if cancel {
            match tokio::time::timeout_at(cancel_at, attempt).await {
                Ok(result) => result,
                Err(_) => {
                    let watched = w.client.renewed_leases();
                    let t = w.clock.now();
                    w.log(Event::Cancelled { op, watched, t });
                    return None;
                }
            }
        } else {
            attempt.await
        };
        match result {
            Ok(guard) => return Some(guard),
            // Not worth retrying: the lock is busy at the deadline, or the
            // request is one this backend refuses.
            Err(e @ (LockError::Busy { .. } | LockError::Config(_))) => {
                let t = w.clock.now();
                w.log(Event::GaveUp {
                    op,
                    error: e.to_string(),
                    t,
                });
                return None;
            }
            Err(e) => {
                let t = w.clock.now();
                w.log(Event::AcquireError {
                    op,
                    error: e.to_string(),
                    t,
                });
                let pause = ms(20).min(left);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Logs the grant of `guard` (one key) for `op`: the guard and its fencing
/// token, asked for at once (a lock taken uncontended gets its token on
/// first use). The grant's time is taken before the token is asked for, so
/// the logged hold starts no later than it did. `None` (logged as given
/// up, the guard dropped) when the lease ended before the token came: a
/// holder whose lease ended never gets a token.
pub(super) async fn granted(w: &mut Worker, op: u64, guard: LockGuard) -> Option<(LockGuard, u64)> {
    let t = w.clock.now();
    match guard.fencing_token().await {
        Ok(fence) => {
            w.log(Event::Acquired {
                op,
                fence,
                more_fences: vec![],
                t,
            });
            Some((guard, fence))
        }
        Err(e) => {
            let t = w.clock.now();
            w.log(Event::GaveUp {
                op,
                error: format!("no fencing token: {e}"),
                t,
            });
            None
        }
    }
}
