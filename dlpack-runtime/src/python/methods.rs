//! [`add_dlpack_methods`]: `__dlpack__`, `__dlpack_device__` and `__dlpack_c_exchange_api__`
//! installed on a pyclass as methods of its own, with argument handling written for
//! `__dlpack__`'s four parameters.

use core::ffi::CStr;

use pyo3::PyClass;
use pyo3::exceptions::{PySystemError, PyTypeError};
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyTuple};

use crate::export::DlpackExport;

use super::installed::{PerType, method_call};
use super::parameters::{self, COUNT, DlpackArguments, tuple_item, tuple_size};
use super::{dlpack_c_exchange_api, dlpack_device};

/// Installs `__dlpack__`, `__dlpack_device__` and `__dlpack_c_exchange_api__` on the pyclass
/// `T`: the same protocol as the `#[pymethods]` written with [`dlpack`](super::dlpack), [`dlpack_device`] and
/// [`dlpack_c_exchange_api`] (see the module docs), with one call in the module's init, and
/// faster per call.
///
/// ```
/// use dlpack_runtime::{DlpackExport, python};
/// use pyo3::prelude::*;
///
/// #[pyclass(frozen)]
/// #[derive(DlpackExport)]
/// struct Tensor {
///     #[dlpack(data)]
///     data: Vec<f32>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
/// }
///
/// #[pymodule]
/// fn tensors(m: &Bound<'_, PyModule>) -> PyResult<()> {
///     m.add_class::<Tensor>()?;
///     python::add_dlpack_methods::<Tensor>(m.py())
/// }
/// ```
///
/// With the `cuda` feature it also installs `__cuda_array_interface__`, a property that is
/// `python::cuda_array_interface` of the instance (an `AttributeError` for a tensor not in CUDA
/// memory).
///
/// `__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)` is the array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html),
/// served as [`dlpack`](super::dlpack) serves it. It is a `METH_FASTCALL | METH_KEYWORDS` method that matches
/// its keywords against interned names (callers such as NumPy pass interned names, so one
/// pointer comparison each), where pyo3's general argument handling decodes each keyword to
/// UTF-8 and compares strings. Arguments in their plain forms (`None`, `int`, a tuple of two
/// `int`s, `True`/`False`) are read without building any Python object; other spellings
/// (a tuple subclass, NumPy scalars) are converted as pyo3 converts arguments, with the same
/// results. Argument errors raise `TypeError` (`OverflowError` for an `int` out of range), as
/// Python's own functions do.
///
/// Needs the vectorcall calling convention in the build's C API: any build for a given
/// interpreter, or `abi3` for Python 3.10 and later.
///
/// The common calls run on the GIL their caller holds, without pyo3's attach bookkeeping, and
/// so does `T`'s [`DlpackExport::export_parts`](crate::DlpackExport::export_parts) within them:
/// a derived implementation never touches Python; a hand-written one must not clone or drop
/// `Py<...>` values there (pyo3 would defer the release, panic on a clone, or abort under
/// `pyo3_disable_reference_pool`). Such a type can use the `#[pymethods]` written with
/// [`dlpack`](super::dlpack) instead, which run attached.
///
/// # Errors
///
/// The Python error of creating the methods, or of setting them on the type (a type created
/// with `#[pyclass(immutable_type)]` refuses new attributes).
pub fn add_dlpack_methods<T>(py: Python<'_>) -> PyResult<()>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let ty = T::type_object(py);
    let defs = method_defs::<T>()?;
    // Made now, so that even the first call finds its keywords by pointer.
    names(py);
    for def in defs {
        // SAFETY: `def` lives for the whole process (leaked in `method_defs`), and `ty` is a
        // live type object; the result is a new reference or NULL with an exception set.
        let descr = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                pyffi::PyDescr_NewMethod(ty.as_type_ptr(), def as *const _ as *mut _),
            )
        }?;
        // SAFETY: `ml_name` is a static C string.
        let name = unsafe { CStr::from_ptr(def.ml_name) }
            .to_str()
            .map_err(|_| PySystemError::new_err("method name is not UTF-8"))?;
        ty.setattr(name, descr)?;
    }
    #[cfg(feature = "cuda")]
    super::cai::install::<T>(&ty)?;
    ty.setattr("__dlpack_c_exchange_api__", dlpack_c_exchange_api::<T>(py)?)
}

/// The method definitions of `T`, made once per type and leaked: CPython keeps pointers to
/// them for the life of the type.
fn method_defs<T>() -> PyResult<&'static [pyffi::PyMethodDef; 2]>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    static DEFS: PerType<[pyffi::PyMethodDef; 2]> = PerType::new();
    DEFS.get::<T>("method", || {
        [
            pyffi::PyMethodDef {
                ml_name: c"__dlpack__".as_ptr(),
                ml_meth: pyffi::PyMethodDefPointer {
                    PyCFunctionFastWithKeywords: dlpack_method::<T>,
                },
                ml_flags: pyffi::METH_FASTCALL | pyffi::METH_KEYWORDS,
                ml_doc: parameters::DOC.as_ptr(),
            },
            pyffi::PyMethodDef {
                ml_name: c"__dlpack_device__".as_ptr(),
                ml_meth: pyffi::PyMethodDefPointer {
                    PyCFunction: dlpack_device_method::<T>,
                },
                ml_flags: pyffi::METH_NOARGS,
                ml_doc: DLPACK_DEVICE_DOC.as_ptr(),
            },
        ]
    })
}

const DLPACK_DEVICE_DOC: &CStr =
    c"__dlpack_device__($self, /)\n--\n\n(device_type, device_id) of this tensor, in DLPack numbering.";

/// The parameter names of `__dlpack__`, interned, in parameter order (made by [`names`]).
static NAMES: PyOnceLock<[Py<PyString>; COUNT]> = PyOnceLock::new();

/// The parameter names of `__dlpack__`, interned, in parameter order.
fn names(py: Python<'_>) -> &[Py<PyString>; COUNT] {
    NAMES.get_or_init(py, || {
        parameters::NAMES.map(|n| PyString::intern(py, n).unbind())
    })
}

/// The arguments of one `__dlpack__` call, by parameter (borrowed from the call).
type Arguments<'a, 'py> = [Option<Borrowed<'a, 'py, PyAny>>; COUNT];

/// Sorts the vectorcall arguments of `__dlpack__` into its parameters, all keyword-only: a
/// positional argument is a `TypeError` in Python's words, as NumPy's and PyTorch's
/// `__dlpack__` raise it.
///
/// # Safety
///
/// `args` points to `nargs` positional values followed by one value per name in `kwnames`
/// (NULL or a tuple of strings), all borrowed for the call (the vectorcall convention).
unsafe fn sort_arguments<'a, 'py>(
    py: Python<'py>,
    method: &dyn Fn() -> String,
    args: *const *mut pyffi::PyObject,
    nargs: usize,
    kwnames: *mut pyffi::PyObject,
) -> PyResult<Arguments<'a, 'py>> {
    let mut sorted: Arguments<'a, 'py> = [None; COUNT];
    if nargs > 0 {
        let verb = if nargs == 1 { "was" } else { "were" };
        return Err(PyTypeError::new_err(format!(
            "{}() takes 0 positional arguments but {nargs} {verb} given; its parameters ({}) are keyword-only",
            method(),
            parameters::NAMES.join(", ")
        )));
    }
    if kwnames.is_null() {
        return Ok(sorted);
    }
    // SAFETY: `kwnames` is a tuple (caller), borrowed for the call.
    let kwnames = unsafe { Borrowed::from_ptr(py, kwnames).cast_unchecked::<PyTuple>() };
    let names = names(py);
    for (i, name) in kwnames.iter_borrowed().enumerate() {
        // Interned names match by pointer; others are compared as strings.
        let slot = match names.iter().position(|n| n.as_ptr() == name.as_ptr()) {
            Some(slot) => Some(slot),
            None => {
                let mut found = None;
                for (slot, n) in names.iter().enumerate() {
                    if name.eq(n.bind(py))? {
                        found = Some(slot);
                        break;
                    }
                }
                found
            }
        };
        let Some(slot) = slot else {
            return Err(PyTypeError::new_err(format!(
                "{}() got an unexpected keyword argument '{}'",
                method(),
                name.as_any()
            )));
        };
        if sorted[slot].is_some() {
            return Err(PyTypeError::new_err(format!(
                "{}() got multiple values for argument '{}'",
                method(),
                name.as_any()
            )));
        }
        // SAFETY: the value of keyword `i` follows the `nargs` positional values (caller).
        sorted[slot] = Some(unsafe { Borrowed::from_ptr(py, *args.add(nargs + i)) });
    }
    Ok(sorted)
}

/// `__dlpack__` of `T`, `METH_FASTCALL | METH_KEYWORDS`.
unsafe extern "C" fn dlpack_method<T>(
    slf: *mut pyffi::PyObject,
    args: *const *mut pyffi::PyObject,
    nargs: pyffi::Py_ssize_t,
    kwnames: *mut pyffi::PyObject,
) -> *mut pyffi::PyObject
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    // SAFETY: CPython calls methods with the GIL held, for the whole call.
    let _attached = unsafe { crate::abi::gil::Attached::assume() };
    // SAFETY: CPython's method call, with the GIL: `slf` is the instance and `args`, `nargs`
    // and `kwnames` the vectorcall arguments, all borrowed for the call.
    if let Some(result) = unsafe { quick_dlpack::<T>(slf, args, nargs, kwnames) } {
        return result;
    }
    // SAFETY: CPython's method call: `slf` is the instance, borrowed for the call.
    unsafe {
        method_call::<T>(slf, |py, slf| {
            // Named as Python names methods in its errors, only when an error needs it.
            let method = || {
                let ty = slf.as_any().get_type();
                let name = ty
                    .qualname()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                format!("{name}.__dlpack__")
            };
            // SAFETY: the vectorcall arguments of this call (CPython), `nargs >= 0`.
            let sorted = sort_arguments(py, &method, args, nargs.max(0) as usize, kwnames)?;
            let arguments = DlpackArguments::extract(&method, sorted)?;
            let request = arguments.request();
            let managed = super::producer::export_object(&slf, &request)?;
            super::capsule::to_capsule(py, managed).map(Bound::into_ptr)
        })
    }
}

/// `__dlpack__` of `T` for its common calls, those whose arguments [`quick_arguments`] reads
/// (NumPy's `from_dlpack(x)` passes `max_version=(1, 0), dl_device=None, copy=None`), without
/// pyo3's attach bookkeeping: CPython calls a method with the GIL held, so the thread is
/// attached, but `Python::attach` cannot know it outside a pyo3 frame and takes the
/// `PyGILState_Ensure` path (about a seventh of the whole call). `None` when the call needs the
/// general path, decided before anything is done; otherwise the capsule, or NULL with an
/// exception set.
///
/// pyo3 does not count this thread as attached here, so this code drops no `Py<T>` (pyo3 would
/// defer its release, or abort under `pyo3_disable_reference_pool`) and builds no `PyErr`
/// outside [`raise`]: the exported object's reference is released by `PyOwner`, which checks
/// the GIL itself.
///
/// # Safety
///
/// Called as CPython calls the `__dlpack__` method (`METH_FASTCALL | METH_KEYWORDS`), with the
/// GIL held: `slf` is NULL or the instance, `args` points to `nargs` positional values followed
/// by one value per name in `kwnames` (NULL or a tuple of strings), all borrowed for the call.
unsafe fn quick_dlpack<T>(
    slf: *mut pyffi::PyObject,
    args: *const *mut pyffi::PyObject,
    nargs: pyffi::Py_ssize_t,
    kwnames: *mut pyffi::PyObject,
) -> Option<*mut pyffi::PyObject>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let quick = std::panic::catch_unwind(|| {
        // SAFETY: CPython holds the GIL for its method calls (caller); see above for what this
        // token is not used for.
        let py = unsafe { Python::assume_attached() };
        let names = NAMES.get(py)?;
        // SAFETY: the vectorcall arguments of this call (caller).
        let arguments = unsafe { quick_arguments(names, args, nargs, kwnames) }?;
        // SAFETY: NULL or a live, borrowed object (caller).
        let slf = unsafe { Borrowed::from_ptr_or_opt(py, slf) }?;
        if !slf.is_instance_of::<T>() {
            return None;
        }
        // SAFETY: an instance of `T` (checked).
        let slf = unsafe { slf.cast_unchecked::<T>() };
        let request = arguments.request();
        Some(
            super::producer::export_object(&slf, &request)
                // SAFETY: the GIL is held (above).
                .map(|managed| unsafe { super::capsule::new_capsule(managed) }),
        )
    });
    match quick {
        Ok(None) => None,
        Ok(Some(Ok(capsule))) => Some(capsule),
        // SAFETY: CPython holds the GIL for its method calls (caller).
        Ok(Some(Err(err))) => Some(unsafe { raise(move || err.into()) }),
        // SAFETY: as above.
        Err(_) => Some(unsafe { raise(|| PySystemError::new_err("panic in a DLPack method")) }),
    }
}

/// Raises the error `err` makes, with pyo3 attached (where a `PyErr` may be built and
/// dropped), and returns NULL.
///
/// # Safety
///
/// The GIL is held.
#[cold]
unsafe fn raise(err: impl FnOnce() -> PyErr) -> *mut pyffi::PyObject {
    // SAFETY: the GIL is held (caller).
    unsafe { super::restore_attached(err) };
    core::ptr::null_mut()
}

/// Reads `__dlpack__`'s arguments when each is in a common form (absent, `None`, an exact
/// `int` in range, an exact tuple of two such ints, `True` or `False`) and the keywords are
/// the interned parameter names, passed once each: with no Python object or exception made.
/// `None` otherwise, for the general path to read them (and to report their errors).
///
/// # Safety
///
/// The GIL is held; `args` points to `nargs` positional values followed by one value per name
/// in `kwnames` (NULL or a tuple of strings), all borrowed for the call.
unsafe fn quick_arguments(
    names: &[Py<PyString>; COUNT],
    args: *const *mut pyffi::PyObject,
    nargs: pyffi::Py_ssize_t,
    kwnames: *mut pyffi::PyObject,
) -> Option<DlpackArguments> {
    let mut sorted = [core::ptr::null_mut::<pyffi::PyObject>(); COUNT];
    // Every parameter is keyword-only: the general path reports positional ones.
    if nargs != 0 {
        return None;
    }
    if !kwnames.is_null() {
        // SAFETY: `kwnames` is a tuple (caller).
        let count = unsafe { tuple_size(kwnames) };
        for i in 0..count {
            // SAFETY: `i` is in bounds of the tuple.
            let name = unsafe { tuple_item(kwnames, i) };
            let slot = names.iter().position(|n| n.as_ptr() == name)?;
            if !sorted[slot].is_null() {
                return None;
            }
            // SAFETY: the value of keyword `i` follows the `nargs` positional values (caller).
            sorted[slot] = unsafe { *args.offset(nargs + i) };
        }
    }
    // SAFETY: each is NULL or a live object borrowed for the call (above), GIL held.
    unsafe { DlpackArguments::quick(sorted) }
}

/// `__dlpack_device__` of `T`, `METH_NOARGS`.
unsafe extern "C" fn dlpack_device_method<T>(
    slf: *mut pyffi::PyObject,
    _unused: *mut pyffi::PyObject,
) -> *mut pyffi::PyObject
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    // SAFETY: CPython's method call: `slf` is the instance, borrowed for the call.
    unsafe {
        method_call::<T>(slf, |py, slf| {
            let (device_type, device_id) = dlpack_device(slf.get());
            Ok((device_type, device_id).into_pyobject(py)?.into_ptr())
        })
    }
}
