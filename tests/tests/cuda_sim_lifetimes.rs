//! Long suites on the CUDA simulator stay small (feature `cuda`): a thread's per-thread default
//! stream, and its worker thread, end with the thread; a stream destroyed with work pending
//! leaves no thread and no thread stack once that work has run; freed allocations are kept in
//! a compact form that still reports every use after free. One test in this binary, so that no
//! other test's threads come and go while it counts the process's threads and mappings. Needs
//! the simulator; the test command runs it with it.
#![cfg(feature = "cuda")]

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, sys};
use sys::CUresult;

const NEEDS_SIMULATOR: &str = "needs the CUDA simulator on the library path (scripts/cuda-sim.sh): a real driver has no checker";

/// `CU_STREAM_PER_THREAD`.
fn per_thread() -> sys::CUstream {
    std::ptr::without_provenance_mut(0x2)
}

/// Threads of this process (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// Memory mappings of this process (`/proc/self/maps`): a thread stack that is never released
/// stays there, after its thread has ended.
fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .count()
}

/// Waits until the process has at most `threads` threads (ended threads leave
/// `/proc/self/task` shortly after their last instruction), for at most ten seconds.
fn wait_for_threads(most: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = threads();
        if now <= most || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Host functions run by [`count_run`].
static RAN: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    RAN.fetch_add(1, Ordering::Relaxed);
}

/// Creates `count` streams, holds each with a gate and enqueues a counted host function behind
/// it, destroys them all while held (`cuStreamDestroy` returns at once), then releases the
/// gates and synchronizes the context: the destroyed streams' work has run.
fn destroy_busy_streams(ctx: &Arc<CudaContext>, count: usize) {
    let ran = RAN.load(Ordering::Relaxed);
    let streams: Vec<sys::CUstream> = (0..count)
        .map(|_| {
            let mut stream = std::ptr::null_mut();
            let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
            // SAFETY: a valid out-pointer; a context is current.
            unsafe { sys::cuStreamCreate(&mut stream, flags) }
                .result()
                .unwrap();
            stream
        })
        .collect();
    let gates: Vec<Gate> = streams
        .iter()
        .map(|&stream| {
            // SAFETY: a live stream, created above.
            let gate = unsafe { Gate::hold_raw(stream) };
            // SAFETY: a live stream; `count_run` matches `CUhostFn` and uses no data.
            unsafe { sys::cuLaunchHostFunc(stream, Some(count_run), std::ptr::null_mut()) }
                .result()
                .unwrap();
            gate
        })
        .collect();
    for stream in streams {
        // SAFETY: a live stream, destroyed once; its work is pending behind its gate.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
    }
    assert_eq!(
        RAN.load(Ordering::Relaxed),
        ran,
        "work behind the held gates ran"
    );
    for gate in &gates {
        gate.release();
    }
    ctx.synchronize().unwrap();
    assert_eq!(
        RAN.load(Ordering::Relaxed),
        ran + count,
        "the destroyed streams' work ran"
    );
}

/// Streams destroyed with work pending, by the thousand: their work runs, and their worker
/// threads end after it and release their stacks (a thread never joined nor detached keeps
/// its stack mapped after it ends, two mappings and megabytes of address space each).
fn busy_streams_leave_nothing_behind(ctx: &Arc<CudaContext>) {
    // A first round, so that what the process keeps for later threads (the C library's cache
    // of thread stacks, its allocator's arenas) is there before counting.
    let start = threads();
    destroy_busy_streams(ctx, 200);
    let threads_before = wait_for_threads(start);
    let mappings_before = mappings();
    for _ in 0..15 {
        destroy_busy_streams(ctx, 200);
    }
    let threads_after = wait_for_threads(threads_before);
    let mappings_after = mappings();
    assert!(
        threads_after <= threads_before,
        "threads: {threads_before} before 3,000 busy streams were destroyed, {threads_after} after their work ran"
    );
    assert!(
        mappings_after <= mappings_before + 64,
        "mappings: {mappings_before} before 3,000 busy streams were destroyed, {mappings_after} after their work ran"
    );
}

fn alloc(bytes: usize) -> sys::CUdeviceptr {
    let mut p = 0;
    // SAFETY: a valid out-pointer; a context is current.
    unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }
        .result()
        .unwrap();
    p
}

/// On a thread of its own: sets `bytes` bytes at `p` to `value` on the thread's per-thread
/// default stream, synchronizes it if `sync`, and ends.
fn on_a_short_thread(
    ctx: &Arc<CudaContext>,
    p: sys::CUdeviceptr,
    bytes: usize,
    value: u8,
    sync: bool,
) {
    let ctx = ctx.clone();
    std::thread::spawn(move || {
        ctx.bind_to_thread().unwrap();
        // SAFETY: `bytes` bytes of a live allocation; stream-ordered.
        unsafe { sys::cuMemsetD8Async(p, value, bytes, per_thread()) }
            .result()
            .unwrap();
        if sync {
            // SAFETY: the thread's per-thread default stream, with a current context.
            unsafe { sys::cuStreamSynchronize(per_thread()) }
                .result()
                .unwrap();
        }
    })
    .join()
    .unwrap();
}

#[test]
fn streams_end_with_their_thread_or_their_work_and_every_use_after_free_is_reported() {
    let ctx = CudaContext::new(0).expect(NEEDS_SIMULATOR);
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    ctx.bind_to_thread().unwrap();
    let p = alloc(64);
    ctx.synchronize().unwrap();

    // Fifty short threads, each with its per-thread default stream: none is left behind.
    let before = threads();
    for _ in 0..50 {
        on_a_short_thread(&ctx, p, 64, 1, true);
    }
    assert_eq!(threads(), before, "threads after 50 short threads");

    // A thread that ends with work pending on its per-thread stream: the work still runs, and
    // the context's synchronization waits for it.
    let gate = Gate::hold(&ctx.default_stream());
    let bytes = {
        // The per-thread stream is blocking: it waits for the held legacy stream.
        on_a_short_thread(&ctx, p, 32, 2, false);
        gate.release();
        ctx.synchronize().unwrap();
        let mut out = [0u8; 64];
        // SAFETY: 64 bytes each side; synchronous.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 64) }
            .result()
            .unwrap();
        out
    };
    assert_eq!(bytes[..32], [2; 32], "the ended thread's pending write ran");
    assert_eq!(bytes[32..], [1; 32]);
    checker.assert_clean("per-thread streams, synchronized before their thread ended");

    // Freed memory stays known through many frees of every kind.
    let stream = ctx.new_stream().unwrap();
    let first = alloc(256);
    // SAFETY: allocated above, freed once.
    unsafe { sys::cuMemFree_v2(first) }.result().unwrap();
    let mut middle = 0;
    for k in 0..20_000 {
        let p = if k % 3 == 0 {
            let mut p = 0;
            // SAFETY: a valid out-pointer; a live stream.
            unsafe { sys::cuMemAllocAsync(&mut p, 64 + k % 500, stream.cu_stream()) }
                .result()
                .unwrap();
            p
        } else {
            alloc(64 + k % 500)
        };
        if k == 10_000 {
            middle = p;
        }
        // SAFETY: allocated above, freed once (stream-ordered after its allocation, or after
        // the host's, which the stream's later work is ordered after).
        unsafe { sys::cuMemFreeAsync(p, stream.cu_stream()) }
            .result()
            .unwrap();
    }
    stream.synchronize().unwrap();
    checker.assert_clean("20,000 allocations and frees");
    for (p, freed_by) in [
        (first, "cuMemFree on the host"),
        (middle + 8, "cuMemFreeAsync on stream"),
    ] {
        // SAFETY: a stale pointer, which the simulator refuses and reports.
        let result = unsafe { sys::cuMemsetD8Async(p, 0, 8, stream.cu_stream()) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
        let report = checker.report();
        assert_eq!(checker.violations(), 1, "{report}");
        assert!(
            report.contains(&format!(
                "touches {p:#x}, in an allocation already freed by {freed_by}"
            )),
            "{report}"
        );
        checker.reset();
    }
    // SAFETY: allocated above, freed once, after the work on it completed.
    unsafe { sys::cuMemFree_v2(p) }.result().unwrap();

    busy_streams_leave_nothing_behind(&ctx);
    checker.assert_clean("streams destroyed with work pending");
}
