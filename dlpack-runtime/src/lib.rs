//! Zero-copy [DLPack](https://dmlc.github.io/dlpack/latest/) exchange for your own Rust tensor
//! types.
//!
//! Annotate the tensor type you already have with `#[derive(DlpackExport)]` and/or
//! `#[derive(DlpackImport)]`, and it can lend its memory to NumPy, PyTorch, JAX, CuPy or another
//! Rust crate, and be built from theirs, without copying. This crate holds the DLPack ABI
//! ([`ffi`]), ownership ([`ManagedTensor`]), validation ([`layout`]), the stream rules
//! ([`stream`]) and, behind features, the Python glue.
//!
//! # Quick start
//!
//! ```
//! use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
//!
//! /// A tensor type of your own: a buffer and a shape.
//! #[derive(DlpackExport)]
//! struct Matrix {
//!     #[dlpack(data)]
//!     values: Vec<f32>,
//!     #[dlpack(shape)]
//!     shape: [usize; 2],
//! }
//!
//! /// A consumer that accepts any strided float32 tensor.
//! #[derive(DlpackImport)]
//! struct View {
//!     #[dlpack(data)]
//!     data: ImportedData<f32>,
//!     #[dlpack(shape)]
//!     shape: Vec<usize>,
//!     #[dlpack(strides)]
//!     strides: Vec<isize>,
//! }
//!
//! let m = Matrix { values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], shape: [2, 3] };
//! let address = m.values.as_ptr();
//!
//! // Export: `m` moves into a DLManagedTensorVersioned (one allocation, no copy) ...
//! let managed = m.to_dlpack()?;
//! // ... and import: validated once, then read in place.
//! let view = View::from_managed(managed)?;
//! assert_eq!(view.shape, [2, 3]);
//! assert_eq!(view.strides, [3, 1]);
//! assert_eq!(view.data.as_ptr(), address);
//! assert_eq!(view.data.get(&[1, 2])?, 6.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With the `python` feature, the same types speak `__dlpack__` / `from_dlpack` to NumPy and
//! friends: see the `python` module.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `derive` | yes | `#[derive(DlpackExport)]`, `#[derive(DlpackImport)]` |
//! | `python` | no | pyo3 glue: `__dlpack__`, `__dlpack_device__`, `from_dlpack`, capsules |
//! | `ndarray` | no | `ImportedData::as_array(_mut)` views; `ndarray::Array` as a producer |
//! | `half` | no | `Element` for `half::f16`, `half::bf16` |
//! | `num-complex` | no | `Element` for `num_complex::Complex<f32>`, `Complex<f64>` |
//!
//! # Safety model
//!
//! - **Who frees what.** A managed tensor is lent by its producer; whoever holds it calls its
//!   `deleter` exactly once (spec section 1.11). In Rust that holder is a [`ManagedTensor`],
//!   whose `Drop` calls the deleter, on every path: success, refusal by validation, refusal of a
//!   version. Exported tensors live in one heap block (header, shape, strides, owner); their
//!   deleter drops the owner and frees the block, and never unwinds across `extern "C"`.
//! - **What is checked.** Imports validate the layout ([`layout::validate`]): rank, extents,
//!   strides by version, overflow of every extent computation, NULL data, dtype width; typed
//!   access adds dtype, host accessibility, alignment, read-only and `bool` bit patterns.
//!   Exports validate the layout they describe against the buffer's length, so safe code cannot
//!   lend memory it does not own.
//! - **Writes.** An export by value is writable; a shared export (`Arc<T>`, a Python object) is
//!   read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`). Imports refuse mutable access to read-only
//!   tensors and to legacy tensors, which cannot say (spec section 1.12).
//! - **Shared memory.** Zero-copy means the producer and the consumer see the same memory.
//!   References handed out by imports ([`ImportedData::as_slice`], ndarray views) assume that
//!   nothing writes the memory while they are borrowed; writes through the producer's own
//!   handle (a NumPy array, say) must not overlap such a borrow.
//! - **Streams.** The `stream` argument is parsed by the table of spec section 2.4 and illegal
//!   values are refused ([`stream::parse_stream`]). Types without stream fields have no pending
//!   work on any stream, so there is nothing to order.
//!
//! Spec references ("spec section N") point to the DLPack reference: `dlpack.h` 1.3, the Python
//! specification and the array API standard, as summarized in the project's `dlpack-spec.md`.

#![warn(missing_docs)]

pub mod device;
pub mod dtype;
pub mod error;
pub mod export;
pub mod ffi;
pub mod import;
pub mod layout;
pub mod managed;
#[cfg(feature = "ndarray")]
pub mod ndarray;
#[cfg(feature = "python")]
pub mod python;
pub mod stream;

pub use device::{Device, DeviceType};
pub use dtype::{DataType, DataTypeCode, Element};
pub use error::{ExportError, ImportError, LayoutError, StreamError};
pub use export::{AsShape, AsStrides, DlpackExport, ExportBuffer, ExportParts, ExportRequest};
pub use import::{
    DlpackImport, FromShape, FromStrides, ImportBuffer, ImportConstraints, ImportedData,
};
pub use layout::Contiguity;
pub use managed::{ManagedTensor, RawManagedTensor, Writability};

/// Derives [`DlpackExport`](trait@DlpackExport): the type becomes a DLPack producer.
///
/// Field roles, each a bare keyword in `#[dlpack(...)]`:
///
/// | attribute | meaning | accepted types |
/// |---|---|---|
/// | `data` | the buffer (required, once); the dtype is its element type | [`ExportBuffer`]: `Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `Arc<Vec<T>>` |
/// | `shape` | extents in elements (required, once) | [`AsShape`]: `Vec<usize>`, `[usize; N]`, `Box<[usize]>` |
/// | `strides` | strides in elements, signed; compact row-major when absent | [`AsStrides`]: `Vec<isize>`, `[isize; N]`, `Box<[isize]>`, `Option<_>` |
/// | `byte_offset` | bytes from the buffer start to element `(0, ..., 0)` | `usize` |
/// | `device` | the device; must agree with the buffer's | [`Device`] |
///
/// Container option: `#[dlpack(crate = "path")]` when `dlpack_runtime` is renamed.
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackExport;

/// Derives [`DlpackImport`](trait@DlpackImport): the type becomes a DLPack consumer.
///
/// | attribute | meaning | accepted types |
/// |---|---|---|
/// | `data` | owns the imported tensor (required, once); fixes the dtype | [`ImportBuffer`]: [`ImportedData<T>`], [`ManagedTensor`] |
/// | `shape` | receives the extents (required, once) | [`FromShape`]: `Vec<usize>`, `Box<[usize]>`, `[usize; N]` (fixes `ndim`) |
/// | `strides` | receives the strides in elements; **when absent the import requires C-contiguous data** | [`FromStrides`]: `Vec<isize>`, `Box<[isize]>`, `[isize; N]`, `Option<_>` |
/// | `byte_offset` | receives `DLTensor::byte_offset` in bytes (informational: the data field already applies it) | `usize` |
/// | `device` | receives the device | [`Device`] |
///
/// Other fields are filled with `Default::default()`. Container option:
/// `#[dlpack(crate = "path")]`.
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackImport;

#[doc(hidden)]
pub mod __private;
