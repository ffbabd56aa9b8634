//! Pieces of the `bench` binary (see `src/bin/bench.rs` and BENCHMARKS.md).

pub(crate) mod raw;
pub(crate) mod report;
pub(crate) mod rows;
pub(crate) mod server;
