//! Fenced writes: the storage refuses a write whose fencing token is stale.
//!
//! A lease cannot stop a holder that was paused past it (a GC pause, a VM
//! migration, `SIGSTOP`): it wakes up still believing it holds the lock, and
//! writes. Every lock hands out a fencing token ([`LockGuard::fencing_token`],
//! [`LockInfo::fencing_token`](crate::LockInfo)), larger for each later
//! holder; the storage makes the old holder harmless by refusing any write
//! whose token is lower than one it has already accepted for the same
//! resource. This module is that check, for Redis and PostgreSQL:
//!
//! * equal tokens pass (one holder may write many times);
//! * a resource with no record yet accepts any token;
//! * a lower token is [`LockError::Stale`] and nothing is written.
//!
//! The `resource` is any name the writers agree on, usually the lock's key.
//! Each store keeps its own record: a holder that never wrote to a store has
//! not fenced it. Records are named by the resource alone, not under a
//! client's [key prefix](crate::LockClientBuilder::key_prefix) (a fenced
//! write is sent on a connection, by no client): services that share a
//! server must not fence the same resource names, since their tokens come
//! from different counters (one per prefixed key) and do not compare.
//! [`force_release`](crate::LockClient::force_release) raises the record of
//! resource `key`, whatever the client's prefix.
//!
//! # Redis
//!
//! ```no_run
//! # async fn pay(client: redis::Client, token: u64) -> Result<(), lock_runtime::LockError> {
//! # let mut conn = client.get_multiplexed_async_connection().await.unwrap();
//! use lock_runtime::fence;
//!
//! let replies = fence::redis(&mut conn, "order:42", token)
//!     .cmd(redis::cmd("HSET").arg("order:42").arg("status").arg("paid"))
//!     .cmd(redis::cmd("INCRBY").arg("{order:42}:payments").arg(1))
//!     .run()
//!     .await?; // Err(LockError::Stale { .. }) when a later holder wrote first
//! assert_eq!(replies.len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! One script call (`EVALSHA`, loaded on first use) reads the resource's
//! record, compares, records the token and runs the commands: nothing can
//! come between the check and the write. The commands travel as data (names
//! and arguments in `ARGV`), never as script text, and only write commands
//! whose keys sit at known positions are accepted
//! ([`allowed_commands`]: `SET`, `HSET`, `DEL`, `INCRBY`, `LPUSH`, `ZADD`,
//! `EXPIRE`, ...), so every key they touch is declared in `KEYS`, as a
//! cluster requires. The connection is any redis-rs async connection, to any
//! server: the lock's own or the one the data lives on.
//!
//! **One hash slot.** The record lives in the resource's own hash slot, and
//! every key the commands touch must too, on a single server as on a
//! cluster (so code that works on one keeps working on the other): use the
//! resource itself as the key (`order:42`), or as the hash tag of the keys
//! (`{order:42}:payments`); a resource with a tag of its own
//! (`{tenant:7}:order:1`) shares it with every key under that tag. Any
//! other key is [`LockError::Config`], before anything is sent. This also
//! makes one record per resource per server: writers cannot fence the same
//! resource in two places by accident.
//!
//! **The record** is a string key, [`record_key`]`(resource)`, under the
//! [`RECORD_PREFIX`] namespace (`lock-fence:{tag}:resource`, the tag hashing
//! to the resource's slot), holding the highest token. It **expires**: every
//! accepted write sets it again with a time to live, the retention
//! ([`DEFAULT_RETENTION`], 14 days, twice the longest lease
//! [`MAX_TTL`](crate::MAX_TTL); [`RedisFence::retention`] sets another). So
//! what stays in Redis is one small key per resource written to within the
//! retention, however many resources there ever were (a hash per slot would
//! keep every resource forever, with nothing to prune it by). The price: a
//! holder that writes after its resource's record expired is accepted, so
//! keep the retention longer than a holder can stay paused after its lease
//! ends. A token is only ever raised, so a refused holder's data is never
//! touched; a fenced command naming a key under [`RECORD_PREFIX`] (which
//! could lower or erase a record) is refused with [`LockError::Config`]. A
//! write whose check passed records its token even if one of its commands
//! then fails (see [`RedisFence::run`]).
//!
//! `run` returns the commands' replies, one per command in order.
//!
//! # PostgreSQL
//!
//! With the `postgres` feature, `fence::postgres` fences the caller's
//! transaction: called first in it, with `&mut *tx`, it raises the
//! resource's row in the table `fence::POSTGRES_SCHEMA` creates, or fails with
//! [`LockError::Stale`], and the caller rolls back. The statement
//! (`INSERT .. ON CONFLICT (resource) DO UPDATE .. WHERE token <= EXCLUDED.token`)
//! locks the row until the transaction ends, so concurrent writers of one
//! resource serialize on it: a stale one waits for the newer one to commit,
//! then is refused. Outside a transaction (autocommit) the row lock ends
//! with the statement, and the writes after it are not protected: always
//! fence inside the transaction that writes.
//!
//! Rows are not pruned by the library. `updated_at` is the time of the last
//! fenced write; delete old rows with
//!
//! ```sql
//! DELETE FROM lock_fence WHERE updated_at < now() - interval '14 days';
//! ```
//!
//! which is safe once no holder of those resources can still write: longer
//! ago than the longest lease plus the longest pause a holder may survive
//! (a deleted row accepts any token again, as a Redis record that expired).
//!
//! [`LockGuard::fencing_token`]: crate::LockGuard::fencing_token
//! [`LockError::Stale`]: crate::LockError::Stale
//! [`LockError::Config`]: crate::LockError::Config

pub(crate) mod commands;
#[cfg(feature = "postgres")]
mod postgres_store;
mod redis_store;

pub use self::commands::allowed_commands;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres_store::{POSTGRES_SCHEMA, postgres};
pub use self::redis_store::{DEFAULT_RETENTION, RECORD_PREFIX, RedisFence, record_key, redis};
