//! The scheduling decisions, without a backend or a runtime: which leases
//! a wake-up renews, and what an answer does to them.

use super::*;
use crate::held::AtomicInstant;
use crate::key::KeyNames;
use crate::token::Token;

const TTL: Duration = Duration::from_millis(300);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn held(id: u64) -> Arc<Held> {
    Arc::new(Held {
        id,
        client_id: 1,
        key: format!("k{id}"),
        names: KeyNames::new("t:", &format!("k{id}")),
        token: Token::for_test(),
        fencing: id.into(),
        mint: None,
        ttl: TTL,
        lost: Default::default(),
        ended: Default::default(),
        valid_until: AtomicInstant::new(Instant::now()),
        metrics: crate::metrics::Name::default(),
        since: Instant::now(),
        hold_until: None,
    })
}

/// Puts lock `id` under watch as `Watchdog::watch` does, with explicit times.
fn watch(state: &mut Leases, id: u64, renew: bool, due: Instant, valid_until: Instant) {
    let held = held(id);
    held.set_valid_until(valid_until);
    state.timers.insert((due, id));
    state.entries.insert(
        id,
        WatchedLease {
            lease: Lease::Lock(held),
            ttl: TTL,
            drift: Duration::ZERO,
            renew,
            valid_until,
            due,
            busy: false,
        },
    );
}

/// The lock of entry `id`.
fn lock(state: &Leases, id: u64) -> Arc<Held> {
    match &state.entries[&id].lease {
        Lease::Lock(held) => held.clone(),
        #[cfg(feature = "idempotency")]
        Lease::Record(_) => panic!("entry {id} is a record"),
    }
}

fn ids(batch: &Batch) -> Vec<u64> {
    let mut ids: Vec<u64> = batch.iter().map(|(id, ..)| *id).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_wake_up_renews_what_is_due_within_a_sixth_of_its_lease_and_nothing_later() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + TTL);
    watch(&mut state, 2, true, now + ms(40), now + TTL); // within ttl/6 = 50 ms
    watch(&mut state, 3, true, now + ms(250), now + TTL * 2); // far off
    let batch = take_due(&mut state, now);
    // 3 is not due within a sixth, but tops the partial batch up only if
    // due within a third (100 ms): it is not.
    assert_eq!(ids(&batch), vec![1, 2]);
    assert!(state.entries[&1].busy && state.entries[&2].busy);
    assert!(!state.entries[&3].busy);
    assert_eq!(state.timers.len(), 1, "in-flight leases have no timer");
}

#[test]
fn a_partial_batch_is_topped_up_with_leases_due_within_a_third() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + TTL);
    watch(&mut state, 2, true, now + ms(90), now + TTL);
    watch(&mut state, 3, true, now + ms(150), now + TTL);
    assert_eq!(ids(&take_due(&mut state, now)), vec![1, 2]);
}

#[test]
fn a_lease_whose_validity_ran_out_before_its_renewal_is_lost_not_renewed() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now - ms(10), now - ms(1));
    let lost = lock(&state, 1);
    assert!(take_due(&mut state, now).is_empty());
    assert!(lost.lost.is_cancelled());
    assert!(state.entries.is_empty() && state.timers.is_empty());
}

#[test]
fn a_fixed_lease_is_lost_at_its_end_and_never_renewed() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, false, now + ms(10), now + ms(10));
    assert!(
        take_due(&mut state, now).is_empty(),
        "renewed a fixed lease"
    );
    assert!(!lock(&state, 1).lost.is_cancelled());
    assert!(take_due(&mut state, now + ms(10)).is_empty());
    assert!(state.entries.is_empty());
}

#[test]
fn a_confirmed_renewal_re_arms_the_lease_from_its_send_time() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + ms(100));
    let held = lock(&state, 1);
    take_due(&mut state, now);
    let sent = now + ms(5);
    settle(&mut state, vec![1], sent, Some(Ok(vec![Some(true)])));
    let entry = &state.entries[&1];
    assert_eq!(entry.valid_until, sent + TTL);
    assert_eq!(
        held.valid_until(),
        sent + TTL,
        "the guard sees the new validity"
    );
    assert_eq!(entry.due, sent + TTL / 3);
    assert!(!entry.busy && state.timers.contains(&(sent + TTL / 3, 1)));
    assert!(held.valid_at(sent + TTL - ms(1)) && !held.valid_at(sent + TTL));
}

#[test]
fn not_ours_from_the_server_loses_the_lease_at_once() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + TTL);
    watch(&mut state, 2, true, now, now + TTL);
    let (one, two) = (lock(&state, 1), lock(&state, 2));
    take_due(&mut state, now);
    settle(
        &mut state,
        vec![1, 2],
        now,
        Some(Ok(vec![Some(false), Some(true)])),
    );
    assert!(one.lost.is_cancelled() && !one.valid_at(now));
    assert!(!two.lost.is_cancelled());
    assert!(!state.entries.contains_key(&1) && state.entries.contains_key(&2));
}

#[test]
fn an_unanswered_renewal_is_retried_soon_and_lost_only_once_the_lease_may_have_ended() {
    let start = Instant::now();
    let mut state = Leases::default();
    let valid_until = start + ms(200);
    watch(&mut state, 1, true, start, valid_until);
    let held = lock(&state, 1);
    take_due(&mut state, start);
    let err = || {
        Some(Err(LockError::Backend(crate::error::BackendError::new(
            "down",
        ))))
    };
    settle(&mut state, vec![1], start, err());
    // Still valid: retried after ttl/30 (at least 5 ms), never past validity.
    let due = state.entries[&1].due;
    assert!(due > start && due <= valid_until && due <= Instant::now() + ms(11));
    assert!(!held.lost.is_cancelled());
    // A timed-out call (no answer at all) past the validity: lost.
    state.entries.get_mut(&1).unwrap().valid_until = Instant::now();
    settle(&mut state, vec![1], start, None);
    assert!(held.lost.is_cancelled());
    assert!(state.entries.is_empty());
}

#[test]
fn an_answer_for_a_lease_released_meanwhile_is_ignored() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + TTL);
    take_due(&mut state, now);
    state.entries.remove(&1); // unwatched while the call was in flight
    settle(&mut state, vec![1], now, Some(Ok(vec![Some(false)])));
    assert!(state.timers.is_empty());
}

/// Puts record `id` under watch as `Watchdog::watch_record` does.
#[cfg(feature = "idempotency")]
fn watch_record(state: &mut Leases, id: u64, due: Instant, valid_until: Instant) {
    state.timers.insert((due, id));
    state.entries.insert(
        id,
        WatchedLease {
            lease: Lease::Record(Arc::new(RecordLease {
                record: format!("t:I{{r{id}}}"),
                token: Token::for_test(),
                lost: Default::default(),
            })),
            ttl: TTL,
            drift: Duration::ZERO,
            renew: true,
            valid_until,
            due,
            busy: false,
        },
    );
}

#[cfg(feature = "idempotency")]
#[test]
fn records_ride_the_lock_schedule_and_are_given_up_only_when_the_server_says_so() {
    let now = Instant::now();
    let mut state = Leases::default();
    watch(&mut state, 1, true, now, now + TTL);
    watch_record(&mut state, 2, now + ms(10), now + TTL);
    // Past its validity (a renewal whose reply was lost may have re-armed
    // it): a record is still renewed, where a lock would be lost.
    watch_record(&mut state, 3, now - ms(10), now - ms(1));
    let batch = take_due(&mut state, now);
    assert_eq!(ids(&batch), vec![1, 2, 3]);
    let err = || {
        Some(Err(LockError::Backend(crate::error::BackendError::new(
            "down",
        ))))
    };
    settle(&mut state, vec![3], now, err());
    let due = state.entries[&3].due;
    assert!(due > now, "retried later, not in a busy loop");
    // A confirmed renewal re-arms it like a lock's.
    settle(&mut state, vec![2], now, Some(Ok(vec![Some(true)])));
    assert_eq!(state.entries[&2].valid_until, now + TTL);
    assert_eq!(state.entries[&2].due, now + TTL / 3);
    // "Not ours" ends it.
    settle(&mut state, vec![2], now, Some(Ok(vec![Some(false)])));
    assert!(!state.entries.contains_key(&2));
}
