//! What the watchdog keeps alive (a lock's lease or an idempotency record's),
//! and how one batch of one kind is renewed.

use std::sync::Arc;

use tokio::time::Instant;

use super::Batch;
use crate::backend::Backend;
use crate::error::LockError;
use crate::held::Held;

/// The lease of an in-flight idempotency record, as the watchdog renews it.
#[cfg(feature = "idempotency")]
#[derive(Debug)]
pub(crate) struct RecordLease {
    pub(crate) record: String,
    pub(crate) token: crate::token::Token,
    /// Set when the server says the record is not ours any more.
    pub(crate) lost: crate::held::Lost,
}

/// What one entry renews.
#[derive(Clone, Debug)]
pub(super) enum Lease {
    Lock(Arc<Held>),
    #[cfg(feature = "idempotency")]
    Record(Arc<RecordLease>),
}

impl Lease {
    /// A lock's lease (`None`: a record's).
    pub(super) fn lock(&self) -> Option<&Arc<Held>> {
        match self {
            Lease::Lock(held) => Some(held),
            #[cfg(feature = "idempotency")]
            Lease::Record(_) => None,
        }
    }

    /// Whether a lease that may have run out is given up: a lock's is (its
    /// guard must not go on believing it holds it), a record's is not.
    pub(super) fn lost_at_validity_end(&self) -> bool {
        match self {
            Lease::Lock(_) => true,
            #[cfg(feature = "idempotency")]
            Lease::Record(_) => false,
        }
    }

    pub(super) fn as_lock(&self) -> Option<&Held> {
        match self {
            Lease::Lock(held) => Some(held),
            #[cfg(feature = "idempotency")]
            Lease::Record(_) => None,
        }
    }

    pub(super) fn set_valid_until(&self, at: Instant) {
        match self {
            Lease::Lock(held) => held.set_valid_until(at),
            #[cfg(feature = "idempotency")]
            Lease::Record(_) => {}
        }
    }

    pub(super) fn lose(&self, why: &str) {
        match self {
            Lease::Lock(held) => lose(held, why),
            #[cfg(feature = "idempotency")]
            Lease::Record(record) => {
                // Its guard's `lost()` resolves: `IdempotencyLayer` cancels
                // the handler, which a duplicate's claim may run by now.
                tracing::warn!(record = %record.record,
                    "idempotency: the in-flight record was lost ({why}); a duplicate may run");
                record.lost.cancel();
            }
        }
    }
}

/// Renews a batch of one kind with that kind's batched script.
pub(super) async fn renew(
    backend: &Backend,
    batch: &Batch,
) -> Result<Vec<Option<bool>>, LockError> {
    let locks: Vec<_> = batch
        .iter()
        .filter_map(|(_, lease, ttl, _)| {
            lease.as_lock().map(|held| (&held.names, &held.token, *ttl))
        })
        .collect();
    if !locks.is_empty() {
        let extended = backend.extend_many(&locks).await?;
        let renewed = extended.iter().filter(|e| **e == Some(true)).count();
        crate::metrics::renewal_call(renewed);
        return Ok(extended);
    }
    #[cfg(feature = "idempotency")]
    {
        let records: Vec<_> = batch
            .iter()
            .filter_map(|(_, lease, ttl, _)| match lease {
                Lease::Record(r) => Some((r.record.as_str(), &r.token, *ttl)),
                Lease::Lock(_) => None,
            })
            .collect();
        if !records.is_empty() {
            return backend.renew_records(&records).await;
        }
    }
    Ok(Vec::new())
}

fn lose(held: &Held, why: &str) {
    held.lose(why);
}
