//! Devices: [`Device`] and [`DeviceType`], the safe form of `DLDevice` and `DLDeviceType`
//! (`dlpack.h`).

use core::fmt;

use crate::abi::ffi;

/// The `device_type` of a `DLDevice` (`dlpack.h`, `DLDeviceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceType {
    /// `kDLCPU` (1).
    Cpu,
    /// `kDLCUDA` (2).
    Cuda,
    /// `kDLCUDAHost` (3): pinned host memory from `cudaMallocHost`.
    CudaHost,
    /// `kDLOpenCL` (4).
    OpenCl,
    /// `kDLVulkan` (7).
    Vulkan,
    /// `kDLMetal` (8).
    Metal,
    /// `kDLVPI` (9).
    Vpi,
    /// `kDLROCM` (10).
    Rocm,
    /// `kDLROCMHost` (11): pinned host memory from `hipMallocHost`.
    RocmHost,
    /// `kDLExtDev` (12): reserved, implementation-defined.
    ExtDev,
    /// `kDLCUDAManaged` (13): unified memory from `cudaMallocManaged`.
    CudaManaged,
    /// `kDLOneAPI` (14).
    OneApi,
    /// `kDLWebGPU` (15).
    WebGpu,
    /// `kDLHexagon` (16).
    Hexagon,
    /// `kDLMAIA` (17).
    Maia,
    /// `kDLTrn` (18).
    Trn,
    /// A code this crate does not know, kept as found.
    Unknown(i32),
}

impl DeviceType {
    /// Converts the raw `DLDevice::device_type`. Never fails: unknown codes become
    /// [`DeviceType::Unknown`].
    pub const fn from_raw(raw: ffi::DLDeviceType) -> Self {
        match raw {
            ffi::kDLCPU => Self::Cpu,
            ffi::kDLCUDA => Self::Cuda,
            ffi::kDLCUDAHost => Self::CudaHost,
            ffi::kDLOpenCL => Self::OpenCl,
            ffi::kDLVulkan => Self::Vulkan,
            ffi::kDLMetal => Self::Metal,
            ffi::kDLVPI => Self::Vpi,
            ffi::kDLROCM => Self::Rocm,
            ffi::kDLROCMHost => Self::RocmHost,
            ffi::kDLExtDev => Self::ExtDev,
            ffi::kDLCUDAManaged => Self::CudaManaged,
            ffi::kDLOneAPI => Self::OneApi,
            ffi::kDLWebGPU => Self::WebGpu,
            ffi::kDLHexagon => Self::Hexagon,
            ffi::kDLMAIA => Self::Maia,
            ffi::kDLTrn => Self::Trn,
            other => Self::Unknown(other),
        }
    }

    /// The raw `DLDevice::device_type`.
    #[inline]
    pub const fn to_raw(self) -> ffi::DLDeviceType {
        match self {
            Self::Cpu => ffi::kDLCPU,
            Self::Cuda => ffi::kDLCUDA,
            Self::CudaHost => ffi::kDLCUDAHost,
            Self::OpenCl => ffi::kDLOpenCL,
            Self::Vulkan => ffi::kDLVulkan,
            Self::Metal => ffi::kDLMetal,
            Self::Vpi => ffi::kDLVPI,
            Self::Rocm => ffi::kDLROCM,
            Self::RocmHost => ffi::kDLROCMHost,
            Self::ExtDev => ffi::kDLExtDev,
            Self::CudaManaged => ffi::kDLCUDAManaged,
            Self::OneApi => ffi::kDLOneAPI,
            Self::WebGpu => ffi::kDLWebGPU,
            Self::Hexagon => ffi::kDLHexagon,
            Self::Maia => ffi::kDLMAIA,
            Self::Trn => ffi::kDLTrn,
            Self::Unknown(raw) => raw,
        }
    }

    /// Whether the host can read and write this memory directly through `data`: CPU, pinned
    /// CUDA and ROCm host memory, and CUDA managed memory (which a producer may return when
    /// `dl_device` asks for the CPU).
    pub const fn is_host_accessible(self) -> bool {
        matches!(
            self,
            Self::Cpu | Self::CudaHost | Self::RocmHost | Self::CudaManaged
        )
    }
}

/// A device: the safe form of `DLDevice` (`dlpack.h`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// Kind of device.
    pub device_type: DeviceType,
    /// Device ordinal in the producer's numbering; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

impl Device {
    /// The host CPU, `(kDLCPU, 0)`.
    pub const CPU: Self = Self {
        device_type: DeviceType::Cpu,
        device_id: 0,
    };

    /// A device of the given type and ordinal.
    pub const fn new(device_type: DeviceType, device_id: i32) -> Self {
        Self {
            device_type,
            device_id,
        }
    }

    /// CUDA device `ordinal`.
    pub const fn cuda(ordinal: i32) -> Self {
        Self::new(DeviceType::Cuda, ordinal)
    }

    /// Converts the raw header struct; unknown device types are kept.
    pub const fn from_raw(raw: ffi::DLDevice) -> Self {
        Self::new(DeviceType::from_raw(raw.device_type), raw.device_id)
    }

    /// The raw header struct.
    #[inline]
    pub const fn to_raw(self) -> ffi::DLDevice {
        ffi::DLDevice {
            device_type: self.device_type.to_raw(),
            device_id: self.device_id,
        }
    }

    /// Whether the host can read and write this memory directly.
    pub const fn is_host_accessible(self) -> bool {
        self.device_type.is_host_accessible()
    }
}

impl Default for Device {
    fn default() -> Self {
        Self::CPU
    }
}

impl From<ffi::DLDevice> for Device {
    fn from(raw: ffi::DLDevice) -> Self {
        Self::from_raw(raw)
    }
}

impl From<Device> for ffi::DLDevice {
    fn from(device: Device) -> Self {
        device.to_raw()
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Formats as `cpu:0`, `cuda:1`, `unknown(42):0`.
impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.device_type {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
            DeviceType::CudaHost => "cuda_host",
            DeviceType::OpenCl => "opencl",
            DeviceType::Vulkan => "vulkan",
            DeviceType::Metal => "metal",
            DeviceType::Vpi => "vpi",
            DeviceType::Rocm => "rocm",
            DeviceType::RocmHost => "rocm_host",
            DeviceType::ExtDev => "ext_dev",
            DeviceType::CudaManaged => "cuda_managed",
            DeviceType::OneApi => "oneapi",
            DeviceType::WebGpu => "webgpu",
            DeviceType::Hexagon => "hexagon",
            DeviceType::Maia => "maia",
            DeviceType::Trn => "trn",
            DeviceType::Unknown(code) => return write!(f, "unknown({code}):{}", self.device_id),
        };
        write!(f, "{name}:{}", self.device_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_raw() {
        for raw in -4..64 {
            let ty = DeviceType::from_raw(raw);
            assert_eq!(ty.to_raw(), raw);
            let known = matches!(raw, 1..=4 | 7..=18);
            assert_eq!(!matches!(ty, DeviceType::Unknown(_)), known, "code {raw}");
        }
    }

    #[test]
    fn host_accessible_devices() {
        assert!(Device::CPU.is_host_accessible());
        assert!(Device::new(DeviceType::CudaManaged, 0).is_host_accessible());
        assert!(!Device::cuda(0).is_host_accessible());
        assert!(!Device::new(DeviceType::Unknown(77), 0).is_host_accessible());
    }

    #[test]
    fn display() {
        assert_eq!(Device::cuda(1).to_string(), "cuda:1");
        assert_eq!(
            Device::new(DeviceType::Unknown(42), 0).to_string(),
            "unknown(42):0"
        );
    }
}
