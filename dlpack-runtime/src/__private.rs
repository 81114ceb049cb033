//! Items that generated code calls. Not public API: no stability promise.

pub use core::default::Default;
pub use core::option::Option::{self, None, Some};
pub use core::result::Result::{self, Err, Ok};

pub use crate::device::Device;
pub use crate::error::ImportError;
pub use crate::export::{AsShape, AsStrides, DlpackExport, ExportBuffer, ExportParts};
pub use crate::import::{DlpackImport, FromShape, FromStrides, ImportBuffer, ImportConstraints};
pub use crate::layout::{Contiguity, TensorLayout};
pub use crate::managed::ManagedTensor;

/// Generated `DlpackImport` code: the validated layout under `constraints`.
pub fn import_layout<'a>(
    managed: &'a ManagedTensor,
    constraints: &ImportConstraints,
) -> Result<TensorLayout<'a>, ImportError> {
    constraints.check(managed)
}
