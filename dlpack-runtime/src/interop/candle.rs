//! candle interop: the items of `dlpack_runtime::candle` (documented there, at the crate root).

use core::ffi::c_void;

use candle_core::{CpuStorage, DType, Storage, Tensor, WithDType};

use crate::export::{DlpackExport, ExportBuffer, ExportError, ExportParts};
use crate::import::{ImportBuffer, ImportError, ImportedData};
#[cfg(feature = "python")]
use crate::tensor::dtype::{DataType, DataTypeCode, Element};
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::ManagedTensor;

/// Why a candle tensor cannot be exported, or a DLPack tensor cannot become a candle tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CandleError {
    /// The candle tensor is not on the CPU.
    #[error("a candle tensor on {location} cannot be lent, expected a CPU tensor")]
    Device {
        /// candle's device location, in words.
        location: String,
    },
    /// A candle dtype with no DLPack counterpart here (the sub-byte placeholders).
    #[error(
        "candle dtype {0:?} has no DLPack dtype, expected u8, u32, i16, i32, i64, f16, bf16, f32, f64, f8e4m3 or f8e8m0"
    )]
    CandleDtype(DType),
    /// A DLPack dtype with no candle counterpart.
    #[error(
        "DLPack dtype {found} has no candle dtype, expected uint8, uint32, int16, int32, int64, float16, bfloat16, float32, float64 or float8_e4m3fn"
    )]
    Dtype {
        /// The tensor's dtype.
        found: DataType,
    },
    /// The DLPack tensor cannot be read (its layout, or memory the host cannot reach).
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The producer could not export.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// candle refused to build the tensor. The message includes candle's, so it is not also
    /// the [`source`](std::error::Error::source).
    #[error("candle: {0}")]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for CandleError {
    fn from(err: candle_core::Error) -> Self {
        Self::Candle(err)
    }
}

impl From<LayoutError> for CandleError {
    fn from(err: LayoutError) -> Self {
        Self::Import(err.into())
    }
}

/// The storage of a candle CPU tensor, lent read-only: its base pointer, length in bytes and
/// dtype, taken under candle's read lock.
struct Storaged {
    ptr: *const c_void,
    byte_len: usize,
    dtype: DataType,
}

// SAFETY: `ptr` points into the CPU storage of the tensor that the same `CandleTensor` keeps
// (a clone, so the storage's `Arc` stays alive); candle never moves or resizes a storage
// buffer (its in-place operations write through it), so `byte_len` bytes of `dtype` stay
// there, aligned for their element type (a `Vec` of it). Never handed out writable.
unsafe impl ExportBuffer for Storaged {
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

// SAFETY: the pointer is only read, and the storage it points into belongs to a `Tensor`
// (`Send + Sync`) held alongside it.
unsafe impl Send for Storaged {}
// SAFETY: as for `Send`.
unsafe impl Sync for Storaged {}

/// A candle tensor, ready to be lent zero-copy: a [`DlpackExport`] producer whose exports are
/// read-only views of the tensor's CPU storage (shared with every clone of the tensor), kept
/// alive while any consumer holds them.
///
/// Writes through candle's in-place operations (`slice_set`, a `Var`'s `set`) while a consumer
/// reads the export race with it, as writes to a NumPy array shared with another library do.
pub struct CandleTensor {
    tensor: Tensor,
    storage: Storaged,
    shape: Vec<usize>,
    strides: Vec<isize>,
    start_offset: usize,
}

impl core::fmt::Debug for CandleTensor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CandleTensor")
            .field("dtype", &self.storage.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("start_offset", &self.start_offset)
            .finish()
    }
}

impl CandleTensor {
    /// Takes a clone of `tensor` (sharing its storage) and its layout: shape and strides in
    /// elements, start offset in elements.
    ///
    /// # Errors
    ///
    /// [`CandleError::Device`] for a tensor that is not on the CPU; [`CandleError::CandleDtype`]
    /// for the sub-byte placeholder dtypes (`F6E2M3`, `F6E3M2`, `F4`).
    pub fn new(tensor: &Tensor) -> Result<Self, CandleError> {
        let (storage, layout) = tensor.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            return Err(CandleError::Device {
                location: format!("{:?}", tensor.device().location()),
            });
        };
        let storage = match cpu {
            CpuStorage::U8(v) => lend(v),
            CpuStorage::U32(v) => lend(v),
            CpuStorage::I16(v) => lend(v),
            CpuStorage::I32(v) => lend(v),
            CpuStorage::I64(v) => lend(v),
            CpuStorage::BF16(v) => lend(v),
            CpuStorage::F16(v) => lend(v),
            CpuStorage::F32(v) => lend(v),
            CpuStorage::F64(v) => lend(v),
            CpuStorage::F8E4M3(v) => lend(v),
            // One byte per element, `float8_e8m0fnu`'s own encoding.
            CpuStorage::F8E8M0(v) => Storaged {
                dtype: DataType::scalar(DataTypeCode::Float8E8M0Fnu, 8),
                ..lend(v)
            },
            CpuStorage::F6E2M3(_) | CpuStorage::F6E3M2(_) | CpuStorage::F4(_) => {
                return Err(CandleError::CandleDtype(tensor.dtype()));
            }
        };
        Ok(Self {
            tensor: tensor.clone(),
            storage,
            shape: layout.dims().to_vec(),
            // candle's strides are element counts of a valid layout: each fits in `isize`.
            strides: layout.stride().iter().map(|&s| s as isize).collect(),
            start_offset: layout.start_offset(),
        })
    }

    /// The candle tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Gives back the candle tensor.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

/// The storage of `v`, lent read-only.
fn lend<T: Element>(v: &[T]) -> Storaged {
    Storaged {
        ptr: v.as_ptr().cast(),
        byte_len: core::mem::size_of_val(v),
        dtype: T::DTYPE,
    }
}

impl DlpackExport for CandleTensor {
    fn export_parts(&self) -> ExportParts<'_> {
        ExportParts::shared(&self.storage, &self.shape)
            .with_strides(Some(&self.strides))
            .with_offset(self.start_offset)
    }

    /// Read-only all the same: the storage is shared with every clone of the tensor.
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        self.export_parts()
    }
}

impl TryFrom<&Tensor> for CandleTensor {
    type Error = CandleError;

    fn try_from(tensor: &Tensor) -> Result<Self, CandleError> {
        Self::new(tensor)
    }
}

/// Copies the elements of `managed` into a new candle tensor on `device`, in row-major order
/// (any strides, including negative and zero ones). The producer's deleter has run when this
/// returns, whatever the result.
///
/// # Errors
///
/// [`CandleError::Dtype`] for a dtype candle has no type for (`int8`, `uint16`, `uint64`,
/// `bool`, complex, the other float8 formats, ...); [`CandleError::Import`] for an invalid
/// layout or memory the host cannot read (CUDA memory: ask the producer for
/// `dl_device=(CPU, 0)`, as `candle::tensor_from_py` (feature `python`) does);
/// [`CandleError::Candle`] when candle cannot place the tensor on `device`.
pub fn tensor_from_managed(
    managed: ManagedTensor,
    device: &candle_core::Device,
) -> Result<Tensor, CandleError> {
    let dtype = DataType::from_raw(managed.dl_tensor().dtype);
    match dtype {
        DataType::U8 => copy::<u8>(managed, device),
        DataType::U32 => copy::<u32>(managed, device),
        DataType::I16 => copy::<i16>(managed, device),
        DataType::I32 => copy::<i32>(managed, device),
        DataType::I64 => copy::<i64>(managed, device),
        DataType::F16 => copy::<half::f16>(managed, device),
        DataType::BF16 => copy::<half::bf16>(managed, device),
        DataType::F32 => copy::<f32>(managed, device),
        DataType::F64 => copy::<f64>(managed, device),
        DataType::F8E4M3FN => copy::<float8::F8E4M3>(managed, device),
        found => Err(CandleError::Dtype { found }),
    }
}

/// The copy of `managed`'s elements of type `T` into a candle tensor of its shape.
fn copy<T: Element + WithDType>(
    managed: ManagedTensor,
    device: &candle_core::Device,
) -> Result<Tensor, CandleError> {
    let data = ImportedData::<T>::from_managed(managed)?;
    let layout = data.layout()?;
    let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
    let values = data.to_vec()?;
    drop(data);
    Ok(Tensor::from_vec(values, shape, device)?)
}

/// Exports `producer` (versioned, no stream) and copies it into a new candle tensor on
/// `device`, as [`tensor_from_managed`] does.
///
/// # Errors
///
/// [`CandleError::Export`] when the producer cannot export, otherwise as
/// [`tensor_from_managed`].
pub fn tensor_from_dlpack<P: DlpackExport + Send + 'static>(
    producer: P,
    device: &candle_core::Device,
) -> Result<Tensor, CandleError> {
    tensor_from_managed(producer.into_dlpack()?, device)
}
