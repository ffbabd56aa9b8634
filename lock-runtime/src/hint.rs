//! The `retry_after` that [`LockError::Busy`](crate::LockError::Busy)
//! carries (and `LockLayer` turns into a `Retry-After` header): a hint of when
//! a retry is likely to find the key free, [`RetryHints`].
//!
//! The holder's remaining lease is only the latest moment a retry can
//! succeed without the holder releasing first; a live holder usually
//! releases long before it (a 30 s lease around a 0.3 s handler). So each
//! client remembers how long its recent holds took, per key and over all
//! keys, and a busy answer carries that figure, never more than the
//! remaining lease. A client that knows nothing yet (no hold released)
//! answers the remaining lease, as a lease-based estimate must.
//!
//! A client keeps two: one for its locks, one for its idempotency records
//! (claim to settle), so neither kind's times stand in for the other's.
//!
//! A key that stays busy longer than that (a holder slower than usual,
//! or one that held it since before this client saw any release) gets hints
//! that grow: never less than how long this client has been finding it busy
//! in a row. A caller that obeys them backs off exponentially instead of
//! asking every millisecond for a key held for minutes.
//!
//! Memory is bounded whatever the number of key names: keys share a fixed
//! table of slots by hash, and a slot taken by another key is simply
//! overwritten (a hint, not a record).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many keys' recent holds one client remembers.
const SLOTS: usize = 256;

/// The least hint given: a retry sooner than this is a busy loop.
pub(crate) const MIN_HINT: Duration = Duration::from_millis(1);

/// One client's memory of its recent hold times.
pub(crate) struct RetryHints {
    hasher: foldhash::fast::FixedState,
    /// What the busy streaks' times count from.
    base: Instant,
    /// Per key (by hash): the key's hash in the high bits is checked on read,
    /// the estimate in microseconds beside it.
    slots: Box<[Slot]>,
    /// Over every key this client held, in microseconds (0: none yet).
    typical: AtomicU64,
}

#[derive(Default)]
struct Slot {
    /// The key's hash, `0` for a slot never written.
    key: AtomicU64,
    micros: AtomicU64,
    /// The key found busy in a row: its hash (`0`: none), and the first and
    /// the last time of it (microseconds since `base`).
    busy_key: AtomicU64,
    busy_first: AtomicU64,
    busy_last: AtomicU64,
}

impl RetryHints {
    pub(crate) fn new() -> Self {
        Self {
            hasher: foldhash::fast::FixedState::with_seed(0x6c6f_636b),
            base: Instant::now(),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            typical: AtomicU64::new(0),
        }
    }

    /// Counts a hold of `key` that lasted `held_for` (from acquisition to
    /// release, or to the end of `hold_at_least`, whichever is later).
    pub(crate) fn held(&self, key: &str, held_for: Duration) {
        let micros = u64::try_from(held_for.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let hash = self.hash(key);
        let slot = &self.slots[(hash % SLOTS as u64) as usize];
        let before = if slot.key.load(Ordering::Relaxed) == hash {
            slot.micros.load(Ordering::Relaxed)
        } else {
            0
        };
        slot.micros.store(recent(before, micros), Ordering::Relaxed);
        slot.key.store(hash, Ordering::Relaxed);
        // Released here: a busy streak of the key is over.
        let _ = slot
            .busy_key
            .compare_exchange(hash, 0, Ordering::Relaxed, Ordering::Relaxed);
        let typical = self.typical.load(Ordering::Relaxed);
        self.typical
            .store(recent(typical, micros), Ordering::Relaxed);
    }

    /// The hint for a busy `key` whose holder's lease has `remaining` left:
    /// what this key's recent holds in this client took, else what this
    /// client's holds of any key took, but at least how long this client
    /// has been finding the key busy in a row; never more than `remaining`
    /// (nor less than [`MIN_HINT`]). With no hold released yet: `remaining`.
    pub(crate) fn hint(&self, key: &str, remaining: Duration) -> Duration {
        let now = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.hint_at(key, remaining, now)
    }

    /// [`hint`](Self::hint) at `now` (microseconds since `base`).
    fn hint_at(&self, key: &str, remaining: Duration, now: u64) -> Duration {
        let hash = self.hash(key);
        let slot = &self.slots[(hash % SLOTS as u64) as usize];
        let mut micros = slot.micros.load(Ordering::Relaxed);
        if slot.key.load(Ordering::Relaxed) != hash {
            micros = 0;
        }
        if micros == 0 {
            micros = self.typical.load(Ordering::Relaxed);
        }
        let busy_for = Duration::from_micros(self.busy_streak(slot, hash, now));
        let estimate = if micros == 0 {
            remaining
        } else {
            Duration::from_micros(micros).max(busy_for).min(remaining)
        };
        estimate.max(MIN_HINT)
    }

    /// How long (us) `slot`'s key, `hash`, has been found busy in a row, now
    /// found busy again at `now`. The streak goes on while each busy answer
    /// comes within twice the streak's length (and a millisecond) of the
    /// last: a caller backing off as told; a longer gap, or a release by
    /// this client, starts a new one.
    fn busy_streak(&self, slot: &Slot, hash: u64, now: u64) -> u64 {
        let (first, last) = (
            slot.busy_first.load(Ordering::Relaxed),
            slot.busy_last.load(Ordering::Relaxed),
        );
        let going_on = slot.busy_key.load(Ordering::Relaxed) == hash
            && now >= last
            && now - last <= 2 * (last - first.min(last)) + 1_000;
        slot.busy_last.store(now, Ordering::Relaxed);
        if going_on {
            now - first.min(now)
        } else {
            slot.busy_first.store(now, Ordering::Relaxed);
            slot.busy_key.store(hash, Ordering::Relaxed);
            0
        }
    }

    fn hash(&self, key: &str) -> u64 {
        // Never 0, the mark of a slot never written.
        self.hasher.hash_one(key) | 1
    }
}

impl Default for RetryHints {
    fn default() -> Self {
        Self::new()
    }
}

/// The estimate after a hold of `sample` given the estimate `before` (0:
/// none): a longer hold raises it at once (a retry sent too early only
/// finds the key busy again), shorter ones bring it down a quarter of the
/// way each, so one slow hold does not stretch every later hint.
fn recent(before: u64, sample: u64) -> u64 {
    if before == 0 || sample >= before {
        sample
    } else {
        before - (before - sample) / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn a_client_that_released_nothing_hints_the_remaining_lease() {
        let hints = RetryHints::new();
        assert_eq!(hints.hint("order:1", LEASE), LEASE);
    }

    #[test]
    fn a_key_held_briefly_hints_its_hold_time_not_its_lease() {
        let hints = RetryHints::new();
        hints.held("order:1", Duration::from_millis(300));
        assert_eq!(hints.hint("order:1", LEASE), Duration::from_millis(300));
    }

    #[test]
    fn the_remaining_lease_bounds_the_hint() {
        let hints = RetryHints::new();
        hints.held("order:1", Duration::from_secs(5));
        let remaining = Duration::from_millis(200);
        assert_eq!(hints.hint("order:1", remaining), remaining);
    }

    #[test]
    fn a_key_never_held_here_hints_what_other_keys_took() {
        let hints = RetryHints::new();
        hints.held("order:1", Duration::from_millis(100));
        hints.held("order:2", Duration::from_millis(100));
        assert_eq!(hints.hint("order:3", LEASE), Duration::from_millis(100));
    }

    #[test]
    fn a_long_hold_raises_the_hint_at_once_and_short_ones_bring_it_down() {
        let hints = RetryHints::new();
        hints.held("job", Duration::from_millis(100));
        hints.held("job", Duration::from_millis(900));
        assert_eq!(hints.hint("job", LEASE), Duration::from_millis(900));
        for _ in 0..12 {
            hints.held("job", Duration::from_millis(100));
        }
        let after = hints.hint("job", LEASE);
        assert!(after < Duration::from_millis(150), "{after:?}");
    }

    #[test]
    fn the_hint_is_never_below_a_millisecond() {
        let hints = RetryHints::new();
        hints.held("k", Duration::from_micros(3));
        assert_eq!(hints.hint("k", LEASE), MIN_HINT);
        assert_eq!(RetryHints::new().hint("k", Duration::ZERO), MIN_HINT);
    }

    #[test]
    fn a_key_that_stays_busy_gets_hints_that_grow_as_a_caller_backs_off() {
        let hints = RetryHints::new();
        hints.held("job", Duration::from_millis(1)); // one quick hold before
        // A holder that keeps it: a caller obeying each hint, in virtual time.
        let (mut now, mut given) = (1_000_000u64, Vec::new());
        for _ in 0..12 {
            let hint = hints.hint_at("job", LEASE, now);
            given.push(hint.as_millis());
            now += u64::try_from(hint.as_micros()).unwrap();
        }
        assert_eq!(given[..4], [1, 1, 2, 4], "{given:?}");
        assert_eq!(given[11], 1024, "doubling: {given:?}");
        // Bounded by the lease left.
        let short = Duration::from_millis(300);
        assert_eq!(hints.hint_at("job", short, now), short);
        // Released by this client: the next busy streak starts over.
        hints.held("job", Duration::from_millis(1));
        assert_eq!(hints.hint_at("job", LEASE, now + 10), MIN_HINT);
        // A long quiet gap starts over too.
        assert_eq!(hints.hint_at("job", LEASE, now + 60_000_000), MIN_HINT);
    }

    #[test]
    fn memory_stays_bounded_whatever_the_number_of_keys() {
        let hints = RetryHints::new();
        for i in 0..10_000 {
            hints.held(&format!("order:{i}"), Duration::from_millis(50));
        }
        assert_eq!(hints.slots.len(), SLOTS);
        assert_eq!(hints.hint("order:9999", LEASE), Duration::from_millis(50));
    }
}
