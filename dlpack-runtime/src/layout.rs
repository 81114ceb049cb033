//! Validation of a borrowed `DLTensor` and layout arithmetic (spec sections 1.7 and 1.12).
//!
//! [`validate`] is the single gate every imported tensor passes before anything reads its data:
//! it checks `ndim`, `shape`, `strides` (by version), the dtype width, the element count and the
//! byte span that the layout reaches, with every product and sum checked for overflow. The
//! result, a [`TensorLayout`], answers contiguity, stride and offset questions, and the typed
//! access checks ([`TensorLayout::check_typed`]) add dtype, device, alignment and read-only rules.
//!
//! Units: shapes are in elements, strides in elements (signed), `byte_offset` and spans in bytes.

use core::ffi::c_void;

use crate::device::Device;
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
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the span is empty (a zero-size tensor).
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A validated layout of a `DLTensor`, borrowing its `shape` and `strides` arrays.
///
/// Invariants established by [`validate`]: `ndim <= MAX_NDIM`; every extent is `>= 0`; the
/// element count and the byte span fit in `isize`; `data` is non-NULL whenever the tensor has
/// elements; `data + span` does not wrap the address space.
#[derive(Debug, Clone, Copy)]
pub struct TensorLayout<'a> {
    data: *mut c_void,
    device: Device,
    dtype: DataType,
    shape: &'a [i64],
    strides: Option<&'a [i64]>,
    byte_offset: usize,
    numel: usize,
    span: ByteSpan,
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
pub unsafe fn validate<'a>(
    t: &'a ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<TensorLayout<'a>, LayoutError> {
    // SAFETY: forwarded from the caller.
    let layout = unsafe { validate_unaddressed(t, null_strides, padded_subbyte) }?;
    layout.check_address()?;
    Ok(layout)
}

/// [`validate`] without the checks on `data` itself (NULL with elements, address wrap): the
/// span relative to `data` is computed, so an exporter can check it against its buffer first.
///
/// # Safety
///
/// As for [`validate`].
pub(crate) unsafe fn validate_unaddressed<'a>(
    t: &'a ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<TensorLayout<'a>, LayoutError> {
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
    let dtype = DataType::from_raw(t.dtype);
    let element_bits = check_dtype(dtype, padded_subbyte)?;
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

    let mut numel: u64 = 1;
    for (axis, &extent) in shape.iter().enumerate() {
        if extent < 0 {
            return Err(LayoutError::NegativeExtent { axis, extent });
        }
        numel = numel
            .checked_mul(extent as u64)
            .ok_or(LayoutError::Overflow {
                what: "element count",
            })?;
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
        byte_span(shape, strides, element_bits, t.byte_offset)?
    };
    Ok(TensorLayout {
        data: t.data,
        device: Device::from_raw(t.device),
        dtype,
        shape,
        strides,
        byte_offset: t.byte_offset as usize,
        numel,
        span,
    })
}

impl TensorLayout<'_> {
    /// Checks `data` against the span: non-NULL when there are elements, and `data + span`
    /// inside the address space.
    pub(crate) fn check_address(&self) -> Result<(), LayoutError> {
        if self.numel == 0 {
            return Ok(());
        }
        if self.data.is_null() {
            return Err(LayoutError::NullData { numel: self.numel });
        }
        let base = self.data as usize as i128;
        if base + (self.span.start as i128) < 0
            || base + (self.span.end as i128) > usize::MAX as i128
        {
            return Err(LayoutError::Overflow {
                what: "address of the data span",
            });
        }
        Ok(())
    }
}

/// Bits one element occupies in memory, after the dtype rules of spec sections 1.5 and 1.6.
fn check_dtype(dtype: DataType, padded_subbyte: bool) -> Result<u64, LayoutError> {
    if dtype.bits == 0 || dtype.lanes == 0 {
        return Err(LayoutError::ZeroWidthDtype { dtype });
    }
    let required = match dtype.code {
        DataTypeCode::Float6E2M3Fn | DataTypeCode::Float6E3M2Fn => Some(6),
        DataTypeCode::Float4E2M1Fn => Some(4),
        _ => None,
    };
    if let Some(bits) = required {
        if dtype.bits != bits {
            return Err(LayoutError::DtypeWidth {
                dtype,
                expected_bits: bits,
            });
        }
    }
    let bits = dtype.element_bits() as u64;
    Ok(if padded_subbyte && bits < 8 { 8 } else { bits })
}

/// The byte span touched by a non-empty layout, relative to `data`.
fn byte_span(
    shape: &[i64],
    strides: Option<&[i64]>,
    element_bits: u64,
    byte_offset: u64,
) -> Result<ByteSpan, LayoutError> {
    const OVERFLOW: LayoutError = LayoutError::Overflow { what: "byte span" };
    // Lowest and highest element index reached, relative to element (0, ..., 0).
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
        None => {
            // numel > 0 was checked to fit in isize.
            hi = shape.iter().map(|&e| e as i128).product::<i128>() - 1;
        }
    }
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

impl<'a> TensorLayout<'a> {
    /// `DLTensor::data`: base pointer, before `byte_offset`.
    pub fn data(&self) -> *mut c_void {
        self.data
    }

    /// Pointer to logical element `(0, ..., 0)`: `data + byte_offset`. For a zero-size tensor
    /// this may be NULL or dangling and must not be read.
    pub fn first_element_ptr(&self) -> *mut u8 {
        (self.data as *mut u8).wrapping_add(self.byte_offset)
    }

    /// Device of the memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Extents in elements, one per axis (all `>= 0`).
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }

    /// The strides array in elements as the producer gave it, or `None` when it was NULL
    /// (compact row-major, or a 0-d tensor).
    pub fn raw_strides(&self) -> Option<&'a [i64]> {
        self.strides
    }

    /// Stride of `axis` in elements; computed as compact row-major when the producer gave NULL.
    ///
    /// # Panics
    ///
    /// If `axis >= ndim`.
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
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }

    /// Number of elements (product of the extents; 1 for a 0-d tensor).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Bytes touched relative to `data`, `byte_offset` included.
    pub fn span(&self) -> ByteSpan {
        self.span
    }

    /// Whether the elements are laid out compactly in the given order. Axes of extent 1 are
    /// ignored (their stride is arbitrary), and zero-size tensors are contiguous.
    pub fn is_contiguous(&self, order: Contiguity) -> bool {
        match order {
            Contiguity::C => self.compact_in(self.axes().rev()),
            Contiguity::F => self.compact_in(self.axes()),
            Contiguity::Any => {
                self.is_contiguous(Contiguity::C) || self.is_contiguous(Contiguity::F)
            }
        }
    }

    fn axes(&self) -> core::ops::Range<usize> {
        0..self.ndim()
    }

    fn compact_in(&self, axes_inner_first: impl Iterator<Item = usize>) -> bool {
        if self.numel == 0 {
            return true;
        }
        let mut expected: i64 = 1;
        for axis in axes_inner_first {
            let extent = self.shape[axis];
            if extent == 1 {
                continue;
            }
            if self.stride(axis) != expected {
                return false;
            }
            expected *= extent;
        }
        true
    }

    /// Checks that the tensor can be read as a host slice or host elements of `T`: the dtype is
    /// `T::DTYPE`, the device is host-accessible, and element `(0, ..., 0)` is aligned for `T`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::DtypeMismatch`], [`LayoutError::NotHostAccessible`] or
    /// [`LayoutError::Misaligned`].
    pub fn check_typed<T: Element>(&self) -> Result<(), LayoutError> {
        if self.dtype != T::DTYPE {
            return Err(LayoutError::DtypeMismatch {
                found: self.dtype,
                expected: T::DTYPE,
            });
        }
        if !self.device.is_host_accessible() {
            return Err(LayoutError::NotHostAccessible {
                device: self.device,
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
    pub fn require_contiguous(&self, order: Contiguity) -> Result<(), LayoutError> {
        if self.is_contiguous(order) {
            Ok(())
        } else {
            Err(LayoutError::NotContiguous {
                expected: order,
                shape: self.shape.to_vec(),
                strides: self.strides_vec(),
            })
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
        self.dtype
            .element_bytes()
            .ok_or(LayoutError::SubByteAccess { dtype: self.dtype })
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
}
