//! [`ExportError`]: a request to export that cannot be honoured.

use crate::plan::stream::StreamError;
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::layout::LayoutError;

/// A request to export that cannot be honoured (the producer side of the array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html):
/// its parameters and Raises).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The described layout is invalid or reaches outside the buffer. The message includes the
    /// [`LayoutError`]'s, so it is not also the [`source`](std::error::Error::source).
    #[error("cannot export: {0}")]
    Layout(LayoutError),
    /// The `stream` argument is illegal.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// A legacy request (no `max_version`, or major 0) of a read-only tensor with `copy=False`:
    /// a legacy `DLManagedTensor` cannot carry the read-only flag (it has no `flags`,
    /// `dlpack.h`), and without `copy=False` the consumer would get a writable copy.
    #[error(
        "copy=False, but a read-only tensor reaches a legacy (unversioned) DLManagedTensor consumer only as a copy, which cannot say read-only; expected max_version >= (1, 0), or copy=None to get a writable copy"
    )]
    ReadOnlyLegacy,
    /// The requested `dl_device` cannot be served.
    #[error(
        "cannot export a {found} tensor to dl_device {requested}, expected {}",
        reachable_devices(*found)
    )]
    UnsupportedDevice {
        /// The tensor's device.
        found: Device,
        /// The device asked for.
        requested: Device,
    },
    /// The `dl_device` asked for is a CUDA device (feature `cuda`) or a ROCm device (feature
    /// `hip`) that the process does not have: its ordinal is negative, or not below the number
    /// of devices of that runtime, which the message names ("2 ROCm devices (0 to 1)").
    #[error(
        "dl_device {requested} does not exist: the process has {}",
        crate::tensor::device::devices_in_words(
            crate::tensor::device::runtime_name(requested.device_type),
            *count
        )
    )]
    NoSuchDevice {
        /// The device asked for.
        requested: Device,
        /// The number of devices of the requested device's runtime (CUDA or ROCm) in the
        /// process.
        count: i32,
    },
    /// `copy=False` but serving the request needs a copy.
    #[error("copy=False but exporting a {found} tensor to dl_device {requested} needs a copy")]
    CopyRequired {
        /// The tensor's device.
        found: Device,
        /// The device asked for.
        requested: Device,
    },
    /// A copy is needed or asked for, but this crate cannot make it: host-accessible memory is
    /// copied to `cpu:0` only (a copy of `cuda_host` memory onto `cuda_host` would need pinned
    /// memory), and CUDA device memory needs the `cuda` feature.
    #[error(
        "cannot copy {device} memory onto {device}, expected cpu:0 memory, a copy to dl_device cpu:0 of host-accessible memory, or CUDA device memory with the `cuda` feature"
    )]
    CopyUnsupported {
        /// The tensor's device.
        device: Device,
    },
    /// A CUDA driver call (stream ordering, a copy, a check) failed, or no driver is present.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::engine::cuda::CudaError),
    /// A HIP runtime call (stream ordering of a ROCm tensor, a copy, a check) failed, no HIP
    /// runtime is present, or a stream of the wrong API was named (feature `hip`).
    #[cfg(feature = "hip")]
    #[error(transparent)]
    Hip(#[from] crate::engine::hip::HipError),
    /// A legacy tensor was asked, with `copy=False`, of a tensor that exists only as a
    /// versioned one (without `copy=False` the consumer gets a copy).
    #[error(
        "copy=False, but this tensor exists only as a versioned DLManagedTensorVersioned, expected max_version >= (1, 0), or copy=None to get a copy"
    )]
    VersionedOnly,
    /// The data buffer carries a layout of its own ([`ExportBuffer::own_layout`], an
    /// `ndarray::Array`), and the layout the tensor type declares beside it disagrees: either
    /// would export values other than the buffer's.
    ///
    /// [`ExportBuffer::own_layout`]: crate::ExportBuffer::own_layout
    #[error(
        "the tensor declares {what} {declared}, but its data buffer (an ndarray array, say) has its own layout with {what} {own}; expected the buffer's own {what} (a buffer with a layout of its own exports that layout: leave out the strides and offset fields, or set them from the buffer)"
    )]
    BufferLayout {
        /// What disagrees: `shape`, `strides` (in elements), `byte_offset` or `dtype`.
        what: &'static str,
        /// What the tensor type declares.
        declared: String,
        /// What the buffer's own layout says.
        own: String,
    },
    /// The device field of the tensor disagrees with the buffer's own device.
    #[error("the device field says {field} but the buffer lives on {buffer}")]
    DeviceMismatch {
        /// Device named by the `#[dlpack(device)]` field.
        field: Device,
        /// Device the buffer reports.
        buffer: Device,
    },
}

/// The `dl_device` values an export of a `found` tensor can serve, for error messages.
fn reachable_devices(found: Device) -> String {
    let cuda = super::COPIES_CUDA_MEMORY;
    if found == Device::CPU {
        if cuda {
            "cpu:0 or a CUDA device".to_owned()
        } else {
            "cpu:0".to_owned()
        }
    } else if cuda && matches!(found.device_type, DeviceType::Cuda | DeviceType::CudaHost) {
        format!("{found}, cpu:0 or a CUDA device")
    } else if cfg!(feature = "hip") && found.device_type == DeviceType::Rocm {
        format!("{found}, cpu:0 or a ROCm device")
    } else if found.is_host_accessible() {
        format!("{found} or cpu:0")
    } else {
        found.to_string()
    }
}

impl From<LayoutError> for ExportError {
    fn from(err: LayoutError) -> Self {
        Self::Layout(err)
    }
}
