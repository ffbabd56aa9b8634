//! Reading the embedded backend's locks without touching them (see
//! [`super::super::inspect`]).

use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::inspect::{Holding, Observed};
use crate::key::{KeyNames, LockKind};

impl MemoryBackend {
    /// The state of the lock `names` (any kind).
    pub(crate) fn observe(&self, names: &KeyNames) -> Observed {
        let state = self.state();
        if names.kind != LockKind::Mutex {
            return state.shared.observe(names, state.fence);
        }
        let now = Instant::now();
        let held = state
            .locks
            .get(&names.lock)
            .filter(|held| held.expires > now);
        // Entries whose wait ended are skipped, as acquire does.
        let waiting: Vec<String> = state
            .queues
            .get(names.queue())
            .filter(|queue| queue.expires > now)
            .map(|queue| {
                queue
                    .entries
                    .iter()
                    .filter(|e| e.until > now)
                    .map(|e| e.token.as_str().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        Observed {
            held: held.is_some(),
            remaining: held.map(|held| held.expires - now),
            fence: state.fence,
            queued: waiting.len(),
            holders: held
                .map(|held| Holding {
                    token: held.token.as_str().to_owned(),
                    fencing: Some(held.fencing),
                    remaining: Some(held.expires - now),
                })
                .into_iter()
                .collect(),
            waiting,
        }
    }
}

impl MemoryBackend {
    /// An operator's force-release (see `Backend::force_release`): the lock
    /// of `names` deleted whoever holds it, the counter raised; returns it.
    pub(crate) fn force_release(&self, names: &KeyNames) -> u64 {
        let granted = {
            let mut state = self.state();
            state.locks.remove(&names.lock);
            let state = &mut *state;
            let granted = state.shared.evict(names, &mut state.fence);
            state.fence += 1;
            (granted, state.fence)
        };
        self.notify(names, granted.0);
        self.announce(names.notice());
        granted.1
    }
}
