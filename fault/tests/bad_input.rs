//! Bad input never panics while serving: property tests over key
//! validation, the `Idempotency-Key` header, `LockLayer` key templates (a
//! malformed one is refused when the layer is built, a panic naming the
//! setter, as axum refuses a bad route; the parser is the one of the
//! `lock-keys` crate, which `#[distributed_lock]` also runs, at compile time,
//! where the trybuild tests cover it), and keys built from tenants' values.
//!
//! All on `.memory()`: the code under test is the same for every backend.

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use lock_runtime::__private::testing::force_delete;
use lock_runtime::{IdempotencyLayer, LockClient, LockInfo, LockLayer, MAX_KEY_LEN};
use proptest::prelude::*;
use tower::ServiceExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn memory() -> LockClient {
    LockClient::builder().memory().build().await.unwrap()
}

/// What the runtime promises to accept.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.chars().any(char::is_control)
}

/// The placeholders' names in a template the layer took (well formed: `<<`
/// and `>>` are literal, any other `<` opens a placeholder that the next `>`
/// closes).
fn placeholder_names(template: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find(['<', '>']) {
        let at = &rest[i..];
        if at.starts_with("<<") || at.starts_with(">>") {
            rest = &at[2..];
            continue;
        }
        let end = at.find('>').expect("a template the layer took is closed");
        names.push(&at[1..end]);
        rest = &at[end + 1..];
    }
    names
}

/// Percent-encodes everything but unreserved characters, for a path segment.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn keys() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[:{} a-zé漢\u{0}-\u{1f}\u{7f}\u{85}]{0,24}",
        "[a-z{}:]{1000,1030}",
    ]
}

async fn body_text(response: axum::response::Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_key_is_locked_or_refused_as_invalid(key in keys()) {
        runtime().block_on(async {
            let client = memory().await;
            match client.lock(key.as_str()).acquire().await {
                Ok(guard) => {
                    prop_assert!(valid_key(&key), "accepted {key:?}");
                    prop_assert_eq!(guard.key(), key.as_str());
                    guard.release().await.unwrap();
                }
                Err(e) => {
                    prop_assert!(e.is_invalid_key(), "{key:?}: {e:?}");
                    prop_assert!(!valid_key(&key), "refused {key:?}: {e}");
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            // `with_lock` and `force_delete` validate the same way.
            let ran = client.with_lock(key.as_str(), async { 7 }).await;
            prop_assert_eq!(ran.is_ok(), valid_key(&key));
            prop_assert_eq!(force_delete(&client, &key).await.is_ok(), valid_key(&key));
            Ok(())
        })?;
    }

    #[test]
    fn any_idempotency_key_header_gets_a_response(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let Ok(value) = HeaderValue::from_bytes(&raw) else {
            // Not sendable in HTTP at all (CR, LF, NUL): nothing to parse.
            return Ok(());
        };
        runtime().block_on(async {
            let client = memory().await;
            let app: Router = Router::new()
                .route("/orders", post(|| async { "created" }))
                .route_layer(IdempotencyLayer::new(client));
            let send = |app: Router| {
                let request = Request::post("/orders")
                    .header("idempotency-key", value.clone())
                    .body(Body::from("{}"))
                    .unwrap();
                app.oneshot(request)
            };
            let first = send(app.clone()).await.unwrap();
            let status = first.status();
            prop_assert!(status == StatusCode::OK || status == StatusCode::BAD_REQUEST, "{status} for {raw:?}");
            let simple = !raw.is_empty()
                && raw.len() <= 255
                && raw.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-');
            if simple {
                prop_assert_eq!(status, StatusCode::OK);
            }
            if status == StatusCode::OK {
                prop_assert_eq!(body_text(first).await, "created");
                // The retry is answered from the record.
                let again = send(app).await.unwrap();
                prop_assert_eq!(again.status(), StatusCode::OK);
                prop_assert_eq!(
                    again.headers().get("idempotent-replayed").map(|v| v.as_bytes()),
                    Some(&b"true"[..])
                );
            } else {
                prop_assert!(body_text(first).await.contains("Idempotency-Key"));
            }
            Ok(())
        })?;
    }

    #[test]
    fn any_lock_layer_template_and_path_values_get_a_response(
        template in "[<>ab:{} é.x]{0,16}",
        a in any::<String>(),
        b in "[a-z{}<>:/ ]{1,8}",
    ) {
        runtime().block_on(async {
            let client = memory().await;
            let plain = !template.contains(['<', '>']);
            // A malformed template is refused when the layer is built (a
            // panic naming the setter), never answered per request.
            let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                LockLayer::new(client).key(&template)
            }));
            let layer = match built {
                Ok(layer) => layer,
                Err(payload) => {
                    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
                    prop_assert!(message.starts_with("LockLayer::key: "), "{message}");
                    prop_assert!(
                        !(plain && valid_key(&template)),
                        "the plain key {template:?} was refused: {message}"
                    );
                    return Ok(());
                }
            };
            let app: Router = Router::new()
                .route("/r/{a}/{b}", get(|lock: LockInfo| async move { lock.key }))
                .route_layer(layer);
            let uri = format!("/r/{}/{}", encode(&a), encode(&b));
            let request = Request::get(uri.as_str()).body(Body::empty()).unwrap();
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            // A template naming a parameter its route lacks is the
            // service's mistake: 500, whatever the request.
            if placeholder_names(&template).iter().any(|n| !["a", "b"].contains(n)) {
                prop_assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{:?}", template);
                return Ok(());
            }
            prop_assert!(
                [StatusCode::OK, StatusCode::BAD_REQUEST].contains(&status),
                "{status} for template {template:?}, a {a:?}, b {b:?}"
            );
            if plain && valid_key(&template) {
                prop_assert_eq!(status, StatusCode::OK);
                prop_assert_eq!(body_text(response).await, template);
            } else if status == StatusCode::OK {
                let key = body_text(response).await;
                prop_assert!(valid_key(&key));
            }
            Ok(())
        })?;
    }

    /// With the tenant inside a hash tag that its values cannot close, no
    /// request of one tenant names another tenant's lock, whatever the rest
    /// of the key (the part a caller chooses) holds.
    #[test]
    fn a_tenant_cannot_name_another_tenants_lock(
        t1 in "[a-z0-9_-]{1,8}",
        t2 in "[a-z0-9_-]{1,8}",
        id1 in any::<String>(),
        id2 in any::<String>(),
    ) {
        prop_assume!(t1 != t2);
        runtime().block_on(async {
            let client = memory().await;
            let app: Router = Router::new()
                .route("/t/{tenant}/orders/{id}", get(|lock: LockInfo| async move { lock.key }))
                .route_layer(LockLayer::new(client).key("{tenant:<tenant>}:order:<id>"));
            let mut keys = Vec::new();
            for (t, id) in [(&t1, &id1), (&t2, &id2)] {
                let uri = format!("/t/{}/orders/{}", encode(t), encode(id));
                let request = Request::get(uri.as_str()).body(Body::empty()).unwrap();
                let response = app.clone().oneshot(request).await.unwrap();
                if response.status() == StatusCode::OK {
                    let key = body_text(response).await;
                    let tag = format!("{{tenant:{t}}}");
                    prop_assert!(key.starts_with(&tag), "{key:?}");
                    keys.push(key);
                }
            }
            if let [k1, k2] = &keys[..] {
                prop_assert_ne!(k1, k2);
            }
            Ok(())
        })?;
    }
}

/// Template values are escaped (`%`, `:`, `{`, `}`): a tenant value that
/// contains the literal text following its placeholder (here `}:order:`)
/// cannot forge another tenant's key.
#[test]
fn a_tenant_value_containing_separators_cannot_forge_another_tenants_key() {
    runtime().block_on(async {
        let client = memory().await;
        let app: Router = Router::new()
            .route(
                "/t/{tenant}/orders/{id}",
                get(|lock: LockInfo| async move { lock.key }),
            )
            .route_layer(LockLayer::new(client).key("{tenant:<tenant>}:order:<id>"));
        let mut keys = Vec::new();
        for (t, id) in [("acme", "1}:order:2"), ("acme}:order:1", "2")] {
            let uri = format!("/t/{}/orders/{}", encode(t), encode(id));
            let request = Request::get(uri.as_str()).body(Body::empty()).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            keys.push(body_text(response).await);
        }
        assert_ne!(
            keys[0], keys[1],
            "one tenant's values spelled another's key"
        );
        assert_eq!(keys[0], "{tenant:acme}:order:1%7D%3Aorder%3A2");
        assert_eq!(keys[1], "{tenant:acme%7D%3Aorder%3A1}:order:2");
    });
}

#[test]
fn a_one_megabyte_key_is_refused_at_once_with_the_limit_in_the_message() {
    runtime().block_on(async {
        let client = memory().await;
        let huge = "k".repeat(1 << 20);
        let started = std::time::Instant::now();
        let err = client.lock(huge.as_str()).acquire().await.unwrap_err();
        assert!(err.is_invalid_key(), "{err:?}");
        assert!(err.to_string().contains("1024"), "{err}");
        // The message does not echo the megabyte.
        assert!(
            err.to_string().len() < 200,
            "{} bytes",
            err.to_string().len()
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    });
}
