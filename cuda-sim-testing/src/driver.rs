//! [`load`]: the CUDA simulator under `cargo test`, with no environment variable to set.

use std::sync::OnceLock;

/// The CUDA driver library that cudarc will load in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The CUDA simulator: the one built with this crate, or one put first on the library path
    /// (`LD_LIBRARY_PATH`) by hand. [`Checker::attach`](crate::Checker::attach) returns a
    /// checker.
    Simulator,
    /// A CUDA driver installed on the machine (`libcuda.so` or `libcuda.so.1` found by the
    /// dynamic loader). Tests run on the GPU; [`Checker::attach`](crate::Checker::attach)
    /// returns `None`.
    Hardware,
}

/// Why the simulator could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The simulator's shared library is not where cargo built it (a test binary copied to
    /// another machine, or a target directory cleaned since the build).
    #[error(
        "no CUDA driver is installed and the CUDA simulator is not at {path} (where cargo built it for cuda-sim-testing): {reason}"
    )]
    Simulator {
        /// Where the library was looked for.
        path: String,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The simulator was loaded, but cudarc does not find it under the driver's names (a
    /// dynamic loader that does not match a library's SONAME, `libcuda.so.1`).
    #[error("the CUDA simulator at {path} was loaded, but cudarc does not find it as libcuda.so.1")]
    NotFoundByCudarc {
        /// The simulator's path.
        path: String,
    },
}

/// Where cargo built the simulator for this crate (`<target>/<profile>/deps/libcuda_sim.so`).
pub const SIMULATOR_PATH: &str = env!("CUDA_SIM_LIBRARY");

/// The names the dynamic loader knows a CUDA driver by on Linux, in cudarc's order.
const DRIVER_NAMES: [&str; 2] = ["libcuda.so", "libcuda.so.1"];

/// Makes sure cudarc finds a CUDA driver in this process: the machine's own if it has one,
/// otherwise the CUDA simulator that cargo built with this crate. Call it at the start of
/// every test that uses CUDA, before cudarc's first call (`CudaContext::new`); the work is done
/// once per process and later calls return the same answer.
///
/// How: the simulator is loaded by its path (`dlopen`), and its SONAME is the driver's,
/// `libcuda.so.1`, so when cudarc then asks the dynamic loader for `libcuda.so.1` it gets the
/// library already loaded. A machine with a driver (`libcuda.so` or `libcuda.so.1` on the
/// loader's path) keeps it, so the same `cargo test` runs on the GPU there; to test on the
/// simulator on such a machine, put a directory holding [`SIMULATOR_PATH`] as `libcuda.so`
/// and `libcuda.so.1` first on `LD_LIBRARY_PATH`.
///
/// Errors: [`LoadError`] when there is no driver and the simulator cannot be loaded.
pub fn load() -> Result<Driver, LoadError> {
    static LOADED: OnceLock<Result<Driver, LoadError>> = OnceLock::new();
    LOADED.get_or_init(load_once).clone()
}

fn load_once() -> Result<Driver, LoadError> {
    for name in DRIVER_NAMES {
        // SAFETY: loading the CUDA driver runs its initializers, as cudarc's own load does; the
        // library stays loaded for the process (cudarc keeps its own handle).
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            // SAFETY: looking a symbol up; not called.
            let simulated =
                unsafe { lib.get::<unsafe extern "C" fn() -> u64>(b"cuSimViolations") }.is_ok();
            std::mem::forget(lib);
            return Ok(if simulated {
                Driver::Simulator
            } else {
                Driver::Hardware
            });
        }
    }
    // SAFETY: the simulator's initializers are Rust statics made on first use; it stays
    // loaded for the process, as a driver does.
    let lib =
        unsafe { libloading::Library::new(SIMULATOR_PATH) }.map_err(|e| LoadError::Simulator {
            path: SIMULATOR_PATH.into(),
            reason: e.to_string(),
        })?;
    std::mem::forget(lib);
    // SAFETY: probing only.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(LoadError::NotFoundByCudarc {
            path: SIMULATOR_PATH.into(),
        });
    }
    Ok(Driver::Simulator)
}

/// [`load`], panicking with the [`LoadError`]'s message: for tests.
#[track_caller]
pub fn driver() -> Driver {
    load().unwrap_or_else(|e| panic!("{e}"))
}

/// The CUDA driver entry points this process has called, as the CUDA simulator counts them
/// (`cuSimDriverCalls`, `cuSimDriverCallReport`): the simulator's own `cuSim*` functions are
/// not counted. A test proves that a code path leaves the driver alone by comparing the counts
/// before and after it ([`DriverCalls::since`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// All calls.
    pub total: u64,
    /// The calls of each entry point called, in the order of their first calls.
    pub by_entry_point: Vec<(String, u64)>,
}

impl DriverCalls {
    /// The counts of this process now, or `None` when its driver is not a simulator that counts
    /// calls (a real driver, or none). Loads the driver first ([`load`]).
    pub fn now() -> Option<Self> {
        type Total = unsafe extern "C" fn() -> u64;
        type Report = unsafe extern "C" fn(*mut u8, usize) -> usize;
        if load() != Ok(Driver::Simulator) {
            return None;
        }
        // SAFETY: `culib` is the library cudarc calls, loaded above; the symbols, when present,
        // have the signatures the simulator documents (`cuda-sim`, module `calls`), and are
        // called as documented: the report with a NULL buffer for its length, then with a
        // buffer of that length (a report that grew since is cut to it).
        unsafe {
            let lib = cudarc::driver::sys::culib();
            let total = *lib.get::<Total>(b"cuSimDriverCalls").ok()?;
            let report = *lib.get::<Report>(b"cuSimDriverCallReport").ok()?;
            let total = total();
            let mut text = vec![0u8; report(std::ptr::null_mut(), 0)];
            let len = report(text.as_mut_ptr(), text.len()).min(text.len());
            text.truncate(len);
            let by_entry_point = String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|line| {
                    let (name, n) = line.rsplit_once(' ')?;
                    Some((name.to_owned(), n.parse().ok()?))
                })
                .collect();
            Some(Self {
                total,
                by_entry_point,
            })
        }
    }

    /// The calls made since `before`, an earlier count of the same process: the entry points
    /// whose counts grew, by how much.
    pub fn since(&self, before: &DriverCalls) -> DriverCalls {
        let by_entry_point = self
            .by_entry_point
            .iter()
            .filter_map(|(name, n)| {
                let earlier = before
                    .by_entry_point
                    .iter()
                    .find(|(b, _)| b == name)
                    .map_or(0, |(_, n)| *n);
                (*n > earlier).then(|| (name.clone(), n - earlier))
            })
            .collect();
        DriverCalls {
            total: self.total.saturating_sub(before.total),
            by_entry_point,
        }
    }
}

impl std::fmt::Display for DriverCalls {
    /// `0`, or the total and each entry point's count: `3 (cuInit 1, cuCtxGetCurrent 2)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.total)?;
        if !self.by_entry_point.is_empty() {
            let list: Vec<String> = self
                .by_entry_point
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect();
            write!(f, " ({})", list.join(", "))?;
        }
        Ok(())
    }
}
