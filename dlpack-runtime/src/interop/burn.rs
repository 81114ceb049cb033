//! burn interop: the items of `dlpack_runtime::burn` (documented there, at the crate root).

use core::ffi::c_void;

use burn_ndarray::NdArrayTensor;
use burn_tensor::backend::Backend;
use burn_tensor::{
    AllocationProperty, BasicOps, BoolStore, Bytes, DType, Tensor, TensorData, TensorPrimitive,
};

use crate::export::{DlpackExport, ExportBuffer, ExportError, ExportParts};
use crate::import::{ImportBuffer, ImportError, ImportedData};
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::ManagedTensor;

/// The storage of an `NdArrayStorage` (burn-ndarray's owned or borrowed storage, a type it
/// does not name publicly) lent read-only, through its view.
macro_rules! lend {
    ($storage:expr) => {{
        // `view` reads the storage in place, owned (`ArcArray`) or borrowed (`Bytes`).
        let view = $storage.view();
        lend(view.as_ptr(), view.shape(), view.strides())
    }};
}

/// Why a burn tensor cannot be exported, or a DLPack tensor cannot become a burn tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BurnError {
    /// A burn dtype with no DLPack counterpart here (quantized, `Flex32`, bools stored as
    /// 32-bit integers).
    #[error(
        "burn dtype {0:?} has no DLPack dtype, expected F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8 or Bool"
    )]
    BurnDtype(DType),
    /// A DLPack dtype with no burn dtype.
    #[error(
        "DLPack dtype {found} has no burn dtype, expected float64, float32, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8 or bool"
    )]
    Dtype {
        /// The tensor's dtype.
        found: DataType,
    },
    /// A DLPack dtype that the burn tensor kind asked for cannot hold on the backend that
    /// imports it: `burn-ndarray` keeps floats as float32 or float64 only, integers in `Int`
    /// tensors and bools in `Bool` tensors; `burn-cuda` keeps floats as float32, float16 or
    /// bfloat16.
    #[error("a DLPack {found} tensor cannot become a {backend} {kind} tensor, expected {expected}")]
    Kind {
        /// The tensor's dtype.
        found: DataType,
        /// The burn backend that imports it (`"burn-ndarray"`, `"burn-cuda"`).
        backend: &'static str,
        /// The burn tensor kind asked for (`Float`, `Int` or `Bool`).
        kind: &'static str,
        /// The DLPack dtypes that kind accepts, in words.
        expected: &'static str,
    },
    /// The burn tensor asked for has rank 0 (`D` is 0): burn has no rank-0 tensors (its
    /// `Tensor::from_data` panics on one), so a DLPack scalar is refused here instead.
    #[error(
        "burn has no rank-0 tensors: a DLPack tensor cannot become a burn tensor of rank 0, expected a rank of 1 or more (reshape a scalar to [1] first)"
    )]
    RankZero,
    /// The DLPack tensor's rank is not the burn tensor's `D`.
    #[error("a DLPack tensor of rank {found} cannot become a burn tensor of rank {expected}")]
    Rank {
        /// The DLPack tensor's `ndim`.
        found: usize,
        /// The burn tensor's rank `D`.
        expected: usize,
    },
    /// The burn tensor is quantized: its storage holds quantized values and their scales, which
    /// DLPack cannot describe as one tensor.
    #[error("a quantized burn tensor cannot be lent, dequantize it first")]
    Quantized,
    /// burn's host data is not aligned for its element type.
    #[error("burn host data at {address:#x} is not aligned to {align} bytes for {dtype}")]
    Misaligned {
        /// The address of the data.
        address: usize,
        /// The alignment of the element type, in bytes.
        align: usize,
        /// The dtype.
        dtype: DataType,
    },
    /// The DLPack tensor cannot be read (its layout, or memory the host cannot reach).
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The producer could not export.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A driver call of this crate failed (feature `burn-cuda`).
    #[cfg(feature = "burn-cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::engine::cuda::CudaError),
    /// burn's CUDA backend (cubecl) reported an error (feature `burn-cuda`).
    #[cfg(feature = "burn-cuda")]
    #[error("burn's CUDA backend failed: {reason}")]
    Backend {
        /// cubecl's message.
        reason: String,
    },
    /// The DLPack tensor's memory is on another device than the burn device asked for
    /// (feature `burn-cuda`).
    #[cfg(feature = "burn-cuda")]
    #[error(
        "a DLPack tensor on {found} cannot become a burn tensor on {expected} without a copy between devices, expected memory on {expected} or the host"
    )]
    Device {
        /// The device of the tensor's memory.
        found: crate::tensor::device::Device,
        /// The burn tensor's device.
        expected: crate::tensor::device::Device,
    },
}

impl From<LayoutError> for BurnError {
    fn from(err: LayoutError) -> Self {
        Self::Import(err.into())
    }
}

/// The DLPack dtype of a burn dtype, if it has one.
pub(super) fn dlpack_dtype(dtype: DType) -> Option<DataType> {
    Some(match dtype {
        DType::F64 => DataType::F64,
        DType::F32 => DataType::F32,
        DType::F16 => DataType::F16,
        DType::BF16 => DataType::BF16,
        DType::I64 => DataType::I64,
        DType::I32 => DataType::I32,
        DType::I16 => DataType::I16,
        DType::I8 => DataType::I8,
        DType::U64 => DataType::U64,
        DType::U32 => DataType::U32,
        DType::U16 => DataType::U16,
        DType::U8 => DataType::U8,
        // One byte per element, 0 or 1: DLPack's `bool` (`kDLBool`, 8 bits).
        DType::Bool(BoolStore::Native | BoolStore::U8) => DataType::BOOL,
        _ => return None,
    })
}

/// The memory of a burn CPU tensor, lent read-only: the address of its lowest element, the
/// length in bytes of the span from there to the end of its highest element, and its dtype.
struct Lent {
    ptr: *const c_void,
    byte_len: usize,
    dtype: DataType,
}

// SAFETY: a `Lent` is made by `lend` for a `BurnTensor` and by `BurnData::new`, and lives
// beside what owns its memory, never mutated:
// - In a `BurnTensor`, `ptr` points into the storage of the `NdArrayTensor` held beside it: an
//   `ArcArray`'s heap buffer (burn writes one in place only when it holds the sole handle, and
//   copies it otherwise; the `BurnTensor` holds one) or the heap memory of the `Bytes` of
//   borrowed storage (written only through `&mut Bytes`, copy-on-write where shared). Neither
//   moves when the tensor moves. `byte_len` bytes of `dtype` from `ptr` are the span of the
//   tensor's view (from its own shape and strides), aligned for the element type.
// - In a `BurnData`, `ptr` is the first byte of the `Bytes` of the `TensorData` held beside it
//   (heap memory of its allocation controller, which does not move with the `Bytes`), checked
//   aligned for `dtype`, and `byte_len` is the length of those bytes.
// Never handed out writable.
unsafe impl ExportBuffer for Lent {
    fn dtype(&self) -> DataType {
        self.dtype
    }
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    fn as_ptr(&self) -> *const c_void {
        self.ptr
    }
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        None
    }
}

// SAFETY: the pointer is only read, and the storage it points into belongs to an
// `NdArrayTensor` (`Send + Sync`) held alongside it.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`.
unsafe impl Sync for Lent {}

/// A burn tensor primitive of the CPU backend (`burn-ndarray`): the [`TensorKind::Primitive`](burn_tensor::TensorKind::Primitive)
/// of `Float` (a [`TensorPrimitive`] over [`NdArrayTensor`]), `Int` and `Bool` tensors of any
/// backend whose primitives are `NdArrayTensor`s (`burn_ndarray::NdArray<E, I, Q>`). Sealed.
pub trait NdArrayPrimitive: sealed::Sealed + Sized {
    /// The `NdArrayTensor` inside, or [`BurnError::Quantized`].
    #[doc(hidden)]
    fn into_ndarray(self) -> Result<NdArrayTensor, BurnError>;
    /// The primitive around `tensor`.
    #[doc(hidden)]
    fn from_ndarray(tensor: NdArrayTensor) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for burn_ndarray::NdArrayTensor {}
    impl<B: burn_tensor::backend::Backend> Sealed for burn_tensor::TensorPrimitive<B> {}
}

impl NdArrayPrimitive for NdArrayTensor {
    fn into_ndarray(self) -> Result<NdArrayTensor, BurnError> {
        Ok(self)
    }
    fn from_ndarray(tensor: NdArrayTensor) -> Self {
        tensor
    }
}

impl<B: Backend<FloatTensorPrimitive = NdArrayTensor>> NdArrayPrimitive for TensorPrimitive<B> {
    fn into_ndarray(self) -> Result<NdArrayTensor, BurnError> {
        match self {
            TensorPrimitive::Float(tensor) => Ok(tensor),
            TensorPrimitive::QFloat(_) => Err(BurnError::Quantized),
        }
    }
    fn from_ndarray(tensor: NdArrayTensor) -> Self {
        TensorPrimitive::Float(tensor)
    }
}

/// A burn CPU tensor (`burn-ndarray`), ready to be lent zero-copy: a [`DlpackExport`] producer
/// whose exports are read-only views of the tensor's own storage (shared with every clone of
/// the tensor), kept alive while any consumer holds them.
///
/// burn's CPU storage is copy-on-write: an operation writes a buffer in place only when it
/// holds the buffer's sole handle. The export holds one, so burn never writes the memory a
/// consumer reads; operations on clones of the tensor write copies.
pub struct BurnTensor {
    tensor: NdArrayTensor,
    lent: Lent,
    shape: Vec<usize>,
    strides: Vec<isize>,
    byte_offset: usize,
}

impl core::fmt::Debug for BurnTensor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BurnTensor")
            .field("dtype", &self.lent.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("byte_offset", &self.byte_offset)
            .finish()
    }
}

impl BurnTensor {
    /// Takes `tensor` (clone it first to keep using it: burn's clones share the storage) and
    /// its layout: shape and strides in elements (ndarray's, possibly negative or zero), the
    /// offset of element `(0, ..., 0)` from the lowest element in bytes.
    ///
    /// # Errors
    ///
    /// [`BurnError::Quantized`] for a quantized float tensor.
    pub fn new<B, const D: usize, K>(tensor: Tensor<B, D, K>) -> Result<Self, BurnError>
    where
        B: Backend,
        K: BasicOps<B>,
        K::Primitive: NdArrayPrimitive,
    {
        Self::from_primitive(tensor.into_primitive().into_ndarray()?)
    }

    /// [`new`](Self::new), from the primitive.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for storage kinds burn may add.
    pub fn from_primitive(tensor: NdArrayTensor) -> Result<Self, BurnError> {
        let (lent, shape, strides, byte_offset) = match &tensor {
            NdArrayTensor::F64(s) => lend!(s),
            NdArrayTensor::F32(s) => lend!(s),
            NdArrayTensor::I64(s) => lend!(s),
            NdArrayTensor::I32(s) => lend!(s),
            NdArrayTensor::I16(s) => lend!(s),
            NdArrayTensor::I8(s) => lend!(s),
            NdArrayTensor::U64(s) => lend!(s),
            NdArrayTensor::U32(s) => lend!(s),
            NdArrayTensor::U16(s) => lend!(s),
            NdArrayTensor::U8(s) => lend!(s),
            NdArrayTensor::Bool(s) => lend!(s),
        };
        Ok(Self {
            tensor,
            lent,
            shape,
            strides,
            byte_offset,
        })
    }

    /// The tensor primitive.
    pub fn primitive(&self) -> &NdArrayTensor {
        &self.tensor
    }

    /// Gives back the tensor primitive (`Tensor::from_primitive` makes it a burn tensor again).
    pub fn into_primitive(self) -> NdArrayTensor {
        self.tensor
    }
}

/// The memory of a view whose element `(0, ..., 0)` is at `first`, lent read-only, with its
/// shape, strides (elements) and the byte offset of element `(0, ..., 0)` from the lowest
/// element.
fn lend<E: Element>(
    first: *const E,
    shape: &[usize],
    strides: &[isize],
) -> (Lent, Vec<usize>, Vec<isize>, usize) {
    let size = core::mem::size_of::<E>();
    let shape = shape.to_vec();
    let strides = strides.to_vec();
    let (mut low, mut high) = (0isize, 0isize);
    let empty = shape.contains(&0);
    if !empty {
        for (&extent, &stride) in shape.iter().zip(&strides) {
            if extent > 1 {
                // Within the array's own allocation: the product fits in `isize`.
                let reach = (extent as isize - 1) * stride;
                if reach < 0 {
                    low += reach
                } else {
                    high += reach
                }
            }
        }
    }
    let byte_offset = (-low) as usize * size;
    let byte_len = if empty {
        0
    } else {
        (high - low + 1) as usize * size
    };
    let lent = Lent {
        ptr: first.cast::<u8>().wrapping_sub(byte_offset).cast(),
        byte_len,
        dtype: E::DTYPE,
    };
    (lent, shape, strides, byte_offset)
}

impl DlpackExport for BurnTensor {
    fn export_parts(&self) -> ExportParts<'_> {
        ExportParts::shared(&self.lent, &self.shape)
            .with_strides(Some(&self.strides))
            .with_byte_offset(self.byte_offset)
    }

    /// Read-only all the same: the storage is shared with every clone of the tensor.
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        self.export_parts()
    }
}

/// The host data of a burn tensor of any backend ([`TensorData`], from `Tensor::into_data`),
/// ready to be lent: a [`DlpackExport`] producer over the data's own bytes, compact row-major,
/// read-only.
///
/// Reading a tensor's data is a copy to host memory for device backends (and waits for the
/// device's pending work on it, as `into_data` does); for the CPU backend, `into_data` of a
/// contiguous tensor that holds the sole handle to its storage takes that storage without a
/// copy, and of other tensors copies. [`BurnTensor`] lends CPU tensors without a copy in all
/// cases.
pub struct BurnData {
    data: TensorData,
    lent: Lent,
    shape: Vec<usize>,
}

impl core::fmt::Debug for BurnData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BurnData")
            .field("dtype", &self.lent.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl BurnData {
    /// Reads the host data of `tensor` (`Tensor::into_data`: a copy for device backends, see
    /// [`BurnData`]) and takes it.
    ///
    /// # Errors
    ///
    /// As [`BurnData::new`].
    pub fn from_tensor<B: Backend, const D: usize, K: BasicOps<B>>(
        tensor: Tensor<B, D, K>,
    ) -> Result<Self, BurnError> {
        Self::new(tensor.into_data())
    }

    /// Takes `data`.
    ///
    /// # Errors
    ///
    /// [`BurnError::BurnDtype`] for a dtype without a DLPack counterpart (quantized, `Flex32`,
    /// bools stored as 32-bit integers); [`BurnError::Misaligned`] for bytes not aligned for
    /// the element type. (Bytes fewer than the shape needs are refused by the export,
    /// [`ExportError`].)
    pub fn new(data: TensorData) -> Result<Self, BurnError> {
        let dtype = dlpack_dtype(data.dtype).ok_or(BurnError::BurnDtype(data.dtype))?;
        let shape = data.shape.to_vec();
        let bytes: &[u8] = data.as_bytes();
        let ptr = bytes.as_ptr();
        let align = (dtype.bits as usize / 8).max(1);
        if (ptr as usize) % align != 0 {
            return Err(BurnError::Misaligned {
                address: ptr as usize,
                align,
                dtype,
            });
        }
        let lent = Lent {
            ptr: ptr.cast(),
            byte_len: bytes.len(),
            dtype,
        };
        Ok(Self { data, lent, shape })
    }

    /// Gives back the data.
    pub fn into_data(self) -> TensorData {
        self.data
    }
}

impl DlpackExport for BurnData {
    fn export_parts(&self) -> ExportParts<'_> {
        ExportParts::shared(&self.lent, &self.shape)
    }

    /// Read-only all the same: the bytes may be shared (`Bytes` splits and file mappings).
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        self.export_parts()
    }
}

/// An import lent to burn: the import, borrowed shared for as long as it lives, and its
/// elements as bytes.
struct Lending<T: Element> {
    /// Kept for its memory, its shared borrow and its deleter.
    _import: ImportedData<T>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer reaches the import's memory, only read; `ImportedData` is `Send`, and the
// deleter it runs on drop may run on any thread (`ManagedTensor` is `Send`).
unsafe impl<T: Element> Send for Lending<T> {}

impl<T: Element> AsRef<[u8]> for Lending<T> {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` are those of the import's `as_slice()`, taken when `self` was
        // made: C-contiguous host memory, initialized, every element checked (bools 0 or 1),
        // alive while `self._import` is, and borrowed shared by the import until its
        // drop (it is never borrowed mutably: `self._import` is private and never used), so no
        // writer from safe code while the slice lives.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The burn dtype of a DLPack dtype, if burn has one.
pub(super) fn burn_dtype(dtype: DataType) -> Option<DType> {
    Some(match dtype {
        DataType::F64 => DType::F64,
        DataType::F32 => DType::F32,
        DataType::F16 => DType::F16,
        DataType::BF16 => DType::BF16,
        DataType::I64 => DType::I64,
        DataType::I32 => DType::I32,
        DataType::I16 => DType::I16,
        DataType::I8 => DType::I8,
        DataType::U64 => DType::U64,
        DataType::U32 => DType::U32,
        DataType::U16 => DType::U16,
        DataType::U8 => DType::U8,
        DataType::BOOL => DType::Bool(BoolStore::Native),
        _ => return None,
    })
}

/// Burn host data ([`TensorData`]) of `managed`'s elements, for any burn backend
/// (`Tensor::from_data(data, (&device, data.dtype))` uploads it; the CPU backend keeps it as it
/// is, see [`tensor_from_managed`]).
///
/// Zero-copy for C-contiguous host memory aligned for its dtype: the data's bytes are the
/// producer's memory, read-only (burn copies them on its first write), and the producer's
/// deleter runs when the last `Bytes` holding them is dropped. Otherwise (other strides,
/// negative and zero included; misaligned memory) the elements are copied in row-major order
/// and the deleter has run when this returns. `bool` elements are checked to be 0 or 1.
///
/// # Errors
///
/// [`BurnError::Dtype`] for a dtype burn has no type for (complex, float8, ...);
/// [`BurnError::Import`] for an invalid layout, memory the host cannot read (CUDA memory: ask
/// the producer for `dl_device=(CPU, 0)`, as `burn::tensor_from_py` (feature `python`) does),
/// a `bool` element that is neither 0 nor 1, or memory another import borrows exclusively. The
/// producer's deleter has run when an error is returned.
pub fn tensor_data_from_managed(managed: ManagedTensor) -> Result<TensorData, BurnError> {
    let found = DataType::from_raw(managed.dl_tensor().dtype);
    let dtype = burn_dtype(found).ok_or(BurnError::Dtype { found })?;
    match found {
        DataType::F64 => data_of::<f64>(managed, dtype),
        DataType::F32 => data_of::<f32>(managed, dtype),
        DataType::F16 => data_of::<half::f16>(managed, dtype),
        DataType::BF16 => data_of::<half::bf16>(managed, dtype),
        DataType::I64 => data_of::<i64>(managed, dtype),
        DataType::I32 => data_of::<i32>(managed, dtype),
        DataType::I16 => data_of::<i16>(managed, dtype),
        DataType::I8 => data_of::<i8>(managed, dtype),
        DataType::U64 => data_of::<u64>(managed, dtype),
        DataType::U32 => data_of::<u32>(managed, dtype),
        DataType::U16 => data_of::<u16>(managed, dtype),
        DataType::U8 => data_of::<u8>(managed, dtype),
        _ => data_of::<bool>(managed, dtype),
    }
}

/// The data of `managed`'s elements of type `T` (burn's `dtype`): its memory when it is
/// C-contiguous and aligned, a row-major copy otherwise.
fn data_of<T: Element + burn_tensor::Element>(
    managed: ManagedTensor,
    dtype: DType,
) -> Result<TensorData, BurnError> {
    let data = ImportedData::<T>::from_managed(managed)?;
    let shape: Vec<usize> = data.layout()?.shape().iter().map(|&e| e as usize).collect();
    let (ptr, len) = match data.as_slice() {
        Ok(slice) => (slice.as_ptr().cast::<u8>(), core::mem::size_of_val(slice)),
        Err(LayoutError::NotContiguous { .. } | LayoutError::Misaligned { .. }) => {
            let values = data.to_vec()?;
            drop(data);
            return Ok(TensorData::new(values, shape));
        }
        Err(err) => return Err(err.into()),
    };
    let bytes = bytes::Bytes::from_owner(Lending {
        _import: data,
        ptr,
        len,
    });
    Ok(TensorData::from_bytes(
        Bytes::from_shared(bytes, AllocationProperty::Other),
        shape,
        dtype,
    ))
}

/// A burn CPU tensor (`burn-ndarray`) of `managed`'s elements, of rank `D` and kind `K`
/// (`Float`, `Int` or `Bool`), keeping the tensor's dtype (a float64 tensor stays float64 on an
/// `NdArray<f32>` backend).
///
/// Zero-copy for C-contiguous host memory aligned for its dtype: burn-ndarray keeps the
/// producer's memory as borrowed storage, read-only, and copies it into storage of its own
/// when an operation needs an owned array (its copy-on-write for borrowed storage); the
/// producer's deleter runs when the tensor and every clone and copy-free result of it are
/// dropped. Otherwise the elements are copied in row-major order (any strides), and the
/// deleter has run when this returns.
///
/// # Errors
///
/// [`BurnError::RankZero`] when `D` is 0; [`BurnError::Rank`] when the tensor's rank is not
/// `D`; [`BurnError::Kind`] for a dtype the kind cannot hold on the CPU backend (`Float`: float32, float64; `Int`: the signed and
/// unsigned integers; `Bool`: bool); otherwise as [`tensor_data_from_managed`]. The
/// producer's deleter has run when an error is returned.
pub fn tensor_from_managed<B, const D: usize, K>(
    managed: ManagedTensor,
) -> Result<Tensor<B, D, K>, BurnError>
where
    B: Backend,
    K: BasicOps<B>,
    K::Primitive: NdArrayPrimitive,
{
    if D == 0 {
        return Err(BurnError::RankZero);
    }
    let ndim = managed.dl_tensor().ndim;
    let found = usize::try_from(ndim).unwrap_or(usize::MAX);
    if found != D {
        return Err(BurnError::Rank { found, expected: D });
    }
    let dtype = DataType::from_raw(managed.dl_tensor().dtype);
    let kind = K::name();
    let expected = match kind {
        "Float" => "float32 or float64",
        "Int" => "int8, int16, int32, int64, uint8, uint16, uint32 or uint64",
        _ => "bool",
    };
    let accepted = match kind {
        "Float" => matches!(dtype, DataType::F32 | DataType::F64),
        "Int" => matches!(
            dtype,
            DataType::I8
                | DataType::I16
                | DataType::I32
                | DataType::I64
                | DataType::U8
                | DataType::U16
                | DataType::U32
                | DataType::U64
        ),
        _ => dtype == DataType::BOOL,
    };
    if !accepted {
        return Err(if burn_dtype(dtype).is_none() {
            BurnError::Dtype { found: dtype }
        } else {
            BurnError::Kind {
                found: dtype,
                backend: "burn-ndarray",
                kind,
                expected,
            }
        });
    }
    let data = tensor_data_from_managed(managed)?;
    let primitive = NdArrayTensor::from_data(data);
    Ok(Tensor::from_primitive(K::Primitive::from_ndarray(
        primitive,
    )))
}

/// Exports `producer` (versioned, no stream) and makes a burn CPU tensor of it, as
/// [`tensor_from_managed`] does.
///
/// # Errors
///
/// [`BurnError::Export`] when the producer cannot export, otherwise as
/// [`tensor_from_managed`].
pub fn tensor_from_dlpack<B, const D: usize, K, P>(
    producer: P,
) -> Result<Tensor<B, D, K>, BurnError>
where
    B: Backend,
    K: BasicOps<B>,
    K::Primitive: NdArrayPrimitive,
    P: DlpackExport + Send + 'static,
{
    tensor_from_managed(producer.into_dlpack()?)
}
