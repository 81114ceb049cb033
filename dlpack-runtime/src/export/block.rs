//! The heap block of an export, with all of the export's `unsafe`: one allocation holds the
//! `DLManagedTensorVersioned` (or legacy `DLManagedTensor`) header, the owner and the `shape`
//! and `strides` arrays; the `extern "C"` deleter drops the owner and frees exactly that block,
//! and never unwinds.

use core::ffi::c_void;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};
use std::alloc::{self, Layout};

use super::block_cache;
use super::{
    ExportError, ExportParts, ExportRequest, StreamWork, keep_current_context, touches_cuda,
};
use crate::abi::ffi::{self, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::tensor::layout::{self, ByteSpan, LayoutError, NullStrides};
use crate::tensor::managed::{ManagedTensor, RawManagedTensor};

/// Whether a legacy tensor freshly built by [`build`] was meant to be read-only; legacy
/// headers have no flags, so the block records it.
pub(super) fn legacy_read_only(managed: &ManagedTensor) -> bool {
    // SAFETY: only tensors built by `build` just before reach here; their `manager_ctx` points
    // to the start of their block, a `Block<DLManagedTensor, O>` whose `prefix` sits at the same
    // offset for every `O` (`repr(C)`, fixed-layout fields before `owner`).
    unsafe {
        let block = managed.dl_tensor_ctx().cast::<Block<DLManagedTensor, ()>>();
        (*block).prefix.read_only
    }
}

/// The header kinds a block can start with.
pub(super) trait Header: Sized {
    /// The header for a finished export whose deleter frees a `Block<Self, O>`.
    fn new<O: Send + 'static>(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        read_only: bool,
    ) -> Self;
    /// Wraps a finished block; `unaliased`: no other tensor reaches its memory.
    ///
    /// # Safety
    ///
    /// `ptr` is a finished block built by [`build`], owned by nobody else, whose header
    /// validates; `unaliased` as [`ManagedTensor::from_raw_validated`] requires.
    unsafe fn into_managed(ptr: NonNull<Self>, unaliased: bool) -> ManagedTensor;
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
    unsafe fn into_managed(ptr: NonNull<Self>, unaliased: bool) -> ManagedTensor {
        // SAFETY: a finished block has version 1.3, known flags and our deleter, and its header
        // validates; `unaliased` as required (caller).
        unsafe { ManagedTensor::from_raw_validated(RawManagedTensor::Versioned(ptr), unaliased) }
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
    unsafe fn into_managed(ptr: NonNull<Self>, unaliased: bool) -> ManagedTensor {
        // SAFETY: a finished block is a valid legacy tensor with our deleter, and its header
        // validates; `unaliased` as required (caller).
        unsafe { ManagedTensor::from_raw_validated(RawManagedTensor::Legacy(ptr), unaliased) }
    }
}

/// Fields every block has right after its header, independent of the owner type.
#[repr(C)]
struct BlockPrefix {
    /// Size of the whole allocation in bytes: with [`block_align`], the layout that
    /// `block_cache::allocation_layout` maps to the allocation's layout.
    size: usize,
    /// Whether the export is read-only (recorded for legacy headers, which have no flags).
    read_only: bool,
    /// Whether the owner may hold CUDA resources (feature `cuda`): its buffer is CUDA memory
    /// (device, pinned host or managed), or the export names CUDA stream work. Its drop may
    /// then bind a CUDA context, so the deleter keeps the thread's current one; host exports
    /// never touch the driver (no `cuInit`, no context calls).
    cuda: bool,
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

/// The owner of an export until it moves into its block, where the caller put it: dropped if
/// the export ends (an error, a panic) before the move. The move is one copy from here into the
/// block (a value moved through intermediate places is copied again, and a copy that reads
/// back fresh writes in differently aligned pieces stalls).
pub(super) struct PendingOwner<O> {
    owner: ManuallyDrop<O>,
    moved: bool,
}

impl<O> PendingOwner<O> {
    #[inline(always)]
    pub(super) fn new(owner: O) -> Self {
        Self {
            owner: ManuallyDrop::new(owner),
            moved: false,
        }
    }

    /// The owner, before the move.
    #[inline(always)]
    pub(super) fn get_mut(&mut self) -> &mut O {
        debug_assert!(!self.moved, "the owner is in its block");
        &mut self.owner
    }

    /// Moves the owner to `dst`; from then on it belongs there and this drops nothing.
    ///
    /// # Safety
    ///
    /// `dst` is valid for a write of `O` and does not overlap `self`; called at most once.
    #[inline(always)]
    unsafe fn move_to(&mut self, dst: *mut ManuallyDrop<O>) {
        debug_assert!(!self.moved, "the owner moves once");
        // Word by word: the caller wrote the owner moments ago (`crate::abi::words`).
        // SAFETY: `dst` is writable and disjoint (caller); the value is not dropped here
        // afterwards (`moved`), so it has exactly one owner: the copy.
        unsafe { crate::abi::words::move_to(&self.owner, dst) };
        self.moved = true;
    }
}

impl<O> Drop for PendingOwner<O> {
    fn drop(&mut self) {
        if !self.moved {
            // SAFETY: not moved, so the owner is here, and this is its only drop.
            unsafe { ManuallyDrop::drop(&mut self.owner) };
        }
    }
}

/// Builds the block for `owner`, of `ndim` axes: one allocation. `parts_of` is asked at the
/// owner's final address in the block, where its answer is exported. On an error before the
/// owner moves into the block, the owner stays in `owner` (its caller drops it).
#[inline(always)]
pub(super) fn build<H, O, F>(
    owner: &mut PendingOwner<O>,
    ndim: usize,
    parts_of: &F,
    sync: &mut StreamWork<'_>,
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
    // At least that size and alignment: the layout of the block's class in the thread's cache.
    let block_layout = block_cache::allocation_layout(block_layout);
    // SAFETY: the layout comes from `allocation_layout`.
    let raw = unsafe { block_cache::allocate(block_layout) };
    let Some(block) = NonNull::new(raw.cast::<Block<H, O>>()) else {
        alloc::handle_alloc_error(block_layout)
    };
    // SAFETY: `block` is a fresh or kept, unused allocation of at least the size and alignment
    // of `Block<H, O>` (the allocation extends that layout), so disjoint from `owner`; the
    // prefix and the owner are written in place, field by field, and the owner moves once
    // (`build` is its only mover). The header stays uninitialized until `fill` writes it:
    // nothing reads it before (`free_block` reads only the prefix and the owner).
    unsafe {
        let b = block.as_ptr();
        ptr::addr_of_mut!((*b).prefix).write(BlockPrefix {
            size: block_layout.size(),
            read_only: false,
            cuda: false,
        });
        owner.move_to(ptr::addr_of_mut!((*b).owner));
    }
    // SAFETY: `arrays_offset` is inside the allocation (`Layout::extend`), aligned for `i64`.
    let arrays = unsafe { raw.add(arrays_offset) }.cast::<i64>();
    // Frees the block if `fill` fails or `parts_of` panics; disarmed on success.
    let guard = BlockGuard::<H, O>(block);
    // SAFETY: the block's prefix and owner are initialized and exclusively ours; `arrays` has
    // `2 * ndim` slots.
    let unaliased = unsafe { fill::<H, O, F>(block, arrays, ndim, parts_of, sync) }?;
    core::mem::forget(guard);
    // SAFETY: `fill` succeeded, so the block is finished (header written) and owned by nobody
    // else, and its finished header validates. `unaliased` is the buffer's word that nothing
    // but it reaches its bytes, except readers of a shared owner that nothing writes
    // (`ExportBuffer::is_unaliased`, part of that unsafe trait's contract); the owner moved into
    // the block, where only this tensor reaches it, or is one of those shared owners.
    Ok(unsafe { H::into_managed(block.cast::<H>(), unaliased) })
}

/// [`build`] for an owner that is not a parameter of the caller: asks its rank first.
pub(super) fn build_owned<H, O, F>(owner: O, parts_of: &F) -> Result<ManagedTensor, ExportError>
where
    H: Header,
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    let mut owner = PendingOwner::new(owner);
    let ndim = parts_of(owner.get_mut()).shape.len();
    build::<H, O, F>(
        &mut owner,
        ndim,
        parts_of,
        &mut StreamWork::new(&ExportRequest::new()),
    )
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
/// [`layout::validate`] would validate it, in the same pass that writes it. Returns whether the
/// buffer's memory is unaliased ([`ExportBuffer::is_unaliased`](super::ExportBuffer::is_unaliased)).
///
/// # Safety
///
/// `block`'s prefix and owner are initialized and the block is exclusively owned by the caller;
/// `arrays` points to `2 * ndim` writable `i64` inside the same allocation.
#[inline(never)]
unsafe fn fill<H, O, F>(
    block: NonNull<Block<H, O>>,
    arrays: *mut i64,
    ndim: usize,
    parts_of: &F,
    sync: &mut StreamWork<'_>,
) -> Result<bool, ExportError>
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
    // Recorded before anything can fail: the guard's `free_block` reads it too.
    if touches_cuda(&parts) {
        // SAFETY: the prefix is initialized and exclusively ours (caller), and disjoint from
        // the owner that `parts` borrows.
        unsafe { (*block.as_ptr()).prefix.cuda = true };
    }
    if parts.shape.len() != ndim {
        return Err(LayoutError::ShapeChanged {
            before: ndim,
            after: parts.shape.len(),
        }
        .into());
    }
    let (device, byte_len) = (parts.facts.device, parts.facts.byte_len);
    let unaliased = parts.facts.unaliased;
    // A dtype field overrides the buffer's (type-erased storage); the layout is checked against
    // the buffer's length in bytes all the same.
    let dtype = parts.dtype();
    let (strides, byte_offset) = parts.strides_and_offset(dtype)?;
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
    // Compact row-major strides (computed below) reach exactly `numel - 1` elements past the
    // first and none before it when every extent is >= 1: their reach telescopes, so it needs
    // no pass of its own.
    let mut compact = false;
    match strides {
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
                    acc = acc.saturating_mul(extent.max(1));
                }
            }
            compact = true;
        }
    }
    let has_elements = numel.is_some_and(|n| n > 0);
    let data_address = parts.facts.ptr as u64 + byte_offset as u64;
    let marked_read_only = parts.read_only;
    let (data, read_only) = match parts.facts.mut_ptr {
        Some(p) if !marked_read_only => (p, false),
        _ => (parts.facts.ptr.cast_mut(), true),
    };
    if !unaliased {
        // Memory that others may borrow: the buffer records the loan (or refuses it).
        parts
            .buffer()
            .lend(!read_only)
            .map_err(LayoutError::Borrow)?;
    }
    let raw_dtype = dtype.to_raw();
    let raw_device = device.to_raw();
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
        // Zero-size tensors carry a NULL `data` (`dlpack.h`, `DLTensor::data`).
        dl_tensor.data = ptr::null_mut();
        dl_tensor.byte_offset = 0;
        ByteSpan { start: 0, end: 0 }
    } else {
        // Every extent is >= 1, so the reach was accumulated as `validate` does, or, for the
        // compact strides, is the sum `validate` computes: `sum((extent - 1) * stride)` with
        // each stride the product of the later extents telescopes to `numel - 1` (no stride
        // saturated: they divide `numel`, which fits in `isize`).
        let (lo, hi) = if compact {
            (0, numel as i64 - 1)
        } else {
            reach.bounds()?
        };
        let span = layout::span_from_bounds(lo, hi, element_bits, byte_offset as u64)?;
        if span.start < 0 || span.end as usize > byte_len {
            return Err(out_of_buffer(
                parts.shape,
                strides,
                span,
                byte_len,
                element_bits,
                byte_offset,
            )
            .into());
        }
        // Inside a live buffer, so never NULL nor wrapping; checked all the same.
        layout::check_address(data, numel, span)?;
        if device.device_type.has_address_data() {
            // Fold the offset into `data`: consumers that ignore `byte_offset` (many do) then
            // still read the right element. In bounds: `byte_offset <= span.end`.
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
    // Make the producer's pending work visible on the consumer's stream (the `stream` parameter
    // of the array API's `__dlpack__`,
    // https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html)
    // while its streams are borrowed, before the tensor is handed out; once the layout is known
    // to be valid: an invalid one is refused before any stream, event or device is asked about
    // (a pointer past the buffer's end as such, not as memory of another device).
    let ordered = sync.order_pending(&parts, device, data_address, has_elements, read_only);
    // A buffer of another device may name CUDA work of its own (its producer stream, or the
    // events of a CUDA import it lends on).
    if sync.touched_cuda() {
        // SAFETY: as above.
        unsafe { (*block.as_ptr()).prefix.cuda = true };
    }
    ordered?;
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
    Ok(unaliased)
}

/// The refusal of a layout that reaches outside the buffer: [`LayoutError::StridesInBytes`]
/// when the strides look like byte strides (whole multiples of the element size that, divided
/// by it, keep the layout inside the buffer), [`LayoutError::OutOfBuffer`] otherwise.
#[cold]
fn out_of_buffer(
    shape: &[usize],
    strides: Option<&[isize]>,
    span: ByteSpan,
    byte_len: usize,
    element_bits: u64,
    byte_offset: usize,
) -> LayoutError {
    let out_of_buffer = LayoutError::OutOfBuffer {
        start: span.start,
        end: span.end,
        len: byte_len,
    };
    let (Some(strides), true) = (strides, element_bits % 8 == 0 && element_bits > 8) else {
        return out_of_buffer;
    };
    let size = (element_bits / 8) as isize;
    let mut reach = layout::Reach::new();
    for (&extent, &stride) in shape.iter().zip(strides) {
        if extent > 1 && stride % size != 0 {
            return out_of_buffer;
        }
        // Extents fit in `i64` (checked by the caller's pass).
        reach.add(extent as i64, (stride / size) as i64);
    }
    let fits = reach
        .bounds()
        .and_then(|(lo, hi)| layout::span_from_bounds(lo, hi, element_bits, byte_offset as u64))
        .is_ok_and(|fixed| fixed.start >= 0 && fixed.end as usize <= byte_len);
    if fits {
        LayoutError::StridesInBytes {
            start: span.start,
            end: span.end,
            len: byte_len,
            element_bytes: size as usize,
        }
    } else {
        out_of_buffer
    }
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
    let b = block.as_ptr();
    // SAFETY: the prefix is initialized (caller).
    let (size, cuda) = unsafe { ((*b).prefix.size, (*b).prefix.cuda) };
    // The drop of an owner of CUDA resources may bind a CUDA context (cudarc buffers do): the
    // consumer's thread keeps its own. A host export's drop leaves the driver alone.
    let _current = keep_current_context(cuda);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the owner is initialized and dropped exactly once (caller).
        unsafe { ManuallyDrop::drop(&mut (*b).owner) }
    }));
    if dropped.is_err() {
        report("the exported owner panicked while being dropped; its memory is freed regardless");
    }
    // SAFETY: `build` allocated the block with `block_cache::allocate`, with the layout that
    // `allocation_layout` makes of the size it recorded in the prefix and the alignment of
    // `Block<H, O>` (which depends on `H` and `O` only); nothing uses the block afterwards.
    unsafe {
        block_cache::free(
            b.cast(),
            block_cache::allocation_layout(Layout::from_size_align_unchecked(
                size,
                block_align::<H, O>(),
            )),
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
