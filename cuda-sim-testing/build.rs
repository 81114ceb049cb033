//! Passes to the crate where the simulator's shared library is, as the `cuda-sim` dependency's
//! build script says (`DEP_CUDA_SIM_LIBRARY_DIR`, `DEP_CUDA_SIM_BUILD_ID`): the directory cargo
//! builds it into, as `CUDA_SIM_LIBRARY_DIR`, and the text that only the library of this build
//! holds, as `CUDA_SIM_BUILD_ID`. The file's name is found at run time (`driver::load`): where
//! `cuda-sim` comes from a registry, cargo names it with a hash no build script learns.
fn main() {
    for (dep, env) in [
        ("DEP_CUDA_SIM_LIBRARY_DIR", "CUDA_SIM_LIBRARY_DIR"),
        ("DEP_CUDA_SIM_BUILD_ID", "CUDA_SIM_BUILD_ID"),
    ] {
        println!("cargo:rerun-if-env-changed={dep}");
        let value = std::env::var(dep).unwrap_or_default();
        println!("cargo:rustc-env={env}={value}");
    }
}
