//! Support for the runtime-core suites (`tests/tests/core*.rs`): one fixture
//! that gives the same test a `.memory()` or a real-Redis client, a macro that
//! generates one `#[tokio::test]` per backend from one `async fn`, and a
//! capture of the library's `tracing` warnings. (The small timing helpers are
//! in `test_support::helpers`.)
//!
//! A module of the `tests` crate's library: a test file takes what it needs
//! with `use tests::core_support::{Env, warnings_for};` and the macro with
//! `use tests::both_backends;`.

use std::sync::{Mutex, OnceLock};

use lock_runtime::{LockClient, LockClientBuilder};
use test_support::RedisServer;
use test_support::helpers::{default_redis_client, memory_client};

/// Which backend a fixture runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The embedded backend (`.memory()`).
    Memory,
    /// A `redis-server` of the fixture's own.
    Redis,
}

/// One backend under test: its client, and for Redis the server it talks to.
pub struct Env {
    /// Its backend.
    pub kind: Kind,
    /// A client on that backend.
    pub client: LockClient,
    /// The server, for Redis.
    pub server: Option<RedisServer>,
}

impl Env {
    /// A fixture on the embedded backend.
    pub async fn memory() -> Self {
        capture_warnings();
        let client = memory_client().await;
        Self {
            kind: Kind::Memory,
            client,
            server: None,
        }
    }

    /// A fixture on a fresh `redis-server` of its own.
    pub async fn redis() -> Self {
        capture_warnings();
        let server = RedisServer::start();
        let client = default_redis_client(&server).await;
        Self {
            kind: Kind::Redis,
            client,
            server: Some(server),
        }
    }

    /// A fixture on `kind`.
    pub async fn new(kind: Kind) -> Self {
        match kind {
            Kind::Memory => Self::memory().await,
            Kind::Redis => Self::redis().await,
        }
    }

    /// A builder pointed at this fixture's backend (a new client for Redis;
    /// for memory a builder gives an unrelated store, so prefer [`Env::other`]).
    pub fn builder(&self) -> LockClientBuilder {
        match &self.server {
            Some(server) => LockClient::builder().redis(server.url()),
            None => LockClient::builder().memory(),
        }
    }

    /// A second client on the same store. For Redis an independent client (own
    /// connections, own subscriber, own reentrancy identity); for the embedded
    /// backend, which lives inside one client, a clone: what differs between
    /// the two is then only the per-acquisition ownership token.
    pub async fn other(&self) -> LockClient {
        match &self.server {
            Some(server) => default_redis_client(server).await,
            None => self.client.clone(),
        }
    }

    /// The Redis fixture's server (panics on the embedded backend).
    pub fn server(&self) -> &RedisServer {
        self.server.as_ref().expect("a Redis fixture")
    }

    /// Whether the fixture runs on Redis.
    pub fn is_redis(&self) -> bool {
        self.kind == Kind::Redis
    }
}

/// Generates, for each named `async fn name(env: Env)`, a test
/// `memory::name` and a test `redis::name` on a multi-thread runtime.
/// Attributes written before a name (`#[cfg(unix)]`, say) go on both tests.
#[macro_export]
macro_rules! both_backends {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod memory {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::core_support::Env::memory().await).await
                }
            )*
        }
        mod redis {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::core_support::Env::redis().await).await
                }
            )*
        }
    };
}

// ---- tracing capture -----------------------------------------------------

/// One event the library emitted: every `WARN`/`ERROR`, and events of any
/// level for the keys passed to [`watch_events`].
#[derive(Clone, Debug)]
pub struct Captured {
    /// Its level.
    pub level: tracing::Level,
    /// Its message.
    pub message: String,
    /// Its `key` field, if any.
    pub key: Option<String>,
    /// The names of the event's fields (`waited_us`, `fencing`, ...).
    pub fields: Vec<&'static str>,
}

/// The `WARN`-or-worse events, kept for the tests that look for them.
pub type Warning = Captured;

static EVENTS: Mutex<Vec<Captured>> = Mutex::new(Vec::new());
static WATCHED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Installs (once per process) a global subscriber that records warnings,
/// and every event (down to `TRACE`) of watched keys.
/// Set `CORE_TEST_LOG=debug` (an `EnvFilter`) to also print the library's events.
pub fn capture_warnings() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::{Layer, filter::LevelFilter};
        let print = std::env::var("CORE_TEST_LOG").ok().map(|filter| {
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::new(filter))
        });
        let _ = tracing_subscriber::registry()
            .with(Capture.with_filter(LevelFilter::TRACE))
            .with(print)
            .try_init();
    });
}

/// Records every event whose `key` field is `key` from now on.
pub fn watch_events(key: &str) {
    capture_warnings();
    lock(&WATCHED).push(key.to_owned());
}

/// The events recorded so far whose `key` field is `key`.
pub fn events_for(key: &str) -> Vec<Captured> {
    lock(&EVENTS)
        .iter()
        .filter(|e| e.key.as_deref() == Some(key))
        .cloned()
        .collect()
}

/// The `WARN`-or-worse events recorded so far whose `key` field is `key`.
pub fn warnings_for(key: &str) -> Vec<Warning> {
    events_for(key)
        .into_iter()
        .filter(|e| e.level <= tracing::Level::WARN)
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Capture;

#[derive(Default)]
struct Fields {
    message: String,
    key: Option<String>,
    names: Vec<&'static str>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.names.push(field.name());
        match field.name() {
            "message" => self.message = value.to_owned(),
            "key" => self.key = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.names.push(field.name());
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "key" => self.key = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let level = *event.metadata().level();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let keep = level <= tracing::Level::WARN
            || fields
                .key
                .as_ref()
                .is_some_and(|k| lock(&WATCHED).iter().any(|w| w == k));
        if keep {
            lock(&EVENTS).push(Captured {
                level,
                message: fields.message,
                key: fields.key,
                fields: fields.names,
            });
        }
    }
}
