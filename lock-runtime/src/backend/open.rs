//! From a server's URL and the builder's options to a driver client:
//! what the driver would pass over in silence (`?db=` over TCP, `rediss://`
//! without the `tls` feature, `#insecure`) is refused here, and the client
//! never sends `CLIENT SETINFO`.

use std::time::Duration;

use crate::error::LockError;

/// How the client talks to its servers.
#[derive(Clone, Debug)]
pub(crate) struct RedisOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// `WAIT n timeout` after acquire and extend (Sentinel, single server).
    pub(crate) replica_acks: Option<(u32, Duration)>,
    /// Group commit of a mutex's script calls (`LockClientBuilder::coalesce_scripts`).
    pub(crate) coalesce: bool,
    /// The certificates of every `rediss://` connection: a CA to trust
    /// instead of the system's roots, a client certificate to present
    /// (`LockClientBuilder::tls_root_certificates`, `tls_client_certificate`).
    #[cfg(feature = "tls")]
    pub(crate) certificates: Option<redis::TlsCertificates>,
    /// The ACL user and password of a Sentinel group's master
    /// (`LockClientBuilder::sentinel_master_auth`).
    pub(crate) master_auth: Option<MasterAuth>,
}

/// A Sentinel master's ACL user and password; `Debug` shows the user only.
#[derive(Clone)]
pub(crate) struct MasterAuth {
    pub(crate) username: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for MasterAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Parses a URL into a driver client, as a configuration error when
/// malformed, with `options`' TLS certificates.
pub(crate) fn open_client(url: &str, options: &RedisOptions) -> Result<redis::Client, LockError> {
    use redis::IntoConnectionInfo;
    check_url(url)?;
    // Never echo the URL: it may carry a password.
    let invalid =
        |e: redis::RedisError| LockError::Config(format!("invalid Redis URL: {e}; {EXPECTED}"));
    let info = url.into_connection_info().map_err(invalid)?;
    // No `CLIENT SETINFO` after connecting (redis-rs names itself by
    // default): a least-privilege ACL user need not be allowed it, and
    // servers that know the command (Redis 7.2+, Valkey) would log every
    // refusal in `ACL LOG`.
    let settings = skip_set_lib_name(info.redis_settings().clone());
    let info = info.set_redis_settings(settings);
    // `rediss://` in any case: `Some(insecure)`.
    let tls = match info.addr() {
        redis::ConnectionAddr::TcpTls { insecure, .. } => Some(*insecure),
        _ => None,
    };
    #[cfg(not(feature = "tls"))]
    let _ = (options, tls); // `rediss://` was refused by `check_url`
    #[cfg(feature = "tls")]
    {
        if tls == Some(true) {
            return Err(LockError::Config(
                "`#insecure` is not supported: trust the server's CA with \
                 `tls_root_certificates` instead"
                    .into(),
            ));
        }
        super::certificates::install_crypto_provider();
        if let Some(certificates) = &options.certificates {
            if tls.is_none() {
                return Err(LockError::Config(
                    "TLS certificates are set, but a server URL is `redis://`: \
                     use `rediss://`"
                        .into(),
                ));
            }
            return redis::Client::build_with_tls(info, certificates.clone())
                .map_err(|e| LockError::Config(format!("invalid TLS certificates: {e}")));
        }
    }
    redis::Client::open(info).map_err(invalid)
}

/// The URLs the client takes, for the errors that refuse others.
const EXPECTED: &str = "expected `redis://[user:password@]host[:port][/db]`, `rediss://..` \
     (the `tls` feature) or `redis+unix:///path`";

/// Refuses, before the driver parses it, a URL whose scheme the driver
/// does not take or this build cannot serve, or whose query names what
/// the driver would pass over (see [`unread_tcp_parameter`]). The scheme
/// is named in the error, never the rest (it may carry a password).
fn check_url(url: &str) -> Result<(), LockError> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme).filter(|s| {
        !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+')
    });
    let Some(scheme) = scheme.map(str::to_ascii_lowercase) else {
        return Err(LockError::Config(format!(
            "invalid Redis URL: no scheme; {EXPECTED}"
        )));
    };
    let known = [
        "redis",
        "rediss",
        "valkey",
        "valkeys",
        "redis+unix",
        "valkey+unix",
        "unix",
    ];
    if !known.contains(&scheme.as_str()) {
        return Err(LockError::Config(format!(
            "invalid Redis URL: `{scheme}://` is not a Redis scheme; {EXPECTED}"
        )));
    }
    if cfg!(not(feature = "tls")) && (scheme == "rediss" || scheme == "valkeys") {
        return Err(LockError::Config(format!(
            "`{scheme}://` needs lock-runtime's `tls` feature: \
             `lock-runtime = {{ version = \"0.1\", features = [\"tls\"] }}`"
        )));
    }
    if let Some(name) = unread_tcp_parameter(url) {
        return Err(LockError::Config(format!(
            "invalid Redis URL: `?{name}=` is read on `redis+unix://` URLs only (over TCP \
             the client would connect to database 0 with no login): write the database as \
             the path and the login before the host, `redis://user:password@host:6379/3`"
        )));
    }
    Ok(())
}

/// The first query parameter of a TCP URL that names a database or a login
/// (`?db=3`, `?user=`, `?pass=`): the driver reads those on Unix socket URLs
/// and ignores them over TCP, so two services meaning the same database
/// would lock in different ones.
fn unread_tcp_parameter(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    let tcp = ["redis", "rediss", "valkey", "valkeys"];
    if !tcp.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
        return None;
    }
    let query = rest.split('#').next()?.split_once('?')?.1;
    let unread = ["db", "user", "username", "pass", "password"];
    let mut names = query
        .split('&')
        .map(|pair| pair.split('=').next().unwrap_or(pair));
    names.find(|name| unread.contains(name))
}

/// `settings` without the `CLIENT SETINFO` that redis-rs sends on connect.
pub(crate) fn skip_set_lib_name(
    settings: redis::RedisConnectionInfo,
) -> redis::RedisConnectionInfo {
    settings.set_skip_set_lib_name()
}
