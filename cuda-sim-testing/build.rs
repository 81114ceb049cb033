//! Passes the path of the simulator's shared library, which cargo builds for the `cuda-sim`
//! dependency, to the crate as `CUDA_SIM_LIBRARY`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CUDA_SIM_LIBRARY");
    let library = std::env::var("DEP_CUDA_SIM_LIBRARY").unwrap_or_default();
    println!("cargo:rustc-env=CUDA_SIM_LIBRARY={library}");
}
