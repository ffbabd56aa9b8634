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

use std::time::Duration;

use bytes::Bytes;

use super::{Backend, RecordsAt};
use crate::LockError;
use crate::token::Token;

mod memory;
mod redis;
#[cfg(test)]
mod tests;

pub(crate) use memory::MemoryRecords;
use redis::{
    claim_on, claim_on_majority, complete_on, majority_says, on_every_node, release_on, renew_on,
};

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
