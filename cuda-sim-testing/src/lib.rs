//! Testing stream-ordered CUDA code, with or without a GPU.
//!
//! - [`driver`] (or [`load`]): puts the CUDA simulator (crate `cuda-sim`, built by cargo with
//!   this crate) under `cargo test` on a machine without a CUDA driver, with no environment
//!   variable to set; a machine with a driver keeps it. [`simulator_path`] says where that
//!   library is (cargo builds it with this crate, from crates.io as from a path).
//! - [`Gate`]: holds a stream, so the work enqueued behind it is pending until the test
//!   releases it, on a GPU and on the simulator alike (a host function, `cuLaunchHostFunc`);
//!   after [`Gate::DEFAULT_TIMEOUT`] it opens by itself and fails the test, never hangs it.
//! - [`Checker`]: the simulator's happens-before checker (`None` on a real driver): the
//!   violations found, their report, the operation counts, and [`Checker::assert_clean`].
//! - [`DriverCalls`]: the driver entry points the process has called, as the simulator counts
//!   them, for tests of code paths that must leave the driver alone.
//! - [`device_count`] and [`require_devices`]: how many devices the driver has, for tests of
//!   multi-GPU code (the simulator has 2 unless its `CUDA_SIM_DEVICES` setting says otherwise;
//!   it models peer access and copies between devices), and a skip, said on stderr, where a
//!   machine has too few.
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//! use cuda_sim_testing::{Checker, Gate};
//!
//! cuda_sim_testing::driver(); // before cudarc's first call
//! let ctx = CudaContext::new(0).unwrap();
//! let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap()); // before any gate
//! let checker = Checker::attach(); // None on a GPU
//! let mut src = a.alloc_zeros::<f32>(1024).unwrap();
//! let mut dst = b.alloc_zeros::<f32>(1024).unwrap();
//! let gate = Gate::hold(&a);
//! a.memset_zeros(&mut src).unwrap(); // pending until the gate is released
//! let written = a.record_event(None).unwrap();
//! b.wait(&written).unwrap(); // leave it out, and the checker reports the copy below
//! b.memcpy_dtod(&src, &mut dst).unwrap();
//! gate.release();
//! b.synchronize().unwrap();
//! if let Some(checker) = checker {
//!     checker.assert_clean("a copy ordered after the producer");
//! }
//! ```
//!
//! The simulator runs no kernel body: a launch is enqueued in stream order and checked as a
//! read and write of every allocation its pointer parameters point into, but computes no
//! values (see the `cuda-sim` crate docs).
//!
//! # HIP
//!
//! The simulator has a HIP face too: the `hip*` functions of ROCm's `libamdhip64.so`, over the
//! same model and checker (the `cuda-sim` crate docs list them, and what they model). Code that
//! loads the HIP runtime by name (`libamdhip64.so`) finds the simulator only on the library
//! path, which the dynamic loader reads when the process starts: run such a test with the
//! directory `scripts/cuda-sim.sh` prints first on `LD_LIBRARY_PATH` (it holds the library as
//! `libcuda.so` and as `libamdhip64.so`, `.so.6`, `.so.7`, links to one file):
//!
//! ```text
//! sim="$(./scripts/cuda-sim.sh)" && LD_LIBRARY_PATH="$sim" cargo test --test my_hip_test
//! ```
//!
//! There [`load`] and [`Checker::attach`] find the same file as `libcuda.so`, so the checker,
//! [`DriverCalls`] (which counts `hip*` calls by name too) and the HIP face are one library.
//! Without that directory on the library path, [`load`] loads [`simulator_path`], another
//! file: a library loaded as `libamdhip64.so` from elsewhere would be a second simulator, with
//! a checker of its own. A test may also load the HIP face by full path: [`simulator_path`]
//! itself, or a link named `libamdhip64.so` to it, is the library [`load`] loads there (this
//! crate's `tests/hip.rs` takes `libamdhip64.so` from the library path, else such a link).
//!
//! cudarc's bindings must be those the simulator was built against (CUDA 13 with cudarc 0.19's
//! `fallback-latest`; set `CUDARC_CUDA_VERSION=13040` in `.cargo/config.toml`'s `[env]` where
//! a toolkit of another version is installed). Linux only.

mod checker;
mod devices;
mod driver;
mod gate;

pub use checker::{Checker, DeclareError};
pub use devices::{DeviceCountError, device_count, require_devices};
pub use driver::{Driver, DriverCalls, LoadError, driver, load, simulator_path};
pub use gate::Gate;
