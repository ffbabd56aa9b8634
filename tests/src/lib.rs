//! The integration suites live in `tests/`; the redis-server launcher,
//! topologies and helpers they share are in the `test-support` package.
//! [`core_support`] holds the two-backend fixture of the core suites
//! ([`both_backends!`]) and a capture of the library's warnings;
//! [`recorded`] runs a scenario under a `metrics` recorder of its own.

pub mod core_support;
pub mod recorded;
