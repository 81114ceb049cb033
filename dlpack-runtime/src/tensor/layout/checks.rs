//! The checks behind validation: element counts, contiguity, dtype widths, and the byte span a
//! layout reaches, with every product and sum checked for overflow.

use core::ffi::c_void;

use super::{ByteSpan, Contiguity, LayoutError};
use crate::abi::ffi;
use crate::tensor::dtype::{DataType, DataTypeCode, Element};

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
pub(super) fn compact_in(
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
pub(super) const fn is_canonical(dtype: DataType) -> bool {
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
    crate::tensor::device::DeviceType::raw_is_host_accessible(device_type)
}

/// Bits one element occupies in memory, after the dtype rules of `dlpack.h` (`DLDataType`,
/// `DLDataTypeCode`, `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`).
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
pub(super) fn byte_span(
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
pub(super) fn span_from_bounds_bits(
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
