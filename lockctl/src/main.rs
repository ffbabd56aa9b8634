//! `lockctl`: see who holds and waits for the locks of `lock-runtime`, and,
//! in an emergency, break one.
//!
//! ```text
//! lockctl [--redis URL | --cluster URL... | --redlock URL...] [--key-prefix P] [--json] show KEY
//! lockctl [--redis URL | --cluster URL... | --redlock URL...] [--key-prefix P] [--json] list [--prefix P] [--limit N]
//! lockctl [--redis URL | --cluster URL... | --redlock URL...] [--key-prefix P] [--json] leaders [--prefix P] [--limit N]
//! lockctl [--redis URL | --cluster URL... | --redlock URL...] [--key-prefix P] [--json] force-release KEY [--yes]
//! ```
//!
//! The options may also follow the command (`lockctl show KEY --redis
//! URL`). `--redis` defaults to `REDIS_URL`; `--cluster` takes the seeds of
//! a Redis Cluster (then `list` covers every master); `--redlock` every
//! master of a Redlock, as the services' clients name them (one of them as
//! `--redis` would see, and release, only its copy of a lock). Only
//! `force-release` changes a lock; every command, as every client, loads
//! the library's scripts and leaves its label (`lockctl:user@host`) in the
//! clients' registry, for a minute. `rediss://` servers
//! with a private CA or asking for a client certificate: `--tls-ca FILE`,
//! `--tls-cert FILE --tls-key FILE` (PEM). Output is a table, or
//! JSON with `--json`. Every failure (a bad URL, an unreachable server, a
//! bad key, nothing to release, a declined confirmation) is one line on
//! standard error and exit code 1; a command line that does not parse is
//! clap's usage message and exit code 2.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_runtime::LockClient;

mod force;
mod leaders;
mod output;

#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    about = "Show who holds and waits for lock-runtime locks, list them, force-release one"
)]
struct Cli {
    /// The Redis server (or Sentinel-less master) the locks live on.
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    redis: Option<String>,
    /// A seed node of a Redis Cluster (repeat for more); used instead of
    /// --redis.
    #[arg(long, global = true, value_name = "URL", conflicts_with = "redlock")]
    cluster: Vec<String>,
    /// A master of a Redlock (repeat for each, as the services name them:
    /// an odd number); used instead of --redis.
    #[arg(long, global = true, value_name = "URL")]
    redlock: Vec<String>,
    /// PEM CA certificates to trust for `rediss://` servers, instead of the
    /// system's roots (`LockClientBuilder::tls_root_certificates`).
    #[arg(long, global = true, env = "LOCKCTL_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// A PEM client certificate for servers that ask for one (mutual TLS,
    /// `tls-auth-clients yes`); with --tls-key.
    #[arg(
        long,
        global = true,
        env = "LOCKCTL_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "LOCKCTL_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// The prefix the services' clients use (`LockClientBuilder::key_prefix`).
    #[arg(long, global = true, default_value = "lock:", value_name = "PREFIX")]
    key_prefix: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// KEY's lock (the mutex, read-write lock or semaphore in use): its
    /// holder (label), since when, the lease left, the fencing counter, and
    /// the queue of waiters by label, in line order.
    #[command(alias = "inspect")]
    Show {
        /// The lock's key, as the service names it (without the prefix).
        key: String,
    },
    /// The locks held now, with their holders (found with SCAN, bounded;
    /// never KEYS; on a cluster, on every master).
    List {
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many locks (at least 1).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
    },
    /// The elected leaders (`client.leader(name)`): name, label, term.
    Leaders {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many leaders (at least 1).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
    },
    /// Deletes KEY's lock whoever holds it (every holder of a read-write
    /// lock or semaphore), and raises the key's fencing counter: the
    /// evicted holder learns at its next renewal, and its next fenced write
    /// (fence::redis with KEY as the resource, on the lock's server) is
    /// refused as stale, as is any write with a token issued before. Asks
    /// first unless --yes; logs who did it.
    ForceRelease {
        /// The lock's key.
        key: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// A failure: its one-line message (the exit code is 1).
struct Failure(String);

impl From<lock_runtime::LockError> for Failure {
    fn from(err: lock_runtime::LockError) -> Self {
        // The library names its builder's call; here it is a flag.
        let line = one_line(&err).replace("`tls_client_certificate`", "--tls-cert and --tls-key");
        Failure(line.replace("`tls_root_certificates`", "--tls-ca"))
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_max_level(tracing::Level::ERROR)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message)) => {
            eprintln!("lockctl: {message}");
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line; a cause whose text is already
/// there (the driver's errors repeat their own source's) is left out.
fn one_line(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string().replace('\n', " ");
    let mut next = err.source();
    while let Some(cause) = next {
        let said = cause.to_string().replace('\n', " ");
        if !text.contains(&said) {
            text += &format!(": {said}");
        }
        next = cause.source();
    }
    text
}

/// What an empty listing says: which prefix it looked under, and why that
/// may be the wrong one.
fn nothing_under(key_prefix: &str) -> String {
    let mut said = format!("no locks held under the key prefix {key_prefix:?}");
    if !key_prefix.ends_with(':') {
        said += " (prefixes usually end with ':', as the default \"lock:\" does: is it the \
                  services' --key-prefix?)";
    }
    said
}

async fn client(cli: &Cli) -> Result<LockClient, Failure> {
    let builder = LockClient::builder();
    let builder = match (&cli.redis, &cli.cluster[..], &cli.redlock[..]) {
        (_, [_, ..], _) => builder.cluster(cli.cluster.iter().cloned()),
        (_, _, [_, ..]) => builder.redlock(cli.redlock.iter().cloned()),
        (Some(url), [], []) => builder.redis(url),
        (None, [], []) => {
            return Err(Failure(
                "no server: give --redis URL (or set REDIS_URL), --cluster URL or --redlock URL"
                    .into(),
            ));
        }
    };
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| Failure(format!("cannot read {}: {e}", path.display())))
    };
    let builder = match &cli.tls_ca {
        Some(ca) => builder.tls_root_certificates(read(ca)?),
        None => builder,
    };
    let builder = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => builder.tls_client_certificate(read(cert)?, read(key)?),
        _ => builder,
    };
    Ok(builder
        .key_prefix(&cli.key_prefix)
        .label(format!("lockctl:{}", force::operator()))
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await?)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let client = client(&cli).await?;
    match cli.command {
        Command::Show { key } => {
            let state = client.inspect(&key).await?;
            output::show(&state, cli.json);
        }
        Command::List { prefix, limit } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let states = client.list(&prefix, limit).await?;
            output::list(&states, cli.json);
            // On stderr: the table (or JSON) stays what it is.
            if states.is_empty() {
                eprintln!("{}", nothing_under(&cli.key_prefix));
            } else if states.len() == limit {
                eprintln!("the first {limit} locks found; --limit to see more");
            }
        }
        Command::Leaders { prefix, limit } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            leaders::print(&client, &prefix, limit, cli.json).await?;
        }
        Command::ForceRelease { key, yes } => {
            force::release(&client, &key, yes, cli.json).await?;
        }
    }
    Ok(())
}
