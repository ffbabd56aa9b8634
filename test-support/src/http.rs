//! HTTP fixtures: an axum app served on a loopback port, and requests to it.

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

/// Sends `request` and returns the response, whatever its status (the test
/// checks that); fails the test if the request cannot be sent.
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.expect("send the request")
}

/// Writes `request` (a whole HTTP/1.1 request, headers and body) on a raw
/// connection to the app at `base`, and returns the connection: dropping it
/// is exactly a client going away mid-request.
pub fn raw_request(base: &str, request: &str) -> std::net::TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the app");
    std::io::Write::write_all(&mut conn, request.as_bytes()).expect("write the request");
    conn
}
