//! The driver entry points the simulator models, by area of the CUDA driver API: each
//! translates its handles and out-parameters and calls the model's operations (`ops`) in the
//! scope of the calling thread's current context.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use cudarc::driver::sys::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_MEMCPY2D, CUcontext, CUctxCreateParams, CUdevice,
    CUdevice_attribute, CUdeviceptr, CUevent, CUgraph, CUgraphEdgeData, CUgraphExec,
    CUgraphInstantiateResult, CUgraphNode, CUhostFn, CUmemorytype, CUpointer_attribute, CUresult,
    CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUuuid, cuuint64_t,
};

use super::driver::driver;
use crate::face::calls;
use crate::face::ffi::{maybe_out, out};
use crate::model::base::{Handle, Res, unsupported};
use crate::model::ops::{self, Mode, side_of};
use crate::model::request::{CopyRequest, Fill, Side, fill_1d, fill_2d, linear};
use crate::model::state::{Scope, exchange_capture_mode};

use CUresult::*;

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

fn ptr<T>(h: Handle) -> *mut T {
    h as *mut T
}

// ---------------------------------------------------------------------------------------------
// Initialization, version, devices

fn attribute(attrib: CUdevice_attribute) -> c_int {
    use CUdevice_attribute::*;
    match attrib {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => 132,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
        | CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        _ => 0,
    }
}

driver! {
    /// Initializes the simulator (flags must be 0).
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        ops::initialize();
        calls::initialized();
        Ok(())
    }

    /// Reports CUDA 13.0.
    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: an out-pointer (driver API contract).
        unsafe { out(version, 13000) }
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        let n = ops::device_count()?;
        // SAFETY: an out-pointer.
        unsafe { out(count, n) }
    }

    /// Device handles are the ordinals.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        ops::check_device(ordinal)?;
        // SAFETY: an out-pointer.
        unsafe { out(device, ordinal) }
    }

    fn cuDeviceGetAttribute(value: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) {
        ops::check_device(dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(value, attribute(attrib)) }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        ops::check_device(dev)?;
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let text = format!("cuda-sim device {dev}");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` has room for `len` bytes (contract); `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        Ok(())
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let total = ops::total_memory(dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(bytes, total) }
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        ops::check_device(dev)?;
        let mut bytes = [0 as c_char; 16];
        for (i, b) in b"cuda-sim".iter().enumerate() {
            bytes[i] = *b as c_char;
        }
        bytes[15] = dev as c_char;
        // SAFETY: an out-pointer.
        unsafe { out(uuid, CUuuid { bytes }) }
    }
}

// ---------------------------------------------------------------------------------------------
// Contexts

driver! {
    /// The primary context of `dev` (one per device, the same handle every time).
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        let ctx = ops::retain_primary(dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Drops one retain; the context's state is kept when the count reaches zero.
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        ops::release_primary(dev)
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let retained = ops::primary_active(dev)?;
        // SAFETY: out-pointers.
        unsafe {
            out(flags, 0)?;
            out(active, c_int::from(retained))
        }
    }

    /// A context that is not the primary one; it becomes current.
    fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        _params: *mut CUctxCreateParams,
        _flags: c_uint,
        dev: CUdevice,
    ) {
        ops::check_device(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = ops::create_context(dev)?;
        // SAFETY: checked not NULL; an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Destroys a created context; its streams' pending work still completes.
    fn cuCtxDestroy_v2(ctx: CUcontext) {
        ops::destroy_context(h(ctx))
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        let current = ops::current_context()?.unwrap_or(0);
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(current)) }
    }

    /// Replaces the top of the thread's context stack (NULL unbinds).
    fn cuCtxSetCurrent(ctx: CUcontext) {
        ops::set_current_context((!ctx.is_null()).then(|| h(ctx)))
    }

    fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        ops::push_context(h(ctx))
    }

    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        let popped = ops::pop_context()?;
        // SAFETY: NULL or an out-pointer.
        unsafe { maybe_out(pctx, ptr(popped)) };
        Ok(())
    }

    fn cuCtxGetDevice(device: *mut CUdevice) {
        let dev = ops::current_device()?;
        // SAFETY: an out-pointer.
        unsafe { out(device, dev) }
    }

    fn cuCtxGetId(ctx: CUcontext, id: *mut c_ulonglong) {
        let id_value = ops::context_id((!ctx.is_null()).then(|| h(ctx)))?;
        // SAFETY: an out-pointer.
        unsafe { out(id, id_value) }
    }

    /// Waits for every stream of the current context.
    fn cuCtxSynchronize() {
        ops::synchronize(Scope::Current)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        ops::live_current_context()?;
        // SAFETY: NULL or out-pointers.
        unsafe {
            maybe_out(least, 0);
            maybe_out(greatest, -5);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Streams

driver! {
    /// A stream of the current context; flags `CU_STREAM_DEFAULT` (blocking: synchronizes with
    /// the legacy default stream) or `CU_STREAM_NON_BLOCKING`.
    fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) {
        create_stream(ph, flags, 0)
    }

    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: c_uint, priority: c_int) {
        create_stream(ph, flags, priority)
    }

    /// Returns at once; work already enqueued still runs.
    fn cuStreamDestroy_v2(stream: CUstream) {
        ops::destroy_stream(Scope::Current, h(stream))
    }

    fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) {
        let f = ops::stream_flags(Scope::Current, h(stream))?;
        // SAFETY: an out-pointer.
        unsafe { out(flags, f) }
    }

    fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) {
        let ctx = ops::stream_context(Scope::Current, h(stream))?;
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Blocks until the stream's work so far is done (the legacy default stream's includes the
    /// blocking streams' earlier work). A capturing stream is
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated.
    fn cuStreamSynchronize(stream: CUstream) {
        ops::stream_synchronize(Scope::Current, h(stream))
    }

    /// `CUDA_ERROR_NOT_READY` while work is pending. A capturing stream is
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated; the legacy
    /// default stream beside a capturing blocking stream is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`
    /// and invalidates that capture.
    fn cuStreamQuery(stream: CUstream) {
        ops::stream_query(Scope::Current, h(stream))
    }

    /// Work enqueued on `stream` afterwards waits for the event's position at its last record;
    /// a never-recorded event adds no wait. Flags: 0 or `CU_EVENT_WAIT_EXTERNAL` (0x1, which
    /// has an effect only on a capturing stream).
    ///
    /// Stream capture: on a capturing stream, an event recorded in the same capture adds a
    /// dependency inside the capture; otherwise, with `CU_EVENT_WAIT_EXTERNAL`, the wait becomes
    /// an event-wait node of the graph; without it, an event recorded outside the capture is
    /// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, one recorded in another capture under way
    /// `CUDA_ERROR_STREAM_CAPTURE_MERGE` (both invalidate). A stream that is not capturing and
    /// waits on an event recorded in a capture under way joins that capture; one recorded in a
    /// capture that has ended is `CUDA_ERROR_CAPTURED_EVENT`.
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) {
        if flags & !WAIT_EXTERNAL != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        ops::stream_wait_event(Scope::Current, h(stream), h(event), flags & WAIT_EXTERNAL != 0)
    }

    /// Runs `f(user_data)` on the stream's thread, in stream order; on a capturing stream, a
    /// host node of the graph, called at each launch.
    fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, user_data: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        ops::launch_host_func(Scope::Current, h(stream), f, user_data as usize)
    }

    /// The legacy default stream while a blocking stream of its context is capturing is
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the capture is not invalidated).
    fn cuStreamIsCapturing(stream: CUstream, status: *mut CUstreamCaptureStatus) {
        let s = ops::capture_status(Scope::Current, h(stream))?;
        // SAFETY: an out-pointer.
        unsafe { out(status, s) }
    }

    /// Status, id and graph of the stream's capture; every out-pointer may be NULL. The id is
    /// unique per capture sequence and never 0; with no capture under way the id is 0 and the
    /// graph NULL. The dependencies are not modelled: always 0, with NULL arrays. The legacy
    /// default stream while a blocking stream of its context is capturing is
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
    fn cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status_out: *mut CUstreamCaptureStatus,
        id_out: *mut cuuint64_t,
        graph_out: *mut CUgraph,
        dependencies_out: *mut *const CUgraphNode,
        edge_data_out: *mut *const CUgraphEdgeData,
        count_out: *mut usize,
    ) {
        let (status, id, graph) = ops::capture_info(Scope::Current, h(stream))?;
        // SAFETY: each is NULL or an out-pointer of its type (contract); NULL ones are skipped.
        unsafe {
            maybe_out(status_out, status);
            maybe_out(id_out, id);
            maybe_out(graph_out, ptr(graph));
            maybe_out(dependencies_out, std::ptr::null());
            maybe_out(edge_data_out, std::ptr::null());
            maybe_out(count_out, 0);
        }
        Ok(())
    }

    /// Operations enqueued on the stream (and on streams that join the capture through
    /// events) become nodes of a graph and do not run; see the crate documentation. The legacy
    /// default stream cannot be captured (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a stream
    /// already capturing is `CUDA_ERROR_ILLEGAL_STATE`.
    fn cuStreamBeginCapture_v2(stream: CUstream, mode: CUstreamCaptureMode) {
        ops::begin_capture(Scope::Current, h(stream), mode)
    }

    /// Ends the capture begun on `stream`, for every stream in it, and returns its graph.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` or `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` (a stream
    /// that joined was not joined back) end it with a NULL graph;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` (not the origin stream, and the capture is
    /// invalidated), `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` and `CUDA_ERROR_ILLEGAL_STATE` (not
    /// capturing) leave it as it is; a NULL `graph` is `CUDA_ERROR_INVALID_VALUE`.
    fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) {
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match ops::end_capture(Scope::Current, h(stream)) {
            // SAFETY: an out-pointer, not NULL.
            Ok(g) => unsafe { out(graph, ptr(g)) },
            Err(e) => {
                if ops::ends_with_null_graph(e) {
                    // SAFETY: an out-pointer, not NULL.
                    unsafe { out(graph, std::ptr::null_mut())? };
                }
                Err(e)
            }
        }
    }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode) {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: not NULL; an in/out pointer (contract).
        unsafe { *mode = exchange_capture_mode(*mode) };
        Ok(())
    }
}

fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Res {
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let handle = ops::create_stream(Scope::Current, flags, priority)?;
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(ph, ptr(handle)) }
}

// ---------------------------------------------------------------------------------------------
// Graphs (from stream capture only)

fn instantiate(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> Res {
    if exec.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = ops::instantiate(h(graph), flags)?;
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(exec, ptr(e)) }
}

driver! {
    /// Destroys a graph from `cuStreamEndCapture`; executable graphs made from it stay usable.
    fn cuGraphDestroy(graph: CUgraph) {
        ops::destroy_graph(h(graph))
    }

    /// An executable graph of a graph from `cuStreamEndCapture`: a copy of its nodes,
    /// independent of the graph afterwards. Flags as `CUDA_GRAPH_INSTANTIATE_FLAG_*`; device
    /// launch is `CUDA_ERROR_NOT_SUPPORTED`.
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) {
        instantiate(exec, graph, flags)
    }

    /// As `cuGraphInstantiateWithFlags`, with `params.flags`; sets `result_out`
    /// (`CUDA_GRAPH_INSTANTIATE_SUCCESS`, or `CUDA_GRAPH_INSTANTIATE_ERROR` with the error
    /// returned) and `hErrNode_out` (NULL). An upload stream is checked, and has nothing to do.
    fn cuGraphInstantiateWithParams(
        exec: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    ) {
        if params.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: not NULL; a valid, writable parameter block (contract).
        let p = unsafe { &mut *params };
        p.hErrNode_out = std::ptr::null_mut();
        let result = (|| {
            if p.flags & 0x2 != 0 {
                ops::stream_flags(Scope::Current, h(p.hUploadStream))?;
            }
            instantiate(exec, graph, p.flags)
        })();
        p.result_out = if result.is_ok() {
            CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS
        } else {
            CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR
        };
        result
    }

    /// Destroys an executable graph; launches already enqueued still run.
    fn cuGraphExecDestroy(exec: CUgraphExec) {
        ops::destroy_exec(h(exec))
    }

    /// Enqueues the graph's nodes on `stream`, in captured order, after the stream's earlier
    /// work and after the previous launch of `exec` (launches of one executable graph are
    /// ordered). Each node is enqueued like the operation it was captured from, so legacy
    /// stream barriers and the checker apply with the launch stream's order; device addresses
    /// are resolved at each launch (freed memory is reported as a use after free, and the
    /// launch is `CUDA_ERROR_INVALID_VALUE` with nothing enqueued). A capturing `stream` (a
    /// child graph) is `CUDA_ERROR_NOT_SUPPORTED` and invalidates its capture.
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) {
        ops::launch_graph(Scope::Current, h(exec), h(stream))
    }

    /// Checks the handles; there is nothing to upload to a simulated device.
    fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) {
        ops::upload_graph(Scope::Current, h(exec), h(stream))
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// `CU_EVENT_RECORD_EXTERNAL`.
const RECORD_EXTERNAL: c_uint = 0x1;
/// `CU_EVENT_WAIT_EXTERNAL`.
const WAIT_EXTERNAL: c_uint = 0x1;

fn record(event: CUevent, stream: CUstream, flags: c_uint) -> Res {
    if flags & !RECORD_EXTERNAL != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ops::record_event(
        Scope::Current,
        h(event),
        h(stream),
        flags & RECORD_EXTERNAL != 0,
    )
}

driver! {
    fn cuEventCreate(ph: *mut CUevent, flags: c_uint) {
        if ph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = ops::create_event(Scope::Current, flags)?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(ph, ptr(handle)) }
    }

    /// Captures the stream's position now; the stream must be in the event's context. On a
    /// capturing stream, the record is inside the capture: only streams of the capture may
    /// wait on it (a stream outside any capture that does joins it), and host queries and
    /// waits are `CUDA_ERROR_CAPTURED_EVENT` until the event is recorded again.
    fn cuEventRecord(event: CUevent, stream: CUstream) {
        record(event, stream, 0)
    }

    /// As `cuEventRecord`; flags 0 or `CU_EVENT_RECORD_EXTERNAL` (0x1): on a capturing stream,
    /// an event-record node of the graph, which records the event at that point of each
    /// launch (the event itself is left as it was); elsewhere, no effect.
    fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, flags: c_uint) {
        record(event, stream, flags)
    }

    /// `CUDA_SUCCESS` once the recorded position has completed (or if never recorded).
    /// `CUDA_ERROR_CAPTURED_EVENT` if last recorded in a stream capture (which is
    /// invalidated if still under way).
    fn cuEventQuery(event: CUevent) {
        ops::query_event(h(event))
    }

    fn cuEventSynchronize(event: CUevent) {
        ops::synchronize_event(h(event))
    }

    /// Destroys at once; waits already enqueued on it keep their position.
    fn cuEventDestroy_v2(event: CUevent) {
        ops::destroy_event(h(event))
    }

    /// Milliseconds between the completions of two recorded events (host clock).
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) {
        let elapsed = ops::elapsed_time(h(start), h(end))?;
        // SAFETY: an out-pointer.
        unsafe { out(ms, elapsed) }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

driver! {
    /// Device memory of the current context's device, zeroed, 256-byte aligned.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = ops::alloc(Scope::Current, bytes)?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(dptr, p) }
    }

    /// Stream-ordered allocation: work not ordered after this point of `stream` that touches
    /// the memory is a violation. On a capturing stream (graph memory nodes), not modelled:
    /// `CUDA_ERROR_NOT_SUPPORTED`, and the capture is invalidated.
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = ops::alloc_async(Scope::Current, bytes, h(stream), "cuMemAllocAsync")?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(dptr, p) }
    }

    /// A host-side free: every access to the memory must be ordered before the host's
    /// current position (a synchronization), or it is a violation.
    fn cuMemFree_v2(dptr: CUdeviceptr) {
        ops::free(dptr, "cuMemFree")
    }

    /// A stream-ordered free: every access must be ordered before this point of `stream`. On
    /// a capturing stream, not modelled, as for `cuMemAllocAsync`.
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) {
        ops::free_async(Scope::Current, dptr, h(stream), "cuMemFreeAsync")
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let (f, t) = ops::memory_info(Scope::Current)?;
        // SAFETY: out-pointers.
        unsafe {
            out(free, f)?;
            out(total, t)
        }
    }

    /// Pinned host memory: copies to and from it are asynchronous.
    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        alloc_host(pp, bytes)
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) {
        alloc_host(pp, bytes)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        ops::free_host(p as usize)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, p: CUdeviceptr) {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let Some(info) = ops::pointer_info(p)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: `data` has room for the attribute's type (driver API contract).
        unsafe { write_attribute(data, attribute, p, Some(&info)) }
    }

    /// Like `cuPointerGetAttribute`, but an unknown pointer gets default values, not an error.
    fn cuPointerGetAttributes(
        n: c_uint,
        attributes: *mut CUpointer_attribute,
        data: *mut *mut c_void,
        p: CUdeviceptr,
    ) {
        if n > 0 && (attributes.is_null() || data.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let info = ops::pointer_info(p)?;
        for k in 0..n as usize {
            // SAFETY: `n` attributes and `n` out-pointers (contract).
            unsafe { write_attribute(*data.add(k), *attributes.add(k), p, info.as_ref())? };
        }
        Ok(())
    }
}

fn alloc_host(pp: *mut *mut c_void, bytes: usize) -> Res {
    if pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let addr = ops::alloc_host(Scope::Current, bytes)?;
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(pp, addr as *mut c_void) }
}

/// # Safety
/// `data` has room for the attribute's type.
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    p: CUdeviceptr,
    info: Option<&ops::PointerInfo>,
) -> Res {
    use CUpointer_attribute::*;
    // SAFETY: in every arm, `data` has room for the attribute's documented type (caller).
    // Booleans are written as one byte, which reads correctly as a zeroed `bool` or `int` alike.
    unsafe {
        match attribute {
            CU_POINTER_ATTRIBUTE_CONTEXT => {
                out(data.cast(), ptr::<c_void>(info.map_or(0, |i| i.ctx)))
            }
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                out(data.cast(), info.map_or(0, |i| i.memory_type as c_uint))
            }
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER | CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => {
                let value = match (attribute, info) {
                    (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, Some(i)) => i.start,
                    (_, Some(_)) => p,
                    (_, None) => 0,
                };
                out(data.cast::<u64>(), value)
            }
            CU_POINTER_ATTRIBUTE_HOST_POINTER => out(
                data.cast::<*mut c_void>(),
                match info {
                    Some(i) if i.memory_type == CUmemorytype::CU_MEMORYTYPE_HOST => {
                        i.start as *mut c_void
                    }
                    _ => std::ptr::null_mut(),
                },
            ),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                out(data.cast::<c_int>(), info.map_or(-2, |i| i.device))
            }
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => out(data.cast::<usize>(), info.map_or(0, |i| i.len)),
            CU_POINTER_ATTRIBUTE_BUFFER_ID => out(data.cast::<u64>(), info.map_or(0, |i| i.id)),
            CU_POINTER_ATTRIBUTE_IS_MANAGED => out(data.cast::<u8>(), 0),
            CU_POINTER_ATTRIBUTE_SYNC_MEMOPS | CU_POINTER_ATTRIBUTE_MAPPED => {
                out(data.cast::<u8>(), u8::from(info.is_some()))
            }
            other => {
                unsupported(&format!("cuPointerGetAttribute({other:?})"));
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Copies and memsets

fn copy_2d(c: *const CUDA_MEMCPY2D, stream: CUstream, mode: Mode) -> Res {
    if c.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a valid descriptor (contract).
    let c = unsafe { &*c };
    let side =
        |ty: CUmemorytype, host: usize, dev: CUdeviceptr, x: usize, y: usize, pitch: usize| {
            let offset = y * pitch + x;
            match ty {
                CUmemorytype::CU_MEMORYTYPE_HOST => Ok(Side::Host(host + offset)),
                CUmemorytype::CU_MEMORYTYPE_DEVICE => Ok(Side::Device(dev + offset as u64)),
                CUmemorytype::CU_MEMORYTYPE_UNIFIED => Ok(match side_of(dev) {
                    Side::Device(p) => Side::Device(p + offset as u64),
                    Side::Host(p) => Side::Host(p + offset),
                }),
                CUmemorytype::CU_MEMORYTYPE_ARRAY => {
                    unsupported("cuMemcpy2D with CUDA arrays");
                    Err(CUDA_ERROR_NOT_SUPPORTED)
                }
            }
        };
    let r = CopyRequest {
        src: side(
            c.srcMemoryType,
            c.srcHost as usize,
            c.srcDevice,
            c.srcXInBytes,
            c.srcY,
            c.srcPitch,
        )?,
        src_pitch: c.srcPitch,
        dst: side(
            c.dstMemoryType,
            c.dstHost as usize,
            c.dstDevice,
            c.dstXInBytes,
            c.dstY,
            c.dstPitch,
        )?,
        dst_pitch: c.dstPitch,
        width: c.WidthInBytes,
        height: c.Height,
    };
    let name = if mode == Mode::Sync {
        "cuMemcpy2D"
    } else {
        "cuMemcpy2DAsync"
    };
    ops::copy(Scope::Current, name, r, h(stream), mode)
}
const NULL_STREAM: CUstream = std::ptr::null_mut();

fn copy(op: &'static str, r: CopyRequest, stream: CUstream, mode: Mode) -> Res {
    ops::copy(Scope::Current, op, r, h(stream), mode)
}

fn memset(op: &'static str, dst: CUdeviceptr, f: Fill, stream: CUstream, mode: Mode) -> Res {
    ops::memset(Scope::Current, op, dst, f, h(stream), mode)
}

/// The devices of the contexts of a peer copy (`CUDA_ERROR_INVALID_CONTEXT` for one that is
/// not live), then the model's check of its sides.
fn check_peer_copy(
    op: &str,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
) -> Res {
    let dst_device = ops::context_device(h(dst_ctx))?;
    let src_device = ops::context_device(h(src_ctx))?;
    ops::check_peer_copy(op, dst, dst_device, src, src_device, bytes)
}

driver! {
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) {
        copy("cuMemcpyHtoD", linear(Side::Host(src as usize), Side::Device(dst), bytes), NULL_STREAM, Mode::Sync)
    }

    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) {
        copy("cuMemcpyDtoH", linear(Side::Device(src), Side::Host(dst as usize), bytes), NULL_STREAM, Mode::Sync)
    }

    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        copy("cuMemcpyDtoD", linear(Side::Device(src), Side::Device(dst), bytes), NULL_STREAM, Mode::Sync)
    }

    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        copy("cuMemcpy", linear(side_of(src), side_of(dst), bytes), NULL_STREAM, Mode::Sync)
    }

    /// From pageable memory the source is staged at once; from pinned memory it is read when
    /// the copy runs.
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream) {
        copy("cuMemcpyHtoDAsync", linear(Side::Host(src as usize), Side::Device(dst), bytes), stream, Mode::Async)
    }

    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream) {
        copy("cuMemcpyDtoHAsync", linear(Side::Device(src), Side::Host(dst as usize), bytes), stream, Mode::Async)
    }

    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) {
        copy("cuMemcpyDtoDAsync", linear(Side::Device(src), Side::Device(dst), bytes), stream, Mode::Async)
    }

    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) {
        copy("cuMemcpyAsync", linear(side_of(src), side_of(dst), bytes), stream, Mode::Async)
    }

    /// A copy between the memory of two contexts (of one device or two), on the legacy
    /// default stream of the current context, which the host waits for. Needs no peer access
    /// (the driver stages the copy when the devices cannot reach each other). Errors as
    /// `cuMemcpyPeerAsync`; `CUDA_ERROR_INVALID_CONTEXT` too with no current context.
    fn cuMemcpyPeer(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        bytes: usize,
    ) {
        check_peer_copy("cuMemcpyPeer", dst, dst_ctx, src, src_ctx, bytes)?;
        let r = linear(Side::Device(src), Side::Device(dst), bytes);
        copy("cuMemcpyPeer", r, ptr(0), Mode::Sync)
    }

    /// A copy between the memory of two contexts, in the order of `stream` (of any context):
    /// the checker sees a read of the source and a write of the destination by that stream.
    /// Needs no peer access. `CUDA_ERROR_INVALID_CONTEXT` for a context that is not live,
    /// `CUDA_ERROR_INVALID_VALUE` for a range outside a live allocation; a pointer that is
    /// memory of another device than its context's is reported as a misuse, and copied.
    fn cuMemcpyPeerAsync(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        bytes: usize,
        stream: CUstream,
    ) {
        check_peer_copy("cuMemcpyPeerAsync", dst, dst_ctx, src, src_ctx, bytes)?;
        let r = linear(Side::Device(src), Side::Device(dst), bytes);
        copy("cuMemcpyPeerAsync", r, stream, Mode::Async)
    }

    fn cuMemcpy2D_v2(c: *const CUDA_MEMCPY2D) {
        copy_2d(c, NULL_STREAM, Mode::Sync)
    }

    fn cuMemcpy2DAsync_v2(c: *const CUDA_MEMCPY2D, stream: CUstream) {
        copy_2d(c, stream, Mode::Async)
    }

    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) {
        memset("cuMemsetD8", dst, fill_1d(value.into(), 1, n), NULL_STREAM, Mode::Sync)
    }

    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) {
        memset("cuMemsetD8Async", dst, fill_1d(value.into(), 1, n), stream, Mode::Async)
    }

    fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) {
        memset("cuMemsetD32", dst, fill_1d(value, 4, n), NULL_STREAM, Mode::Sync)
    }

    fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) {
        memset("cuMemsetD32Async", dst, fill_1d(value, 4, n), stream, Mode::Async)
    }

    /// `height` rows of `width` bytes, `pitch` bytes apart.
    fn cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) {
        let f = fill_2d(value.into(), 1, pitch, width, height);
        memset("cuMemsetD2D8", dst, f, NULL_STREAM, Mode::Sync)
    }

    fn cuMemsetD2D8Async(
        dst: CUdeviceptr,
        pitch: usize,
        value: u8,
        width: usize,
        height: usize,
        stream: CUstream,
    ) {
        let f = fill_2d(value.into(), 1, pitch, width, height);
        memset("cuMemsetD2D8Async", dst, f, stream, Mode::Async)
    }

    /// `height` rows of `width` 32-bit values, `pitch` bytes apart.
    fn cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize) {
        let f = fill_2d(value, 4, pitch, width, height);
        memset("cuMemsetD2D32", dst, f, NULL_STREAM, Mode::Sync)
    }

    fn cuMemsetD2D32Async(
        dst: CUdeviceptr,
        pitch: usize,
        value: c_uint,
        width: usize,
        height: usize,
        stream: CUstream,
    ) {
        let f = fill_2d(value, 4, pitch, width, height);
        memset("cuMemsetD2D32Async", dst, f, stream, Mode::Async)
    }
}

// ---------------------------------------------------------------------------------------------
// Error strings

driver! {
    fn cuGetErrorName(error: CUresult, p: *mut *const c_char) {
        let s = ops::c_string((0, error as u32, false), || format!("{error:?}"));
        // SAFETY: an out-pointer.
        unsafe { out(p, s) }
    }

    fn cuGetErrorString(error: CUresult, p: *mut *const c_char) {
        let s = ops::c_string((0, error as u32, true), || ops::description(error));
        // SAFETY: an out-pointer.
        unsafe { out(p, s) }
    }
}
