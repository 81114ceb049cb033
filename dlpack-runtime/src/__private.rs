//! Items that generated code calls. Not public API: no stability promise.

pub use crate::borrow::Access;
pub use crate::export::{
    AsExportBuffer, AsProducerStream, AsShape, AsStrides, BufferAccess, DlpackExport, ExportBuffer,
    ExportParts,
};
pub use crate::import::{
    DlpackImport, FromShape, FromStrides, ImportBuffer, ImportConstraints, ImportError,
};
pub use crate::tensor::device::{Device, DeviceType};
pub use crate::tensor::dtype::{DataType, Element};
pub use crate::tensor::layout::Contiguity;
pub use crate::tensor::managed::ManagedTensor;

use crate::tensor::layout::{LayoutError, TensorLayout};

/// The type of a `#[dlpack(byte_offset)]` field: bytes from the start of the data field's
/// buffer to element `(0, ..., 0)`, a `usize`, read by an export and written by an import (see
/// [`import_byte_offset`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(byte_offset)]` field",
    label = "expected `usize`",
    note = "`#[dlpack(byte_offset)]` is the start of element (0, ..., 0) in bytes from the buffer start, a `usize` as in `dlpack.h`'s `DLTensor::byte_offset`: declare the field `usize` (convert from your own type where you set it)"
)]
pub trait ByteOffsetField {
    /// The value an export reads.
    fn to_role(&self) -> usize;
    /// The field an import writes.
    fn from_role(value: usize) -> Self;
}

/// The type of a `#[dlpack(offset)]` field: elements from the start of the data field's buffer
/// to element `(0, ..., 0)`, a `usize`, read by an export and written by an import (see
/// [`import_offset`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(offset)]` field",
    label = "expected `usize`",
    note = "`#[dlpack(offset)]` is the start of element (0, ..., 0) in elements from the buffer start, a `usize`: declare the field `usize` (convert from your own type where you set it), or count bytes in a `usize` field marked `#[dlpack(byte_offset)]`"
)]
pub trait OffsetField {
    /// The value an export reads.
    fn to_role(&self) -> usize;
    /// The field an import writes.
    fn from_role(value: usize) -> Self;
}

/// The type of a `#[dlpack(readonly)]` field: whether the memory may not be written.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(readonly)]` field",
    label = "expected `bool`",
    note = "`#[dlpack(readonly)]` says whether the tensor's memory may not be written, a `bool` (`DLPACK_FLAG_BITMASK_READ_ONLY`): declare the field `bool`; a type that is always read-only is marked `#[dlpack(readonly)]` on the struct instead"
)]
pub trait ReadonlyField {
    /// The value an export reads.
    fn to_role(&self) -> bool;
    /// The field an import writes.
    fn from_role(value: bool) -> Self;
}

/// The type of a `#[dlpack(device)]` field: where the memory lives, a [`Device`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(device)]` field",
    label = "expected `dlpack_runtime::Device`",
    note = "`#[dlpack(device)]` holds a `dlpack_runtime::Device` (`Device::CPU`, `Device::cuda(0)`, `Device::from_raw(...)`), `dlpack.h`'s `DLDevice`: declare the field `Device`; a name such as \"cuda:0\" is not parsed"
)]
pub trait DeviceField {
    /// The value an export reads.
    fn to_role(&self) -> Device;
    /// The field an import writes.
    fn from_role(value: Device) -> Self;
}

/// The type of a `#[dlpack(dtype)]` field: the element type at run time, a [`DataType`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(dtype)]` field",
    label = "expected `dlpack_runtime::DataType`",
    note = "`#[dlpack(dtype)]` holds a `dlpack_runtime::DataType` (`DataType::F16`, `<f32 as Element>::DTYPE`), `dlpack.h`'s `DLDataType`: declare the field `DataType`; a consumer that needs one element type writes `#[dlpack(dtype = f32)]` on the struct"
)]
pub trait DtypeField {
    /// The value an export reads.
    fn to_role(&self) -> DataType;
    /// The field an import writes.
    fn from_role(value: DataType) -> Self;
}

impl ByteOffsetField for usize {
    #[inline(always)]
    fn to_role(&self) -> usize {
        *self
    }
    #[inline(always)]
    fn from_role(value: usize) -> Self {
        value
    }
}

impl OffsetField for usize {
    #[inline(always)]
    fn to_role(&self) -> usize {
        *self
    }
    #[inline(always)]
    fn from_role(value: usize) -> Self {
        value
    }
}

impl ReadonlyField for bool {
    #[inline(always)]
    fn to_role(&self) -> bool {
        *self
    }
    #[inline(always)]
    fn from_role(value: bool) -> Self {
        value
    }
}

impl DeviceField for Device {
    #[inline(always)]
    fn to_role(&self) -> Device {
        *self
    }
    #[inline(always)]
    fn from_role(value: Device) -> Self {
        value
    }
}

impl DtypeField for DataType {
    #[inline(always)]
    fn to_role(&self) -> DataType {
        *self
    }
    #[inline(always)]
    fn from_role(value: DataType) -> Self {
        value
    }
}

/// Generated `DlpackImport` code, `#[dlpack(dtype = T)]` beside a data field of one element
/// type ([`ImportBuffer::ELEMENT_DTYPE`]): whether the two agree, evaluated in a constant so
/// that a contradiction is a compile error at the constraint.
pub const fn dtypes_agree(data: Option<DataType>, constraint: DataType) -> bool {
    let Some(data) = data else {
        return true;
    };
    let (a, b) = (data.to_raw(), constraint.to_raw());
    a.code == b.code && a.bits == b.bits && a.lanes == b.lanes
}

/// Generated `DlpackImport` code: the validated layout under `constraints`.
#[inline(always)]
pub fn import_layout<'a>(
    managed: &'a ManagedTensor,
    constraints: &ImportConstraints,
) -> Result<TensorLayout<'a>, ImportError> {
    constraints.check(managed)
}

/// Generated `DlpackImport` code, `#[dlpack(byte_offset)]`: bytes from the first byte the
/// layout reaches to element `(0, ..., 0)`, where that element lies in the buffer the data field
/// lends when it is exported again (an import lends the bytes its layout reaches). 0 for a
/// tensor without elements.
#[inline]
pub fn import_byte_offset(layout: &TensorLayout<'_>) -> usize {
    crate::import::lent_byte_offset(layout)
}

/// Generated `DlpackImport` code, `#[dlpack(offset)]`: [`import_byte_offset`] in elements.
///
/// # Errors
///
/// [`LayoutError::SubByteAccess`] for a non-zero offset of a dtype whose elements are not whole
/// bytes (an offset in elements cannot say it: count bytes with `#[dlpack(byte_offset)]`),
/// [`LayoutError::OffsetNotElementAligned`] should the offset split an element (strides are
/// whole elements, so it does not for a valid layout).
#[inline]
pub fn import_offset(layout: &TensorLayout<'_>) -> Result<usize, ImportError> {
    let byte_offset = import_byte_offset(layout);
    if byte_offset == 0 {
        return Ok(0);
    }
    let dtype = layout.dtype();
    let size = dtype
        .element_bytes()
        .ok_or(LayoutError::SubByteAccess { dtype })?;
    if byte_offset % size != 0 {
        return Err(LayoutError::OffsetNotElementAligned {
            byte_offset,
            element_bytes: size,
        }
        .into());
    }
    Ok(byte_offset / size)
}

/// Generated `DlpackImportStorage` code: the error when no variant accepts the tensor.
pub fn no_variant<const N: usize>(
    storage: &'static str,
    reasons: [(&'static str, ImportError); N],
) -> ImportError {
    ImportError::NoVariant {
        storage,
        reasons: reasons.into(),
    }
}

/// The bound generated where a consumer constraint (`dtype = ...`, `shape = [...]`, ...) is
/// written on a type that derives `DlpackExport`: it holds when the type also derives
/// `DlpackImport`, where the constraint applies.
#[diagnostic::on_unimplemented(
    message = "consumer constraints apply to `DlpackImport`, and `{Self}` is not a consumer",
    label = "checked when importing, so it needs `#[derive(DlpackImport)]`",
    note = "a producer describes its tensor with field roles; remove the constraint, or derive `DlpackImport` for `{Self}` too"
)]
pub trait ConstraintNeedsImport {}

impl<T: DlpackImport> ConstraintNeedsImport for T {}

/// Generated where a consumer constraint is written on a `DlpackExport` type.
pub fn constraint_needs_import<T: ConstraintNeedsImport>() {}

/// The bound generated where the container flag `#[dlpack(readonly)]` is written on a type that
/// derives `DlpackImport`: it holds when the type also derives `DlpackExport`, where the flag
/// applies.
#[diagnostic::on_unimplemented(
    message = "`#[dlpack(readonly)]` on the struct makes exports read-only, and `{Self}` is not a producer",
    label = "applies to `DlpackExport`",
    note = "a consumer requires writable memory with `#[dlpack(writable)]`, or receives the read-only flag in a `bool` field marked `#[dlpack(readonly)]`"
)]
pub trait ReadonlyNeedsExport {}

impl<T: DlpackExport> ReadonlyNeedsExport for T {}

/// Generated where the container flag `#[dlpack(readonly)]` is written on a `DlpackImport` type.
pub fn readonly_needs_export<T: ReadonlyNeedsExport>() {}

/// Generated `DlpackImport` code: keeps its tokens (the `pyo3::FromPyObject` impl) when the
/// runtime has the `python` feature.
#[cfg(feature = "python")]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_python {
    ($($tokens:tt)*) => { $($tokens)* };
}

/// Generated `DlpackImport` code: drops its tokens without the `python` feature.
#[cfg(not(feature = "python"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __if_python {
    ($($tokens:tt)*) => {};
}

#[cfg(feature = "python")]
pub use pyo3;

/// Generated `FromPyObject` code: `python::from_dlpack` of the argument.
#[cfg(feature = "python")]
pub fn from_py_object<T: DlpackImport>(
    obj: pyo3::Borrowed<'_, '_, pyo3::PyAny>,
) -> pyo3::PyResult<T> {
    crate::python::from_dlpack(&obj)
}

/// Generated `DlpackExport` code, `#[dlpack(stream)]`: adds the field's stream to the parts.
#[cfg(feature = "cuda")]
#[inline]
pub fn with_stream<'a, S: AsProducerStream + ?Sized>(
    parts: ExportParts<'a>,
    field: &'a S,
) -> ExportParts<'a> {
    parts.with_stream(field.as_producer_stream())
}

/// The bound of `with_stream` without the `cuda` feature: never met, so a `#[dlpack(stream)]`
/// field is one error that names the feature.
#[cfg(not(feature = "cuda"))]
#[diagnostic::on_unimplemented(
    message = "`#[dlpack(stream)]` needs the `cuda` feature of dlpack-runtime",
    label = "a stream field, without the `cuda` feature",
    note = "enable it: `features = [\"cuda\"]` on the dlpack-runtime dependency; stream fields are cudarc `CudaStream`s"
)]
pub trait StreamNeedsCuda {}

/// Generated `DlpackExport` code, `#[dlpack(stream)]`, without the `cuda` feature: an error.
#[cfg(not(feature = "cuda"))]
#[inline]
pub fn with_stream<'a, S: StreamNeedsCuda + ?Sized>(
    parts: ExportParts<'a>,
    _field: &'a S,
) -> ExportParts<'a> {
    parts
}
