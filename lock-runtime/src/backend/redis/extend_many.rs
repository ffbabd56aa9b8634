//! The watchdog's renewals in one call per connection and hash slot
//! (extend_many.lua), and the leases that cannot join one.
//!
//! Each lease gets its own answer: renewed (`Some(true)`), refused
//! (`Some(false)`: not ours any more) or unknown (`None`: its call failed or
//! went unanswered; the watchdog asks again until the lease may have run
//! out). A call that fails leaves only its own leases unknown: on a cluster
//! a shard that is down does not make the leases on the others unconfirmed.

use super::super::scripts::{EXTEND_MANY, evalsha, millis, run_script};
use super::RedisBackend;
use crate::backend::LockRef;
use crate::error::{BackendError, LockError};
use crate::key::{KeyNames, LockKind};
use crate::token::Token;
use std::time::Duration;

impl RedisBackend {
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<Option<bool>>, LockError> {
        if !self.is_cluster() {
            return self.extend_batch(leases).await;
        }
        // A cluster runs a script only on keys of one slot: one call per slot.
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, (names, ..)) in leases.iter().enumerate() {
            by_slot.entry(names.slot).or_default().push(i);
        }
        let answers = futures_util::future::join_all(by_slot.values().map(|indices| {
            let group: Vec<_> = indices.iter().map(|i| leases[*i]).collect();
            async move { self.extend_batch(&group).await }
        }))
        .await;
        let mut extended = vec![None; leases.len()];
        let mut failed = None;
        for ((slot, indices), answer) in by_slot.iter().zip(answers) {
            if let Some(e) = place(&mut extended, indices, answer) {
                tracing::debug!(error = %e, slot, leases = indices.len(),
                    "lease renewal failed in one hash slot; its leases are retried");
                failed.get_or_insert(e);
            }
        }
        answered(extended, failed)
    }

    async fn extend_batch(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<Option<bool>>, LockError> {
        let batched = |names: &KeyNames| names.kind == LockKind::Mutex && !names.is_leader();
        if leases.iter().any(|(names, ..)| !batched(names)) {
            // Readers', permits' and leaders' leases: one call each (their
            // sets are renewed by `shared.lua`, a leader's record with its
            // lease by `extend.lua`), the mutexes' in one batch.
            let (mutexes, others): (Vec<usize>, Vec<usize>) =
                (0..leases.len()).partition(|i| batched(leases[*i].0));
            let batch: Vec<_> = mutexes.iter().map(|i| leases[*i]).collect();
            let (batched, singles) = futures_util::future::join(
                Box::pin(self.extend_batch(&batch)),
                futures_util::future::join_all(others.iter().map(|i| {
                    let (names, token, ttl) = leases[*i];
                    self.extend(LockRef::new(names, token, ttl))
                })),
            )
            .await;
            // A failed call leaves its own leases unknown, not the others'.
            let mut extended = vec![None; leases.len()];
            let mut failed = place(&mut extended, &mutexes, batched);
            if let Some(e) = &failed {
                tracing::debug!(error = %e, "batched lease renewal failed");
            }
            for (i, single) in others.iter().zip(singles) {
                let single = single.map(|renewed| vec![Some(renewed)]);
                if let Some(e) = place(&mut extended, std::slice::from_ref(i), single) {
                    tracing::debug!(error = %e, "lease renewal failed");
                    failed.get_or_insert(e);
                }
            }
            return answered(extended, failed);
        }
        let Some((first, ..)) = leases.first() else {
            return Ok(Vec::new());
        };
        let mut cmd = evalsha(
            &EXTEND_MANY,
            leases.len(),
            3 * leases.len(),
            leases.len() * (first.lock.len() + 48),
        );
        for (names, ..) in leases {
            cmd.arg(&names.lock);
        }
        for (_, token, ttl) in leases {
            cmd.arg(*token).arg(millis(*ttl));
        }
        let mut conn = self.connection();
        let extended: Vec<i64> = run_script(&mut conn, &EXTEND_MANY, &cmd)
            .await
            .map_err(|e| BackendError::with_source("batched extend failed", e))?;
        if extended.len() != leases.len() {
            return Err(BackendError::new("batched extend: wrong number of answers").into());
        }
        if extended.contains(&1) {
            // Unconfirmed by replicas: the watchdog retries until the lease ends.
            self.replicated(&mut conn).await?;
        }
        Ok(extended.into_iter().map(|e| Some(e == 1)).collect())
    }
}

/// Puts one call's answers for the leases at `indices` into `extended`; a
/// failed call leaves them unknown and gives back its error.
fn place(
    extended: &mut [Option<bool>],
    indices: &[usize],
    answer: Result<Vec<Option<bool>>, LockError>,
) -> Option<LockError> {
    match answer {
        Ok(answer) => {
            for (i, e) in indices.iter().zip(answer) {
                extended[*i] = e;
            }
            None
        }
        Err(e) => Some(e),
    }
}

/// The answers of several calls: the first failure's error when nothing
/// answered (for the watchdog's log), else each lease's own answer.
fn answered(
    extended: Vec<Option<bool>>,
    failed: Option<LockError>,
) -> Result<Vec<Option<bool>>, LockError> {
    match failed {
        Some(e) if extended.iter().all(Option::is_none) => Err(e),
        _ => Ok(extended),
    }
}
