//! The CUDA hand-off (feature `cuda`). Without a driver only the first test runs here; the
//! others need a CUDA device and are run by `scripts/gpu-suite.sh` (`--include-ignored`).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use dlpack_runtime::cuda::{self, CudaError};
use dlpack_runtime::{
    Device, DlpackExport, DlpackImport, ExportError, ExportRequest, ImportedData,
};
use dlpack_tests::{Counter, DropGuard};

const NEEDS_GPU: &str = "needs a CUDA device: run scripts/gpu-suite.sh";

/// A producer with device memory and the stream its writes were enqueued on.
#[derive(DlpackExport)]
struct GpuTensor {
    #[dlpack(data)]
    data: CudaSlice<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: Arc<CudaStream>,
    _guard: DropGuard,
}

impl GpuTensor {
    /// A 1-D tensor of `data`, with pending work on `stream`, counted by `counter`.
    fn new(data: CudaSlice<u32>, stream: &Arc<CudaStream>, counter: &Counter) -> Self {
        Self {
            shape: vec![data.len()],
            data,
            stream: stream.clone(),
            _guard: counter.guard(),
        }
    }
}

/// A consumer of compact `u32` tensors on any device.
#[derive(DlpackImport)]
struct GpuView {
    #[dlpack(data)]
    data: ImportedData<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(device)]
    device: Device,
}

#[test]
fn without_a_driver_exports_and_probes_are_errors_not_panics() {
    match cuda::driver() {
        Err(CudaError::NoDriver) => {
            assert_eq!(cuda::pointer_device(0x1000), Err(CudaError::NoDriver));
            assert!(cuda::ReadyEvents::record(&[]).unwrap().is_empty());
        }
        other => {
            eprintln!("CUDA driver probe: {other:?}; the ignored GPU tests cover this machine")
        }
    }
}

fn setup() -> (Arc<CudaContext>, Arc<CudaStream>, Arc<CudaStream>) {
    cuda::driver().expect(NEEDS_GPU);
    let ctx = CudaContext::new(0).unwrap();
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    (ctx, a, b)
}

const N: usize = 64 << 20; // 64 Mi u32 = 256 MiB
/// Elements of the buffer of the host-time test: 256 Mi u32 = 1 GiB, so that 300 full writes
/// (300 GB, one launch each, far below the launch queue's depth) keep an H200 busy for well
/// over 50 ms.
const SLOW_N: usize = 256 << 20;

/// Enqueues `passes` full writes of `buf` on `stream`, the last one writing `passes`.
fn slow_fill(buf: &CudaSlice<u32>, stream: &CudaStream, passes: u32) {
    let ptr = cuda_ptr(buf, stream);
    for value in 1..=passes {
        // SAFETY: `ptr` points to `buf.len()` u32 of a live allocation; stream-ordered.
        unsafe { sys::cuMemsetD32Async(ptr, value, buf.len(), stream.cu_stream()) }
            .result()
            .unwrap();
    }
}

fn cuda_ptr(buf: &CudaSlice<u32>, stream: &CudaStream) -> sys::CUdeviceptr {
    use cudarc::driver::DevicePtr;
    let (ptr, _sync) = buf.device_ptr(stream);
    ptr
}

/// Reads the last element on `stream`, then waits for `stream` only.
fn read_last_on(ptr: sys::CUdeviceptr, stream: &CudaStream) -> u32 {
    let mut out = 0u32;
    // SAFETY: `ptr` is the start of `N` u32; `out` is a live host u32; synchronized below.
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            (&mut out as *mut u32).cast(),
            ptr + (N as u64 - 1) * 4,
            4,
            stream.cu_stream(),
        )
        .result()
        .unwrap();
    }
    stream.synchronize().unwrap();
    out
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn a_cross_stream_race_is_shown_without_the_dependency_and_absent_with_it() {
    let (ctx, a, b) = setup();
    let passes = 200;
    let mut wrong_without = 0;
    let mut wrong_with = 0;
    for trial in 0..100 {
        for with_dependency in [false, true] {
            let counter = Counter::new();
            let buf = a.alloc_zeros::<u32>(N).unwrap();
            slow_fill(&buf, &a, passes);
            let t = GpuTensor::new(buf, &a, &counter);
            let stream = if with_dependency {
                b.cu_stream() as i64
            } else {
                -1
            };
            let view = GpuView::from_managed(
                t.to_dlpack_with(&ExportRequest::versioned().stream(Some(stream)))
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(view.device, Device::cuda(0));
            assert_eq!(view.shape, [N]);
            let got = read_last_on(view.data.cuda_device_ptr().unwrap(), &b);
            if got != passes {
                if with_dependency {
                    wrong_with += 1
                } else {
                    wrong_without += 1
                }
            }
            a.synchronize().unwrap();
            drop(view);
            assert_eq!(counter.get(), 1, "trial {trial}");
        }
    }
    println!(
        "race: wrong values without the dependency {wrong_without}/100, with it {wrong_with}/100"
    );
    assert_eq!(
        wrong_with, 0,
        "the event dependency orders the consumer after the producer"
    );
    assert!(
        wrong_without > 0,
        "without the dependency the consumer must be able to see the race"
    );
    drop(ctx);
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn the_host_is_not_blocked_by_an_event_dependency() {
    let (_ctx, a, b) = setup();
    let buf = a.alloc_zeros::<u32>(SLOW_N).unwrap();
    let counter = Counter::new();
    // Warm up the pool and the driver.
    let warm = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    drop(
        warm.to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    );
    slow_fill(&buf, &a, 300);
    let t = GpuTensor::new(buf, &a, &counter);
    let start = Instant::now();
    let managed = t
        .to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
        .unwrap();
    let event_export = start.elapsed();
    let pending = !cuda_query(&a);
    a.synchronize().unwrap();
    drop(managed);
    // The same export with a host synchronization, for comparison.
    let buf = a.alloc_zeros::<u32>(SLOW_N).unwrap();
    slow_fill(&buf, &a, 300);
    let start = Instant::now();
    a.synchronize().unwrap();
    let t = GpuTensor::new(buf, &a, &counter);
    drop(
        t.to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    );
    let sync_export = start.elapsed();
    println!(
        "host time of an export with >= 50 ms pending: event dependency {event_export:?}, host synchronization {sync_export:?}"
    );
    assert!(
        pending,
        "the producer's work was still pending when the export returned"
    );
    assert!(
        sync_export >= Duration::from_millis(50),
        "the fill takes at least 50 ms: {sync_export:?}"
    );
    assert!(
        event_export < Duration::from_millis(1),
        "the event dependency does not block the host: {event_export:?}"
    );
}

fn cuda_query(stream: &CudaStream) -> bool {
    // SAFETY: a live stream; query only.
    let result = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    result == sys::CUresult::CUDA_SUCCESS
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn after_warm_up_no_event_is_created_per_exchange() {
    let (_ctx, a, b) = setup();
    let counter = Counter::new();
    let export = |counter: &Counter| {
        let t = GpuTensor::new(a.alloc_zeros::<u32>(1024).unwrap(), &a, counter);
        drop(
            t.to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
                .unwrap(),
        );
    };
    for _ in 0..10 {
        export(&counter);
    }
    let before = cuda::events_created();
    for _ in 0..1000 {
        export(&counter);
    }
    println!(
        "events created by 1000 exchanges after warm-up: {}",
        cuda::events_created() - before
    );
    assert_eq!(cuda::events_created(), before);
    assert_eq!(counter.get(), 1010);
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn stream_ordered_release_waits_for_the_consumer() {
    let (_ctx, a, b) = setup();
    let counter = Counter::new();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
    let view = GpuView::from_managed(
        t.to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
            .unwrap(),
    )
    .unwrap();
    // The consumer's "kernel": >= 50 ms of writes into the imported memory on stream B.
    let ptr = view.data.cuda_device_ptr().unwrap();
    for value in 0..400u32 {
        // SAFETY: `ptr` is `N` u32 of the imported, writable allocation; stream-ordered on B.
        unsafe { sys::cuMemsetD32Async(ptr, value, N, b.cu_stream()) }
            .result()
            .unwrap();
    }
    view.data.release_after(&b).unwrap();
    assert_eq!(
        counter.get(),
        0,
        "not released while the consumer's work is pending"
    );
    assert!(!cuda_query(&b));
    b.synchronize().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter.get() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("stream-ordered release: deleter ran after the consumer's stream finished");
    assert_eq!(counter.get(), 1);
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn ready_events_let_the_consumer_wait_later() {
    let (_ctx, a, b) = setup();
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    slow_fill(&buf, &a, 100);
    let t = GpuTensor::new(buf, &a, &counter);
    let (managed, ready) = t
        .to_dlpack_with_ready_events(&ExportRequest::versioned().stream(Some(-1)))
        .unwrap();
    assert!(!ready.is_empty());
    let view = GpuView::from_managed(managed).unwrap();
    ready.wait_on(&b).unwrap();
    assert_eq!(read_last_on(view.data.cuda_device_ptr().unwrap(), &b), 100);
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn illegal_streams_and_wrong_devices_are_refused() {
    let (_ctx, a, _b) = setup();
    let counter = Counter::new();
    let t = GpuTensor::new(a.alloc_zeros::<u32>(16).unwrap(), &a, &counter);
    let err = t
        .to_dlpack_with(&ExportRequest::versioned().stream(Some(0)))
        .unwrap_err();
    assert!(matches!(err, ExportError::Stream(_)), "{err}");
    assert_eq!(counter.get(), 1);
    let other = a.alloc_zeros::<u32>(4).unwrap();
    match cuda::check_pointer(cuda_ptr(&other, &a), 3) {
        Err(CudaError::WrongDevice {
            found: 0,
            expected: 3,
            ..
        }) => {}
        other => panic!("expected WrongDevice, found {other:?}"),
    }
}

/// A strided view of device memory; strides and offset in elements.
#[derive(DlpackExport)]
struct GpuStrided {
    #[dlpack(data)]
    data: CudaSlice<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    offset: usize,
    #[dlpack(stream)]
    stream: Arc<CudaStream>,
    _guard: DropGuard,
}

/// `len` values `0..len` written on `stream` behind `passes` memsets of the whole buffer: a
/// consumer that is not ordered after `stream` reads memset values.
fn pattern_behind_pending_work(
    stream: &Arc<CudaStream>,
    len: usize,
    passes: u32,
) -> CudaSlice<u32> {
    let mut buf = stream.alloc_zeros::<u32>(len).unwrap();
    let ptr = cuda_ptr(&buf, stream);
    for value in 0..passes {
        // SAFETY: `ptr` points to `len` u32 of a live allocation; stream-ordered.
        unsafe { sys::cuMemsetD32Async(ptr, value | 0x8000_0000, len, stream.cu_stream()) }
            .result()
            .unwrap();
    }
    let host: Vec<u32> = (0..len as u32).collect();
    stream.memcpy_htod(&host, &mut buf).unwrap();
    buf
}

/// A strided view (strides and offset in elements) of a `rows * cols` buffer holding
/// `0..rows * cols` behind `passes` pending memsets on `stream`, and the values its elements
/// hold, in row-major order.
fn view_behind_pending_work(
    stream: &Arc<CudaStream>,
    (rows, cols, passes): (usize, usize, u32),
    shape: &[usize],
    strides: &[isize],
    offset: usize,
    counter: &Counter,
) -> (GpuStrided, Vec<u32>) {
    let t = GpuStrided {
        data: pattern_behind_pending_work(stream, rows * cols, passes),
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        offset,
        stream: stream.clone(),
        _guard: counter.guard(),
    };
    let expected = indices(shape, strides, offset)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    (t, expected)
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

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn copy_true_is_enqueued_on_the_consumer_stream() {
    let (ctx, a, b) = setup();
    let c = ctx.new_stream().unwrap();
    let (rows, cols) = (256usize, 512usize);
    // (shape, strides, offset): transposed (2-D blocks of one element per row), every other
    // column of reversed rows (element by element), a column slice (one 2-D block).
    let views: [(Vec<usize>, Vec<isize>, usize); 3] = [
        (vec![cols, rows], vec![1, cols as isize], 0),
        (
            vec![rows, cols / 2],
            vec![-(cols as isize), 2],
            (rows - 1) * cols,
        ),
        (vec![rows, 16], vec![cols as isize, 1], 8),
    ];
    for (shape, strides, offset) in views {
        let counter = Counter::new();
        let (t, expected) =
            view_behind_pending_work(&a, (rows, cols, 50), &shape, &strides, offset, &counter);
        let request = ExportRequest::versioned()
            .stream(Some(b.cu_stream() as i64))
            .copy(Some(true));
        let (managed, ready) = t.to_dlpack_with_ready_events(&request).unwrap();
        assert!(managed.is_copied(), "{shape:?}");
        assert!(!ready.is_empty(), "a ready event follows the copy");
        let view = GpuView::from_managed(managed).unwrap();
        assert_eq!(view.device, Device::cuda(0));
        assert_eq!(view.shape, shape);
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
        let deadline = Instant::now() + Duration::from_secs(5);
        while counter.get() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counter.get(), 1);
        drop(view);
    }
    // stream=-1: no stream to order the copy before, so the host waits for it; any stream
    // then reads it.
    let counter = Counter::new();
    let (t, expected) = view_behind_pending_work(
        &a,
        (rows, cols, 50),
        &[cols, rows],
        &[1, cols as isize],
        0,
        &counter,
    );
    let managed = t
        .to_dlpack_with(&ExportRequest::versioned().stream(Some(-1)).copy(Some(true)))
        .unwrap();
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
    println!("copy=True: transposed, reversed and sliced views copied on the consumer's stream");
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn dl_device_cpu_copies_to_the_host_after_the_pending_work() {
    let (_ctx, a, _b) = setup();
    let counter = Counter::new();
    let (rows, cols) = (4096usize, 1024usize);
    let (t, expected) = view_behind_pending_work(
        &a,
        (rows, cols, 200),
        &[rows, 24],
        &[cols as isize, 1],
        100,
        &counter,
    );
    let managed = t
        .to_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
        .unwrap();
    assert_eq!(
        counter.get(),
        1,
        "the source is released once the host has its copy"
    );
    assert!(managed.is_copied());
    let view = GpuView::from_managed(managed).unwrap();
    assert_eq!(view.device, Device::CPU);
    assert_eq!(view.shape, [rows, 24]);
    assert_eq!(view.data.as_slice().unwrap(), &expected[..]);
    // A transposed view: many blocks over a span no larger than its elements, so it comes over
    // in one transfer and is compacted on the host.
    let (t, expected) = view_behind_pending_work(
        &a,
        (rows, cols, 200),
        &[cols, rows],
        &[1, cols as isize],
        0,
        &counter,
    );
    let view = GpuView::from_managed(
        t.to_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(view.data.as_slice().unwrap(), &expected[..]);
    // copy=False cannot be served.
    let t = GpuStrided {
        data: a.alloc_zeros::<u32>(4).unwrap(),
        shape: vec![4],
        strides: vec![1],
        offset: 0,
        stream: a.clone(),
        _guard: counter.guard(),
    };
    assert_eq!(
        t.to_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::CPU)
                .copy(Some(false))
        )
        .unwrap_err(),
        ExportError::CopyRequired {
            requested: Device::CPU
        }
    );
    assert_eq!(counter.get(), 3);
    println!("dl_device=(CPU, 0): strided CUDA views copied to the host after 200 pending memsets");
}

#[test]
#[ignore = "needs a CUDA device: run scripts/gpu-suite.sh"]
fn streams_are_checked_against_the_tensor_device() {
    use dlpack_runtime::stream::ProducerStream;
    let (_ctx, a, b) = setup();
    let handle = ProducerStream::Handle(core::num::NonZeroU64::new(b.cu_stream() as u64).unwrap());
    assert_eq!(cuda::check_consumer_stream(handle, 0), Ok(()));
    assert_eq!(
        cuda::check_consumer_stream(ProducerStream::LegacyDefault, 0),
        Ok(())
    );
    match cuda::check_consumer_stream(handle, 1) {
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
        .to_dlpack_with(&ExportRequest::versioned().stream(Some(b.cu_stream() as i64)))
        .unwrap();
    let mut current: sys::CUcontext = std::ptr::dangling_mut();
    // SAFETY: a valid out-pointer.
    unsafe { sys::cuCtxGetCurrent(&mut current) }
        .result()
        .unwrap();
    assert!(current.is_null(), "the current context was restored");
    drop(managed);
    match cuda::check_producer_stream(&a, 3) {
        Err(CudaError::StreamOnOtherDevice {
            role: "producer",
            found: 0,
            expected: 3,
            ..
        }) => {}
        other => panic!("expected StreamOnOtherDevice, found {other:?}"),
    }
}
