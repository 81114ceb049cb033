//! The CUDA hand-off (feature `cuda`), on any CUDA driver: the simulator (`cuda-sim`, run by
//! the test command) or a GPU (`scripts/gpu-suite.sh`). Pending producer work is a [`Gate`] on
//! the producer's stream, so every ordering the tests assert is deterministic, on hardware as on
//! the simulator; where the loaded driver is the simulator, its happens-before checker must
//! also report no violation (and, for the race without a dependency, must report one).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use dlpack_runtime::__testing::cuda as driver;
use dlpack_runtime::cuda::{self, CudaError};
use dlpack_runtime::{
    Device, DlpackExport, DlpackImport, ExportBuffer, ExportError, ExportRequest,
};
use dlpack_tests::gpu::{
    CapturedGraph, GpuStrided, GpuTensor, GpuView, capture_status, captured_copy,
};
use dlpack_tests::{Counter, DropGuard, expected_driver};

const NEEDS_DRIVER: &str =
    "needs a CUDA driver: the CUDA simulator on the library path (scripts/cuda-sim.sh) or a GPU";

#[test]
fn without_a_driver_exports_and_probes_are_errors_not_panics() {
    match cuda::init() {
        Err(CudaError::NoDriver) => {
            assert_ne!(expected_driver(), Some(true), "a driver was expected");
            assert_eq!(driver::pointer_device(0x1000), Err(CudaError::NoDriver));
            assert!(cuda::ReadyEvents::record(&[]).unwrap().is_empty());
        }
        other => {
            assert_ne!(
                expected_driver(),
                Some(false),
                "no driver was expected: {other:?}"
            );
            other.expect("the driver initializes");
            // With a driver, a host pointer is not device memory.
            let host = 0u64;
            assert!(driver::pointer_device(&host as *const u64 as u64).is_err());
        }
    }
}

/// The primary context of device 0 and two streams on it; the checker, reset, if the driver is
/// the simulator.
fn setup() -> (
    Arc<CudaContext>,
    Arc<CudaStream>,
    Arc<CudaStream>,
    Option<Checker>,
) {
    cuda::init().expect(NEEDS_DRIVER);
    let ctx = CudaContext::new(0).unwrap();
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    (ctx, a, b, Checker::attach())
}

fn assert_clean(checker: &Option<Checker>, what: &str) {
    if let Some(c) = &checker {
        c.assert_clean(what);
    }
}

/// Elements of the 1-D test tensors.
const N: usize = 4096;

fn cuda_ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> sys::CUdeviceptr {
    use cudarc::driver::DevicePtr;
    let (ptr, _sync) = buf.device_ptr(stream);
    ptr
}

/// Enqueues a write of `value` to every element of `buf` on `stream`.
fn fill(buf: &CudaSlice<u32>, stream: &CudaStream, value: u32) {
    let ptr = cuda_ptr(buf, stream);
    // SAFETY: `ptr` points to `buf.len()` u32 of a live allocation; stream-ordered.
    unsafe { sys::cuMemsetD32Async(ptr, value, buf.len(), stream.cu_stream()) }
        .result()
        .unwrap();
}

/// Enqueues, on `stream`, a copy of the `u32` at `ptr` into `out` (device memory).
fn copy_one_on(ptr: sys::CUdeviceptr, out: &CudaSlice<u32>, stream: &CudaStream) {
    // SAFETY: `ptr` is a live u32 of device memory, `out` a live u32; stream-ordered.
    unsafe { sys::cuMemcpyDtoDAsync_v2(cuda_ptr(out, stream), ptr, 4, stream.cu_stream()) }
        .result()
        .unwrap();
}

fn last(ptr: sys::CUdeviceptr, len: usize) -> sys::CUdeviceptr {
    ptr + (len as u64 - 1) * 4
}

/// Whether `stream` has no pending work (`cuStreamQuery`).
fn idle(stream: &CudaStream) -> bool {
    // SAFETY: a live stream; query only.
    let result = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    assert!(
        matches!(
            result,
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY
        ),
        "{result:?}"
    );
    result == sys::CUresult::CUDA_SUCCESS
}

/// Whether `stream` has no pending work within `within` (polled).
fn becomes_idle(stream: &CudaStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if idle(stream) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Runs `f` on another thread; the receiver gets its result.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// How long a call that must block is watched before the test concludes that it blocks.
const BLOCKED: Duration = Duration::from_millis(200);
/// How long a call that must return is given (a bound on a hang, not a speed target).
const RETURNS: Duration = Duration::from_secs(20);

#[test]
fn a_cross_stream_race_is_shown_without_the_dependency_and_absent_with_it() {
    let (ctx, a, b, checker) = setup();
    let (mut wrong_without, mut wrong_with) = (0, 0);
    let (mut flagged_without, mut flagged_with) = (0, 0);
    let result = b.alloc_zeros::<u32>(1).unwrap();
    for trial in 0..100u32 {
        for with_dependency in [false, true] {
            let counter = Counter::new();
            let buf = a.alloc_zeros::<u32>(N).unwrap();
            a.synchronize().unwrap();
            let before = checker.as_ref().map_or(0, Checker::violations);
            // The producer's write is pending behind the gate when the consumer is handed
            // the tensor.
            let gate = Gate::hold(&a);
            let value = trial + 1;
            fill(&buf, &a, value);
            let t = GpuTensor::new(buf, &a, &counter);
            let stream = if with_dependency {
                b.cu_stream() as i64
            } else {
                -1
            };
            let view = GpuView::from_managed(
                t.into_dlpack_with(&ExportRequest::versioned().stream(Some(stream)))
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(view.device, Device::cuda(0));
            assert_eq!(view.shape, [N]);
            // The consumer reads on its stream. Before the producer's work is let go, that read
            // has run if and only if nothing orders it after the producer's work.
            copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
            let watch = if with_dependency {
                Duration::from_millis(2)
            } else {
                RETURNS
            };
            assert_eq!(
                becomes_idle(&b, watch),
                !with_dependency,
                "trial {trial}: the consumer's stream ran ahead of the held producer"
            );
            gate.release();
            let got = b.clone_dtoh(&result).unwrap()[0];
            a.synchronize().unwrap();
            drop(view);
            assert_eq!(counter.get(), 1, "trial {trial}");
            let flagged = checker.as_ref().map_or(0, Checker::violations) > before;
            match (with_dependency, got == value) {
                (false, false) => wrong_without += 1,
                (true, false) => wrong_with += 1,
                _ => {}
            }
            match (with_dependency, flagged) {
                (false, true) => flagged_without += 1,
                (true, true) => flagged_with += 1,
                _ => {}
            }
        }
    }
    println!(
        "race over 100 trials: wrong values without the dependency {wrong_without}, with it \
         {wrong_with}; checker violations without {flagged_without}, with {flagged_with} (checker \
         {})",
        if checker.is_some() {
            "present"
        } else {
            "absent: a real driver"
        }
    );
    assert_eq!(
        wrong_with, 0,
        "the event dependency orders the consumer after the producer"
    );
    assert!(
        wrong_without >= 95,
        "without the dependency the consumer reads before the producer's write: {wrong_without}/100"
    );
    if let Some(c) = &checker {
        assert_eq!(flagged_with, 0, "{}", c.report());
        assert!(flagged_without >= 95, "{flagged_without}/100 flagged");
    }
    drop(ctx);
}

#[test]
fn the_host_is_not_blocked_by_an_event_dependency() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    // Warm up the pool and the driver.
    let warm = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    drop(
        warm.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    );
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 7);
    let t = GpuTensor::new(buf, &a, &counter);
    // The export returns while the producer's stream is held: it did not wait for the host.
    let consumer = b.cu_stream() as i64;
    let export =
        spawn(move || t.into_dlpack_with(&ExportRequest::versioned().stream(Some(consumer))));
    let managed = export
        .recv_timeout(RETURNS)
        .expect("the export returned while the producer's work was held")
        .unwrap();
    assert!(!idle(&a), "the producer's work is still pending");
    // Negative control: a host synchronization with the producer's stream does block.
    let a2 = a.clone();
    let host_sync = spawn(move || a2.synchronize());
    assert_eq!(
        host_sync.recv_timeout(BLOCKED).err(),
        Some(mpsc::RecvTimeoutError::Timeout),
        "a host synchronization waits for the held stream"
    );
    gate.release();
    host_sync.recv_timeout(RETURNS).unwrap().unwrap();
    let view = GpuView::from_managed(managed).unwrap();
    let result = b.alloc_zeros::<u32>(1).unwrap();
    copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
    assert_eq!(b.clone_dtoh(&result).unwrap(), [7]);
    drop(view);
    assert_eq!(counter.get(), 2);
    println!("event dependency: the export returned while the producer's stream was held");
    assert_clean(&checker, "host not blocked");
}

#[test]
fn after_warm_up_no_event_is_created_per_exchange() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let export = |counter: &Counter| {
        let t = GpuTensor::new(a.alloc_zeros::<u32>(1024).unwrap(), &a, counter);
        drop(
            t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
                .unwrap(),
        );
    };
    for _ in 0..10 {
        export(&counter);
    }
    let before = driver::events_created();
    for _ in 0..1000 {
        export(&counter);
    }
    println!(
        "events created by 1000 exchanges after warm-up: {}",
        driver::events_created() - before
    );
    assert_eq!(driver::events_created(), before);
    assert_eq!(counter.get(), 1010);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_clean(&checker, "1010 exchanges");
}

/// A view whose consumer's writes are pending behind a gate on `b`.
fn view_written_on(a: &Arc<CudaStream>, b: &Arc<CudaStream>, counter: &Counter) -> (GpuView, Gate) {
    let t = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), a, counter);
    let view = GpuView::from_managed(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    let gate = Gate::hold(b);
    let ptr = view.data.cuda_device_ptr().unwrap();
    // SAFETY: `ptr` is `N` u32 of the imported, writable allocation; stream-ordered on B.
    unsafe { sys::cuMemsetD32Async(ptr, 5, N, b.cu_stream()) }
        .result()
        .unwrap();
    (view, gate)
}

#[test]
fn stream_ordered_release_waits_for_the_consumer() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let (view, gate) = view_written_on(&a, &b, &counter);
    view.data.release_after(&b).unwrap();
    assert_eq!(
        counter.get(),
        0,
        "not released while the consumer's work is pending"
    );
    assert!(!idle(&b));
    // The reaper is still waiting: nothing is released however long the work is held.
    std::thread::sleep(BLOCKED);
    assert_eq!(counter.get(), 0);
    gate.release();
    b.synchronize().unwrap();
    let deadline = Instant::now() + RETURNS;
    while counter.get() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("stream-ordered release: deleter ran after the consumer's stream finished");
    assert_eq!(counter.get(), 1);
    a.synchronize().unwrap();
    assert_clean(&checker, "stream-ordered release");
}

#[test]
fn ready_events_let_the_consumer_wait_later() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 100);
    let t = GpuTensor::new(buf, &a, &counter);
    let (managed, ready) = t
        .into_dlpack_with_ready_events(&ExportRequest::versioned().stream(Some(-1)))
        .unwrap();
    assert!(!ready.is_empty());
    let view = GpuView::from_managed(managed).unwrap();
    ready.wait_on(&b).unwrap();
    let result = b.alloc_zeros::<u32>(1).unwrap();
    copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
    gate.release();
    assert_eq!(b.clone_dtoh(&result).unwrap(), [100]);
    a.synchronize().unwrap();
    drop(view);
    assert!(cuda::ReadyEvents::record(&[]).unwrap().is_empty());
    // The host can wait on them too: `synchronize` returns only once the held work has run.
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    let gate = Arc::new(Gate::hold(&a));
    fill(&buf, &a, 5);
    let t = GpuTensor::new(buf, &a, &counter);
    let (managed, ready) = t
        .into_dlpack_with_ready_events(&ExportRequest::versioned().stream(Some(-1)))
        .unwrap();
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let releaser = {
        let (gate, released) = (gate.clone(), released.clone());
        std::thread::spawn(move || {
            std::thread::sleep(BLOCKED);
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            gate.release();
        })
    };
    ready.synchronize().unwrap();
    assert!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        "synchronize returned before the producer's work was let go"
    );
    releaser.join().unwrap();
    let view = GpuView::from_managed(managed).unwrap();
    copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
    assert_eq!(b.clone_dtoh(&result).unwrap(), [5]);
    drop(view);
    assert_clean(&checker, "ready events");
}

#[test]
fn illegal_streams_and_wrong_devices_are_refused() {
    let (_ctx, a, _b, checker) = setup();
    let counter = Counter::new();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let err = t
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(0)))
        .unwrap_err();
    assert!(matches!(err, ExportError::Stream(_)), "{err}");
    assert_eq!(counter.get(), 1);
    let other = a.alloc_zeros::<u32>(4).unwrap();
    match driver::check_pointer(cuda_ptr(&other, &a), 3) {
        Err(CudaError::WrongDevice {
            found: 0,
            expected: 3,
            ..
        }) => {}
        other => panic!("expected WrongDevice, found {other:?}"),
    }
    a.synchronize().unwrap();
    assert_clean(&checker, "refusals");
}

/// `len` values `0..len`, written on `stream` behind a gate (and behind memsets of other
/// values): a consumer not ordered after `stream` reads the wrong values. The pattern is
/// uploaded to a second buffer first and copied on the device behind the gate, so that nothing
/// the host does waits for the held stream.
fn pattern_behind_a_gate(stream: &Arc<CudaStream>, len: usize) -> (CudaSlice<u32>, Gate) {
    let host: Vec<u32> = (0..len as u32).collect();
    let source = stream.clone_htod(&host).unwrap();
    let buf = stream.alloc_zeros::<u32>(len).unwrap();
    stream.synchronize().unwrap();
    let gate = Gate::hold(stream);
    fill(&buf, stream, 0x8000_0000);
    // SAFETY: both are `len` u32 of live allocations; stream-ordered on `stream`.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            cuda_ptr(&buf, stream),
            cuda_ptr(&source, stream),
            len * 4,
            stream.cu_stream(),
        )
    }
    .result()
    .unwrap();
    // `source` is freed in stream order after the copy.
    drop(source);
    (buf, gate)
}

/// A strided view (strides and offset in elements) of a `rows * cols` buffer holding
/// `0..rows * cols` behind a gate on `stream`, the gate, and the values the view's elements
/// hold, in row-major order.
fn view_behind_a_gate(
    stream: &Arc<CudaStream>,
    (rows, cols): (usize, usize),
    (shape, strides, offset): (&[usize], &[isize], usize),
    counter: &Counter,
) -> (GpuStrided, Gate, Vec<u32>) {
    let (data, gate) = pattern_behind_a_gate(stream, rows * cols);
    let t = GpuStrided {
        data,
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        byte_offset: offset * 4,
        stream: stream.clone(),
        guard: counter.guard(),
    };
    let expected = indices(shape, strides, offset)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    (t, gate, expected)
}

/// Reads `len` u32 at `ptr` on `stream`, then waits for `stream` only.
fn read_all_on(ptr: sys::CUdeviceptr, len: usize, stream: &CudaStream) -> Vec<u32> {
    let mut out = vec![0u32; len];
    // SAFETY: `ptr` is the start of `len` u32 of device memory; `out` has room; synchronized.
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, len * 4, stream.cu_stream())
            .result()
            .unwrap();
    }
    stream.synchronize().unwrap();
    out
}

/// Row-major element indices of a strided view (strides and offset in elements).
fn indices(shape: &[usize], strides: &[isize], offset: usize) -> Vec<usize> {
    let numel: usize = shape.iter().product();
    (0..numel)
        .map(|linear| {
            let mut rest = linear;
            let mut at = offset as isize;
            for axis in (0..shape.len()).rev() {
                at += (rest % shape[axis]) as isize * strides[axis];
                rest /= shape[axis];
            }
            at as usize
        })
        .collect()
}

/// Waits (bounded) until `counter` reaches `n`.
fn wait_for_count(counter: &Counter, n: usize) {
    let deadline = Instant::now() + RETURNS;
    while counter.get() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(counter.get(), n);
}

/// A legacy request (no `max_version`) cannot say read-only: a shared CUDA tensor reaches that
/// consumer as a writable copy of its own, enqueued on its stream after the producer's work,
/// without blocking the host; with `copy=False` the request is refused.
#[test]
fn legacy_consumers_of_read_only_cuda_tensors_get_a_copy_on_their_stream() {
    let (_ctx, a, b, checker) = setup();
    let (rows, cols) = (32usize, 48usize);
    let counter = Counter::new();
    let (t, gate, expected) = view_behind_a_gate(
        &a,
        (rows, cols),
        (&[cols, rows], &[1, cols as isize], 0),
        &counter,
    );
    let shared = Arc::new(t);
    let stream = Some(b.cu_stream() as i64);
    let err = Arc::clone(&shared)
        .into_dlpack_with(&ExportRequest::new().stream(stream).copy(Some(false)))
        .unwrap_err();
    assert_eq!(err, ExportError::ReadOnlyLegacy);
    let managed = Arc::clone(&shared)
        .into_dlpack_with(&ExportRequest::new().stream(stream))
        .unwrap();
    assert!(
        !idle(&a),
        "the export returned with the producer's work held"
    );
    assert!(managed.is_legacy());
    let data = managed.dl_tensor().data as usize;
    let view = GpuView::from_managed(managed).unwrap();
    assert_eq!(view.shape, [cols, rows]);
    gate.release();
    let ptr = view.data.cuda_device_ptr().unwrap();
    assert_ne!(
        ptr as usize,
        cuda_ptr(&shared.data, &a) as usize,
        "a copy, not the producer's memory"
    );
    assert_eq!(ptr as usize, data);
    assert_eq!(read_all_on(ptr, rows * cols, &b), expected);
    drop(view);
    drop(shared);
    wait_for_count(&counter, 1);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_clean(&checker, "legacy copy of a read-only CUDA tensor");
}

#[test]
fn copy_true_is_enqueued_on_the_consumer_stream() {
    let (ctx, a, b, checker) = setup();
    let c = ctx.new_stream().unwrap();
    let (rows, cols) = (64usize, 96usize);
    // (shape, strides, offset): transposed (2-D blocks of one element per row), every other
    // column of reversed rows (element by element), a column slice (one 2-D block).
    let views: [(Vec<usize>, Vec<isize>, usize); 4] = [
        (vec![cols, rows], vec![1, cols as isize], 0),
        (
            vec![rows, cols / 2],
            vec![-(cols as isize), 2],
            (rows - 1) * cols,
        ),
        (vec![rows, 16], vec![cols as isize, 1], 8),
        // A reversed vector: one element per copy, each at its own destination offset.
        (vec![rows], vec![-1], rows - 1),
    ];
    for (shape, strides, offset) in views {
        let counter = Counter::new();
        let (t, gate, expected) =
            view_behind_a_gate(&a, (rows, cols), (&shape, &strides, offset), &counter);
        let request = ExportRequest::versioned()
            .stream(Some(b.cu_stream() as i64))
            .copy(Some(true));
        // The producer's tensor goes into the export and is dropped by it once the copy has
        // run (case C13: the source must stay allocated until then).
        let (managed, ready) = t.into_dlpack_with_ready_events(&request).unwrap();
        assert!(
            !idle(&a),
            "the export returned with the producer's work held"
        );
        assert!(managed.is_copied(), "{shape:?}");
        assert!(!managed.is_read_only(), "a copy is the consumer's to write");
        assert!(!ready.is_empty(), "a ready event follows the copy");
        assert_eq!(
            counter.get(),
            0,
            "the source is kept until the copy has run"
        );
        let view = GpuView::from_managed(managed).unwrap();
        assert_eq!(view.device, Device::cuda(0));
        assert_eq!(view.shape, shape);
        gate.release();
        let numel: usize = shape.iter().product();
        let ptr = view.data.cuda_device_ptr().unwrap();
        // The consumer's stream sees the copy; so does any stream that waits on the event.
        assert_eq!(read_all_on(ptr, numel, &b), expected, "{shape:?} on B");
        ready.wait_on(&c).unwrap();
        assert_eq!(
            read_all_on(ptr, numel, &c),
            expected,
            "{shape:?} after the ready event"
        );
        // The source is released once the consumer's stream has passed the copy.
        wait_for_count(&counter, 1);
        drop(view);
    }
    // stream=-1: no stream to order the copy before, so the host waits for it: the export
    // blocks while the producer's work is held, and any stream reads the copy afterwards.
    let counter = Counter::new();
    let (t, gate, expected) = view_behind_a_gate(
        &a,
        (rows, cols),
        (&[cols, rows], &[1, cols as isize], 0),
        &counter,
    );
    let export = spawn(move || {
        t.into_dlpack_with_ready_events(
            &ExportRequest::versioned().stream(Some(-1)).copy(Some(true)),
        )
    });
    assert!(
        export.recv_timeout(BLOCKED).is_err(),
        "a stream=-1 copy waits for the producer's work"
    );
    gate.release();
    let (managed, ready) = export.recv_timeout(RETURNS).unwrap().unwrap();
    assert!(
        ready.is_empty(),
        "a copy the host waited for needs no ready event"
    );
    assert_eq!(
        counter.get(),
        1,
        "the source is released once the copy has finished"
    );
    let view = GpuView::from_managed(managed).unwrap();
    assert_eq!(
        read_all_on(view.data.cuda_device_ptr().unwrap(), rows * cols, &c),
        expected
    );
    drop(view);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    println!("copy=True: transposed, reversed and sliced views copied on the consumer's stream");
    assert_clean(&checker, "copy=True");
}

#[test]
fn dl_device_cpu_copies_to_the_host_after_the_pending_work() {
    let (_ctx, a, _b, checker) = setup();
    let counter = Counter::new();
    let (rows, cols) = (256usize, 64usize);
    // A column slice (one block) and a transposed view (many blocks over a span no larger than
    // its elements, which come over in one transfer and are compacted on the host).
    let views: [(Vec<usize>, Vec<isize>, usize); 4] = [
        (vec![rows, 24], vec![cols as isize, 1], 10),
        (vec![cols, rows], vec![1, cols as isize], 0),
        // Every other row, reversed, from an offset: the first element is the last row's.
        (
            vec![rows / 2, 24],
            vec![-2 * cols as isize, 1],
            (rows - 1) * cols + 5,
        ),
        // Two overlapping rows, the second 8 elements before the first: a span that starts
        // below the first element and ends well past it, staged in one transfer.
        (vec![2, 60], vec![-8, 1], 8),
    ];
    for (n, (shape, strides, offset)) in views.into_iter().enumerate() {
        let (t, gate, expected) =
            view_behind_a_gate(&a, (rows, cols), (&shape, &strides, offset), &counter);
        let export =
            spawn(move || t.into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU)));
        assert!(
            export.recv_timeout(BLOCKED).is_err(),
            "a host copy waits for the producer's work"
        );
        gate.release();
        let managed = export.recv_timeout(RETURNS).unwrap().unwrap();
        assert_eq!(
            counter.get(),
            n + 1,
            "the source is released once the host has its copy"
        );
        assert!(managed.is_copied());
        let view = GpuView::from_managed(managed).unwrap();
        assert_eq!(view.device, Device::CPU);
        assert_eq!(view.shape, shape);
        assert_eq!(view.data.as_slice().unwrap(), &expected[..], "{shape:?}");
        match view.data.cuda_device_ptr() {
            Err(CudaError::WrongDevice {
                found: -1,
                expected: 0,
                ..
            }) => {}
            other => panic!("a host copy has no device pointer: {other:?}"),
        }
    }
    // copy=False cannot be served.
    let t = GpuStrided {
        data: a.alloc_zeros::<u32>(4).unwrap(),
        shape: vec![4],
        strides: vec![1],
        byte_offset: 0,
        stream: a.clone(),
        guard: counter.guard(),
    };
    assert_eq!(
        t.into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::CPU)
                .copy(Some(false))
        )
        .unwrap_err(),
        ExportError::CopyRequired {
            found: Device::cuda(0),
            requested: Device::CPU
        }
    );
    assert_eq!(counter.get(), 5);
    a.synchronize().unwrap();
    println!("dl_device=(CPU, 0): strided CUDA views copied to the host after the held work");
    assert_clean(&checker, "dl_device=(CPU, 0)");
}

#[test]
fn streams_are_checked_against_the_tensor_device() {
    use dlpack_runtime::__testing::StreamId;
    let (_ctx, a, b, checker) = setup();
    let handle = StreamId::Handle(core::num::NonZeroU64::new(b.cu_stream() as u64).unwrap());
    assert_eq!(driver::check_consumer_stream(handle, 0), Ok(()));
    assert_eq!(
        driver::check_consumer_stream(StreamId::LegacyDefault, 0),
        Ok(())
    );
    match driver::check_consumer_stream(handle, 1) {
        Err(CudaError::StreamOnOtherDevice {
            role: "consumer",
            found: 0,
            expected: 1,
            ..
        }) => {}
        // One GPU: there is no device 1 to compare with.
        Err(CudaError::Driver { .. }) if CudaContext::device_count().unwrap() < 2 => {}
        other => panic!("expected a refusal of device 1, found {other:?}"),
    }
    // An exchange leaves the thread's current context as it found it (here: none), so the
    // CUDA runtime of the caller (PyTorch, CuPy) keeps its device.
    let counter = Counter::new();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    // SAFETY: unbinding the current context is always allowed.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) }
        .result()
        .unwrap();
    let managed = t
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
        .unwrap();
    let mut current: sys::CUcontext = std::ptr::dangling_mut();
    // SAFETY: a valid out-pointer.
    unsafe { sys::cuCtxGetCurrent(&mut current) }
        .result()
        .unwrap();
    assert!(current.is_null(), "the current context was restored");
    drop(managed);
    // And so does the deleter of an export that carries no ready events (`stream=-1`),
    // although the owner's drop (its `CudaSlice`) binds the slice's context.
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let managed = t
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(-1)))
        .unwrap();
    assert!(managed.ready_events().is_none());
    // SAFETY: as above.
    unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) }
        .result()
        .unwrap();
    drop(managed);
    current = std::ptr::dangling_mut();
    // SAFETY: a valid out-pointer.
    unsafe { sys::cuCtxGetCurrent(&mut current) }
        .result()
        .unwrap();
    assert!(
        current.is_null(),
        "the deleter restored the current context"
    );
    match driver::check_producer_stream(&a, 3) {
        Err(CudaError::StreamOnOtherDevice {
            role: "producer",
            found: 0,
            expected: 3,
            ..
        }) => {}
        other => panic!("expected StreamOnOtherDevice, found {other:?}"),
    }
    a.synchronize().unwrap();
    assert_clean(&checker, "stream checks");
}

/// A context of device 0 that is not its primary context (`cuCtxCreate`), and the thread's
/// current context restored.
fn non_primary_context() -> Arc<CudaContext> {
    let mut before: sys::CUcontext = std::ptr::null_mut();
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointers; `cuCtxCreate` makes the new context current, and the pop and
    // set below restore what was current before.
    unsafe {
        sys::cuCtxGetCurrent(&mut before).result().unwrap();
        sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, 0)
            .result()
            .unwrap();
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped).result().unwrap();
        assert_eq!(popped, ctx);
        sys::cuCtxSetCurrent(before).result().unwrap();
    }
    // SAFETY: a context just created for device 0 (ordinal 0, `CUdevice` 0), owned from here on.
    unsafe { CudaContext::from_raw_context(0, 0, ctx) }.unwrap()
}

#[test]
fn streams_of_other_devices_and_contexts_are_told_apart() {
    use dlpack_runtime::__testing::StreamId;
    let (ctx, a, _b, checker) = setup();
    let handle = |s: &CudaStream| {
        StreamId::Handle(core::num::NonZeroU64::new(s.cu_stream() as u64).unwrap())
    };
    // A consumer stream of device 1, for a tensor of device 0.
    if CudaContext::device_count().unwrap() >= 2 {
        let other = CudaContext::new(1).unwrap().new_stream().unwrap();
        match driver::check_consumer_stream(handle(&other), 0) {
            Err(CudaError::StreamOnOtherDevice {
                role: "consumer",
                found: 1,
                expected: 0,
                ..
            }) => {}
            other => panic!("expected a stream of device 1 refused, found {other:?}"),
        }
        assert_eq!(driver::check_consumer_stream(handle(&other), 1), Ok(()));
    } else {
        println!("one device: a consumer stream of another device was not checked");
    }
    // The primary context's default streams are fine producer streams.
    assert_eq!(
        driver::check_producer_stream(&ctx.default_stream(), 0),
        Ok(())
    );
    assert_eq!(
        driver::check_producer_stream(&ctx.per_thread_stream(), 0),
        Ok(())
    );
    assert_eq!(driver::check_producer_stream(&a, 0), Ok(()));
    // Another context of the same device: its created streams are fine (as a producer's, and
    // as a consumer's to wait on), its default streams are not (the special handles name the
    // current context's, which this crate resolves in the primary one), and a consumer's
    // stream of it cannot take a copy (enqueued in the primary context).
    let other_ctx = non_primary_context();
    let created = other_ctx.new_stream().unwrap();
    assert_eq!(driver::check_producer_stream(&created, 0), Ok(()));
    assert_eq!(driver::check_consumer_stream(handle(&created), 0), Ok(()));
    match driver::check_producer_stream(&other_ctx.default_stream(), 0) {
        Err(CudaError::NotPrimaryContext {
            role: "producer",
            device: 0,
            ..
        }) => {}
        other => panic!("expected NotPrimaryContext, found {other:?}"),
    }
    let counter = Counter::new();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let err = t
        .into_dlpack_with(
            &ExportRequest::versioned()
                .stream(Some(created.cu_stream() as i64))
                .copy(Some(true)),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExportError::Cuda(CudaError::NotPrimaryContext {
                role: "consumer",
                ..
            })
        ),
        "{err}"
    );
    // Without a copy, a stream of another context of the device gets an event dependency.
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    drop(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(created.cu_stream() as i64)))
            .unwrap(),
    );
    assert_eq!(counter.get(), 2);
    created.synchronize().unwrap();
    a.synchronize().unwrap();
    assert_clean(&checker, "other contexts");
}

/// Starts capturing `stream` into a graph (relaxed mode), so work enqueued on it does not run.
fn begin_capture(stream: &CudaStream) {
    // SAFETY: a live stream.
    unsafe {
        sys::cuStreamBeginCapture_v2(
            stream.cu_stream(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .result()
    .unwrap();
}

/// Ends the capture of `stream` and destroys the graph.
fn end_capture(stream: &CudaStream) {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a stream being captured; a valid out-pointer; the graph is destroyed once.
    unsafe {
        sys::cuStreamEndCapture(stream.cu_stream(), &mut graph)
            .result()
            .unwrap();
        if !graph.is_null() {
            sys::cuGraphDestroy(graph).result().unwrap();
        }
    }
}

#[test]
fn streams_being_captured_take_no_copies_and_no_releases() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    begin_capture(&b);
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let err = t
        .into_dlpack_with(
            &ExportRequest::versioned()
                .stream(Some(b.cu_stream() as i64))
                .copy(Some(true)),
        )
        .unwrap_err();
    assert!(
        matches!(err, ExportError::Cuda(CudaError::Capturing { .. })),
        "{err}"
    );
    assert_eq!(counter.get(), 1, "the refused export released its tensor");
    assert!(err.to_string().contains("a copy for the consumer"), "{err}");
    // Refused before anything was enqueued: the capture goes on.
    assert_eq!(
        // SAFETY: a live stream.
        unsafe { capture_status(b.cu_stream()) },
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    // A tensor whose release is asked after a captured stream is leaked, never freed while the
    // graph may still read it.
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let view =
        GpuView::from_managed(t.into_dlpack_with(&ExportRequest::versioned()).unwrap()).unwrap();
    let err = view.data.release_after(&b).unwrap_err();
    assert!(matches!(err, CudaError::Capturing { .. }), "{err}");
    end_capture(&b);
    a.synchronize().unwrap();
    std::thread::sleep(BLOCKED);
    assert_eq!(counter.get(), 1, "leaked, not released");
    assert_clean(&checker, "captured streams");
}

/// Reads `buf` to the host after `stream`'s work so far.
fn read(buf: &CudaSlice<u32>, stream: &Arc<CudaStream>) -> Vec<u32> {
    stream.synchronize().unwrap();
    stream.clone_dtoh(buf).unwrap()
}

/// Thread-local capture: a global one would refuse the stream creation of tests running beside
/// these (it may synchronize), on every thread.
const THREAD_LOCAL: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

#[test]
fn an_export_to_a_stream_being_captured_orders_every_launch_of_its_graph() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    let dst_ptr = cuda_ptr(&dst, &b);
    let src = a.alloc_zeros::<u32>(N).unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    // The producer's write is held behind a gate through the capture and the first launch.
    let gate = Gate::hold(&a);
    fill(&src, &a, 7);
    let t = GpuTensor::new(src, &a, &counter);
    let request = ExportRequest::versioned().stream(Some(b.cu_stream() as i64));
    let (graph, view) = captured_copy(t, &request, &b, dst_ptr, THREAD_LOCAL);
    assert_eq!(
        view.data.ready_events().map(|e| e.len()),
        Some(1),
        "the import keeps the event its graph waits on"
    );
    assert_eq!(read(&dst, &b), vec![0; N], "captured work does not run");
    graph.launch(&b);
    // The host did not wait for the producer: the launch is enqueued behind its write.
    assert!(
        !becomes_idle(&b, BLOCKED),
        "the launch waits for the producer"
    );
    gate.release();
    assert_eq!(
        read(&dst, &b),
        vec![7; N],
        "launch 1 reads the producer's values"
    );
    for launch in 2..=3 {
        // SAFETY: `dst_ptr` is `N` u32 of live memory; stream-ordered on `b`.
        unsafe { sys::cuMemsetD32Async(dst_ptr, 0, N, b.cu_stream()) }
            .result()
            .unwrap();
        graph.launch(&b);
        assert_eq!(read(&dst, &b), vec![7; N], "launch {launch}");
    }
    drop(graph);
    drop(view);
    a.synchronize().unwrap();
    assert_eq!(counter.get(), 1);
    assert_clean(&checker, "an export under capture, launched three times");
}

#[test]
fn a_slice_whose_own_stream_is_the_capturing_one_is_exported_into_the_capture() {
    let (_ctx, _a, b, checker) = setup();
    let counter = Counter::new();
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    let dst_ptr = cuda_ptr(&dst, &b);
    // The slice lives on `b`, its write is pending there, and `b` is the consumer's stream,
    // being captured: cudarc's access tracking must not make `b` wait on an event recorded
    // before the capture (which would invalidate it).
    let src = b.alloc_zeros::<u32>(N).unwrap();
    fill(&src, &b, 4);
    let t = GpuTensor::new(src, &b, &counter);
    let request = ExportRequest::versioned().stream(Some(b.cu_stream() as i64));
    let (graph, view) = captured_copy(t, &request, &b, dst_ptr, THREAD_LOCAL);
    assert!(
        view.data.ready_events().is_none(),
        "no event outside the capture is needed, none is kept"
    );
    for launch in 1..=3 {
        // SAFETY: `dst_ptr` is `N` u32 of live memory; stream-ordered on `b`.
        unsafe { sys::cuMemsetD32Async(dst_ptr, 0, N, b.cu_stream()) }
            .result()
            .unwrap();
        graph.launch(&b);
        assert_eq!(read(&dst, &b), vec![4; N], "launch {launch}");
    }
    drop(graph);
    drop(view);
    b.context()
        .check_err()
        .expect("no error recorded by cudarc's tracking");
    assert_eq!(counter.get(), 1);
    assert_clean(&checker, "a slice of the capturing stream");
}

/// A stream of the current context that synchronizes with the legacy default stream
/// (`CU_STREAM_DEFAULT`, where cudarc makes non-blocking ones); destroyed on drop.
struct BlockingStream(sys::CUstream);

impl BlockingStream {
    fn new(ctx: &CudaContext) -> Self {
        ctx.bind_to_thread().unwrap();
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags 0; the context is current.
        unsafe { sys::cuStreamCreate(&mut stream, 0) }
            .result()
            .unwrap();
        Self(stream)
    }
}

impl Drop for BlockingStream {
    fn drop(&mut self) {
        // SAFETY: made by `new`, destroyed once.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

#[test]
fn stream_none_is_refused_while_a_blocking_stream_is_captured_and_the_capture_survives() {
    let (ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let blocking = BlockingStream::new(&ctx);
    let t = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
    let host = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
    // SAFETY: a live stream of the current context.
    unsafe { CapturedGraph::begin(blocking.0, THREAD_LOCAL) };
    // `stream=None`: the legacy default stream, which would join the capture.
    let err = t.into_dlpack_with(&ExportRequest::versioned()).unwrap_err();
    assert!(
        matches!(err, ExportError::Cuda(CudaError::LegacyStreamUnderCapture)),
        "{err}"
    );
    // A host copy goes on the per-thread default stream, outside the capture, and is waited for.
    let copied = GpuView::from_managed(
        host.into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(copied.data.as_slice().unwrap(), vec![0; N]);
    assert_eq!(
        // SAFETY: a live stream.
        unsafe { capture_status(blocking.0) },
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        "the capture goes on"
    );
    // SAFETY: being captured.
    drop(unsafe { CapturedGraph::end(blocking.0) }.expect("a valid capture"));
    assert_eq!(counter.get(), 2);
    // While only a non-blocking stream is captured, the legacy stream is ordered as usual.
    let t = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
    // SAFETY: a live stream of the current context.
    unsafe { CapturedGraph::begin(b.cu_stream(), THREAD_LOCAL) };
    let view = GpuView::from_managed(t.into_dlpack_with(&ExportRequest::versioned()).unwrap());
    // SAFETY: being captured.
    drop(unsafe { CapturedGraph::end(b.cu_stream()) }.expect("a valid capture"));
    drop(view.unwrap());
    a.synchronize().unwrap();
    assert_eq!(counter.get(), 3);
    assert_clean(&checker, "stream=None under capture");
}

#[test]
fn the_first_exchange_on_a_device_creates_its_event() {
    if cuda::init().is_ok() && CudaContext::device_count().unwrap() < 2 {
        println!("one device: the event pool of a fresh device was not checked");
        return;
    }
    let (_ctx, _a, _b, checker) = setup();
    // Device 1: no other test exchanges there, so its event pool starts empty.
    let ctx = CudaContext::new(1).unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let counter = Counter::new();
    let before = driver::events_created();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let view = GpuView::from_managed(
        t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(view.device, Device::cuda(1));
    assert_eq!(
        driver::events_created(),
        before + 1,
        "one event, then pooled"
    );
    drop(view);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_clean(&checker, "device 1");
}

/// A producer whose only stream is its buffer's own (`CudaSlice` records its stream).
#[derive(DlpackExport)]
struct SliceOnly {
    #[dlpack(data)]
    data: CudaSlice<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[test]
fn a_cuda_slice_brings_its_own_stream_and_stays_writable() {
    let (_ctx, a, b, checker) = setup();
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 11);
    let managed = SliceOnly {
        data: buf,
        shape: vec![N],
    }
    .into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
    .unwrap();
    assert!(
        !managed.is_read_only(),
        "an owned CudaSlice is lent writable"
    );
    let view = GpuView::from_managed(managed).unwrap();
    assert!(!view.data.is_read_only());
    let result = b.alloc_zeros::<u32>(1).unwrap();
    copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
    assert!(
        !becomes_idle(&b, Duration::from_millis(20)),
        "the consumer waits for the slice's stream"
    );
    gate.release();
    assert_eq!(b.clone_dtoh(&result).unwrap(), [11]);
    a.synchronize().unwrap();
    drop(view);
    assert_clean(&checker, "CudaSlice stream");
}

/// A CUDA tensor at an address no allocation has (fine while it has no elements), with pending
/// work on `stream`.
#[derive(DlpackExport)]
struct EmptyCuda {
    #[dlpack(data)]
    data: dlpack_tests::types::FakeCuda,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: Arc<CudaStream>,
    _guard: DropGuard,
}

#[test]
fn zero_size_cuda_tensors_are_exchanged_without_touching_their_pointer() {
    let (_ctx, a, b, checker) = setup();
    let counter = Counter::new();
    for shape in [vec![0], vec![2, 0, 3]] {
        for request in [
            ExportRequest::versioned().stream(Some(b.cu_stream() as i64)),
            ExportRequest::versioned().stream(Some(-1)),
            ExportRequest::versioned()
                .stream(Some(b.cu_stream() as i64))
                .copy(Some(true)),
            ExportRequest::versioned().dl_device(Device::CPU),
        ] {
            let t = EmptyCuda {
                data: dlpack_tests::types::FakeCuda {
                    address: 0x7f00_0000_0000,
                    len: 0,
                },
                shape: shape.clone(),
                stream: a.clone(),
                _guard: counter.guard(),
            };
            let managed = t
                .into_dlpack_with(&request)
                .unwrap_or_else(|e| panic!("{shape:?}, {request:?}: {e}"));
            assert_eq!(managed.dl_tensor().ndim as usize, shape.len());
        }
    }
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // Copies release their source once the consumer's stream has passed the copy.
    wait_for_count(&counter, 8);
    assert_clean(&checker, "zero-size tensors");
}

#[test]
fn a_zero_size_copy_without_synchronization_does_not_wait_for_the_producer() {
    let (_ctx, a, _b, checker) = setup();
    let counter = Counter::new();
    let copy_without_sync = ExportRequest::versioned().stream(Some(-1)).copy(Some(true));
    let gate = Gate::hold(&a);
    let t = EmptyCuda {
        data: dlpack_tests::types::FakeCuda {
            address: 0x7f00_0000_0000,
            len: 0,
        },
        shape: vec![4, 0],
        stream: a.clone(),
        _guard: counter.guard(),
    };
    // A copy of nothing is finished at once: the export returns while the producer is held.
    let request = copy_without_sync;
    let export = spawn(move || t.into_dlpack_with(&request).map(|m| m.is_copied()));
    let copied = export
        .recv_timeout(RETURNS)
        .expect("a zero-size copy=True, stream=-1 export returned while the producer was held");
    assert!(copied.unwrap(), "the result is a copy");
    assert!(!idle(&a), "the producer's work is still pending");
    // Negative control: a copy of elements, with no consumer stream to order it before, is
    // waited for on the host, behind the held producer.
    let buf = a.alloc_zeros::<u32>(4).unwrap();
    let t = GpuTensor::new(buf, &a, &counter);
    let request = copy_without_sync;
    let export = spawn(move || t.into_dlpack_with(&request).map(|m| m.is_copied()));
    assert_eq!(
        export.recv_timeout(BLOCKED).err(),
        Some(mpsc::RecvTimeoutError::Timeout),
        "a copy of elements with stream=-1 waits for the producer"
    );
    gate.release();
    assert!(export.recv_timeout(RETURNS).unwrap().unwrap());
    a.synchronize().unwrap();
    wait_for_count(&counter, 2);
    assert_clean(&checker, "zero-size copy without synchronization");
}

/// Free device memory (`cuMemGetInfo`) of the current context's device, in bytes.
fn free_memory(ctx: &CudaContext) -> usize {
    ctx.bind_to_thread().unwrap();
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers; a context is current.
    unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
        .result()
        .unwrap();
    free
}

#[test]
fn device_copies_free_their_memory_when_released() {
    let (ctx, a, b, checker) = setup();
    let counter = Counter::new();
    let (rows, cols) = (64usize, 96usize);
    let exchange = || {
        let (t, gate, expected) = view_behind_a_gate(
            &a,
            (rows, cols),
            (&[cols, rows], &[1, cols as isize], 0),
            &counter,
        );
        gate.release();
        let request = ExportRequest::versioned()
            .stream(Some(b.cu_stream() as i64))
            .copy(Some(true));
        let view = GpuView::from_managed(t.into_dlpack_with(&request).unwrap()).unwrap();
        let ptr = view.data.cuda_device_ptr().unwrap();
        assert_eq!(read_all_on(ptr, rows * cols, &b), expected);
    };
    exchange();
    a.synchronize().unwrap();
    wait_for_count(&counter, 1);
    // The copy's memory is freed on the reaper thread once its stream work is done.
    std::thread::sleep(Duration::from_millis(50));
    let before = free_memory(&ctx);
    for _ in 0..5 {
        exchange();
    }
    a.synchronize().unwrap();
    wait_for_count(&counter, 6);
    let deadline = Instant::now() + RETURNS;
    while free_memory(&ctx) < before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        free_memory(&ctx) >= before,
        "five released copies left {} bytes allocated",
        before - free_memory(&ctx)
    );
    assert_clean(&checker, "copies freed");
}

/// A producer whose pending work is on a stream other than its buffer's own.
#[derive(DlpackExport)]
struct OtherStreams {
    #[dlpack(data)]
    data: CudaSlice<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    writer: Arc<CudaStream>,
    #[dlpack(stream)]
    maybe: Option<Arc<CudaStream>>,
}

#[test]
fn stream_fields_name_work_on_streams_other_than_the_buffers() {
    let (ctx, a, b, checker) = setup();
    let c = ctx.new_stream().unwrap();
    let d = ctx.new_stream().unwrap();
    // The buffer belongs to C; the pending writes are on A (a plain stream field) and on D (an
    // optional one).
    for on_optional in [false, true] {
        let data = c.alloc_zeros::<u32>(N).unwrap();
        c.synchronize().unwrap();
        let writer = if on_optional { &d } else { &a };
        let gate = Gate::hold(writer);
        let ptr = cuda_ptr(&data, &c);
        // SAFETY: `ptr` is `N` u32 of a live allocation; stream-ordered on the writer.
        unsafe { sys::cuMemsetD32Async(ptr, 21, N, writer.cu_stream()) }
            .result()
            .unwrap();
        let t = OtherStreams {
            data,
            shape: vec![N],
            writer: a.clone(),
            maybe: on_optional.then(|| d.clone()),
        };
        let view = GpuView::from_managed(
            t.into_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
                .unwrap(),
        )
        .unwrap();
        let result = b.alloc_zeros::<u32>(1).unwrap();
        copy_one_on(last(view.data.cuda_device_ptr().unwrap(), N), &result, &b);
        assert!(
            !becomes_idle(&b, Duration::from_millis(20)),
            "the consumer waits for the stream field's work (optional: {on_optional})"
        );
        gate.release();
        assert_eq!(b.clone_dtoh(&result).unwrap(), [21]);
        writer.synchronize().unwrap();
        drop(view);
    }
    c.synchronize().unwrap();
    assert_clean(&checker, "stream fields");
}
