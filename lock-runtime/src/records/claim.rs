//! Claiming a record: one claim, sent again when its reply was lost, and
//! for a record in flight a wait on its notice channel, through the same
//! wait handle (the notice registry) as a lock acquire.

use std::time::Duration;

use tokio::time::Instant;

use super::guard::{MAX_POLL, RecordGuard, Taken, release_in_background};
use super::names::RecordNames;
use crate::backend::WaitHandle;
use crate::backend::records::{Claim, RecordClaim, StoredResponse};
use crate::durations::later;
use crate::token::Token;
use crate::{LockClient, LockError};

/// How many times a claim is sent when no answer comes back.
const CLAIM_TRIES: u32 = 3;

/// What a claim found, after waiting for a record in flight as long as asked.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Ours to run.
    Run(RecordGuard),
    /// Completed: its stored result.
    Done(StoredResponse),
    /// Another claimer still runs it; its lease ends within `remaining`.
    InFlight { remaining: Duration },
    /// The key was used with another fingerprint.
    Reused,
}

/// One claim of a record, with everything it is claimed with.
#[derive(Clone, Debug)]
pub(crate) struct Ask {
    pub(crate) key: String,
    pub(crate) names: RecordNames,
    pub(crate) fingerprint: String,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) retention: Duration,
}

impl Ask {
    /// Claims the record; while another claimer runs it, waits (up to
    /// `wait`) for its completion or release notice, with the record's lease
    /// as the fallback timer. An error when the store did not answer; what
    /// the claim may have taken is released in the background.
    pub(crate) async fn claim(self, client: &LockClient) -> Result<Outcome, LockError> {
        let token = client.0.token();
        let backend = client.backend();
        let notice = &self.names.notice;
        // A wait above `MAX_WAIT` waits that long, as a lock's does.
        let deadline = later(Instant::now(), self.wait);
        let waits = !self.wait.is_zero();
        // Registered for the record's notices once it was found in flight
        // (at once where that costs nothing: the embedded backend, or a
        // channel already subscribed to).
        let mut waiter: Option<WaitHandle> = None;
        if waits && backend.notices_ready_on(notice) {
            waiter = Some(backend.register_on(notice, &token).await);
        }
        let mut pause = Duration::from_millis(10);
        loop {
            // The record's lease starts no earlier than this.
            let sent = Instant::now();
            let on_the_wire = OnTheWire::new(client, &self.names, &self.fingerprint, token);
            let answer = self.send(client, &token, waits).await;
            on_the_wire.answered();
            let remaining = match answer {
                Ok(Claim::Claimed) => {
                    drop(waiter); // no more notices for us
                    return Ok(Outcome::Run(self.taken(client, token, sent)));
                }
                Ok(Claim::Done(stored)) => return Ok(Outcome::Done(stored)),
                Ok(Claim::Mismatch) => return Ok(Outcome::Reused),
                Ok(Claim::InFlight { remaining }) => remaining,
                Err(e) => {
                    // The claim may have run though its reply was lost: give
                    // up what may be ours, so the key is not held for a lease.
                    let (names, fingerprint) = (self.names.clone(), self.fingerprint.clone());
                    release_in_background(client.clone(), names, token, fingerprint, false);
                    return Err(e);
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(Outcome::InFlight { remaining });
            }
            let Some(handle) = &waiter else {
                // Register, then claim again at once: a notice sent between
                // the first claim and the registration is seen that way.
                waiter = Some(backend.register_on(notice, &token).await);
                continue;
            };
            // Notices are at most once: the lease is the fallback timer,
            // bounded by our deadline. Where the subscription was not
            // confirmed (refused by an ACL, the notice connection down), look
            // again with a capped back-off instead.
            let mut nap = (remaining + Duration::from_millis(1)).min(deadline - now);
            if !backend.notices_ready_on(notice) {
                nap = nap.min(pause);
                pause = (pause * 2).min(MAX_POLL);
            }
            tokio::select! {
                () = handle.waiter.notify.notified() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Sends the claim, again when its reply was lost: the repeated `SET NX`
    /// finds the key taken and the claim script re-arms a claim that is
    /// already ours, so a lost reply neither turns into an error nor leaves
    /// the key blocked for a lease. `waiting`: the caller will wait for a
    /// record in flight, and marks it so that its completion or release is
    /// announced.
    async fn send(
        &self,
        client: &LockClient,
        token: &Token,
        waiting: bool,
    ) -> Result<Claim, LockError> {
        let record = &self.names.record;
        let mut pause = Duration::from_millis(20);
        let mut tries = 1;
        loop {
            match client
                .backend()
                .claim_record(RecordClaim {
                    record,
                    notice: &self.names.notice,
                    token,
                    fingerprint: &self.fingerprint,
                    lease: self.lease,
                    waiting,
                })
                .await
            {
                Err(e) if tries < CLAIM_TRIES => {
                    tracing::debug!(%record, error = &e as &dyn std::error::Error, "idempotency: claim unanswered; sending it again");
                    tokio::time::sleep(pause).await;
                    pause *= 4;
                    tries += 1;
                }
                answer => return answer,
            }
        }
    }

    fn taken(self, client: &LockClient, token: Token, sent: Instant) -> RecordGuard {
        let taken = Taken {
            key: self.key,
            names: self.names,
            token,
            fingerprint: self.fingerprint,
            lease: self.lease,
            retention: self.retention,
        };
        RecordGuard::start(client.clone(), taken, sent)
    }
}

/// A claim on its way: if the claiming future is dropped before its answer
/// is read (the caller went away), the claim may have run on the server with
/// nobody left to run the work or release it, which would keep the key in
/// flight for a whole lease. Dropped armed, it releases the record for its
/// token in the background (a no-op where the claim did not take it).
/// It borrows what a release needs and copies it only when it does one.
struct OnTheWire<'a> {
    client: &'a LockClient,
    names: &'a RecordNames,
    fingerprint: &'a str,
    token: Token,
    armed: bool,
}

impl<'a> OnTheWire<'a> {
    fn new(
        client: &'a LockClient,
        names: &'a RecordNames,
        fingerprint: &'a str,
        token: Token,
    ) -> Self {
        Self {
            client,
            names,
            fingerprint,
            token,
            armed: true,
        }
    }

    /// The answer was read: whoever holds the record now settles it.
    fn answered(mut self) {
        self.armed = false;
    }
}

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(
                "idempotency: dropped while claiming; releasing what it may have claimed"
            );
            release_in_background(
                self.client.clone(),
                self.names.clone(),
                self.token,
                self.fingerprint.to_owned(),
                false,
            );
        }
    }
}
