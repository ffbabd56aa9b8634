//! The embedded backend's own tests.

use super::*;

#[tokio::test(start_paused = true)]
async fn expired_locks_can_be_taken_and_fences_keep_counting() {
    let m = MemoryBackend::default();
    let names = KeyNames::new("t:", "k");
    let (a, b) = (Token::for_test(), Token::for_test());
    let ttl = Duration::from_millis(100);
    let zero = Duration::ZERO;
    assert_eq!(
        m.acquire(&names, &a, ttl, zero),
        AcquireOutcome::Acquired { fencing: 1 }
    );
    assert!(matches!(
        m.acquire(&names, &b, ttl, zero),
        AcquireOutcome::Busy { .. }
    ));
    tokio::time::advance(Duration::from_millis(101)).await;
    assert!(!m.extend(&names, &a, ttl));
    assert_eq!(
        m.acquire(&names, &b, ttl, zero),
        AcquireOutcome::Acquired { fencing: 2 }
    );
    assert!(!m.release(&names, &a, false));
    assert!(m.release(&names, &b, false));
}

#[tokio::test(start_paused = true)]
async fn release_hands_over_to_the_first_waiter_in_line() {
    let m = MemoryBackend::default();
    let names = KeyNames::new("t:", "k");
    let [a, b, c] = [(); 3].map(|_| Token::for_test());
    let (ttl, wait) = (Duration::from_secs(1), Duration::from_secs(5));
    assert!(matches!(
        m.acquire(&names, &a, ttl, wait),
        AcquireOutcome::Acquired { .. }
    ));
    let wb = m.register(names.notice(), &b);
    let wc = m.register(names.notice(), &c);
    assert!(matches!(
        m.acquire(&names, &b, ttl, wait),
        AcquireOutcome::Busy { .. }
    ));
    assert!(matches!(
        m.acquire(&names, &c, ttl, wait),
        AcquireOutcome::Busy { .. }
    ));
    assert!(m.release(&names, &a, false));
    assert_eq!(wb.waiter.take_grant(), Some(2));
    assert_eq!(wc.waiter.take_grant(), None);
    // The hand-over is visible to the new owner's next attempt too.
    assert_eq!(
        m.acquire(&names, &b, ttl, wait),
        AcquireOutcome::Acquired { fencing: 2 }
    );
    // An abandoned waiter leaves the line.
    assert!(!m.release(&names, &c, true));
    assert!(m.release(&names, &b, false));
    assert_eq!(wc.waiter.take_grant(), None);
}

#[tokio::test(start_paused = true)]
async fn what_is_kept_does_not_grow_with_the_number_of_names() {
    let m = MemoryBackend::default();
    let (ttl, wait) = (Duration::from_secs(1), Duration::from_secs(1));
    let mut last = 0;
    for i in 0..200_000u32 {
        let names = KeyNames::new("t:", &format!("order:{i}"));
        let (a, b) = (Token::for_test(), Token::for_test());
        let AcquireOutcome::Acquired { fencing } = m.acquire(&names, &a, ttl, wait) else {
            panic!("free");
        };
        assert!(fencing > last, "tokens only increase");
        last = fencing;
        if i % 10 == 0 {
            // Every tenth name has a waiter, handed the lock on release.
            assert!(matches!(
                m.acquire(&names, &b, ttl, wait),
                AcquireOutcome::Busy { .. }
            ));
            assert!(m.release(&names, &a, false));
            assert!(m.release(&names, &b, false));
        } else {
            assert!(m.release(&names, &a, false));
        }
        let state = m.state();
        assert!(
            state.locks.is_empty() && state.queues.is_empty(),
            "name {i}: {} locks, {} queues kept",
            state.locks.len(),
            state.queues.len()
        );
    }
}
