//! Where the order service keeps its orders: in Redis, beside the locks and
//! idempotency records, so that every instance sees every order; or in this
//! process's memory when there is no Redis.
//!
//! Both refuse a payment whose fencing token is older than the newest one a
//! write to the order was accepted with: such a payment comes from a holder
//! whose lease ran out while it worked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Serialize;

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
        pay: redis::Script,
    },
}

#[derive(Debug, Default)]
struct Memory {
    last_id: u64,
    /// Each order with the newest fencing token a write to it was accepted with.
    orders: HashMap<u64, (Order, u64)>,
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
            pay: redis::Script::new(include_str!("pay.lua")),
        })))
    }

    /// Stores a new order with the next id.
    pub async fn create(&self, item: String, amount_cents: u64) -> Result<Order, StoreError> {
        match &*self.0 {
            Backend::Memory(m) => {
                let mut m = lock(m);
                m.last_id += 1;
                let order = Order {
                    id: m.last_id,
                    item,
                    amount_cents,
                    status: OrderStatus::Created,
                    paid_with_fencing_token: None,
                };
                m.orders.insert(order.id, (order.clone(), 0));
                Ok(order)
            }
            Backend::Redis {
                conn,
                order_key,
                ids_key,
                ..
            } => {
                let mut conn = conn.clone();
                let id: u64 = conn.incr(ids_key, 1).await?;
                let () = conn
                    .hset_multiple(
                        format!("{order_key}{id}"),
                        &[
                            ("item", item.clone()),
                            ("amount_cents", amount_cents.to_string()),
                            ("status", "created".to_owned()),
                        ],
                    )
                    .await?;
                Ok(Order {
                    id,
                    item,
                    amount_cents,
                    status: OrderStatus::Created,
                    paid_with_fencing_token: None,
                })
            }
        }
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
                conn,
                order_key,
                pay,
                ..
            } => {
                let outcome: i64 = pay
                    .key(format!("{order_key}{id}"))
                    .arg(fence)
                    .invoke_async(&mut conn.clone())
                    .await?;
                match outcome {
                    1 => match self.get(id).await? {
                        Some(order) => Ok(Payment::Recorded(order)),
                        None => Ok(Payment::NoSuchOrder),
                    },
                    0 => Ok(Payment::NoSuchOrder),
                    _ => Ok(Payment::StaleFence),
                }
            }
        }
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
    let status = match field("status")?.as_str() {
        "created" => OrderStatus::Created,
        "paid" => OrderStatus::Paid,
        other => return Err(StoreError(format!("order {id}: unknown status {other:?}"))),
    };
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
