//! Conformance of peer access and copies between devices: `cuDeviceCanAccessPeer`,
//! `cuCtxEnablePeerAccess` and `cuCtxDisablePeerAccess` with their documented errors,
//! `cuMemcpyPeerAsync` ordered on its stream behind an event recorded on another device's
//! stream (and not ordered without the wait), `cuMemcpyPeer`, and an event recorded on a stream
//! of another context. Each test needs two devices and says on stderr that it is skipped where
//! the driver has one.

use super::*;

use cuda_sim_testing::require_devices;
use sys::cudaError_enum::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
};

/// The primary contexts of devices 0 and 1 (retained by the returned `CudaContext`s), or
/// `None`, said on stderr, where the driver has one device.
fn two_devices(test: &str) -> Option<[Arc<CudaContext>; 2]> {
    let _ = ctx();
    if !require_devices(2, test) {
        return None;
    }
    Some([0, 1].map(|ordinal| CudaContext::new(ordinal).expect("a context on each device")))
}

fn can_access_peer(dev: c_int, peer: c_int) -> Result<c_int, CUresult> {
    let mut can = -1;
    // SAFETY: the out-pointer is a live local; ordinals are only looked up.
    match unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) } {
        SUCCESS => Ok(can),
        error => Err(error),
    }
}

fn enable_peer(peer: sys::CUcontext, flags: u32) -> CUresult {
    // SAFETY: `peer` is a live context (or the test's deliberate error case).
    unsafe { sys::cuCtxEnablePeerAccess(peer, flags) }
}

fn disable_peer(peer: sys::CUcontext) -> CUresult {
    // SAFETY: `peer` is a live context.
    unsafe { sys::cuCtxDisablePeerAccess(peer) }
}

fn bind(ctx: &CudaContext) {
    ctx.bind_to_thread().expect("bind a primary context");
}

#[test]
fn a_device_cannot_access_itself_as_a_peer_and_ordinals_are_checked() {
    let _ctx = ctx();
    let count = c_int::try_from(device_count()).unwrap();
    for dev in 0..count {
        assert_eq!(can_access_peer(dev, dev), Ok(0), "device {dev} with itself");
        for peer in 0..count {
            let can = can_access_peer(dev, peer).expect("cuDeviceCanAccessPeer");
            assert!(can == 0 || can == 1, "{dev} -> {peer}: {can}");
        }
        assert_eq!(
            can_access_peer(dev, count),
            Err(CUDA_ERROR_INVALID_DEVICE),
            "a peer ordinal out of range"
        );
    }
    assert_eq!(can_access_peer(-1, 0), Err(CUDA_ERROR_INVALID_DEVICE));
}

#[test]
fn peer_access_is_enabled_once_one_way_and_disabled_once() {
    let Some([c0, c1]) = two_devices("peer_access_is_enabled_once_one_way_and_disabled_once")
    else {
        return;
    };
    let (p0, p1) = (c0.cu_ctx(), c1.cu_ctx());
    bind(&c0);
    if can_access_peer(0, 1) != Ok(1) {
        assert_eq!(enable_peer(p1, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        eprintln!("device 0 cannot access device 1: only the refusal was checked");
        return;
    }
    assert_eq!(
        enable_peer(p1, 1),
        CUDA_ERROR_INVALID_VALUE,
        "flags must be 0"
    );
    assert_eq!(
        enable_peer(p0, 0),
        CUDA_ERROR_INVALID_CONTEXT,
        "the current context itself"
    );
    assert_eq!(disable_peer(p1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    ok(enable_peer(p1, 0), "cuCtxEnablePeerAccess");
    assert_eq!(enable_peer(p1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    // One way: device 1's context has not enabled access to device 0's.
    bind(&c1);
    assert_eq!(disable_peer(p0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    bind(&c0);
    ok(disable_peer(p1), "cuCtxDisablePeerAccess");
    assert_eq!(disable_peer(p1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    // With no current context (a new thread has none).
    let peer = p1 as usize;
    let none = std::thread::spawn(move || {
        let peer: sys::CUcontext = std::ptr::with_exposed_provenance_mut::<sys::CUctx_st>(peer);
        // SAFETY: a live context handle, only passed.
        let enable = unsafe { sys::cuCtxEnablePeerAccess(peer, 0) };
        // SAFETY: as above.
        let disable = unsafe { sys::cuCtxDisablePeerAccess(peer) };
        (enable, disable)
    });
    let (enable, disable) = none.join().unwrap();
    assert_eq!(enable, CUDA_ERROR_INVALID_CONTEXT, "no current context");
    assert_eq!(disable, CUDA_ERROR_INVALID_CONTEXT, "no current context");
}

/// Device 0 writes a buffer on its stream, held pending by a gate; device 1's stream copies it
/// with `cuMemcpyPeerAsync` into device 1's memory. After waiting on an event recorded after
/// the write, device 1's stream is pending while the gate holds, and copies the written values;
/// without the wait it completes while the write is still held, with the old values (and the
/// simulator's checker reports the race).
fn peer_copy_behind_another_devices_event(ordered: bool, test: &str) {
    let Some([c0, c1]) = two_devices(test) else {
        return;
    };
    let checker = Checker::attach();
    bind(&c0);
    let src = DevBuf::new(N);
    let a = Stream::non_blocking();
    a.fill(&src, 1);
    assert_eq!(a.sync(), SUCCESS);
    let written = Event::new();
    bind(&c1);
    let dst = DevBuf::new(N);
    let b = Stream::non_blocking();
    b.fill(&dst, 0);
    assert_eq!(b.sync(), SUCCESS);
    if let Some(checker) = &checker {
        checker.reset();
    }
    let gate = a.gate();
    a.fill(&src, 7);
    written.record(&a);
    if ordered {
        b.wait(&written);
    }
    // SAFETY: both are live allocations of `bytes` bytes of their contexts; a live stream.
    let result = unsafe {
        sys::cuMemcpyPeerAsync(dst.ptr, c1.cu_ctx(), src.ptr, c0.cu_ctx(), src.bytes, b.raw)
    };
    ok(result, "cuMemcpyPeerAsync");
    if ordered {
        assert_eq!(b.query(), NOT_READY, "the copy waits for device 0's write");
        gate.release();
        assert_eq!(b.read(&dst), vec![7; N]);
        if let Some(checker) = &checker {
            checker.assert_clean("a peer copy behind another device's event");
        }
    } else {
        assert_eq!(b.sync(), SUCCESS, "the copy does not wait for the gate");
        assert_eq!(b.read(&dst), vec![1; N], "copied before the write");
        gate.release();
        assert_eq!(a.sync(), SUCCESS);
        if let Some(checker) = &checker {
            assert_eq!(checker.violations(), 1, "{}", checker.report());
            checker.reset();
        }
    }
    assert_eq!(a.sync(), SUCCESS);
}

#[test]
fn a_peer_copy_waits_for_an_event_recorded_on_another_device() {
    peer_copy_behind_another_devices_event(
        true,
        "a_peer_copy_waits_for_an_event_recorded_on_another_device",
    );
}

#[test]
fn a_peer_copy_without_the_wait_does_not_wait_for_the_other_device() {
    peer_copy_behind_another_devices_event(
        false,
        "a_peer_copy_without_the_wait_does_not_wait_for_the_other_device",
    );
}

#[test]
fn cu_memcpy_peer_copies_between_devices_with_or_without_peer_access() {
    let Some([c0, c1]) =
        two_devices("cu_memcpy_peer_copies_between_devices_with_or_without_peer_access")
    else {
        return;
    };
    bind(&c1);
    let dst = DevBuf::new(N);
    let b = Stream::non_blocking();
    b.fill(&dst, 0);
    assert_eq!(b.sync(), SUCCESS);
    bind(&c0);
    let src = DevBuf::new(N);
    let a = Stream::non_blocking();
    a.fill(&src, 0x1234_5678);
    assert_eq!(a.sync(), SUCCESS);
    // SAFETY: both are live allocations of `bytes` bytes of their contexts.
    let result =
        unsafe { sys::cuMemcpyPeer(dst.ptr, c1.cu_ctx(), src.ptr, c0.cu_ctx(), src.bytes) };
    ok(result, "cuMemcpyPeer");
    assert_eq!(b.read(&dst), vec![0x1234_5678; N]);
    // Back, into the first half of device 0's buffer, on device 0's stream.
    b.fill(&dst, 5);
    assert_eq!(b.sync(), SUCCESS);
    // SAFETY: as above, half the bytes.
    let result = unsafe {
        sys::cuMemcpyPeerAsync(
            src.ptr,
            c0.cu_ctx(),
            dst.ptr,
            c1.cu_ctx(),
            src.bytes / 2,
            a.raw,
        )
    };
    ok(result, "cuMemcpyPeerAsync");
    let back = a.read(&src);
    assert_eq!(back[..N / 2], vec![5; N / 2][..]);
    assert_eq!(back[N / 2..], vec![0x1234_5678; N / 2][..]);
}

#[test]
fn an_event_is_recorded_only_on_a_stream_of_its_own_context() {
    let Some([c0, c1]) = two_devices("an_event_is_recorded_only_on_a_stream_of_its_own_context")
    else {
        return;
    };
    bind(&c0);
    let event = Event::new();
    bind(&c1);
    let other = Stream::non_blocking();
    // SAFETY: live handles of two contexts: the call under test.
    let result = unsafe { sys::cuEventRecord(event.0, other.raw) };
    assert_eq!(result, CUDA_ERROR_INVALID_HANDLE);
    // Waiting on it from a stream of the other device is allowed.
    bind(&c0);
    let mine = Stream::non_blocking();
    event.record(&mine);
    other.wait(&event);
    assert_eq!(other.sync(), SUCCESS);
    assert_eq!(mine.sync(), SUCCESS);
}
