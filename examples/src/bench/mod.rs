//! Pieces of the `bench` binary (see `src/bin/bench.rs` and BENCHMARKS.md).

pub(crate) mod attr;
pub(crate) mod chart;
pub(crate) mod defs;
pub(crate) mod held;
pub(crate) mod measure;
pub(crate) mod probe;
pub(crate) mod raw;
pub(crate) mod report;
pub(crate) mod rows;
pub(crate) mod server;
pub(crate) mod sides;
