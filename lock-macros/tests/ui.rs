//! Compile-time behaviour of `#[distributed_lock]`: every form that must build
//! (and run), and one file per diagnostic with its expected `.stderr`.
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test -p lock-macros --test ui`, then read the diff.

#[test]
fn attribute_forms_compile_and_diagnostics_point_at_the_mistake() {
    let t = trybuild::TestCases::new();
    t.pass("ui/pass/*.rs");
    t.compile_fail("ui/fail/*.rs");
}
