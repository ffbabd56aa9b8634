//! Where the order service keeps its orders: in PostgreSQL, or in Redis
//! beside the locks and idempotency records, so that every instance sees
//! every order; or in this process's memory.
//!
//! Each refuses a payment whose fencing token is older than the newest one a
//! write to the order was accepted with: such a payment comes from a holder
//! whose lease ran out while it worked. Redis and PostgreSQL leave that check
//! to `lock_runtime::fence`, atomically with the write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, fence};
use redis::AsyncCommands as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Serialize;
#[cfg(feature = "postgres")]
use sqlx::PgPool;

#[derive(Clone, Debug, Serialize)]
pub struct Order {
    pub id: u64,
    pub item: String,
    pub amount_cents: u64,
    pub status: OrderStatus,
    /// The fencing token of the lock the payment was recorded under.
    pub paid_with_fencing_token: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    Created,
    Paid,
    /// Left unpaid too long: cancelled by the sweeper (`sweeper.rs`).
    Cancelled,
}

/// What became of a payment write.
#[derive(Debug)]
pub enum Payment {
    Recorded(Order),
    NoSuchOrder,
    /// A write with a newer fencing token was accepted first.
    StaleFence,
}

/// The store failed (Redis unreachable, a malformed record).
#[derive(Debug)]
pub struct StoreError(String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "order store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        StoreError(e.to_string())
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError(e.to_string())
    }
}

impl From<LockError> for StoreError {
    fn from(e: LockError) -> Self {
        // The error and its causes, on one line.
        let mut text = e.to_string();
        let mut next = std::error::Error::source(&e);
        while let Some(cause) = next {
            text += &format!(": {cause}");
            next = cause.source();
        }
        StoreError(text)
    }
}

/// The orders, cheap to clone.
#[derive(Clone, Debug)]
pub struct Orders(Arc<Backend>);

#[derive(Debug)]
enum Backend {
    Memory(Mutex<Memory>),
    Redis {
        conn: ConnectionManager,
        /// `<namespace>:order:`, followed by the id.
        order_key: String,
        /// The id counter.
        ids_key: String,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        pool: PgPool,
        /// Orders of other namespaces share the tables, not the ids.
        namespace: String,
    },
}

#[derive(Debug, Default)]
struct Memory {
    last_id: u64,
    /// Each order with the newest fencing token a write to it was accepted with.
    orders: HashMap<u64, (Order, u64)>,
    /// When each order was created (the sweeper's clock).
    created: HashMap<u64, std::time::Instant>,
}

impl Orders {
    /// Orders in this process only.
    pub fn memory() -> Self {
        Orders(Arc::new(Backend::Memory(Mutex::default())))
    }

    /// Orders in the Redis at `url`, under `<namespace>:order:<id>`.
    pub async fn redis(url: &str, namespace: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_number_of_retries(2);
        let mut conn = ConnectionManager::new_with_config(client, config).await?;
        // Fails now, not on the first order, when the credentials are refused.
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(Orders(Arc::new(Backend::Redis {
            conn,
            order_key: format!("{namespace}:order:"),
            ids_key: format!("{namespace}:order-ids"),
        })))
    }

    /// Orders in the PostgreSQL database at `url` (feature `postgres`), in the tables `orders`
    /// and `order_ids` (created if missing, with the fence's `lock_fence` and
    /// the idempotency records' `lock_idempotency`).
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str, namespace: &str) -> Result<Self, sqlx::Error> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(2))
            .connect(url)
            .await?;
        sqlx::raw_sql(fence::POSTGRES_SCHEMA).execute(&pool).await?;
        // Idempotency records committed with the orders.
        sqlx::raw_sql(lock_runtime::layer::idempotency::POSTGRES_SCHEMA)
            .execute(&pool)
            .await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS order_ids (
                 namespace text PRIMARY KEY,
                 last_id   bigint NOT NULL
             );
             CREATE TABLE IF NOT EXISTS orders (
                 namespace    text   NOT NULL,
                 id           bigint NOT NULL,
                 item         text   NOT NULL,
                 amount_cents bigint NOT NULL,
                 status       text   NOT NULL,
                 paid_with_fencing_token bigint,
                 PRIMARY KEY (namespace, id)
             );
             ALTER TABLE orders ADD COLUMN IF NOT EXISTS
                 created_at timestamptz NOT NULL DEFAULT now();",
        )
        .execute(&pool)
        .await?;
        Ok(Orders(Arc::new(Backend::Postgres {
            pool,
            namespace: namespace.to_owned(),
        })))
    }

    /// The order `id`, if there is one.
    pub async fn get(&self, id: u64) -> Result<Option<Order>, StoreError> {
        match &*self.0 {
            Backend::Memory(m) => Ok(lock(m).orders.get(&id).map(|(o, _)| o.clone())),
            Backend::Redis {
                conn, order_key, ..
            } => {
                let fields: HashMap<String, String> =
                    conn.clone().hgetall(format!("{order_key}{id}")).await?;
                if fields.is_empty() {
                    return Ok(None);
                }
                order_from_fields(id, &fields).map(Some)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, namespace } => {
                let Ok(id) = i64::try_from(id) else {
                    return Ok(None);
                };
                let row: Option<(String, i64, String, Option<i64>)> = sqlx::query_as(
                    "SELECT item, amount_cents, status, paid_with_fencing_token
                     FROM orders WHERE namespace = $1 AND id = $2",
                )
                .bind(namespace)
                .bind(id)
                .fetch_optional(pool)
                .await?;
                let Some((item, amount_cents, status, token)) = row else {
                    return Ok(None);
                };
                Ok(Some(Order {
                    id: id as u64,
                    item,
                    amount_cents: amount_cents as u64,
                    status: parse_status(id as u64, &status)?,
                    paid_with_fencing_token: token.map(|t| t as u64),
                }))
            }
        }
    }

    /// Marks order `id` paid under the fencing token `fence`, atomically with
    /// the check that no newer token wrote to it first.
    pub async fn pay(&self, id: u64, fence: u64) -> Result<Payment, StoreError> {
        match &*self.0 {
            Backend::Memory(m) => {
                let mut m = lock(m);
                let Some((order, highest)) = m.orders.get_mut(&id) else {
                    return Ok(Payment::NoSuchOrder);
                };
                if fence < *highest {
                    return Ok(Payment::StaleFence);
                }
                *highest = fence;
                order.status = OrderStatus::Paid;
                order.paid_with_fencing_token = Some(fence);
                Ok(Payment::Recorded(order.clone()))
            }
            Backend::Redis {
                conn, order_key, ..
            } => {
                // Orders are never deleted: one that exists now exists at the write.
                if self.get(id).await?.is_none() {
                    return Ok(Payment::NoSuchOrder);
                }
                // The order's key is the fence's resource: the record lives
                // in its hash slot, as a cluster requires.
                let order = format!("{order_key}{id}");
                let written = fence::redis(&mut conn.clone(), &order, fence)
                    .cmd(
                        redis::cmd("HSET")
                            .arg(&order)
                            .arg("status")
                            .arg("paid")
                            .arg("paid_with_fencing_token")
                            .arg(fence),
                    )
                    .run()
                    .await;
                match written {
                    Ok(_) => match self.get(id).await? {
                        Some(order) => Ok(Payment::Recorded(order)),
                        None => Ok(Payment::NoSuchOrder),
                    },
                    Err(LockError::Stale { .. }) => Ok(Payment::StaleFence),
                    Err(e) => Err(e.into()),
                }
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres { pool, namespace } => {
                let Ok(signed_id) = i64::try_from(id) else {
                    return Ok(Payment::NoSuchOrder);
                };
                let mut tx = pool.begin().await?;
                // First in the transaction: a stale token rolls it all back
                // (dropping `tx` does), and a newer writer waits for us.
                match fence::postgres(&mut tx, &format!("{namespace}:order:{id}"), fence).await {
                    Ok(()) => {}
                    Err(LockError::Stale { .. }) => return Ok(Payment::StaleFence),
                    Err(e) => return Err(e.into()),
                }
                let paid = sqlx::query(
                    "UPDATE orders SET status = 'paid', paid_with_fencing_token = $3
                     WHERE namespace = $1 AND id = $2",
                )
                .bind(namespace)
                .bind(signed_id)
                .bind(i64::try_from(fence).map_err(|_| too_large("fencing token"))?)
                .execute(&mut *tx)
                .await?;
                if paid.rows_affected() == 0 {
                    return Ok(Payment::NoSuchOrder);
                }
                tx.commit().await?;
                match self.get(id).await? {
                    Some(order) => Ok(Payment::Recorded(order)),
                    None => Ok(Payment::NoSuchOrder),
                }
            }
        }
    }
}

/// Inserts a new order with the next id in `tx`.
#[cfg(feature = "postgres")]
async fn insert_order(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    namespace: &str,
    item: &str,
    amount_cents: u64,
) -> Result<u64, StoreError> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO order_ids (namespace, last_id) VALUES ($1, 1)
         ON CONFLICT (namespace) DO UPDATE SET last_id = order_ids.last_id + 1
         RETURNING last_id",
    )
    .bind(namespace)
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO orders (namespace, id, item, amount_cents, status)
         VALUES ($1, $2, $3, $4, 'created')",
    )
    .bind(namespace)
    .bind(id)
    .bind(item)
    .bind(i64::try_from(amount_cents).map_err(|_| too_large("amount_cents"))?)
    .execute(&mut **tx)
    .await?;
    Ok(id as u64)
}

#[path = "create.rs"]
mod create;
#[path = "sweep.rs"]
mod sweep;

pub use sweep::Cancel;

#[cfg(feature = "postgres")]
fn too_large(what: &str) -> StoreError {
    StoreError(format!("{what} does not fit PostgreSQL's bigint"))
}

fn parse_status(id: u64, status: &str) -> Result<OrderStatus, StoreError> {
    match status {
        "created" => Ok(OrderStatus::Created),
        "paid" => Ok(OrderStatus::Paid),
        "cancelled" => Ok(OrderStatus::Cancelled),
        other => Err(StoreError(format!("order {id}: unknown status {other:?}"))),
    }
}

fn lock(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn order_from_fields(id: u64, fields: &HashMap<String, String>) -> Result<Order, StoreError> {
    let field = |name: &str| {
        fields
            .get(name)
            .ok_or_else(|| StoreError(format!("order {id} has no `{name}`")))
    };
    let number = |name: &str| -> Result<u64, StoreError> {
        field(name)?
            .parse()
            .map_err(|_| StoreError(format!("order {id}: `{name}` is not a number")))
    };
    let status = parse_status(id, field("status")?)?;
    Ok(Order {
        id,
        item: field("item")?.clone(),
        amount_cents: number("amount_cents")?,
        status,
        paid_with_fencing_token: match fields.contains_key("paid_with_fencing_token") {
            true => Some(number("paid_with_fencing_token")?),
            false => None,
        },
    })
}
