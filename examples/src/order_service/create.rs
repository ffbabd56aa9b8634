//! Creating an order exactly once across crashes: the order and the
//! idempotency record commit together, through the `Commit` that
//! `IdempotencyLayer` hands the handler (`commit_with_postgres`, or
//! `commit_on_lock_server` for orders in the Redis of the locks, set up by
//! [`Orders::idempotency_layer`]).
//!
//! Without the `Commit` (the in-memory store, or `IDEMPOTENCY_COMMIT=off`),
//! the order commits first and the layer completes its record after: a
//! process killed between the two leaves an order whose retry makes a second
//! one.

use axum::response::{IntoResponse, Response};
use lock_runtime::layer::IdempotencyLayer;
use lock_runtime::layer::idempotency::Commit;
use redis::AsyncCommands as _;

use super::{Backend, Order, OrderStatus, Orders, StoreError, lock, sweep};

/// An order written but not committed yet.
pub enum PendingOrder {
    Memory,
    /// The order's `HSET`, not sent yet.
    Redis {
        conn: redis::aio::ConnectionManager,
        write: redis::Cmd,
    },
    /// The transaction that inserted the order.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl Orders {
    /// `layer`, set to commit records where the orders are (PostgreSQL; in
    /// Redis, the server of the locks, where the record itself is completed
    /// with the order; nothing for the in-memory store).
    pub fn idempotency_layer(&self, layer: IdempotencyLayer) -> IdempotencyLayer {
        match &*self.0 {
            Backend::Memory(_) => layer,
            // The orders are on the lock server (`REDIS_URL`): the order's
            // write completes its record in one script, with no copy.
            Backend::Redis { .. } => layer.commit_on_lock_server(),
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, .. } => layer.commit_with_postgres(pool.clone()),
        }
    }

    /// Writes a new order with the next id, not committed yet (PostgreSQL:
    /// in an open transaction; Redis: the id taken, the order's write
    /// built). An id taken by an order that never commits is a gap, never a
    /// second order.
    pub async fn prepare(
        &self,
        item: String,
        amount_cents: u64,
    ) -> Result<(Order, PendingOrder), StoreError> {
        let order = |id: u64| Order {
            id,
            item: item.clone(),
            amount_cents,
            status: OrderStatus::Created,
            paid_with_fencing_token: None,
        };
        match &*self.0 {
            Backend::Memory(m) => {
                let mut m = lock(m);
                m.last_id += 1;
                let order = order(m.last_id);
                m.orders.insert(order.id, (order.clone(), 0));
                m.created.insert(order.id, std::time::Instant::now());
                Ok((order, PendingOrder::Memory))
            }
            Backend::Redis {
                conn,
                order_key,
                ids_key,
            } => {
                let id: u64 = conn.clone().incr(ids_key, 1).await?;
                let write = redis::cmd("HSET")
                    .arg(format!("{order_key}{id}"))
                    .arg("item")
                    .arg(&item)
                    .arg("amount_cents")
                    .arg(amount_cents)
                    .arg("status")
                    .arg("created")
                    .arg("created_ms")
                    .arg(sweep::now_ms())
                    .clone();
                let conn = conn.clone();
                Ok((order(id), PendingOrder::Redis { conn, write }))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, namespace } => {
                let mut tx = pool.begin().await?;
                let id = super::insert_order(&mut tx, namespace, &item, amount_cents).await?;
                Ok((order(id), PendingOrder::Postgres(tx)))
            }
        }
    }
}

impl PendingOrder {
    /// Commits the order. With `commit`, the response is committed with it,
    /// as the idempotency record, and returned (or, when another claimer of
    /// the same key committed first, its response, and this order is not
    /// committed); without, the order commits alone and the layer stores the
    /// response after.
    pub async fn commit(
        self,
        commit: Option<&Commit>,
        response: impl IntoResponse,
    ) -> Result<Response, StoreError> {
        match (self, commit) {
            (PendingOrder::Memory, _) => Ok(response.into_response()),
            (PendingOrder::Redis { conn, write }, None) => {
                let () = write.query_async(&mut conn.clone()).await?;
                Ok(response.into_response())
            }
            (PendingOrder::Redis { write, .. }, Some(commit)) => {
                Ok(commit.redis().cmd(write).respond(response).await?)
            }
            #[cfg(feature = "postgres")]
            (PendingOrder::Postgres(tx), None) => {
                tx.commit().await?;
                Ok(response.into_response())
            }
            #[cfg(feature = "postgres")]
            (PendingOrder::Postgres(tx), Some(commit)) => Ok(commit.postgres(tx, response).await?),
        }
    }
}
