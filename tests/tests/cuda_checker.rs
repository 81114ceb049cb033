//! Negative controls for the CUDA simulator's happens-before checker (feature `cuda`): each test
//! makes one mistake that a GPU would turn into a race or a use-after-free, and asserts that the
//! checker reports it, next to the same exchange done right, which it must not report. These
//! tests need the simulator (a real driver has no checker); the test command runs them with it.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use dlpack_runtime::{DlpackExport, DlpackImport, ExportRequest};
use dlpack_tests::Counter;
use dlpack_tests::gpu::{CapturedGraph, GpuStrided, GpuTensor, GpuView, captured_copy};

const NEEDS_SIMULATOR: &str = "needs the CUDA simulator on the library path (scripts/cuda-sim.sh): a real driver has no checker";

const N: usize = 1024;

fn setup() -> (Arc<CudaContext>, Arc<CudaStream>, Arc<CudaStream>, Checker) {
    let ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    (ctx, a, b, checker)
}

fn ptr(buf: &CudaSlice<u32>, stream: &CudaStream) -> sys::CUdeviceptr {
    buf.device_ptr(stream).0
}

/// Enqueues a write of `value` to `len` u32 at `p` on `stream`.
fn fill(p: sys::CUdeviceptr, len: usize, value: u32, stream: &CudaStream) {
    // SAFETY: `p` is `len` u32 of a live allocation; stream-ordered.
    unsafe { sys::cuMemsetD32Async(p, value, len, stream.cu_stream()) }
        .result()
        .unwrap();
}

/// Exports a tensor written on `a` to a consumer on `b`, then writes it on `b` behind a gate.
fn consumer_writing(a: &Arc<CudaStream>, b: &Arc<CudaStream>) -> (GpuView, Gate) {
    let t = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), a, &Counter::new());
    let view = GpuView::from_managed(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(view.shape, [N]);
    let gate = Gate::hold(b);
    fill(view.data.cuda_device_ptr().unwrap(), N, 9, b);
    (view, gate)
}

#[test]
fn a_deleter_run_before_the_consumer_stream_passed_its_event_is_reported() {
    let (_ctx, a, b, checker) = setup();
    // Wrong: the consumer drops the tensor while its own writes are pending; the producer's
    // deleter frees the memory in the producer's stream order, unordered with those writes.
    let (view, gate) = consumer_writing(&a, &b);
    drop(view);
    let n = checker.violations();
    let report = checker.report();
    gate.release();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    assert!(n >= 1, "the early deleter is reported");
    assert!(
        report.contains("free of allocation") && report.contains("is not ordered after the write"),
        "{report}"
    );
    // Right: release after the consumer's stream.
    checker.reset();
    let (view, gate) = consumer_writing(&a, &b);
    view.data.release_after(&b).unwrap();
    gate.release();
    b.synchronize().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    a.synchronize().unwrap();
    checker.assert_clean("release_after");
}

#[test]
fn a_copy_not_ordered_after_the_producer_work_is_reported() {
    let (_ctx, a, b, checker) = setup();
    let src = a.alloc_zeros::<u32>(N).unwrap();
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.reset();
    // Wrong: the consumer's stream copies the producer's buffer without waiting for the
    // producer's pending write.
    let gate = Gate::hold(&a);
    fill(ptr(&src, &a), N, 3, &a);
    // SAFETY: both are `N` u32 of live allocations; stream-ordered on B.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst.device_ptr(&b).0, ptr(&src, &a), N * 4, b.cu_stream()) }
        .result()
        .unwrap();
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains("read of bytes") && report.contains("cuMemsetD32Async"),
        "{report}"
    );
    gate.release();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // Right: copy=True to the consumer's stream orders the copy after the producer's work.
    checker.reset();
    let gate = Gate::hold(&a);
    fill(ptr(&src, &a), N, 4, &a);
    let t = GpuTensor::new(src, &a, &Counter::new());
    let view = GpuView::from_managed(
        t.into_dlpack_with(
            &ExportRequest::versioned()
                .stream(Some(b.cu_stream() as i64))
                .copy(Some(true)),
        )
        .unwrap(),
    )
    .unwrap();
    gate.release();
    b.synchronize().unwrap();
    drop(view);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("copy=True");
}

#[test]
fn accesses_to_freed_memory_and_unordered_frees_are_reported() {
    let (_ctx, a, b, checker) = setup();
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the context is current (bound by `setup`).
    unsafe { sys::cuMemAlloc_v2(&mut p, N * 4) }
        .result()
        .unwrap();
    // A write on B, then a host-side free without synchronizing with B.
    let gate = Gate::hold(&b);
    fill(p, N, 1, &b);
    // SAFETY: `p` is a live allocation of this context.
    unsafe { sys::cuMemFree_v2(p) }.result().unwrap();
    assert_eq!(checker.violations(), 1, "{}", checker.report());
    assert!(checker.report().contains("free of allocation"));
    // Touching the freed memory is reported and refused.
    // SAFETY: `p` is stale on purpose: the driver must refuse it.
    let result = unsafe { sys::cuMemsetD32Async(p, 0, N, a.cu_stream()) };
    assert_eq!(result, sys::CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(checker.violations(), 2);
    assert!(
        checker.report().contains("already freed by cuMemFree"),
        "{}",
        checker.report()
    );
    gate.release();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
}

#[test]
fn memory_allocated_in_stream_order_is_not_usable_before_the_allocation() {
    let (_ctx, a, b, checker) = setup();
    // Allocate on A behind a gate, write on B without ordering after A.
    let gate = Gate::hold(&a);
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a valid out-pointer and a live stream.
    unsafe { sys::cuMemAllocAsync(&mut p, N * 4, a.cu_stream()) }
        .result()
        .unwrap();
    fill(p, N, 1, &b);
    assert_eq!(checker.violations(), 1, "{}", checker.report());
    gate.release();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // SAFETY: a live allocation; every access is ordered before this host-side free.
    unsafe { sys::cuMemFree_v2(p) }.result().unwrap();
    assert_eq!(checker.violations(), 1);
}

/// Copies of strided CUDA views take as few driver copies as their layout allows: what
/// README's "copies" paragraph promises, counted by the simulator.
#[test]
fn strided_copies_take_the_fewest_driver_copies() {
    let (_ctx, a, b, checker) = setup();
    let (rows, cols) = (64usize, 48usize);
    let host: Vec<u32> = (0..(rows * cols) as u32).collect();
    let view = |shape: &[usize], strides: &[isize], offset: usize| GpuStrided {
        data: a.clone_htod(&host).unwrap(),
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        byte_offset: offset * 4,
        stream: a.clone(),
        guard: Default::default(),
    };
    let column_slice = || view(&[rows, 24], &[cols as isize, 1], 10);
    let transposed = || view(&[cols, rows], &[1, cols as isize], 0);
    let on_b = ExportRequest::versioned()
        .stream(Some(b.cu_stream() as i64))
        .copy(Some(true));
    let to_host = ExportRequest::versioned().dl_device(dlpack_runtime::Device::CPU);
    // (view, request, 2-D copies, 1-D device-to-host copies)
    let cases: [(GpuStrided, &ExportRequest, u64, u64); 3] = [
        // One block of rows, on the consumer's stream and to the host.
        (column_slice(), &on_b, 1, 0),
        (column_slice(), &to_host, 1, 0),
        // Many blocks over a span no larger than twice the elements: one transfer, compacted
        // on the host.
        (transposed(), &to_host, 0, 1),
    ];
    // A host copy is staged in one transfer when the span is at most twice the elements plus
    // 1 MiB: a sparse view of a 1.04 MiB buffer just inside that bound, and a sparser one just
    // outside it (copied block by block).
    let (big_rows, big_cols) = (532usize, 512usize);
    let big: Vec<u32> = (0..(big_rows * big_cols) as u32).collect();
    let sparse = |columns: usize, step: isize| GpuStrided {
        data: a.clone_htod(&big).unwrap(),
        shape: vec![big_rows, columns],
        strides: vec![big_cols as isize, step],
        byte_offset: 0,
        stream: a.clone(),
        guard: Default::default(),
    };
    for (t, staged) in [(sparse(16, 32), true), (sparse(4, 128), false)] {
        a.synchronize().unwrap();
        checker.reset();
        let managed = t.into_dlpack_with(&to_host).unwrap();
        let (two_d, one_d) = (
            checker.operations("cuMemcpy2DAsync"),
            checker.operations("cuMemcpyDtoHAsync"),
        );
        if staged {
            assert_eq!((two_d, one_d), (0, 1), "staged");
        } else {
            assert!(one_d == 0 && two_d > 0, "block by block: {two_d}, {one_d}");
        }
        drop(managed);
    }
    for (n, (t, request, two_d, one_d)) in cases.into_iter().enumerate() {
        a.synchronize().unwrap();
        checker.reset();
        let managed = t.into_dlpack_with(request).unwrap();
        b.synchronize().unwrap();
        assert_eq!(
            (
                checker.operations("cuMemcpy2DAsync"),
                checker.operations("cuMemcpyDtoHAsync")
            ),
            (two_d, one_d),
            "case {n}"
        );
        assert!(managed.is_copied());
        drop(managed);
    }
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("strided copies");
}

/// A user's own tensor type that keeps an import and lends it on (a relay): no stream field.
#[derive(DlpackImport, DlpackExport)]
struct Relay {
    #[dlpack(data)]
    data: dlpack_runtime::ImportedData<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A tensor whose write of 7 is pending on `a` behind a gate, imported into a [`Relay`] for
/// the consumer stream `first` (`-1`: no synchronization), then lent on to `c` and imported
/// there; a read of its last element is enqueued on `c` into `out`, still behind the gate.
fn relayed(
    a: &Arc<CudaStream>,
    first: i64,
    c: &Arc<CudaStream>,
    out: &CudaSlice<u32>,
) -> (GpuView, Gate) {
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    let gate = Gate::hold(a);
    fill(ptr(&buf, a), N, 7, a);
    let t = GpuTensor::new(buf, a, &Counter::new());
    let relay = Relay::from_managed(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(first)))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(relay.shape, [N]);
    let view = GpuView::from_managed(
        relay
            .into_dlpack_with(&ExportRequest::versioned().stream(Some(c.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    let last = view.data.cuda_device_ptr().unwrap() + (N as u64 - 1) * 4;
    // SAFETY: `last` is a u32 of the imported allocation, `out` a live u32; stream-ordered on C.
    unsafe { sys::cuMemcpyDtoDAsync_v2(out.device_ptr(c).0, last, 4, c.cu_stream()) }
        .result()
        .unwrap();
    (view, gate)
}

#[test]
fn a_relay_through_a_users_own_type_orders_the_next_consumer_after_the_producer() {
    let (ctx, a, b, checker) = setup();
    let c = ctx.new_stream().unwrap();
    let out = c.alloc_zeros::<u32>(1).unwrap();
    c.synchronize().unwrap();
    checker.reset();
    // Wrong: the first import asks for no synchronization (`stream=-1`), so it carries nothing
    // to be ready after, and the read on C races with the producer's write.
    let (view, gate) = relayed(&a, -1, &c, &out);
    assert!(view.data.managed().ready_events().is_none());
    let n = checker.violations();
    let report = checker.report();
    gate.release();
    a.synchronize().unwrap();
    c.synchronize().unwrap();
    drop(view);
    assert!(n >= 1, "the unordered read of the relay is reported");
    assert!(
        report.contains("read of bytes") && report.contains("cuMemsetD32Async"),
        "{report}"
    );
    // Right: imported for B, kept in a type with no stream field, lent on to C: C waits for
    // the producer's write with nothing added by the user.
    checker.reset();
    let (view, gate) = relayed(&a, b.cu_stream() as i64, &c, &out);
    let carried = view.data.managed().ready_events().map_or(0, |e| e.len());
    assert_eq!(
        carried, 1,
        "the relayed tensor carries the producer's event on"
    );
    assert_eq!(checker.violations(), 0, "{}", checker.report());
    gate.release();
    assert_eq!(c.clone_dtoh(&out).unwrap(), [7]);
    drop(view);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("a relay through a user's own type");
}

#[test]
fn a_relay_released_after_a_stream_is_released_after_its_producer_too() {
    let (ctx, a, b, checker) = setup();
    let c = ctx.new_stream().unwrap();
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    checker.reset();
    let gate = Gate::hold(&a);
    fill(ptr(&buf, &a), N, 7, &a);
    let t = GpuTensor::new(buf, &a, &counter);
    let relay = Relay::from_managed(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    // Released after C, which never used it: the release still waits for the producer's write.
    relay.data.release_after(&c).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        counter.get(),
        0,
        "released while the producer's write is pending"
    );
    gate.release();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while counter.get() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(counter.get(), 1);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("a relay released after another stream");
}

/// Global capture, as PyTorch captures: these tests run one at a time (they hold the checker).
const GLOBAL: sys::CUstreamCaptureMode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

/// A producer tensor of `N` u32 written with `value` on `a` behind a gate, and a destination of
/// `N` u32 on `b` (with its pointer), made before any capture.
fn gated_producer_and_destination(
    a: &Arc<CudaStream>,
    b: &Arc<CudaStream>,
    value: u32,
) -> (GpuTensor, Gate, CudaSlice<u32>, sys::CUdeviceptr) {
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    let dst_ptr = ptr(&dst, b);
    let src = a.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let gate = Gate::hold(a);
    fill(ptr(&src, a), N, value, a);
    (GpuTensor::new(src, a, &Counter::new()), gate, dst, dst_ptr)
}

#[test]
fn a_captured_import_without_the_dependency_is_reported_at_launch() {
    let (_ctx, a, b, checker) = setup();
    // Wrong: the import under capture asks for no synchronization (`stream=-1`); the graph's
    // copy reads the producer's memory while its write is held.
    let (t, gate, dst, dst_ptr) = gated_producer_and_destination(&a, &b, 5);
    let request = ExportRequest::versioned().stream(Some(-1));
    let (graph, view) = captured_copy(t, &request, &b, dst_ptr, GLOBAL);
    checker.assert_clean("a capture runs nothing");
    graph.launch(&b);
    let report = checker.report();
    assert!(
        checker.violations() >= 1,
        "the unordered launch is reported"
    );
    assert!(
        report.contains("cuMemsetD32Async") && report.contains("cuMemcpyDtoDAsync"),
        "{report}"
    );
    gate.release();
    b.synchronize().unwrap();
    drop((graph, view, dst));
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // Right: the import names the capturing stream; three launches, the first while held.
    checker.reset();
    let (t, gate, dst, dst_ptr) = gated_producer_and_destination(&a, &b, 6);
    let request = ExportRequest::versioned().stream(Some(b.cu_stream() as i64));
    let (graph, view) = captured_copy(t, &request, &b, dst_ptr, GLOBAL);
    for _ in 0..3 {
        graph.launch(&b);
        gate.release();
        b.synchronize().unwrap();
        assert_eq!(b.clone_dtoh(&dst).unwrap(), vec![6; N]);
    }
    checker.assert_clean("an import under capture with its dependency");
    drop((graph, view, dst));
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("the release after the launches");
}

#[test]
fn a_launch_after_the_captured_import_was_released_is_reported() {
    let (_ctx, a, b, checker) = setup();
    let (t, gate, dst, dst_ptr) = gated_producer_and_destination(&a, &b, 8);
    let request = ExportRequest::versioned().stream(Some(b.cu_stream() as i64));
    let (graph, view) = captured_copy(t, &request, &b, dst_ptr, GLOBAL);
    graph.launch(&b);
    gate.release();
    b.synchronize().unwrap();
    assert_eq!(b.clone_dtoh(&dst).unwrap(), vec![8; N]);
    // Wrong: the import (its memory and the event its graph waits on) is released while the
    // graph is still launched.
    drop(view);
    a.synchronize().unwrap();
    checker.assert_clean("launched while the import lived");
    // The simulator reports the freed memory; what the launch returns is not asserted (a GPU
    // would read freed memory).
    let _ = graph.try_launch(&b);
    let _ = b.synchronize();
    let report = checker.report();
    assert!(
        checker.violations() >= 1,
        "the launch after the release is reported"
    );
    assert!(report.contains("freed"), "{report}");
    // The event the graph waited on went with the import: destroyed, never pooled for reuse
    // (a reused event would silently move the launch's wait).
    assert!(report.contains("which was destroyed"), "{report}");
    drop((graph, dst));
    checker.reset();
}

#[test]
fn a_copy_for_a_stream_outside_a_global_capture_leaves_the_capture_valid() {
    let (ctx, a, b, checker) = setup();
    let c = ctx.new_stream().unwrap();
    let src = a.alloc_zeros::<u32>(N).unwrap();
    fill(ptr(&src, &a), N, 3, &a);
    let t = GpuTensor::new(src, &a, &Counter::new());
    // Another thread captures `c` in global mode, as PyTorch does, while this one asks for a
    // copy on `b`: the copy's allocation must neither fail nor invalidate that capture.
    let (begun_tx, begun_rx) = std::sync::mpsc::channel();
    let (copied_tx, copied_rx) = std::sync::mpsc::channel::<()>();
    let capturing = {
        let (ctx, c) = (ctx.clone(), c.clone());
        std::thread::spawn(move || {
            ctx.bind_to_thread().unwrap();
            // SAFETY: a live stream of the bound context.
            unsafe { CapturedGraph::begin(c.cu_stream(), GLOBAL) };
            begun_tx.send(()).unwrap();
            copied_rx.recv().unwrap();
            // SAFETY: being captured (begun above).
            unsafe { CapturedGraph::end(c.cu_stream()) }.map(drop)
        })
    };
    begun_rx.recv().unwrap();
    let copied = t.into_dlpack_with(
        &ExportRequest::versioned()
            .stream(Some(b.cu_stream() as i64))
            .copy(Some(true)),
    );
    copied_tx.send(()).unwrap();
    let ended = capturing.join().unwrap();
    let view = GpuView::from_managed(copied.expect("the copy is made")).unwrap();
    assert_eq!(ended, Ok(()), "the other thread's capture stays valid");
    let out = b.alloc_zeros::<u32>(N).unwrap();
    // SAFETY: `N` u32 of the copy into `N` u32 of live memory; stream-ordered on `b`.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            ptr(&out, &b),
            view.data.cuda_device_ptr().unwrap(),
            N * 4,
            b.cu_stream(),
        )
    }
    .result()
    .unwrap();
    b.synchronize().unwrap();
    assert_eq!(b.clone_dtoh(&out).unwrap(), vec![3; N]);
    drop(view);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("a copy beside a global capture");
}

#[test]
fn the_kit_finds_the_simulator_on_the_library_path() {
    // The test command puts the simulator first on the library path: the kit's loader keeps it
    // and says so, and its checker is there.
    assert_eq!(
        cuda_sim_testing::load(),
        Ok(cuda_sim_testing::Driver::Simulator)
    );
    assert!(Checker::attach().is_some(), "{NEEDS_SIMULATOR}");
}
