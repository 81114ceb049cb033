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
//!
//!     // Optional: the DLPack 1.3 C exchange API, for C consumers (spec section 5).
//!     #[classattr]
//!     fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
//!         python::dlpack_exchange_api::<Self>(py)
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
//! fallback on `TypeError`), or from a raw capsule; [`from_dlpack_with`] adds `device` and
//! `copy`. Producers whose type publishes the C exchange API are read through it when no
//! synchronization is needed.
//!
//! # C exchange API (spec section 5)
//!
//! [`dlpack_exchange_api`] builds the `__dlpack_c_exchange_api__` capsule for a pyclass, so C
//! consumers (tvm-ffi, PyTorch extensions) skip the Python-level call.
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
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyTuple};

use crate::device::Device;
use crate::error::{ExportError, ImportError};
use crate::export::{DlpackExport, ExportRequest, allocate_host, export_with, serve};
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

/// Options of `from_dlpack(x, /, *, device=None, copy=None)` (spec section 2.9).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FromDlpackOptions {
    /// Device the data must end up on; `None`: the producer's device. Passed to the producer as
    /// `dl_device`.
    pub device: Option<Device>,
    /// `Some(true)`: always copy; `Some(false)`: never copy; `None`: copy only if needed.
    pub copy: Option<bool>,
    /// The consumer's stream, passed as `stream=` (spec section 2.4: for CUDA a `cudaStream_t`
    /// as an integer, `1` or `2` for the default streams, `-1` for no synchronization); `None`
    /// passes none, which a CUDA producer reads as the legacy default stream.
    pub stream: Option<i64>,
}

impl FromDlpackOptions {
    /// No device change, copy only if needed, no stream.
    pub const fn new() -> Self {
        Self {
            device: None,
            copy: None,
            stream: None,
        }
    }

    /// Sets `stream`: the stream the consumer will use the data on.
    pub const fn stream(mut self, stream: Option<i64>) -> Self {
        self.stream = stream;
        self
    }

    /// Sets `device`.
    pub const fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Sets `copy`.
    pub const fn copy(mut self, copy: Option<bool>) -> Self {
        self.copy = copy;
        self
    }
}

/// `from_dlpack` for Rust: builds `T` from any Python object that has `__dlpack__`, or from a
/// raw DLPack capsule. Same as [`from_dlpack_with`] with default options.
///
/// # Errors
///
/// As [`from_dlpack_with`].
pub fn from_dlpack<T: DlpackImport>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    from_dlpack_with(obj, &FromDlpackOptions::new())
}

/// `from_dlpack(obj, device=..., copy=...)` for Rust.
///
/// Protocol (spec sections 2.2, 2.6, 2.9, 5): when the producer's type publishes the C
/// exchange API (`__dlpack_c_exchange_api__`, version 1.x; looked up once per type) and no
/// `device`/`copy` is asked, the tensor is taken through `managed_tensor_from_py_object_no_sync`
/// and kept if it is host memory with no `stream` asked, or (feature `cuda`) CUDA device memory, whose
/// producer's `current_work_stream` is then ordered before the consumer's `stream` by an event
/// (`None`: the legacy default stream), as `__dlpack__(stream=...)` would. Otherwise it calls
/// `__dlpack__(max_version=(1, 3), dl_device=..., copy=..., stream=...)` (no keyword left at
/// its default is passed; so `__dlpack_device__` is not needed to choose a stream), and on
/// `TypeError` retries `__dlpack__()` (with `stream` only, if one was given) for producers that
/// predate the keywords, then serves `copy=True` and `device` itself (copying CUDA memory with
/// the `cuda` feature) and checks `device`. The capsule is consumed as [`consume_capsule`]
/// describes, and the tensor is validated by `T`'s import before anything reads it.
///
/// # Errors
///
/// `AttributeError` when `obj` has no `__dlpack__`; the producer's own exceptions; those of
/// [`consume_capsule`]; `BufferError` when the result cannot be on `device`, when `copy=False`
/// cannot be honoured, or when `T` refuses the tensor (its deleter then runs).
pub fn from_dlpack_with<T: DlpackImport>(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<T> {
    let managed = managed_from_object(obj, options)?;
    T::from_managed(managed).map_err(Into::into)
}

/// The managed tensor of `obj` (a producer or a capsule), as [`from_dlpack_with`] obtains it.
///
/// # Errors
///
/// As [`from_dlpack_with`].
pub fn managed_from_object(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<ManagedTensor> {
    let py = obj.py();
    // SAFETY: `obj` is a live object, GIL held.
    if unsafe { pyffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return settle(consume_capsule(obj)?, options, true);
    }
    let plain = options.device.is_none() && options.copy.is_none() && options.stream.is_none();
    if options.device.is_none() && options.copy.is_none() {
        if let Some(api) = exchange_api_of(&obj.get_type())? {
            match via_exchange_api(obj, api) {
                Ok(managed) => match order_exchanged(py, &managed, api, options)? {
                    true => return Ok(managed),
                    // Memory this consumer cannot order: give it back and ask `__dlpack__`,
                    // which synchronizes.
                    false => drop(managed),
                },
                // A producer that cannot serve the C path (pending streams, say) may still
                // serve `__dlpack__`, which raises its own error otherwise.
                Err(err) if err.is_instance_of::<PyBufferError>(py) => {}
                Err(err) => return Err(err),
            }
        }
    }
    // The consumer's stream, if any, is the caller's choice; so the producer's device does not
    // change the call, and `__dlpack_device__` is not asked.
    let kwargs = if plain {
        default_kwargs(py)?
    } else {
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "max_version"), max_version(py)?)?;
        if let Some(device) = options.device {
            let raw = device.to_raw();
            kwargs.set_item(intern!(py, "dl_device"), (raw.device_type, raw.device_id))?;
        }
        if let Some(copy) = options.copy {
            kwargs.set_item(intern!(py, "copy"), copy)?;
        }
        if let Some(stream) = options.stream {
            kwargs.set_item(intern!(py, "stream"), stream)?;
        }
        kwargs
    };
    let dunder = obj.getattr(intern!(py, "__dlpack__"))?;
    let (capsule, fell_back) = match dunder.call((), Some(&kwargs)) {
        Ok(capsule) => (capsule, false),
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            // A producer older than `max_version`: `stream` is as old as `__dlpack__` itself.
            let retried = match options.stream {
                Some(stream) => {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item(intern!(py, "stream"), stream)?;
                    dunder.call((), Some(&kwargs))?
                }
                None => dunder.call0()?,
            };
            (retried, true)
        }
        Err(err) => return Err(err),
    };
    settle(consume_capsule(&capsule)?, options, fell_back)
}

/// `(1, 3)`, the `max_version` this consumer asks for, built once.
fn max_version(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    VERSION
        .get_or_try_init(py, || {
            PyTuple::new(py, [ffi::DLPACK_MAJOR_VERSION, ffi::DLPACK_MINOR_VERSION])
                .map(Bound::unbind)
        })
        .map(|version| version.bind(py))
}

/// `{"max_version": (1, 3)}`, the keywords of a `__dlpack__` call without `device` and `copy`,
/// built once rather than on every call.
///
/// A callee written in C with `METH_VARARGS | METH_KEYWORDS` receives this very dict and could
/// change it, so it is checked before each use to hold exactly that one entry; a changed dict is
/// replaced by a fresh one for the call.
fn default_kwargs(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    static KWARGS: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let key = intern!(py, "max_version");
    let version = max_version(py)?;
    let fresh = || -> PyResult<Bound<'_, PyDict>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item(key, version)?;
        Ok(kwargs)
    };
    let kwargs = KWARGS
        .get_or_try_init(py, || fresh().map(Bound::unbind))?
        .bind(py);
    let intact = kwargs.len() == 1
        && kwargs
            .get_item(key)?
            .is_some_and(|value| value.is(version.as_any()));
    if intact { Ok(kwargs.clone()) } else { fresh() }
}

/// The C exchange API table a type publishes (`__dlpack_c_exchange_api__`, a capsule named
/// `"dlpack_exchange_api"` of major version 1), looked up once per type and cached, as spec
/// section 5.1 allows. The cache holds a reference to each type, so a type's address is never
/// reused while its entry exists.
fn exchange_api_of(
    ty: &Bound<'_, pyo3::types::PyType>,
) -> PyResult<Option<&'static ffi::DLPackExchangeAPI>> {
    type Cache = std::collections::HashMap<usize, (Py<pyo3::types::PyType>, usize)>;
    static CACHE: std::sync::OnceLock<Mutex<Cache>> = std::sync::OnceLock::new();
    thread_local! {
        /// The last type this thread looked up, and its table's address: a front for `CACHE`
        /// that spares the lock and the hash when one type is exchanged repeatedly. It holds
        /// only types that `CACHE` holds, whose addresses are therefore never reused.
        static LAST: core::cell::Cell<(usize, usize)> = const { core::cell::Cell::new((0, 0)) };
    }
    let table = |address: usize| {
        // SAFETY: cached addresses are 0 or tables that live for the whole process (below).
        (address != 0).then(|| unsafe { &*(address as *const ffi::DLPackExchangeAPI) })
    };
    let key = ty.as_ptr() as usize;
    if let Ok((last, address)) = LAST.try_with(core::cell::Cell::get) {
        if last == key {
            return Ok(table(address));
        }
    }
    let cache = CACHE.get_or_init(Default::default);
    let cached = cache
        .lock()
        .map_err(|_| poisoned())?
        .get(&key)
        .map(|(_, address)| *address);
    let address = match cached {
        Some(address) => address,
        None => {
            let address = lookup_exchange_api(ty)?;
            cache
                .lock()
                .map_err(|_| poisoned())?
                .insert(key, (ty.clone().unbind(), address));
            address
        }
    };
    // `key` is in `CACHE` now, with a reference to its type.
    let _ = LAST.try_with(|last| last.set((key, address)));
    Ok(table(address))
}

fn poisoned() -> PyErr {
    PyBufferError::new_err("exchange API cache poisoned by a panic")
}

/// Address of the type's exchange API table, or 0 when it publishes none usable.
fn lookup_exchange_api(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<usize> {
    let Some(capsule) = ty.getattr_opt(intern!(ty.py(), "__dlpack_c_exchange_api__"))? else {
        return Ok(0);
    };
    let name = ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME.as_ptr();
    // SAFETY: `capsule` is a live object, GIL held; `PyCapsule_IsValid` sets no exception.
    if unsafe { pyffi::PyCapsule_IsValid(capsule.as_ptr(), name) } != 1 {
        return Ok(0);
    }
    // SAFETY: a valid capsule under this name holds a `const DLPackExchangeAPI*` that lives for
    // the whole process (spec section 5.1).
    let api = unsafe { pyffi::PyCapsule_GetPointer(capsule.as_ptr(), name) }
        .cast::<ffi::DLPackExchangeAPI>();
    // SAFETY: as above; the header is readable.
    let usable = !api.is_null() && unsafe { (*api).header.version.major } == ffi::DLPACK_MAJOR_VERSION
        // SAFETY: as above.
        && unsafe { (*api).managed_tensor_from_py_object_no_sync }.is_some();
    Ok(if usable { api as usize } else { 0 })
}

/// Applies `device` and `copy` to a tensor obtained without them (a raw capsule, or a producer
/// that refused the keywords).
fn settle(
    managed: ManagedTensor,
    options: &FromDlpackOptions,
    unasked: bool,
) -> PyResult<ManagedTensor> {
    let found = Device::from_raw(managed.dl_tensor().device);
    let unreachable = options.device.filter(|&wanted| {
        !(found == wanted || wanted == Device::CPU && found.is_host_accessible())
    });
    // CUDA memory a producer handed over despite `dl_device=(CPU, 0)` is copied here, as the
    // producer should have done (feature `cuda`).
    let copy_to_host = unreachable == Some(Device::CPU)
        && cfg!(feature = "cuda")
        && found.device_type == crate::DeviceType::Cuda
        && options.copy != Some(false);
    if let Some(wanted) = unreachable {
        if !copy_to_host {
            return Err(PyBufferError::new_err(format!(
                "the producer handed over a {found} tensor, expected {wanted} (from_dlpack(device=...))"
            )));
        }
    }
    if copy_to_host || unasked && options.copy == Some(true) && !managed.is_copied() {
        // The copy is ours: versioned, writable, flagged IS_COPIED; a CUDA copy goes on the
        // stream the producer was asked to order its work on.
        let request = ExportRequest::versioned().copy(Some(true));
        let request = if copy_to_host {
            request.dl_device(Device::CPU)
        } else {
            request.stream(options.stream)
        };
        return serve(managed, &request).map_err(Into::into);
    }
    Ok(managed)
}

/// Makes a tensor taken through a C exchange API without synchronization safe to use as
/// `__dlpack__(stream=options.stream)` would (spec sections 2.5 and 5.4): host memory needs
/// nothing; CUDA memory (feature `cuda`) gets an event dependency from the producer's
/// `current_work_stream` to the consumer's stream (`None`: the legacy default stream). Returns
/// `false` for memory this consumer cannot order, which the caller gives back.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn order_exchanged(
    py: Python<'_>,
    managed: &ManagedTensor,
    api: &ffi::DLPackExchangeAPI,
    options: &FromDlpackOptions,
) -> PyResult<bool> {
    let raw = managed.dl_tensor().device;
    let device = Device::from_raw(raw);
    if device.device_type == crate::DeviceType::Cpu {
        return Ok(options.stream.is_none());
    }
    #[cfg(feature = "cuda")]
    // Host and managed CUDA memory: `current_work_stream` is per device, and these have none
    // (device 0 by convention), so `__dlpack__` orders them instead.
    if device.device_type == crate::DeviceType::Cuda {
        let Some(current) = api.current_work_stream else {
            return Ok(false);
        };
        let request =
            crate::stream::parse_stream(device, options.stream).map_err(ExportError::from)?;
        let mut stream: *mut c_void = core::ptr::null_mut();
        // SAFETY: the table's contract (spec section 5.3): GIL held, a valid out-pointer; the
        // stream written is valid until control returns to Python.
        if unsafe { current(raw.device_type, raw.device_id, &mut stream) } != 0 {
            return Err(PyErr::fetch(py));
        }
        crate::cuda::order_raw(device.device_id, stream.cast(), request)
            .map_err(ExportError::from)?;
        return Ok(true);
    }
    Ok(false)
}

/// Takes the tensor through a C exchange API table (spec section 5.3).
fn via_exchange_api(
    obj: &Bound<'_, PyAny>,
    api: &ffi::DLPackExchangeAPI,
) -> PyResult<ManagedTensor> {
    let from_py = api.managed_tensor_from_py_object_no_sync.ok_or_else(|| {
        PyBufferError::new_err("exchange API table without managed_tensor_from_py_object_no_sync")
    })?;
    let mut out: *mut DLManagedTensorVersioned = core::ptr::null_mut();
    // SAFETY: the table's contract: `py_object` is an object of the table's type (the type we
    // read it from), `out` receives an owned tensor; GIL held. 0 on success, -1 with a Python
    // exception set on failure.
    let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: on success `out` is an owned managed tensor (spec section 5.3).
    unsafe { ManagedTensor::from_raw_versioned(out) }.map_err(Into::into)
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

/// A managed tensor already built, exported as it is (or copied).
struct Prebuilt(ManagedTensor);

impl ErasedExport for Prebuilt {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError> {
        if request.needs_copy(Device::from_raw(self.0.dl_tensor().device)) {
            return serve(self.0, request);
        }
        request.check(Device::from_raw(self.0.dl_tensor().device))?;
        if !self.0.is_legacy() && !request.wants_versioned() {
            return Err(ExportError::VersionedOnly);
        }
        Ok(self.0)
    }
}

/// Wraps a managed tensor in a Python object with `__dlpack__` and `__dlpack_device__`
/// (exported once, as it is; a legacy request of a versioned tensor is a `BufferError`).
///
/// # Errors
///
/// The Python error of creating the object; the tensor is then dropped (its deleter runs).
pub fn export_managed(py: Python<'_>, managed: ManagedTensor) -> PyResult<Bound<'_, ExportOnce>> {
    let device = Device::from_raw(managed.dl_tensor().device);
    Bound::new(
        py,
        ExportOnce {
            device,
            inner: Mutex::new(Some(Box::new(Prebuilt(managed)))),
        },
    )
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

/// The C exchange API table of pyclass `T` (spec section 5), as the capsule to publish as the
/// class attribute `__dlpack_c_exchange_api__`:
///
/// a `#[classattr]` method returning `python::dlpack_exchange_api::<Self>(py)`, as in the
/// module example.
///
/// The table (version 1.3) lives for the whole process, one per type:
/// `managed_tensor_from_py_object_no_sync` makes the same shared, read-only export as
/// [`dlpack`]; `managed_tensor_allocator` allocates zeroed host tensors;
/// `managed_tensor_to_py_object_no_sync` wraps a tensor in an [`ExportOnce`] object;
/// `dltensor_from_py_object_no_sync` is NULL (optional; the shape is not stored as `int64_t`);
/// `current_work_stream` reports NULL (no current stream). The conversion performs no
/// synchronization, as the spec requires; a tensor whose producer names CUDA streams with
/// pending work (`#[dlpack(stream)]` fields, `CudaSlice` buffers) is refused with `BufferError`,
/// since the C exchange API cannot name those streams: `__dlpack__(stream=...)` orders them
/// before the consumer's stream. This crate's consumer then falls back to `__dlpack__`.
///
/// # Errors
///
/// The Python error of creating the capsule.
pub fn dlpack_exchange_api<T>(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    static TABLES: std::sync::OnceLock<Mutex<std::collections::HashMap<std::any::TypeId, usize>>> =
        std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(Default::default);
    let address = *tables
        .lock()
        .map_err(|_| PyBufferError::new_err("exchange API registry poisoned by a panic"))?
        .entry(std::any::TypeId::of::<T>())
        .or_insert_with(|| {
            let table = Box::new(ffi::DLPackExchangeAPI {
                header: ffi::DLPackExchangeAPIHeader {
                    version: DLPackVersion {
                        major: ffi::DLPACK_MAJOR_VERSION,
                        minor: ffi::DLPACK_MINOR_VERSION,
                    },
                    prev_api: core::ptr::null_mut(),
                },
                managed_tensor_allocator: Some(c_api_allocate),
                managed_tensor_from_py_object_no_sync: Some(c_api_from_py::<T>),
                managed_tensor_to_py_object_no_sync: Some(c_api_to_py),
                dltensor_from_py_object_no_sync: None,
                current_work_stream: Some(c_api_current_work_stream),
            });
            // Leaked on purpose: the spec requires the table to live for the whole process.
            Box::into_raw(table) as usize
        });
    let pointer = NonNull::new(address as *mut c_void)
        .ok_or_else(|| PyBufferError::new_err("null exchange API table"))?;
    // SAFETY: `pointer` is a leaked, never-freed table, valid for the process; no destructor.
    unsafe { PyCapsule::new_with_pointer(py, pointer, ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME) }
}

/// Runs `f` with the GIL, turning a Rust panic into a Python `SystemError` and an error into a
/// raised exception: the C API functions return 0 or -1 and never unwind.
fn c_api_call(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> core::ffi::c_int {
    Python::attach(|py| {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(py)));
        match result {
            Ok(Ok(())) => 0,
            Ok(Err(err)) => {
                err.restore(py);
                -1
            }
            Err(_) => {
                pyo3::exceptions::PySystemError::new_err(
                    "panic in a DLPack C exchange API function",
                )
                .restore(py);
                -1
            }
        }
    })
}

/// `managed_tensor_from_py_object_no_sync` for objects of type `T`.
unsafe extern "C" fn c_api_from_py<T>(
    py_object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> core::ffi::c_int
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    c_api_call(|py| {
        if py_object.is_null() || out.is_null() {
            return Err(PyValueError::new_err(
                "NULL argument to managed_tensor_from_py_object_no_sync",
            ));
        }
        // SAFETY: the caller passes a live object (borrowed for the call), GIL held.
        let obj = unsafe { Bound::from_borrowed_ptr(py, py_object.cast()) };
        let obj = obj.cast_into::<T>().map_err(PyErr::from)?;
        // No synchronization (spec section 5.3): `stream=-1` where a stream is legal. The table
        // carries no stream per tensor, so a tensor with work pending on the producer's own
        // streams cannot be ordered before the consumer's: refused, for `__dlpack__(stream=...)`
        // to serve it, rather than handed over unordered.
        let (device, pending) = {
            let parts = obj.get().export_parts();
            (parts.device(), parts.has_producer_streams())
        };
        if pending {
            return Err(PyBufferError::new_err(format!(
                "this {device} tensor names CUDA streams with pending work, which the C exchange API cannot order before the consumer's stream; expected a __dlpack__(stream=...) call"
            )));
        }
        let request = match device.device_type {
            crate::DeviceType::Cpu => ExportRequest::versioned(),
            _ => ExportRequest::versioned().stream(Some(-1)),
        };
        let owner = PyOwner(Some(obj.unbind()));
        let managed = export_with(owner, PyOwner::parts, &request)?;
        match managed.into_raw() {
            // SAFETY: `out` is a valid out-pointer (checked non-NULL; caller's contract).
            RawManagedTensor::Versioned(p) => unsafe { out.write(p.as_ptr()) },
            RawManagedTensor::Legacy(_) => {
                unreachable!("a versioned request builds a versioned tensor")
            }
        }
        Ok(())
    })
}

/// `managed_tensor_allocator`: a zeroed host tensor of the prototype's dtype and shape.
unsafe extern "C" fn c_api_allocate(
    prototype: *mut ffi::DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(*mut c_void, *const core::ffi::c_char, *const core::ffi::c_char),
    >,
) -> core::ffi::c_int {
    let result = std::panic::catch_unwind(|| -> Result<*mut DLManagedTensorVersioned, String> {
        if prototype.is_null() || out.is_null() {
            return Err("NULL argument to managed_tensor_allocator".to_owned());
        }
        // SAFETY: a non-NULL prototype is a readable `DLTensor` whose `shape` holds `ndim`
        // entries (spec section 5.3: only dtype, ndim, shape and device are used).
        let prototype = unsafe { &*prototype };
        let device = Device::from_raw(prototype.device);
        if device != Device::CPU {
            return Err(format!(
                "this producer allocates cpu:0 tensors only, not {device}"
            ));
        }
        let ndim = usize::try_from(prototype.ndim)
            .map_err(|_| format!("ndim is {}, expected >= 0", prototype.ndim))?;
        if ndim > crate::layout::MAX_NDIM || ndim > 0 && prototype.shape.is_null() {
            return Err(format!(
                "ndim is {ndim} with shape {:?}, expected at most 64 extents",
                prototype.shape
            ));
        }
        let extents: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: non-NULL, `ndim` entries (prototype contract).
            unsafe { core::slice::from_raw_parts(prototype.shape, ndim) }
        };
        let shape = extents
            .iter()
            .map(|&e| usize::try_from(e).map_err(|_| format!("extent {e} is negative")))
            .collect::<Result<Vec<_>, _>>()?;
        let managed = allocate_host(crate::DataType::from_raw(prototype.dtype), shape)
            .map_err(|e| e.to_string())?;
        match managed.into_raw() {
            RawManagedTensor::Versioned(p) => Ok(p.as_ptr()),
            RawManagedTensor::Legacy(_) => Err("allocator built a legacy tensor".to_owned()),
        }
    });
    match result {
        Ok(Ok(tensor)) => {
            // SAFETY: `out` is non-NULL (checked) and writable (caller's contract).
            unsafe { out.write(tensor) };
            0
        }
        Ok(Err(message)) => {
            report_c_error(error_ctx, set_error, &message);
            -1
        }
        Err(_) => {
            report_c_error(error_ctx, set_error, "panic in managed_tensor_allocator");
            -1
        }
    }
}

fn report_c_error(
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(*mut c_void, *const core::ffi::c_char, *const core::ffi::c_char),
    >,
    message: &str,
) {
    if let Some(set_error) = set_error {
        let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's callback, with its context and two NUL-terminated strings that
        // outlive the call (spec section 5.3: `SetError` is called exactly on failure).
        unsafe { set_error(error_ctx, c"BufferError".as_ptr(), message.as_ptr()) };
    }
}

/// `managed_tensor_to_py_object_no_sync`: steals `tensor` into an [`ExportOnce`] object.
unsafe extern "C" fn c_api_to_py(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> core::ffi::c_int {
    c_api_call(|py| {
        if out_py_object.is_null() {
            // SAFETY: the tensor was handed over (stolen) even on failure: free it once.
            drop(unsafe { ManagedTensor::from_raw_versioned(tensor) });
            return Err(PyValueError::new_err("NULL out_py_object"));
        }
        // SAFETY: the caller hands over an owned managed tensor (spec section 5.3).
        let managed = unsafe { ManagedTensor::from_raw_versioned(tensor) }?;
        let obj = export_managed(py, managed)?;
        // SAFETY: `out_py_object` is non-NULL and writable; the new reference goes to the caller.
        unsafe { out_py_object.write(obj.into_ptr().cast()) };
        Ok(())
    })
}

/// `current_work_stream`: NULL. This producer has no current stream: its CUDA tensors carry
/// their own streams, which the C exchange API cannot name.
unsafe extern "C" fn c_api_current_work_stream(
    _device_type: ffi::DLDeviceType,
    _device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> core::ffi::c_int {
    if !out_current_stream.is_null() {
        // SAFETY: a non-NULL out-pointer is writable (caller's contract).
        unsafe { out_current_stream.write(core::ptr::null_mut()) };
    }
    0
}
