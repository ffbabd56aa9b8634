//! Compile-time diagnostics of `#[distributed_lock]`: one file per mistake in
//! `ui/fail`, with its expected `.stderr`. The forms that must build and run
//! are ordinary tests (`tests/forms_*.rs`), built with the workspace's other
//! tests: with no passing case here, trybuild only checks its files (no code
//! generation for its copy of the dependencies).
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test -p lock-macros --test ui`, then read the diff.

#[test]
fn diagnostics_point_at_the_mistake() {
    trybuild::TestCases::new().compile_fail("ui/fail/*.rs");
}
