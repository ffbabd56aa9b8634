//! The acquire requests of a granted Redlock lock still in flight on the
//! slower nodes, kept until its release: on each node the release goes
//! only once that node's request is over, or it could reach the node first
//! and the request behind it would leave the node holding the lock for a
//! lease.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::key::KeyNames;
use crate::token::Token;

/// One node's acquire request, running in its task: `ended` resolves (with
/// an error: nothing is ever sent on it) once that task is over, answered,
/// timed out or aborted.
#[derive(Debug)]
pub(super) struct InFlight {
    node: usize,
    ended: oneshot::Receiver<()>,
}

impl InFlight {
    /// The request to node `node`, and what its task holds until it ends.
    pub(super) fn new(node: usize) -> (Self, oneshot::Sender<()>) {
        let (over, ended) = oneshot::channel();
        (Self { node, ended }, over)
    }

    /// Resolves once the request's task is over.
    pub(super) async fn ended(self) {
        let _ = self.ended.await;
    }

    fn is_over(&mut self) -> bool {
        matches!(
            self.ended.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        )
    }
}

/// The requests still in flight when their lock was granted, by lock name
/// and token.
#[derive(Debug, Default)]
pub(super) struct Stragglers(Mutex<HashMap<(String, Token), Vec<InFlight>>>);

impl Stragglers {
    /// Keeps `in_flight`, the requests of `names` by `token` still running
    /// when the lock was granted, for its release; forgets those of other
    /// locks that are over.
    pub(super) fn keep(&self, names: &KeyNames, token: &Token, in_flight: Vec<InFlight>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, requests| !requests.iter_mut().all(InFlight::is_over));
        if !in_flight.is_empty() {
            kept.insert((names.lock.clone(), *token), in_flight);
        }
    }

    /// The requests of `names` by `token` kept by [`Self::keep`], by node
    /// (of `nodes`); taken: one release waits for them.
    pub(super) fn take(
        &self,
        names: &KeyNames,
        token: &Token,
        nodes: usize,
    ) -> Vec<Option<InFlight>> {
        let mut by_node: Vec<Option<InFlight>> = (0..nodes).map(|_| None).collect();
        let taken = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(names.lock.clone(), *token));
        for request in taken.into_iter().flatten() {
            let node = request.node;
            by_node[node] = Some(request);
        }
        by_node
    }
}
