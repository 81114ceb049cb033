//! [`load`]: the CUDA simulator under `cargo test`, with no environment variable to set.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

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
    /// another machine, or a target directory cleaned since the build), or cannot be loaded.
    #[error(
        "no CUDA driver is installed and the CUDA simulator is not at {path} (where cargo built it for cuda-sim-testing): {reason}"
    )]
    Simulator {
        /// Where the library was looked for: its path, or the directory searched for it.
        path: String,
        /// The dynamic loader's message, or why no library there is this build's.
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

/// The directory cargo builds the simulator into for this crate (`<target>/<profile>/deps`).
const LIBRARY_DIR: &str = env!("CUDA_SIM_LIBRARY_DIR");

/// The text that the simulator's library of this build holds (`cuSimBuildId`).
const BUILD_ID: &str = env!("CUDA_SIM_BUILD_ID");

/// Where cargo built the simulator for this crate: the shared library in
/// `<target>/<profile>/deps` that holds this build's id. Its name is `libcuda_sim.so` where
/// `cuda-sim` is a path dependency, and `libcuda_sim-<hash>.so` where it comes from a registry
/// (crates.io), a hash that only cargo knows; the directory may hold other builds' libraries
/// too (other versions or features), which the id tells apart. Where several hold it, the
/// newest. The libraries are read, not loaded.
///
/// Errors: [`LoadError::Simulator`] when no library there holds this build's id.
pub fn simulator_path() -> Result<PathBuf, LoadError> {
    let not_found = |reason: String| LoadError::Simulator {
        path: LIBRARY_DIR.into(),
        reason,
    };
    let id = format!("cuda-sim build id: {BUILD_ID}\0");
    let prefix = format!("{}cuda_sim", std::env::consts::DLL_PREFIX);
    let suffix = std::env::consts::DLL_SUFFIX;
    let entries = std::fs::read_dir(LIBRARY_DIR).map_err(|e| not_found(e.to_string()))?;
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(suffix))
        else {
            continue;
        };
        // `libcuda_sim.so` or `libcuda_sim-<hash>.so`, not `libcuda_sim_testing...`.
        if !(rest.is_empty() || rest.starts_with('-')) {
            continue;
        }
        let path = entry.path();
        if elf_section(&path, ".cuda_sim_build_id").as_deref() != Some(id.as_bytes()) {
            continue;
        }
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
            newest = Some((modified, path));
        }
    }
    newest.map(|(_, path)| path).ok_or_else(|| {
        not_found(format!(
            "no {prefix}*{suffix} there is the one built with this crate (none holds `{}`)",
            id.trim_end_matches('\0')
        ))
    })
}

/// The contents of the section `name` of the ELF file at `path` (64-bit, little-endian, as on
/// x86-64 and aarch64 Linux), read from the file; `None` when it has no such section, or is
/// not such a file. Sections above 4 KiB are not read (the build id is far smaller).
fn elf_section(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut read_at = |offset: u64, len: u64| -> Option<Vec<u8>> {
        file.seek(SeekFrom::Start(offset)).ok()?;
        let mut buf = vec![0; usize::try_from(len).ok()?];
        file.read_exact(&mut buf).ok()?;
        Some(buf)
    };
    let u16_at = |b: &[u8], i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
    // The ELF header: magic, ELFCLASS64, ELFDATA2LSB; where the section headers are
    // (`e_shoff`, `e_shentsize`, `e_shnum`) and which section holds their names (`e_shstrndx`).
    let header = read_at(0, 64)?;
    if header[..6] != *b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = u64_at(&header, 0x28)?;
    let entsize = u64::from(u16_at(&header, 0x3a)?);
    let count = u64::from(u16_at(&header, 0x3c)?);
    let names_index = u64::from(u16_at(&header, 0x3e)?);
    if entsize < 64 || names_index >= count {
        return None;
    }
    let table = read_at(shoff, entsize * count)?;
    // A section header: its name's offset in the names (`sh_name`), and where its bytes are in
    // the file (`sh_offset`, `sh_size`).
    let section = |i: u64| -> Option<(u32, u64, u64)> {
        let h = table.get(usize::try_from(i * entsize).ok()?..)?;
        Some((u32_at(h, 0)?, u64_at(h, 0x18)?, u64_at(h, 0x20)?))
    };
    let (_, names_offset, names_size) = section(names_index)?;
    let names = read_at(names_offset, names_size.min(1 << 20))?;
    (0..count)
        .find_map(|i| {
            let (name_offset, offset, size) = section(i)?;
            let found = names.get(usize::try_from(name_offset).ok()?..)?;
            let found = found.split(|&b| b == 0).next()?;
            (found == name.as_bytes() && size <= 4096).then_some((offset, size))
        })
        .and_then(|(offset, size)| read_at(offset, size))
}

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
/// simulator on such a machine, put a directory holding [`simulator_path`] as `libcuda.so`
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
    let path = simulator_path()?;
    // SAFETY: the simulator's initializers are Rust statics made on first use; it stays
    // loaded for the process, as a driver does.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| LoadError::Simulator {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    std::mem::forget(lib);
    // SAFETY: probing only.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(LoadError::NotFoundByCudarc {
            path: path.display().to_string(),
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
