//! `bench --cpu`: the client's CPU time per pair and per request, natively,
//! for the scenarios and sides of `bench --instructions` (see there).
//!
//! Instruction counts do not move with load, but they weigh every
//! instruction alike: an atomic read-modify-write, a clock read, a cache
//! miss and the kernel's share of a system call count as one or nothing.
//! At 32 tasks on distinct keys the library's client executes 1.04-1.08 x
//! raw redis-rs's instructions and spends about 1.2 x its CPU time (see
//! BENCHMARKS.md), so this mode measures the time itself: each side runs
//! in a child process of this binary (the same child as `--instructions`,
//! natively, on a `current_thread` runtime), which reports the CPU time of
//! its thread (`/proc/thread-self/schedstat`: user and kernel, in ns)
//! over the counted part only: no connecting, no warm-up. The runs of a
//! scenario's sides alternate, and each ratio is the median of the ratios
//! of the runs taken side by side, as the bench's rows are.

use std::process::{Command, ExitCode};

use crate::instructions::{CHILD, CPU_REPORT, Flags, Kind, chosen, sides};
use crate::report::median;

const USAGE: &str = "\
usage: bench --cpu [--runs R] [--n N] [--only SCENARIOS]

  --runs R        runs per side, alternating (default 5)
  --n N           pairs or requests per run (default: 5,000 for one task,
                  200,000 for 32 tasks' pairs, 50,000 for 32 tasks'
                  requests)
  --only LIST     comma-separated scenarios: pair, pair32, route, route32,
                  idem, idem32, permit (default all)

Always starts its own redis-server (REDIS_SERVER names the binary, or
--server).";

/// `bench --cpu ...`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --cpu: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    runs: usize,
    n: Option<usize>,
    only: Option<Vec<String>>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        runs: 5,
        n: None,
        only: None,
    };
    let mut flags = Flags::new(args, USAGE);
    while let Some(arg) = flags.next() {
        match arg {
            "--runs" => opts.runs = flags.number(arg)?,
            "--n" => opts.n = Some(flags.number(arg)?),
            "--only" => opts.only = Some(flags.scenarios(arg)?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(flags.unknown(other)),
        }
    }
    Ok(opts)
}

/// Pairs or requests per run where `--n` does not say: about a second of
/// CPU each on a 2-core VM (one task's waits for each reply cost it more
/// CPU an operation, in the kernel, than 32 tasks' do).
fn default_n(tasks: usize, kind: Kind) -> usize {
    match (tasks, kind) {
        (1, _) => 5_000,
        (_, Kind::Pair) => 200_000,
        _ => 50_000,
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let opts = parse(args)?;
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let server = test_support::RedisServer::try_start(&[])?;
    let url = server.url();
    let mut lines = Vec::new();
    for (scenario, tasks, kind) in chosen(opts.only.as_deref()) {
        let n = opts.n.unwrap_or(default_n(*tasks, *kind));
        let sides = sides(*kind);
        // Per side, the CPU us per pair or request of each run.
        let mut per_op = vec![Vec::with_capacity(opts.runs); sides.len()];
        for run in 0..opts.runs {
            for k in 0..sides.len() {
                let i = (k + run) % sides.len();
                eprintln!(
                    "bench --cpu: {scenario} ({tasks} task(s)), {}: {n}, run {}/{}",
                    sides[i],
                    run + 1,
                    opts.runs
                );
                let seconds = child_cpu(&exe, scenario, sides[i], &url, n)?;
                per_op[i].push(seconds * 1e6 / n as f64);
            }
        }
        for (i, side) in sides.iter().enumerate() {
            let ratios: Vec<f64> = per_op[i]
                .iter()
                .zip(&per_op[1])
                .map(|(s, b)| s / b)
                .collect();
            let (lo, hi) = per_op[i]
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
            lines.push(format!(
                "| {scenario} | {side} | {:.2} | {lo:.2}-{hi:.2} | {:.2} |",
                median(&per_op[i]),
                median(&ratios)
            ));
        }
    }
    println!(
        "\nthe client's CPU time per pair (pair, pair32) or request (route, idem and their 32s), \
         natively, medians of {} runs; ratio to the hand-rolled side (raw): the median of the \
         runs' ratios\n",
        opts.runs
    );
    println!("| scenario | side | CPU us | min-max | x raw |");
    println!("|---|---|---:|---:|---:|");
    for l in &lines {
        println!("{l}");
    }
    Ok(())
}

/// Runs the child of `scenario`/`side` natively: the counted part's CPU
/// seconds, as it reports them.
fn child_cpu(
    exe: &std::path::Path,
    scenario: &str,
    side: &str,
    url: &str,
    n: usize,
) -> Result<f64, String> {
    let out = Command::new(exe)
        .args([CHILD, scenario, side, url, &n.to_string()])
        .env(CPU_REPORT, "1")
        .output()
        .map_err(|e| format!("run the child: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{scenario} {side}: the child failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .last()
        .and_then(|l| l.trim().parse::<f64>().ok())
        .ok_or(format!(
            "{scenario} {side}: the child reported no CPU time ({text:?})"
        ))
}
