//! Imported tensors as the storage of exports: [`ImportedData<T>`] and [`ManagedTensor`] are
//! [`ExportBuffer`]s, so a tensor type of your own can hold imported memory (alone, or as a
//! variant of a storage enum beside owned buffers) and lend it on zero-copy.
//!
//! As a buffer, an imported tensor lends the bytes its layout reaches, from the lowest one (the
//! tensor's byte span): with negative strides that lowest byte lies before element
//! `(0, ..., 0)`. [`ImportedData::start_offset`] gives the element offset of `(0, ..., 0)` from
//! there, which is the `offset` of a tensor that re-exports the import's own layout, and what
//! the `offset` (`byte_offset`, in bytes) field of a derived consumer receives: a type that
//! derives both directions re-exports what it imported as it was. Read-only
//! imports (flagged, or legacy) stay read-only; a writable import is lent writable when it is
//! exported by value. The producer's deleter runs once, when the last owner of the import is
//! dropped: after every consumer of every re-export is done.

use core::ffi::c_void;

use super::ImportedData;
use crate::borrow::{self, Access, BorrowError, Footprint};
use crate::export::ExportBuffer;
use crate::tensor::device::Device;
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::layout::{ByteSpan, TensorLayout};
use crate::tensor::managed::ManagedTensor;

/// The bytes a managed tensor's layout reaches, as `(lowest byte, length)`; an empty span at
/// `data` for a zero-size tensor or an invalid layout (whose exports then fail their bounds
/// check).
fn lent_bytes(managed: &ManagedTensor) -> (*mut u8, usize) {
    let data = managed.dl_tensor().data.cast::<u8>();
    match managed.layout() {
        Ok(layout) => {
            let ByteSpan { start, end } = layout.span();
            // Inside the validated span: `data + start` does not wrap.
            (data.wrapping_offset(start), (end - start) as usize)
        }
        Err(_) => (data, 0),
    }
}

/// Bytes from the first byte `layout` reaches to element `(0, ..., 0)`: where that element lies
/// in the bytes an import of the layout lends ([`lent_bytes`]), so the `byte_offset` of a
/// tensor that re-exports them with the layout's own shape and strides. `byte_offset` minus the
/// reach of the negative strides: `byte_offset` itself unless some stride is negative. 0 for a
/// tensor without elements, which reaches no byte.
pub(crate) fn lent_byte_offset(layout: &TensorLayout<'_>) -> usize {
    let span = layout.span();
    if span.is_empty() {
        return 0;
    }
    // The span starts at or below element `(0, ..., 0)`, `byte_offset` bytes from `data`.
    (layout.byte_offset() as isize - span.start) as usize
}

/// The footprint of `managed`'s bytes, for host memory of whole-byte elements with a valid
/// layout (the only memory that is borrowed); `None` otherwise, or when it reaches no byte.
pub(super) fn host_footprint(managed: &ManagedTensor) -> Option<Footprint> {
    let layout = managed.layout().ok()?;
    if !layout.device().is_host_accessible() {
        return None;
    }
    layout.footprint(layout.dtype().element_bytes()?)
}

impl<T: Element> ImportedData<T> {
    /// Elements from the lowest element the layout reaches to element `(0, ..., 0)`: the
    /// `offset` (in elements) of a tensor that lends this import on with the import's own shape
    /// and strides (0 unless some stride is negative; 0 for a tensor without elements). It is
    /// what a `#[dlpack(offset)]` field of a derived consumer receives beside this data.
    ///
    /// # Errors
    ///
    /// The validation error of an invalid layout.
    pub fn start_offset(&self) -> Result<usize, crate::LayoutError> {
        let layout = self.layout()?;
        // The span's start is an element boundary: strides are whole elements.
        Ok(lent_byte_offset(&layout) / core::mem::size_of::<T>().max(1))
    }
}

// SAFETY: the pointer and length are those of the byte span of the import's validated layout,
// memory the producer keeps alive, unmodified in place by it only as the shared-memory rules of
// the crate allow, until `self` (which owns the managed tensor) is dropped; the bytes hold
// elements of `T::DTYPE` (checked at import), aligned as the import's first element is. The
// mutable pointer is handed out only for a writable import (versioned, not flagged read-only)
// through `&mut self`.
unsafe impl<T: Element> ExportBuffer for ImportedData<T> {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn is_unaliased(&self) -> bool {
        // Lent on by value or shared, an unaliased import keeps its memory unaliased: nothing
        // but it (and what it is lent to) reaches the bytes.
        self.managed().is_unaliased()
    }
    fn lend(&self, writable: bool) -> Result<(), BorrowError> {
        self.lend_memory(writable)
    }
    fn device(&self) -> Device {
        Device::from_raw(self.managed().dl_tensor().device)
    }
    fn byte_len(&self) -> usize {
        lent_bytes(self.managed()).1
    }
    fn as_ptr(&self) -> *const c_void {
        lent_bytes(self.managed()).0.cast_const().cast()
    }
    #[cfg(feature = "cuda")]
    fn ready_events(&self) -> Option<&crate::engine::cuda::ReadyEvents> {
        self.managed().ready_events()
    }
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        // Lent on by value: whatever this import borrowed before is over (`&mut self`: no
        // reference of it is alive), and its consumers borrow for themselves.
        self.release_borrow();
        if self.is_read_only() {
            return None;
        }
        Some(lent_bytes(self.managed()).0.cast())
    }
}

// SAFETY: as for `ImportedData<T>`, with the dtype of the tensor's header.
unsafe impl ExportBuffer for ManagedTensor {
    fn dtype(&self) -> DataType {
        DataType::from_raw(self.dl_tensor().dtype)
    }
    fn is_unaliased(&self) -> bool {
        ManagedTensor::is_unaliased(self)
    }
    fn lend(&self, writable: bool) -> Result<(), BorrowError> {
        let Some(footprint) = host_footprint(self) else {
            return Ok(());
        };
        let access = if writable {
            Access::Exclusive
        } else {
            Access::Shared
        };
        borrow::lend(self.id(), &footprint, self.origin(), access)
    }
    fn device(&self) -> Device {
        Device::from_raw(self.dl_tensor().device)
    }
    fn byte_len(&self) -> usize {
        lent_bytes(self).1
    }
    fn as_ptr(&self) -> *const c_void {
        lent_bytes(self).0.cast_const().cast()
    }
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        if self.is_read_only() {
            return None;
        }
        Some(lent_bytes(self).0.cast())
    }
    #[cfg(feature = "cuda")]
    fn ready_events(&self) -> Option<&crate::engine::cuda::ReadyEvents> {
        ManagedTensor::ready_events(self)
    }
}
