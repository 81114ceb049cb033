//! Compile-time tests of the derives (trybuild): `ui/fail` holds inputs that must be refused,
//! grouped by category and named after the rule they break, next to the expected compiler
//! output (`.stderr`); `ui/pass` holds inputs that must compile and run.
//!
//! Bless the `.stderr` files on the pinned toolchain only:
//! `TRYBUILD=overwrite cargo test -p dlpack-tests --test ui`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/**/*.rs");
    t.pass("ui/pass/*.rs");
}
