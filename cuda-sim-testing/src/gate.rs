//! [`Gate`]: pending work on a stream, as a fact the test controls.

use std::ffi::c_void;
use std::io::Write as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, DriverError, sys};

/// What the test and the host function share.
#[derive(Debug)]
struct State {
    /// Released, by the test or by the timeout.
    open: bool,
    /// Opened by the timeout, not by the test.
    timed_out: bool,
    /// The panic of a timed-out gate was raised (by [`Gate::release`] or the drop).
    reported: bool,
    /// How long after `held_at` the gate opens by itself; `None`: never.
    timeout: Option<Duration>,
    held_at: Instant,
}

type Shared = (Mutex<State>, Condvar);

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.0.lock().unwrap_or_else(|e| e.into_inner())
}

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
///
/// A test that breaks that rule would wait for ever; instead, a gate opens by itself after
/// [`Gate::DEFAULT_TIMEOUT`] (or the time given to [`Gate::with_timeout`]), says so on
/// standard error, and the test panics when it releases or drops the gate: a failure that
/// names the cause, not a hang.
#[derive(Debug)]
#[must_use = "the gate is released when dropped"]
pub struct Gate(Arc<Shared>);

unsafe extern "C" fn wait_for_gate(user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Arc::into_raw` of `Gate::try_hold_raw`; this call takes that
    // reference back, exactly once (the driver calls a host function once).
    let gate = unsafe { Arc::from_raw(user_data.cast::<Shared>()) };
    let mut state = lock(&gate);
    while !state.open {
        let Some(timeout) = state.timeout else {
            state = gate.1.wait(state).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let held = state.held_at.elapsed();
        if held >= timeout {
            state.open = true;
            state.timed_out = true;
            // Nothing may panic here (a host function is called from the driver): the write's
            // error is dropped.
            let _ = writeln!(
                std::io::stderr(),
                "cuda-sim-testing: a gate held for {timeout:?} opened by itself (most likely the \
                 host waited for the held stream: see the docs of Gate); the test fails when it \
                 releases or drops the gate"
            );
            break;
        }
        // `with_timeout` wakes this wait when it changes the timeout.
        state = gate
            .1
            .wait_timeout(state, timeout - held)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Gate {
    /// How long a gate stays held unless the test releases it or sets another time with
    /// [`Gate::with_timeout`]: 60 seconds, measured from the hold.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

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
        let gate = Arc::new((
            Mutex::new(State {
                open: false,
                timed_out: false,
                reported: false,
                timeout: Some(Self::DEFAULT_TIMEOUT),
                held_at: Instant::now(),
            }),
            Condvar::new(),
        ));
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

    /// The gate opens by itself `timeout` after it was held (`None`: never; the default is
    /// [`Gate::DEFAULT_TIMEOUT`]). A gate already held longer opens at once.
    pub fn with_timeout(self, timeout: Option<Duration>) -> Self {
        lock(&self.0).timeout = timeout;
        self.0.1.notify_all();
        self
    }

    /// Whether the gate opened by itself, its timeout passed before the test released it.
    pub fn timed_out(&self) -> bool {
        lock(&self.0).timed_out
    }

    /// Lets the stream go on (idempotent).
    ///
    /// # Panics
    ///
    /// If the gate had opened by itself ([`Gate::timed_out`]), once: the work behind it was
    /// no longer held, and the host waited for the held stream somewhere before.
    #[track_caller]
    pub fn release(&self) {
        if let Some(timeout) = self.open() {
            panic!("{}", timed_out_message(timeout));
        }
    }

    /// Opens the gate; the timeout to report if it had opened by itself and that was not
    /// reported yet.
    fn open(&self) -> Option<Duration> {
        let mut state = lock(&self.0);
        state.open = true;
        self.0.1.notify_all();
        if state.timed_out && !state.reported {
            state.reported = true;
            return Some(state.timeout.unwrap_or_default());
        }
        None
    }
}

fn timed_out_message(timeout: Duration) -> String {
    format!(
        "the gate opened by itself after {timeout:?}, before the test released it: most likely \
         the host waited for the held stream (a synchronize, a copy into pageable host memory, \
         cudarc's new_stream, the legacy default stream's work: see the docs of Gate); release \
         the gate before such calls, or give it more time with Gate::with_timeout"
    )
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(timeout) = self.open() {
            // A test that only drops its gate fails all the same; never while it unwinds.
            if !std::thread::panicking() {
                panic!("{}", timed_out_message(timeout));
            }
        }
    }
}
