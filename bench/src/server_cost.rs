//! `bench --server-instructions`: what a lock costs Redis, in instructions,
//! against the hand-written commands it replaces; a figure that does not
//! move with the machine's load.
//!
//! Each side runs in a `redis-server` of its own under `valgrind
//! --tool=callgrind` (with `--hz 1`, so the server's timer adds next to
//! nothing): the side's commands for N keys, pipelined 200 at a time on one
//! connection, then `SHUTDOWN NOSAVE`; callgrind's total for the process,
//! less that of a server that ran no operation (started, loaded the
//! scripts, shut down), divided by N, is the side's instructions per
//! operation. Everything the server does is in it: reading and parsing the
//! request, running the command or the script, writing the reply.
//!
//! The lock's sides (rows 1, 2 and 11) come first, then an idempotency
//! record's (row 12): a fresh claim and the stored response, written by
//! hand, owner-checked, and as the library sends them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::raw::{
    CHECKED_STORE, FENCED_MINIMUM, LIBRARY_SETTLE, RETENTION_MS, acquire_args, library_names,
    library_record_names, library_settle_args, library_token, load_script, release_args,
};

const ACQUIRE: &str = include_str!("../../lock-runtime/scripts/acquire.lua");
const RELEASE: &str = include_str!("../../lock-runtime/scripts/release.lua");
const UNLOCK: &str = include_str!("../../lock-runtime/scripts/unlock.lua");
const MINT: &str = include_str!("../../lock-runtime/scripts/mint.lua");
const SHARED: &str = include_str!("../../lock-runtime/scripts/shared.lua");
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
const EMPTY: &str = "return 1";

const USAGE: &str = "\
usage: bench --server-instructions [--ops N]

  --ops N   operations per side (default 10000)

Starts one redis-server per side under valgrind (REDIS_SERVER names the binary).";

/// The sides, in the order printed: a name and what one operation sends.
const SIDES: &[(&str, Side)] = &[
    (
        "raw pair: SET NX PX + compare-and-delete EVALSHA",
        Side::RawPair,
    ),
    (
        "fenced minimum pair: EVALSHA (SET NX PX, INCR) + compare-and-delete",
        Side::MinimumPair,
    ),
    (
        "library pair: SET NX PX + unlock.lua (DELIFEQ on Valkey 9, DELEX on Redis 8.4), as sent",
        Side::LibraryPair,
    ),
    (
        "library pair, token asked for: SET NX PX + mint.lua + the release",
        Side::LibraryFencedPair,
    ),
    (
        "library pair through its scripts: acquire.lua + release.lua",
        Side::ScriptedPair,
    ),
    ("  SET NX PX", Side::Set),
    ("  INCR", Side::Incr),
    ("  EVALSHA of `return 1`, 1 key + 2 args", Side::Empty3),
    ("  EVALSHA of `return 1`, 4 keys + 6 args", Side::Empty10),
    ("  acquire.lua alone, uncontended", Side::Acquire),
    (
        "permit pair: shared.lua acquire + release, a semaphore of 4 (row 10)",
        Side::PermitPair,
    ),
    (
        "raw record: SET NX PX (claim) + SET PX (store)",
        Side::RawRecord,
    ),
    (
        "owner-checked record: SET NX PX + EVALSHA (GET = owner, SET PX)",
        Side::CheckedRecord,
    ),
    (
        "library record: its SET NX PX claim + its settle (SET IFEQ PX where the server has it, else idempotency_settle.lua), as sent",
        Side::LibraryRecord,
    ),
];

/// The body every record side stores: the HTTP rows' handler's.
const BODY: &[u8] = br#"{"ok":true}"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    Idle,
    RawPair,
    MinimumPair,
    LibraryPair,
    LibraryFencedPair,
    ScriptedPair,
    Set,
    Incr,
    Empty3,
    Empty10,
    Acquire,
    PermitPair,
    RawRecord,
    CheckedRecord,
    LibraryRecord,
}

/// The SHA1s of the scripts, as loaded.
struct Shas {
    acquire: String,
    release: String,
    cad: String,
    minimum: String,
    empty: String,
    checked: String,
    settle: String,
    unlock: String,
    mint: String,
    shared: String,
    /// The server's own compare-and-delete (`DELIFEQ`, `DELEX`), which the
    /// library releases with.
    native: Option<&'static str>,
}

impl Side {
    /// The commands of operation `i`.
    fn commands(self, i: usize, sha: &Shas) -> Vec<redis::Cmd> {
        let names = library_names("", &format!("k{i}"));
        let (key, counter) = (&names[0], &names[1]);
        let n = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) as u64 | 1;
        // The library's sides send its tokens as it draws them (57
        // characters); the hand-written ones a 128-bit hex token.
        let library = matches!(
            self,
            Side::LibraryPair
                | Side::LibraryFencedPair
                | Side::ScriptedPair
                | Side::Acquire
                | Side::PermitPair
                | Side::LibraryRecord
        );
        let token = if library {
            library_token(n)
        } else {
            format!("{n:032x}")
        };
        let evalsha = |sha: &str, keys: &[String]| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(keys.len()).arg(keys);
            cmd
        };
        let acquire = || {
            let mut cmd = evalsha(&sha.acquire, &names[..4]);
            cmd.arg(acquire_args(&names, &token));
            cmd
        };
        let cad = || {
            let mut cmd = evalsha(&sha.cad, &names[..1]);
            cmd.arg(&token);
            cmd
        };
        let claim = |key: &str, value: &str| {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(value).arg("NX").arg("PX").arg(30_000);
            set
        };
        let set = || claim(key, &token);
        // The library's plain release: the server's own compare-and-delete
        // where it has one.
        let unlock = || match sha.native {
            Some("DELIFEQ") => {
                let mut cmd = redis::cmd("DELIFEQ");
                cmd.arg(key).arg(&token);
                cmd
            }
            Some(_) => {
                let mut cmd = redis::cmd("DELEX");
                cmd.arg(key).arg("IFEQ").arg(&token);
                cmd
            }
            None => {
                let mut cmd = evalsha(&sha.unlock, &names[..1]);
                cmd.arg(&token);
                cmd
            }
        };
        let (record, notice) = library_record_names("", &format!("k{i}"));
        match self {
            Side::Idle => vec![],
            Side::RawPair => vec![set(), cad()],
            Side::MinimumPair => {
                let mut take = evalsha(&sha.minimum, &names[..2]);
                take.arg(&token).arg(30_000);
                vec![take, cad()]
            }
            Side::LibraryPair => vec![set(), unlock()],
            Side::LibraryFencedPair => {
                let mut mint = evalsha(&sha.mint, &names[..2]);
                mint.arg(&token);
                vec![set(), mint, unlock()]
            }
            Side::ScriptedPair => {
                let mut release = evalsha(&sha.release, &names[..4]);
                release.arg(release_args(&names, &token));
                vec![acquire(), release]
            }
            Side::Set => vec![set()],
            Side::Incr => {
                let mut incr = redis::cmd("INCR");
                incr.arg(counter);
                vec![incr]
            }
            Side::Empty3 => {
                let mut cmd = evalsha(&sha.empty, &names[..1]);
                cmd.arg(&token).arg(30_000);
                vec![cmd]
            }
            Side::Empty10 => {
                // As many arguments as acquire.lua took before the twelfth
                // session packed them.
                let mut cmd = evalsha(&sha.empty, &names[..4]);
                cmd.arg(&token).arg(30_000).arg(0).arg(&names[4]);
                cmd.arg(2_000).arg("PUBLISH");
                vec![cmd]
            }
            Side::Acquire => vec![acquire()],
            Side::PermitPair => {
                // A semaphore's names (writer, holders, queue, the slot's
                // counter, tokens, the queue's deadlines) and arguments, as
                // shared.rs sends them.
                let shared = ["T", "P", "O", "S", "Z", "U"]
                    .map(|kind| format!("{kind}{{k{i}}}"))
                    .to_vec();
                let (notice, publish) = (format!("M{{k{i}}}"), "PUBLISH");
                let [take, give] = ["acquire", "release"].map(|op| {
                    let mut cmd = evalsha(&sha.shared, &shared);
                    cmd.arg(op).arg(&token).arg(30_000).arg("s").arg(4);
                    cmd.arg(&notice).arg(2_000).arg(publish).arg(0);
                    cmd
                });
                vec![take, give]
            }
            Side::RawRecord => {
                let mut store = redis::cmd("SET");
                store.arg(&record).arg(BODY).arg("PX").arg(RETENTION_MS);
                vec![claim(&record, "inflight"), store]
            }
            Side::CheckedRecord => {
                let owner = format!("run:{i}");
                let mut store = evalsha(&sha.checked, std::slice::from_ref(&record));
                store.arg(&owner).arg(BODY).arg(RETENTION_MS);
                vec![claim(&record, &owner), store]
            }
            // The settle as the library sends it: `SET .. IFEQ` on the
            // servers with a native compare-and-delete (they have the
            // conditional `SET` too), else the script.
            Side::LibraryRecord => {
                let (claimed, _, retention, stored) =
                    library_settle_args(&token, &notice, 200, BODY);
                let settle = if sha.native.is_some() {
                    let mut set = redis::cmd("SET");
                    set.arg(&record).arg(stored).arg("IFEQ").arg(&claimed);
                    set.arg("PX").arg(retention);
                    set
                } else {
                    let mut settle = evalsha(&sha.settle, std::slice::from_ref(&record));
                    settle.arg(library_settle_args(&token, &notice, 200, BODY));
                    settle
                };
                vec![claim(&record, &claimed), settle]
            }
        }
    }
}

/// Entry point of `bench --server-instructions`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let mut ops = 10_000usize;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--ops" => match it.next().and_then(|n| n.parse().ok()).filter(|&n| n > 0) {
                Some(n) => ops = n,
                None => return usage_error("--ops needs a positive number"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage_error(&format!("unknown argument `{other}`")),
        }
    }
    match run(ops) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench --server-instructions: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("bench --server-instructions: {message}\n{USAGE}");
    ExitCode::from(2)
}

fn run(ops: usize) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let dir = std::env::temp_dir().join(format!("bench-server-instr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let outcome = (|| {
        let idle = runtime.block_on(instructions(&dir, Side::Idle, 0))?;
        println!(
            "Redis instructions per operation (callgrind, {ops} operations a side; a server \
             that ran none: {idle} in all)"
        );
        let mut raw = None;
        let mut unit = "raw pair";
        for &(name, side) in SIDES {
            if side == Side::RawRecord {
                // The record sides are read against the raw record.
                (raw, unit) = (None, "raw record");
            }
            let total = runtime.block_on(instructions(&dir, side, ops))?;
            let per_op = total.saturating_sub(idle) as f64 / ops as f64;
            let baseline = *raw.get_or_insert(per_op);
            println!(
                "{name:<72} {per_op:>9.0}  {:>5.2} x {unit}",
                per_op / baseline
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// callgrind's instruction total for one server that ran `ops` operations
/// of `side`.
async fn instructions(dir: &Path, side: Side, ops: usize) -> Result<u64, String> {
    let port = test_support::try_free_port().map_err(|e| format!("no free port: {e}"))?;
    let out = dir.join(format!("callgrind.{port}"));
    let server = Server::start(&out, port)?;
    let mut conn = connect(port).await?;
    let sha = Shas {
        acquire: load_script(&mut conn, ACQUIRE).await?,
        release: load_script(&mut conn, RELEASE).await?,
        cad: load_script(&mut conn, COMPARE_AND_DELETE).await?,
        minimum: load_script(&mut conn, FENCED_MINIMUM).await?,
        empty: load_script(&mut conn, EMPTY).await?,
        checked: load_script(&mut conn, CHECKED_STORE).await?,
        settle: load_script(&mut conn, LIBRARY_SETTLE).await?,
        unlock: load_script(&mut conn, UNLOCK).await?,
        mint: load_script(&mut conn, MINT).await?,
        shared: load_script(&mut conn, SHARED).await?,
        native: native_release(&mut conn).await,
    };
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for i in 0..ops {
        for cmd in side.commands(i, &sha) {
            pipe.add_command(cmd);
            queued += 1;
        }
        if queued >= 200 || i + 1 == ops {
            let _: Vec<redis::Value> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| format!("{side:?}: {e}"))?;
            pipe = redis::pipe();
            queued = 0;
        }
    }
    // SHUTDOWN closes the connection: its reply is an error or nothing.
    let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
        .arg("NOSAVE")
        .query_async(&mut conn)
        .await;
    server.wait()?;
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no instruction total in {}", out.display()))
}

/// The server's own compare-and-delete, as `COMMAND INFO` finds it:
/// `DELIFEQ` (Valkey 9 and later) or `DELEX` (Redis 8.4 and later), as the
/// library finds out with its probe script.
async fn native_release(conn: &mut MultiplexedConnection) -> Option<&'static str> {
    for name in ["DELIFEQ", "DELEX"] {
        let info: redis::RedisResult<Vec<redis::Value>> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query_async(conn)
            .await;
        if info.is_ok_and(|info| info.first().is_some_and(|c| *c != redis::Value::Nil)) {
            return Some(name);
        }
    }
    None
}

async fn connect(port: u16) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .map_err(|e| format!("client: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.get_multiplexed_async_connection().await {
            Ok(conn) => return Ok(conn),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("redis-server under valgrind did not answer: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `redis-server` under callgrind; killed on drop unless it exited.
struct Server(Option<Child>);

impl Server {
    fn start(out: &Path, port: u16) -> Result<Self, String> {
        let binary: PathBuf = test_support::redis_server_bin();
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&binary)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--hz", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start valgrind (apt-get install valgrind): {e}"))?;
        Ok(Self(Some(child)))
    }

    /// Waits for the server to exit after `SHUTDOWN`, so callgrind has
    /// written its totals.
    fn wait(mut self) -> Result<(), String> {
        let mut child = self.0.take().ok_or("server already gone")?;
        child.wait().map_err(|e| format!("valgrind: {e}"))?;
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
