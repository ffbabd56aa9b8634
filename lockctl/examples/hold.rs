//! Holds one lock under a label until interrupted: something for `lockctl`
//! to show (the transcript in docs/design.md, "Operations", was captured with it).
//!
//! ```text
//! cargo run -p lockctl --example hold -- LABEL KEY [mutex|read|write|permits=N] [SECONDS]
//! ```
//!
//! `REDIS_URL` names the server (default `redis://127.0.0.1:6379`). It waits
//! up to an hour for the lock, holds it with a 30 s lease renewed by the
//! watchdog for SECONDS (default 300), then releases it; it says so if it
//! loses it first.

use std::time::Duration;

use lock_runtime::LockClient;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        eprintln!("hold: {e}");
        std::process::exit(1);
    }
}

async fn run(args: &[String]) -> Result<(), String> {
    let [label, key, rest @ ..] = args else {
        return Err("usage: hold LABEL KEY [mutex|read|write|permits=N] [SECONDS]".into());
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = LockClient::builder()
        .redis(url)
        .label(label)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let (ttl, wait) = (Duration::from_secs(30), Duration::from_secs(3600));
    let how = rest.first().map_or("mutex", String::as_str);
    let secs: u64 = match rest.get(1) {
        Some(s) => s
            .parse()
            .map_err(|_| format!("not a number of seconds: {s}"))?,
        None => 300,
    };
    let request = match how {
        "mutex" => client.lock(key),
        "read" => client.rw_lock(key).read(),
        "write" => client.rw_lock(key).write(),
        permits => {
            let n = permits
                .strip_prefix("permits=")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("not a kind: {permits}"))?;
            client.semaphore(key, n)
        }
    };
    let guard = request
        .ttl(ttl)
        .wait(wait)
        .acquire()
        .await
        .map_err(|e| e.to_string())?;
    let token = guard.fencing_token().await.map_err(|e| e.to_string())?;
    eprintln!("hold: {label} holds `{key}` with fencing token {token}");
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(secs)) => {
            guard.release().await.map_err(|e| e.to_string())?;
            eprintln!("hold: {label} released `{key}`");
        }
        _ = guard.lost() => eprintln!("hold: {label} lost `{key}`"),
    }
    Ok(())
}
