//! Zero-copy [DLPack](https://dmlc.github.io/dlpack/latest/) exchange for your own Rust tensor
//! types.
//!
//! Annotate the tensor type you already have with `#[derive(DlpackExport)]` and/or
//! `#[derive(DlpackImport)]`, and it can lend its memory to NumPy, PyTorch, JAX, CuPy or another
//! Rust crate, and be built from theirs, without copying. This crate holds the DLPack ABI
//! ([`ffi`]), ownership ([`ManagedTensor`]), validation ([`TensorLayout`]), the stream rules
//! and, behind features, the CUDA (module `cuda`), ROCm/HIP (module `hip`) and Python (module
//! `python`) glue.
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
//! let managed = m.into_dlpack()?;
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
//! Tensor libraries that keep a storage enum over element types (`enum Storage { F32(Vec<f32>),
//! ... }`, shared in an `Arc`, with a start offset in elements) derive `DlpackStorage` for it;
//! consumers declare what they accept as constraints (`#[dlpack(dtype = f32, shape = [_, 3])]`).
//! The derives' attribute tables are on the re-exported derives `DlpackExport`, `DlpackImport`,
//! `DlpackStorage` and `DlpackImportStorage` (feature `derive`).
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
//! | `candle` | no | `candle_core::Tensor` lent zero-copy (`candle::CandleTensor`), candle tensors built from any DLPack tensor (a copy); implies `float8` and `half`; needs Rust 1.94 |
//! | `burn` | no | burn CPU tensors (`burn-ndarray`) lent zero-copy (`burn::BurnTensor`), any backend's tensor lent through its host data (`burn::BurnData`), burn CPU tensors built from any DLPack tensor (zero-copy for C-contiguous host memory); implies `half`; needs Rust 1.92 |
//! | `burn-cuda` | no | burn's CUDA backend (`burn-cuda`, cubecl), fused (`burn_cuda::Cuda` with its default features) or not: its tensors lent zero-copy as CUDA memory after a host wait for burn's work (`burn::cuda::BurnCudaTensor`), and built from any DLPack tensor by a device copy on a stream of this crate; implies `burn` and `cuda`, turns on burn-cuda's `fusion`; needs Rust 1.92 |
//! | `float8` | no | `Element` for `float8::F8E4M3` (`float8_e4m3fn`), `float8::F8E5M2` (`float8_e5m2`) |
//! | `cuda` | no | cudarc (dynamic loading): `#[dlpack(stream)]`, event dependencies, ready events, stream-ordered release, copies of CUDA memory on the consumer's stream (to the host, on the device, to another CUDA device with `dl_device`) and of host memory to a CUDA device, `CudaSlice` buffers; needs Rust 1.88 (cudarc 0.19), the rest of the crate builds on 1.85 |
//! | `hip` | no | ROCm/HIP (module `hip`): `kDLROCM` hand-off ordered by events (`hipStreamWaitEvent`), capture status asked before every host wait, ready events and relays, stream-ordered release (`hip::release_after`), copies of ROCm memory to the host, on the device and to another ROCm device, `HipStream` and `HipSlice`, `python::from_dlpack` of ROCm producers on a consumer HIP stream (with `python`), on a binding loaded at run time from `libamdhip64.so` (builds without ROCm); implies `cuda` (the export machinery is shared: cudarc is compiled, but ROCm work never calls the CUDA driver) |
//!
//! # Safety model
//!
//! - **Who frees what.** A managed tensor is lent by its producer; whoever holds it calls its
//!   `deleter` exactly once (`dlpack.h`, `DLManagedTensorVersioned::deleter`). In Rust that
//!   holder is a [`ManagedTensor`], whose `Drop` calls the deleter, on every path: success,
//!   refusal by validation, refusal of a version. Exported tensors live in one heap block
//!   (header, shape, strides, owner); their deleter drops the owner and frees the block, and
//!   never unwinds across `extern "C"`. A freed block of up to 512 bytes (whose owner needs
//!   no more than 16-byte alignment) is kept by the thread that freed it for its next export of
//!   that size (at most 4 per size, given back to the allocator when the thread exits), so a
//!   thread that exports and drops in turn allocates nothing.
//! - **What is checked.** Imports validate the layout ([`TensorLayout`]): rank, extents,
//!   strides by version, overflow of every extent computation, NULL data, dtype width; typed
//!   access adds dtype, host accessibility, alignment, read-only and `bool` bit patterns.
//!   Exports validate the layout they describe against the buffer's length, so safe code cannot
//!   lend memory it does not own.
//! - **Writes.** An export by value is writable unless its buffer is shared (an `Arc` storage
//!   with other clones) or it is marked read-only (a `readonly` field, the `#[dlpack(readonly)]`
//!   flag); a shared export (`Arc<T>`, a Python object) is read-only
//!   (`DLPACK_FLAG_BITMASK_READ_ONLY`). Imports refuse mutable access to read-only
//!   tensors and to legacy tensors, which cannot say (`DLManagedTensor` has no `flags`).
//! - **Shared memory.** Zero-copy means the producer and the consumer see the same memory.
//!   References handed out by imports ([`ImportedData::as_slice`], ndarray views) assume that
//!   nothing writes the memory while they are borrowed; writes through the producer's own
//!   handle (a NumPy array, say) must not overlap such a borrow.
//! - **Streams.** The `stream` argument is parsed per device as the `stream` parameter of the
//!   array API's
//!   [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html)
//!   lists its values, and illegal values are refused ([`StreamError`]). Types without
//!   stream fields have no pending work on any stream, so there is nothing to order.

#![warn(missing_docs)]

// The layers, lowest first: abi, borrow, tensor, plan, engine, export, import, interop,
// python; each folder uses only those before it (`tests/layers.rs` checks it).
mod abi;
pub mod borrow;
mod engine;
mod export;
mod import;
mod interop;
mod plan;
#[cfg(feature = "python")]
pub mod python;
mod tensor;

pub use abi::ffi;
pub use borrow::BorrowError;
#[cfg(feature = "cuda")]
pub use export::ProducerStream;
pub use export::{
    AsExportBuffer, AsProducerStream, AsShape, AsStrides, BufferAccess, BufferLayout, DlpackExport,
    ExportBuffer, ExportError, ExportParts, ExportRequest, export_with,
};
pub use import::{
    DlpackImport, Elements, FromShape, FromStrides, ImportBuffer, ImportConstraints, ImportError,
    ImportedData, ReadonlyData, ReadwriteData,
};
#[cfg(feature = "candle")]
pub mod candle {
    //! candle interop (feature `candle`): [`candle_core::Tensor`]s lent zero-copy, and candle
    //! tensors built from any DLPack tensor.
    //!
    //! - **Export** ([`CandleTensor`]): a CPU tensor's storage is lent as it is, read-only (candle
    //!   tensors share their storage with every clone, and candle has no read-only flag of its own).
    //!   The export keeps a clone of the tensor, so the storage outlives every consumer; candle's
    //!   layout becomes the DLPack layout: its start offset (in elements) the `byte_offset`, its
    //!   strides (in elements) the `strides`. Narrowed, transposed and broadcast views are lent as
    //!   they are, without a copy.
    //! - **Import** ([`tensor_from_managed`], [`tensor_from_dlpack`], and with the `python` feature
    //!   [`tensor_from_py`]): candle tensors own their storage and cannot borrow foreign memory, so
    //!   the elements are copied into new candle storage, in row-major order (any strides, negative
    //!   and zero included). The producer's deleter runs once the copy is made.
    //!
    //! | candle `DType` | DLPack dtype |
    //! |---|---|
    //! | `U8`, `U32`, `I16`, `I32`, `I64` | `uint8`, `uint32`, `int16`, `int32`, `int64` |
    //! | `F16`, `BF16`, `F32`, `F64` | `float16`, `bfloat16`, `float32`, `float64` |
    //! | `F8E4M3` | `float8_e4m3fn` (`float8::F8E4M3`) |
    //! | `F8E8M0` | `float8_e8m0fnu` (export only: one byte per element) |
    //! | `F6E2M3`, `F6E3M2`, `F4` | none: [`CandleError::CandleDtype`] |
    //!
    //! Memory on candle's CUDA or Metal devices is refused ([`CandleError::Device`]): candle's
    //! device storage is built only with its `cuda` feature, which needs the CUDA toolkit.
    //!
    //! ```
    //! use candle_core::{Device, IndexOp, Tensor};
    //! use dlpack_runtime::candle::{CandleTensor, tensor_from_dlpack};
    //! use dlpack_runtime::{DlpackImport, ImportedData};
    //!
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
    //! let t = Tensor::arange(0f32, 12.0, &Device::Cpu)?.reshape((3, 4))?;
    //! // Rows 1..3, transposed: a view with a start offset of 4 elements, strides (1, 4).
    //! let v = t.i(1..3)?.t()?;
    //! let view = View::from_dlpack(CandleTensor::new(&v)?)?;
    //! assert_eq!((view.shape.as_slice(), view.strides.as_slice()), ([4, 2].as_slice(), [1, 4].as_slice()));
    //! assert_eq!(view.data.to_vec()?, v.flatten_all()?.to_vec1::<f32>()?);
    //!
    //! // And back into candle: a copy, in row-major order.
    //! let back = tensor_from_dlpack(CandleTensor::new(&v)?, &Device::Cpu)?;
    //! assert_eq!(back.to_vec2::<f32>()?, v.to_vec2::<f32>()?);
    //! # Ok::<(), Box<dyn std::error::Error>>(())
    //! ```

    pub use crate::interop::candle::*;
    #[cfg(feature = "python")]
    pub use crate::python::candle::tensor_from_py;
}
#[cfg(feature = "burn")]
pub mod burn {
    //! burn interop (feature `burn`): burn tensors lent to any DLPack consumer, and burn CPU
    //! tensors built from any DLPack producer.
    //!
    //! - **Export, CPU backend** ([`BurnTensor`]): a tensor of `burn_ndarray::NdArray` (any
    //!   kind: `Float`, `Int`, `Bool`) is lent zero-copy, read-only: its storage (an ndarray
    //!   `ArcArray`, or the borrowed bytes of a zero-copy load) moves into the export with the
    //!   tensor, which keeps it alive while any consumer holds it. The layout is ndarray's:
    //!   shape and strides in elements (negative and zero strides included), so transposed,
    //!   sliced, flipped and broadcast tensors are lent as burn holds them (burn-ndarray makes
    //!   some of them copies of its own: `slice`, `flip`, `expand`). burn's CPU storage is
    //!   copy-on-write, so burn never writes memory an export still lends. An autodiff tensor
    //!   (`Autodiff<NdArray>`) is lent through its value: `tensor.inner()`.
    //! - **Export, any backend** ([`BurnData`]): the tensor's host data (`Tensor::into_data`,
    //!   burn's [`TensorData`](burn_tensor::TensorData)), lent read-only, compact row-major.
    //!   For device backends (`burn-cuda`, `burn-wgpu`, ...) that is a copy to host memory,
    //!   made after the device's pending work on the tensor (burn's `into_data` waits for it);
    //!   the consumer gets CPU memory. burn's CUDA backend lends its device memory in place
    //!   with the `burn-cuda` feature (module `burn::cuda`), after a host wait for its work.
    //! - **Import** ([`tensor_from_managed`], [`tensor_from_dlpack`], and with the `python`
    //!   feature [`tensor_from_py`]): a C-contiguous host tensor aligned for its dtype becomes
    //!   a burn CPU tensor without a copy: burn-ndarray keeps foreign memory as borrowed
    //!   storage (`NdArrayStorage::Borrowed`, over [`Bytes`](burn_tensor::Bytes) holding the
    //!   import), reads it in place, never writes it, and copies it into storage of its own
    //!   when an operation needs an owned array. The producer's deleter runs when the last
    //!   tensor holding that storage is dropped. Other layouts (any strides, negative and zero
    //!   included) are copied in row-major order, and the deleter runs once the copy is made.
    //!   [`tensor_data_from_managed`] gives the same data as a `TensorData` for any backend's
    //!   `Tensor::from_data`.
    //!
    //! | burn `DType` | DLPack dtype | CPU tensor kind |
    //! |---|---|---|
    //! | `F64`, `F32` | `float64`, `float32` | `Float` |
    //! | `F16`, `BF16` | `float16`, `bfloat16` | none: burn-ndarray has no such storage; [`BurnData`] and [`tensor_data_from_managed`] carry them |
    //! | `I64`, `I32`, `I16`, `I8` | `int64`, `int32`, `int16`, `int8` | `Int` |
    //! | `U64`, `U32`, `U16`, `U8` | `uint64`, `uint32`, `uint16`, `uint8` | `Int` |
    //! | `Bool` (stored as `bool` or `u8`) | `bool` | `Bool` |
    //! | `Flex32`, `QFloat`, `Bool` stored as `u32` | none: [`BurnError::BurnDtype`], [`BurnError::Quantized`] | |
    //!
    //! ```
    //! use burn_ndarray::NdArray;
    //! use burn_tensor::{Int, Tensor};
    //! use dlpack_runtime::burn::{BurnTensor, tensor_from_dlpack};
    //! use dlpack_runtime::{DlpackImport, ImportedData};
    //!
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
    //! let device = Default::default();
    //! let t = Tensor::<NdArray, 1, Int>::arange(0..6, &device).float().reshape([2, 3]);
    //! // Transposed: a view with strides (1, 3), lent as it is.
    //! let view = View::from_dlpack(BurnTensor::new(t.clone().transpose())?)?;
    //! assert_eq!((view.shape.as_slice(), view.strides.as_slice()), ([3, 2].as_slice(), [1, 3].as_slice()));
    //! assert_eq!(view.data.to_vec()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    //!
    //! // And back into burn: C-contiguous, so burn reads the export's memory in place.
    //! let back: Tensor<NdArray, 2> = tensor_from_dlpack(BurnTensor::new(t.clone())?)?;
    //! assert_eq!(back.into_data(), t.into_data());
    //! # Ok::<(), Box<dyn std::error::Error>>(())
    //! ```

    pub use crate::interop::burn::*;
    #[cfg(feature = "python")]
    pub use crate::python::burn::tensor_from_py;

    #[cfg(feature = "burn-cuda")]
    pub mod cuda {
        //! burn's CUDA backend (feature `burn-cuda`: burn-cuda 0.21, cubecl-cuda 0.10, default
        //! features off but `fusion`): tensors lent as CUDA memory (`kDLCUDA`), and built from
        //! any DLPack tensor, of both CUDA backends ([`CudaPrimitive`]):
        //! - `burn_cuda::Cuda<F, I>` as burn-cuda's default features make it, the fused
        //!   backend `burn_fusion::Fusion<CubeBackend<CudaRuntime, F, I, BT>>`. A fused tensor
        //!   is an entry in fusion's queue of deferred operations: an export first has fusion
        //!   run what it still holds for the tensor (`resolve_tensor_float`, which enqueues the
        //!   kernels on cubecl's streams) and lends the `CubeTensor` it stands for; an import
        //!   registers its copy with fusion as a new tensor, as burn-fusion's `from_data` does.
        //! - `burn_cubecl::CubeBackend<CudaRuntime, F, I, BT>` (`burn_cuda::Cuda` without
        //!   burn-cuda's `fusion` feature).
        //!
        //! - **Export, zero-copy** ([`BurnCudaTensor`]): the tensor's own device memory (the
        //!   address cubecl's client gives for its handle, `ComputeClient::get_resource`), with
        //!   cubecl's layout: shape and strides in elements, as cubecl keeps them (a
        //!   transposed tensor is the same memory with its strides swapped; cubecl's pitched
        //!   layouts pad rows; a slice that burn keeps as a view, where its offset is a multiple
        //!   of cubecl's memory alignment, starts at its handle's offset, and other slices are
        //!   copies burn made with a kernel). Read-only: burn writes a buffer in place only
        //!   through its sole handle, and the export holds one, with the client, until the
        //!   consumer releases it.
        //! - **Ordering, by a host wait.** DLPack orders a producer's pending work before the
        //!   consumer's stream with an event: record on the producer's stream, wait on the
        //!   consumer's (the `cuda` module docs). cubecl enqueues burn's work on streams of its
        //!   own (one per host thread, `StreamId::current()`) and hands out neither those streams
        //!   nor an event recorded on them, so [`BurnCudaTensor::new`] waits on the host instead:
        //!   it asks the client for the handle's memory from this thread (which makes this
        //!   thread's cubecl stream wait for the stream that last wrote the tensor) and then
        //!   synchronizes that stream (`ComputeClient::sync`). **Cost: one host wait per export,
        //!   for all of the work queued on that cubecl stream, not only the tensor's**; any
        //!   consumer stream then reads finished values, and the `stream` of the request needs
        //!   nothing more. A caller that has already waited (one `B::sync(&device)` before many
        //!   exports) skips it with `unsafe` [`BurnCudaTensor::from_primitive_unsynchronized`].
        //!   To make the export non-blocking, cubecl would have to expose, for a tensor's handle,
        //!   either the `CUstream` of the work that writes it (the exporter would record an
        //!   event there and make the consumer's stream wait on it) or such an event itself (a
        //!   `CUevent` recorded after that work, as cubecl already records internally to order
        //!   its own streams, `Fence` in cubecl-cuda).
        //! - **Import, a device copy** ([`tensor_from_managed`], [`tensor_from_dlpack`], and
        //!   with the `python` feature `tensor_from_py`, which runs the host waits without the
        //!   GIL):
        //!   cubecl's storage allocates and frees its own memory (`cuMemAllocAsync` on its
        //!   stream, into pools it reuses) and has no way to hold memory it did not allocate, so
        //!   burn cannot keep a producer's memory: the elements are copied. The memory is
        //!   allocated through the tensor's client (`ComputeClient::empty`) and the host waits for
        //!   cubecl's stream (the allocation, and earlier users of pooled memory, are then done);
        //!   the producer is asked to order its work before a stream of this crate
        //!   ([`consumer_stream`], passed as the export's `stream`; events the tensor carries are
        //!   waited on too); the copy runs on that stream (one driver copy per 2-D block of any
        //!   strides, into compact row-major memory); the host waits for the stream; the
        //!   producer's deleter runs; and only then is the tensor handed to burn, whose stream
        //!   this crate cannot order after its own. Two host waits per import. Host memory is
        //!   uploaded by burn itself (`Tensor::from_data`). Memory of another CUDA device is
        //!   asked for on the burn device (`dl_device`), which this crate's producers serve
        //!   with a copy between devices.
        //!
        //! | DLPack dtype | CUDA backend tensor kind |
        //! |---|---|
        //! | `float32`, `float16`, `bfloat16` | `Float` (`float64` is refused: burn-cuda registers no `F64`) |
        //! | `int8` to `int64`, `uint8` to `uint64` | `Int` |
        //! | `bool` | `Bool`, where the device's burn bool dtype is one byte (`BoolStore::U8`, burn-cuda's default) |
        //!
        //! Exports carry every dtype of the table in the [`burn`](super) module docs that the
        //! tensor has (burn-cuda's bools are `Bool(U8)`, lent as `bool`).
        //!
        //! The tests on the CUDA simulator (`tests/tests/burn_cuda.rs`) cover what is this
        //! crate's: the wait before export and the ordering of the import, with the simulator's
        //! checker, and their negative controls; burn's kernels need NVRTC and a GPU, so the
        //! round trips through burn's operations run in `scripts/gpu-suite.sh`.

        pub use crate::interop::burn_cuda::*;
        #[cfg(feature = "python")]
        pub use crate::python::burn_cuda::tensor_from_py;
    }
}
#[cfg(feature = "cuda")]
pub use interop::cuda;
#[cfg(feature = "hip")]
pub use interop::hip;
pub use plan::cai::CaiError;
pub use plan::stream::StreamError;
pub use tensor::device::{Device, DeviceType};
pub use tensor::dtype::{DataType, DataTypeCode, Element};
pub use tensor::layout::{ByteSpan, Contiguity, LayoutError, MAX_NDIM, TensorLayout};
pub use tensor::managed::{HeaderError, ManagedTensor, RawManagedTensor, Writability};

/// Derives [`DlpackExport`](trait@DlpackExport): the type becomes a DLPack producer.
///
/// Field roles, each a bare keyword in `#[dlpack(...)]` on one field:
///
/// | attribute | meaning | accepted types | example |
/// |---|---|---|---|
/// | `data` | the buffer (required, once); the dtype is its element type unless a `dtype` field says otherwise; a buffer with a layout of its own (`ndarray::Array`, [`ExportBuffer::own_layout`]) exports that layout, and the shape, strides and offset fields must agree with it ([`ExportError::BufferLayout`]) | [`AsExportBuffer`]: `Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `Arc<Vec<T>>`, `ndarray::Array<T, D>` (feature `ndarray`), any [`ExportBuffer`], a storage enum deriving [`DlpackStorage`], `Arc<S>` of any of these | `#[dlpack(data)] storage: Arc<Storage>` |
/// | `shape` | extents in elements (required, once) | [`AsShape`]: `Vec<usize>`, `[usize; N]`, `Box<[usize]>` | `#[dlpack(shape)] dims: Vec<usize>` |
/// | `strides` | strides in elements, signed; compact row-major when absent or `None` | [`AsStrides`]: `Vec<isize>`, `[isize; N]`, `Box<[isize]>`, `Option<_>` of those | `#[dlpack(strides)] stride: Vec<isize>` |
/// | `offset` | start offset in **elements** from the start of the `data` field's buffer to element `(0, ..., 0)`; converted to bytes with overflow checks; the same meaning on import ([`DlpackImport`] (derive)) | `usize` | `#[dlpack(offset)] start_offset: usize` |
/// | `byte_offset` | the same offset in **bytes** (a multiple of the element size); not together with `offset` | `usize` | `#[dlpack(byte_offset)] byte_offset: usize` |
/// | `dtype` | the exported dtype, for storage whose element type is erased (bytes holding float16, say); the layout is checked against the buffer's length in bytes | [`DataType`] | `#[dlpack(dtype)] dtype: DataType` |
/// | `device` | the device; must agree with the buffer's (checked at export) | [`Device`] | `#[dlpack(device)] device: Device` |
/// | `readonly` | `true` exports read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`) | `bool` | `#[dlpack(readonly)] frozen: bool` |
/// | `stream` | a stream with pending work on the data (feature `cuda`; several fields allowed): the consumer's stream is made to wait on an event recorded there | [`AsProducerStream`]: cudarc `CudaStream`, `Arc<CudaStream>`, `Option<_>`; with the `hip` feature `HipStream`, `Arc<HipStream>` (for ROCm tensors) | `#[dlpack(stream)] stream: Arc<CudaStream>` |
///
/// Container options, on the struct:
///
/// | attribute | meaning | example |
/// |---|---|---|
/// | `crate = "path"` | the path of `dlpack_runtime` when it is renamed or re-exported | `#[dlpack(crate = "dl")]` |
/// | `readonly` | every export is read-only (no `readonly` field then) | `#[dlpack(readonly)]` |
/// | `transparent` | the struct's one field is the tensor: the impl forwards to the field's own `DlpackExport` (a `#[pyclass]` wrapper around another crate's tensor type); no field roles then | `#[dlpack(transparent)]` |
///
/// Consumer constraints (`dtype = ...`, `shape = [...]`, ...) belong to [`DlpackImport`]
/// (derive): on a type that only derives `DlpackExport` they are a compile error.
///
/// Exports: [`DlpackExport::into_dlpack`] moves the value into the managed tensor (writable unless
/// a shared buffer, a `readonly` field or the flag says otherwise); an `Arc` of the value is a
/// shared export, read-only, that keeps the `Arc` alive while any consumer holds the tensor.
/// Generics, lifetimes, where clauses and tuple structs (`#[dlpack(data)] Vec<f32>` on field
/// `.0`) are supported; the generated code holds no `unsafe`.
///
/// ```
/// use std::sync::Arc;
/// use dlpack_runtime::{Device, DlpackExport, DlpackImport, DlpackStorage, ImportedData};
///
/// #[derive(DlpackStorage)]
/// enum Storage {
///     F32(Vec<f32>),
///     F64(Vec<f64>),
/// }
///
/// /// A candle-like tensor: shared storage, a layout with a start offset, a device.
/// #[derive(DlpackExport)]
/// struct Tensor {
///     #[dlpack(data)]
///     storage: Arc<Storage>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
///     #[dlpack(strides)]
///     stride: Vec<isize>,
///     #[dlpack(offset)]
///     start_offset: usize,
///     #[dlpack(device)]
///     device: Device,
/// }
///
/// // Row 1 of a 2x3 matrix: start offset 3 elements.
/// let t = Tensor {
///     storage: Arc::new(Storage::F64(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0])),
///     shape: vec![3],
///     stride: vec![1],
///     start_offset: 3,
///     device: Device::CPU,
/// };
///
/// #[derive(DlpackImport)]
/// struct Row {
///     #[dlpack(data)]
///     data: ImportedData<f64>,
///     #[dlpack(shape)]
///     shape: [usize; 1],
/// }
///
/// let row = Row::from_dlpack(t)?;
/// assert_eq!(row.data.as_slice()?, [3.0, 4.0, 5.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackExport;

/// Derives [`DlpackImport`](trait@DlpackImport): the type becomes a DLPack consumer.
///
/// Field roles (other fields are filled with `Default::default()`):
///
/// | attribute | meaning | accepted types | example |
/// |---|---|---|---|
/// | `data` | owns the imported tensor (required, once); fixes the dtype | [`ImportBuffer`]: [`ImportedData<T>`], [`ManagedTensor`] (any dtype), an enum of those deriving [`DlpackImportStorage`] | `#[dlpack(data)] data: ImportedData<f32>` |
/// | `shape` | receives the extents (required, once) | [`FromShape`]: `Vec<usize>`, `Box<[usize]>`, `[usize; N]` (fixes `ndim`) | `#[dlpack(shape)] shape: [usize; 2]` |
/// | `strides` | receives the strides in elements; **when absent the import requires C-contiguous data** | [`FromStrides`]: `Vec<isize>`, `Box<[isize]>`, `[isize; N]`, `Option<_>` | `#[dlpack(strides)] strides: Vec<isize>` |
/// | `offset` | receives the start offset in **elements** from the start of the `data` field's buffer to element `(0, ..., 0)`, as on export: counted from the first byte the layout reaches, which is where the data lends its bytes from ([`ImportedData::start_offset`]); 0 unless some stride is negative, and for empty tensors; a non-zero offset of a dtype whose elements are not whole bytes is refused | `usize` | `#[dlpack(offset)] start: usize` |
/// | `byte_offset` | the same offset in **bytes** (not `DLTensor::byte_offset`, which the data field applies); not together with `offset` | `usize` | `#[dlpack(byte_offset)] byte_offset: usize` |
/// | `dtype` | receives the dtype (useful with `data: ManagedTensor`) | [`DataType`] | `#[dlpack(dtype)] dtype: DataType` |
/// | `device` | receives the device | [`Device`] | `#[dlpack(device)] device: Device` |
/// | `readonly` | receives whether the tensor is read-only (flagged, or legacy) | `bool` | `#[dlpack(readonly)] read_only: bool` |
///
/// `offset` and `byte_offset` mean the same in both derives: where element `(0, ..., 0)` lies in
/// the `data` field's buffer. An imported buffer ([`ImportedData<T>`], [`ManagedTensor`], an
/// enum of them) is lent on, when exported again, as the bytes its layout reaches, from the
/// lowest one; the import fills the field with the offset from there, which is what the export
/// of the same data needs to describe the same layout. A type that derives both directions
/// thus re-exports every layout it imported: negative strides, narrowed, transposed and
/// broadcast views, 0-d and empty tensors.
///
/// ```
/// use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
///
/// /// Imported memory, kept and lent on: a type that derives both directions.
/// #[derive(DlpackExport, DlpackImport)]
/// struct Relay {
///     #[dlpack(data)]
///     data: ImportedData<f32>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
///     #[dlpack(strides)]
///     strides: Vec<isize>,
///     #[dlpack(offset)]
///     offset: usize,
/// }
///
/// /// A 3x4 matrix of 0..12 flipped along axis 0: element (0, 0) is buffer element 8.
/// #[derive(DlpackExport)]
/// struct Flipped {
///     #[dlpack(data)]
///     values: Vec<f32>,
///     #[dlpack(shape)]
///     shape: [usize; 2],
///     #[dlpack(strides)]
///     strides: [isize; 2],
///     #[dlpack(offset)]
///     offset: usize,
/// }
///
/// let values = (0..12).map(|v| v as f32).collect();
/// let relay = Relay::from_dlpack(Flipped { values, shape: [3, 4], strides: [-4, 1], offset: 8 })?;
/// // The import lends the 12 elements its layout reaches; element (0, 0) is 8 into them.
/// assert_eq!((relay.offset, relay.data.start_offset()?), (8, 8));
/// let again = Relay::from_dlpack(relay)?;
/// assert_eq!(again.data.to_vec()?[..5], [8.0, 9.0, 10.0, 11.0, 4.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Container options: `crate = "path"` and `transparent` (forward to the one field's own
/// `DlpackImport`) as for `DlpackExport`, and **consumer constraints**,
/// checked once at import, before any data is read, each failing with a typed [`ImportError`]
/// that names what was found and what was expected (in the spirit of nanobind's
/// `ndarray<float, shape<-1, 3>, c_contig, device::cpu>`):
///
/// | constraint | requires | error | example |
/// |---|---|---|---|
/// | `dtype = T` | elements of the Rust element type `T` ([`Element`]) | [`ImportError::Dtype`] | `#[dlpack(dtype = f32)]` |
/// | `ndim = N` | `N` axes | [`ImportError::Ndim`] | `#[dlpack(ndim = 2)]` |
/// | `shape = [..]` | one entry per axis, an extent or `_` for any; implies `ndim` | [`ImportError::Shape`] | `#[dlpack(shape = [_, 3])]` |
/// | `contiguous = "C" \| "F" \| "any"` | compact row-major, column-major, or either; `"F"` and `"any"` need a `strides` field | [`ImportError::Layout`] | `#[dlpack(contiguous = "F")]` |
/// | `device = "cpu" \| "cuda" \| "rocm"` | memory of that device type, any ordinal | [`ImportError::Device`] | `#[dlpack(device = "cpu")]` |
/// | `writable` | a writable tensor (versioned, not flagged read-only) | [`ImportError::ReadOnly`] | `#[dlpack(writable)]` |
///
/// Contradictions are compile errors: `ndim` against `shape`, either against a `[usize; N]`
/// shape field, `contiguous = "F"` without a strides field, `dtype = T` against a data field
/// `ImportedData<U>` of another element type, and the export flag `#[dlpack(readonly)]` on a
/// type that does not also derive `DlpackExport`.
///
/// On both derives, a role field of another type than its role holds is an error at the field
/// saying what the role holds; `#[repr(packed)]` structs (whose fields may be unaligned), an
/// empty `#[dlpack()]` and a data field of zero-lane elements (`Vec<[f32; 0]>`) are refused.
///
/// ```
/// use dlpack_runtime::{DataType, DlpackExport, DlpackImport, ImportError, ManagedTensor};
///
/// #[derive(DlpackExport)]
/// struct Matrix {
///     #[dlpack(data)]
///     values: Vec<f32>,
///     #[dlpack(shape)]
///     shape: [usize; 2],
/// }
///
/// /// Float32 points in 3-d, row-major, on the host.
/// #[derive(DlpackImport)]
/// #[dlpack(dtype = f32, shape = [_, 3], device = "cpu")]
/// struct Points {
///     #[dlpack(data)]
///     managed: ManagedTensor,
///     #[dlpack(shape)]
///     shape: [usize; 2],
///     #[dlpack(dtype)]
///     dtype: DataType,
/// }
///
/// let points = Points::from_dlpack(Matrix { values: vec![0.0; 6], shape: [2, 3] })?;
/// assert_eq!((points.shape, points.dtype), ([2, 3], DataType::F32));
///
/// let err = Points::from_dlpack(Matrix { values: vec![0.0; 6], shape: [3, 2] }).err().unwrap();
/// assert_eq!(err.to_string(), "tensor has shape [3, 2], expected [_, 3]");
/// # Ok::<(), ImportError>(())
/// ```
///
/// # Borrowing at import: `borrow = "shared" | "exclusive"`
///
/// An [`ImportedData`] borrows the bytes it reaches at its first access (see [`borrow`]). The
/// container option `borrow` makes the import take that borrow at once, right after it builds
/// the data field: `"shared"` for a consumer that reads, `"exclusive"` for one that writes (it
/// requires `writable`). A conflicting borrow then refuses the import itself, with
/// [`ImportError::Layout`] holding [`LayoutError::Borrow`], and the managed tensor is dropped.
/// The borrow is the import's: it lasts until the value is dropped (or its data gives it back
/// with [`ImportedData::release_borrow`]), the semantics of rust-numpy's `PyReadonlyArray` and
/// `PyReadwriteArray`.
///
/// Use it for the arguments of a `#[pyfunction]`: pyo3 builds them before the body runs, so
/// `f(x, x)` for `fn f(a: ViewMut, b: ViewMut)` fails while extracting `b`, with a
/// `BufferError` that carries pyo3's note `while processing 'b'` (printed by tracebacks since
/// Python 3.11), rather than at the first access inside the body, where the error names byte
/// ranges only. Leave it out for imports that are kept and accessed later, or not at all (a
/// relay lent on, a holder that borrows shared or exclusively as asked): without it an import
/// that is never accessed never borrows. The data field must borrow: [`ImportedData<T>`], or a
/// storage enum ([`DlpackImportStorage`]) whose variants all hold one; a [`ManagedTensor`]
/// takes no borrow, and the option on it is a compile error, as is `"exclusive"` without
/// `writable` or any other value. Memory the host cannot read (device memory) has no borrow to
/// take.
///
/// ```
/// use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
///
/// /// A writable view that borrows its memory exclusively as soon as it is imported.
/// #[derive(DlpackImport)]
/// #[dlpack(writable, borrow = "exclusive")]
/// struct ViewMut {
///     #[dlpack(data)]
///     data: ImportedData<f32>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
/// }
///
/// #[derive(DlpackExport)]
/// struct Column {
///     #[dlpack(data)]
///     values: Vec<f32>,
///     #[dlpack(shape)]
///     shape: [usize; 1],
/// }
///
/// let mut view = ViewMut::from_dlpack(Column { values: vec![0.0; 3], shape: [3] })?;
/// view.data.as_slice_mut()?[0] = 1.0;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackImport;

/// Derives [`AsExportBuffer`] for a storage enum whose variants each hold one buffer (or for a
/// struct with one field), so that it, or an `Arc` of it, can be the `#[dlpack(data)]` of a
/// [`DlpackExport`] (derive) type. The generated impl is safe code: it matches on the variant and
/// lends that variant's buffer.
///
/// | input | meaning | accepted variant types | example |
/// |---|---|---|---|
/// | `enum` with one field per variant | each variant is one way to hold the data | [`AsExportBuffer`]: any buffer, `Arc` of one, another storage | `F32(Vec<f32>)`, `Shared { values: Arc<[f64]> }` |
/// | `struct` with one field | a wrapper around one buffer | as above | `struct Bytes(Vec<u8>);` |
/// | `#[dlpack(crate = "path")]` | the runtime's path, as for the tensor derives | | `#[dlpack(crate = "dl")]` |
///
/// Exports by value are writable when the variant's buffer allows it (`Arc`: while unique).
/// A variant for device memory needs a buffer type whose [`ExportBuffer::device`] says so.
///
/// ```
/// use dlpack_runtime::{AsExportBuffer, DataType, DlpackStorage};
///
/// #[derive(DlpackStorage)]
/// enum Storage {
///     F32(Vec<f32>),
///     I64(Vec<i64>),
/// }
///
/// assert_eq!(Storage::I64(vec![1, 2]).as_export_buffer().dtype(), DataType::I64);
/// ```
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackStorage;

/// Derives [`ImportBuffer`] for an enum whose variants each hold one imported buffer (or for a
/// struct with one field): importing asks each variant's buffer, in declaration order, whether it
/// accepts the tensor ([`ImportBuffer::accepts`]: `ImportedData<f32>` accepts float32), and
/// builds the first that does. When none does, the error is [`ImportError::NoVariant`], naming
/// each variant's reason, and the tensor's deleter has run. The storage borrows at import
/// ([`ImportBuffer::borrow_at_import`], for a consumer marked `#[dlpack(borrow = "...")]`) when
/// every variant's buffer does, through the variant it holds.
///
/// | input | meaning | accepted variant types | example |
/// |---|---|---|---|
/// | `enum` with one field per variant | one variant per accepted dtype | [`ImportBuffer`]: [`ImportedData<T>`], [`ManagedTensor`] (accepts all: put it last) | `F16(ImportedData<half::f16>)` |
/// | `struct` with one field | a wrapper around one imported buffer | as above | `struct Floats(ImportedData<f32>);` |
/// | `#[dlpack(crate = "path")]` | the runtime's path | | `#[dlpack(crate = "dl")]` |
///
/// ```
/// use dlpack_runtime::{DlpackExport, DlpackImport, DlpackImportStorage, ImportedData};
///
/// #[derive(DlpackImportStorage)]
/// enum Floats {
///     F32(ImportedData<f32>),
///     F64(ImportedData<f64>),
/// }
///
/// #[derive(DlpackImport)]
/// struct View {
///     #[dlpack(data)]
///     data: Floats,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
/// }
///
/// #[derive(DlpackExport)]
/// struct Column {
///     #[dlpack(data)]
///     values: Vec<f64>,
///     #[dlpack(shape)]
///     shape: [usize; 1],
/// }
///
/// let view = View::from_dlpack(Column { values: vec![0.5, 1.5], shape: [2] })?;
/// let Floats::F64(data) = view.data else { unreachable!("float64 data") };
/// assert_eq!(data.to_vec()?, [0.5, 1.5]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "derive")]
pub use dlpack_derive::DlpackImportStorage;

#[doc(hidden)]
pub mod __private;
#[doc(hidden)]
pub mod __testing;
