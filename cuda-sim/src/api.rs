//! The driver entry points the simulator models, by area of the CUDA driver API.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::sys::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_MEMCPY2D, CUcontext, CUctxCreateParams, CUdevice,
    CUdevice_attribute, CUdeviceptr, CUevent, CUgraph, CUgraphEdgeData, CUgraphExec,
    CUgraphInstantiateResult, CUgraphNode, CUhostFn, CUmemorytype, CUpointer_attribute, CUresult,
    CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUuuid, cuuint64_t,
};

use crate::checker::Pattern;
use crate::engine::{
    self, Copy2D, DISABLE_TIMING, Event, Handle, Kind, LastRecord, Loc, Res, Resolved, State,
    Waiter, Work,
};
use crate::graph::Node;
use crate::{driver, maybe_out, out, state};

use CUresult::*;

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

fn ptr<T>(h: Handle) -> *mut T {
    h as *mut T
}

/// Waits without the global lock, then records the host's observation under it.
fn host_wait(waiters: Vec<Waiter>) {
    for w in &waiters {
        w.wait();
    }
    let mut st = state();
    for w in &waiters {
        st.observed(w);
    }
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
        state().initialized = true;
        crate::calls::initialized();
        Ok(())
    }

    /// Reports CUDA 13.0.
    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: an out-pointer (driver API contract).
        unsafe { out(version, 13000) }
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        let st = state();
        st.check_init()?;
        // SAFETY: an out-pointer.
        unsafe { out(count, st.devices) }
    }

    /// Device handles are the ordinals.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        state().check_device(ordinal)?;
        // SAFETY: an out-pointer.
        unsafe { out(device, ordinal) }
    }

    fn cuDeviceGetAttribute(value: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) {
        state().check_device(dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(value, attribute(attrib)) }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        state().check_device(dev)?;
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
        state().check_device(dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(bytes, crate::config().memory) }
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        device_uuid(uuid, dev)
    }
}

fn device_uuid(uuid: *mut CUuuid, dev: CUdevice) -> Res {
    state().check_device(dev)?;
    let mut bytes = [0 as c_char; 16];
    for (i, b) in b"cuda-sim".iter().enumerate() {
        bytes[i] = *b as c_char;
    }
    bytes[15] = dev as c_char;
    // SAFETY: an out-pointer.
    unsafe { out(uuid, CUuuid { bytes }) }
}

// ---------------------------------------------------------------------------------------------
// Contexts

driver! {
    /// The primary context of `dev` (one per device, the same handle every time).
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        let mut st = state();
        st.check_device(dev)?;
        let ctx = st.primary(dev);
        st.contexts.get_mut(&ctx).expect("made by primary()").retained += 1;
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Drops one retain; the context's state is kept when the count reaches zero.
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let mut st = state();
        st.check_device(dev)?;
        let ctx = st.primary(dev);
        let c = st.contexts.get_mut(&ctx).expect("made by primary()");
        if c.retained == 0 {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        c.retained -= 1;
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let mut st = state();
        st.check_device(dev)?;
        let ctx = st.primary(dev);
        let retained = st.contexts[&ctx].retained;
        // SAFETY: out-pointers.
        unsafe {
            out(flags, 0)?;
            out(active, c_int::from(retained > 0))
        }
    }

    /// A context that is not the primary one; it becomes current.
    fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        _params: *mut CUctxCreateParams,
        _flags: c_uint,
        dev: CUdevice,
    ) {
        let mut st = state();
        st.check_device(dev)?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = st.create_context(dev);
        engine::push_current(ctx);
        // SAFETY: checked not NULL; an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Destroys a created context; its streams' pending work still completes.
    fn cuCtxDestroy_v2(ctx: CUcontext) {
        let workers = {
            let mut st = state();
            st.check_init()?;
            let c = st.context(h(ctx))?;
            if c.primary {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            st.contexts.get_mut(&h(ctx)).expect("checked").destroyed = true;
            st.forget_peers(h(ctx));
            st.end_context_streams(h(ctx))
        };
        for w in workers {
            let _ = w.join();
        }
        if engine::current_raw() == Some(h(ctx)) {
            engine::pop_current();
        }
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        state().check_init()?;
        let current = engine::current_raw().unwrap_or(0);
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(current)) }
    }

    /// Replaces the top of the thread's context stack (NULL unbinds).
    fn cuCtxSetCurrent(ctx: CUcontext) {
        let st = state();
        st.check_init()?;
        if ctx.is_null() {
            engine::set_current(None);
        } else {
            st.context(h(ctx))?;
            engine::set_current(Some(h(ctx)));
        }
        Ok(())
    }

    fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        let st = state();
        st.check_init()?;
        st.context(h(ctx))?;
        engine::push_current(h(ctx));
        Ok(())
    }

    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        state().check_init()?;
        let popped = engine::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            // SAFETY: an out-pointer, not NULL.
            unsafe { out(pctx, ptr(popped))? };
        }
        Ok(())
    }

    fn cuCtxGetDevice(device: *mut CUdevice) {
        let st = state();
        let ctx = st.current()?;
        let dev = st.contexts[&ctx].device;
        // SAFETY: an out-pointer.
        unsafe { out(device, dev) }
    }

    fn cuCtxGetId(ctx: CUcontext, id: *mut c_ulonglong) {
        let st = state();
        let ctx = if ctx.is_null() { st.current()? } else { h(ctx) };
        st.context(ctx)?;
        // SAFETY: an out-pointer.
        unsafe { out(id, ctx as c_ulonglong) }
    }

    /// Waits for every stream of the current context.
    fn cuCtxSynchronize() {
        let waiters = {
            let mut st = state();
            let ctx = st.current()?;
            st.check_capture_safe()?;
            st.context_waiters(ctx)
        };
        host_wait(waiters);
        Ok(())
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        state().current()?;
        if !least.is_null() {
            // SAFETY: an out-pointer, not NULL.
            unsafe { out(least, 0)? };
        }
        if !greatest.is_null() {
            // SAFETY: an out-pointer, not NULL.
            unsafe { out(greatest, -5)? };
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Streams

fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Res {
    if ph.is_null() || flags & !engine::NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let ctx = st.current()?;
    let handle = st.handle();
    st.new_stream(ctx, Kind::Created { flags, priority }, handle);
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(ph, ptr(handle)) }
}

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
        let worker = {
            let mut st = state();
            let i = st.stream(h(stream))?;
            if !matches!(st.streams[i].kind, Kind::Created { .. }) {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            st.destroy_stream(i)
        };
        // An idle stream's worker ends at once.
        if let Some(w) = worker {
            let _ = w.join();
        }
        Ok(())
    }

    fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        let f = match st.streams[i].kind {
            Kind::Created { flags, .. } => flags,
            _ => 0,
        };
        // SAFETY: an out-pointer.
        unsafe { out(flags, f) }
    }

    fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        let ctx = st.streams[i].ctx;
        // SAFETY: an out-pointer.
        unsafe { out(pctx, ptr(ctx)) }
    }

    /// Blocks until the stream's work so far is done (the legacy default stream's includes the
    /// blocking streams' earlier work). A capturing stream is
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated.
    fn cuStreamSynchronize(stream: CUstream) {
        let waiter = {
            let mut st = state();
            let i = st.stream(h(stream))?;
            if st.streams[i].capture.is_some() {
                st.invalidate_stream_capture(i);
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            if st.streams[i].kind == Kind::Legacy {
                st.check_capture_safe()?;
                st.enqueue(i, "cuStreamSynchronize", &[], None, None)?;
            }
            st.waiter(i)
        };
        host_wait(vec![waiter]);
        Ok(())
    }

    /// `CUDA_ERROR_NOT_READY` while work is pending. A capturing stream is
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated; the legacy
    /// default stream beside a capturing blocking stream is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`
    /// and invalidates that capture.
    fn cuStreamQuery(stream: CUstream) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        if st.streams[i].capture.is_some() {
            st.invalidate_stream_capture(i);
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        st.check_implicit(i, true)?;
        let w = st.waiter(i);
        engine::ready(State::is_done(&w))?;
        st.observed(&w);
        Ok(())
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
        let mut st = state();
        let i = st.stream(h(stream))?;
        st.wait_event(i, h(event), flags & WAIT_EXTERNAL != 0)
    }

    /// Runs `f(user_data)` on the stream's thread, in stream order; on a capturing stream, a
    /// host node of the graph, called at each launch.
    fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, user_data: *mut c_void) {
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut st = state();
        let i = st.stream(h(stream))?;
        let data = user_data as usize;
        if st.capturing(i)?.is_some() {
            st.add_node(i, Node::Host { f, data });
            return Ok(());
        }
        // SAFETY: the caller's host function and its argument (driver API contract).
        let work: Work = Box::new(move || unsafe { f(data as *mut c_void) });
        st.enqueue(i, "cuLaunchHostFunc", &[], None, Some(work))?;
        Ok(())
    }

    /// The legacy default stream while a blocking stream of its context is capturing is
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the capture is not invalidated).
    fn cuStreamIsCapturing(stream: CUstream, status: *mut CUstreamCaptureStatus) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        st.check_implicit(i, false)?;
        let s = st.capture_status(i);
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
        let mut st = state();
        let i = st.stream(h(stream))?;
        st.check_implicit(i, false)?;
        let status = st.capture_status(i);
        let (id, graph) = match st.streams[i].capture {
            Some(id) if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {
                (id, st.captures[&id].graph)
            }
            Some(id) => (id, 0),
            None => (0, 0),
        };
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
        let mut st = state();
        let i = st.stream(h(stream))?;
        st.begin_capture(i, mode)
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
        let mut st = state();
        let i = st.stream(h(stream))?;
        match st.end_capture(i) {
            Ok(g) => {
                // SAFETY: an out-pointer, not NULL.
                unsafe { out(graph, ptr(g)) }
            }
            Err(e) => {
                if matches!(
                    e,
                    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
                ) {
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
        unsafe { *mode = engine::exchange_capture_mode(*mode) };
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Graphs (from stream capture only)

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`: auto-free on launch, upload, device launch, node priority.
const INSTANTIATE_AUTO_FREE: u64 = 0x1;
const INSTANTIATE_KNOWN: u64 = 0x1 | 0x2 | 0x4 | 0x8;
const INSTANTIATE_DEVICE_LAUNCH: u64 = 0x4;

/// Instantiates `graph` with `flags`: auto-free on launch and node priorities have no effect
/// (no graph memory nodes, no concurrency), an upload has nothing to do; device launch is not
/// modelled (`CUDA_ERROR_NOT_SUPPORTED`), and `CUDA_ERROR_INVALID_VALUE` with auto-free.
fn instantiate(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) -> Res {
    if exec.is_null() || flags & !INSTANTIATE_KNOWN != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
        if flags & INSTANTIATE_AUTO_FREE != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::stubs::unsupported("CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let mut st = state();
    st.check_init()?;
    let e = st.instantiate(h(graph))?;
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(exec, ptr(e)) }
}

driver! {
    /// Destroys a graph from `cuStreamEndCapture`; executable graphs made from it stay usable.
    fn cuGraphDestroy(graph: CUgraph) {
        if state().graphs.remove(&h(graph)).is_some() {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
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
                state().stream(h(p.hUploadStream))?;
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
        if state().execs.remove(&h(exec)).is_some() {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }

    /// Enqueues the graph's nodes on `stream`, in captured order, after the stream's earlier
    /// work and after the previous launch of `exec` (launches of one executable graph are
    /// ordered). Each node is enqueued like the operation it was captured from, so legacy
    /// stream barriers and the checker apply with the launch stream's order; device addresses
    /// are resolved at each launch (freed memory is reported as a use after free, and the
    /// launch is `CUDA_ERROR_INVALID_VALUE` with nothing enqueued). A capturing `stream` (a
    /// child graph) is `CUDA_ERROR_NOT_SUPPORTED` and invalidates its capture.
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        st.launch(h(exec), i)
    }

    /// Checks the handles; there is nothing to upload to a simulated device.
    fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) {
        let mut st = state();
        st.stream(h(stream))?;
        if st.execs.contains_key(&h(exec)) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Events

driver! {
    fn cuEventCreate(ph: *mut CUevent, flags: c_uint) {
        if ph.is_null() || flags & !0xF != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut st = state();
        let ctx = st.current()?;
        let handle = st.handle();
        st.events.insert(handle, Event { ctx, flags, last: LastRecord::Never });
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
        let mut st = state();
        if let Some(r) = recorded_for_host(&mut st, event)? {
            let w = State::event_waiter(&r);
            engine::ready(State::is_done(&w))?;
            st.observed(&w);
        }
        Ok(())
    }

    fn cuEventSynchronize(event: CUevent) {
        let waiter = recorded_for_host(&mut state(), event)?.map(|r| State::event_waiter(&r));
        if let Some(w) = waiter {
            host_wait(vec![w]);
        }
        Ok(())
    }

    /// Destroys at once; waits already enqueued on it keep their position.
    fn cuEventDestroy_v2(event: CUevent) {
        let mut st = state();
        st.check_init()?;
        st.events.remove(&h(event)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }

    /// Milliseconds between the completions of two recorded events (host clock).
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) {
        let st = state();
        let stamp = |e: CUevent| -> Res<Option<std::time::Instant>> {
            let ev = st.events.get(&h(e)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if ev.flags & DISABLE_TIMING != 0 {
                return Err(CUDA_ERROR_INVALID_HANDLE);
            }
            match &ev.last {
                LastRecord::Stream(r) => Ok(*engine::lock(&r.done_at)),
                LastRecord::Capture { .. } => Err(CUDA_ERROR_CAPTURED_EVENT),
                LastRecord::Never => Err(CUDA_ERROR_INVALID_HANDLE),
            }
        };
        let (Some(a), Some(b)) = (stamp(start)?, stamp(end)?) else {
            return Err(CUDA_ERROR_NOT_READY);
        };
        let elapsed = if b >= a {
            (b - a).as_secs_f32() * 1e3
        } else {
            -((a - b).as_secs_f32() * 1e3)
        };
        // SAFETY: an out-pointer.
        unsafe { out(ms, elapsed) }
    }
}

/// The position an event was last recorded at (`None`: never recorded), for a host query or
/// wait: `CUDA_ERROR_CAPTURED_EVENT` for an event last recorded in a stream capture (invalidated
/// if still under way), and refused while a stream capture forbids potentially unsafe calls.
fn recorded_for_host(st: &mut State, event: CUevent) -> Res<Option<engine::Recorded>> {
    st.check_init()?;
    let last = st
        .events
        .get(&h(event))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .last
        .clone();
    let recorded = match last {
        LastRecord::Never => None,
        LastRecord::Stream(r) => Some(r),
        LastRecord::Capture { id, .. } => {
            st.invalidate(id);
            return Err(CUDA_ERROR_CAPTURED_EVENT);
        }
    };
    st.check_capture_safe()?;
    Ok(recorded)
}

/// `CU_EVENT_RECORD_EXTERNAL`.
const RECORD_EXTERNAL: c_uint = 0x1;
/// `CU_EVENT_WAIT_EXTERNAL`.
const WAIT_EXTERNAL: c_uint = 0x1;

fn record(event: CUevent, stream: CUstream, flags: c_uint) -> Res {
    if flags & !RECORD_EXTERNAL != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let i = st.stream(h(stream))?;
    let ctx = st
        .events
        .get(&h(event))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .ctx;
    if ctx != st.streams[i].ctx {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    st.record_event(i, h(event), flags & RECORD_EXTERNAL != 0)
}

// ---------------------------------------------------------------------------------------------
// Memory

driver! {
    /// Device memory of the current context's device, zeroed, 256-byte aligned.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut st = state();
        let ctx = st.current()?;
        st.check_capture_safe()?;
        let p = st.alloc(bytes, ctx, None)?;
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
        let mut st = state();
        let i = st.stream(h(stream))?;
        refuse_in_capture(&mut st, i, "cuMemAllocAsync")?;
        let ctx = st.streams[i].ctx;
        let p = st.alloc(bytes, ctx, Some(i))?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(dptr, p) }
    }

    /// A host-side free: every access to the memory must be ordered before the host's
    /// current position (a synchronization), or it is a violation.
    fn cuMemFree_v2(dptr: CUdeviceptr) {
        let mut st = state();
        st.check_init()?;
        st.check_capture_safe()?;
        st.free(dptr, None, "cuMemFree")
    }

    /// A stream-ordered free: every access must be ordered before this point of `stream`. On
    /// a capturing stream, not modelled, as for `cuMemAllocAsync`.
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) {
        let mut st = state();
        let i = st.stream(h(stream))?;
        refuse_in_capture(&mut st, i, "cuMemFreeAsync")?;
        st.free(dptr, Some(i), "cuMemFreeAsync")
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let st = state();
        st.current()?;
        let total_bytes = crate::config().memory;
        // SAFETY: out-pointers.
        unsafe {
            out(free, total_bytes - st.memory.used)?;
            out(total, total_bytes)
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
        state().memory.free_pinned(p as usize)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, p: CUdeviceptr) {
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let st = state();
        st.check_init()?;
        let Some(info) = pointer_info(&st, p) else {
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
        let st = state();
        st.check_init()?;
        let info = pointer_info(&st, p);
        for k in 0..n as usize {
            // SAFETY: `n` attributes and `n` out-pointers (contract).
            unsafe { write_attribute(*data.add(k), *attributes.add(k), p, info.as_ref())? };
        }
        Ok(())
    }
}

/// Stream-ordered allocation in a stream capture (graph memory nodes) is not modelled:
/// `CUDA_ERROR_NOT_SUPPORTED` on a capturing stream, which invalidates its capture.
fn refuse_in_capture(st: &mut State, i: usize, op: &str) -> Res {
    st.check_implicit(i, true)?;
    if st.streams[i].capture.is_some() {
        crate::stubs::unsupported(&format!("{op} in a stream capture"));
        st.invalidate_stream_capture(i);
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

fn alloc_host(pp: *mut *mut c_void, bytes: usize) -> Res {
    if pp.is_null() || bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let ctx = st.current()?;
    let device = st.contexts[&ctx].device;
    let addr = st.memory.alloc_pinned(bytes, ctx, device)?;
    // SAFETY: an out-pointer, not NULL.
    unsafe { out(pp, addr as *mut c_void) }
}

struct PointerInfo {
    ctx: Handle,
    device: i32,
    memory_type: CUmemorytype,
    start: u64,
    len: usize,
    id: u64,
}

fn pointer_info(st: &State, p: CUdeviceptr) -> Option<PointerInfo> {
    if let Some(a) = st.memory.find(p) {
        return Some(PointerInfo {
            ctx: a.ctx,
            device: a.device,
            memory_type: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            start: a.base,
            len: a.len,
            id: a.id,
        });
    }
    let (&base, pinned) = st.memory.pinned.range(..=(p as usize)).next_back()?;
    ((p as usize) < base + pinned.len).then_some(PointerInfo {
        ctx: pinned.ctx,
        device: pinned.device,
        memory_type: CUmemorytype::CU_MEMORYTYPE_HOST,
        start: base as u64,
        len: pinned.len,
        id: base as u64,
    })
}

/// # Safety
/// `data` has room for the attribute's type.
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    p: CUdeviceptr,
    info: Option<&PointerInfo>,
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
                crate::stubs::unsupported(&format!("cuPointerGetAttribute({other:?})"));
                Err(CUDA_ERROR_NOT_SUPPORTED)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Copies and memsets

/// One side of a copy as the caller named it.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Device(CUdeviceptr),
    Host(usize),
}

/// How the host relates to a copy's completion.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Stream-ordered; the host goes on.
    Async,
    /// The host waits for the copy, and is ordered after it (`cuMemcpy*` without `Async`).
    Sync,
}

/// A copy of `height` rows of `width` bytes; pitches in bytes.
#[derive(Clone, Copy)]
pub(crate) struct CopyRequest {
    src: Side,
    src_pitch: usize,
    dst: Side,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// A copy or memset ready to enqueue: its accesses for the checker and its work.
pub(crate) struct Prepared {
    pub(crate) accesses: Vec<(engine::Alloc, Pattern, bool)>,
    pub(crate) work: Work,
}

/// The bytes one side of a copy touches, from its first byte.
fn pattern_of(r: &CopyRequest, pitch: usize) -> Pattern {
    Pattern {
        start: 0,
        width: r.width as u64,
        pitch: pitch.max(r.width) as u64,
        height: r.height as u64,
    }
}

/// A device side of a copy: its location, with its access (`pattern` from `p`) added to
/// `accesses` for the checker.
fn device_loc(
    st: &mut State,
    p: CUdeviceptr,
    pattern: Pattern,
    write: bool,
    op: &str,
    accesses: &mut Vec<(engine::Alloc, Pattern, bool)>,
) -> Res<Loc> {
    let extent = ((pattern.height - 1) * pattern.pitch + pattern.width) as usize;
    let a = device_side(st, p, extent, op)?;
    let offset = p - a.base;
    let loc = Loc::Device(a.buf.clone(), offset as usize);
    accesses.push((
        a,
        Pattern {
            start: offset,
            ..pattern
        },
        write,
    ));
    Ok(loc)
}

/// Whether host memory at `addr` is pinned (`cuMemHostAlloc`); a NULL or device address is
/// `CUDA_ERROR_INVALID_VALUE`.
fn host_is_pinned(st: &State, addr: usize, len: usize) -> Res<bool> {
    if addr == 0 || st.memory.is_device_address(addr as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(st.memory.pinned_at(addr, len).is_some())
}

/// Bytes from the first to one past the last of a side.
fn extent(r: &CopyRequest, pitch: usize) -> usize {
    if r.height == 0 {
        0
    } else {
        (r.height - 1) * pitch + r.width
    }
}

/// Resolves a device side for an operation: a live allocation, or a violation (freed) /
/// `CUDA_ERROR_INVALID_VALUE` (unknown).
fn device_side(st: &mut State, p: CUdeviceptr, len: usize, op: &str) -> Res<engine::Alloc> {
    match st.memory.resolve(p, len) {
        Resolved::Live(a) => Ok(st.take_alloc_view(a.base)),
        Resolved::Freed(by) => {
            st.checker.use_after_free(p, op, &by);
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        Resolved::Unknown => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// What a violation report calls operation `op`: its name, and the graph launch replaying it.
fn described(op: &str, replay: Option<&str>) -> String {
    match replay {
        Some(launch) => format!("{op} (replayed by {launch})"),
        None => op.to_string(),
    }
}

/// Resolves the sides of a copy and makes its work; also says whether the destination is
/// pageable host memory. A direct call (`replay` is `None`) stages a pageable source now (the
/// caller may reuse it on return); a graph launch (`replay` names it) replaying a captured copy
/// needs its host memory still pinned, or reports a violation and refuses it
/// (`CUDA_ERROR_INVALID_VALUE`). Freed device memory is reported as a use after free.
pub(crate) fn prepare_copy(
    st: &mut State,
    op: &str,
    r: &CopyRequest,
    replay: Option<&str>,
) -> Res<(Prepared, bool)> {
    let what = described(op, replay);
    let mut accesses = Vec::new();
    let src = match r.src {
        Side::Device(p) => {
            let pattern = pattern_of(r, r.src_pitch);
            device_loc(st, p, pattern, false, &what, &mut accesses)?
        }
        Side::Host(addr) => {
            let len = extent(r, r.src_pitch);
            if host_is_pinned(st, addr, len)? {
                Loc::Host(addr)
            } else if replay.is_some() {
                return Err(no_longer_pinned(st, &what, addr));
            } else {
                let mut staged = vec![0u8; len];
                // SAFETY: the caller's source of `len` bytes (contract).
                unsafe { engine::copy_bytes(staged.as_mut_ptr(), addr as *const u8, len) };
                Loc::Staged(Arc::new(staged), 0)
            }
        }
    };
    let (dst, pageable_dst) = match r.dst {
        Side::Device(p) => {
            let pattern = pattern_of(r, r.dst_pitch);
            let loc = device_loc(st, p, pattern, true, &what, &mut accesses)?;
            (loc, false)
        }
        Side::Host(addr) => {
            let pinned = host_is_pinned(st, addr, extent(r, r.dst_pitch))?;
            if !pinned && replay.is_some() {
                return Err(no_longer_pinned(st, &what, addr));
            }
            (Loc::Host(addr), !pinned)
        }
    };
    let job = Copy2D {
        src,
        src_pitch: r.src_pitch,
        dst,
        dst_pitch: r.dst_pitch,
        width: r.width,
        height: r.height,
    };
    let work: Work = Box::new(move || job.run());
    Ok((Prepared { accesses, work }, pageable_dst))
}

/// Reports a replayed copy whose host memory is no longer pinned (freed with
/// `cuMemFreeHost`): what it touched may be any memory of the process by now.
fn no_longer_pinned(st: &mut State, what: &str, addr: usize) -> CUresult {
    st.checker.misuse(format!(
        "{what} touches host memory at {addr:#x}, which is no longer pinned host memory \
         (freed with cuMemFreeHost); the launch was refused"
    ));
    CUDA_ERROR_INVALID_VALUE
}

/// Checks a copy enqueued on capturing stream `i`: device sides in live allocations
/// (`CUDA_ERROR_INVALID_VALUE`), host sides in pinned memory. A copy involving pageable host
/// memory is refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the capture:
/// its bytes would have to be taken at capture time or read at each launch, and the simulator
/// does neither.
fn check_capturable_copy(st: &mut State, i: usize, r: &CopyRequest) -> Res {
    for (side, pitch) in [(r.src, r.src_pitch), (r.dst, r.dst_pitch)] {
        let len = extent(r, pitch);
        match side {
            Side::Device(p) => {
                if !matches!(st.memory.resolve(p, len), Resolved::Live(_)) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
            }
            Side::Host(addr) => {
                if !host_is_pinned(st, addr, len)? {
                    st.invalidate_stream_capture(i);
                    return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
                }
            }
        }
    }
    Ok(())
}

fn copy(op: &'static str, r: CopyRequest, stream: CUstream, mode: Mode) -> Res {
    if r.width == 0 || r.height == 0 {
        return Ok(());
    }
    if r.height > 1 && (r.src_pitch < r.width || r.dst_pitch < r.width) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let waiter = {
        let mut st = state();
        if mode == Mode::Sync {
            st.check_capture_safe()?;
        }
        let i = st.stream(h(stream))?;
        if st.capturing(i)?.is_some() {
            check_capturable_copy(&mut st, i, &r)?;
            st.add_node(i, Node::Copy { op, req: r });
            return Ok(());
        }
        let (p, pageable_dst) = prepare_copy(&mut st, op, &r, None)?;
        let refs: Vec<_> = p.accesses.iter().map(|(a, p, w)| (a, *p, *w)).collect();
        st.enqueue(i, op, &refs, None, Some(p.work))?;
        match mode {
            Mode::Sync => Some(st.waiter(i)),
            // "For transfers from device memory to pageable host memory, the function will
            // return only once the copy has completed" (CUDA API synchronization behavior):
            // the host is then ordered after the stream up to the copy.
            Mode::Async if pageable_dst => Some(st.waiter(i)),
            Mode::Async => None,
        }
    };
    if let Some(w) = waiter {
        host_wait(vec![w]);
    }
    Ok(())
}

/// The contexts of a peer copy: both live (`CUDA_ERROR_INVALID_CONTEXT`); each pointer that
/// is memory of a device other than its context's is reported as a misuse.
fn check_peer_copy(
    op: &str,
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
) -> Res {
    let mut st = state();
    st.check_init()?;
    let dst_device = st.context(h(dst_ctx))?.device;
    let src_device = st.context(h(src_ctx))?.device;
    if bytes == 0 {
        return Ok(());
    }
    for (what, p, device) in [
        ("destination", dst, dst_device),
        ("source", src, src_device),
    ] {
        let found = st.memory.find(p).map(|a| a.device);
        if let Some(actual) = found.filter(|&d| d != device) {
            st.checker.misuse(format!(
                "{op}: the {what} {p:#x} is memory of device {actual}, but its context is one \
                 of device {device}"
            ));
        }
    }
    Ok(())
}

fn linear(src: Side, dst: Side, bytes: usize) -> CopyRequest {
    CopyRequest {
        src,
        src_pitch: bytes,
        dst,
        dst_pitch: bytes,
        width: bytes,
        height: 1,
    }
}

/// A unified-addressing pointer: device memory if the range table knows it, else host.
fn side_of(p: CUdeviceptr) -> Side {
    let st = state();
    if st.memory.is_device_address(p) {
        Side::Device(p)
    } else {
        Side::Host(p as usize)
    }
}

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
                    crate::stubs::unsupported("cuMemcpy2D with CUDA arrays");
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
    copy(name, r, stream, mode)
}

/// A memset of `height` rows of `n` values of `size` bytes (1 or 4), rows `pitch` bytes apart.
#[derive(Clone, Copy)]
pub(crate) struct Fill {
    value: u32,
    size: usize,
    n: usize,
    pitch: usize,
    height: usize,
}

impl Fill {
    /// Bytes per row and bytes from the first to one past the last (`None` on overflow).
    fn extent(&self) -> Option<(usize, usize)> {
        let width = self.n.checked_mul(self.size)?;
        let extent = (self.height - 1)
            .checked_mul(self.pitch)
            .and_then(|rows| rows.checked_add(width))?;
        Some((width, extent))
    }
}

/// Resolves a memset's destination and makes its work (see [`prepare_copy`] for `replay`).
pub(crate) fn prepare_memset(
    st: &mut State,
    op: &str,
    dst: CUdeviceptr,
    f: &Fill,
    replay: Option<&str>,
) -> Res<Prepared> {
    let (width, extent) = f.extent().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let a = device_side(st, dst, extent, &described(op, replay))?;
    let offset = (dst - a.base) as usize;
    let buf = a.buf.clone();
    let f = *f;
    let work: Work = Box::new(move || {
        for row in 0..f.height {
            let p = buf.ptr().wrapping_add(offset + row * f.pitch);
            // SAFETY: every row lies in the allocation (checked against `extent`), which
            // `buf` keeps alive; rows are aligned to `size` (`dst` and `pitch` are).
            unsafe {
                if f.size == 4 {
                    engine::fill_u32(p, f.value, f.n)
                } else {
                    engine::fill_u8(p, f.value as u8, f.n)
                }
            }
        }
    });
    let p = Pattern {
        start: offset as u64,
        width: width as u64,
        pitch: f.pitch.max(width) as u64,
        height: f.height as u64,
    };
    Ok(Prepared {
        accesses: vec![(a, p, true)],
        work,
    })
}

fn memset(op: &'static str, dst: CUdeviceptr, f: Fill, stream: CUstream, mode: Mode) -> Res {
    if f.n == 0 || f.height == 0 {
        return Ok(());
    }
    let (width, extent) = f.extent().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !dst.is_multiple_of(f.size as u64)
        || (f.height > 1 && (f.pitch < width || !f.pitch.is_multiple_of(f.size)))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let waiter = {
        let mut st = state();
        if mode == Mode::Sync {
            st.check_capture_safe()?;
        }
        let i = st.stream(h(stream))?;
        if st.capturing(i)?.is_some() {
            if !matches!(st.memory.resolve(dst, extent), Resolved::Live(_)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            st.add_node(i, Node::Memset { op, dst, fill: f });
            return Ok(());
        }
        let p = prepare_memset(&mut st, op, dst, &f, None)?;
        let refs: Vec<_> = p.accesses.iter().map(|(a, p, w)| (a, *p, *w)).collect();
        st.enqueue(i, op, &refs, None, Some(p.work))?;
        (mode == Mode::Sync).then(|| st.waiter(i))
    };
    if let Some(w) = waiter {
        host_wait(vec![w]);
    }
    Ok(())
}

fn fill_1d(value: u32, size: usize, n: usize) -> Fill {
    Fill {
        value,
        size,
        n,
        pitch: n * size,
        height: 1,
    }
}

fn fill_2d(value: u32, size: usize, pitch: usize, n: usize, height: usize) -> Fill {
    Fill {
        value,
        size,
        n,
        pitch,
        height,
    }
}

const NULL_STREAM: CUstream = std::ptr::null_mut();

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

/// Static C strings for names and descriptions, made once per code.
fn c_string(key: (u32, bool), make: impl FnOnce() -> String) -> *const c_char {
    static STRINGS: LazyLock<Mutex<std::collections::HashMap<(u32, bool), &'static CStr>>> =
        LazyLock::new(Default::default);
    let mut map = engine::lock(&STRINGS);
    let s = map.entry(key).or_insert_with(|| {
        let text = std::ffi::CString::new(make()).unwrap_or_default();
        Box::leak(text.into_boxed_c_str())
    });
    s.as_ptr()
}

fn description(code: CUresult) -> String {
    match code {
        CUDA_SUCCESS => "no error".into(),
        CUDA_ERROR_INVALID_VALUE => "invalid argument".into(),
        CUDA_ERROR_OUT_OF_MEMORY => "out of memory".into(),
        CUDA_ERROR_NOT_INITIALIZED => "initialization error".into(),
        CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal".into(),
        CUDA_ERROR_INVALID_CONTEXT => "invalid device context".into(),
        CUDA_ERROR_INVALID_HANDLE => "invalid resource handle".into(),
        CUDA_ERROR_NOT_READY => "device not ready".into(),
        CUDA_ERROR_NOT_SUPPORTED => "operation not supported (by the CUDA simulator)".into(),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            "operation not permitted when stream is capturing".into()
        }
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
            "operation failed due to a previous error during capture".into()
        }
        other => format!("{other:?}"),
    }
}

driver! {
    fn cuGetErrorName(error: CUresult, p: *mut *const c_char) {
        let s = c_string((error as u32, false), || format!("{error:?}"));
        // SAFETY: an out-pointer.
        unsafe { out(p, s) }
    }

    fn cuGetErrorString(error: CUresult, p: *mut *const c_char) {
        let s = c_string((error as u32, true), || description(error));
        // SAFETY: an out-pointer.
        unsafe { out(p, s) }
    }
}
