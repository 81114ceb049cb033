//! The reaper: a thread that frees what must wait for the device (an imported tensor after the
//! consumer's stream, device memory after the device), and what a failed wait means for it.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, result, sys};

use super::event::{PooledEvent, ReadyEvents};
use super::{CudaError, CurrentContext, HostWait, bind, check_not_capturing, init};

/// Work for the reaper thread: frees that must wait for the device.
pub(super) enum Job {
    /// Drop `value` (an imported tensor, a copy's source) once `event` (recorded on the
    /// consumer's stream: a CUDA event, or a HIP event for a ROCm tensor) has completed, and
    /// the events `after` (what the tensor was ready after), with `owner` bound: the context of
    /// the value's CUDA device memory, whose drop may free it there (cudarc's `CudaSlice` frees
    /// in the current context unless it tracks events).
    Release {
        event: ReadyEvents,
        after: ReadyEvents,
        value: Box<dyn Send>,
        owner: Option<Arc<CudaContext>>,
    },
    /// Free device memory of `ctx` once the device has finished all work submitted so far.
    Free {
        ctx: Arc<CudaContext>,
        ptr: sys::CUdeviceptr,
    },
    /// Free device memory of HIP device `device` (from `hipMalloc`) with `hipFree`, which waits
    /// for the device's work submitted so far (its implicit `hipDeviceSynchronize()`,
    /// `hip_runtime_api.h`), with `device` current.
    #[cfg(feature = "hip")]
    FreeHip { device: i32, ptr: u64 },
}

/// What a wait that failed means for the memory waited on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterFailedWait {
    /// The context is broken for good (a sticky error, or the driver shutting down): nothing
    /// runs in it any more, so the memory may be freed.
    Free,
    /// A stream capture forbids the wait now: try again later.
    Retry,
    /// Anything else: the memory may still be in use; leaking it is the safe choice.
    Leak,
}

pub(crate) fn after_failed_wait(err: &CudaError) -> AfterFailedWait {
    use sys::CUresult as R;
    let CudaError::Driver { code, .. } = err else {
        return AfterFailedWait::Leak;
    };
    match code {
        R::CUDA_ERROR_ILLEGAL_ADDRESS
        | R::CUDA_ERROR_LAUNCH_FAILED
        | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | R::CUDA_ERROR_MISALIGNED_ADDRESS
        | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | R::CUDA_ERROR_INVALID_PC
        | R::CUDA_ERROR_HARDWARE_STACK_ERROR
        | R::CUDA_ERROR_ECC_UNCORRECTABLE
        | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
        | R::CUDA_ERROR_DEINITIALIZED => AfterFailedWait::Free,
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        | R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => AfterFailedWait::Retry,
        _ => AfterFailedWait::Leak,
    }
}

impl Job {
    /// Waits, then frees. Returns the job when a stream capture forbids the wait now. A wait
    /// that fails otherwise leaves the memory alone (leaked, and said on stderr) unless the
    /// context is broken for good: freeing memory that may still be read is worse than a leak.
    fn run(self) -> Option<Job> {
        #[cfg(feature = "hip")]
        if let Job::FreeHip { device, ptr } = self {
            return free_hip_now(device, ptr).then_some(self);
        }
        // A job of ROCm work alone (HIP events, no CUDA context) never calls the CUDA driver.
        let cuda = match &self {
            Job::Release {
                event,
                after,
                owner,
                ..
            } => event.has_cuda() || after.has_cuda() || owner.is_some(),
            Job::Free { .. } => true,
            #[cfg(feature = "hip")]
            Job::FreeHip { .. } => false,
        };
        let _current = cuda.then(CurrentContext::save);
        if cuda {
            relax_cuda_capture_mode();
        }
        #[cfg(feature = "hip")]
        if let Job::Release { event, after, .. } = &self {
            if event.has_hip() || after.has_hip() {
                relax_hip_capture_mode();
            }
        }
        let waited = match &self {
            Job::Release { event, after, .. } => {
                event.synchronize().and_then(|()| after.synchronize())
            }
            // The deleter carries no stream (`dlpack.h`, `DLManagedTensorVersioned::deleter`):
            // wait for every stream of the context, then free.
            Job::Free { ctx, .. } => bind(ctx.cu_ctx()).and_then(|()| HostWait::Context.run()),
            // Freed at the top.
            #[cfg(feature = "hip")]
            Job::FreeHip { .. } => Ok(()),
        };
        let verdict = match &waited {
            Ok(()) => AfterFailedWait::Free,
            Err(err) => after_failed_wait(err),
        };
        match (verdict, self) {
            (AfterFailedWait::Retry, job) => return Some(job),
            (
                AfterFailedWait::Free,
                Job::Release {
                    event,
                    value,
                    owner,
                    ..
                },
            ) => {
                drop_in(owner.as_deref(), value);
                drop(event);
            }
            (AfterFailedWait::Free, Job::Free { ptr, .. }) => {
                // SAFETY: `ptr` came from `cuMemAlloc` in the bound context and is freed once,
                // here, after every access enqueued before the free was asked has finished.
                let _ = unsafe { result::free_sync(ptr) };
            }
            (AfterFailedWait::Leak, Job::Release { value, .. }) => {
                leak("a tensor whose release could not wait for the consumer's stream");
                core::mem::forget(value);
            }
            (AfterFailedWait::Leak, Job::Free { .. }) => {
                leak("device memory of a copy that could not wait for the device");
            }
            // Freed at the top.
            #[cfg(feature = "hip")]
            (_, Job::FreeHip { .. }) => {}
        }
        None
    }
}

/// Frees `ptr`, device memory of HIP device `device` from `hipMalloc`, on this thread (the
/// reaper's, whose HIP capture mode is made relaxed first: another thread's global-mode
/// capture must not forbid the free). Returns whether to try again later: `hipFree` refused
/// with a stream-capture error. Any other failure leaves the memory alone (leaked, and said on
/// stderr): it may still be read.
#[cfg(feature = "hip")]
fn free_hip_now(device: i32, ptr: u64) -> bool {
    use crate::engine::hip::{self, HipError};
    relax_hip_capture_mode();
    match hip::free_device_memory(device, ptr) {
        Ok(()) => false,
        Err(HipError::Driver { code, .. }) if hip::is_capture_error(code) => true,
        Err(_) => {
            leak("device memory of a ROCm copy that hipFree refused");
            false
        }
    }
}

/// Frees `ptr`, device memory of HIP device `device` from `hipMalloc`, on the reaper thread:
/// the caller does not wait for the device (`hipFree` does, there). Without a reaper thread
/// the free runs here.
#[cfg(feature = "hip")]
pub(crate) fn free_hip_later(device: i32, ptr: u64) {
    let _ = reap(Job::FreeHip { device, ptr });
}

/// Drops `value` with `owner`, the context of its device memory, bound (when it can be: a
/// context that cannot be bound is broken, and the drop's own calls fail there alike). The
/// caller restores the thread's current context.
pub(crate) fn drop_in<V>(owner: Option<&CudaContext>, value: V) {
    if let Some(owner) = owner {
        let _ = bind(owner.cu_ctx());
    }
    drop(value);
}

pub(crate) fn leak(what: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "dlpack-runtime: leaked {what}");
}

fn reaper() -> Option<&'static Mutex<Sender<Job>>> {
    static REAPER: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let requeue = tx.clone();
            std::thread::Builder::new()
                .name("dlpack-release".into())
                .spawn(move || {
                    for job in rx {
                        // A panic in one job must not end the thread: the jobs queued behind
                        // it would be dropped without their waits.
                        let retry =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run()))
                                .unwrap_or(None);
                        if let Some(job) = retry {
                            // A capture forbids the wait now: behind the other jobs, later.
                            std::thread::sleep(std::time::Duration::from_millis(10));
                            if let Err(returned) = requeue.send(job) {
                                let _ = returned.0.run();
                            }
                        }
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Hands `job` to the reaper thread, or runs it here (blocking) if the thread is gone.
pub(super) fn reap(job: Job) -> Result<(), CudaError> {
    let mut job = match reaper().and_then(|r| r.lock().ok()) {
        Some(sender) => match sender.send(job) {
            Ok(()) => return Ok(()),
            Err(returned) => returned.0,
        },
        None => job,
    };
    while let Some(pending) = job.run() {
        std::thread::sleep(std::time::Duration::from_millis(10));
        job = pending;
    }
    Err(CudaError::ReaperGone)
}

/// Stream-ordered release: drops `value` (a tensor) only after `stream`, a raw stream handle of
/// `ctx` valid for the duration of the call, has completed the work enqueued on it so far. An
/// event is recorded on `stream` now; the reaper thread waits for it, then drops `value` with
/// `owner` bound, the context of the value's device memory (which may be another device's than
/// `stream`'s: the source of a copy between devices).
///
/// # Errors
///
/// [`CudaError::Capturing`] when `stream` is being captured into a CUDA graph: `value` is
/// leaked (said on stderr), since the captured work reads it whenever the graph is launched.
/// [`CudaError`] when the event cannot be recorded: `value` is then dropped after a host
/// synchronization of `stream` (leaked, and said on stderr, if that fails too while the
/// context still runs: it may still be read).
pub(crate) fn release_after_raw(
    value: Box<dyn Send>,
    after: ReadyEvents,
    ctx: &CudaContext,
    stream: sys::CUstream,
    owner: Option<Arc<CudaContext>>,
) -> Result<(), CudaError> {
    let _current = CurrentContext::save();
    let recorded = init()
        .and_then(|()| bind(ctx.cu_ctx()))
        .and_then(|()| {
            check_not_capturing(
                stream,
                "a stream-ordered release (the graph reads the tensor at every launch, so it is leaked instead)",
                "release tensors that a graph reads after the graph's last launch, on a stream that is not being captured",
            )
        })
        .and_then(|()| PooledEvent::take(ctx))
        .and_then(|event| event.record_on(stream).map(|()| event));
    match recorded {
        Ok(event) => reap(Job::Release {
            event: ReadyEvents::of_cuda(vec![Arc::new(event)]),
            after,
            value,
            owner,
        }),
        Err(err @ (CudaError::Capturing { .. } | CudaError::LegacyStreamUnderCapture)) => {
            // The captured work reads the tensor whenever the graph is launched: only a leak is
            // safe (and waiting on the stream would invalidate the capture).
            leak("a tensor released after a stream that is being captured into a CUDA graph");
            core::mem::forget(value);
            Err(err)
        }
        Err(err) => {
            // `stream` is a stream of the bound context, valid for this call.
            let waited = bind(ctx.cu_ctx())
                .and_then(|()| HostWait::Stream(stream).run())
                .and_then(|()| after.synchronize());
            match waited.as_ref().map_err(after_failed_wait) {
                Ok(()) | Err(AfterFailedWait::Free) => drop_in(owner.as_deref(), value),
                Err(_) => {
                    leak("a tensor whose release could not wait for the consumer's stream");
                    core::mem::forget(value);
                }
            }
            Err(err)
        }
    }
}

/// Makes the reaper thread's CUDA stream-capture mode relaxed, once (where a driver is
/// loaded): another thread's global-mode capture must not forbid (nor be invalidated by) its
/// waits.
fn relax_cuda_capture_mode() {
    use std::cell::Cell;
    thread_local!(static RELAXED: Cell<bool> = const { Cell::new(false) });
    if !RELAXED.get() && init().is_ok() {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer; affects this thread only.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RELAXED.set(true);
    }
}

/// Makes the reaper thread's HIP stream-capture mode relaxed, once: another thread's
/// global-mode capture must not forbid (nor be invalidated by) its waits.
#[cfg(feature = "hip")]
fn relax_hip_capture_mode() {
    use std::cell::Cell;
    thread_local!(static RELAXED: Cell<bool> = const { Cell::new(false) });
    if !RELAXED.get() {
        RELAXED.set(crate::engine::hip::relax_capture_mode().is_ok());
    }
}

/// Stream-ordered release of a ROCm tensor: drops `value` only after the HIP stream `stream`
/// (valid for the call, of HIP device `device`; NULL its default stream) has completed the work
/// enqueued on it so far, and after the HIP events `after`. A HIP event is recorded on
/// `stream` now, after its capture status is asked (`hipStreamIsCapturing`, never a wait on a
/// capturing stream); the reaper thread waits for it and `after` (`hipEventSynchronize`, off
/// the GIL), then drops `value`. The thread's current device is left as it was.
///
/// # Errors
///
/// [`HipError::Capturing`] (or [`HipError::DefaultStreamUnderCapture`]) when `stream` is being
/// captured into a HIP graph: `value` is leaked (said on stderr), since the captured work
/// reads it whenever the graph is launched. [`HipError::NoDriver`] without a HIP runtime:
/// `value` is dropped at once (no stream runs). [`HipError`] when the event cannot be
/// recorded: `value` is then dropped after a host synchronization of `stream` and `after`
/// (leaked, and said on stderr, if that fails too). [`HipError::ReaperGone`] when the reaper
/// thread has stopped: `value` was dropped after host waits.
#[cfg(feature = "hip")]
pub(crate) fn release_after_hip(
    value: Box<dyn Send>,
    after: ReadyEvents,
    device: i32,
    stream: crate::engine::hip::hipStream_t,
) -> Result<(), crate::engine::hip::HipError> {
    use crate::engine::hip::{self, HipError, HipEvent};
    let recorded = hip::CurrentDevice::save().and_then(|current| {
        current.set(device)?;
        hip::check_not_capturing(
            stream,
            "a stream-ordered release (the graph reads the tensor at every launch, so it is leaked instead)",
            "release tensors that a graph reads after the graph's last launch, on a stream that is not being captured",
        )?;
        HipEvent::recorded(stream)
    });
    match recorded {
        Ok(event) => reap(Job::Release {
            event: ReadyEvents::of_hip(vec![event]),
            after,
            value,
            owner: None,
        })
        .map_err(|_| HipError::ReaperGone),
        Err(HipError::NoDriver) => {
            // No HIP runtime: no stream runs, so nothing can still read the tensor.
            drop(value);
            Err(HipError::NoDriver)
        }
        Err(err @ (HipError::Capturing { .. } | HipError::DefaultStreamUnderCapture)) => {
            leak("a tensor released after a stream that is being captured into a HIP graph");
            core::mem::forget(value);
            Err(err)
        }
        Err(err) => {
            let waited =
                hip::synchronize_streams(device, &[stream]).is_ok() && after.synchronize().is_ok();
            if waited {
                drop(value);
            } else {
                leak("a tensor whose release could not wait for the consumer's stream");
                core::mem::forget(value);
            }
            Err(err)
        }
    }
}
