//! Who waits for which key in this process: the wake-up side of "waiting
//! without polling".
//!
//! Waiters queue in the backend (FIFO per key). A release hands the lock
//! straight to the head of that queue and sends one notice naming the new
//! owner's token and fencing token; the registry routes it to exactly that
//! waiter, so a release wakes one task, not a herd. A notice that names no
//! owner ("free") wakes every waiter of the key, which is only needed when the
//! queue was lost (a restarted server, say).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What an observer registers under instead of a token digest (digests are
/// hex, so never start with it): observers hear every notice of a channel
/// (a leader election's watchers), and never take a waiter's part.
pub(crate) const OBSERVER: &str = "observer:";

/// One waiting acquisition.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    pub(crate) notify: Notify,
    /// The fencing token of a hand-over to us; 0 when none arrived.
    granted: AtomicU64,
    /// A hand-over to another waiter of this key was seen.
    handoff_seen: AtomicBool,
    /// A notice said the key is free, or notices may have been missed: try
    /// again. A wake-up with none of these three set is the permit of a
    /// notice whose news an earlier wake-up already took.
    freed: AtomicBool,
}

impl Waiter {
    /// The hand-over that arrived since the last call, if any.
    pub(crate) fn take_grant(&self) -> Option<u64> {
        match self.granted.swap(0, Ordering::AcqRel) {
            0 => None,
            fencing => Some(fencing),
        }
    }

    /// Whether a hand-over to another waiter was seen since the last call.
    pub(crate) fn take_handoff_seen(&self) -> bool {
        self.handoff_seen.swap(false, Ordering::AcqRel)
    }

    /// Whether a free notice (or a wake after notices may have been missed)
    /// arrived since the last call.
    pub(crate) fn take_freed(&self) -> bool {
        self.freed.swap(false, Ordering::AcqRel)
    }

    fn free(&self) {
        self.freed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn grant(&self, fencing: u64) {
        self.granted.store(fencing, Ordering::Release);
        self.notify.notify_one();
    }
}

/// Notice channel -> (digest of the owner token -> waiter), and which channels the server
/// confirmed we are subscribed to.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    channels: Mutex<HashMap<String, HashMap<String, Arc<Waiter>>>>,
    /// Confirmed subscriptions -> "nobody waited at the last sweep".
    /// Lock order: `channels` before `subscribed`.
    subscribed: Mutex<HashMap<String, bool>>,
}

impl Registry {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Arc<Waiter>>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the waiter `token` on `channel`. `true` in the second field
    /// when the channel had no waiter before (a subscription may be needed).
    pub(crate) fn register(&self, channel: &str, token: &str) -> (Arc<Waiter>, bool) {
        let mut channels = self.channels();
        let new_channel = !channels.contains_key(channel);
        let waiter = Arc::new(Waiter::default());
        channels
            .entry(channel.to_owned())
            .or_default()
            .insert(token.to_owned(), waiter.clone());
        (waiter, new_channel)
    }

    pub(crate) fn unregister(&self, channel: &str, token: &str) {
        let mut channels = self.channels();
        if let Some(waiters) = channels.get_mut(channel) {
            waiters.remove(token);
            if waiters.is_empty() {
                channels.remove(channel);
            }
        }
    }

    /// Routes a notice: `token:fencing` goes to that waiter only; anything else
    /// ("free") wakes every waiter of the channel.
    pub(crate) fn deliver(&self, channel: &str, payload: &[u8]) {
        match parse_grant(payload) {
            Some((token, fencing)) => self.grant(channel, token, fencing),
            None => {
                if let Some(waiters) = self.channels().get(channel) {
                    for waiter in waiters.values() {
                        waiter.free();
                    }
                }
            }
        }
    }

    /// Hands over to `token`. One other waiter of the key (if any) learns of
    /// the hand-over, so that if the new owner is dead, somebody re-tries when
    /// its short hand-over lease runs out rather than at the old holder's.
    pub(crate) fn grant(&self, channel: &str, token: &str, fencing: u64) {
        let channels = self.channels();
        let Some(waiters) = channels.get(channel) else {
            return;
        };
        if let Some(waiter) = waiters.get(token) {
            waiter.grant(fencing);
        }
        if let Some((_, watcher)) = waiters
            .iter()
            .find(|(t, _)| t.as_str() != token && !t.starts_with(OBSERVER))
        {
            watcher.handoff_seen.store(true, Ordering::Release);
            watcher.notify.notify_one();
        }
        for (_, observer) in waiters.iter().filter(|(t, _)| t.starts_with(OBSERVER)) {
            observer.notify.notify_one();
        }
    }

    /// Wakes every waiter (after notices may have been missed).
    pub(crate) fn wake_all(&self) {
        for waiters in self.channels().values() {
            for waiter in waiters.values() {
                waiter.free();
            }
        }
    }

    /// The channels somebody waits on.
    pub(crate) fn channel_names(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }

    fn subscribed(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.subscribed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `true` when the server confirmed our subscription to `channel`.
    pub(crate) fn is_subscribed(&self, channel: &str) -> bool {
        self.subscribed().contains_key(channel)
    }

    pub(crate) fn set_subscribed(&self, channel: &str) {
        self.subscribed().insert(channel.to_owned(), false);
    }

    /// Forgets one subscription (the server dropped it).
    pub(crate) fn forget_subscribed(&self, channel: &str) {
        self.subscribed().remove(channel);
    }

    /// `true` when somebody waits on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Forgets every subscription (the connection dropped).
    pub(crate) fn clear_subscribed(&self) {
        self.subscribed().clear();
    }

    /// Takes the subscriptions nobody waited on at this sweep nor the last one.
    pub(crate) fn take_idle(&self) -> Vec<String> {
        let channels = self.channels();
        let mut subscribed = self.subscribed();
        let mut idle = Vec::new();
        subscribed.retain(|channel, idle_before| {
            if channels.contains_key(channel) {
                *idle_before = false;
                true
            } else if *idle_before {
                idle.push(channel.clone());
                false
            } else {
                *idle_before = true;
                true
            }
        });
        idle
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.channels().len()
    }
}

fn parse_grant(payload: &[u8]) -> Option<(&str, u64)> {
    let payload = std::str::from_utf8(payload).ok()?;
    let (token, fencing) = payload.split_once(':')?;
    let fencing = fencing.parse().ok().filter(|f| *f > 0)?;
    Some((token, fencing))
}

/// A waiter's registration; unregisters on drop.
pub(crate) struct WaitHandle {
    pub(crate) waiter: Arc<Waiter>,
    registry: Arc<Registry>,
    channel: String,
    token: String,
}

impl WaitHandle {
    pub(crate) fn new(registry: &Arc<Registry>, channel: &str, token: &str) -> (Self, bool) {
        let (waiter, new_channel) = registry.register(channel, token);
        (
            Self {
                waiter,
                registry: registry.clone(),
                channel: channel.to_owned(),
                token: token.to_owned(),
            },
            new_channel,
        )
    }
}

impl WaitHandle {
    /// Sleeps until a notice for this waiter or `until`, whichever comes
    /// first: `true` when a notice woke it. Notices are at most once, so
    /// every waiter sleeps with a timer too.
    pub(crate) async fn notice_or(&self, until: tokio::time::Instant) -> bool {
        tokio::select! {
            () = self.waiter.notify.notified() => true,
            () = tokio::time::sleep_until(until) => false,
        }
    }
}

impl Drop for WaitHandle {
    fn drop(&mut self) {
        self.registry.unregister(&self.channel, &self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_wakes_only_the_named_waiter() {
        let registry = Arc::new(Registry::default());
        let (a, first) = WaitHandle::new(&registry, "ch", "aaaa");
        let (b, second) = WaitHandle::new(&registry, "ch", "bbbb");
        assert!(first && !second);
        registry.deliver("ch", b"bbbb:7");
        assert_eq!(a.waiter.take_grant(), None);
        assert_eq!(b.waiter.take_grant(), Some(7));
        drop((a, b));
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn observers_hear_every_grant_and_take_no_waiter_part() {
        let registry = Arc::new(Registry::default());
        let (w, _) = WaitHandle::new(&registry, "ch", "aaaa");
        let (o, _) = WaitHandle::new(&registry, "ch", &format!("{OBSERVER}1"));
        registry.deliver("ch", b"bbbb:7");
        assert!(
            w.waiter.take_handoff_seen(),
            "the waiter learns of the hand-over"
        );
        assert!(!o.waiter.take_handoff_seen());
        assert_eq!(o.waiter.take_grant(), None);
        let woken = o.waiter.notify.notified();
        futures_util::pin_mut!(woken);
        assert!(woken.as_mut().enable(), "the observer was woken");
    }

    #[test]
    fn only_a_free_notice_or_a_wake_after_missed_notices_says_free() {
        let registry = Arc::new(Registry::default());
        let (w, _) = WaitHandle::new(&registry, "ch", "aaaa");
        // Two hand-overs to others before the waiter looks: one piece of
        // news, and no reason to try.
        registry.deliver("ch", b"bbbb:7");
        registry.deliver("ch", b"cccc:8");
        assert!(w.waiter.take_handoff_seen());
        assert!(!w.waiter.take_handoff_seen());
        assert!(
            !w.waiter.take_freed(),
            "a hand-over to another frees nothing"
        );
        registry.deliver("ch", b"");
        assert!(w.waiter.take_freed(), "a free notice");
        assert!(!w.waiter.take_freed());
        registry.wake_all();
        assert!(w.waiter.take_freed(), "notices may have been missed");
        assert_eq!(w.waiter.take_grant(), None);
    }

    #[test]
    fn malformed_notices_only_wake() {
        for payload in [&b""[..], b"x", b"tok:", b"tok:abc", b"tok:0", b"\xff:1"] {
            assert!(parse_grant(payload).is_none());
        }
    }
}
