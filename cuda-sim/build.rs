//! Gives the shared library the driver's SONAME, as the real `libcuda.so.1` has, and tells
//! crates that depend on this one (`cuda-sim-testing`) where cargo puts it: `<profile>/deps`
//! of the target directory, three levels above this script's `OUT_DIR`
//! (`<profile>/build/cuda-sim-<hash>/out`), as `DEP_CUDA_SIM_LIBRARY`.
//!
//! The SONAME is a `rustc-link-arg`, which cargo passes to this package's own linked targets
//! only (the shared library, and the unit tests' executable, which never loads a driver). Not
//! a `rustc-cdylib-link-arg` (nor its other name, `rustc-link-arg-cdylib`): cargo passes those
//! to every shared library that depends on this package, however indirectly, so a user's
//! extension module depending on `cuda-sim-testing` would be named `libcuda.so.1` too, and
//! its own load of the driver would find itself.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,-soname,libcuda.so.1");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Some(profile) = out.ancestors().nth(3) {
        let name = format!(
            "{}cuda_sim{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        println!(
            "cargo:library={}",
            profile.join("deps").join(name).display()
        );
    }
}
