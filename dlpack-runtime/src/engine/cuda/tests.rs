//! Unit tests of the driver tier: special stream handles, the driver probe, and the verdicts on
//! failed waits.

use super::*;
use crate::plan::stream::{StreamRequest, SyncPlan};

#[test]
fn special_streams_map_to_the_driver_handles() {
    assert_eq!(raw_stream(StreamId::LegacyDefault) as usize, 1);
    assert_eq!(raw_stream(StreamId::PerThreadDefault) as usize, 2);
    let h = core::num::NonZeroU64::new(0xdead_b000).unwrap();
    assert_eq!(raw_stream(StreamId::Handle(h)) as usize, 0xdead_b000);
}

#[test]
fn without_a_driver_everything_is_an_error_not_a_panic() {
    // Set by the test command: `present` on the CUDA simulator, `absent` with no driver.
    let expected = std::env::var("DLPACK_TESTS_EXPECT_DRIVER").ok();
    match init() {
        Err(CudaError::NoDriver) => {
            assert_ne!(expected.as_deref(), Some("present"));
            assert_eq!(pointer_device(0x1000), Err(CudaError::NoDriver));
            assert_eq!(pointer_range(0x1000), Err(CudaError::NoDriver));
            let handle = StreamId::Handle(core::num::NonZeroU64::new(0xdead_b000).unwrap());
            assert_eq!(
                check_producer_raw_stream(handle, 0),
                Err(CudaError::NoDriver)
            );
            assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
            assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
            let plan = SyncPlan::HostSync {
                streams: vec![StreamId::LegacyDefault],
            };
            assert_eq!(execute(&plan, &[]), Err(CudaError::NoDriver));
        }
        other => {
            assert_ne!(expected.as_deref(), Some("absent"), "{other:?}");
            other.expect("the driver initializes");
            assert!(matches!(
                pointer_device(0x1000),
                Err(CudaError::Driver {
                    call: "cuPointerGetAttribute",
                    ..
                })
            ));
            assert_eq!(
                pointer_range(0x1000),
                Err(CudaError::Driver {
                    call: "cuPointerGetAttribute",
                    code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
                })
            );
            assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
            assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
        }
    }
}

#[test]
fn failed_waits_free_only_in_broken_contexts_and_retry_only_under_capture() {
    use sys::CUresult as R;
    let failed = |code| CudaError::Driver {
        call: "cuEventSynchronize",
        code,
    };
    for code in [
        R::CUDA_ERROR_ILLEGAL_ADDRESS,
        R::CUDA_ERROR_LAUNCH_FAILED,
        R::CUDA_ERROR_ECC_UNCORRECTABLE,
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        R::CUDA_ERROR_DEINITIALIZED,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Free,
            "{code:?}"
        );
    }
    for code in [
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Retry,
            "{code:?}"
        );
    }
    for code in [
        R::CUDA_ERROR_INVALID_HANDLE,
        R::CUDA_ERROR_NOT_READY,
        R::CUDA_ERROR_UNKNOWN,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Leak,
            "{code:?}"
        );
    }
    assert_eq!(
        after_failed_wait(&CudaError::NoDriver),
        AfterFailedWait::Leak
    );
}

/// Whether a CUDA driver is loaded; without one, says that `what` was not checked (a failure
/// where `DLPACK_TESTS_EXPECT_DRIVER=present`).
fn driver_present(what: &str) -> bool {
    if init().is_ok() {
        return true;
    }
    let expected = std::env::var("DLPACK_TESTS_EXPECT_DRIVER").ok();
    assert_ne!(
        expected.as_deref(),
        Some("present"),
        "a driver was expected"
    );
    println!("no CUDA driver: {what} was not checked");
    false
}

/// A host function that blocks its stream until the flag it points to is set.
unsafe extern "C" fn hold_until_set(flag: *mut core::ffi::c_void) {
    // SAFETY: `flag` is the `AtomicBool` the test keeps alive until the stream has passed this.
    let flag = unsafe { &*flag.cast::<std::sync::atomic::AtomicBool>() };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !flag.load(std::sync::atomic::Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

#[test]
fn a_kept_stream_is_made_without_waiting_for_the_device() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;
    if !driver_present("the making of a kept stream") {
        return;
    }
    // Work pending on the device, held by a host function until `open` is set.
    let busy = CudaContext::new(0).unwrap();
    let held = busy.new_stream().unwrap();
    let open = Box::new(AtomicBool::new(false));
    let flag = (&*open as *const AtomicBool).cast_mut().cast();
    // SAFETY: a live stream of `busy`; the flag outlives the host function (the stream is
    // synchronized below, before `open` is dropped).
    unsafe { sys::cuLaunchHostFunc(held.cu_stream(), Some(hold_until_set), flag) }
        .result()
        .unwrap();
    // Each on a handle of its own of the primary context, as a fresh `CudaContext::new(0)`
    // is: its first stream.
    let (made, kept) = channel();
    let ctx = CudaContext::new(0).unwrap();
    std::thread::spawn(move || {
        let _ = made.send(kept_stream(&ctx).map(|s| s.cu_stream() as usize));
    });
    let kept = kept.recv_timeout(Duration::from_secs(10));
    // The negative control: cudarc's `new_stream` waits for the held work.
    let (made, cudarcs) = channel();
    let ctx = CudaContext::new(0).unwrap();
    std::thread::spawn(move || {
        let _ = made.send(ctx.new_stream().map(|s| s.cu_stream() as usize));
    });
    let waited = cudarcs.recv_timeout(Duration::from_millis(500)).is_err();
    open.store(true, Ordering::Release);
    let cudarcs = cudarcs.recv_timeout(Duration::from_secs(30));
    held.synchronize().unwrap();
    drop(open);
    assert!(
        matches!(kept, Ok(Ok(stream)) if stream != 0),
        "the kept stream was made while the device was busy: {kept:?}"
    );
    assert!(
        waited,
        "cudarc's first stream of a handle waits for the device"
    );
    assert!(matches!(cudarcs, Ok(Ok(_))), "{cudarcs:?}");
}

#[test]
fn a_producer_ordered_before_a_stream_being_captured_is_ordered_at_every_launch() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use sys::CUresult as R;
    const N: usize = 1024;
    if !driver_present("the capture of an ordered import") {
        return;
    }
    let ctx = context(0).unwrap();
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx()).unwrap();
    let (producer, consumer) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let (p, c) = (producer.cu_stream(), consumer.cu_stream());
    let open = Box::new(AtomicBool::new(false));
    // SAFETY: plain driver calls on live streams and memory of the bound context; the flag
    // outlives the host function (the stream is synchronized before it is dropped); every
    // copy and memset stays within the `N` u32 allocated.
    unsafe {
        let (mut src, mut dst) = (0, 0);
        sys::cuMemAlloc_v2(&mut src, N * 4).result().unwrap();
        sys::cuMemAlloc_v2(&mut dst, N * 4).result().unwrap();
        let flag = (&*open as *const AtomicBool).cast_mut().cast();
        sys::cuLaunchHostFunc(p, Some(hold_until_set), flag)
            .result()
            .unwrap();
        sys::cuMemsetD32Async(src, 9, N, p).result().unwrap();
        // The consumer's stream is captured, as a C exchange API consumer's would be.
        sys::cuStreamBeginCapture_v2(
            c,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .result()
        .unwrap();
        let request = StreamRequest::Handle(core::num::NonZeroU64::new(c as u64).unwrap());
        let kept = order_raw(0, p, request).unwrap();
        assert_eq!(kept.len(), 1, "the event the graph waits on is kept");
        sys::cuMemcpyDtoDAsync_v2(dst, src, N * 4, c)
            .result()
            .unwrap();
        let mut graph = core::ptr::null_mut();
        sys::cuStreamEndCapture(c, &mut graph).result().unwrap();
        let mut exec = core::ptr::null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        for launch in 1..=3 {
            sys::cuMemsetD32Async(dst, 0, N, c).result().unwrap();
            sys::cuGraphLaunch(exec, c).result().unwrap();
            if launch == 1 {
                // Behind the held producer: the host did not wait, the launch does.
                std::thread::sleep(std::time::Duration::from_millis(50));
                assert_eq!(sys::cuStreamQuery(c), R::CUDA_ERROR_NOT_READY);
                open.store(true, Ordering::Release);
            }
            let mut host = vec![0u32; N];
            sys::cuStreamSynchronize(c).result().unwrap();
            sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), dst, N * 4)
                .result()
                .unwrap();
            assert_eq!(host, vec![9; N], "launch {launch}");
        }
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        drop(kept);
        sys::cuStreamSynchronize(p).result().unwrap();
        sys::cuMemFree_v2(src).result().unwrap();
        sys::cuMemFree_v2(dst).result().unwrap();
    }
}
