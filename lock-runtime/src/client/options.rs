//! What a lock request asks for besides its key ([`LockOptions`]), and the
//! same checked against the client when the request starts ([`Asked`]):
//! the lease resolved, the wait turned into one [`Deadline`].
//!
//! Every kind of request shares them: [`LockRequest`](crate::LockRequest)
//! (and the read-write lock and semaphore built on it),
//! [`LockAllRequest`](crate::LockAllRequest),
//! [`LeaderRequest`](crate::LeaderRequest) (its lease and wait), the
//! attribute (through `__private`) and `LockLayer`. Their public setters
//! write this value, and every one is checked by [`LockOptions::resolve`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{MAX_TTL, validate_ttl};
use crate::client::inner::Inner;
use crate::durations::later;
use crate::error::LockError;

/// What a lock request asks for besides its key(s) and its kind of lock:
/// the lease, the wait, renewals, `hold_at_least` and the metrics name.
/// Not a stable API: the attribute's expansion builds one; users set the
/// same through [`LockRequest`](crate::LockRequest)'s methods.
#[derive(Clone, Debug)]
#[must_use]
pub struct LockOptions {
    /// `None`: the client's default.
    pub(crate) ttl: Option<Duration>,
    /// `Duration::ZERO`: try once.
    pub(crate) wait: Duration,
    pub(crate) renew: bool,
    /// Zero: none.
    pub(crate) hold_at_least: Duration,
    pub(crate) metrics: crate::metrics::Name,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl LockOptions {
    /// The defaults: the client's lease, try once, renewed, no
    /// `hold_at_least`, the metrics name `default`.
    pub fn new() -> Self {
        Self {
            ttl: None,
            wait: Duration::ZERO,
            renew: true,
            hold_at_least: Duration::ZERO,
            metrics: crate::metrics::Name::default(),
        }
    }

    /// See [`LockRequest::ttl`](crate::LockRequest::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// See [`LockRequest::wait`](crate::LockRequest::wait).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// See [`LockRequest::renew`](crate::LockRequest::renew).
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// See [`LockRequest::hold_at_least`](crate::LockRequest::hold_at_least).
    pub fn hold_at_least(mut self, min: Duration) -> Self {
        self.hold_at_least = min;
        self
    }

    /// See [`LockRequest::metrics_name`](crate::LockRequest::metrics_name)
    /// (without the `metrics` feature the name is not even copied).
    pub fn metrics_name(mut self, name: impl Into<Arc<str>>) -> Self {
        if cfg!(feature = "metrics") {
            self.metrics = crate::metrics::Name::new(name.into());
        }
        self
    }

    /// Sets the metrics name already made (a layer's, made once per route).
    #[cfg(feature = "axum")]
    pub(crate) fn metrics(mut self, name: crate::metrics::Name) -> Self {
        self.metrics = name;
        self
    }

    /// Checks the options against `inner`'s client as the request starts:
    /// the lease (the client's default where none was set) and
    /// `hold_at_least` within their limits, and the wait turned into the
    /// request's one [`Deadline`], from now.
    pub(crate) fn resolve(&self, inner: &Inner) -> Result<Asked, LockError> {
        let ttl = self.ttl.unwrap_or(inner.default_ttl);
        validate_ttl(ttl)?;
        if self.hold_at_least > MAX_TTL {
            return Err(LockError::Config(format!(
                "hold_at_least {} is above the maximum of {}",
                crate::error::shown(self.hold_at_least),
                crate::error::shown(MAX_TTL)
            )));
        }
        Ok(Asked {
            ttl,
            deadline: Deadline::after(self.wait),
            renew: self.renew,
            hold_at_least: self.hold_at_least,
            metrics: self.metrics.clone(),
        })
    }
}

/// A request's public setters, each a thin setter on its `options`
/// ([`LockOptions`]), with the request's own docs: every lock request kind
/// offers the same five, in this order (and `options`, all at once). A
/// leadership and a record's claim offer only the lease and the wait
/// ([`lease_setters`]: a leadership is renewed while it leads, and ends
/// when it resigns).
macro_rules! option_setters {
    (
        $(#[$metrics:meta])* metrics_name;
        $(#[$ttl:meta])* ttl;
        $(#[$wait:meta])* wait;
        $(#[$renew:meta])* renew;
        $(#[$hold:meta])* hold_at_least;
    ) => {
        /// Every option at once (the attribute's, a layer's).
        pub(crate) fn options(mut self, options: LockOptions) -> Self {
            self.options = options;
            self
        }

        $crate::client::option_setter!($(#[$metrics])* metrics_name(name: impl Into<Arc<str>>));
        $crate::client::lease_setters!($(#[$ttl])* ttl; $(#[$wait])* wait;);
        $crate::client::option_setter!($(#[$renew])* renew(renew: bool));
        $crate::client::option_setter!($(#[$hold])* hold_at_least(min: Duration));
    };
}
pub(super) use option_setters;

/// The lease and the wait of [`option_setters`], for the requests that offer
/// only those (an idempotency record's claim, a leadership), with their docs.
macro_rules! lease_setters {
    ($(#[$ttl:meta])* ttl; $(#[$wait:meta])* wait;) => {
        $crate::client::option_setter!($(#[$ttl])* ttl(ttl: Duration));
        $crate::client::option_setter!($(#[$wait])* wait(wait: Duration));
    };
}
pub(crate) use lease_setters;

/// One setter of [`option_setters`]: `name(value)` sets the option `name`
/// of the request's `options`.
macro_rules! option_setter {
    ($(#[$doc:meta])* $name:ident($value:ident: $ty:ty)) => {
        $(#[$doc])*
        pub fn $name(mut self, $value: $ty) -> Self {
            self.options = self.options.$name($value);
            self
        }
    };
}
pub(crate) use option_setter;

/// [`LockOptions`] as a started request uses them, checked.
#[derive(Clone, Debug)]
pub(crate) struct Asked {
    /// The lease, asked for and renewed to.
    pub(crate) ttl: Duration,
    pub(crate) deadline: Deadline,
    pub(crate) renew: bool,
    /// Zero: none.
    pub(crate) hold_at_least: Duration,
    pub(crate) metrics: crate::metrics::Name,
}

/// Until when a request may wait, resolved once when it starts; it is
/// turned back into a duration only for a script (see [`Deadline::left`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    started: Instant,
    /// `None`: try once.
    at: Option<Instant>,
}

impl Deadline {
    /// `wait` from now: `Duration::ZERO` tries once; a wait above
    /// [`MAX_WAIT`](crate::MAX_WAIT) (`Duration::MAX` included) waits that
    /// long, so what a script is told ([`Deadline::left`]) is always an
    /// exact number of milliseconds.
    pub(crate) fn after(wait: Duration) -> Self {
        let started = Instant::now();
        let at = (!wait.is_zero()).then(|| later(started, wait));
        Self { started, at }
    }

    /// When the request started (for its wait-time metric).
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// `true`: the request tries once, and neither waits nor queues.
    pub(crate) fn tries_once(&self) -> bool {
        self.at.is_none()
    }

    /// When waiting ends (the start, for a request that tries once).
    pub(crate) fn at(&self) -> Instant {
        self.at.unwrap_or(self.started)
    }

    /// `true` once there is no time left to wait.
    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at()
    }

    /// The wait a script sent at `sent` is given (how long it may stay
    /// queued on the server): zero to try once, else what is left, at least
    /// a millisecond (a script's unit; zero would mean "try once").
    pub(crate) fn left(&self, sent: Instant) -> Duration {
        match self.at {
            None => Duration::ZERO,
            Some(at) => at
                .saturating_duration_since(sent)
                .max(Duration::from_millis(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_resolved_once_and_told_to_scripts_in_what_is_left() {
        let once = Deadline::after(Duration::ZERO);
        assert!(once.tries_once() && once.passed());
        assert_eq!(once.left(Instant::now()), Duration::ZERO);

        let d = Deadline::after(Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!d.tries_once() && !d.passed());
        assert_eq!(d.left(Instant::now()), Duration::from_millis(1500));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(d.passed());
        // Still a wait, however late: never "try once" by accident.
        assert_eq!(d.left(Instant::now()), Duration::from_millis(1));

        for huge in [Duration::MAX, Duration::from_millis(u64::MAX)] {
            let forever = Deadline::after(huge);
            assert!(forever.at() > Instant::now() + Duration::from_secs(365 * 24 * 3600));
            // What a script gets stays below 2^53 ms, exact as a Lua number.
            assert_eq!(forever.left(forever.started()), crate::MAX_WAIT);
        }
    }
}
