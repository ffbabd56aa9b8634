//! One Redis (or Valkey) server: scripts on a multiplexed, self-reconnecting
//! connection, and one shared pub/sub connection for release notices.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, oneshot};

use super::waiters::{Registry, WaitHandle};
use super::{AcquireOutcome, HANDOFF_LEASE};
use crate::LockError;
use crate::error::BackendError;
use crate::key::KeyNames;
use crate::token::Token;

static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/acquire.lua")));
static EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/extend.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/release.lua")));
static EXTEND_MANY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../scripts/extend_many.lua")));

/// How the client talks to one server.
#[derive(Clone, Debug)]
pub(crate) struct RedisOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

pub(crate) struct RedisBackend {
    conn: ConnectionManager,
    waiters: Arc<Registry>,
    notifier: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

/// Parses a URL into a driver client, as a configuration error when malformed.
pub(crate) fn open_client(url: &str) -> Result<redis::Client, LockError> {
    let client = redis::Client::open(url).map_err(|e| {
        // Never echo the URL: it may carry a password.
        LockError::Config(format!("invalid Redis URL: {e}"))
    })?;
    #[cfg(not(feature = "tls"))]
    if url.starts_with("rediss://") {
        return Err(LockError::Config(
            "`rediss://` needs the `tls` feature of lock-runtime".into(),
        ));
    }
    Ok(client)
}

impl RedisBackend {
    pub(crate) async fn connect(url: &str, options: &RedisOptions) -> Result<Self, LockError> {
        let client = open_client(url)?;
        #[cfg(feature = "tls")]
        {
            // rustls needs a process-wide crypto provider; keep the user's if set.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut conn = tokio::time::timeout(
            options
                .connect_timeout
                .saturating_add(Duration::from_millis(100)),
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| BackendError::timeout("connecting to Redis timed out"))?
        .map_err(|e| BackendError::with_source("cannot connect to Redis", e))?;
        // Load the scripts once, so the hot path is a plain EVALSHA.
        for script in [&*ACQUIRE, &*EXTEND, &*RELEASE, &*EXTEND_MANY] {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| BackendError::with_source("cannot load the lock scripts", e))?;
        }
        let waiters = Arc::new(Registry::default());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(notifier(client, options.clone(), waiters.clone(), rx));
        Ok(Self {
            conn,
            waiters,
            notifier: tx,
        })
    }

    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquireOutcome, LockError> {
        let wait_ms = if wait.is_zero() { 0 } else { millis(wait) };
        let (acquired, value): (i64, i64) = ACQUIRE
            .key(&names.lock)
            .key(&names.fence)
            .key(&names.queue)
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(wait_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| BackendError::with_source("acquire failed", e))?;
        let value = u64::try_from(value).unwrap_or(0);
        Ok(if acquired == 1 {
            AcquireOutcome::Acquired { fencing: value }
        } else {
            AcquireOutcome::Busy {
                remaining: Duration::from_millis(value),
            }
        })
    }

    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let extended: i64 = EXTEND
            .key(&names.lock)
            .arg(token.as_str())
            .arg(millis(ttl))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| BackendError::with_source("extend failed", e))?;
        Ok(extended == 1)
    }

    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        token: &Token,
        ttl: Duration,
        dequeue: bool,
    ) -> Result<bool, LockError> {
        let member = if dequeue {
            format!("{}:{}", token.as_str(), millis(ttl))
        } else {
            String::new()
        };
        let answer: redis::Value = RELEASE
            .key(&names.lock)
            .key(&names.fence)
            .key(&names.queue)
            .arg(token.as_str())
            .arg(&names.notice)
            .arg(millis(HANDOFF_LEASE))
            .arg(member)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| BackendError::with_source("release failed", e))?;
        match answer {
            redis::Value::Array(items) if !items.is_empty() => {
                // Handed over: if the new owner waits in this process, wake it
                // now instead of after the notice's trip through pub/sub.
                if let [
                    _,
                    redis::Value::BulkString(next),
                    redis::Value::Int(fencing),
                ] = &items[..]
                    && let (Ok(next), Ok(fencing)) =
                        (std::str::from_utf8(next), u64::try_from(*fencing))
                {
                    self.waiters.grant(&names.notice, next, fencing);
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) async fn extend_many(
        &self,
        leases: &[(&KeyNames, &Token, Duration)],
    ) -> Result<Vec<bool>, LockError> {
        let mut invocation = EXTEND_MANY.prepare_invoke();
        for (names, token, ttl) in leases {
            invocation
                .key(&names.lock)
                .arg(token.as_str())
                .arg(millis(*ttl));
        }
        let extended: Vec<i64> = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| BackendError::with_source("batched extend failed", e))?;
        Ok(extended.into_iter().map(|e| e == 1).collect())
    }

    /// Deletes a key as an operator would (`DEL`), for tests.
    pub(crate) async fn delete(&self, names: &KeyNames) -> Result<(), LockError> {
        redis::cmd("DEL")
            .arg(&names.lock)
            .exec_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// `true` when notices for `names` already reach this process, so a
    /// waiter can register before its first attempt at no cost.
    pub(crate) fn is_subscribed(&self, names: &KeyNames) -> bool {
        self.waiters.is_subscribed(&names.notice)
    }

    /// A plain connection handle, for the other modules' scripts.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Registers a waiter for `names`' notices. Returns once the server
    /// confirmed the subscription, or once subscribing failed: then the waiter
    /// still wakes at the holder's lease end (notices are best effort).
    pub(crate) async fn register(&self, names: &KeyNames, token: &Token) -> WaitHandle {
        let (handle, _) = WaitHandle::new(&self.waiters, &names.notice, token.as_str());
        if self.waiters.is_subscribed(&names.notice) {
            return handle;
        }
        let (ack, acked) = oneshot::channel();
        if self
            .notifier
            .send(Command::Subscribe(names.notice.clone(), ack))
            .is_ok()
        {
            let _ = acked.await;
        }
        handle
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) enum Command {
    Subscribe(String, oneshot::Sender<()>),
}

/// How often channels nobody waited on during a whole period are unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Owns the pub/sub connection: subscribes on request, dispatches notices to
/// the registry, reconnects and re-subscribes after a drop (waking every waiter,
/// since notices may have been missed), and unsubscribes idle channels.
/// Ends when the backend is dropped.
async fn notifier(
    client: redis::Client,
    options: RedisOptions,
    waiters: Arc<Registry>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(20);
    // Wait for the first request before opening a connection.
    let Some(mut pending) = commands.recv().await else {
        return;
    };
    loop {
        let connected =
            tokio::time::timeout(options.connect_timeout, client.get_async_pubsub()).await;
        let pubsub = match connected {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "lock notices: cannot connect; waiters fall back to lease timers");
                if !fail_and_wait(&mut pending, &mut commands, &mut backoff, &waiters).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                tracing::debug!(
                    "lock notices: connect timed out; waiters fall back to lease timers"
                );
                if !fail_and_wait(&mut pending, &mut commands, &mut backoff, &waiters).await {
                    return;
                }
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        waiters.clear_subscribed();
        // Re-subscribe whatever is waited on (after a reconnect), then wake all.
        let mut ok = true;
        for channel in waiters.channel_names() {
            match subscribe(&mut sink, &channel, &options).await {
                Ok(()) => waiters.set_subscribed(&channel),
                Err(SubscribeFailure::Refused(e)) => warn_refused(&channel, &e),
                Err(SubscribeFailure::Connection) => {
                    ok = false;
                    break;
                }
            }
        }
        waiters.wake_all();
        if !ok {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            continue;
        }
        backoff = Duration::from_millis(20);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.tick().await;
        let mut next = Some(pending);
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => tokio::select! {
                    command = commands.recv() => match command {
                        Some(command) => command,
                        None => return,
                    },
                    message = stream.next() => match message {
                        Some(message) => {
                            waiters.deliver(message.get_channel_name(), message.get_payload_bytes());
                            continue;
                        }
                        None => {
                            tracing::debug!("lock notices: connection dropped; re-subscribing");
                            waiters.clear_subscribed();
                            break;
                        }
                    },
                    _ = sweep.tick() => {
                        let unused = waiters.take_idle();
                        if !unused.is_empty() && sink.unsubscribe(&unused).await.is_err() {
                            break;
                        }
                        continue;
                    }
                },
            };
            match command {
                Command::Subscribe(channel, ack) => {
                    if !channel.is_empty() && !waiters.is_subscribed(&channel) {
                        match subscribe(&mut sink, &channel, &options).await {
                            Ok(()) => waiters.set_subscribed(&channel),
                            Err(SubscribeFailure::Refused(e)) => warn_refused(&channel, &e),
                            Err(SubscribeFailure::Connection) => {
                                let _ = ack.send(());
                                break;
                            }
                        }
                    }
                    let _ = ack.send(());
                }
            }
        }
        // Reconnect: wait for the next request only if nobody is waiting now.
        pending = match commands.try_recv() {
            Ok(command) => command,
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) if !waiters.channel_names().is_empty() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                // A harmless no-op request that re-runs the loop.
                let (ack, _) = oneshot::channel();
                Command::Subscribe(String::new(), ack)
            }
            Err(mpsc::error::TryRecvError::Empty) => match commands.recv().await {
                Some(command) => command,
                None => return,
            },
        };
    }
}

/// Why a subscription did not happen.
enum SubscribeFailure {
    /// The server answered with an error (an ACL without this channel, say):
    /// the connection is fine; waiters of this key fall back to timers.
    Refused(redis::RedisError),
    /// The connection failed or timed out: reconnect.
    Connection,
}

async fn subscribe(
    sink: &mut redis::aio::PubSubSink,
    channel: &str,
    options: &RedisOptions,
) -> Result<(), SubscribeFailure> {
    if channel.is_empty() {
        return Ok(());
    }
    match tokio::time::timeout(options.response_timeout, sink.subscribe(channel)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if is_refusal(&e) => Err(SubscribeFailure::Refused(e)),
        _ => Err(SubscribeFailure::Connection),
    }
}

/// A reply the server sent on purpose, not a broken connection.
fn is_refusal(e: &redis::RedisError) -> bool {
    !(e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error())
}

fn warn_refused(channel: &str, e: &redis::RedisError) {
    // Once per process at warn level: it is a configuration problem.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!(channel, error = %e, "lock notices: SUBSCRIBE refused");
        return;
    }
    tracing::warn!(
        channel,
        error = %e,
        "lock notices: the server refused SUBSCRIBE (check the ACL's channel permissions, \
         e.g. `&lock:*`); waiters of this key wake only when the holder's lease ends"
    );
}

/// Answers `pending` (the waiter falls back to its timer), backs off, and takes
/// the next request. `false` when the backend is gone.
async fn fail_and_wait(
    pending: &mut Command,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    backoff: &mut Duration,
    waiters: &Registry,
) -> bool {
    let Command::Subscribe(_, ack) = std::mem::replace(
        pending,
        Command::Subscribe(String::new(), oneshot::channel().0),
    );
    let _ = ack.send(());
    while let Ok(Command::Subscribe(_, ack)) = commands.try_recv() {
        let _ = ack.send(());
    }
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(1));
    if !waiters.channel_names().is_empty() {
        // Somebody waits: keep trying to reconnect on our own.
        *pending = Command::Subscribe(String::new(), oneshot::channel().0);
        return true;
    }
    match commands.recv().await {
        Some(command) => {
            *pending = command;
            true
        }
        None => false,
    }
}
