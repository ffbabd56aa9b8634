//! Connecting [`RedisBackend`]: one server, a Redlock node, a Sentinel
//! group's master, a cluster.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::super::conn::{Conn, SentinelConn, SingleConn};
use super::super::notifier::{Notices, Source};
use super::super::open::{RedisOptions, open_client};
use super::super::scripts::load_scripts;
use super::super::waiters::Registry;
use super::batch::{BATCH, Batcher};
use super::plain::{Native, native_commands};
use super::{Plain, RedisBackend};
use crate::error::{BackendError, LockError};

/// The failure of the first command sent to `addr`, naming the server; one
/// that answered something other than Redis's protocol (a web server, a
/// database on the wrong port) is said to be that, not a parse error of the
/// scripts' loading. A TLS server that refuses a client's certificate (none
/// given, expired, or of a CA it does not trust) closes its connection
/// after the handshake: `tls` (`Some(has a client certificate)` for a TLS
/// server) says when that may be why.
fn first_answer(addr: &str, e: LockError, tls: Option<bool>) -> LockError {
    let hint = match tls {
        Some(false) => {
            "a server that asks for client certificates (`tls-auth-clients yes`) \
                        needs one: `tls_client_certificate`"
        }
        _ => {
            "the server may have refused the client certificate: expired, or not signed \
              by a CA it trusts"
        }
    };
    match e {
        LockError::Backend(e)
            if e.driver_error()
                .is_some_and(|d| d.kind() == redis::ErrorKind::Parse) =>
        {
            BackendError::wrap(format!("{addr} did not answer as a Redis server"), e).into()
        }
        LockError::Backend(e) if tls.is_some() && e.is_connection() => {
            BackendError::wrap(format!("{addr} closed the TLS connection ({hint})"), e).into()
        }
        LockError::Backend(e) => e.at(addr).into(),
        other => other,
    }
}

impl RedisBackend {
    /// One server.
    pub(crate) async fn connect(url: &str, options: &RedisOptions) -> Result<Self, LockError> {
        Self::node(url, options, Arc::new(Registry::default()), false).await
    }

    /// One Redlock node, whose waiters live in `waiters` (shared by the
    /// nodes). Its waiters do not queue, so every release is announced.
    pub(crate) async fn redlock_node(
        url: &str,
        options: &RedisOptions,
        waiters: Arc<Registry>,
    ) -> Result<Self, LockError> {
        Self::node(url, options, waiters, true).await
    }

    async fn node(
        url: &str,
        options: &RedisOptions,
        waiters: Arc<Registry>,
        announce_free: bool,
    ) -> Result<Self, LockError> {
        let client = open_client(url, options)?;
        #[cfg(feature = "tls")]
        let client_cert = options
            .certificates
            .as_ref()
            .is_some_and(|c| c.client_tls.is_some());
        #[cfg(not(feature = "tls"))]
        let client_cert = false;
        let addr = client.get_connection_info().addr();
        let tls = matches!(addr, redis::ConnectionAddr::TcpTls { .. }).then_some(client_cert);
        let addr = addr.to_string();
        let mut conn = Conn::Single(Arc::new(
            SingleConn::connect(client.clone(), options).await?,
        ));
        load_scripts(&mut conn)
            .await
            .map_err(|e| first_answer(&addr, e, tls))?;
        BATCH
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(|e| BackendError::with_source("cannot load the lock scripts", e))?;
        // A Redlock node's locks are a vote of scripts: no plain path.
        let native = if announce_free {
            Native::None
        } else {
            native_commands(&mut conn).await?
        };
        let plain = Plain::new(!announce_free && !options.coalesce, native);
        let mut node = Self::with_pubsub(
            conn,
            Source::Fixed(Box::new(client)),
            options,
            waiters,
            plain,
        );
        node.announce_free = announce_free;
        if announce_free {
            // A Redlock node: each call races a per-node timeout; not batched.
            node.batcher = None;
        }
        Ok(node)
    }

    /// The master of the Sentinel group `master`.
    pub(crate) async fn sentinel(
        master: &str,
        sentinels: &[String],
        options: &RedisOptions,
    ) -> Result<Self, LockError> {
        at_least_one(sentinels, "`.sentinel(..)` needs at least one sentinel URL")?;
        let sentinel = Arc::new(SentinelConn::new(master, sentinels, options)?);
        sentinel
            .current()
            .await
            .map_err(|e| BackendError::with_source("cannot reach the Sentinel master", e))?;
        let mut conn = Conn::Sentinel(sentinel.clone());
        load_scripts(&mut conn).await?;
        // Asked of the master found now; a failover to a server without
        // its native commands turns them off at its first refusal (see
        // plain.rs).
        let plain = Plain::new(!options.coalesce, native_commands(&mut conn).await?);
        Ok(Self::with_pubsub(
            conn,
            Source::Sentinel(sentinel),
            options,
            Arc::new(Registry::default()),
            plain,
        ))
    }

    /// A Redis Cluster reached through `seeds`.
    pub(crate) async fn cluster(
        seeds: &[String],
        options: &RedisOptions,
    ) -> Result<Self, LockError> {
        at_least_one(seeds, "`.cluster(..)` needs at least one seed URL")?;
        for url in seeds {
            open_client(url, options)?;
        }
        // Two connections to every node: the commands', and the notices'
        // (sharded pub/sub, whose pushes go to `push_tx`). On one, a slot
        // that moved under a subscription had a re-subscription's
        // confirmation taken for the answer of a command sent beside it,
        // and every answer after it for the command before: an acquire
        // answered with another's `OK` was a lock granted to two holders.
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let cluster = connect_cluster(seeds, options, None).await?;
        let notices = connect_cluster(seeds, options, Some(push_tx)).await?;
        let waiters = Arc::new(Registry::default());
        // Asked of one node: a cluster runs one server version (a node that
        // refuses a native command turns them off at its first refusal).
        let native = native_commands(&mut Conn::Cluster(cluster.clone())).await?;
        let plain = Plain::new(!options.coalesce, native);
        // Scripts are loaded on each node by EVALSHA's fallback on first use.
        Ok(Self {
            conn: Conn::Cluster(cluster.clone()),
            batcher: Some(Batcher::new(
                Conn::Cluster(cluster.clone()),
                None,
                options.coalesce,
            )),
            notices: Notices::cluster(notices, push_rx, waiters.clone()),
            waiters,
            publish: "SPUBLISH",
            announce_free: false,
            replica_acks: None,
            plain,
        })
    }

    fn with_pubsub(
        conn: Conn,
        source: Source,
        options: &RedisOptions,
        waiters: Arc<Registry>,
        plain: Plain,
    ) -> Self {
        Self {
            batcher: Some(Batcher::new(
                conn.clone(),
                options.replica_acks,
                options.coalesce,
            )),
            conn,
            notices: Notices::pubsub(source, options, waiters.clone()),
            waiters,
            publish: "PUBLISH",
            announce_free: false,
            replica_acks: options.replica_acks,
            plain,
        }
    }
}

/// `Config(message)` for an empty list of URLs.
fn at_least_one(urls: &[String], message: &str) -> Result<(), LockError> {
    if urls.is_empty() {
        return Err(LockError::Config(message.into()));
    }
    Ok(())
}

/// A connection to the cluster behind `seeds`, in RESP3, whose pushes (a
/// subscription's messages) go to `pushes` when given.
async fn connect_cluster(
    seeds: &[String],
    options: &RedisOptions,
    pushes: Option<mpsc::UnboundedSender<redis::PushInfo>>,
) -> Result<redis::cluster_async::ClusterConnection, LockError> {
    let builder = redis::cluster::ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout)
        .use_protocol(redis::ProtocolVersion::RESP3)
        // Retry MOVED/ASK/TRYAGAIN in milliseconds, not the driver's
        // default seconds: a lease is measured in seconds.
        .retries(8)
        .min_retry_wait(2)
        .max_retry_wait(100)
        .retry_wait_formula(2, 2);
    let builder = match pushes {
        Some(pushes) => builder.push_sender(pushes),
        None => builder,
    };
    #[cfg(feature = "tls")]
    let builder = match &options.certificates {
        Some(certificates) => builder.certs(certificates.clone()),
        None => builder,
    };
    let client = builder
        .build()
        .map_err(|e| LockError::Config(format!("invalid cluster configuration: {e}")))?;
    tokio::time::timeout(
        options
            .connect_timeout
            .saturating_add(Duration::from_millis(100)),
        client.get_async_connection(),
    )
    .await
    .map_err(|_| BackendError::timeout("connecting to the cluster timed out"))?
    .map_err(|e| BackendError::with_source("cannot connect to the cluster", e).into())
}
