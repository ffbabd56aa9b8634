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
//!   runs on every node, on a node whose acquire request was still in flight
//!   when the majority answered only once that request ended (else the
//!   release could reach the node first, and the acquire behind it would
//!   leave the node holding the lock for a lease). Waiters wait on release
//!   notices from every node, with lease timers as fallback; Redlock does not queue waiters (a hand-over
//!   would have to agree across nodes).
//!
//! A node that restarts without its data must stay out for longer than the
//! longest lease (delayed restart), or run with `appendfsync always`;
//! otherwise it can help a second client to a majority while the first still
//! holds the lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{Instant, timeout};

use super::redis::{RedisBackend, RedisOptions};
use super::waiters::{Registry, WaitHandle};
use super::{AcquireOutcome, LockRef, Released};
use crate::backoff::split_vote_pause;
use crate::error::{BackendError, LockError};
use crate::key::KeyNames;
use crate::token::Token;

mod stragglers;
mod tally;
use stragglers::{NodeRequest, Stragglers};
pub(crate) use tally::majority;
use tally::{ReleaseTally, distinct_masters};

static FENCE_RAISE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../scripts/fence_raise.lua")));

/// The clock drift allowance of a lease.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

#[derive(Debug)]
pub(crate) struct RedlockBackend {
    nodes: Vec<Arc<RedisBackend>>,
    waiters: Arc<Registry>,
    node_timeout: Duration,
    /// The acquire requests still in flight when their lock was granted
    /// (the slower nodes': they go on, so that those nodes hold it too):
    /// a node's release waits for them.
    stragglers: Stragglers,
    /// Tests only (`__private::testing::delay_redlock_acquires`): the node
    /// whose acquire requests start late, and by how many milliseconds,
    /// packed `node << 32 | ms`, as a task the runtime polls late would;
    /// 0: none.
    delayed: AtomicU64,
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
        distinct_masters(urls)?;
        let waiters = Arc::new(Registry::default());
        let connected = join_all(
            urls.iter()
                .map(|url| RedisBackend::redlock_node(url, options, waiters.clone())),
        )
        .await;
        let mut nodes = Vec::with_capacity(urls.len());
        for (i, node) in connected.into_iter().enumerate() {
            nodes.push(Arc::new(node.map_err(|e| match e {
                LockError::Backend(b) => LockError::Backend(BackendError::wrap(
                    format!("Redlock node {i} is unavailable"),
                    b,
                )),
                other => other,
            })?));
        }
        Ok(Self {
            nodes,
            waiters,
            node_timeout: options.response_timeout,
            stragglers: Stragglers::default(),
            delayed: AtomicU64::new(0),
        })
    }

    /// Restarts every node's notices if they ended with their runtime.
    pub(crate) async fn restart_if_ended(&self) -> Result<(), LockError> {
        join_all(self.nodes.iter().map(|node| node.restart_if_ended()))
            .await
            .into_iter()
            .collect()
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

    pub(crate) async fn acquire(&self, lock: LockRef<'_>) -> Result<AcquireOutcome, LockError> {
        self.acquire_paced(lock.names, lock.token, lock.ttl, None)
            .await
    }

    /// [`RedlockBackend::acquire`], pausing at most `split_pause` (half of
    /// it at least) after a split vote where every node answered, instead of
    /// up to one per-node timeout. For a waiter woken by a free notice: its
    /// split is likeliest its retry crossing the release on the nodes (it
    /// reached a node before the release did, which a loaded releaser's
    /// tasks can delay by milliseconds), and a pause of up to a per-node
    /// timeout (a second by default) would only delay the hand-over. With a
    /// node down, the usual pause (see [`split_vote_pause`]).
    pub(crate) async fn acquire_paced(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        split_pause: Option<Duration>,
    ) -> Result<AcquireOutcome, LockError> {
        let started = Instant::now();
        let per_node = self.per_node(ttl);
        let quorum = self.quorum();
        // Each node's request in a task of its own, so that one still in
        // flight when the outcome is known can finish (below); `in_flight`
        // tells when each task is over.
        let mut in_flight = Vec::with_capacity(self.nodes.len());
        let delayed = self.delayed.load(Ordering::Relaxed);
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let (node, names, token) = (node.clone(), names.clone(), *token);
                let (request, over) = NodeRequest::new(i);
                in_flight.push(Some(request));
                let late = (delayed != 0 && delayed >> 32 == i as u64)
                    .then(|| Duration::from_millis(delayed & u64::from(u32::MAX)));
                tokio::spawn(async move {
                    let _over = over;
                    if let Some(late) = late {
                        tokio::time::sleep(late).await;
                    }
                    let answer = timeout(
                        per_node,
                        node.acquire(LockRef::new(&names, &token, ttl), Duration::ZERO),
                    )
                    .await;
                    (i, answer)
                })
            })
            .collect();
        let mut acquired = Vec::new();
        let mut busy = Vec::new();
        let mut failed = 0;
        // The first failure, for the error when no majority answers: a
        // node's own error (a refused connection, ...), or a timeout.
        let mut first_failure: Option<BackendError> = None;
        // Decide as soon as the outcome is known: a dead node must not make
        // every acquire wait for its timeout.
        while let Some(joined) = pending.next().await {
            match joined {
                Ok((i, answer)) => {
                    in_flight[i] = None;
                    match answer {
                        Ok(Ok(AcquireOutcome::Acquired { fencing })) => acquired.push((i, fencing)),
                        Ok(Ok(AcquireOutcome::Busy { remaining, .. })) => busy.push(remaining),
                        Ok(Err(LockError::Backend(e))) => {
                            failed += 1;
                            first_failure.get_or_insert(e);
                        }
                        Ok(Err(_)) => failed += 1,
                        Err(_) => {
                            failed += 1;
                            first_failure.get_or_insert_with(|| {
                                BackendError::timeout(format!(
                                    "node {i} did not answer within {}",
                                    crate::error::shown(per_node)
                                ))
                            });
                        }
                    }
                }
                Err(_) => failed += 1,
            }
            let minority = self.nodes.len() - quorum;
            if acquired.len() >= quorum || busy.len() > minority || failed > minority {
                break;
            }
        }
        let undecided = pending.len();
        let in_flight: Vec<NodeRequest> = in_flight.into_iter().flatten().collect();
        if acquired.len() < quorum {
            // Not ours: requests still in flight are stopped; one that took
            // its node anyway is undone by the release below.
            for request in pending.iter() {
                request.abort();
            }
        }
        // Ours: the requests still in flight go on, so that the slower nodes
        // hold the lock too (renewed with the rest) and it survives more
        // than the bare minimum of node failures. Either way a release on
        // their nodes goes once they are over (stopped, answered or timed
        // out), never ahead of them.
        drop(pending);
        self.stragglers.keep(names, token, in_flight);
        let valid = |now: Instant| {
            ttl.checked_sub(now - started + drift(ttl))
                .is_some_and(|v| !v.is_zero())
        };
        if acquired.len() >= quorum && valid(Instant::now()) {
            let fencing = acquired.iter().map(|(_, f)| *f).max().unwrap_or(0);
            let fence = names.fence();
            let raised = join_all(acquired.iter().map(|(i, _)| {
                let mut conn = self.nodes[*i].connection();
                let fence = &fence;
                async move {
                    timeout(
                        per_node,
                        FENCE_RAISE
                            .key(fence)
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
        // Too few nodes can answer for a majority either way (those still
        // undecided were stopped): an error at once, no split-vote pause.
        if busy.len() <= self.nodes.len() - quorum && failed + undecided > self.nodes.len() - quorum
        {
            let context = format!(
                "Redlock: {failed} of {} nodes failed or did not answer in time; a majority of \
                 {quorum} must answer",
                self.nodes.len()
            );
            return Err(match first_failure {
                Some(cause) => BackendError::wrap(context, cause),
                None => BackendError::new(context),
            }
            .into());
        }
        if !acquired.is_empty() {
            // A split vote (likely while a minority is down, when a majority
            // needs every live node): a random pause. With a node down,
            // attempts last up to a per-node timeout and contenders need the
            // long pause to stop splitting in lockstep.
            let pause = split_vote_pause(split_pause.filter(|_| failed == 0), per_node);
            tracing::debug!(key = %names.lock, took = acquired.len(), busy = busy.len(),
                pause_us = pause.as_micros() as u64, "Redlock: split vote; pausing");
            tokio::time::sleep(pause).await;
        }
        if busy.len() > self.nodes.len() - quorum {
            busy.sort();
            // The lock cannot be ours before enough holders' leases end.
            let needed = busy.len() + quorum - self.nodes.len();
            let remaining = busy
                .get(needed.saturating_sub(1))
                .copied()
                .unwrap_or_default();
            // Redlock waiters never queue, so no hand-over needs a fence.
            return Ok(AcquireOutcome::Busy {
                remaining,
                fence: 0,
            });
        }

        // A majority answered, but too slowly for the lease: busy for now.
        Ok(AcquireOutcome::Busy {
            remaining: Duration::from_millis(1),
            fence: 0,
        })
    }

    /// Releases on every node and waits for each (a majority that answered
    /// too late, a refused acquire's clean-up): on a node with one of this
    /// lock's acquire requests still in flight, once that request is over.
    async fn release_all(&self, names: &KeyNames, token: &Token, ttl: Duration) -> usize {
        let per_node = self.per_node(ttl).max(Duration::from_millis(50));
        let stragglers = self.stragglers.take(names, token, self.nodes.len());
        join_all(
            self.nodes
                .iter()
                .zip(stragglers)
                .map(|(node, straggler)| async move {
                    if let Some(request) = straggler {
                        request.ended().await;
                    }
                    timeout(
                        per_node,
                        node.release(LockRef::new(names, token, ttl), false, false),
                    )
                    .await
                }),
        )
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(Released::Yes))))
        .count()
    }

    /// Publishes a free notice on `channel` on every node, best effort.
    pub(crate) async fn announce(&self, channel: &str) {
        join_all(self.nodes.iter().map(|node| node.announce(channel))).await;
    }

    /// Extends each lease on every node; a lease is extended when a majority
    /// confirmed it, refused only when so many refused it that the nodes
    /// that did not answer could not make a majority ([`majority`]), and
    /// unknown otherwise. An error when fewer than a majority answered at
    /// all (the watchdog then re-tries until the validity runs out).
    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<Option<bool>>, LockError> {
        let ttl = leases.iter().map(|l| l.2).min().unwrap_or(Duration::ZERO);
        let per_node = self.per_node(ttl);
        let answers = join_all(
            self.nodes
                .iter()
                .map(|node| timeout(per_node, node.extend_many(leases))),
        )
        .await;
        let answered: Vec<Vec<Option<bool>>> = answers
            .into_iter()
            .map(|a| a.ok().and_then(Result::ok))
            .map(|a| a.filter(|a| a.len() == leases.len()))
            .map(|a| a.unwrap_or_else(|| vec![None; leases.len()]))
            .collect();
        let quorum = self.quorum();
        let nodes_answering = answered
            .iter()
            .filter(|a| a.iter().any(Option::is_some))
            .count();
        if nodes_answering < quorum {
            return Err(BackendError::new(format!(
                "Redlock: only {} of {} nodes answered the renewal",
                nodes_answering,
                self.nodes.len()
            ))
            .into());
        }
        Ok((0..leases.len())
            .map(|i| {
                let said: Vec<Option<bool>> = answered.iter().map(|a| a[i]).collect();
                majority(&said, quorum)
            })
            .collect())
    }

    /// Releases on every node. [`Released::Yes`] when a majority released it;
    /// [`Released::Gone`] when a majority released it or answered "not ours"
    /// after a lost copy of the release (a node that answered neither way
    /// cannot make it [`Released::NotOurs`]); an error whose outcome is unknown
    /// when too few nodes answered to tell.
    pub(crate) async fn release(&self, lock: LockRef<'_>) -> Result<Released, LockError> {
        let LockRef { names, token, ttl } = lock;
        let per_node = self.per_node(ttl).max(Duration::from_millis(50));
        // Every node gets the release, in a task of its own; the answer is
        // given as soon as a majority decided it, so a dead node does not
        // delay it. On a node whose acquire request is still in flight, the
        // release goes once that request is over (answered or timed out).
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .zip(self.stragglers.take(names, token, self.nodes.len()))
            .map(|(node, straggler)| {
                let (node, names, token) = (node.clone(), names.clone(), *token);
                tokio::spawn(async move {
                    if let Some(request) = straggler {
                        request.ended().await;
                    }
                    timeout(
                        per_node,
                        node.release(LockRef::new(&names, &token, ttl), false, false),
                    )
                    .await
                })
            })
            .collect();
        let mut tally = ReleaseTally::new(self.nodes.len());
        while let Some(answer) = pending.next().await {
            tally.add(match answer {
                Ok(Ok(Ok(released))) => Some(released),
                _ => None,
            });
            if let Some(decided) = tally.decided() {
                return Ok(decided);
            }
        }
        Err(BackendError::outcome_unknown(
            format!(
                "Redlock: {} of {} nodes answered the release, too few to tell: its outcome is unknown \
                 (where it did not run, the lease runs out by itself)",
                tally.answered(),
                self.nodes.len()
            ),
            None,
        )
        .into())
    }

    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        for node in &self.nodes {
            let _ = timeout(self.node_timeout, node.delete(names)).await;
        }
        Ok(())
    }

    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.waiters.is_subscribed(channel)
    }

    /// Registers on every node's notices on `channel` (one registry for all
    /// of them), so a notice from any node wakes the waiter.
    pub(crate) async fn register(&self, channel: &str, token: &Token) -> WaitHandle {
        let (handle, _) = WaitHandle::new(&self.waiters, channel, &token.digest());
        // Subscribe everywhere, but wait only for a majority: a dead node's
        // subscriber is reconnecting and must not hold the waiter up.
        let per_node = self.node_timeout;
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| timeout(per_node, node.subscribe(channel)))
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

    /// Makes the acquire requests to `node` start `by` late (tests).
    pub(crate) fn delay_acquires(&self, node: usize, by: Duration) {
        let ms = u64::try_from(by.as_millis())
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX));
        self.delayed
            .store((node as u64) << 32 | ms, Ordering::Relaxed);
    }

    /// Every node, in configuration order.
    pub(crate) fn nodes(&self) -> &[Arc<RedisBackend>] {
        &self.nodes
    }

    /// How long one node may take to answer one request.
    pub(crate) fn node_timeout(&self) -> Duration {
        self.node_timeout
    }
}
