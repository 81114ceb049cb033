//! Borrows of NumPy memory mirrored into rust-numpy's registry, so that a `PyReadwriteArray` or
//! `PyReadonlyArray` held by an extension built on the `numpy` crate conflicts with this crate's
//! borrows of the same array, both ways.
//!
//! rust-numpy publishes its registry as the capsule `_RUST_NUMPY_BORROW_CHECKING_API` on
//! `numpy._core.multiarray` (`numpy.core.multiarray` before NumPy 2): a `#[repr(C)]` table of
//! version 1, `{ version: u64, flags: *mut c_void, acquire, acquire_mut, release, release_mut }`,
//! whose functions take an `ndarray` object, must be called with the GIL held, and return 0
//! (granted), -1 (conflict) or, for `acquire_mut`, -2 (the array is not writeable). Its key is
//! computed from the array object at acquire *and* at release, so both calls must see the same
//! array with the same shape, strides and dtype.
//!
//! So a borrow is mirrored only when all of this holds:
//! - the import's producer is NumPy itself: its deleter is NumPy's (found by exporting a probe
//!   array and reading its deleter), and NumPy keeps the exporting array in `manager_ctx` (checked
//!   on the same probe), so `manager_ctx` is a Python object, and is checked to be an `ndarray`;
//! - rust-numpy's table is published, of version 1 or later;
//! - the borrow is taken on a private view of that array (`ndarray.view()`), which nothing else
//!   can reshape or retype before the release, and which keeps the array alive.
//!
//! Anything else (no NumPy, no rust-numpy, another producer) is not mirrored: rust-numpy only
//! knows NumPy arrays. A borrow whose import is dropped while the interpreter is finalizing keeps
//! its rust-numpy borrow: the registry dies with the process.

use core::ffi::{CStr, c_int, c_void};
use std::sync::{Mutex, OnceLock, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

use super::{Access, Origin};

/// rust-numpy's table, version 1 (`numpy` crate, `borrow/shared.rs`).
#[repr(C)]
struct RustNumpyApi {
    version: u64,
    flags: *mut c_void,
    acquire: unsafe extern "C" fn(flags: *mut c_void, array: *mut pyo3::ffi::PyObject) -> c_int,
    acquire_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut pyo3::ffi::PyObject) -> c_int,
    release: unsafe extern "C" fn(flags: *mut c_void, array: *mut pyo3::ffi::PyObject),
    release_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut pyo3::ffi::PyObject),
}

const CAPSULE: &CStr = c"_RUST_NUMPY_BORROW_CHECKING_API";

/// NumPy's deleters, versioned and legacy, once a probe confirmed that NumPy keeps the exporting
/// array in `manager_ctx`; `None` when it does not.
static NUMPY_DELETERS: OnceLock<Option<[usize; 2]>> = OnceLock::new();

/// One mirrored borrow: the private view it was taken on, and how.
struct Mirrored {
    owner: usize,
    view: Py<PyAny>,
    access: Access,
    table: *const RustNumpyApi,
}

// SAFETY: the table pointer is only dereferenced with the GIL held, and points to rust-numpy's
// table, which lives as long as the interpreter (its capsule is never freed).
unsafe impl Send for Mirrored {}

/// This copy's mirrored borrows.
static MIRRORED: Mutex<Vec<Mirrored>> = Mutex::new(Vec::new());

/// A conflict reported by rust-numpy.
pub(crate) enum Refusal {
    /// rust-numpy holds a conflicting borrow.
    Conflict,
    /// The array is not writeable (`acquire_mut` returned -2).
    NotWriteable,
    /// An unexpected answer.
    Failed,
}

/// Mirrors a borrow of `owner`'s memory into rust-numpy's registry when its memory is a NumPy
/// array's (see the module docs); `Ok(false)` when nothing was mirrored. Called before this
/// crate's registry grants the borrow: on a refusal there, [`undo`] takes the mirror back.
pub(crate) fn mirror(owner: usize, origin: Origin, access: Access) -> Result<bool, Refusal> {
    if origin.manager_ctx.is_null() || origin.deleter == 0 {
        return Ok(false);
    }
    if let Some(found) = NUMPY_DELETERS.get() {
        // Known: no need to wait for the GIL for memory that is not NumPy's.
        if !found.is_some_and(|deleters| deleters.contains(&origin.deleter)) {
            return Ok(false);
        }
    }
    Python::try_attach(|py| mirror_attached(py, owner, origin, access)).unwrap_or(Ok(false))
}

fn mirror_attached(
    py: Python<'_>,
    owner: usize,
    origin: Origin,
    access: Access,
) -> Result<bool, Refusal> {
    let Some(deleters) = numpy_deleters(py) else {
        return Ok(false);
    };
    if !deleters.contains(&origin.deleter) {
        return Ok(false);
    }
    let Some(table) = rust_numpy_table(py) else {
        return Ok(false);
    };
    // SAFETY: NumPy's deleter frees a managed tensor whose `manager_ctx` is the exporting array,
    // a live Python object (a strong reference held until the deleter runs), as the probe
    // confirmed for this NumPy.
    let array = unsafe { Bound::from_borrowed_ptr(py, origin.manager_ctx.cast()) };
    let Ok(ndarray) = numpy_module(py).and_then(|np| np.getattr("ndarray")) else {
        return Ok(false);
    };
    if !array.is_instance(&ndarray).unwrap_or(false) {
        return Ok(false);
    }
    let Ok(view) = array.call_method0("view") else {
        return Err(Refusal::Failed);
    };
    let mut mirrored = MIRRORED.lock().unwrap_or_else(PoisonError::into_inner);
    let held = mirrored.iter().position(|m| m.owner == owner);
    if let Some(index) = held {
        let m = &mirrored[index];
        if m.access == Access::Exclusive || access == Access::Shared {
            return Ok(true);
        }
        // An upgrade: shared to exclusive on the same private view, with the GIL held
        // throughout, so nothing else can take the array in between.
        // SAFETY: rust-numpy's table, GIL held; the view is the one acquired shared before.
        let code = unsafe {
            ((*m.table).release)((*m.table).flags, m.view.as_ptr());
            ((*m.table).acquire_mut)((*m.table).flags, m.view.as_ptr())
        };
        if code == 0 {
            mirrored[index].access = Access::Exclusive;
            return Ok(true);
        }
        // SAFETY: as above; the shared borrow is taken back (it was held a moment ago and
        // nothing ran in between).
        let back = unsafe { ((*m.table).acquire)((*m.table).flags, m.view.as_ptr()) };
        debug_assert_eq!(back, 0);
        return Err(refusal(code));
    }
    // SAFETY: rust-numpy's table (name and version checked), called with the GIL held on an
    // `ndarray` that nothing else references.
    let code = unsafe {
        match access {
            Access::Shared => ((*table).acquire)((*table).flags, view.as_ptr()),
            Access::Exclusive => ((*table).acquire_mut)((*table).flags, view.as_ptr()),
        }
    };
    if code != 0 {
        return Err(refusal(code));
    }
    mirrored.push(Mirrored {
        owner,
        view: view.unbind(),
        access,
        table,
    });
    Ok(true)
}

fn refusal(code: c_int) -> Refusal {
    match code {
        -1 => Refusal::Conflict,
        -2 => Refusal::NotWriteable,
        _ => Refusal::Failed,
    }
}

/// Takes back what [`mirror`] did for `owner` when this crate's registry refused the borrow:
/// a fresh mirror is released, an upgrade is turned back to shared (`was` is what the import
/// held before).
pub(crate) fn undo(owner: usize, was: Option<Access>) {
    let _ = Python::try_attach(|py| {
        let mut mirrored = MIRRORED.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(index) = mirrored.iter().position(|m| m.owner == owner) else {
            return;
        };
        let m = &mirrored[index];
        if was == Some(m.access) {
            return;
        }
        // SAFETY: rust-numpy's table, GIL held, on the view the borrow was taken on.
        unsafe { release_one(m) };
        if was == Some(Access::Shared) {
            // SAFETY: as above; it was held shared a moment ago.
            let _ = unsafe { ((*m.table).acquire)((*m.table).flags, m.view.as_ptr()) };
            mirrored[index].access = Access::Shared;
        } else {
            let m = mirrored.swap_remove(index);
            drop(m.view.into_bound(py));
        }
    });
}

/// Releases the mirrored borrow of `owner`, if any.
pub(crate) fn release(owner: usize) {
    let taken = {
        let mut mirrored = MIRRORED.lock().unwrap_or_else(PoisonError::into_inner);
        match mirrored.iter().position(|m| m.owner == owner) {
            Some(index) => mirrored.swap_remove(index),
            None => return,
        }
    };
    let mut taken = Some(taken);
    let _ = Python::try_attach(|_| {
        if let Some(m) = taken.take() {
            // SAFETY: rust-numpy's table, GIL held, on the view the borrow was taken on.
            unsafe { release_one(&m) };
            drop(m);
        }
    });
    if let Some(m) = taken {
        // The interpreter is gone or going: rust-numpy's registry goes with it, and the view
        // cannot be released without it.
        core::mem::forget(m.view);
    }
}

/// Releases `m` in rust-numpy's registry.
///
/// # Safety
///
/// The GIL is held, and `m` is a live mirrored borrow.
unsafe fn release_one(m: &Mirrored) {
    // SAFETY: rust-numpy's table (caller: live mirror), GIL held (caller); the same private view
    // whose key was registered, unchanged since.
    unsafe {
        match m.access {
            Access::Shared => ((*m.table).release)((*m.table).flags, m.view.as_ptr()),
            Access::Exclusive => ((*m.table).release_mut)((*m.table).flags, m.view.as_ptr()),
        }
    }
}

/// The `numpy` module, when it has been imported (this crate never imports it).
fn numpy_module(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("sys")?.getattr("modules")?.get_item("numpy")
}

/// NumPy's deleters (see [`NUMPY_DELETERS`]), probed once NumPy is loaded.
fn numpy_deleters(py: Python<'_>) -> Option<[usize; 2]> {
    if let Some(found) = NUMPY_DELETERS.get() {
        return *found;
    }
    let np = numpy_module(py).ok()?;
    let found = probe(py, &np);
    *NUMPY_DELETERS.get_or_init(|| found)
}

/// Exports a one-byte array both ways and reads the deleters, checking that `manager_ctx` is
/// the array.
fn probe(py: Python<'_>, np: &Bound<'_, PyAny>) -> Option<[usize; 2]> {
    let array = np.call_method1("empty", (1, "uint8")).ok()?;
    let address = array.as_ptr().cast::<c_void>();
    let legacy = array.call_method0("__dlpack__").ok()?;
    let legacy = legacy.cast_into::<PyCapsule>().ok()?;
    let l = legacy.pointer_checked(Some(c"dltensor")).ok()?;
    let l = l.cast::<crate::ffi::DLManagedTensor>();
    // SAFETY: an unconsumed capsule of this name holds a live managed tensor (the DLPack Python
    // specification), which the capsule's destructor frees when it is collected.
    let (l_ctx, l_del) = unsafe { (l.as_ref().manager_ctx, l.as_ref().deleter?) };
    if l_ctx != address {
        return None;
    }
    // Versioned tensors since NumPy 2.1; 0 (no deleter) before.
    let kwargs = PyDict::new(py);
    kwargs
        .set_item("max_version", PyTuple::new(py, [1, 0]).ok()?)
        .ok()?;
    let mut v_del = 0;
    if let Ok(versioned) = array.call_method("__dlpack__", (), Some(&kwargs)) {
        let versioned = versioned.cast_into::<PyCapsule>().ok()?;
        let v = versioned
            .pointer_checked(Some(c"dltensor_versioned"))
            .ok()?;
        let v = v.cast::<crate::ffi::DLManagedTensorVersioned>();
        // SAFETY: as above, for a versioned managed tensor.
        let (v_ctx, deleter) = unsafe { (v.as_ref().manager_ctx, v.as_ref().deleter?) };
        if v_ctx != address {
            return None;
        }
        v_del = deleter as usize;
    }
    Some([v_del, l_del as usize])
}

/// rust-numpy's table, when an extension built on the `numpy` crate published it.
fn rust_numpy_table(py: Python<'_>) -> Option<*const RustNumpyApi> {
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let module = modules
        .get_item("numpy._core.multiarray")
        .or_else(|_| modules.get_item("numpy.core.multiarray"))
        .ok()?;
    let capsule = module.getattr("_RUST_NUMPY_BORROW_CHECKING_API").ok()?;
    let capsule = capsule.cast_into::<PyCapsule>().ok()?;
    let table = capsule.pointer_checked(Some(CAPSULE)).ok()?;
    let table = table.cast::<RustNumpyApi>().as_ptr();
    // SAFETY: a capsule of this name points to rust-numpy's table, whose first field is its
    // version; version 1 has the fields above (later versions only add fields at the end).
    (unsafe { (*table).version } >= 1).then_some(table.cast_const())
}
