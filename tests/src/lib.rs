//! The integration suites live in `tests/`; the redis-server launcher,
//! topologies and helpers they share are in the `test-support` package.
//! `src/core_support.rs` (the two-backend fixture of the core suites and a
//! capture of the library's warnings) is included by the test files that use
//! it with `#[path]`.
