//! `LockLayer`'s keys as a real HTTP client meets them: aliases of one
//! order (`/orders/7/pay`, `/orders/007/pay`, `/orders/+7/pay`) take one
//! lock when the key is the typed id and run at once under a raw-text
//! template, a key extractor that rejects a request answers with its own
//! rejection, the handler never run, and a template naming a parameter its
//! route lacks is the server's mistake.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use http::StatusCode;
use lock_runtime::LockInfo;
use lock_runtime::layer::LockLayer;
use test_support::RedisServer;
use test_support::helpers::{memory_client, ms, redis_client, secs};
use test_support::http::{send, serve};

mod layers_common;
use layers_common::Gauge;

/// Sends one pay per path in `paths`, all at once, to a `/orders/{id}/pay`
/// route under `layer`. Every handler that runs is held until each request
/// has either been answered or entered the handler, so a lock that lets two
/// aliases through shows as two handlers at once, whatever the timing.
/// Returns the statuses (in the order of `paths`) and the most handlers that
/// ran at once.
async fn pay_through_aliases(layer: LockLayer, paths: &[&str]) -> (Vec<StatusCode>, usize) {
    let gauge = Gauge::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(
                move |State(gauge): State<Gauge>, Path(id): Path<u64>, lock: LockInfo| {
                    let mut gate = gate.clone();
                    async move {
                        let _inside = gauge.enter();
                        gate.wait_for(|open| *open).await.unwrap();
                        format!("order {id} paid under {}", lock.key)
                    }
                },
            ),
        )
        .route_layer(layer)
        .with_state(gauge.clone());
    let base = serve(app).await;
    let http = reqwest::Client::new();
    let answered = Arc::new(AtomicUsize::new(0));
    let requests: Vec<_> = paths
        .iter()
        .map(|path| {
            let (http, answered) = (http.clone(), answered.clone());
            let url = format!("{base}{path}");
            tokio::spawn(async move {
                let r = send(http.post(url)).await;
                let status = r.status();
                let body = r.text().await.unwrap();
                answered.fetch_add(1, Ordering::SeqCst);
                (status, body)
            })
        })
        .collect();
    let deadline = Instant::now() + secs(10);
    while answered.load(Ordering::SeqCst) + gauge.now.load(Ordering::SeqCst) < paths.len() {
        assert!(
            Instant::now() < deadline,
            "requests neither answered nor in the handler"
        );
        tokio::time::sleep(ms(5)).await;
    }
    open.send(true).unwrap();
    let mut statuses = Vec::new();
    for (path, request) in paths.iter().zip(requests) {
        let (status, body) = request.await.unwrap();
        println!("{path}: {status} {body}");
        statuses.push(status);
    }
    (statuses, gauge.max.load(Ordering::SeqCst))
}

const ALIASES_OF_15: [&str; 5] = [
    "/orders/15/pay",
    "/orders/015/pay",
    "/orders/+15/pay",
    "/orders/0015/pay",
    "/orders/00015/pay",
];

fn count(statuses: &[StatusCode], wanted: StatusCode) -> usize {
    statuses.iter().filter(|&&s| s == wanted).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliased_paths_of_one_order_take_one_lock_when_the_key_is_the_typed_id() {
    let server = RedisServer::start();
    for client in [redis_client(&server).await, memory_client().await] {
        let layer = LockLayer::new(client).key_from(|Path(id): Path<u64>| format!("order:{id}"));
        let (statuses, most_at_once) = pay_through_aliases(layer, &ALIASES_OF_15).await;
        assert_eq!(count(&statuses, StatusCode::OK), 1, "{statuses:?}");
        assert_eq!(
            count(&statuses, StatusCode::CONFLICT),
            ALIASES_OF_15.len() - 1,
            "{statuses:?}"
        );
        assert_eq!(most_at_once, 1);
    }
}

/// The default key is the path as the router reads it: percent-encoded
/// spellings of one path take one lock (each took a lock of its own, so a
/// client could run one order's handler three times at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_encoded_spellings_of_one_path_take_its_one_lock_by_default() {
    let client = memory_client().await;
    let spellings = ["/orders/15/pay", "/orders/%31%35/pay", "/orders/1%35/pay"];
    let (statuses, most_at_once) = pay_through_aliases(LockLayer::new(client), &spellings).await;
    assert_eq!(count(&statuses, StatusCode::OK), 1, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::CONFLICT), 2, "{statuses:?}");
    assert_eq!(most_at_once, 1);
}

/// What `key_from` is for: a template renders the path text, so the aliases
/// of one order take different locks and are paid at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_text_template_lets_aliases_of_one_order_run_at_once() {
    let client = memory_client().await;
    let layer = LockLayer::new(client).key("order:<id>");
    let (statuses, most_at_once) = pay_through_aliases(layer, &ALIASES_OF_15).await;
    assert_eq!(
        count(&statuses, StatusCode::OK),
        ALIASES_OF_15.len(),
        "{statuses:?}"
    );
    assert_eq!(most_at_once, ALIASES_OF_15.len());
}

/// An account number read from the `x-account` header, as a handler would
/// extract it.
struct Account(u32);

impl<S: Sync> axum::extract::FromRequestParts<S> for Account {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let value = parts.headers.get("x-account").and_then(|v| v.to_str().ok());
        match value.and_then(|v| v.trim().parse().ok()) {
            Some(n) => Ok(Account(n)),
            None => Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                "x-account must be an account number",
            )),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_extractor_that_rejects_answers_with_its_own_rejection_and_the_handler_never_runs() {
    let client = memory_client().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move |lock: Option<LockInfo>| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            lock.map(|l| l.key).unwrap_or_default()
        }
    };
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(handler.clone()).route_layer(
                LockLayer::new(client.clone())
                    .key_from(|Path(id): Path<u64>| format!("order:{id}")),
            ),
        )
        // The same extractor in a handler, without the layer: its own rejection.
        .route(
            "/unlocked/orders/{id}/pay",
            post(|Path(id): Path<u64>| async move { id.to_string() }),
        )
        .route(
            "/accounts/debit",
            post(handler).route_layer(
                LockLayer::new(client.clone())
                    .key_from(|Account(n): Account| format!("account:{n}")),
            ),
        );
    let base = serve(app).await;
    let http = reqwest::Client::new();

    let locked = send(http.post(format!("{base}/orders/abc/pay"))).await;
    let unlocked = send(http.post(format!("{base}/unlocked/orders/abc/pay"))).await;
    assert_eq!(locked.status(), StatusCode::BAD_REQUEST);
    assert_eq!(locked.status(), unlocked.status());
    let (locked, unlocked) = (locked.text().await.unwrap(), unlocked.text().await.unwrap());
    assert!(locked.contains("Cannot parse `abc` to a `u64`"), "{locked}");
    assert_eq!(locked, unlocked);

    let r = send(
        http.post(format!("{base}/accounts/debit"))
            .header("x-account", "seven"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.text().await.unwrap(),
        "x-account must be an account number"
    );
    let r = send(http.post(format!("{base}/accounts/debit"))).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a handler ran");

    // Accepted: the handler runs under the lock named by the parsed value.
    let r = send(
        http.post(format!("{base}/accounts/debit"))
            .header("x-account", " 007"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.text().await.unwrap(), "account:7");
    let r = send(http.post(format!("{base}/orders/+15/pay"))).await;
    assert_eq!(r.text().await.unwrap(), "order:15");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The layer added to a route without the parameter its template names: the
/// server's mistake (`500`, the handler never run), not the client's (it
/// was `400`, blaming a request that could never have been right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_naming_a_parameter_its_route_lacks_answers_500() {
    let client = memory_client().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
        }
    };
    let layer = LockLayer::new(client).key("order:<order_id>");
    let app = Router::new().route("/orders/{id}/pay", post(handler).route_layer(layer));
    let base = serve(app).await;
    let r = send(reqwest::Client::new().post(format!("{base}/orders/7/pay"))).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = r.text().await.unwrap();
    assert!(body.contains("misconfigured"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
