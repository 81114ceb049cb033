//! A gate holds its stream until released, and a gate the test forgot to release (or could not
//! release, because the host waited for the held stream) opens by itself after its timeout and
//! fails the test, instead of hanging it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use cuda_sim_testing::Gate;
use cudarc::driver::{CudaContext, CudaStream, sys};

/// Whether `stream` has no pending work (`cuStreamQuery`).
fn idle(stream: &CudaStream) -> bool {
    // SAFETY: a live stream (the `CudaStream` keeps it and its context).
    let result = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    match result {
        sys::CUresult::CUDA_SUCCESS => true,
        sys::CUresult::CUDA_ERROR_NOT_READY => false,
        other => panic!("cuStreamQuery: {other:?}"),
    }
}

/// A stream of its own, with work enqueued behind a gate: a memset of `n` bytes.
fn held_memset(gate: impl FnOnce(&CudaStream) -> Gate) -> (std::sync::Arc<CudaStream>, Gate) {
    cuda_sim_testing::driver();
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut data = stream.alloc_zeros::<u8>(64).unwrap();
    let gate = gate(&stream);
    stream.memset_zeros(&mut data).unwrap();
    (stream, gate)
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_gate_holds_its_stream_until_released() {
    // The negative control of the timeout: released in time, nothing opened by itself.
    let (stream, gate) = held_memset(|s| Gate::hold(s).with_timeout(Some(Duration::from_secs(60))));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !idle(&stream),
        "the work behind the gate ran while it was held"
    );
    assert!(!gate.timed_out());
    gate.release();
    stream.synchronize().unwrap();
    assert!(idle(&stream));
    assert!(!gate.timed_out());
}

#[test]
fn a_host_wait_behind_a_held_gate_ends_at_the_timeout_and_fails_the_release() {
    let timeout = Duration::from_millis(300);
    let (stream, gate) = held_memset(|s| Gate::hold(s).with_timeout(Some(timeout)));
    let start = Instant::now();
    // The mistake the timeout is for: waiting on the host for a held stream.
    stream.synchronize().unwrap();
    assert!(
        start.elapsed() >= timeout / 2,
        "the wait ended before the gate opened"
    );
    assert!(gate.timed_out());
    let message = panic_message(catch_unwind(AssertUnwindSafe(|| gate.release())).unwrap_err());
    assert!(
        message.contains("opened by itself after 300ms"),
        "{message}"
    );
    assert!(message.contains("release the gate before"), "{message}");
    // Reported once: the drop after a failed release does not panic again.
    drop(gate);
}

#[test]
fn a_timed_out_gate_that_is_only_dropped_fails_too() {
    let (stream, gate) =
        held_memset(|s| Gate::hold(s).with_timeout(Some(Duration::from_millis(100))));
    stream.synchronize().unwrap();
    let message = panic_message(catch_unwind(AssertUnwindSafe(move || drop(gate))).unwrap_err());
    assert!(message.contains("opened by itself"), "{message}");
}

#[test]
fn a_shorter_timeout_set_while_held_takes_effect() {
    // Held with the default timeout (a minute), then given 100 ms: the host function, already
    // waiting, wakes to the new deadline.
    let (stream, gate) = held_memset(Gate::hold);
    std::thread::sleep(Duration::from_millis(50));
    let gate = gate.with_timeout(Some(Duration::from_millis(100)));
    let start = Instant::now();
    stream.synchronize().unwrap();
    assert!(start.elapsed() < Gate::DEFAULT_TIMEOUT / 2);
    assert!(gate.timed_out());
    let _ = catch_unwind(AssertUnwindSafe(|| gate.release())).unwrap_err();
}
