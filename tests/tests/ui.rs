//! Compile-time tests of the derives (trybuild): `ui/fail` holds inputs that must be refused,
//! grouped by category (`attr`: the attribute grammar; `check`: rules between fields and
//! options; `constraints`: consumer constraints; `storage`: the storage derives; `types`: field
//! types that miss a runtime trait) and named after the rule they break, next to the expected
//! compiler output (`.stderr`); `ui/pass` holds inputs that must compile and run.
//!
//! Bless the `.stderr` files on the pinned toolchain only:
//! `TRYBUILD=overwrite cargo test -p dlpack-tests --test ui` (`--all-features` for
//! `ui/cuda`).
//!
//! The expected output lists trait implementations, which the `cuda` feature extends, so
//! `ui/fail` and `ui/pass` run in the default-feature pass of `scripts/test.sh` only;
//! `ui/cuda/fail` holds inputs that name cudarc's types (stream fields), refused with the
//! feature, and runs in the pass with every feature: its output depends on every crate of that
//! build (`hip` adds `HipStream` to the implementations listed; with `burn-cuda`'s crates in the
//! build, rustc names cudarc's `CUstream_st` by its whole path), so bless it with
//! `--all-features`.

#[cfg(not(feature = "cuda"))]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/**/*.rs");
    t.pass("ui/pass/*.rs");
}

#[cfg(feature = "cuda")]
#[test]
fn ui_cuda() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/cuda/fail/**/*.rs");
}
