//! Host copies for exports: compact row-major, 64-byte aligned memory, flagged `IS_COPIED`, and
//! fresh host tensors for a producer's allocator.

use core::ffi::c_void;

use super::block::build_owned;
use super::{ExportBuffer, ExportError, ExportParts};
use crate::abi::ffi::{self, DLManagedTensor, DLManagedTensorVersioned};
use crate::borrow::ReadBorrow;
use crate::plan::copy::StridedCopy;
use crate::tensor::dtype::DataType;
use crate::tensor::layout::{LayoutError, TensorLayout};
use crate::tensor::managed::ManagedTensor;

/// Alignment of the memory of host copies, in bytes: a cache line.
const ALIGN: usize = 64;

/// Host memory for copies: `byte_len` bytes from `offset` into `storage`, where the address is
/// a multiple of [`ALIGN`].
///
/// The storage is a plain byte allocation `ALIGN - 1` bytes longer than the data, aligned by
/// hand, rather than an allocation with the alignment asked of the allocator: glibc serves
/// those (`posix_memalign`) by splitting a larger chunk, and alternating them with other
/// allocations of the same size, as a loop of copies does, fragmented its heap until pages
/// were returned to the system and faulted back in on every few copies.
struct CopiedBuffer {
    storage: Vec<u8>,
    offset: usize,
    byte_len: usize,
    dtype: DataType,
}

// SAFETY: `storage` holds `offset + byte_len` initialized bytes, and `storage[offset..]` starts
// at a multiple of `ALIGN` (64), which is enough for every dtype; `as_mut_ptr` derives from
// `&mut self`. `storage` is never resized, so the address does not move.
unsafe impl ExportBuffer for CopiedBuffer {
    #[inline]
    fn dtype(&self) -> DataType {
        self.dtype
    }
    #[inline]
    fn is_unaliased(&self) -> bool {
        // Fresh memory, reached by nothing but the copy's export.
        true
    }
    #[inline]
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    #[inline]
    fn as_ptr(&self) -> *const c_void {
        self.storage[self.offset..].as_ptr().cast()
    }
    #[inline]
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        Some(self.storage[self.offset..].as_mut_ptr().cast())
    }
}

struct Copied {
    buffer: CopiedBuffer,
    shape: Vec<usize>,
}

/// Host memory for `numel` elements of `element_bytes`, aligned to [`ALIGN`]: the storage (its
/// length 0, its capacity `byte_len + ALIGN - 1`, none for 0 bytes), the offset of the aligned
/// start in it, and `byte_len`. Zeroed when `zeroed` (length `offset + byte_len`).
fn host_storage(
    numel: usize,
    element_bytes: usize,
    zeroed: bool,
) -> Result<(Vec<u8>, usize, usize), ExportError> {
    let too_large = LayoutError::CopyTooLarge {
        numel,
        element_bytes,
    };
    let byte_len = numel
        .checked_mul(element_bytes)
        .filter(|&b| b <= isize::MAX as usize - ALIGN)
        .ok_or_else(|| too_large.clone())?;
    let mut storage = Vec::<u8>::new();
    if byte_len == 0 {
        // No allocation: a tensor without elements is exported with NULL `data`.
        return Ok((storage, 0, 0));
    }
    storage
        .try_reserve_exact(byte_len + ALIGN - 1)
        .map_err(|_| too_large)?;
    let offset = storage.as_ptr().align_offset(ALIGN);
    debug_assert!(offset < ALIGN);
    if zeroed {
        storage.resize(offset + byte_len, 0);
    }
    Ok((storage, offset, byte_len))
}

fn copied_parts(c: &mut Copied) -> ExportParts<'_> {
    ExportParts::unique(&mut c.buffer, &c.shape)
}

/// A zeroed, compact row-major host tensor of `dtype` and `shape` (in elements), versioned,
/// writable: what a producer's allocator hands out (`dlpack.h`,
/// `DLPackExchangeAPI::managed_tensor_allocator`).
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
    let (storage, offset, byte_len) = host_storage(numel, size, true)?;
    let owner = Copied {
        buffer: CopiedBuffer {
            storage,
            offset,
            byte_len,
            dtype,
        },
        shape,
    };
    build_owned::<DLManagedTensorVersioned, _, _>(owner, &copied_parts)
}

/// A compact row-major host copy of the tensor `layout` describes, flagged `IS_COPIED`
/// (`dlpack.h`, `DLPACK_FLAG_BITMASK_IS_COPIED`) and versioned when `versioned`: `fill` writes
/// the elements to the new memory (`plan.bytes()` bytes at the pointer it gets) as `plan`
/// describes: a plan for a copy engine with that maximum pitch (`engine_pitch`), or for the
/// host.
pub(crate) fn copy_to_host(
    layout: &TensorLayout<'_>,
    versioned: bool,
    engine_pitch: Option<usize>,
    fill: impl FnOnce(*mut u8, &StridedCopy) -> Result<(), ExportError>,
) -> Result<ManagedTensor, ExportError> {
    let dtype = layout.dtype();
    let Some(size) = dtype.element_bytes() else {
        return Err(LayoutError::SubByteAccess { dtype }.into());
    };
    // Not zeroed: the copy writes every byte after the leading padding, zeroed here.
    let (mut storage, offset, byte_len) = host_storage(layout.numel(), size, false)?;
    let strides = layout.strides_vec();
    let plan = match engine_pitch {
        Some(pitch) => StridedCopy::new(layout.shape(), &strides, size, pitch)?,
        None => StridedCopy::for_host(layout.shape(), &strides, size)?,
    };
    debug_assert_eq!(plan.bytes(), byte_len);
    let start = storage.as_mut_ptr();
    // SAFETY: the capacity holds `offset + byte_len` bytes (`host_storage`): the padding is
    // written here, the `byte_len` bytes after it by `fill`.
    unsafe { start.write_bytes(0, offset) };
    // SAFETY: as above; `offset <= capacity`.
    fill(unsafe { start.add(offset) }, &plan)?;
    // SAFETY: `fill` succeeded, so the plan's `byte_len` bytes after the padding are written:
    // `offset + byte_len` bytes are initialized, within the capacity.
    unsafe { storage.set_len(offset + byte_len) };
    let shape = layout.shape().iter().map(|&e| e as usize).collect();
    let copied = Copied {
        buffer: CopiedBuffer {
            storage,
            offset,
            byte_len,
            dtype,
        },
        shape,
    };
    build_copied(copied, &copied_parts, versioned)
}

/// Builds the export of a copy `owner` (fresh memory, writable), flagged `IS_COPIED`
/// (`dlpack.h`, `DLPACK_FLAG_BITMASK_IS_COPIED`); versioned when `versioned`.
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
    // The copy reads the source while it runs: borrowed shared for that time, so that no
    // import of the same memory writes it meanwhile (see `crate::borrow`), unless no other
    // import can reach it.
    let _read = if source.is_unaliased() {
        None
    } else {
        Some(read_borrow(source, &layout)?)
    };
    let src = layout.first_element_ptr();
    copy_to_host(&layout, versioned, None, |dst, plan| {
        // SAFETY: `src` is element (0, ..., 0) of the validated layout the plan was made from,
        // in host-accessible memory the producer keeps alive while `source` lives; `dst` is
        // fresh memory of `plan.bytes()` bytes.
        unsafe { plan.run_on_host(src, dst) };
        Ok(())
    })
}

/// A shared borrow of the bytes `layout` (the validated host layout of `source`) reaches, for
/// the time of a copy.
fn read_borrow(
    source: &ManagedTensor,
    layout: &TensorLayout<'_>,
) -> Result<ReadBorrow, ExportError> {
    let dtype = layout.dtype();
    let Some(size) = dtype.element_bytes() else {
        return Err(LayoutError::SubByteAccess { dtype }.into());
    };
    ReadBorrow::new(source.id(), layout.footprint(size), source.origin())
        .map_err(|e| LayoutError::Borrow(e).into())
}
