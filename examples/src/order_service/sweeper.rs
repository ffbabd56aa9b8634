//! The order service's singleton job: a sweeper that cancels orders left
//! unpaid longer than `CANCEL_UNPAID_AFTER_MS`, on exactly one instance at
//! a time. Every instance campaigns for the leadership `order-sweeper`; the
//! leader sweeps every `SWEEP_EVERY_MS` and logs its term with each sweep;
//! when it dies (or loses its lease) the next instance in line takes over
//! within the lease, with a higher term. Each cancel takes the order's lock
//! (the one payments take), so a payment and a cancel never interleave, and
//! is written through the fence with the term (`store::sweep`), so a deposed
//! leader's late cancels are refused. Told to stop (the service shuts
//! down), it finishes the sweep under way and resigns: the next instance
//! leads at once.

use std::time::Duration;

use lock_runtime::{Leader, LockClient, LockError};
use tokio::sync::watch;

use crate::store::{Cancel, Orders};

/// The election's name (under the client's key prefix, the namespace).
pub const ELECTION: &str = "order-sweeper";

/// The leader's lease: a dead leader is replaced within it.
const LEASE: Duration = Duration::from_secs(5);

/// After a failed campaign (the server unreachable), before the next.
const RETRY: Duration = Duration::from_secs(1);

/// The sweeper's settings.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// `CANCEL_UNPAID_AFTER_MS` (default 15 minutes).
    pub unpaid_for: Duration,
    /// `SWEEP_EVERY_MS` (default 5 s).
    pub every: Duration,
    /// What observers see while this instance leads.
    pub label: String,
}

/// Who leads the sweeper, for `GET /sweeper`.
pub async fn observe(client: &LockClient) -> Result<watch::Receiver<Option<Leader>>, LockError> {
    client.leader(ELECTION).observe().await
}

/// Resolves once `stop` says `true` (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Campaigns, and sweeps while leading, until `stop` says `true`; then
/// resigns (a leadership only dropped would be given back too, but in the
/// background: `LockClient::shutdown` would wait for it).
pub async fn run(
    client: LockClient,
    orders: Orders,
    sweep: Sweep,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let candidate = client.leader(ELECTION).ttl(LEASE).label(&sweep.label);
        let campaign = tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            campaign = candidate.campaign() => campaign,
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(e) => {
                tracing::warn!(error = %e, "sweeper: campaign failed; trying again");
                tokio::select! {
                    () = stopped(&mut stop) => return,
                    () = tokio::time::sleep(RETRY) => continue,
                }
            }
        };
        let term = leadership.term();
        tracing::info!(
            term,
            label = leadership.label(),
            "sweeper: elected, sweeping"
        );
        let lost = leadership.lost();
        let sweeping = sweep_while_leading(&client, &orders, &sweep, term, stop.clone());
        tokio::select! {
            () = lost => tracing::warn!(term, "sweeper: leadership lost; campaigning again"),
            () = sweeping => {}
        }
        if *stop.borrow() {
            match leadership.resign().await {
                Ok(()) => tracing::info!(term, "sweeper: stopped; leadership given back"),
                Err(e) => tracing::warn!(term, error = %e, "sweeper: stopped; resign failed"),
            }
            return;
        }
        drop(leadership);
    }
}

/// Sweeps every `sweep.every` while leading; returns when a newer leader
/// wrote first, or at the first tick after `stop` said `true`.
async fn sweep_while_leading(
    client: &LockClient,
    orders: &Orders,
    sweep: &Sweep,
    term: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(sweep.every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            _ = every.tick() => {}
        }
        let due = match orders.unpaid_older_than(sweep.unpaid_for).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(term, error = %e, "sweep: cannot list the orders");
                continue;
            }
        };
        let mut cancelled = Vec::new();
        for id in due {
            // The payment's lock, trying once: an order being paid is left
            // for the next sweep.
            let cancel = client
                .lock(format!("order:{id}"))
                .ttl(Duration::from_secs(10))
                .run(orders.cancel_if_unpaid(id, sweep.unpaid_for, term))
                .await;
            match cancel {
                Ok(Ok(Cancel::Cancelled)) => cancelled.push(id),
                Ok(Ok(Cancel::NotDue)) => {}
                Ok(Ok(Cancel::StaleTerm)) => {
                    tracing::warn!(term, "sweep: a newer sweeper wrote first; stopping");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(term, order = id, error = %e, "sweep: cancel failed"),
                Err(e) if e.is_busy() => {}
                Err(e) => tracing::warn!(term, order = id, error = %e, "sweep: cancel failed"),
            }
        }
        tracing::info!(term, cancelled = ?cancelled, "sweep");
    }
}
