use axum::{Router, extract::Path, http::StatusCode, routing::post};
use lock_runtime::{IdempotencyLayer, LockClient, LockLayer};
use std::time::Duration;

async fn pay(Path(id): Path<u64>) -> String {
    format!("order {id} paid")
}

async fn create_order(body: String) -> (StatusCode, String) {
    (StatusCode::CREATED, body)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = LockClient::builder().redis(url).build().await?;

    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(pay).route_layer(
                // The id as the handler parses it: /orders/15 and /orders/015 are one lock.
                LockLayer::new(client.clone())
                    .key_from(|Path(id): Path<u64>| format!("order:{id}"))
                    .wait(Duration::from_secs(2)),
            ),
        )
        .route(
            "/orders",
            post(create_order).route_layer(IdempotencyLayer::new(client.clone())),
        );

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Gives back what is still held (a handler cut short), not after its lease.
    client.shutdown().await;
    Ok(())
}
