//! Which registry the process uses: the table every copy of this crate in the process shares.
//!
//! With the `python` feature, and once the interpreter runs, the table lives in `sys.modules`:
//! module `_dlpack_runtime_shared`, attribute `BORROW_CHECKING_API`, a capsule of that full name
//! pointing to a [`BorrowApi`]. The first copy to borrow publishes its own table there with
//! `dict.setdefault` (atomic, so two copies racing both end up with the winner's); every other
//! copy reads it, checks its name, version and size, and calls through it. Extension modules
//! are never unloaded, so the table's code and data stay valid for the life of the process.
//!
//! Without the `python` feature, or when this copy borrows before the interpreter is initialized,
//! it uses its own table ([`LOCAL`]) for the rest of the process: copies that are not Python
//! extension modules have no common place to meet.

use std::sync::OnceLock;

use super::BorrowError;
use super::registry::{BorrowApi, LOCAL};

/// The table this copy uses, once found.
static TABLE: OnceLock<Result<&'static BorrowApi, &'static str>> = OnceLock::new();

/// The process's table.
///
/// # Errors
///
/// [`BorrowError::Unavailable`] when `sys.modules` holds something else under the table's name.
pub(super) fn table() -> Result<&'static BorrowApi, BorrowError> {
    let found = match TABLE.get() {
        Some(found) => *found,
        None => {
            // Found outside the `OnceLock`: the search may wait for the GIL, and a thread that
            // holds the GIL must never wait for this lock. Racing threads find the same table.
            let found = find();
            *TABLE.get_or_init(|| found)
        }
    };
    found.map_err(|reason| BorrowError::Unavailable { reason })
}

#[cfg(not(feature = "python"))]
fn find() -> Result<&'static BorrowApi, &'static str> {
    Ok(&LOCAL)
}

#[cfg(feature = "python")]
fn find() -> Result<&'static BorrowApi, &'static str> {
    python::find()
}

#[cfg(feature = "python")]
mod python {
    use core::ffi::{CStr, c_void};
    use core::ptr::NonNull;

    use pyo3::prelude::*;
    use pyo3::types::{PyCapsule, PyCapsuleMethods, PyModule};

    use super::super::registry::API_VERSION;
    use super::{BorrowApi, LOCAL};

    /// The module in `sys.modules` that holds the table.
    const MODULE: &str = "_dlpack_runtime_shared";
    /// The attribute of [`MODULE`] that is the capsule.
    const ATTRIBUTE: &str = "BORROW_CHECKING_API";
    /// The capsule's name.
    const CAPSULE: &CStr = c"_dlpack_runtime_shared.BORROW_CHECKING_API";

    /// The published table, publishing [`LOCAL`] if there is none; [`LOCAL`] itself when the
    /// interpreter is not running.
    pub(super) fn find() -> Result<&'static BorrowApi, &'static str> {
        Python::try_attach(|py| published(py).map_err(|_| "reading sys.modules failed")?)
            .unwrap_or(Ok(&LOCAL))
    }

    fn published(py: Python<'_>) -> PyResult<Result<&'static BorrowApi, &'static str>> {
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
        if version < API_VERSION || size < size_of::<BorrowApi>() as u64 {
            return Ok(Err(
                "_dlpack_runtime_shared.BORROW_CHECKING_API is an older table",
            ));
        }
        // SAFETY: a table of at least this version and size, published for the life of the
        // process (its publisher's module is never unloaded, and the capsule stays in
        // `sys.modules`, which holds it).
        Ok(Ok(unsafe { table.as_ref() }))
    }
}
