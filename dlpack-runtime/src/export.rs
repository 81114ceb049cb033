//! The producer side: building managed tensors from Rust owners.
//!
//! A type becomes a producer by implementing [`DlpackExport`] (usually with
//! `#[derive(DlpackExport)]`): it describes its memory as [`ExportParts`], a borrowed
//! [`ExportBuffer`] plus shape, strides, offset, dtype, device and writability.
//! [`DlpackExport::to_dlpack_with`]
//! then moves the owner into **one heap block** that holds the `DLManagedTensorVersioned` (or
//! legacy `DLManagedTensor`) header, the `shape` and `strides` arrays and the owner itself; the
//! `extern "C"` deleter drops the owner and frees exactly that block, and never unwinds.
//!
//! Before anything is handed out, the described layout is validated with the same rules a
//! consumer applies ([`crate::layout::validate`], in the same pass that writes the `shape` and
//! `strides` arrays) and its byte span is checked to lie inside the buffer, so safe code cannot
//! describe memory it does not own. The [`ManagedTensor`] returned records that validation, so a
//! Rust consumer does not validate the same header again.
//!
//! Buffers are reached through the safe trait [`AsExportBuffer`]: every [`ExportBuffer`] is one,
//! an `Arc` of one is one (exported writable while the `Arc` is unique, read-only otherwise), and
//! a storage enum over buffers (`enum Storage { F32(Vec<f32>), F64(Vec<f64>) }`) becomes one
//! with `#[derive(DlpackStorage)]` or a hand-written `impl`, without `unsafe`.

use core::ffi::c_void;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};
use std::alloc::{self, Layout};
use std::sync::Arc;

use crate::device::{Device, DeviceType};
use crate::dtype::{DataType, Element};
use crate::error::{ExportError, LayoutError};
use crate::ffi::{self, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::layout::{self, ByteSpan, NullStrides};
use crate::managed::{ManagedTensor, RawManagedTensor};
use crate::stream::parse_stream;

/// A contiguous buffer that can be exported: a base pointer, a length in bytes, a dtype and a
/// device.
///
/// Implemented for `Vec<T>`, `Box<[T]>` and `Arc<[T]>` with `T:`[`Element`] (host memory), and
/// for `ndarray::Array<T, D>` (feature `ndarray`). `Arc<[T]>` is exported writable only while the
/// `Arc` is unique. An `Arc` of a buffer (`Arc<Vec<T>>`) or of a storage enum is not an
/// `ExportBuffer` itself but an [`AsExportBuffer`], which is what `#[dlpack(data)]` asks for.
///
/// This trait is `unsafe` because exports hand its pointer to foreign code. Types that merely
/// *hold* buffers (storage enums, wrappers) implement the safe [`AsExportBuffer`] instead.
///
/// # Safety
///
/// For as long as `self` is alive and not accessed otherwise:
/// - [`as_ptr`](Self::as_ptr) points to `byte_len()` bytes readable on [`device`](Self::device)
///   (a host address for host-accessible devices);
/// - [`as_mut_ptr`](Self::as_mut_ptr), when it returns `Some`, points to the same bytes,
///   readable and writable, and no other alias is used while the export lives;
/// - the bytes hold values of [`dtype`](Self::dtype), and the pointer is aligned for it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exportable buffer",
    label = "not an `ExportBuffer`",
    note = "buffers are `Vec<T>`, `Box<[T]>`, `Arc<[T]>` (and `ndarray::Array<T, D>` with the `ndarray` feature) with `T: dlpack_runtime::Element`",
    note = "an enum or wrapper holding buffers derives `dlpack_runtime::DlpackStorage` or implements the safe trait `dlpack_runtime::AsExportBuffer`"
)]
pub unsafe trait ExportBuffer {
    /// Element type of the buffer.
    fn dtype(&self) -> DataType;
    /// Where the memory lives. Host memory by default.
    fn device(&self) -> Device {
        Device::CPU
    }
    /// Length of the buffer in bytes.
    fn byte_len(&self) -> usize;
    /// Base pointer for read-only export.
    fn as_ptr(&self) -> *const c_void;
    /// Base pointer for writable export, or `None` when the memory is shared and must be
    /// exported read-only.
    fn as_mut_ptr(&mut self) -> Option<*mut c_void>;
    /// The stream the buffer's own pending work is ordered on (a cudarc `CudaSlice`'s stream),
    /// if any; the export orders the consumer after it as after `#[dlpack(stream)]` fields.
    #[cfg(feature = "cuda")]
    fn producer_stream(&self) -> Option<&cudarc::driver::CudaStream> {
        None
    }
}

// SAFETY: the vector's pointer and length describe `len * size_of::<T>()` initialized, aligned
// bytes of `T` in host memory, owned by `self`; `T: Element` gives the dtype; the mutable
// pointer derives from `&mut self`.
unsafe impl<T: Element> ExportBuffer for Vec<T> {
    #[inline]
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    #[inline]
    fn byte_len(&self) -> usize {
        core::mem::size_of_val::<[T]>(self)
    }
    #[inline]
    fn as_ptr(&self) -> *const c_void {
        <[T]>::as_ptr(self).cast()
    }
    #[inline]
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        Some(<[T]>::as_mut_ptr(self).cast())
    }
}

// SAFETY: as for `Vec<T>`: a boxed slice owns `len` initialized, aligned `T` in host memory.
unsafe impl<T: Element> ExportBuffer for Box<[T]> {
    #[inline]
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    #[inline]
    fn byte_len(&self) -> usize {
        core::mem::size_of_val::<[T]>(self)
    }
    #[inline]
    fn as_ptr(&self) -> *const c_void {
        <[T]>::as_ptr(self).cast()
    }
    #[inline]
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        Some(<[T]>::as_mut_ptr(self).cast())
    }
}

// SAFETY: as for `Vec<T>`; the mutable pointer is only handed out while the `Arc` is unique
// (`Arc::get_mut`), otherwise the export is read-only.
unsafe impl<T: Element> ExportBuffer for Arc<[T]> {
    #[inline]
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    #[inline]
    fn byte_len(&self) -> usize {
        core::mem::size_of_val::<[T]>(self)
    }
    #[inline]
    fn as_ptr(&self) -> *const c_void {
        <[T]>::as_ptr(self).cast()
    }
    #[inline]
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        Arc::get_mut(self).map(|s| s.as_mut_ptr().cast())
    }
}

/// How an export borrows its buffer: shared (the export is read-only) or unique (writable, unless
/// the buffer itself says it is shared: see [`ExportBuffer::as_mut_ptr`]).
pub enum BufferAccess<'a> {
    /// A shared borrow: the export is read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    Shared(&'a dyn ExportBuffer),
    /// A unique borrow: the export may be writable.
    Unique(&'a mut dyn ExportBuffer),
}

impl BufferAccess<'_> {
    /// The buffer, whichever the borrow.
    #[inline]
    pub fn buffer(&self) -> &dyn ExportBuffer {
        match self {
            BufferAccess::Shared(b) => *b,
            BufferAccess::Unique(b) => &**b,
        }
    }
}

/// A type that holds an exportable buffer: what `#[dlpack(data)]` of `#[derive(DlpackExport)]`
/// accepts. A safe trait: implementing it only *selects* a buffer, whose own [`ExportBuffer`]
/// implementation vouches for the memory.
///
/// Implemented for
/// - every [`ExportBuffer`] (`Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `ndarray::Array<T, D>`, user
///   buffers), borrowed as itself;
/// - `Arc<S>` for every `S: AsExportBuffer` (so `Arc<Vec<T>>` and `Arc<Storage>`): the export is
///   writable while the `Arc` is unique (no other `Arc` or `Weak`), read-only otherwise;
/// - storage enums and wrappers, with `#[derive(DlpackStorage)]` or by hand:
///
/// ```
/// use dlpack_runtime::{AsExportBuffer, BufferAccess, ExportBuffer};
///
/// /// A storage enum over element types, as tensor libraries keep it.
/// enum Storage {
///     F32(Vec<f32>),
///     I64(Vec<i64>),
/// }
///
/// impl AsExportBuffer for Storage {
///     fn as_export_buffer(&self) -> &dyn ExportBuffer {
///         match self {
///             Storage::F32(v) => v,
///             Storage::I64(v) => v,
///         }
///     }
///     // Optional: without it, exports by value are read-only.
///     fn as_export_buffer_mut(&mut self) -> BufferAccess<'_> {
///         match self {
///             Storage::F32(v) => v.as_export_buffer_mut(),
///             Storage::I64(v) => v.as_export_buffer_mut(),
///         }
///     }
/// }
///
/// let storage = Storage::I64(vec![1, 2, 3]);
/// assert_eq!(storage.as_export_buffer().byte_len(), 24);
/// ```
///
/// Both methods are called once per export, and what they return is used for the whole export,
/// so an implementation cannot mix up two buffers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold the data of an exported tensor",
    label = "not an exportable buffer",
    note = "buffers are `Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `Arc<Vec<T>>` (and `ndarray::Array<T, D>` with the `ndarray` feature) with `T: dlpack_runtime::Element`, and `Arc<S>` of any of them",
    note = "a storage enum whose variants each hold one buffer derives `dlpack_runtime::DlpackStorage`; other types implement the safe trait `dlpack_runtime::AsExportBuffer`"
)]
pub trait AsExportBuffer {
    /// The buffer, borrowed shared, for a read-only export.
    fn as_export_buffer(&self) -> &dyn ExportBuffer;

    /// The buffer for an export by value: [`BufferAccess::Unique`] allows a writable export,
    /// [`BufferAccess::Shared`] makes it read-only. The default is `Shared`, so implementing
    /// [`as_export_buffer`](Self::as_export_buffer) alone gives read-only exports.
    #[inline]
    fn as_export_buffer_mut(&mut self) -> BufferAccess<'_> {
        BufferAccess::Shared(self.as_export_buffer())
    }
}

impl<B: ExportBuffer> AsExportBuffer for B {
    #[inline]
    fn as_export_buffer(&self) -> &dyn ExportBuffer {
        self
    }
    #[inline]
    fn as_export_buffer_mut(&mut self) -> BufferAccess<'_> {
        BufferAccess::Unique(self)
    }
}

/// A shared storage: writable while this is the only `Arc` (and no `Weak` exists), read-only
/// otherwise, as `Arc::get_mut` decides.
impl<S: AsExportBuffer> AsExportBuffer for Arc<S> {
    #[inline]
    fn as_export_buffer(&self) -> &dyn ExportBuffer {
        S::as_export_buffer(self)
    }
    #[inline]
    fn as_export_buffer_mut(&mut self) -> BufferAccess<'_> {
        // Another `Arc` exists (or existed at this load): shared, without the locked
        // instruction of `Arc::get_mut`. A clone dropped meanwhile on another thread only makes
        // this export read-only where it could have been writable. No clone can appear: this
        // `Arc` is borrowed mutably, and no other exists to clone from.
        if Arc::strong_count(self) != 1 {
            return BufferAccess::Shared(S::as_export_buffer(self));
        }
        if Arc::get_mut(self).is_none() {
            return BufferAccess::Shared(S::as_export_buffer(self));
        }
        match Arc::get_mut(self) {
            Some(storage) => storage.as_export_buffer_mut(),
            // `&mut self` excludes new clones between the two calls.
            None => unreachable!("an `Arc` found unique stays unique while borrowed mutably"),
        }
    }
}

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
/// let managed = h.to_dlpack()?;
/// assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), DataType::F16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ExportParts<'a> {
    buffer: BufferAccess<'a>,
    shape: &'a [usize],
    strides: Option<&'a [isize]>,
    offset: Offset,
    dtype: Option<DataType>,
    device: Option<Device>,
    read_only: bool,
    /// `#[dlpack(stream)]` fields with pending work (feature `cuda`).
    #[cfg(feature = "cuda")]
    streams: Vec<&'a cudarc::driver::CudaStream>,
}

/// Where element `(0, ..., 0)` starts, in the unit the producer keeps.
#[derive(Clone, Copy)]
enum Offset {
    Bytes(usize),
    Elements(usize),
}

impl<'a> ExportParts<'a> {
    /// Parts borrowing `buffer` as `access` says: [`BufferAccess::Unique`] as
    /// [`ExportParts::unique`], [`BufferAccess::Shared`] as [`ExportParts::shared`]. This is how
    /// an [`AsExportBuffer`] is exported by value:
    /// `ExportParts::new(storage.as_export_buffer_mut(), shape)`.
    #[inline]
    pub fn new(access: BufferAccess<'a>, shape: &'a [usize]) -> Self {
        let read_only = matches!(access, BufferAccess::Shared(_));
        Self {
            buffer: access,
            shape,
            strides: None,
            offset: Offset::Bytes(0),
            dtype: None,
            device: None,
            read_only,
            #[cfg(feature = "cuda")]
            streams: Vec::new(),
        }
    }

    /// Adds a stream on which the producer may have pending work on the data (feature `cuda`;
    /// `None`: nothing pending). The export makes the consumer's stream wait for it
    /// (spec section 2.5).
    #[cfg(feature = "cuda")]
    #[inline]
    pub fn with_stream(mut self, stream: Option<&'a cudarc::driver::CudaStream>) -> Self {
        if let Some(stream) = stream {
            self.streams.push(stream);
        }
        self
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
    fn buffer(&self) -> &dyn ExportBuffer {
        self.buffer.buffer()
    }

    /// Whether the producer names streams with pending work on the data: `#[dlpack(stream)]`
    /// fields, or the buffer's own stream (feature `cuda`).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn has_producer_streams(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            !self.streams.is_empty() || self.buffer().producer_stream().is_some()
        }
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// The device of the export: the buffer's device.
    #[inline]
    pub fn device(&self) -> Device {
        self.buffer().device()
    }

    /// The element type: the one set by [`with_dtype`](Self::with_dtype), else the buffer's.
    #[inline]
    pub fn dtype(&self) -> DataType {
        self.dtype.unwrap_or_else(|| self.buffer().dtype())
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

    /// The offset from the buffer start to element `(0, ..., 0)` in bytes, for elements of
    /// `dtype`.
    #[inline]
    fn byte_offset(&self, dtype: DataType) -> Result<usize, LayoutError> {
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

/// A DLPack producer: a type whose memory can be lent as a managed tensor.
///
/// Usually derived with `#[derive(DlpackExport)]`. The two methods describe the memory; the
/// provided methods do the export.
pub trait DlpackExport {
    /// Describes the memory for a read-only export through `&self` (shared export).
    fn export_parts(&self) -> ExportParts<'_>;

    /// Describes the memory for an export by value: writable unless the buffer is shared or
    /// marked read-only.
    fn export_parts_mut(&mut self) -> ExportParts<'_>;

    /// `__dlpack_device__`: the device of the memory.
    fn dlpack_device(&self) -> Device {
        self.export_parts().device()
    }

    /// Moves `self` into a versioned managed tensor (DLPack 1.3), with no stream and no copy:
    /// the Rust-to-Rust default.
    ///
    /// # Errors
    ///
    /// As [`DlpackExport::to_dlpack_with`].
    fn to_dlpack(self) -> Result<ManagedTensor, ExportError>
    where
        Self: Sized + Send + 'static,
    {
        self.to_dlpack_with(&ExportRequest::versioned())
    }

    /// Moves `self` into a managed tensor as `request` asks (the arguments of `__dlpack__`).
    ///
    /// # Errors
    ///
    /// [`ExportError::Layout`] when the described layout is invalid or reaches outside the
    /// buffer; [`ExportError::Stream`] for a `stream` illegal on the device;
    /// [`ExportError::ReadOnlyLegacy`] for a legacy request of a read-only tensor;
    /// [`ExportError::UnsupportedDevice`], [`ExportError::CopyRequired`] or
    /// [`ExportError::CopyUnsupported`] when `dl_device`/`copy` cannot be served;
    /// [`ExportError::DeviceMismatch`] when a device field disagrees with the buffer. `self` is
    /// dropped on error.
    fn to_dlpack_with(self, request: &ExportRequest) -> Result<ManagedTensor, ExportError>
    where
        Self: Sized + Send + 'static,
    {
        export_with(self, |owner| owner.export_parts_mut(), request)
    }

    /// As [`DlpackExport::to_dlpack_with`], and returns events recorded on the producer's
    /// streams (feature `cuda`), for a consumer that waits later, on any of its streams.
    ///
    /// # Errors
    ///
    /// As [`DlpackExport::to_dlpack_with`].
    #[cfg(feature = "cuda")]
    fn to_dlpack_with_ready_events(
        self,
        request: &ExportRequest,
    ) -> Result<(ManagedTensor, crate::cuda::ReadyEvents), ExportError>
    where
        Self: Sized + Send + 'static,
    {
        export_with_ready_events(self, |owner| owner.export_parts_mut(), request)
    }
}

/// Exports `owner` as [`export_with`] does, and records one event on each producer stream with
/// pending work (feature `cuda`): beyond the DLPack standard, the consumer may make any of its
/// streams wait on them later. Events, never stream handles, outlive the call.
///
/// # Errors
///
/// As [`export_with`].
#[cfg(feature = "cuda")]
pub fn export_with_ready_events<O, F>(
    mut owner: O,
    parts_of: F,
    request: &ExportRequest,
) -> Result<(ManagedTensor, crate::cuda::ReadyEvents), ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    let ndim = parts_of(&mut owner).shape.len();
    let mut sync = StreamSync::new(request);
    sync.ready = Some(None);
    let managed = if request.wants_versioned() {
        build::<DLManagedTensorVersioned, O, F>(owner, ndim, &parts_of, &mut sync)?
    } else {
        build::<DLManagedTensor, O, F>(owner, ndim, &parts_of, &mut sync)?
    };
    let managed = finish(managed, request, &mut sync)?;
    let ready = sync.ready.flatten().unwrap_or_default();
    Ok((managed, ready))
}

/// Shared export: the `Arc` stays alive while any consumer holds the tensor, and the export is
/// read-only.
impl<T: DlpackExport + Send + Sync + 'static> DlpackExport for Arc<T> {
    #[inline]
    fn export_parts(&self) -> ExportParts<'_> {
        (**self).export_parts()
    }
    #[inline]
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        (**self).export_parts()
    }
}

/// The arguments of `__dlpack__(stream, max_version, dl_device, copy)` (spec section 2.1).
///
/// The all-`None` request ([`ExportRequest::new`]) is Python's default and yields a legacy
/// `DLManagedTensor`; [`ExportRequest::versioned`] asks for DLPack 1.3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportRequest {
    /// The consumer's stream, as in the table of spec section 2.4 (`None`: Python's `None`).
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
    /// for the device the consumer will use (spec section 2.4), and `dl_device` must be
    /// `device` itself, `cpu:0` for host-accessible memory, or (feature `cuda`) `cpu:0` for
    /// CUDA memory, which is then copied (spec section 2.7).
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
            return Err(ExportError::CopyRequired { requested: target });
        }
        if cfg!(feature = "cuda") && device.device_type == DeviceType::Cuda && target == Device::CPU
        {
            return Ok(());
        }
        Err(ExportError::UnsupportedDevice {
            found: device,
            requested: target,
        })
    }

    /// Whether serving this request for a tensor on `device` makes a copy: `copy=True`, or a
    /// `dl_device` that the memory is not reachable from (spec section 2.7).
    #[inline]
    pub fn needs_copy(&self, device: Device) -> bool {
        self.copy == Some(true) || self.dl_device.is_some_and(|t| !same_memory(device, t))
    }

    #[inline]
    pub(crate) fn wants_versioned(&self) -> bool {
        self.max_version.is_some_and(|v| v.major >= 1)
    }
}

/// Whether memory on `device` can be handed to a consumer on `target` without a copy.
#[inline]
fn same_memory(device: Device, target: Device) -> bool {
    target == device || target == Device::CPU && device.is_host_accessible()
}

/// Exports `owner`, described by `parts_of`, as `request` asks. This is what
/// [`DlpackExport::to_dlpack_with`] calls; it serves owners that are not `DlpackExport`
/// themselves (a Python object holding a tensor, say).
///
/// `parts_of` is called on the owner at its final address inside the heap block, so buffers
/// whose address changes when moved are fine.
///
/// # Errors
///
/// As [`DlpackExport::to_dlpack_with`]. The owner is dropped on error.
pub fn export_with<O, F>(
    mut owner: O,
    parts_of: F,
    request: &ExportRequest,
) -> Result<ManagedTensor, ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    // The rank sizes the block, so `parts_of` is asked first where the owner was passed (for
    // the rank only), then again at the owner's final address in the block. Asked here, on the
    // parameter itself, the owner is not copied before the allocation: copied right away, it
    // would be read back while the caller's writes to it are still in flight (a
    // store-forwarding stall that cost about a tenth of an export).
    let ndim = parts_of(&mut owner).shape.len();
    let mut sync = StreamSync::new(request);
    let managed = if request.wants_versioned() {
        let managed = build::<DLManagedTensorVersioned, O, F>(owner, ndim, &parts_of, &mut sync);
        if request.stream.is_none() && request.dl_device.is_none() && request.copy != Some(true) {
            // `to_dlpack()`'s request: `finish` has nothing to do (see there), so the block is
            // the result as built.
            return managed;
        }
        managed?
    } else {
        build::<DLManagedTensor, O, F>(owner, ndim, &parts_of, &mut sync)?
    };
    finish(managed, request, &mut sync)
}

/// What `request` asks of a tensor `build` made, beyond building it.
fn finish(
    managed: ManagedTensor,
    request: &ExportRequest,
    sync: &mut StreamSync<'_>,
) -> Result<ManagedTensor, ExportError> {
    // Without `stream`, `dl_device` and `copy=True` nothing can fail or change (no stream is
    // legal on every device, and the target is the tensor's own device): skip the checks, as
    // for `to_dlpack()`.
    if request.stream.is_some() || request.dl_device.is_some() || request.copy.is_some() {
        let device = Device::from_raw(managed.dl_tensor().device);
        request.check(device)?;
        if request.needs_copy(device) {
            // The copy is fresh and writable, whatever the source was.
            return copy_for(managed, request, sync);
        }
    }
    // A versioned tensor carries its own read-only flag; a legacy one cannot.
    if managed.is_legacy() && legacy_read_only(&managed) {
        return Err(ExportError::ReadOnlyLegacy);
    }
    Ok(managed)
}

/// Serves `request` with a managed tensor built before it came (a prebuilt export, or a
/// tensor a producer handed over without honouring `copy`): checks it, and copies when it asks
/// for a copy. The tensor is returned as it is otherwise.
///
/// # Errors
///
/// As [`ExportRequest::check`], and those of the copy.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn serve(
    managed: ManagedTensor,
    request: &ExportRequest,
) -> Result<ManagedTensor, ExportError> {
    let device = Device::from_raw(managed.dl_tensor().device);
    request.check(device)?;
    if request.needs_copy(device) {
        return copy_for(managed, request, &mut StreamSync::new(request));
    }
    Ok(managed)
}

/// The copy `request` asks for: on the host for host-accessible memory, with the driver on the
/// consumer's stream for CUDA memory (feature `cuda`).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn copy_for(
    managed: ManagedTensor,
    request: &ExportRequest,
    sync: &mut StreamSync<'_>,
) -> Result<ManagedTensor, ExportError> {
    #[cfg(feature = "cuda")]
    {
        let device = Device::from_raw(managed.dl_tensor().device);
        if device.device_type == DeviceType::Cuda {
            let copy = match sync.copy.take() {
                Some(copy) => copy,
                // Built without stream work (no producer stream, no elements, or prebuilt):
                // nothing is pending, so nothing is ordered before the copy.
                None => crate::cuda::copy_sync(device, request, &[])?,
            };
            let want_ready = sync.ready.is_some();
            let (copied, ready) = crate::cuda::copy_export(managed, request, &copy, want_ready)?;
            if want_ready {
                sync.ready = Some(ready);
            }
            return Ok(copied);
        }
    }
    // A host copy is `cpu:0` memory: it serves a request for `cpu:0` only.
    let device = Device::from_raw(managed.dl_tensor().device);
    if request.dl_device.unwrap_or(device) != Device::CPU {
        return Err(ExportError::CopyUnsupported { device });
    }
    copy_of(&managed, request.wants_versioned())
}

/// Whether a legacy tensor freshly built by [`build`] was meant to be read-only; legacy
/// headers have no flags, so the block records it.
fn legacy_read_only(managed: &ManagedTensor) -> bool {
    // SAFETY: only tensors built by `build` just before reach here; their `manager_ctx` points
    // to the start of their block, a `Block<DLManagedTensor, O>` whose `prefix` sits at the same
    // offset for every `O` (`repr(C)`, fixed-layout fields before `owner`).
    unsafe {
        let block = managed.dl_tensor_ctx().cast::<Block<DLManagedTensor, ()>>();
        (*block).prefix.read_only
    }
}

/// The header kinds a block can start with.
trait Header: Sized {
    /// The header for a finished export whose deleter frees a `Block<Self, O>`.
    fn new<O: Send + 'static>(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        read_only: bool,
    ) -> Self;
    /// Wraps a finished block.
    ///
    /// # Safety
    ///
    /// `ptr` is a finished block built by [`build`], owned by nobody else, whose header
    /// validates.
    unsafe fn into_managed(ptr: NonNull<Self>) -> ManagedTensor;
}

impl Header for DLManagedTensorVersioned {
    fn new<O: Send + 'static>(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        read_only: bool,
    ) -> Self {
        Self {
            version: DLPackVersion {
                major: ffi::DLPACK_MAJOR_VERSION,
                minor: ffi::DLPACK_MINOR_VERSION,
            },
            manager_ctx,
            deleter: Some(delete_block::<Self, O>),
            flags: if read_only {
                ffi::DLPACK_FLAG_BITMASK_READ_ONLY
            } else {
                0
            },
            dl_tensor,
        }
    }
    #[inline]
    unsafe fn into_managed(ptr: NonNull<Self>) -> ManagedTensor {
        // SAFETY: a finished block has version 1.3, known flags and our deleter, and its header
        // validates (caller).
        unsafe { ManagedTensor::from_raw_validated(RawManagedTensor::Versioned(ptr)) }
    }
}

impl Header for DLManagedTensor {
    fn new<O: Send + 'static>(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        _read_only: bool,
    ) -> Self {
        Self {
            dl_tensor,
            manager_ctx,
            deleter: Some(delete_block::<Self, O>),
        }
    }
    #[inline]
    unsafe fn into_managed(ptr: NonNull<Self>) -> ManagedTensor {
        // SAFETY: a finished block is a valid legacy tensor with our deleter, and its header
        // validates (caller).
        unsafe { ManagedTensor::from_raw_validated(RawManagedTensor::Legacy(ptr)) }
    }
}

/// Fields every block has right after its header, independent of the owner type.
#[repr(C)]
struct BlockPrefix {
    /// Size of the whole allocation in bytes (its alignment is [`block_align`]).
    size: usize,
    /// Whether the export is read-only (recorded for legacy headers, which have no flags).
    read_only: bool,
}

/// One heap block: header (offset 0, so the header pointer is the block pointer), prefix,
/// owner, then `2 * ndim` `i64` (shape, then strides).
#[repr(C)]
struct Block<H, O> {
    header: H,
    prefix: BlockPrefix,
    owner: ManuallyDrop<O>,
}

/// Layout of a block with `arrays_len` trailing `i64`, and the offset of those.
#[inline]
fn block_layout<H, O>(arrays_len: usize) -> Result<(Layout, usize), LayoutError> {
    const OVERFLOW: LayoutError = LayoutError::Overflow {
        what: "export block size",
    };
    let Ok(arrays) = Layout::array::<i64>(arrays_len) else {
        return Err(OVERFLOW);
    };
    let Ok((layout, offset)) = Layout::new::<Block<H, O>>().extend(arrays) else {
        return Err(OVERFLOW);
    };
    Ok((layout.pad_to_align(), offset))
}

/// Alignment of every `Block<H, O>` allocation, whatever its `arrays_len`.
const fn block_align<H, O>() -> usize {
    let block = core::mem::align_of::<Block<H, O>>();
    let arrays = core::mem::align_of::<i64>();
    if block > arrays { block } else { arrays }
}

/// Builds the block for `owner`, of `ndim` axes: one allocation. `parts_of` is asked at the
/// owner's final address in the block, where its answer is exported.
#[inline(always)]
fn build<H, O, F>(
    owner: O,
    ndim: usize,
    parts_of: &F,
    sync: &mut StreamSync<'_>,
) -> Result<ManagedTensor, ExportError>
where
    H: Header,
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    if ndim > layout::MAX_NDIM {
        return Err(LayoutError::TooManyDims {
            ndim,
            max: layout::MAX_NDIM,
        }
        .into());
    }
    let (block_layout, arrays_offset) = block_layout::<H, O>(2 * ndim)?;
    debug_assert_eq!(block_layout.align(), block_align::<H, O>());
    // SAFETY: the layout is non-zero-sized: it contains the header.
    let raw = unsafe { alloc::alloc(block_layout) };
    let Some(block) = NonNull::new(raw.cast::<Block<H, O>>()) else {
        alloc::handle_alloc_error(block_layout)
    };
    // SAFETY: `block` is freshly allocated with the size and alignment of `Block<H, O>` (the
    // allocation extends that layout); the prefix and the owner are written in place, field by
    // field. The header stays uninitialized until `fill` writes it: nothing reads it before
    // (`free_block` reads only the prefix and the owner).
    unsafe {
        let b = block.as_ptr();
        ptr::addr_of_mut!((*b).prefix).write(BlockPrefix {
            size: block_layout.size(),
            read_only: false,
        });
        ptr::addr_of_mut!((*b).owner).write(ManuallyDrop::new(owner));
    }
    // SAFETY: `arrays_offset` is inside the allocation (`Layout::extend`), aligned for `i64`.
    let arrays = unsafe { raw.add(arrays_offset) }.cast::<i64>();
    // Frees the block if `fill` fails or `parts_of` panics; disarmed on success.
    let guard = BlockGuard::<H, O>(block);
    // SAFETY: the block's prefix and owner are initialized and exclusively ours; `arrays` has
    // `2 * ndim` slots.
    unsafe { fill::<H, O, F>(block, arrays, ndim, parts_of, sync) }?;
    core::mem::forget(guard);
    // SAFETY: `fill` succeeded, so the block is finished (header written) and owned by nobody
    // else, and its finished header validates.
    Ok(unsafe { H::into_managed(block.cast::<H>()) })
}

/// [`build`] for an owner that is not a parameter of the caller: asks its rank first.
fn build_owned<H, O, F>(mut owner: O, parts_of: &F) -> Result<ManagedTensor, ExportError>
where
    H: Header,
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    let ndim = parts_of(&mut owner).shape.len();
    build::<H, O, F>(
        owner,
        ndim,
        parts_of,
        &mut StreamSync::new(&ExportRequest::new()),
    )
}

/// What an export does about the producer's pending stream work (feature `cuda`): the request
/// that names the consumer's stream, and whether ready events are wanted. Without `cuda` there
/// are no streams, and this carries nothing.
pub(crate) struct StreamSync<'r> {
    #[cfg(feature = "cuda")]
    request: &'r ExportRequest,
    #[cfg(feature = "cuda")]
    ready: Option<Option<crate::cuda::ReadyEvents>>,
    /// Where the copy of a CUDA tensor goes, decided while the producer's streams were
    /// borrowed (their work is ordered before it).
    #[cfg(feature = "cuda")]
    copy: Option<crate::stream::CopySync>,
    #[cfg(not(feature = "cuda"))]
    _request: core::marker::PhantomData<&'r ExportRequest>,
}

impl<'r> StreamSync<'r> {
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn new(request: &'r ExportRequest) -> Self {
        Self {
            #[cfg(feature = "cuda")]
            request,
            #[cfg(feature = "cuda")]
            ready: None,
            #[cfg(feature = "cuda")]
            copy: None,
            #[cfg(not(feature = "cuda"))]
            _request: core::marker::PhantomData,
        }
    }
}

/// Frees an unfinished block when dropped: on an error return or an unwinding panic.
struct BlockGuard<H, O>(NonNull<Block<H, O>>);

impl<H, O> Drop for BlockGuard<H, O> {
    fn drop(&mut self) {
        // SAFETY: the guard lives only between the initialization of the block's prefix and
        // owner and its hand-out (where it is forgotten), so they are initialized, and the
        // block is freed once, here.
        unsafe { free_block::<H, O>(self.0) };
    }
}

/// Describes the owner inside `block` and writes the finished header, validated as
/// [`layout::validate`] would validate it, in the same pass that writes it.
///
/// # Safety
///
/// `block`'s prefix and owner are initialized and the block is exclusively owned by the caller;
/// `arrays` points to `2 * ndim` writable `i64` inside the same allocation.
#[inline]
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
unsafe fn fill<H, O, F>(
    block: NonNull<Block<H, O>>,
    arrays: *mut i64,
    ndim: usize,
    parts_of: &F,
    sync: &mut StreamSync<'_>,
) -> Result<(), ExportError>
where
    H: Header,
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    // SAFETY: initialized and exclusive (caller); `arrays` lies outside `Block<H, O>`, so this
    // reference does not overlap the writes to `arrays` below. Only the owner is borrowed: the
    // header is not initialized yet.
    let owner = unsafe { &mut (*block.as_ptr()).owner };
    let parts = parts_of(owner);
    if parts.shape.len() != ndim {
        return Err(LayoutError::ShapeChanged {
            before: ndim,
            after: parts.shape.len(),
        }
        .into());
    }
    let buffer = parts.buffer();
    let (device, byte_len) = (buffer.device(), buffer.byte_len());
    // A dtype field overrides the buffer's (type-erased storage); the layout is checked against
    // the buffer's length in bytes all the same.
    let dtype = parts.dtype();
    let byte_offset = parts.byte_offset(dtype)?;
    if let Some(size) = dtype.element_bytes() {
        if byte_offset % size != 0 {
            // Elements of the buffer start at multiples of their size: any other offset splits
            // them (an offset given in elements instead of bytes, say).
            return Err(LayoutError::OffsetNotElementAligned {
                byte_offset,
                element_bytes: size,
            }
            .into());
        }
    }
    if let Some(field) = parts.device {
        if field != device {
            return Err(ExportError::DeviceMismatch {
                field,
                buffer: device,
            });
        }
    }
    // SAFETY: `arrays` has `2 * ndim` slots (caller); both halves are in bounds.
    let (shape_ptr, strides_ptr) = (arrays, unsafe { arrays.add(ndim) });
    // One pass per array writes it and validates it as `layout::validate` would validate the
    // finished header (the element count, the reach of the strides); the errors are reported
    // afterwards, in `validate`'s order. The shape and strides arrays are ours, so `ndim`, NULL
    // arrays and negative extents need no check.
    let mut numel: Option<u64> = Some(1);
    for (axis, &extent) in parts.shape.iter().enumerate() {
        let Ok(extent) = i64::try_from(extent) else {
            return Err(LayoutError::Overflow { what: "extent" }.into());
        };
        numel = numel.and_then(|n| n.checked_mul(extent as u64));
        // SAFETY: `axis < ndim`, inside the shape half.
        unsafe { shape_ptr.add(axis).write(extent) };
    }
    let mut reach = layout::Reach::new();
    match parts.strides {
        Some(strides) if strides.len() != ndim => {
            return Err(LayoutError::StridesRank {
                shape: ndim,
                strides: strides.len(),
            }
            .into());
        }
        Some(strides) => {
            for (axis, &stride) in strides.iter().enumerate() {
                // `isize` fits in `i64`.
                let stride = stride as i64;
                // SAFETY: `axis < ndim`, inside both halves; the shape half is written above.
                unsafe {
                    strides_ptr.add(axis).write(stride);
                    reach.add(*shape_ptr.add(axis), stride);
                }
            }
        }
        None => {
            let mut acc: i64 = 1;
            for axis in (0..ndim).rev() {
                // SAFETY: `axis < ndim`, inside both halves; the shape half is written above.
                unsafe {
                    let extent = *shape_ptr.add(axis);
                    strides_ptr.add(axis).write(acc);
                    reach.add(extent, acc);
                    acc = acc.saturating_mul(extent.max(1));
                }
            }
        }
    }
    #[cfg(feature = "cuda")]
    {
        // Make the producer's pending work visible on the consumer's stream (spec section 2.5)
        // while its streams are borrowed, before the tensor is handed out.
        let mut pending = parts.streams.clone();
        if let Some(stream) = buffer.producer_stream() {
            pending.push(stream);
        }
        let has_elements = numel.is_some_and(|n| n > 0);
        if !pending.is_empty() || device.device_type == DeviceType::Cuda && has_elements {
            let data = buffer.as_ptr() as u64 + byte_offset as u64;
            let synced = crate::cuda::sync_export(
                device,
                data,
                has_elements,
                &pending,
                sync.request,
                sync.ready.is_some(),
            )?;
            if synced.ready.is_some() {
                sync.ready = Some(synced.ready);
            }
            sync.copy = synced.copy;
        }
    }
    let (data, read_only) = match parts.buffer {
        BufferAccess::Unique(b) if !parts.read_only => match b.as_mut_ptr() {
            Some(p) => (p, false),
            None => (b.as_ptr().cast_mut(), true),
        },
        BufferAccess::Unique(b) => (b.as_ptr().cast_mut(), true),
        BufferAccess::Shared(b) => (b.as_ptr().cast_mut(), true),
    };
    let raw_dtype = layout::dtype_to_raw(dtype);
    let raw_device = layout::device_to_raw(device);
    // `layout::validate`'s checks, in its order, on what the passes above computed.
    let element_bits = layout::check_dtype(raw_dtype, false)?;
    if byte_offset > isize::MAX as usize {
        return Err(LayoutError::Overflow {
            what: "byte_offset",
        }
        .into());
    }
    let numel = match numel {
        Some(n) if n <= isize::MAX as u64 => n as usize,
        _ => {
            return Err(LayoutError::Overflow {
                what: "element count",
            }
            .into());
        }
    };
    let mut dl_tensor = DLTensor {
        data,
        device: raw_device,
        ndim: ndim as i32,
        dtype: raw_dtype,
        shape: shape_ptr,
        strides: strides_ptr,
        byte_offset: byte_offset as u64,
    };
    let span = if numel == 0 {
        // Zero-size tensors carry a NULL `data` (spec section 1.7, `dlpack.h` `data` docs).
        dl_tensor.data = ptr::null_mut();
        dl_tensor.byte_offset = 0;
        ByteSpan { start: 0, end: 0 }
    } else {
        // Every extent is >= 1, so the reach was accumulated as `validate` does.
        let (lo, hi) = reach.bounds()?;
        let span = layout::span_from_bounds(lo, hi, element_bits, byte_offset as u64)?;
        if span.start < 0 || span.end as usize > byte_len {
            return Err(LayoutError::OutOfBuffer {
                start: span.start,
                end: span.end,
                len: byte_len,
            }
            .into());
        }
        // Inside a live buffer, so never NULL nor wrapping; checked all the same.
        layout::check_address(data, numel, span)?;
        if has_address_data(device.device_type) {
            // Fold the offset into `data`: consumers that drop `byte_offset` (spec section 6,
            // corner 2) then still read the right element. In bounds: `byte_offset <= span.end`.
            dl_tensor.data = data.cast::<u8>().wrapping_add(byte_offset).cast();
            dl_tensor.byte_offset = 0;
            // The span is relative to `data`, which moved by `byte_offset` (a whole number of
            // bytes, so the rounding of sub-byte spans is unchanged); the addresses it covers,
            // checked above, are the same.
            ByteSpan {
                start: span.start - byte_offset as isize,
                end: span.end - byte_offset as isize,
            }
        } else {
            span
        }
    };
    // SAFETY: exclusive (caller); the owner's borrow (`parts`) ends above. Writes the header in
    // place (it was uninitialized, nothing to drop) and the read-only mark.
    unsafe {
        let b = block.as_ptr();
        (*b).prefix.read_only = read_only;
        ptr::addr_of_mut!((*b).header).write(H::new::<O>(dl_tensor, b.cast(), read_only));
    }
    debug_assert_eq!(
        // SAFETY: `shape`/`strides` point to `ndim` initialized `i64` each, in the block.
        unsafe { layout::validate(&dl_tensor, NullStrides::Refuse, false) }
            .map(|l| (l.numel(), l.span())),
        Ok((numel, span)),
        "the exporter's validation is that of the finished header"
    );
    Ok(())
}

/// Device types whose `data` is a plain address, so an offset can be folded into it.
fn has_address_data(device_type: DeviceType) -> bool {
    matches!(
        device_type,
        DeviceType::Cpu
            | DeviceType::Cuda
            | DeviceType::CudaHost
            | DeviceType::CudaManaged
            | DeviceType::Rocm
            | DeviceType::RocmHost
    )
}

/// Drops the owner and frees the block. A panic in the owner's `Drop` is caught and reported
/// on stderr; the block is freed all the same. Never unwinds: the owner's `Drop` is the only
/// code here that can panic.
///
/// # Safety
///
/// `block`'s prefix and owner are initialized (by [`build`]), and the block is freed exactly
/// once.
#[inline]
unsafe fn free_block<H, O>(block: NonNull<Block<H, O>>) {
    // The owner's drop may bind a CUDA context (cudarc buffers do): the consumer's thread keeps
    // its own.
    #[cfg(feature = "cuda")]
    let _current = crate::cuda::CurrentContext::save();
    let b = block.as_ptr();
    // SAFETY: the prefix is initialized (caller).
    let size = unsafe { (*b).prefix.size };
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the owner is initialized and dropped exactly once (caller).
        unsafe { ManuallyDrop::drop(&mut (*b).owner) }
    }));
    if dropped.is_err() {
        report("the exported owner panicked while being dropped; its memory is freed regardless");
    }
    // SAFETY: `build` allocated the block with exactly this size and alignment (the size is
    // recorded in the prefix, the alignment depends on `H` and `O` only).
    unsafe {
        alloc::dealloc(
            b.cast(),
            Layout::from_size_align_unchecked(size, block_align::<H, O>()),
        )
    };
}

#[cold]
fn report(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "dlpack-runtime: {message}");
}

/// The `deleter` of exported tensors: frees the block. Never unwinds: [`free_block`] catches
/// the owner's panics, and nothing else in it panics (were it to, `extern "C"` aborts rather
/// than unwind).
///
/// # Safety
///
/// Called by the consumer, once, with the pointer handed out (the `dlpack.h` deleter contract).
unsafe extern "C" fn delete_block<H, O>(header: *mut H) {
    if let Some(header) = NonNull::new(header) {
        // SAFETY: the header is at offset 0 of its `Block<H, O>`, which `build` made and
        // finished; the consumer calls the deleter exactly once (caller).
        unsafe { free_block::<H, O>(header.cast()) };
    }
}

/// Host memory with 64-byte alignment, for copies.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Align64([u8; 64]);

struct CopiedBuffer {
    chunks: Vec<Align64>,
    byte_len: usize,
    dtype: DataType,
}

// SAFETY: `chunks` owns at least `byte_len` initialized host bytes, 64-byte aligned, which
// is enough for every dtype; `as_mut_ptr` derives from `&mut self`.
unsafe impl ExportBuffer for CopiedBuffer {
    #[inline]
    fn dtype(&self) -> DataType {
        self.dtype
    }
    #[inline]
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    #[inline]
    fn as_ptr(&self) -> *const c_void {
        self.chunks.as_ptr().cast()
    }
    #[inline]
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        Some(self.chunks.as_mut_ptr().cast())
    }
}

struct Copied {
    buffer: CopiedBuffer,
    shape: Vec<usize>,
}

/// Zeroed host memory for `numel` elements of `element_bytes`, 64-byte aligned.
/// Host memory for `numel` elements of `element_bytes`, 64-byte aligned: zeroed when `zeroed`,
/// else allocated only (length 0, capacity for every byte).
fn host_chunks(
    numel: usize,
    element_bytes: usize,
    zeroed: bool,
) -> Result<(Vec<Align64>, usize), ExportError> {
    let too_large = LayoutError::CopyTooLarge {
        numel,
        element_bytes,
    };
    let byte_len = numel
        .checked_mul(element_bytes)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| too_large.clone())?;
    let mut chunks = Vec::new();
    chunks
        .try_reserve_exact(byte_len.div_ceil(64))
        .map_err(|_| too_large)?;
    if zeroed {
        chunks.resize(byte_len.div_ceil(64), Align64([0; 64]));
    }
    Ok((chunks, byte_len))
}

fn copied_parts(c: &mut Copied) -> ExportParts<'_> {
    ExportParts::unique(&mut c.buffer, &c.shape)
}

/// A zeroed, compact row-major host tensor of `dtype` and `shape` (in elements), versioned,
/// writable: what a producer's allocator hands out (spec section 5.3).
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn allocate_host(
    dtype: DataType,
    shape: Vec<usize>,
) -> Result<ManagedTensor, ExportError> {
    let Some(size) = dtype.element_bytes() else {
        return Err(LayoutError::SubByteAccess { dtype }.into());
    };
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &e| acc.checked_mul(e))
        .unwrap_or(usize::MAX);
    let (chunks, byte_len) = host_chunks(numel, size, true)?;
    let owner = Copied {
        buffer: CopiedBuffer {
            chunks,
            byte_len,
            dtype,
        },
        shape,
    };
    build_owned::<DLManagedTensorVersioned, _, _>(owner, &copied_parts)
}

/// A compact row-major host copy of the tensor `layout` describes, flagged `IS_COPIED` (spec
/// section 2.7) and versioned when `versioned`: `fill` writes the elements to the new memory
/// (`plan.bytes()` bytes at the pointer it gets) as `plan` describes: a plan for a copy engine
/// with that maximum pitch (`engine_pitch`), or for the host.
pub(crate) fn copy_to_host(
    layout: &crate::layout::TensorLayout<'_>,
    versioned: bool,
    engine_pitch: Option<usize>,
    fill: impl FnOnce(*mut u8, &crate::copy::StridedCopy) -> Result<(), ExportError>,
) -> Result<ManagedTensor, ExportError> {
    let dtype = layout.dtype();
    let Some(size) = dtype.element_bytes() else {
        return Err(LayoutError::SubByteAccess { dtype }.into());
    };
    // Not zeroed: the copy writes every byte but the padding of the last chunk, zeroed here.
    let (mut chunks, byte_len) = host_chunks(layout.numel(), size, false)?;
    let len = byte_len.div_ceil(64);
    let strides = layout.strides_vec();
    let plan = match engine_pitch {
        Some(pitch) => crate::copy::StridedCopy::new(layout.shape(), &strides, size, pitch),
        None => crate::copy::StridedCopy::for_host(layout.shape(), &strides, size),
    };
    debug_assert_eq!(plan.bytes(), byte_len);
    if byte_len > 0 {
        // SAFETY: the capacity holds `len >= 1` chunks; the last one is written whole.
        unsafe { chunks.as_mut_ptr().add(len - 1).write(Align64([0; 64])) };
        fill(chunks.as_mut_ptr().cast::<u8>(), &plan)?;
        // SAFETY: `fill` succeeded, so the plan's `byte_len` bytes are written, and the padding
        // after them (inside the last chunk) was zeroed: `len` chunks are initialized.
        unsafe { chunks.set_len(len) };
    }
    let shape = layout.shape().iter().map(|&e| e as usize).collect();
    let copied = Copied {
        buffer: CopiedBuffer {
            chunks,
            byte_len,
            dtype,
        },
        shape,
    };
    build_copied(copied, &copied_parts, versioned)
}

/// Builds the export of a copy `owner` (fresh memory, writable), flagged `IS_COPIED` (spec
/// section 2.7); versioned when `versioned`.
pub(crate) fn build_copied<O, F>(
    owner: O,
    parts_of: &F,
    versioned: bool,
) -> Result<ManagedTensor, ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    let mut managed = if versioned {
        build_owned::<DLManagedTensorVersioned, O, F>(owner, parts_of)?
    } else {
        build_owned::<DLManagedTensor, O, F>(owner, parts_of)?
    };
    managed.set_flags(ffi::DLPACK_FLAG_BITMASK_IS_COPIED);
    Ok(managed)
}

/// A compact row-major copy of a host-accessible tensor, flagged `IS_COPIED` when versioned.
pub(crate) fn copy_of(
    source: &ManagedTensor,
    versioned: bool,
) -> Result<ManagedTensor, ExportError> {
    let layout = source.layout()?;
    if !layout.device().is_host_accessible() {
        return Err(ExportError::CopyUnsupported {
            device: layout.device(),
        });
    }
    let src = layout.first_element_ptr();
    copy_to_host(&layout, versioned, None, |dst, plan| {
        // SAFETY: `src` is element (0, ..., 0) of the validated layout the plan was made from,
        // in host-accessible memory the producer keeps alive while `source` lives; `dst` is
        // fresh memory of `plan.bytes()` bytes.
        unsafe { plan.run_on_host(src, dst) };
        Ok(())
    })
}
