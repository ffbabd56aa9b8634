//! One answer to durations out of range, for every request, layer and
//! builder:
//!
//! * a **wait** longer than [`MAX_WAIT`] (a century; `Duration::MAX`
//!   included) is [`MAX_WAIT`]: "longer than anything" has one meaning, so
//!   it is clamped, never refused;
//! * a **lease** or a **retention** out of range is [`LockError::Config`]
//!   when the request runs (shortening it would break what the caller was
//!   promised), and a layer given one refuses it when it is built, with the
//!   same message ([`refused_at_build`]);
//! * an instant computed from a caller's duration never overflows
//!   ([`later`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{LockError, shown};
use lock_keys::MAX_RETENTION;
use lock_keys::MAX_WAIT;

/// `from + by`, with `by` clamped to [`MAX_WAIT`]: never overflows, never
/// panics, whatever `by` is.
pub(crate) fn later(from: Instant, by: Duration) -> Instant {
    let mut by = by.min(MAX_WAIT);
    loop {
        // A century past any instant a process sees fits every platform's
        // clock; should one not, the furthest instant it has is used.
        match from.checked_add(by) {
            Some(at) => return at,
            None => by /= 2,
        }
    }
}

/// Checks the retention of a record (`what` names it in the message):
/// above zero and at most [`MAX_RETENTION`].
pub(crate) fn check_retention(what: &str, retention: Duration) -> Result<(), LockError> {
    if retention < Duration::from_millis(1) {
        return Err(LockError::Config(format!(
            "the retention of {what} must be at least one millisecond"
        )));
    }
    if retention > MAX_RETENTION {
        return Err(LockError::Config(format!(
            "the retention of {what} ({}) is above the maximum of {}",
            shown(retention),
            shown(MAX_RETENTION)
        )));
    }
    Ok(())
}

/// A layer's setting checked as it is set: the value, or a panic naming the
/// setter and saying why. Layers are built once, when the router is, so a
/// setting no request could be served with stops the program there (as
/// axum refuses a bad route) instead of failing every request with a `500`.
#[cfg(feature = "axum")]
#[track_caller]
pub(crate) fn refused_at_build<T>(setter: &str, checked: Result<T, LockError>) -> T {
    match checked {
        Ok(value) => value,
        Err(LockError::Config(why)) => panic!("{setter}: {why}"),
        Err(e) => panic!("{setter}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_instant_is_clamped_to_the_longest_wait_instead_of_overflowing() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::MAX), now + MAX_WAIT);
        assert_eq!(later(now, Duration::from_millis(u64::MAX)), now + MAX_WAIT);
        assert_eq!(
            later(now, Duration::from_secs(2)),
            now + Duration::from_secs(2)
        );
        assert_eq!(later(now, Duration::ZERO), now);
    }

    #[test]
    fn a_retention_is_checked_against_both_of_its_bounds() {
        for bad in [Duration::ZERO, Duration::from_micros(999)] {
            let e = check_retention("a record", bad).unwrap_err();
            assert!(e.to_string().contains("at least one millisecond"), "{e}");
        }
        for bad in [MAX_RETENTION + Duration::from_secs(1), Duration::MAX] {
            let e = check_retention("a record", bad).unwrap_err();
            assert!(e.is_config() && e.to_string().contains("maximum"), "{e}");
        }
        check_retention("a record", Duration::from_millis(1)).unwrap();
        check_retention("a record", MAX_RETENTION).unwrap();
    }

    #[test]
    fn durations_in_messages_read_as_a_person_would_write_them() {
        assert_eq!(shown(Duration::MAX), "Duration::MAX");
        assert_eq!(shown(MAX_RETENTION), "365 days");
        assert_eq!(shown(Duration::from_secs(24 * 3600)), "1 day");
        assert_eq!(shown(Duration::from_nanos(29_999_970_226)), "29s 999ms");
        assert_eq!(shown(Duration::from_millis(50)), "50ms");
        assert_eq!(shown(Duration::from_nanos(1)), "1ns");
        assert_eq!(shown(Duration::ZERO), "0s");
        let past_days = Duration::from_secs(7 * 24 * 3600 + 1);
        assert_eq!(shown(past_days), "7days 1s");
    }
}
