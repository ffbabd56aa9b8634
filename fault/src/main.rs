//! The `fault` program: runs the fault-injection scenarios and prints the
//! table, or acts as one worker process of a run.
//!
//! ```text
//! fault all [--ops N] [--short] [--keep DIR]      every scenario, then the table
//! fault run NAME [--ops N] [--short] [--keep DIR] one scenario
//! fault list                                       the scenarios' names
//! fault probe --redis URL                          build a client, lock and release once
//! fault worker --id N --lock URL ...               (internal) one worker process
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use fault::scenario::{self, Outcome, Scenario};
use fault::worker::{self, WorkerConfig};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("worker") => WorkerConfig::from_args(&args[1..])
            .and_then(worker::run)
            .map(|()| true),
        Some("all") => options(&args[1..]).and_then(|o| {
            let mut scenarios = Scenario::all(o.ops, o.short);
            scenarios.extend(Scenario::scale_out(o.ops, o.short));
            run_all(&scenarios, &o)
        }),
        Some("run") => match args.get(1) {
            Some(name) => options(&args[2..]).and_then(|o| {
                match Scenario::by_name(name, o.ops, o.short) {
                    Some(s) => run_all(&[s], &o),
                    None => Err(format!("no scenario {name:?}; see `fault list`")),
                }
            }),
            None => Err("usage: fault run NAME [--ops N]".into()),
        },
        Some("list") => {
            for s in Scenario::all(0, false)
                .into_iter()
                .chain(Scenario::scale_out(0, false))
            {
                println!("{:28} {}", s.name, s.title);
            }
            Ok(true)
        }
        Some("probe") => match (args.get(1).map(String::as_str), args.get(2)) {
            (Some("--redis"), Some(url)) => probe(url),
            _ => Err("usage: fault probe --redis URL".into()),
        },
        _ => Err(
            "usage: fault all [--ops N] [--short] [--keep DIR] | fault run NAME [...] | fault list | fault probe --redis URL"
                .into(),
        ),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fault: {e}");
            ExitCode::from(2)
        }
    }
}

struct Options {
    ops: u64,
    short: bool,
    keep: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        ops: 10_000,
        short: false,
        keep: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ops" => {
                o.ops = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--ops needs a number")?;
            }
            "--short" => o.short = true,
            "--keep" => o.keep = Some(it.next().ok_or("--keep needs a directory")?.into()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

fn run_all(scenarios: &[Scenario], o: &Options) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut outcomes: Vec<Outcome> = Vec::new();
    for s in scenarios {
        eprintln!("running {} ({} operations) ...", s.name, s.ops);
        let outcome = match scenario::run(s, &exe, o.keep.as_deref()) {
            Ok(outcome) => outcome,
            Err(e) => {
                eprintln!("  {}: harness error: {e}", s.name);
                Outcome {
                    name: s.name,
                    title: s.title,
                    report: Default::default(),
                    elapsed: Default::default(),
                    faults: 0,
                    expect_violations: s.expect_violations,
                    error: Some(e),
                }
            }
        };
        eprintln!("  {}: {}", s.name, outcome.report);
        for example in &outcome.report.examples {
            eprintln!("    {example}");
        }
        outcomes.push(outcome);
    }
    println!("{}", scenario::table(&outcomes));
    let ok = outcomes.iter().all(Outcome::as_expected);
    if !ok {
        eprintln!("some scenario did not come out as expected");
    }
    Ok(ok)
}

/// Connects with `url`, takes and releases a lock; prints what happened.
fn probe(url: &str) -> Result<bool, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let client = match lock_runtime::LockClient::builder().redis(url).build().await {
            Ok(client) => client,
            Err(e) => {
                println!("error: {e}");
                return Ok(false);
            }
        };
        match client.lock("probe").acquire().await {
            Ok(guard) => {
                let fence = guard.fencing_token();
                match guard.release().await {
                    Ok(()) => {
                        println!("ok: locked and released, fencing token {fence}");
                        Ok(true)
                    }
                    Err(e) => {
                        println!("error: {e}");
                        Ok(false)
                    }
                }
            }
            Err(e) => {
                println!("error: {e}");
                Ok(false)
            }
        }
    })
}
