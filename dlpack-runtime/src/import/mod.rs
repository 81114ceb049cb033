//! The consumer side: building Rust values from managed tensors.
//!
//! A type becomes a consumer by implementing [`DlpackImport`] (usually with
//! `#[derive(DlpackImport)]`). Its `#[dlpack(data)]` field keeps the [`ManagedTensor`] alive
//! (an [`ImportedData<T>`] or the [`ManagedTensor`] itself), so the producer's deleter runs
//! exactly once, when the Rust value is dropped, or at once if the import is refused.
//!
//! Every import validates the layout ([`ManagedTensor::layout`]) and the consumer's
//! [`ImportConstraints`] before anything reads the data, once: a tensor this crate's exporter
//! built arrives validated, a foreign one is validated at its first `layout`, and
//! [`ImportedData`] keeps what the import established, so typed accesses only check their
//! index.

mod constraints;
mod data;
mod error;
mod guard;
mod iter;
mod lend;

pub(crate) use lend::lent_byte_offset;

pub use constraints::ImportConstraints;
pub use data::ImportedData;
pub use error::ImportError;
pub use guard::{ReadonlyData, ReadwriteData};
pub use iter::Elements;

use crate::abi::words::load;
use crate::borrow::Access;
use crate::export::DlpackExport;
use crate::tensor::dtype::DataType;
use crate::tensor::layout::TensorLayout;
use crate::tensor::managed::ManagedTensor;

/// A DLPack consumer: a type that can be built from a managed tensor.
///
/// Usually derived with `#[derive(DlpackImport)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a DLPack consumer",
    label = "not `DlpackImport`",
    note = "a tensor type derives `#[derive(dlpack_runtime::DlpackImport)]`; a generic one imports when its fields do, so check bounds such as `T: dlpack_runtime::Element` on its element type",
    note = "a wrapper around a consumer derives it with `#[dlpack(transparent)]`"
)]
pub trait DlpackImport: Sized {
    /// Builds `Self` from `managed`, taking ownership. On error `managed` has been dropped, so
    /// its deleter has run exactly once.
    ///
    /// # Errors
    ///
    /// [`ImportError`] naming the first check that failed.
    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError>;

    /// Rust-to-Rust exchange: exports `producer` as a versioned tensor and imports it.
    ///
    /// # Errors
    ///
    /// [`ImportError::Export`] when the producer cannot export, otherwise as
    /// [`DlpackImport::from_managed`].
    fn from_dlpack<P: DlpackExport + Send + 'static>(producer: P) -> Result<Self, ImportError> {
        Self::from_managed(producer.into_dlpack()?)
    }

    /// Rust-to-Rust exchange as `request` asks: the Rust spelling of the array API's
    /// `from_dlpack(x, device=..., copy=...)` with the consumer's `stream`. Exports `producer`
    /// with `request` (its `dl_device`, `copy` and `stream`; with the `cuda` feature a
    /// `dl_device` of another CUDA device, or of a CUDA device for host memory, is a copy on
    /// `stream`, a stream of that device) and imports the result.
    ///
    /// # Errors
    ///
    /// [`ImportError::Export`] when the producer cannot serve `request` (such as
    /// [`ExportError::CopyRequired`](crate::ExportError::CopyRequired) for `copy=False` to
    /// another device), otherwise as [`DlpackImport::from_managed`].
    fn from_dlpack_with<P: DlpackExport + Send + 'static>(
        producer: P,
        request: &crate::export::ExportRequest,
    ) -> Result<Self, ImportError> {
        Self::from_managed(producer.into_dlpack_with(request)?)
    }
}

/// A type usable as the `#[dlpack(data)]` field of an imported tensor: it takes ownership of the
/// managed tensor.
///
/// A buffer that is also an [`ExportBuffer`](crate::ExportBuffer) lends, when exported again,
/// the bytes the tensor's layout reaches, from the lowest one, as [`ImportedData<T>`] and
/// [`ManagedTensor`] do: the `offset` and `byte_offset` fields of a derived consumer count from
/// there, so that the type's own export describes the same layout.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold the data of an imported tensor",
    label = "not an `ImportBuffer`",
    note = "imported data is held by `dlpack_runtime::ImportedData<T>` or `dlpack_runtime::ManagedTensor`, or by an enum of them that derives `dlpack_runtime::DlpackImportStorage`"
)]
pub trait ImportBuffer: Sized {
    /// The one dtype every tensor this buffer accepts has, when there is one
    /// ([`ImportedData<T>`](ImportedData): `T`'s); `None` (the default) for buffers that accept
    /// several ([`ManagedTensor`], storage enums). The derive refuses at compile time a
    /// `#[dlpack(dtype = T)]` constraint that contradicts it, which no tensor could meet.
    const ELEMENT_DTYPE: Option<DataType> = None;

    /// Takes ownership of `managed`, whose layout has been validated.
    ///
    /// # Errors
    ///
    /// [`ImportError`] when the tensor does not suit the buffer (for example its dtype);
    /// `managed` is dropped.
    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError>;

    /// Whether [`from_managed`](Self::from_managed) would accept `managed`, asked without taking
    /// it: a storage enum (`#[derive(DlpackImportStorage)]`) tries its variants with it. The
    /// default accepts every tensor.
    ///
    /// # Errors
    ///
    /// The error `from_managed` would return.
    fn accepts(managed: &ManagedTensor) -> Result<(), ImportError> {
        let _ = managed;
        Ok(())
    }

    /// Whether [`borrow_at_import`](Self::borrow_at_import) takes a borrow: `true` for
    /// [`ImportedData<T>`](ImportedData) and for storage enums whose variants all do; `false`
    /// (the default) for buffers that do not borrow, such as [`ManagedTensor`]. The derive
    /// refuses at compile time `#[dlpack(borrow = "...")]` on a consumer whose data field's
    /// buffer does not borrow, which would promise a borrow nothing takes.
    const BORROWS_AT_IMPORT: bool = false;

    /// Takes the borrow of the bytes this buffer's layout reaches as `access`, at import: the
    /// generated import of a consumer marked `#[dlpack(borrow = "shared")]` or
    /// `#[dlpack(borrow = "exclusive")]` calls it right after building its data field, so that
    /// a conflicting borrow refuses the import itself (in Python, the extraction of the
    /// argument, which names it). The borrow is the one the buffer's accesses would take, held
    /// until the buffer is dropped or gives it back (see the [`borrow`](crate::borrow)
    /// module). The default takes none.
    ///
    /// # Errors
    ///
    /// [`ImportError::Layout`] holding [`LayoutError::Borrow`](crate::LayoutError::Borrow) when
    /// another borrow of the same memory conflicts; the buffer is dropped by the caller.
    fn borrow_at_import(&mut self, access: Access) -> Result<(), ImportError> {
        let _ = access;
        Ok(())
    }
}

impl ImportBuffer for ManagedTensor {
    #[inline]
    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError> {
        Ok(managed)
    }
}

/// A type usable as `#[dlpack(shape)]` of an imported tensor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `#[dlpack(shape)]` of an imported tensor",
    note = "shapes are `Vec<usize>`, `Box<[usize]>` or `[usize; N]`; other types implement `dlpack_runtime::FromShape`"
)]
pub trait FromShape: Sized {
    /// Builds the shape from extents in elements (all `>= 0`, validated).
    ///
    /// # Errors
    ///
    /// [`ImportError::Ndim`] when the type has a fixed rank that differs.
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError>;
}

/// A type usable as `#[dlpack(strides)]` of an imported tensor: strides in elements.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the `#[dlpack(strides)]` of an imported tensor",
    note = "strides are `Vec<isize>`, `Box<[isize]>`, `[isize; N]` or `Option` of those, in elements; other types implement `dlpack_runtime::FromStrides`"
)]
pub trait FromStrides: Sized {
    /// Builds the strides from the validated layout (computed when the producer gave NULL).
    ///
    /// # Errors
    ///
    /// [`ImportError::Ndim`] when the type has a fixed rank that differs.
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError>;
}

impl FromShape for Vec<usize> {
    #[inline]
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        // One load per extent: an export that just wrote them wrote them one by one
        // (`crate::abi::words`).
        Ok(shape.iter().map(|e| load(e) as usize).collect())
    }
}
impl FromShape for Box<[usize]> {
    #[inline]
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        Vec::from_shape(shape).map(Vec::into_boxed_slice)
    }
}
impl<const N: usize> FromShape for [usize; N] {
    #[inline]
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        if shape.len() != N {
            return Err(ImportError::Ndim {
                found: shape.len(),
                expected: N,
            });
        }
        // One load per extent, as for `Vec`.
        Ok(core::array::from_fn(|axis| load(&shape[axis]) as usize))
    }
}
impl FromStrides for Vec<isize> {
    #[inline]
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        Ok(match layout.raw_strides() {
            // Validated strides fit in `i64`; on 64-bit targets that is `isize` (on narrower ones
            // the cast truncates as `stride(axis) as isize` always did).
            // One load per stride, as for the shape.
            Some(strides) => strides.iter().map(|s| load(s) as isize).collect(),
            None => (0..layout.ndim())
                .map(|axis| layout.stride(axis) as isize)
                .collect(),
        })
    }
}
impl FromStrides for Box<[isize]> {
    #[inline]
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        Vec::from_strides(layout).map(Vec::into_boxed_slice)
    }
}
impl<S: FromStrides> FromStrides for Option<S> {
    #[inline]
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        S::from_strides(layout).map(Some)
    }
}
impl<const N: usize> FromStrides for [isize; N] {
    #[inline]
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        if layout.ndim() != N {
            return Err(ImportError::Ndim {
                found: layout.ndim(),
                expected: N,
            });
        }
        Ok(match layout.raw_strides() {
            // `ndim == N`: in bounds. Validated strides fit in `i64`; on 64-bit targets that is
            // `isize` (on narrower ones the cast truncates as `stride(axis) as isize` always did).
            // One load per stride, as for the shape.
            Some(strides) => core::array::from_fn(|axis| load(&strides[axis]) as isize),
            None => core::array::from_fn(|axis| layout.stride(axis) as isize),
        })
    }
}

/// Runs one piece of code on the typed data of whichever variant a storage enum holds: the
/// dtype dispatch of a `#[derive(DlpackImportStorage)]` enum (or any enum of one-field variants),
/// written once.
///
/// `dispatch!(value, Enum { A, B, ... } => |data| body)` is
/// `match value { Enum::A(data) => body, Enum::B(data) => body, ... }`: `body` is compiled once
/// per variant, with `data` of that variant's type, so element-specific code (`as f64`,
/// arithmetic) works in it. The enum is named by its name, in scope (`use` it first).
///
/// ```
/// use dlpack_runtime::{DlpackExport, DlpackImport, DlpackImportStorage, ImportedData, dispatch};
///
/// #[derive(DlpackImportStorage)]
/// enum Numbers {
///     F32(ImportedData<f32>),
///     I64(ImportedData<i64>),
/// }
///
/// #[derive(DlpackImport)]
/// struct View {
///     #[dlpack(data)]
///     data: Numbers,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
///     #[dlpack(strides)]
///     strides: Vec<isize>,
/// }
///
/// #[derive(DlpackExport)]
/// struct Column {
///     #[dlpack(data)]
///     values: Vec<i64>,
///     #[dlpack(shape)]
///     shape: [usize; 1],
/// }
///
/// let view = View::from_dlpack(Column { values: vec![1, 2, 3], shape: [3] })?;
/// let total = dispatch!(&view.data, Numbers { F32, I64 } => |data| {
///     data.iter()?.map(|x| x as f64).sum::<f64>()
/// });
/// assert_eq!(total, 6.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[macro_export]
macro_rules! dispatch {
    ($value:expr, $enum:ident { $($variant:ident),+ $(,)? } => |$data:pat_param| $body:expr) => {
        match $value {
            $( $enum::$variant($data) => $body, )+
        }
    };
}
