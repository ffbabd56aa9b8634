//! What the library reports to the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`; without it every call here is a no-op and
//! [`Name`] is empty).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `lock_acquisitions_total` | counter | `name`, `outcome` = `acquired` / `busy` / `error` |
//! | `lock_wait_seconds` | histogram | `name`, `outcome` |
//! | `lock_hold_seconds` | histogram | `name` |
//! | `lock_handovers_total` | counter | `name` (acquired from a release's hand-over) |
//! | `lock_leases_lost_total` | counter | `name` |
//! | `lock_renewal_calls_total` | counter | |
//! | `lock_renewed_total` | counter | (leases re-armed by those calls) |
//! | `lock_leader` | gauge | `name` (the election's, or its [`metrics_name`](crate::LeaderRequest::metrics_name)): how many of its elections this process leads (1 or 0 for one election), from its first campaign |
//! | `lock_leader_terms_total` | counter | `name` (as `lock_leader`): terms won by this process |
//! | `idempotency_requests_total` | counter | `route`, `outcome` = `claimed` / `replayed` / `in_flight` / `payload_mismatch` / `store_unavailable` |
//!
//! `name` is never the key (one series per order would explode): it is what
//! [`LockRequest::metrics_name`](crate::LockRequest::metrics_name) set, the
//! attribute's key template, or the `LockLayer`'s route; `default` otherwise.
//! A leader election's series are named by the election (elections usually
//! have a few fixed names), or by
//! [`LeaderRequest::metrics_name`](crate::LeaderRequest::metrics_name).

use std::sync::Arc;
use std::time::Duration;

/// The `name` label of a lock's metrics, with the keys of its series built
/// once, on first use, and shared by every lock of the name (a `LockLayer`
/// resolves one per route): a lock's life then reports without building a
/// key (labels allocated, hashed) for each event, which the facade would do
/// on every call even with no recorder installed. Keys do not depend on the
/// recorder, so one built under a recorder is right under any other. Empty
/// (zero-sized) without the `metrics` feature.
#[derive(Clone, Debug, Default)]
pub(crate) struct Name {
    /// `None`: the name `default`, whose keys are built once per process.
    #[cfg(feature = "metrics")]
    keys: Option<Arc<report::SeriesKeys>>,
}

impl Name {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: Some(Arc::new(report::SeriesKeys::new(name))),
        }
    }

    /// Whether both are one name, made once (for `LockLayer`'s route names'
    /// tests).
    #[cfg(test)]
    #[cfg(feature = "metrics")]
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn same_as(&self, other: &Name) -> bool {
        match (&self.keys, &other.keys) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    /// The keys of this name's series.
    #[cfg(feature = "metrics")]
    fn keys(&self) -> &report::SeriesKeys {
        static DEFAULT: std::sync::LazyLock<report::SeriesKeys> =
            std::sync::LazyLock::new(|| report::SeriesKeys::new(Arc::from("default")));
        self.keys.as_deref().unwrap_or(&DEFAULT)
    }
}

/// What became of a request to an
/// [`IdempotencyLayer`](crate::layer::IdempotencyLayer): the `outcome` label of
/// `idempotency_requests_total`.
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug)]
pub(crate) enum IdempotencyOutcome {
    Claimed,
    Replayed,
    PayloadMismatch,
    InFlight,
    StoreUnavailable,
}

#[cfg(feature = "axum")]
impl IdempotencyOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const COUNT: usize = 5;

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Replayed => "replayed",
            Self::PayloadMismatch => "payload_mismatch",
            Self::InFlight => "in_flight",
            Self::StoreUnavailable => "store_unavailable",
        }
    }
}

/// The `route` label of an idempotency layer's series, with their keys
/// built once, on first use, and shared by the route's requests (as
/// [`Name`] does for a lock's). Empty without the `metrics` feature.
#[cfg(feature = "axum")]
#[derive(Clone, Debug, Default)]
pub(crate) struct RouteSeries {
    #[cfg(feature = "metrics")]
    keys: Arc<report::RouteKeys>,
}

#[cfg(feature = "axum")]
impl RouteSeries {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(route: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            keys: Arc::new(report::RouteKeys::new(route)),
        }
    }
}

#[cfg(feature = "metrics")]
mod report {
    use std::sync::OnceLock;

    use metrics::{Key, Label, Metadata};

    use super::*;

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

    /// The keys of one route's idempotency series, each built on its first
    /// use.
    #[cfg(feature = "axum")]
    #[derive(Debug, Default)]
    pub(crate) struct RouteKeys {
        route: Arc<str>,
        built: [OnceLock<Key>; IdempotencyOutcome::COUNT],
    }

    #[cfg(feature = "axum")]
    impl RouteKeys {
        pub(super) fn new(route: &str) -> Self {
            Self {
                route: Arc::from(route),
                built: Default::default(),
            }
        }

        fn key(&self, outcome: IdempotencyOutcome) -> &Key {
            self.built[outcome as usize].get_or_init(|| {
                Key::from_parts(
                    "idempotency_requests_total",
                    vec![
                        Label::new("route", metrics::SharedString::from(self.route.clone())),
                        Label::from_static_parts("outcome", outcome.label()),
                    ],
                )
            })
        }
    }

    /// A series of a named lock: its metric and, where it has one, its
    /// `outcome` label.
    #[derive(Clone, Copy)]
    enum Series {
        Acquired,
        WaitAcquired,
        Handover,
        Busy,
        WaitBusy,
        Failed,
        Hold,
        Lost,
    }

    impl Series {
        const COUNT: usize = 8;

        fn parts(self) -> (&'static str, Option<&'static str>) {
            match self {
                Self::Acquired => ("lock_acquisitions_total", Some("acquired")),
                Self::WaitAcquired => ("lock_wait_seconds", Some("acquired")),
                Self::Handover => ("lock_handovers_total", None),
                Self::Busy => ("lock_acquisitions_total", Some("busy")),
                Self::WaitBusy => ("lock_wait_seconds", Some("busy")),
                Self::Failed => ("lock_acquisitions_total", Some("error")),
                Self::Hold => ("lock_hold_seconds", None),
                Self::Lost => ("lock_leases_lost_total", None),
            }
        }
    }

    /// The keys of one name's series, each built on its first use.
    #[derive(Debug)]
    pub(crate) struct SeriesKeys {
        name: Arc<str>,
        built: [OnceLock<Key>; Series::COUNT],
    }

    impl SeriesKeys {
        pub(super) fn new(name: Arc<str>) -> Self {
            Self {
                name,
                built: Default::default(),
            }
        }

        fn key(&self, series: Series) -> &Key {
            self.built[series as usize].get_or_init(|| {
                let (metric, outcome) = series.parts();
                let mut labels = vec![Label::new(
                    "name",
                    metrics::SharedString::from(self.name.clone()),
                )];
                if let Some(outcome) = outcome {
                    labels.push(Label::from_static_parts("outcome", outcome));
                }
                Key::from_parts(metric, labels)
            })
        }
    }

    fn counter(name: &Name, series: Series) -> metrics::Counter {
        let key = name.keys().key(series);
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
    }

    fn histogram(name: &Name, series: Series) -> metrics::Histogram {
        let key = name.keys().key(series);
        metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
    }

    /// An acquisition asked for at `asked` took the lock now.
    pub(crate) fn acquired(name: &Name, asked: tokio::time::Instant, handover: bool) {
        counter(name, Series::Acquired).increment(1);
        let waited = asked.elapsed();
        histogram(name, Series::WaitAcquired).record(waited.as_secs_f64());
        if handover {
            counter(name, Series::Handover).increment(1);
        }
    }

    pub(crate) fn busy(name: &Name, waited: Duration) {
        counter(name, Series::Busy).increment(1);
        histogram(name, Series::WaitBusy).record(waited.as_secs_f64());
    }

    pub(crate) fn failed(name: &Name) {
        counter(name, Series::Failed).increment(1);
    }

    pub(crate) fn released(name: &Name, held_for: Duration) {
        histogram(name, Series::Hold).record(held_for.as_secs_f64());
    }

    pub(crate) fn lost(name: &Name) {
        counter(name, Series::Lost).increment(1);
    }

    fn leader_gauge(name: &str) -> metrics::Gauge {
        metrics::gauge!("lock_leader", "name" => name.to_owned())
    }

    /// A campaign starts: the series exists (0 unless this process leads).
    pub(crate) fn campaigning(name: &str) {
        leader_gauge(name).increment(0.0);
    }

    pub(crate) fn elected(name: &str) {
        metrics::counter!("lock_leader_terms_total", "name" => name.to_owned()).increment(1);
    }

    /// One leadership's part of `lock_leader{name}` (the leaderships of
    /// `name` this process holds: 1 or 0): added when won, taken back once,
    /// when the lease is lost or the leadership resigned or dropped.
    pub(crate) struct LeadingGauge {
        gauge: metrics::Gauge,
        ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
        task: tokio::task::JoinHandle<()>,
    }

    impl LeadingGauge {
        pub(crate) fn new(
            name: &str,
            lost: impl std::future::Future<Output = ()> + Send + 'static,
        ) -> Self {
            let gauge = leader_gauge(name);
            gauge.increment(1.0);
            let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (on_loss, flag) = (gauge.clone(), ended.clone());
            let task = tokio::spawn(async move {
                lost.await;
                if !flag.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    on_loss.decrement(1.0);
                }
            });
            Self { gauge, ended, task }
        }
    }

    impl Drop for LeadingGauge {
        fn drop(&mut self) {
            self.task.abort();
            if !self.ended.swap(true, std::sync::atomic::Ordering::AcqRel) {
                self.gauge.decrement(1.0);
            }
        }
    }

    pub(crate) fn renewal_call(renewed: usize) {
        metrics::counter!("lock_renewal_calls_total").increment(1);
        metrics::counter!("lock_renewed_total").increment(renewed as u64);
    }

    #[cfg(feature = "axum")]
    pub(crate) fn idempotency(route: &RouteSeries, outcome: IdempotencyOutcome) {
        let key = route.keys.key(outcome);
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(unused_variables)]
mod report {
    use super::*;

    // No clock read for the wait without the feature.
    pub(crate) fn acquired(name: &Name, asked: tokio::time::Instant, handover: bool) {}
    pub(crate) fn busy(name: &Name, waited: Duration) {}
    pub(crate) fn failed(name: &Name) {}
    pub(crate) fn released(name: &Name, held_for: Duration) {}
    pub(crate) fn lost(name: &Name) {}
    pub(crate) fn renewal_call(renewed: usize) {}
    pub(crate) fn campaigning(name: &str) {}
    pub(crate) fn elected(name: &str) {}
    #[cfg(feature = "axum")]
    pub(crate) fn idempotency(route: &RouteSeries, outcome: IdempotencyOutcome) {}
}

pub(crate) use report::*;
