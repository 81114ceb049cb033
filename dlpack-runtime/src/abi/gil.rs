//! Whether this thread is attached to the interpreter (holds the GIL, on a GIL build) (feature
//! `python`): asked by the layers below the Python glue that must not wait to attach (the
//! borrow registry's lookup) or must detach while they block (host waits of the CUDA driver
//! tier).
//!
//! The answer is proven, never guessed, on every build:
//!
//! - **Full C API** (GIL or free-threaded): `PyGILState_Check`, this thread's own state.
//! - **Limited API (`abi3`) on CPython 3.12 or later**: `PyThreadState_GetDict` returns NULL
//!   exactly when this thread is not attached (from 3.12 it reads this thread's own state).
//! - **Limited API on CPython 3.11**: `PyGILState_Check`, which 3.11 exports though its limited
//!   API does not name it, looked up at run time (`abi::symbol`). (3.11's
//!   `PyThreadState_GetDict` would read whichever thread holds the GIL.)
//! - **Where neither can be had** (an abi3 wheel on CPython 3.11 on Windows, where there is no
//!   `dlsym`; PyPy; GraalPy): the `Python<'py>` token of this crate's Python entry points
//!   (`__dlpack__`, `from_dlpack`, the C exchange API, capsule destructors) marks the thread
//!   attached ([`Attached`]) for the entry point's duration, and [`Detached`] unmarks it while
//!   it waits. A wait reached from elsewhere on those builds (a pyfunction of yours that drops
//!   a CUDA import) keeps the GIL: detach there yourself (`py.detach`). Code run inside an
//!   entry point (a producer's `export_parts`, a `Drop`) must not call into this crate from
//!   inside a `py.detach` of its own there, since the mark would then claim an attachment the
//!   thread gave up. The environment variable `DLPACK_RUNTIME_ATTACHED_QUERY=marks`, read once,
//!   makes an abi3 build use the marks on any interpreter, so that tests can run this path.

#[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
std::thread_local! {
    /// How many [`Attached`] marks this thread is inside (0 inside a [`Detached`]).
    /// Const-initialized and without a destructor: it lives as long as its thread.
    static MARKS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// This thread's mark counter where [`holds_gil`] reads the marks (the limited API on CPython
/// 3.11, PyPy, GraalPy), NULL elsewhere: one thread-local lookup per guard, not two.
#[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
#[inline]
fn marks() -> *const core::cell::Cell<usize> {
    #[cfg(all(Py_LIMITED_API, not(any(PyPy, GraalPy))))]
    if !matches!(limited_query(), LimitedQuery::Marks) {
        return core::ptr::null();
    }
    MARKS
        .try_with(core::ptr::from_ref)
        .unwrap_or(core::ptr::null())
}

/// This thread is attached for the life of the value (a token proved it), on builds that must
/// be told ([module docs](self)); nothing elsewhere. Not `Send`: a mark belongs to its thread.
pub(crate) struct Attached {
    /// [`marks`] when this guard marked the thread.
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
    marks: *const core::cell::Cell<usize>,
    _thread: core::marker::PhantomData<*const ()>,
}

impl Attached {
    /// Marks this thread attached; `py` proves it.
    #[inline]
    pub(crate) fn enter(py: pyo3::Python<'_>) -> Self {
        let _ = py;
        // SAFETY: `py` proves this thread attached.
        unsafe { Self::assume() }
    }

    /// Marks this thread attached without a token: CPython calls a capsule destructor or a
    /// C-level method with the GIL held (the callers' contract).
    ///
    /// # Safety
    ///
    /// This thread is attached to an initialized interpreter for the life of the value.
    #[inline]
    pub(crate) unsafe fn assume() -> Self {
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
        let marks = marks();
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
        // SAFETY: NULL or this thread's counter, which lives as long as the thread.
        if let Some(marks) = unsafe { marks.as_ref() } {
            marks.set(marks.get() + 1);
        }
        Self {
            #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
            marks,
            _thread: core::marker::PhantomData,
        }
    }
}

impl Drop for Attached {
    #[inline]
    fn drop(&mut self) {
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
        // SAFETY: NULL or the counter of the thread that made the guard, which is this thread
        // (the guard is not `Send`) and lives as long as it.
        if let Some(marks) = unsafe { self.marks.as_ref() } {
            marks.set(marks.get().saturating_sub(1));
        }
    }
}

/// This thread is detached for the life of the value: the marks of [`Attached`] are set aside
/// and put back on drop. Not `Send`. (Host waits are the only detaching code: feature `cuda`.)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Detached {
    /// [`marks`], and the marks set aside.
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
    marks: (*const core::cell::Cell<usize>, usize),
    _thread: core::marker::PhantomData<*const ()>,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Detached {
    /// Unmarks this thread; call right before detaching.
    #[inline]
    pub(crate) fn enter() -> Self {
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
        let marks = marks();
        Self {
            #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
            // SAFETY: NULL or this thread's counter, which lives as long as the thread.
            marks: (marks, unsafe { marks.as_ref() }.map_or(0, |marks| marks.replace(0))),
            _thread: core::marker::PhantomData,
        }
    }
}

impl Drop for Detached {
    #[inline]
    fn drop(&mut self) {
        #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
        // SAFETY: as for `Attached`'s drop.
        if let Some(marks) = unsafe { self.marks.0.as_ref() } {
            marks.set(self.marks.1);
        }
    }
}

/// Whether this thread is attached to an initialized interpreter ([module docs](self)).
#[inline]
pub(crate) fn holds_gil() -> bool {
    // SAFETY: `Py_IsInitialized` may be called at any time.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return false;
    }
    attached_to_initialized()
}

/// The full API: `PyGILState_Check`.
#[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
#[inline]
fn attached_to_initialized() -> bool {
    // SAFETY: `PyGILState_Check` may be called from any thread once the interpreter is
    // initialized (checked by the caller). It also answers 1 when CPython cannot tell, which
    // happens only with several interpreters, in which pyo3 modules refuse to load.
    unsafe { pyo3::ffi::PyGILState_Check() != 0 }
}

/// How a build for the limited API asks ([`limited_query`]).
#[cfg(all(Py_LIMITED_API, not(any(PyPy, GraalPy))))]
#[derive(Clone, Copy)]
enum LimitedQuery {
    /// CPython 3.12 or later: `PyThreadState_GetDict`, of the stable ABI.
    Dict,
    /// CPython 3.11: `PyGILState_Check`, which 3.11 exports (as every CPython since 3.4) though
    /// its limited API does not name it, found at run time.
    Check(unsafe extern "C" fn() -> core::ffi::c_int),
    /// Neither (no `dlsym`, as on Windows), or asked for by `DLPACK_RUNTIME_ATTACHED_QUERY`:
    /// the marks of the entry points.
    Marks,
}

/// The query of this interpreter, chosen once.
#[cfg(all(Py_LIMITED_API, not(any(PyPy, GraalPy))))]
#[inline]
fn limited_query() -> LimitedQuery {
    static QUERY: std::sync::OnceLock<LimitedQuery> = std::sync::OnceLock::new();
    *QUERY.get_or_init(|| {
        if std::env::var_os("DLPACK_RUNTIME_ATTACHED_QUERY").is_some_and(|v| v == "marks") {
            return LimitedQuery::Marks;
        }
        if running_3_12_or_later() {
            return LimitedQuery::Dict;
        }
        super::symbol::global(c"PyGILState_Check").map_or(LimitedQuery::Marks, |found| {
            // SAFETY: CPython's `int PyGILState_Check(void)`.
            LimitedQuery::Check(unsafe {
                core::mem::transmute::<
                    *mut core::ffi::c_void,
                    unsafe extern "C" fn() -> core::ffi::c_int,
                >(found.as_ptr())
            })
        })
    })
}

/// The limited API: `PyThreadState_GetDict` from CPython 3.12 on, `PyGILState_Check` found at
/// run time on 3.11, the marks where neither can be had.
#[cfg(all(Py_LIMITED_API, not(any(PyPy, GraalPy))))]
#[inline]
fn attached_to_initialized() -> bool {
    match limited_query() {
        // SAFETY: from CPython 3.12, `PyThreadState_GetDict` reads this thread's own state
        // (NULL when it is not attached), sets no exception, and may be called attached or
        // not. It creates the dict on the first call of an attached thread; NULL then (no
        // memory) is read as "not attached", which only keeps the GIL during a wait.
        LimitedQuery::Dict => unsafe { !pyo3::ffi::PyThreadState_GetDict().is_null() },
        // SAFETY: as for the full API's `PyGILState_Check` (its `attached_to_initialized`).
        LimitedQuery::Check(check) => unsafe { check() != 0 },
        LimitedQuery::Marks => marked(),
    }
}

/// PyPy, GraalPy: the marks.
#[cfg(any(PyPy, GraalPy))]
#[inline]
fn attached_to_initialized() -> bool {
    marked()
}

/// Whether this thread is inside an [`Attached`] mark (and not inside a [`Detached`] since).
#[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
#[inline]
fn marked() -> bool {
    MARKS.try_with(|marks| marks.get() > 0).unwrap_or(false)
}

/// Whether the running CPython is 3.12 or later, read once from `Py_GetVersion` (the
/// interpreter an abi3 library is loaded into may be newer than the one it was built for).
#[cfg(all(Py_LIMITED_API, not(any(PyPy, GraalPy))))]
fn running_3_12_or_later() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    /// 0: not read yet; 1: before 3.12; 2: 3.12 or later.
    static ANSWER: AtomicU8 = AtomicU8::new(0);
    match ANSWER.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            // SAFETY: `Py_GetVersion` returns a static NUL-terminated string and may be
            // called at any time.
            let version = unsafe { core::ffi::CStr::from_ptr(pyo3::ffi::Py_GetVersion()) };
            let later = parse_at_least_3_12(version.to_bytes());
            ANSWER.store(if later { 2 } else { 1 }, Ordering::Relaxed);
            later
        }
    }
}

/// Whether a `Py_GetVersion` string (`"3.12.1 (main, ...)"`) names 3.12 or later.
#[cfg_attr(not(all(Py_LIMITED_API, not(any(PyPy, GraalPy)))), allow(dead_code))]
fn parse_at_least_3_12(version: &[u8]) -> bool {
    let number = |part: &[u8]| -> Option<u32> {
        let digits = part.iter().take_while(|b| b.is_ascii_digit()).count();
        core::str::from_utf8(&part[..digits]).ok()?.parse().ok()
    };
    let mut parts = version.split(|&b| b == b'.');
    match (parts.next().and_then(number), parts.next().and_then(number)) {
        (Some(major), Some(minor)) => (major, minor) >= (3, 12),
        _ => false,
    }
}

/// Whether the interpreter is finalizing (or gone): then a thread that is not attached must not
/// try to attach (CPython 3.11 to 3.13 end such a thread, later versions hang it), and a
/// reference it holds is left to the interpreter's end. Best effort, as pyo3's own check: the
/// interpreter may begin finalizing right after the answer. `Py_IsFinalizing` from CPython
/// 3.13, `_Py_IsFinalizing` before (looked up at run time where the build cannot name it).
pub(crate) fn is_finalizing() -> bool {
    // SAFETY: `Py_IsInitialized` may be called at any time.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return true;
    }
    finalizing_now()
}

/// A build for CPython 3.13 or later names `Py_IsFinalizing`.
#[cfg(all(Py_3_13, not(any(PyPy, GraalPy))))]
#[inline]
fn finalizing_now() -> bool {
    // SAFETY: may be called at any time, attached or not.
    unsafe { pyo3::ffi::Py_IsFinalizing() != 0 }
}

/// Older builds look the function up where the running interpreter exports it: an abi3 library
/// built for 3.11 may run on a 3.13 that has only `Py_IsFinalizing`.
#[cfg(all(not(Py_3_13), not(any(PyPy, GraalPy))))]
fn finalizing_now() -> bool {
    use core::ffi::c_int;
    use std::sync::OnceLock;

    type Query = unsafe extern "C" fn() -> c_int;
    static QUERY: OnceLock<Option<Query>> = OnceLock::new();
    let query = QUERY.get_or_init(|| {
        [c"Py_IsFinalizing", c"_Py_IsFinalizing"]
            .into_iter()
            .find_map(super::symbol::global)
            // SAFETY: both names are CPython's `int (void)` functions, callable at any time.
            .map(|found| unsafe {
                core::mem::transmute::<*mut core::ffi::c_void, Query>(found.as_ptr())
            })
    });
    // SAFETY: CPython's `int (void)` query (above), callable at any time, attached or not.
    query.is_some_and(|query| unsafe { query() } != 0)
}

/// PyPy, GraalPy: not known to be finalizing; pyo3's own `try_attach` checks are all that
/// applies. (Elsewhere a query that cannot be found, as on Windows before 3.13, answers the
/// same.)
#[cfg(any(PyPy, GraalPy))]
#[inline]
fn finalizing_now() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::parse_at_least_3_12;

    #[test]
    fn version_strings_are_read_by_major_and_minor() {
        assert!(!parse_at_least_3_12(
            b"3.11.7 (main, Dec  1 2023) [GCC 12.2.0]"
        ));
        assert!(parse_at_least_3_12(b"3.12.0 (main)"));
        assert!(parse_at_least_3_12(
            b"3.14.0rc1 experimental free-threading build"
        ));
        assert!(parse_at_least_3_12(b"3.100.0"));
        assert!(parse_at_least_3_12(b"4.0.0"));
        assert!(!parse_at_least_3_12(b"3.9.18"));
        assert!(!parse_at_least_3_12(b""));
        assert!(!parse_at_least_3_12(b"garbage"));
    }
}
