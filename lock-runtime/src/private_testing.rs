use std::time::Duration;

use crate::{client::LockClient, error::LockError};

/// The lease a waiter gets when a release hands the lock to it (capped by
/// the lease it asked for); its watchdog renews it to the full lease at once.
pub const HANDOFF_LEASE: Duration = crate::backend::HANDOFF_LEASE;

/// The Redis name of the fencing counter `key` uses under `prefix`: the
/// one of its hash slot, `prefix + S{tag}`, shared with every key there.
pub fn fence_counter(prefix: &str, key: &str) -> String {
    crate::key::KeyNames::new(prefix, key).fence()
}

/// Deletes the lock `key` regardless of its owner, as an operator's `DEL`
/// would. The holder finds out at its next renewal.
pub async fn force_delete(client: &LockClient, key: &str) -> Result<(), LockError> {
    client.force_delete(key).await
}

/// Deletes the leader election `name`'s lock regardless of its owner,
/// as an operator's `DEL` would (its record stays until its lease
/// ends). The leader finds out at its next renewal.
pub async fn force_delete_leader(client: &LockClient, name: &str) -> Result<(), LockError> {
    client.backend().delete(&client.leader_names(name)).await
}

/// The Redis names of the mutex `key` under `prefix`: its lock key and
/// its waiters' queue.
pub fn lock_names(prefix: &str, key: &str) -> (String, String) {
    let names = crate::key::KeyNames::new(prefix, key);
    let queue = names.queue().to_owned();
    (names.lock, queue)
}

/// The four names acquire.lua and release.lua take for the mutex `key`
/// under `prefix` (its lock, its slot's fencing counter, its queue, the
/// queue's deadlines), and its notice channel.
pub fn script_names(prefix: &str, key: &str) -> ([String; 4], String) {
    let names = crate::key::KeyNames::new(prefix, key);
    let keys = [
        names.lock.clone(),
        names.fence(),
        names.queue().to_owned(),
        names.deadlines(),
    ];
    (keys, names.notice().to_owned())
}

/// The server's own compare-and-delete `client` releases with, as the
/// command's name (`DELIFEQ` on Valkey 9 and later, `DELEX` on Redis 8.4
/// and later; detected when it connected), or `None`: the script.
/// Makes `client` take the server for one with the native commands of
/// `command` (`DELIFEQ` or `DELEX`; anything else: none), whatever its
/// probe found: a cluster node not yet upgraded, as the client meets it
/// in a rolling upgrade.
pub fn assume_native_release(client: &LockClient, command: &str) {
    use crate::backend::redis::Native;
    let native = match command {
        "DELIFEQ" => Native::Delifeq,
        "DELEX" => Native::Delex,
        _ => Native::None,
    };
    if let crate::backend::Backend::Redis(b) = client.backend() {
        b.assume_native(native);
    }
}

pub fn native_release(client: &LockClient) -> Option<&'static str> {
    use crate::backend::redis::Native;
    match client.backend() {
        crate::backend::Backend::Redis(b) => match b.native() {
            Native::None => None,
            Native::Delifeq => Some("DELIFEQ"),
            Native::Delex => Some("DELEX"),
        },
        _ => None,
    }
}

/// The Redis name of the leader election `name`'s lock under `prefix`.
pub fn leader_lock_name(prefix: &str, name: &str) -> String {
    crate::key::KeyNames::leader(prefix, name).lock
}

/// The group commit of `client`'s mutex calls on Redis (single server,
/// Sentinel, Cluster) so far: `(batch calls, ops they carried, most ops
/// in one call)`; zeros on other backends.
pub fn batched_calls(client: &LockClient) -> (u64, u64, u64) {
    match client.backend() {
        crate::backend::Backend::Redis(b) => {
            let s = b.batch_stats();
            (s.calls, s.ops, s.largest)
        }
        _ => (0, 0, 0),
    }
}

/// Makes `client`'s Redlock acquire requests to its `node`th master start
/// `by` late, as a request whose task the runtime polls late would (a
/// loaded machine). `false`: `client` is not a Redlock client.
pub fn delay_redlock_acquires(client: &LockClient, node: usize, by: Duration) -> bool {
    match client.backend() {
        crate::backend::Backend::Redlock(redlock) => {
            redlock.delay_acquires(node, by);
            true
        }
        _ => false,
    }
}
