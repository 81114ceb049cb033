//! [`LayoutError`]: a layout that cannot be read safely, or a typed access it does not allow.

use super::Contiguity;
use crate::borrow::BorrowError;
use crate::tensor::device::Device;
use crate::tensor::dtype::DataType;

/// A `DLTensor` layout that cannot be read safely, or a typed access it does not allow
/// (`dlpack.h`, `DLTensor` and `DLDataType`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `ndim` is negative.
    #[error("`ndim` is {ndim}, expected a value >= 0")]
    NegativeNdim {
        /// The `ndim` found.
        ndim: i32,
    },
    /// `ndim` exceeds [`crate::tensor::layout::MAX_NDIM`].
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
    /// The access would alias another import's borrow of the same memory (see
    /// [`ImportedData`](crate::ImportedData)'s borrows).
    #[error(transparent)]
    Borrow(#[from] BorrowError),
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
    /// An export's layout reaches outside its buffer, and its strides look like byte strides:
    /// whole multiples of the element size that, divided by it, would keep the layout inside.
    #[error(
        "layout reaches bytes [{start}, {end}) of a buffer of {len} bytes, expected a span inside [0, {len}); strides are in elements, and these look like bytes: divided by the element size ({element_bytes} bytes) they would fit"
    )]
    StridesInBytes {
        /// First byte reached, relative to the buffer start.
        start: isize,
        /// One past the last byte reached.
        end: isize,
        /// Buffer length in bytes.
        len: usize,
        /// Bytes per element.
        element_bytes: usize,
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
