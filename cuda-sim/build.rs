//! Gives the shared library the driver's SONAME, as the real `libcuda.so.1` has, and tells
//! crates that depend on this one (`cuda-sim-testing`) how to find it:
//!
//! - `DEP_CUDA_SIM_LIBRARY_DIR`: the directory cargo puts it in, `<profile>/deps` of the target
//!   directory, three levels above this script's `OUT_DIR` (`<profile>/build/cuda-sim-<hash>/out`);
//! - `DEP_CUDA_SIM_BUILD_ID`: text that this build's library holds (in its section
//!   `.cuda_sim_build_id`, and from `cuSimBuildId`), and no other build's. The file is `libcuda_sim.so` where the crate is a path dependency (a
//!   workspace member), but `libcuda_sim-<hash>.so` where it comes from a registry (crates.io),
//!   and no build script learns that hash; the directory may also hold the libraries of other
//!   builds (other versions, other features). The build script's `OUT_DIR` is the id: one per
//!   version, features and profile of the crate in one target directory.
//!
//! The SONAME is a `rustc-link-arg`, which cargo passes to this package's own linked targets
//! only (the shared library, and the unit tests' executable, which never loads a driver). Not
//! a `rustc-cdylib-link-arg` (nor its other name, `rustc-link-arg-cdylib`): cargo passes those
//! to every shared library that depends on this package, however indirectly, so a user's
//! extension module depending on `cuda-sim-testing` would be named `libcuda.so.1` too, and
//! its own load of the driver would find itself.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,-soname,libcuda.so.1");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rustc-env=CUDA_SIM_BUILD_ID={out}");
    println!("cargo:build_id={out}");
    if let Some(profile) = std::path::Path::new(&out).ancestors().nth(3) {
        println!("cargo:library_dir={}", profile.join("deps").display());
    }
}
