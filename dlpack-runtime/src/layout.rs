//! Validation of a borrowed `DLTensor` and layout arithmetic (spec sections 1.7 and 1.12).
//!
//! [`validate`] is the single gate every imported tensor passes before anything reads its data:
//! it checks `ndim`, `shape`, `strides` (by version), the dtype width, the element count and the
//! byte span that the layout reaches, with every product and sum checked for overflow (in
//! checked `i64` for whole-byte elements, exactly as wide as needed: anything that overflows it
//! cannot fit in `isize`; sub-byte widths use `i128`). A
//! [`ManagedTensor`](crate::ManagedTensor) runs it once and keeps the verdict. The
//! result, a [`TensorLayout`], answers contiguity, stride and offset questions, and the typed
//! access checks ([`TensorLayout::check_typed`]) add dtype, device, alignment and read-only rules.
//!
//! Units: shapes are in elements, strides in elements (signed), `byte_offset` and spans in bytes.

use core::ffi::c_void;

use crate::device::{Device, DeviceType};
use crate::dtype::{DataType, DataTypeCode, Element};
use crate::error::LayoutError;
use crate::ffi;

/// The largest `ndim` accepted, as in NumPy (`NPY_MAXDIMS` = 64).
pub const MAX_NDIM: usize = 64;

/// How to read a NULL `strides` pointer, which depends on who produced the tensor
/// (spec section 1.7, corner 1 of section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullStrides {
    /// NULL means compact row-major: legacy tensors and versioned tensors of minor < 2.
    MeanCompact,
    /// NULL is refused when `ndim > 0`: versioned tensors of minor >= 2.
    Refuse,
}

impl NullStrides {
    /// The rule for a tensor of the given version (`None` for a legacy `DLManagedTensor`).
    pub fn for_version(version: Option<ffi::DLPackVersion>) -> Self {
        match version {
            Some(v) if v.major == 1 && v.minor >= 2 => Self::Refuse,
            _ => Self::MeanCompact,
        }
    }
}

/// Memory order of a contiguous tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contiguity {
    /// Compact row-major (C order).
    C,
    /// Compact column-major (Fortran order).
    F,
    /// Compact in either order.
    Any,
}

/// A byte range relative to `DLTensor::data`: `[start, end)`, `start` possibly negative when
/// negative strides reach below `data`. Empty (`start == end`) for zero-size tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSpan {
    /// First byte touched, relative to `data` (includes `byte_offset`).
    pub start: isize,
    /// One past the last byte touched, relative to `data`.
    pub end: isize,
}

impl ByteSpan {
    /// Length of the span in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the span is empty (a zero-size tensor).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A validated layout of a `DLTensor`, borrowing its `shape` and `strides` arrays.
///
/// Invariants established by [`validate`]: `ndim <= MAX_NDIM`; every extent is `>= 0`; the
/// element count and the byte span fit in `isize`; `data` is non-NULL whenever the tensor has
/// elements; `data + span` does not wrap the address space.
///
/// Device and dtype are kept in their raw `dlpack.h` form and converted when asked for, and the
/// byte span (checked by validation) is recomputed when asked for, so that rebuilding the layout
/// of a validated tensor costs no conversion and no pass over its strides.
#[derive(Clone, Copy)]
pub struct TensorLayout<'a> {
    data: *mut c_void,
    /// The `DLDevice`, packed in one word (see [`Packed`]).
    device: u64,
    /// The `DLDataType` and the bits one element occupies (sub-byte padding applied), packed in
    /// one word (see [`Packed`]).
    dtype: u64,
    shape: &'a [i64],
    strides: Option<&'a [i64]>,
    byte_offset: usize,
    numel: usize,
}

/// Packing of the small header fields of a [`TensorLayout`] into whole words. A layout is
/// built and then moved (returned) at once; built from 32-bit and 16-bit pieces, its moves read
/// back whole words that were just written in pieces, which stalls the processor (a failed
/// store-to-load forwarding) on every exchange.
struct Packed;

impl Packed {
    #[inline]
    fn device(d: ffi::DLDevice) -> u64 {
        d.device_type as u32 as u64 | (d.device_id as u32 as u64) << 32
    }

    #[inline]
    fn raw_device(word: u64) -> ffi::DLDevice {
        ffi::DLDevice {
            device_type: word as u32 as i32,
            device_id: (word >> 32) as u32 as i32,
        }
    }

    #[inline]
    fn dtype(d: ffi::DLDataType, element_bits: u32) -> u64 {
        d.code as u64 | (d.bits as u64) << 8 | (d.lanes as u64) << 16 | (element_bits as u64) << 32
    }

    #[inline]
    fn raw_dtype(word: u64) -> ffi::DLDataType {
        ffi::DLDataType {
            code: word as u8,
            bits: (word >> 8) as u8,
            lanes: (word >> 16) as u16,
        }
    }

    #[inline]
    fn element_bits(word: u64) -> u64 {
        word >> 32
    }
}

impl core::fmt::Debug for TensorLayout<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TensorLayout")
            .field("data", &self.data)
            .field("device", &self.device())
            .field("dtype", &self.dtype())
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("byte_offset", &self.byte_offset)
            .field("numel", &self.numel)
            .field("span", &self.span())
            .finish()
    }
}

/// Reads the `shape` and `strides` arrays of `t` and checks the layout.
///
/// `null_strides` says how a NULL `strides` pointer is read (see [`NullStrides::for_version`]).
/// `padded_subbyte` is the `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED` flag: sub-byte elements
/// then occupy one byte each.
///
/// # Errors
///
/// A [`LayoutError`] naming the first rule broken: negative or too large `ndim`, NULL `shape`,
/// negative extent, NULL `strides` where refused, zero-width or malformed dtype, overflow of the
/// element count or byte span, NULL `data` for a non-empty tensor, or a span that wraps the
/// address space.
///
/// # Safety
///
/// When `t.ndim > 0`, `t.shape` must be NULL or point to `t.ndim` readable `int64_t`, and
/// `t.strides` must be NULL or point to `t.ndim` readable `int64_t` (the `DLTensor` contract of
/// `dlpack.h`), both valid and unmodified for `'a`. Nothing else is dereferenced.
#[inline]
pub unsafe fn validate<'a>(
    t: &'a ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<TensorLayout<'a>, LayoutError> {
    // SAFETY: forwarded from the caller.
    let (layout, span) = unsafe { validate_unaddressed(t, null_strides, padded_subbyte) }?;
    check_address(layout.data, layout.numel, span)?;
    Ok(layout)
}

/// [`validate`] without the checks on `data` itself (NULL with elements, address wrap), which
/// returns the byte span it checked too.
///
/// # Safety
///
/// As for [`validate`].
unsafe fn validate_unaddressed<'a>(
    t: &'a ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<(TensorLayout<'a>, ByteSpan), LayoutError> {
    if t.ndim < 0 {
        return Err(LayoutError::NegativeNdim { ndim: t.ndim });
    }
    let ndim = t.ndim as usize;
    if ndim > MAX_NDIM {
        return Err(LayoutError::TooManyDims {
            ndim,
            max: MAX_NDIM,
        });
    }
    let element_bits = check_dtype(t.dtype, padded_subbyte)?;
    if t.byte_offset > isize::MAX as u64 {
        return Err(LayoutError::Overflow {
            what: "byte_offset",
        });
    }

    let shape: &'a [i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(LayoutError::NullShape { ndim });
    } else {
        // SAFETY: the caller guarantees `shape` points to `ndim` readable `int64_t` valid for
        // 'a; it is non-NULL (checked above) and `int64_t` is always aligned in a C array.
        unsafe { core::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides: Option<&'a [i64]> = if ndim == 0 || t.strides.is_null() {
        if ndim > 0 && null_strides == NullStrides::Refuse {
            return Err(LayoutError::NullStrides { ndim });
        }
        None
    } else {
        // SAFETY: as for `shape`: non-NULL, `ndim` readable `int64_t` valid for 'a (caller).
        Some(unsafe { core::slice::from_raw_parts(t.strides, ndim) })
    };

    // The element count, checked in `u64` (extents are `>= 0`), then bounded by `isize::MAX`.
    let mut numel: u64 = 1;
    for (axis, &extent) in shape.iter().enumerate() {
        if extent < 0 {
            return Err(LayoutError::NegativeExtent { axis, extent });
        }
        numel = match numel.checked_mul(extent as u64) {
            Some(n) => n,
            None => {
                return Err(LayoutError::Overflow {
                    what: "element count",
                });
            }
        };
    }
    if numel > isize::MAX as u64 {
        return Err(LayoutError::Overflow {
            what: "element count",
        });
    }
    let numel = numel as usize;
    let span = if numel == 0 {
        ByteSpan { start: 0, end: 0 }
    } else {
        byte_span(shape, strides, numel, element_bits, t.byte_offset)?
    };
    let layout = TensorLayout {
        data: t.data,
        device: Packed::device(t.device),
        // At most 255 * 65535 (or 8, padded).
        dtype: Packed::dtype(t.dtype, element_bits as u32),
        shape,
        strides,
        byte_offset: t.byte_offset as usize,
        numel,
    };
    Ok((layout, span))
}

impl<'a> TensorLayout<'a> {
    /// The layout of `t`, which a former [`validate`] accepted, rebuilt without checking
    /// anything again.
    ///
    /// # Safety
    ///
    /// [`validate`] accepted `t` with some `NullStrides` rule and the sub-byte flag `padded`;
    /// `t` and its `shape`/`strides` arrays have not changed since, and they stay valid and
    /// unmodified for `'a`.
    #[inline]
    pub(crate) unsafe fn from_validated(t: &'a ffi::DLTensor, padded_subbyte: bool) -> Self {
        // Validation succeeded, so `0 <= ndim <= MAX_NDIM`, the arrays are non-NULL where they
        // are read, and `bits * lanes` is the non-zero element width it checked.
        let ndim = t.ndim as usize;
        let shape: &'a [i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: validated non-NULL with `ndim` readable entries, unmodified for 'a
            // (caller).
            unsafe { core::slice::from_raw_parts(t.shape, ndim) }
        };
        let strides = if ndim == 0 || t.strides.is_null() {
            None
        } else {
            // SAFETY: as for `shape`.
            Some(unsafe { core::slice::from_raw_parts(t.strides, ndim) })
        };
        let numel = validated_numel(shape);
        let bits = t.dtype.bits as u32 * t.dtype.lanes as u32;
        Self {
            data: t.data,
            device: Packed::device(t.device),
            dtype: Packed::dtype(t.dtype, if padded_subbyte && bits < 8 { 8 } else { bits }),
            shape,
            strides,
            byte_offset: t.byte_offset as usize,
            numel,
        }
    }
}

/// The element count of a validated shape: the extents are `>= 0` and their product was checked
/// to fit in `isize`, so it is computed without checks.
#[inline]
pub(crate) fn validated_numel(shape: &[i64]) -> usize {
    shape
        .iter()
        .fold(1usize, |n, &e| n.wrapping_mul(e as usize))
}

/// [`TensorLayout::is_contiguous`] on the arrays of a validated layout of `numel` elements.
#[inline]
pub(crate) fn is_contiguous(
    shape: &[i64],
    strides: Option<&[i64]>,
    numel: usize,
    order: Contiguity,
) -> bool {
    let axes = 0..shape.len();
    match order {
        Contiguity::C => compact_in(shape, strides, numel, axes.rev()),
        Contiguity::F => compact_in(shape, strides, numel, axes),
        Contiguity::Any => {
            compact_in(shape, strides, numel, axes.clone().rev())
                || compact_in(shape, strides, numel, axes)
        }
    }
}

/// Whether the axes, innermost first, are laid out compactly. Axes of extent 1 are ignored
/// (their stride is arbitrary), and zero-size tensors are compact.
#[inline]
fn compact_in(
    shape: &[i64],
    strides: Option<&[i64]>,
    numel: usize,
    axes_inner_first: impl Iterator<Item = usize>,
) -> bool {
    if numel == 0 {
        return true;
    }
    let mut expected: i64 = 1;
    for axis in axes_inner_first {
        let extent = shape[axis];
        if extent == 1 {
            continue;
        }
        let stride = match strides {
            Some(strides) => strides[axis],
            // NULL: compact row-major, whose strides are the products of the later extents
            // (no overflow: they divide `numel`, which is not 0 here).
            None => shape[axis + 1..].iter().product(),
        };
        if stride != expected {
            return false;
        }
        // Extents are >= 2 here and their product divides `numel`: no overflow.
        expected *= extent;
    }
    true
}

/// Whether the raw dtype `raw` is `T::DTYPE`: `DataType::from_raw(raw) == T::DTYPE`, without the
/// conversion when `T::DTYPE` is canonical (every `Element` of this crate).
#[inline]
pub(crate) fn raw_dtype_is<T: Element>(raw: ffi::DLDataType) -> bool {
    // `DataType::from_raw` is one-to-one onto the canonical dtypes (those whose `Unknown` codes
    // are unknown indeed), so for a canonical `T::DTYPE` comparing raw headers compares dtypes.
    if const { is_canonical(T::DTYPE) } {
        raw == const { T::DTYPE.to_raw() }
    } else {
        DataType::from_raw(raw) == T::DTYPE
    }
}

/// Whether `DataType::from_raw(dtype.to_raw()) == dtype`: false only for an `Unknown` code that
/// names a known one.
const fn is_canonical(dtype: DataType) -> bool {
    match dtype.code {
        DataTypeCode::Unknown(code) => {
            matches!(DataTypeCode::from_raw(code), DataTypeCode::Unknown(_))
        }
        _ => true,
    }
}

/// Whether memory of this raw device type is host-accessible: [`DeviceType::is_host_accessible`]
/// on the raw code, without the conversion.
///
/// [`DeviceType::is_host_accessible`]: crate::DeviceType::is_host_accessible
#[inline]
pub(crate) fn raw_host_accessible(device_type: ffi::DLDeviceType) -> bool {
    matches!(
        device_type,
        ffi::kDLCPU | ffi::kDLCUDAHost | ffi::kDLROCMHost | ffi::kDLCUDAManaged
    )
}

/// Bits one element occupies in memory, after the dtype rules of spec sections 1.5 and 1.6.
#[inline]
pub(crate) fn check_dtype(raw: ffi::DLDataType, padded_subbyte: bool) -> Result<u64, LayoutError> {
    if raw.bits == 0 || raw.lanes == 0 {
        return Err(LayoutError::ZeroWidthDtype {
            dtype: DataType::from_raw(raw),
        });
    }
    let required = match raw.code {
        ffi::kDLFloat6_e2m3fn | ffi::kDLFloat6_e3m2fn => 6,
        ffi::kDLFloat4_e2m1fn => 4,
        _ => raw.bits,
    };
    if raw.bits != required {
        return Err(LayoutError::DtypeWidth {
            dtype: DataType::from_raw(raw),
            expected_bits: required,
        });
    }
    let bits = raw.bits as u64 * raw.lanes as u64;
    Ok(if padded_subbyte && bits < 8 { 8 } else { bits })
}

/// The byte span touched by a non-empty layout (`numel > 0`, checked to fit in `isize`),
/// relative to `data`.
#[inline]
fn byte_span(
    shape: &[i64],
    strides: Option<&[i64]>,
    numel: usize,
    element_bits: u64,
    byte_offset: u64,
) -> Result<ByteSpan, LayoutError> {
    let (lo, hi) = match strides {
        Some(strides) => {
            let mut reach = Reach::new();
            for (&extent, &stride) in shape.iter().zip(strides) {
                reach.add(extent, stride);
            }
            reach.bounds()?
        }
        // `numel` fits in `isize`, hence in `i64`.
        None => (0, numel as i64 - 1),
    };
    span_from_bounds(lo, hi, element_bits, byte_offset)
}

/// The lowest and highest element index a strided layout reaches, relative to element
/// `(0, ..., 0)`, accumulated axis by axis in checked `i64`.
///
/// A reach or sum outside `i64` is refused as an overflow: the exact computation (`i128`)
/// refuses the same layouts, because such a span cannot fit in `isize`.
#[derive(Clone, Copy)]
pub(crate) struct Reach {
    lo: i64,
    hi: i64,
    overflow: bool,
}

impl Reach {
    #[inline]
    pub(crate) const fn new() -> Self {
        Self {
            lo: 0,
            hi: 0,
            overflow: false,
        }
    }

    /// Adds an axis of `extent >= 1` elements and `stride` elements.
    #[inline]
    pub(crate) fn add(&mut self, extent: i64, stride: i64) {
        match (extent - 1).checked_mul(stride) {
            Some(reach) if reach < 0 => match self.lo.checked_add(reach) {
                Some(lo) => self.lo = lo,
                None => self.overflow = true,
            },
            Some(reach) => match self.hi.checked_add(reach) {
                Some(hi) => self.hi = hi,
                None => self.overflow = true,
            },
            None => self.overflow = true,
        }
    }

    /// `(lo, hi)`, or the overflow.
    #[inline]
    pub(crate) fn bounds(self) -> Result<(i64, i64), LayoutError> {
        if self.overflow {
            return Err(LayoutError::Overflow { what: "byte span" });
        }
        Ok((self.lo, self.hi))
    }
}

/// The byte span, relative to `data`, of the element indices `lo ..= hi` (`lo <= 0 <= hi`)
/// relative to element `(0, ..., 0)`, which sits `byte_offset <= isize::MAX` bytes after `data`.
///
/// Elements of whole bytes are computed with checked `i64` arithmetic; every overflow it
/// reports is a span that does not fit in `isize` (the bounds the exact computation checks),
/// so it refuses exactly what the exact `i128` computation in bits refuses. Other widths take
/// that exact computation.
#[inline(always)]
pub(crate) fn span_from_bounds(
    lo: i64,
    hi: i64,
    element_bits: u64,
    byte_offset: u64,
) -> Result<ByteSpan, LayoutError> {
    const OVERFLOW: LayoutError = LayoutError::Overflow { what: "byte span" };
    if element_bits % 8 != 0 {
        return span_from_bounds_bits(lo, hi, element_bits, byte_offset);
    }
    // Element bytes: `element_bits` is a multiple of 8, at most 255 * 65535.
    let size = (element_bits / 8) as i64;
    // In bytes relative to `data`: start = byte_offset + lo * size (`lo <= 0`), end =
    // byte_offset + (hi + 1) * size. An overflow of `lo * size` below `i64::MIN` makes
    // `end - start > i64::MAX`; of `hi + 1`, `(hi + 1) * size` or the `end` sum, `end > i64::MAX`.
    let (Some(lo_bytes), Some(end_bytes)) = (
        lo.checked_mul(size),
        hi.checked_add(1).and_then(|n| n.checked_mul(size)),
    ) else {
        return Err(OVERFLOW);
    };
    // `byte_offset <= isize::MAX` (checked by the caller) and `lo_bytes <= 0`: no overflow.
    let offset = byte_offset as i64;
    let start = offset + lo_bytes;
    let Some(end) = offset.checked_add(end_bytes) else {
        return Err(OVERFLOW);
    };
    let Some(len) = end_bytes.checked_sub(lo_bytes) else {
        return Err(OVERFLOW);
    };
    if start < isize::MIN as i64 || end > isize::MAX as i64 || len > isize::MAX as i64 {
        return Err(OVERFLOW);
    }
    Ok(ByteSpan {
        start: start as isize,
        end: end as isize,
    })
}

/// [`span_from_bounds`] for any element width, in bits with `i128` arithmetic (sub-byte and
/// other widths that are not whole bytes).
#[cold]
fn span_from_bounds_bits(
    lo: i64,
    hi: i64,
    element_bits: u64,
    byte_offset: u64,
) -> Result<ByteSpan, LayoutError> {
    const OVERFLOW: LayoutError = LayoutError::Overflow { what: "byte span" };
    let (lo, hi) = (lo as i128, hi as i128);
    let bits = element_bits as i128;
    let offset_bits = byte_offset as i128 * 8;
    let start_bits = offset_bits + lo * bits;
    let end_bits = offset_bits + (hi + 1) * bits;
    let start = start_bits.div_euclid(8);
    let end = (end_bits + 7).div_euclid(8);
    if start < isize::MIN as i128 || end > isize::MAX as i128 || end - start > isize::MAX as i128 {
        return Err(OVERFLOW);
    }
    Ok(ByteSpan {
        start: start as isize,
        end: end as isize,
    })
}

/// Checks `data` against the span of a layout of `numel` elements: non-NULL when there are
/// elements, and `data + span` inside the address space.
#[inline]
pub(crate) fn check_address(
    data: *mut c_void,
    numel: usize,
    span: ByteSpan,
) -> Result<(), LayoutError> {
    if numel == 0 {
        return Ok(());
    }
    if data.is_null() {
        return Err(LayoutError::NullData { numel });
    }
    // `start < end` for a non-empty tensor, so these two sums stay in `0..=usize::MAX`
    // exactly when both ends of the span do.
    let base = data as usize;
    if base.checked_add_signed(span.start).is_none() || base.checked_add_signed(span.end).is_none()
    {
        return Err(LayoutError::Overflow {
            what: "address of the data span",
        });
    }
    Ok(())
}

/// `DataType::to_raw`, inlined where it is called (the exporter's hot path).
#[inline]
pub(crate) fn dtype_to_raw(dtype: DataType) -> ffi::DLDataType {
    use DataTypeCode as C;
    let code = match dtype.code {
        C::Int => ffi::kDLInt,
        C::UInt => ffi::kDLUInt,
        C::Float => ffi::kDLFloat,
        C::OpaqueHandle => ffi::kDLOpaqueHandle,
        C::Bfloat => ffi::kDLBfloat,
        C::Complex => ffi::kDLComplex,
        C::Bool => ffi::kDLBool,
        C::Float8E3M4 => ffi::kDLFloat8_e3m4,
        C::Float8E4M3 => ffi::kDLFloat8_e4m3,
        C::Float8E4M3B11Fnuz => ffi::kDLFloat8_e4m3b11fnuz,
        C::Float8E4M3Fn => ffi::kDLFloat8_e4m3fn,
        C::Float8E4M3Fnuz => ffi::kDLFloat8_e4m3fnuz,
        C::Float8E5M2 => ffi::kDLFloat8_e5m2,
        C::Float8E5M2Fnuz => ffi::kDLFloat8_e5m2fnuz,
        C::Float8E8M0Fnu => ffi::kDLFloat8_e8m0fnu,
        C::Float6E2M3Fn => ffi::kDLFloat6_e2m3fn,
        C::Float6E3M2Fn => ffi::kDLFloat6_e3m2fn,
        C::Float4E2M1Fn => ffi::kDLFloat4_e2m1fn,
        C::Unknown(code) => code,
    };
    ffi::DLDataType {
        code,
        bits: dtype.bits,
        lanes: dtype.lanes,
    }
}

/// `Device::to_raw`, inlined where it is called (the exporter's hot path).
#[inline]
pub(crate) fn device_to_raw(device: Device) -> ffi::DLDevice {
    use DeviceType as D;
    let device_type = match device.device_type {
        D::Cpu => ffi::kDLCPU,
        D::Cuda => ffi::kDLCUDA,
        D::CudaHost => ffi::kDLCUDAHost,
        D::OpenCl => ffi::kDLOpenCL,
        D::Vulkan => ffi::kDLVulkan,
        D::Metal => ffi::kDLMetal,
        D::Vpi => ffi::kDLVPI,
        D::Rocm => ffi::kDLROCM,
        D::RocmHost => ffi::kDLROCMHost,
        D::ExtDev => ffi::kDLExtDev,
        D::CudaManaged => ffi::kDLCUDAManaged,
        D::OneApi => ffi::kDLOneAPI,
        D::WebGpu => ffi::kDLWebGPU,
        D::Hexagon => ffi::kDLHexagon,
        D::Maia => ffi::kDLMAIA,
        D::Trn => ffi::kDLTrn,
        D::Unknown(raw) => raw,
    };
    ffi::DLDevice {
        device_type,
        device_id: device.device_id,
    }
}

impl<'a> TensorLayout<'a> {
    /// `DLTensor::data`: base pointer, before `byte_offset`.
    #[inline]
    pub fn data(&self) -> *mut c_void {
        self.data
    }

    /// Pointer to logical element `(0, ..., 0)`: `data + byte_offset`. For a zero-size tensor
    /// this may be NULL or dangling and must not be read.
    #[inline]
    pub fn first_element_ptr(&self) -> *mut u8 {
        (self.data as *mut u8).wrapping_add(self.byte_offset)
    }

    /// Device of the memory.
    #[inline]
    pub fn device(&self) -> Device {
        Device::from_raw(Packed::raw_device(self.device))
    }

    /// Element type.
    #[inline]
    pub fn dtype(&self) -> DataType {
        DataType::from_raw(self.raw_dtype())
    }

    /// The raw `DLDataType`, as in the header.
    #[inline]
    pub(crate) fn raw_dtype(&self) -> ffi::DLDataType {
        Packed::raw_dtype(self.dtype)
    }

    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Extents in elements, one per axis (all `>= 0`).
    #[inline]
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }

    /// The strides array in elements as the producer gave it, or `None` when it was NULL
    /// (compact row-major, or a 0-d tensor).
    #[inline]
    pub fn raw_strides(&self) -> Option<&'a [i64]> {
        self.strides
    }

    /// Stride of `axis` in elements; computed as compact row-major when the producer gave NULL.
    ///
    /// # Panics
    ///
    /// If `axis >= ndim`.
    #[inline]
    pub fn stride(&self, axis: usize) -> i64 {
        match self.strides {
            Some(strides) => strides[axis],
            None => {
                assert!(
                    axis < self.shape.len(),
                    "axis {axis} out of range for ndim {}",
                    self.ndim()
                );
                // Saturates only for zero-size tensors, whose strides are never used to step.
                self.shape[axis + 1..]
                    .iter()
                    .fold(1i64, |acc, &e| acc.saturating_mul(e))
            }
        }
    }

    /// All strides in elements (computed when the producer gave NULL).
    pub fn strides_vec(&self) -> Vec<i64> {
        (0..self.ndim()).map(|axis| self.stride(axis)).collect()
    }

    /// `DLTensor::byte_offset`, in bytes (validated to fit in `isize`).
    #[inline]
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }

    /// Number of elements (product of the extents; 1 for a 0-d tensor).
    #[inline]
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Bytes touched relative to `data`, `byte_offset` included.
    ///
    /// Computed on each call, with the arithmetic validation checked.
    pub fn span(&self) -> ByteSpan {
        if self.numel == 0 {
            return ByteSpan { start: 0, end: 0 };
        }
        let span = byte_span(
            self.shape,
            self.strides,
            self.numel,
            Packed::element_bits(self.dtype),
            self.byte_offset as u64,
        );
        // Validation computed this very span from these very values (a `TensorLayout` exists
        // only for a validated header, which cannot change while it is borrowed): it fits.
        debug_assert!(span.is_ok(), "the span of a validated layout was checked");
        span.unwrap_or(ByteSpan { start: 0, end: 0 })
    }

    /// Whether the elements are laid out compactly in the given order. Axes of extent 1 are
    /// ignored (their stride is arbitrary), and zero-size tensors are contiguous.
    #[inline]
    pub fn is_contiguous(&self, order: Contiguity) -> bool {
        is_contiguous(self.shape, self.strides, self.numel, order)
    }

    /// Checks that the tensor can be read as a host slice or host elements of `T`: the dtype is
    /// `T::DTYPE`, the device is host-accessible, and element `(0, ..., 0)` is aligned for `T`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::DtypeMismatch`], [`LayoutError::NotHostAccessible`] or
    /// [`LayoutError::Misaligned`].
    #[inline]
    pub fn check_typed<T: Element>(&self) -> Result<(), LayoutError> {
        if !raw_dtype_is::<T>(self.raw_dtype()) {
            return Err(LayoutError::DtypeMismatch {
                found: self.dtype(),
                expected: T::DTYPE,
            });
        }
        if !raw_host_accessible(Packed::raw_device(self.device).device_type) {
            return Err(LayoutError::NotHostAccessible {
                device: self.device(),
            });
        }
        if self.numel > 0 {
            let address = self.first_element_ptr() as usize;
            let align = core::mem::align_of::<T>();
            if address % align != 0 {
                return Err(LayoutError::Misaligned { address, align });
            }
            // Strides are in elements, so every element shares the alignment of element 0.
        }
        Ok(())
    }

    /// Requires compact storage in `order`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::NotContiguous`], naming the shape and strides found.
    #[inline]
    pub fn require_contiguous(&self, order: Contiguity) -> Result<(), LayoutError> {
        if self.is_contiguous(order) {
            Ok(())
        } else {
            Err(self.not_contiguous(order))
        }
    }

    #[cold]
    #[inline(never)]
    fn not_contiguous(&self, order: Contiguity) -> LayoutError {
        LayoutError::NotContiguous {
            expected: order,
            shape: self.shape.to_vec(),
            strides: self.strides_vec(),
        }
    }

    /// Byte offset of the element at `index` relative to [`Self::first_element_ptr`].
    ///
    /// # Errors
    ///
    /// [`LayoutError::IndexRank`] or [`LayoutError::IndexOutOfBounds`]; element sizes that are
    /// not whole bytes give [`LayoutError::SubByteAccess`].
    pub fn offset_of(&self, index: &[usize]) -> Result<isize, LayoutError> {
        let size = self.element_bytes()? as i64;
        if index.len() != self.ndim() {
            return Err(LayoutError::IndexRank {
                found: index.len(),
                expected: self.ndim(),
            });
        }
        let mut offset: i64 = 0;
        for (axis, &i) in index.iter().enumerate() {
            if i as u64 >= self.shape[axis] as u64 {
                return Err(LayoutError::IndexOutOfBounds {
                    axis,
                    index: i,
                    extent: self.shape[axis],
                });
            }
            // In range: `i < extent`, and the span of the whole tensor fits in isize.
            offset += i as i64 * self.stride(axis) * size;
        }
        Ok(offset as isize)
    }

    fn element_bytes(&self) -> Result<usize, LayoutError> {
        let dtype = self.dtype();
        match dtype.element_bytes() {
            Some(size) => Ok(size),
            None => Err(LayoutError::SubByteAccess { dtype }),
        }
    }

    /// Calls `f` with the byte offset (relative to [`Self::first_element_ptr`]) of every
    /// element, in logical row-major order. No allocation.
    ///
    /// # Errors
    ///
    /// [`LayoutError::SubByteAccess`] for element sizes that are not whole bytes.
    pub fn for_each_offset(&self, mut f: impl FnMut(isize)) -> Result<(), LayoutError> {
        let size = self.element_bytes()? as isize;
        if self.numel == 0 {
            return Ok(());
        }
        let ndim = self.ndim();
        // Only axes of extent > 1 move: their reach `(extent - 1) * stride * size` is inside
        // the validated span, so these products and the running offset fit in `isize`. Axes of
        // extent 1 may carry any stride, even one that would overflow, and are never stepped.
        let mut byte_strides = [0isize; MAX_NDIM];
        for (axis, s) in byte_strides.iter_mut().enumerate().take(ndim) {
            if self.shape[axis] > 1 {
                *s = self.stride(axis) as isize * size;
            }
        }
        let mut index = [0i64; MAX_NDIM];
        let mut offset: isize = 0;
        for _ in 0..self.numel {
            f(offset);
            // Odometer step, innermost axis fastest.
            for axis in (0..ndim).rev() {
                if index[axis] + 1 < self.shape[axis] {
                    index[axis] += 1;
                    offset += byte_strides[axis];
                    break;
                }
                offset -= byte_strides[axis] * index[axis] as isize;
                index[axis] = 0;
            }
        }
        Ok(())
    }
}

/// Compact row-major strides, in elements, for `shape` (in elements).
pub fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (axis, &extent) in shape.iter().enumerate().rev() {
        strides[axis] = acc;
        acc = acc.saturating_mul(extent.max(1));
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ptr;

    fn tensor(
        data: *mut c_void,
        shape: &mut [i64],
        strides: Option<&mut [i64]>,
        dtype: DataType,
    ) -> ffi::DLTensor {
        ffi::DLTensor {
            data,
            device: Device::CPU.to_raw(),
            ndim: shape.len() as i32,
            dtype: dtype.to_raw(),
            shape: if shape.is_empty() {
                ptr::null_mut()
            } else {
                shape.as_mut_ptr()
            },
            strides: strides.map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }

    fn check(t: &ffi::DLTensor) -> Result<TensorLayout<'_>, LayoutError> {
        // SAFETY: every test tensor points `shape`/`strides` at live arrays of `ndim` entries.
        unsafe { validate(t, NullStrides::MeanCompact, false) }
    }

    #[test]
    fn c01_negative_strides_span_below_data() {
        let mut buf = [0i32; 12];
        // Flipped along axis 1 then transposed: element (0, 0) is buf[3].
        let mut shape = [4i64, 3];
        let mut strides = [-1i64, 4];
        let mut t = tensor(
            buf.as_mut_ptr().cast(),
            &mut shape,
            Some(&mut strides),
            DataType::I32,
        );
        t.byte_offset = 12;
        let layout = check(&t).unwrap();
        assert_eq!(layout.span(), ByteSpan { start: 0, end: 48 });
        assert!(!layout.is_contiguous(Contiguity::Any));
        let mut offsets = vec![];
        layout.for_each_offset(|o| offsets.push(o / 4)).unwrap();
        assert_eq!(offsets, [0, 4, 8, -1, 3, 7, -2, 2, 6, -3, 1, 5]);
    }

    #[test]
    fn zero_size_allows_null_data_and_is_contiguous() {
        let mut shape = [2i64, 0, 3];
        let t = tensor(ptr::null_mut(), &mut shape, None, DataType::F32);
        let layout = check(&t).unwrap();
        assert_eq!(layout.numel(), 0);
        assert!(layout.span().is_empty());
        assert!(layout.is_contiguous(Contiguity::C));
        let mut n = 0;
        layout.for_each_offset(|_| n += 1).unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn zero_d_may_have_null_shape_and_strides() {
        let mut x = 7.0f64;
        let t = tensor((&mut x as *mut f64).cast(), &mut [], None, DataType::F64);
        // SAFETY: ndim is 0, nothing is read through shape/strides.
        let layout = unsafe { validate(&t, NullStrides::Refuse, false) }.unwrap();
        assert_eq!(layout.numel(), 1);
        assert_eq!(layout.span(), ByteSpan { start: 0, end: 8 });
    }

    #[test]
    fn refusals_name_what_was_found() {
        let mut x = 0u8;
        let p: *mut c_void = (&mut x as *mut u8).cast();
        let mut shape = [3i64, -2];
        assert_eq!(
            check(&tensor(p, &mut shape, None, DataType::U8)).unwrap_err(),
            LayoutError::NegativeExtent {
                axis: 1,
                extent: -2
            }
        );
        let mut shape = [1i64 << 40, 1 << 40];
        assert!(matches!(
            check(&tensor(p, &mut shape, None, DataType::U8)),
            Err(LayoutError::Overflow { .. })
        ));
        let mut shape = [3i64];
        assert_eq!(
            check(&tensor(ptr::null_mut(), &mut shape, None, DataType::U8)).unwrap_err(),
            LayoutError::NullData { numel: 3 }
        );
        let mut t = tensor(p, &mut shape, None, DataType::U8);
        t.ndim = -1;
        assert_eq!(
            check(&t).unwrap_err(),
            LayoutError::NegativeNdim { ndim: -1 }
        );
        t.ndim = 65;
        assert_eq!(
            check(&t).unwrap_err(),
            LayoutError::TooManyDims { ndim: 65, max: 64 }
        );
        t.ndim = 1;
        // SAFETY: shape points at one live entry.
        let refused = unsafe { validate(&t, NullStrides::Refuse, false) };
        assert_eq!(refused.unwrap_err(), LayoutError::NullStrides { ndim: 1 });
        t.shape = ptr::null_mut();
        assert_eq!(check(&t).unwrap_err(), LayoutError::NullShape { ndim: 1 });
        let mut shape = [3i64];
        let t = tensor(
            p,
            &mut shape,
            None,
            DataType::new(DataTypeCode::Float, 32, 0),
        );
        assert!(matches!(check(&t), Err(LayoutError::ZeroWidthDtype { .. })));
        let t = tensor(
            p,
            &mut shape,
            None,
            DataType::scalar(DataTypeCode::Float4E2M1Fn, 8),
        );
        assert!(matches!(
            check(&t),
            Err(LayoutError::DtypeWidth {
                expected_bits: 4,
                ..
            })
        ));
    }

    #[test]
    fn huge_strides_overflow_instead_of_wrapping() {
        let mut x = 0u64;
        let mut shape = [3i64];
        let mut strides = [i64::MAX / 2];
        let t = tensor(
            (&mut x as *mut u64).cast(),
            &mut shape,
            Some(&mut strides),
            DataType::U64,
        );
        assert!(matches!(check(&t), Err(LayoutError::Overflow { .. })));
    }

    #[test]
    fn contiguity_ignores_extent_one_axes() {
        let mut x = [0f32; 6];
        let mut shape = [1i64, 6, 1];
        let mut strides = [999i64, 1, -5];
        let t = tensor(
            x.as_mut_ptr().cast(),
            &mut shape,
            Some(&mut strides),
            DataType::F32,
        );
        let layout = check(&t).unwrap();
        assert!(layout.is_contiguous(Contiguity::C));
        assert!(layout.is_contiguous(Contiguity::F));
        let mut shape = [2i64, 3];
        let mut strides = [1i64, 2];
        let t = tensor(
            x.as_mut_ptr().cast(),
            &mut shape,
            Some(&mut strides),
            DataType::F32,
        );
        let layout = check(&t).unwrap();
        assert!(!layout.is_contiguous(Contiguity::C));
        assert!(layout.is_contiguous(Contiguity::F));
        let mut shape = [2i64, 3];
        let t = tensor(x.as_mut_ptr().cast(), &mut shape, None, DataType::F32);
        let layout = check(&t).unwrap();
        assert!(layout.is_contiguous(Contiguity::C));
        assert!(!layout.is_contiguous(Contiguity::F));
        assert_eq!(layout.strides_vec(), [3, 1]);
    }

    #[test]
    fn extent_one_axes_with_huge_strides_are_never_stepped() {
        let mut x = [1u16, 2];
        let mut shape = [2i64, 1, 1];
        let mut strides = [1i64, i64::MAX, i64::MIN];
        let t = tensor(
            x.as_mut_ptr().cast(),
            &mut shape,
            Some(&mut strides),
            DataType::U16,
        );
        let layout = check(&t).unwrap();
        assert_eq!(layout.span(), ByteSpan { start: 0, end: 4 });
        let mut offsets = vec![];
        layout.for_each_offset(|o| offsets.push(o)).unwrap();
        assert_eq!(offsets, [0, 2]);
        assert_eq!(layout.offset_of(&[1, 0, 0]).unwrap(), 2);
        // A zero-size tensor with NULL strides and huge extents: strides saturate, no overflow.
        let mut shape = [0i64, 1 << 40, 1 << 40];
        let t = tensor(ptr::null_mut(), &mut shape, None, DataType::U16);
        let layout = check(&t).unwrap();
        assert_eq!(layout.stride(0), i64::MAX);
        assert!(layout.is_contiguous(Contiguity::C));
    }

    #[test]
    fn sub_byte_span_is_packed_unless_padded() {
        let mut x = [0u8; 8];
        let mut shape = [5i64];
        let t = tensor(
            x.as_mut_ptr().cast(),
            &mut shape,
            None,
            DataType::scalar(DataTypeCode::Float4E2M1Fn, 4),
        );
        assert_eq!(check(&t).unwrap().span(), ByteSpan { start: 0, end: 3 });
        // SAFETY: shape points at one live entry.
        let padded = unsafe { validate(&t, NullStrides::MeanCompact, true) }.unwrap();
        assert_eq!(padded.span(), ByteSpan { start: 0, end: 5 });
    }

    #[test]
    fn typed_checks() {
        let mut x = [0u32; 4];
        let mut shape = [3i64];
        let mut t = tensor(x.as_mut_ptr().cast(), &mut shape, None, DataType::U32);
        let layout = check(&t).unwrap();
        assert!(layout.check_typed::<u32>().is_ok());
        assert_eq!(
            layout.check_typed::<f32>().unwrap_err(),
            LayoutError::DtypeMismatch {
                found: DataType::U32,
                expected: DataType::F32
            }
        );
        t.byte_offset = 2;
        let layout = check(&t).unwrap();
        assert!(matches!(
            layout.check_typed::<u32>(),
            Err(LayoutError::Misaligned { align: 4, .. })
        ));
        t.byte_offset = 0;
        t.device = Device::cuda(0).to_raw();
        let layout = check(&t).unwrap();
        assert_eq!(
            layout.check_typed::<u32>().unwrap_err(),
            LayoutError::NotHostAccessible {
                device: Device::cuda(0)
            }
        );
    }

    #[test]
    fn offset_of_checks_rank_and_bounds() {
        let mut x = [0i64; 12];
        let mut shape = [3i64, 4];
        let mut strides = [1i64, 3];
        let t = tensor(
            x.as_mut_ptr().cast(),
            &mut shape,
            Some(&mut strides),
            DataType::I64,
        );
        let layout = check(&t).unwrap();
        assert_eq!(layout.offset_of(&[2, 3]).unwrap(), (2 + 9) * 8);
        assert_eq!(
            layout.offset_of(&[2]).unwrap_err(),
            LayoutError::IndexRank {
                found: 1,
                expected: 2
            }
        );
        assert_eq!(
            layout.offset_of(&[3, 0]).unwrap_err(),
            LayoutError::IndexOutOfBounds {
                axis: 0,
                index: 3,
                extent: 3
            }
        );
    }

    #[test]
    fn compact_strides_of_shapes() {
        assert_eq!(compact_strides(&[2, 3, 4]), [12, 4, 1]);
        assert_eq!(compact_strides(&[]), Vec::<i64>::new());
        assert_eq!(compact_strides(&[2, 0, 3]), [3, 3, 1]);
    }

    #[test]
    fn raw_host_access_agrees_with_device_type() {
        for code in -3..64 {
            assert_eq!(
                raw_host_accessible(code),
                crate::DeviceType::from_raw(code).is_host_accessible(),
                "device type {code}"
            );
        }
    }

    /// The span as it was computed before the `i64` arithmetic: every index and byte in
    /// `i128`, bounds checked at each axis. The reference the fast span must agree with.
    fn exact_span(
        shape: &[i64],
        strides: Option<&[i64]>,
        element_bits: u64,
        byte_offset: u64,
    ) -> Result<ByteSpan, LayoutError> {
        const OVERFLOW: LayoutError = LayoutError::Overflow { what: "byte span" };
        let (mut lo, mut hi): (i128, i128) = (0, 0);
        match strides {
            Some(strides) => {
                for (&extent, &stride) in shape.iter().zip(strides) {
                    let reach = (extent as i128 - 1) * stride as i128;
                    if reach < 0 {
                        lo += reach
                    } else {
                        hi += reach
                    }
                    if lo < i64::MIN as i128 || hi > i64::MAX as i128 {
                        return Err(OVERFLOW);
                    }
                }
            }
            None => hi = shape.iter().map(|&e| e as i128).product::<i128>() - 1,
        }
        let bits = element_bits as i128;
        let offset_bits = byte_offset as i128 * 8;
        let start = (offset_bits + lo * bits).div_euclid(8);
        let end = (offset_bits + (hi + 1) * bits + 7).div_euclid(8);
        if start < isize::MIN as i128
            || end > isize::MAX as i128
            || end - start > isize::MAX as i128
        {
            return Err(OVERFLOW);
        }
        Ok(ByteSpan {
            start: start as isize,
            end: end as isize,
        })
    }

    /// The checked `i64` span agrees with the exact `i128` computation, results and refusals
    /// alike, on values around every bound, for whole-byte and sub-byte widths.
    #[test]
    fn i64_span_agrees_with_exact_span() {
        let edges = [
            i64::MIN,
            i64::MIN + 1,
            i64::MIN / 2,
            i64::MIN / 3,
            -(1 << 40),
            -(1 << 32),
            -7,
            -1,
            0,
            1,
            2,
            3,
            7,
            1 << 32,
            1 << 40,
            i64::MAX / 3,
            i64::MAX / 2,
            i64::MAX - 1,
            i64::MAX,
        ];
        let extents = [
            1i64,
            2,
            3,
            1 << 20,
            1 << 31,
            1 << 40,
            i64::MAX / 2,
            i64::MAX,
        ];
        let offsets = [
            0u64,
            1,
            8,
            1 << 40,
            isize::MAX as u64 / 2,
            isize::MAX as u64,
        ];
        let mut checked = 0;
        for bits in [4u64, 6, 8, 12, 16, 64, 8 * 255, 255 * 65535] {
            for &offset in &offsets {
                for &e0 in &extents {
                    for &e1 in &extents {
                        for &s0 in &edges {
                            for &s1 in &edges {
                                let shape = [e0, e1];
                                let strides = [s0, s1];
                                let fast = byte_span(&shape, Some(&strides), 1, bits, offset);
                                let exact = exact_span(&shape, Some(&strides), bits, offset);
                                assert_eq!(fast, exact, "{shape:?} {strides:?} {bits} {offset}");
                                checked += 1;
                            }
                        }
                    }
                }
                for numel in [1usize, 2, 1 << 40, isize::MAX as usize] {
                    let shape = [numel as i64];
                    let fast = byte_span(&shape, None, numel, bits, offset);
                    let exact = exact_span(&shape, None, bits, offset);
                    assert_eq!(fast, exact, "{numel} {bits} {offset}");
                }
            }
        }
        assert!(checked > 10_000);
    }

    #[test]
    fn raw_dtype_comparison_is_exact() {
        assert!(is_canonical(DataType::F32));
        assert!(is_canonical(DataType::new(
            DataTypeCode::Unknown(200),
            8,
            1
        )));
        assert!(!is_canonical(DataType::new(
            DataTypeCode::Unknown(2),
            32,
            1
        )));
        assert!(raw_dtype_is::<f32>(DataType::F32.to_raw()));
        assert!(!raw_dtype_is::<f32>(DataType::I32.to_raw()));
        assert!(!raw_dtype_is::<f32>(
            DataType::new(DataTypeCode::Float, 32, 2).to_raw()
        ));
        assert!(raw_dtype_is::<[f32; 2]>(
            DataType::new(DataTypeCode::Float, 32, 2).to_raw()
        ));
    }

    #[test]
    fn packed_fields_round_trip() {
        for (code, bits, lanes, element_bits) in [
            (0u8, 0u8, 0u16, 0u32),
            (2, 32, 1, 32),
            (17, 4, 65535, 8),
            (255, 255, 65535, u32::MAX),
        ] {
            let raw = ffi::DLDataType { code, bits, lanes };
            let word = Packed::dtype(raw, element_bits);
            assert_eq!(Packed::raw_dtype(word), raw);
            assert_eq!(Packed::element_bits(word), element_bits as u64);
        }
        for (device_type, device_id) in
            [(1, 0), (-1, -7), (i32::MAX, i32::MIN), (i32::MIN, i32::MAX)]
        {
            let raw = ffi::DLDevice {
                device_type,
                device_id,
            };
            assert_eq!(Packed::raw_device(Packed::device(raw)), raw);
        }
    }

    #[test]
    fn inlined_conversions_agree_with_to_raw() {
        for code in 0..=u8::MAX {
            for (bits, lanes) in [(8, 1), (32, 4)] {
                let raw = ffi::DLDataType { code, bits, lanes };
                let dtype = DataType::from_raw(raw);
                assert_eq!(dtype_to_raw(dtype), dtype.to_raw());
                assert_eq!(dtype_to_raw(dtype), raw);
            }
        }
        for device_type in -3..64 {
            let raw = ffi::DLDevice {
                device_type,
                device_id: 3,
            };
            let device = Device::from_raw(raw);
            assert_eq!(device_to_raw(device), device.to_raw());
            assert_eq!(device_to_raw(device), raw);
        }
    }
}
