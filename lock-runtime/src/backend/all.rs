//! Several locks in one atomic step, for `lock_all`: where a backend can
//! take them together, and the step itself.

use std::time::Duration;

use super::Backend;
use crate::error::LockError;
use crate::key::KeyNames;
use crate::token::Token;

/// Which keys one atomic step may take together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicSteps {
    /// Any keys: one server (or Sentinel's master), or the embedded backend.
    Any,
    /// Keys of one hash slot: a Redis Cluster runs a script on one slot.
    PerSlot,
    /// None: Redlock (a step would have to agree across nodes); the keys
    /// are taken one at a time.
    Never,
}

/// The answer of one atomic step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AllOutcome {
    /// Every lock is ours; the fencing token of each, in the order asked.
    Acquired(Vec<u64>),
    /// Lock `index` is held by another owner for at most `remaining`;
    /// none was taken.
    Busy { index: usize, remaining: Duration },
}

impl Backend {
    /// Which keys [`Backend::acquire_all`] may take together.
    pub(crate) fn atomic_steps(&self) -> AtomicSteps {
        match self {
            Backend::Redis(b) if b.is_cluster() => AtomicSteps::PerSlot,
            Backend::Redis(_) | Backend::Memory(_) => AtomicSteps::Any,
            Backend::Redlock(_) => AtomicSteps::Never,
        }
    }

    /// Takes every lock of `names` for `token`, all or none, trying once
    /// (never queues). `names` must be allowed together by
    /// [`Backend::atomic_steps`] and not be empty. An error may follow a
    /// step that ran: the caller releases `names` with `token`.
    pub(crate) async fn acquire_all(
        &self,
        names: &[&KeyNames],
        token: &Token,
        ttl: Duration,
    ) -> Result<AllOutcome, LockError> {
        match self {
            Backend::Redis(b) => b.acquire_all(names, token, ttl).await,
            Backend::Memory(b) => Ok(match b.acquire_all(names, token, ttl) {
                Ok(fencing) => AllOutcome::Acquired(vec![fencing; names.len()]),
                Err((index, remaining)) => AllOutcome::Busy { index, remaining },
            }),
            Backend::Redlock(_) => Err(LockError::Config(
                "Redlock takes several locks one at a time, not in one step".into(),
            )),
        }
    }
}
