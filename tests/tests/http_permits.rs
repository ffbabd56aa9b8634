//! `LockLayer::permits(n)`: a distributed per-key concurrency limit for
//! routes, on an axum app served on a loopback port and driven by a real HTTP
//! client. Each scenario runs on the embedded backend (`memory::<name>`) and
//! on a `redis-server` of its own (`redis::<name>`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::StatusCode;
use lock_runtime::LockInfo;
use lock_runtime::layer::LockLayer;
use test_support::helpers::{eventually, memory_client, ms, secs, within};
use test_support::http::{send, serve};
use tokio::sync::{Barrier, Semaphore};
use tokio::task::JoinHandle;

use tests::both_backends;
use tests::core_support::Env;

// Braces: rustfmt leaves the list alone.
both_backends! {
    two_permits_let_two_requests_run_at_once_and_the_third_gets_429_until_one_ends,
    one_permit_is_a_mutex_that_answers_429_with_the_holders_remaining_lease,
    an_explicit_busy_status_wins_over_429,
    a_request_waits_for_a_permit_within_its_wait,
    every_key_has_its_own_permits,
}

/// The handlers of [`export_app`]: how many run now, the most that ever
/// ran at once, and a gate each one passes (one permit of `finish`) before
/// it answers.
#[derive(Clone)]
struct Handlers {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    finish: Arc<Semaphore>,
}

impl Handlers {
    fn new() -> Self {
        Self {
            now: Arc::default(),
            max: Arc::default(),
            runs: Arc::default(),
            finish: Arc::new(Semaphore::new(0)),
        }
    }

    fn running(&self) -> usize {
        self.now.load(SeqCst)
    }

    /// Lets `n` handlers (running or to come) answer.
    fn let_finish(&self, n: usize) {
        self.finish.add_permits(n);
    }
}

/// `POST /tenants/{tenant}/export` under `layer`. The handler holds until
/// the test lets it finish ([`Handlers::let_finish`]), then answers
/// `<key> <fencing token> <whether current_lock() is its LockInfo>`.
fn export_app(layer: LockLayer) -> (Router, Handlers) {
    let handlers = Handlers::new();
    let app = Router::new()
        .route("/tenants/{tenant}/export", post(export))
        .route_layer(layer)
        .with_state(handlers.clone());
    (app, handlers)
}

async fn export(State(h): State<Handlers>, permit: LockInfo) -> String {
    let now = h.now.fetch_add(1, SeqCst) + 1;
    h.max.fetch_max(now, SeqCst);
    h.runs.fetch_add(1, SeqCst);
    let seen = lock_runtime::current_lock() == Some(permit.clone());
    h.finish.acquire().await.expect("open").forget();
    h.now.fetch_sub(1, SeqCst);
    format!(
        "{} {} {seen}",
        permit.key,
        permit.fencing_token().await.unwrap()
    )
}

/// A request sent from a task of its own: its status and body.
fn spawn_export(base: &str, tenant: &str) -> JoinHandle<(StatusCode, String)> {
    let url = format!("{base}/tenants/{tenant}/export");
    tokio::spawn(async move {
        let r = send(reqwest::Client::new().post(url)).await;
        (r.status(), r.text().await.unwrap())
    })
}

/// Awaits a request of [`spawn_export`] that must succeed under the permit
/// `key`; returns its fencing token.
async fn exported(request: JoinHandle<(StatusCode, String)>, key: &str) -> u64 {
    let (status, body) = within(secs(10), "an export's answer", request)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut words = body.split(' ');
    assert_eq!(words.next(), Some(key), "{body}");
    let token = words.next().unwrap().parse().unwrap();
    assert_eq!(
        words.next(),
        Some("true"),
        "current_lock() is not the handler's LockInfo: {body}"
    );
    token
}

/// Checks a refusal: `status`, a `Retry-After` of whole seconds in
/// `retry_after`, and a problem+json body whose detail names `key` and
/// whose title is the status's.
async fn assert_refused(
    r: reqwest::Response,
    status: StatusCode,
    retry_after: std::ops::RangeInclusive<u64>,
    key: &str,
) -> String {
    assert_eq!(r.status(), status);
    let after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after.contains(&after), "Retry-After: {after}");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = r.json().await.unwrap();
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["status"], status.as_u16());
    assert_eq!(problem["title"], status.canonical_reason().unwrap());
    let detail = problem["detail"].as_str().unwrap().to_owned();
    // The key stays with the service.
    assert!(!detail.contains(key), "{detail}");
    detail
}

async fn two_permits_let_two_requests_run_at_once_and_the_third_gets_429_until_one_ends(env: Env) {
    let layer = LockLayer::new(env.client.clone())
        .key("export:<tenant>")
        .permits(2)
        .ttl(secs(6));
    let (app, handlers) = export_app(layer);
    let base = serve(app).await;
    let http = reqwest::Client::new();

    let first = spawn_export(&base, "acme");
    let second = spawn_export(&base, "acme");
    eventually(secs(5), "two exports run at once", || {
        handlers.running() == 2
    })
    .await;

    // Both permits are taken: the third is refused at once, and says why.
    let r = send(http.post(format!("{base}/tenants/acme/export"))).await;
    // The permit that ends first: a 6 s lease renewed every 2 s.
    let detail = assert_refused(r, StatusCode::TOO_MANY_REQUESTS, 3..=6, "export:acme").await;
    assert!(detail.contains("2 permits"), "{detail}");
    assert_eq!(handlers.runs.load(SeqCst), 2, "a refused request ran");

    // One ends: once its answer is in, its permit is free for the next
    // request (the layer releases it before the response is handed on).
    handlers.let_finish(1);
    eventually(secs(5), "one export is answered", || {
        first.is_finished() || second.is_finished()
    })
    .await;
    assert_eq!(handlers.running(), 1);
    let third = spawn_export(&base, "acme");
    eventually(secs(5), "a new export gets the freed permit", || {
        handlers.running() == 2
    })
    .await;

    handlers.let_finish(2);
    let mut tokens = Vec::new();
    for request in [first, second, third] {
        tokens.push(exported(request, "export:acme").await);
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "one fencing token per permit: {tokens:?}");
    assert!(tokens[0] >= 1, "{tokens:?}");
    assert_eq!(handlers.max.load(SeqCst), 2, "more than 2 exports at once");

    // All permits are back.
    let again = [spawn_export(&base, "acme"), spawn_export(&base, "acme")];
    eventually(secs(5), "two exports run again", || handlers.running() == 2).await;
    handlers.let_finish(2);
    for request in again {
        exported(request, "export:acme").await;
    }
}

async fn one_permit_is_a_mutex_that_answers_429_with_the_holders_remaining_lease(env: Env) {
    let layer = LockLayer::new(env.client.clone())
        .key("export:<tenant>")
        .permits(1);
    let (app, handlers) = export_app(layer);
    let base = serve(app).await;
    let http = reqwest::Client::new();

    // A holder outside HTTP (another process, say) takes the only permit.
    let holder = env
        .client
        .semaphore("export:acme", 1)
        .ttl(secs(6))
        .acquire()
        .await
        .unwrap();
    let r = send(http.post(format!("{base}/tenants/acme/export"))).await;
    // The holder's remaining lease, rounded up: renewed every 2 s, so 4 to 6 s.
    let detail = assert_refused(r, StatusCode::TOO_MANY_REQUESTS, 3..=6, "export:acme").await;
    assert!(detail.contains("only permit"), "{detail}");
    assert_eq!(
        handlers.runs.load(SeqCst),
        0,
        "the handler ran without a permit"
    );

    // Another tenant is free meanwhile.
    handlers.let_finish(1);
    exported(spawn_export(&base, "globex"), "export:globex").await;

    holder.release().await.unwrap();
    let running = spawn_export(&base, "acme");
    eventually(secs(5), "the export runs", || handlers.running() == 1).await;
    // A request holds the permit as the outside holder did.
    let r = send(http.post(format!("{base}/tenants/acme/export"))).await;
    assert_refused(r, StatusCode::TOO_MANY_REQUESTS, 1..=30, "export:acme").await;
    handlers.let_finish(1);
    exported(running, "export:acme").await;
    assert_eq!(handlers.max.load(SeqCst), 1);
}

async fn an_explicit_busy_status_wins_over_429(env: Env) {
    // Whichever of the two is set first.
    let layers = [
        LockLayer::new(env.client.clone())
            .key("export:<tenant>")
            .permits(1)
            .busy_status(StatusCode::SERVICE_UNAVAILABLE),
        LockLayer::new(env.client.clone())
            .key("export:<tenant>")
            .busy_status(StatusCode::SERVICE_UNAVAILABLE)
            .permits(1),
    ];
    let holder = env
        .client
        .semaphore("export:acme", 1)
        .acquire()
        .await
        .unwrap();
    for layer in layers {
        assert!(
            format!("{layer:?}").contains("busy_status: 503"),
            "{layer:?}"
        );
        let (app, handlers) = export_app(layer);
        let base = serve(app).await;
        let r = send(reqwest::Client::new().post(format!("{base}/tenants/acme/export"))).await;
        assert_refused(r, StatusCode::SERVICE_UNAVAILABLE, 1..=30, "export:acme").await;
        assert_eq!(handlers.runs.load(SeqCst), 0);
    }
    holder.release().await.unwrap();
}

async fn a_request_waits_for_a_permit_within_its_wait(env: Env) {
    let layer = LockLayer::new(env.client.clone())
        .key("export:<tenant>")
        .permits(2)
        .wait(secs(10));
    let (app, handlers) = export_app(layer);
    let base = serve(app).await;
    handlers.let_finish(1);
    let holders = [
        env.client
            .semaphore("export:acme", 2)
            .acquire()
            .await
            .unwrap(),
        env.client
            .semaphore("export:acme", 2)
            .acquire()
            .await
            .unwrap(),
    ];
    let waiting = spawn_export(&base, "acme");
    tokio::time::sleep(ms(200)).await;
    assert!(!waiting.is_finished(), "the request did not wait");
    assert_eq!(
        handlers.runs.load(SeqCst),
        0,
        "the handler ran without a permit"
    );
    let [first, _second] = holders;
    first.release().await.unwrap();
    exported(waiting, "export:acme").await;
}

async fn every_key_has_its_own_permits(env: Env) {
    const TENANTS: usize = 3;
    const PERMITS: usize = 2;
    // Every handler waits for all the others: this only completes if the
    // tenants' requests all run at the same time.
    let barrier = Arc::new(Barrier::new(TENANTS * PERMITS));
    let app = Router::new()
        .route(
            "/tenants/{tenant}/export",
            post(move |permit: LockInfo| {
                let barrier = barrier.clone();
                async move {
                    match tokio::time::timeout(secs(10), barrier.wait()).await {
                        Ok(_) => Ok(permit.key),
                        Err(_) => Err((
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "the exports did not all run at once",
                        )),
                    }
                }
            }),
        )
        .route_layer(
            LockLayer::new(env.client.clone())
                .key("export:<tenant>")
                .permits(PERMITS as u32),
        );
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let replies = futures_util::future::join_all((0..TENANTS * PERMITS).map(|i| {
        let http = http.clone();
        let tenant = i % TENANTS;
        let url = format!("{base}/tenants/t{tenant}/export");
        async move {
            let r = send(http.post(url)).await;
            (tenant, r.status(), r.text().await.unwrap())
        }
    }))
    .await;
    for (tenant, status, body) in replies {
        assert_eq!(status, StatusCode::OK, "tenant t{tenant}: {body}");
        assert_eq!(body, format!("export:t{tenant}"));
    }
}

#[tokio::test]
async fn zero_permits_are_refused_when_the_layer_is_built() {
    let client = memory_client().await;
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        LockLayer::new(client.clone())
            .key("export:<tenant>")
            .permits(0)
    }));
    let payload = refused.expect_err("permits(0) was accepted");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(message.starts_with("LockLayer::permits"), "{message}");
    assert!(message.contains("zero permits"), "{message}");
}

#[tokio::test]
async fn the_layer_and_its_service_show_their_permits() {
    use tower::Layer;

    let client = memory_client().await;
    let mutex = LockLayer::new(client.clone()).key("export:<tenant>");
    let shown = format!("{mutex:?}");
    assert!(shown.contains("permits: None"), "{shown}");
    assert!(shown.contains("busy_status: 409"), "{shown}");

    let limited = mutex.permits(4);
    let shown = format!("{limited:?}");
    assert!(shown.contains("permits: Some(4)"), "{shown}");
    assert!(shown.contains("busy_status: 429"), "{shown}");
    let service = format!("{:?}", limited.layer(()));
    assert!(service.contains("permits: Some(4)"), "{service}");
}
