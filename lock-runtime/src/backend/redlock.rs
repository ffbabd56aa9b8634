//! Redlock: one lock over N independent masters, held with a majority.
//!
//! * **Acquire** runs the acquire script on every node in parallel, each
//!   bounded by a per-node timeout small against the lease. The lock is ours
//!   only with a majority, and only while `validity = ttl - elapsed - drift`
//!   is positive, with `drift = ttl / 100 + 2 ms`, measured on the monotonic
//!   clock from before the first request. A failed attempt releases on every
//!   node before it returns.
//! * **Fencing**: each node keeps its own counter. The token is the highest
//!   counter of the acquiring majority, and that value is then written back to
//!   every node of the majority (never lowering a counter). Any later majority
//!   shares a node with this one, whose next increment is higher: tokens never
//!   decrease while a majority of nodes keeps its data.
//! * **Extend** (the watchdog) needs a majority within the validity; **release**
//!   runs on every node. Waiters wait on release notices from every node, with
//!   lease timers as fallback; Redlock does not queue waiters (a hand-over
//!   would have to agree across nodes).
//!
//! A node that restarts without its data must stay out for longer than the
//! longest lease (delayed restart), or run with `appendfsync always`;
//! otherwise it can help a second client to a majority while the first still
//! holds the lock.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{Instant, timeout};

use super::AcquireOutcome;
use super::redis::{RedisBackend, RedisOptions};
use super::waiters::{Registry, WaitHandle};
use crate::LockError;
use crate::error::BackendError;
use crate::key::KeyNames;
use crate::token::Token;

static FENCE_RAISE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/fence_raise.lua")));

/// The clock drift allowance of a lease.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

#[derive(Debug)]
pub(crate) struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
    waiters: Arc<Registry>,
    node_timeout: Duration,
}

impl RedlockBackend {
    /// Connects to every node. Nodes that cannot be reached now are an error:
    /// a lock service should start complete.
    pub(crate) async fn connect(
        urls: &[String],
        options: &RedisOptions,
    ) -> Result<Self, LockError> {
        if urls.len() < 3 || urls.len().is_multiple_of(2) {
            return Err(LockError::Config(format!(
                "Redlock needs an odd number of independent masters, at least 3 (got {})",
                urls.len()
            )));
        }
        let waiters = Arc::new(Registry::default());
        let connected = join_all(
            urls.iter()
                .map(|url| RedisBackend::redlock_node(url, options, waiters.clone())),
        )
        .await;
        let mut nodes = Vec::with_capacity(urls.len());
        for (i, node) in connected.into_iter().enumerate() {
            nodes.push(Arc::new(node.map_err(|e| match e {
                LockError::Backend(b) => {
                    LockError::Backend(BackendError::new(format!("Redlock node {i}: {b}")))
                }
                other => other,
            })?));
        }
        Ok(Self {
            nodes,
            waiters,
            node_timeout: options.response_timeout,
        })
    }

    /// How many nodes make a majority.
    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The per-node timeout of a request under a lease of `ttl`.
    fn per_node(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .min((ttl / 10).max(Duration::from_millis(5)))
    }

    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let started = Instant::now();
        let per_node = self.per_node(ttl);
        let quorum = self.quorum();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move {
                let answer = timeout(
                    per_node,
                    node.acquire(names, token, ttl, Duration::ZERO, false),
                )
                .await;
                (i, answer)
            })
            .collect();
        let mut acquired = Vec::new();
        let mut busy = Vec::new();
        let mut failed = 0;
        // Decide as soon as the outcome is known: a dead node must not make
        // every acquire wait for its timeout.
        while let Some((i, answer)) = pending.next().await {
            match answer {
                Ok(Ok(AcquireOutcome::Acquired { fencing })) => acquired.push((i, fencing)),
                Ok(Ok(AcquireOutcome::Busy { remaining })) => busy.push(remaining),
                _ => failed += 1,
            }
            let minority = self.nodes.len() - quorum;
            if acquired.len() >= quorum || busy.len() > minority || failed > minority {
                break;
            }
        }
        // Requests still in flight are dropped: if one took the lock on its
        // node anyway, the release below (failure) or the lease (success: that
        // copy is ours and renewed with the rest) takes care of it.
        let undecided = pending.len();
        drop(pending);
        let valid = |now: Instant| {
            ttl.checked_sub(now - started + drift(ttl))
                .is_some_and(|v| !v.is_zero())
        };
        if acquired.len() >= quorum && valid(Instant::now()) {
            let fencing = acquired.iter().map(|(_, f)| *f).max().unwrap_or(0);
            let raised = join_all(acquired.iter().map(|(i, _)| {
                let mut conn = self.nodes[*i].connection();
                async move {
                    timeout(
                        per_node,
                        FENCE_RAISE
                            .key(&names.fence)
                            .arg(fencing)
                            .invoke_async::<i64>(&mut conn),
                    )
                    .await
                }
            }))
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(1))))
            .count();
            if raised >= quorum && valid(Instant::now()) {
                return Ok(AcquireOutcome::Acquired { fencing });
            }
        }
        // Not ours: undo whatever was taken, everywhere, before answering.
        self.release_all(names, token, ttl).await;
        if busy.len() > self.nodes.len() - quorum {
            busy.sort();
            // The lock cannot be ours before enough holders' leases end.
            let needed = busy.len() + quorum - self.nodes.len();
            let remaining = busy
                .get(needed.saturating_sub(1))
                .copied()
                .unwrap_or_default();
            return Ok(AcquireOutcome::Busy { remaining });
        }
        let failed = failed + undecided;
        if failed > self.nodes.len() - quorum {
            return Err(BackendError::new(format!(
                "Redlock: only {} of {} nodes answered; a majority of {quorum} is needed",
                self.nodes.len() - failed,
                self.nodes.len()
            ))
            .into());
        }
        // A majority answered, but too slowly for the lease: busy for now.
        Ok(AcquireOutcome::Busy {
            remaining: Duration::from_millis(1),
        })
    }

    async fn release_all(&self, names: &KeyNames, token: &Token, ttl: Duration) -> usize {
        let per_node = self.per_node(ttl).max(Duration::from_millis(50));
        join_all(
            self.nodes
                .iter()
                .map(|node| timeout(per_node, node.release(names, token, ttl, false))),
        )
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(true))))
        .count()
    }

    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        Ok(self.extend_many(&[(names, token, ttl)]).await?[0])
    }

    /// Extends each lease on every node; a lease is extended when a majority
    /// confirmed it. An error when fewer than a majority answered at all (the
    /// watchdog then re-tries until the validity runs out).
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<bool>, LockError> {
        let ttl = leases.iter().map(|l| l.2).min().unwrap_or(Duration::ZERO);
        let per_node = self.per_node(ttl);
        let answers = join_all(
            self.nodes
                .iter()
                .map(|node| timeout(per_node, node.extend_many(leases))),
        )
        .await;
        let answered: Vec<Vec<bool>> = answers
            .into_iter()
            .filter_map(|a| a.ok().and_then(Result::ok))
            .filter(|a| a.len() == leases.len())
            .collect();
        let quorum = self.quorum();
        if answered.len() < quorum {
            return Err(BackendError::new(format!(
                "Redlock: only {} of {} nodes answered the renewal",
                answered.len(),
                self.nodes.len()
            ))
            .into());
        }
        Ok((0..leases.len())
            .map(|i| answered.iter().filter(|a| a[i]).count() >= quorum)
            .collect())
    }

    /// Releases on every node: `true` when a majority released it (it was
    /// ours), `false` when it was not ours on a majority.
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let per_node = self.per_node(ttl).max(Duration::from_millis(50));
        // Every node gets the release, in a task of its own; the answer is
        // given as soon as a majority decided it, so a dead node does not
        // delay it.
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| {
                let (node, names, token) = (node.clone(), names.clone(), *token);
                tokio::spawn(async move {
                    timeout(per_node, node.release(&names, &token, ttl, false)).await
                })
            })
            .collect();
        let quorum = self.quorum();
        let (mut answered, mut released) = (0, 0);
        while let Some(answer) = pending.next().await {
            if let Ok(Ok(Ok(was_ours))) = answer {
                answered += 1;
                released += usize::from(was_ours);
            }
            if released >= quorum {
                return Ok(true);
            }
            if answered - released >= quorum {
                return Ok(false);
            }
        }
        if answered < quorum {
            return Err(BackendError::new(format!(
                "Redlock: only {answered} of {} nodes answered the release",
                self.nodes.len()
            ))
            .into());
        }
        Ok(false)
    }

    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        for node in &self.nodes {
            let _ = timeout(self.node_timeout, node.delete(names)).await;
        }
        Ok(())
    }

    pub(crate) fn is_subscribed(&self, names: &KeyNames) -> bool {
        self.waiters.is_subscribed(&names.notice)
    }

    /// Registers on every node's notices (one registry for all of them).
    pub(crate) async fn register(&self, names: &KeyNames, token: &Token) -> WaitHandle {
        let (handle, _) = WaitHandle::new(&self.waiters, &names.notice, &token.digest());
        // Subscribe everywhere, but wait only for a majority: a dead node's
        // subscriber is reconnecting and must not hold the waiter up.
        let per_node = self.node_timeout;
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| timeout(per_node, node.subscribe(names)))
            .collect();
        let mut done = 0;
        while pending.next().await.is_some() {
            done += 1;
            if done >= self.quorum() {
                break;
            }
        }
        handle
    }

    /// Every node, in configuration order.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn nodes(&self) -> &[Arc<RedisBackend>] {
        &self.nodes
    }

    /// How long one node may take to answer one request.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn node_timeout(&self) -> Duration {
        self.node_timeout
    }
}
