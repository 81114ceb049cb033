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

/// Whether the driver in use has at least `needed` devices ([`device_count`]); if not, says on
/// stderr that the test `test` is skipped and why, so that a multi-GPU test on a machine with
/// fewer GPUs is reported as skipped rather than passing silently. Panics when the devices
/// cannot be counted (no driver).
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
    eprintln!("skipped: {test} needs {needed} CUDA devices, and the driver has {count} {noun}");
    false
}
