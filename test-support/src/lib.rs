//! Test support shared by the `tests`, `fault` and `examples` packages (not
//! published, no stable API).
//!
//! * [`ServerKind`]: which server every launcher starts, Redis (default),
//!   Redis 8 or Valkey, chosen by `LOCK_TEST_SERVER` ([`SERVER_ENV`]); tests that one
//!   server cannot run say so by name ([`tls_available`]).
//! * [`RedisServer`]: one `redis-server` launcher: a free loopback port, a
//!   temporary directory, extra options, TLS, restart, SIGSTOP/SIGCONT/SIGKILL,
//!   `redis-cli`, and windows of lost replies ([`RedisServer::lose_replies`]).
//! * [`PostgresServer`]: one PostgreSQL launcher (`initdb` and `postgres` on
//!   a free loopback port in a temporary directory, as the `postgres` user
//!   when run as root).
//! * [`topology`]: independent masters for Redlock, a Sentinel deployment and
//!   a Redis Cluster, on loopback.
//! * [`helpers`]: small async helpers for tests of `lock_runtime`.
//! * [`CommandProxy`]: a loopback proxy that records every command name a
//!   client sends (what `ACL LOG` and `MONITOR` cannot show on servers that
//!   do not know the command).
//! * `http` (feature `http`): an axum app served on a loopback port.
//!
//! Constructors come in two flavours: `start*` panic (for tests), `try_*`
//! return [`Result`] (for the `fault` and `bench` programs, which report
//! failures).
//!
//! ```no_run
//! let server = test_support::RedisServer::start();
//! assert_eq!(server.cli(&["PING"]), "PONG");
//! ```

mod acl;
pub mod helpers;
#[cfg(feature = "http")]
pub mod http;
mod kind;
mod postgres;
mod proxy;
mod replies;
mod server;
mod tls;
pub mod topology;

pub use acl::{ACL_LOCKER, acl_locker};
pub use kind::{
    REDIS8_VERSION, SERVER_ENV, SKIPS_ENV, ServerKind, VALKEY_VERSION, describe_server,
    native_release, redis8_dir, redis8_flavor, tls_available, valkey_dir,
};
pub use postgres::{PostgresServer, postgres_bin_dir};
pub use proxy::CommandProxy;
pub use replies::{KILL_OTHER_CLIENTS, LostReplies, RawConnection};
pub use server::{RedisServer, free_port, redis_server_bin, signal, try_free_port};
pub use tls::{TlsFiles, client_cert, self_signed_cert};

/// Runs `command` with `input` written to its stdin, and waits for its
/// output (stdout piped; stderr as `command` has it).
pub fn output_with_input(
    command: &mut std::process::Command,
    input: &str,
) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin was piped")
        .write_all(input.as_bytes())?;
    child.wait_with_output()
}

/// A fallible result with a message.
pub type Result<T> = std::result::Result<T, String>;

/// An error and its causes on one line, as `anyhow` prints them with `{:#}`
/// (a `LockError` names what failed; its source says why).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        text += &format!(": {cause}");
        next = cause.source();
    }
    text
}
