//! [`ExportRequest`]: the arguments of `__dlpack__`, and what serving them needs.

use super::{COPIES_CUDA_MEMORY, ExportError};
use crate::abi::ffi::{self, DLPackVersion};
use crate::plan::stream::parse_stream;
use crate::tensor::device::{Device, DeviceType};

/// The arguments of `__dlpack__(stream, max_version, dl_device, copy)` (the array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html)).
///
/// The all-`None` request ([`ExportRequest::new`]) is Python's default and yields a legacy
/// `DLManagedTensor`; [`ExportRequest::versioned`] asks for DLPack 1.3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportRequest {
    /// The consumer's stream, as the `stream` parameter of `__dlpack__` lists per device
    /// (`None`: Python's `None`).
    pub stream: Option<i64>,
    /// Highest version the consumer understands; `None` or major 0 gives a legacy tensor.
    pub max_version: Option<DLPackVersion>,
    /// Device the consumer wants the data on; `None`: the tensor's own device.
    pub dl_device: Option<Device>,
    /// `Some(true)`: always copy; `Some(false)`: never copy; `None`: copy only if needed.
    pub copy: Option<bool>,
}

impl ExportRequest {
    /// All arguments `None`, as Python's `__dlpack__()`: a legacy tensor.
    #[inline]
    pub const fn new() -> Self {
        Self {
            stream: None,
            max_version: None,
            dl_device: None,
            copy: None,
        }
    }

    /// A request for a versioned tensor at this crate's version (1.3).
    #[inline]
    pub const fn versioned() -> Self {
        Self::new().max_version(DLPackVersion {
            major: ffi::DLPACK_MAJOR_VERSION,
            minor: ffi::DLPACK_MINOR_VERSION,
        })
    }

    /// Sets `stream`.
    #[inline]
    pub const fn stream(mut self, stream: Option<i64>) -> Self {
        self.stream = stream;
        self
    }

    /// Sets `max_version`.
    #[inline]
    pub const fn max_version(mut self, version: DLPackVersion) -> Self {
        self.max_version = Some(version);
        self
    }

    /// Sets `dl_device`.
    #[inline]
    pub const fn dl_device(mut self, device: Device) -> Self {
        self.dl_device = Some(device);
        self
    }

    /// Sets `copy`.
    #[inline]
    pub const fn copy(mut self, copy: Option<bool>) -> Self {
        self.copy = copy;
        self
    }

    /// Checks what can be checked before exporting a tensor on `device`: `stream` must be legal
    /// for the device the consumer will use (`__dlpack__`'s `stream` parameter), and
    /// `dl_device` must be `device` itself, `cpu:0` for host-accessible memory, or (feature
    /// `cuda`) `cpu:0` or any CUDA device for CUDA memory, and any CUDA device for `cpu` and
    /// `cuda_host` memory, which are then copied (its `dl_device` and `copy`). Whether the CUDA
    /// device exists is the driver's to say, when the copy is planned
    /// ([`ExportError::NoSuchDevice`]).
    ///
    /// # Errors
    ///
    /// [`ExportError::Stream`], [`ExportError::CopyRequired`] (`copy=False` but serving
    /// `dl_device` needs a copy), [`ExportError::UnsupportedDevice`].
    pub fn check(&self, device: Device) -> Result<(), ExportError> {
        let target = self.dl_device.unwrap_or(device);
        parse_stream(target, self.stream)?;
        if same_memory(device, target) {
            return Ok(());
        }
        if self.copy == Some(false) {
            return Err(ExportError::CopyRequired {
                found: device,
                requested: target,
            });
        }
        if COPIES_CUDA_MEMORY && copies_between(device, target) {
            return Ok(());
        }
        Err(ExportError::UnsupportedDevice {
            found: device,
            requested: target,
        })
    }

    /// Whether serving this request for a tensor on `device` makes a copy: `copy=True`, or a
    /// `dl_device` that the memory is not reachable from (`__dlpack__`'s `dl_device` and `copy`).
    #[inline]
    pub fn needs_copy(&self, device: Device) -> bool {
        self.copy == Some(true) || self.dl_device.is_some_and(|t| !same_memory(device, t))
    }

    /// Whether a legacy consumer (no `max_version`, or major 0) of a tensor, read-only when
    /// `read_only`, gets a copy: a legacy `DLManagedTensor` cannot say read-only, so unless
    /// `copy=False` the consumer gets a writable copy instead of the original, as the `copy`
    /// parameter of `__dlpack__` allows when sharing is not possible.
    #[inline]
    pub(crate) fn copies_for_legacy(&self, read_only: bool) -> bool {
        read_only && !self.wants_versioned() && self.copy != Some(false)
    }

    #[inline]
    pub(crate) fn wants_versioned(&self) -> bool {
        self.max_version.is_some_and(|v| v.major >= 1)
    }
}

/// Whether a tensor on `device` can be copied to `target` with the CUDA driver (feature `cuda`):
/// CUDA device memory to the host or to any CUDA device (the same device with `copy=True`,
/// another by a copy between devices), and host memory (`cpu`, `cuda_host`) to a CUDA device.
#[inline]
pub(crate) fn copies_between(device: Device, target: Device) -> bool {
    match (device.device_type, target.device_type) {
        (DeviceType::Cuda, DeviceType::Cuda) => true,
        (DeviceType::Cuda, _) => target == Device::CPU,
        // ROCm device memory to the host or to a ROCm device, on the HIP driver tier.
        (DeviceType::Rocm, DeviceType::Rocm) => cfg!(feature = "hip"),
        (DeviceType::Rocm, _) => cfg!(feature = "hip") && target == Device::CPU,
        (DeviceType::Cpu | DeviceType::CudaHost, DeviceType::Cuda) => true,
        _ => false,
    }
}

/// Whether memory on `device` can be handed to a consumer on `target` without a copy.
#[inline]
pub(super) fn same_memory(device: Device, target: Device) -> bool {
    target == device || target == Device::CPU && device.is_host_accessible()
}
