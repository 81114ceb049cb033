//! Validation of a borrowed `DLTensor` and layout arithmetic (`dlpack.h`: `DLTensor`, and the
//! version rules of `DLManagedTensorVersioned::version`).
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
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::abi::ffi;
use crate::borrow::Footprint;
use crate::tensor::device::Device;
use crate::tensor::dtype::{DataType, Element};

mod checks;
mod error;
#[cfg(test)]
mod tests;

use checks::byte_span;
pub(crate) use checks::{
    Reach, check_address, check_dtype, is_contiguous, raw_dtype_is, raw_host_accessible,
    span_from_bounds, validated_numel,
};
pub use error::LayoutError;

/// The largest `ndim` accepted, as in NumPy (`NPY_MAXDIMS` = 64).
pub const MAX_NDIM: usize = 64;

/// How to read a NULL `strides` pointer, which depends on who produced the tensor
/// (`dlpack.h`, `DLTensor::strides`: NULL meant compact row-major until DLPack 1.2, which
/// requires strides when `ndim > 0`; consumers still meet NULL from older producers).
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
    /// The `shape` array, `ndim` entries (an empty slice's dangling pointer when `ndim` is 0).
    /// Kept as a pointer, not a reference, so that a layout stored next to the tensor that owns
    /// the arrays (as `ImportedData` stores one) holds no reference into memory its owner frees.
    shape: NonNull<i64>,
    /// The `strides` array, `ndim` entries, or NULL: compact row-major.
    strides: *const i64,
    ndim: usize,
    byte_offset: usize,
    _arrays: PhantomData<&'a [i64]>,
}

/// Packing of the small header fields of a [`TensorLayout`] into whole words. A layout is
/// built and then moved (returned) at once; built from 32-bit and 16-bit pieces, its moves read
/// back whole words that were just written in pieces, which stalls the processor (a failed
/// store-to-load forwarding) on every exchange.
struct Packed;

impl Packed {
    /// `device_id` in the low half and `device_type` in the high half: the other order is the
    /// header's own bytes, which the compiler then copies together with `data` in one 16-byte
    /// load, and that load stalls on an export's separate, fresh writes of the two.
    #[inline]
    fn device(d: ffi::DLDevice) -> u64 {
        d.device_id as u32 as u64 | (d.device_type as u32 as u64) << 32
    }

    #[inline]
    fn raw_device(word: u64) -> ffi::DLDevice {
        ffi::DLDevice {
            device_type: (word >> 32) as u32 as i32,
            device_id: word as u32 as i32,
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
            .field("shape", &self.shape())
            .field("strides", &self.raw_strides())
            .field("byte_offset", &self.byte_offset)
            .field("numel", &self.numel())
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
    let (layout, span, numel) = unsafe { validate_unaddressed(t, null_strides, padded_subbyte) }?;
    check_address(layout.data, numel, span)?;
    Ok(layout)
}

/// [`validate`] without handing out the layout: whether `t` validates. For callers that keep
/// the verdict and rebuild the layout from the header when asked
/// ([`TensorLayout::from_validated`]), the layout then never travels back through memory from
/// here: a freshly written copy read back in wider moves stalls.
///
/// # Errors
///
/// As [`validate`].
///
/// # Safety
///
/// As [`validate`].
pub(crate) unsafe fn check_header(
    t: &ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<(), LayoutError> {
    // SAFETY: forwarded from the caller.
    let (layout, span, numel) = unsafe { validate_unaddressed(t, null_strides, padded_subbyte) }?;
    check_address(layout.data, numel, span)
}

/// [`validate`] without the checks on `data` itself (NULL with elements, address wrap), which
/// returns the byte span it checked and the element count too.
///
/// # Safety
///
/// As for [`validate`].
unsafe fn validate_unaddressed<'a>(
    t: &'a ffi::DLTensor,
    null_strides: NullStrides,
    padded_subbyte: bool,
) -> Result<(TensorLayout<'a>, ByteSpan, usize), LayoutError> {
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
    let layout = TensorLayout::from_arrays(
        t,
        // At most 255 * 65535 (or 8, padded).
        Packed::dtype(t.dtype, element_bits as u32),
        shape,
        strides,
    );
    Ok((layout, span, numel))
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
        let bits = t.dtype.bits as u32 * t.dtype.lanes as u32;
        Self::from_arrays(
            t,
            Packed::dtype(t.dtype, if padded_subbyte && bits < 8 { 8 } else { bits }),
            shape,
            strides,
        )
    }

    /// The layout of `t` with its arrays `shape` and `strides` (validated, valid for `'a`) and
    /// the packed `dtype`.
    #[inline]
    fn from_arrays(
        t: &ffi::DLTensor,
        dtype: u64,
        shape: &'a [i64],
        strides: Option<&'a [i64]>,
    ) -> Self {
        Self {
            data: t.data,
            device: Packed::device(t.device),
            dtype,
            shape: NonNull::from(shape).cast(),
            strides: strides.map_or(core::ptr::null(), <[i64]>::as_ptr),
            ndim: shape.len(),
            byte_offset: t.byte_offset as usize,
            _arrays: PhantomData,
        }
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
        self.ndim
    }

    /// Extents in elements, one per axis (all `>= 0`).
    #[inline]
    pub fn shape(&self) -> &'a [i64] {
        // SAFETY: `shape` points to `ndim` entries (or is an empty slice's dangling pointer),
        // valid and unmodified for 'a (the contract of the constructors).
        unsafe { core::slice::from_raw_parts(self.shape.as_ptr(), self.ndim) }
    }

    /// The strides array in elements as the producer gave it, or `None` when it was NULL
    /// (compact row-major, or a 0-d tensor).
    #[inline]
    pub fn raw_strides(&self) -> Option<&'a [i64]> {
        if self.strides.is_null() {
            return None;
        }
        // SAFETY: non-NULL, so `ndim` entries valid and unmodified for 'a, as for `shape`.
        Some(unsafe { core::slice::from_raw_parts(self.strides, self.ndim) })
    }

    /// Stride of `axis` in elements; computed as compact row-major when the producer gave NULL.
    ///
    /// # Panics
    ///
    /// If `axis >= ndim`.
    #[inline]
    pub fn stride(&self, axis: usize) -> i64 {
        match self.raw_strides() {
            Some(strides) => strides[axis],
            None => {
                assert!(
                    axis < self.ndim,
                    "axis {axis} out of range for ndim {}",
                    self.ndim()
                );
                // Saturates only for zero-size tensors, whose strides are never used to step.
                self.shape()[axis + 1..]
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
    ///
    /// Computed on each call (one pass over the extents), so that building a layout costs no
    /// pass over its shape when nothing asks for the count.
    #[inline]
    pub fn numel(&self) -> usize {
        validated_numel(self.shape())
    }

    /// The bytes the layout reaches, as the borrow registry keys them: every element
    /// `element_bytes` long (the dtype's size, or the accessing type's); `None` when it reaches
    /// none. Strides in bytes are the element strides times `element_bytes` (an axis of extent 1
    /// may carry any stride: the footprint ignores it).
    pub(crate) fn footprint(&self, element_bytes: usize) -> Option<Footprint> {
        let first = self.first_element_ptr().addr();
        // The common case, one run of bytes: what the general construction gives, directly.
        if self.is_contiguous(Contiguity::C) {
            if let Some(footprint) = Footprint::run(first, self.numel(), element_bytes) {
                return Some(footprint);
            }
        }
        let stride = |axis| self.stride(axis).saturating_mul(element_bytes as i64);
        // On the stack for up to 8 axes: a borrow allocates only what the registry keeps.
        let mut inline = [0i64; 8];
        if let Some(strides) = inline.get_mut(..self.ndim()) {
            for (axis, slot) in strides.iter_mut().enumerate() {
                *slot = stride(axis);
            }
            return Footprint::new(first, self.shape(), strides, element_bytes);
        }
        let strides: Vec<i64> = (0..self.ndim()).map(stride).collect();
        Footprint::new(first, self.shape(), &strides, element_bytes)
    }

    /// Bytes touched relative to `data`, `byte_offset` included.
    ///
    /// Computed on each call, with the arithmetic validation checked.
    pub fn span(&self) -> ByteSpan {
        let numel = self.numel();
        if numel == 0 {
            return ByteSpan { start: 0, end: 0 };
        }
        let span = byte_span(
            self.shape(),
            self.raw_strides(),
            numel,
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
        is_contiguous(self.shape(), self.raw_strides(), self.numel(), order)
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
        if self.numel() > 0 {
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
            shape: self.shape().to_vec(),
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
        let size = self.element_bytes()?;
        self.locate(index, size).map(|(offset, _)| offset)
    }

    /// Byte offset of the element at `index` relative to [`Self::first_element_ptr`], for
    /// elements of `element_bytes` bytes, and its position in row-major order.
    ///
    /// # Errors
    ///
    /// [`LayoutError::IndexRank`] or [`LayoutError::IndexOutOfBounds`].
    #[inline]
    pub(crate) fn locate(
        &self,
        index: &[usize],
        element_bytes: usize,
    ) -> Result<(isize, usize), LayoutError> {
        let ndim = self.ndim();
        if index.len() != ndim {
            return Err(LayoutError::IndexRank {
                found: index.len(),
                expected: ndim,
            });
        }
        let mut linear = 0usize;
        for (axis, (&i, &extent)) in index.iter().zip(self.shape()).enumerate() {
            if i as u64 >= extent as u64 {
                return Err(LayoutError::IndexOutOfBounds {
                    axis,
                    index: i,
                    extent,
                });
            }
            // In range: `i < extent`, and the element count fits in `isize`.
            linear = linear * extent as usize + i;
        }
        let Some(strides) = self.raw_strides() else {
            // Compact row-major: the row-major position is the element offset; in range, as
            // the span of the whole tensor fits in `isize`.
            return Ok(((linear * element_bytes) as isize, linear));
        };
        let mut offset: i64 = 0;
        for (&i, &stride) in index.iter().zip(strides) {
            // In range: `i < extent`, and the span of the whole tensor fits in `isize`.
            offset += i as i64 * stride * element_bytes as i64;
        }
        Ok((offset as isize, linear))
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
        if self.numel() == 0 {
            return Ok(());
        }
        let (ndim, shape) = (self.ndim(), self.shape());
        // Only axes of extent > 1 move: their reach `(extent - 1) * stride * size` is inside
        // the validated span, so these products and the running offset fit in `isize`. Axes of
        // extent 1 may carry any stride, even one that would overflow, and are never stepped.
        let mut byte_strides = [0isize; MAX_NDIM];
        for (axis, s) in byte_strides.iter_mut().enumerate().take(ndim) {
            if shape[axis] > 1 {
                *s = self.stride(axis) as isize * size;
            }
        }
        let mut index = [0i64; MAX_NDIM];
        let mut offset: isize = 0;
        for _ in 0..self.numel() {
            f(offset);
            // Odometer step, innermost axis fastest.
            for axis in (0..ndim).rev() {
                if index[axis] + 1 < shape[axis] {
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
