//! Key templates and limits shared by `lock-runtime` and `lock-macros`.
//!
//! **Internal; no stable API.** Depend on `lock-runtime`, which re-exports the
//! limits at its root (`lock_runtime::MAX_KEY_LEN`, `lock_runtime::MIN_TTL`,
//! ...). This crate exists so that the `#[distributed_lock]` attribute (at
//! compile time) and `LockLayer` (at run time) read key templates with one
//! parser and check them against one set of limits; `lock-runtime` pins it
//! with `=`, as it pins `lock-macros`.

mod limits;
pub mod template;

pub use limits::{
    DEFAULT_TTL, MAX_KEY_LEN, MAX_LOCK_ALL_KEYS, MAX_PREFIX_LEN, MAX_RETENTION, MAX_TTL, MAX_WAIT,
    MIN_TTL,
};
