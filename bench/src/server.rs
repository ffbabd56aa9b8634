//! The Redis the benchmark talks to: a private `redis-server` started for the
//! run (`test_support::RedisServer`, killed on drop, also when the benchmark
//! panics), or `REDIS_URL` when it names a loopback server.

/// Accepts `redis://` URLs whose host is loopback (`127.x.x.x`, `localhost`,
/// `[::1]`) and `unix://` / `redis+unix://` sockets; refuses anything else, so
/// the benchmark never loads a shared or remote server.
pub(crate) fn check_loopback(url: &str) -> Result<(), String> {
    if url.starts_with("unix://") || url.starts_with("redis+unix://") {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("redis://") else {
        return Err("REDIS_URL must start with redis:// (or unix://)".into());
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let loopback = host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "REDIS_URL host {host:?} is not loopback; the benchmark only runs against \
             127.0.0.1, localhost or ::1"
        ))
    }
}
