//! Python glue (feature `python`): `__dlpack__`, `__dlpack_device__` and `from_dlpack` on pyo3.
//!
//! # Producer: give a `#[pyclass]` tensor the protocol
//!
//! A frozen pyclass that derives [`DlpackExport`] gets the two methods with one line each. The
//! export is shared and read-only: the Python object stays alive while any consumer holds the
//! tensor, and a frozen class cannot be mutated from Rust in the meantime.
//!
//! ```
//! use dlpack_runtime::{DlpackExport, python};
//! use pyo3::prelude::*;
//! use pyo3::types::PyCapsule;
//!
//! #[pyclass(frozen)]
//! #[derive(DlpackExport)]
//! struct Tensor {
//!     #[dlpack(data)]
//!     data: Vec<f32>,
//!     #[dlpack(shape)]
//!     shape: Vec<usize>,
//! }
//!
//! #[pymethods]
//! impl Tensor {
//!     #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
//!     fn __dlpack__<'py>(
//!         slf: &Bound<'py, Self>,
//!         stream: Option<i64>,
//!         max_version: Option<(u32, u32)>,
//!         dl_device: Option<(i32, i32)>,
//!         copy: Option<bool>,
//!     ) -> PyResult<Bound<'py, PyCapsule>> {
//!         python::dlpack(slf, stream, max_version, dl_device, copy)
//!     }
//!
//!     fn __dlpack_device__(&self) -> (i32, i32) {
//!         python::dlpack_device(self)
//!     }
//! }
//! ```
//!
//! To hand a Rust tensor to Python **by value** (writable, exported once), wrap it with
//! [`export_once`]: the result is a Python object with `__dlpack__` that `numpy.from_dlpack`
//! and friends accept.
//!
//! # Consumer
//!
//! [`from_dlpack`] builds any [`DlpackImport`] type from a Python object that has `__dlpack__`
//! (calling `__dlpack_device__` first and asking for `max_version=(1, 3)`, with the spec's
//! fallback on `TypeError`), or from a raw capsule.
//!
//! # Capsules (spec section 2.3)
//!
//! Capsules are named `"dltensor_versioned"` or `"dltensor"`. Their destructor calls the tensor's
//! deleter only while the capsule still has that name; a consumer that takes ownership renames it
//! to `"used_dltensor_versioned"` / `"used_dltensor"`. [`from_dlpack`] renames only once it has
//! taken ownership, and leaves the capsule untouched when it refuses it (a foreign major
//! version), so the producer frees it.
//!
//! # Threads and the GIL
//!
//! A tensor imported from Python (a NumPy array, say) is freed by its producer's deleter, which
//! takes the GIL. Dropping such an import on a thread other than the one holding the GIL blocks
//! until the GIL is released; drop it while attached, or from a thread that can wait.
//!
//! # Exceptions
//!
//! | error | Python exception |
//! |---|---|
//! | [`ExportError::Stream`] (illegal `stream` value) | `ValueError` |
//! | every other [`ExportError`] (`dl_device`, `copy=False`, read-only legacy, layout) | `BufferError` |
//! | [`ImportError`] (version, layout, dtype, constraints) | `BufferError` |
//! | a capsule that was already consumed | `ValueError` |
//! | a capsule of another kind | `TypeError` |
//! | an object without `__dlpack__` | `AttributeError` |
//! | wrong argument types (`stream` not an int, `max_version` not a pair) | `TypeError` (from pyo3) |

use core::ffi::{CStr, c_void};
use core::ptr::NonNull;
use std::sync::Mutex;

use pyo3::PyClass;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::types::{PyCapsule, PyDict};

use crate::device::Device;
use crate::error::{ExportError, ImportError};
use crate::export::{DlpackExport, ExportRequest, export_with};
use crate::ffi::{self, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion};
use crate::import::DlpackImport;
use crate::managed::{ManagedTensor, RawManagedTensor};

impl From<ExportError> for PyErr {
    fn from(err: ExportError) -> Self {
        match err {
            ExportError::Stream(_) => PyValueError::new_err(err.to_string()),
            _ => PyBufferError::new_err(err.to_string()),
        }
    }
}

impl From<ImportError> for PyErr {
    fn from(err: ImportError) -> Self {
        match err {
            ImportError::Export(export) => export.into(),
            _ => PyBufferError::new_err(err.to_string()),
        }
    }
}

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
/// Arguments are those of `__dlpack__` (spec section 2.1): `stream` as in the table of spec
/// section 2.4; `max_version` `None` gives a legacy `"dltensor"` capsule, major >= 1 a
/// `"dltensor_versioned"` capsule at version 1.3; `dl_device` the device wanted; `copy`.
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
    let py = slf.py();
    let request = export_request(stream, max_version, dl_device, copy);
    let owner = PyOwner(Some(slf.clone().unbind()));
    let managed = export_with(owner, PyOwner::parts, &request)?;
    to_capsule(py, managed)
}

/// `__dlpack_device__`: `(device_type, device_id)` in DLPack numbering (spec section 2.1).
pub fn dlpack_device<T: DlpackExport + ?Sized>(tensor: &T) -> (i32, i32) {
    let device = tensor.dlpack_device().to_raw();
    (device.device_type, device.device_id)
}

/// Keeps a Python object alive inside an export; releases it with the GIL, or leaks it once
/// the interpreter is finalizing (spec section 1.11: deleters may run on any thread, even after
/// shutdown).
struct PyOwner<T: PyClass>(Option<Py<T>>);

impl<T: PyClass<Frozen = True> + DlpackExport + Sync> PyOwner<T> {
    fn parts(&mut self) -> crate::export::ExportParts<'_> {
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

impl<T: PyClass> Drop for PyOwner<T> {
    fn drop(&mut self) {
        if let Some(obj) = self.0.take() {
            if Python::try_attach(move |_py| drop(obj)).is_none() {
                // The interpreter is gone or finalizing: releasing the reference is impossible
                // and unnecessary.
            }
        }
    }
}

/// Wraps a managed tensor in a capsule named by its kind, with the spec's destructor.
///
/// # Errors
///
/// The Python error of `PyCapsule_New` (memory); the tensor's deleter has then been called.
pub fn to_capsule(py: Python<'_>, managed: ManagedTensor) -> PyResult<Bound<'_, PyCapsule>> {
    let raw = managed.into_raw();
    let (pointer, name, destructor): (NonNull<c_void>, &'static CStr, pyffi::PyCapsule_Destructor) =
        match raw {
            RawManagedTensor::Versioned(p) => (
                p.cast(),
                ffi::DLTENSOR_VERSIONED_CAPSULE_NAME,
                versioned_capsule_destructor,
            ),
            RawManagedTensor::Legacy(p) => (
                p.cast(),
                ffi::DLTENSOR_CAPSULE_NAME,
                legacy_capsule_destructor,
            ),
        };
    // SAFETY: `pointer` is a live managed tensor whose ownership moves into the capsule; the
    // destructor frees it only under the unconsumed name and is callable from any thread with
    // the GIL (CPython capsule contract).
    let capsule =
        unsafe { PyCapsule::new_with_pointer_and_destructor(py, pointer, name, Some(destructor)) };
    if capsule.is_err() {
        // SAFETY: the capsule was not created, so ownership never left us; version checked at
        // construction.
        drop(unsafe { ManagedTensor::from_raw_unchecked(raw) });
    }
    capsule
}

/// Capsule destructor for `"dltensor_versioned"`: calls the deleter only if the capsule was
/// not consumed (spec section 2.3).
unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut pyffi::PyObject) {
    // SAFETY: CPython calls the destructor with the capsule, GIL held. `PyCapsule_IsValid` sets
    // no exception and is false for a renamed (consumed) capsule.
    unsafe {
        if pyffi::PyCapsule_IsValid(capsule, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr()) == 1 {
            let p =
                pyffi::PyCapsule_GetPointer(capsule, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr());
            let p = p.cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        }
    }
}

/// Capsule destructor for `"dltensor"`: calls the deleter only if the capsule was not
/// consumed (spec section 2.3).
unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut pyffi::PyObject) {
    // SAFETY: as for `versioned_capsule_destructor`, for the legacy name and struct.
    unsafe {
        if pyffi::PyCapsule_IsValid(capsule, ffi::DLTENSOR_CAPSULE_NAME.as_ptr()) == 1 {
            let p = pyffi::PyCapsule_GetPointer(capsule, ffi::DLTENSOR_CAPSULE_NAME.as_ptr());
            let p = p.cast::<DLManagedTensor>();
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        }
    }
}

/// Takes ownership of the managed tensor in a DLPack capsule (spec section 2.3).
///
/// A `"dltensor_versioned"` capsule whose major version is not 1 is refused **without**
/// renaming it, so its producer's destructor frees it. Otherwise the capsule is renamed to its
/// `used_*` name and the returned [`ManagedTensor`] owns the tensor.
///
/// # Errors
///
/// `ValueError` for a consumed capsule, `TypeError` for a capsule of another name or a
/// non-capsule, `BufferError` for a foreign major version.
pub fn consume_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    let obj = capsule.as_ptr();
    // SAFETY: `obj` is a live object (borrowed by `capsule`), GIL held.
    if unsafe { pyffi::PyCapsule_CheckExact(obj) } == 0 {
        return Err(PyTypeError::new_err(format!(
            "expected a DLPack capsule, found an object of type {}",
            capsule
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        )));
    }
    // SAFETY: `obj` is a capsule (checked), GIL held; `PyCapsule_IsValid` sets no exception.
    let is_named = |name: &CStr| unsafe { pyffi::PyCapsule_IsValid(obj, name.as_ptr()) } == 1;
    if is_named(ffi::DLTENSOR_VERSIONED_CAPSULE_NAME) {
        // SAFETY: the capsule is valid under this name (checked).
        let p = unsafe {
            pyffi::PyCapsule_GetPointer(obj, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr())
        }
        .cast::<DLManagedTensorVersioned>();
        // SAFETY: a `"dltensor_versioned"` capsule holds a managed tensor whose `version` is at
        // offset 0 in every major version (spec section 1.10).
        let version = unsafe { (*p).version };
        if version.major != ffi::DLPACK_MAJOR_VERSION {
            return Err(ImportError::UnsupportedVersion { found: version }.into());
        }
        rename(obj, ffi::USED_DLTENSOR_VERSIONED_CAPSULE_NAME)?;
        // SAFETY: renamed, so the capsule destructor no longer frees it: we own it now.
        return unsafe { ManagedTensor::from_raw_versioned(p) }.map_err(Into::into);
    }
    if is_named(ffi::DLTENSOR_CAPSULE_NAME) {
        // SAFETY: the capsule is valid under this name (checked).
        let p = unsafe { pyffi::PyCapsule_GetPointer(obj, ffi::DLTENSOR_CAPSULE_NAME.as_ptr()) }
            .cast::<DLManagedTensor>();
        rename(obj, ffi::USED_DLTENSOR_CAPSULE_NAME)?;
        // SAFETY: renamed, so the capsule destructor no longer frees it: we own it now.
        return unsafe { ManagedTensor::from_raw_legacy(p) }.map_err(Into::into);
    }
    if is_named(ffi::USED_DLTENSOR_VERSIONED_CAPSULE_NAME)
        || is_named(ffi::USED_DLTENSOR_CAPSULE_NAME)
    {
        return Err(PyValueError::new_err(
            "DLPack capsule has already been consumed (its name is `used_dltensor*`); a capsule can be imported only once",
        ));
    }
    // SAFETY: `obj` is a capsule; `PyCapsule_GetName` returns its name or NULL, no exception.
    let name = unsafe { pyffi::PyCapsule_GetName(obj) };
    let name = if name.is_null() {
        "NULL".to_owned()
    } else {
        // SAFETY: a non-NULL capsule name is a NUL-terminated C string owned by the capsule,
        // alive while `capsule` is borrowed.
        let name = unsafe { CStr::from_ptr(name) };
        format!("{name:?}")
    };
    Err(PyTypeError::new_err(format!(
        "capsule is named {name}, expected \"dltensor_versioned\" or \"dltensor\""
    )))
}

fn rename(obj: *mut pyffi::PyObject, name: &'static CStr) -> PyResult<()> {
    // SAFETY: `obj` is a capsule, GIL held; `name` is static as the capsule API requires.
    if unsafe { pyffi::PyCapsule_SetName(obj, name.as_ptr()) } != 0 {
        // SAFETY: GIL held by the caller's `Bound`.
        return Err(PyErr::fetch(unsafe { Python::assume_attached() }));
    }
    Ok(())
}

/// `from_dlpack` for Rust: builds `T` from any Python object that has `__dlpack__`, or from a
/// raw DLPack capsule.
///
/// Protocol (spec sections 2.2, 2.6): calls `__dlpack_device__()` when present, then
/// `__dlpack__(max_version=(1, 3))` (no stream: host consumers have none, and `None` is the
/// only legal value for CPU), and on `TypeError` retries `__dlpack__()` for producers that
/// predate `max_version`. The capsule is consumed as [`consume_capsule`] describes, and the
/// tensor is validated by `T`'s import before anything reads it.
///
/// # Errors
///
/// `AttributeError` when `obj` has no `__dlpack__`; the producer's own exceptions; those of
/// [`consume_capsule`]; `BufferError` when `T` refuses the tensor (its deleter then runs).
pub fn from_dlpack<T: DlpackImport>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    let managed = managed_from_object(obj)?;
    T::from_managed(managed).map_err(Into::into)
}

/// The managed tensor of `obj` (a producer or a capsule), as [`from_dlpack`] obtains it.
///
/// # Errors
///
/// As [`from_dlpack`].
pub fn managed_from_object(obj: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    let py = obj.py();
    // SAFETY: `obj` is a live object, GIL held.
    if unsafe { pyffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return consume_capsule(obj);
    }
    let dunder = obj.getattr("__dlpack__")?;
    if obj.hasattr("__dlpack_device__")? {
        // The device decides the stream; host consumers pass none (spec section 2.2).
        obj.call_method0("__dlpack_device__")?;
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item(
        "max_version",
        (ffi::DLPACK_MAJOR_VERSION, ffi::DLPACK_MINOR_VERSION),
    )?;
    let capsule = match dunder.call((), Some(&kwargs)) {
        Ok(capsule) => capsule,
        Err(err) if err.is_instance_of::<PyTypeError>(py) => dunder.call0()?,
        Err(err) => return Err(err),
    };
    consume_capsule(&capsule)
}

/// A Rust tensor owned by Python, exported once by value (writable) through `__dlpack__`.
///
/// Made by [`export_once`]. A second `__dlpack__` call raises `BufferError`.
#[pyclass(frozen, name = "ExportOnce", module = "dlpack_runtime")]
pub struct ExportOnce {
    device: Device,
    inner: Mutex<Option<Box<dyn ErasedExport>>>,
}

trait ErasedExport: Send {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError>;
}

impl<T: DlpackExport + Send + 'static> ErasedExport for T {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError> {
        (*self).to_dlpack_with(request)
    }
}

/// Moves `tensor` into a Python object with `__dlpack__` and `__dlpack_device__`, for
/// `numpy.from_dlpack(obj)` and the like. The export is by value, so it is writable.
///
/// # Errors
///
/// The Python error of creating the object.
pub fn export_once<T: DlpackExport + Send + 'static>(
    py: Python<'_>,
    tensor: T,
) -> PyResult<Bound<'_, ExportOnce>> {
    let device = tensor.dlpack_device();
    Bound::new(
        py,
        ExportOnce {
            device,
            inner: Mutex::new(Some(Box::new(tensor))),
        },
    )
}

#[pymethods]
impl ExportOnce {
    /// `__dlpack__(stream=None, *, max_version=None, dl_device=None, copy=None)`.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let request = export_request(stream, max_version, dl_device, copy);
        // Refuse bad arguments before taking the tensor, so that a corrected call can still
        // export it.
        request.check(self.device)?;
        let tensor = self
            .inner
            .lock()
            .map_err(|_| PyBufferError::new_err("tensor state was poisoned by a panic"))?
            .take()
            .ok_or_else(|| {
                PyBufferError::new_err(
                    "this tensor was already exported by value; it can be exported once",
                )
            })?;
        let managed = tensor.export(&request)?;
        to_capsule(py, managed)
    }

    /// `__dlpack_device__()`: `(device_type, device_id)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let device = self.device.to_raw();
        (device.device_type, device.device_id)
    }

    fn __repr__(&self) -> String {
        let exported = self.inner.lock().map_or(true, |inner| inner.is_none());
        format!(
            "ExportOnce(device={}, exported={})",
            self.device,
            if exported { "True" } else { "False" }
        )
    }
}
