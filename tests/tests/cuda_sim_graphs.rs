//! The CUDA simulator's checker on graph launches (feature `cuda`): each test makes one mistake
//! that a GPU would turn into a race, a use after free or undefined behaviour, in a graph
//! captured from a stream and launched, and asserts that the checker reports it, next to the
//! same launch done right, which it must not report. Also the simulator's own choices for
//! what the driver leaves open (pageable host memory in a capture). These tests need the
//! simulator (a real driver has no checker); the test command runs them with it.
#![cfg(feature = "cuda")]

use std::ptr::null_mut;
use std::sync::Arc;

use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, sys};
use sys::CUresult;
use sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
use sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED;

const NEEDS_SIMULATOR: &str = "needs the CUDA simulator on the library path (scripts/cuda-sim.sh): a real driver has no checker";

/// Elements (`u32`) of the test buffers.
const N: usize = 1024;

fn setup() -> (Arc<CudaContext>, Checker) {
    let ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    (ctx, checker)
}

#[track_caller]
fn ok(result: CUresult) {
    assert_eq!(result, CUresult::CUDA_SUCCESS);
}

/// A non-blocking stream, destroyed on drop.
struct Stream(sys::CUstream);

impl Stream {
    fn new() -> Self {
        let mut raw = null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the out-pointer is a live local; a context is current.
        ok(unsafe { sys::cuStreamCreate(&mut raw, flags) });
        Self(raw)
    }

    fn sync(&self) {
        // SAFETY: a live stream.
        ok(unsafe { sys::cuStreamSynchronize(self.0) });
    }

    fn gate(&self) -> Gate {
        // SAFETY: a live stream of the current context.
        unsafe { Gate::hold_raw(self.0) }
    }

    fn fill(&self, ptr: sys::CUdeviceptr, value: u32) {
        // SAFETY: the tests pass allocations of `N` u32; stream-ordered.
        ok(unsafe { sys::cuMemsetD32Async(ptr, value, N, self.0) });
    }

    fn copy(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr) {
        // SAFETY: the tests pass allocations of `N` u32; stream-ordered.
        ok(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, N * 4, self.0) });
    }

    fn read(&self, src: sys::CUdeviceptr) -> Vec<u32> {
        let mut out = vec![0u32; N];
        // SAFETY: `out` has room for `N` u32; from device to pageable memory the copy has
        // completed when the call returns (and the stream is synchronized below).
        ok(unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, N * 4, self.0) });
        self.sync();
        out
    }

    fn begin_capture(&self) {
        let mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream, not capturing.
        ok(unsafe { sys::cuStreamBeginCapture_v2(self.0, mode) });
    }

    /// Ends the capture and instantiates its graph (then destroyed: the executable graph is
    /// independent of it).
    fn end_capture(&self) -> Exec {
        let (mut graph, mut exec) = (null_mut(), null_mut());
        // SAFETY: a capturing stream; the out-pointers are live locals; the graph is destroyed
        // once, after its instantiation.
        unsafe {
            ok(sys::cuStreamEndCapture(self.0, &mut graph));
            ok(sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0));
            ok(sys::cuGraphDestroy(graph));
        }
        Exec(exec)
    }

    fn capture_status(&self) -> sys::CUstreamCaptureStatus {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream; the out-pointer is a live local.
        ok(unsafe { sys::cuStreamIsCapturing(self.0, &mut status) });
        status
    }

    /// Waits on `event` with `CU_EVENT_WAIT_EXTERNAL` (an event-wait node when capturing).
    fn wait_external(&self, event: sys::CUevent) {
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32;
        // SAFETY: live handles.
        ok(unsafe { sys::cuStreamWaitEvent(self.0, event, flags) });
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by `Stream::new`, destroyed once.
        let result = unsafe { sys::cuStreamDestroy_v2(self.0) };
        if !std::thread::panicking() {
            ok(result);
        }
    }
}

/// An executable graph, destroyed on drop.
struct Exec(sys::CUgraphExec);

impl Exec {
    fn launch(&self, stream: &Stream) -> CUresult {
        // SAFETY: live handles; the tests keep the graphs' memory alive until the launch
        // stream is synchronized (or the launch is refused).
        unsafe { sys::cuGraphLaunch(self.0, stream.0) }
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        let result = unsafe { sys::cuGraphExecDestroy(self.0) };
        if !std::thread::panicking() {
            ok(result);
        }
    }
}

fn alloc() -> sys::CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: the out-pointer is a live local; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut ptr, N * 4) });
    ptr
}

fn free(ptr: sys::CUdeviceptr) {
    // SAFETY: an allocation of `alloc`, freed once, after the work that used it.
    ok(unsafe { sys::cuMemFree_v2(ptr) });
}

fn event() -> sys::CUevent {
    let mut event = null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: the out-pointer is a live local; a context is current.
    ok(unsafe { sys::cuEventCreate(&mut event, flags) });
    event
}

fn record(event: sys::CUevent, stream: &Stream) {
    // SAFETY: live handles of one context.
    ok(unsafe { sys::cuEventRecord(event, stream.0) });
}

fn destroy(event: sys::CUevent) {
    // SAFETY: a live event, destroyed once.
    ok(unsafe { sys::cuEventDestroy_v2(event) });
}

#[test]
fn a_replayed_copy_not_ordered_after_the_producer_is_reported() {
    let (_ctx, checker) = setup();
    let (src, dst) = (alloc(), alloc());
    let (producer, capturing, launch) = (Stream::new(), Stream::new(), Stream::new());
    let ready = event();

    // Wrong: the graph's copy reads `src` with no dependency on the producer's write.
    capturing.begin_capture();
    capturing.copy(dst, src);
    let unordered = capturing.end_capture();
    // Right: an external event wait orders it after the producer's record.
    capturing.begin_capture();
    capturing.wait_external(ready);
    capturing.copy(dst, src);
    let ordered = capturing.end_capture();
    assert_eq!(checker.violations(), 0, "capturing accesses nothing");

    let gate = producer.gate();
    producer.fill(src, 3);
    record(ready, &producer);
    ok(unordered.launch(&launch));
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains("read of bytes")
            && report.contains("cuMemcpyDtoDAsync")
            && report.contains("cuMemsetD32Async"),
        "{report}"
    );
    gate.release();
    producer.sync();
    launch.sync();

    checker.reset();
    let gate = producer.gate();
    producer.fill(src, 4);
    record(ready, &producer);
    ok(ordered.launch(&launch));
    gate.release();
    assert_eq!(launch.read(dst), vec![4; N], "the producer's values");
    producer.sync();
    checker.assert_clean("a replayed copy after an external event wait");
    assert_eq!(checker.operations("cuGraphLaunch"), 1);
    assert_eq!(
        checker.operations("cuMemcpyDtoDAsync"),
        1,
        "the replayed copy"
    );
    assert_eq!(
        checker.operations("cuStreamWaitEvent"),
        1,
        "the replayed wait"
    );
    destroy(ready);
    free(src);
    free(dst);
}

#[test]
fn a_launch_after_the_source_was_freed_is_a_use_after_free() {
    let (_ctx, checker) = setup();
    let (src, dst) = (alloc(), alloc());
    let (capturing, launch) = (Stream::new(), Stream::new());
    capturing.begin_capture();
    capturing.copy(dst, src);
    let exec = capturing.end_capture();

    // Right: launched while the source is live.
    ok(exec.launch(&launch));
    launch.sync();
    checker.assert_clean("a launch before the free");

    // Wrong: launched after it was freed.
    free(src);
    assert_eq!(
        exec.launch(&launch),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "the launch is refused"
    );
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains("already freed by cuMemFree") && report.contains("cuGraphLaunch"),
        "{report}"
    );
    assert_eq!(checker.operations("cuGraphLaunch"), 1, "nothing enqueued");
    drop(exec);
    free(dst);
}

#[test]
fn a_launch_reaching_a_destroyed_event_is_reported() {
    let (_ctx, checker) = setup();
    let buf = alloc();
    let (capturing, launch) = (Stream::new(), Stream::new());
    let ready = event();
    capturing.begin_capture();
    capturing.wait_external(ready);
    capturing.fill(buf, 6);
    let exec = capturing.end_capture();

    // Right: the event is alive (never recorded: no wait).
    ok(exec.launch(&launch));
    assert_eq!(launch.read(buf), vec![6; N]);
    checker.assert_clean("a launch waiting on a live event");

    // Wrong: destroyed before the launch; reported, and no wait is added.
    destroy(ready);
    launch.fill(buf, 0);
    ok(exec.launch(&launch));
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains(&format!("graph exec {:#x}", exec.0 as usize))
            && report.contains(&format!("event {:#x}", ready as usize))
            && report.contains("destroyed"),
        "{report}"
    );
    assert_eq!(launch.read(buf), vec![6; N], "the rest of the graph ran");
    drop(exec);
    free(buf);
}

#[test]
fn an_external_event_record_node_records_at_each_launch() {
    let (_ctx, checker) = setup();
    let buf = alloc();
    let (capturing, launch) = (Stream::new(), Stream::new());
    let done = event();
    capturing.begin_capture();
    capturing.fill(buf, 2);
    let external = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
    // SAFETY: live handles of one context.
    ok(unsafe { sys::cuEventRecordWithFlags(done, capturing.0, external) });
    let exec = capturing.end_capture();
    // SAFETY: a live event.
    let query = || unsafe { sys::cuEventQuery(done) };
    assert_eq!(
        query(),
        CUresult::CUDA_SUCCESS,
        "not recorded by the capture"
    );

    let gate = launch.gate();
    ok(exec.launch(&launch));
    assert_eq!(
        query(),
        CUresult::CUDA_ERROR_NOT_READY,
        "recorded by the launch"
    );
    gate.release();
    // SAFETY: a live event.
    ok(unsafe { sys::cuEventSynchronize(done) });
    assert_eq!(launch.read(buf), vec![2; N]);
    checker.assert_clean("an event record node");
    drop(exec);
    destroy(done);
    free(buf);
}

#[test]
fn copies_of_pageable_memory_and_stream_ordered_allocation_are_refused_in_a_capture() {
    let (_ctx, checker) = setup();
    let buf = alloc();
    let stream = Stream::new();
    let host = vec![5u32; N];

    // Pageable host memory: refused, and the capture is invalidated.
    stream.begin_capture();
    // SAFETY: `host` holds `N` u32; the call is refused and reads nothing.
    let result = unsafe { sys::cuMemcpyHtoDAsync_v2(buf, host.as_ptr().cast(), N * 4, stream.0) };
    assert_eq!(result, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        stream.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let mut graph = null_mut();
    // SAFETY: a capturing stream; the out-pointer is a live local.
    let result = unsafe { sys::cuStreamEndCapture(stream.0, &mut graph) };
    assert_eq!(result, CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(graph.is_null());

    // Pinned host memory: captured, and read at each launch.
    let mut pinned = null_mut();
    // SAFETY: the out-pointer is a live local.
    ok(unsafe { sys::cuMemAllocHost_v2(&mut pinned, N * 4) });
    let pinned = pinned.cast::<u32>();
    stream.begin_capture();
    // SAFETY: `pinned` holds `N` u32 and outlives the launches (synchronized below).
    ok(unsafe { sys::cuMemcpyHtoDAsync_v2(buf, pinned.cast(), N * 4, stream.0) });
    let exec = stream.end_capture();
    for value in [8u32, 9] {
        // SAFETY: `pinned` holds `N` u32; no copy from it is pending (the stream was
        // synchronized by the last read).
        unsafe { std::slice::from_raw_parts_mut(pinned, N).fill(value) };
        ok(exec.launch(&stream));
        assert_eq!(stream.read(buf), vec![value; N], "read at the launch");
    }
    drop(exec);
    // SAFETY: allocated above; no copy from it is pending.
    ok(unsafe { sys::cuMemFreeHost(pinned.cast()) });

    // Stream-ordered allocation: not modelled in a capture.
    stream.begin_capture();
    let mut ptr = 0;
    // SAFETY: the out-pointer is a live local; a live stream.
    let result = unsafe { sys::cuMemAllocAsync(&mut ptr, 64, stream.0) };
    assert_eq!(result, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    assert_eq!(
        stream.capture_status(),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    // SAFETY: a capturing stream; the out-pointer is a live local.
    let result = unsafe { sys::cuStreamEndCapture(stream.0, &mut graph) };
    assert_eq!(result, CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    checker.assert_clean("refusals in captures");
    free(buf);
}
