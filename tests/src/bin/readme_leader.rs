use lock_runtime::{LockClient, fence, redis};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = LockClient::builder().redis(url.as_str()).build().await?;
    // Where the fenced writes go: any Redis (here the lock's), through the
    // `redis` crate lock_runtime re-exports, so the types are the library's.
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    let leadership = client
        .leader("order-sweeper")
        .ttl(Duration::from_secs(10)) // a dead leader is replaced within this
        .label("pod-a") // what observers and `lockctl leaders` show
        .campaign() // waits in line until elected
        .await?;

    // Resource and keys share one hash slot: `{orders}` is their hash tag.
    fence::redis(&mut conn, "{orders}:sweeper", leadership.term())
        .cmd(
            redis::cmd("HSET")
                .arg("{orders}:42")
                .arg("status")
                .arg("cancelled"),
        )
        .run()
        .await?; // Err(LockError::Stale { .. }) once a later term wrote: nothing written
    leadership.resign().await?; // the next candidate is elected at once
    Ok(())
}
