//! Idempotency records: the storage side of `IdempotencyLayer`.
//!
//! A record is one key (a Redis hash) that moves through two states:
//!
//! * **run**: claimed by one request (an owner token, like a lock's) for a
//!   lease that the claimer's watchdog renews; if the process dies the record
//!   expires and the key can be used again;
//! * **done**: the stored response (status, encoded headers, body, or a mark
//!   that the body was over the storage limit), kept for the retention
//!   period, with the owner token of the request that ran it.
//!
//! Both carry the request fingerprint, so a reuse of the key for another
//! request is told apart from a retry. Claim, renew, complete and release are
//! each one script (or one critical section of the embedded backend), and
//! each may be sent again when its reply was lost: a repeated claim re-arms
//! our own claim, a repeated completion finds our response already stored
//! (the owner is kept for that), a repeated renewal or release finds nothing
//! left to do. So an ambiguous reply is retried, never taken for a refusal.
//!
//! On Redlock every node keeps a copy and a majority decides, as for a lock:
//! a master that dies or comes back empty neither stops the layer nor lets a
//! completed request run again.
#![cfg(feature = "axum")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use futures_util::future::join_all;

use super::redis::RedisBackend;
use super::redlock::RedlockBackend;
use super::{Backend, RecordsAt};
use crate::LockError;
use crate::error::BackendError;
use crate::token::Token;

static CLAIM: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/idempotency_claim.lua")));
static RENEW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/idempotency_renew.lua")));
static COMPLETE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/idempotency_complete.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/idempotency_release.lua")));

/// A response as stored in a record. `headers` is opaque here (the layer
/// encodes and decodes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Bytes,
    pub(crate) body: Bytes,
    /// The body was over the storage limit: `body` is empty, and a replay
    /// must say so rather than send an empty body.
    pub(crate) body_too_large: bool,
}

/// The answer of one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The record is ours to run.
    Claimed,
    /// Another request runs it; its lease ends within `remaining`.
    InFlight { remaining: Duration },
    /// It ran; here is its response.
    Done(StoredResponse),
    /// The key was used by a request with another fingerprint.
    Mismatch,
}

impl Backend {
    /// Claims `record` for `token` if it is free (absent or expired), atomically.
    pub(crate) async fn claim_record(
        &self,
        record: &str,
        token: &Token,
        fingerprint: &str,
        lease: Duration,
    ) -> Result<Claim, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => claim_on(b, record, token, fingerprint, lease).await,
            RecordsAt::Redlock(b) => claim_on_majority(b, record, token, fingerprint, lease).await,
            RecordsAt::Memory(b) => Ok(b.records.claim(record, token, fingerprint, lease)),
        }
    }

    /// Re-arms the lease of a record `token` runs (a no-op once it holds our
    /// response). `false`: no longer ours. An error when the answer is
    /// unknown (no reply, or no majority either way on Redlock): not a loss.
    pub(crate) async fn renew_record(
        &self,
        record: &str,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => renew_on(b, record, token, lease).await,
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| renew_on(n, record, token, lease)).await;
                majority_says(b, &answers, "renewal")
            }
            RecordsAt::Memory(b) => Ok(b.records.renew(record, token, lease)),
        }
    }

    /// Stores `response` in a record `token` ran, kept for `retention`.
    /// `true` also when an earlier try whose reply was lost stored it, and
    /// when the record was gone (our lease ran out, or a Redlock node missed
    /// the claim): the handler ran, so its response is kept. `false`: another
    /// request's claim or response is there (nothing stored). An error when
    /// the answer is unknown; sending it again is safe.
    pub(crate) async fn complete_record(
        &self,
        record: &str,
        token: &Token,
        fingerprint: &str,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<bool, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => {
                complete_on(b, record, token, fingerprint, response, retention).await
            }
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| {
                    complete_on(n, record, token, fingerprint, response, retention)
                })
                .await;
                majority_says(b, &answers, "completion")
            }
            RecordsAt::Memory(b) => {
                Ok(b.records
                    .complete(record, token, fingerprint, response, retention))
            }
        }
    }

    /// Deletes a record `token` runs, so its key can be used again.
    /// `false`: no longer ours.
    pub(crate) async fn release_record(
        &self,
        record: &str,
        token: &Token,
    ) -> Result<bool, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => release_on(b, record, token).await,
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| release_on(n, record, token)).await;
                majority_says(b, &answers, "release")
            }
            RecordsAt::Memory(b) => Ok(b.records.release(record, token)),
        }
    }
}

async fn claim_on(
    node: &RedisBackend,
    record: &str,
    token: &Token,
    fingerprint: &str,
    lease: Duration,
) -> Result<Claim, LockError> {
    let (code, remaining, status, headers, body, big): (i64, i64, i64, Vec<u8>, Vec<u8>, Vec<u8>) =
        CLAIM
            .key(record)
            .arg(token.as_str())
            .arg(fingerprint)
            .arg(millis(lease))
            .invoke_async(&mut node.connection())
            .await
            .map_err(|e| BackendError::with_source("idempotency claim failed", e))?;
    Ok(match code {
        0 => Claim::Claimed,
        1 => Claim::InFlight {
            remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
        },
        2 => Claim::Done(StoredResponse {
            status: u16::try_from(status).unwrap_or(0),
            headers: headers.into(),
            body: body.into(),
            body_too_large: big == b"1",
        }),
        3 => Claim::Mismatch,
        other => {
            return Err(BackendError::new(format!(
                "idempotency claim: unexpected reply code {other}"
            ))
            .into());
        }
    })
}

async fn renew_on(
    node: &RedisBackend,
    record: &str,
    token: &Token,
    lease: Duration,
) -> Result<bool, LockError> {
    let renewed: i64 = RENEW
        .key(record)
        .arg(token.as_str())
        .arg(millis(lease))
        .invoke_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("idempotency renewal failed", e))?;
    Ok(renewed == 1)
}

async fn complete_on(
    node: &RedisBackend,
    record: &str,
    token: &Token,
    fingerprint: &str,
    response: &StoredResponse,
    retention: Duration,
) -> Result<bool, LockError> {
    let stored: i64 = COMPLETE
        .key(record)
        .arg(token.as_str())
        .arg(millis(retention))
        .arg(response.status)
        .arg(&response.headers[..])
        .arg(&response.body[..])
        .arg(fingerprint)
        .arg(if response.body_too_large { "1" } else { "" })
        .invoke_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("idempotency completion failed", e))?;
    Ok(stored == 1)
}

async fn release_on(node: &RedisBackend, record: &str, token: &Token) -> Result<bool, LockError> {
    let released: i64 = RELEASE
        .key(record)
        .arg(token.as_str())
        .invoke_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("idempotency release failed", e))?;
    Ok(released == 1)
}

/// Runs `op` on every Redlock node at once, each bounded by the node timeout:
/// one answer per node, `None` where it failed or was too slow.
async fn on_every_node<'a, T, F, Fut>(redlock: &'a RedlockBackend, op: F) -> Vec<Option<T>>
where
    F: Fn(&'a RedisBackend) -> Fut,
    Fut: Future<Output = Result<T, LockError>>,
{
    let per_node = redlock.node_timeout();
    join_all(
        redlock
            .nodes()
            .iter()
            .map(|node| tokio::time::timeout(per_node, op(node))),
    )
    .await
    .into_iter()
    .map(|answer| match answer {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "idempotency: a Redlock node failed");
            None
        }
        Err(_) => {
            tracing::debug!("idempotency: a Redlock node did not answer in time");
            None
        }
    })
    .collect()
}

/// `true` when a majority of nodes said `true`; `false` only when so many
/// said `false` that no majority can say `true`; otherwise (too few answers to
/// tell: a lost reply may have been a `true`) an error, so the caller treats
/// the outcome as unknown rather than as a refusal.
fn majority_says(
    redlock: &RedlockBackend,
    answers: &[Option<bool>],
    what: &str,
) -> Result<bool, LockError> {
    match majority(answers, redlock.quorum()) {
        Some(decided) => Ok(decided),
        None => Err(no_majority(redlock, answers.iter().flatten().count(), what)),
    }
}

/// The rule of [`majority_says`]: `None` while the unknown answers could
/// still tip it either way.
fn majority(answers: &[Option<bool>], quorum: usize) -> Option<bool> {
    let yes = answers.iter().filter(|a| **a == Some(true)).count();
    let no = answers.iter().filter(|a| **a == Some(false)).count();
    if yes >= quorum {
        Some(true)
    } else if no > answers.len() - quorum {
        Some(false)
    } else {
        None
    }
}

fn no_majority(redlock: &RedlockBackend, answered: usize, what: &str) -> LockError {
    BackendError::new(format!(
        "Redlock: {answered} of {} nodes answered the idempotency {what}, without \
         a majority of {} either way",
        redlock.nodes().len(),
        redlock.quorum()
    ))
    .into()
}

/// A claim on Redlock: the record is ours only with a majority of nodes, and
/// a stored response (or another request's fingerprint) on any node wins over
/// that, so a response stored on a majority is found by any later majority,
/// and one that reached only a minority is still replayed rather than run
/// again. A claim that is not ours is undone on every node before answering.
async fn claim_on_majority(
    redlock: &RedlockBackend,
    record: &str,
    token: &Token,
    fingerprint: &str,
    lease: Duration,
) -> Result<Claim, LockError> {
    let answers = on_every_node(redlock, |n| claim_on(n, record, token, fingerprint, lease)).await;
    let quorum = redlock.quorum();
    let mut claimed = 0;
    let mut in_flight: Option<Duration> = None;
    let mut decided = None;
    for answer in answers.iter().flatten() {
        match answer {
            Claim::Claimed => claimed += 1,
            Claim::InFlight { remaining } => {
                in_flight = Some(in_flight.map_or(*remaining, |r| r.min(*remaining)));
            }
            // A stored response outranks another request's fingerprint.
            Claim::Done(_) => decided = Some(answer.clone()),
            Claim::Mismatch => decided = decided.or(Some(Claim::Mismatch)),
        }
    }
    let answered = answers.iter().flatten().count();
    let outcome = match decided {
        Some(claim) => Ok(claim),
        None if claimed >= quorum => return Ok(Claim::Claimed),
        None if answered < quorum => Err(no_majority(redlock, answered, "claim")),
        // A majority answered and not all of it is ours: someone else holds
        // the rest.
        None => Ok(Claim::InFlight {
            remaining: in_flight.unwrap_or(Duration::from_millis(1)),
        }),
    };
    if claimed > 0 {
        // Best effort: a copy left behind only blocks its node for a lease.
        on_every_node(redlock, |n| release_on(n, record, token)).await;
    }
    outcome
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[derive(Debug)]
enum State {
    Run {
        owner: Token,
    },
    Done {
        owner: Token,
        response: StoredResponse,
    },
}

#[derive(Debug)]
struct Record {
    state: State,
    fingerprint: String,
    expires: Instant,
}

/// The embedded backend's records: a map behind a mutex, expiry checked on
/// access with tokio's clock (so `tokio::time::pause()` works).
#[derive(Debug, Default)]
pub(crate) struct MemoryRecords {
    records: Mutex<HashMap<String, Record>>,
    claims: AtomicUsize,
}

/// How many claims between two sweeps of expired records.
const SWEEP_EVERY: usize = 1024;

impl MemoryRecords {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live record named `name`, with expired ones removed on the way.
    fn live<'a>(
        records: &'a mut HashMap<String, Record>,
        name: &str,
        now: Instant,
    ) -> Option<&'a mut Record> {
        if records.get(name).is_some_and(|r| r.expires <= now) {
            records.remove(name);
        }
        records.get_mut(name)
    }

    fn claim(&self, name: &str, token: &Token, fingerprint: &str, lease: Duration) -> Claim {
        let now = Instant::now();
        let mut records = self.records();
        if self.claims.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            records.retain(|_, r| r.expires > now);
        }
        match Self::live(&mut records, name, now) {
            None => {
                records.insert(
                    name.to_owned(),
                    Record {
                        state: State::Run { owner: *token },
                        fingerprint: fingerprint.to_owned(),
                        expires: now + lease,
                    },
                );
                Claim::Claimed
            }
            Some(record) if record.fingerprint != fingerprint => Claim::Mismatch,
            Some(record) => match &record.state {
                State::Run { owner } if owner == token => {
                    record.expires = now + lease;
                    Claim::Claimed
                }
                State::Run { .. } => Claim::InFlight {
                    remaining: record.expires - now,
                },
                State::Done { response, .. } => Claim::Done(response.clone()),
            },
        }
    }

    /// The live record `name` if `token` runs it.
    fn owned<'a>(
        records: &'a mut HashMap<String, Record>,
        name: &str,
        token: &Token,
        now: Instant,
    ) -> Option<&'a mut Record> {
        Self::live(records, name, now)
            .filter(|r| matches!(&r.state, State::Run { owner } if owner == token))
    }

    fn renew(&self, name: &str, token: &Token, lease: Duration) -> bool {
        let now = Instant::now();
        let mut records = self.records();
        match Self::live(&mut records, name, now) {
            Some(record) => match &record.state {
                State::Run { owner } if owner == token => {
                    record.expires = now + lease;
                    true
                }
                // Crossed our completion: nothing to re-arm.
                State::Done { owner, .. } => owner == token,
                State::Run { .. } => false,
            },
            None => false,
        }
    }

    /// As the script: stored (or already ours) unless another request's
    /// claim or response is there.
    fn complete(
        &self,
        name: &str,
        token: &Token,
        fingerprint: &str,
        response: &StoredResponse,
        retention: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut records = self.records();
        let done = Record {
            state: State::Done {
                owner: *token,
                response: response.clone(),
            },
            fingerprint: fingerprint.to_owned(),
            expires: now + retention,
        };
        match Self::live(&mut records, name, now) {
            None => {
                records.insert(name.to_owned(), done);
                true
            }
            Some(record) => match &record.state {
                State::Done { owner, .. } => owner == token,
                State::Run { owner } if owner == token => {
                    *record = done;
                    true
                }
                State::Run { .. } => false,
            },
        }
    }

    fn release(&self, name: &str, token: &Token) -> bool {
        let now = Instant::now();
        let mut records = self.records();
        if Self::owned(&mut records, name, token, now).is_some() {
            records.remove(name);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16) -> StoredResponse {
        StoredResponse {
            status,
            headers: Bytes::from_static(b"content-type:text/plain\n"),
            body: Bytes::from_static(b"hello"),
            body_too_large: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_is_claimed_once_then_replayed() {
        let m = MemoryRecords::default();
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let lease = Duration::from_secs(1);
        assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
        assert!(matches!(
            m.claim("r", &b, "fp", lease),
            Claim::InFlight { .. }
        ));
        assert_eq!(m.claim("r", &b, "other", lease), Claim::Mismatch);
        let retention = Duration::from_secs(60);
        assert!(!m.complete("r", &b, "fp", &response(201), retention));
        assert!(m.complete("r", &a, "fp", &response(201), retention));
        assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
        // A completed record is nobody's to release; a renewal that crossed
        // the completion is harmless, and only its owner's.
        assert!(m.renew("r", &a, lease));
        assert!(!m.renew("r", &b, lease));
        assert!(!m.release("r", &a));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(m.claim("r", &b, "other", lease), Claim::Claimed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_completion_sent_again_after_a_lost_reply_is_still_ours() {
        let m = MemoryRecords::default();
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let (lease, retention) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
        assert!(m.complete("r", &a, "fp", &response(201), retention));
        // The same completion again (its first reply was lost): success, and
        // the stored response is unchanged.
        assert!(m.complete("r", &a, "fp", &response(500), retention));
        assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
        // Our lease ran out before the completion arrived and nobody claimed
        // in between: the handler ran, so its response is kept.
        assert_eq!(m.claim("s", &a, "fp", lease), Claim::Claimed);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(m.complete("s", &a, "fp", &response(201), retention));
        assert_eq!(m.claim("s", &b, "fp", lease), Claim::Done(response(201)));
        // Somebody else claimed in between: nothing of theirs is overwritten.
        assert_eq!(m.claim("t", &a, "fp", lease), Claim::Claimed);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(m.claim("t", &b, "fp", lease), Claim::Claimed);
        assert!(!m.complete("t", &a, "fp", &response(201), retention));
        assert!(m.release("t", &b));
    }

    #[test]
    fn a_redlock_answer_is_decided_only_when_the_lost_replies_cannot_change_it() {
        let (t, f, u) = (Some(true), Some(false), None);
        assert_eq!(majority(&[t, t, u], 2), Some(true));
        assert_eq!(majority(&[f, f, u], 2), Some(false));
        // One `true`, one `false`, one lost reply that may have been a `true`.
        assert_eq!(majority(&[t, f, u], 2), None);
        assert_eq!(majority(&[t, u, u], 2), None);
        assert_eq!(majority(&[t, t, f, f, u], 3), None);
        assert_eq!(majority(&[t, f, f, f, u], 3), Some(false));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrenewed_claim_expires_and_a_released_one_is_free_at_once() {
        let m = MemoryRecords::default();
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let lease = Duration::from_millis(300);
        assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(m.renew("r", &a, lease));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(matches!(
            m.claim("r", &b, "fp", lease),
            Claim::InFlight { .. }
        ));
        tokio::time::advance(Duration::from_millis(101)).await;
        assert_eq!(m.claim("r", &b, "fp", lease), Claim::Claimed);
        assert!(!m.renew("r", &a, lease));
        assert!(!m.complete("r", &a, "fp", &response(200), lease));
        assert!(m.release("r", &b));
        assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
    }
}
