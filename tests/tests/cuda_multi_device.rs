//! Exports to another device (feature `cuda`): `dl_device` naming another CUDA device than the
//! tensor's (a copy between devices on the consumer's stream of that device, after an event of
//! the producer's pending work that the consumer's stream waits on), and a host tensor copied to
//! a CUDA device on the consumer's stream. On the simulator with two devices (its default) and
//! four (`CUDA_SIM_DEVICES=4`, in a child process of this binary: the simulator reads its
//! settings once per process), with the checker attached; on hardware where the machine has the
//! GPUs (`scripts/gpu-suite.sh`), and said to be skipped where it has fewer. The copies between
//! devices are also run with peer access off (`CUDA_SIM_NO_PEER=all`: the driver stages them),
//! and with the target's default streams (`stream=None`, `1`, `2`).
//!
//! Every ordering test has its negative control: the same exchange with the producer's pending
//! work left unnamed is flagged by the checker. Every call is made with a known current context,
//! and leaves it as it found it.
#![cfg(feature = "cuda")]

use std::process::Command;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_sim_testing::{Checker, Driver, DriverCalls, Gate, device_count, require_devices};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use dlpack_runtime::__testing::cuda as driver;
use dlpack_runtime::cuda;
use dlpack_runtime::{
    DataType, Device, DlpackExport, DlpackImport, ExportBuffer, ExportError, ExportRequest,
};
use dlpack_tests::gpu::GpuView;
use dlpack_tests::types::Tensor;
use dlpack_tests::{Counter, DropGuard};

const NEEDS_DRIVER: &str =
    "needs a CUDA driver: the CUDA simulator on the library path (scripts/cuda-sim.sh) or a GPU";

/// Elements of the test tensors.
const N: usize = 4096;

/// Whether the driver has `needed` devices; if not, says that `test` is skipped.
fn devices(needed: usize, test: &str) -> bool {
    cuda::init().expect(NEEDS_DRIVER);
    require_devices(needed, test)
}

fn assert_clean(checker: &Option<Checker>, what: &str) {
    if let Some(c) = checker {
        c.assert_clean(what);
    }
}

/// The thread's current context (`cuCtxGetCurrent`).
fn current() -> sys::CUcontext {
    let mut ctx = null_mut();
    // SAFETY: a live out-pointer; the driver is initialized.
    unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result().unwrap();
    ctx
}

fn set_current(ctx: sys::CUcontext) {
    // SAFETY: a live context, or NULL (no context).
    unsafe { sys::cuCtxSetCurrent(ctx) }.result().unwrap();
}

/// Runs `f` with `ctx` current, and checks that it leaves `ctx` current.
fn keeps_context<T>(ctx: sys::CUcontext, what: &str, f: impl FnOnce() -> T) -> T {
    set_current(ctx);
    let out = f();
    assert_eq!(current(), ctx, "{what}: the current context changed");
    out
}

fn cuda_ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> sys::CUdeviceptr {
    use cudarc::driver::DevicePtr;
    let (ptr, _sync) = buf.device_ptr(stream);
    ptr
}

/// `0..len` in a buffer of `stream`'s device, written on `stream` behind a gate: the values
/// are uploaded to a second buffer first and copied on the device behind the gate, so that
/// nothing the host does waits for the held stream.
fn pattern_behind_a_gate(
    stream: &Arc<CudaStream>,
    len: usize,
    base: u32,
) -> (CudaSlice<u32>, Gate) {
    let host: Vec<u32> = (0..len as u32).map(|i| base + i).collect();
    let source = stream.clone_htod(&host).unwrap();
    let buf = stream.alloc_zeros::<u32>(len).unwrap();
    stream.synchronize().unwrap();
    let gate = Gate::hold(stream);
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
    drop(source);
    (buf, gate)
}

/// Reads `len` u32 at `ptr` on `stream` (with its context current), then waits for `stream`
/// only.
fn read_all_on(ptr: sys::CUdeviceptr, len: usize, stream: &CudaStream) -> Vec<u32> {
    set_current(stream.context().cu_ctx());
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

/// Whether `stream` has no pending work (`cuStreamQuery`, with its context current).
fn idle(stream: &CudaStream) -> bool {
    set_current(stream.context().cu_ctx());
    // SAFETY: a live stream; query only.
    let result = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    result == sys::CUresult::CUDA_SUCCESS
}

/// Waits (bounded) until `counter` reaches `n`.
fn wait_for_count(counter: &Counter, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while counter.get() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(counter.get(), n);
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

/// Device memory by address, which names no stream of its own: the producer's pending work is
/// what its `#[dlpack(stream)]` field says, and nothing when that is `None` (the negative
/// controls).
struct RawCuda {
    ptr: sys::CUdeviceptr,
    len: usize,
    device: i32,
}

// SAFETY: `ptr` is `len` u32 of device memory of `device`, kept alive by the test (the
// `CudaSlice` it came from outlives every use of the export); `as_mut_ptr` hands it out as the
// slice would.
unsafe impl ExportBuffer for RawCuda {
    fn dtype(&self) -> DataType {
        DataType::U32
    }
    fn device(&self) -> Device {
        Device::cuda(self.device)
    }
    fn byte_len(&self) -> usize {
        self.len * 4
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.ptr as usize as *mut core::ffi::c_void)
    }
}

/// A strided view of device memory with pending work on `stream` (`None`: unnamed).
#[derive(DlpackExport)]
struct Producer {
    #[dlpack(data)]
    data: RawCuda,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
    #[dlpack(stream)]
    stream: Option<Arc<CudaStream>>,
    _guard: DropGuard,
}

/// A consumer of any strided `u32` layout.
#[derive(DlpackImport)]
struct Strided {
    #[dlpack(data)]
    data: dlpack_runtime::ImportedData<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(device)]
    device: Device,
}

/// One copy between devices: a view of `rows * cols` values written behind a gate on a
/// stream of device `from` is exported with `dl_device=cuda:to` and the consumer's stream of
/// device `to`, with a context current that is neither's. With the producer's stream named
/// (`ordered`): the export returns with the producer held, the copy is flagged `IS_COPIED`, on
/// `cuda:to`, the source is kept until the copy has run and released after, the values are the
/// view's, and the checker reports nothing. Without it: the checker flags the copy's read.
fn copy_between(
    checker: &Option<Checker>,
    (from, to): (i32, i32),
    (shape, strides, offset): (&[usize], &[isize], usize),
    ordered: bool,
) {
    let (rows, cols) = (32usize, 48usize);
    let src_ctx = CudaContext::new(from as usize).unwrap();
    let dst_ctx = CudaContext::new(to as usize).unwrap();
    let a = src_ctx.new_stream().unwrap();
    let b = dst_ctx.new_stream().unwrap();
    let before = checker.as_ref().map_or(0, Checker::violations);
    let base = 1000 * (from as u32 + 1);
    let (buf, gate) = pattern_behind_a_gate(&a, rows * cols, base);
    let counter = Counter::new();
    let t = Producer {
        data: RawCuda {
            ptr: cuda_ptr(&buf, &a),
            len: rows * cols,
            device: from,
        },
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        byte_offset: offset * 4,
        stream: ordered.then(|| a.clone()),
        _guard: counter.guard(),
    };
    let expected: Vec<u32> = indices(shape, strides, offset)
        .into_iter()
        .map(|i| base + i as u32)
        .collect();
    let request = ExportRequest::versioned()
        .dl_device(Device::cuda(to))
        .stream(Some(b.cu_stream() as i64));
    let what = format!("cuda:{from} -> cuda:{to} {shape:?} {strides:?}");
    // A current context of neither device's primary context: none.
    let (managed, ready) = keeps_context(null_mut(), &what, || {
        t.into_dlpack_with_ready_events(&request).unwrap()
    });
    assert!(
        !idle(&a),
        "{what}: the export returned with the producer held"
    );
    assert!(managed.is_copied(), "{what}");
    assert!(!managed.is_read_only(), "{what}: a copy is the consumer's");
    assert!(!ready.is_empty(), "{what}: an event follows the copy");
    if ordered {
        assert_eq!(
            counter.get(),
            0,
            "{what}: the source is kept until the copy has run"
        );
    }
    let view = Strided::from_managed(managed).unwrap();
    assert_eq!(view.device, Device::cuda(to), "{what}");
    assert_eq!(view.shape, shape, "{what}");
    let ptr = view.data.cuda_device_ptr().unwrap();
    assert_eq!(
        driver::pointer_device(ptr).unwrap(),
        to,
        "{what}: the copy's memory"
    );
    gate.release();
    let got = read_all_on(ptr, expected.len(), &b);
    wait_for_count(&counter, 1);
    a.synchronize().unwrap();
    drop(view);
    drop(buf);
    let flagged = checker.as_ref().map_or(0, Checker::violations) - before;
    if ordered {
        assert_eq!(got, expected, "{what}");
        if let Some(c) = checker {
            assert_eq!(flagged, 0, "{what}: {}", c.report());
        }
    } else if let Some(c) = checker {
        let report = c.report();
        assert!(flagged >= 1, "{what}: the unordered copy is flagged");
        assert!(
            report.contains("is not ordered after the write"),
            "{what}: {report}"
        );
        c.reset();
    }
}

/// (shape, strides, offset) of views of a 32 x 48 buffer: compact (one peer copy), a column
/// slice (one 2-D block), transposed (2-D blocks of one element per row), a reversed vector
/// (one peer copy per element).
fn views() -> Vec<(Vec<usize>, Vec<isize>, usize)> {
    vec![
        (vec![32, 48], vec![48, 1], 0),
        (vec![32, 16], vec![48, 1], 8),
        (vec![48, 32], vec![1, 48], 0),
        (vec![32], vec![-1], 31),
    ]
}

#[test]
fn dl_device_of_another_gpu_is_a_peer_copy_after_the_producers_work() {
    if !devices(
        2,
        "dl_device_of_another_gpu_is_a_peer_copy_after_the_producers_work",
    ) {
        return;
    }
    let checker = Checker::attach();
    for (from, to) in [(0, 1), (1, 0)] {
        for (shape, strides, offset) in views() {
            copy_between(&checker, (from, to), (&shape, &strides, offset), true);
        }
    }
    if let Some(c) = &checker {
        assert!(c.operations("cuMemcpyPeerAsync") >= 1, "{}", c.report());
    }
    assert_clean(&checker, "copies between two devices");
}

/// The negative control: the producer's work left unnamed, the peer copy races with it.
#[test]
fn a_peer_copy_without_the_producers_stream_is_flagged() {
    if !devices(2, "a_peer_copy_without_the_producers_stream_is_flagged") {
        return;
    }
    let Some(checker) = Checker::attach() else {
        eprintln!("skipped: the negative control needs the simulator's checker");
        return;
    };
    checker.reset();
    let checker = Some(checker);
    copy_between(&checker, (0, 1), (&[32, 48], &[48, 1], 0), false);
    copy_between(&checker, (1, 0), (&[48, 32], &[1, 48], 0), false);
}

/// `copy=False` cannot be served between devices: refused before the driver is asked, naming
/// both devices; the source is dropped once. `copy=True` and `copy=None` copy alike.
#[test]
fn copy_false_to_another_gpu_is_refused_naming_both_devices() {
    let counter = Counter::new();
    let make = |counter: &Counter| dlpack_tests::types::fake_cuda(4, counter);
    let err = make(&counter)
        .into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::cuda(1))
                .copy(Some(false)),
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::CopyRequired {
            found: Device::cuda(0),
            requested: Device::cuda(1)
        }
    );
    assert_eq!(
        err.to_string(),
        "copy=False but exporting a cuda:0 tensor to dl_device cuda:1 needs a copy"
    );
    assert_eq!(counter.get(), 1);
    if cuda::init().is_err() {
        // Refused before the driver is asked: the same without a driver.
        assert_ne!(
            dlpack_tests::expected_driver(),
            Some(true),
            "a driver was expected"
        );
        return;
    }
    if !devices(
        2,
        "copy_false_to_another_gpu_is_refused_naming_both_devices",
    ) {
        return;
    }
    let checker = Checker::attach();
    // A device the driver does not have: refused naming it and the devices there are, the
    // source dropped once (more cases in
    // a_dl_device_the_process_does_not_have_is_refused_naming_the_devices).
    let missing = device_count().unwrap() as i32;
    let s0 = CudaContext::new(0).unwrap().new_stream().unwrap();
    let t = dlpack_tests::gpu::GpuTensor::new(s0.alloc_zeros::<u32>(4).unwrap(), &s0, &counter);
    let err = t
        .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::cuda(missing)))
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::NoSuchDevice {
            requested: Device::cuda(missing),
            count: missing
        }
    );
    assert_eq!(counter.get(), 2);
    let ctx1 = CudaContext::new(1).unwrap();
    let b = ctx1.new_stream().unwrap();
    for copy in [None, Some(true)] {
        let ctx0 = CudaContext::new(0).unwrap();
        let a = ctx0.new_stream().unwrap();
        let (buf, gate) = pattern_behind_a_gate(&a, N, 7);
        let t = dlpack_tests::gpu::GpuTensor::new(buf, &a, &counter);
        let request = ExportRequest::versioned()
            .dl_device(Device::cuda(1))
            .copy(copy)
            .stream(Some(b.cu_stream() as i64));
        let managed = keeps_context(ctx0.cu_ctx(), "copy=None/True", || {
            t.into_dlpack_with(&request).unwrap()
        });
        assert!(managed.is_copied());
        let view = GpuView::from_managed(managed).unwrap();
        assert_eq!(view.device, Device::cuda(1));
        gate.release();
        let got = read_all_on(view.data.cuda_device_ptr().unwrap(), N, &b);
        assert_eq!(got, (7..7 + N as u32).collect::<Vec<_>>(), "copy={copy:?}");
        drop(view);
        a.synchronize().unwrap();
    }
    assert_clean(&checker, "copy=None and copy=True to another device");
}

/// `stream=-1` names no stream of the target: the copy goes on its legacy default stream and
/// the host waits for it, so any stream of the target reads it afterwards.
#[test]
fn a_copy_to_another_gpu_with_stream_minus_one_is_finished_when_handed_over() {
    if !devices(
        2,
        "a_copy_to_another_gpu_with_stream_minus_one_is_finished_when_handed_over",
    ) {
        return;
    }
    let checker = Checker::attach();
    let counter = Counter::new();
    let ctx0 = CudaContext::new(0).unwrap();
    let ctx1 = CudaContext::new(1).unwrap();
    let a = ctx0.new_stream().unwrap();
    let c = ctx1.new_stream().unwrap();
    let (buf, gate) = pattern_behind_a_gate(&a, N, 11);
    let t = dlpack_tests::gpu::GpuTensor::new(buf, &a, &counter);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        gate.release();
    });
    let request = ExportRequest::versioned()
        .dl_device(Device::cuda(1))
        .stream(Some(-1));
    let (managed, ready) = keeps_context(ctx1.cu_ctx(), "stream=-1", || {
        t.into_dlpack_with_ready_events(&request).unwrap()
    });
    release.join().unwrap();
    assert!(ready.is_empty(), "the host waited for the copy");
    assert_eq!(
        counter.get(),
        1,
        "the source is released once the copy finished"
    );
    let view = GpuView::from_managed(managed).unwrap();
    assert_eq!(
        read_all_on(view.data.cuda_device_ptr().unwrap(), N, &c),
        (11..11 + N as u32).collect::<Vec<_>>()
    );
    drop(view);
    assert_clean(&checker, "stream=-1 to another device");
}

/// A host tensor with `dl_device=cuda:k`: copied on the consumer's stream of device `k`, held
/// by a gate, so the export returns before the copy runs; the copy is `IS_COPIED` on `cuda:k`
/// with the source's values (compact and strided sources), the host source is released at
/// once, and another stream of the device reads the copy only after the ready event (without
/// the wait, the checker flags the read: the negative control).
fn host_to_device(checker: &Option<Checker>, k: i32) {
    let ctx = CudaContext::new(k as usize).unwrap();
    let b = ctx.new_stream().unwrap();
    let c = ctx.new_stream().unwrap();
    let values: Vec<u32> = (0..(64 * 32) as u32).map(|i| i * 3 + 1).collect();
    // (shape, strides, offset in elements): compact, and transposed.
    for (shape, strides, offset) in [
        (vec![64usize, 32], None, 0usize),
        (vec![32, 64], Some(vec![1isize, 32]), 0),
    ] {
        for ordered in [true, false] {
            let counter = Counter::new();
            let t = Tensor {
                data: values.clone(),
                shape: shape.clone(),
                strides: strides.clone(),
                offset: offset * 4,
                guard: counter.guard(),
            };
            let expected: Vec<u32> = match &strides {
                None => values.clone(),
                Some(s) => indices(&shape, s, offset)
                    .into_iter()
                    .map(|i| values[i])
                    .collect(),
            };
            // Where the other stream puts what it reads (device memory: a copy into pageable
            // host memory would block the host behind the gate).
            let scratch = c.alloc_zeros::<u32>(expected.len()).unwrap();
            let scratch_ptr = cuda_ptr(&scratch, &c);
            c.synchronize().unwrap();
            let before = checker.as_ref().map_or(0, Checker::violations);
            let gate = Gate::hold(&b);
            let request = ExportRequest::versioned()
                .dl_device(Device::cuda(k))
                .stream(Some(b.cu_stream() as i64));
            let what = format!("cpu:0 -> cuda:{k} {shape:?} {strides:?}");
            let (managed, ready) = keeps_context(null_mut(), &what, || {
                t.into_dlpack_with_ready_events(&request).unwrap()
            });
            assert!(
                !idle(&b),
                "{what}: the export returned with the consumer's stream held"
            );
            assert_eq!(
                counter.get(),
                1,
                "{what}: the host source is released once staged"
            );
            assert!(managed.is_copied(), "{what}");
            let view = Strided::from_managed(managed).unwrap();
            assert_eq!(view.device, Device::cuda(k));
            assert_eq!(view.shape, shape);
            let ptr = view.data.cuda_device_ptr().unwrap();
            if ordered {
                ready.wait_on(&c).unwrap();
            }
            // Another stream of the device reads the copy: ordered by the ready event only.
            set_current(ctx.cu_ctx());
            // SAFETY: `ptr` and `scratch_ptr` are `expected.len()` u32 of live allocations of
            // this device; stream-ordered on `c`.
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(scratch_ptr, ptr, expected.len() * 4, c.cu_stream())
                    .result()
                    .unwrap();
            }
            gate.release();
            let out = read_all_on(scratch_ptr, expected.len(), &c);
            b.synchronize().unwrap();
            let flagged = checker.as_ref().map_or(0, Checker::violations) - before;
            if ordered {
                assert_eq!(out, expected, "{what}");
                if let Some(ch) = checker {
                    assert_eq!(flagged, 0, "{what}: {}", ch.report());
                    assert!(ch.operations("cuMemcpyHtoDAsync") >= 1, "{}", ch.report());
                }
            } else if let Some(ch) = checker {
                assert!(flagged >= 1, "{what}: the unordered read is flagged");
                ch.reset();
            }
            assert_eq!(
                read_all_on(ptr, expected.len(), &b),
                expected,
                "{what} on B"
            );
            drop(view);
        }
    }
}

#[test]
fn host_tensors_are_copied_to_a_gpu_on_the_consumers_stream() {
    cuda::init().expect(NEEDS_DRIVER);
    let checker = Checker::attach();
    if let Some(c) = &checker {
        c.reset();
    }
    let count = device_count().unwrap() as i32;
    for k in 0..count.min(2) {
        host_to_device(&checker, k);
    }
}

/// Runs the ignored test `name` of this binary in a child process with `env` set, and checks
/// that it ran and passed.
fn in_child(name: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new(exe);
    command.args([
        name,
        "--exact",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name} with {env:?}:\n{stdout}\n{stderr}"
    );
}

/// Four devices: on the simulator in a child with `CUDA_SIM_DEVICES=4`; on hardware where the
/// machine has four GPUs; skipped, said on stderr, otherwise.
#[test]
fn copies_between_four_devices() {
    cuda::init().expect(NEEDS_DRIVER);
    let count = device_count().unwrap();
    if count >= 4 {
        four_devices();
    } else if cuda_sim_testing::driver() == Driver::Simulator {
        in_child(
            "child_copies_between_four_devices",
            &[("CUDA_SIM_DEVICES", "4")],
        );
    } else {
        assert!(!require_devices(4, "copies_between_four_devices"));
    }
}

#[test]
#[ignore = "run by copies_between_four_devices, with CUDA_SIM_DEVICES=4"]
fn child_copies_between_four_devices() {
    assert_eq!(device_count().unwrap(), 4);
    four_devices();
}

/// Every ordered pair of four devices, a compact and a transposed view each, ordered; the
/// negative control for two pairs; host tensors to each device.
fn four_devices() {
    let checker = Checker::attach();
    if let Some(c) = &checker {
        c.reset();
    }
    let views = views();
    for from in 0..4 {
        for to in (0..4).filter(|&to| to != from) {
            for (shape, strides, offset) in &views[..3] {
                copy_between(&checker, (from, to), (shape, strides, *offset), true);
            }
        }
    }
    assert_clean(&checker, "copies between four devices");
    if checker.is_some() {
        copy_between(&checker, (2, 3), (&[32, 48], &[48, 1], 0), false);
        copy_between(&checker, (3, 0), (&[48, 32], &[1, 48], 0), false);
    }
    for k in 0..4 {
        host_to_device(&checker, k);
    }
}

/// The driver calls of one exchange between devices, warm (events pooled, contexts retained),
/// as the simulator counts them; beside them, the same exchange with `copy=True` on one device
/// (BENCHMARKS.md). The host is never blocked: no synchronization is among them. In a child
/// process, so that no other test's calls are counted.
#[test]
fn driver_calls_of_an_exchange_between_devices() {
    if !devices(2, "driver_calls_of_an_exchange_between_devices") {
        return;
    }
    if DriverCalls::now().is_none() {
        eprintln!("skipped: driver calls are counted by the simulator only");
        return;
    }
    in_child("child_driver_calls", &[]);
}

#[test]
#[ignore = "run by driver_calls_of_an_exchange_between_devices, alone in a child process"]
fn child_driver_calls() {
    let counter = Counter::new();
    let ctx0 = CudaContext::new(0).unwrap();
    let ctx1 = CudaContext::new(1).unwrap();
    let a = ctx0.new_stream().unwrap();
    let b0 = ctx0.new_stream().unwrap();
    let b1 = ctx1.new_stream().unwrap();
    let cases: [(&str, Device, &Arc<CudaStream>); 2] = [
        (
            "cuda:0 -> cuda:1 (dl_device, compact)",
            Device::cuda(1),
            &b1,
        ),
        (
            "cuda:0 -> cuda:0 (copy=True, compact)",
            Device::cuda(0),
            &b0,
        ),
    ];
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    let ptr = cuda_ptr(&buf, &a);
    a.synchronize().unwrap();
    let mut released = 0;
    for (what, target, consumer) in cases {
        let mut calls = None;
        // The first rounds warm the event pools and the contexts. Each round ends quiet (the
        // source released, the copy's memory freed by the release thread), so that only the
        // export is counted.
        for _ in 0..3 {
            let t = Producer {
                data: RawCuda {
                    ptr,
                    len: N,
                    device: 0,
                },
                shape: vec![N],
                strides: vec![1],
                byte_offset: 0,
                stream: Some(a.clone()),
                _guard: counter.guard(),
            };
            let request = ExportRequest::versioned()
                .dl_device(target)
                .copy(Some(true))
                .stream(Some(consumer.cu_stream() as i64));
            set_current(ctx0.cu_ctx());
            let before = DriverCalls::now().unwrap();
            let managed = t.into_dlpack_with(&request).unwrap();
            calls = Some(DriverCalls::now().unwrap().since(&before));
            drop(managed);
            consumer.synchronize().unwrap();
            a.synchronize().unwrap();
            released += 1;
            wait_for_count(&counter, released);
            std::thread::sleep(Duration::from_millis(100));
        }
        let calls = calls.unwrap();
        println!("driver calls, {what}: {calls}");
        let count = |name: &str| {
            calls
                .by_entry_point
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, n)| *n)
        };
        // The caller's thread never waits; the release thread waits (at most once) for the
        // event after the copy, to release the source, and its call is counted with the rest.
        for wait in ["cuStreamSynchronize", "cuCtxSynchronize"] {
            assert_eq!(count(wait), 0, "{what}: {calls}");
        }
        assert!(count("cuEventSynchronize") <= 1, "{what}: {calls}");
        assert_eq!(count("cuStreamWaitEvent"), 1, "{what}: {calls}");
        if target == Device::cuda(1) {
            assert_eq!(count("cuMemcpyPeerAsync"), 1, "{what}: {calls}");
        } else {
            assert_eq!(count("cuMemcpyDtoDAsync_v2"), 1, "{what}: {calls}");
        }
    }
    // A host tensor to device 1: no producer stream, so no wait; one copy from the host.
    let mut calls = None;
    for _ in 0..3 {
        let t = dlpack_tests::types::tensor(vec![1u32; N], &[N], &counter);
        let request = ExportRequest::versioned()
            .dl_device(Device::cuda(1))
            .stream(Some(b1.cu_stream() as i64));
        set_current(ctx0.cu_ctx());
        let before = DriverCalls::now().unwrap();
        let managed = t.into_dlpack_with(&request).unwrap();
        calls = Some(DriverCalls::now().unwrap().since(&before));
        drop(managed);
        b1.synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let calls = calls.unwrap();
    println!("driver calls, cpu:0 -> cuda:1 (dl_device, compact): {calls}");
    let count = |name: &str| {
        calls
            .by_entry_point
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(count("cuMemcpyHtoDAsync_v2"), 1, "{calls}");
    assert_eq!(count("cuStreamWaitEvent"), 0, "{calls}");
    assert_eq!(count("cuStreamSynchronize"), 0, "{calls}");
}

/// The Rust import API: `DlpackImport::from_dlpack_with` asks the producer for another device
/// (a copy on the consumer's stream of that device) and imports the copy; `copy=False` is the
/// producer's refusal, naming both devices.
#[test]
fn rust_consumers_import_onto_another_device() {
    if !devices(2, "rust_consumers_import_onto_another_device") {
        return;
    }
    let checker = Checker::attach();
    let counter = Counter::new();
    let ctx0 = CudaContext::new(0).unwrap();
    let ctx1 = CudaContext::new(1).unwrap();
    let a = ctx0.new_stream().unwrap();
    let b = ctx1.new_stream().unwrap();
    let (buf, gate) = pattern_behind_a_gate(&a, N, 5);
    let t = dlpack_tests::gpu::GpuTensor::new(buf, &a, &counter);
    let request = ExportRequest::versioned()
        .dl_device(Device::cuda(1))
        .stream(Some(b.cu_stream() as i64));
    let view: GpuView = keeps_context(ctx0.cu_ctx(), "from_dlpack_with", || {
        GpuView::from_dlpack_with(t, &request).unwrap()
    });
    assert!(!idle(&a), "the import returned with the producer held");
    assert_eq!(view.device, Device::cuda(1));
    assert!(view.data.managed().is_copied());
    gate.release();
    assert_eq!(
        read_all_on(view.data.cuda_device_ptr().unwrap(), N, &b),
        (5..5 + N as u32).collect::<Vec<_>>()
    );
    drop(view);
    wait_for_count(&counter, 1);
    let t = dlpack_tests::gpu::GpuTensor::new(a.alloc_zeros::<u32>(4).unwrap(), &a, &counter);
    let err = GpuView::from_dlpack_with(t, &request.copy(Some(false)))
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "copy=False but exporting a cuda:0 tensor to dl_device cuda:1 needs a copy"
    );
    assert_eq!(counter.get(), 2);
    a.synchronize().unwrap();
    assert_clean(&checker, "from_dlpack_with to another device");
}

/// Host tensors imported onto a CUDA device through the Rust import API.
#[test]
fn rust_consumers_import_host_tensors_onto_a_gpu() {
    cuda::init().expect(NEEDS_DRIVER);
    let checker = Checker::attach();
    let ctx = CudaContext::new(0).unwrap();
    let b = ctx.new_stream().unwrap();
    let counter = Counter::new();
    let values: Vec<u32> = (0..N as u32).rev().collect();
    let t = dlpack_tests::types::tensor(values.clone(), &[N], &counter);
    let request = ExportRequest::versioned()
        .dl_device(Device::cuda(0))
        .stream(Some(b.cu_stream() as i64));
    let view = keeps_context(null_mut(), "host to device import", || {
        GpuView::from_dlpack_with(t, &request).unwrap()
    });
    assert_eq!(view.device, Device::cuda(0));
    assert_eq!(counter.get(), 1);
    assert_eq!(
        read_all_on(view.data.cuda_device_ptr().unwrap(), N, &b),
        values
    );
    assert_clean(&checker, "from_dlpack_with, host to device");
}

/// `stream=None`, `1` and `2` with `dl_device=cuda:1` name the default streams of device 1
/// (resolved in its primary context), not device 0's: the copy goes there, after an event of
/// the producer's pending work on device 0, and a read on that default stream sees the values.
#[test]
fn default_streams_name_the_target_devices_streams() {
    if !devices(2, "default_streams_name_the_target_devices_streams") {
        return;
    }
    let checker = Checker::attach();
    let ctx0 = CudaContext::new(0).unwrap();
    let ctx1 = CudaContext::new(1).unwrap();
    let a = ctx0.new_stream().unwrap();
    for (stream, raw) in [(None, 1usize), (Some(1), 1), (Some(2), 2)] {
        let counter = Counter::new();
        let (buf, gate) = pattern_behind_a_gate(&a, N, 3);
        let t = dlpack_tests::gpu::GpuTensor::new(buf, &a, &counter);
        let request = ExportRequest::versioned()
            .dl_device(Device::cuda(1))
            .stream(stream);
        let managed = keeps_context(ctx0.cu_ctx(), "a default stream of the target", || {
            t.into_dlpack_with(&request).unwrap()
        });
        assert!(
            !idle(&a),
            "stream={stream:?}: the export returned with the producer held"
        );
        let view = GpuView::from_managed(managed).unwrap();
        assert_eq!(view.device, Device::cuda(1));
        gate.release();
        let ptr = view.data.cuda_device_ptr().unwrap();
        let mut out = vec![0u32; N];
        set_current(ctx1.cu_ctx());
        // SAFETY: `ptr` is the copy's `N` u32 on device 1, whose primary context is current, so
        // the special handle is its default stream; `out` has room; synchronized below.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, N * 4, raw as sys::CUstream)
                .result()
                .unwrap();
            sys::cuStreamSynchronize(raw as sys::CUstream)
                .result()
                .unwrap();
        }
        assert_eq!(
            out,
            (3..3 + N as u32).collect::<Vec<_>>(),
            "stream={stream:?}"
        );
        drop(view);
        wait_for_count(&counter, 1);
        a.synchronize().unwrap();
    }
    assert_clean(&checker, "default streams of the target device");
}

/// Devices that cannot access each other's memory (`CUDA_SIM_NO_PEER=all`): the copies between
/// them still work (the driver stages them), ordered as with peer access; the negative control
/// too. In a child: the simulator reads the setting once per process.
#[test]
fn copies_between_devices_without_peer_access() {
    if !devices(2, "copies_between_devices_without_peer_access") {
        return;
    }
    if cuda_sim_testing::driver() != Driver::Simulator {
        eprintln!("skipped: peer access is turned off by the simulator's CUDA_SIM_NO_PEER");
        return;
    }
    in_child(
        "child_copies_without_peer_access",
        &[("CUDA_SIM_NO_PEER", "all")],
    );
}

#[test]
#[ignore = "run by copies_between_devices_without_peer_access, with CUDA_SIM_NO_PEER=all"]
fn child_copies_without_peer_access() {
    assert!(device_count().unwrap() >= 2);
    let mut can = 1;
    // SAFETY: a live out-pointer; the driver is initialized (`device_count`).
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, 0, 1) }
        .result()
        .unwrap();
    assert_eq!(can, 0, "CUDA_SIM_NO_PEER=all");
    let checker = Checker::attach();
    for (shape, strides, offset) in views() {
        copy_between(&checker, (0, 1), (&shape, &strides, offset), true);
    }
    assert_clean(&checker, "copies between devices without peer access");
    copy_between(&checker, (1, 0), (&[32, 48], &[48, 1], 0), false);
}

/// With `dl_device`, `stream` is a stream of that device: a stream of the tensor's own device is
/// refused, naming both, and the source is dropped once.
#[test]
fn a_consumer_stream_of_another_device_than_dl_device_is_refused() {
    if !devices(
        2,
        "a_consumer_stream_of_another_device_than_dl_device_is_refused",
    ) {
        return;
    }
    let counter = Counter::new();
    let ctx0 = CudaContext::new(0).unwrap();
    let a = ctx0.new_stream().unwrap();
    let t = dlpack_tests::gpu::GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
    let err = t
        .into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::cuda(1))
                .stream(Some(a.cu_stream() as i64)),
        )
        .unwrap_err();
    match &err {
        ExportError::Cuda(cuda::CudaError::StreamOnOtherDevice {
            role: "consumer",
            found: 0,
            expected: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().ends_with(
            "belongs to CUDA device 0, expected device 1 (the tensor's, or the dl_device asked for)"
        ),
        "{err}"
    );
    assert_eq!(counter.get(), 1);
    a.synchronize().unwrap();
}

/// A user's tensor of a `CudaSlice` on its context's default stream, exported with its stream.
#[derive(DlpackExport)]
struct SliceTensor {
    #[dlpack(data)]
    data: CudaSlice<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: Arc<CudaStream>,
}

/// A float32 view of any device memory, for the copies below.
#[derive(DlpackImport)]
struct AnyF32 {
    #[dlpack(data)]
    data: dlpack_runtime::ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// The source of a copy (to another device, or `copy=True` on its own) is dropped by the
/// release thread with its own device's context bound. A `CudaSlice` of a context that tracks
/// no events (cudarc's `disable_event_tracking`, or a context used by one stream) frees its
/// memory in the current context: dropped with none bound, the free failed, the memory leaked,
/// and `CUDA_ERROR_INVALID_CONTEXT` was recorded in the user's context, failing their next
/// call. In a child process: event tracking is a setting of the shared primary context.
#[test]
fn copy_sources_are_freed_in_their_own_context() {
    if !devices(2, "copy_sources_are_freed_in_their_own_context") {
        return;
    }
    in_child("child_copy_sources_are_freed_in_their_own_context", &[]);
}

#[test]
#[ignore = "run by copy_sources_are_freed_in_their_own_context in a child process"]
fn child_copy_sources_are_freed_in_their_own_context() {
    let c0 = CudaContext::new(0).unwrap();
    let c1 = CudaContext::new(1).unwrap();
    // SAFETY: this process makes no use of the slices' events (they are never shared across
    // streams without the exports' own ordering).
    unsafe { c0.disable_event_tracking() };
    let producer = c0.default_stream();
    let consumers = [(0, c0.new_stream().unwrap()), (1, c1.new_stream().unwrap())];
    const LEN: usize = 1 << 16;
    let free_bytes = |ctx: &Arc<CudaContext>| {
        ctx.bind_to_thread().unwrap();
        cudarc::driver::result::mem_get_info().unwrap().0
    };
    let before = free_bytes(&c0);
    for (device, consumer) in &consumers {
        for round in 0..8 {
            let data = producer.clone_htod(&vec![round as f32; LEN]).unwrap();
            let tensor = SliceTensor {
                data,
                shape: vec![LEN],
                stream: producer.clone(),
            };
            let request = ExportRequest::versioned()
                .dl_device(Device::cuda(*device))
                .copy(Some(true))
                .stream(Some(consumer.cu_stream() as i64));
            let view = AnyF32::from_dlpack_with(tensor, &request).unwrap();
            assert_eq!(view.shape, [LEN]);
            assert!(view.data.managed().is_copied());
            let ptr = view.data.cuda_device_ptr().unwrap();
            consumer.synchronize().unwrap();
            let mut back = vec![0f32; LEN];
            consumer.context().bind_to_thread().unwrap();
            // SAFETY: `ptr` is `LEN` float32 of the copy, alive while `view` lives; the
            // consumer's stream, which wrote it, has finished.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut back, ptr) }.unwrap();
            assert!(back.iter().all(|&v| v == round as f32), "device {device}");
            drop(view);
            // Nothing was recorded in the user's contexts, and their next calls succeed.
            c0.check_err().unwrap();
            c1.check_err().unwrap();
            producer.synchronize().unwrap();
        }
    }
    // Every source is given back once its copy has run: the release thread frees each within
    // moments of the consumer's stream passing the copy.
    let deadline = Instant::now() + Duration::from_secs(10);
    while free_bytes(&c0) != before {
        assert!(
            Instant::now() < deadline,
            "device 0 did not get back the copies' sources: {} bytes free, {before} before",
            free_bytes(&c0)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    c0.check_err().unwrap();
}

/// A `dl_device` that names a CUDA device the process does not have (an ordinal past the last,
/// or negative) is refused with [`ExportError::NoSuchDevice`], naming the device asked for and
/// the devices there are, for a CUDA tensor (with and without a consumer stream) and for a host
/// tensor; the source is dropped once, and the thread's current context is kept.
#[test]
fn a_dl_device_the_process_does_not_have_is_refused_naming_the_devices() {
    if !devices(
        1,
        "a_dl_device_the_process_does_not_have_is_refused_naming_the_devices",
    ) {
        return;
    }
    let count = device_count().unwrap() as i32;
    let devices = if count == 1 {
        "1 CUDA device (0)".to_owned()
    } else {
        format!("{count} CUDA devices (0 to {})", count - 1)
    };
    let ctx0 = CudaContext::new(0).unwrap();
    let a = ctx0.new_stream().unwrap();
    for ordinal in [count, count + 5, -1, i32::MIN] {
        let requested = Device::cuda(ordinal);
        let expected =
            format!("dl_device cuda:{ordinal} does not exist: the process has {devices}");
        let check = |err: ExportError, what: &str| {
            assert_eq!(
                err,
                ExportError::NoSuchDevice { requested, count },
                "{what} to cuda:{ordinal}"
            );
            assert_eq!(err.to_string(), expected, "{what}");
        };
        for stream in [None, Some(2)] {
            let counter = Counter::new();
            let t =
                dlpack_tests::gpu::GpuTensor::new(a.alloc_zeros::<u32>(N).unwrap(), &a, &counter);
            let request = ExportRequest::versioned()
                .dl_device(requested)
                .stream(stream);
            let err = keeps_context(null_mut(), "a refused export", || {
                t.into_dlpack_with(&request).unwrap_err()
            });
            check(err, &format!("a cuda:0 tensor, stream {stream:?}"));
            assert_eq!(counter.get(), 1, "the source is dropped once");
        }
        let counter = Counter::new();
        let t = dlpack_tests::types::tensor(vec![1u32; N], &[N], &counter);
        let err = t
            .into_dlpack_with(&ExportRequest::versioned().dl_device(requested))
            .unwrap_err();
        check(err, "a cpu:0 tensor");
        assert_eq!(counter.get(), 1, "the host source is dropped once");
    }
    a.synchronize().unwrap();
}
