//! The model's operations, as every driver face calls them: streams, events, capture and
//! graphs, memory, copies and memsets, host synchronization, peer access and error texts. A
//! face translates its handles, codes and out-parameters and calls these; none of them knows
//! which face called it. Each takes the [`Scope`] in which the special stream handles (NULL,
//! the per-thread stream) and the implicit context resolve.

use std::ffi::{CStr, c_char, c_void};
use std::sync::{LazyLock, Mutex};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemorytype, CUresult, CUstreamCaptureMode, CUstreamCaptureStatus,
};

use super::base::{Handle, Res, lock, unsupported};
use super::config::config;
use super::memory::Resolved;
use super::nodes::Node;
use super::prepare::{extent, host_is_pinned, prepare_copy, prepare_memset};
use super::request::{CopyRequest, Fill, Side};
use super::state::{
    self, DISABLE_TIMING, Event, Kind, LastRecord, NON_BLOCKING, Scope, State, state,
};
use super::stream::{self, Recorded, Waiter, Work};

use CUresult::*;

/// Marks the simulated driver initialized.
pub(crate) fn initialize() {
    state().initialized = true;
}

/// The number of devices.
pub(crate) fn device_count() -> Res<i32> {
    let st = state();
    st.check_init()?;
    Ok(st.devices)
}

/// Checks a device ordinal.
pub(crate) fn check_device(dev: i32) -> Res {
    state().check_device(dev)
}

/// The primary context of device `dev` (made on first use).
pub(crate) fn primary_context(dev: i32) -> Res<Handle> {
    state().scope_context(Scope::Device(dev))
}

/// The device of a live context.
pub(crate) fn context_device(ctx: Handle) -> Res<i32> {
    let st = state();
    st.check_init()?;
    Ok(st.context(ctx)?.device)
}

/// The bytes of device memory, all devices together.
pub(crate) fn total_memory(dev: i32) -> Res<usize> {
    check_device(dev)?;
    Ok(config().memory)
}

// ---------------------------------------------------------------------------------------------
// Contexts

/// Retains the primary context of `dev` (one per device, the same handle every time).
pub(crate) fn retain_primary(dev: i32) -> Res<Handle> {
    let mut st = state();
    st.check_device(dev)?;
    let ctx = st.primary(dev);
    st.contexts
        .get_mut(&ctx)
        .expect("made by primary()")
        .retained += 1;
    Ok(ctx)
}

/// Drops one retain of the primary context of `dev`; its state is kept when the count reaches
/// zero (`CUDA_ERROR_INVALID_CONTEXT` if it is not retained).
pub(crate) fn release_primary(dev: i32) -> Res {
    let mut st = state();
    st.check_device(dev)?;
    let ctx = st.primary(dev);
    let c = st.contexts.get_mut(&ctx).expect("made by primary()");
    if c.retained == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    c.retained -= 1;
    Ok(())
}

/// Whether the primary context of `dev` is retained (active).
pub(crate) fn primary_active(dev: i32) -> Res<bool> {
    let mut st = state();
    st.check_device(dev)?;
    let ctx = st.primary(dev);
    Ok(st.contexts[&ctx].retained > 0)
}

/// A context of `dev` that is not the primary one; it becomes the calling thread's current
/// context.
pub(crate) fn create_context(dev: i32) -> Res<Handle> {
    let mut st = state();
    st.check_device(dev)?;
    let ctx = st.create_context(dev);
    state::push_current(ctx);
    Ok(ctx)
}

/// Destroys a created context: its streams end (their pending work still completes), the
/// peer access to and from it is forgotten, and it stops being current on this thread.
pub(crate) fn destroy_context(ctx: Handle) -> Res {
    let workers = {
        let mut st = state();
        st.check_init()?;
        if st.context(ctx)?.primary {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        st.contexts.get_mut(&ctx).expect("checked").destroyed = true;
        st.forget_peers(ctx);
        st.end_context_streams(ctx)
    };
    for w in workers {
        let _ = w.join();
    }
    if state::current_raw() == Some(ctx) {
        state::pop_current();
    }
    Ok(())
}

/// The calling thread's current context, if any.
pub(crate) fn current_context() -> Res<Option<Handle>> {
    state().check_init()?;
    Ok(state::current_raw())
}

/// The calling thread's current context, which must be live (`CUDA_ERROR_INVALID_CONTEXT`).
pub(crate) fn live_current_context() -> Res<Handle> {
    state().current()
}

/// Replaces the top of the thread's context stack (`None` unbinds).
pub(crate) fn set_current_context(ctx: Option<Handle>) -> Res {
    let st = state();
    st.check_init()?;
    if let Some(c) = ctx {
        st.context(c)?;
    }
    state::set_current(ctx);
    Ok(())
}

/// Pushes a live context on the thread's context stack.
pub(crate) fn push_context(ctx: Handle) -> Res {
    let st = state();
    st.check_init()?;
    st.context(ctx)?;
    state::push_current(ctx);
    Ok(())
}

/// Pops the thread's current context (`CUDA_ERROR_INVALID_CONTEXT` with none).
pub(crate) fn pop_context() -> Res<Handle> {
    state().check_init()?;
    state::pop_current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The device of the current context.
pub(crate) fn current_device() -> Res<i32> {
    let st = state();
    let ctx = st.current()?;
    Ok(st.contexts[&ctx].device)
}

/// A context's id (`None`: the current context's): its handle.
pub(crate) fn context_id(ctx: Option<Handle>) -> Res<u64> {
    let st = state();
    let ctx = match ctx {
        Some(c) => c,
        None => st.current()?,
    };
    st.context(ctx)?;
    Ok(ctx as u64)
}

/// Waits without the global lock, then records the host's observation under it.
pub(crate) fn host_wait(waiters: Vec<Waiter>) {
    for w in &waiters {
        w.wait();
    }
    let mut st = state();
    for w in &waiters {
        st.observed(w);
    }
}

/// Waits for every stream of the context of `scope` (refused while a capture forbids
/// potentially unsafe calls).
pub(crate) fn synchronize(scope: Scope) -> Res {
    let waiters = {
        let mut st = state();
        let ctx = st.scope_context(scope)?;
        st.check_capture_safe()?;
        st.context_waiters(ctx)
    };
    host_wait(waiters);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Streams

/// A stream of the context of `scope`; flags 0 (blocking: synchronizes with the legacy default
/// stream) or [`NON_BLOCKING`].
pub(crate) fn create_stream(scope: Scope, flags: u32, priority: i32) -> Res<Handle> {
    if flags & !NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let ctx = st.scope_context(scope)?;
    let handle = st.handle();
    st.new_stream(ctx, Kind::Created { flags, priority }, handle);
    Ok(handle)
}

/// Destroys a created stream at once; work already enqueued still runs.
pub(crate) fn destroy_stream(scope: Scope, stream: Handle) -> Res {
    let worker = {
        let mut st = state();
        let i = st.stream_in(scope, stream)?;
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

/// A stream's creation flags (0 for the default streams).
pub(crate) fn stream_flags(scope: Scope, stream: Handle) -> Res<u32> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    Ok(match st.streams[i].kind {
        Kind::Created { flags, .. } => flags,
        _ => 0,
    })
}

/// A stream's context.
pub(crate) fn stream_context(scope: Scope, stream: Handle) -> Res<Handle> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    Ok(st.streams[i].ctx)
}

/// A stream's device.
pub(crate) fn stream_device(scope: Scope, stream: Handle) -> Res<i32> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    let ctx = st.streams[i].ctx;
    Ok(st.contexts[&ctx].device)
}

/// Blocks until the stream's work so far is done (the legacy default stream's includes the
/// blocking streams' earlier work). A capturing stream is
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated.
pub(crate) fn stream_synchronize(scope: Scope, stream: Handle) -> Res {
    let waiter = {
        let mut st = state();
        let i = st.stream_in(scope, stream)?;
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
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and its capture is invalidated; the legacy default
/// stream beside a capturing blocking stream is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and
/// invalidates that capture.
pub(crate) fn stream_query(scope: Scope, stream: Handle) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    if st.streams[i].capture.is_some() {
        st.invalidate_stream_capture(i);
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    st.check_implicit(i, true)?;
    let w = st.waiter(i);
    stream::ready(State::is_done(&w))?;
    st.observed(&w);
    Ok(())
}

/// Work enqueued on `stream` afterwards waits for the event's position at its last record (see
/// [`State::wait_event`] for captures; `external`: an event recorded outside the capture
/// becomes an event-wait node).
pub(crate) fn stream_wait_event(
    scope: Scope,
    stream: Handle,
    event: Handle,
    external: bool,
) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.wait_event(i, event, external)
}

/// A host function, as the driver calls it.
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);

/// Runs `f(user_data)` on the stream's thread, in stream order; on a capturing stream, a host
/// node of the graph, called at each launch.
pub(crate) fn launch_host_func(scope: Scope, stream: Handle, f: HostFn, data: usize) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    if st.capturing(i)?.is_some() {
        st.add_node(i, Node::Host { f, data });
        return Ok(());
    }
    // SAFETY: the caller's host function and its argument (driver API contract).
    let work: Work = Box::new(move || unsafe { f(data as *mut c_void) });
    st.enqueue(i, "cuLaunchHostFunc", &[], None, Some(work))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Capture and graphs

/// A stream's capture status. The legacy default stream while a blocking stream of its
/// context is capturing is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the capture is not
/// invalidated).
pub(crate) fn capture_status(scope: Scope, stream: Handle) -> Res<CUstreamCaptureStatus> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.check_implicit(i, false)?;
    Ok(st.capture_status(i))
}

/// A stream's capture: status, the capture sequence's id (0 with none) and the graph being
/// built (0 unless active).
pub(crate) fn capture_info(
    scope: Scope,
    stream: Handle,
) -> Res<(CUstreamCaptureStatus, u64, Handle)> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.check_implicit(i, false)?;
    let status = st.capture_status(i);
    let (id, graph) = match st.streams[i].capture {
        Some(id) if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {
            (id, st.captures[&id].graph)
        }
        Some(id) => (id, 0),
        None => (0, 0),
    };
    Ok((status, id, graph))
}

/// Begins a capture on `stream` in `mode`.
pub(crate) fn begin_capture(scope: Scope, stream: Handle, mode: CUstreamCaptureMode) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.begin_capture(i, mode)
}

/// Ends the capture begun on `stream`, for every stream in it, and returns its graph. See
/// [`ends_with_null_graph`] for the errors after which the caller's graph is NULL.
pub(crate) fn end_capture(scope: Scope, stream: Handle) -> Res<Handle> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.end_capture(i)
}

/// Whether an error of [`end_capture`] ended the capture (the graph returned is NULL):
/// invalidated, or a stream that joined was not joined back.
pub(crate) fn ends_with_null_graph(e: CUresult) -> bool {
    matches!(
        e,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
    )
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`: auto-free on launch, upload, device launch, node priority.
const INSTANTIATE_AUTO_FREE: u64 = 0x1;
const INSTANTIATE_KNOWN: u64 = 0x1 | 0x2 | 0x4 | 0x8;
const INSTANTIATE_DEVICE_LAUNCH: u64 = 0x4;

/// Instantiates `graph` with `flags`: auto-free on launch and node priorities have no effect
/// (no graph memory nodes, no concurrency), an upload has nothing to do; device launch is not
/// modelled (`CUDA_ERROR_NOT_SUPPORTED`), and `CUDA_ERROR_INVALID_VALUE` with auto-free.
pub(crate) fn instantiate(graph: Handle, flags: u64) -> Res<Handle> {
    if flags & !INSTANTIATE_KNOWN != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
        if flags & INSTANTIATE_AUTO_FREE != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        unsupported("CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let mut st = state();
    st.check_init()?;
    st.instantiate(graph)
}

/// Destroys a graph from [`end_capture`]; executable graphs made from it stay usable.
pub(crate) fn destroy_graph(graph: Handle) -> Res {
    match state().graphs.remove(&graph) {
        Some(_) => Ok(()),
        None => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Destroys an executable graph; launches already enqueued still run.
pub(crate) fn destroy_exec(exec: Handle) -> Res {
    match state().execs.remove(&exec) {
        Some(_) => Ok(()),
        None => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Enqueues an executable graph's nodes on `stream` ([`State::launch`]).
pub(crate) fn launch_graph(scope: Scope, exec: Handle, stream: Handle) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    st.launch(exec, i)
}

/// Checks the handles of an upload; there is nothing to upload to a simulated device.
pub(crate) fn upload_graph(scope: Scope, exec: Handle, stream: Handle) -> Res {
    let mut st = state();
    st.stream_in(scope, stream)?;
    if st.execs.contains_key(&exec) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// An event of the context of `scope`; flags as `CU_EVENT_*` (4 bits).
pub(crate) fn create_event(scope: Scope, flags: u32) -> Res<Handle> {
    if flags & !0xF != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let ctx = st.scope_context(scope)?;
    let handle = st.handle();
    st.events.insert(
        handle,
        Event {
            ctx,
            flags,
            last: LastRecord::Never,
        },
    );
    Ok(handle)
}

/// Records an event on a stream of its own context (`CUDA_ERROR_INVALID_HANDLE` otherwise);
/// `external`: on a capturing stream, an event-record node.
pub(crate) fn record_event(scope: Scope, event: Handle, stream: Handle, external: bool) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    let ctx = st.events.get(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?.ctx;
    if ctx != st.streams[i].ctx {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    st.record_event(i, event, external)
}

/// The position an event was last recorded at (`None`: never recorded), for a host query or
/// wait: `CUDA_ERROR_CAPTURED_EVENT` for an event last recorded in a stream capture
/// (invalidated if still under way), and refused while a stream capture forbids potentially
/// unsafe calls.
fn recorded_for_host(st: &mut State, event: Handle) -> Res<Option<Recorded>> {
    st.check_init()?;
    let last = st
        .events
        .get(&event)
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

/// `CUDA_SUCCESS` once the recorded position has completed (or if never recorded).
pub(crate) fn query_event(event: Handle) -> Res {
    let mut st = state();
    if let Some(r) = recorded_for_host(&mut st, event)? {
        let w = State::event_waiter(&r);
        stream::ready(State::is_done(&w))?;
        st.observed(&w);
    }
    Ok(())
}

/// Blocks until the recorded position has completed.
pub(crate) fn synchronize_event(event: Handle) -> Res {
    let waiter = recorded_for_host(&mut state(), event)?.map(|r| State::event_waiter(&r));
    if let Some(w) = waiter {
        host_wait(vec![w]);
    }
    Ok(())
}

/// Destroys at once; waits already enqueued on it keep their position.
pub(crate) fn destroy_event(event: Handle) -> Res {
    let mut st = state();
    st.check_init()?;
    st.events.remove(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}

/// Milliseconds between the completions of two recorded events (host clock).
pub(crate) fn elapsed_time(start: Handle, end: Handle) -> Res<f32> {
    let st = state();
    let stamp = |e: Handle| -> Res<Option<std::time::Instant>> {
        let ev = st.events.get(&e).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if ev.flags & DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match &ev.last {
            LastRecord::Stream(r) => Ok(*lock(&r.done_at)),
            LastRecord::Capture { .. } => Err(CUDA_ERROR_CAPTURED_EVENT),
            LastRecord::Never => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    };
    let (Some(a), Some(b)) = (stamp(start)?, stamp(end)?) else {
        return Err(CUDA_ERROR_NOT_READY);
    };
    Ok(if b >= a {
        (b - a).as_secs_f32() * 1e3
    } else {
        -((a - b).as_secs_f32() * 1e3)
    })
}

// ---------------------------------------------------------------------------------------------
// Memory

/// Device memory of the device of `scope`, zeroed, 256-byte aligned; refused while a capture
/// forbids potentially unsafe calls.
pub(crate) fn alloc(scope: Scope, bytes: usize) -> Res<u64> {
    let mut st = state();
    let ctx = st.scope_context(scope)?;
    st.check_capture_safe()?;
    st.alloc(bytes, ctx, None)
}

/// Stream-ordered allocation: work not ordered after this point of `stream` that touches the
/// memory is a violation. On a capturing stream (graph memory nodes), not modelled:
/// `CUDA_ERROR_NOT_SUPPORTED`, and the capture is invalidated.
pub(crate) fn alloc_async(scope: Scope, bytes: usize, stream: Handle, op: &str) -> Res<u64> {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    refuse_in_capture(&mut st, i, op)?;
    let ctx = st.streams[i].ctx;
    st.alloc(bytes, ctx, Some(i))
}

/// A host-side free: every access to the memory must be ordered before the host's current
/// position (a synchronization), or it is a violation.
pub(crate) fn free(p: CUdeviceptr, op: &str) -> Res {
    let mut st = state();
    st.check_init()?;
    st.check_capture_safe()?;
    st.free(p, None, op)
}

/// A host-side free that first waits for every stream of the context of `scope`, as HIP's
/// `hipFree` and `hipHostFree` do ("an implicit hipDeviceSynchronize()", `hip_runtime_api.h`):
/// the wait is refused while a capture forbids potentially unsafe calls, as
/// [`synchronize`]'s; `pinned` frees pinned host memory rather than device memory.
pub(crate) fn free_after_synchronize(scope: Scope, p: u64, pinned: bool, op: &str) -> Res {
    synchronize(scope)?;
    if pinned {
        free_host(p as usize)
    } else {
        free(p, op)
    }
}

/// A stream-ordered free: every access must be ordered before this point of `stream`. On a
/// capturing stream, not modelled, as for [`alloc_async`].
pub(crate) fn free_async(scope: Scope, p: CUdeviceptr, stream: Handle, op: &str) -> Res {
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    refuse_in_capture(&mut st, i, op)?;
    st.free(p, Some(i), op)
}

/// Free and total device memory, as seen from the context of `scope`.
pub(crate) fn memory_info(scope: Scope) -> Res<(usize, usize)> {
    let mut st = state();
    st.scope_context(scope)?;
    let total = config().memory;
    Ok((total - st.memory.used, total))
}

/// Stream-ordered allocation in a stream capture (graph memory nodes) is not modelled:
/// `CUDA_ERROR_NOT_SUPPORTED` on a capturing stream, which invalidates its capture.
fn refuse_in_capture(st: &mut State, i: usize, op: &str) -> Res {
    st.check_implicit(i, true)?;
    if st.streams[i].capture.is_some() {
        unsupported(&format!("{op} in a stream capture"));
        st.invalidate_stream_capture(i);
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// Pinned host memory of the context of `scope`: copies to and from it are asynchronous.
pub(crate) fn alloc_host(scope: Scope, bytes: usize) -> Res<usize> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let ctx = st.scope_context(scope)?;
    let device = st.contexts[&ctx].device;
    st.memory.alloc_pinned(bytes, ctx, device)
}

/// Frees pinned host memory.
pub(crate) fn free_host(p: usize) -> Res {
    state().memory.free_pinned(p)
}

/// What the model knows of a pointer: the allocation (device or pinned host memory) it is in.
pub(crate) struct PointerInfo {
    pub(crate) ctx: Handle,
    pub(crate) device: i32,
    pub(crate) memory_type: CUmemorytype,
    pub(crate) start: u64,
    pub(crate) len: usize,
    pub(crate) id: u64,
}

/// The allocation `p` points into: `None` for memory the model does not know (pageable host
/// memory, freed or never allocated device addresses).
pub(crate) fn pointer_info(p: CUdeviceptr) -> Res<Option<PointerInfo>> {
    let st = state();
    st.check_init()?;
    Ok(find_pointer(&st, p))
}

fn find_pointer(st: &State, p: CUdeviceptr) -> Option<PointerInfo> {
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

// ---------------------------------------------------------------------------------------------
// Peer access

/// Whether device `dev` can access the memory of device `peer` directly (0 for a device with
/// itself; `CUDA_SIM_NO_PEER`).
pub(crate) fn can_access_peer(dev: i32, peer: i32) -> Res<bool> {
    let st = state();
    st.check_device(dev)?;
    st.check_device(peer)?;
    Ok(config().no_peer.can_access(dev, peer))
}

/// Enables access from context `from` to the memory of context `to` (one way): errors as
/// `cuCtxEnablePeerAccess` documents them.
pub(crate) fn enable_peer_access(from: Handle, to: Handle, flags: u32) -> Res {
    let mut st = state();
    st.check_init()?;
    st.context(from)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let to_device = st.context(to)?.device;
    if to == from {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let from_device = st.contexts[&from].device;
    if !config().no_peer.can_access(from_device, to_device) {
        return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    }
    if !st.peers.insert((from, to)) {
        return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    }
    Ok(())
}

/// Disables the access from `from` to `to` that [`enable_peer_access`] enabled.
pub(crate) fn disable_peer_access(from: Handle, to: Handle) -> Res {
    let mut st = state();
    st.check_init()?;
    st.context(from)?;
    st.context(to)?;
    if !st.peers.remove(&(from, to)) {
        return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Misuse reports, texts

/// Violations found since the start or the last [`reset`].
pub(crate) fn violations() -> u64 {
    state().checker.count()
}

/// Forgets the violations found so far and the operation counts.
pub(crate) fn reset() {
    let mut st = state();
    st.checker.reset();
    st.operations.clear();
}

/// How many operations named `name` streams were given since the start or the last [`reset`].
pub(crate) fn operations(name: &str) -> u64 {
    state().operations.get(name).copied().unwrap_or(0)
}

/// The report of the violations, one per line.
pub(crate) fn report() -> String {
    state().checker.report()
}

/// Reports a misuse that no driver call refused (the checker counts it as a violation).
pub(crate) fn report_misuse(what: String) {
    state().checker.misuse(what);
}

/// Which text of a code: the face (0 CUDA, 1 HIP), the code, and whether its description.
type TextKey = (u8, u32, bool);

/// A static C string, made once per `key`.
pub(crate) fn c_string(key: TextKey, make: impl FnOnce() -> String) -> *const c_char {
    static STRINGS: LazyLock<Mutex<std::collections::HashMap<TextKey, &'static CStr>>> =
        LazyLock::new(Default::default);
    let mut map = lock(&STRINGS);
    let s = map.entry(key).or_insert_with(|| {
        let text = std::ffi::CString::new(make()).unwrap_or_default();
        Box::leak(text.into_boxed_c_str())
    });
    s.as_ptr()
}

/// What an error code means, in the driver's words.
pub(crate) fn description(code: CUresult) -> String {
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

// ---------------------------------------------------------------------------------------------
// Copies and memsets

/// How the host relates to a copy's completion.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Stream-ordered; the host goes on.
    Async,
    /// The host waits for the copy, and is ordered after it (`cuMemcpy*` without `Async`).
    Sync,
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

/// A copy on stream `stream` (a handle, resolved in `scope`): synchronous (`Mode::Sync`: refused
/// while a capture forbids potentially unsafe calls, and the host waits for it) or stream-ordered;
/// on a capturing stream, a copy node of the capture's graph.
pub(crate) fn copy(
    scope: Scope,
    op: &'static str,
    r: CopyRequest,
    stream: Handle,
    mode: Mode,
) -> Res {
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
        let i = st.stream_in(scope, stream)?;
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

/// Checks the two sides of a peer copy, named with the devices their memory should be on: each
/// pointer that is memory of another device is reported as a misuse (the copy still runs).
pub(crate) fn check_peer_copy(
    op: &str,
    dst: CUdeviceptr,
    dst_device: i32,
    src: CUdeviceptr,
    src_device: i32,
    bytes: usize,
) -> Res {
    let mut st = state();
    st.check_init()?;
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

/// A unified-addressing pointer: device memory if the range table knows it, else host.
pub(crate) fn side_of(p: CUdeviceptr) -> Side {
    let st = state();
    if st.memory.is_device_address(p) {
        Side::Device(p)
    } else {
        Side::Host(p as usize)
    }
}

/// A memset on stream `stream` (a handle, resolved in `scope`), as [`copy`].
pub(crate) fn memset(
    scope: Scope,
    op: &'static str,
    dst: CUdeviceptr,
    f: Fill,
    stream: Handle,
    mode: Mode,
) -> Res {
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
        let i = st.stream_in(scope, stream)?;
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
