//! With the `python` feature: the configuration of the Python build pyo3 targets, as cfgs
//! (`Py_LIMITED_API`, `Py_3_12`, ...), so that the Python glue calls `__dlpack__` with
//! vectorcall where that API is available.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "python")]
    pyo3_build_config::use_pyo3_cfgs();
    #[cfg(not(feature = "python"))]
    pyo3_cfgs_unused();
}

/// Without the `python` feature the cfgs are never set; declared all the same so that
/// `cfg(...)` checks on them are not reported as unknown.
#[cfg(not(feature = "python"))]
fn pyo3_cfgs_unused() {
    for cfg in ["Py_LIMITED_API", "PyPy", "GraalPy", "Py_3_10", "Py_3_12"] {
        println!("cargo:rustc-check-cfg=cfg({cfg})");
    }
}
