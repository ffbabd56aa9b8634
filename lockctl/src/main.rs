//! `lockctl`: see and, in an emergency, break the locks of `lock-runtime`.
//!
//! ```text
//! lockctl [--redis URL] [--key-prefix P] [--json] inspect KEY
//! lockctl [--redis URL] [--key-prefix P] [--json] list [--prefix P] [--limit N]
//! lockctl [--redis URL] [--key-prefix P] force-release KEY [--yes]
//! lockctl [--redis URL] [--key-prefix P] [--json] leaders [--prefix P] [--limit N]
//! ```
//!
//! `--redis` defaults to `REDIS_URL`. Output is a table, or JSON with
//! `--json`. Every failure (a bad URL, an unreachable server, a bad key) is
//! one line on standard error and a non-zero exit: 1 when the command could
//! not do what was asked (nothing to release, release declined), 2 for bad
//! input or an unreachable server.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lock_runtime::{LockClient, LockState};
use serde_json::json;

mod leaders;

#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    about = "Inspect, list and force-release lock-runtime locks"
)]
struct Cli {
    /// The Redis server (or Sentinel-less master) the locks live on.
    #[arg(long, env = "REDIS_URL", value_name = "URL")]
    redis: String,
    /// The prefix the services' clients use (`LockClientBuilder::key_prefix`).
    #[arg(long, default_value = "lock:", value_name = "PREFIX")]
    key_prefix: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Whether KEY is held, the lease left, the fencing counter, the waiters.
    Inspect {
        /// The lock's key, as the service names it (without the prefix).
        key: String,
    },
    /// The locks held now (found with SCAN, bounded; never KEYS).
    List {
        /// Only keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many locks.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// The elected leaders (`client.leader(name)`): name, label, term.
    Leaders {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// At most this many leaders.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Deletes KEY's lock whoever holds it (the holder learns at its next
    /// renewal). Asks first unless --yes; logs who did it.
    ForceRelease {
        /// The lock's key.
        key: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// A failure: its one-line message and exit code.
struct Failure(u8, String);

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_max_level(tracing::Level::WARN)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockctl: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("lockctl: {message}");
            ExitCode::from(code)
        }
    }
}

/// An error and its causes on one line.
fn one_line(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        text += &format!(": {cause}");
        next = cause.source();
    }
    text
}

fn bad(err: lock_runtime::LockError) -> Failure {
    Failure(2, one_line(&err))
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let client = LockClient::builder()
        .redis(&cli.redis)
        .key_prefix(&cli.key_prefix)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .await
        .map_err(bad)?;
    match cli.command {
        Command::Inspect { key } => {
            let state = client.inspect(&key).await.map_err(bad)?;
            print_states(&[state], cli.json, true);
            Ok(())
        }
        Command::List { prefix, limit } => {
            let states = client.list(&prefix, limit).await.map_err(bad)?;
            print_states(&states, cli.json, false);
            Ok(())
        }
        Command::Leaders { prefix, limit } => leaders::print(&client, &prefix, limit, cli.json)
            .await
            .map_err(bad),
        Command::ForceRelease { key, yes } => {
            let state = client.inspect(&key).await.map_err(bad)?;
            if !state.held {
                return Err(Failure(
                    1,
                    format!("`{key}` is not held: nothing to release"),
                ));
            }
            if !yes && !confirm(&state)? {
                return Err(Failure(1, "not released".into()));
            }
            let who = operator();
            let held = client.force_release(&key).await.map_err(bad)?;
            eprintln!("lockctl: {who} force-released `{key}` (held: {held})");
            if cli.json {
                println!("{}", json!({ "key": key, "released": held, "by": who }));
            } else {
                println!("released `{key}`");
            }
            Ok(())
        }
    }
}

/// `user@host` of whoever runs this, for the log.
fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".into());
    format!("{user}@{host}")
}

fn confirm(state: &LockState) -> Result<bool, Failure> {
    eprint!(
        "force-release `{}` (lease left {}, {} waiting)? The holder may still be working. [y/N] ",
        state.key,
        lease(state),
        state.waiters
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure(2, format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

fn lease(state: &LockState) -> String {
    match (state.held, state.remaining) {
        (false, _) => "-".into(),
        (true, None) => "no expiry".into(),
        (true, Some(left)) => {
            humantime::format_duration(Duration::from_millis(left.as_millis() as u64)).to_string()
        }
    }
}

fn print_states(states: &[LockState], as_json: bool, show_free: bool) {
    if as_json {
        let rows: Vec<_> = states
            .iter()
            .map(|s| {
                json!({
                    "key": s.key,
                    "held": s.held,
                    "remaining_ms": s.remaining.map(|d| d.as_millis() as u64),
                    "fencing_counter": s.fencing_counter,
                    "waiters": s.waiters,
                })
            })
            .collect();
        let out = if show_free && rows.len() == 1 {
            rows[0].clone()
        } else {
            serde_json::Value::Array(rows)
        };
        println!("{out}");
        return;
    }
    let width = states.iter().map(|s| s.key.len()).max().unwrap_or(3).max(3);
    println!(
        "{:width$}  {:5}  {:>12}  {:>15}  {:>7}",
        "KEY", "HELD", "LEASE LEFT", "FENCING COUNTER", "WAITERS"
    );
    for s in states {
        println!(
            "{:width$}  {:5}  {:>12}  {:>15}  {:>7}",
            s.key,
            if s.held { "yes" } else { "no" },
            lease(s),
            s.fencing_counter,
            s.waiters
        );
    }
}
