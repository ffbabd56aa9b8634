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
pub(super) struct NodeRequest {
    node: usize,
    ended: oneshot::Receiver<()>,
}

impl NodeRequest {
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
pub(super) struct Stragglers(Mutex<Kept>);

/// What [`Stragglers`] keeps, and when it next forgets what is over.
#[derive(Debug, Default)]
struct Kept {
    by_lock: HashMap<(String, Token), Vec<NodeRequest>>,
    /// The size at which the locks whose requests are all over are
    /// forgotten (locks never released, or released elsewhere): twice
    /// what was left the last time, so that costs each lock O(1).
    prune_at: usize,
}

impl Stragglers {
    /// Keeps `in_flight`, the requests of `names` by `token` still running
    /// when the lock was granted, for its release; forgets those of other
    /// locks that are over, now and then.
    pub(super) fn keep(&self, names: &KeyNames, token: &Token, in_flight: Vec<NodeRequest>) {
        if in_flight.is_empty() {
            return;
        }
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.by_lock.len() >= kept.prune_at {
            kept.by_lock
                .retain(|_, requests| !requests.iter_mut().all(NodeRequest::is_over));
            kept.prune_at = (2 * kept.by_lock.len()).max(64);
        }
        kept.by_lock.insert((names.lock.clone(), *token), in_flight);
    }

    /// The requests of `names` by `token` kept by [`Self::keep`], by node
    /// (of `nodes`); taken: one release waits for them.
    pub(super) fn take(
        &self,
        names: &KeyNames,
        token: &Token,
        nodes: usize,
    ) -> Vec<Option<NodeRequest>> {
        let mut by_node: Vec<Option<NodeRequest>> = (0..nodes).map(|_| None).collect();
        let taken = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_lock
            .remove(&(names.lock.clone(), *token));
        for request in taken.into_iter().flatten() {
            let node = request.node;
            by_node[node] = Some(request);
        }
        by_node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_taken_by_node_once_and_the_locks_of_ended_ones_forgotten() {
        let stragglers = Stragglers::default();
        let (names, token) = (KeyNames::new("p:", "k"), Token::for_test());
        let (slow, slow_task) = NodeRequest::new(3);
        stragglers.keep(&names, &token, vec![slow]);
        // Another token's lock is another entry; nothing kept for no request.
        stragglers.keep(&names, &Token::for_test(), Vec::new());
        assert!(
            stragglers
                .take(&names, &Token::for_test(), 5)
                .iter()
                .all(Option::is_none)
        );
        let taken = stragglers.take(&names, &token, 5);
        let nodes: Vec<bool> = taken.iter().map(Option::is_some).collect();
        assert_eq!(nodes, [false, false, false, true, false]);
        assert!(
            stragglers
                .take(&names, &token, 5)
                .iter()
                .all(Option::is_none)
        );
        // The release waits until the request's task is over.
        let request = taken.into_iter().flatten().next().unwrap();
        let waiting = tokio::spawn(request.ended());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(slow_task);
        waiting.await.unwrap();

        // Locks never released whose requests ended are forgotten once the
        // map has grown to its pruning size; those still in flight stay.
        let mut running = Vec::new();
        for i in 0..64 {
            let (request, task) = NodeRequest::new(0);
            let key = KeyNames::new("p:", &format!("ended-{i}"));
            stragglers.keep(&key, &token, vec![request]);
            if i == 0 {
                running.push(task);
            }
        }
        let (request, _task) = NodeRequest::new(1);
        stragglers.keep(&KeyNames::new("p:", "last"), &token, vec![request]);
        let kept = stragglers.0.lock().unwrap();
        assert_eq!(kept.by_lock.len(), 2, "the ended-0 lock and the last");
        assert_eq!(kept.prune_at, 64);
    }
}
