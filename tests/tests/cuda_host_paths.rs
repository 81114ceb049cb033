//! With feature `cuda` on, host tensors never touch the CUDA driver (feature `cuda`; with
//! `python`, the Python side too): the host-path matrix (`dlpack_tests::host_paths`: exports,
//! imports, copies, legacy and versioned tensors, drops on other threads, the derive's types,
//! NumPy both ways) runs first with no driver loaded, which it must not load, then with the
//! CUDA simulator loaded, which must count no driver call. A process that merely exchanges host
//! tensors then neither pays for the driver's start-up nor hands forked children a driver they
//! cannot use (`cuda_sim_fork.rs`).
//!
//! One test in this binary, so that nothing else in the process loads or calls the driver while
//! it watches.
#![cfg(feature = "cuda")]

use cuda_sim_testing::{Driver, DriverCalls};
use dlpack_tests::host_paths;

/// The CUDA driver libraries mapped into this process: the driver (`libcuda.so*`) or the
/// simulator under the name cargo builds it with (`libcuda_sim.so`).
fn driver_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut found: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| {
            let name = path.rsplit('/').next().unwrap_or(path);
            name.starts_with("libcuda.so") || name.starts_with("libcuda_sim")
        })
        .map(str::to_owned)
        .collect();
    found.dedup();
    found
}

/// Runs the whole matrix; says how many Rust cases and Python groups ran.
fn matrix() -> String {
    let rust = host_paths::rust_matrix();
    #[cfg(feature = "python")]
    let python = format!(", {} Python groups", host_paths::python_matrix());
    #[cfg(not(feature = "python"))]
    let python = ", no Python (feature python is off)";
    format!("{rust} Rust cases{python}")
}

#[test]
fn host_paths_neither_load_nor_call_the_cuda_driver() {
    assert!(
        driver_libraries().is_empty(),
        "a CUDA driver was loaded before the test: {:?}",
        driver_libraries()
    );
    let cases = matrix();
    let loaded = driver_libraries();
    println!("host-path matrix ({cases}) with no driver loaded: drivers loaded {loaded:?}");

    // With a driver loaded (as in a process that has GPU tensors too), nothing is called.
    let calls = match cuda_sim_testing::load() {
        Ok(Driver::Simulator) => {
            let before = DriverCalls::now().expect("the CUDA simulator counts its calls");
            matrix();
            let calls = DriverCalls::now().unwrap().since(&before);
            println!("driver calls across the host-path matrix: {calls}");
            Some(calls)
        }
        Ok(Driver::Hardware) => {
            println!("a real CUDA driver is installed: it counts no calls");
            None
        }
        Err(err) => panic!("{err}"),
    };
    assert_eq!(
        loaded,
        Vec::<String>::new(),
        "the host-path matrix loaded a CUDA driver"
    );
    let Some(calls) = calls else {
        return;
    };
    assert_eq!(calls.total, 0, "host paths called the CUDA driver: {calls}");
    // The count is live: the driver's own initialization is one call.
    let before = DriverCalls::now().unwrap();
    assert_eq!(cudarc::driver::result::init().map_err(|e| e.0), Ok(()));
    let init = DriverCalls::now().unwrap().since(&before);
    assert_eq!(init.to_string(), "1 (cuInit 1)");
}
