//! The buffers an export lends: [`ExportBuffer`] (the `unsafe` trait for memory itself) and
//! [`AsExportBuffer`] (the safe trait for what holds buffers: storage enums, `Arc`s).

use core::ffi::c_void;
use std::sync::Arc;

use crate::tensor::device::Device;
use crate::tensor::dtype::{DataType, Element};

/// A contiguous buffer that can be exported: a base pointer, a length in bytes, a dtype and a
/// device.
///
/// Implemented for `Vec<T>`, `Box<[T]>` and `Arc<[T]>` with `T:`[`Element`] (host memory), for
/// `ndarray::Array<T, D>` (feature `ndarray`), and for imported tensors
/// ([`ImportedData<T>`](crate::ImportedData), [`ManagedTensor`](crate::ManagedTensor)), which
/// lend the bytes their layout reaches, so that a tensor type can hold imported memory and lend
/// it on zero-copy (see [`ImportedData::start_offset`](crate::ImportedData::start_offset)). `Arc<[T]>` is exported writable only while the
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
///   readable and writable; any other access to them while the export lives is the
///   implementer's to order (a buffer that lends memory others also describe, as NumPy lends
///   one array to every `__dlpack__` call, leaves [`is_unaliased`](Self::is_unaliased) false:
///   the imports of this crate then order their accesses through its borrow registry);
/// - the bytes hold values of [`dtype`](Self::dtype), and the pointer is aligned for it;
/// - when [`is_unaliased`](Self::is_unaliased) returns `true`, nothing but `self` (and exports
///   of it) reaches the bytes, and nothing writes them while `self` is shared.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exportable buffer",
    label = "not an `ExportBuffer`",
    note = "buffers are `Vec<T>`, `Box<[T]>`, `Arc<[T]>` (and `ndarray::Array<T, D>` with the `ndarray` feature) with `T: dlpack_runtime::Element`, and imported tensors (`ImportedData<T>`, `ManagedTensor`)",
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
    /// Whether nothing but this buffer reaches its bytes: no other buffer, tensor, reference or
    /// foreign code reads or writes them while `self` lives, except through `self` (and through
    /// clones of a shared owner such as an `Arc`, which only read while it is shared). `true`
    /// for memory a Rust value owns outright (`Vec<T>`, `Box<[T]>`, `Arc<[T]>`, an owned
    /// `ndarray::Array`, a fresh copy); `false`, the default, for memory that something else
    /// may also describe: an imported tensor lent on (unless it is itself unaliased), foreign
    /// or mapped memory.
    ///
    /// Imports of a tensor exported from an unaliased buffer skip the borrow registry of
    /// [`ImportedData`](crate::ImportedData): no other import can describe the same bytes, so
    /// no borrow can conflict. Returning `true` for memory something else reaches is unsound
    /// (it is part of this trait's contract).
    #[inline]
    fn is_unaliased(&self) -> bool {
        false
    }
    /// Called by every export of this buffer whose memory is not unaliased
    /// ([`is_unaliased`](Self::is_unaliased)), before the tensor is handed out, with whether
    /// the export is writable: a buffer whose memory is borrowed elsewhere (an imported tensor
    /// lent on) records the loan there, and refuses it while that memory is borrowed in a way
    /// the loan conflicts with. The default does nothing.
    ///
    /// # Errors
    ///
    /// [`BorrowError`](crate::BorrowError) when the memory cannot be lent so.
    #[inline]
    fn lend(&self, writable: bool) -> Result<(), crate::BorrowError> {
        let _ = writable;
        Ok(())
    }
    /// The layout the buffer carries itself, when it is more than a run of elements (an
    /// `ndarray::Array` knows its shape, its strides and where its element `(0, ..., 0)` is);
    /// `None`, the default, for flat buffers, whose layout is the one the tensor type declares
    /// (its `#[dlpack(shape)]`, `#[dlpack(strides)]` and offset fields).
    ///
    /// An export of a buffer with a layout of its own exports that layout, never another: the
    /// declared shape must be the buffer's; declared strides, when given, must be the buffer's
    /// on every axis of extent > 1 (absent strides stand for the buffer's own, not for compact
    /// row-major); a declared offset must be 0 (the buffer's own is used) or the buffer's own;
    /// a dtype set with [`ExportParts::with_dtype`](crate::ExportParts::with_dtype) must be the
    /// buffer's. Otherwise the export fails with [`ExportError::BufferLayout`](crate::ExportError::BufferLayout).
    /// The layout adds nothing to this trait's safety contract: the export checks that it
    /// stays within [`byte_len`](Self::byte_len), as it checks a declared one.
    #[inline]
    fn own_layout(&self) -> Option<BufferLayout<'_>> {
        None
    }
    /// The stream the buffer's own pending work is ordered on (a cudarc `CudaSlice`'s stream),
    /// if any; the export orders the consumer after it as after `#[dlpack(stream)]` fields.
    #[cfg(feature = "cuda")]
    fn producer_stream(&self) -> Option<crate::export::ProducerStream<'_>> {
        None
    }
    /// The events after which the buffer's data is ready (feature `cuda`), if it carries any:
    /// an imported CUDA tensor lent on ([`ManagedTensor::ready_events`](crate::ManagedTensor::ready_events)).
    /// The export orders the consumer after them: its stream waits on them, or the host does
    /// for a host consumer; the exported tensor carries them on.
    #[cfg(feature = "cuda")]
    fn ready_events(&self) -> Option<&crate::engine::cuda::ReadyEvents> {
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
    fn is_unaliased(&self) -> bool {
        true
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
    fn is_unaliased(&self) -> bool {
        true
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
    fn is_unaliased(&self) -> bool {
        true
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

/// The layout a buffer carries itself ([`ExportBuffer::own_layout`]), relative to its
/// [`as_ptr`](ExportBuffer::as_ptr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLayout<'a> {
    /// Extents in elements.
    pub shape: &'a [usize],
    /// Strides in elements of the buffer's dtype, signed, one per axis.
    pub strides: &'a [isize],
    /// Bytes from [`as_ptr`](ExportBuffer::as_ptr) to element `(0, ..., 0)` (non-zero when a
    /// negative stride puts it above the lowest address).
    pub byte_offset: usize,
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
    note = "buffers are `Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `Arc<Vec<T>>` (and `ndarray::Array<T, D>` with the `ndarray` feature) with `T: dlpack_runtime::Element`, imported tensors (`ImportedData<T>`, `ManagedTensor`), and `Arc<S>` of any of them",
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
