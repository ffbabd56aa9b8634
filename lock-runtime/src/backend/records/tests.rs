use super::*;
use crate::backend::redlock::majority;

fn response(status: u16) -> StoredResponse {
    StoredResponse {
        status,
        headers: Bytes::from_static(b"content-type:text/plain\n"),
        body: Bytes::from_static(b"hello"),
        body_too_large: false,
    }
}

fn token() -> Token {
    Token::for_test()
}

#[tokio::test(start_paused = true)]
async fn a_record_is_claimed_once_then_replayed() {
    let (m, a, b) = (MemoryRecords::default(), token(), token());
    let lease = Duration::from_secs(1);
    assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
    assert!(matches!(
        m.claim("r", &b, "fp", lease),
        Claim::InFlight { .. }
    ));
    assert_eq!(m.claim("r", &b, "other", lease), Claim::Mismatch);
    let retention = Duration::from_secs(60);
    assert!(!m.complete("r", &b, "fp", &response(201), retention));
    assert!(m.complete("r", &a, "fp", &response(201), retention));
    assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
    // A completed record is nobody's to release; a renewal that crossed
    // the completion is harmless, and only its owner's.
    assert!(m.renew("r", &a, lease));
    assert!(!m.renew("r", &b, lease));
    assert!(!m.release("r", &a));
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
    tokio::time::advance(Duration::from_secs(31)).await;
    assert_eq!(m.claim("r", &b, "other", lease), Claim::Claimed);
}

#[tokio::test(start_paused = true)]
async fn a_completion_sent_again_after_a_lost_reply_is_still_ours() {
    let (m, a, b) = (MemoryRecords::default(), token(), token());
    let (lease, retention) = (Duration::from_secs(1), Duration::from_secs(60));
    assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
    assert!(m.complete("r", &a, "fp", &response(201), retention));
    // The same completion again (its first reply was lost): success, and
    // the stored response is unchanged.
    assert!(m.complete("r", &a, "fp", &response(500), retention));
    assert_eq!(m.claim("r", &b, "fp", lease), Claim::Done(response(201)));
    // Our lease ran out before the completion arrived and nobody claimed
    // in between: the handler ran, so its response is kept.
    assert_eq!(m.claim("s", &a, "fp", lease), Claim::Claimed);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(m.complete("s", &a, "fp", &response(201), retention));
    assert_eq!(m.claim("s", &b, "fp", lease), Claim::Done(response(201)));
    // Somebody else claimed in between: nothing of theirs is overwritten.
    assert_eq!(m.claim("t", &a, "fp", lease), Claim::Claimed);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(m.claim("t", &b, "fp", lease), Claim::Claimed);
    assert!(!m.complete("t", &a, "fp", &response(201), retention));
    assert!(m.release("t", &b));
}

#[test]
fn a_redlock_answer_is_decided_only_when_the_lost_replies_cannot_change_it() {
    let (t, f, u) = (Some(true), Some(false), None);
    assert_eq!(majority(&[t, t, u], 2), Some(true));
    assert_eq!(majority(&[f, f, u], 2), Some(false));
    // One `true`, one `false`, one lost reply that may have been a `true`.
    assert_eq!(majority(&[t, f, u], 2), None);
    assert_eq!(majority(&[t, u, u], 2), None);
    assert_eq!(majority(&[t, t, f, f, u], 3), None);
    assert_eq!(majority(&[t, f, f, f, u], 3), Some(false));
}

#[tokio::test(start_paused = true)]
async fn an_unrenewed_claim_expires_and_a_released_one_is_free_at_once() {
    let (m, a, b) = (MemoryRecords::default(), token(), token());
    let lease = Duration::from_millis(300);
    assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(m.renew("r", &a, lease));
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(matches!(
        m.claim("r", &b, "fp", lease),
        Claim::InFlight { .. }
    ));
    tokio::time::advance(Duration::from_millis(101)).await;
    assert_eq!(m.claim("r", &b, "fp", lease), Claim::Claimed);
    assert!(!m.renew("r", &a, lease));
    assert!(!m.complete("r", &a, "fp", &response(200), lease));
    assert!(m.release("r", &b));
    assert_eq!(m.claim("r", &a, "fp", lease), Claim::Claimed);
}

#[tokio::test]
async fn the_embedded_backend_announces_a_completion_and_a_release_to_waiters() {
    use std::sync::Arc;
    let backend = Backend::Memory(Arc::new(crate::backend::memory::MemoryBackend::default()));
    let (a, b) = (token(), token());
    let (lease, retention) = (Duration::from_secs(1), Duration::from_secs(60));
    let names = crate::key::RecordNames {
        record: "t:I{r}".to_owned(),
        notice: "t:J{r}".to_owned(),
    };
    let ours = |token: &Token| Ours {
        names: names.clone(),
        token: *token,
        fingerprint: "fp".to_owned(),
        ttl: lease,
        retention,
    };
    let (ours_a, ours_b) = (ours(&a), ours(&b));
    let notice = names.notice.as_str();
    let woken = |handle: &crate::backend::WaitHandle| {
        let notified = handle.waiter.notify.notified();
        futures_util::FutureExt::now_or_never(notified).is_some()
    };
    assert_eq!(
        backend.claim_record(&ours_a, true).await.unwrap(),
        Claim::Claimed
    );
    let waiting = backend.register_on(notice, &b).await;
    assert!(!woken(&waiting));
    assert!(backend.release_record(&ours_a).await.unwrap());
    assert!(woken(&waiting), "a release wakes the waiter");
    // Nothing to release: no notice.
    assert!(!backend.release_record(&ours_a).await.unwrap());
    assert!(!woken(&waiting));
    assert_eq!(
        backend.claim_record(&ours_b, true).await.unwrap(),
        Claim::Claimed
    );
    let stored = backend
        .complete_record(&ours_b, &response(201))
        .await
        .unwrap();
    assert!(stored);
    assert!(woken(&waiting), "a completion wakes the waiter");
}
