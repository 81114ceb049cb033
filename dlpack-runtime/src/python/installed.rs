//! What the definitions installed on a pyclass at run time share ([`add_dlpack_methods`]'s
//! methods, and the `__cuda_array_interface__` getter with feature `cuda`): the per-type
//! registry of the definitions CPython keeps pointers to, and the call wrapper of their bodies.
//!
//! [`add_dlpack_methods`]: super::add_dlpack_methods

use core::any::TypeId;
use core::marker::PhantomData;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use pyo3::PyClass;
use pyo3::exceptions::{PySystemError, PyTypeError};
use pyo3::ffi as pyffi;
use pyo3::prelude::*;

/// Definitions of type `D` that CPython keeps pointers to for the life of a type object: one
/// per Rust type `T`, made on first use, leaked, never freed nor written (a `static` per kind
/// of definition).
pub(super) struct PerType<D> {
    addresses: OnceLock<Mutex<HashMap<TypeId, usize>>>,
    /// The addresses are of `D`s (`fn() -> D`: the registry is `Sync` whatever `D` is).
    kind: PhantomData<fn() -> D>,
}

impl<D: 'static> PerType<D> {
    pub(super) const fn new() -> Self {
        Self {
            addresses: OnceLock::new(),
            kind: PhantomData,
        }
    }

    /// `T`'s definition, made by `make` the first time; `what` names the registry in the
    /// error of one that a panic poisoned.
    pub(super) fn get<T: 'static>(
        &'static self,
        what: &str,
        make: impl FnOnce() -> D,
    ) -> PyResult<&'static D> {
        let address = *self
            .addresses
            .get_or_init(Default::default)
            .lock()
            .map_err(|_| PySystemError::new_err(format!("{what} registry poisoned by a panic")))?
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::into_raw(Box::new(make())) as usize);
        // SAFETY: every address in this registry is of a `D` leaked by `Box::into_raw` above,
        // never freed nor written, so shared for the life of the process.
        Ok(unsafe { &*(address as *const D) })
    }
}

/// Runs the body of a method of `T` on its instance `slf`, with the GIL (the caller holds it),
/// turning an error into a raised exception and a panic into `SystemError`: methods return NULL
/// then, and never unwind.
///
/// # Safety
///
/// `slf` is NULL or a live object borrowed for the call (CPython calls a method with its
/// instance, which the method descriptor has checked to be a `T`; checked again here).
pub(super) unsafe fn method_call<T: PyClass>(
    slf: *mut pyffi::PyObject,
    f: impl for<'a, 'py> FnOnce(Python<'py>, Borrowed<'a, 'py, T>) -> PyResult<*mut pyffi::PyObject>,
) -> *mut pyffi::PyObject {
    // SAFETY: CPython calls methods and getters with the GIL held, for the whole call.
    let _attached = unsafe { crate::abi::gil::Attached::assume() };
    // `try_attach`: where pyo3 refuses to attach (a finalizing interpreter), `attach` would
    // panic, and a panic here cannot unwind.
    let called = Python::try_attach(|py| {
        let call = || {
            // SAFETY: NULL or a live, borrowed object (caller).
            let slf = unsafe { Borrowed::from_ptr_or_opt(py, slf) }.ok_or_else(|| {
                PyTypeError::new_err("a DLPack method called without its instance")
            })?;
            f(py, slf.cast::<T>().map_err(PyErr::from)?)
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
            Ok(Ok(result)) => result,
            Ok(Err(err)) => {
                err.restore(py);
                core::ptr::null_mut()
            }
            Err(_) => {
                PySystemError::new_err("panic in a DLPack method").restore(py);
                core::ptr::null_mut()
            }
        }
    });
    called.unwrap_or_else(|| {
        // SAFETY: CPython holds the GIL for its method calls.
        unsafe { super::raise_unattached(c"a DLPack method called while Python is finalizing") };
        core::ptr::null_mut()
    })
}
