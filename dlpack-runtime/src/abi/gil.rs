//! Whether this thread holds the GIL (feature `python`): asked by the layers below the Python
//! glue that must not wait for the GIL (the borrow registry's lookup) or must release it (host
//! waits of the CUDA driver tier).

/// Whether this thread holds the GIL of an initialized interpreter (`PyGILState_Check`).
#[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
pub(crate) fn holds_gil() -> bool {
    // SAFETY: `Py_IsInitialized` may be called at any time; `PyGILState_Check` once the
    // interpreter is initialized, from any thread.
    unsafe { pyo3::ffi::Py_IsInitialized() != 0 && pyo3::ffi::PyGILState_Check() != 0 }
}

/// The limited API has no `PyGILState_Check`, so this thread is taken not to hold the GIL:
/// callers then do without (the borrow registry looks only where the Python consumer holds
/// the GIL; host waits keep it).
#[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
pub(crate) fn holds_gil() -> bool {
    false
}
