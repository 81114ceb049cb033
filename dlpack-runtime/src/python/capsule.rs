//! Capsules: wrapping a managed tensor for Python, and taking one back, with the rename protocol
//! of the [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html)
//! ("Implementation").

use core::ffi::{CStr, c_void};
use core::ptr::{NonNull, null_mut};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::sync::critical_section::with_critical_section;
use pyo3::types::PyCapsule;

use crate::abi::ffi::{self, DLManagedTensor, DLManagedTensorVersioned};
use crate::tensor::managed::{HeaderError, ManagedTensor, RawManagedTensor};

/// Wraps a managed tensor in a capsule named by its kind, with the destructor the DLPack Python
/// specification prescribes ("Implementation").
///
/// # Errors
///
/// The Python error of `PyCapsule_New` (memory); the tensor's deleter has then been called.
pub fn to_capsule(py: Python<'_>, managed: ManagedTensor) -> PyResult<Bound<'_, PyCapsule>> {
    // SAFETY: the GIL is held (`py`), as `new_capsule` needs; its result is a new reference or
    // NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, new_capsule(managed)) }
        // SAFETY: `new_capsule` makes capsules.
        .map(|capsule| unsafe { capsule.cast_into_unchecked() })
}

/// [`to_capsule`] with the C API's conventions: a new reference, or NULL with the exception of
/// `PyCapsule_New` set (the tensor's deleter has then been called). Builds no `PyErr`.
///
/// # Safety
///
/// The GIL is held.
pub(super) unsafe fn new_capsule(managed: ManagedTensor) -> *mut pyffi::PyObject {
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
    // SAFETY: the GIL is held (caller); `pointer` is a live managed tensor whose ownership moves
    // into the capsule; `name` is static, as the capsule keeps it; the destructor frees the
    // tensor only under the unconsumed name and is callable from any thread with the GIL
    // (CPython capsule contract).
    let capsule =
        unsafe { pyffi::PyCapsule_New(pointer.as_ptr(), name.as_ptr(), Some(destructor)) };
    if capsule.is_null() {
        // The deleter may run Python code (a re-exported producer's own deleter, say): not
        // with `PyCapsule_New`'s exception set, which is put back afterwards.
        // SAFETY: the GIL is held (caller).
        let pending = unsafe { fetch_error() };
        // SAFETY: the capsule was not created, so ownership never left us; version checked at
        // construction.
        drop(unsafe { ManagedTensor::from_raw_unchecked(raw) });
        // SAFETY: what `fetch_error` took, handed back, GIL held.
        unsafe { restore_error(pending) };
    }
    capsule
}

/// The raised exception, taken out (type, value, traceback; all NULL when none is set).
///
/// # Safety
///
/// The GIL is held.
#[allow(deprecated)] // `PyErr_GetRaisedException`, its replacement, exists from 3.12 only.
unsafe fn fetch_error() -> [*mut pyffi::PyObject; 3] {
    let [mut kind, mut value, mut traceback] = [null_mut(); 3];
    // SAFETY: the GIL is held (caller); the three are out-pointers.
    unsafe { pyffi::PyErr_Fetch(&mut kind, &mut value, &mut traceback) };
    [kind, value, traceback]
}

/// Raises again what [`fetch_error`] took.
///
/// # Safety
///
/// The GIL is held; `pending` comes from `fetch_error` and is used once.
#[allow(deprecated)] // `PyErr_SetRaisedException`, its replacement, exists from 3.12 only.
unsafe fn restore_error([kind, value, traceback]: [*mut pyffi::PyObject; 3]) {
    // SAFETY: the references `PyErr_Fetch` handed out move back (caller), GIL held.
    unsafe { pyffi::PyErr_Restore(kind, value, traceback) };
}

/// Capsule destructor for `"dltensor_versioned"`: calls the deleter only if the capsule was
/// not consumed (DLPack Python specification, "Implementation").
unsafe extern "C" fn versioned_capsule_destructor(capsule: *mut pyffi::PyObject) {
    // SAFETY: CPython calls the destructor with the capsule, GIL held. `PyCapsule_IsValid` sets
    // no exception and is false for a renamed (consumed) capsule. No critical section, unlike
    // `consume_capsule`: the destructor runs when the last reference is gone, so no other
    // thread can hold the capsule, consume it or rename it while the name is checked here.
    unsafe {
        if pyffi::PyCapsule_IsValid(capsule, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr()) == 1 {
            let p =
                pyffi::PyCapsule_GetPointer(capsule, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr());
            let p = p.cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*p).deleter {
                // CPython calls capsule destructors with the GIL held (`abi::gil`).
                let _attached = crate::abi::gil::Attached::assume();
                deleter(p);
            }
        }
    }
}

/// Capsule destructor for `"dltensor"`: calls the deleter only if the capsule was not
/// consumed (DLPack Python specification, "Implementation").
unsafe extern "C" fn legacy_capsule_destructor(capsule: *mut pyffi::PyObject) {
    // SAFETY: as for `versioned_capsule_destructor` (no other thread holds the capsule), for
    // the legacy name and struct.
    unsafe {
        if pyffi::PyCapsule_IsValid(capsule, ffi::DLTENSOR_CAPSULE_NAME.as_ptr()) == 1 {
            let p = pyffi::PyCapsule_GetPointer(capsule, ffi::DLTENSOR_CAPSULE_NAME.as_ptr());
            let p = p.cast::<DLManagedTensor>();
            if let Some(deleter) = (*p).deleter {
                // CPython calls capsule destructors with the GIL held (`abi::gil`).
                let _attached = crate::abi::gil::Attached::assume();
                deleter(p);
            }
        }
    }
}

/// Takes ownership of the managed tensor in a DLPack capsule (DLPack Python specification,
/// "Implementation").
///
/// A `"dltensor_versioned"` capsule whose major version is not 1 is refused **without**
/// renaming it, so its producer's destructor frees it. Otherwise the capsule is renamed to its
/// `used_*` name and the returned [`ManagedTensor`] owns the tensor.
///
/// The name check, the read of the pointer and the rename are one step under the capsule's
/// critical section, so that on a free-threaded interpreter two threads consuming one capsule
/// at once (through this crate, or any consumer that takes the same critical section) cannot
/// both take the tensor: one gets it, the others the `ValueError` of a consumed capsule. The
/// capsule functions of CPython are not atomic as a group, so a consumer that takes no
/// critical section is not excluded. With the GIL the critical section is a no-op.
///
/// # Errors
///
/// `ValueError` for a consumed capsule, `TypeError` for a capsule of another name or a
/// non-capsule, `BufferError` for a foreign major version.
pub fn consume_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    crate::borrow::prepare(capsule.py());
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
    // Inside: only capsule functions, which run no Python code and do not detach the thread
    // (which would suspend the critical section), and lazily built errors.
    let taken = with_critical_section(capsule, || take(obj))?;
    // Outside: a refused tensor is handed to its deleter here, which may run Python code.
    match taken {
        // SAFETY: renamed, so the capsule destructor no longer frees it: we own it now.
        Taken::Versioned(p) => unsafe { ManagedTensor::from_raw_versioned(p) },
        // SAFETY: as above.
        Taken::Legacy(p) => unsafe { ManagedTensor::from_raw_legacy(p) },
    }
    .map_err(Into::into)
}

/// The tensor of a capsule that [`take`] renamed, now owned by the caller.
enum Taken {
    Versioned(*mut DLManagedTensorVersioned),
    Legacy(*mut DLManagedTensor),
}

/// The check-then-act of [`consume_capsule`]: the tensor of an unconsumed capsule `obj`, which
/// is renamed to its `used_*` name, or the error for another name. Run under the capsule's
/// critical section; `obj` is a capsule, and the thread is attached.
fn take(obj: *mut pyffi::PyObject) -> PyResult<Taken> {
    // SAFETY: `obj` is a capsule (caller), GIL held; `PyCapsule_IsValid` sets no exception.
    let is_named = |name: &CStr| unsafe { pyffi::PyCapsule_IsValid(obj, name.as_ptr()) } == 1;
    if is_named(ffi::DLTENSOR_VERSIONED_CAPSULE_NAME) {
        let p =
            pointer(obj, ffi::DLTENSOR_VERSIONED_CAPSULE_NAME)?.cast::<DLManagedTensorVersioned>();
        // SAFETY: a `"dltensor_versioned"` capsule holds a managed tensor whose `version` is at
        // offset 0 in every major version (`dlpack.h`, `DLManagedTensorVersioned`).
        let version = unsafe { (*p).version };
        if version.major != ffi::DLPACK_MAJOR_VERSION {
            return Err(HeaderError::UnsupportedVersion { found: version }.into());
        }
        rename(obj, ffi::USED_DLTENSOR_VERSIONED_CAPSULE_NAME)?;
        return Ok(Taken::Versioned(p));
    }
    if is_named(ffi::DLTENSOR_CAPSULE_NAME) {
        let p = pointer(obj, ffi::DLTENSOR_CAPSULE_NAME)?.cast::<DLManagedTensor>();
        rename(obj, ffi::USED_DLTENSOR_CAPSULE_NAME)?;
        return Ok(Taken::Legacy(p));
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

/// The pointer of capsule `obj`, just found valid under `name`. NULL only if a consumer that
/// takes no critical section renamed it in between: its exception is then returned.
fn pointer(obj: *mut pyffi::PyObject, name: &CStr) -> PyResult<*mut c_void> {
    // SAFETY: `obj` is a capsule, GIL held; on NULL an exception is set.
    let p = unsafe { pyffi::PyCapsule_GetPointer(obj, name.as_ptr()) };
    if p.is_null() {
        // SAFETY: GIL held by the caller's `Bound`.
        return Err(PyErr::fetch(unsafe { Python::assume_attached() }));
    }
    Ok(p)
}

fn rename(obj: *mut pyffi::PyObject, name: &'static CStr) -> PyResult<()> {
    // SAFETY: `obj` is a capsule, GIL held; `name` is static as the capsule API requires.
    if unsafe { pyffi::PyCapsule_SetName(obj, name.as_ptr()) } != 0 {
        // SAFETY: GIL held by the caller's `Bound`.
        return Err(PyErr::fetch(unsafe { Python::assume_attached() }));
    }
    Ok(())
}
