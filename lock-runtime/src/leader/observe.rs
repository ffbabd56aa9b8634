//! Following who leads one election: [`start`] reads the record once and
//! spawns [`follow`], which reads it again at every notice on the name's
//! channel (each grant, hand-over and resign publishes one) and, as the
//! fallback for a lost notice or a leader that died, when the leader's
//! lease runs out. No polling: with nobody leading and no notice, it sleeps.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::Leader;
use crate::backend::{LeaderEntry, WaitHandle};
use crate::backoff::Retry;
use crate::client::LockClient;
use crate::client::inner::Inner;
use crate::error::LockError;
use crate::key::KeyNames;

/// After a lease's end, before reading again: the server expires the
/// record at that moment, not before.
const PAST_LEASE: Duration = Duration::from_millis(5);

/// Subscribes, then reads (so no change between the two is missed), and
/// spawns the follower.
pub(super) async fn start(
    client: &LockClient,
    name: String,
) -> Result<watch::Receiver<Option<Leader>>, LockError> {
    let inner = &client.0;
    crate::client::keep_tasks_running(inner).await?;
    let names = client.leader_names(&name);
    let id = inner
        .next_lock_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let notices = inner.backend.observe_notices(names.notice(), id).await?;
    let record = inner.backend.leader(&names).await?;
    let lease = record.as_ref().map(|(_, _, left)| *left);
    let (tx, rx) = watch::channel(record.map(|r| leader(&name, r)));
    tokio::spawn(follow(
        (Arc::downgrade(inner), inner.dropped.subscribe()),
        name,
        names,
        notices,
        tx,
        lease,
    ));
    Ok(rx)
}

fn leader(name: &str, (label, term, _): LeaderEntry) -> Leader {
    Leader {
        name: name.to_owned(),
        label,
        term,
    }
}

/// Reads the record at each notice, or when `lease` (the current leader's
/// lease left) runs out; sends what changed. Ends when every receiver is
/// gone, or the client is (`dropped`: then `changed()` answers `Err`).
async fn follow(
    (inner, mut dropped): (Weak<Inner>, watch::Receiver<()>),
    name: String,
    names: KeyNames,
    notices: WaitHandle,
    tx: watch::Sender<Option<Leader>>,
    mut lease: Option<Duration>,
) {
    let mut failed_reads = Retry::REREAD_LEADER.start();
    loop {
        let reread = async {
            match lease {
                Some(left) => tokio::time::sleep(left + PAST_LEASE).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tx.closed() => return,
            _ = dropped.changed() => return,
            () = notices.waiter.notify.notified() => {}
            () = reread => {}
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match inner.backend.leader(&names).await {
            Ok(record) => {
                failed_reads.reset();
                lease = record.as_ref().map(|(_, _, left)| *left);
                let now = record.map(|r| leader(&name, r));
                tx.send_if_modified(|seen| {
                    if *seen == now {
                        return false;
                    }
                    tracing::debug!(name = %name, leader = ?now, "leader changed");
                    *seen = now;
                    true
                });
            }
            Err(e) => {
                tracing::debug!(name = %name, error = &e as &dyn std::error::Error,
                    "reading the leader's record failed; trying again");
                lease = Some(failed_reads.next_pause());
            }
        }
    }
}
