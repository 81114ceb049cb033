//! `ndarray` interop (feature `ndarray`): zero-copy views of imported tensors, and zero-copy
//! export of owned arrays.
//!
//! - [`ImportedData::as_array`] / [`ImportedData::as_array_mut`] view an imported host tensor as
//!   an `ArrayViewD` / `ArrayViewMutD` for every layout ndarray can express: any strides,
//!   negative and zero included (zero only for read-only views: a mutable view must not alias).
//! - `ndarray::Array<T, D>` implements [`DlpackExport`]: the array moves into the managed tensor
//!   with its own shape, strides (in elements, possibly negative) and offset.
//!
//! ```
//! use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
//! use ndarray::{array, s, Ix2};
//!
//! #[derive(DlpackImport)]
//! struct View {
//!     #[dlpack(data)]
//!     data: ImportedData<f64>,
//!     #[dlpack(shape)]
//!     shape: Vec<usize>,
//!     #[dlpack(strides)]
//!     strides: Vec<isize>,
//! }
//!
//! let a = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]];
//! let flipped = a.slice_move(s![.., ..;-1]); // strides (3, -1)
//! let view = View::from_managed(flipped.into_dlpack()?)?;
//! let v = view.data.as_array()?.into_dimensionality::<Ix2>()?;
//! assert_eq!(v, array![[3.0, 2.0, 1.0], [6.0, 5.0, 4.0]]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::ffi::c_void;

use ::ndarray::{Array, ArrayViewD, ArrayViewMutD, Axis, Dimension, IxDyn, ShapeBuilder};

use crate::borrow::Access;
use crate::export::ExportError;
use crate::export::{
    BufferLayout, DlpackExport, ExportBuffer, ExportParts, ExportRequest, export_with,
};
use crate::import::ImportedData;
use crate::tensor::device::Device;
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::layout::LayoutError;
use crate::tensor::layout::TensorLayout;
use crate::tensor::managed::ManagedTensor;

/// Shape and non-negative strides of the lowest-address view, the pointer to its first element,
/// and the axes to invert afterwards to restore negative strides.
struct Normalized {
    shape: Vec<usize>,
    strides: Vec<usize>,
    low: *mut u8,
    inverted: Vec<usize>,
}

fn normalize<T: Element>(layout: &TensorLayout<'_>) -> Normalized {
    let size = core::mem::size_of::<T>() as isize;
    let mut low = layout.first_element_ptr();
    let mut shape = Vec::with_capacity(layout.ndim());
    let mut strides = Vec::with_capacity(layout.ndim());
    let mut inverted = Vec::new();
    for (axis, &extent) in layout.shape().iter().enumerate() {
        // Extent-0/1 axes: any stride is equivalent; use 0 to stay clear of overflow.
        let stride = if extent > 1 {
            layout.stride(axis) as isize
        } else {
            0
        };
        if stride < 0 {
            // Within the validated span: `(extent - 1) * stride * size` fits in `isize`.
            low = low.wrapping_offset((extent as isize - 1) * stride * size);
            inverted.push(axis);
        }
        shape.push(extent as usize);
        strides.push(stride.unsigned_abs());
    }
    Normalized {
        shape,
        strides,
        low,
        inverted,
    }
}

/// Whether two distinct indices can address the same element: checked by sorting the moving
/// axes by stride and requiring each stride to exceed the reach of all smaller ones.
fn overlaps(shape: &[usize], strides: &[usize]) -> bool {
    let mut axes: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(e, _)| **e > 1)
        .map(|(&e, &s)| (s, e))
        .collect();
    axes.sort_unstable();
    let mut reach: usize = 0;
    for (stride, extent) in axes {
        if stride <= reach {
            return true;
        }
        reach = reach.saturating_add(stride.saturating_mul(extent - 1));
    }
    false
}

impl<T: Element> ImportedData<T> {
    /// The layout, checked for a view of `T` and borrowed as `access` (see
    /// [`ImportedData`]'s borrows).
    fn checked_for_array(&self, access: Access) -> Result<TensorLayout<'_>, LayoutError> {
        let layout = self.layout()?;
        layout.check_typed::<T>()?;
        self.borrow(access)?;
        if !T::ALL_BIT_PATTERNS_VALID {
            // `to_vec` reads every element through its bit-pattern check.
            self.check_all_elements(&layout)?;
        }
        Ok(layout)
    }

    /// A zero-copy `ndarray` view of a host tensor, for any valid layout (negative and zero
    /// strides included). `bool` data is checked element by element first. Borrows the memory
    /// shared, as [`ImportedData::as_slice`] does.
    ///
    /// # Errors
    ///
    /// The host-access errors of [`ImportedData::get`] ([`LayoutError::DtypeMismatch`],
    /// [`LayoutError::NotHostAccessible`], [`LayoutError::Misaligned`]),
    /// [`LayoutError::InvalidValue`], and [`LayoutError::Borrow`] when another import holds an
    /// exclusive borrow of some of the same bytes.
    pub fn as_array(&self) -> Result<ArrayViewD<'_, T>, LayoutError> {
        let layout = self.checked_for_array(Access::Shared)?;
        // SAFETY: `layout` is this import's, checked for a view of `T` (every element too), and
        // borrowed shared by the import until `&mut self` or its drop: past `'_`.
        Ok(unsafe { array_of(&layout) })
    }

    /// [`as_array`](Self::as_array) without borrowing, for a guard.
    ///
    /// # Safety
    ///
    /// Nothing writes the import's bytes while the view lives: they are borrowed (shared or
    /// exclusively) for at least that long, or need no borrow.
    pub(crate) unsafe fn as_array_covered(&self) -> Result<ArrayViewD<'_, T>, LayoutError> {
        let layout = self.layout()?;
        layout.check_typed::<T>()?;
        self.check_all_elements(&layout)?;
        // SAFETY: `layout` is this import's, checked for a view of `T` (every element too), and
        // not written while the view lives (caller).
        Ok(unsafe { array_of(&layout) })
    }

    /// A zero-copy mutable `ndarray` view of a writable host tensor whose elements do not
    /// overlap. Borrows the memory exclusively, as [`ImportedData::as_slice_mut`] does.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`]; [`LayoutError::Overlapping`] for layouts where two indices
    /// reach the same element (stride 0, say); [`LayoutError::Borrow`] when another import holds
    /// any borrow of some of the same bytes; otherwise as [`ImportedData::as_array`].
    pub fn as_array_mut(&mut self) -> Result<ArrayViewMutD<'_, T>, LayoutError> {
        // SAFETY: `borrow` takes (or finds) this import's own exclusive borrow, which lasts until
        // `&mut self` or the drop of `self`: past `'_`; `&mut self` excludes every other access
        // from this import while the view lives.
        unsafe { self.as_array_mut_with(|this| this.borrow(Access::Exclusive)) }
    }

    /// [`as_array_mut`](Self::as_array_mut); `borrow` is called once the view can be made (a
    /// refused view takes no borrow) and before any element is read.
    ///
    /// # Safety
    ///
    /// When `borrow` returns `Ok(())`, nothing else reads or writes the import's bytes while the
    /// view lives: they are borrowed exclusively for at least that long (or need no borrow),
    /// and no other reference of this import to them is alive.
    pub(crate) unsafe fn as_array_mut_with(
        &mut self,
        borrow: impl FnOnce(&Self) -> Result<(), LayoutError>,
    ) -> Result<ArrayViewMutD<'_, T>, LayoutError> {
        if self.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.layout()?;
        layout.check_typed::<T>()?;
        let n = normalize::<T>(&layout);
        if overlaps(&n.shape, &n.strides) {
            return Err(LayoutError::Overlapping {
                shape: layout.shape().to_vec(),
                strides: layout.strides_vec(),
            });
        }
        borrow(self)?;
        self.check_all_elements(&layout)?;
        if layout.numel() == 0 {
            return Ok(ArrayViewMutD::from_shape(IxDyn(&n.shape), &mut [])
                .unwrap_or_else(|_| unreachable!("zero-size shape")));
        }
        // SAFETY: as in `array_of`; in addition the tensor is writable (flag checked), its
        // elements do not overlap (checked), nothing else reads or writes them while the view
        // lives (caller), which `&mut self` extends to this import's own references.
        let mut view = unsafe {
            ArrayViewMutD::from_shape_ptr(
                IxDyn(&n.shape).strides(IxDyn(&n.strides)),
                n.low.cast::<T>(),
            )
        };
        for axis in n.inverted {
            view.invert_axis(Axis(axis));
        }
        Ok(view)
    }
}

/// A zero-copy view of the elements of `layout`.
///
/// # Safety
///
/// `layout` is an import's validated layout, checked for a view of `T`
/// ([`TensorLayout::check_typed`]) and, for types with invalid bit patterns, every element
/// checked; its memory lives for `'a` and nothing writes it during `'a`.
unsafe fn array_of<'a, T: Element>(layout: &TensorLayout<'a>) -> ArrayViewD<'a, T> {
    let n = normalize::<T>(layout);
    if layout.numel() == 0 {
        return ArrayViewD::from_shape(IxDyn(&n.shape), &[])
            .unwrap_or_else(|_| unreachable!("zero-size shape"));
    }
    // SAFETY: the layout is validated (every element lies in the producer's buffer, alive for
    // `'a`), host-accessible and aligned for `T` (`check_typed`), every element is a valid `T`
    // (caller); `low` is the lowest element address and the strides are non-negative, so every
    // offset ndarray forms stays within that span; the element count fits in `isize`. Nothing
    // writes the elements during `'a` (caller).
    let mut view = unsafe {
        ArrayViewD::from_shape_ptr(
            IxDyn(&n.shape).strides(IxDyn(&n.strides)),
            n.low.cast::<T>(),
        )
    };
    for axis in n.inverted {
        view.invert_axis(Axis(axis));
    }
    view
}

/// Byte offset of logical element 0 from the lowest-address element, and the byte length of the
/// span from there to the end of the highest-address element.
fn array_span<T, D: Dimension>(array: &Array<T, D>) -> (usize, usize) {
    let size = core::mem::size_of::<T>();
    if array.is_empty() {
        return (0, 0);
    }
    let (mut low, mut high) = (0isize, 0isize);
    for (&extent, &stride) in array.shape().iter().zip(array.strides()) {
        if extent > 1 {
            let reach = (extent as isize - 1) * stride;
            if reach < 0 {
                low += reach
            } else {
                high += reach
            }
        }
    }
    ((-low) as usize * size, (high - low + 1) as usize * size)
}

// SAFETY: an owned array holds every element it describes in one allocation; `as_ptr` /
// `as_mut_ptr` return its lowest element address (computed from the array's own strides), and
// `byte_len` the bytes from there to the end of its highest element. The mutable pointer derives
// from `&mut self` of the owner.
unsafe impl<T: Element, D: Dimension> ExportBuffer for Array<T, D> {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn is_unaliased(&self) -> bool {
        // An owned array owns its elements outright.
        true
    }
    fn device(&self) -> Device {
        Device::CPU
    }
    fn byte_len(&self) -> usize {
        array_span(self).1
    }
    fn as_ptr(&self) -> *const c_void {
        let (offset, _) = array_span(self);
        self.as_ptr().cast::<u8>().wrapping_sub(offset).cast()
    }
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        let (offset, _) = array_span(self);
        Some(
            Array::as_mut_ptr(self)
                .cast::<u8>()
                .wrapping_sub(offset)
                .cast(),
        )
    }
    /// The array's own shape, strides and offset: an array used as the `#[dlpack(data)]` of a
    /// derived tensor type exports its own layout, and the type's shape (strides, offset) must
    /// agree with it.
    fn own_layout(&self) -> Option<BufferLayout<'_>> {
        Some(BufferLayout {
            shape: self.shape(),
            strides: self.strides(),
            byte_offset: array_span(self).0,
        })
    }
}

/// An owned array is a producer: it moves into the managed tensor with its shape, strides (in
/// elements) and offset, without a copy, and is writable.
impl<T: Element, D: Dimension + 'static> DlpackExport for Array<T, D> {
    fn export_parts(&self) -> ExportParts<'_> {
        let (offset, _) = array_span(self);
        ExportParts::shared(self, self.shape())
            .with_strides(Some(self.strides()))
            .with_byte_offset(offset)
    }

    /// Read-only parts: the array holds its shape inside the buffer owner, so a unique borrow of
    /// the buffer cannot lend the shape as well. [`DlpackExport::into_dlpack_with`] exports arrays
    /// writable all the same, by moving them next to a copy of their shape.
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        self.export_parts()
    }

    fn into_dlpack_with(self, request: &ExportRequest) -> Result<ManagedTensor, ExportError>
    where
        Self: Sized + Send + 'static,
    {
        let owner = ArrayOwner {
            shape: self.shape().to_vec(),
            strides: self.strides().to_vec(),
            array: self,
        };
        export_with(owner, ArrayOwner::parts, request)
    }
}

/// An array beside its shape and strides, so that the array can be borrowed uniquely.
struct ArrayOwner<T, D: Dimension> {
    array: Array<T, D>,
    shape: Vec<usize>,
    strides: Vec<isize>,
}

impl<T: Element, D: Dimension> ArrayOwner<T, D> {
    fn parts(&mut self) -> ExportParts<'_> {
        let (offset, _) = array_span(&self.array);
        ExportParts::unique(&mut self.array, &self.shape)
            .with_strides(Some(&self.strides))
            .with_byte_offset(offset)
    }
}
