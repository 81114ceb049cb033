//! Several devices on the simulator: the device count the kit reports, peer copies ordered by
//! events recorded on another device's stream (and the races flagged without them), kernel
//! launches reaching another device's memory with and without peer access, and the simulator's
//! `CUDA_SIM_DEVICES` and `CUDA_SIM_NO_PEER` settings, run in child processes of this test
//! binary (the simulator reads its settings once per process).
//!
//! On a real driver the tests that need the simulator's checker or settings say they are
//! skipped; the same semantics are checked on hardware by the conformance suite
//! (`tests/tests/cuda_driver.rs`, module `peer`).

use std::ffi::c_void;
use std::process::Command;
use std::ptr::null_mut;

use cuda_sim_testing::{Checker, Driver, Gate, device_count, require_devices};
use cudarc::driver::sys::{self, CUresult};

/// `u32`s per buffer.
const N: usize = 1024;
const BYTES: usize = N * 4;

#[track_caller]
fn ok(result: CUresult, what: &str) {
    assert_eq!(result, CUresult::CUDA_SUCCESS, "{what}");
}

/// Whether this process runs on the simulator; if not, says the test is skipped.
fn on_simulator(test: &str) -> bool {
    if cuda_sim_testing::driver() == Driver::Simulator {
        return true;
    }
    eprintln!("skipped: {test} checks the CUDA simulator's model, and the driver is a GPU's");
    false
}

/// The simulator's checker where the test can run: on the simulator, with two devices or
/// more; otherwise `None`, and the test says on stderr that it is skipped.
fn checker_and_two_devices(test: &str) -> Option<Checker> {
    if !on_simulator(test) || !require_devices(2, test) {
        return None;
    }
    Checker::attach()
}

/// The primary context of device `ordinal`, retained (for the process).
fn context(ordinal: i32) -> sys::CUcontext {
    let mut ctx = null_mut();
    // SAFETY: the driver is initialized (`device_count`); a live out-pointer.
    ok(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, ordinal) },
        "cuDevicePrimaryCtxRetain",
    );
    ctx
}

fn make_current(ctx: sys::CUcontext) {
    // SAFETY: a live context.
    ok(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent");
}

/// The contexts of the first `n` devices.
fn contexts(n: usize) -> Vec<sys::CUcontext> {
    assert!(device_count().unwrap() >= n);
    (0..n as i32).map(context).collect()
}

/// A non-blocking stream of `ctx`.
fn stream(ctx: sys::CUcontext) -> sys::CUstream {
    make_current(ctx);
    let mut s = null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: a live out-pointer, a current context.
    ok(
        unsafe { sys::cuStreamCreate(&mut s, flags) },
        "cuStreamCreate",
    );
    s
}

/// `BYTES` of memory of `ctx`'s device.
fn alloc(ctx: sys::CUcontext) -> sys::CUdeviceptr {
    make_current(ctx);
    let mut p = 0;
    // SAFETY: a live out-pointer, a current context.
    ok(unsafe { sys::cuMemAlloc_v2(&mut p, BYTES) }, "cuMemAlloc");
    p
}

/// An event of `ctx`, timing disabled.
fn event(ctx: sys::CUcontext) -> sys::CUevent {
    make_current(ctx);
    let mut e = null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: a live out-pointer, a current context.
    ok(
        unsafe { sys::cuEventCreate(&mut e, flags) },
        "cuEventCreate",
    );
    e
}

fn fill(p: sys::CUdeviceptr, value: u32, s: sys::CUstream) {
    // SAFETY: `p` is a live allocation of `N` `u32`s; `s` a live stream.
    ok(
        unsafe { sys::cuMemsetD32Async(p, value, N, s) },
        "cuMemsetD32Async",
    );
}

fn record(e: sys::CUevent, s: sys::CUstream) {
    // SAFETY: live handles of one context.
    ok(unsafe { sys::cuEventRecord(e, s) }, "cuEventRecord");
}

fn wait(s: sys::CUstream, e: sys::CUevent) {
    // SAFETY: live handles (of any contexts).
    ok(
        unsafe { sys::cuStreamWaitEvent(s, e, 0) },
        "cuStreamWaitEvent",
    );
}

/// Copies all of `src` (memory of `src_ctx`) into `dst` (of `dst_ctx`) on stream `s`.
fn peer_copy(
    dst: sys::CUdeviceptr,
    dst_ctx: sys::CUcontext,
    src: sys::CUdeviceptr,
    src_ctx: sys::CUcontext,
    s: sys::CUstream,
) {
    // SAFETY: both are live allocations of `BYTES` bytes of their contexts; a live stream.
    let result = unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, BYTES, s) };
    ok(result, "cuMemcpyPeerAsync");
}

fn sync(s: sys::CUstream) {
    // SAFETY: a live stream.
    ok(
        unsafe { sys::cuStreamSynchronize(s) },
        "cuStreamSynchronize",
    );
}

/// The `u32`s of `p` (memory of `ctx`), read synchronously once its writers are synchronized.
fn read(ctx: sys::CUcontext, p: sys::CUdeviceptr) -> Vec<u32> {
    make_current(ctx);
    let mut out = vec![0u32; N];
    // SAFETY: `out` has room for `BYTES` bytes; `p` is a live allocation of as many.
    let result = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, BYTES) };
    ok(result, "cuMemcpyDtoH");
    out
}

fn free(ctx: sys::CUcontext, p: sys::CUdeviceptr) {
    make_current(ctx);
    // SAFETY: a live allocation, freed once, after its users were synchronized.
    ok(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree");
}

fn destroy(s: sys::CUstream, e: sys::CUevent) {
    // SAFETY: live handles, destroyed once.
    unsafe {
        ok(sys::cuStreamDestroy_v2(s), "cuStreamDestroy");
        ok(sys::cuEventDestroy_v2(e), "cuEventDestroy");
    }
}

/// Holds stream `s` until released.
fn gate(s: sys::CUstream) -> Gate {
    // SAFETY: a live stream.
    unsafe { Gate::hold_raw(s) }
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

#[test]
fn device_count_is_the_drivers_count() {
    let count = device_count().unwrap();
    let driver = cuda_sim_testing::load().unwrap();
    let mut raw = 0;
    // SAFETY: the driver is initialized by `device_count`; a live out-pointer.
    ok(
        unsafe { sys::cuDeviceGetCount(&mut raw) },
        "cuDeviceGetCount",
    );
    assert_eq!(count, raw as usize);
    if driver == Driver::Simulator && std::env::var_os("CUDA_SIM_DEVICES").is_none() {
        assert_eq!(count, 2, "the simulator's default");
    }
    assert!(require_devices(count, "device_count_is_the_drivers_count"));
    assert!(!require_devices(
        count + 1,
        "a test needing one more device"
    ));
}

/// `CUDA_SIM_TESTING_NO_SKIP=1` turns the skip into a failure naming the count (in a child,
/// where the variable is set); without it the same call skips (above).
#[test]
fn no_skip_turns_a_skip_into_a_failure() {
    if !on_simulator("no_skip_turns_a_skip_into_a_failure") {
        return;
    }
    in_child(
        "child_fails_instead_of_skipping",
        &[("CUDA_SIM_TESTING_NO_SKIP", "1")],
    );
}

#[test]
#[ignore = "run by no_skip_turns_a_skip_into_a_failure, in a child with CUDA_SIM_TESTING_NO_SKIP=1"]
fn child_fails_instead_of_skipping() {
    let count = device_count().unwrap();
    assert!(require_devices(
        count,
        "a test the driver has the devices for"
    ));
    let failed = std::panic::catch_unwind(|| require_devices(count + 1, "a needy test"))
        .expect_err("not skipped: it fails");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "a needy test needs {} CUDA devices, and the driver has {count} devices (CUDA_SIM_TESTING_NO_SKIP=1: not skipped)",
            count + 1
        )
    );
}

#[test]
fn device_count_follows_the_simulators_setting() {
    if !on_simulator("device_count_follows_the_simulators_setting") {
        return;
    }
    for n in ["1", "4"] {
        in_child("child_reports_the_device_count", &[("CUDA_SIM_DEVICES", n)]);
    }
}

#[test]
#[ignore = "run by device_count_follows_the_simulators_setting, in a child with CUDA_SIM_DEVICES set"]
fn child_reports_the_device_count() {
    let expected: usize = std::env::var("CUDA_SIM_DEVICES").unwrap().parse().unwrap();
    assert_eq!(device_count().unwrap(), expected);
    assert!(require_devices(expected, "child_reports_the_device_count"));
    assert!(!require_devices(
        expected + 1,
        "a test needing one more device"
    ));
}

/// A buffer of device 0 written on a stream of device 0 (held by a gate, so the write is
/// pending), then copied to device 1 by a stream of device 1: with a wait on an event recorded
/// after the write, the copy is ordered and copies the written values; without it, the read of
/// the source is flagged.
fn peer_copy_after_a_cross_device_wait(ordered: bool) {
    let Some(checker) = checker_and_two_devices("peer_copy_after_a_cross_device_wait") else {
        return;
    };
    let ctx = contexts(2);
    let (a, b) = (stream(ctx[0]), stream(ctx[1]));
    let (src, dst) = (alloc(ctx[0]), alloc(ctx[1]));
    let written = event(ctx[0]);
    checker.reset();
    let g = gate(a);
    fill(src, 0x5eed, a);
    record(written, a);
    if ordered {
        wait(b, written);
    }
    peer_copy(dst, ctx[1], src, ctx[0], b);
    g.release();
    sync(a);
    sync(b);
    let report = checker.report();
    if ordered {
        assert_eq!(checker.violations(), 0, "{report}");
        assert_eq!(read(ctx[1], dst), vec![0x5eed; N]);
    } else {
        assert_eq!(checker.violations(), 1, "{report}");
        assert!(
            report.contains("read of bytes [")
                && report.contains("cuMemcpyPeerAsync")
                && report.contains("is not ordered after the write")
                && report.contains("cuMemsetD32Async"),
            "{report}"
        );
    }
    assert_eq!(checker.operations("cuMemcpyPeerAsync"), 1);
    free(ctx[0], src);
    free(ctx[1], dst);
    destroy(a, written);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(b) }, "cuStreamDestroy");
}

#[test]
fn a_peer_copy_after_a_wait_on_another_devices_event_is_ordered() {
    peer_copy_after_a_cross_device_wait(true);
}

#[test]
fn a_peer_copy_without_the_wait_races_with_the_other_devices_write() {
    peer_copy_after_a_cross_device_wait(false);
}

/// The other way round: device 0 overwrites its buffer after a stream of device 1 read it with
/// a peer copy (held pending by a gate). Ordered by an event recorded on device 1's stream and
/// waited on by device 0's, the copy keeps the old values; without the wait, the write is
/// flagged.
fn overwrite_after_a_peer_read(ordered: bool) {
    let Some(checker) = checker_and_two_devices("overwrite_after_a_peer_read") else {
        return;
    };
    let ctx = contexts(2);
    let (a, b) = (stream(ctx[0]), stream(ctx[1]));
    let (src, dst) = (alloc(ctx[0]), alloc(ctx[1]));
    fill(src, 1, a);
    sync(a);
    let copied = event(ctx[1]);
    checker.reset();
    let g = gate(b);
    peer_copy(dst, ctx[1], src, ctx[0], b);
    record(copied, b);
    if ordered {
        wait(a, copied);
    }
    fill(src, 2, a);
    g.release();
    sync(a);
    sync(b);
    let report = checker.report();
    if ordered {
        assert_eq!(checker.violations(), 0, "{report}");
        assert_eq!(
            read(ctx[1], dst),
            vec![1; N],
            "the copy ran before the overwrite"
        );
        assert_eq!(read(ctx[0], src), vec![2; N]);
    } else {
        assert_eq!(checker.violations(), 1, "{report}");
        assert!(
            report.contains("write of bytes [")
                && report.contains("is not ordered after the read")
                && report.contains("cuMemcpyPeerAsync"),
            "{report}"
        );
    }
    free(ctx[0], src);
    free(ctx[1], dst);
    destroy(b, copied);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(a) }, "cuStreamDestroy");
}

#[test]
fn an_overwrite_after_a_wait_on_the_peer_copys_event_is_ordered() {
    overwrite_after_a_peer_read(true);
}

#[test]
fn an_overwrite_without_the_wait_races_with_the_peer_copys_read() {
    overwrite_after_a_peer_read(false);
}

/// A kernel whose one parameter is a pointer; the simulator reads only its signature.
const PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
    .visible .entry touch(.param .u64 touch_p)\n{\n\tret;\n}\n\0";

/// Launches `touch(p)` on `s`, one thread.
fn launch(f: sys::CUfunction, p: sys::CUdeviceptr, s: sys::CUstream) {
    let mut params = [&p as *const sys::CUdeviceptr as *mut c_void];
    // SAFETY: one pointer per parameter of `touch`, alive for the call; live handles.
    let result =
        unsafe { sys::cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.as_mut_ptr(), null_mut()) };
    ok(result, "cuLaunchKernel");
}

#[test]
fn a_kernel_reaching_another_devices_memory_needs_peer_access() {
    let Some(checker) =
        checker_and_two_devices("a_kernel_reaching_another_devices_memory_needs_peer_access")
    else {
        return;
    };
    let ctx = contexts(2);
    let a = stream(ctx[0]);
    let (mine, theirs) = (alloc(ctx[0]), alloc(ctx[1]));
    make_current(ctx[0]);
    let (mut module, mut f) = (null_mut(), null_mut());
    // SAFETY: NUL-terminated PTX text; live out-pointers; a current context.
    unsafe {
        ok(
            sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()),
            "cuModuleLoadData",
        );
        ok(
            sys::cuModuleGetFunction(&mut f, module, c"touch".as_ptr()),
            "cuModuleGetFunction",
        );
    }
    checker.reset();
    launch(f, mine, a);
    sync(a);
    assert_eq!(checker.violations(), 0, "{}", checker.report());

    launch(f, theirs, a);
    sync(a);
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains("cuLaunchKernel `touch`")
            && report.contains("of device 1")
            && report.contains("without peer access enabled"),
        "{report}"
    );

    checker.reset();
    // SAFETY: a live peer context, device 0's current.
    ok(
        unsafe { sys::cuCtxEnablePeerAccess(ctx[1], 0) },
        "cuCtxEnablePeerAccess",
    );
    launch(f, theirs, a);
    sync(a);
    assert_eq!(checker.violations(), 0, "{}", checker.report());

    // SAFETY: as above.
    ok(
        unsafe { sys::cuCtxDisablePeerAccess(ctx[1]) },
        "cuCtxDisablePeerAccess",
    );
    launch(f, theirs, a);
    sync(a);
    assert_eq!(checker.violations(), 1, "{}", checker.report());
    checker.reset();

    // SAFETY: a loaded module, unloaded once, its launches synchronized.
    ok(unsafe { sys::cuModuleUnload(module) }, "cuModuleUnload");
    free(ctx[0], mine);
    free(ctx[1], theirs);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(a) }, "cuStreamDestroy");
}

#[test]
fn a_chain_of_peer_copies_across_four_devices() {
    if !on_simulator("a_chain_of_peer_copies_across_four_devices") {
        return;
    }
    for ordered in ["1", "0"] {
        in_child(
            "child_chain_of_peer_copies",
            &[("CUDA_SIM_DEVICES", "4"), ("PEER_CHAIN_ORDERED", ordered)],
        );
    }
}

/// Device 0's buffer is copied to device 1, then 2, then 3, each copy on a stream of its
/// destination device waiting on an event recorded after the previous copy; the first write is
/// held pending by a gate. Ordered: every buffer has the value, no violation. With the wait of
/// device 2's stream left out: exactly that copy's read is flagged.
#[test]
#[ignore = "run by a_chain_of_peer_copies_across_four_devices, with CUDA_SIM_DEVICES=4"]
fn child_chain_of_peer_copies() {
    let ordered = std::env::var("PEER_CHAIN_ORDERED").unwrap() == "1";
    assert_eq!(device_count().unwrap(), 4);
    let checker = Checker::attach().expect("the simulator");
    let ctx = contexts(4);
    let streams: Vec<_> = ctx.iter().map(|&c| stream(c)).collect();
    let bufs: Vec<_> = ctx.iter().map(|&c| alloc(c)).collect();
    let events: Vec<_> = ctx.iter().map(|&c| event(c)).collect();
    checker.reset();
    let g = gate(streams[0]);
    fill(bufs[0], 0xabcd, streams[0]);
    record(events[0], streams[0]);
    for k in 1..4 {
        if ordered || k != 2 {
            wait(streams[k], events[k - 1]);
        }
        peer_copy(bufs[k], ctx[k], bufs[k - 1], ctx[k - 1], streams[k]);
        record(events[k], streams[k]);
    }
    g.release();
    for &s in &streams {
        sync(s);
    }
    let report = checker.report();
    if ordered {
        assert_eq!(checker.violations(), 0, "{report}");
        for k in 0..4 {
            assert_eq!(read(ctx[k], bufs[k]), vec![0xabcd; N], "device {k}");
        }
    } else {
        assert_eq!(checker.violations(), 1, "{report}");
        assert!(
            report.contains("read of bytes [")
                && report.contains("cuMemcpyPeerAsync")
                && report.contains("is not ordered after the write"),
            "{report}"
        );
    }
    for k in 0..4 {
        free(ctx[k], bufs[k]);
        destroy(streams[k], events[k]);
    }
}

#[test]
fn the_no_peer_setting_makes_pairs_unable_and_copies_still_work() {
    if !on_simulator("the_no_peer_setting_makes_pairs_unable_and_copies_still_work") {
        return;
    }
    in_child(
        "child_no_peer",
        &[("CUDA_SIM_DEVICES", "4"), ("CUDA_SIM_NO_PEER", "0:1, 3:2")],
    );
    in_child(
        "child_no_peer",
        &[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_NO_PEER", "all")],
    );
}

/// The pairs `CUDA_SIM_NO_PEER` lists answer 0 both ways, and enabling access between them is
/// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`; a peer copy between them works (staged by the driver).
#[test]
#[ignore = "run by the_no_peer_setting_makes_pairs_unable_and_copies_still_work"]
fn child_no_peer() {
    let n = device_count().unwrap();
    let setting = std::env::var("CUDA_SIM_NO_PEER").unwrap();
    let unable = |a: usize, b: usize| {
        a == b || setting == "all" || [(0, 1), (1, 0), (2, 3), (3, 2)].contains(&(a, b))
    };
    for dev in 0..n {
        for peer in 0..n {
            let mut can = -1;
            // SAFETY: a live out-pointer; ordinals in range.
            ok(
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev as i32, peer as i32) },
                "cuDeviceCanAccessPeer",
            );
            assert_eq!(can, i32::from(!unable(dev, peer)), "{dev} -> {peer}");
        }
    }
    let checker = Checker::attach().expect("the simulator");
    let ctx = contexts(2);
    make_current(ctx[0]);
    // SAFETY: a live peer context.
    let result = unsafe { sys::cuCtxEnablePeerAccess(ctx[1], 0) };
    assert_eq!(result, CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    let a = stream(ctx[0]);
    let (src, dst) = (alloc(ctx[0]), alloc(ctx[1]));
    fill(src, 9, a);
    peer_copy(dst, ctx[1], src, ctx[0], a);
    sync(a);
    assert_eq!(read(ctx[1], dst), vec![9; N]);
    assert_eq!(checker.violations(), 0, "{}", checker.report());
    free(ctx[0], src);
    free(ctx[1], dst);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(a) }, "cuStreamDestroy");
}

/// A peer copy given a pointer with a context of another device is reported and still copies;
/// a context that is not one (NULL) is `CUDA_ERROR_INVALID_CONTEXT`.
#[test]
fn a_peer_copy_checks_its_contexts() {
    let Some(checker) = checker_and_two_devices("a_peer_copy_checks_its_contexts") else {
        return;
    };
    let ctx = contexts(2);
    let a = stream(ctx[0]);
    let (src, dst) = (alloc(ctx[0]), alloc(ctx[1]));
    fill(src, 3, a);
    sync(a);
    checker.reset();
    // SAFETY: live allocations of `BYTES` bytes; a NULL context, the case under test.
    let result = unsafe { sys::cuMemcpyPeerAsync(dst, null_mut(), src, ctx[0], BYTES, a) };
    assert_eq!(result, CUresult::CUDA_ERROR_INVALID_CONTEXT);
    // Device 1's memory named with device 0's context.
    peer_copy(dst, ctx[0], src, ctx[0], a);
    sync(a);
    let report = checker.report();
    assert_eq!(checker.violations(), 1, "{report}");
    assert!(
        report.contains("cuMemcpyPeerAsync: the destination")
            && report.contains("is memory of device 1, but its context is one of device 0"),
        "{report}"
    );
    assert_eq!(read(ctx[1], dst), vec![3; N], "copied all the same");
    checker.reset();
    free(ctx[0], src);
    free(ctx[1], dst);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(a) }, "cuStreamDestroy");
}

/// Two contexts of one device are no peers (`cuDeviceCanAccessPeer` answers 0 for a device
/// with itself); a created context of another device is, and its access ends with it.
#[test]
fn peer_access_between_created_contexts() {
    let test = "peer_access_between_created_contexts";
    if !on_simulator(test) || !require_devices(2, test) {
        return;
    }
    let ctx = contexts(2);
    let create = |dev: i32| {
        let mut c = null_mut();
        // SAFETY: a live out-pointer; no creation parameters.
        ok(
            unsafe { sys::cuCtxCreate_v4(&mut c, null_mut(), 0, dev) },
            "cuCtxCreate",
        );
        c
    };
    let same = create(0);
    // SAFETY: live contexts; `same` is current (made so by its creation).
    let result = unsafe { sys::cuCtxEnablePeerAccess(ctx[0], 0) };
    assert_eq!(result, CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    // SAFETY: as above.
    ok(
        unsafe { sys::cuCtxEnablePeerAccess(ctx[1], 0) },
        "cuCtxEnablePeerAccess",
    );
    make_current(ctx[1]);
    let other = create(1);
    make_current(ctx[1]);
    // SAFETY: live contexts.
    ok(
        unsafe { sys::cuCtxEnablePeerAccess(same, 0) },
        "cuCtxEnablePeerAccess",
    );
    // SAFETY: as above.
    let result = unsafe { sys::cuCtxEnablePeerAccess(other, 0) };
    assert_eq!(
        result,
        CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        "one device"
    );
    // SAFETY: a created context, destroyed once.
    ok(unsafe { sys::cuCtxDestroy_v2(same) }, "cuCtxDestroy");
    make_current(ctx[1]);
    // SAFETY: a destroyed context: the case under test.
    let result = unsafe { sys::cuCtxDisablePeerAccess(same) };
    assert_eq!(result, CUresult::CUDA_ERROR_INVALID_CONTEXT);
    // SAFETY: a created context, destroyed once.
    ok(unsafe { sys::cuCtxDestroy_v2(other) }, "cuCtxDestroy");
}

/// A peer copy captured on a stream of device 1 into a graph: each launch copies device 0's
/// buffer again, ordered behind device 0's write by an event wait before the launch; a launch
/// without that wait is flagged, reported as the captured copy.
#[test]
fn a_captured_peer_copy_is_replayed_in_the_launch_streams_order() {
    let Some(checker) =
        checker_and_two_devices("a_captured_peer_copy_is_replayed_in_the_launch_streams_order")
    else {
        return;
    };
    let ctx = contexts(2);
    let (a, b) = (stream(ctx[0]), stream(ctx[1]));
    let (src, dst) = (alloc(ctx[0]), alloc(ctx[1]));
    let written = event(ctx[0]);
    let (mut graph, mut exec) = (null_mut(), null_mut());
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: live handles and out-pointers; the capture is ended on the stream that began it.
    unsafe {
        ok(
            sys::cuStreamBeginCapture_v2(b, mode),
            "cuStreamBeginCapture",
        );
        peer_copy(dst, ctx[1], src, ctx[0], b);
        ok(sys::cuStreamEndCapture(b, &mut graph), "cuStreamEndCapture");
        ok(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            "cuGraphInstantiateWithFlags",
        );
    }
    let launch = || {
        // SAFETY: a live executable graph and stream.
        ok(unsafe { sys::cuGraphLaunch(exec, b) }, "cuGraphLaunch");
    };
    checker.reset();
    for (value, ordered) in [(11, true), (12, true), (13, false)] {
        let g = gate(a);
        fill(src, value, a);
        record(written, a);
        if ordered {
            wait(b, written);
        }
        launch();
        g.release();
        sync(a);
        sync(b);
        let report = checker.report();
        if ordered {
            assert_eq!(checker.violations(), 0, "{report}");
            assert_eq!(read(ctx[1], dst), vec![value; N]);
        } else {
            assert_eq!(checker.violations(), 1, "{report}");
            assert!(
                report.contains("read of bytes [")
                    && report.contains("by cuMemcpyPeerAsync on stream")
                    && report.contains("is not ordered after the write"),
                "{report}"
            );
        }
    }
    assert_eq!(checker.operations("cuMemcpyPeerAsync"), 3);
    checker.reset();
    // SAFETY: live graphs, destroyed once, their launches synchronized.
    unsafe {
        ok(sys::cuGraphExecDestroy(exec), "cuGraphExecDestroy");
        ok(sys::cuGraphDestroy(graph), "cuGraphDestroy");
    }
    free(ctx[0], src);
    free(ctx[1], dst);
    destroy(a, written);
    // SAFETY: a live stream, destroyed once.
    ok(unsafe { sys::cuStreamDestroy_v2(b) }, "cuStreamDestroy");
}

/// The most devices the simulator allows: every device's address range stays clear of the host's
/// memory, so small host buffers copy to and from each device: 64 bytes from the heap (the child
/// runs with `MALLOC_ARENA_MAX=1`, so that glibc's `malloc` serves every thread from the heap
/// after the executable, as it serves a program's main thread) and 64 bytes of a static of the
/// executable's image.
#[test]
fn sixty_four_devices_take_no_host_address() {
    if !on_simulator("sixty_four_devices_take_no_host_address") {
        return;
    }
    in_child(
        "child_sixty_four_devices",
        &[("CUDA_SIM_DEVICES", "64"), ("MALLOC_ARENA_MAX", "1")],
    );
}

/// 64 bytes in the executable's image (a static), beside its heap.
static IMAGE_BYTES: std::sync::Mutex<[u8; 64]> = std::sync::Mutex::new([0; 64]);

/// Copies `host` (64 bytes) to `p` and back into `back` (64 bytes), returning the results.
fn round_trip(p: sys::CUdeviceptr, host: *const u8, back: *mut u8) -> (CUresult, CUresult) {
    // SAFETY: `host` holds 64 bytes (caller); `p` is a live allocation of 64 bytes.
    let to = unsafe { sys::cuMemcpyHtoD_v2(p, host.cast(), 64) };
    // SAFETY: `back` has room for 64 bytes (caller); `p` is a live allocation of as many.
    let from = unsafe { sys::cuMemcpyDtoH_v2(back.cast(), p, 64) };
    (to, from)
}

#[test]
#[ignore = "run by sixty_four_devices_take_no_host_address, with CUDA_SIM_DEVICES=64"]
fn child_sixty_four_devices() {
    assert_eq!(device_count().unwrap(), 64);
    let ctx = contexts(64);
    let mut pointers = Vec::new();
    for (d, &c) in ctx.iter().enumerate() {
        make_current(c);
        let mut p = 0;
        // SAFETY: a live out-pointer, a current context.
        ok(unsafe { sys::cuMemAlloc_v2(&mut p, 64) }, "cuMemAlloc");
        // From the heap: a small allocation, as a 64-byte malloc gets it.
        let host: Vec<u8> = (0..64).map(|i| (i as u8) ^ (d as u8)).collect();
        let mut back = vec![0u8; 64];
        let results = round_trip(p, host.as_ptr(), back.as_mut_ptr());
        assert_eq!(
            results,
            (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS),
            "device {d}: copies from and to heap buffers at {:p} and {:p}",
            host.as_ptr(),
            back.as_ptr()
        );
        assert_eq!(back, host, "device {d}, through heap buffers");
        // From and to the executable's image.
        let mut image = IMAGE_BYTES.lock().unwrap();
        image.fill(d as u8);
        let expected = *image;
        let mut out = [0u8; 64];
        let results = round_trip(p, image.as_ptr(), out.as_mut_ptr());
        assert_eq!(
            results,
            (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS),
            "device {d}: a copy from a static at {:p}",
            image.as_ptr()
        );
        image.fill(0);
        let results = round_trip(p, expected.as_ptr(), image.as_mut_ptr());
        assert_eq!(
            results,
            (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS),
            "device {d}: a copy to a static at {:p}",
            image.as_ptr()
        );
        assert_eq!(
            (*image, out),
            (expected, expected),
            "device {d}, through a static"
        );
        drop(image);
        let mut device = -1i32;
        // SAFETY: a live out-pointer of the attribute's type; `p` is a live allocation.
        ok(
            unsafe {
                sys::cuPointerGetAttribute(
                    (&raw mut device).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    p,
                )
            },
            "cuPointerGetAttribute",
        );
        assert_eq!(
            device, d as i32,
            "the device of an allocation of device {d}"
        );
        pointers.push(p);
    }
    for (&c, p) in ctx.iter().zip(pointers) {
        free(c, p);
    }
}
