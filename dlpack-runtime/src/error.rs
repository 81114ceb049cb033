//! Error types, one per concern. Every variant names what was found and what was expected.

use crate::device::Device;
use crate::dtype::DataType;
use crate::ffi::DLPackVersion;
use crate::layout::Contiguity;

/// A `DLTensor` layout that cannot be read safely, or a typed access it does not allow
/// (spec sections 1.5 to 1.7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `ndim` is negative.
    #[error("`ndim` is {ndim}, expected a value >= 0")]
    NegativeNdim {
        /// The `ndim` found.
        ndim: i32,
    },
    /// `ndim` exceeds [`crate::layout::MAX_NDIM`].
    #[error("`ndim` is {ndim}, expected at most {max}")]
    TooManyDims {
        /// The `ndim` found.
        ndim: usize,
        /// The largest `ndim` accepted.
        max: usize,
    },
    /// `shape` is NULL although `ndim > 0`.
    #[error("`shape` is NULL for a tensor of ndim {ndim}, expected {ndim} extents")]
    NullShape {
        /// The `ndim` of the tensor.
        ndim: usize,
    },
    /// `strides` is NULL for a tensor whose version requires them (DLPack >= 1.2, `ndim > 0`).
    #[error(
        "`strides` is NULL for a tensor of ndim {ndim}, expected {ndim} strides (required since DLPack 1.2)"
    )]
    NullStrides {
        /// The `ndim` of the tensor.
        ndim: usize,
    },
    /// An extent is negative.
    #[error("extent of axis {axis} is {extent}, expected a value >= 0")]
    NegativeExtent {
        /// The axis.
        axis: usize,
        /// The extent found.
        extent: i64,
    },
    /// The dtype has zero bits or zero lanes.
    #[error("dtype {dtype} has zero width, expected bits > 0 and lanes > 0")]
    ZeroWidthDtype {
        /// The dtype found.
        dtype: DataType,
    },
    /// A dtype whose code fixes its width (float6, float4) has another width.
    #[error("dtype {dtype} has {} bits, expected {expected_bits}", dtype.bits)]
    DtypeWidth {
        /// The dtype found.
        dtype: DataType,
        /// The width its code requires.
        expected_bits: u8,
    },
    /// An extent, stride or offset computation overflows.
    #[error("the {what} overflows, expected a layout whose extent fits in the address space")]
    Overflow {
        /// Which computation overflowed.
        what: &'static str,
    },
    /// `data` is NULL for a tensor with elements.
    #[error("`data` is NULL for a tensor of {numel} elements, expected a pointer")]
    NullData {
        /// Number of elements.
        numel: usize,
    },
    /// The dtype is not the one the access asks for.
    #[error("dtype is {found}, expected {expected}")]
    DtypeMismatch {
        /// The tensor's dtype.
        found: DataType,
        /// The dtype asked for.
        expected: DataType,
    },
    /// The memory cannot be read by the host.
    #[error(
        "data lives on {device}, expected host-accessible memory (cpu, cuda_host, rocm_host or cuda_managed)"
    )]
    NotHostAccessible {
        /// The tensor's device.
        device: Device,
    },
    /// The first element is not aligned for the element type.
    #[error("first element at address {address:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Address of element (0, ..., 0).
        address: usize,
        /// Alignment required.
        align: usize,
    },
    /// The layout is not compact in the order asked for.
    #[error("tensor of shape {shape:?} and strides {strides:?} (elements) is not {}", contiguity_name(*expected))]
    NotContiguous {
        /// The order asked for.
        expected: Contiguity,
        /// Shape found, in elements.
        shape: Vec<i64>,
        /// Strides found, in elements.
        strides: Vec<i64>,
    },
    /// An element holds a bit pattern that is not a valid value of the element type
    /// (a `bool` byte other than 0 or 1).
    #[error("element {index} holds the byte pattern {bytes:?}, expected a valid {dtype}")]
    InvalidValue {
        /// Position of the element in logical row-major order.
        index: usize,
        /// Its bytes.
        bytes: Vec<u8>,
        /// The dtype.
        dtype: DataType,
    },
    /// Mutable access to a tensor flagged read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    #[error(
        "tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY, or a legacy capsule), expected writable memory"
    )]
    ReadOnly,
    /// An element index of the wrong rank.
    #[error("index has {found} coordinates, expected {expected}")]
    IndexRank {
        /// Coordinates given.
        found: usize,
        /// `ndim`.
        expected: usize,
    },
    /// An element index outside the shape.
    #[error("index {index} on axis {axis} is out of bounds for extent {extent}")]
    IndexOutOfBounds {
        /// The axis.
        axis: usize,
        /// The index given.
        index: usize,
        /// The extent of the axis.
        extent: i64,
    },
    /// Element-wise access to a dtype whose elements are not whole bytes.
    #[error(
        "dtype {dtype} has elements that are not whole bytes, expected a byte-sized dtype for element access"
    )]
    SubByteAccess {
        /// The dtype.
        dtype: DataType,
    },
    /// The layout reaches outside the buffer it describes (export side).
    #[error(
        "layout reaches bytes [{start}, {end}) of a buffer of {len} bytes, expected a span inside [0, {len})"
    )]
    OutOfBuffer {
        /// First byte reached, relative to the buffer start.
        start: isize,
        /// One past the last byte reached.
        end: isize,
        /// Buffer length in bytes.
        len: usize,
    },
    /// A mutable view was asked of a layout in which two indices reach the same element.
    #[error(
        "tensor of shape {shape:?} and strides {strides:?} (elements) has overlapping elements, expected a layout without aliasing for mutable access"
    )]
    Overlapping {
        /// Shape found, in elements.
        shape: Vec<i64>,
        /// Strides found, in elements.
        strides: Vec<i64>,
    },
    /// A copy of the elements cannot be allocated: a stride-0 broadcast, say, describes more
    /// elements than memory can hold.
    #[error(
        "copying {numel} elements of {element_bytes} bytes cannot be allocated, expected a copy that fits in memory"
    )]
    CopyTooLarge {
        /// Elements to copy.
        numel: usize,
        /// Bytes per element.
        element_bytes: usize,
    },
    /// An exported `byte_offset` is not a multiple of the element size, so it would split the
    /// buffer's elements (export side).
    #[error(
        "byte_offset is {byte_offset} bytes, expected a multiple of the element size ({element_bytes} bytes); is it given in elements?"
    )]
    OffsetNotElementAligned {
        /// The offset given, in bytes.
        byte_offset: usize,
        /// Size of one element in bytes.
        element_bytes: usize,
    },
    /// A producer described a different `ndim` on a second call (export side).
    #[error("the producer described {before} axes, then {after}, expected a stable shape")]
    ShapeChanged {
        /// Axes on the first call.
        before: usize,
        /// Axes on the second call.
        after: usize,
    },
    /// `shape` and `strides` have different lengths (export side).
    #[error("shape has {shape} axes and strides have {strides}, expected the same number")]
    StridesRank {
        /// Axes in the shape.
        shape: usize,
        /// Entries in the strides.
        strides: usize,
    },
}

fn contiguity_name(c: Contiguity) -> &'static str {
    match c {
        Contiguity::C => "C-contiguous (row-major)",
        Contiguity::F => "F-contiguous (column-major)",
        Contiguity::Any => "contiguous (C or F order)",
    }
}

/// A `stream` argument that is not legal for the device (spec section 2.4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream value is not one of the legal values for the device type.
    #[error("stream={} is not valid for a consumer on {device}, expected {allowed}", display_stream(*found))]
    Invalid {
        /// The stream value given (`None` for Python's `None`).
        found: Option<i64>,
        /// The device the consumer will use: `dl_device` when given, else the tensor's.
        device: Device,
        /// The legal values, in words.
        allowed: &'static str,
    },
    /// Streams on this device type are not supported by this crate yet.
    #[error(
        "stream={found} for a {device} tensor: synchronization on this device is not supported, expected stream=None or -1"
    )]
    Unsupported {
        /// The stream value given.
        found: i64,
        /// The tensor's device.
        device: Device,
    },
}

fn display_stream(s: Option<i64>) -> String {
    s.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

/// A request to export that cannot be honoured (the producer side of `__dlpack__`,
/// spec sections 2.4 to 2.8).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The described layout is invalid or reaches outside the buffer.
    #[error("cannot export: {0}")]
    Layout(#[from] LayoutError),
    /// The `stream` argument is illegal.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// `max_version` names a major version below 1 while the tensor is read-only: a legacy
    /// `DLManagedTensor` cannot carry the read-only flag (spec section 2.7).
    #[error(
        "a read-only tensor cannot be exported as a legacy (unversioned) DLManagedTensor, expected max_version >= (1, 0)"
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
    /// `copy=False` but serving the request needs a copy.
    #[error("copy=False but exporting to {requested} needs a copy")]
    CopyRequired {
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
    #[error("CUDA: {0}")]
    Cuda(#[from] crate::cuda::CudaError),
    /// A legacy tensor was asked of a tensor that exists only as a versioned one.
    #[error(
        "this tensor exists only as a versioned DLManagedTensorVersioned, expected max_version >= (1, 0)"
    )]
    VersionedOnly,
    /// The device field of the tensor disagrees with the buffer's own device.
    #[error("the device field says {field} but the buffer lives on {buffer}")]
    DeviceMismatch {
        /// Device named by the `#[dlpack(device)]` field.
        field: Device,
        /// Device the buffer reports.
        buffer: Device,
    },
}

/// A tensor that cannot be imported, or does not meet the consumer's constraints
/// (spec sections 1.7, 1.12, 2.3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The managed tensor is NULL.
    #[error("managed tensor pointer is NULL, expected a DLManagedTensor(Versioned)")]
    NullTensor,
    /// `version.major` is not 1; the tensor was handed back to its deleter unread.
    #[error("DLPack version {}.{} is not supported, expected major version 1", found.major, found.minor)]
    UnsupportedVersion {
        /// The version found.
        found: DLPackVersion,
    },
    /// `flags` has bits this crate does not know; the tensor was handed back to its deleter.
    #[error(
        "flags {flags:#x} are not defined by DLPack 1.3 (tensor version {}.{}), expected only READ_ONLY (0x1), IS_COPIED (0x2) and IS_SUBBYTE_TYPE_PADDED (0x4)",
        version.major,
        version.minor
    )]
    UnknownFlags {
        /// The unknown bits.
        flags: u64,
        /// The tensor's version.
        version: DLPackVersion,
    },
    /// The layout is invalid or does not meet the consumer's constraints.
    #[error("cannot import: {0}")]
    Layout(#[from] LayoutError),
    /// The consumer requires writable memory and the tensor is read-only.
    #[error("tensor is read-only, expected writable memory (the consumer is declared `writable`)")]
    ReadOnly,
    /// The tensor's device is not one the consumer accepts.
    #[error("tensor lives on {found}, expected {expected}")]
    Device {
        /// Device found.
        found: Device,
        /// Devices accepted, in words.
        expected: &'static str,
    },
    /// The consumer's rank constraint fails.
    #[error("tensor has ndim {found}, expected {expected}")]
    Ndim {
        /// `ndim` found.
        found: usize,
        /// `ndim` required.
        expected: usize,
    },
    /// The consumer's dtype constraint (`dtype = ...`) fails.
    #[error("tensor has dtype {found}, expected {expected}")]
    Dtype {
        /// The tensor's dtype.
        found: DataType,
        /// The dtype required.
        expected: DataType,
    },
    /// The consumer's shape constraint (`shape = [...]`) fails.
    #[error(
        "tensor has shape {found:?}, expected {}",
        display_shape_pattern(expected)
    )]
    Shape {
        /// Extents found, in elements.
        found: Vec<usize>,
        /// Extents required, one per axis; `None` accepts any extent (written `_`).
        expected: Vec<Option<usize>>,
    },
    /// No variant of a storage enum (`#[derive(DlpackImportStorage)]`) accepts the tensor.
    #[error(
        "no variant of `{storage}` accepts the tensor: {}",
        display_reasons(reasons)
    )]
    NoVariant {
        /// The storage enum's name.
        storage: &'static str,
        /// Each variant's name and why it refused, in declaration order.
        reasons: Vec<(&'static str, ImportError)>,
    },
    /// The producer failed to export.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A Python-side failure (capsule, protocol) with its message.
    #[error("{0}")]
    Protocol(String),
}

fn display_shape_pattern(pattern: &[Option<usize>]) -> String {
    let axes: Vec<String> = pattern
        .iter()
        .map(|axis| axis.map_or_else(|| "_".to_owned(), |extent| extent.to_string()))
        .collect();
    format!("[{}]", axes.join(", "))
}

fn display_reasons(reasons: &[(&'static str, ImportError)]) -> String {
    let reasons: Vec<String> = reasons
        .iter()
        .map(|(variant, error)| format!("`{variant}` refuses it ({error})"))
        .collect();
    reasons.join("; ")
}

/// The `dl_device` values an export of a `found` tensor can serve, for error messages.
fn reachable_devices(found: Device) -> String {
    if found == Device::CPU {
        "cpu:0".to_owned()
    } else if found.is_host_accessible()
        || cfg!(feature = "cuda") && found.device_type == crate::DeviceType::Cuda
    {
        format!("{found} or cpu:0")
    } else {
        found.to_string()
    }
}
