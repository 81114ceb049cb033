//! The CUDA driver tier: raw driver calls on cudarc's `sys` and `result` layers, for devices,
//! streams and stream plans only (it never sees an export or an import). Errors, the driver
//! probe, the current-context guard, and the checks of pointers and streams live here; events,
//! the reaper and copies in the submodules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use crate::plan::stream::StreamId;

mod copy;
mod event;
mod reaper;
#[cfg(test)]
mod tests;
mod wait;

#[cfg(feature = "burn-cuda")]
pub(crate) use copy::copy_into_device;
pub(crate) use copy::{
    DeviceMemory, PeerContexts, copy_to_device, copy_to_host, enqueue_from_host, max_pitch,
};
#[cfg(any(feature = "python", test))]
pub(crate) use event::order_raw;
pub use event::{ReadyEvents, events_created};
pub(crate) use event::{execute, execute_for, record_and_order};
pub(crate) use reaper::{AfterFailedWait, after_failed_wait, drop_in, leak, release_after_raw};
#[cfg(feature = "hip")]
pub(crate) use reaper::{free_hip_later, release_after_hip};
#[cfg(feature = "hip")]
pub(crate) use wait::detached;
pub(crate) use wait::{HostWait, synchronize};

/// A CUDA failure, or the absence of a driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver: libcuda could not be loaded, expected a machine with an NVIDIA driver"
    )]
    NoDriver,
    /// A failure of the HIP runtime where CUDA and ROCm work meet: the [`ReadyEvents`] of a
    /// ROCm export waited on or synchronized, or waited on by a CUDA stream
    /// (`HipError::ForeignEvents`).
    #[cfg(feature = "hip")]
    #[error(transparent)]
    Hip(#[from] crate::engine::hip::HipError),
    /// A driver call failed.
    #[error("CUDA driver call {call} failed with {code:?}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result code.
        code: sys::CUresult,
    },
    /// A CUDA device ordinal that the driver does not have: negative, or not below the number
    /// of CUDA devices of the process.
    #[error(
        "CUDA device {device} does not exist: the process has {}",
        crate::tensor::device::devices_in_words("CUDA", *count)
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        device: i32,
        /// The number of CUDA devices of the process (`cuDeviceGetCount`).
        count: i32,
    },
    /// A data pointer lives on another device than the tensor says.
    #[error("data pointer {pointer:#x} belongs to CUDA device {found}, expected device {expected}")]
    WrongDevice {
        /// The pointer.
        pointer: u64,
        /// Its device ordinal.
        found: i32,
        /// The device the tensor names.
        expected: i32,
    },
    /// A stream belongs to another device than the one it must be of (`cuStreamGetCtx`; for a
    /// producer stream, its context's device): the tensor's, or for the consumer's stream of a
    /// copy to another device, the `dl_device` asked for.
    #[error(
        "{role} stream {stream:#x} belongs to CUDA device {found}, expected device {expected} (the tensor's, or the dl_device asked for)"
    )]
    StreamOnOtherDevice {
        /// `"consumer"` or `"producer"`.
        role: &'static str,
        /// The stream handle.
        stream: u64,
        /// The device of the stream's context.
        found: i32,
        /// The device the stream must be of.
        expected: i32,
    },
    /// A stream of a context other than its device's primary context, where this crate needs
    /// the primary one: a consumer stream it enqueues work of its own on (a copy), or a
    /// producer's default stream (the special handles resolve in the primary context).
    #[error(
        "{role} stream {stream:#x} belongs to a context other than the primary context of CUDA device {device}, expected a stream of the primary context (the runtime API's)"
    )]
    NotPrimaryContext {
        /// `"consumer"` or `"producer"`.
        role: &'static str,
        /// The stream handle.
        stream: u64,
        /// The tensor's device.
        device: i32,
    },
    /// A stream being captured into a CUDA graph where the operation `operation` needs a
    /// stream that runs its work now: captured work runs only when the graph is launched, and
    /// as often as it is launched.
    #[error(
        "{operation} cannot be done on stream {stream:#x}, which is being captured into a CUDA graph (captured work runs only at each launch of the graph): {instead}"
    )]
    Capturing {
        /// The stream handle.
        stream: u64,
        /// What could not be done, such as `"a copy for the consumer (copy=True or dl_device)"`.
        operation: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// The legacy default stream (`stream=None` or `1`), or a host wait that needs it, while a
    /// blocking stream of its context is being captured into a CUDA graph: any work on the
    /// legacy stream would make the capture depend on it and invalidate it
    /// (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, `cuStreamIsCapturing`).
    #[error(
        "the legacy default stream (stream=None or 1) cannot be ordered while a blocking stream of its context is being captured into a CUDA graph: its implicit synchronization would invalidate the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); expected the capturing stream itself as the consumer's stream, or stream=-1 with the order kept by the caller"
    )]
    LegacyStreamUnderCapture,
    /// The reaper thread of stream-ordered release is gone.
    #[error(
        "the stream-ordered release thread has stopped; the tensor was released at once after a host synchronization"
    )]
    ReaperGone,
}

pub(crate) fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver { call, code: e.0 }
}

/// Loads and initializes the CUDA driver (`cuInit`), once per process; later calls return the
/// first call's result.
///
/// # Errors
///
/// [`CudaError::NoDriver`] when `libcuda` cannot be loaded; [`CudaError::Driver`] when
/// `cuInit` fails (no device, driver too old).
pub fn init() -> Result<(), CudaError> {
    static PROBE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to `dlopen` the driver library under its candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver);
            }
            result::init().map_err(driver_error("cuInit"))
        })
        .clone()
}

/// Restores the thread's current context when dropped. The CUDA runtime (PyTorch, CuPy, JAX)
/// follows the driver's current context, so every entry point here leaves it as it found it.
pub(crate) struct CurrentContext(Option<sys::CUcontext>);

impl CurrentContext {
    /// Saves the current context (nothing without a driver).
    pub(crate) fn save() -> Self {
        if init().is_err() {
            return Self(None);
        }
        let mut ctx: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: the driver is loaded (probed above); a valid out-pointer. On failure `ctx`
        // stays NULL, and NULL is restored: no context, as the driver reported.
        let _ = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        Self(Some(ctx))
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: the context (or NULL) was current on this thread when saved.
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

/// A new non-blocking stream of `ctx` (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`), for a
/// caller that keeps it for the rest of the process: it is never destroyed.
///
/// cudarc's `CudaContext::new_stream` synchronizes the whole context (`cuCtxSynchronize`: a
/// host wait for every stream of the device, other libraries' included) when it makes the
/// first stream of a `CudaContext` handle that tracks events; this makes the stream with the
/// driver instead and never waits.
pub(crate) fn kept_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, CudaError> {
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx())?;
    let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(driver_error("cuStreamCreate"))?;
    // SAFETY: `raw` is a live stream of `ctx` (current when it was made); it is never
    // destroyed, so it outlives the wrapper and everything that retains it; work on it is
    // ordered by its users, as on any stream.
    Ok(unsafe { ctx.wrap_borrowed_stream(raw) })
}

/// Makes `ctx` current on this thread (`cuCtxSetCurrent`), without cudarc's check of errors
/// recorded on its context by other work.
pub(crate) fn bind(ctx: sys::CUcontext) -> Result<(), CudaError> {
    // SAFETY: `ctx` is a live context (a retained primary context, or one the driver returned
    // for a live stream).
    unsafe { sys::cuCtxSetCurrent(ctx) }
        .result()
        .map_err(driver_error("cuCtxSetCurrent"))
}

/// The raw handle of a stream identity, for the driver: `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`, or the handle itself.
pub(crate) fn raw_stream(stream: StreamId) -> sys::CUstream {
    match stream {
        StreamId::LegacyDefault => 0x1 as sys::CUstream,
        StreamId::PerThreadDefault => 0x2 as sys::CUstream,
        StreamId::Handle(h) => h.get() as sys::CUstream,
    }
}

/// The identity of a cudarc stream within one exchange (NULL is the legacy default stream).
pub(crate) fn stream_id(stream: &CudaStream) -> StreamId {
    match stream.cu_stream() as usize {
        0 | 1 => StreamId::LegacyDefault,
        2 => StreamId::PerThreadDefault,
        h => StreamId::Handle(
            core::num::NonZeroU64::new(h as u64).unwrap_or(core::num::NonZeroU64::MIN),
        ),
    }
}

/// The primary context of CUDA device `ordinal`, retained once per process.
///
/// # Errors
///
/// [`CudaError::NoDriver`]; [`CudaError::NoSuchDevice`] for an ordinal the driver does not
/// have; [`CudaError::Driver`] for another failure.
pub(crate) fn context(ordinal: i32) -> Result<Arc<CudaContext>, CudaError> {
    init()?;
    static CONTEXTS: OnceLock<Mutex<HashMap<i32, Arc<CudaContext>>>> = OnceLock::new();
    let contexts = CONTEXTS.get_or_init(Default::default);
    if let Some(ctx) = contexts.lock().ok().and_then(|c| c.get(&ordinal).cloned()) {
        return Ok(ctx);
    }
    let no_such_device = || -> CudaError {
        match CudaContext::device_count() {
            Ok(count) => CudaError::NoSuchDevice {
                device: ordinal,
                count,
            },
            Err(e) => driver_error("cuDeviceGetCount")(e),
        }
    };
    let index = usize::try_from(ordinal).map_err(|_| no_such_device())?;
    // Creating (and dropping a context that lost a race) binds it: leave the thread's as it was.
    let _current = CurrentContext::save();
    let ctx = CudaContext::new(index).map_err(|e| {
        if e.0 == sys::CUresult::CUDA_ERROR_INVALID_DEVICE {
            no_such_device()
        } else {
            driver_error("cuDevicePrimaryCtxRetain")(e)
        }
    })?;
    let kept = match contexts.lock() {
        Ok(mut c) => c.entry(ordinal).or_insert(ctx).clone(),
        Err(_) => ctx,
    };
    Ok(kept)
}

/// The device a context belongs to, as a `CUdevice` handle (`cuCtxGetDevice` with the context
/// pushed, then popped).
fn context_device(ctx: sys::CUcontext) -> Result<sys::CUdevice, CudaError> {
    // SAFETY: `ctx` is a live context (the driver returned it for a live stream); pushing it
    // and popping it right after leaves this thread's context stack as it was.
    unsafe {
        sys::cuCtxPushCurrent_v2(ctx)
            .result()
            .map_err(driver_error("cuCtxPushCurrent"))?;
        let mut device: sys::CUdevice = 0;
        let got = sys::cuCtxGetDevice(&mut device)
            .result()
            .map_err(driver_error("cuCtxGetDevice"));
        let mut popped: sys::CUcontext = core::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped)
            .result()
            .map_err(driver_error("cuCtxPopCurrent"))?;
        got.map(|()| device)
    }
}

/// The context a stream handle belongs to (`cuStreamGetCtx`).
pub(crate) fn stream_context(stream: sys::CUstream) -> Result<sys::CUcontext, CudaError> {
    let mut ctx: sys::CUcontext = core::ptr::null_mut();
    // SAFETY: `stream` is a live stream, valid for the call (caller); a valid out-pointer.
    unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
        .result()
        .map_err(driver_error("cuStreamGetCtx"))?;
    Ok(ctx)
}

/// This thread's stream-capture mode set to relaxed (`cuThreadExchangeStreamCaptureMode`) until
/// dropped, then restored. A call the driver counts as potentially unsafe during a capture
/// (`cuMemAlloc`), made for work outside every capture, then neither fails nor invalidates a
/// capture in global mode on another thread (PyTorch's caching allocator does the same around
/// `cudaMalloc`). Does nothing where the mode cannot be exchanged.
pub(crate) struct RelaxedCapture(Option<sys::CUstreamCaptureMode>);

impl RelaxedCapture {
    pub(crate) fn enter() -> Self {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; affects this thread only.
        let exchanged = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        Self((exchanged == sys::CUresult::CUDA_SUCCESS).then_some(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0 {
            // SAFETY: as above; puts back the mode `enter` found.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// Where a stream stands with CUDA graph capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Not being captured: its work runs as it is enqueued.
    Not,
    /// Being captured, in the capture sequence `id` (`cuStreamGetCaptureInfo`: unique per
    /// sequence in the process), valid or already invalidated.
    Active {
        /// The capture sequence.
        id: u64,
    },
    /// The legacy default stream while a blocking stream of its context is being captured:
    /// work on it would join that capture and invalidate it.
    Implicit,
}

/// Where `stream` (of the current context for the special handles; valid for the call) stands
/// with CUDA graph capture: `cuStreamIsCapturing`, which does not invalidate a capture, and the
/// capture's id (`cuStreamGetCaptureInfo_v3`) only for a stream being captured.
///
/// # Errors
///
/// [`CudaError::Driver`] from those calls.
pub(crate) fn capture_of(stream: sys::CUstream) -> Result<Capture, CudaError> {
    use sys::CUstreamCaptureStatus as Status;
    let mut status = Status::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is valid for the call (caller); a valid out-pointer.
    match unsafe { sys::cuStreamIsCapturing(stream, &mut status) } {
        sys::CUresult::CUDA_SUCCESS => {}
        // The driver documents this answer of `cuStreamIsCapturing` for the legacy default
        // stream while a blocking stream of its context is captured; the capture goes on.
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => return Ok(Capture::Implicit),
        code => {
            return Err(CudaError::Driver {
                call: "cuStreamIsCapturing",
                code,
            });
        }
    }
    if status == Status::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(Capture::Not);
    }
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: as above; the out-pointers not needed are NULL, which the driver allows.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            &mut id,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver_error("cuStreamGetCaptureInfo"))?;
    Ok(Capture::Active { id })
}

/// Refuses a stream that is being captured into a CUDA graph (or the legacy stream while a
/// blocking stream is), where this crate would enqueue work whose completion it then waits
/// for, or that must run once (`operation`, with what to do `instead`): captured work runs
/// only when the graph is launched.
pub(crate) fn check_not_capturing(
    stream: sys::CUstream,
    operation: &'static str,
    instead: &'static str,
) -> Result<(), CudaError> {
    match capture_of(stream)? {
        Capture::Not => Ok(()),
        Capture::Active { .. } => Err(CudaError::Capturing {
            stream: stream as u64,
            operation,
            instead,
        }),
        Capture::Implicit => Err(CudaError::LegacyStreamUnderCapture),
    }
}

/// The ordinal of a `CUdevice` handle.
fn ordinal_of(device: sys::CUdevice) -> i32 {
    let count = result::device::get_count().unwrap_or(0);
    (0..count)
        .find(|&i| result::device::get(i).is_ok_and(|d| d == device))
        .unwrap_or(-1)
}

/// Checks that the consumer's stream `stream` belongs to CUDA device `expected`
/// (`cuStreamGetCtx`). The special handles (legacy and per-thread default streams) pass: this
/// crate resolves them in the device's primary context, the one the CUDA runtime uses.
///
/// # Errors
///
/// [`CudaError::StreamOnOtherDevice`]; [`CudaError::Driver`] for a handle the driver does not
/// know.
pub fn check_consumer_stream(stream: StreamId, expected: i32) -> Result<(), CudaError> {
    consumer_context(stream, expected).map(|_| ())
}

/// As [`check_consumer_stream`], and whether the stream is in the device's primary context
/// (special handles are).
fn consumer_context(stream: StreamId, expected: i32) -> Result<bool, CudaError> {
    let StreamId::Handle(handle) = stream else {
        return Ok(true);
    };
    let ctx = context(expected)?;
    let _current = CurrentContext::save();
    // The consumer's stream is valid for the duration of the call (the `stream` parameter of the
    // array API's `__dlpack__`,
    // https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html).
    let found_ctx = stream_context(handle.get() as sys::CUstream)?;
    if found_ctx == ctx.cu_ctx() {
        return Ok(true);
    }
    // Another context: fine if it is on the same device (a non-primary context).
    let found = context_device(found_ctx)?;
    let wanted = result::device::get(expected).map_err(driver_error("cuDeviceGet"))?;
    if found == wanted {
        Ok(false)
    } else {
        Err(CudaError::StreamOnOtherDevice {
            role: "consumer",
            stream: handle.get(),
            found: ordinal_of(found),
            expected,
        })
    }
}

/// Checks that a consumer's stream is one this crate may enqueue its own work on: of the
/// tensor's device, in its primary context.
pub(crate) fn check_primary_stream(stream: StreamId, device: i32) -> Result<(), CudaError> {
    match (consumer_context(stream, device)?, stream) {
        (false, StreamId::Handle(h)) => Err(CudaError::NotPrimaryContext {
            role: "consumer",
            stream: h.get(),
            device,
        }),
        _ => Ok(()),
    }
}

/// Checks that a producer stream belongs to CUDA device `expected` (its context's ordinal), and
/// that a default stream (legacy or per-thread) is one of the primary context: the special
/// handles name the default stream of the current context, and this crate resolves them in
/// the primary one.
///
/// # Errors
///
/// [`CudaError::StreamOnOtherDevice`]; [`CudaError::NotPrimaryContext`] for a default stream of
/// another context.
pub fn check_producer_stream(stream: &CudaStream, expected: i32) -> Result<(), CudaError> {
    let found = stream.context().ordinal() as i32;
    if found != expected {
        return Err(CudaError::StreamOnOtherDevice {
            role: "producer",
            stream: stream.cu_stream() as u64,
            found,
            expected,
        });
    }
    if !matches!(stream_id(stream), StreamId::Handle(_)) && !stream.context().is_primary() {
        return Err(CudaError::NotPrimaryContext {
            role: "producer",
            stream: stream.cu_stream() as u64,
            device: expected,
        });
    }
    Ok(())
}

/// The device ordinal that owns `pointer` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
///
/// # Errors
///
/// [`CudaError::Driver`] for a pointer the driver does not know.
pub fn pointer_device(pointer: u64) -> Result<i32, CudaError> {
    init()?;
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is a valid out-pointer for an `int` attribute; the driver only reads
    // its own tables for `pointer`.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            pointer as sys::CUdeviceptr,
        )
    }
    .result()
    .map_err(driver_error("cuPointerGetAttribute"))?;
    Ok(ordinal)
}

/// The CUDA allocation a pointer lies in: its device and its byte range.
#[cfg_attr(not(any(feature = "python", test)), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PointerRange {
    /// The device ordinal (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
    pub device: i32,
    /// The allocation's first byte (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`).
    pub start: u64,
    /// The allocation's size in bytes (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`).
    pub len: u64,
}

/// The device and the allocation range of `pointer` (`cuPointerGetAttribute`): for memory
/// mapped with `cuMemMap`, the whole address range reserved with `cuMemAddressReserve`, not
/// the mapped chunk (the attributes' documentation; `cuMemGetAddressRange` gives the chunk).
///
/// # Errors
///
/// [`CudaError::Driver`] (`cuPointerGetAttribute`, `CUDA_ERROR_INVALID_VALUE`) for a pointer
/// the driver does not know.
#[cfg_attr(not(any(feature = "python", test)), allow(dead_code))]
pub(crate) fn pointer_range(pointer: u64) -> Result<PointerRange, CudaError> {
    let device = pointer_device(pointer)?;
    let mut start: sys::CUdeviceptr = 0;
    let mut len: usize = 0;
    // SAFETY: valid out-pointers of the attributes' types (`CUdeviceptr`, `size_t`); the driver
    // only reads its own tables for `pointer`.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut start as *mut sys::CUdeviceptr).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            pointer as sys::CUdeviceptr,
        )
        .result()
        .map_err(driver_error("cuPointerGetAttribute"))?;
        sys::cuPointerGetAttribute(
            (&mut len as *mut usize).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            pointer as sys::CUdeviceptr,
        )
        .result()
        .map_err(driver_error("cuPointerGetAttribute"))?;
    }
    Ok(PointerRange {
        device,
        start: start as u64,
        len: len as u64,
    })
}

/// Checks that a producer's raw stream handle is a stream the driver knows (`cuStreamGetCtx`)
/// of CUDA device `expected`; the default streams always pass.
///
/// # Errors
///
/// [`CudaError::Driver`] from `cuStreamGetCtx` for a handle the driver refuses (the driver does
/// not validate arbitrary handles: one that is not a live stream may crash a real driver, so the
/// handle is trusted, and the check is for a stream of another device);
/// [`CudaError::StreamOnOtherDevice`] for a stream of another device.
#[cfg_attr(not(any(feature = "python", test)), allow(dead_code))]
pub(crate) fn check_producer_raw_stream(stream: StreamId, expected: i32) -> Result<(), CudaError> {
    let StreamId::Handle(handle) = stream else {
        return Ok(());
    };
    init()?;
    // The producer's stream is valid while its object lives (the CUDA Array Interface's
    // "Lifetime management" section); the driver refuses a destroyed or unknown handle where it
    // can tell (the simulator always can, a real driver not for every value).
    let found = context_device(stream_context(handle.get() as sys::CUstream)?)?;
    let wanted = result::device::get(expected).map_err(driver_error("cuDeviceGet"))?;
    if found == wanted {
        Ok(())
    } else {
        Err(CudaError::StreamOnOtherDevice {
            role: "producer",
            stream: handle.get(),
            found: ordinal_of(found),
            expected,
        })
    }
}

/// Checks that `pointer` belongs to CUDA device `expected`.
///
/// # Errors
///
/// [`CudaError::WrongDevice`], or the errors of [`pointer_device`].
pub fn check_pointer(pointer: u64, expected: i32) -> Result<(), CudaError> {
    let found = pointer_device(pointer)?;
    if found == expected {
        Ok(())
    } else {
        Err(CudaError::WrongDevice {
            pointer,
            found,
            expected,
        })
    }
}
