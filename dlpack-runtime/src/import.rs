//! The consumer side: building Rust values from managed tensors.
//!
//! A type becomes a consumer by implementing [`DlpackImport`] (usually with
//! `#[derive(DlpackImport)]`). Its `#[dlpack(data)]` field keeps the [`ManagedTensor`] alive
//! (an [`ImportedData<T>`] or the [`ManagedTensor`] itself), so the producer's deleter runs
//! exactly once, when the Rust value is dropped, or at once if the import is refused.
//!
//! Every import validates the layout ([`ManagedTensor::layout`]) and the consumer's
//! [`ImportConstraints`] before anything reads the data.

use core::marker::PhantomData;

use crate::device::{Device, DeviceType};
use crate::dtype::{DataType, Element};
use crate::error::{ImportError, LayoutError};
use crate::export::DlpackExport;
use crate::layout::{Contiguity, TensorLayout};
use crate::managed::ManagedTensor;

/// What a consumer requires of a tensor, checked once at import, in the spirit of nanobind's
/// `ndarray<float, shape<-1, 3>, c_contig, device::cuda>`.
///
/// `#[derive(DlpackImport)]` builds one from its container options (`dtype = f32`, `ndim = 2`,
/// `shape = [_, 3]`, `contiguous = "C"`, `device = "cpu"`, `writable`); by hand:
///
/// ```
/// use dlpack_runtime::{Contiguity, DataType, DeviceType, ImportConstraints};
///
/// const POINTS: ImportConstraints = ImportConstraints::new()
///     .dtype(DataType::F32)
///     .shape(&[None, Some(3)])
///     .contiguous(Contiguity::C)
///     .device(DeviceType::Cpu);
/// assert_eq!(POINTS.ndim, Some(2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportConstraints {
    /// Required memory order; `None` accepts any valid strided layout.
    pub contiguous: Option<Contiguity>,
    /// Whether writable memory is required (`DLPACK_FLAG_BITMASK_READ_ONLY` clear, versioned).
    pub writable: bool,
    /// Required `ndim`.
    pub ndim: Option<usize>,
    /// Required dtype.
    pub dtype: Option<DataType>,
    /// Required extents, one entry per axis: `Some(n)` requires extent `n`, `None` accepts any
    /// (`shape = [_, 3]` is `[None, Some(3)]`). Implies `ndim`.
    pub shape: Option<&'static [Option<usize>]>,
    /// Required device type (any ordinal).
    pub device: Option<DeviceType>,
}

impl ImportConstraints {
    /// No constraint beyond a valid layout.
    pub const fn new() -> Self {
        Self {
            contiguous: None,
            writable: false,
            ndim: None,
            dtype: None,
            shape: None,
            device: None,
        }
    }

    /// Requires compact storage in `order`.
    pub const fn contiguous(mut self, order: Contiguity) -> Self {
        self.contiguous = Some(order);
        self
    }

    /// Requires writable memory when `writable` is true.
    pub const fn writable(mut self, writable: bool) -> Self {
        self.writable = writable;
        self
    }

    /// Requires `ndim` axes.
    pub const fn ndim(mut self, ndim: usize) -> Self {
        self.ndim = Some(ndim);
        self
    }

    /// Requires elements of `dtype`.
    pub const fn dtype(mut self, dtype: DataType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Requires extents matching `pattern`, one entry per axis (`None`: any extent); sets
    /// `ndim` to the pattern's length.
    pub const fn shape(mut self, pattern: &'static [Option<usize>]) -> Self {
        self.shape = Some(pattern);
        self.ndim = Some(pattern.len());
        self
    }

    /// Requires memory on a device of type `device_type`, whatever its ordinal.
    pub const fn device(mut self, device_type: DeviceType) -> Self {
        self.device = Some(device_type);
        self
    }

    /// Validates `managed` and checks the constraints, in this order: layout, dtype, device,
    /// `ndim`, shape, contiguity, writability.
    ///
    /// # Errors
    ///
    /// [`ImportError::Layout`] for an invalid layout or a contiguity mismatch;
    /// [`ImportError::Dtype`], [`ImportError::Device`], [`ImportError::Ndim`],
    /// [`ImportError::Shape`] and [`ImportError::ReadOnly`] for the other constraints.
    pub fn check<'a>(&self, managed: &'a ManagedTensor) -> Result<TensorLayout<'a>, ImportError> {
        let layout = managed.layout()?;
        if let Some(expected) = self.dtype {
            if layout.dtype() != expected {
                return Err(ImportError::Dtype {
                    found: layout.dtype(),
                    expected,
                });
            }
        }
        if let Some(expected) = self.device {
            if layout.device().device_type != expected {
                return Err(ImportError::Device {
                    found: layout.device(),
                    expected: device_type_name(expected),
                });
            }
        }
        if let Some(expected) = self.ndim {
            if layout.ndim() != expected {
                return Err(ImportError::Ndim {
                    found: layout.ndim(),
                    expected,
                });
            }
        }
        if let Some(pattern) = self.shape {
            let matches = layout.ndim() == pattern.len()
                && layout
                    .shape()
                    .iter()
                    .zip(pattern)
                    .all(|(&extent, want)| want.is_none_or(|want| extent as usize == want));
            if !matches {
                return Err(ImportError::Shape {
                    found: layout.shape().iter().map(|&e| e as usize).collect(),
                    expected: pattern.to_vec(),
                });
            }
        }
        if let Some(order) = self.contiguous {
            layout.require_contiguous(order)?;
        }
        if self.writable && managed.is_read_only() {
            return Err(ImportError::ReadOnly);
        }
        Ok(layout)
    }
}

/// The name a consumer constraint gives a device type, for [`ImportError::Device`].
fn device_type_name(device_type: DeviceType) -> &'static str {
    match device_type {
        DeviceType::Cpu => "cpu memory (kDLCPU)",
        DeviceType::Cuda => "cuda memory (kDLCUDA)",
        DeviceType::CudaHost => "cuda_host memory (kDLCUDAHost)",
        DeviceType::CudaManaged => "cuda_managed memory (kDLCUDAManaged)",
        DeviceType::Rocm => "rocm memory (kDLROCM)",
        DeviceType::RocmHost => "rocm_host memory (kDLROCMHost)",
        DeviceType::OpenCl => "opencl memory (kDLOpenCL)",
        DeviceType::Vulkan => "vulkan memory (kDLVulkan)",
        DeviceType::Metal => "metal memory (kDLMetal)",
        DeviceType::Vpi => "vpi memory (kDLVPI)",
        DeviceType::ExtDev => "ext_dev memory (kDLExtDev)",
        DeviceType::OneApi => "oneapi memory (kDLOneAPI)",
        DeviceType::WebGpu => "webgpu memory (kDLWebGPU)",
        DeviceType::Hexagon => "hexagon memory (kDLHexagon)",
        DeviceType::Maia => "maia memory (kDLMAIA)",
        DeviceType::Trn => "trn memory (kDLTrn)",
        DeviceType::Unknown(_) => "memory of the device type the consumer declared",
    }
}

/// A DLPack consumer: a type that can be built from a managed tensor.
///
/// Usually derived with `#[derive(DlpackImport)]`.
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
        Self::from_managed(producer.to_dlpack()?)
    }
}

/// A type usable as the `#[dlpack(data)]` field of an imported tensor: it takes ownership of the
/// managed tensor.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold the data of an imported tensor",
    label = "not an `ImportBuffer`",
    note = "imported data is held by `dlpack_runtime::ImportedData<T>` or `dlpack_runtime::ManagedTensor`, or by an enum of them that derives `dlpack_runtime::DlpackImportStorage`"
)]
pub trait ImportBuffer: Sized {
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
}

impl ImportBuffer for ManagedTensor {
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
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        Ok(shape.iter().map(|&e| e as usize).collect())
    }
}
impl FromShape for Box<[usize]> {
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        Ok(shape.iter().map(|&e| e as usize).collect())
    }
}
impl<const N: usize> FromShape for [usize; N] {
    fn from_shape(shape: &[i64]) -> Result<Self, ImportError> {
        if shape.len() != N {
            return Err(ImportError::Ndim {
                found: shape.len(),
                expected: N,
            });
        }
        Ok(core::array::from_fn(|axis| shape[axis] as usize))
    }
}
impl FromStrides for Vec<isize> {
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        Ok((0..layout.ndim())
            .map(|axis| layout.stride(axis) as isize)
            .collect())
    }
}
impl FromStrides for Box<[isize]> {
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        Ok((0..layout.ndim())
            .map(|axis| layout.stride(axis) as isize)
            .collect())
    }
}
impl<S: FromStrides> FromStrides for Option<S> {
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        S::from_strides(layout).map(Some)
    }
}
impl<const N: usize> FromStrides for [isize; N] {
    fn from_strides(layout: &TensorLayout<'_>) -> Result<Self, ImportError> {
        if layout.ndim() != N {
            return Err(ImportError::Ndim {
                found: layout.ndim(),
                expected: N,
            });
        }
        Ok(core::array::from_fn(|axis| layout.stride(axis) as isize))
    }
}

/// Imported memory of element type `T`: owns the managed tensor and reads it through its
/// validated layout. The producer's deleter runs when this is dropped.
///
/// The dtype is checked at import; host access ([`as_slice`](Self::as_slice),
/// [`get`](Self::get), [`to_vec`](Self::to_vec)) additionally checks that the memory is
/// host-accessible and aligned; mutable access checks that the tensor is writable.
pub struct ImportedData<T: Element> {
    managed: ManagedTensor,
    _element: PhantomData<T>,
}

impl<T: Element> core::fmt::Debug for ImportedData<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ImportedData")
            .field("dtype", &T::DTYPE)
            .field("managed", &self.managed)
            .finish()
    }
}

impl<T: Element> ImportBuffer for ImportedData<T> {
    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError> {
        Self::accepts(&managed)?;
        Ok(Self {
            managed,
            _element: PhantomData,
        })
    }

    /// Accepts tensors of dtype `T::DTYPE`.
    fn accepts(managed: &ManagedTensor) -> Result<(), ImportError> {
        let found = DataType::from_raw(managed.dl_tensor().dtype);
        if found != T::DTYPE {
            return Err(LayoutError::DtypeMismatch {
                found,
                expected: T::DTYPE,
            }
            .into());
        }
        Ok(())
    }
}

impl<T: Element> ImportedData<T> {
    /// The owned managed tensor.
    pub fn managed(&self) -> &ManagedTensor {
        &self.managed
    }

    /// Gives back the managed tensor.
    pub fn into_managed(self) -> ManagedTensor {
        self.managed
    }

    /// The validated layout.
    ///
    /// # Errors
    ///
    /// Never for a value built by import (the layout was validated then); the `Result` keeps
    /// the check in place rather than assumed.
    pub fn layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        self.managed.layout()
    }

    /// Device of the memory.
    pub fn device(&self) -> Device {
        Device::from_raw(self.managed.dl_tensor().device)
    }

    /// Whether mutable access is refused.
    pub fn is_read_only(&self) -> bool {
        self.managed.is_read_only()
    }

    /// Pointer to element `(0, ..., 0)` (`data + byte_offset`), on the tensor's device. NULL or
    /// dangling for a zero-size tensor.
    pub fn as_ptr(&self) -> *const T {
        self.host_layout_unchecked_ptr()
    }

    fn host_layout_unchecked_ptr(&self) -> *const T {
        let t = self.managed.dl_tensor();
        t.data
            .cast::<u8>()
            .wrapping_add(t.byte_offset as usize)
            .cast()
    }

    fn host_layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        let layout = self.managed.layout()?;
        layout.check_typed::<T>()?;
        Ok(layout)
    }

    /// The elements as a slice, for a C-contiguous tensor in host-accessible memory. `bool`
    /// elements are checked to be 0 or 1 (one pass over the data).
    ///
    /// The memory is shared with its producer. While the slice is borrowed, nothing may write
    /// to it: do not call back into code that writes the producer's array (Python code writing
    /// the NumPy array this came from, say) while holding the slice. [`ImportedData::get`] and
    /// [`ImportedData::to_vec`] read values at the time of the call instead.
    ///
    /// # Errors
    ///
    /// [`LayoutError::NotContiguous`], [`LayoutError::NotHostAccessible`],
    /// [`LayoutError::Misaligned`], [`LayoutError::InvalidValue`].
    pub fn as_slice(&self) -> Result<&[T], LayoutError> {
        let layout = self.host_layout()?;
        layout.require_contiguous(Contiguity::C)?;
        if layout.numel() == 0 {
            return Ok(&[]);
        }
        let ptr = layout.first_element_ptr().cast::<T>();
        check_bit_patterns::<T>(ptr, layout.numel())?;
        // SAFETY: the layout is validated and C-contiguous, so `numel` elements of `T` start at
        // `ptr` (aligned: `check_typed`) in host-accessible memory the producer keeps alive while
        // `self` owns the managed tensor; every element holds a valid `T` (checked above), and
        // no `&mut` to them exists while `&self` is borrowed.
        Ok(unsafe { core::slice::from_raw_parts(ptr, layout.numel()) })
    }

    /// The elements as a mutable slice, for a writable C-contiguous tensor in host memory.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`] for a read-only or legacy tensor, otherwise as
    /// [`ImportedData::as_slice`].
    pub fn as_slice_mut(&mut self) -> Result<&mut [T], LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.host_layout()?;
        layout.require_contiguous(Contiguity::C)?;
        let (ptr, numel) = (layout.first_element_ptr().cast::<T>(), layout.numel());
        if numel == 0 {
            return Ok(&mut []);
        }
        check_bit_patterns::<T>(ptr, numel)?;
        // SAFETY: as in `as_slice`; the tensor is writable (flag checked) and `&mut self`
        // guarantees no other reference from this side.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr, numel) })
    }

    /// Reads the element at `index` (one coordinate per axis), for any valid layout.
    ///
    /// # Errors
    ///
    /// [`LayoutError::IndexRank`], [`LayoutError::IndexOutOfBounds`], the host-access errors,
    /// and [`LayoutError::InvalidValue`] for a bad `bool` byte.
    pub fn get(&self, index: &[usize]) -> Result<T, LayoutError> {
        let layout = self.host_layout()?;
        let offset = layout.offset_of(index)?;
        // The row-major position of `index`, for error messages; in range (checked above).
        let linear = index
            .iter()
            .zip(layout.shape())
            .fold(0usize, |acc, (&i, &e)| acc * e as usize + i);
        // SAFETY: `offset` addresses an in-bounds element of the validated layout (checked by
        // `offset_of`), aligned and host-accessible (`check_typed`).
        unsafe { read_element::<T>(layout.first_element_ptr().offset(offset), linear) }
    }

    /// Writes the element at `index`, for a writable tensor.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`], otherwise as [`ImportedData::get`].
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.host_layout()?;
        let offset = layout.offset_of(index)?;
        // SAFETY: in-bounds, aligned, host-accessible element of a writable tensor; `&mut self`
        // excludes other access from this side.
        unsafe {
            layout
                .first_element_ptr()
                .offset(offset)
                .cast::<T>()
                .write(value)
        };
        Ok(())
    }

    /// Copies the elements out in logical row-major order, for any valid layout (negative and
    /// zero strides included).
    ///
    /// # Errors
    ///
    /// The host-access errors, [`LayoutError::InvalidValue`] for a bad `bool` byte, and
    /// [`LayoutError::CopyTooLarge`] when the copy cannot be allocated (a broadcast with stride 0
    /// can describe far more elements than its memory holds).
    pub fn to_vec(&self) -> Result<Vec<T>, LayoutError> {
        let layout = self.host_layout()?;
        let base = layout.first_element_ptr();
        let mut out = Vec::new();
        let too_large = LayoutError::CopyTooLarge {
            numel: layout.numel(),
            element_bytes: core::mem::size_of::<T>(),
        };
        layout
            .numel()
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(too_large.clone())?;
        out.try_reserve_exact(layout.numel())
            .map_err(|_| too_large)?;
        let mut failure = None;
        layout.for_each_offset(|offset| {
            if failure.is_some() {
                return;
            }
            // SAFETY: every offset produced by `for_each_offset` addresses an element of the
            // validated layout, aligned and host-accessible (`check_typed`).
            match unsafe { read_element::<T>(base.offset(offset), out.len()) } {
                Ok(v) => out.push(v),
                Err(e) => failure = Some(e),
            }
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl<T: Element> ImportedData<T> {
    /// Checks the bit pattern of every element of `layout` (host-accessible, typed-checked).
    #[cfg_attr(not(feature = "ndarray"), allow(dead_code))]
    pub(crate) fn check_all_elements(&self, layout: &TensorLayout<'_>) -> Result<(), LayoutError> {
        let base = layout.first_element_ptr();
        let mut failure = None;
        let mut index = 0usize;
        layout.for_each_offset(|offset| {
            if failure.is_none() {
                // SAFETY: every offset addresses an element of the validated layout, aligned
                // and host-accessible (checked by the caller with `check_typed`).
                if let Err(e) = unsafe { read_element::<T>(base.offset(offset), index) } {
                    failure = Some(e);
                }
            }
            index += 1;
        })?;
        failure.map_or(Ok(()), Err)
    }
}

/// Reads one element, checking its bit pattern.
///
/// # Safety
///
/// `ptr` points to `size_of::<T>()` readable bytes, aligned for `T`.
unsafe fn read_element<T: Element>(ptr: *const u8, index: usize) -> Result<T, LayoutError> {
    // SAFETY: readable bytes (caller).
    let bytes = unsafe { core::slice::from_raw_parts(ptr, core::mem::size_of::<T>()) };
    if !T::ALL_BIT_PATTERNS_VALID && !T::is_valid_bit_pattern(bytes) {
        return Err(LayoutError::InvalidValue {
            index,
            bytes: bytes.to_vec(),
            dtype: T::DTYPE,
        });
    }
    // SAFETY: aligned (caller) and a valid `T` (checked above).
    Ok(unsafe { ptr.cast::<T>().read() })
}

fn check_bit_patterns<T: Element>(ptr: *const T, numel: usize) -> Result<(), LayoutError> {
    let size = core::mem::size_of::<T>();
    if T::ALL_BIT_PATTERNS_VALID {
        return Ok(());
    }
    for index in 0..numel {
        // SAFETY: `ptr` points to `numel` contiguous elements (callers).
        let bytes =
            unsafe { core::slice::from_raw_parts(ptr.cast::<u8>().add(index * size), size) };
        if !T::is_valid_bit_pattern(bytes) {
            return Err(LayoutError::InvalidValue {
                index,
                bytes: bytes.to_vec(),
                dtype: T::DTYPE,
            });
        }
    }
    Ok(())
}
