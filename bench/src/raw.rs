//! The raw redis-rs baseline: what a careful user would write by hand with no
//! lock library, on one multiplexed connection.
//!
//! Acquire is `SET key value NX PX 30000`; release is an `EVALSHA` of a
//! compare-and-delete script (loaded once with `SCRIPT LOAD`). Values are
//! 32 hex digits, like the library's 128-bit tokens.

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};

/// Deletes `KEYS[1]` only if it still holds `ARGV[1]`.
const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) end return 0";

/// The same, then publishes a release notice on `ARGV[2]` (the pub/sub handoff
/// baseline).
const COMPARE_DELETE_PUBLISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0";

/// The least a fenced acquire can be: `SET NX PX` and `INCR` of the key's
/// counter in one step (the counter, or minus the holder's `PTTL`).
pub(crate) const FENCED_MINIMUM: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return redis.call('INCR', KEYS[2]) end return -redis.call('PTTL', KEYS[1])";

/// The library's own acquire and release scripts, sent by hand in row 1's
/// informational line: what a pair costs with no client code around it.
pub(crate) const LIBRARY_ACQUIRE: &str = include_str!("../../lock-runtime/scripts/acquire.lua");
pub(crate) const LIBRARY_RELEASE: &str = include_str!("../../lock-runtime/scripts/release.lua");

/// `SCRIPT LOAD src` on `conn`: the script's SHA1, for `EVALSHA`.
pub(crate) async fn load_script(
    conn: &mut impl ConnectionLike,
    src: &str,
) -> Result<String, String> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(src)
        .query_async(conn)
        .await
        .map_err(|e| format!("SCRIPT LOAD: {e}"))
}

/// What a raw side sends on: one multiplexed connection (the baselines), or
/// redis-rs's `ConnectionManager` over one, which reconnects as the
/// library's connection does.
pub(crate) trait RawConn: ConnectionLike + Clone + Send + Sync + 'static {}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RawConn for C {}

/// A connection and the scripts' SHA1s. Clones share the connection.
#[derive(Clone)]
pub(crate) struct Raw<C = MultiplexedConnection> {
    conn: C,
    del_sha: String,
    del_pub_sha: String,
    lib_acquire_sha: String,
    lib_release_sha: String,
    fenced_sha: String,
    /// Prepended to every key, so runs against a shared server do not collide.
    pub(crate) prefix: String,
}

impl Raw {
    /// The baselines' connection: one multiplexed connection.
    pub(crate) async fn connect(client: &redis::Client, prefix: &str) -> Result<Self, String> {
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("raw connection: {e}"))?;
        Self::on(conn, prefix).await
    }
}

impl Raw<ConnectionManager> {
    /// A `ConnectionManager` configured as the library's (its default
    /// connect and response timeouts, two reconnect attempts at most 500 ms
    /// apart): what the raw pair costs on the connection the library sends on.
    pub(crate) async fn connect_managed(
        client: &redis::Client,
        prefix: &str,
    ) -> Result<Self, String> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
            .set_response_timeout(Some(std::time::Duration::from_secs(1)))
            .set_number_of_retries(2)
            .set_max_delay(std::time::Duration::from_millis(500));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| format!("raw connection manager: {e}"))?;
        Self::on(conn, prefix).await
    }
}

impl<C: RawConn> Raw<C> {
    /// One `HSET` of `field` on `key`, as the unfenced baseline of a fenced
    /// write.
    pub(crate) async fn hset(&mut self, key: &str, field: u64) -> Result<(), String> {
        redis::cmd("HSET")
            .arg(key)
            .arg("paid_by")
            .arg(field)
            .exec_async(&mut self.conn)
            .await
            .map_err(|e| format!("HSET: {e}"))
    }

    /// The same `HSET` through `lock_runtime::fence::redis`, with `token`.
    pub(crate) async fn fenced_hset(
        &mut self,
        key: &str,
        token: u64,
        field: u64,
    ) -> Result<(), String> {
        lock_runtime::fence::redis(&mut self.conn, key, token)
            .cmd(redis::cmd("HSET").arg(key).arg("paid_by").arg(field))
            .run()
            .await
            .map(drop)
            .map_err(|e| format!("fenced HSET: {e}"))
    }

    /// Loads the scripts on `conn`.
    async fn on(mut conn: C, prefix: &str) -> Result<Self, String> {
        let del_sha = load_script(&mut conn, COMPARE_AND_DELETE).await?;
        let del_pub_sha = load_script(&mut conn, COMPARE_DELETE_PUBLISH).await?;
        let lib_acquire_sha = load_script(&mut conn, LIBRARY_ACQUIRE).await?;
        let lib_release_sha = load_script(&mut conn, LIBRARY_RELEASE).await?;
        let fenced_sha = load_script(&mut conn, FENCED_MINIMUM).await?;
        Ok(Self {
            conn,
            del_sha,
            del_pub_sha,
            lib_acquire_sha,
            lib_release_sha,
            fenced_sha,
            prefix: prefix.to_string(),
        })
    }

    /// The full key for `name`.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// `SET key value NX PX 30000`: `true` when taken.
    pub(crate) async fn try_set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let reply: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("raw SET: {e}"))?;
        Ok(reply.is_some())
    }

    /// `EVALSHA` compare-and-delete: `true` when it was ours.
    pub(crate) async fn release(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let mut script = redis::cmd("EVALSHA");
        script.arg(&self.del_sha).arg(1).arg(key).arg(value);
        self.deleted(script).await
    }

    /// Compare-and-delete, then `PUBLISH channel`.
    pub(crate) async fn release_publish(
        &mut self,
        key: &str,
        value: &str,
        channel: &str,
    ) -> Result<bool, String> {
        let mut script = redis::cmd("EVALSHA");
        script
            .arg(&self.del_pub_sha)
            .arg(1)
            .arg(key)
            .arg(value)
            .arg(channel);
        self.deleted(script).await
    }

    /// Runs a compare-and-delete `EVALSHA`: `true` when the key was ours.
    async fn deleted(&mut self, script: redis::Cmd) -> Result<bool, String> {
        let n: i64 = script
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("raw EVALSHA: {e}"))?;
        Ok(n == 1)
    }

    /// One uncontended acquire + release; an error if the key was not free.
    /// The least fenced pair by hand: [`FENCED_MINIMUM`] (a token from
    /// `counter`), then the compare-and-delete.
    pub(crate) async fn fenced_pair(
        &mut self,
        key: &str,
        counter: &str,
        value: &str,
    ) -> Result<(), String> {
        let token: i64 = redis::cmd("EVALSHA")
            .arg(&self.fenced_sha)
            .arg(2)
            .arg(key)
            .arg(counter)
            .arg(value)
            .arg(30_000)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("raw fenced acquire: {e}"))?;
        if token <= 0 {
            return Err(format!("raw fenced baseline: {key} was unexpectedly held"));
        }
        if !self.release(key, value).await? {
            return Err(format!(
                "raw fenced baseline: {key} was not ours at release"
            ));
        }
        Ok(())
    }

    pub(crate) async fn pair(&mut self, key: &str, value: &str) -> Result<(), String> {
        if !self.try_set(key, value).await? {
            return Err(format!("raw baseline: {key} was unexpectedly held"));
        }
        if !self.release(key, value).await? {
            return Err(format!("raw baseline: {key} was not ours at release"));
        }
        Ok(())
    }
}

impl<C: RawConn> Raw<C> {
    /// The names the library gives the key `name` ([`library_names`]).
    pub(crate) fn library_names(&self, name: &str) -> [String; 5] {
        library_names(&self.prefix, name)
    }

    /// One uncontended pair of the library's own scripts, as the library
    /// sends them for a try-once `lock(name)` on one server, on `names`
    /// ([`Raw::library_names`], built once outside the timing), with none of
    /// the client's work around them.
    pub(crate) async fn scripted_pair(
        &mut self,
        names: &[String; 5],
        value: &str,
    ) -> Result<(), String> {
        let fencing: i64 = redis::cmd("EVALSHA")
            .arg(&self.lib_acquire_sha)
            .arg(4)
            .arg(&names[..4])
            .arg(acquire_args(names, value))
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("library acquire script: {e}"))?;
        if fencing <= 0 {
            return Err(format!("scripted pair: {} was unexpectedly held", names[0]));
        }
        let released: redis::Value = redis::cmd("EVALSHA")
            .arg(&self.lib_release_sha)
            .arg(4)
            .arg(&names[..4])
            .arg(release_args(names, value))
            .query_async(&mut self.conn)
            .await
            .map_err(|e| format!("library release script: {e}"))?;
        if released != redis::Value::Int(1) {
            return Err(format!(
                "scripted pair: {} was not ours at release",
                names[0]
            ));
        }
        Ok(())
    }
}

/// A 32-hex-digit value unique to `(task, n)`, like a 128-bit token.
pub(crate) fn value(task: u64, n: u64) -> String {
    format!("{task:016x}{n:016x}")
}

/// The names the library gives the key `name` under `prefix`: the lock, the
/// slot's fencing counter, the queue, the queue's deadlines, and last the
/// notice argument of its scripts (`PUBLISH <channel>`).
pub(crate) fn library_names(prefix: &str, name: &str) -> [String; 5] {
    ["L", "S", "Q", "D", "N"].map(|kind| match kind {
        "N" => format!("PUBLISH {prefix}N{{{name}}}"),
        _ => format!("{prefix}{kind}{{{name}}}"),
    })
}

/// acquire.lua's arguments after its four keys, as the library sends them
/// for a try-once lock (30 s lease) on one server: the token, the lease and
/// the notice argument (the wait is left out: try once).
pub(crate) fn acquire_args<'a>(names: &'a [String; 5], token: &'a str) -> (&'a str, u32, &'a str) {
    (token, 30_000, &names[4])
}

/// release.lua's arguments after its four keys, as the library sends them
/// for a lock that never queued: the token and the notice argument.
pub(crate) fn release_args<'a>(names: &'a [String; 5], token: &'a str) -> (&'a str, &'a str) {
    (token, &names[4])
}

/// The library's settle script (a record's completion), as it ships.
pub(crate) const LIBRARY_SETTLE: &str =
    include_str!("../../lock-runtime/scripts/idempotency_settle.lua");

/// The owner-checked store: the response, only over our own claim.
pub(crate) const CHECKED_STORE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end return 0";

/// How long a completed record is kept (the library's default, 24 h), in ms.
pub(crate) const RETENTION_MS: u32 = 86_400_000;

/// The request fingerprint the library's record commands carry, sent by
/// hand: as long as the library's (a SHA-256 in hex), not computed.
const FINGERPRINT: &str = "5f1e0c2a9b3d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7";

/// The names the library gives the record of Idempotency-Key `key` under
/// `prefix`, where it has a SHA-256 in hex (64 digits): the record and its
/// notice channel.
pub(crate) fn library_record_names(prefix: &str, key: &str) -> (String, String) {
    let hash = format!("{key:0>64}");
    let name = |role: &str| format!("{prefix}{role}{{{hash}}}");
    (name("I"), name("N"))
}

/// A token of the library's shape for the counter `n`: 32 hex digits, a
/// client id of 12 and a draw time of 11, dotted (57 characters).
pub(crate) fn library_token(n: u64) -> String {
    format!("{n:032x}.5f1e0c2a9b3d.19af0c2e1b4")
}

/// Checks that [`library_token`] still has the length of the tokens the
/// library writes (read back from the key of a lock `lib` holds, named
/// under `lib_prefix`), so the sides that send the library's commands by
/// hand send what it sends.
pub(crate) async fn check_library_token(
    lib: &lock_runtime::LockClient,
    lib_prefix: &str,
    conn: &mut MultiplexedConnection,
) -> Result<(), String> {
    let name = "token-shape";
    let guard = lib.lock(name).acquire().await.map_err(|e| e.to_string())?;
    let key = &library_names(lib_prefix, name)[0];
    let held: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .map_err(|e| format!("reading {key}: {e}"))?;
    guard.release().await.map_err(|e| e.to_string())?;
    let (written, mirrored) = (held.map_or(0, |t| t.len()), library_token(0).len());
    if written == mirrored {
        Ok(())
    } else {
        Err(format!(
            "the library's tokens are {written} characters, raw::library_token makes \
             {mirrored}: update it"
        ))
    }
}

/// The value the library's claim (`SET <record> <value> NX PX`) writes for
/// `owner` (a token of the library's length: [`library_token`]).
pub(crate) fn library_claim(owner: &str) -> String {
    format!("run:{owner}:{FINGERPRINT}")
}

/// idempotency_settle.lua's arguments after its key, as the library sends
/// them to store a response of `status` with one `content-type:
/// application/json` header and `body`, for `owner`, announced on
/// `notice`: the claim as written, how notices go, the retention and the
/// completed record.
pub(crate) fn library_settle_args(
    owner: &str,
    notice: &str,
    status: u16,
    body: &[u8],
) -> (String, String, u32, Vec<u8>) {
    let headers = "content-type:application/json\n";
    let mut record = format!(
        "done:{owner}:{FINGERPRINT}:{status}:0:{}:{headers}",
        headers.len()
    )
    .into_bytes();
    record.extend_from_slice(body);
    (
        library_claim(owner),
        format!("PUBLISH {notice}"),
        RETENTION_MS,
        record,
    )
}
