//! The `fault` program: runs the fault-injection scenarios and prints the
//! table, or acts as one worker process of a run.
//!
//! ```text
//! fault all [--ops N] [--runs R] [--short] [--keep DIR] [--server S]  every scenario, then the table
//! fault run NAME[,NAME..] [--ops N] [--runs R] [--short] [--keep DIR] [--server S]  these scenarios, in this order
//!
//! `--server redis|valkey|redis8` chooses the server every scenario starts (its
//! lock servers, Sentinel and Cluster alike, and the record's store);
//! without it `LOCK_TEST_SERVER` does, and Redis by default. The run
//! prints the server and its version first.
//!
//! `--runs R` repeats the whole list R times (in the same order, so each
//! scenario runs after the same predecessor every time) and ends with the
//! spread over the runs: violations and max stall as min / median / max.
//! fault list                                       the scenarios' names
//! fault probe --redis URL                          build a client, lock and release once
//! fault worker --id N --lock URL ...               (internal) one worker process
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fault::scenario::{self, Outcome, Scenario};
use fault::worker::{self, WorkerConfig};

const USAGE: &str = "usage: fault all [--ops N] [--runs R] [--short] [--keep DIR] [--server redis|valkey|redis8] | fault run NAME[,NAME...] [...] | fault list | fault probe --redis URL";

/// Every scenario, by name, with its title.
fn list() {
    for s in Scenario::suite(0, false)
        .into_iter()
        .chain(Scenario::demonstrations(0, false))
    {
        println!("{:28} {}", s.name, s.title);
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("worker") => WorkerConfig::from_args(&args[1..])
            .and_then(worker::run)
            .map(|()| true),
        Some("all") => {
            options(&args[1..]).and_then(|o| run_all(&Scenario::suite(o.ops, o.short), &o))
        }
        Some("run") => match args.get(1) {
            Some(names) => options(&args[2..]).and_then(|o| {
                let scenarios = names
                    .split(',')
                    .map(|name| {
                        Scenario::by_name(name, o.ops, o.short)
                            .ok_or_else(|| format!("no scenario {name:?}; see `fault list`"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                run_all(&scenarios, &o)
            }),
            None => Err("usage: fault run NAME[,NAME...] [--ops N] [--runs R] [--server S]".into()),
        },
        Some("list") => {
            list();
            Ok(true)
        }
        Some("--help" | "-h" | "help") => {
            println!("{USAGE}\n\nscenarios (`fault run NAME`; `fault all` runs the suite):");
            list();
            Ok(true)
        }
        Some("probe") => match (args.get(1).map(String::as_str), args.get(2)) {
            (Some("--redis"), Some(url)) => probe(url),
            _ => Err("usage: fault probe --redis URL".into()),
        },
        _ => Err(format!(
            "{USAGE}\n(`fault --help` also lists the scenarios)"
        )),
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
    runs: u32,
    short: bool,
    keep: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        ops: 10_000,
        runs: 1,
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
            "--runs" => {
                o.runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|r| *r > 0)
                    .ok_or("--runs needs a number above 0")?;
            }
            "--short" => o.short = true,
            "--keep" => o.keep = Some(it.next().ok_or("--keep needs a directory")?.into()),
            "--server" => {
                let name = it.next().ok_or("--server needs redis, valkey or redis8")?;
                test_support::ServerKind::parse(name)
                    .map_err(|_| format!("--server {name:?}: expected redis, valkey or redis8"))?
                    .choose()?;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

fn run_all(scenarios: &[Scenario], o: &Options) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let server = test_support::ServerKind::try_current()?;
    println!("server: {}", server.version()?);
    let mut all: Vec<Outcome> = Vec::new();
    for round in 1..=o.runs {
        let keep = match (&o.keep, o.runs) {
            (Some(dir), 1) => Some(dir.clone()),
            (Some(dir), _) => Some(dir.join(format!("run-{round}"))),
            (None, _) => None,
        };
        if o.runs > 1 {
            eprintln!("run {round} of {}", o.runs);
        }
        let outcomes = run_round(scenarios, &exe, keep.as_deref());
        println!("{}", scenario::table(&outcomes));
        all.extend(outcomes);
    }
    if o.runs > 1 {
        println!("{}", fault::spread::table(&all));
    }
    let ok = all.iter().all(Outcome::as_expected);
    if !ok {
        eprintln!("some scenario did not come out as expected");
    }
    Ok(ok)
}

fn run_round(scenarios: &[Scenario], exe: &Path, keep: Option<&Path>) -> Vec<Outcome> {
    let mut outcomes: Vec<Outcome> = Vec::new();
    for s in scenarios {
        match &s.orders {
            Some(plan) => eprintln!("running {} ({} kills) ...", s.name, plan.kills),
            None => eprintln!("running {} ({} operations) ...", s.name, s.ops),
        }
        let outcome = match scenario::run(s, exe, keep) {
            Ok(outcome) => outcome,
            Err(e) => {
                eprintln!("  {}: harness error: {e}", s.name);
                Outcome {
                    scenario: s.clone(),
                    report: Default::default(),
                    elapsed: Default::default(),
                    faults: 0,
                    tokens: None,
                    orders: None,
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
    outcomes
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
                println!("error: {}", test_support::error_chain(&e));
                return Ok(false);
            }
        };
        match client.lock("probe").acquire().await {
            Ok(guard) => {
                let fence = match guard.fencing_token().await {
                    Ok(fence) => fence.to_string(),
                    Err(e) => format!("not issued ({e})"),
                };
                match guard.release().await {
                    Ok(()) => {
                        println!("ok: locked and released, fencing token {fence}");
                        Ok(true)
                    }
                    Err(e) => {
                        println!("error: {}", test_support::error_chain(&e));
                        Ok(false)
                    }
                }
            }
            Err(e) => {
                println!("error: {}", test_support::error_chain(&e));
                Ok(false)
            }
        }
    })
}
