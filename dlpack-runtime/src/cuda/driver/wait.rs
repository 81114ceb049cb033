//! Host waits: every place where this crate blocks the host on the device
//! (`cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`) goes through [`HostWait`].
//!
//! With the `python` feature, a wait on a thread that holds the GIL releases it for the
//! duration of the wait (pyo3's `Python::detach`), so that other Python threads run meanwhile:
//! one of them may be the one that lets the awaited work finish, and a wait that kept the GIL
//! would then never end. Only the driver call runs detached; nothing inside it needs the GIL,
//! and no lock of this crate is held across it. The limited Python API (`abi3`) has no way to
//! ask whether the thread holds the GIL (`PyGILState_Check`): there the wait keeps it.

use cudarc::driver::sys;

use super::{CudaError, driver_error};

/// One blocking wait of the host, on handles valid for the call, with the context they belong
/// to current on this thread (the wait runs on this thread, detached or not).
#[derive(Debug, Clone, Copy)]
pub(crate) enum HostWait {
    /// `cuStreamSynchronize`: the stream has finished its work.
    Stream(sys::CUstream),
    /// `cuEventSynchronize`: the event's recorded work has finished.
    Event(sys::CUevent),
    /// `cuCtxSynchronize`: every stream of the current context has finished.
    Context,
}

// SAFETY: plain driver handles, usable from any thread; the wait is run on the thread that made
// it, and `Send` only lets it cross pyo3's `detach`, which keeps the thread.
unsafe impl Send for HostWait {}

impl HostWait {
    /// Blocks the host until the wait is over, releasing the GIL meanwhile where this thread
    /// holds it (module docs).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from the driver call, naming it.
    pub(crate) fn run(self) -> Result<(), CudaError> {
        #[cfg(all(feature = "python", not(any(Py_LIMITED_API, PyPy, GraalPy))))]
        if holds_gil() {
            if let Some(result) = pyo3::Python::try_attach(|py| py.detach(move || self.now())) {
                return result;
            }
        }
        self.now()
    }

    /// The driver call itself, on this thread, as it is.
    fn now(self) -> Result<(), CudaError> {
        // SAFETY: handles valid for the call, of the current context (the type's contract).
        let (result, call) = unsafe {
            match self {
                Self::Stream(stream) => (sys::cuStreamSynchronize(stream), "cuStreamSynchronize"),
                Self::Event(event) => (sys::cuEventSynchronize(event), "cuEventSynchronize"),
                Self::Context => (sys::cuCtxSynchronize(), "cuCtxSynchronize"),
            }
        };
        result.result().map_err(driver_error(call))
    }
}

/// Whether this thread holds the GIL of an initialized interpreter (`PyGILState_Check`).
#[cfg(all(feature = "python", not(any(Py_LIMITED_API, PyPy, GraalPy))))]
fn holds_gil() -> bool {
    // SAFETY: `Py_IsInitialized` may be called at any time; `PyGILState_Check` once the
    // interpreter is initialized, from any thread.
    unsafe { pyo3::ffi::Py_IsInitialized() != 0 && pyo3::ffi::PyGILState_Check() != 0 }
}

/// Waits for `stream` (valid for the call, of the current context): [`HostWait::Stream`].
///
/// # Errors
///
/// [`CudaError::Driver`] from `cuStreamSynchronize`.
pub(crate) fn synchronize(stream: sys::CUstream) -> Result<(), CudaError> {
    HostWait::Stream(stream).run()
}
