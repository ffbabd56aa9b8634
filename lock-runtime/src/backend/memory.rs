//! The embedded backend: the same semantics as Redis, inside this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::waiters::{Registry, Subscription};
use super::AcquireOutcome;
use crate::key::KeyNames;
use crate::token::Token;

#[derive(Debug)]
struct Held {
    token: Token,
    expires: Instant,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Held>,
    fences: HashMap<String, u64>,
    ops: u64,
}

/// Locks in a `HashMap` behind a mutex; expiry is checked on access with
/// tokio's clock, so `tokio::time::pause()` works in users' tests.
#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    waiters: Arc<Registry>,
    /// Idempotency records (`IdempotencyLayer`).
    #[cfg(feature = "axum")]
    pub(crate) records: super::records::MemoryRecords,
}

impl MemoryBackend {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn acquire(&self, names: &KeyNames, token: &Token, ttl: Duration) -> AcquireOutcome {
        let now = Instant::now();
        let mut state = self.state();
        state.ops += 1;
        if state.ops % 4096 == 0 {
            state.locks.retain(|_, held| held.expires > now);
        }
        if let Some(held) = state.locks.get_mut(&names.lock) {
            if held.expires > now {
                if held.token != *token {
                    return AcquireOutcome::Busy {
                        remaining: held.expires - now,
                    };
                }
                held.expires = now + ttl;
                let fencing = state.fences.get(&names.fence).copied().unwrap_or(0);
                return AcquireOutcome::Acquired { fencing };
            }
        }
        let fence = state.fences.entry(names.fence.clone()).or_insert(0);
        *fence += 1;
        let fencing = *fence;
        state.locks.insert(
            names.lock.clone(),
            Held {
                token: token.clone(),
                expires: now + ttl,
            },
        );
        AcquireOutcome::Acquired { fencing }
    }

    pub(crate) fn extend(&self, names: &KeyNames, token: &Token, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        match state.locks.get_mut(&names.lock) {
            Some(held) if held.expires > now && held.token == *token => {
                held.expires = now + ttl;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn release(&self, names: &KeyNames, token: &Token) -> bool {
        let now = Instant::now();
        let released = {
            let mut state = self.state();
            match state.locks.get(&names.lock) {
                Some(held) if held.token == *token => {
                    let live = held.expires > now;
                    state.locks.remove(&names.lock);
                    live
                }
                _ => false,
            }
        };
        if released {
            self.waiters.wake(&names.notice);
        }
        released
    }

    /// Deletes a key as an operator would (`DEL`), for tests.
    pub(crate) fn delete(&self, names: &KeyNames) {
        self.state().locks.remove(&names.lock);
    }

    pub(crate) fn subscribe(&self, names: &KeyNames) -> Subscription {
        Subscription {
            slot: self.waiters.slot(&names.notice),
            cleanup: Some((self.waiters.clone(), names.notice.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn expired_locks_can_be_taken_and_fences_keep_counting() {
        let m = MemoryBackend::default();
        let names = KeyNames::new("t:", "k");
        let (a, b) = (Token::random().unwrap(), Token::random().unwrap());
        let ttl = Duration::from_millis(100);
        assert!(matches!(m.acquire(&names, &a, ttl), AcquireOutcome::Acquired { fencing: 1 }));
        assert!(matches!(m.acquire(&names, &b, ttl), AcquireOutcome::Busy { .. }));
        tokio::time::advance(Duration::from_millis(101)).await;
        assert!(!m.extend(&names, &a, ttl));
        assert!(matches!(m.acquire(&names, &b, ttl), AcquireOutcome::Acquired { fencing: 2 }));
        assert!(!m.release(&names, &a));
        assert!(m.release(&names, &b));
    }

    #[test]
    fn unused_wait_slots_are_dropped() {
        let m = MemoryBackend::default();
        let names = KeyNames::new("t:", "k");
        let s1 = m.subscribe(&names);
        let s2 = m.subscribe(&names);
        drop(s1);
        assert_eq!(m.waiters.len(), 1);
        drop(s2);
        assert_eq!(m.waiters.len(), 0);
    }
}
