//! The retry policies' own tests: each stops where its doc says.

use super::*;

#[test]
fn pauses_double_up_to_the_cap_and_reset_to_the_first() {
    let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
    let pauses: Vec<u128> = (0..5).map(|_| b.advance().as_millis()).collect();
    assert_eq!(pauses, [20, 40, 80, 100, 100]);
    // A policy's retrying starts over after a step that worked.
    let mut retry = Retry::RECONNECT_NOTICES.start();
    let pauses: Vec<u128> = (0..7).map(|_| retry.next_pause().as_millis()).collect();
    assert_eq!(pauses, [20, 40, 80, 160, 320, 640, 1000]);
    retry.reset();
    assert_eq!(retry.next_pause(), Duration::from_millis(20));
    let mut retry = Retry::REREAD_LEADER.start();
    let pauses: Vec<u128> = (0..6).map(|_| retry.next_pause().as_millis()).collect();
    assert_eq!(pauses, [50, 100, 200, 400, 800, 1000]);
}

/// Re-sends until the policy says no, pausing as it says (time paused).
async fn resends(policy: Retry, deadline: Option<Instant>) -> (u32, Duration) {
    let start = Instant::now();
    let mut retry = policy.start();
    let mut n = 0;
    while retry.allows(deadline) {
        retry.pause().await;
        n += 1;
    }
    (n, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn each_policy_stops_where_its_doc_says() {
    let ms = Duration::from_millis;
    // Re-sends for 10 s at most, the first at once: 20+40+...+320 ms,
    // then 500 ms each.
    let (n, took) = resends(Retry::ACQUIRE, None).await;
    assert!(took <= ms(10_000) && took > ms(9_400), "{n} in {took:?}");
    // Within a wait, no pause past it.
    let (n, took) = resends(Retry::ACQUIRE, Some(Instant::now() + ms(100))).await;
    assert_eq!((n, took), (3, ms(60)));
    assert_eq!(resends(Retry::ONCE, None).await, (1, Duration::ZERO));
    let (_, took) = resends(Retry::SLOT_MIGRATION, None).await;
    assert!(
        took < Duration::from_secs(5) && took > Duration::from_millis(4700),
        "{took:?}"
    );
    let (_, took) = resends(Retry::RELEASE_IN_BACKGROUND, None).await;
    assert!(
        took < Duration::from_secs(30) && took > Duration::from_secs(28),
        "{took:?}"
    );
}
