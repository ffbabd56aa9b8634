//! Free functions: every option, `?` in the body, visibilities, patterns.

use std::time::Duration;

use lock_runtime::{LockClient, LockError, distributed_lock};

// Its fields are shown by `Debug` only.
#[allow(dead_code)]
#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Parse(std::num::ParseIntError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

/// Every option at once; `?` on a foreign error inside the body.
#[distributed_lock(
    key = "order:<order_id>",
    ttl = "30s",
    wait = "2s",
    renew = true,
    client = client,
    crate = ::lock_runtime,
)]
pub async fn pay(client: &LockClient, order_id: u64, amount: &str) -> Result<u64, AppError> {
    let amount: u64 = amount.parse()?;
    Ok(order_id + amount)
}

#[distributed_lock(key = "job:nightly", renew = false, ttl = "1m 30s")]
pub(crate) async fn nightly() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "{tenant:<tenant>}:<point.0>:<pos.y>:<<literal>>")]
async fn patterns(
    (tenant, _unused): (String, u8),
    point: (u8, u8),
    mut pos: Position,
) -> Result<String, LockError> {
    pos.y += point.1 as u32;
    Ok(format!("{tenant}:{}", pos.y))
}

struct Position {
    y: u32,
}

/// An alias of `Result` with one parameter works as well.
type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "alias", client = client)]
async fn alias(client: LockClient) -> AppResult<&'static str> {
    let _ = &client;
    Ok("ok")
}

/// Unsafe and `#[must_use]` are kept.
#[must_use]
#[distributed_lock(key = "unsafe")]
async unsafe fn unsafe_fn(p: *const u8) -> Result<bool, LockError> {
    Ok(p.is_null())
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn every_form_runs() {
    let client = LockClient::builder().memory().build().await.unwrap();
    lock_runtime::set_global_client(client.clone());
    let fut = pay(&client, 40, "2");
    assert_send(&fut);
    assert_eq!(fut.await.unwrap(), 42);
    assert!(matches!(
        pay(&client, 1, "x").await,
        Err(AppError::Parse(_))
    ));
    nightly().await.unwrap();
    let key = patterns(("acme".into(), 0), (1, 2), Position { y: 3 })
        .await
        .unwrap();
    assert_eq!(key, "acme:5");
    assert_eq!(alias(client.clone()).await.unwrap(), "ok");
    // Named, not called (the workspace forbids `unsafe` blocks): that a call
    // needs one is `ui/fail/unsafe_kept.rs`.
    let _ = unsafe_fn as unsafe fn(*const u8) -> _;
    let _ = Duration::ZERO;
}
