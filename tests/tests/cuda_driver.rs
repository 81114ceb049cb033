//! Conformance tests of the CUDA driver API semantics that the DLPack hand-off relies on: the
//! stream position an event captures, never-recorded and re-recorded events, not-ready queries,
//! the legacy and per-thread default streams against blocking and non-blocking streams, the
//! per-thread context stack, pointer attributes, stream capture into graphs and their launch,
//! copies and memsets, PTX modules and kernel launches (their order and geometry checks: the
//! simulator runs no kernel body, so no test here reads a kernel's values), error codes and
//! context synchronization, and peer access and copies between two devices (module `peer`:
//! skipped, with a word on stderr, where the driver has one device).
//!
//! Written against the driver API only (cudarc's raw `sys` functions), with no branch for any
//! particular driver: the test command runs it on the CUDA simulator (`cuda-sim`, a stand-in
//! `libcuda.so`), and `scripts/gpu-suite.sh` runs the same tests on a real GPU, so the
//! simulator's model is checked against hardware whenever one is lent. Pending work is made with
//! [`Gate`]s (host functions that hold a stream until released), never by timing.
#![cfg(feature = "cuda")]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, sys};
use sys::CUresult;
use sys::CUstreamCaptureMode::{
    CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
};
use sys::CUstreamCaptureStatus::{
    CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_INVALIDATED,
    CU_STREAM_CAPTURE_STATUS_NONE,
};
use sys::cudaError_enum::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_READY as NOT_READY, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED, CUDA_SUCCESS as SUCCESS,
};

#[path = "cuda_driver/peer.rs"]
mod peer;

/// Elements (`u32`) of the test buffers.
const N: usize = 256;

const NEEDS_DRIVER: &str =
    "needs a CUDA driver: the CUDA simulator on the library path (scripts/cuda-sim.sh) or a GPU";

fn ctx() -> Arc<CudaContext> {
    // SAFETY: probing only (cudarc would panic with a list of library names instead).
    assert!(unsafe { sys::is_culib_present() }, "{NEEDS_DRIVER}");
    CudaContext::new(0).expect(NEEDS_DRIVER)
}

fn device_count() -> usize {
    let count = CudaContext::device_count().expect("cuDeviceGetCount");
    usize::try_from(count).expect("a non-negative device count")
}

#[track_caller]
fn ok(result: CUresult, what: &str) {
    assert_eq!(result, SUCCESS, "{what}");
}

/// A stream handle: one from `cuStreamCreate` (destroyed on drop) or a special handle.
struct Stream {
    raw: sys::CUstream,
    owned: bool,
}

impl Stream {
    fn create(flags: sys::CUstream_flags) -> Self {
        let mut raw = null_mut();
        // SAFETY: the out-pointer is a live local; the flags are a valid flag set.
        let result = unsafe { sys::cuStreamCreate(&mut raw, flags as u32) };
        ok(result, "cuStreamCreate");
        Self { raw, owned: true }
    }

    /// A stream that synchronizes with the legacy default stream (`CU_STREAM_DEFAULT`).
    fn blocking() -> Self {
        Self::create(sys::CUstream_flags::CU_STREAM_DEFAULT)
    }

    fn non_blocking() -> Self {
        Self::create(sys::CUstream_flags::CU_STREAM_NON_BLOCKING)
    }

    fn special(handle: usize) -> Self {
        let raw = std::ptr::without_provenance_mut(handle);
        Self { raw, owned: false }
    }

    /// `CU_STREAM_LEGACY`, the legacy default stream.
    fn legacy() -> Self {
        Self::special(0x1)
    }

    /// The NULL handle: the legacy default stream too (the driver API's default build).
    fn null() -> Self {
        Self::special(0)
    }

    /// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
    fn per_thread() -> Self {
        Self::special(0x2)
    }

    /// Holds the stream until the gate is released (or dropped).
    fn gate(&self) -> Gate {
        // SAFETY: the handle is live or special, with a current context.
        unsafe { Gate::hold_raw(self.raw) }
    }

    fn query(&self) -> CUresult {
        // SAFETY: the handle is live or special.
        unsafe { sys::cuStreamQuery(self.raw) }
    }

    fn sync(&self) -> CUresult {
        // SAFETY: the handle is live or special.
        unsafe { sys::cuStreamSynchronize(self.raw) }
    }

    /// Enqueues `cuMemsetD32Async` of all of `buf` to `value`.
    fn fill(&self, buf: &DevBuf, value: u32) {
        // SAFETY: `buf` is a live allocation of `words()` `u32`s.
        let result = unsafe { sys::cuMemsetD32Async(buf.ptr, value, buf.words(), self.raw) };
        ok(result, "cuMemsetD32Async");
    }

    /// Enqueues a copy of all of `src` into `dst` (of the same size).
    fn copy(&self, dst: &DevBuf, src: &DevBuf) {
        assert_eq!(dst.bytes, src.bytes);
        // SAFETY: both are live allocations of `bytes` bytes.
        let result = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, src.bytes, self.raw) };
        ok(result, "cuMemcpyDtoDAsync");
    }

    /// Makes the stream wait for `event`'s last recorded position.
    fn wait(&self, event: &Event) {
        // SAFETY: both handles are live (or the stream's is special).
        let result = unsafe { sys::cuStreamWaitEvent(self.raw, event.0, 0) };
        ok(result, "cuStreamWaitEvent");
    }

    /// Reads `buf` back on this stream (`cuMemcpyDtoHAsync`, then `cuStreamSynchronize`).
    fn read(&self, buf: &DevBuf) -> Vec<u32> {
        self.read_into(vec![0u32; buf.words()], buf.ptr)
    }

    fn read_bytes(&self, buf: &DevBuf) -> Vec<u8> {
        self.read_into(vec![0u8; buf.bytes], buf.ptr)
    }

    fn read_into<T>(&self, mut out: Vec<T>, src: sys::CUdeviceptr) -> Vec<T> {
        let bytes = std::mem::size_of_val(&out[..]);
        let dst = out.as_mut_ptr().cast();
        // SAFETY: `out` has room for `bytes` bytes and is not freed while the copy may be
        // pending: it is returned after the stream is synchronized, and leaked if that fails.
        let result = unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.raw) };
        ok(result, "cuMemcpyDtoHAsync");
        let result = self.sync();
        if result != SUCCESS {
            std::mem::forget(out);
            panic!("cuStreamSynchronize after a read: {result:?}");
        }
        out
    }

    fn context(&self) -> sys::CUcontext {
        let mut context = null_mut();
        // SAFETY: the handle is live or special; the out-pointer is a live local.
        ok(
            unsafe { sys::cuStreamGetCtx(self.raw, &mut context) },
            "cuStreamGetCtx",
        );
        context
    }

    fn capture_status(&self) -> sys::CUstreamCaptureStatus {
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the handle is live; the out-pointer is a live local.
        let result = unsafe { sys::cuStreamIsCapturing(self.raw, &mut status) };
        ok(result, "cuStreamIsCapturing");
        status
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the stream was created by `Stream::create` and is destroyed once; pending
        // work still completes after `cuStreamDestroy`.
        let result = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        if !thread::panicking() {
            ok(result, "cuStreamDestroy");
        }
    }
}

/// An event from `cuEventCreate` (timing disabled), destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Self {
        let mut event = null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the out-pointer is a live local.
        ok(
            unsafe { sys::cuEventCreate(&mut event, flags) },
            "cuEventCreate",
        );
        Self(event)
    }

    fn record(&self, stream: &Stream) {
        // SAFETY: both handles are live (or the stream's is special).
        ok(
            unsafe { sys::cuEventRecord(self.0, stream.raw) },
            "cuEventRecord",
        );
    }

    fn query(&self) -> CUresult {
        // SAFETY: the event is live.
        unsafe { sys::cuEventQuery(self.0) }
    }

    fn sync(&self) -> CUresult {
        // SAFETY: the event is live.
        unsafe { sys::cuEventSynchronize(self.0) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event was created by `Event::new` and is destroyed once.
        let result = unsafe { sys::cuEventDestroy_v2(self.0) };
        if !thread::panicking() {
            ok(result, "cuEventDestroy");
        }
    }
}

/// Device memory from `cuMemAlloc` (in the current context), freed on drop. Tests declare
/// their buffers before their gates: locals drop in reverse order, so the gates open before a
/// free (which may wait for the device).
struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DevBuf {
    fn with_bytes(bytes: usize) -> Self {
        let mut ptr = 0;
        // SAFETY: the out-pointer is a live local.
        ok(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc");
        Self { ptr, bytes }
    }

    /// Room for `n` `u32`s.
    fn new(n: usize) -> Self {
        Self::with_bytes(n * 4)
    }

    fn words(&self) -> usize {
        self.bytes / 4
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: the allocation is freed once; every test synchronizes its work before it ends.
        let result = unsafe { sys::cuMemFree_v2(self.ptr) };
        if !thread::panicking() {
            ok(result, "cuMemFree");
        }
    }
}

fn current_context() -> sys::CUcontext {
    let mut context = null_mut();
    // SAFETY: the out-pointer is a live local.
    ok(
        unsafe { sys::cuCtxGetCurrent(&mut context) },
        "cuCtxGetCurrent",
    );
    context
}

fn push_context(context: sys::CUcontext) {
    // SAFETY: `context` is live (the caller holds a `CudaContext` retaining it).
    ok(
        unsafe { sys::cuCtxPushCurrent_v2(context) },
        "cuCtxPushCurrent",
    );
}

fn pop_context() -> Result<sys::CUcontext, CUresult> {
    let mut context = null_mut();
    // SAFETY: the out-pointer is a live local.
    match unsafe { sys::cuCtxPopCurrent_v2(&mut context) } {
        SUCCESS => Ok(context),
        error => Err(error),
    }
}

fn pointer_ordinal(ptr: sys::CUdeviceptr) -> Result<c_int, CUresult> {
    let mut ordinal: c_int = -1;
    let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: DEVICE_ORDINAL writes an `int` to a live local; `ptr` is only looked up.
    match unsafe { sys::cuPointerGetAttribute((&raw mut ordinal).cast(), attribute, ptr) } {
        SUCCESS => Ok(ordinal),
        error => Err(error),
    }
}

fn pointer_context(ptr: sys::CUdeviceptr) -> sys::CUcontext {
    let mut context: sys::CUcontext = null_mut();
    let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT;
    // SAFETY: CONTEXT writes a `CUcontext` to a live local; `ptr` is only looked up.
    let result = unsafe { sys::cuPointerGetAttribute((&raw mut context).cast(), attribute, ptr) };
    ok(result, "cuPointerGetAttribute(CONTEXT)");
    context
}

fn pointer_memory_type(ptr: sys::CUdeviceptr) -> u32 {
    let mut memory_type: u32 = 0;
    let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let out = (&raw mut memory_type).cast();
    // SAFETY: MEMORY_TYPE writes an `unsigned int` to a live local; `ptr` is only looked up.
    let result = unsafe { sys::cuPointerGetAttribute(out, attribute, ptr) };
    ok(result, "cuPointerGetAttribute(MEMORY_TYPE)");
    memory_type
}

#[test]
fn an_event_captures_its_streams_position_at_record_time() {
    let _ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let (buf, snapshot) = (DevBuf::new(N), DevBuf::new(N));
    let (a, b) = (Stream::non_blocking(), Stream::non_blocking());
    let event = Event::new();
    a.fill(&buf, 0);
    b.fill(&snapshot, 0xFFFF_FFFF);

    // A: gate 1, write 1, record, gate 2, write 2. B: wait for the record, copy.
    let first = a.gate();
    a.fill(&buf, 1);
    event.record(&a);
    let second = a.gate();
    a.fill(&buf, 2);
    b.wait(&event);
    b.copy(&snapshot, &buf);
    assert_eq!(b.query(), NOT_READY, "B waits for the record");

    first.release();
    // B completes while A is still held at the second gate.
    ok(b.sync(), "B after the first gate");
    assert_eq!(event.query(), SUCCESS, "the recorded position is reached");
    assert_eq!(a.query(), NOT_READY, "A is held at the second gate");

    second.release();
    ok(a.sync(), "A after the second gate");
    assert_eq!(
        b.read(&snapshot),
        vec![1; N],
        "B copied before the second write"
    );
    assert_eq!(a.read(&buf), vec![2; N]);
}

#[test]
fn rerecording_an_event_leaves_earlier_waits_on_the_old_position() {
    let _ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let (buf, before, after) = (DevBuf::new(N), DevBuf::new(N), DevBuf::new(N));
    let (a, b, c) = (
        Stream::non_blocking(),
        Stream::non_blocking(),
        Stream::non_blocking(),
    );
    let event = Event::new();
    a.fill(&buf, 0);
    b.fill(&before, 0xFFFF_FFFF);
    c.fill(&after, 0xFFFF_FFFF);

    let first = a.gate();
    a.fill(&buf, 1);
    event.record(&a);
    b.wait(&event);
    b.copy(&before, &buf);
    let second = a.gate();
    a.fill(&buf, 2);
    event.record(&a);
    c.wait(&event);
    c.copy(&after, &buf);

    first.release();
    // The wait enqueued before the re-record is for the old position only.
    ok(b.sync(), "B after the first gate");
    assert_eq!(c.query(), NOT_READY, "a later wait is for the new position");
    assert_eq!(event.query(), NOT_READY, "the event is the new position");

    second.release();
    ok(c.sync(), "C after the second gate");
    assert_eq!(event.query(), SUCCESS);
    assert_eq!(b.read(&before), vec![1; N]);
    assert_eq!(c.read(&after), vec![2; N]);
}

#[test]
fn a_never_recorded_event_counts_as_complete() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let stream = Stream::non_blocking();
    let event = Event::new();

    assert_eq!(event.query(), SUCCESS, "cuEventQuery");
    ok(event.sync(), "cuEventSynchronize");
    stream.wait(&event);
    stream.fill(&buf, 5);
    ok(stream.sync(), "a wait for a never-recorded event");
    assert_eq!(stream.read(&buf), vec![5; N]);
    if let Some(c) = &checker {
        c.assert_clean("never-recorded event");
    }
}

#[test]
fn a_stream_and_an_event_behind_a_gate_are_not_ready_until_it_opens() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let stream = Stream::non_blocking();
    let event = Event::new();

    let gate = stream.gate();
    stream.fill(&buf, 3);
    event.record(&stream);
    assert_eq!(stream.query(), NOT_READY, "cuStreamQuery behind a gate");
    assert_eq!(event.query(), NOT_READY, "cuEventQuery behind a gate");

    gate.release();
    ok(stream.sync(), "cuStreamSynchronize after the gate");
    assert_eq!(stream.query(), SUCCESS);
    assert_eq!(event.query(), SUCCESS);
    ok(event.sync(), "cuEventSynchronize after the gate");
    assert_eq!(stream.read(&buf), vec![3; N]);
    if let Some(c) = &checker {
        c.assert_clean("not-ready queries");
    }
}

#[test]
fn the_legacy_default_stream_waits_for_blocking_streams() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let (legacy, blocking) = (Stream::legacy(), Stream::blocking());

    let gate = blocking.gate();
    legacy.fill(&buf, 7);
    assert_eq!(
        legacy.query(),
        NOT_READY,
        "legacy work waits for the blocking stream"
    );
    assert_eq!(
        Stream::null().query(),
        NOT_READY,
        "NULL is the legacy stream"
    );

    gate.release();
    ok(legacy.sync(), "the legacy stream after the gate");
    assert_eq!(Stream::null().query(), SUCCESS);
    assert_eq!(legacy.read(&buf), vec![7; N]);
    if let Some(c) = &checker {
        c.assert_clean("legacy stream after a blocking stream");
    }
}

#[test]
fn the_legacy_default_stream_does_not_wait_for_non_blocking_streams() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let (held, buf) = (DevBuf::new(N), DevBuf::new(N));
    let (legacy, non_blocking) = (Stream::legacy(), Stream::non_blocking());

    let gate = non_blocking.gate();
    non_blocking.fill(&held, 3);
    legacy.fill(&buf, 9);
    // This would never return (the gate opens below) if the legacy stream waited.
    ok(
        legacy.sync(),
        "the legacy stream while the non-blocking one is held",
    );
    assert_eq!(non_blocking.query(), NOT_READY);

    gate.release();
    ok(
        non_blocking.sync(),
        "the non-blocking stream after the gate",
    );
    assert_eq!(legacy.read(&buf), vec![9; N]);
    assert_eq!(non_blocking.read(&held), vec![3; N]);
    if let Some(c) = &checker {
        c.assert_clean("legacy stream beside a non-blocking stream");
    }
}

#[test]
fn blocking_streams_wait_for_earlier_legacy_work_and_non_blocking_streams_do_not() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let (after_legacy, independent) = (DevBuf::new(N), DevBuf::new(N));
    let legacy = Stream::legacy();
    let (blocking, non_blocking) = (Stream::blocking(), Stream::non_blocking());
    blocking.fill(&after_legacy, 0);
    non_blocking.fill(&independent, 0);
    ok(blocking.sync(), "initial fill");
    ok(non_blocking.sync(), "initial fill");

    let gate = legacy.gate();
    blocking.fill(&after_legacy, 5);
    non_blocking.fill(&independent, 6);
    ok(
        non_blocking.sync(),
        "a non-blocking stream while the legacy one is held",
    );
    assert_eq!(
        blocking.query(),
        NOT_READY,
        "blocking work waits for legacy work"
    );
    assert_eq!(legacy.query(), NOT_READY);

    gate.release();
    ok(blocking.sync(), "the blocking stream after the gate");
    ok(legacy.sync(), "the legacy stream after the gate");
    assert_eq!(blocking.read(&after_legacy), vec![5; N]);
    assert_eq!(non_blocking.read(&independent), vec![6; N]);
    if let Some(c) = &checker {
        c.assert_clean("blocking and non-blocking streams after legacy work");
    }
}

#[test]
fn the_per_thread_default_stream_belongs_to_its_thread() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let (theirs, mine) = (DevBuf::new(N), DevBuf::new(N));
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();

    thread::scope(|scope| {
        let go = go_tx; // moved in, so that a panic here unblocks the other thread
        let (ctx, theirs) = (&ctx, &theirs);
        let other = scope.spawn(move || {
            ctx.bind_to_thread().expect("bind the context");
            let stream = Stream::per_thread();
            let gate = stream.gate();
            stream.fill(theirs, 1);
            held_tx.send(()).expect("report the gate");
            go_rx.recv().expect("wait for the test thread");
            let while_held = stream.query();
            gate.release();
            ok(
                stream.sync(),
                "the other thread's per-thread stream after its gate",
            );
            while_held
        });
        held_rx
            .recv()
            .expect("the other thread holds its per-thread stream");

        ctx.bind_to_thread().expect("bind the context");
        let stream = Stream::per_thread();
        stream.fill(&mine, 2);
        // This thread's per-thread stream is not the held one.
        ok(stream.sync(), "this thread's per-thread stream");
        assert_eq!(stream.query(), SUCCESS);
        assert_eq!(stream.context(), ctx.cu_ctx(), "cuStreamGetCtx(0x2)");

        go.send(()).expect("release the other thread");
        let while_held = other.join().expect("the other thread");
        assert_eq!(while_held, NOT_READY, "the other thread's was held");
    });
    let stream = Stream::per_thread();
    assert_eq!(stream.read(&theirs), vec![1; N]);
    assert_eq!(stream.read(&mine), vec![2; N]);
}

#[test]
fn the_context_stack_is_per_thread_and_pops_back_to_the_previous_context() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    thread::scope(|scope| {
        scope.spawn(|| {
            let primary = ctx.cu_ctx();
            ctx.bind_to_thread().expect("bind the context");
            assert_eq!(current_context(), primary);
            // SAFETY: NULL unbinds the calling thread's context.
            ok(
                unsafe { sys::cuCtxSetCurrent(null_mut()) },
                "cuCtxSetCurrent(NULL)",
            );
            assert!(current_context().is_null(), "after cuCtxSetCurrent(NULL)");
            assert_eq!(
                pop_context(),
                Err(CUDA_ERROR_INVALID_CONTEXT),
                "empty stack"
            );

            push_context(primary);
            assert_eq!(current_context(), primary, "the pushed context is current");
            let mut device: sys::CUdevice = -1;
            // SAFETY: the out-pointer is a live local.
            ok(
                unsafe { sys::cuCtxGetDevice(&mut device) },
                "cuCtxGetDevice",
            );
            assert_eq!(device, ctx.cu_device());
            push_context(primary);
            assert_eq!(pop_context(), Ok(primary));
            assert_eq!(current_context(), primary, "one push is left");

            let other = scope.spawn(|| {
                assert!(current_context().is_null(), "a new thread has no context");
                push_context(ctx.cu_ctx());
                assert_eq!(current_context(), ctx.cu_ctx());
                assert_eq!(pop_context(), Ok(ctx.cu_ctx()));
                assert!(current_context().is_null());
            });
            other.join().expect("the other thread");
            assert_eq!(
                current_context(),
                primary,
                "not changed by the other thread"
            );

            assert_eq!(pop_context(), Ok(primary), "pop returns the pushed context");
            assert!(
                current_context().is_null(),
                "pop restores the previous (none)"
            );
        });
    });

    let retain = |ordinal: c_int| {
        let mut device: sys::CUdevice = -1;
        let mut context = null_mut();
        // SAFETY: the out-pointers are live locals.
        unsafe {
            ok(sys::cuDeviceGet(&mut device, ordinal), "cuDeviceGet");
            let result = sys::cuDevicePrimaryCtxRetain(&mut context, device);
            ok(result, "cuDevicePrimaryCtxRetain");
        }
        (device, context)
    };
    let release = |device: sys::CUdevice| {
        // SAFETY: balances one `cuDevicePrimaryCtxRetain` above.
        let result = unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) };
        ok(result, "cuDevicePrimaryCtxRelease");
    };
    let (device, first) = retain(0);
    let (_, second) = retain(0);
    assert_eq!(first, ctx.cu_ctx(), "the primary context");
    assert_eq!(second, first, "retaining twice gives the same handle");
    release(device);
    release(device);
    if device_count() >= 2 {
        let (device1, other) = retain(1);
        assert_ne!(other, first, "each device has its own primary context");
        release(device1);
    } else {
        eprintln!("one device only: not checked that device 1's primary context is distinct");
    }
}

#[test]
fn device_pointers_report_their_device_context_and_memory_type() {
    let _ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let contexts: Vec<_> = (0..device_count().min(2))
        .map(|ordinal| CudaContext::new(ordinal).expect("a context on each device"))
        .collect();
    let device_memory = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    let mut buffers = Vec::new();
    for (ordinal, ctx) in contexts.iter().enumerate() {
        ctx.bind_to_thread()
            .expect("bind the device's primary context");
        let buf = DevBuf::new(N);
        let ordinal = c_int::try_from(ordinal).unwrap();
        assert_eq!(pointer_ordinal(buf.ptr), Ok(ordinal), "DEVICE_ORDINAL");
        assert_eq!(
            pointer_ordinal(buf.ptr + 100),
            Ok(ordinal),
            "interior pointer"
        );
        assert_eq!(pointer_context(buf.ptr), ctx.cu_ctx(), "CONTEXT");
        assert_eq!(pointer_memory_type(buf.ptr), device_memory, "MEMORY_TYPE");
        buffers.push(buf);
    }
    if let [first, second] = &buffers[..] {
        // The attributes do not depend on the current context.
        contexts[0].bind_to_thread().expect("bind device 0");
        assert_eq!(pointer_ordinal(second.ptr), Ok(1));
        contexts[1].bind_to_thread().expect("bind device 1");
        assert_eq!(pointer_ordinal(first.ptr), Ok(0));
    } else {
        eprintln!("one device only: pointers on device 1 were not checked");
    }

    let on_stack = 0u64;
    let boxed = Box::new([0u8; 64]);
    let stack_address = (&raw const on_stack) as sys::CUdeviceptr;
    let box_address = boxed.as_ptr() as sys::CUdeviceptr;
    assert_eq!(
        pointer_ordinal(stack_address),
        Err(CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(pointer_ordinal(box_address), Err(CUDA_ERROR_INVALID_VALUE));

    for (ctx, buf) in contexts.iter().zip(buffers) {
        ctx.bind_to_thread().expect("bind the owning context");
        drop(buf);
    }
}

#[test]
fn a_stream_knows_its_context_and_its_capture_status() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let buf = DevBuf::new(N);
    let stream = Stream::non_blocking();
    assert_eq!(stream.context(), ctx.cu_ctx(), "the creating context");
    assert_eq!(
        Stream::legacy().context(),
        ctx.cu_ctx(),
        "0x1: the current one"
    );
    assert_eq!(
        Stream::null().context(),
        ctx.cu_ctx(),
        "NULL: the current one"
    );
    stream.fill(&buf, 0);
    ok(stream.sync(), "initial fill");
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_NONE);

    let begin = || {
        let mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the stream is live and not capturing.
        ok(
            unsafe { sys::cuStreamBeginCapture_v2(stream.raw, mode) },
            "begin capture",
        );
    };
    let end = || {
        let mut graph = null_mut();
        // SAFETY: the stream is live; the out-pointer is a live local.
        let result = unsafe { sys::cuStreamEndCapture(stream.raw, &mut graph) };
        (result, graph)
    };

    // A capture records work without running it.
    begin();
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    stream.fill(&buf, 7);
    let (result, graph) = end();
    ok(result, "cuStreamEndCapture");
    assert!(!graph.is_null(), "a successful capture gives a graph");
    // SAFETY: the graph came from the capture above and is destroyed once.
    ok(unsafe { sys::cuGraphDestroy(graph) }, "cuGraphDestroy");
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_NONE);
    ok(stream.sync(), "synchronize after the capture");
    assert_eq!(stream.read(&buf), vec![0; N], "captured work does not run");

    // Synchronizing a capturing stream is refused and invalidates the capture.
    begin();
    let refused = stream.sync();
    eprintln!("cuStreamSynchronize while capturing: {refused:?}");
    assert_ne!(refused, SUCCESS, "cuStreamSynchronize while capturing");
    assert_eq!(
        stream.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let (result, graph) = end();
    assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(graph.is_null(), "an invalidated capture gives no graph");
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_NONE);
    ok(stream.sync(), "synchronize after the capture ended");
}

#[test]
fn the_threads_capture_mode_is_exchanged() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let exchange = |mut mode: sys::CUstreamCaptureMode| {
        // SAFETY: the in/out-pointer is a live local.
        let result = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        ok(result, "cuThreadExchangeStreamCaptureMode");
        mode
    };
    thread::scope(|scope| {
        scope.spawn(|| {
            ctx.bind_to_thread().expect("bind the context");
            let previous = exchange(CU_STREAM_CAPTURE_MODE_RELAXED);
            assert_eq!(previous, CU_STREAM_CAPTURE_MODE_GLOBAL, "the default");
            let previous = exchange(CU_STREAM_CAPTURE_MODE_GLOBAL);
            assert_eq!(previous, CU_STREAM_CAPTURE_MODE_RELAXED, "the mode set");
        });
    });
}

/// One side of a 2-D copy: a device pointer (or a host one, when `host` is set), its pitch and
/// the byte column and row where the copy starts.
struct Side {
    device: sys::CUdeviceptr,
    host: *mut u8,
    pitch: usize,
    x: usize,
    y: usize,
}

/// Enqueues `cuMemcpy2DAsync` of `width` x `height` bytes from device memory to `dst`.
fn copy_2d(stream: &Stream, src: &Side, dst: &Side, width: usize, height: usize) {
    use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
    let params = sys::CUDA_MEMCPY2D {
        srcXInBytes: src.x,
        srcY: src.y,
        srcMemoryType: CU_MEMORYTYPE_DEVICE,
        srcHost: null(),
        srcDevice: src.device,
        srcArray: null_mut(),
        srcPitch: src.pitch,
        dstXInBytes: dst.x,
        dstY: dst.y,
        dstMemoryType: if dst.host.is_null() {
            CU_MEMORYTYPE_DEVICE
        } else {
            CU_MEMORYTYPE_HOST
        },
        dstHost: dst.host.cast(),
        dstDevice: dst.device,
        dstArray: null_mut(),
        dstPitch: dst.pitch,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: the callers pass live buffers whose pitches and extents cover the copy, and
    // synchronize the stream before they read or free a host destination.
    ok(
        unsafe { sys::cuMemcpy2DAsync_v2(&params, stream.raw) },
        "cuMemcpy2DAsync",
    );
}

#[test]
fn copies_and_memsets_produce_the_right_bytes() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let host: Vec<u32> = (0..N as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let bytes = N * 4;
    let [a, b, c, d, e] = [(); 5].map(|()| DevBuf::new(N));
    let (legacy, stream) = (Stream::legacy(), Stream::non_blocking());

    // Synchronous 1-D copies (all on the legacy stream, so in order).
    let mut back = vec![0u32; N];
    let (from_host, to_back) = (host.as_ptr().cast(), back.as_mut_ptr().cast());
    // SAFETY: `host`, `back` and the device buffers hold `bytes` bytes each; synchronous
    // copies from device memory to host memory complete before they return.
    unsafe {
        ok(
            sys::cuMemcpyHtoD_v2(a.ptr, from_host, bytes),
            "cuMemcpyHtoD",
        );
        ok(sys::cuMemcpyDtoD_v2(b.ptr, a.ptr, bytes), "cuMemcpyDtoD");
        ok(sys::cuMemcpyDtoH_v2(to_back, b.ptr, bytes), "cuMemcpyDtoH");
    }
    assert_eq!(back, host, "HtoD, DtoD, DtoH");

    // Asynchronous 1-D copies on one stream.
    // SAFETY: `host` holds `bytes` bytes and outlives the copy (`read` synchronizes the stream).
    let result = unsafe { sys::cuMemcpyHtoDAsync_v2(c.ptr, from_host, bytes, stream.raw) };
    ok(result, "cuMemcpyHtoDAsync");
    stream.copy(&d, &c);
    assert_eq!(stream.read(&d), host, "HtoDAsync, DtoDAsync, DtoHAsync");

    // Synchronous memsets, read back with the synchronous copy.
    let read_sync = |buf: &DevBuf| {
        let mut out = vec![0u8; buf.bytes];
        let dst = out.as_mut_ptr().cast();
        // SAFETY: `out` holds `buf.bytes` bytes; the synchronous copy completes before return.
        ok(
            unsafe { sys::cuMemcpyDtoH_v2(dst, buf.ptr, buf.bytes) },
            "cuMemcpyDtoH",
        );
        out
    };
    // SAFETY: every range lies in `e`.
    unsafe { ok(sys::cuMemsetD8_v2(e.ptr, 0xAB, bytes), "cuMemsetD8") };
    assert_eq!(read_sync(&e), vec![0xAB; bytes], "cuMemsetD8");
    // SAFETY: every range lies in `e`.
    unsafe {
        ok(sys::cuMemsetD32_v2(e.ptr, 0xDEAD_BEEF, N), "cuMemsetD32");
        ok(
            sys::cuMemsetD8_v2(e.ptr + 5, 0x11, 3),
            "cuMemsetD8, unaligned",
        );
    }
    let mut expected = 0xDEAD_BEEFu32.to_le_bytes().repeat(N);
    expected[5..8].fill(0x11);
    assert_eq!(read_sync(&e), expected, "cuMemsetD32 then cuMemsetD8");

    // Asynchronous memsets on the non-blocking stream, after the legacy work above.
    ok(legacy.sync(), "the legacy stream");
    let s = stream.raw;
    // SAFETY: every range lies in `e`.
    unsafe {
        ok(
            sys::cuMemsetD32Async(e.ptr, 0x0102_0304, N, s),
            "cuMemsetD32Async",
        );
        ok(
            sys::cuMemsetD8Async(e.ptr + 4, 0xFF, 4, s),
            "cuMemsetD8Async",
        );
        ok(
            sys::cuMemsetD32Async(e.ptr + 32, 9, 2, s),
            "cuMemsetD32Async, offset",
        );
    }
    let mut expected = vec![0x0102_0304u32; N];
    expected[1] = 0xFFFF_FFFF;
    expected[8..10].fill(9);
    assert_eq!(stream.read(&e), expected, "asynchronous memsets");

    // 2-D copies from a device buffer of 4 rows of 64 bytes.
    const PITCH: usize = 64;
    let src_host: Vec<u8> = (0..PITCH * 4).map(|i| i as u8).collect();
    let src = DevBuf::with_bytes(src_host.len());
    let pitched = |x, y| Side {
        device: src.ptr,
        host: null_mut(),
        pitch: PITCH,
        x,
        y,
    };
    let (from, len) = (src_host.as_ptr().cast(), src_host.len());
    // SAFETY: `src_host` holds `len` bytes and outlives the copy (the stream is synchronized
    // below).
    let result = unsafe { sys::cuMemcpyHtoDAsync_v2(src.ptr, from, len, s) };
    ok(result, "cuMemcpyHtoDAsync of the 2-D source");

    // Device to host: the 16 x 3 window at (8, 1), into a dense host buffer.
    let mut window = vec![0u8; 16 * 3];
    let dense = Side {
        device: 0,
        host: window.as_mut_ptr(),
        pitch: 16,
        x: 0,
        y: 0,
    };
    copy_2d(&stream, &pitched(8, 1), &dense, 16, 3);
    ok(stream.sync(), "2-D device to host");
    let expected: Vec<u8> = (1..4)
        .flat_map(|row| src_host[row * PITCH + 8..row * PITCH + 24].iter().copied())
        .collect();
    assert_eq!(window, expected, "2-D device to host");

    // Device to device: 16 x 4 bytes from (0, 0) to (4, 0) of a buffer with a 32-byte pitch.
    let dst = DevBuf::with_bytes(32 * 4);
    // SAFETY: the range is `dst`.
    unsafe {
        ok(
            sys::cuMemsetD8Async(dst.ptr, 0xEE, dst.bytes, s),
            "cuMemsetD8Async",
        )
    };
    let narrow = Side {
        device: dst.ptr,
        host: null_mut(),
        pitch: 32,
        x: 4,
        y: 0,
    };
    copy_2d(&stream, &pitched(0, 0), &narrow, 16, 4);
    let expected: Vec<u8> = (0..4)
        .flat_map(|row| {
            let mut line = vec![0xEE; 32];
            line[4..20].copy_from_slice(&src_host[row * PITCH..row * PITCH + 16]);
            line
        })
        .collect();
    assert_eq!(stream.read_bytes(&dst), expected, "2-D device to device");
    if let Some(c) = &checker {
        c.assert_clean("copies and memsets");
    }
}

#[test]
fn error_names_device_ordinals_and_the_driver_version_are_reported() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let text = |f: unsafe fn(CUresult, *mut *const c_char) -> CUresult, error: CUresult| {
        let mut text: *const c_char = null();
        // SAFETY: the out-pointer is a live local; on success the driver points it at a static
        // NUL-terminated string.
        unsafe {
            ok(f(error, &mut text), "cuGetErrorName/cuGetErrorString");
            assert!(!text.is_null());
            CStr::from_ptr(text).to_str().expect("ASCII").to_owned()
        }
    };
    assert_eq!(text(sys::cuGetErrorName, NOT_READY), "CUDA_ERROR_NOT_READY");
    assert_eq!(text(sys::cuGetErrorName, SUCCESS), "CUDA_SUCCESS");
    assert!(!text(sys::cuGetErrorString, NOT_READY).is_empty());

    let get = |ordinal: c_int| {
        let mut device: sys::CUdevice = -1;
        // SAFETY: the out-pointer is a live local.
        match unsafe { sys::cuDeviceGet(&mut device, ordinal) } {
            SUCCESS => Ok(device),
            error => Err(error),
        }
    };
    let count = c_int::try_from(device_count()).unwrap();
    assert_eq!(get(0), Ok(ctx.cu_device()));
    assert_eq!(
        get(count),
        Err(CUDA_ERROR_INVALID_DEVICE),
        "ordinal = count"
    );
    assert_eq!(get(-1), Err(CUDA_ERROR_INVALID_DEVICE), "negative ordinal");

    let mut version: c_int = 0;
    // SAFETY: the out-pointer is a live local.
    ok(
        unsafe { sys::cuDriverGetVersion(&mut version) },
        "cuDriverGetVersion",
    );
    assert!(version >= 12000, "driver version {version}");
}

#[test]
fn context_synchronize_waits_for_every_stream_of_the_context() {
    let ctx = ctx();
    let checker = Checker::attach();
    let (one, two) = (DevBuf::new(N), DevBuf::new(N));
    let (a, b) = (Stream::non_blocking(), Stream::non_blocking());
    a.fill(&one, 0);
    b.fill(&two, 0);

    let gate_a = a.gate();
    a.fill(&one, 1);
    let gate_b = b.gate();
    b.fill(&two, 2);
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = thread::spawn({
        let ctx = ctx.clone();
        move || {
            ctx.bind_to_thread().expect("bind the context");
            // SAFETY: no arguments; the context is current on this thread.
            let _ = done_tx.send(unsafe { sys::cuCtxSynchronize() });
        }
    });
    // Only the checks of "not yet" use a timeout: a driver that returns early fails them, a
    // correct one never can.
    let not_yet = Duration::from_millis(200);
    let timeout = Err(RecvTimeoutError::Timeout);
    assert_eq!(done_rx.recv_timeout(not_yet), timeout, "both streams held");
    gate_a.release();
    ok(a.sync(), "stream A after its gate");
    assert_eq!(done_rx.recv_timeout(not_yet), timeout, "stream B held");
    gate_b.release();
    let result = done_rx.recv_timeout(Duration::from_secs(60));
    assert_eq!(result, Ok(SUCCESS), "cuCtxSynchronize after both gates");
    waiter.join().expect("the waiter thread");

    ok(b.sync(), "stream B, already complete");
    assert_eq!(a.query(), SUCCESS);
    assert_eq!(b.query(), SUCCESS);
    assert_eq!(a.read(&one), vec![1; N]);
    assert_eq!(b.read(&two), vec![2; N]);
    if let Some(c) = &checker {
        c.assert_clean("context synchronize");
    }
}

#[test]
fn two_dimensional_memsets_write_only_their_rows() {
    let _ctx = ctx();
    let checker = Checker::attach();
    // 8 rows of 64 bytes; the memsets write the first 6 rows, 20 bytes (5 words) of each.
    let (rows, pitch, written) = (8usize, 64usize, 6usize);
    let buf = DevBuf::with_bytes(rows * pitch);
    let stream = Stream::non_blocking();
    let expect = |value: u8, width: usize| -> Vec<u8> {
        (0..rows * pitch)
            .map(|i| {
                if i / pitch < written && i % pitch < width {
                    value
                } else {
                    0
                }
            })
            .collect()
    };
    // SAFETY: the rows lie in `buf`; stream-ordered, then synchronized by `read_bytes`.
    unsafe {
        ok(
            sys::cuMemsetD2D8Async(buf.ptr, pitch, 0xAB, 20, written, stream.raw),
            "cuMemsetD2D8Async",
        );
    }
    assert_eq!(
        stream.read_bytes(&buf),
        expect(0xAB, 20),
        "cuMemsetD2D8Async"
    );
    // SAFETY: as above; 5 words per row; synchronous.
    unsafe {
        ok(sys::cuMemsetD8_v2(buf.ptr, 0, rows * pitch), "cuMemsetD8");
        ok(
            sys::cuMemsetD2D32_v2(buf.ptr, pitch, 0xCDCD_CDCD, 5, written),
            "cuMemsetD2D32",
        );
    }
    assert_eq!(stream.read_bytes(&buf), expect(0xCD, 20), "cuMemsetD2D32");
    if let Some(c) = &checker {
        c.assert_clean("2-D memsets");
    }
}

// ---------------------------------------------------------------------------------------------
// Stream capture and graphs

/// The capture status, id and graph of a stream (`cuStreamGetCaptureInfo_v3`).
struct CaptureInfo {
    status: sys::CUstreamCaptureStatus,
    id: u64,
    graph: sys::CUgraph,
}

impl Stream {
    fn begin_capture(&self, mode: sys::CUstreamCaptureMode) {
        // SAFETY: the handle is live and not capturing.
        let result = unsafe { sys::cuStreamBeginCapture_v2(self.raw, mode) };
        ok(result, "cuStreamBeginCapture");
    }

    /// `cuStreamEndCapture`: its result and the graph it gave (NULL on failure).
    fn end_capture(&self) -> (CUresult, sys::CUgraph) {
        let mut graph = null_mut();
        // SAFETY: the handle is live; the out-pointer is a live local.
        let result = unsafe { sys::cuStreamEndCapture(self.raw, &mut graph) };
        (result, graph)
    }

    /// Ends a capture that must succeed, with its graph.
    fn end_capture_graph(&self) -> Graph {
        let (result, graph) = self.end_capture();
        ok(result, "cuStreamEndCapture");
        assert!(!graph.is_null(), "a successful capture gives a graph");
        Graph(graph)
    }

    /// `cuStreamIsCapturing`: its result and the status (NONE unless it succeeded).
    fn is_capturing(&self) -> (CUresult, sys::CUstreamCaptureStatus) {
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the handle is live or special; the out-pointer is a live local.
        let result = unsafe { sys::cuStreamIsCapturing(self.raw, &mut status) };
        (result, status)
    }

    fn capture_info(&self) -> CaptureInfo {
        let mut info = CaptureInfo {
            status: CU_STREAM_CAPTURE_STATUS_NONE,
            id: 0,
            graph: null_mut(),
        };
        // SAFETY: the handle is live; the out-pointers are live locals or NULL (optional).
        let result = unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                self.raw,
                &mut info.status,
                &mut info.id,
                &mut info.graph,
                null_mut(),
                null_mut(),
                null_mut(),
            )
        };
        ok(result, "cuStreamGetCaptureInfo_v3");
        info
    }

    /// `cuStreamWaitEvent` with `flags`, for its result.
    fn wait_with_flags(&self, event: &Event, flags: u32) -> CUresult {
        // SAFETY: both handles are live.
        unsafe { sys::cuStreamWaitEvent(self.raw, event.0, flags) }
    }

    /// Enqueues a host function that counts its calls in `calls`.
    fn count_calls(&self, calls: &'static AtomicUsize) {
        let user_data = std::ptr::from_ref(calls).cast_mut().cast();
        // SAFETY: `count_call` matches `CUhostFn`; `user_data` is a `'static` counter.
        let result = unsafe { sys::cuLaunchHostFunc(self.raw, Some(count_call), user_data) };
        ok(result, "cuLaunchHostFunc");
    }
}

unsafe extern "C" fn count_call(user_data: *mut c_void) {
    // SAFETY: `user_data` is the `&'static AtomicUsize` of `Stream::count_calls`.
    let calls = unsafe { &*user_data.cast::<AtomicUsize>() };
    calls.fetch_add(1, Ordering::SeqCst);
}

/// A graph from a stream capture, destroyed on drop.
struct Graph(sys::CUgraph);

impl Graph {
    /// `cuGraphInstantiateWithFlags` with no flags.
    fn instantiate(&self) -> Exec {
        let mut exec = null_mut();
        // SAFETY: the graph is live; the out-pointer is a live local.
        let result = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, self.0, 0) };
        ok(result, "cuGraphInstantiateWithFlags");
        Exec(exec)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the graph came from a capture and is destroyed once.
        let result = unsafe { sys::cuGraphDestroy(self.0) };
        if !thread::panicking() {
            ok(result, "cuGraphDestroy");
        }
    }
}

/// An executable graph, destroyed on drop.
struct Exec(sys::CUgraphExec);

impl Exec {
    fn launch(&self, stream: &Stream) {
        // SAFETY: both handles are live; the tests keep the graphs' buffers alive until the
        // launch stream is synchronized.
        ok(
            unsafe { sys::cuGraphLaunch(self.0, stream.raw) },
            "cuGraphLaunch",
        );
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: the executable graph is destroyed once; launches already enqueued still run.
        let result = unsafe { sys::cuGraphExecDestroy(self.0) };
        if !thread::panicking() {
            ok(result, "cuGraphExecDestroy");
        }
    }
}

#[test]
fn a_captured_graph_replays_its_memset_copy_and_host_function_at_each_launch() {
    let _ctx = ctx();
    let checker = Checker::attach();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let (src, dst) = (DevBuf::new(N), DevBuf::new(N));
    let (stream, launch) = (Stream::non_blocking(), Stream::non_blocking());
    stream.fill(&src, 0);
    stream.fill(&dst, 0);
    ok(stream.sync(), "initial fills");
    CALLS.store(0, Ordering::SeqCst);

    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    stream.fill(&src, 7);
    stream.copy(&dst, &src);
    stream.count_calls(&CALLS);
    let graph = stream.end_capture_graph();
    ok(stream.sync(), "the capturing stream after the capture");
    assert_eq!(stream.read(&src), vec![0; N], "captured work does not run");
    assert_eq!(stream.read(&dst), vec![0; N], "captured work does not run");
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        0,
        "nor does a captured host function"
    );

    let exec = graph.instantiate();
    for launches in 1..=3u32 {
        // Each launch runs the nodes again, over what was written in between.
        launch.fill(&src, launches);
        launch.fill(&dst, 100 + launches);
        exec.launch(&launch);
        assert_eq!(
            launch.read(&src),
            vec![7; N],
            "launch {launches}: the memset"
        );
        assert_eq!(launch.read(&dst), vec![7; N], "launch {launches}: the copy");
        assert_eq!(
            CALLS.load(Ordering::SeqCst),
            launches as usize,
            "launch {launches}: the host function"
        );
    }
    if let Some(c) = &checker {
        c.assert_clean("graph launches");
    }
}

#[test]
fn launches_of_one_executable_graph_are_ordered() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let (stream, first, second) = (
        Stream::non_blocking(),
        Stream::non_blocking(),
        Stream::non_blocking(),
    );
    stream.fill(&buf, 0);
    ok(stream.sync(), "initial fill");
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    stream.fill(&buf, 4);
    let exec = stream.end_capture_graph().instantiate();

    // "Each launch is ordered behind both any previous work in hStream and any previous
    // launches of hGraphExec" (cuGraphLaunch).
    let gate = first.gate();
    exec.launch(&first);
    exec.launch(&second);
    assert_eq!(
        second.query(),
        NOT_READY,
        "the second launch waits for the first"
    );
    gate.release();
    ok(second.sync(), "the second launch after the gate");
    assert_eq!(first.query(), SUCCESS, "the first launch is done before it");
    assert_eq!(second.read(&buf), vec![4; N]);
    if let Some(c) = &checker {
        c.assert_clean("ordered launches");
    }
}

#[test]
fn an_external_event_wait_in_a_graph_waits_for_the_events_record() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let (buf, out) = (DevBuf::new(N), DevBuf::new(N));
    let (producer, capturing, launch) = (
        Stream::non_blocking(),
        Stream::non_blocking(),
        Stream::non_blocking(),
    );
    producer.fill(&buf, 0);
    capturing.fill(&out, 0);
    ok(producer.sync(), "initial fill");
    ok(capturing.sync(), "initial fill");
    let event = Event::new();
    let gate = producer.gate();
    producer.fill(&buf, 5);
    event.record(&producer);

    // Wrong: a default wait on an event recorded outside the capture.
    capturing.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    assert_eq!(
        capturing.wait_with_flags(&event, 0),
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION
    );
    assert_eq!(
        capturing.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let (result, graph) = capturing.end_capture();
    assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(graph.is_null(), "an invalidated capture gives no graph");

    // Right: CU_EVENT_WAIT_EXTERNAL makes it an event-wait node of the graph.
    let external = sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32;
    capturing.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    ok(
        capturing.wait_with_flags(&event, external),
        "cuStreamWaitEvent(CU_EVENT_WAIT_EXTERNAL) while capturing",
    );
    capturing.copy(&out, &buf);
    let exec = capturing.end_capture_graph().instantiate();
    exec.launch(&launch);
    assert_eq!(
        launch.query(),
        NOT_READY,
        "the launch waits for the producer's record"
    );
    gate.release();
    ok(launch.sync(), "the launch after the gate");
    assert_eq!(launch.read(&out), vec![5; N], "the producer's values");
    ok(producer.sync(), "the producer");
    if let Some(c) = &checker {
        c.assert_clean("an external event wait");
    }
}

#[test]
fn the_legacy_stream_is_unusable_while_a_blocking_stream_captures() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let (buf, other) = (DevBuf::new(N), DevBuf::new(N));
    let (blocking, non_blocking) = (Stream::blocking(), Stream::non_blocking());
    Stream::legacy().fill(&buf, 0);
    Stream::legacy().fill(&other, 0);
    ok(Stream::legacy().sync(), "initial fills");

    blocking.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    for (legacy, name) in [
        (Stream::legacy(), "CU_STREAM_LEGACY"),
        (Stream::null(), "NULL"),
    ] {
        let (result, _) = legacy.is_capturing();
        assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "{name}");
    }
    assert_eq!(
        blocking.capture_status(),
        CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "cuStreamIsCapturing does not invalidate the capture"
    );
    blocking.fill(&buf, 3);
    let exec = blocking.end_capture_graph().instantiate();
    assert_eq!(
        Stream::legacy().is_capturing(),
        (SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE),
        "after the capture"
    );

    // A capture on a non-blocking stream leaves the legacy stream usable.
    non_blocking.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    assert_eq!(
        Stream::legacy().is_capturing(),
        (SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE)
    );
    Stream::legacy().fill(&other, 6);
    non_blocking.fill(&other, 9);
    let _graph = non_blocking.end_capture_graph();
    exec.launch(&Stream::legacy());
    assert_eq!(Stream::legacy().read(&buf), vec![3; N], "the launch");
    assert_eq!(
        Stream::legacy().read(&other),
        vec![6; N],
        "the legacy stream's fill ran, the captured one did not"
    );
    if let Some(c) = &checker {
        c.assert_clean("the legacy stream beside captures");
    }
}

#[test]
fn the_per_thread_default_stream_can_be_captured() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let stream = Stream::per_thread();
    stream.fill(&buf, 0);
    ok(stream.sync(), "initial fill");
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    stream.fill(&buf, 5);
    let exec = stream.end_capture_graph().instantiate();
    assert_eq!(stream.read(&buf), vec![0; N], "captured work does not run");
    exec.launch(&stream);
    assert_eq!(stream.read(&buf), vec![5; N]);
    if let Some(c) = &checker {
        c.assert_clean("a capture of the per-thread default stream");
    }
}

#[test]
fn capture_modes_decide_which_threads_may_make_potentially_unsafe_calls() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let stream = Stream::non_blocking();
    let alloc = || {
        let mut ptr = 0;
        // SAFETY: the out-pointer is a live local; a context is current.
        let result = unsafe { sys::cuMemAlloc_v2(&mut ptr, 1024) };
        (result, ptr)
    };
    let alloc_on_another_thread = || {
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    ctx.bind_to_thread().expect("bind the context");
                    alloc()
                })
                .join()
                .expect("the other thread")
        })
    };
    let free = |(result, ptr): (CUresult, sys::CUdeviceptr)| {
        if result == SUCCESS {
            // SAFETY: allocated above and freed once, with no capture under way.
            ok(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree");
        }
    };
    let exchange = |mut mode: sys::CUstreamCaptureMode| {
        // SAFETY: the in/out-pointer is a live local.
        let result = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        ok(result, "cuThreadExchangeStreamCaptureMode");
        mode
    };

    // Global: another thread's potentially unsafe call is refused and invalidates.
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_GLOBAL);
    let refused = alloc_on_another_thread();
    eprintln!(
        "cuMemAlloc on another thread during a global capture: {:?}",
        refused.0
    );
    assert_eq!(
        stream.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let (result, graph) = stream.end_capture();
    free(refused);
    assert_ne!(refused.0, SUCCESS, "cuMemAlloc during a global capture");
    assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(graph.is_null());

    // Thread-local: another thread is not concerned.
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let allowed = alloc_on_another_thread();
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    let _graph = stream.end_capture_graph();
    free(allowed);
    ok(
        allowed.0,
        "cuMemAlloc on another thread during a thread-local capture",
    );

    // The capturing thread itself: refused in thread-local mode ...
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let refused = alloc();
    assert_eq!(
        stream.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let (result, _) = stream.end_capture();
    free(refused);
    assert_ne!(refused.0, SUCCESS, "cuMemAlloc on the capturing thread");
    assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // ... and allowed once the thread's mode is relaxed.
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let previous = exchange(CU_STREAM_CAPTURE_MODE_RELAXED);
    let allowed = alloc();
    exchange(previous);
    assert_eq!(stream.capture_status(), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    let _graph = stream.end_capture_graph();
    free(allowed);
    ok(
        allowed.0,
        "cuMemAlloc on a capturing thread in relaxed mode",
    );
}

#[test]
fn capture_info_gives_each_capture_its_own_id() {
    let _ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    let stream = Stream::non_blocking();
    assert_eq!(stream.capture_info().status, CU_STREAM_CAPTURE_STATUS_NONE);

    let mut ids = Vec::new();
    for _ in 0..2 {
        stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        let info = stream.capture_info();
        assert_eq!(info.status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
        assert_ne!(info.id, 0, "an id for the capture sequence");
        assert!(!info.graph.is_null(), "the graph being captured into");
        let graph = stream.end_capture_graph();
        assert_eq!(graph.0, info.graph, "the graph that was being built");
        ids.push(info.id);
        assert_eq!(stream.capture_info().status, CU_STREAM_CAPTURE_STATUS_NONE);
    }
    assert_ne!(ids[0], ids[1], "each capture sequence has its own id");
}

#[test]
fn a_stream_that_waits_on_a_captured_event_joins_the_capture() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let [a, b, c] = [(); 3].map(|()| DevBuf::new(N));
    let (origin, forked, launch) = (
        Stream::non_blocking(),
        Stream::non_blocking(),
        Stream::non_blocking(),
    );
    let (fork, join) = (Event::new(), Event::new());

    // Right: fork to the other stream and join it back.
    origin.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    origin.fill(&a, 1);
    fork.record(&origin);
    forked.wait(&fork);
    assert_eq!(
        forked.capture_status(),
        CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "the waiting stream joined the capture"
    );
    assert_eq!(forked.capture_info().id, origin.capture_info().id);
    forked.copy(&b, &a);
    join.record(&forked);
    origin.wait(&join);
    origin.copy(&c, &b);
    let graph = origin.end_capture_graph();
    assert_eq!(
        forked.capture_status(),
        CU_STREAM_CAPTURE_STATUS_NONE,
        "the capture ended for every stream in it"
    );
    let exec = graph.instantiate();
    for buf in [&a, &b, &c] {
        launch.fill(buf, 0);
    }
    exec.launch(&launch);
    assert_eq!(
        launch.read(&c),
        vec![1; N],
        "through both streams, in order"
    );
    assert_eq!(launch.read(&b), vec![1; N]);

    // Wrong: the forked stream's work is never joined back.
    origin.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    origin.fill(&a, 2);
    fork.record(&origin);
    forked.wait(&fork);
    forked.fill(&b, 2);
    let (result, graph) = origin.end_capture();
    assert_eq!(result, CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    assert!(graph.is_null(), "an unjoined capture gives no graph");
    assert_eq!(origin.capture_status(), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_eq!(forked.capture_status(), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_eq!(launch.read(&b), vec![1; N], "captured work does not run");
    if let Some(c) = &checker {
        c.assert_clean("fork and join");
    }
}

#[test]
fn an_executable_graph_outlives_its_graph() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let buf = DevBuf::new(N);
    let stream = Stream::non_blocking();
    stream.fill(&buf, 0);
    ok(stream.sync(), "initial fill");
    stream.begin_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    stream.fill(&buf, 8);
    let graph = stream.end_capture_graph();

    let mut params = sys::CUDA_GRAPH_INSTANTIATE_PARAMS {
        flags: 0,
        hUploadStream: null_mut(),
        hErrNode_out: null_mut(),
        result_out: sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR,
    };
    let mut exec = null_mut();
    // SAFETY: the graph is live; the out-pointer and the parameters are live locals.
    let result = unsafe { sys::cuGraphInstantiateWithParams(&mut exec, graph.0, &mut params) };
    ok(result, "cuGraphInstantiateWithParams");
    assert_eq!(
        params.result_out,
        sys::CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS
    );
    let exec = Exec(exec);
    drop(graph);
    exec.launch(&stream);
    assert_eq!(
        stream.read(&buf),
        vec![8; N],
        "launched after cuGraphDestroy"
    );
    drop(exec);
    if let Some(c) = &checker {
        c.assert_clean("an executable graph after its graph");
    }
}

#[test]
fn cudarcs_capture_and_graph_launch_work() {
    let ctx = ctx();
    // The checker counts the whole process: one such test at a time.
    let _turn = Checker::attach();
    // SAFETY: this test orders its work itself: one stream only (cudarc's events would be
    // recorded outside the capture and waited on inside it).
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("a stream");
    let mut data = stream.clone_htod(&[1u32; 4]).expect("clone_htod");
    stream.synchronize().expect("synchronize");
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("begin_capture");
    stream.memset_zeros(&mut data).expect("memset_zeros");
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .expect("end_capture")
        .expect("a graph");
    assert_eq!(stream.clone_dtoh(&data).expect("clone_dtoh"), [1; 4]);
    graph.launch().expect("launch");
    assert_eq!(stream.clone_dtoh(&data).expect("clone_dtoh"), [0; 4]);
    stream
        .memcpy_htod(&[2u32; 4], &mut data)
        .expect("memcpy_htod");
    graph.launch().expect("launch");
    assert_eq!(stream.clone_dtoh(&data).expect("clone_dtoh"), [0; 4]);
}

/// `dlpack_tests::gpu::KERNELS_PTX`, loaded with `cuModuleLoadData` into the current context
/// and unloaded on drop.
struct Module(sys::CUmodule);

impl Module {
    fn load() -> Self {
        let text = std::ffi::CString::new(dlpack_tests::gpu::KERNELS_PTX).unwrap();
        let mut module = null_mut();
        // SAFETY: a valid out-pointer; NUL-terminated PTX text.
        let result = unsafe { sys::cuModuleLoadData(&mut module, text.as_ptr().cast()) };
        ok(result, "cuModuleLoadData");
        Self(module)
    }

    fn function(&self, name: &CStr) -> Result<sys::CUfunction, CUresult> {
        let mut f = null_mut();
        // SAFETY: a loaded module; a NUL-terminated name; a valid out-pointer.
        match unsafe { sys::cuModuleGetFunction(&mut f, self.0, name.as_ptr()) } {
            SUCCESS => Ok(f),
            e => Err(e),
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`, unloaded once.
        let result = unsafe { sys::cuModuleUnload(self.0) };
        if !thread::panicking() {
            ok(result, "cuModuleUnload");
        }
    }
}

/// `cuLaunchKernel` of `fill_u32(buf, value, n)` with the given geometry on `stream`.
fn launch_fill(
    f: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    stream: &Stream,
    buf: &DevBuf,
    value: u32,
) -> CUresult {
    let n = buf.words() as u32;
    let mut params = [
        (&buf.ptr as *const sys::CUdeviceptr)
            .cast_mut()
            .cast::<c_void>(),
        (&value as *const u32).cast_mut().cast::<c_void>(),
        (&n as *const u32).cast_mut().cast::<c_void>(),
    ];
    // SAFETY: one pointer per parameter of `fill_u32(u64, u32, u32)`, alive for the call; the
    // kernel writes `n` u32 of `buf`, a live allocation.
    unsafe {
        sys::cuLaunchKernel(
            f,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            0,
            stream.raw,
            params.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn a_ptx_module_finds_its_entries_by_name() {
    let _ctx = ctx();
    let module = Module::load();
    assert!(module.function(c"fill_u32").is_ok());
    assert!(module.function(c"copy_u32").is_ok());
    assert_eq!(
        module.function(c"fill"),
        Err(sys::cudaError_enum::CUDA_ERROR_NOT_FOUND)
    );
    assert_eq!(
        module.function(c"fill_u32_out"),
        Err(sys::cudaError_enum::CUDA_ERROR_NOT_FOUND),
        "a parameter is not an entry"
    );
}

#[test]
fn kernel_launches_are_stream_ordered_and_their_geometry_is_checked() {
    let _ctx = ctx();
    let checker = Checker::attach();
    let module = Module::load();
    let fill = module.function(c"fill_u32").unwrap();
    let buf = DevBuf::new(N);
    let stream = Stream::non_blocking();
    let event = Event::new();

    let gate = stream.gate();
    let blocks = N.div_ceil(128) as u32;
    ok(
        launch_fill(fill, (blocks, 1, 1), (128, 1, 1), &stream, &buf, 7),
        "cuLaunchKernel",
    );
    event.record(&stream);
    // After the kernel in stream order: its value is the one left.
    stream.fill(&buf, 9);
    assert_eq!(
        stream.query(),
        NOT_READY,
        "a launch behind a gate is pending"
    );
    assert_eq!(event.query(), NOT_READY);
    gate.release();
    ok(stream.sync(), "cuStreamSynchronize after the gate");
    assert_eq!(event.query(), SUCCESS);
    assert_eq!(stream.read(&buf), vec![9; N]);

    for (grid, block) in [
        ((0, 1, 1), (128, 1, 1)),
        ((1, 1, 1), (0, 1, 1)),
        ((1, 1, 1), (1025, 1, 1)),
        ((1, 1, 1), (32, 32, 2)),
        ((1, 1, 1), (1, 1, 65)),
        ((1, 65536, 1), (1, 1, 1)),
    ] {
        assert_eq!(
            launch_fill(fill, grid, block, &stream, &buf, 1),
            CUDA_ERROR_INVALID_VALUE,
            "grid {grid:?}, block {block:?}"
        );
    }
    ok(stream.sync(), "cuStreamSynchronize");
    if let Some(c) = &checker {
        c.assert_clean("a launch followed by a memset on one stream");
    }
}
