//! `bench --serve ROUTE SIDE`: serves one side of rows 11 and 12 until
//! SIGINT or SIGTERM (its server stopped with it), for a profiler (`perf record -p`, `perf stat -p`) while `wrk`
//! (as the row runs it) loads it. Prints the address to load and the `wrk`
//! script that row 12 needs (an `Idempotency-Key` per request).

use std::process::ExitCode;

use lock_runtime::LockClient;

use crate::http::{Side, app, serve};

pub(crate) const USAGE: &str = "bench --serve lock|idem lib|raw|by-hand [--server redis|valkey|redis8] (idem also: write|commit|commit-here)";

pub(crate) fn main(args: &[String]) -> ExitCode {
    let side = match args {
        [route, side] => match (route.as_str(), side.as_str()) {
            ("lock", "lib") => Side::LockLayer,
            ("lock", "raw") => Side::RawLock,
            ("idem", "lib") => Side::Idempotency,
            ("idem", "raw") => Side::RawIdempotency,
            ("idem", "by-hand") => Side::RawLibraryIdempotency,
            ("idem", "write") => Side::IdempotencyWrite,
            ("idem", "commit") => Side::IdempotencyCommit,
            ("idem", "commit-here") => Side::IdempotencyCommitHere,
            ("lock", "by-hand") => Side::RawLibraryLock,
            _ => return usage(),
        },
        _ => return usage(),
    };
    match run(side) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --serve: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: {USAGE}");
    ExitCode::from(2)
}

fn run(side: Side) -> Result<(), String> {
    // As the rows serve: the default multi-threaded runtime.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let server = test_support::RedisServer::try_start(&[])?;
        let url = server.url();
        let redis = redis::Client::open(url.as_str()).map_err(|e| format!("redis client: {e}"))?;
        let prefix = format!("serve{}:", std::process::id());
        let lib = LockClient::builder()
            .redis(url.as_str())
            .key_prefix(prefix.clone())
            .build()
            .await
            .map_err(|e| format!("lock client: {e}"))?;
        let (base, task) = serve(app(side, &lib, &redis, &prefix).await?).await?;
        let script = crate::load::write_script()?;
        println!(
            "serving {base} (pid {}): wrk -t2 -c{} -d10s -s {} {base}",
            std::process::id(),
            crate::load::CONNECTIONS,
            script.display()
        );
        // SIGTERM too (`kill PID`): returning drops `server`, which stops it.
        let signal = crate::interrupted().await;
        eprintln!("bench --serve: {signal}: stopping");
        task.abort();
        let _ = std::fs::remove_file(&script);
        drop(server);
        Ok(())
    })
}
