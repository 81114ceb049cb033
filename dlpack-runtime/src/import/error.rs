//! [`ImportError`]: a tensor that cannot be imported, or does not meet the consumer's
//! constraints.

use crate::export::ExportError;
use crate::tensor::device::Device;
use crate::tensor::dtype::DataType;
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::HeaderError;

/// A tensor that cannot be imported, or does not meet the consumer's constraints
/// (`dlpack.h`, `DLTensor` and `DLPackVersion`; capsules as in the "Implementation" section of
/// the [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The managed tensor cannot be taken: NULL, an unsupported version, unknown flags.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The layout is invalid or does not meet the consumer's constraints. The message includes
    /// the [`LayoutError`]'s, so it is not also the [`source`](std::error::Error::source).
    #[error("cannot import: {0}")]
    Layout(LayoutError),
    /// The consumer requires writable memory and the tensor is read-only: flagged
    /// `DLPACK_FLAG_BITMASK_READ_ONLY`, or a legacy `DLManagedTensor`, which has no flags and
    /// so cannot say it is writable.
    #[error(
        "tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY, or a legacy capsule, which carries no flags), expected writable memory (the consumer is declared `writable`)"
    )]
    ReadOnly,
    /// The tensor's device is not one the consumer accepts.
    #[error("tensor lives on {found}, expected {expected}")]
    Device {
        /// Device found.
        found: Device,
        /// Devices accepted, in words.
        expected: &'static str,
    },
    /// The consumer's rank constraint fails.
    #[error("tensor has ndim {found}, expected {expected}")]
    Ndim {
        /// `ndim` found.
        found: usize,
        /// `ndim` required.
        expected: usize,
    },
    /// The consumer's dtype constraint (`dtype = ...`) fails.
    #[error("tensor has dtype {found}, expected {expected}")]
    Dtype {
        /// The tensor's dtype.
        found: DataType,
        /// The dtype required.
        expected: DataType,
    },
    /// The consumer's shape constraint (`shape = [...]`) fails.
    #[error(
        "tensor has shape {found:?}, expected {}",
        display_shape_pattern(expected)
    )]
    Shape {
        /// Extents found, in elements.
        found: Vec<usize>,
        /// Extents required, one per axis; `None` accepts any extent (written `_`).
        expected: Vec<Option<usize>>,
    },
    /// No variant of a storage enum (`#[derive(DlpackImportStorage)]`) accepts the tensor.
    #[error(
        "no variant of `{storage}` accepts the tensor: {}",
        display_reasons(reasons)
    )]
    NoVariant {
        /// The storage enum's name.
        storage: &'static str,
        /// Each variant's name and why it refused, in declaration order.
        reasons: Vec<(&'static str, ImportError)>,
    },
    /// The producer failed to export.
    #[error(transparent)]
    Export(#[from] ExportError),
}

fn display_shape_pattern(pattern: &[Option<usize>]) -> String {
    let axes: Vec<String> = pattern
        .iter()
        .map(|axis| axis.map_or_else(|| "_".to_owned(), |extent| extent.to_string()))
        .collect();
    format!("[{}]", axes.join(", "))
}

fn display_reasons(reasons: &[(&'static str, ImportError)]) -> String {
    let reasons: Vec<String> = reasons
        .iter()
        .map(|(variant, error)| format!("`{variant}` refuses it ({error})"))
        .collect();
    reasons.join("; ")
}

impl From<LayoutError> for ImportError {
    fn from(err: LayoutError) -> Self {
        Self::Layout(err)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::tensor::dtype::DataType;

    #[test]
    fn a_cause_is_printed_or_returned_as_the_source_never_both() {
        let cause = LayoutError::SubByteAccess {
            dtype: DataType::BOOL,
        };
        let printed = [
            ImportError::from(cause.clone()).to_string(),
            ExportError::from(cause.clone()).to_string(),
        ];
        for message in &printed {
            assert_eq!(message.matches(&cause.to_string()).count(), 1, "{message}");
        }
        assert!(ImportError::from(cause.clone()).source().is_none());
        assert!(ExportError::from(cause.clone()).source().is_none());
        // Transparent variants show their cause's message and its source, not the cause.
        let nested = ImportError::from(ExportError::from(cause.clone()));
        assert_eq!(nested.to_string(), printed[1]);
        assert!(nested.source().is_none());
    }
}
