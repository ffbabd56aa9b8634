//! The error types' own tests: the chains, the connection failures, the reasons.

use super::*;

/// The chain of a driver's I/O error says its cause once: redis-rs's
/// error displays its I/O error and gives it as its source too.
#[test]
fn a_chain_says_a_drivers_cause_once() {
    let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
    let e = BackendError::with_source("acquire failed", redis::RedisError::from(io));
    let mut said = vec![e.to_string()];
    let mut next = std::error::Error::source(&e);
    while let Some(cause) = next {
        said.push(cause.to_string());
        next = cause.source();
    }
    let timed_out = said.iter().filter(|s| s.contains("timed out")).count();
    assert_eq!(timed_out, 1, "{said:?}");
    assert!(e.driver_error().is_some() && e.is_timeout(), "{e:?}");
    // Wrapped (a Redlock node's failure), the driver's error is still
    // found: a broken pipe is a connection failure.
    let pipe = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
    let node = BackendError::with_source("acquire failed", redis::RedisError::from(pipe));
    let wrapped = BackendError::wrap("Redlock: 3 of 5 nodes failed", node);
    assert!(wrapped.driver_error().is_some(), "{wrapped:?}");
    assert!(wrapped.is_connection(), "{wrapped:?}");
}

fn driver(kind: redis::ErrorKind) -> redis::RedisError {
    redis::RedisError::from((kind, "test"))
}

#[test]
fn no_server_to_send_to_is_worth_a_retry_and_ran_nothing() {
    // Mid-failover the sentinels name no master that answers as one; a
    // background release that gave up on it left its queue entry to be
    // handed the key, one hand-over lease each (FAULTS.md, scenario 8).
    for kind in [
        redis::ErrorKind::MasterNameNotFoundBySentinel,
        redis::ErrorKind::NoValidReplicasFoundBySentinel,
        // The same for a cluster that cannot serve the slot (a lock on
        // a dead master's slot fails with a MOVED to that master).
        redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
        redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
        redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
        redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
        redis::ErrorKind::Server(redis::ServerErrorKind::Ask),
        // A server restarted with its data, loading it (`LOADING`): as a
        // restart, ridden out within an acquire's wait.
        redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
    ] {
        let e = driver(kind);
        assert_eq!(connection_failure(&e), Some(ConnectionFailure::Unreachable));
        let backend = BackendError::with_source("release failed", e);
        assert!(backend.is_connection(), "{kind:?}");
        assert!(!backend.is_outcome_unknown(), "{kind:?}");
        assert!(LockError::Backend(backend).is_connection());
    }
}

#[test]
fn each_misuse_is_read_back_from_its_config_error_and_nothing_else_is() {
    for reason in ConfigReason::ALL {
        let e = LockError::misuse(reason, "\"k\"");
        assert!(e.is_config());
        assert_eq!(e.config_reason(), Some(reason), "{e}");
    }
    assert_eq!(
        LockError::Config("invalid Redis URL: nope".into()).config_reason(),
        None
    );
    assert_eq!(LockError::lost("k").config_reason(), None);
}

#[test]
fn answers_the_server_sent_on_purpose_are_not_connection_failures() {
    let e = driver(redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly));
    assert_eq!(connection_failure(&e), None);
    assert!(!BackendError::with_source("release failed", e).is_connection());
    // redis-rs would reconnect after a refused login; it is an answer.
    let e = driver(redis::ErrorKind::AuthenticationFailed);
    assert!(e.is_unrecoverable_error());
    assert_eq!(connection_failure(&e), None);
    assert!(!BackendError::with_source("cannot connect", e).is_connection());
}
