//! How the nodes' answers decide an outcome: one release's, and a yes-or-no
//! step's (a renewal, a record's completion) by [`majority`], of masters
//! that each count once ([`distinct_masters`]).

use crate::backend::Released;
use crate::error::LockError;

/// `true` when a majority of nodes said `true`; `false` only when so many
/// said `false` that no majority can say `true`; otherwise `None` (too few
/// answers to tell: a lost reply may have been a `true`), which the caller
/// treats as unknown rather than as a refusal.
pub(crate) fn majority(answers: &[Option<bool>], quorum: usize) -> Option<bool> {
    let yes = answers.iter().filter(|a| **a == Some(true)).count();
    let no = answers.iter().filter(|a| **a == Some(false)).count();
    if yes >= quorum {
        Some(true)
    } else if no > answers.len() - quorum {
        Some(false)
    } else {
        None
    }
}

/// Combines the nodes' answers to one release, as they come in.
#[derive(Debug)]
pub(super) struct ReleaseTally {
    nodes: usize,
    yes: usize,
    gone: usize,
    not_ours: usize,
    failed: usize,
}

impl ReleaseTally {
    pub(super) fn new(nodes: usize) -> Self {
        Self {
            nodes,
            yes: 0,
            gone: 0,
            not_ours: 0,
            failed: 0,
        }
    }

    /// One node's answer; `None`: it failed or did not answer in time.
    pub(super) fn add(&mut self, answer: Option<Released>) {
        match answer {
            Some(Released::Yes) => self.yes += 1,
            Some(Released::Gone) => self.gone += 1,
            Some(Released::NotOurs) => self.not_ours += 1,
            None => self.failed += 1,
        }
    }

    pub(super) fn answered(&self) -> usize {
        self.yes + self.gone + self.not_ours
    }

    /// The outcome, once the answers so far decide it whatever the rest say.
    pub(super) fn decided(&self) -> Option<Released> {
        let quorum = self.nodes / 2 + 1;
        let open = self.nodes - self.yes - self.gone - self.not_ours - self.failed;
        if self.yes >= quorum {
            return Some(Released::Yes);
        }
        // A majority released it or may have (a lost copy), and the nodes
        // still out cannot make it a plain `Yes` any more.
        if self.yes + self.gone >= quorum && self.yes + open < quorum {
            return Some(Released::Gone);
        }
        // Not ours on so many nodes that no majority can have released it,
        // whatever the nodes still out or failed did.
        if self.nodes - self.not_ours < quorum {
            return Some(Released::NotOurs);
        }
        None
    }
}

/// Every master counts once in a majority: a URL naming a server already
/// given (the same host, port and database) would make one server two
/// votes, so it is a configuration error.
pub(super) fn distinct_masters(urls: &[String]) -> Result<(), LockError> {
    let mut seen = std::collections::HashSet::new();
    for url in urls {
        // A URL that does not parse is told by the connect that follows.
        let Ok(client) = redis::Client::open(url.as_str()) else {
            continue;
        };
        let info = client.get_connection_info();
        let server = format!("{}/{}", info.addr(), info.redis_settings().db());
        if !seen.insert(server) {
            return Err(LockError::Config(format!(
                "Redlock needs independent masters: {} is given twice",
                info.addr()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod release_tally_tests {
    use super::*;

    fn tally(nodes: usize, answers: &[Option<Released>]) -> Option<Released> {
        let mut t = ReleaseTally::new(nodes);
        let mut decided = None;
        for a in answers {
            t.add(*a);
            decided = decided.or(t.decided());
        }
        decided
    }

    use Released::{Gone, NotOurs, Yes};

    #[test]
    fn a_majority_of_releases_decides_at_once() {
        assert_eq!(tally(3, &[Some(Yes), Some(Yes)]), Some(Yes));
        assert_eq!(tally(5, &[Some(Yes), Some(Yes)]), None);
        assert_eq!(
            tally(5, &[Some(Yes), None, Some(Yes), Some(Yes)]),
            Some(Yes)
        );
    }

    #[test]
    fn lost_copies_count_towards_a_majority_once_yes_is_out_of_reach() {
        // 1 yes + 1 gone of 3: the third could still say yes; wait for it.
        assert_eq!(tally(3, &[Some(Yes), Some(Gone)]), None);
        assert_eq!(
            tally(3, &[Some(Yes), Some(Gone), Some(NotOurs)]),
            Some(Gone)
        );
        assert_eq!(tally(3, &[Some(Gone), Some(Gone)]), Some(Gone));
        assert_eq!(tally(3, &[Some(Yes), Some(Gone), None]), Some(Gone));
    }

    #[test]
    fn not_ours_on_a_blocking_minority_or_more_is_not_ours() {
        assert_eq!(tally(3, &[Some(NotOurs), Some(NotOurs)]), Some(NotOurs));
        assert_eq!(tally(5, &[Some(NotOurs), Some(NotOurs)]), None);
        assert_eq!(
            tally(5, &[Some(NotOurs), Some(NotOurs), Some(NotOurs)]),
            Some(NotOurs)
        );
        assert_eq!(
            tally(3, &[Some(Yes), Some(NotOurs), Some(NotOurs)]),
            Some(NotOurs)
        );
    }

    #[test]
    fn failed_nodes_leave_the_outcome_unknown() {
        // A node that did not answer may have released: neither way is proven.
        assert_eq!(tally(3, &[Some(Yes), None, Some(NotOurs)]), None);
        assert_eq!(tally(3, &[None, None, Some(Yes)]), None);
        assert_eq!(
            tally(5, &[Some(Gone), Some(Yes), None, None, Some(NotOurs)]),
            None
        );
    }
}
