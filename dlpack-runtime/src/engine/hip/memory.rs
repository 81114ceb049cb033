//! HIP device memory: [`HipSlice`], a minimal owned buffer of one stream, and the copies of a
//! ROCm export to the host.

use core::ffi::c_void;
use core::marker::PhantomData;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::sys::{self, hipStream_t};
use super::{CurrentDevice, HipError, HipStream, api, check, check_not_capturing};
use crate::engine::cuda::detached;
use crate::plan::copy::{Block, StridedCopy};
use crate::tensor::dtype::{DataType, Element};

/// `len` elements of `T` in device memory of one HIP device, allocated and freed in the order
/// of one stream (`hipMallocAsync`, `hipFreeAsync`); every operation on it is enqueued on that
/// stream, so its work is pending there until the stream has passed it.
///
/// As the `#[dlpack(data)]` field of a derived type it exports as `kDLROCM` memory of its
/// stream's device, and names its stream as a producer stream: the consumer's stream is made
/// to wait for the work pending on it.
///
/// Dropped while its stream is being captured into a HIP graph, the memory is leaked: a free
/// enqueued there would join the capture. Keep slices of a capturing stream alive until the
/// capture ends.
#[derive(Debug)]
pub struct HipSlice<T: Element> {
    /// The device address (0 for no elements).
    ptr: u64,
    len: usize,
    stream: Arc<HipStream>,
    _element: PhantomData<T>,
}

impl<T: Element> HipSlice<T> {
    /// `len` elements set to zero bytes, on `stream`'s device, in `stream`'s order
    /// (`hipMallocAsync`, `hipMemsetAsync`); the host does not wait.
    ///
    /// # Errors
    ///
    /// [`HipError::NoDriver`]; [`HipError::Driver`] (out of memory, a size overflow as
    /// `hipErrorInvalidValue`).
    pub fn alloc_zeros(stream: &Arc<HipStream>, len: usize) -> Result<Self, HipError> {
        let mut slice = Self::alloc(stream, len)?;
        slice.memset(0)?;
        Ok(slice)
    }

    /// A copy of `values` on `stream`'s device, in `stream`'s order (`hipMallocAsync`,
    /// `hipMemcpyAsync` from pageable memory, which the runtime reads before it returns).
    ///
    /// # Errors
    ///
    /// As [`HipSlice::alloc_zeros`].
    pub fn from_host(stream: &Arc<HipStream>, values: &[T]) -> Result<Self, HipError> {
        let mut slice = Self::alloc(stream, values.len())?;
        slice.copy_from_host(values)?;
        Ok(slice)
    }

    fn alloc(stream: &Arc<HipStream>, len: usize) -> Result<Self, HipError> {
        let api = api()?;
        let bytes = len.checked_mul(size_of::<T>()).ok_or(HipError::Driver {
            call: "hipMallocAsync",
            code: sys::ERROR_INVALID_VALUE,
            name: "hipErrorInvalidValue".to_owned(),
        })?;
        let mut ptr: *mut c_void = core::ptr::null_mut();
        if bytes > 0 {
            let current = CurrentDevice::save()?;
            current.set(stream.device())?;
            check(
                "hipMallocAsync",
                // SAFETY: a valid out-pointer; the stream is live (the `Arc` holds it), of the
                // current device.
                unsafe { (api.hipMallocAsync)(&mut ptr, bytes, stream.raw()) },
                api,
            )?;
        }
        Ok(Self {
            ptr: ptr as u64,
            len,
            stream: Arc::clone(stream),
            _element: PhantomData,
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The device address of the first element (0 for no elements).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The HIP device ordinal of the memory.
    pub fn device(&self) -> i32 {
        self.stream.device()
    }

    /// The stream the slice's work is ordered on.
    pub fn stream(&self) -> &Arc<HipStream> {
        &self.stream
    }

    /// Sets every byte to `byte`, on the slice's stream (`hipMemsetAsync`); the host does not
    /// wait.
    ///
    /// # Errors
    ///
    /// [`HipError::Driver`].
    pub fn memset(&mut self, byte: u8) -> Result<(), HipError> {
        if self.ptr == 0 {
            return Ok(());
        }
        let api = api()?;
        let current = CurrentDevice::save()?;
        current.set(self.device())?;
        check(
            "hipMemsetAsync",
            // SAFETY: `byte_len` bytes of our allocation; the stream is live, of its device.
            unsafe {
                (api.hipMemsetAsync)(
                    self.ptr as usize as *mut c_void,
                    i32::from(byte),
                    self.byte_len(),
                    self.stream.raw(),
                )
            },
            api,
        )
    }

    /// Copies `values` (as many as the slice has elements) into the slice, on its stream
    /// (`hipMemcpyAsync` from pageable memory: the runtime reads `values` before it returns).
    ///
    /// # Errors
    ///
    /// [`HipError::Driver`] with `hipErrorInvalidValue` when `values` has another length.
    pub fn copy_from_host(&mut self, values: &[T]) -> Result<(), HipError> {
        let api = api()?;
        if values.len() != self.len {
            return check("hipMemcpyAsync", sys::ERROR_INVALID_VALUE, api);
        }
        if self.ptr == 0 {
            return Ok(());
        }
        let current = CurrentDevice::save()?;
        current.set(self.device())?;
        let (dst, src, bytes, stream) = (
            self.ptr as usize,
            values.as_ptr() as usize,
            self.byte_len(),
            self.stream.raw() as usize,
        );
        let copy = move || {
            check(
                "hipMemcpyAsync",
                // SAFETY: `bytes` bytes of our allocation and of `values`, which the runtime reads
                // before it returns (pageable memory); the stream is live.
                unsafe {
                    (api.hipMemcpyAsync)(
                        dst as *mut c_void,
                        src as *const c_void,
                        bytes,
                        sys::MEMCPY_HOST_TO_DEVICE,
                        stream as hipStream_t,
                    )
                },
                api,
            )
        };
        // SAFETY: one HIP call on this function's pointers; nothing touches Python.
        unsafe { detached(copy) }
    }

    /// The slice's values, after the work pending on its stream: the host waits for the stream
    /// (asking first whether it is being captured).
    ///
    /// # Errors
    ///
    /// [`HipError::Capturing`] for a stream being captured; [`HipError::Driver`].
    pub fn to_host(&self) -> Result<Vec<T>, HipError> {
        let mut values: Vec<T> = Vec::with_capacity(self.len);
        if self.ptr != 0 {
            let current = CurrentDevice::save()?;
            current.set(self.device())?;
            check_not_capturing(
                self.stream.raw(),
                "a copy to the host",
                "copy after the capture ends",
            )?;
            // SAFETY: `values` has room for `byte_len` bytes; our allocation has them; the
            // stream is live and not capturing (checked).
            unsafe {
                copy_to_host_on(
                    self.stream.raw(),
                    self.ptr,
                    self.byte_len(),
                    values.as_mut_ptr().cast(),
                )
            }?;
        }
        // SAFETY: the copy wrote all `len` elements (it completed); `T: Element` values are
        // plain data written from device memory of elements of `T`.
        unsafe { values.set_len(self.len) };
        Ok(values)
    }
}

impl<T: Element> Drop for HipSlice<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let Ok(api) = api() else { return };
        let Ok(current) = CurrentDevice::save() else {
            return;
        };
        if current.set(self.device()).is_err() {
            return;
        }
        // A free enqueued on a stream being captured would join the capture: leaked instead.
        if super::capture_of(self.stream.raw()) != Ok(super::Capture::Not) {
            return;
        }
        // SAFETY: our allocation, freed once, in the order of the stream that made it (live:
        // the `Arc` holds it); its device is current.
        let _ = unsafe { (api.hipFreeAsync)(self.ptr as usize as *mut c_void, self.stream.raw()) };
    }
}

/// Copies `bytes` bytes of device memory at `src` to `dst` on `stream` (`hipMemcpyAsync`) and
/// waits for the stream, with the GIL released meanwhile where this thread holds it.
///
/// # Safety
///
/// `src` is `bytes` bytes of device memory of the current device, `dst` has room for `bytes`;
/// `stream` is valid for the call and not being captured (asked by the caller).
unsafe fn copy_to_host_on(
    stream: hipStream_t,
    src: u64,
    bytes: usize,
    dst: *mut u8,
) -> Result<(), HipError> {
    let api = api()?;
    let (stream, dst) = (stream as usize, dst as usize);
    let copy = move || {
        let enqueued = check(
            "hipMemcpyAsync",
            // SAFETY: the caller's contract.
            unsafe {
                (api.hipMemcpyAsync)(
                    dst as *mut c_void,
                    src as usize as *const c_void,
                    bytes,
                    sys::MEMCPY_DEVICE_TO_HOST,
                    stream as hipStream_t,
                )
            },
            api,
        );
        // Waited for even after a failed enqueue: what was enqueued writes to `dst`.
        let waited = check(
            "hipStreamSynchronize",
            // SAFETY: a live stream, not capturing (caller).
            unsafe { (api.hipStreamSynchronize)(stream as hipStream_t) },
            api,
        );
        enqueued.and(waited)
    };
    // SAFETY: HIP calls on the caller's pointers; nothing touches Python.
    unsafe { detached(copy) }
}

/// The stream this crate copies ROCm memory of `device` to the host on: non-blocking, made once
/// per device and kept for the process's lifetime, never captured (no other code knows it).
///
/// # Errors
///
/// As [`HipStream::new_non_blocking`].
pub(crate) fn copy_stream(device: i32) -> Result<hipStream_t, HipError> {
    static STREAMS: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
    let streams = STREAMS.get_or_init(Default::default);
    let mut streams = streams.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&raw) = streams.get(&device) {
        return Ok(raw as hipStream_t);
    }
    let stream = HipStream::new_non_blocking(device)?;
    let raw = stream.raw();
    // Kept for the process's lifetime.
    core::mem::forget(stream);
    streams.insert(device, raw as usize);
    Ok(raw)
}

/// Copies the `bytes` bytes of device memory of HIP device `device` at `src` to `dst`, on
/// [`copy_stream`] (which the caller has made wait for the producer's pending work), and waits
/// for the copy on the host.
///
/// # Safety
///
/// `src` is `bytes` bytes of device memory of `device`, alive until this returns; `dst` has
/// room for `bytes` bytes.
pub(crate) unsafe fn copy_span_to_host(
    device: i32,
    src: u64,
    bytes: usize,
    dst: *mut u8,
) -> Result<(), HipError> {
    if bytes == 0 {
        return Ok(());
    }
    let current = CurrentDevice::save()?;
    current.set(device)?;
    let stream = copy_stream(device)?;
    // SAFETY: the caller's contract; `copy_stream` is live, of `device`, never captured.
    unsafe { copy_to_host_on(stream, src, bytes, dst) }
}

/// The largest row pitch of a 2-D copy that this tier plans, in bytes: `INT_MAX`, the
/// `hipDeviceAttributeMaxPitch` of AMD devices. Larger pitches are split into rows of their
/// own by [`StridedCopy`].
pub(crate) const MAX_PITCH: usize = i32::MAX as usize;

/// Device memory of one HIP device allocated by this crate for a copy (`hipMalloc`), of an
/// element type named at run time. Dropping it does not wait: the reaper thread frees it with
/// `hipFree`, which waits for the device's work submitted so far first (its implicit
/// `hipDeviceSynchronize()`, `hip_runtime_api.h`), so the consumer's work enqueued before the
/// deleter still reads it. The deleter carries no stream (`dlpack.h`,
/// `DLManagedTensorVersioned::deleter`), so nothing narrower than the device can be waited for.
#[derive(Debug)]
pub(crate) struct HipMemory {
    ptr: u64,
    bytes: usize,
    dtype: DataType,
    device: i32,
}

impl HipMemory {
    /// `bytes` bytes of device memory of HIP device `device` (none for 0 bytes), for elements
    /// of `dtype`. The thread's current device is left as it was.
    ///
    /// # Errors
    ///
    /// [`HipError::Driver`] from `hipMalloc` (out of memory).
    pub(crate) fn alloc(device: i32, bytes: usize, dtype: DataType) -> Result<Self, HipError> {
        let mut ptr: *mut c_void = core::ptr::null_mut();
        if bytes > 0 {
            let api = api()?;
            let current = CurrentDevice::save()?;
            current.set(device)?;
            check(
                "hipMalloc",
                // SAFETY: a valid out-pointer; the allocation belongs to the current device.
                unsafe { (api.hipMalloc)(&mut ptr, bytes) },
                api,
            )?;
        }
        Ok(Self {
            ptr: ptr as u64,
            bytes,
            dtype,
            device,
        })
    }

    /// The device address (0 for no bytes).
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size, in bytes.
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The HIP device ordinal.
    pub(crate) fn device(&self) -> i32 {
        self.device
    }
}

impl Drop for HipMemory {
    fn drop(&mut self) {
        if self.ptr != 0 {
            crate::engine::cuda::free_hip_later(self.device, self.ptr);
        }
    }
}

/// Frees `ptr`, device memory of HIP device `device` from `hipMalloc`, with `device` current for
/// the call (the device `hipFree`'s implicit `hipDeviceSynchronize()` waits for: the memory's,
/// whatever device the thread had current). Blocks until the device's work submitted so far is
/// done, with the GIL released meanwhile. The thread's current device is left as it was.
///
/// # Errors
///
/// [`HipError::NoDriver`] without a HIP runtime; [`HipError::NoSuchDevice`];
/// [`HipError::Driver`] from `hipFree` (then the memory is not freed).
pub(crate) fn free_device_memory(device: i32, ptr: u64) -> Result<(), HipError> {
    let api = api()?;
    let current = CurrentDevice::save()?;
    current.set(device)?;
    let free = move || {
        // SAFETY: `ptr` is device memory from `hipMalloc` that the caller frees once, here;
        // `hipFree` waits for the current device's (the memory's) pending work first.
        unsafe { (api.hipFree)(ptr as usize as *mut c_void) }
    };
    // SAFETY: one HIP call; nothing touches Python.
    let code = unsafe { detached(free) };
    check("hipFree", code, api)
}

/// Enqueues the copy `plan` of a strided tensor whose first element is at `src` (device memory
/// of HIP device `src_device`) into the compact memory `dst` (of HIP device `dst.device()`) on
/// `stream` (valid for the call, of `dst`'s device, which is current): one
/// `hipMemcpyAsync` (device to device) or `hipMemcpy2DAsync` per block on one device, one
/// `hipMemcpyPeerAsync` per row between devices.
///
/// # Errors
///
/// [`HipError::Driver`] from the runtime.
///
/// # Safety
///
/// `plan` was made for the source's layout, whose elements stay alive until `stream` has
/// passed the copy; `dst` has at least `plan.bytes()` bytes.
pub(crate) unsafe fn copy_on_device(
    plan: &StridedCopy,
    src: u64,
    src_device: i32,
    dst: &HipMemory,
    stream: hipStream_t,
) -> Result<(), HipError> {
    debug_assert!(plan.bytes() <= dst.bytes);
    let api = api()?;
    let peer = src_device != dst.device;
    plan.try_for_each_block(|block: Block| {
        let from = src.wrapping_add_signed(block.src as i64);
        let to = dst.ptr + block.dst as u64;
        if peer {
            for row in 0..block.height {
                check(
                    "hipMemcpyPeerAsync",
                    // SAFETY: row `row` of the block: `width` bytes of the source's elements
                    // (the plan covers exactly them) and `width` bytes inside `dst` (sized to
                    // the plan), on their two devices; `stream` is valid for the call.
                    unsafe {
                        (api.hipMemcpyPeerAsync)(
                            (to + (row * block.dst_pitch) as u64) as usize as *mut c_void,
                            dst.device,
                            (from + (row * block.src_pitch) as u64) as usize as *const c_void,
                            src_device,
                            block.width,
                            stream,
                        )
                    },
                    api,
                )?;
            }
            return Ok(());
        }
        if block.height == 1 {
            return check(
                "hipMemcpyAsync",
                // SAFETY: as above, on one device.
                unsafe {
                    (api.hipMemcpyAsync)(
                        to as usize as *mut c_void,
                        from as usize as *const c_void,
                        block.width,
                        sys::MEMCPY_DEVICE_TO_DEVICE,
                        stream,
                    )
                },
                api,
            );
        }
        check(
            "hipMemcpy2DAsync",
            // SAFETY: `height` rows of `width` bytes, `src_pitch` apart, are elements of the
            // source (`src_pitch >= width`, at most `MAX_PITCH`); the destination rows are
            // packed inside `dst`; `stream` is valid for the call.
            unsafe {
                (api.hipMemcpy2DAsync)(
                    to as usize as *mut c_void,
                    block.dst_pitch,
                    from as usize as *const c_void,
                    block.src_pitch,
                    block.width,
                    block.height,
                    sys::MEMCPY_DEVICE_TO_DEVICE,
                    stream,
                )
            },
            api,
        )
    })
}
