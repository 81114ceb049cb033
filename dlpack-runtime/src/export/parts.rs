//! [`ExportParts`], what a producer exports, and the traits of the derive's field roles:
//! [`AsShape`], [`AsStrides`], [`AsProducerStream`].

use super::device::Streams;
use super::{BufferAccess, ExportBuffer, ExportError};
use crate::tensor::device::Device;
use crate::tensor::dtype::DataType;
use crate::tensor::layout::LayoutError;

/// A type usable as `#[dlpack(shape)]` of an exported tensor: extents in elements.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `#[dlpack(shape)]` of an exported tensor",
    note = "shapes are `Vec<usize>`, `[usize; N]` or `Box<[usize]>`; other types implement `dlpack_runtime::AsShape`"
)]
pub trait AsShape {
    /// Extents in elements.
    fn as_shape(&self) -> &[usize];
}

/// A type usable as `#[dlpack(strides)]` of an exported tensor: strides in elements (signed),
/// or `None` for compact row-major.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `#[dlpack(strides)]` of an exported tensor",
    note = "strides are `Vec<isize>`, `[isize; N]`, `Box<[isize]>` or `Option` of those, in elements; other types implement `dlpack_runtime::AsStrides`"
)]
pub trait AsStrides {
    /// Strides in elements, or `None` for compact row-major.
    fn as_strides(&self) -> Option<&[isize]>;
}

impl AsShape for Vec<usize> {
    #[inline]
    fn as_shape(&self) -> &[usize] {
        self
    }
}
impl AsShape for Box<[usize]> {
    #[inline]
    fn as_shape(&self) -> &[usize] {
        self
    }
}
impl<const N: usize> AsShape for [usize; N] {
    #[inline]
    fn as_shape(&self) -> &[usize] {
        self
    }
}
impl AsStrides for Vec<isize> {
    #[inline]
    fn as_strides(&self) -> Option<&[isize]> {
        Some(self)
    }
}
impl AsStrides for Box<[isize]> {
    #[inline]
    fn as_strides(&self) -> Option<&[isize]> {
        Some(self)
    }
}
impl<const N: usize> AsStrides for [isize; N] {
    #[inline]
    fn as_strides(&self) -> Option<&[isize]> {
        Some(self)
    }
}
impl<S: AsStrides> AsStrides for Option<S> {
    #[inline]
    fn as_strides(&self) -> Option<&[isize]> {
        self.as_ref().and_then(AsStrides::as_strides)
    }
}

/// What a producer exports: a borrowed buffer and the layout of the tensor inside it.
///
/// Units: `shape` in elements; `strides` in elements, signed (`None`: compact row-major); the
/// offset from the buffer start to logical element `(0, ..., 0)` in bytes
/// ([`with_byte_offset`](Self::with_byte_offset)) or in elements
/// ([`with_offset`](Self::with_offset)).
///
/// ```
/// use dlpack_runtime::{DataType, DlpackExport, ExportParts};
///
/// /// Float16 values kept as raw bytes, with a start offset in elements.
/// struct Halves {
///     bytes: Vec<u8>,
///     shape: [usize; 1],
///     start: usize,
/// }
///
/// impl DlpackExport for Halves {
///     fn export_parts(&self) -> ExportParts<'_> {
///         ExportParts::shared(&self.bytes, &self.shape)
///             .with_dtype(DataType::F16)
///             .with_offset(self.start)
///     }
///     fn export_parts_mut(&mut self) -> ExportParts<'_> {
///         ExportParts::unique(&mut self.bytes, &self.shape)
///             .with_dtype(DataType::F16)
///             .with_offset(self.start)
///     }
/// }
///
/// // 0x3c00 is 1.0 in float16 (little-endian bytes `00 3c`): skip one element, keep two.
/// let h = Halves { bytes: vec![0, 0, 0x00, 0x3c, 0x00, 0x3c], shape: [2], start: 1 };
/// let managed = h.into_dlpack()?;
/// assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), DataType::F16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ExportParts<'a> {
    /// The buffer itself, for what only some exports ask (its producer stream, a loan).
    pub(super) buffer: BufferAccess<'a>,
    /// The buffer's facts, asked once where the parts are made, where the buffer's type is
    /// known (so the calls are direct): base pointer, length in bytes, dtype, device.
    pub(super) facts: BufferFacts,
    pub(super) shape: &'a [usize],
    pub(super) strides: Option<&'a [isize]>,
    pub(super) offset: Offset,
    pub(super) dtype: Option<DataType>,
    pub(super) device: Option<Device>,
    pub(super) read_only: bool,
    /// `#[dlpack(stream)]` fields with pending work (feature `cuda`).
    pub(super) streams: Streams<'a>,
}

/// What an export reads of its buffer, read once (see [`ExportParts`]).
#[derive(Clone, Copy)]
pub(super) struct BufferFacts {
    /// [`ExportBuffer::as_ptr`].
    pub(super) ptr: *const core::ffi::c_void,
    /// [`ExportBuffer::byte_len`].
    pub(super) byte_len: usize,
    /// [`ExportBuffer::dtype`].
    pub(super) dtype: DataType,
    /// [`ExportBuffer::device`].
    pub(super) device: Device,
    /// [`ExportBuffer::as_mut_ptr`] of a unique borrow; `None` for a shared one.
    pub(super) mut_ptr: Option<*mut core::ffi::c_void>,
    /// [`ExportBuffer::is_unaliased`].
    pub(super) unaliased: bool,
    /// Whether [`ExportBuffer::own_layout`] is `Some`: the layout is then checked against it.
    pub(super) own_layout: bool,
}

impl BufferFacts {
    #[inline(always)]
    fn of(access: &mut BufferAccess<'_>) -> Self {
        let buffer = access.buffer();
        let (ptr, byte_len, dtype, device, unaliased, own_layout) = (
            buffer.as_ptr(),
            buffer.byte_len(),
            buffer.dtype(),
            buffer.device(),
            buffer.is_unaliased(),
            buffer.own_layout().is_some(),
        );
        // The writable pointer is asked last, and when there is one it serves as the read-only
        // pointer too: taking it borrows the memory uniquely, which invalidates pointers taken
        // before (Rust's aliasing rules, as Miri checks them).
        let mut_ptr = match access {
            BufferAccess::Unique(b) => b.as_mut_ptr(),
            BufferAccess::Shared(_) => None,
        };
        Self {
            ptr: mut_ptr.map_or(ptr, |p| p.cast_const()),
            byte_len,
            dtype,
            device,
            mut_ptr,
            unaliased,
            own_layout,
        }
    }
}

/// Where element `(0, ..., 0)` starts, in the unit the producer keeps.
#[derive(Clone, Copy)]
pub(super) enum Offset {
    Bytes(usize),
    Elements(usize),
}

impl<'a> ExportParts<'a> {
    /// Parts borrowing `buffer` as `access` says: [`BufferAccess::Unique`] as
    /// [`ExportParts::unique`], [`BufferAccess::Shared`] as [`ExportParts::shared`]. This is how
    /// an [`AsExportBuffer`](crate::AsExportBuffer) is exported by value:
    /// `ExportParts::new(storage.as_export_buffer_mut(), shape)`.
    #[inline]
    pub fn new(mut access: BufferAccess<'a>, shape: &'a [usize]) -> Self {
        let read_only = matches!(access, BufferAccess::Shared(_));
        Self {
            facts: BufferFacts::of(&mut access),
            buffer: access,
            shape,
            strides: None,
            offset: Offset::Bytes(0),
            dtype: None,
            device: None,
            read_only,
            streams: Streams::default(),
        }
    }

    /// Parts borrowing `buffer` uniquely: the export is writable unless marked read-only or the
    /// buffer is shared (see [`ExportBuffer::as_mut_ptr`]).
    #[inline]
    pub fn unique(buffer: &'a mut dyn ExportBuffer, shape: &'a [usize]) -> Self {
        Self::new(BufferAccess::Unique(buffer), shape)
    }

    /// Parts borrowing `buffer` shared: the export is read-only.
    #[inline]
    pub fn shared(buffer: &'a dyn ExportBuffer, shape: &'a [usize]) -> Self {
        Self::new(BufferAccess::Shared(buffer), shape)
    }

    /// Sets the strides, in elements (`None`: compact row-major).
    #[inline]
    pub fn with_strides(mut self, strides: Option<&'a [isize]>) -> Self {
        self.strides = strides;
        self
    }

    /// Sets the offset in **bytes** from the buffer start to element `(0, ..., 0)`. It must be a
    /// multiple of the element size. Replaces an offset set by [`with_offset`](Self::with_offset).
    #[inline]
    pub fn with_byte_offset(mut self, byte_offset: usize) -> Self {
        self.offset = Offset::Bytes(byte_offset);
        self
    }

    /// Sets the offset in **elements** from the buffer start to element `(0, ..., 0)` (a start
    /// offset, as tensor libraries keep in their layouts). The export converts it to bytes with
    /// the exported dtype's element size, refusing an overflow and dtypes whose elements are not
    /// whole bytes. Replaces an offset set by [`with_byte_offset`](Self::with_byte_offset).
    #[inline]
    pub fn with_offset(mut self, elements: usize) -> Self {
        self.offset = Offset::Elements(elements);
        self
    }

    /// Exports the memory as `dtype` instead of the buffer's own dtype, for storage whose
    /// element type is erased (bytes holding float16 values, say). Extents, strides and offsets
    /// count elements of `dtype`; the layout is checked against the buffer's length in bytes.
    #[inline]
    pub fn with_dtype(mut self, dtype: DataType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Names the device; it must agree with the buffer's (checked at export).
    #[inline]
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Marks the export read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`) when `read_only` is true.
    /// `false` does not make a shared export writable.
    #[inline]
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only |= read_only;
        self
    }

    #[inline]
    pub(super) fn buffer(&self) -> &dyn ExportBuffer {
        self.buffer.buffer()
    }

    /// The device of the export: the buffer's device.
    #[inline]
    pub fn device(&self) -> Device {
        self.facts.device
    }

    /// The element type: the one set by [`with_dtype`](Self::with_dtype), else the buffer's.
    #[inline]
    pub fn dtype(&self) -> DataType {
        self.dtype.unwrap_or(self.facts.dtype)
    }

    /// Extents in elements.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        self.shape
    }

    /// Whether the export will be read-only: a shared borrow, or marked read-only. (A unique
    /// borrow of a shared buffer, an `Arc<[T]>` with clones, is also exported read-only.)
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The strides (in elements; `None`: compact row-major) and the byte offset of element
    /// `(0, ..., 0)` to export, for elements of `dtype`: those declared, or, when the buffer has
    /// a layout of its own ([`ExportBuffer::own_layout`]), that layout, once what is declared
    /// agrees with it.
    ///
    /// # Errors
    ///
    /// [`ExportError::BufferLayout`] when the declared shape, strides, offset or dtype disagree
    /// with the buffer's own layout; the errors of the offset's conversion to bytes.
    #[inline]
    pub(super) fn strides_and_offset(
        &self,
        dtype: DataType,
    ) -> Result<(Option<&[isize]>, usize), ExportError> {
        let byte_offset = self.byte_offset(dtype)?;
        if !self.facts.own_layout {
            return Ok((self.strides, byte_offset));
        }
        self.own_strides_and_offset(dtype, byte_offset)
    }

    /// [`strides_and_offset`](Self::strides_and_offset) of a buffer with a layout of its own.
    #[cold]
    fn own_strides_and_offset(
        &self,
        dtype: DataType,
        byte_offset: usize,
    ) -> Result<(Option<&[isize]>, usize), ExportError> {
        let Some(own) = self.buffer().own_layout() else {
            return Ok((self.strides, byte_offset));
        };
        let mismatch = |what, declared: String, own: String| ExportError::BufferLayout {
            what,
            declared,
            own,
        };
        if dtype != self.facts.dtype {
            return Err(mismatch(
                "dtype",
                dtype.to_string(),
                self.facts.dtype.to_string(),
            ));
        }
        if self.shape != own.shape {
            return Err(mismatch(
                "shape",
                format!("{:?}", self.shape),
                format!("{:?}", own.shape),
            ));
        }
        if let Some(strides) = self.strides {
            // Strides of extent-0 and extent-1 axes address nothing: any value is the same
            // layout.
            let agree = strides.len() == own.strides.len()
                && own
                    .shape
                    .iter()
                    .zip(strides.iter().zip(own.strides))
                    .all(|(&extent, (a, b))| extent <= 1 || a == b);
            if !agree {
                return Err(mismatch(
                    "strides",
                    format!("{strides:?}"),
                    format!("{:?}", own.strides),
                ));
            }
        }
        if byte_offset != 0 && byte_offset != own.byte_offset {
            return Err(mismatch(
                "byte_offset",
                byte_offset.to_string(),
                own.byte_offset.to_string(),
            ));
        }
        Ok((Some(own.strides), own.byte_offset))
    }

    /// The offset from the buffer start to element `(0, ..., 0)` in bytes, for elements of
    /// `dtype`.
    #[inline]
    pub(super) fn byte_offset(&self, dtype: DataType) -> Result<usize, LayoutError> {
        match self.offset {
            Offset::Bytes(bytes) => Ok(bytes),
            Offset::Elements(0) => Ok(0),
            Offset::Elements(elements) => {
                let Some(size) = dtype.element_bytes() else {
                    return Err(LayoutError::SubByteAccess { dtype });
                };
                match elements.checked_mul(size) {
                    Some(bytes) => Ok(bytes),
                    None => Err(LayoutError::Overflow {
                        what: "offset in elements, converted to bytes",
                    }),
                }
            }
        }
    }
}

/// A type usable as a `#[dlpack(stream)]` field: a stream on which the producer may have
/// pending work on the tensor (feature `cuda`). Several fields may play this role.
///
/// Implemented for cudarc's `CudaStream`, `Arc<CudaStream>`, and `Option` of either (`None`:
/// no pending work); with the `hip` feature also for `dlpack_runtime::hip::HipStream` and
/// `Arc<HipStream>` (pending work on a ROCm tensor). A user stream type implements it by handing out a `ProducerStream`
/// made from a cudarc stream (`ProducerStream::from(&stream)`); a stream owned by another
/// library (a raw `CUstream`) becomes one with cudarc's `CudaContext::wrap_borrowed_stream`,
/// which never destroys it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[dlpack(stream)]` field",
    label = "expected cudarc's `Arc<CudaStream>`, `CudaStream`, or `Option` of either",
    note = "`#[dlpack(stream)]` holds a stream with pending work on the data: cudarc's `Arc<CudaStream>` or `CudaStream`, or `Option` of either (`None`: no pending work), with the `cuda` feature of dlpack-runtime; a stream type of your own implements `dlpack_runtime::AsProducerStream`",
    note = "a raw `CUstream` owned by another library becomes an `Arc<CudaStream>` with cudarc's `CudaContext::wrap_borrowed_stream`, which never destroys it"
)]
pub trait AsProducerStream {
    /// The stream, for this call; `None` when there is no pending work. The default says there
    /// is none, so an impl written without the `cuda` feature still compiles with it.
    #[cfg(feature = "cuda")]
    fn as_producer_stream(&self) -> Option<ProducerStream<'_>> {
        None
    }
}

/// A stream with pending work on an export's data, borrowed for the export (feature `cuda`):
/// what [`AsProducerStream`] and [`ExportBuffer::producer_stream`](crate::ExportBuffer::producer_stream)
/// hand over. Made with `From` from a cudarc `CudaStream` (`ProducerStream::from(&stream)`) or,
/// with the `hip` feature, from a `dlpack_runtime::hip::HipStream`, so that those traits name
/// no type of cudarc and keep their signatures across its versions. A CUDA stream names work
/// on a CUDA tensor, a HIP stream work on a ROCm one; the other way round is refused at export.
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
pub struct ProducerStream<'a>(pub(crate) AnyStream<'a>);

/// The stream a [`ProducerStream`] carries: one of the CUDA driver's or one of the HIP
/// runtime's.
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum AnyStream<'a> {
    /// A cudarc stream.
    Cuda(&'a cudarc::driver::CudaStream),
    /// A HIP stream.
    #[cfg(feature = "hip")]
    Hip(&'a crate::engine::hip::HipStream),
}
