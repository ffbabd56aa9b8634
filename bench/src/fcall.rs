//! `bench --fcall`: the library's acquire and release scripts called as a
//! Redis function library (`FCALL`) against the same bodies as scripts
//! (`EVALSHA`), in one run on one server the benchmark starts.
//!
//! The script files are loaded unchanged: each body becomes the body of a
//! function whose parameters are named `KEYS` and `ARGV`, so both sides run
//! the same Lua. Measured per repetition, the sides interleaved: the serial
//! pair (blocks of 100 pairs in turn) and 32 tasks on distinct keys (windows
//! in turn) on one multiplexed connection, as the library sends them; and
//! over the whole run, what Redis says each call cost it (`INFO
//! commandstats`, `usec_per_call`), which leaves out the client and the
//! network.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::curves::info;
use crate::raw::{acquire_args, library_names, load_script, release_args};
use crate::report::median;
use crate::rows::blocks;

const ACQUIRE: &str = include_str!("../../lock-runtime/scripts/acquire.lua");
const RELEASE: &str = include_str!("../../lock-runtime/scripts/release.lua");

/// The function library's name and its two functions.
const LIBRARY: &str = "lockbench";
const ACQUIRE_FN: &str = "lockbench_acquire";
const RELEASE_FN: &str = "lockbench_release";

const USAGE: &str = "\
usage: bench --fcall [--reps N] [--pairs N]

  --reps N      repetitions (default 5); the table shows medians
  --pairs N     serial pairs per side per repetition (default 2000)

Always starts its own redis-server (REDIS_SERVER names the binary).";

/// Tasks on distinct keys, the window of a slice, and slices per side per
/// repetition.
const TASKS: usize = 32;
const WINDOW: Duration = Duration::from_millis(300);
const SLICES: usize = 2;

/// The source of the function library: the two script files as function
/// bodies.
pub(crate) fn library_source() -> String {
    format!(
        "#!lua name={LIBRARY}\n\
         redis.register_function('{ACQUIRE_FN}', function(KEYS, ARGV)\n{ACQUIRE}\nend)\n\
         redis.register_function('{RELEASE_FN}', function(KEYS, ARGV)\n{RELEASE}\nend)\n"
    )
}

/// How a side calls the two bodies: the command and what names the body.
#[derive(Clone, Copy, Debug)]
enum Via<'a> {
    /// `EVALSHA <sha>`: the acquire's and the release's SHA1.
    Evalsha(&'a str, &'a str),
    /// `FCALL <function>`.
    Fcall,
}

impl Via<'_> {
    fn call(self, acquire: bool) -> redis::Cmd {
        let (command, target) = match (self, acquire) {
            (Via::Evalsha(sha, _), true) => ("EVALSHA", sha),
            (Via::Evalsha(_, sha), false) => ("EVALSHA", sha),
            (Via::Fcall, true) => ("FCALL", ACQUIRE_FN),
            (Via::Fcall, false) => ("FCALL", RELEASE_FN),
        };
        let mut cmd = redis::cmd(command);
        cmd.arg(target);
        cmd
    }
}

/// The names the library gives one key, under `prefix`.
fn names(prefix: &str, key: &str) -> [String; 5] {
    library_names(prefix, key)
}

/// One uncontended acquire + release of `names`, as the library sends
/// them for a try-once lock on one server.
async fn pair(
    conn: &mut MultiplexedConnection,
    via: Via<'_>,
    names: &[String; 5],
    token: &str,
) -> Result<(), String> {
    let fencing: i64 = via
        .call(true)
        .arg(4)
        .arg(&names[..4])
        .arg(acquire_args(names, token))
        .query_async(conn)
        .await
        .map_err(|e| format!("acquire ({via:?}): {e}"))?;
    if fencing <= 0 {
        return Err(format!("{} was unexpectedly held", names[0]));
    }
    let released: i64 = via
        .call(false)
        .arg(4)
        .arg(&names[..4])
        .arg(release_args(names, token))
        .query_async(conn)
        .await
        .map_err(|e| format!("release ({via:?}): {e}"))?;
    if released != 1 {
        return Err(format!("{} was not ours at release", names[0]));
    }
    Ok(())
}

/// `TASKS` tasks, each on its own key, pairing in a loop for `WINDOW`:
/// pairs per second, and the server's CPU time (all of it: reading,
/// parsing, running, replying) per pair, in microseconds.
async fn parallel(
    conn: &MultiplexedConnection,
    via: Via<'_>,
    side: &str,
) -> Result<(f64, f64), String> {
    let mut probe = conn.clone();
    let cpu_0 = info::cpu_seconds(&mut probe).await?;
    let start = Instant::now() + Duration::from_millis(5);
    let end = start + WINDOW;
    let tasks = (0..TASKS).map(|i| {
        let mut conn = conn.clone();
        let names = names(&format!("fc:{side}:"), &format!("par:{i}"));
        let token = format!("{i:032x}");
        async move {
            tokio::time::sleep_until(start.into()).await;
            let mut done = 0u64;
            loop {
                pair(&mut conn, via, &names, &token).await?;
                if Instant::now() >= end {
                    return Ok::<u64, String>(done);
                }
                done += 1;
            }
        }
    });
    let counts = futures_util::future::try_join_all(tasks).await?;
    let cpu_1 = info::cpu_seconds(&mut probe).await?;
    let pairs = counts.iter().sum::<u64>() as f64;
    Ok((pairs / WINDOW.as_secs_f64(), (cpu_1 - cpu_0) * 1e6 / pairs))
}

/// `bench --fcall ...`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --fcall: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let (mut reps, mut pairs) = (5usize, 2000usize);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> Result<usize, String> {
            let v = args
                .next()
                .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
            v.parse()
                .map_err(|_| format!("{flag} {v:?} is not a number"))
        };
        match arg.as_str() {
            "--reps" => reps = number("--reps")?.max(1),
            "--pairs" => pairs = number("--pairs")?.max(1),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let server = test_support::RedisServer::try_start(&[])?;
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(measure(&url, reps, pairs))
}

async fn measure(url: &str, reps: usize, pairs: usize) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let acquire_sha = load_script(&mut conn, ACQUIRE).await?;
    let release_sha = load_script(&mut conn, RELEASE).await?;
    let loaded: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library_source())
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("FUNCTION LOAD: {e}"))?;
    if loaded != LIBRARY {
        return Err(format!("FUNCTION LOAD answered {loaded:?}"));
    }
    let eval = Via::Evalsha(&acquire_sha, &release_sha);
    let sides = [(eval, "evalsha"), (Via::Fcall, "fcall")];
    // Warm-up: every path once, then counters from zero.
    for (via, side) in sides {
        pair(&mut conn, via, &names(&format!("fc:{side}:"), "warm"), "w").await?;
        parallel(&conn, via, side).await?;
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .exec_async(&mut conn)
        .await
        .map_err(|e| format!("CONFIG RESETSTAT: {e}"))?;
    let (mut serial, mut par) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut par_cpu = [Vec::new(), Vec::new()];
    let serial_names = sides.map(|(_, side)| names(&format!("fc:{side}:"), "serial"));
    for rep in 0..reps {
        let (mut a, mut b) = (conn.clone(), conn.clone());
        let (e, f) = blocks(
            pairs,
            rep,
            async || pair(&mut a, eval, &serial_names[0], "s").await,
            async || pair(&mut b, Via::Fcall, &serial_names[1], "s").await,
        )
        .await?;
        serial[0].push(median(&e));
        serial[1].push(median(&f));
        let (mut slices, mut cpus) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for slice in 0..SLICES {
            for k in 0..2 {
                let side = (k + rep + slice) % 2;
                let (via, name) = sides[side];
                let (rate, cpu) = parallel(&conn, via, name).await?;
                slices[side].push(rate);
                cpus[side].push(cpu);
            }
        }
        for side in 0..2 {
            par[side].push(median(&slices[side]));
            par_cpu[side].push(median(&cpus[side]));
        }
        eprintln!(
            "rep {}: serial {:.1} / {:.1} us, 32 tasks {:.0} / {:.0} pairs/s (evalsha / fcall)",
            rep + 1,
            serial[0][rep],
            serial[1][rep],
            par[0][rep],
            par[1][rep]
        );
    }
    let stats = info::info(&mut conn, "commandstats").await?;
    let per_call = |name: &str| {
        let (calls, usec) = info::command(&stats, name);
        usec / calls
    };
    let ratios = |v: &[Vec<f64>; 2]| -> f64 {
        let r: Vec<f64> = v[0].iter().zip(&v[1]).map(|(e, f)| f / e).collect();
        median(&r)
    };
    println!(
        "\nFCALL against EVALSHA, the library's acquire.lua + release.lua bodies, {}; \
         medians of {reps}\n",
        test_support::describe_server(&info::info(&mut conn, "server").await?)
    );
    println!(
        "{:<44} {:>12} {:>12} {:>14}",
        "measure", "EVALSHA", "FCALL", "FCALL/EVALSHA"
    );
    println!(
        "{:<44} {:>12.1} {:>12.1} {:>14.3}",
        "serial pair, median latency (us)",
        median(&serial[0]),
        median(&serial[1]),
        ratios(&serial)
    );
    println!(
        "{:<44} {:>12.0} {:>12.0} {:>14.3}",
        "32 tasks, distinct keys (pairs/s)",
        median(&par[0]),
        median(&par[1]),
        ratios(&par)
    );
    println!(
        "{:<44} {:>12.2} {:>12.2} {:>14.3}",
        "32 tasks: Redis CPU per pair, whole server (us)",
        median(&par_cpu[0]),
        median(&par_cpu[1]),
        ratios(&par_cpu)
    );
    let (e, f) = (per_call("evalsha"), per_call("fcall"));
    println!(
        "{:<44} {:>12.2} {:>12.2} {:>14.3}",
        "Redis CPU per call, usec_per_call (whole run)",
        e,
        f,
        f / e
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_wraps_both_script_files_unchanged() {
        let source = library_source();
        assert!(source.starts_with("#!lua name=lockbench\n"));
        assert!(source.contains(ACQUIRE) && source.contains(RELEASE));
        assert_eq!(source.matches("redis.register_function(").count(), 2);
    }
}
