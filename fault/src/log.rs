//! The operation log: one JSON object per line, per worker process, plus the
//! harness's own log of the faults it injected.
//!
//! # Timestamps
//!
//! Every event carries `t`, microseconds since the run's *epoch*: a reading of
//! `CLOCK_MONOTONIC` that the harness takes and passes to every worker on its
//! command line. `CLOCK_MONOTONIC` is one clock for every process of the
//! machine, never stepped, so `t = CLOCK_MONOTONIC now - epoch` is monotonic
//! within a process and comparable across processes to the microsecond.
//! Durations (waits, stalls) are differences of these timestamps.
//!
//! (An earlier version paired one wall-clock sample per process with
//! `Instant`; a worker preempted between the two readings, as happens when 32
//! of them start at once on two cores, was then milliseconds off, and the
//! checker reported overlaps that the store never saw.)

use std::fs::File;
use std::io::{BufRead, BufReader, LineWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::kind::Side;

/// Microseconds on `CLOCK_MONOTONIC`, now: the same clock in every process.
pub fn monotonic_micros() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    secs * 1_000_000 + nanos / 1_000
}

/// A process's view of the run's shared time line.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// The run's zero, in [`monotonic_micros`].
    epoch: u64,
}

impl Clock {
    /// A clock whose zero is `epoch` (a [`monotonic_micros`] reading of the
    /// harness).
    pub fn new(epoch: u64) -> Self {
        Self { epoch }
    }

    /// µs since the epoch.
    pub fn now(&self) -> u64 {
        monotonic_micros().saturating_sub(self.epoch)
    }
}

/// How a store write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcome {
    /// Accepted; the store numbered it `seq`.
    Accepted,
    /// Rejected: a higher fencing token was seen before.
    Rejected,
    /// The store did not answer (the store is not faulted, but a worker
    /// stopped mid-write can time out on a reply that already arrived).
    Error,
}

/// How `LockGuard::release` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseOutcome {
    /// `Ok(())`: the server still had our token.
    Ok,
    /// `Err(LockError::Lost)`: "not owner".
    Lost,
    /// Any other error (server unreachable).
    Error,
}

/// One line of a worker's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The worker started.
    Start {
        /// Worker number.
        worker: u32,
        /// OS process id.
        pid: u32,
        /// Time.
        t: u64,
    },
    /// A lock operation begins: the worker wants `key`.
    Attempt {
        /// Operation number within the worker.
        op: u64,
        /// The lock key.
        key: String,
        /// `lock_all`: the other keys, in the order the request named them
        /// after `key`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        more_keys: Vec<String>,
        /// A read-write lock's side (none for the other kinds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        side: Option<Side>,
        /// Time.
        t: u64,
    },
    /// One acquire call failed with a backend error (retried within the wait).
    AcquireError {
        /// Operation.
        op: u64,
        /// The error's text.
        error: String,
        /// Time.
        t: u64,
    },
    /// Acquired, with this fencing token.
    Acquired {
        /// Operation.
        op: u64,
        /// Fencing token; 0 when the worker asks for it later (a `Token` or
        /// `TokenRefused` line follows, unless the process dies first).
        fence: u64,
        /// `lock_all`: the tokens of the attempt's `more_keys`, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        more_fences: Vec<u64>,
        /// Time (after `acquire` returned).
        t: u64,
    },
    /// The fencing token of a lock whose grant was logged without one,
    /// asked for after the think (a lock taken on the plain path gets it
    /// minted now, by a step that checks the lease).
    Token {
        /// Operation.
        op: u64,
        /// The token.
        fence: u64,
        /// When it was asked for.
        sent: u64,
        /// Time (the answer).
        t: u64,
    },
    /// That token refused: the operation ends there (no read, no write),
    /// with a release.
    TokenRefused {
        /// Operation.
        op: u64,
        /// `LockError::Lost`: the lease had ended (any other error: the
        /// server could not be asked).
        lost: bool,
        /// The error's text.
        error: String,
        /// When it was asked for.
        sent: u64,
        /// Time (the answer).
        t: u64,
    },
    /// Not acquired within the wait (`Busy`, or errors until the deadline).
    GaveUp {
        /// Operation.
        op: u64,
        /// The last error's text.
        error: String,
        /// Time.
        t: u64,
    },
    /// The acquire future was dropped by a timeout (scenario 6).
    Cancelled {
        /// Operation.
        op: u64,
        /// `client.renewed_leases()` right after: must be 0 (no guard lives).
        watched: usize,
        /// Time.
        t: u64,
    },
    /// The fenced read of the record.
    Read {
        /// Operation.
        op: u64,
        /// Which key's record (none: the operation's only key).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// `false`: rejected by fencing (or the store failed).
        ok: bool,
        /// The record's version.
        version: u64,
        /// The record's counter.
        counter: u64,
        /// Time.
        t: u64,
    },
    /// The runtime thread was blocked (`std::thread::sleep`) while holding.
    Blocked {
        /// Operation.
        op: u64,
        /// How long, in ms.
        ms: u64,
        /// The lease, in ms.
        ttl_ms: u64,
        /// ms until `lost()` resolved after the block, if it did within 2 s.
        lost_after_ms: Option<u64>,
        /// Time (after the block and the check).
        t: u64,
    },
    /// The fenced write of `counter + 1`.
    Write {
        /// Operation.
        op: u64,
        /// Which key's record (none: the operation's only key).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// Outcome.
        outcome: WriteOutcome,
        /// The store's sequence number when accepted.
        seq: u64,
        /// `guard.is_lost()` just before the write.
        lost_before: bool,
        /// Time just before the write was sent.
        #[serde(default)]
        sent: u64,
        /// Time (its answer).
        t: u64,
    },
    /// About to call `release` (the end of the hold as far as the holder knows).
    ReleaseSent {
        /// Operation.
        op: u64,
        /// Time.
        t: u64,
    },
    /// `release` returned.
    Released {
        /// Operation.
        op: u64,
        /// Outcome.
        outcome: ReleaseOutcome,
        /// Time.
        t: u64,
    },
    /// A waiting acquire (scenario 12) was seen in the key's queue of
    /// waiters: at `t` (a queue read's answer) it surely stood in line.
    Queued {
        /// Operation.
        op: u64,
        /// Time (the answer of the first queue read that listed it).
        t: u64,
    },
    /// A waiting acquire's entry (scenario 12) left the key's queue: the
    /// first queue read that no longer listed it answered at `t`. `handed`:
    /// the same read (atomic with it) found the lock key naming this
    /// waiter's token, i.e. a release or an expiry handed the key to it. A
    /// `Queued` line after this one means the waiter stood in line again.
    Left {
        /// Operation.
        op: u64,
        /// Time (the answer of the read).
        t: u64,
        /// The key was handed to this waiter.
        handed: bool,
        /// µs since the answer of the previous read of the queue (the reads
        /// follow each other within about 2 ms while the process runs: a
        /// long gap is a process the machine did not schedule).
        gap_us: u64,
    },
    /// The key handed to a waiting acquire (a `Left` line with `handed`)
    /// stopped naming it while its acquire was still pending: the hand-over's
    /// lease ran out before the waiter took the key up (its confirmation
    /// came too late), so it lost its turn.
    Lapsed {
        /// Operation.
        op: u64,
        /// Time (the answer of the first read that found the key not ours).
        t: u64,
        /// The longest gap between two reads of the watcher since the key
        /// was seen handed to it, µs (see `Left`).
        max_gap_us: u64,
    },
    /// The key's queue (a list) and its deadlines (a sorted set of the same
    /// entries) disagreed in one atomic read, while this acquire waited:
    /// the entries found in only one of them. Logged once per operation.
    QueueMismatch {
        /// Operation.
        op: u64,
        /// Time (the answer of the read).
        t: u64,
        /// Entries in the list, not in the sorted set.
        list_only: Vec<String>,
        /// Entries in the sorted set, not in the list.
        set_only: Vec<String>,
    },
    /// A try-once acquire (wait 0, scenario 12) was answered: `granted` (an
    /// `Acquired` line follows) or busy (the operation ends here).
    TryOnce {
        /// Operation.
        op: u64,
        /// The lock was taken.
        granted: bool,
        /// Time.
        t: u64,
    },
    /// The worker finished its share.
    Done {
        /// Time.
        t: u64,
    },
}

impl Event {
    /// The event's time.
    pub fn t(&self) -> u64 {
        match self {
            Event::Start { t, .. }
            | Event::Attempt { t, .. }
            | Event::AcquireError { t, .. }
            | Event::Acquired { t, .. }
            | Event::Token { t, .. }
            | Event::TokenRefused { t, .. }
            | Event::GaveUp { t, .. }
            | Event::Cancelled { t, .. }
            | Event::Read { t, .. }
            | Event::Blocked { t, .. }
            | Event::Write { t, .. }
            | Event::ReleaseSent { t, .. }
            | Event::Released { t, .. }
            | Event::Queued { t, .. }
            | Event::Left { t, .. }
            | Event::Lapsed { t, .. }
            | Event::QueueMismatch { t, .. }
            | Event::TryOnce { t, .. }
            | Event::Done { t } => *t,
        }
    }
}

/// What the harness did, in its own log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// A worker was stopped (SIGSTOP) from `start` to `end` (SIGCONT).
    StopWorker {
        /// Worker number.
        worker: u32,
        /// SIGSTOP time.
        start: u64,
        /// SIGCONT time.
        end: u64,
    },
    /// A worker was killed (SIGKILL) at `t`.
    KillWorker {
        /// Worker number.
        worker: u32,
        /// Time.
        t: u64,
    },
    /// The lock server was unavailable from `start` to `end` (paused or dead).
    Server {
        /// `"pause"` or `"kill"`.
        kind: String,
        /// Start.
        start: u64,
        /// Back (SIGCONT sent, or the restarted server answers).
        end: u64,
    },
    /// Redlock nodes `nodes` were dead (SIGKILL) from `start` until restarted
    /// empty at `end` (a minority: the lock must keep working).
    Nodes {
        /// Node numbers.
        nodes: Vec<u32>,
        /// Kill time.
        start: u64,
        /// Restart time.
        end: u64,
    },
    /// `CLIENT KILL TYPE <kind>` at `t`, closing `killed` connections.
    ClientKill {
        /// `normal` or `pubsub`.
        kind: String,
        /// Connections closed.
        killed: u64,
        /// Time.
        t: u64,
    },
}

/// Appends events to a file, one line each, written through at once (a
/// worker killed with SIGKILL loses no line it finished).
#[derive(Debug)]
pub struct LogWriter {
    out: LineWriter<File>,
}

impl LogWriter {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            out: LineWriter::new(File::create(path)?),
        })
    }

    /// Writes one event. A full disk is reported once by the caller; the
    /// checker then sees a truncated log.
    pub fn write<T: Serialize>(&mut self, event: &T) -> std::io::Result<()> {
        let line = serde_json::to_string(event).map_err(std::io::Error::other)?;
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(b"\n")
    }
}

/// Reads a JSON-lines file; a last line cut by a kill is ignored, any other
/// malformed line is an error.
pub fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Vec<T>> {
    let file = File::open(path)?;
    let lines: Vec<String> = BufReader::new(file).lines().collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(event) => out.push(event),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "{}:{}: {e}",
                    path.display(),
                    i + 1
                )));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        let events = vec![
            Event::Attempt {
                op: 1,
                key: "k:{a} ü".into(),
                more_keys: vec![],
                side: None,
                t: 5,
            },
            Event::Attempt {
                op: 2,
                key: "k1".into(),
                more_keys: vec!["k0".into()],
                side: Some(Side::Read),
                t: 6,
            },
            Event::Write {
                op: 1,
                key: Some("k1".into()),
                outcome: WriteOutcome::Accepted,
                seq: 3,
                lost_before: false,
                sent: 8,
                t: 9,
            },
        ];
        let mut w = LogWriter::create(&path).unwrap();
        for e in &events {
            w.write(e).unwrap();
        }
        drop(w);
        // A line cut by a kill at the end is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"ev\":\"acq")
            .unwrap();
        assert_eq!(read_lines::<Event>(&path).unwrap(), events);
    }

    #[test]
    fn clocks_of_one_epoch_agree_across_instances() {
        let epoch = monotonic_micros();
        let a = Clock::new(epoch);
        let b = Clock::new(epoch);
        let (x, y) = (a.now(), b.now());
        assert!(y >= x && y - x < 50_000, "{x} then {y}");
        assert!(a.now() >= y);
    }
}
