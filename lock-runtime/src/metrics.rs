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
//! | `lock_leader` | gauge | `name` (the election's): 1 while this process leads it, else 0 (from its first campaign) |
//! | `lock_leader_terms_total` | counter | `name` (the election's): terms won by this process |
//! | `idempotency_requests_total` | counter | `route`, `outcome` = `claimed` / `replayed` / `in_flight` / `payload_mismatch` / `store_unavailable` |
//!
//! `name` is never the key (one series per order would explode): it is what
//! [`LockRequest::metrics_name`](crate::LockRequest::metrics_name) set, the
//! attribute's key template, or the `LockLayer`'s route; `default` otherwise.

use std::sync::Arc;
use std::time::Duration;

/// The `name` label of a lock's metrics. Empty (zero-sized) without the
/// `metrics` feature.
#[derive(Clone, Debug, Default)]
pub(crate) struct Name {
    #[cfg(feature = "metrics")]
    name: Option<Arc<str>>,
}

impl Name {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            name: Some(name),
        }
    }

    /// The label value, without copying the name.
    #[cfg(feature = "metrics")]
    fn label(&self) -> metrics::SharedString {
        match &self.name {
            Some(name) => metrics::SharedString::from(name.clone()),
            None => metrics::SharedString::const_str("default"),
        }
    }
}

#[cfg(feature = "metrics")]
mod report {
    use super::*;

    pub(crate) fn acquired(name: &Name, waited: Duration, handover: bool) {
        let label = name.label();
        metrics::counter!("lock_acquisitions_total", "name" => label.clone(), "outcome" => "acquired")
            .increment(1);
        metrics::histogram!("lock_wait_seconds", "name" => label.clone(), "outcome" => "acquired")
            .record(waited.as_secs_f64());
        if handover {
            metrics::counter!("lock_handovers_total", "name" => label).increment(1);
        }
    }

    pub(crate) fn busy(name: &Name, waited: Duration) {
        let label = name.label();
        metrics::counter!("lock_acquisitions_total", "name" => label.clone(), "outcome" => "busy")
            .increment(1);
        metrics::histogram!("lock_wait_seconds", "name" => label, "outcome" => "busy")
            .record(waited.as_secs_f64());
    }

    pub(crate) fn failed(name: &Name) {
        metrics::counter!("lock_acquisitions_total", "name" => name.label(), "outcome" => "error")
            .increment(1);
    }

    pub(crate) fn released(name: &Name, held_for: Duration) {
        metrics::histogram!("lock_hold_seconds", "name" => name.label())
            .record(held_for.as_secs_f64());
    }

    pub(crate) fn lost(name: &Name) {
        metrics::counter!("lock_leases_lost_total", "name" => name.label()).increment(1);
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
    pub(crate) fn idempotency(route: &str, outcome: &'static str) {
        metrics::counter!("idempotency_requests_total", "route" => route.to_owned(), "outcome" => outcome)
            .increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(unused_variables)]
mod report {
    use super::*;

    pub(crate) fn acquired(name: &Name, waited: Duration, handover: bool) {}
    pub(crate) fn busy(name: &Name, waited: Duration) {}
    pub(crate) fn failed(name: &Name) {}
    pub(crate) fn released(name: &Name, held_for: Duration) {}
    pub(crate) fn lost(name: &Name) {}
    pub(crate) fn renewal_call(renewed: usize) {}
    pub(crate) fn campaigning(name: &str) {}
    pub(crate) fn elected(name: &str) {}
    #[cfg(feature = "axum")]
    pub(crate) fn idempotency(route: &str, outcome: &'static str) {}
}

pub(crate) use report::*;
