//! Host waits: every place where this crate blocks the host on the device goes through here:
//! the synchronizations ([`HostWait`]: `cuStreamSynchronize`, `cuEventSynchronize`,
//! `cuCtxSynchronize`) and copies to pageable host memory, which the driver completes before it
//! returns ([`detached`]).
//!
//! With the `python` feature, a wait on a thread that holds the GIL releases it for the
//! duration of the wait (pyo3's `Python::detach`), so that other Python threads run meanwhile:
//! one of them may be the one that lets the awaited work finish, and a wait that kept the GIL
//! would then never end. Only the driver calls run detached; nothing inside needs the GIL, and
//! no lock of this crate is held across them. Whether the thread holds the GIL is proven on
//! every build (`abi::gil`: `PyGILState_Check` on the full API, `PyThreadState_GetDict` on the
//! limited API from CPython 3.12, `PyGILState_Check` looked up at run time on 3.11, the entry
//! points' tokens where neither can be had).

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

impl HostWait {
    /// Blocks the host until the wait is over, releasing the GIL meanwhile where this thread
    /// holds it (module docs).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from the driver call, naming it.
    pub(crate) fn run(self) -> Result<(), CudaError> {
        // SAFETY: the driver call touches no Python object.
        unsafe { detached(move || self.now()) }
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

/// Runs `f`, blocking driver work, on this thread, with the GIL released meanwhile where this
/// thread holds it (module docs); as it is otherwise.
///
/// # Safety
///
/// `f` touches no Python object and calls nothing that does: it runs while this thread does
/// not hold the GIL. (pyo3's `detach` asks for a `Send` closure to keep Python references out;
/// `f` is not `Send` when it captures raw pointers, which is why this function is `unsafe`.)
pub(crate) unsafe fn detached<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "python")]
    if crate::abi::gil::holds_gil() {
        /// `f` or its result crossing pyo3's `detach`, which runs its closure on this thread.
        struct OnThisThread<T>(T);
        // SAFETY: the value never leaves the thread that made it (`detach` runs the closure
        // synchronously, on the calling thread); `Send` only lets it cross the bound that keeps
        // Python references out of `detach`, which the caller's contract covers.
        unsafe impl<T> Send for OnThisThread<T> {}
        // SAFETY: this thread holds the GIL (`holds_gil`), so it is attached to the
        // interpreter; the token is used only to detach, and not kept.
        let py = unsafe { pyo3::Python::assume_attached() };
        let f = OnThisThread(f);
        return py
            .detach(move || {
                let f = f;
                // Code inside does not count this thread attached (`abi::gil`).
                let _detached = crate::abi::gil::Detached::enter();
                OnThisThread((f.0)())
            })
            .0;
    }
    f()
}

/// Waits for `stream` (valid for the call, of the current context): [`HostWait::Stream`].
///
/// # Errors
///
/// [`CudaError::Driver`] from `cuStreamSynchronize`.
pub(crate) fn synchronize(stream: sys::CUstream) -> Result<(), CudaError> {
    HostWait::Stream(stream).run()
}
