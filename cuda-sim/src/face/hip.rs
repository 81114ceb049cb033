//! The HIP face: the `hip*` entry points of ROCm's `libamdhip64.so` that the simulator models,
//! over the same model as the `cu*` face (`ops`). Each translates HIP's handles, codes and
//! out-parameters and calls the model; none holds an operation of its own.
//!
//! Translation: HIP has no contexts. Each host thread has a current device (`hipSetDevice`,
//! 0 until set), and every call works in the primary context of that device
//! ([`Scope::Device`]): the null stream is that context's legacy default stream (with its
//! implicit synchronization with blocking streams), `hipStreamPerThread` (2) this thread's
//! per-thread default stream of it; 1, CUDA's `CU_STREAM_LEGACY`, is no HIP handle
//! (`hipErrorInvalidHandle`). HIP initializes itself at its first call; `hipInit` is accepted.
//! HIP's error codes are the CUDA driver API's numbers for every code the model returns; a code
//! without a HIP twin is `hipErrorUnknown`.
//!
//! The ROCm capture hazard (before ROCm 7.14, pytorch/pytorch#187110): a capture-unsafe call
//! while a stream captures (a host synchronization of a capturing stream or of its device,
//! `hipStreamQuery`/`hipEventQuery` of captured work, a synchronous copy or memset that would
//! use the null stream beside a capturing blocking stream) is refused by the model, which
//! invalidates the capture as the CUDA driver does. This face then reports it to the checker
//! ("capture-unsafe `call` on a capturing stream, not reported by HIP before 7.14"), at every
//! modelled version, and returns `hipSuccess` below 7.14 (`CUDA_SIM_HIP_VERSION`), the error
//! at 7.14 and above. The refused call does nothing else: no wait, no copy.

#![allow(non_camel_case_types)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};

use super::calls::{self, Counter};
use super::ffi::{maybe_out, out};
use crate::model::base::Handle;
use crate::model::config::config;
use crate::model::ops::{self, Mode, side_of};
use crate::model::request::{CopyRequest, Side, fill_1d, linear};
use crate::model::state::{Scope, exchange_capture_mode};

use CUresult::*;

/// `hipError_t`, a C enum.
pub type hipError_t = c_int;
/// `hipStream_t`, `hipEvent_t`, `hipGraph_t`, `hipGraphExec_t`, `hipGraphNode_t`: opaque
/// pointers.
pub type hipStream_t = *mut c_void;
pub type hipEvent_t = *mut c_void;
pub type hipGraph_t = *mut c_void;
pub type hipGraphExec_t = *mut c_void;
pub type hipGraphNode_t = *mut c_void;
/// `hipStreamCaptureStatus`, `hipStreamCaptureMode`, `hipMemcpyKind`: C enums.
pub type hipStreamCaptureStatus = c_int;
pub type hipStreamCaptureMode = c_int;
pub type hipMemcpyKind = c_int;
/// `hipHostFn_t`.
pub type hipHostFn_t = Option<unsafe extern "C" fn(*mut c_void)>;

/// `hipPointerAttribute_t`, ROCm 6 and later.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipPointerAttribute_t {
    /// `hipMemoryType`: Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11.
    pub type_: c_int,
    pub device: c_int,
    pub devicePointer: *mut c_void,
    pub hostPointer: *mut c_void,
    pub isManaged: c_int,
    pub allocationFlags: c_uint,
}

/// `hipMemoryType` values the model produces.
const MEMORY_UNREGISTERED: c_int = 0;
const MEMORY_HOST: c_int = 1;
const MEMORY_DEVICE: c_int = 2;

/// `hipErrorInvalidMemcpyDirection`: a code of HIP's alone.
const INVALID_MEMCPY_DIRECTION: hipError_t = 21;
/// `hipErrorUnknown`.
const UNKNOWN: hipError_t = 999;

/// The model's codes and their HIP names (the numbers are the same).
const CODES: [(CUresult, &str); 30] = [
    (CUDA_SUCCESS, "hipSuccess"),
    (CUDA_ERROR_INVALID_VALUE, "hipErrorInvalidValue"),
    (CUDA_ERROR_OUT_OF_MEMORY, "hipErrorOutOfMemory"),
    (CUDA_ERROR_NOT_INITIALIZED, "hipErrorNotInitialized"),
    (CUDA_ERROR_NO_DEVICE, "hipErrorNoDevice"),
    (CUDA_ERROR_INVALID_DEVICE, "hipErrorInvalidDevice"),
    (CUDA_ERROR_INVALID_IMAGE, "hipErrorInvalidImage"),
    (CUDA_ERROR_INVALID_CONTEXT, "hipErrorInvalidContext"),
    (
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        "hipErrorPeerAccessUnsupported",
    ),
    (CUDA_ERROR_INVALID_PTX, "hipErrorInvalidKernelFile"),
    (CUDA_ERROR_FILE_NOT_FOUND, "hipErrorFileNotFound"),
    (CUDA_ERROR_INVALID_HANDLE, "hipErrorInvalidHandle"),
    (CUDA_ERROR_ILLEGAL_STATE, "hipErrorIllegalState"),
    (CUDA_ERROR_NOT_FOUND, "hipErrorNotFound"),
    (CUDA_ERROR_NOT_READY, "hipErrorNotReady"),
    (CUDA_ERROR_ILLEGAL_ADDRESS, "hipErrorIllegalAddress"),
    (
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        "hipErrorLaunchOutOfResources",
    ),
    (
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        "hipErrorPeerAccessAlreadyEnabled",
    ),
    (
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        "hipErrorPeerAccessNotEnabled",
    ),
    (CUDA_ERROR_NOT_SUPPORTED, "hipErrorNotSupported"),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        "hipErrorStreamCaptureUnsupported",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        "hipErrorStreamCaptureInvalidated",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_MERGE,
        "hipErrorStreamCaptureMerge",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        "hipErrorStreamCaptureUnmatched",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        "hipErrorStreamCaptureUnjoined",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        "hipErrorStreamCaptureIsolation",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        "hipErrorStreamCaptureImplicit",
    ),
    (CUDA_ERROR_CAPTURED_EVENT, "hipErrorCapturedEvent"),
    (
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        "hipErrorStreamCaptureWrongThread",
    ),
    (CUDA_ERROR_UNKNOWN, "hipErrorUnknown"),
];

/// A HIP error: a code of the model, or one of HIP's own.
pub(crate) struct HipError(hipError_t);

impl From<CUresult> for HipError {
    fn from(e: CUresult) -> Self {
        Self(code(e))
    }
}

/// HIP's code for a code of the model.
fn code(e: CUresult) -> hipError_t {
    if CODES.iter().any(|&(c, _)| c == e) {
        e as hipError_t
    } else {
        UNKNOWN
    }
}

type HipRes<T = ()> = Result<T, HipError>;

/// HIP's version, `HIP_VERSION` encoded (major * 10_000_000 + minor * 100_000 + patch).
fn version() -> i32 {
    config().hip_version as i32
}

/// ROCm 7.14: from it on, capture-unsafe calls return their error.
const CAPTURE_ERRORS_FROM: i32 = 71_400_000;

thread_local! {
    /// The thread's current device (`hipSetDevice`).
    static DEVICE: Cell<i32> = const { Cell::new(0) };
}

/// The calling thread's scope: its current device's primary context.
fn scope() -> Scope {
    Scope::Device(DEVICE.with(Cell::get))
}

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

fn ptr<T>(h: Handle) -> *mut T {
    h as *mut T
}

/// A stream handle as the model knows it: 1 (CUDA's legacy stream handle) is none of HIP's.
fn stream(s: hipStream_t) -> HipRes<Handle> {
    match h(s) {
        1 => Err(CUDA_ERROR_INVALID_HANDLE.into()),
        other => Ok(other),
    }
}

/// The ROCm capture hazard for capture-unsafe call `call`: a refusal because of a stream
/// capture is reported to the checker, and, before ROCm 7.14, not returned.
fn capture_unsafe(call: &str, r: Result<(), CUresult>) -> HipRes {
    match r {
        Err(
            e @ (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | CUDA_ERROR_CAPTURED_EVENT),
        ) => {
            ops::report_misuse(format!(
                "capture-unsafe {call} on a capturing stream, not reported by HIP before 7.14"
            ));
            if version() < CAPTURE_ERRORS_FROM {
                Ok(())
            } else {
                Err(e.into())
            }
        }
        other => Ok(other?),
    }
}

/// Runs a HIP call: its code, and never a panic across the C boundary.
fn run(name: &str, f: impl FnOnce() -> HipRes) -> hipError_t {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(HipError(code))) => code,
        Err(_) => {
            eprintln!("cuda-sim: {name} panicked; returning hipErrorUnknown");
            UNKNOWN
        }
    }
}

/// Defines exported HIP functions. Each body returns `HipRes`; each call is counted (by entry
/// point, with the driver's), refused in a forked child of a process that initialized the
/// simulator, and initializes it (HIP needs no `hipInit`) before its body runs.
macro_rules! hip {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        ///
        /// The arguments follow HIP's contract for this function (`hip_runtime_api.h`).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> hipError_t {
            static CALLS: Counter = Counter::new(stringify!($name));
            run(stringify!($name), move || -> HipRes {
                calls::enter(&CALLS)?;
                ops::initialize();
                calls::initialized();
                $body
            })
        }
    )*};
}

// ---------------------------------------------------------------------------------------------
// Initialization, versions, devices

hip! {
    /// Flags must be 0.
    fn hipInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        Ok(())
    }

    /// The modelled HIP version (`CUDA_SIM_HIP_VERSION`, default 7.0.0: 70000000).
    fn hipDriverGetVersion(v: *mut c_int) {
        // SAFETY: an out-pointer.
        Ok(unsafe { out(v, version()) }?)
    }

    /// As `hipDriverGetVersion`.
    fn hipRuntimeGetVersion(v: *mut c_int) {
        // SAFETY: an out-pointer.
        Ok(unsafe { out(v, version()) }?)
    }

    fn hipGetDeviceCount(count: *mut c_int) {
        let n = ops::device_count()?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(count, n) }?)
    }

    fn hipGetDevice(device: *mut c_int) {
        // SAFETY: an out-pointer.
        Ok(unsafe { out(device, DEVICE.with(Cell::get)) }?)
    }

    /// Makes `device` the calling thread's current device (`hipErrorInvalidDevice` out of
    /// range).
    fn hipSetDevice(device: c_int) {
        ops::check_device(device)?;
        DEVICE.with(|d| d.set(device));
        Ok(())
    }

    /// Waits for every stream of the current device. Capture-unsafe (the ROCm hazard).
    fn hipDeviceSynchronize() {
        capture_unsafe("hipDeviceSynchronize", ops::synchronize(scope()))
    }

    fn hipDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) {
        let answer = ops::can_access_peer(device, peer)?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(can, c_int::from(answer)) }?)
    }

    /// Enables access from the current device to `peer`'s memory (one way):
    /// `hipErrorInvalidDevice` for an ordinal out of range or the current device itself,
    /// `hipErrorPeerAccessUnsupported`, `hipErrorPeerAccessAlreadyEnabled` the second time.
    fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) {
        let (from, to) = peer_contexts(peer)?;
        Ok(ops::enable_peer_access(from, to, flags)?)
    }

    /// `hipErrorPeerAccessNotEnabled` if not enabled.
    fn hipDeviceDisablePeerAccess(peer: c_int) {
        let (from, to) = peer_contexts(peer)?;
        Ok(ops::disable_peer_access(from, to)?)
    }
}

/// The primary contexts of the current device and of device `peer`, a distinct device.
fn peer_contexts(peer: c_int) -> HipRes<(Handle, Handle)> {
    let me = DEVICE.with(Cell::get);
    ops::check_device(peer)?;
    if peer == me {
        return Err(CUDA_ERROR_INVALID_DEVICE.into());
    }
    Ok((ops::primary_context(me)?, ops::primary_context(peer)?))
}

// ---------------------------------------------------------------------------------------------
// Streams, capture and graphs

/// `hipStreamNonBlocking`.
const NON_BLOCKING: c_uint = 0x1;

fn create_stream(s: *mut hipStream_t, flags: c_uint) -> HipRes {
    if s.is_null() || flags & !NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE.into());
    }
    let handle = ops::create_stream(scope(), flags & NON_BLOCKING, 0)?;
    // SAFETY: an out-pointer, not NULL.
    Ok(unsafe { out(s, ptr(handle)) }?)
}

/// `hipStreamCaptureMode` as the model knows it.
fn capture_mode(mode: hipStreamCaptureMode) -> HipRes<CUstreamCaptureMode> {
    use CUstreamCaptureMode::*;
    match mode {
        0 => Ok(CU_STREAM_CAPTURE_MODE_GLOBAL),
        1 => Ok(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        2 => Ok(CU_STREAM_CAPTURE_MODE_RELAXED),
        _ => Err(CUDA_ERROR_INVALID_VALUE.into()),
    }
}

hip! {
    /// A blocking stream of the current device.
    fn hipStreamCreate(s: *mut hipStream_t) {
        create_stream(s, 0)
    }

    /// Flags `hipStreamDefault` (0, blocking) or `hipStreamNonBlocking` (1).
    fn hipStreamCreateWithFlags(s: *mut hipStream_t, flags: c_uint) {
        create_stream(s, flags)
    }

    fn hipStreamDestroy(s: hipStream_t) {
        Ok(ops::destroy_stream(scope(), stream(s)?)?)
    }

    /// Capture-unsafe on a capturing stream, or on the null stream beside a capturing blocking
    /// stream (the ROCm hazard).
    fn hipStreamSynchronize(s: hipStream_t) {
        let s = stream(s)?;
        capture_unsafe("hipStreamSynchronize", ops::stream_synchronize(scope(), s))
    }

    /// `hipErrorNotReady` while work is pending; capture-unsafe as `hipStreamSynchronize`.
    fn hipStreamQuery(s: hipStream_t) {
        let s = stream(s)?;
        match ops::stream_query(scope(), s) {
            Err(CUDA_ERROR_NOT_READY) => Err(CUDA_ERROR_NOT_READY.into()),
            other => capture_unsafe("hipStreamQuery", other),
        }
    }

    fn hipStreamGetFlags(s: hipStream_t, flags: *mut c_uint) {
        let f = ops::stream_flags(scope(), stream(s)?)?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(flags, f) }?)
    }

    fn hipStreamGetDevice(s: hipStream_t, device: *mut c_int) {
        let d = ops::stream_device(scope(), stream(s)?)?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(device, d) }?)
    }

    /// Flags 0 or `hipEventWaitExternal` (1), alike: inside a capture, a wait on an event
    /// recorded outside it is an event-wait node of the graph.
    fn hipStreamWaitEvent(s: hipStream_t, e: hipEvent_t, flags: c_uint) {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        Ok(ops::stream_wait_event(scope(), stream(s)?, h(e), true)?)
    }

    fn hipLaunchHostFunc(s: hipStream_t, f: hipHostFn_t, data: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        Ok(ops::launch_host_func(scope(), stream(s)?, f, data as usize)?)
    }

    /// `hipStreamCaptureStatusNone` 0, `Active` 1, `Invalidated` 2.
    fn hipStreamIsCapturing(s: hipStream_t, status: *mut hipStreamCaptureStatus) {
        let st = ops::capture_status(scope(), stream(s)?)?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(status, st as hipStreamCaptureStatus) }?)
    }

    /// The status and the capture's id (0 with none; `id` may be NULL).
    fn hipStreamGetCaptureInfo(s: hipStream_t, status: *mut hipStreamCaptureStatus, id: *mut u64) {
        let (st, capture, _graph) = ops::capture_info(scope(), stream(s)?)?;
        // SAFETY: out-pointers; `id` may be NULL.
        unsafe {
            out(status, st as hipStreamCaptureStatus)?;
            maybe_out(id, capture);
        }
        Ok(())
    }

    /// Modes `hipStreamCaptureModeGlobal` 0, `ThreadLocal` 1, `Relaxed` 2.
    fn hipStreamBeginCapture(s: hipStream_t, mode: hipStreamCaptureMode) {
        let mode = capture_mode(mode)?;
        Ok(ops::begin_capture(scope(), stream(s)?, mode)?)
    }

    /// The graph, or NULL with `hipErrorStreamCaptureInvalidated` (or `Unjoined`).
    fn hipStreamEndCapture(s: hipStream_t, graph: *mut hipGraph_t) {
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        match ops::end_capture(scope(), stream(s)?) {
            // SAFETY: an out-pointer, not NULL.
            Ok(g) => Ok(unsafe { out(graph, ptr(g)) }?),
            Err(e) => {
                if ops::ends_with_null_graph(e) {
                    // SAFETY: an out-pointer, not NULL.
                    unsafe { out(graph, std::ptr::null_mut())? };
                }
                Err(e.into())
            }
        }
    }

    fn hipThreadExchangeStreamCaptureMode(mode: *mut hipStreamCaptureMode) {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        // SAFETY: not NULL; an in/out pointer (contract).
        let new = capture_mode(unsafe { *mode })?;
        let old = exchange_capture_mode(new);
        // SAFETY: as above.
        unsafe { *mode = old as hipStreamCaptureMode };
        Ok(())
    }

    /// An executable graph (`err_node` is set to NULL, `log` left as it is).
    fn hipGraphInstantiate(
        exec: *mut hipGraphExec_t,
        graph: hipGraph_t,
        err_node: *mut hipGraphNode_t,
        _log: *mut c_char,
        _log_size: usize,
    ) {
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        // SAFETY: NULL or an out-pointer.
        unsafe { maybe_out(err_node, std::ptr::null_mut()) };
        let e = ops::instantiate(h(graph), 0)?;
        // SAFETY: an out-pointer, not NULL.
        Ok(unsafe { out(exec, ptr(e)) }?)
    }

    fn hipGraphLaunch(exec: hipGraphExec_t, s: hipStream_t) {
        Ok(ops::launch_graph(scope(), h(exec), stream(s)?)?)
    }

    fn hipGraphExecDestroy(exec: hipGraphExec_t) {
        Ok(ops::destroy_exec(h(exec))?)
    }

    fn hipGraphDestroy(graph: hipGraph_t) {
        Ok(ops::destroy_graph(h(graph))?)
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// `hipEventDefault`, `BlockingSync`, `DisableTiming`, `Interprocess`, and the fence and release
/// flags (which have nothing to act on here).
const EVENT_FLAGS: c_uint = 0xF | 0x2000_0000 | 0x4000_0000 | 0x8000_0000;

fn create_event(e: *mut hipEvent_t, flags: c_uint) -> HipRes {
    if e.is_null() || flags & !EVENT_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE.into());
    }
    let handle = ops::create_event(scope(), flags & 0xF)?;
    // SAFETY: an out-pointer, not NULL.
    Ok(unsafe { out(e, ptr(handle)) }?)
}

hip! {
    fn hipEventCreate(e: *mut hipEvent_t) {
        create_event(e, 0)
    }

    /// `hipEventDisableTiming` (2) makes `hipEventElapsedTime` refuse it.
    fn hipEventCreateWithFlags(e: *mut hipEvent_t, flags: c_uint) {
        create_event(e, flags)
    }

    /// On a stream of the event's device.
    fn hipEventRecord(e: hipEvent_t, s: hipStream_t) {
        Ok(ops::record_event(scope(), h(e), stream(s)?, false)?)
    }

    /// `hipErrorNotReady` while pending; capture-unsafe for an event recorded in a capture
    /// (the ROCm hazard).
    fn hipEventQuery(e: hipEvent_t) {
        match ops::query_event(h(e)) {
            Err(CUDA_ERROR_NOT_READY) => Err(CUDA_ERROR_NOT_READY.into()),
            other => capture_unsafe("hipEventQuery", other),
        }
    }

    /// Capture-unsafe as `hipEventQuery`.
    fn hipEventSynchronize(e: hipEvent_t) {
        capture_unsafe("hipEventSynchronize", ops::synchronize_event(h(e)))
    }

    fn hipEventDestroy(e: hipEvent_t) {
        Ok(ops::destroy_event(h(e))?)
    }

    fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, end: hipEvent_t) {
        let t = ops::elapsed_time(h(start), h(end))?;
        // SAFETY: an out-pointer.
        Ok(unsafe { out(ms, t) }?)
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

hip! {
    /// Device memory of the current device; 0 bytes give NULL and `hipSuccess`.
    fn hipMalloc(p: *mut *mut c_void, bytes: usize) {
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        let addr = if bytes == 0 { 0 } else { ops::alloc(scope(), bytes)? };
        // SAFETY: an out-pointer, not NULL.
        Ok(unsafe { out(p, addr as *mut c_void) }?)
    }

    /// A host-side free (NULL: nothing) after the current device's work: `hipFree` "performs an
    /// implicit hipDeviceSynchronize()" (`hip_runtime_api.h`), so accesses enqueued on the
    /// device's streams before the call are ordered before the free; memory of another device
    /// than the current one is not waited for. See `cuMemFree` for the checker's view.
    fn hipFree(p: *mut c_void) {
        if p.is_null() {
            return Ok(());
        }
        Ok(ops::free_after_synchronize(scope(), p as u64, false, "hipFree")?)
    }

    /// Stream-ordered allocation (not modelled in a capture: `hipErrorNotSupported`).
    fn hipMallocAsync(p: *mut *mut c_void, bytes: usize, s: hipStream_t) {
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        let addr = ops::alloc_async(scope(), bytes, stream(s)?, "hipMallocAsync")?;
        // SAFETY: an out-pointer, not NULL.
        Ok(unsafe { out(p, addr as *mut c_void) }?)
    }

    fn hipFreeAsync(p: *mut c_void, s: hipStream_t) {
        Ok(ops::free_async(scope(), p as u64, stream(s)?, "hipFreeAsync")?)
    }

    /// Pinned host memory (flags have nothing to act on).
    fn hipHostMalloc(p: *mut *mut c_void, bytes: usize, _flags: c_uint) {
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        let addr = ops::alloc_host(scope(), bytes)?;
        // SAFETY: an out-pointer, not NULL.
        Ok(unsafe { out(p, addr as *mut c_void) }?)
    }

    /// Frees pinned host memory after the current device's work, as `hipFree` does
    /// (`hip_runtime_api.h`: "an implicit hipDeviceSynchronize()").
    fn hipHostFree(p: *mut c_void) {
        if p.is_null() {
            return Ok(());
        }
        Ok(ops::free_after_synchronize(scope(), p as u64, true, "hipHostFree")?)
    }

    /// Device memory: type Device; pinned host memory: type Host (both pointers the same);
    /// memory the model does not know: type Unregistered and `hipSuccess`, as ROCm 6 and
    /// later answer for pageable host memory.
    fn hipPointerGetAttributes(attr: *mut hipPointerAttribute_t, p: *const c_void) {
        if attr.is_null() || p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE.into());
        }
        let info = ops::pointer_info(p as u64)?;
        let mut a = hipPointerAttribute_t {
            type_: MEMORY_UNREGISTERED,
            device: 0,
            devicePointer: std::ptr::null_mut(),
            hostPointer: std::ptr::null_mut(),
            isManaged: 0,
            allocationFlags: 0,
        };
        if let Some(i) = info {
            a.device = i.device;
            a.devicePointer = p.cast_mut();
            if i.memory_type == cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_HOST {
                a.type_ = MEMORY_HOST;
                a.hostPointer = p.cast_mut();
            } else {
                a.type_ = MEMORY_DEVICE;
            }
        }
        // SAFETY: an out-pointer, not NULL.
        Ok(unsafe { out(attr, a) }?)
    }
}

// ---------------------------------------------------------------------------------------------
// Copies and memsets

/// The sides of a copy of `kind`: `hipMemcpyHostToHost` 0, `HostToDevice` 1, `DeviceToHost`
/// 2, `DeviceToDevice` 3, `Default` 4 (from the pointers).
fn sides(kind: hipMemcpyKind, dst: usize, src: usize) -> HipRes<(Side, Side)> {
    let (d, hst) = (|p: usize| Side::Device(p as u64), Side::Host);
    Ok(match kind {
        0 => (hst(src), hst(dst)),
        1 => (hst(src), d(dst)),
        2 => (d(src), hst(dst)),
        3 => (d(src), d(dst)),
        4 => (side_of(src as u64), side_of(dst as u64)),
        _ => return Err(HipError(INVALID_MEMCPY_DIRECTION)),
    })
}

hip! {
    /// A synchronous copy on the null stream: capture-unsafe beside a capturing blocking stream
    /// (the ROCm hazard).
    fn hipMemcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: hipMemcpyKind) {
        let (s, d) = sides(kind, dst as usize, src as usize)?;
        let r = ops::copy(scope(), "hipMemcpy", linear(s, d, bytes), 0, Mode::Sync);
        capture_unsafe("hipMemcpy", r)
    }

    fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: hipMemcpyKind,
        st: hipStream_t,
    ) {
        let (s, d) = sides(kind, dst as usize, src as usize)?;
        let r = linear(s, d, bytes);
        Ok(ops::copy(scope(), "hipMemcpyAsync", r, stream(st)?, Mode::Async)?)
    }

    /// `height` rows of `width` bytes.
    fn hipMemcpy2DAsync(
        dst: *mut c_void,
        dpitch: usize,
        src: *const c_void,
        spitch: usize,
        width: usize,
        height: usize,
        kind: hipMemcpyKind,
        st: hipStream_t,
    ) {
        let (s, d) = sides(kind, dst as usize, src as usize)?;
        let r = CopyRequest {
            src: s,
            src_pitch: spitch,
            dst: d,
            dst_pitch: dpitch,
            width,
            height,
        };
        Ok(ops::copy(scope(), "hipMemcpy2DAsync", r, stream(st)?, Mode::Async)?)
    }

    /// A copy between the memory of two devices, in the order of `st`; needs no peer access.
    /// A pointer that is memory of another device than named is reported as a misuse.
    fn hipMemcpyPeerAsync(
        dst: *mut c_void,
        dst_device: c_int,
        src: *const c_void,
        src_device: c_int,
        bytes: usize,
        st: hipStream_t,
    ) {
        ops::check_device(dst_device)?;
        ops::check_device(src_device)?;
        let (d, s) = (dst as u64, src as u64);
        ops::check_peer_copy("hipMemcpyPeerAsync", d, dst_device, s, src_device, bytes)?;
        let r = linear(Side::Device(s), Side::Device(d), bytes);
        Ok(ops::copy(scope(), "hipMemcpyPeerAsync", r, stream(st)?, Mode::Async)?)
    }

    /// A synchronous memset on the null stream: capture-unsafe as `hipMemcpy`.
    fn hipMemset(dst: *mut c_void, value: c_int, bytes: usize) {
        let f = fill_1d(u32::from(value as u8), 1, bytes);
        let r = ops::memset(scope(), "hipMemset", dst as u64, f, 0, Mode::Sync);
        capture_unsafe("hipMemset", r)
    }

    fn hipMemsetAsync(dst: *mut c_void, value: c_int, bytes: usize, st: hipStream_t) {
        let f = fill_1d(u32::from(value as u8), 1, bytes);
        Ok(ops::memset(scope(), "hipMemsetAsync", dst as u64, f, stream(st)?, Mode::Async)?)
    }
}

// ---------------------------------------------------------------------------------------------
// Error names and strings

/// The model's code for a HIP code (`None`: no such code).
fn model_code(e: hipError_t) -> Option<CUresult> {
    CODES
        .iter()
        .map(|&(c, _)| c)
        .find(|&c| c as hipError_t == e)
}

/// Counts a call of an entry point that returns no `hipError_t`.
fn count(counter: &'static Counter) {
    let _ = calls::enter(counter);
}

/// The code's name, as `hip_runtime_api.h` spells it (`hipErrorUnknown` for a code it does
/// not know of here).
///
/// # Safety
///
/// None: any value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetErrorName(e: hipError_t) -> *const c_char {
    static CALLS: Counter = Counter::new("hipGetErrorName");
    count(&CALLS);
    let name = match (e, model_code(e)) {
        (INVALID_MEMCPY_DIRECTION, _) => "hipErrorInvalidMemcpyDirection",
        (_, Some(c)) => CODES.iter().find(|&&(k, _)| k == c).map_or("", |&(_, n)| n),
        (_, None) => "hipErrorUnknown",
    };
    ops::c_string((1, e as u32, false), || name.to_string())
}

/// What the code means, in the driver's words.
///
/// # Safety
///
/// None: any value is accepted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hipGetErrorString(e: hipError_t) -> *const c_char {
    static CALLS: Counter = Counter::new("hipGetErrorString");
    count(&CALLS);
    let text = match (e, model_code(e)) {
        (INVALID_MEMCPY_DIRECTION, _) => "invalid copy direction for memcpy".to_string(),
        (_, Some(c)) => ops::description(c),
        (_, None) => "unknown error".to_string(),
    };
    ops::c_string((1, e as u32, true), || text)
}
