//! Devices: [`Device`] and [`DeviceType`], the safe form of `DLDevice` and `DLDeviceType`
//! (`dlpack.h`).

use core::fmt;

use crate::abi::ffi;

/// How a device type's streams are named in the `stream` argument of `__dlpack__` (the table
/// of its `stream` parameter, per device type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamApi {
    /// Host memory: no streams; only `stream=None` is legal.
    Host,
    /// CUDA streams (`cudaStream_t`): `None`/`1` legacy default, `2` per-thread default, `-1`
    /// no synchronization, `0` refused.
    Cuda,
    /// ROCm streams (`hipStream_t`): `None`/`0` default, `-1` no synchronization.
    Rocm,
    /// Streams the array API does not standardize: `None` and `-1` only.
    Unstandardized,
}

/// Declares every device type this crate knows, once: its variant and doc, its `dlpack.h`
/// code, its name (as `Device` displays it), whether the host can reach its memory through
/// `data`, whether `data` is a plain address (so an offset can be folded into it), and its
/// stream API. Everything that depends on the device type reads it from here.
macro_rules! device_types {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $code:ident, $name:literal,
            host: $host:literal, address: $address:literal, streams: $streams:ident;
    )*) => {
        /// The `device_type` of a `DLDevice` (`dlpack.h`, `DLDeviceType`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DeviceType {
            $($(#[doc = $doc])* $variant,)*
            /// A code this crate does not know, kept as found.
            Unknown(i32),
        }

        impl DeviceType {
            /// Converts the raw `DLDevice::device_type`. Never fails: unknown codes become
            /// [`DeviceType::Unknown`].
            #[inline]
            pub const fn from_raw(raw: ffi::DLDeviceType) -> Self {
                match raw {
                    $(ffi::$code => Self::$variant,)*
                    other => Self::Unknown(other),
                }
            }

            /// The raw `DLDevice::device_type`.
            #[inline]
            pub const fn to_raw(self) -> ffi::DLDeviceType {
                match self {
                    $(Self::$variant => ffi::$code,)*
                    Self::Unknown(raw) => raw,
                }
            }

            /// Whether the host can read and write this memory directly through `data`: CPU,
            /// pinned CUDA and ROCm host memory, and CUDA managed memory (which a producer may
            /// return when `dl_device` asks for the CPU).
            #[inline]
            pub const fn is_host_accessible(self) -> bool {
                match self {
                    $(Self::$variant => $host,)*
                    Self::Unknown(_) => false,
                }
            }

            /// [`DeviceType::is_host_accessible`] of a raw `DLDevice::device_type`, without the
            /// conversion (the validation's hot path).
            #[inline]
            pub(crate) const fn raw_is_host_accessible(raw: ffi::DLDeviceType) -> bool {
                match raw {
                    $(ffi::$code => $host,)*
                    _ => false,
                }
            }

            /// Whether `data` is a plain address, so a byte offset can be folded into it.
            #[inline]
            pub(crate) const fn has_address_data(self) -> bool {
                match self {
                    $(Self::$variant => $address,)*
                    Self::Unknown(_) => false,
                }
            }

            /// How this device type's streams are named in `__dlpack__`'s `stream`.
            #[inline]
            pub(crate) const fn streams(self) -> StreamApi {
                match self {
                    $(Self::$variant => StreamApi::$streams,)*
                    Self::Unknown(_) => StreamApi::Unstandardized,
                }
            }

            /// The name `Device` displays (`cuda` in `cuda:0`); `None` for an unknown code.
            #[inline]
            pub(crate) const fn name(self) -> Option<&'static str> {
                match self {
                    $(Self::$variant => Some($name),)*
                    Self::Unknown(_) => None,
                }
            }

            /// The memory of this device type in words, with its `dlpack.h` name
            /// (`cuda memory (kDLCUDA)`).
            pub(crate) const fn memory_name(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!(
                        $name, " memory (", stringify!($code), ")"
                    ),)*
                    Self::Unknown(_) => "memory of the device type the consumer declared",
                }
            }
        }
    };
}

device_types! {
    /// `kDLCPU` (1).
    Cpu = kDLCPU, "cpu", host: true, address: true, streams: Host;
    /// `kDLCUDA` (2).
    Cuda = kDLCUDA, "cuda", host: false, address: true, streams: Cuda;
    /// `kDLCUDAHost` (3): pinned host memory from `cudaMallocHost`.
    CudaHost = kDLCUDAHost, "cuda_host", host: true, address: true, streams: Cuda;
    /// `kDLOpenCL` (4).
    OpenCl = kDLOpenCL, "opencl", host: false, address: false, streams: Unstandardized;
    /// `kDLVulkan` (7).
    Vulkan = kDLVulkan, "vulkan", host: false, address: false, streams: Unstandardized;
    /// `kDLMetal` (8).
    Metal = kDLMetal, "metal", host: false, address: false, streams: Unstandardized;
    /// `kDLVPI` (9).
    Vpi = kDLVPI, "vpi", host: false, address: false, streams: Unstandardized;
    /// `kDLROCM` (10).
    Rocm = kDLROCM, "rocm", host: false, address: true, streams: Rocm;
    /// `kDLROCMHost` (11): pinned host memory from `hipMallocHost`.
    RocmHost = kDLROCMHost, "rocm_host", host: true, address: true, streams: Rocm;
    /// `kDLExtDev` (12): reserved, implementation-defined.
    ExtDev = kDLExtDev, "ext_dev", host: false, address: false, streams: Unstandardized;
    /// `kDLCUDAManaged` (13): unified memory from `cudaMallocManaged`.
    CudaManaged = kDLCUDAManaged, "cuda_managed", host: true, address: true, streams: Cuda;
    /// `kDLOneAPI` (14).
    OneApi = kDLOneAPI, "oneapi", host: false, address: false, streams: Unstandardized;
    /// `kDLWebGPU` (15).
    WebGpu = kDLWebGPU, "webgpu", host: false, address: false, streams: Unstandardized;
    /// `kDLHexagon` (16).
    Hexagon = kDLHexagon, "hexagon", host: false, address: false, streams: Unstandardized;
    /// `kDLMAIA` (17).
    Maia = kDLMAIA, "maia", host: false, address: false, streams: Unstandardized;
    /// `kDLTrn` (18).
    Trn = kDLTrn, "trn", host: false, address: false, streams: Unstandardized;
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
        let Some(name) = self.device_type.name() else {
            return write!(
                f,
                "unknown({}):{}",
                self.device_type.to_raw(),
                self.device_id
            );
        };
        write!(f, "{name}:{}", self.device_id)
    }
}

/// The runtime whose devices a device type's ordinals count, for error messages: `"ROCm"`
/// for ROCm memory (`kDLROCM`, `kDLROCMHost`), `"CUDA"` otherwise.
pub(crate) fn runtime_name(device_type: DeviceType) -> &'static str {
    match device_type.streams() {
        StreamApi::Rocm => "ROCm",
        _ => "CUDA",
    }
}

/// `count` devices of the runtime `runtime` (`"CUDA"`, `"ROCm"`) in words, with the valid
/// ordinals, for error messages: "2 CUDA devices (0 to 1)", "no ROCm device".
pub(crate) fn devices_in_words(runtime: &str, count: i32) -> String {
    match count {
        ..=0 => format!("no {runtime} device"),
        1 => format!("1 {runtime} device (0)"),
        n => format!("{n} {runtime} devices (0 to {})", n - 1),
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
    fn device_facts_come_from_the_one_table() {
        assert_eq!(DeviceType::Cuda.memory_name(), "cuda memory (kDLCUDA)");
        assert_eq!(
            DeviceType::CudaManaged.memory_name(),
            "cuda_managed memory (kDLCUDAManaged)"
        );
        let address: Vec<_> = (-1..20)
            .map(DeviceType::from_raw)
            .filter(|t| t.has_address_data())
            .collect();
        assert_eq!(
            address,
            [
                DeviceType::Cpu,
                DeviceType::Cuda,
                DeviceType::CudaHost,
                DeviceType::Rocm,
                DeviceType::RocmHost,
                DeviceType::CudaManaged
            ]
        );
        assert_eq!(DeviceType::Cpu.streams(), StreamApi::Host);
        assert_eq!(DeviceType::CudaHost.streams(), StreamApi::Cuda);
        assert_eq!(DeviceType::RocmHost.streams(), StreamApi::Rocm);
        assert_eq!(DeviceType::Vulkan.streams(), StreamApi::Unstandardized);
        assert_eq!(DeviceType::Unknown(99).streams(), StreamApi::Unstandardized);
        assert_eq!(DeviceType::Unknown(99).name(), None);
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
