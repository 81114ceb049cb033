//! The producer side: `__dlpack__` and `__dlpack_device__` for a frozen pyclass that derives
//! `DlpackExport`.

use pyo3::PyClass;
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::types::PyCapsule;

use crate::abi::ffi::{self, DLPackVersion};
use crate::export::{DlpackExport, ExportRequest, export_with};
use crate::tensor::device::Device;

use super::*;

/// Builds the [`ExportRequest`] of a `__dlpack__` call from its Python arguments.
pub fn export_request(
    stream: Option<i64>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> ExportRequest {
    let mut request = ExportRequest::new().stream(stream).copy(copy);
    if let Some((major, minor)) = max_version {
        request = request.max_version(DLPackVersion { major, minor });
    }
    if let Some((device_type, device_id)) = dl_device {
        request = request.dl_device(Device::from_raw(ffi::DLDevice {
            device_type,
            device_id,
        }));
    }
    request
}

/// `__dlpack__` of a frozen pyclass that is a [`DlpackExport`]: a shared, read-only export
/// that keeps the Python object alive until the consumer calls the deleter.
///
/// Arguments are those of the array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html):
/// `stream` as its `stream` parameter lists per device; `max_version` `None` gives a legacy
/// `"dltensor"` capsule, major >= 1 a `"dltensor_versioned"` capsule at version 1.3;
/// `dl_device` the device wanted; `copy`. The array API makes every one keyword-only: declare
/// the method with `#[pyo3(signature = (*, stream=None, max_version=None, dl_device=None,
/// copy=None))]`, as the module docs do, so that a positional argument raises `TypeError` as it
/// does for NumPy's and PyTorch's `__dlpack__`.
///
/// # Errors
///
/// As tabulated in the module docs: `ValueError` for an illegal `stream`, `BufferError` for
/// everything the producer cannot serve (a legacy capsule of this read-only export included).
pub fn dlpack<'py, T>(
    slf: &Bound<'py, T>,
    stream: Option<i64>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyCapsule>>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let _attached = crate::abi::gil::Attached::enter(slf.py());
    let request = export_request(stream, max_version, dl_device, copy);
    to_capsule(slf.py(), export_object(slf, &request)?)
}

/// The export of the pyclass object `obj` that `request` asks for: shared and read-only, with
/// `obj` kept alive (a new reference, in a [`PyOwner`]) until the consumer calls the deleter.
/// Builds no `PyErr` and drops no `Py<T>` (its callers include code that runs without pyo3's
/// attach bookkeeping).
///
/// # Errors
///
/// The [`ExportError`](crate::ExportError) of [`export_with`]; `obj`'s reference is released.
pub(super) fn export_object<T>(
    obj: &Bound<'_, T>,
    request: &ExportRequest,
) -> Result<crate::ManagedTensor, crate::ExportError>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    export_with(PyOwner(Some(obj.clone().unbind())), PyOwner::parts, request)
}

/// `__dlpack_device__`: `(device_type, device_id)` in DLPack numbering (`dlpack.h`, `DLDevice`).
pub fn dlpack_device<T: DlpackExport + ?Sized>(tensor: &T) -> (i32, i32) {
    let device = tensor.dlpack_device().to_raw();
    (device.device_type, device.device_id)
}

/// Keeps a Python object alive inside an export; releases it with the GIL, or leaks it once
/// the interpreter is finalizing (deleters may run on any thread, even after shutdown: the
/// [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html),
/// "Implementation").
pub(super) struct PyOwner<T>(pub(super) Option<Py<T>>);

impl<T: PyClass<Frozen = True> + DlpackExport + Sync> PyOwner<T> {
    pub(super) fn parts(&mut self) -> crate::export::ExportParts<'_> {
        match &self.0 {
            Some(obj) => obj.get().export_parts(),
            // Unreachable: the object is only taken in `Drop`.
            None => unreachable_parts(),
        }
    }
}

#[cold]
fn unreachable_parts() -> ! {
    unreachable!("PyOwner is emptied only when dropped")
}

impl<T> Drop for PyOwner<T> {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            // The common case: a consumer (NumPy freeing its array, say) calls the deleter on a
            // thread that holds the GIL, but outside any pyo3 frame, where `try_attach` would
            // take the `PyGILState_Ensure` path. Holding the GIL is all `Py_DecRef` needs.
            // Where the build cannot tell (`abi::gil`'s marks, outside this crate's entry
            // points), attaching below.
            if crate::abi::gil::holds_gil() {
                // SAFETY: this thread holds the GIL (checked above); the reference is ours and
                // released exactly once.
                unsafe { pyffi::Py_DecRef(obj.into_ptr()) };
                return;
            }
            // A deleter run on another thread while the interpreter finalizes (or after):
            // attaching would end or hang the thread, so the reference is left to the
            // interpreter's end, as NumPy and nanobind leave theirs.
            if crate::abi::gil::is_finalizing() {
                core::mem::forget(obj);
                return;
            }
            // Attach with the C API alone (pyo3's `try_attach` adds its own bookkeeping, a
            // good part of a deleter's cost where it is called on every exchange, as on abi3
            // builds on CPython 3.11): waits for the GIL if another thread holds it.
            // SAFETY: the interpreter is initialized and not finalizing (checked above, best
            // effort as pyo3's own check); `PyGILState_Ensure` attaches this thread (creating
            // its thread state if it has none) and `PyGILState_Release` undoes exactly that;
            // the reference is ours and released once, attached.
            unsafe {
                let state = pyffi::PyGILState_Ensure();
                pyffi::Py_DecRef(obj.into_ptr());
                pyffi::PyGILState_Release(state);
            }
        }
    }
}
