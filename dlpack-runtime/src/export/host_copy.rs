//! Host copies for exports: compact row-major, 64-byte aligned memory, flagged `IS_COPIED`, and
//! fresh host tensors for a producer's allocator.

use core::ffi::c_void;

use super::block::build_owned;
use super::{ExportBuffer, ExportError, ExportParts};
use crate::copy::StridedCopy;
use crate::dtype::DataType;
use crate::ffi::{self, DLManagedTensor, DLManagedTensorVersioned};
use crate::layout::{LayoutError, TensorLayout};
use crate::managed::ManagedTensor;

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
    // Not zeroed: the copy writes every byte but the padding of the last chunk, zeroed here.
    let (mut chunks, byte_len) = host_chunks(layout.numel(), size, false)?;
    let len = byte_len.div_ceil(64);
    let strides = layout.strides_vec();
    let plan = match engine_pitch {
        Some(pitch) => StridedCopy::new(layout.shape(), &strides, size, pitch),
        None => StridedCopy::for_host(layout.shape(), &strides, size),
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
    let src = layout.first_element_ptr();
    copy_to_host(&layout, versioned, None, |dst, plan| {
        // SAFETY: `src` is element (0, ..., 0) of the validated layout the plan was made from,
        // in host-accessible memory the producer keeps alive while `source` lives; `dst` is
        // fresh memory of `plan.bytes()` bytes.
        unsafe { plan.run_on_host(src, dst) };
        Ok(())
    })
}
