//! Key templates, limits and kinds of lock shared by `lock-runtime` and
//! `lock-macros`.
//!
//! **Internal; no stable API.** Depend on `lock-runtime`, which re-exports the
//! limits and [`LockKind`] at its root (`lock_runtime::MAX_KEY_LEN`,
//! `lock_runtime::MIN_TTL`, `lock_runtime::LockKind`, ...). This crate exists
//! so that the `#[distributed_lock]` attribute (at compile time) and
//! `LockLayer` (at run time) read key templates with one parser and check
//! them against one set of limits, and so that the attribute names the kind
//! of lock it takes with the client's own type; `lock-runtime` pins it with
//! `=`, as it pins `lock-macros`.

mod kind;
mod limits;
pub mod template;

pub use kind::{Access, LockKind};
pub use limits::{
    DEFAULT_TTL, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS, MAX_PREFIX_LEN, MAX_RETENTION, MAX_TTL, MAX_WAIT,
    MIN_TTL,
};
