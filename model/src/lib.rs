//! A model-checked lock protocol. See the crate's README section in FAULTS.md.

pub mod check;
pub mod lock;
