//! HTTP fixtures: an axum app served on a loopback port.

use axum::Router;

/// Serves `app` on a free loopback port from a spawned task (it runs until
/// the runtime ends); returns its base URL, `http://127.0.0.1:<port>`.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve the app") });
    format!("http://{addr}")
}
