//! The store's side of the sweeper (`sweeper.rs`): which orders are left
//! unpaid too long, and cancelling one of them. A cancel is written through
//! the fence where the store has one, with the sweeper's leadership term, on
//! a resource of the order's own for sweeps (`{<order key>}:sweeper` on
//! Redis, in the order's hash slot as a fenced write needs;
//! `<namespace>:order:<id>:sweeper` in PostgreSQL): a leader paused past its
//! lease, whose successor swept that order already, has its late cancel
//! refused. (Payments fence the order with the order lock's tokens, a
//! sequence of their own, hence a resource apart.)

use std::collections::HashMap;
use std::time::Duration;

use lock_runtime::{LockError, fence};
use redis::AsyncCommands as _;

#[cfg(feature = "postgres")]
use super::too_large;
use super::{Backend, OrderStatus, Orders, StoreError, lock, parse_status};

/// What became of one cancel.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancel {
    Cancelled,
    /// Paid, cancelled already, gone, or not old enough any more to tell.
    NotDue,
    /// A sweeper with a newer term wrote first: this one was deposed.
    StaleTerm,
}

/// Milliseconds since the Unix epoch (Redis orders' `created_ms`).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Orders {
    /// The ids of orders created more than `age` ago and still unpaid.
    pub async fn unpaid_older_than(&self, age: Duration) -> Result<Vec<u64>, StoreError> {
        match &*self.0 {
            Backend::Memory(m) => {
                let m = lock(m);
                let mut ids: Vec<u64> = m
                    .orders
                    .iter()
                    .filter(|(id, (order, _))| {
                        order.status == OrderStatus::Created
                            && m.created.get(id).is_some_and(|at| at.elapsed() > age)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                ids.sort_unstable();
                Ok(ids)
            }
            Backend::Redis {
                conn, order_key, ..
            } => {
                let mut conn = conn.clone();
                let mut names: Vec<String> = Vec::new();
                let mut cursor = 0u64;
                loop {
                    let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{order_key}*"))
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut conn)
                        .await?;
                    names.extend(found);
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                }
                let cutoff = now_ms().saturating_sub(age.as_millis() as u64);
                let mut ids = Vec::new();
                for name in names {
                    let Some(Ok(id)) = name.strip_prefix(order_key.as_str()).map(str::parse) else {
                        continue;
                    };
                    if due(&mut conn, &name, cutoff).await? {
                        ids.push(id);
                    }
                }
                ids.sort_unstable();
                Ok(ids)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, namespace } => {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT id FROM orders WHERE namespace = $1 AND status = 'created'
                     AND created_at < now() - make_interval(secs => $2) ORDER BY id",
                )
                .bind(namespace)
                .bind(age.as_secs_f64())
                .fetch_all(pool)
                .await?;
                Ok(ids.into_iter().map(|id| id as u64).collect())
            }
        }
    }

    /// Cancels order `id` if it is still unpaid and older than `age`, as
    /// the sweeper of leadership term `term`. The caller holds the order's
    /// lock (the one payments take), so no payment runs meanwhile.
    pub async fn cancel_if_unpaid(
        &self,
        id: u64,
        age: Duration,
        term: u64,
    ) -> Result<Cancel, StoreError> {
        match &*self.0 {
            Backend::Memory(m) => {
                // One process: no other sweeper can write here.
                let m = &mut *lock(m);
                let due = m.created.get(&id).is_some_and(|at| at.elapsed() > age);
                match m.orders.get_mut(&id) {
                    Some((order, _)) if due && order.status == OrderStatus::Created => {
                        order.status = OrderStatus::Cancelled;
                        Ok(Cancel::Cancelled)
                    }
                    _ => Ok(Cancel::NotDue),
                }
            }
            Backend::Redis {
                conn, order_key, ..
            } => {
                let mut conn = conn.clone();
                let order = format!("{order_key}{id}");
                let cutoff = now_ms().saturating_sub(age.as_millis() as u64);
                if !due(&mut conn, &order, cutoff).await? {
                    return Ok(Cancel::NotDue);
                }
                // Tagged with the order's key: the same hash slot.
                let sweeps = format!("{{{order}}}:sweeper");
                let written = fence::redis(&mut conn, &sweeps, term)
                    .cmd(
                        redis::cmd("HSET")
                            .arg(&order)
                            .arg("status")
                            .arg("cancelled")
                            .arg("cancelled_in_term")
                            .arg(term),
                    )
                    .run()
                    .await;
                match written {
                    Ok(_) => Ok(Cancel::Cancelled),
                    Err(LockError::Stale { .. }) => Ok(Cancel::StaleTerm),
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, namespace } => {
                let signed = i64::try_from(id).map_err(|_| too_large("order id"))?;
                let mut tx = pool.begin().await?;
                let sweeps = format!("{namespace}:order:{id}:sweeper");
                match fence::postgres(&mut tx, &sweeps, term).await {
                    Ok(()) => {}
                    Err(LockError::Stale { .. }) => return Ok(Cancel::StaleTerm),
                    Err(e) => return Err(e.into()),
                }
                let cancelled = sqlx::query(
                    "UPDATE orders SET status = 'cancelled'
                     WHERE namespace = $1 AND id = $2 AND status = 'created'
                     AND created_at < now() - make_interval(secs => $3)",
                )
                .bind(namespace)
                .bind(signed)
                .bind(age.as_secs_f64())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(if cancelled.rows_affected() == 1 {
                    Cancel::Cancelled
                } else {
                    Cancel::NotDue
                })
            }
        }
    }
}

/// A Redis order still `created`, created before `cutoff` (ms).
async fn due(
    conn: &mut redis::aio::ConnectionManager,
    order: &str,
    cutoff: u64,
) -> Result<bool, StoreError> {
    let fields: HashMap<String, String> = conn.hgetall(order).await?;
    let (Some(status), Some(created)) = (fields.get("status"), fields.get("created_ms")) else {
        return Ok(false);
    };
    let status = parse_status(0, status)?;
    Ok(status == OrderStatus::Created && created.parse().is_ok_and(|c: u64| c < cutoff))
}
