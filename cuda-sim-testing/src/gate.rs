//! [`Gate`]: pending work on a stream, as a fact the test controls.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::{CudaStream, DriverError, sys};

type Shared = (Mutex<bool>, Condvar);

/// Holds a stream: everything enqueued on it after [`Gate::hold`] waits until
/// [`Gate::release`] (or the gate's drop).
///
/// The gate is a host function enqueued with `cuLaunchHostFunc` that blocks until the test
/// releases it. The driver runs host functions in stream order, so the work behind it is
/// pending for as long as the test wants, on a GPU and on the CUDA simulator alike: a test
/// that asserts what happens while a producer's work is pending does not depend on timing.
///
/// What blocks while a gate is held: any host call that waits for the held stream
/// (`CudaStream::synchronize`, `cuCtxSynchronize`, cudarc's `CudaContext::new_stream` when it
/// is the context's first extra stream: it synchronizes the context, a copy into pageable host
/// memory enqueued on the held stream, `cuEventSynchronize` on an event recorded behind the
/// gate), and, for a blocking stream, the legacy default stream's work and synchronous copies.
/// Create every stream before holding a gate, and release it before such calls.
#[derive(Debug)]
#[must_use = "the gate is released when dropped"]
pub struct Gate(Arc<Shared>);

unsafe extern "C" fn wait_for_gate(user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Arc::into_raw` of `Gate::try_hold_raw`; this call takes that
    // reference back, exactly once (the driver calls a host function once).
    let gate = unsafe { Arc::from_raw(user_data.cast::<Shared>()) };
    let (open, cv) = &*gate;
    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
    while !*open {
        open = cv.wait(open).unwrap_or_else(|e| e.into_inner());
    }
}

impl Gate {
    /// Enqueues a gate on `stream`; panics if the driver refuses (see [`Gate::try_hold`]).
    #[track_caller]
    pub fn hold(stream: &CudaStream) -> Self {
        Self::try_hold(stream).unwrap_or_else(|e| panic!("cuLaunchHostFunc refused a gate: {e}"))
    }

    /// Enqueues a gate on `stream`: the driver's error if `cuLaunchHostFunc` refuses (such as
    /// `CUDA_ERROR_STREAM_CAPTURE_*` on a stream being captured).
    pub fn try_hold(stream: &CudaStream) -> Result<Self, DriverError> {
        // SAFETY: a live stream of a live context (the `CudaStream` keeps both).
        unsafe { Self::try_hold_raw(stream.cu_stream()) }
    }

    /// [`Gate::hold`] for a raw stream handle, such as the legacy default stream
    /// (`CU_STREAM_LEGACY`, `0x1`, or NULL) or the per-thread one (`CU_STREAM_PER_THREAD`,
    /// `0x2`); panics if the driver refuses.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream handle, or a special handle with a current context.
    #[track_caller]
    pub unsafe fn hold_raw(stream: sys::CUstream) -> Self {
        // SAFETY: as the caller promises.
        unsafe { Self::try_hold_raw(stream) }
            .unwrap_or_else(|e| panic!("cuLaunchHostFunc refused a gate: {e}"))
    }

    /// [`Gate::try_hold`] for a raw stream handle.
    ///
    /// # Safety
    ///
    /// As [`Gate::hold_raw`].
    pub unsafe fn try_hold_raw(stream: sys::CUstream) -> Result<Self, DriverError> {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let user_data = Arc::into_raw(gate.clone()) as *mut c_void;
        // SAFETY: `wait_for_gate` matches `CUhostFn`; `user_data` is a leaked `Arc` that the
        // host function takes back; the stream is live (caller).
        let result = unsafe { sys::cuLaunchHostFunc(stream, Some(wait_for_gate), user_data) };
        if let Err(e) = result.result() {
            // SAFETY: the driver refused, so the host function never takes the reference.
            drop(unsafe { Arc::from_raw(user_data.cast::<Shared>()) });
            return Err(e);
        }
        Ok(Self(gate))
    }

    /// Lets the stream go on (idempotent).
    pub fn release(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}
