//! [`device_count`] and [`require_devices`]: how many CUDA devices the driver in use has, for
//! tests of multi-GPU code that run on the simulator (`CUDA_SIM_DEVICES`) and on hardware.

use cudarc::driver::{DriverError, result};

use crate::driver::{LoadError, load};

/// Why [`device_count`] could not count the devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceCountError {
    /// No CUDA driver could be loaded ([`load`]).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The driver refused `cuInit` or `cuDeviceGetCount` (such as `CUDA_ERROR_NO_DEVICE` on a
    /// machine whose driver sees no GPU).
    #[error("the CUDA driver could not count its devices: {0}")]
    Driver(DriverError),
}

/// The number of CUDA devices of the driver this process uses (`cuInit`, then
/// `cuDeviceGetCount`), loading the driver first as [`load`] does: on the simulator the value
/// of its `CUDA_SIM_DEVICES` setting (2 unless set, read once per process), on hardware the
/// GPUs the driver sees.
///
/// Errors: [`DeviceCountError::Load`] without a driver, [`DeviceCountError::Driver`] when the
/// driver refuses.
///
/// ```no_run
/// let devices = cuda_sim_testing::device_count().unwrap();
/// assert!(devices >= 1);
/// ```
pub fn device_count() -> Result<usize, DeviceCountError> {
    load()?;
    result::init().map_err(DeviceCountError::Driver)?;
    let count = result::device::get_count().map_err(DeviceCountError::Driver)?;
    // The driver API's count is an `int`, never negative.
    Ok(usize::try_from(count).unwrap_or(0))
}

/// The environment variable that turns [`require_devices`]'s skips into failures.
const NO_SKIP: &str = "CUDA_SIM_TESTING_NO_SKIP";

/// Whether the driver in use has at least `needed` devices ([`device_count`]); if not, says on
/// stderr that the test `test` is skipped and why. libtest has no skipped state: the test then
/// returns and is listed `ok`, and `cargo test` shows the stderr line of a passing test only
/// with `--nocapture`. Where a skip would hide a gap (a machine meant to have the GPUs), set
/// the environment variable `CUDA_SIM_TESTING_NO_SKIP=1`: the test then fails, with the same
/// words, instead of being skipped.
///
/// # Panics
///
/// When the devices cannot be counted (no driver), and when there are fewer than `needed`
/// while `CUDA_SIM_TESTING_NO_SKIP` is `1`.
///
/// ```no_run
/// #[test]
/// fn copies_between_two_gpus() {
///     if !cuda_sim_testing::require_devices(2, "copies_between_two_gpus") {
///         return;
///     }
///     // ... uses devices 0 and 1
/// }
/// ```
#[track_caller]
pub fn require_devices(needed: usize, test: &str) -> bool {
    let count = device_count().unwrap_or_else(|e| panic!("{e}"));
    if count >= needed {
        return true;
    }
    let noun = if count == 1 { "device" } else { "devices" };
    let why = format!("{test} needs {needed} CUDA devices, and the driver has {count} {noun}");
    if std::env::var_os(NO_SKIP).is_some_and(|v| v == "1") {
        panic!("{why} ({NO_SKIP}=1: not skipped)");
    }
    eprintln!("skipped: {why}");
    false
}
