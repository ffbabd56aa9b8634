//! Group commit of a mutex's script calls on one connection handle, when
//! the client is built with `coalesce_scripts(true)` (off by default: every
//! call then takes its own turn at once).
//!
//! While no script call is in flight on a handle, an acquire, release or
//! extend goes out at once, alone, with its own script, exactly as it would
//! without batching: a lone request never waits. While one is in flight,
//! later ones queue; when it returns, everything queued goes out as ONE
//! `EVALSHA` of the batch script (scripts/batch.lua after the per-key
//! scripts wrapped as functions), one call per hash slot on a cluster. No
//! timer is involved: a batch is whatever arrived during the previous call.
//!
//! Each caller gets its own op's answer (a busy key does not fail the
//! others) and does with it what it does after its own script's answer. An
//! error of the whole call reaches every caller in it. A caller dropped
//! while its op is still queued is left out of the batch; one dropped after
//! the batch went out is in the position of a caller dropped with its own
//! script in flight, which the client already handles (the acquisition's
//! clean-up releases with its token in the background).
//!
//! Not batched (sent alone, as before): leader elections' calls (six keys),
//! read-write locks, semaphores, `lock_all`, fencing-token reservations, and
//! every call on a Redlock node (whose calls race a per-node timeout).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::super::conn::Conn;
use super::super::scripts::{ACQUIRE, EXTEND, RELEASE, evalsha, run_script};
use super::replicas::{Unreplicated, wait_for_replicas};

/// The batch script: the per-key scripts' texts, unchanged, as functions,
/// then the loop that runs each op (scripts/batch.lua).
pub(super) static BATCH: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        "local function acquire(KEYS, ARGV)\n",
        include_str!("../../../scripts/acquire.lua"),
        "\nend\nlocal function release(KEYS, ARGV)\n",
        include_str!("../../../scripts/release.lua"),
        "\nend\nlocal function extend(KEYS, ARGV)\n",
        include_str!("../../../scripts/extend.lua"),
        "\nend\n",
        include_str!("../../../scripts/batch.lua"),
    ))
});

/// Which per-key script an op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    Acquire,
    Release,
    Extend,
}

impl OpKind {
    fn letter(self) -> &'static str {
        match self {
            OpKind::Acquire => "a",
            OpKind::Release => "r",
            OpKind::Extend => "e",
        }
    }

    /// `true` when `answer` says this op wrote a lease replicas must
    /// acknowledge (acquired, or extended).
    fn wrote_lease(self, answer: &redis::Value) -> bool {
        match self {
            OpKind::Acquire => matches!(answer, redis::Value::Int(n) if *n > 0),
            OpKind::Extend => matches!(answer, redis::Value::Int(1)),
            OpKind::Release => false,
        }
    }
}

/// One queued call: its script, keys and arguments as its own script
/// takes them.
pub(super) struct Op {
    pub(super) kind: OpKind,
    /// The keys' hash slot (a cluster runs one call per slot).
    pub(super) slot: u16,
    pub(super) keys: Vec<String>,
    /// The script's arguments, each as the bytes sent.
    pub(super) args: Vec<Vec<u8>>,
}

/// Why a batched op has no answer.
#[derive(Debug)]
pub(super) enum OpError {
    /// The whole call failed (connection, timeout, the server refused it):
    /// what the op's own script call would have failed with.
    Call(redis::RedisError),
    /// This op's script raised an error; the others ran.
    Script(String),
}

/// A batched op's outcome.
pub(super) struct Reply {
    pub(super) answer: Result<redis::Value, OpError>,
    /// With replica acks: the `WAIT` sent once after the batch (when any op
    /// in it wrote a lease): `Err(..)` when too few replicas acked.
    /// `Ok(())` when none are asked for.
    pub(super) replicated: Result<(), Unreplicated>,
}

struct Queued {
    op: Op,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct BatchQueue {
    /// A script call (alone, or a batch) is in flight on this handle.
    in_flight: bool,
    queue: Vec<Queued>,
}

/// Batched calls and ops so far, and the largest batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BatchStats {
    /// Batch script calls sent.
    pub(crate) calls: u64,
    /// Ops they carried.
    pub(crate) ops: u64,
    /// The most ops one call carried.
    pub(crate) largest: u64,
}

/// The group commit of one connection handle.
pub(super) struct Batcher {
    conn: Conn,
    replica_acks: Option<(u32, Duration)>,
    /// `false`: every call goes out alone (the builder's default).
    coalesce: bool,
    state: Mutex<BatchQueue>,
    calls: AtomicU64,
    ops: AtomicU64,
    largest: AtomicU64,
}

/// Holds a handle's turn while a lone call is in flight; dropping it (the
/// answer came, or the caller went away) sends whatever queued meanwhile.
pub(crate) struct Turn(Arc<Batcher>);

impl Drop for Turn {
    fn drop(&mut self) {
        if self.0.coalesce {
            self.0.clone().pass_on();
        }
    }
}

impl Batcher {
    pub(super) fn new(
        conn: Conn,
        replica_acks: Option<(u32, Duration)>,
        coalesce: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            conn,
            replica_acks,
            coalesce,
            state: Mutex::default(),
            calls: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            largest: AtomicU64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BatchQueue> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle's turn when nothing is in flight on it: the caller sends
    /// its own script now and holds the [`Turn`] until the answer.
    /// Without coalescing every caller gets a turn of its own at once (and
    /// nothing ever queues).
    pub(super) fn try_turn(self: &Arc<Self>) -> Option<Turn> {
        if !self.coalesce {
            return Some(Turn(self.clone()));
        }
        let mut state = self.state();
        if state.in_flight {
            return None;
        }
        state.in_flight = true;
        Some(Turn(self.clone()))
    }

    /// Queues `op` behind the call in flight, and waits for its answer. If
    /// that call ended meanwhile, the op goes out at once (a batch of one).
    pub(super) async fn submit(self: &Arc<Self>, op: Op) -> Reply {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = self.state();
            state.queue.push(Queued { op, reply });
            !std::mem::replace(&mut state.in_flight, true)
        };
        if start {
            self.clone().pass_on();
        }
        answer.await.unwrap_or_else(|_| Reply {
            answer: Err(OpError::Call(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the batch carrying this call was dropped before its answer (the runtime shut down)",
            )))),
            replicated: Ok(()),
        })
    }

    /// The call in flight ended: sends what queued meanwhile, or frees the
    /// handle when nothing did.
    fn pass_on(self: Arc<Self>) {
        {
            let mut state = self.state();
            if state.queue.is_empty() {
                state.in_flight = false;
                return;
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let mut flushing = Flushing(Some(self));
                    if let Some(batcher) = &flushing.0 {
                        batcher.flush().await;
                    }
                    flushing.0 = None;
                });
            }
            // No runtime to send on (it is shutting down): the queued callers
            // get an error instead of waiting for ever.
            Err(_) => self.abandon(),
        }
    }

    /// Frees the handle and drops the queue (its callers get an error).
    fn abandon(&self) {
        let mut state = self.state();
        state.in_flight = false;
        state.queue.clear();
    }

    /// Sends batches until nothing is queued, then frees the handle.
    async fn flush(&self) {
        loop {
            let queued = {
                let mut state = self.state();
                if state.queue.is_empty() {
                    state.in_flight = false;
                    return;
                }
                std::mem::take(&mut state.queue)
            };
            // Callers that went away before their op was sent: left out.
            let queued: Vec<Queued> = queued
                .into_iter()
                .filter(|q| !q.reply.is_closed())
                .collect();
            if queued.is_empty() {
                continue;
            }
            if matches!(self.conn, Conn::Cluster(_)) {
                let mut by_slot: BTreeMap<u16, Vec<Queued>> = BTreeMap::new();
                for q in queued {
                    by_slot.entry(q.op.slot).or_default().push(q);
                }
                futures_util::future::join_all(by_slot.into_values().map(|q| self.send(q))).await;
            } else {
                self.send(queued).await;
            }
        }
    }

    /// One op alone: its own script (cheaper than a batch of one).
    async fn send_one(&self, q: Queued) {
        let script = match q.op.kind {
            OpKind::Acquire => &*ACQUIRE,
            OpKind::Release => &*RELEASE,
            OpKind::Extend => &*EXTEND,
        };
        let bytes = q.op.keys.iter().map(String::len).sum::<usize>()
            + q.op.args.iter().map(Vec::len).sum::<usize>();
        let mut cmd = evalsha(
            script,
            q.op.keys.len(),
            q.op.keys.len() + q.op.args.len(),
            bytes,
        );
        for key in &q.op.keys {
            cmd.arg(key);
        }
        for arg in &q.op.args {
            cmd.arg(arg);
        }
        let mut conn = self.conn.clone();
        let answer: redis::RedisResult<redis::Value> = run_script(&mut conn, script, &cmd).await;
        let replicated = match (&answer, self.replica_acks) {
            (Ok(a), Some(acks)) if q.op.kind.wrote_lease(a) => wait_for_replicas(&mut conn, acks)
                .await
                .map_err(Unreplicated::from),
            _ => Ok(()),
        };
        let _ = q.reply.send(Reply {
            answer: answer.map_err(OpError::Call),
            replicated,
        });
    }

    /// One batch script call for `queued`, and each caller's answer.
    async fn send(&self, mut queued: Vec<Queued>) {
        if queued.len() == 1 {
            if let Some(q) = queued.pop() {
                self.send_one(q).await;
            }
            return;
        }
        let keys: usize = queued.iter().map(|q| q.op.keys.len()).sum();
        let args: usize = queued.iter().map(|q| 3 + q.op.args.len()).sum::<usize>() + 1;
        let bytes: usize = queued
            .iter()
            .map(|q| {
                q.op.keys.iter().map(String::len).sum::<usize>()
                    + q.op.args.iter().map(Vec::len).sum::<usize>()
                    + 8
            })
            .sum();
        let mut cmd = evalsha(&BATCH, keys, keys + args, bytes + 8);
        for q in &queued {
            for key in &q.op.keys {
                cmd.arg(key);
            }
        }
        cmd.arg(queued.len());
        for q in &queued {
            cmd.arg(q.op.kind.letter())
                .arg(q.op.keys.len())
                .arg(q.op.args.len());
            for arg in &q.op.args {
                cmd.arg(arg);
            }
        }
        let n = queued.len() as u64;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(n, Ordering::Relaxed);
        self.largest.fetch_max(n, Ordering::Relaxed);
        let mut conn = self.conn.clone();
        let answer: redis::RedisResult<redis::Value> = run_script(&mut conn, &BATCH, &cmd).await;
        let answers = match answer {
            Ok(redis::Value::Array(items)) if items.len() == queued.len() => items,
            Ok(_) => {
                let e = redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "batched lock call: wrong number of answers",
                ));
                return self.fail_all(queued, &e);
            }
            Err(e) => return self.fail_all(queued, &e),
        };
        let wrote = queued
            .iter()
            .zip(&answers)
            .any(|(q, a)| q.op.kind.wrote_lease(a));
        let replicated = match self.replica_acks {
            Some(acks) if wrote => wait_for_replicas(&mut conn, acks)
                .await
                .map_err(Unreplicated::from),
            _ => Ok(()),
        };
        for (q, answer) in queued.into_iter().zip(answers) {
            let answer = match answer {
                redis::Value::BulkString(s) if s.starts_with(b"ERR ") => Err(OpError::Script(
                    String::from_utf8_lossy(&s[4..]).into_owned(),
                )),
                answer => Ok(answer),
            };
            let _ = q.reply.send(Reply {
                answer,
                replicated: replicated.clone(),
            });
        }
    }

    fn fail_all(&self, queued: Vec<Queued>, e: &redis::RedisError) {
        for q in queued {
            let _ = q.reply.send(Reply {
                answer: Err(OpError::Call(e.clone())),
                replicated: Ok(()),
            });
        }
    }

    pub(super) fn stats(&self) -> BatchStats {
        BatchStats {
            calls: self.calls.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }
}

/// The flushing task's hold on its handle: if the task is dropped before it
/// ends (its runtime shut down), the handle is freed and the queue dropped,
/// so callers on another runtime do not queue behind it for ever.
struct Flushing(Option<Arc<Batcher>>);

impl Drop for Flushing {
    fn drop(&mut self) {
        if let Some(batcher) = self.0.take() {
            batcher.abandon();
        }
    }
}
