//! Which registry the process uses: the table every copy of this crate in the process shares.
//!
//! With the `python` feature, and once the interpreter runs, the table lives in `sys.modules`:
//! module `_dlpack_runtime_shared`, attribute `BORROW_CHECKING_API`, a capsule of that full name
//! pointing to a [`BorrowApi`]. The first copy to look publishes its own table there with
//! `dict.setdefault` (atomic, so two copies racing both end up with the winner's); every other
//! copy reads it, checks its name, version and size, and calls through it. Extension modules
//! are never unloaded, so the table's code and data stay valid for the life of the process.
//!
//! A copy looks with the GIL held, never waiting for it: in its Python consumer
//! ([`prepare`]), or at a borrow on a thread that holds the GIL (`abi::gil`, which a build for
//! the limited API on CPython 3.11 learns from this crate's entry points only). Until it has looked (a borrow
//! on another thread first, or before the interpreter starts), it uses its own table
//! ([`LOCAL`]), which it publishes when it looks if no other copy has: so the borrows made
//! before stay visible (if another copy published first, the borrows this copy made before it
//! looked are not seen by the others; an extension module's first borrow usually comes from its
//! Python consumer, which looks first). Without the `python` feature a copy always uses its own table: copies
//! that are not Python extension modules have no common place to meet.

use std::sync::OnceLock;

use super::BorrowError;
use super::registry::{BorrowApi, LOCAL};

/// The table this copy uses, once looked up.
static TABLE: OnceLock<Result<&'static BorrowApi, &'static str>> = OnceLock::new();

/// The process's table.
///
/// # Errors
///
/// [`BorrowError::Unavailable`] when `sys.modules` holds something else under the table's name.
pub(super) fn table() -> Result<&'static BorrowApi, BorrowError> {
    let found = match TABLE.get() {
        Some(found) => *found,
        // Not looked up yet, and it cannot be now without waiting for the GIL: this copy's own
        // table, which it publishes when it looks (unless another copy did first).
        None => match look_now() {
            Some(found) => *TABLE.get_or_init(|| found),
            None => Ok(&LOCAL),
        },
    };
    found.map_err(|reason| BorrowError::Unavailable { reason })
}

#[cfg(not(feature = "python"))]
fn look_now() -> Option<Result<&'static BorrowApi, &'static str>> {
    Some(Ok(&LOCAL))
}

#[cfg(feature = "python")]
fn look_now() -> Option<Result<&'static BorrowApi, &'static str>> {
    python::look_now()
}

/// Looks the table up (or publishes this copy's), with the GIL held.
#[cfg(feature = "python")]
pub(super) fn prepare(py: pyo3::Python<'_>) {
    if TABLE.get().is_none() {
        let found = python::published(py);
        let _ = TABLE.get_or_init(|| found);
    }
}

#[cfg(feature = "python")]
mod python {
    use core::ffi::{CStr, c_void};
    use core::ptr::NonNull;

    use pyo3::prelude::*;
    use pyo3::types::{PyCapsule, PyCapsuleMethods, PyModule};

    use super::super::registry::V1_SIZE;
    use super::{BorrowApi, LOCAL};

    /// The module in `sys.modules` that holds the table.
    const MODULE: &str = "_dlpack_runtime_shared";
    /// The attribute of [`MODULE`] that is the capsule.
    const ATTRIBUTE: &str = "BORROW_CHECKING_API";
    /// The capsule's name.
    const CAPSULE: &CStr = c"_dlpack_runtime_shared.BORROW_CHECKING_API";

    /// The published table (publishing [`LOCAL`] if there is none), when this thread holds
    /// the GIL; `None` otherwise, without waiting for it.
    pub(super) fn look_now() -> Option<Result<&'static BorrowApi, &'static str>> {
        // Never waiting for the GIL: a thread that does not hold it uses this copy's table
        // until it has looked.
        if !crate::abi::gil::holds_gil() {
            return None;
        }
        Python::try_attach(published)
    }

    /// The published table, publishing [`LOCAL`] if there is none.
    pub(super) fn published(py: Python<'_>) -> Result<&'static BorrowApi, &'static str> {
        look(py).unwrap_or(Err("reading sys.modules failed"))
    }

    fn look(py: Python<'_>) -> PyResult<Result<&'static BorrowApi, &'static str>> {
        let modules = py.import("sys")?.getattr("modules")?;
        let module = match modules.get_item(MODULE) {
            Ok(module) => module,
            Err(_) => {
                let module = PyModule::new(py, MODULE)?;
                module.setattr(
                    "__doc__",
                    "The borrow registry that copies of the Rust crate dlpack-runtime share.",
                )?;
                let pointer = NonNull::from(&LOCAL).cast::<c_void>();
                // SAFETY: `LOCAL` is a static, valid for the life of the process (extension
                // modules are never unloaded), and the capsule has no destructor.
                let capsule = unsafe { PyCapsule::new_with_pointer(py, pointer, CAPSULE) }?;
                module.setattr(ATTRIBUTE, capsule)?;
                // The winner of a race is the module that stays.
                modules.call_method1("setdefault", (MODULE, module))?
            }
        };
        let Ok(capsule) = module.getattr(ATTRIBUTE) else {
            return Ok(Err(
                "sys.modules['_dlpack_runtime_shared'] has no BORROW_CHECKING_API",
            ));
        };
        let Ok(capsule) = capsule.cast_into::<PyCapsule>() else {
            return Ok(Err(
                "_dlpack_runtime_shared.BORROW_CHECKING_API is not a capsule",
            ));
        };
        let Ok(pointer) = capsule.pointer_checked(Some(CAPSULE)) else {
            return Ok(Err(
                "_dlpack_runtime_shared.BORROW_CHECKING_API has another capsule name",
            ));
        };
        let table = pointer.cast::<BorrowApi>();
        // SAFETY: a capsule of this name points to a `BorrowApi` of some version, whose first
        // two fields (version and size) every version has.
        let (version, size) = unsafe { ((*table.as_ptr()).version, (*table.as_ptr()).size) };
        // Any version from 1 on: later versions only add fields, read when `size` covers them.
        if version < 1 || size < V1_SIZE {
            return Ok(Err(
                "_dlpack_runtime_shared.BORROW_CHECKING_API is not a version 1 table",
            ));
        }
        // SAFETY: a table of at least version 1's fields, static data of its publisher, whose
        // library is never unloaded (CPython does not unload extension modules).
        Ok(Ok(unsafe { table.as_ref() }))
    }
}
