//! Kernels on the CUDA simulator (feature `cuda`): a cudarc program loads a PTX module and
//! launches its kernels on two streams; the simulator runs no kernel body but enqueues each
//! launch as a read and write of every allocation its pointer parameters point into, so the
//! happens-before checker sees launches as it sees copies. Each mistake is asserted reported,
//! next to the same work done right, which must not be. These tests need the simulator (a real
//! driver has no checker); the test command runs them with it.
#![cfg(feature = "cuda")]

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

use cuda_sim_testing::{Checker, DeclareError, Gate};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;
use dlpack_runtime::{DlpackExport, DlpackImport, ExportRequest};
use dlpack_tests::Counter;
use dlpack_tests::gpu::{CapturedGraph, GpuTensor, GpuView, KERNELS_PTX};
use sys::CUresult;
use sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

const NEEDS_SIMULATOR: &str = "needs the CUDA simulator on the library path (scripts/cuda-sim.sh): a real driver has no checker";

const N: usize = 1024;

struct Setup {
    _ctx: Arc<CudaContext>,
    a: Arc<CudaStream>,
    b: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    fill: CudaFunction,
    copy: CudaFunction,
    checker: Checker,
}

/// Two streams that the test orders itself (cudarc's event tracking off), the PTX module's two
/// kernels, and the checker.
fn setup() -> Setup {
    let ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    // SAFETY: no cudarc buffer exists yet in this context's use by this test.
    unsafe { ctx.disable_event_tracking() };
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    let module = ctx.load_module(Ptx::from_src(KERNELS_PTX)).unwrap();
    let fill = module.load_function("fill_u32").unwrap();
    let copy = module.load_function("copy_u32").unwrap();
    Setup {
        _ctx: ctx,
        a,
        b,
        _module: module,
        fill,
        copy,
        checker,
    }
}

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems(N as u32)
}

/// Launches `fill_u32(out, value, N)` on `stream` through cudarc's launch builder.
fn fill(s: &Setup, stream: &CudaStream, out: &mut CudaSlice<u32>, value: u32) {
    let n = N as u32;
    let mut launch = stream.launch_builder(&s.fill);
    launch.arg(out).arg(&value).arg(&n);
    // SAFETY: the signature is (u64 pointer, u32, u32); `out` has `N` u32.
    unsafe { launch.launch(cfg()) }.unwrap();
}

/// Launches `copy_u32(dst, src, N)` on `stream` with raw device pointers.
fn copy(s: &Setup, stream: &CudaStream, dst: sys::CUdeviceptr, src: sys::CUdeviceptr) {
    let n = N as u32;
    let mut launch = stream.launch_builder(&s.copy);
    launch.arg(&dst).arg(&src).arg(&n);
    // SAFETY: the signature is (u64 pointer, u64 pointer, u32); both have `N` u32.
    unsafe { launch.launch(cfg()) }.unwrap();
}

fn ptr(buf: &CudaSlice<u32>, stream: &CudaStream) -> sys::CUdeviceptr {
    buf.device_ptr(stream).0
}

#[test]
fn an_unordered_pair_of_launches_on_two_streams_is_reported_and_an_ordered_one_is_not() {
    let s = setup();
    let (a, b) = (&s.a, &s.b);
    let mut src = a.alloc_zeros::<u32>(N).unwrap();
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    s.checker.reset();

    // Wrong: B's kernel reads what A's kernel writes, with nothing ordering them.
    let gate = Gate::hold(a);
    fill(&s, a, &mut src, 7);
    copy(&s, b, ptr(&dst, b), ptr(&src, a));
    let report = s.checker.report();
    assert_eq!(s.checker.violations(), 1, "{report}");
    assert!(
        report.contains("cuLaunchKernel `copy_u32` on stream")
            && report.contains("is not ordered after the write of bytes")
            && report.contains("by cuLaunchKernel `fill_u32` on stream"),
        "{report}"
    );
    assert_eq!(s.checker.operations("cuLaunchKernel"), 2);
    gate.release();
    a.synchronize().unwrap();
    b.synchronize().unwrap();

    // Right: B waits on an event recorded on A after its launch.
    s.checker.reset();
    let gate = Gate::hold(a);
    fill(&s, a, &mut src, 8);
    let filled = a.record_event(None).unwrap();
    b.wait(&filled).unwrap();
    copy(&s, b, ptr(&dst, b), ptr(&src, a));
    // The launch behind the event is still pending: the order is the events', not timing's.
    // SAFETY: a live stream.
    let pending = unsafe { sys::cuStreamQuery(b.cu_stream()) };
    assert_eq!(pending, CUresult::CUDA_ERROR_NOT_READY);
    gate.release();
    b.synchronize().unwrap();
    s.checker.assert_clean("launches ordered by an event");
    assert_eq!(s.checker.operations("cuLaunchKernel"), 2);
}

#[test]
fn cudarcs_event_tracking_orders_launches_that_use_one_buffer() {
    let ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    let a = ctx.new_stream().unwrap();
    let b = ctx.new_stream().unwrap();
    let module = ctx.load_module(Ptx::from_src(KERNELS_PTX)).unwrap();
    let f = module.load_function("fill_u32").unwrap();
    let mut buf = a.alloc_zeros::<u32>(N).unwrap();
    let n = N as u32;
    // Event tracking is on (cudarc's default): a `CudaSlice` argument makes the launch wait for
    // the buffer's last use on another stream.
    for (stream, value) in [(&a, 1u32), (&b, 2), (&a, 3)] {
        let mut launch = stream.launch_builder(&f);
        launch.arg(&mut buf).arg(&value).arg(&n);
        // SAFETY: the signature is (u64 pointer, u32, u32); `buf` has `N` u32.
        unsafe { launch.launch(cfg()) }.unwrap();
    }
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    checker.assert_clean("launches ordered by cudarc's events");
    assert_eq!(checker.operations("cuLaunchKernel"), 3);
}

#[test]
fn an_export_of_a_kernels_output_is_clean_only_with_the_event_dependency() {
    let s = setup();
    let (a, b) = (&s.a, &s.b);
    for ordered in [true, false] {
        let mut out = a.alloc_zeros::<u32>(N).unwrap();
        let dst = b.alloc_zeros::<u32>(N).unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        s.checker.reset();
        let gate = Gate::hold(a);
        fill(&s, a, &mut out, 5);
        let t = GpuTensor::new(out, a, &Counter::new());
        // `stream=b`: the export records an event on A and makes B wait on it; `stream=-1`
        // asks for no synchronization, so nothing orders B after the kernel.
        let stream = if ordered { b.cu_stream() as i64 } else { -1 };
        let request = ExportRequest::versioned().stream(Some(stream));
        let view = GpuView::from_managed(t.into_dlpack_with(&request).unwrap()).unwrap();
        assert_eq!(view.shape, [N]);
        copy(&s, b, ptr(&dst, b), view.data.cuda_device_ptr().unwrap());
        let (n, report) = (s.checker.violations(), s.checker.report());
        gate.release();
        b.synchronize().unwrap();
        a.synchronize().unwrap();
        if ordered {
            assert_eq!(n, 0, "{report}");
            assert_eq!(s.checker.operations("event record"), 1, "one event on A");
        } else {
            assert_eq!(n, 1, "{report}");
            assert!(
                report.contains("`copy_u32`") && report.contains("`fill_u32`"),
                "{report}"
            );
        }
        drop(view);
        drop(dst);
    }
}

#[test]
fn read_only_parameters_let_unordered_readers_share_a_buffer() {
    let s = setup();
    let (a, b) = (&s.a, &s.b);
    let src = a.alloc_zeros::<u32>(N).unwrap();
    let d1 = a.alloc_zeros::<u32>(N).unwrap();
    let d2 = b.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // Undeclared, every pointer parameter is read and written: two unordered readers conflict.
    s.checker.reset();
    copy(&s, a, ptr(&d1, a), ptr(&src, a));
    copy(&s, b, ptr(&d2, b), ptr(&src, a));
    assert_eq!(s.checker.violations(), 1, "{}", s.checker.report());
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // `src` (parameter 1) declared read-only: the same launches are clean.
    s.checker.declare_read_only(&s.copy, &[1]).unwrap();
    s.checker.reset();
    copy(&s, a, ptr(&d1, a), ptr(&src, a));
    copy(&s, b, ptr(&d2, b), ptr(&src, a));
    s.checker.assert_clean("two launches that only read `src`");
    // A read-only parameter is still a read: an unordered writer is reported.
    let mut src = src;
    fill(&s, a, &mut src, 1);
    assert_eq!(s.checker.violations(), 1, "{}", s.checker.report());
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    // Only pointer-sized parameters can be declared.
    let err = s.checker.declare_read_only(&s.copy, &[2]).unwrap_err();
    assert_eq!(err, DeclareError::NotAPointer { index: 2 });
    assert!(
        err.to_string()
            .starts_with("parameter 2 of the kernel is not a pointer-sized")
    );
    // Nor a parameter past the last.
    let err = s.checker.declare_read_only(&s.copy, &[1, 9]).unwrap_err();
    assert_eq!(err, DeclareError::NotAPointer { index: 9 });
}

#[test]
fn a_launch_given_freed_memory_is_reported_and_refused() {
    let s = setup();
    let a = &s.a;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the context is current (bound by `setup`).
    unsafe { sys::cuMemAlloc_v2(&mut p, N * 4) }
        .result()
        .unwrap();
    // SAFETY: allocated above, freed once.
    unsafe { sys::cuMemFree_v2(p) }.result().unwrap();
    s.checker.reset();
    let (value, n) = (1u32, N as u32);
    let mut params = [
        &p as *const u64 as *mut c_void,
        &value as *const u32 as *mut c_void,
        &n as *const u32 as *mut c_void,
    ];
    // SAFETY: one pointer per parameter of `fill_u32`, alive for the call.
    let result = unsafe {
        sys::cuLaunchKernel(
            s.fill.cu_function(),
            4,
            1,
            1,
            256,
            1,
            1,
            0,
            a.cu_stream(),
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
    let report = s.checker.report();
    assert_eq!(s.checker.violations(), 1, "{report}");
    assert!(
        report.contains("cuLaunchKernel `fill_u32` (parameter 0) touches")
            && report.contains("already freed by cuMemFree on the host"),
        "{report}"
    );
}

#[test]
fn parameters_packed_in_extra_are_read_like_kernel_params() {
    let s = setup();
    let (a, b) = (&s.a, &s.b);
    let buf = a.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    s.checker.reset();
    // `fill_u32(u64, u32, u32)` packed: offsets 0, 8, 12; 16 bytes.
    let mut packed = [0u8; 16];
    packed[..8].copy_from_slice(&ptr(&buf, a).to_ne_bytes());
    packed[8..12].copy_from_slice(&3u32.to_ne_bytes());
    packed[12..].copy_from_slice(&(N as u32).to_ne_bytes());
    let mut size = packed.len();
    let mut launch = |stream: &CudaStream| {
        let mut extra = [
            std::ptr::without_provenance_mut::<c_void>(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            packed.as_mut_ptr().cast::<c_void>(),
            std::ptr::without_provenance_mut::<c_void>(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            (&mut size as *mut usize).cast::<c_void>(),
            null_mut(), // CU_LAUNCH_PARAM_END
        ];
        // SAFETY: the packed parameters of `fill_u32`, alive for the call.
        unsafe {
            sys::cuLaunchKernel(
                s.fill.cu_function(),
                4,
                1,
                1,
                256,
                1,
                1,
                0,
                stream.cu_stream(),
                null_mut(),
                extra.as_mut_ptr(),
            )
        }
        .result()
        .unwrap();
    };
    launch(a);
    launch(b);
    let report = s.checker.report();
    assert_eq!(s.checker.violations(), 1, "two unordered writers: {report}");
    a.synchronize().unwrap();
    b.synchronize().unwrap();
}

#[test]
fn cubins_fatbins_and_unreadable_ptx_are_refused() {
    let _ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    let _checker = Checker::attach().expect(NEEDS_SIMULATOR);
    let load = |image: &[u8]| {
        let mut module = null_mut();
        // SAFETY: a valid out-pointer; `image` is NUL-terminated or starts with a magic number.
        unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }
    };
    assert_eq!(
        load(b"\x7fELF\x02\x01\x01\0"),
        CUresult::CUDA_ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        load(&[0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0, 0]),
        CUresult::CUDA_ERROR_NOT_SUPPORTED
    );
    assert_eq!(load(b"not a module\0"), CUresult::CUDA_ERROR_INVALID_PTX);
    assert_eq!(
        load(b".version 7.0\n.entry k(.param .q32 x) { ret; }\0"),
        CUresult::CUDA_ERROR_INVALID_PTX
    );
    let mut module = null_mut();
    let text = std::ffi::CString::new(KERNELS_PTX).unwrap();
    // SAFETY: a valid out-pointer; NUL-terminated text; no options.
    let loaded = unsafe {
        sys::cuModuleLoadDataEx(&mut module, text.as_ptr().cast(), 0, null_mut(), null_mut())
    };
    assert_eq!(loaded, CUresult::CUDA_SUCCESS);
    let mut f = null_mut();
    // SAFETY: a loaded module; a NUL-terminated name; a valid out-pointer.
    unsafe { sys::cuModuleGetFunction(&mut f, module, c"copy_u32".as_ptr()) }
        .result()
        .unwrap();
    // SAFETY: loaded above, unloaded once.
    unsafe { sys::cuModuleUnload(module) }.result().unwrap();
    // A kernel of an unloaded module is an invalid handle.
    let mut params = [null_mut::<c_void>(); 3];
    // SAFETY: the handle is stale, which the driver reports before reading parameters.
    let launched = unsafe {
        sys::cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    };
    assert_eq!(launched, CUresult::CUDA_ERROR_INVALID_HANDLE);
}

#[test]
fn a_captured_launch_is_checked_at_each_graph_launch() {
    let s = setup();
    let (a, b) = (&s.a, &s.b);
    let mut src = a.alloc_zeros::<u32>(N).unwrap();
    let dst = b.alloc_zeros::<u32>(N).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let (dst_ptr, src_ptr) = (ptr(&dst, b), ptr(&src, a));
    // SAFETY: a live stream of the current context, not capturing.
    unsafe { CapturedGraph::begin(b.cu_stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) };
    copy(&s, b, dst_ptr, src_ptr);
    // SAFETY: `b` is being captured (begun above).
    let graph = unsafe { CapturedGraph::end(b.cu_stream()) }.expect("the capture stays valid");
    s.checker.reset();
    assert_eq!(
        s.checker.operations("cuLaunchKernel"),
        0,
        "captured, not run"
    );

    // Wrong: a launch of the graph on B races with A's kernel.
    let gate = Gate::hold(a);
    fill(&s, a, &mut src, 4);
    graph.launch(b);
    let report = s.checker.report();
    assert_eq!(s.checker.violations(), 1, "{report}");
    assert!(
        report.contains("cuLaunchKernel `copy_u32` (replayed by cuGraphLaunch")
            && report.contains("cuLaunchKernel `fill_u32`"),
        "{report}"
    );
    gate.release();
    a.synchronize().unwrap();
    b.synchronize().unwrap();

    // Right: the graph launched after an event recorded behind A's kernel.
    s.checker.reset();
    let gate = Gate::hold(a);
    fill(&s, a, &mut src, 5);
    let filled = a.record_event(None).unwrap();
    b.wait(&filled).unwrap();
    graph.launch(b);
    gate.release();
    b.synchronize().unwrap();
    s.checker.assert_clean("a graph launch ordered by an event");
    assert_eq!(
        s.checker.operations("cuLaunchKernel"),
        2,
        "one fill, one replay"
    );

    // A launch after the source was freed is reported and refused.
    drop(src);
    a.synchronize().unwrap();
    s.checker.reset();
    assert_eq!(graph.try_launch(b), CUresult::CUDA_ERROR_INVALID_VALUE);
    let report = s.checker.report();
    assert_eq!(s.checker.violations(), 1, "{report}");
    assert!(report.contains("(parameter 1) touches"), "{report}");
}
