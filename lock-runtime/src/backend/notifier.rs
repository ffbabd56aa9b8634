//! Release notices: how they reach the waiters of this process.
//!
//! * One server or a Sentinel master: one pub/sub connection per client,
//!   owned by the [`notifier`] task, which subscribes on request, delivers
//!   notices to the [`Registry`], reconnects and re-subscribes after a drop
//!   (waking every waiter, since notices may have been missed) and
//!   unsubscribes channels nobody waited on for a while.
//! * A Redis Cluster: sharded pub/sub (`SSUBSCRIBE`) on the cluster
//!   connection, whose pushes [`dispatch_cluster_pushes`] routes.
//!
//! Notices are best effort: a waiter that misses one wakes when the holder's
//! lease runs out.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{mpsc, oneshot};

use super::conn::SentinelConn;
use super::open::RedisOptions;
use super::waiters::Registry;
use crate::backoff::Retry;
use crate::error::{BackendError, LockError, connection_failure};

/// How often channels nobody waited on during a whole period are unsubscribed.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Where release notices come from, and how to subscribe to them.
pub(crate) enum Notices {
    /// A pub/sub connection owned by the notifier task.
    PubSub(PubSub),
    /// Sharded pub/sub on the cluster connection. Dropping `_stop` ends the
    /// push-routing task, which holds a clone of the connection: without it,
    /// the task (and so the connection, whose push sender keeps the task's
    /// receiver open) would outlive the client.
    Cluster {
        cluster: ClusterConnection,
        _stop: oneshot::Sender<()>,
    },
}

impl Notices {
    /// Starts the notifier task of one server or Sentinel group; it connects
    /// on the first subscription and ends when the returned handle is dropped.
    pub(crate) fn pubsub(source: Source, options: &RedisOptions, waiters: Arc<Registry>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(notifier(source.clone(), options.clone(), waiters, rx));
        Notices::PubSub(PubSub {
            commands: std::sync::Mutex::new(tx),
            source,
            options: options.clone(),
        })
    }

    /// Restarts the task behind the notices on the runtime in use if it
    /// ended with the runtime it ran on (a client built in one runtime and
    /// used in another); its subscriptions are made again as waiters ask,
    /// and every waiter is woken (it may have missed a notice). A cluster's
    /// connection cannot move: an error that says so.
    pub(crate) fn restart_if_ended(&self, waiters: &Arc<Registry>) -> Result<(), LockError> {
        match self {
            Notices::PubSub(pubsub) => {
                let mut commands = pubsub.commands.lock().unwrap_or_else(|e| e.into_inner());
                if !commands.is_closed() {
                    return Ok(());
                }
                let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                    BackendError::new(
                        "lock notices: their task ended with the tokio runtime it ran on, and \
                         this call runs outside a tokio runtime to restart it on",
                    )
                })?;
                let (tx, rx) = mpsc::unbounded_channel();
                waiters.clear_subscribed();
                runtime.spawn(notifier(
                    pubsub.source.clone(),
                    pubsub.options.clone(),
                    waiters.clone(),
                    rx,
                ));
                *commands = tx;
                drop(commands);
                waiters.wake_all();
                tracing::info!(
                    "lock notices: their task ended with the tokio runtime it ran on; \
                     restarted on the runtime in use"
                );
                Ok(())
            }
            Notices::Cluster { .. } => Err(BackendError::new(
                "this Redis Cluster client's connection ended with the tokio runtime it was \
                     built in, and a cluster connection cannot move to another runtime: build \
                     the client in the runtime that uses it (or keep that runtime alive)",
            )
            .into()),
        }
    }

    /// Routes a cluster connection's pushes (from `pushes`) to `waiters`.
    pub(crate) fn cluster(
        cluster: ClusterConnection,
        pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
        waiters: Arc<Registry>,
    ) -> Self {
        let cluster_for_task = cluster.clone();
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatch_cluster_pushes(pushes, waiters, cluster_for_task) => {}
                _ = stopped => {}
            }
        });
        Notices::Cluster {
            cluster,
            _stop: stop,
        }
    }

    /// Makes sure notices on `channel` reach `waiters`. Returns once the
    /// server confirmed the subscription, or once subscribing failed (the
    /// waiters then fall back to lease timers).
    pub(crate) async fn subscribe(&self, waiters: &Registry, channel: &str) {
        if waiters.is_subscribed(channel) {
            return;
        }
        match self {
            Notices::PubSub(pubsub) => {
                let notifier = pubsub
                    .commands
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let (ack, acked) = oneshot::channel();
                if notifier
                    .send(Command::Subscribe(channel.to_owned(), ack))
                    .is_ok()
                {
                    let _ = acked.await;
                }
            }
            Notices::Cluster { cluster, .. } => {
                let subscribed = tokio::time::timeout(
                    Duration::from_secs(1),
                    cluster.clone().ssubscribe(channel),
                )
                .await;
                match subscribed {
                    Ok(Ok(())) => waiters.set_subscribed(channel),
                    Ok(Err(e)) if is_refusal(&e) => warn_refused(channel, &e),
                    _ => tracing::debug!(
                        "lock notices: SSUBSCRIBE failed; waiters fall back to lease timers"
                    ),
                }
            }
        }
    }
}

/// The notifier task's handle, and what it takes to start it again.
pub(crate) struct PubSub {
    commands: std::sync::Mutex<mpsc::UnboundedSender<Command>>,
    source: Source,
    options: RedisOptions,
}

/// Where the notifier finds the server to subscribe on.
#[derive(Clone)]
pub(crate) enum Source {
    Fixed(Box<redis::Client>),
    Sentinel(Arc<SentinelConn>),
}

impl Source {
    async fn client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Source::Fixed(client) => Ok((**client).clone()),
            Source::Sentinel(sentinel) => sentinel.client().await,
        }
    }
}

/// A request to the notifier task.
pub(crate) enum Command {
    /// Subscribe to a channel; answered once subscribed, or once that failed.
    Subscribe(String, oneshot::Sender<()>),
    /// No new channel: (re)connect and re-subscribe every channel waited on.
    /// The task sends it to itself while somebody waits and the connection
    /// is down.
    Reconnect,
}

impl Command {
    /// Lets a subscriber go on without the subscription (it falls back to
    /// its lease timer).
    fn answer(self) {
        if let Command::Subscribe(_, ack) = self {
            let _ = ack.send(());
        }
    }
}

/// The notifier task. Ends when the backend (the command sender) is dropped.
async fn notifier(
    source: Source,
    options: RedisOptions,
    waiters: Arc<Registry>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut reconnect = Retry::RECONNECT_NOTICES.start();
    // Wait for the first request before opening a connection.
    let Some(mut pending) = commands.recv().await else {
        return;
    };
    loop {
        let connected = tokio::time::timeout(options.connect_timeout, async {
            source.client().await?.get_async_pubsub().await
        })
        .await;
        let pubsub = match connected {
            Ok(Ok(pubsub)) => pubsub,
            failed => {
                match failed {
                    Ok(Err(e)) => tracing::debug!(
                        error = &e as &dyn std::error::Error,
                        "lock notices: cannot connect; waiters fall back to lease timers"
                    ),
                    _ => tracing::debug!(
                        "lock notices: connect timed out; waiters fall back to lease timers"
                    ),
                }
                // Nobody waits for a connection that is not there.
                pending.answer();
                while let Ok(command) = commands.try_recv() {
                    command.answer();
                }
                reconnect.pause().await;
                pending = if waiters.channel_names().is_empty() {
                    match commands.recv().await {
                        Some(command) => command,
                        None => return,
                    }
                } else {
                    Command::Reconnect
                };
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        waiters.clear_subscribed();
        // Re-subscribe whatever is waited on (after a reconnect), then wake all.
        let mut resubscribed = true;
        for channel in waiters.channel_names() {
            match subscribe(&mut sink, &channel, &options).await {
                Ok(()) => waiters.set_subscribed(&channel),
                Err(SubscribeFailure::Refused(e)) => warn_refused(&channel, &e),
                Err(SubscribeFailure::Connection) => {
                    resubscribed = false;
                    break;
                }
            }
        }
        waiters.wake_all();
        if !resubscribed {
            reconnect.pause().await;
            continue;
        }
        reconnect.reset();
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
                    if !waiters.is_subscribed(&channel) {
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
                Command::Reconnect => {} // connected and re-subscribed above
            }
        }
        // The connection broke: a queued request reconnects at once; with
        // none, reconnect on our own if anybody waits, else wait for one.
        pending = match commands.try_recv() {
            Ok(command) => command,
            Err(mpsc::error::TryRecvError::Disconnected) => return,
            Err(mpsc::error::TryRecvError::Empty) if !waiters.channel_names().is_empty() => {
                reconnect.pause().await;
                Command::Reconnect
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
    match tokio::time::timeout(options.response_timeout, sink.subscribe(channel)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if is_refusal(&e) => Err(SubscribeFailure::Refused(e)),
        _ => Err(SubscribeFailure::Connection),
    }
}

/// A reply the server sent on purpose, not a broken connection, nor a
/// refused login (the subscription itself was not refused).
fn is_refusal(e: &redis::RedisError) -> bool {
    connection_failure(e).is_none() && !crate::error::failed_login(e)
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

/// Routes the cluster's sharded notices to the waiters; after a disconnection
/// (the driver re-subscribes on its own) wakes every waiter, since notices may
/// have been missed. When a slot moves, the server drops its shard channels'
/// subscribers (`sunsubscribe`): subscribe again where the slot lives now and
/// wake that channel's waiters.
async fn dispatch_cluster_pushes(
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    waiters: Arc<Registry>,
    cluster: ClusterConnection,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            redis::PushKind::SMessage | redis::PushKind::Message => {
                if let [redis::Value::BulkString(channel), payload, ..] = &push.data[..]
                    && let Ok(channel) = std::str::from_utf8(channel)
                {
                    let payload: &[u8] = match payload {
                        redis::Value::BulkString(bytes) => bytes,
                        _ => b"",
                    };
                    waiters.deliver(channel, payload);
                }
            }
            redis::PushKind::SUnsubscribe => {
                if let [redis::Value::BulkString(channel), ..] = &push.data[..]
                    && let Ok(channel) = std::str::from_utf8(channel)
                {
                    let channel = channel.to_owned();
                    waiters.forget_subscribed(&channel);
                    if waiters.has_waiters(&channel) {
                        let waiters = waiters.clone();
                        let mut cluster = cluster.clone();
                        tokio::spawn(async move {
                            if let Ok(Ok(())) = tokio::time::timeout(
                                Duration::from_secs(1),
                                cluster.ssubscribe(&channel),
                            )
                            .await
                            {
                                waiters.set_subscribed(&channel);
                            }
                            // A release may have happened in between.
                            waiters.deliver(&channel, b"");
                        });
                    }
                }
            }
            redis::PushKind::Disconnection => waiters.wake_all(),
            _ => {}
        }
    }
}
