//! The connection under a Redis backend: one server, the master a Sentinel
//! group names (re-discovered after a failover), or a Redis Cluster.
//!
//! redis-rs's `ConnectionManager` connects again only after an attempt that
//! failed with an I/O error: once a reconnect fails to log in (a rotated
//! password, a disabled ACL user), it keeps that failure and answers it to
//! every later request without trying again. So one server's manager is
//! replaced after a failed login (`SingleConn`), and a Sentinel master's is
//! forgotten (`SentinelConn::check`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::open::{MasterAuth, RedisOptions, open_client, skip_set_lib_name};
use crate::error::{BackendError, LockError, connection_failure, failed_login};

/// A cheap-to-clone connection handle for scripts and commands.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<SingleConn>),
    Sentinel(Arc<SentinelConn>),
    Cluster(ClusterConnection),
}

pub(crate) fn manager_config(options: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// Connects a manager, bounded by the connect timeout. Its errors name the
/// server (host and port, or the socket's path; never the credentials).
async fn connect_manager(
    client: redis::Client,
    options: &RedisOptions,
) -> Result<ConnectionManager, LockError> {
    let addr = client.get_connection_info().addr();
    // A plain server answers nothing to a TLS handshake: it waits for the
    // end of a command line that never comes.
    let over_tls = match addr {
        redis::ConnectionAddr::TcpTls { .. } => {
            " (a TLS handshake unanswered: does the port serve TLS? `redis://` if not)"
        }
        _ => "",
    };
    let addr = addr.to_string();
    tokio::time::timeout(
        options
            .connect_timeout
            .saturating_add(Duration::from_millis(100)),
        ConnectionManager::new_with_config(client, manager_config(options)),
    )
    .await
    .map_err(|_| {
        BackendError::timeout(format!("connecting to Redis at {addr} timed out{over_tls}"))
    })?
    .map_err(|e| BackendError::with_source(format!("cannot connect to Redis at {addr}"), e).into())
}

/// One server's connection: a `ConnectionManager`, replaced by a new one when
/// a request fails to log in, because the old one would answer that failure
/// forever. The new one logs in on its first request (it is lazy): while the
/// login still fails, every request says so; once it works, the client
/// recovers by itself. A successful request only reads which manager is
/// current.
pub(crate) struct SingleConn {
    manager: ArcSwap<ConnectionManager>,
    client: redis::Client,
    config: ConnectionManagerConfig,
}

impl SingleConn {
    /// Connects to `client`'s server, bounded by the connect timeout.
    pub(crate) async fn connect(
        client: redis::Client,
        options: &RedisOptions,
    ) -> Result<Self, LockError> {
        let manager = connect_manager(client.clone(), options).await?;
        Ok(Self {
            manager: ArcSwap::from_pointee(manager),
            client,
            config: manager_config(options),
        })
    }

    /// The current manager (a clone: one reference count, as the manager
    /// itself was cloned for every request before it could be replaced), and
    /// which one it is, for [`SingleConn::check`].
    fn current(&self) -> (ConnectionManager, *const ConnectionManager) {
        let current = self.manager.load();
        (ConnectionManager::clone(&current), Arc::as_ptr(&current))
    }

    /// Puts a new manager in place of the one at `failed` when `e` is a
    /// failed login (once, however many requests saw it fail).
    fn check(&self, failed: *const ConnectionManager, e: &redis::RedisError) {
        if !failed_login(e) {
            return;
        }
        let current = self.manager.load_full();
        if !std::ptr::eq(Arc::as_ptr(&current), failed) {
            return; // replaced already
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => {
                let previous = self.manager.compare_and_swap(&current, Arc::new(fresh));
                if Arc::ptr_eq(&previous, &current) {
                    tracing::debug!(
                        server = %self.client.get_connection_info().addr(),
                        error = %e,
                        "Redis refused the login; the next request logs in again"
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot make a new Redis connection"),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(s) => {
                let (mut manager, which) = s.current();
                let which = which as usize; // an identity, not dereferenced
                Box::pin(async move {
                    let answer = manager.send_packed_command(cmd).await;
                    if let Err(e) = &answer {
                        s.check(which as *const _, e);
                    }
                    answer
                })
            }
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    let mut conn = s.current().await?;
                    let answer = conn.req_packed_command(cmd).await;
                    s.check(&answer);
                    answer
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(s) => {
                let (mut manager, which) = s.current();
                let which = which as usize; // an identity, not dereferenced
                Box::pin(async move {
                    let answer = manager.send_packed_commands(pipeline, offset, count).await;
                    if let Err(e) = &answer {
                        s.check(which as *const _, e);
                    }
                    answer
                })
            }
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    let mut conn = s.current().await?;
                    let answer = conn.req_packed_commands(pipeline, offset, count).await;
                    s.check(&answer);
                    answer
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(s) => s.manager.load().get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(_) => 0,
        }
    }
}

/// The master of a Sentinel group: asked of the sentinels on first use and
/// again after any error that may mean a failover (connection errors,
/// `READONLY` from a demoted master) or that its manager keeps (a failed
/// login).
pub(crate) struct SentinelConn {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<(ConnectionManager, redis::Client)>>,
    options: RedisOptions,
}

impl SentinelConn {
    pub(crate) fn new(
        master: &str,
        sentinels: &[String],
        options: &RedisOptions,
    ) -> Result<Self, LockError> {
        let infos = sentinels
            .iter()
            .map(|url| open_client(url, options).map(|c| c.get_connection_info().clone()))
            .collect::<Result<Vec<_>, _>>()?;
        // The master's connections: the driver's defaults, with the
        // master's credentials if given, and without `CLIENT SETINFO` (see
        // `open_client`).
        let mut settings = skip_set_lib_name(Default::default());
        if let Some(MasterAuth { username, password }) = &options.master_auth {
            settings = settings.set_username(username).set_password(password);
        }
        let mut master_info = redis::sentinel::SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(settings);
        // Sentinels reached over TLS: the master too.
        let tls = infos
            .iter()
            .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }));
        if tls {
            master_info = master_info.set_tls_mode(redis::TlsMode::Secure);
        }
        let invalid = |e| LockError::Config(format!("invalid Sentinel configuration: {e}"));
        #[cfg(feature = "tls")]
        if let Some(certificates) = options.certificates.clone().filter(|_| tls) {
            let sentinel = with_certificates(infos, master, options, certificates);
            return Ok(Self::over(sentinel.map_err(invalid)?, options));
        }
        // `build` takes a `String` without redis' TLS feature and `impl AsRef<str>`
        // with it; an owned string fits both.
        #[allow(clippy::unnecessary_to_owned)]
        let sentinel = SentinelClient::build(
            infos,
            master.to_owned(),
            Some(master_info),
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(invalid)?;
        Ok(Self::over(sentinel, options))
    }

    fn over(sentinel: SentinelClient, options: &RedisOptions) -> Self {
        Self {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            options: options.clone(),
        }
    }

    fn cached(&self) -> Option<(ConnectionManager, redis::Client)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the current master, discovering it if needed.
    pub(crate) async fn current(&self) -> redis::RedisResult<ConnectionManager> {
        if let Some((manager, _)) = self.cached() {
            return Ok(manager);
        }
        // Boxed: asking the sentinels is a future of several KB, which every
        // command's future (this one's) would carry inline.
        Ok(Box::pin(self.discover()).await?.0)
    }

    /// The current master's client (for the notice subscriber).
    pub(crate) async fn client(&self) -> redis::RedisResult<redis::Client> {
        Ok(self.discover().await?.1)
    }

    async fn discover(&self) -> redis::RedisResult<(ConnectionManager, redis::Client)> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let limit = self.options.connect_timeout;
        let client = within(
            limit,
            "asking the sentinels for the master timed out",
            sentinel.async_get_client(),
        )
        .await?;
        // Without `CLIENT SETINFO`, which the driver's builder (the TLS
        // path with certificates) does not let us turn off: the same
        // address, TLS parameters and credentials.
        let info = client.get_connection_info().clone();
        let settings = skip_set_lib_name(info.redis_settings().clone());
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let manager = within(
            limit,
            "connecting to the master timed out",
            ConnectionManager::new_with_config(client.clone(), manager_config(&self.options)),
        )
        .await?;
        tracing::debug!(master = ?client.get_connection_info().addr(), "sentinel: master discovered");
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((manager.clone(), client.clone()));
        Ok((manager, client))
    }

    /// Forgets the master after an error that may mean it changed, or that
    /// its manager would answer to every later request (a failed login).
    fn check<T>(&self, answer: &redis::RedisResult<T>) {
        if let Err(e) = answer
            && (connection_failure(e).is_some()
                || failed_login(e)
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly))
        {
            self.forget();
        }
    }

    /// Forgets the master: the next request asks the sentinels again.
    fn forget(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Conn {
    /// A Sentinel master that acknowledged a write with too few replicas
    /// may be one the sentinels no longer name (see
    /// `BackendError::is_master_suspect`): it is forgotten, and the next
    /// request asks them again. `false` where there is nobody to ask.
    pub(crate) fn forget_master(&self) -> bool {
        match self {
            Conn::Sentinel(s) => {
                s.forget();
                true
            }
            Conn::Single(_) | Conn::Cluster(_) => false,
        }
    }
}

/// `step`, or a driver timeout error saying `what` after `limit`.
async fn within<T>(
    limit: std::time::Duration,
    what: &'static str,
    step: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::time::timeout(limit, step).await.map_err(|_| {
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
    })?
}

/// A Sentinel client whose sentinels and master are reached over TLS with
/// `certificates` (the driver takes the master's only through its
/// builder): the sentinels' credentials are one user and password for all
/// (the builder takes one), so URLs that carry different ones are refused
/// rather than sent the first URL's; the master's are `options.master_auth`.
#[cfg(feature = "tls")]
fn with_certificates(
    infos: Vec<redis::ConnectionInfo>,
    master: &str,
    options: &RedisOptions,
    certificates: redis::TlsCertificates,
) -> redis::RedisResult<SentinelClient> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let first = infos.first().map(|i| i.redis_settings().clone());
    let login = |s: &redis::RedisConnectionInfo| {
        (
            s.username().map(str::to_owned),
            s.password().map(str::to_owned),
        )
    };
    if let Some(first) = &first
        && infos
            .iter()
            .any(|i| login(i.redis_settings()) != login(first))
    {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "with TLS certificates every sentinel URL must carry the same user and password \
             (the driver sends all sentinels one login)",
        )));
    }
    let addrs = infos.into_iter().map(|i| i.addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
        .set_client_to_redis_certificates(certificates);
    if let Some(first) = &first {
        if let Some(username) = first.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = first.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if let Some(MasterAuth { username, password }) = &options.master_auth {
        builder = builder
            .set_client_to_redis_username(username)
            .set_client_to_redis_password(password);
    }
    builder.build()
}
