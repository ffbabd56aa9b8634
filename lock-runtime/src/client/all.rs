//! [`LockAllRequest`]: several locks, all or none.

use std::future::Future;
use std::time::Duration;

use super::LockClient;
use crate::LockError;
use crate::guard::LockGuard;

/// A request for several locks at once, from [`LockClient::lock_all`]: all
/// of them or none. Each key is the same lock [`LockClient::lock`] takes.
#[derive(Clone, Debug)]
#[must_use = "a lock request does nothing until `.acquire()` or `.run(fut)`"]
pub struct LockAllRequest {
    client: LockClient,
    keys: Vec<String>,
    ttl: Option<Duration>,
    wait: Duration,
    renew: bool,
    metrics: crate::metrics::Name,
}

impl LockAllRequest {
    pub(super) fn new(client: LockClient, keys: Vec<String>) -> Self {
        Self {
            client,
            keys,
            ttl: None,
            wait: Duration::ZERO,
            renew: true,
            metrics: crate::metrics::Name::default(),
        }
    }

    /// The `name` label of these locks' metrics (see [`crate::LockRequest::metrics_name`]).
    pub fn metrics_name(mut self, name: impl Into<std::sync::Arc<str>>) -> Self {
        self.metrics = crate::metrics::Name::new(name.into());
        self
    }

    /// The lease of each lock (default: the client's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait for all of them (default: try once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the watchdog renews the leases (default `true`).
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Takes every lock, or none.
    pub async fn acquire(self) -> Result<LockAllGuard, LockError> {
        let _ = (
            &self.client,
            &self.keys,
            self.ttl,
            self.wait,
            self.renew,
            &self.metrics,
        );
        Err(LockError::Config("lock_all is being built".into()))
    }

    /// Runs `fut` while holding every lock.
    pub async fn run<F: Future>(self, fut: F) -> Result<F::Output, LockError> {
        let guard = self.acquire().await?;
        let output = fut.await;
        guard.release().await?;
        Ok(output)
    }
}

/// Several held locks, from [`LockAllRequest::acquire`].
#[derive(Debug)]
#[must_use = "the locks are released when the guard is dropped"]
pub struct LockAllGuard {
    guards: Vec<LockGuard>,
}

impl LockAllGuard {
    /// The keys, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of each key, in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Releases every lock.
    pub async fn release(self) -> Result<(), LockError> {
        for guard in self.guards {
            guard.release().await?;
        }
        Ok(())
    }
}
