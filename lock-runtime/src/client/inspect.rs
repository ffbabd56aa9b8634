//! [`LockClient::inspect`]: who holds what, for operators and dashboards.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::LockClient;
use crate::backend::inspect::Observed;
use crate::backoff::Retry;
use crate::error::LockError;
use crate::key::{Access, KeyNames, LockKind, validate_key};
use crate::token::public_part;

/// A lock's state as [`LockClient::inspect`] read it: a snapshot, stale the
/// moment it is returned. For operators, dashboards and tests; never decide
/// to skip taking a lock from it.
///
/// Holders and waiters are named by their clients' labels
/// ([`LockClientBuilder::label`](crate::LockClientBuilder::label)); a
/// client whose registry entry is gone (it ended over a minute ago) shows as
/// `unknown client <id>`, a value set by hand as `unknown`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The key, as given (without the client's prefix).
    pub key: String,
    /// Which of the key's locks this is: the first of the mutex, the
    /// read-write lock, the semaphore and the leader election named `key`
    /// that is held or has waiters (the mutex when none is).
    pub kind: LockKind,
    /// The holder's label; where several readers or permits hold, the first
    /// of them (the one that took it first).
    pub holder: Option<String>,
    /// Every holder's label, in the order they took it (one entry per
    /// guard: a client holding two permits appears twice). On Redis and
    /// Valkey, where a lock taken free has no fencing token until asked,
    /// the order they asked for it, to the millisecond.
    pub holders: Vec<String>,
    /// The queued waiters' labels, in line order (at most 1,000 are read):
    /// one entry per place in the server's line. A waiting task takes one,
    /// except that with local hand-over (the builder's `local_handover`, on
    /// by default) the tasks of one client waiting for the same mutex queue
    /// once, as one participant, and are handed the key among themselves:
    /// such a client shows once however many of its tasks wait.
    pub waiting: Vec<String>,
    /// When the (first) holder asked for the lock: derived from its token,
    /// which carries the time the holder's client drew it, at the start of
    /// the acquire (so a holder that waited in line shows when it began to
    /// wait), by that client's clock. `None` for a value set by hand.
    pub since: Option<SystemTime>,
    /// Somebody holds the lock (on Redlock: a majority of the masters).
    pub held: bool,
    /// The lease left, when held with one (`None` when free, or when the key
    /// was set without expiry by hand).
    pub remaining: Option<Duration>,
    /// The highest fencing token issued so far for the keys of this key's
    /// hash slot (they share one counter; 0 before any): at least the
    /// current holder's token (once it has one), and below the next one.
    pub fencing_counter: u64,
    /// How many waiters are queued for the lock, counted as
    /// [`waiting`](Self::waiting) lists them (Redlock's waiters do not
    /// queue: 0 there).
    pub waiters: usize,
    /// This client holds the lock: one of its guards for `key` is alive and
    /// not known lost.
    pub held_by_this_client: bool,
    /// The fencing token of this client's guard, when it holds the lock
    /// and its token was issued (a lock taken uncontended gets its token
    /// when first asked: [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)).
    pub fencing_token: Option<u64>,
}

impl LockClient {
    /// Reads the state of the lock `key` without touching it: which of the
    /// key's locks is in use (see [`LockState::kind`]), whether it is held,
    /// by whom and for how long, the fencing counter, who waits in line, and
    /// whether this client is the holder. Two round trips: one for the
    /// key's locks (one hash slot), one for the labels of clients other
    /// than this one; two more when none of them is in use, for the leader
    /// election named `key` (its lock, then its leader's label).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let client = lock_runtime::LockClient::builder().memory().build().await?;
    /// let guard = client.lock("order:42").acquire().await?;
    /// let token = guard.fencing_token().await?;
    /// let state = client.inspect("order:42").await?;
    /// assert!(state.held && state.held_by_this_client);
    /// assert_eq!(state.holder, Some(client.label().to_owned()));
    /// assert_eq!(state.fencing_token, Some(token));
    /// guard.release().await?;
    /// assert!(!client.inspect("order:42").await?.held);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<LockState, LockError> {
        validate_key(key)?;
        // Reads only: sent again once after a broken connection (one the
        // server closed while idle is only found broken by the next command).
        let inspect = || self.inspect_once(key);
        Retry::ONCE.start().send("inspect", None, inspect).await
    }

    async fn inspect_once(&self, key: &str) -> Result<LockState, LockError> {
        let prefix = &self.0.prefix;
        let seen = self.0.backend.inspect(prefix, key).await?;
        let busy = |o: &Observed| o.held || o.queued > 0;
        let (reported, seen) = if busy(&seen.mutex) {
            (LockKind::Mutex, seen.mutex)
        } else if busy(&seen.rw) {
            (LockKind::RwLock, seen.rw)
        } else if busy(&seen.semaphore) {
            (LockKind::Semaphore, seen.semaphore)
        } else {
            let names = KeyNames::leader(prefix, key);
            let election = self.0.backend.observe_leader(&names).await?;
            if busy(&election) {
                (LockKind::Leader, election)
            } else {
                (LockKind::Mutex, seen.mutex)
            }
        };
        // Names to read, not to take: the access is not used.
        let names = KeyNames::of_kind(prefix, key, reported, Access::Exclusive);
        let mine = self.0.watchdog.holding(&names.lock);
        let tokens = seen
            .holders
            .iter()
            .map(|h| h.token.as_str())
            .chain(seen.waiting.iter().map(String::as_str));
        let labels = self.labels_of(tokens).await?;
        let name = |token: &str| match public_part(token) {
            Some((id, _)) => labels
                .get(id)
                .cloned()
                .unwrap_or_else(|| format!("unknown client {id}")),
            None => "unknown".to_owned(),
        };
        let mut holders: Vec<String> = seen.holders.iter().map(|h| name(&h.token)).collect();
        if reported == LockKind::Leader && seen.held {
            // The label the leader campaigned under, which observers see.
            if let (Some(first), Some((label, ..))) =
                (holders.first_mut(), self.0.backend.leader(&names).await?)
            {
                *first = label;
            }
        }
        let since = seen
            .holders
            .first()
            .and_then(|h| public_part(&h.token))
            .map(|(_, ms)| UNIX_EPOCH + Duration::from_millis(ms));
        Ok(LockState {
            held_by_this_client: mine.is_some(),
            fencing_token: mine.flatten(),
            key: key.to_owned(),
            kind: reported,
            holder: holders.first().cloned(),
            waiting: seen.waiting.iter().map(|t| name(t)).collect(),
            holders,
            since,
            held: seen.held,
            remaining: seen.remaining,
            fencing_counter: seen.fence,
            waiters: seen.queued,
        })
    }

    /// The idempotency record `name` (key `key`) as a held lock, while a
    /// request runs it: its claimer named by label.
    async fn record_in_flight(
        &self,
        key: String,
        name: &str,
    ) -> Result<Option<LockState>, LockError> {
        #[cfg(feature = "idempotency")]
        if let Some(seen) = self.0.backend.record_in_flight(name).await? {
            let labels = self.labels_of(std::iter::once(seen.owner.as_str())).await?;
            let (holder, since) = match public_part(&seen.owner) {
                Some((id, ms)) => (
                    labels
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| format!("unknown client {id}")),
                    Some(UNIX_EPOCH + Duration::from_millis(ms)),
                ),
                None => ("unknown".to_owned(), None),
            };
            return Ok(Some(LockState {
                key,
                kind: LockKind::IdempotencyRecord,
                holder: Some(holder.clone()),
                holders: vec![holder],
                waiting: Vec::new(),
                since,
                held: true,
                remaining: seen.remaining,
                fencing_counter: 0,
                waiters: 0,
                held_by_this_client: false,
                fencing_token: None,
            }));
        }
        let _ = (key, name);
        Ok(None)
    }

    /// The labels of the clients that drew `tokens`, by client id: this
    /// client's own without a round trip, the others' from the registry.
    async fn labels_of<'a>(
        &self,
        tokens: impl Iterator<Item = &'a str>,
    ) -> Result<HashMap<String, String>, LockError> {
        let own = self.0.salt.client_id();
        let mut ids: Vec<&str> = tokens
            .filter_map(|t| public_part(t).map(|(id, _)| id))
            .filter(|id| *id != own)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut labels = self.0.backend.labels_of(&self.0.prefix, &ids).await?;
        labels.insert(own.to_owned(), self.0.label.clone());
        Ok(labels)
    }
}

impl LockClient {
    /// The locks held now whose keys start with `starting_with` (`""`: all),
    /// at most `limit` of them, each as [`LockClient::inspect`] sees it
    /// (mutexes, read-write locks and semaphores; holders and waiters
    /// named; with the `axum` feature also `IdempotencyLayer` records in
    /// flight, by their hashed names, named by the claimer's label), sorted
    /// by key. Found with `SCAN` (never `KEYS`), which reads four names a
    /// lock asked for, and more while fewer than `limit` of those it found
    /// are held (completed records, locks released since): on one server,
    /// a Sentinel group, Redlock (the union over the masters), a Redis
    /// Cluster (every master that serves slots, found with
    /// `CLUSTER NODES`) and the embedded backend (mutexes).
    pub async fn list(
        &self,
        starting_with: &str,
        limit: usize,
    ) -> Result<Vec<LockState>, LockError> {
        let prefix = &self.0.prefix;
        // The names of the keys asked for: a mutex, a read-write lock (its
        // writer or readers), a semaphore (its holders), a record.
        let of_key = |name: &str| {
            crate::key::parse(prefix, name).is_some_and(|(kind, key)| {
                matches!(kind, 'L' | 'W' | 'R' | 'P' | 'I') && key.starts_with(starting_with)
            })
        };
        // Names found are not all held (a completed record, a lock released
        // since): the scan finds four names a lock at first, and more, up
        // to every name there is, while fewer than `limit` turn out held.
        let mut cap = limit.saturating_mul(4).max(limit);
        let mut looked = std::collections::HashSet::new();
        let mut held = Vec::new();
        while held.len() < limit {
            // A read, sent again once after a broken connection (as `inspect`).
            let scan = || self.0.backend.scan_locks(prefix, cap, &of_key);
            let names = Retry::ONCE.start().send("list: scan", None, scan).await?;
            let mut keys: Vec<(String, Option<&String>)> = names
                .iter()
                .filter_map(|name| match crate::key::parse(prefix, name)? {
                    ('I', key) => Some((key, Some(name))),
                    // A name no client made (written by hand: an empty,
                    // oversized or control-character key) is passed over,
                    // not the end of the listing.
                    (_, key) if crate::key::validate_key(&key).is_err() => {
                        tracing::warn!(name = %name.escape_debug(), "list: passing over a name no client can have made");
                        None
                    }
                    (_, key) => Some((key, None)),
                })
                .collect();
            keys.sort();
            keys.dedup();
            for (key, record) in keys {
                if held.len() == limit {
                    break;
                }
                if !looked.insert((key.clone(), record.cloned())) {
                    continue;
                }
                let state = match record {
                    None => self.inspect(&key).await?,
                    Some(name) => match self.record_in_flight(key, name).await? {
                        Some(state) => state,
                        None => continue,
                    },
                };
                if state.held {
                    held.push(state);
                }
            }
            if names.len() < cap {
                break; // every name there is was found
            }
            cap = cap.saturating_mul(4);
        }
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// Deletes the lock `key` whoever holds it, as an operator's `DEL` would;
    /// `true` if it was held. For emergencies (`lockctl force-release`): the
    /// holder is not asked, and finds out at its next renewal (its `lost()`
    /// resolves), while a new holder may already run: a holder in another
    /// process, that is (this client's own holders, every holder on the
    /// embedded backend, are lost at once). Until then its guard still
    /// answers a fencing token it already had (one it had not, minted on
    /// first use, is refused: `Lost`); the raised counter below is what
    /// stops its writes. Logged as a `tracing`
    /// warning naming the key.
    ///
    /// It takes the lock [`inspect`](Self::inspect) reports (the mutex,
    /// every holder of the read-write lock or the semaphore, or the leader of
    /// the election `key` and its record: the next candidate in line is
    /// elected at once; with none, observers see no leader), and raises the
    /// key's fencing counter: the next holder's token is above every token
    /// issued before, and the record that [`fence::redis`](crate::fence::redis)
    /// keeps for resource `key` (the key without the client's prefix: records
    /// are not under it) on the lock's server is raised to it too, so
    /// the evicted holder's next fenced write there is refused
    /// (`LockError::Stale`) even before a new holder writes. Waiters are told
    /// to try again at once.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let state = self.inspect(key).await?;
        let prefix = &self.0.prefix;
        // How many waiters the embedded backend grants once the holders are
        // gone: one permit, the semaphore's own count not being known here.
        let access = match state.kind {
            LockKind::Semaphore => Access::Shared(1),
            _ => Access::Exclusive,
        };
        let names = KeyNames::of_kind(prefix, key, state.kind, access);
        // This client's own holders are told at once (on the embedded
        // backend, every holder), not at their next renewal. Those of now:
        // a holder handed the key by the release below is not evicted.
        let mut ours = self.0.watchdog.locks();
        ours.retain(|held| held.names.lock == names.lock);
        let fence = self.0.backend.force_release(&names, key).await?;
        for held in ours {
            held.lose("force-released by an operator");
        }
        tracing::warn!(
            %key,
            kind = state.kind.as_str(),
            was_held = state.held,
            holder = state.holder.as_deref().unwrap_or("-"),
            fencing_counter = fence,
            "lock force-released by an operator"
        );
        Ok(state.held)
    }
}
