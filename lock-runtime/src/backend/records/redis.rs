//! Records on Redis: a plain `SET NX` for a fresh claim, one script for
//! every other step, and on Redlock a majority of nodes.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use futures_util::future::join_all;

use super::value::{Value, completed};
use super::{Claim, Ours, StoredResponse};
use crate::backend::conn::Conn;
use crate::backend::redis::Native;
use crate::backend::redis::RedisBackend;
use crate::backend::redlock::{RedlockBackend, majority};
use crate::backend::scripts::{evalsha, millis, run_script};
use crate::error::{BackendError, LockError};
use crate::key::slot;
use crate::token::Token;

static CLAIM: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../scripts/idempotency_claim.lua")));
static RENEW_MANY: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(include_str!("../../../scripts/idempotency_renew_many.lua"))
});
/// Completes (with a response) or releases (without) a record we ran.
static SETTLE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../scripts/idempotency_settle.lua")));

/// Claims a record on one node: a plain `SET <record> run:<owner>:<fp> NX
/// PX <lease>` takes a free key (one command, no script: the common case);
/// only when the key exists does the claim script read what it holds (our
/// own claim whose reply was lost, another's in flight, completed, another
/// fingerprint) and decide, atomically.
pub(super) async fn claim_on(
    node: &RedisBackend,
    ours: &Ours,
    waiting: bool,
) -> Result<Claim, LockError> {
    let mut conn = node.connection();
    let (record, value) = (&ours.names.record, Value::claim(ours));
    // Sized once: grown from empty, the command was copied three times.
    let set: Option<()> = redis::Cmd::with_capacity(6, record.len() + value.len_hint() + 32)
        .arg("SET")
        .arg(record)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(millis(ours.ttl))
        .query_async(&mut conn)
        .await
        .map_err(|e| BackendError::with_source("idempotency claim failed", e))?;
    if set.is_some() {
        return replicated_claim(node, ours, &mut conn).await;
    }
    let (code, remaining, record): (i64, i64, Vec<u8>) = CLAIM
        .key(record)
        .arg(ours.token)
        .arg(&ours.fingerprint)
        .arg(millis(ours.ttl))
        .arg(if waiting { "1" } else { "" })
        .invoke_async(&mut conn)
        .await
        .map_err(|e| BackendError::with_source("idempotency claim failed", e))?;
    Ok(match code {
        0 => return replicated_claim(node, ours, &mut conn).await,
        1 => Claim::InFlight {
            remaining: Duration::from_millis(u64::try_from(remaining).unwrap_or(0)),
        },
        2 => Claim::Done(completed(record.into()).ok_or_else(|| {
            BackendError::new("idempotency claim: the completed record cannot be read")
        })?),
        3 => Claim::Mismatch,
        other => {
            return Err(BackendError::new(format!(
                "idempotency claim: unexpected reply code {other}"
            ))
            .into());
        }
    })
}

/// A claim that took the record (or found ours): with replica acks
/// (`min_replica_acks`), once enough replicas acknowledged it. Too few give
/// the record back before saying so, as a lock's acquire does (a claim
/// lost in a failover would let a duplicate run the work); on Sentinel the
/// master is then asked of the sentinels again, and a claim that waits is
/// sent again (`Retry::ACQUIRE`).
async fn replicated_claim(
    node: &RedisBackend,
    ours: &Ours,
    conn: &mut Conn,
) -> Result<Claim, LockError> {
    if node.needs_confirmation()
        && let Err(e) = node.acknowledged(conn).await
    {
        let _ = release_on(node, ours).await;
        node.suspect_master(&e);
        return Err(e);
    }
    Ok(Claim::Claimed)
}

/// Re-arms the leases of records we run, in one script call per hash slot
/// (one call in all on a single server); `true` where re-armed (or already
/// completed by us).
pub(super) async fn renew_many_on(
    node: &RedisBackend,
    leases: &[(&str, &Token, Duration)],
) -> Result<Vec<bool>, LockError> {
    if !node.is_cluster() {
        return renew_batch(node, leases).await;
    }
    // A cluster runs a script only on keys of one slot: one call per slot.
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, (record, ..)) in leases.iter().enumerate() {
        by_slot.entry(slot(record)).or_default().push(i);
    }
    let answers = join_all(by_slot.values().map(|indices| {
        let group: Vec<_> = indices.iter().map(|i| leases[*i]).collect();
        async move { renew_batch(node, &group).await }
    }))
    .await;
    let mut renewed = vec![false; leases.len()];
    for (indices, answer) in by_slot.values().zip(answers) {
        for (i, r) in indices.iter().zip(answer?) {
            renewed[*i] = r;
        }
    }
    Ok(renewed)
}

async fn renew_batch(
    node: &RedisBackend,
    leases: &[(&str, &Token, Duration)],
) -> Result<Vec<bool>, LockError> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let mut invocation = RENEW_MANY.prepare_invoke();
    for (record, token, lease) in leases {
        invocation.key(*record).arg(*token).arg(millis(*lease));
    }
    let renewed: Vec<i64> = invocation
        .invoke_async(&mut node.connection())
        .await
        .map_err(|e| BackendError::with_source("idempotency renewal failed", e))?;
    if renewed.len() != leases.len() {
        return Err(BackendError::new("idempotency renewal: wrong number of answers").into());
    }
    Ok(renewed.into_iter().map(|r| r == 1).collect())
}

pub(super) async fn complete_on(
    node: &RedisBackend,
    ours: &Ours,
    response: &StoredResponse,
) -> Result<bool, LockError> {
    let stored = Value {
        response: Some(response),
        ..Value::claim(ours)
    };
    let completed = settle(node, ours, Some(stored))
        .await
        .map_err(|e| BackendError::with_source("idempotency completion failed", e))?;
    // With replica acks, a completion is answered once replicas hold it
    // (lost in a failover, a retry would run the work again); too few make
    // the outcome unknown, and sending it again is safe.
    if completed && node.needs_confirmation() {
        node.replicated(&mut node.connection()).await?;
    }
    Ok(completed)
}

pub(super) async fn release_on(node: &RedisBackend, ours: &Ours) -> Result<bool, LockError> {
    settle(node, ours, None)
        .await
        .map_err(|e| BackendError::with_source("idempotency release failed", e).into())
}

/// Settles the record `ours` claimed on `node`: stores `stored` (the
/// completed value, kept for the record's retention), or without it
/// releases the record. `true` when it was done.
///
/// Where the server compares for itself (`SET .. IFEQ` and `DELIFEQ` on
/// Valkey 9, `SET .. IFEQ` and `DELEX .. IFEQ` on Redis 8.4; found with the
/// locks' plain path), a record nobody waits on
/// (still exactly our claim's value) is settled by that one command, as a
/// hand-written store would be. Anything else (a duplicate marked it
/// `waited`, a completion sent again, a record not ours) goes to the settle
/// script, which announces itself on the record's notice channel.
async fn settle(
    node: &RedisBackend,
    ours: &Ours,
    stored: Option<Value<'_>>,
) -> redis::RedisResult<bool> {
    let stored = stored.map(|value| (ours.retention, value));
    let (record, claim) = (&ours.names.record, Value::claim(ours));
    let native = node.native();
    if native != Native::None && settled_natively(node, native, record, claim, stored).await? {
        return Ok(true);
    }
    settle_by_script(node, record, claim, &ours.names.notice, stored).await
}

/// `SET record stored IFEQ claim PX retention`, or without `stored`
/// `DELIFEQ record claim` (`DELEX record IFEQ claim`): `true` when the
/// record held exactly `claim`. A command refused (an ACL, a proxy) is
/// `false`, and turns the native commands off for this server, as for
/// locks.
async fn settled_natively(
    node: &RedisBackend,
    native: Native,
    record: &str,
    claim: Value<'_>,
    stored: Option<(Duration, Value<'_>)>,
) -> redis::RedisResult<bool> {
    let bytes = record.len() + claim.len_hint() + 64;
    let cmd = match stored {
        Some((retention, value)) => {
            let mut cmd = redis::Cmd::with_capacity(7, bytes + value.len_hint());
            cmd.arg("SET").arg(record).arg(value).arg("IFEQ").arg(claim);
            cmd.arg("PX").arg(millis(retention));
            cmd
        }
        None => match native.delete_if_equal(record, claim, bytes) {
            Some(cmd) => cmd,
            None => return Ok(false),
        },
    };
    match cmd
        .query_async::<redis::Value>(&mut node.connection())
        .await
    {
        Ok(redis::Value::Okay | redis::Value::Int(1)) => Ok(true),
        Ok(_) => Ok(false),
        Err(e) if node.refused_native(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The settle script (see [`settle`]): `true` when it answered 1.
async fn settle_by_script(
    node: &RedisBackend,
    record: &str,
    claim: Value<'_>,
    notice: &str,
    stored: Option<(Duration, Value<'_>)>,
) -> redis::RedisResult<bool> {
    // The claim as it was written: the script finds it by comparing the
    // record with it whole, building no string (every request that ran
    // settles). One command built in place (`evalsha`), not the driver's
    // `ScriptInvocation`, which copies each argument into a vector of its
    // own and then into the command.
    let value_len = stored.as_ref().map_or(0, |(_, value)| value.len_hint());
    let bytes = record.len() + claim.len_hint() + notice.len() + value_len + 160;
    let mut call = evalsha(&SETTLE, 1, 5, bytes);
    call.arg(record).arg(claim).arg(node.notice_arg(notice));
    if let Some((retention, value)) = stored {
        call.arg(millis(retention)).arg(value);
    }
    let done: i64 = run_script(&mut node.connection(), &SETTLE, &call).await?;
    Ok(done == 1)
}

/// Runs `op` on every Redlock node at once, each bounded by the node timeout:
/// one answer per node, `None` where it failed or was too slow.
pub(super) async fn on_every_node<'a, T, F, Fut>(
    redlock: &'a RedlockBackend,
    op: F,
) -> Vec<Option<T>>
where
    F: Fn(&'a RedisBackend) -> Fut,
    Fut: Future<Output = Result<T, LockError>>,
{
    let per_node = redlock.node_timeout();
    join_all(
        redlock
            .nodes()
            .iter()
            .map(|node| tokio::time::timeout(per_node, op(node))),
    )
    .await
    .into_iter()
    .map(|answer| match answer {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "idempotency: a Redlock node failed"
            );
            None
        }
        Err(_) => {
            tracing::debug!("idempotency: a Redlock node did not answer in time");
            None
        }
    })
    .collect()
}

/// `true` when a majority of nodes said `true`; `false` only when so many
/// said `false` that no majority can say `true`; otherwise (too few answers to
/// tell: a lost reply may have been a `true`) an error, so the caller treats
/// the outcome as unknown rather than as a refusal.
pub(super) fn majority_says(
    redlock: &RedlockBackend,
    answers: &[Option<bool>],
    what: &str,
) -> Result<bool, LockError> {
    match majority(answers, redlock.quorum()) {
        Some(decided) => Ok(decided),
        None => Err(no_majority(redlock, answers.iter().flatten().count(), what)),
    }
}

/// Too few nodes answered to tell: the step's outcome is unknown (it may be
/// sent again).
pub(super) fn no_majority(redlock: &RedlockBackend, answered: usize, what: &str) -> LockError {
    BackendError::outcome_unknown(
        format!(
            "Redlock: {answered} of {} nodes answered the idempotency {what}, without \
         a majority of {} either way",
            redlock.nodes().len(),
            redlock.quorum()
        ),
        None,
    )
    .into()
}

/// A claim on Redlock: the record is ours only with a majority of nodes, and
/// a stored response (or another request's fingerprint) on any node wins over
/// that, so a response stored on a majority is found by any later majority,
/// and one that reached only a minority is still replayed rather than run
/// again. A claim that is not ours is undone on every node before answering.
pub(super) async fn claim_on_majority(
    redlock: &RedlockBackend,
    ours: &Ours,
    waiting: bool,
) -> Result<Claim, LockError> {
    let answers = on_every_node(redlock, |n| claim_on(n, ours, waiting)).await;
    let quorum = redlock.quorum();
    let mut claimed = 0;
    let mut in_flight: Option<Duration> = None;
    let mut decided = None;
    for answer in answers.iter().flatten() {
        match answer {
            Claim::Claimed => claimed += 1,
            Claim::InFlight { remaining } => {
                in_flight = Some(in_flight.map_or(*remaining, |r| r.min(*remaining)));
            }
            // A stored response outranks another request's fingerprint.
            Claim::Done(_) => decided = Some(answer.clone()),
            Claim::Mismatch => decided = decided.or(Some(Claim::Mismatch)),
        }
    }
    let answered = answers.iter().flatten().count();
    let outcome = match decided {
        Some(claim) => Ok(claim),
        None if claimed >= quorum => return Ok(Claim::Claimed),
        None if answered < quorum => Err(no_majority(redlock, answered, "claim")),
        // A majority answered and not all of it is ours: someone else holds
        // the rest.
        None => Ok(Claim::InFlight {
            remaining: in_flight.unwrap_or(Duration::from_millis(1)),
        }),
    };
    if claimed > 0 {
        // Best effort: a copy left behind only blocks its node for a lease.
        // The release announces itself: a duplicate that saw our copies in
        // flight (a split vote) tries again now rather than after a lease.
        on_every_node(redlock, |n| release_on(n, ours)).await;
    }
    outcome
}
