//! Idempotency records: their storage (claim, renew, complete, release) on
//! each backend; `crate::records` is the protocol over these steps.
//!
//! A record is one key (on Redis a string, `value.rs`) that moves through two
//! states:
//!
//! * **run**: claimed by one request (an owner token, like a lock's) for a
//!   lease that the claimer's watchdog renews (with its locks, in batches);
//!   if the process dies the record expires and the key can be used again;
//! * **done**: the stored response (status, encoded headers, body, or a mark
//!   that the body was over the storage limit), kept for the retention
//!   period, with the owner token of the request that ran it.
//!
//! Both carry the request fingerprint, so a reuse of the key for another
//! request is told apart from a retry. A claim is one plain `SET .. NX PX`
//! when the key is free, as a hand-written claim would be, and one script
//! when it is taken; renew, complete and release are each one script (or one
//! critical section of the embedded backend; on Valkey 9 and Redis 8.4 a
//! record nobody waits on is completed by `SET .. IFEQ` and released by
//! `DELIFEQ` (`DELEX .. IFEQ`) over
//! the claim as written, as a hand-written store would be), and each may be
//! sent again
//! when its reply was lost: a repeated claim finds our own claim (the `SET`
//! finds the key taken, and the script sees our token in it and re-arms it),
//! a repeated completion finds our response already stored (the owner is
//! kept for that), a repeated renewal or release finds nothing left to do.
//! So an ambiguous reply is retried, never taken for a refusal.
//!
//! A duplicate that will wait for a record in flight marks it (`waited`)
//! with its claim; completing or releasing a marked record publishes a
//! notice (payload `''`) on the record's notice channel, in the record's
//! hash slot, as a lock release does (`SPUBLISH` on a cluster): duplicates
//! waiting on the record sleep on it, with the record's lease as a fallback
//! timer. An unmarked record is completed without a `PUBLISH`: nobody waits.
//! The mark is set by the claim script that reads the record in flight, in
//! the same atomic step, so a completion either follows it (and announces)
//! or precedes it (and the claim reads the completed record).
//!
//! With replica acks (`min_replica_acks`, one server or Sentinel), a claim
//! that took the record, a completion and a commit on the lock server are
//! followed by `WAIT`, as a lock's acquire is: a claim too few replicas
//! acknowledged is given back and refused, a completion or commit fails
//! with its outcome unknown. Renewals are not waited for (a record's lease
//! is not given up at its end, as a lock's is).
//!
//! On Redlock every node keeps a copy and a majority decides, as for a lock:
//! a master that dies or comes back empty neither stops the layer nor lets a
//! completed request run again.
#![cfg(feature = "idempotency")]

use std::time::Duration;

use bytes::Bytes;

use super::{Backend, RecordsAt};
use crate::error::LockError;
use crate::key::RecordNames;
use crate::token::Token;

pub(crate) mod committed;
mod memory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod redis;
mod seen;
mod store;
#[cfg(test)]
mod tests;
mod value;

use crate::backend::redlock::majority;
pub(crate) use memory::MemoryRecords;
use redis::{
    claim_on, claim_on_majority, complete_on, majority_says, on_every_node, release_on,
    renew_many_on,
};
pub(crate) use store::CommitStore;

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

impl StoredResponse {
    /// A record's result, as `RecordGuard` stores it: bytes alone (status
    /// 0, no headers).
    pub(crate) fn result(bytes: &[u8]) -> Self {
        StoredResponse {
            status: 0,
            headers: Bytes::new(),
            body: Bytes::copy_from_slice(bytes),
            body_too_large: false,
        }
    }
}

/// A record found committed in a commit store (PostgreSQL, Redis), where it
/// was written with its work's own writes.
#[derive(Clone, Debug)]
pub(crate) struct CommittedRecord {
    /// The digest of the fingerprint it was committed with.
    pub(crate) fingerprint: String,
    pub(crate) stored: StoredResponse,
}

/// What a commit of a record with its work's writes did.
pub(crate) enum CommitOutcome {
    /// The writes and the record committed.
    Committed(StoredResponse),
    /// A live record was there already (another claimer committed first):
    /// nothing was written.
    Found(CommittedRecord),
    /// The writes committed in the record itself, on the lock server
    /// (`commit_on_lock_server`), which now holds the result: nothing is
    /// left to complete.
    Completed,
}

/// A record as the claimer that runs it knows it: what its claim, its
/// completion and its release send, on every backend.
#[derive(Clone)]
pub(crate) struct Ours {
    /// The record and its notice channel, where a completion or a release
    /// (or an undone Redlock claim) is announced.
    pub(crate) names: RecordNames,
    pub(crate) token: Token,
    /// The fingerprint's digest.
    pub(crate) fingerprint: String,
    pub(crate) ttl: Duration,
    /// How long a completed record is kept.
    pub(crate) retention: Duration,
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
    /// Claims the record for `ours.token` if it is free (absent or
    /// expired), atomically. `waiting`: the caller will wait for a record in
    /// flight; on Redis it marks the record, whose completion or release is
    /// then announced (and only then: nobody else listens). The embedded
    /// backend's notices cost no round trip and are always sent.
    pub(crate) async fn claim_record(
        &self,
        ours: &Ours,
        waiting: bool,
    ) -> Result<Claim, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => claim_on(b, ours, waiting).await,
            RecordsAt::Redlock(b) => claim_on_majority(b, ours, waiting).await,
            RecordsAt::Memory(b) => {
                let Ours {
                    names,
                    token,
                    fingerprint,
                    ttl,
                    ..
                } = ours;
                Ok(b.records.claim(&names.record, token, fingerprint, *ttl))
            }
        }
    }

    /// Re-arms the leases of records we run (a no-op where one holds our
    /// response), in as few calls as the store allows: one per server (per
    /// slot on a cluster). Each answer: `Some(true)` re-armed, `Some(false)`
    /// no longer ours, `None` unknown (the call failed, or no majority
    /// either way on Redlock): not a loss. An error: every answer is unknown.
    pub(crate) async fn renew_records(
        &self,
        leases: &[(&str, &Token, Duration)],
    ) -> Result<Vec<Option<bool>>, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => Ok(renew_many_on(b, leases)
                .await?
                .into_iter()
                .map(Some)
                .collect()),
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| renew_many_on(n, leases)).await;
                Ok((0..leases.len())
                    .map(|i| {
                        let said: Vec<Option<bool>> = answers
                            .iter()
                            .map(|a| a.as_ref().and_then(|a| a.get(i).copied()))
                            .collect();
                        majority(&said, b.quorum())
                    })
                    .collect())
            }
            RecordsAt::Memory(b) => Ok(leases
                .iter()
                .map(|(record, token, lease)| Some(b.records.renew(record, token, *lease)))
                .collect()),
        }
    }

    /// Stores `response` in the record we ran, kept for its retention, and
    /// announces it on its notice channel so duplicates waiting on it replay
    /// it now. `true` also when an earlier try whose reply was lost stored
    /// it, and when the record was gone (our lease ran out, or a Redlock
    /// node missed the claim): the handler ran, so its response is kept.
    /// `false`: another request's claim or response is there (nothing
    /// stored). An error when the answer is unknown; sending it again is
    /// safe.
    pub(crate) async fn complete_record(
        &self,
        ours: &Ours,
        response: &StoredResponse,
    ) -> Result<bool, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => complete_on(b, ours, response).await,
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| complete_on(n, ours, response)).await;
                majority_says(b, &answers, "completion")
            }
            RecordsAt::Memory(b) => {
                let Ours {
                    names,
                    token,
                    fingerprint,
                    retention,
                    ..
                } = ours;
                let record = &names.record;
                let stored = b
                    .records
                    .complete(record, token, fingerprint, response, *retention);
                if stored {
                    b.announce(&names.notice);
                }
                Ok(stored)
            }
        }
    }

    /// Runs `writes` and completes the record we run with `stored`, in one
    /// script call on the lock server (`commit_on_lock_server`): the record
    /// is its own committed copy. `Found`: a completed record was there
    /// already (nothing written). A `Config` error where the records are
    /// not on one Redis server (see [`Backend::commits_records`]).
    pub(crate) async fn commit_record(
        &self,
        ours: &Ours,
        stored: StoredResponse,
        writes: &crate::fence::commands::Writes,
    ) -> Result<CommitOutcome, LockError> {
        self.commits_records()?;
        match self.records_at() {
            RecordsAt::Redis(b) => committed::commit_on_server(b, ours, stored, writes).await,
            RecordsAt::Redlock(_) | RecordsAt::Memory(_) => {
                unreachable!("refused by commits_records")
            }
        }
    }

    /// `Ok` where a record can be committed with its work on the lock
    /// server: one Redis server (or a Sentinel's master), whose one script
    /// can take the record's key and the work's keys together. Not the
    /// embedded backend (no Redis commands), Redlock (a record on a
    /// majority of masters) or a Cluster (keys in other hash slots).
    pub(crate) fn commits_records(&self) -> Result<(), LockError> {
        let refused = match self.records_at() {
            RecordsAt::Redis(b) if !b.is_cluster() => return Ok(()),
            RecordsAt::Redis(_) => "a Redis Cluster (the work's keys are in other hash slots)",
            RecordsAt::Redlock(_) => "Redlock (a record lives on a majority of masters)",
            RecordsAt::Memory(_) => "the embedded backend (it runs no Redis commands)",
        };
        Err(LockError::Config(format!(
            "commit_on_lock_server needs the lock backend to be one Redis server (or a \
             Sentinel's master); this one is {refused}: use commit_with_redis or \
             commit_with_postgres instead"
        )))
    }

    /// Deletes the record we run, so its key can be used again, and
    /// announces it on its notice channel so a duplicate waiting on it runs
    /// now. `false`: no longer ours.
    pub(crate) async fn release_record(&self, ours: &Ours) -> Result<bool, LockError> {
        match self.records_at() {
            RecordsAt::Redis(b) => release_on(b, ours).await,
            RecordsAt::Redlock(b) => {
                let answers = on_every_node(b, |n| release_on(n, ours)).await;
                majority_says(b, &answers, "release")
            }
            RecordsAt::Memory(b) => {
                let released = b.records.release(&ours.names.record, &ours.token);
                if released {
                    b.announce(&ours.names.notice);
                }
                Ok(released)
            }
        }
    }
}
