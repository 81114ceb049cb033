//! Copies of device memory with the driver: device allocations for copies, and one driver copy
//! per 2-D block of a strided copy plan.

use std::sync::Arc;

use cudarc::driver::{CudaContext, result, sys};

use super::reaper::{Job, reap};
use super::wait::detached;
use super::{CudaError, bind, driver_error, synchronize};
use crate::plan::copy::{Block, StridedCopy};
use crate::tensor::dtype::DataType;
use crate::tensor::layout::TensorLayout;

/// Device memory of one copy, from `cuMemAlloc`; freed by the reaper once the device has
/// finished the work submitted before the drop (the deleter carries no stream).
pub(crate) struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    byte_len: usize,
    dtype: DataType,
    ctx: Arc<CudaContext>,
}

impl DeviceMemory {
    pub(crate) fn alloc(
        ctx: &Arc<CudaContext>,
        byte_len: usize,
        dtype: DataType,
    ) -> Result<Self, CudaError> {
        let ptr = if byte_len == 0 {
            0
        } else {
            bind(ctx.cu_ctx())?;
            // The copy runs outside every capture (a copy to a stream being captured is refused
            // before this): a capture in global mode elsewhere must not forbid the allocation.
            let _relaxed = super::RelaxedCapture::enter();
            // SAFETY: allocates `byte_len` bytes in the bound context; the memory is written by
            // the copy before anyone reads it, and freed once, in `drop`.
            unsafe { result::malloc_sync(byte_len) }.map_err(driver_error("cuMemAlloc"))?
        };
        Ok(Self {
            ptr,
            byte_len,
            dtype,
            ctx: ctx.clone(),
        })
    }
}

impl DeviceMemory {
    /// The device address (0 for an empty allocation).
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn byte_len(&self) -> usize {
        self.byte_len
    }

    /// The element type the memory holds.
    pub(crate) fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The ordinal of the device the memory is on.
    pub(crate) fn ordinal(&self) -> i32 {
        self.ctx.ordinal() as i32
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = reap(Job::Free {
                ctx: self.ctx.clone(),
                ptr: self.ptr,
            });
        }
    }
}

/// Where a copy writes.
#[derive(Clone, Copy)]
enum CopyTarget {
    Host(*mut u8),
    Device(sys::CUdeviceptr),
    /// Device memory of another device than the source's: the contexts of the two.
    Peer(sys::CUdeviceptr, PeerContexts),
}

/// The primary contexts of the two devices of a copy between devices: the source's and the
/// destination's (`cuMemcpyPeerAsync`'s `srcContext` and `dstContext`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerContexts {
    /// The context of the source's device.
    pub(crate) src: sys::CUcontext,
    /// The context of the destination's device.
    pub(crate) dst: sys::CUcontext,
}

/// Enqueues one block of a strided copy from device memory (`src` is the source's first
/// element) on `stream`.
fn enqueue(
    block: Block,
    src: sys::CUdeviceptr,
    dst: CopyTarget,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    let from = src.wrapping_add_signed(block.src as i64);
    if block.height == 1 {
        // The block addresses `width` bytes of the source tensor's elements (the plan covers
        // exactly them) and `width` bytes inside the destination, which the caller sized to
        // the plan; `stream` is valid for the call. The destination stays alive until the copy
        // has finished (the caller waits, or frees through the reaper).
        return match dst {
            // SAFETY: as above, into host memory.
            CopyTarget::Host(p) => unsafe {
                sys::cuMemcpyDtoHAsync_v2(p.add(block.dst).cast(), from, block.width, stream)
            }
            .result()
            .map_err(driver_error("cuMemcpyDtoHAsync")),
            // SAFETY: as above, into device memory.
            CopyTarget::Device(p) => unsafe {
                sys::cuMemcpyDtoDAsync_v2(p + block.dst as u64, from, block.width, stream)
            }
            .result()
            .map_err(driver_error("cuMemcpyDtoDAsync")),
            // SAFETY: as above, into device memory of the context `peer.dst`; `from` is memory
            // of the context `peer.src`; both are live primary contexts. The copy needs no peer
            // access (the driver stages it when the devices cannot reach each other).
            CopyTarget::Peer(p, peer) => unsafe {
                sys::cuMemcpyPeerAsync(
                    p + block.dst as u64,
                    peer.dst,
                    from,
                    peer.src,
                    block.width,
                    stream,
                )
            }
            .result()
            .map_err(driver_error("cuMemcpyPeerAsync")),
        };
    }
    let (dst_type, dst_host, dst_device) = match dst {
        // SAFETY: `block.dst` is inside the destination (as above).
        CopyTarget::Host(p) => (
            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            unsafe { p.add(block.dst) }.cast(),
            0,
        ),
        // Between devices, a 2-D block is a copy of unified addresses (the driver finds each
        // pointer's device).
        CopyTarget::Device(p) | CopyTarget::Peer(p, _) => (
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            core::ptr::null_mut(),
            p + block.dst as u64,
        ),
    };
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: core::ptr::null(),
        srcDevice: from,
        srcArray: core::ptr::null_mut(),
        srcPitch: block.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: core::ptr::null_mut(),
        dstPitch: block.dst_pitch,
        WidthInBytes: block.width,
        Height: block.height,
    };
    // SAFETY: `height` rows of `width` bytes, `src_pitch` apart, are elements of the source
    // (the plan covers exactly them; `src_pitch >= width`, within the device's maximum pitch);
    // the destination rows are packed inside memory sized to the plan; as above for lifetimes.
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
        .result()
        .map_err(driver_error("cuMemcpy2DAsync"))
}

/// The device's largest pitch for 2-D copies, in bytes.
pub(crate) fn max_pitch(ctx: &CudaContext) -> Result<usize, CudaError> {
    // SAFETY: a device handle of a live context; an attribute query only.
    let pitch = unsafe {
        result::device::get_attribute(
            ctx.cu_device(),
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH,
        )
    }
    .map_err(driver_error("cuDeviceGetAttribute"))?;
    Ok(usize::try_from(pitch).unwrap_or(0))
}

/// Copies the elements of `layout`, CUDA memory of the current context, compactly to host
/// memory at `dst` as `plan` (made for `layout` and this device's maximum pitch) describes, on
/// `stream`, and waits for the copy. A layout of many blocks whose span is not much larger
/// than its elements comes over in one transfer and is compacted on the host.
///
/// # Errors
///
/// [`CudaError::Driver`] from the copies, the wait, or the staging allocation.
///
/// # Safety
///
/// `dst` points to `plan.bytes()` writable bytes; `layout` is a validated layout of CUDA
/// memory that stays alive for the call; `stream` is valid for the call.
pub(crate) unsafe fn copy_to_host(
    layout: &TensorLayout<'_>,
    plan: &StridedCopy,
    dst: *mut u8,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    if plan.bytes() == 0 {
        // Nothing to copy, so nothing to wait for.
        return Ok(());
    }
    let span = layout.span();
    let span_len = span.len();
    let first = layout.byte_offset() as isize - span.start;
    let base = (layout.data() as usize as sys::CUdeviceptr).wrapping_add_signed(span.start as i64);
    let src = layout.first_element_ptr() as usize as sys::CUdeviceptr;
    let staged = plan.blocks() > 1 && span_len <= 2 * plan.bytes() + (1 << 20);
    let mut staging: Vec<u8> = Vec::new();
    let copy = || {
        let enqueued = if staged {
            staging
                .try_reserve_exact(span_len)
                .map_err(|_| CudaError::Driver {
                    call: "host staging allocation",
                    code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                })
                .and_then(|()| {
                    // SAFETY: `base` is the start of the tensor's validated span in device
                    // memory, `span_len` bytes; `staging` has room for them (reserved);
                    // synchronized below before anything reads it.
                    unsafe {
                        sys::cuMemcpyDtoHAsync_v2(
                            staging.as_mut_ptr().cast(),
                            base,
                            span_len,
                            stream,
                        )
                    }
                    .result()
                    .map_err(driver_error("cuMemcpyDtoHAsync"))
                })
        } else {
            plan.try_for_each_block(|block| enqueue(block, src, CopyTarget::Host(dst), stream))
        };
        // Wait even after a failed enqueue: the copies already enqueued write to host memory.
        let waited = synchronize(stream);
        enqueued.and(waited)
    };
    // The copies to pageable host memory, and the wait, block the host: with the GIL released
    // where this thread holds it.
    // SAFETY: driver calls on this function's own pointers and memory; nothing touches Python.
    unsafe { detached(copy) }?;
    if staged {
        // SAFETY: the transfer above wrote all `span_len` bytes (it completed).
        unsafe { staging.set_len(span_len) };
        // Compacted in destination order, which the host's caches favour.
        let host = plan.in_host_order(layout.shape(), &layout.strides_vec());
        // SAFETY: element (0, ..., 0) is at `first` inside the staged span, which holds every
        // element of the layout; `dst` has `bytes()` bytes (caller), as `host` writes.
        unsafe { host.run_on_host(staging.as_ptr().offset(first), dst) };
    }
    Ok(())
}

/// Enqueues the copies of `plan` from `src` (element `(0, ..., 0)` of a validated layout of
/// CUDA memory, the one `plan` was made for) into `memory` on `stream`; the host does not wait.
///
/// # Errors
///
/// [`CudaError::Driver`] from the first copy that cannot be enqueued (those before it stay
/// enqueued).
///
/// With `peer`, the source is memory of another device than `memory`'s: each block of one row
/// is a `cuMemcpyPeerAsync` between the two contexts (a compact tensor is one such copy), each
/// block of several rows a 2-D copy of unified addresses.
pub(crate) fn copy_to_device(
    plan: &StridedCopy,
    src: sys::CUdeviceptr,
    memory: &DeviceMemory,
    stream: sys::CUstream,
    peer: Option<PeerContexts>,
) -> Result<(), CudaError> {
    debug_assert!(plan.bytes() <= memory.byte_len);
    let target = match peer {
        Some(peer) => CopyTarget::Peer(memory.ptr, peer),
        None => CopyTarget::Device(memory.ptr),
    };
    plan.try_for_each_block(|block| enqueue(block, src, target, stream))
}

/// Enqueues the copies of `plan` from `src` (element `(0, ..., 0)` of a validated layout of
/// CUDA memory, the one `plan` was made for) into `dst`, device memory of the same device that
/// another allocator owns, on `stream`; the host does not wait.
///
/// # Errors
///
/// [`CudaError::Driver`] from the first copy that cannot be enqueued (those before it stay
/// enqueued).
///
/// # Safety
///
/// `dst` is the first of `plan.bytes()` writable bytes of device memory of the current
/// context's device that stay alive, and that nothing else accesses unordered with `stream`,
/// until the copies have finished on `stream`; `stream` is valid for the call.
#[cfg_attr(not(feature = "burn-cuda"), allow(dead_code))]
pub(crate) unsafe fn copy_into_device(
    plan: &StridedCopy,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    plan.try_for_each_block(|block| enqueue(block, src, CopyTarget::Device(dst), stream))
}

/// Enqueues the copy of `src`, `memory.byte_len()` bytes of host memory, into `memory` on
/// `stream` (a stream of `memory`'s context, which is current), with the GIL released while the
/// driver takes the bytes where this thread holds it: from pageable memory the driver copies
/// them to a staging buffer of its own before the call returns, which may block the host.
///
/// # Errors
///
/// [`CudaError::Driver`] from `cuMemcpyHtoDAsync`.
///
/// # Safety
///
/// `src` points to `memory.byte_len()` readable bytes that stay alive, and are not written,
/// until the copy has finished on `stream` (pageable memory is read before the call returns;
/// pinned memory when the copy runs); `stream` is valid for the call.
pub(crate) unsafe fn enqueue_from_host(
    src: *const u8,
    memory: &DeviceMemory,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    if memory.byte_len == 0 {
        return Ok(());
    }
    let dst = memory.ptr;
    let bytes = memory.byte_len;
    let copy = || {
        // SAFETY: `dst` is a live allocation of `bytes` bytes of the current context; `src`
        // has `bytes` readable bytes (the caller's contract); `stream` is valid for the call.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream) }
            .result()
            .map_err(driver_error("cuMemcpyHtoDAsync"))
    };
    // SAFETY: one driver call on this function's own pointers; nothing touches Python.
    unsafe { detached(copy) }
}
