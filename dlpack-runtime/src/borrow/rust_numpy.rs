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
//! - the import's memory is NumPy's: its deleter is NumPy's (found by exporting a probe array
//!   and reading its deleter, when this crate's Python consumer first runs with NumPy loaded),
//!   and NumPy keeps the exporting array in `manager_ctx` (checked on the same probe), or the
//!   import was read from the array's fields by this crate's consumer (which keeps the array
//!   there too, and stores its deleter in `borrow::NUMPY_FIELDS_DELETER`); `manager_ctx` is
//!   checked to be an `ndarray`;
//! - rust-numpy's table is published, of version 1 or later;
//! - the borrow is taken on a private view of that array, made by `numpy.ndarray.view` itself
//!   (never a subclass's override), or by the C function `PyArray_View` that it calls, from
//!   NumPy's C API table once that table and a probe view through it were checked, and
//!   checked to be exactly an `ndarray`: nothing else
//!   references it, so nothing can reshape or retype it before the release, and it keeps the
//!   array alive.
//!
//! What a borrow needs of NumPy (its deleters, `numpy.ndarray`, `ndarray.view`, the namespace of
//! `numpy._core.multiarray`) is looked up once, when the probe runs: a borrow then finds
//! rust-numpy's capsule by one dictionary lookup with an interned key, and checks its name and
//! version again only when it is not the capsule found first (kept alive here, so that its
//! address is never another object's). No borrow imports a module or raises an exception.
//!
//! Every mirrored borrow runs with the GIL held and under [`MIRRORED`]'s lock, from the mirror
//! to this crate's registry's answer (and the mirror's undoing when that is a refusal), so that
//! concurrent borrows of one import see each other's whole outcome. Python objects are dropped
//! only after the lock is released (a drop can run Python code). Memory that is not NumPy's is
//! recognized without the GIL.
//!
//! A borrow whose import is dropped while the interpreter is finalizing keeps its rust-numpy
//! borrow: the registry dies with the process.

use core::ffi::{CStr, c_int, c_void};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyModule, PyString, PyTuple, PyType};

use super::registry::OwnerHasher;
use super::{Access, BorrowError, BorrowedRange, Origin};

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

/// NumPy, as this crate's Python consumer first found it loaded; `None` when the probe did not
/// confirm that NumPy keeps the exporting array in `manager_ctx`.
static NUMPY: OnceLock<Option<Numpy>> = OnceLock::new();

/// What a borrow of NumPy memory needs, looked up once: a borrow then makes no import, no
/// attribute lookup by a new string and raises no exception.
struct Numpy {
    /// NumPy's deleters, versioned (0 before NumPy 2.1) and legacy.
    deleters: [usize; 2],
    /// `numpy.ndarray`, a static type of NumPy's extension module.
    ndarray: Py<PyType>,
    /// `numpy.ndarray.view`, the method descriptor itself (never a subclass's override).
    view: Py<PyAny>,
    /// NumPy's C function `PyArray_View`, which `ndarray.view` calls, when NumPy's C API table
    /// is found and checked (see [`c_view`]).
    c_view: Option<PyArrayView>,
    /// The namespace of `numpy._core.multiarray` (`numpy.core.multiarray` before NumPy 2), where
    /// rust-numpy publishes its table; `None` when neither module is loaded.
    multiarray: Option<Py<PyDict>>,
}

/// NumPy's `PyArray_View(array, dtype, subtype)`: a new view of `array`, of `subtype`, with
/// `array`'s dtype when `dtype` is NULL (a reference to it is stolen otherwise).
type PyArrayView = unsafe extern "C" fn(
    array: *mut pyo3::ffi::PyObject,
    dtype: *mut pyo3::ffi::PyObject,
    subtype: *mut pyo3::ffi::PyTypeObject,
) -> *mut pyo3::ffi::PyObject;

/// `PyArray_View`'s index in NumPy's C API table (`_ARRAY_API`), the same since NumPy 1.0.
const PY_ARRAY_VIEW: usize = 137;
/// `PyArray_Type`'s index in that table.
const PY_ARRAY_TYPE: usize = 2;

/// The first rust-numpy table found, with its capsule (a strong reference, so that the
/// capsule, and the table it points to, stay alive and its address is never another object's):
/// a borrow finds the capsule in [`Numpy::multiarray`] by one lookup, and checks the table
/// again only when the capsule is not this one.
static RUST_NUMPY_TABLE: OnceLock<(Py<PyAny>, TablePtr)> = OnceLock::new();

/// rust-numpy's table, as a pointer that may be kept in a static.
#[derive(Clone, Copy)]
struct TablePtr(*const RustNumpyApi);

// SAFETY: the table is only dereferenced with the GIL held (see `Mirrored`), and lives as long
// as its capsule, which `RUST_NUMPY_TABLE` keeps.
unsafe impl Send for TablePtr {}
// SAFETY: as above; the pointer itself is never written after it is stored.
unsafe impl Sync for TablePtr {}

/// One mirrored borrow: the private view it was taken on, and how.
struct Mirrored {
    view: Py<PyAny>,
    access: Access,
    table: *const RustNumpyApi,
}

// SAFETY: the table pointer is only dereferenced with the GIL held, and points to rust-numpy's
// table, which lives as long as the interpreter (its capsule is never freed).
unsafe impl Send for Mirrored {}

/// This copy's mirrored borrows.
static MIRRORED: Mutex<MirroredMap> = Mutex::new(HashMap::with_hasher(BuildHasherDefault::new()));

/// [`MIRRORED`]'s entries, by owner.
type MirroredMap = HashMap<usize, Mirrored, BuildHasherDefault<OwnerHasher>>;

/// How many entries [`MIRRORED`] holds: a drop of a managed tensor looks at the list only when
/// it is not empty.
static MIRRORED_COUNT: AtomicUsize = AtomicUsize::new(0);

fn lock() -> MutexGuard<'static, MirroredMap> {
    MIRRORED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Probes NumPy's deleters when NumPy is loaded and that has not been done: called with the GIL
/// held by this crate's Python consumer before it imports anything.
pub(crate) fn prepare(py: Python<'_>) {
    if NUMPY.get().is_some() {
        return;
    }
    if let Some(np) = loaded(py, intern!(py, "numpy")) {
        let found = numpy(py, &np);
        let _ = NUMPY.set(found);
    }
}

/// What [`prepare`] keeps of the loaded module `np`: `None` when the probe fails.
fn numpy(py: Python<'_>, np: &Bound<'_, PyAny>) -> Option<Numpy> {
    let deleters = probe(py, np)?;
    let ndarray = np.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
    let view = ndarray.getattr("view").ok()?;
    let multiarray = loaded(py, intern!(py, "numpy._core.multiarray"))
        .or_else(|| loaded(py, intern!(py, "numpy.core.multiarray")))
        .and_then(|module| module.cast_into::<PyModule>().ok())
        .map(|module| module.dict().unbind());
    let c_view = c_view(py, &ndarray);
    Some(Numpy {
        deleters,
        ndarray: ndarray.unbind(),
        view: view.unbind(),
        c_view,
        multiarray,
    })
}

/// `PyArray_View` from NumPy's C API table, the capsule `_ARRAY_API` of
/// `numpy._core._multiarray_umath` (`numpy.core._multiarray_umath` before NumPy 2), when the
/// table's `PyArray_Type` is `ndarray` and a view made through it of a probe array is exactly
/// an `ndarray` over the array's memory; `None` otherwise (`ndarray.view` is called then).
fn c_view(py: Python<'_>, ndarray: &Bound<'_, PyType>) -> Option<PyArrayView> {
    let umath = loaded(py, intern!(py, "numpy._core._multiarray_umath"))
        .or_else(|| loaded(py, intern!(py, "numpy.core._multiarray_umath")))?;
    let capsule = umath
        .getattr("_ARRAY_API")
        .ok()?
        .cast_into::<PyCapsule>()
        .ok()?;
    let api = capsule.pointer_checked(None).ok()?.cast::<*const c_void>();
    // SAFETY: NumPy's `_ARRAY_API` capsule points to its C API table, an array of pointers
    // with more than `PY_ARRAY_VIEW` entries since NumPy 1.0, static in NumPy's extension
    // module (never unloaded); reads of entries only.
    let (array_type, view) = unsafe {
        (
            *api.as_ptr().add(PY_ARRAY_TYPE),
            *api.as_ptr().add(PY_ARRAY_VIEW),
        )
    };
    if array_type != ndarray.as_ptr().cast_const().cast() || view.is_null() {
        return None;
    }
    // SAFETY: entry `PY_ARRAY_VIEW` of NumPy's table is `PyArray_View`, of this signature (the
    // table is the one whose `PyArray_Type` entry was just checked).
    let view = unsafe { core::mem::transmute::<*const c_void, PyArrayView>(view) };
    // A probe: a view of a fresh array is exactly an `ndarray` over the same memory.
    let np = loaded(py, intern!(py, "numpy"))?;
    let array = np.call_method1("arange", (3,)).ok()?;
    // SAFETY: GIL held, `array` an `ndarray`, no dtype, `subtype` NumPy's `ndarray` type.
    let made = unsafe { call_view(py, view, &array, ndarray) }?;
    let same = made.get_type().is(ndarray)
        && made.getattr("base").ok()?.is(&array)
        && made
            .getattr("shape")
            .ok()?
            .eq(array.getattr("shape").ok()?)
            .ok()?
        && made
            .call_method0("tobytes")
            .ok()?
            .eq(array.call_method0("tobytes").ok()?)
            .ok()?;
    same.then_some(view)
}

/// Calls NumPy's `PyArray_View(array, NULL, ndarray)`: a new `ndarray` view of `array`.
///
/// # Safety
///
/// The GIL is held, `view` is NumPy's `PyArray_View`, `array` an `ndarray` (or subclass) and
/// `ndarray` NumPy's `ndarray` type.
unsafe fn call_view<'py>(
    py: Python<'py>,
    view: PyArrayView,
    array: &Bound<'py, PyAny>,
    ndarray: &Bound<'py, PyType>,
) -> Option<Bound<'py, PyAny>> {
    // SAFETY: as the caller promises; no dtype is passed (nothing is stolen), and the result
    // is a new reference or NULL with an exception set.
    let made = unsafe {
        view(
            array.as_ptr(),
            core::ptr::null_mut(),
            ndarray.as_ptr().cast(),
        )
    };
    // SAFETY: a new reference, or NULL with an exception set (taken and dropped here).
    match unsafe { Bound::from_owned_ptr_or_opt(py, made) } {
        Some(made) => Some(made),
        None => {
            drop(PyErr::take(py));
            None
        }
    }
}

/// Whether `origin` is memory NumPy exported (known without the GIL once probed).
pub(crate) fn is_numpy(origin: Origin) -> bool {
    !origin.manager_ctx.is_null()
        && origin.deleter != 0
        && NUMPY.get().is_some_and(|found| {
            found.as_ref().is_some_and(|np| {
                np.deleters.contains(&origin.deleter)
                    || origin.deleter == super::NUMPY_FIELDS_DELETER.load(Ordering::Acquire)
            })
        })
}

/// NumPy's `ndarray` type, once NumPy was recognized ([`prepare`]).
pub(crate) fn ndarray_type(py: Python<'_>) -> Option<*mut pyo3::ffi::PyTypeObject> {
    let np = NUMPY.get()?.as_ref()?;
    Some(np.ndarray.bind(py).as_type_ptr())
}

/// Borrows `access` (replacing a held borrow when `replace`) for `owner`, whose memory is
/// NumPy's (`origin`), in rust-numpy's registry and then, with `then`, in this crate's; a
/// refusal by `then` undoes the mirror. A conflict in rust-numpy's registry is reported as
/// `ours()`, this crate's registry's own conflict for the request, when it sees one. Without
/// the interpreter, or without rust-numpy's table, only `then` runs.
pub(crate) fn acquire(
    owner: usize,
    origin: Origin,
    requested: BorrowedRange,
    replace: bool,
    then: impl FnOnce() -> Result<(), BorrowError>,
    ours: impl FnOnce() -> Option<BorrowError>,
) -> Result<(), BorrowError> {
    let access = requested.access;
    let mut then = Some(then);
    let attached = Python::try_attach(|py| {
        let mut run = || then.take().map_or(Ok(()), |f| f());
        let Some(np) = NUMPY.get().and_then(Option::as_ref) else {
            return run();
        };
        let Some(table) = rust_numpy_table(py, np) else {
            return run();
        };
        let Some(view) = private_view(py, np, origin) else {
            return run();
        };
        let mut guard = lock();
        let before = guard.get(&owner).map(|m| m.access);
        let mut unused = Unused::of(view);
        let result = match mirror(&mut guard, owner, access, replace, table, &mut unused) {
            // Refused here, and by this crate's registry too: its conflict names the other
            // import's bytes, rust-numpy's does not.
            Err(Refusal::Conflict) => Err(ours().map_or(Refusal::Conflict, Refusal::Registry)),
            Err(refusal) => Err(refusal),
            Ok(()) => {
                let result = run();
                if result.is_err() {
                    undo(&mut guard, owner, before, &mut unused);
                }
                result.map_err(Refusal::Registry)
            }
        };
        drop(guard);
        drop(unused);
        result.map_err(|refusal| refusal.into_error(requested))
    });
    match attached {
        Some(result) => result,
        None => then.take().map_or(Ok(()), |f| f()),
    }
}

/// Views a mirrored borrow leaves unused, dropped once the lock is released (a drop can run
/// Python code): the private view made for it, and views of entries the mirror or its undoing
/// gave up. Two are held inline, so that a borrow allocates nothing for them.
struct Unused {
    inline: [Option<Py<PyAny>>; 2],
    more: Vec<Py<PyAny>>,
}

impl Unused {
    fn of(view: Py<PyAny>) -> Self {
        Unused {
            inline: [Some(view), None],
            more: Vec::new(),
        }
    }

    fn push(&mut self, view: Py<PyAny>) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(view),
            None => self.more.push(view),
        }
    }

    /// The view pushed last.
    fn pop(&mut self) -> Option<Py<PyAny>> {
        self.more
            .pop()
            .or_else(|| self.inline.iter_mut().rev().find_map(Option::take))
    }
}

/// Why a mirrored borrow was refused.
enum Refusal {
    /// rust-numpy's registry: -1.
    Conflict,
    /// rust-numpy's registry: -2 (the array is not writeable).
    NotWriteable,
    /// rust-numpy's registry: anything else.
    Failed,
    /// This crate's registry.
    Registry(BorrowError),
}

impl Refusal {
    fn of(code: c_int) -> Self {
        match code {
            -1 => Refusal::Conflict,
            -2 => Refusal::NotWriteable,
            _ => Refusal::Failed,
        }
    }

    fn into_error(self, requested: BorrowedRange) -> BorrowError {
        let reason = match self {
            Refusal::Registry(err) => return err,
            Refusal::Conflict => {
                "rust-numpy holds a conflicting borrow of the same NumPy array (a PyReadwriteArray, or a PyReadonlyArray against an exclusive borrow)"
            }
            Refusal::NotWriteable => {
                "the NumPy array is not writeable (rust-numpy refuses a mutable borrow of it)"
            }
            Refusal::Failed => "rust-numpy's registry gave an unexpected answer",
        };
        BorrowError::RustNumpy { requested, reason }
    }
}

/// Takes `access` for `owner` in rust-numpy's registry `table`, on the private view
/// `unused[0]` (moved into the list when used). Under the lock, GIL held.
fn mirror(
    guard: &mut MutexGuard<'static, MirroredMap>,
    owner: usize,
    access: Access,
    replace: bool,
    table: *const RustNumpyApi,
    unused: &mut Unused,
) -> Result<(), Refusal> {
    if let Some(m) = guard.get_mut(&owner) {
        let held = m.access;
        if held == access || (held == Access::Exclusive && !replace) {
            return Ok(());
        }
        // An upgrade, or a downgrade (`replace`), on the same view: the GIL is held
        // throughout, so nothing can take the array in between.
        // SAFETY: rust-numpy's table, GIL held, on the view acquired as `held` before.
        let code = unsafe {
            release_one(m.table, &m.view, held);
            take_one(m.table, &m.view, access)
        };
        if code == 0 {
            m.access = access;
            return Ok(());
        }
        // SAFETY: as above; what was held a moment ago is taken back (nothing ran between).
        let back = unsafe { take_one(m.table, &m.view, held) };
        if back != 0 {
            // Lost: the entry no longer stands for a borrow.
            if let Some(m) = guard.remove(&owner) {
                MIRRORED_COUNT.fetch_sub(1, Ordering::Relaxed);
                unused.push(m.view);
            }
        }
        return Err(Refusal::of(code));
    }
    let view = unused.pop().expect("the private view");
    // SAFETY: rust-numpy's table (name and version checked), GIL held, on a private
    // `ndarray` (exactly that type) that nothing else references.
    let code = unsafe { take_one(table, &view, access) };
    if code != 0 {
        unused.push(view);
        return Err(Refusal::of(code));
    }
    guard.insert(
        owner,
        Mirrored {
            view,
            access,
            table,
        },
    );
    MIRRORED_COUNT.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Puts `owner`'s mirror back as it was `before` (none, or held as that access), after this
/// crate's registry refused a borrow that [`mirror`] made. Under the lock, GIL held.
fn undo(
    guard: &mut MutexGuard<'static, MirroredMap>,
    owner: usize,
    before: Option<Access>,
    unused: &mut Unused,
) {
    let Some(m) = guard.get_mut(&owner) else {
        return;
    };
    let now = m.access;
    if before == Some(now) {
        return;
    }
    // SAFETY: rust-numpy's table, GIL held, on the view the borrow was taken on.
    unsafe { release_one(m.table, &m.view, now) };
    if let Some(before) = before {
        // SAFETY: as above; it was held as `before` a moment ago.
        if unsafe { take_one(m.table, &m.view, before) } == 0 {
            m.access = before;
            return;
        }
    }
    if let Some(m) = guard.remove(&owner) {
        MIRRORED_COUNT.fetch_sub(1, Ordering::Relaxed);
        unused.push(m.view);
    }
}

/// Whether any mirrored borrow is held: a drop of a managed tensor looks no further otherwise.
#[inline]
pub(crate) fn any() -> bool {
    MIRRORED_COUNT.load(Ordering::Relaxed) != 0
}

/// Releases the mirrored borrow of `owner`, if any.
pub(crate) fn release(owner: usize) {
    let taken = {
        let mut guard = lock();
        match guard.remove(&owner) {
            Some(m) => {
                MIRRORED_COUNT.fetch_sub(1, Ordering::Relaxed);
                m
            }
            None => return,
        }
    };
    let mut taken = Some(taken);
    // A thread that is not attached must not try to while the interpreter finalizes (it would
    // be ended or hung): the view is then left as below.
    let may_attach = crate::abi::gil::holds_gil() || !crate::abi::gil::is_finalizing();
    let _ = may_attach.then(|| {
        Python::try_attach(|_| {
            if let Some(m) = taken.take() {
                // SAFETY: rust-numpy's table, GIL held, on the view the borrow was taken on.
                unsafe { release_one(m.table, &m.view, m.access) };
                drop(m);
            }
        })
    });
    if let Some(m) = taken {
        // The interpreter is gone or going: rust-numpy's registry goes with it, and the view
        // cannot be released without it.
        core::mem::forget(m.view);
    }
}

/// Takes `access` on `view` in rust-numpy's registry: 0 when granted.
///
/// # Safety
///
/// `table` is rust-numpy's live table, the GIL is held, and `view` is a private `ndarray`.
unsafe fn take_one(table: *const RustNumpyApi, view: &Py<PyAny>, access: Access) -> c_int {
    // SAFETY: as the caller promises.
    unsafe {
        match access {
            Access::Shared => ((*table).acquire)((*table).flags, view.as_ptr()),
            Access::Exclusive => ((*table).acquire_mut)((*table).flags, view.as_ptr()),
        }
    }
}

/// Releases `access` on `view` in rust-numpy's registry.
///
/// # Safety
///
/// As for [`take_one`], and `view` holds `access` there.
unsafe fn release_one(table: *const RustNumpyApi, view: &Py<PyAny>, access: Access) {
    // SAFETY: as the caller promises; the same private view whose key was registered,
    // unchanged since.
    unsafe {
        match access {
            Access::Shared => ((*table).release)((*table).flags, view.as_ptr()),
            Access::Exclusive => ((*table).release_mut)((*table).flags, view.as_ptr()),
        }
    }
}

/// A private view of the `ndarray` in `origin`'s `manager_ctx`: `numpy.ndarray.view(array,
/// numpy.ndarray)`, exactly an `ndarray`; `None` when it is not an array.
fn private_view(py: Python<'_>, np: &Numpy, origin: Origin) -> Option<Py<PyAny>> {
    let ndarray = np.ndarray.bind(py);
    // SAFETY: NumPy's deleter frees a managed tensor whose `manager_ctx` is the exporting array,
    // a live Python object (a strong reference held until the deleter runs), as the probe
    // confirmed for this NumPy (`is_numpy`, checked by the caller's caller).
    let array = unsafe { Bound::from_borrowed_ptr(py, origin.manager_ctx.cast()) };
    if !array.is_instance(ndarray).ok()? {
        return None;
    }
    // `ndarray.view` itself (or the C function it calls), never an override, asked for a plain
    // `ndarray`.
    let view = match np.c_view {
        // SAFETY: GIL held, `array` checked to be an `ndarray`, `view` NumPy's `PyArray_View`
        // (checked when it was found).
        Some(view) => unsafe { call_view(py, view, &array, ndarray) }?,
        None => np.view.bind(py).call1((&array, ndarray)).ok()?,
    };
    view.get_type().is(ndarray).then(|| view.unbind())
}

/// The module `name` when it has been imported (this crate never imports NumPy): an entry of
/// the interpreter's module dictionary (`sys.modules`), found without calling `import`.
fn loaded<'py>(py: Python<'py>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held; the interpreter's module dictionary is a borrowed reference to a
    // live dict, made strong at once.
    let modules =
        unsafe { Bound::from_borrowed_ptr_or_opt(py, pyo3::ffi::PyImport_GetModuleDict()) }?;
    let modules = modules.cast_into::<PyDict>().ok()?;
    modules.get_item(name).ok().flatten()
}

/// Exports a one-byte array both ways and reads the deleters, checking that `manager_ctx` is
/// the array.
fn probe(py: Python<'_>, np: &Bound<'_, PyAny>) -> Option<[usize; 2]> {
    let array = np.call_method1("empty", (1, "uint8")).ok()?;
    let address = array.as_ptr().cast::<c_void>();
    let legacy = array.call_method0("__dlpack__").ok()?;
    let legacy = legacy.cast_into::<PyCapsule>().ok()?;
    let l = legacy.pointer_checked(Some(c"dltensor")).ok()?;
    let l = l.cast::<crate::abi::ffi::DLManagedTensor>();
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
        let v = v.cast::<crate::abi::ffi::DLManagedTensorVersioned>();
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
fn rust_numpy_table(py: Python<'_>, np: &Numpy) -> Option<*const RustNumpyApi> {
    let multiarray = np.multiarray.as_ref()?.bind(py);
    let key = intern!(py, "_RUST_NUMPY_BORROW_CHECKING_API");
    // Every borrow of NumPy memory asks: the dictionary's own lookup, and a comparison with the
    // capsule found first, where the GIL keeps the entry from changing meanwhile.
    #[cfg(not(Py_GIL_DISABLED))]
    {
        // SAFETY: GIL held; a live dict and a str key (hashable: no error is set). The result
        // is a borrowed reference, compared by address only while the GIL is held.
        let found =
            unsafe { pyo3::ffi::PyDict_GetItemWithError(multiarray.as_ptr(), key.as_ptr()) };
        if found.is_null() {
            return None;
        }
        if let Some((known, table)) = RUST_NUMPY_TABLE.get() {
            if core::ptr::eq(found, known.as_ptr()) {
                return Some(table.0);
            }
        }
    }
    let capsule = multiarray.get_item(key).ok().flatten()?;
    if let Some((known, table)) = RUST_NUMPY_TABLE.get() {
        if capsule.is(known) {
            return Some(table.0);
        }
    }
    let table = checked_table(&capsule)?;
    // The first table found is kept with its capsule; a later one (published after the first
    // was removed) is used as it is found, as before the first was kept.
    let _ = RUST_NUMPY_TABLE.set((capsule.unbind(), TablePtr(table)));
    Some(table)
}

/// The table `capsule` points to, when it is rust-numpy's capsule of version 1 or later.
fn checked_table(capsule: &Bound<'_, PyAny>) -> Option<*const RustNumpyApi> {
    let capsule = capsule.cast::<PyCapsule>().ok()?;
    let table = capsule.pointer_checked(Some(CAPSULE)).ok()?;
    let table = table.cast::<RustNumpyApi>().as_ptr();
    // SAFETY: a capsule of this name points to rust-numpy's table, whose first field is its
    // version; version 1 has the fields above (later versions only add fields at the end).
    (unsafe { (*table).version } >= 1).then_some(table.cast_const())
}
