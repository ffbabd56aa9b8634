//! Records of the embedded backend.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{Claim, StoredResponse};
use crate::durations::later;
use crate::token::Token;

#[derive(Debug)]
enum RecordPhase {
    Run {
        owner: Token,
    },
    Done {
        owner: Token,
        response: StoredResponse,
    },
}

#[derive(Debug)]
struct MemoryRecord {
    state: RecordPhase,
    fingerprint: String,
    expires: Instant,
}

/// The embedded backend's records: a map behind a mutex, expiry checked on
/// access with tokio's clock (so `tokio::time::pause()` works).
#[derive(Debug, Default)]
pub(crate) struct MemoryRecords {
    records: Mutex<HashMap<String, MemoryRecord>>,
    claims: AtomicUsize,
}

/// How many claims between two sweeps of expired records.
const SWEEP_EVERY: usize = 1024;

impl MemoryRecords {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, MemoryRecord>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live record named `name`, with expired ones removed on the way.
    fn live<'a>(
        records: &'a mut HashMap<String, MemoryRecord>,
        name: &str,
        now: Instant,
    ) -> Option<&'a mut MemoryRecord> {
        if records.get(name).is_some_and(|r| r.expires <= now) {
            records.remove(name);
        }
        records.get_mut(name)
    }

    pub(super) fn claim(
        &self,
        name: &str,
        token: &Token,
        fingerprint: &str,
        lease: Duration,
    ) -> Claim {
        let now = Instant::now();
        let mut records = self.records();
        if self.claims.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            records.retain(|_, r| r.expires > now);
        }
        match Self::live(&mut records, name, now) {
            None => {
                records.insert(
                    name.to_owned(),
                    MemoryRecord {
                        state: RecordPhase::Run { owner: *token },
                        fingerprint: fingerprint.to_owned(),
                        expires: now + lease,
                    },
                );
                Claim::Claimed
            }
            Some(record) if record.fingerprint != fingerprint => Claim::Mismatch,
            Some(record) => match &record.state {
                RecordPhase::Run { owner } if owner == token => {
                    record.expires = now + lease;
                    Claim::Claimed
                }
                RecordPhase::Run { .. } => Claim::InFlight {
                    remaining: record.expires - now,
                },
                RecordPhase::Done { response, .. } => Claim::Done(response.clone()),
            },
        }
    }

    /// The live record `name` if `token` runs it.
    fn owned<'a>(
        records: &'a mut HashMap<String, MemoryRecord>,
        name: &str,
        token: &Token,
        now: Instant,
    ) -> Option<&'a mut MemoryRecord> {
        Self::live(records, name, now)
            .filter(|r| matches!(&r.state, RecordPhase::Run { owner } if owner == token))
    }

    pub(super) fn renew(&self, name: &str, token: &Token, lease: Duration) -> bool {
        let now = Instant::now();
        let mut records = self.records();
        match Self::live(&mut records, name, now) {
            Some(record) => match &record.state {
                RecordPhase::Run { owner } if owner == token => {
                    record.expires = now + lease;
                    true
                }
                // Crossed our completion: nothing to re-arm.
                RecordPhase::Done { owner, .. } => owner == token,
                RecordPhase::Run { .. } => false,
            },
            None => false,
        }
    }

    /// As the script: stored (or already ours) unless another request's
    /// claim or response is there.
    pub(super) fn complete(
        &self,
        name: &str,
        token: &Token,
        fingerprint: &str,
        response: &StoredResponse,
        retention: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut records = self.records();
        let done = MemoryRecord {
            state: RecordPhase::Done {
                owner: *token,
                response: response.clone(),
            },
            fingerprint: fingerprint.to_owned(),
            // Checked by the request; clamped here too, so that no
            // retention can overflow the clock.
            expires: later(now, retention),
        };
        match Self::live(&mut records, name, now) {
            None => {
                records.insert(name.to_owned(), done);
                true
            }
            Some(record) => match &record.state {
                RecordPhase::Done { owner, .. } => owner == token,
                RecordPhase::Run { owner } if owner == token => {
                    *record = done;
                    true
                }
                RecordPhase::Run { .. } => false,
            },
        }
    }

    pub(super) fn release(&self, name: &str, token: &Token) -> bool {
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
