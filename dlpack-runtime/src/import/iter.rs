//! [`Elements`]: the elements of an import in logical row-major order, for any valid layout,
//! read in place.

use core::iter::FusedIterator;
use core::marker::PhantomData;

use super::ImportedData;
use crate::tensor::dtype::Element;
use crate::tensor::layout::LayoutError;

/// The elements of an [`ImportedData<T>`], by value, in logical row-major order (the last axis
/// fastest), whatever the strides (negative and zero included): made by
/// [`ImportedData::iter`]. Each element is read from the producer's memory when it is reached,
/// without a copy of the tensor; like [`ImportedData::as_slice`], it borrows the memory shared
/// (no other import writes it while the iterator lives) and assumes that no code outside Rust
/// writes it either.
pub struct Elements<'a, T: Element> {
    /// Element `(0, ..., 0)`.
    first: *const u8,
    /// Extent, stride in bytes and position of each axis that steps (extent > 1), outermost
    /// first.
    axes: Axes,
    /// Byte offset of the next element from `first`.
    offset: isize,
    /// Elements not yet yielded.
    remaining: usize,
    _data: PhantomData<&'a ImportedData<T>>,
}

impl<'a, T: Element> Elements<'a, T> {
    /// The iterator over `data`'s elements, whose bit patterns have all been checked.
    pub(super) fn new(data: &'a ImportedData<T>) -> Result<Self, LayoutError> {
        data.host_layout()?;
        data.borrow(crate::borrow::Access::Shared)?;
        // SAFETY: `data` holds a borrow of its bytes (or needs none), which lasts until `&mut`
        // of it or its drop: for `'a` at least.
        unsafe { Self::covered(data) }
    }

    /// The iterator over `data`'s elements, without borrowing them.
    ///
    /// # Safety
    ///
    /// Nothing writes `data`'s bytes during `'a`: they are borrowed (shared or exclusively)
    /// for at least that long, or need no borrow.
    pub(super) unsafe fn covered(data: &'a ImportedData<T>) -> Result<Self, LayoutError> {
        let layout = data.host_layout()?;
        data.check_all_elements(&layout)?;
        let size = core::mem::size_of::<T>() as isize;
        let axes = (0..layout.ndim())
            .filter(|&axis| layout.shape()[axis] > 1)
            // Only axes of extent > 1 step: their reach is inside the validated span, so these
            // products fit in `isize`.
            .map(|axis| Axis {
                extent: layout.shape()[axis] as usize,
                stride: layout.stride(axis) as isize * size,
                index: 0,
            });
        Ok(Self {
            first: layout.first_element_ptr(),
            axes: Axes::collect(axes),
            offset: 0,
            remaining: layout.numel(),
            _data: PhantomData,
        })
    }
}

/// One axis of the odometer.
#[derive(Clone, Copy, Default)]
struct Axis {
    extent: usize,
    /// In bytes.
    stride: isize,
    /// The position on the axis.
    index: usize,
}

/// The axes that step: up to four inline (an iterator then allocates nothing), more on the heap.
enum Axes {
    Inline(usize, [Axis; 4]),
    Heap(Vec<Axis>),
}

impl Axes {
    fn collect(axes: impl Iterator<Item = Axis> + Clone) -> Self {
        let mut inline = [Axis::default(); 4];
        let mut len = 0;
        for axis in axes.clone() {
            if len == inline.len() {
                return Axes::Heap(axes.collect());
            }
            inline[len] = axis;
            len += 1;
        }
        Axes::Inline(len, inline)
    }

    fn as_mut_slice(&mut self) -> &mut [Axis] {
        match self {
            Axes::Inline(len, axes) => &mut axes[..*len],
            Axes::Heap(axes) => axes,
        }
    }
}

impl<T: Element> Iterator for Elements<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // SAFETY: `offset` addresses an element of the validated layout (the odometer below
        // visits exactly its elements), host-accessible and aligned for `T` (`host_layout`),
        // whose bit pattern was checked at construction; the import (or a guard of it) stays
        // borrowed, so the memory stays alive and unwritten.
        let value = unsafe { self.first.offset(self.offset).cast::<T>().read() };
        // Odometer step, the last axis fastest.
        for axis in self.axes.as_mut_slice().iter_mut().rev() {
            if axis.index + 1 < axis.extent {
                axis.index += 1;
                self.offset += axis.stride;
                break;
            }
            self.offset -= axis.stride * axis.index as isize;
            axis.index = 0;
        }
        Some(value)
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T: Element> ExactSizeIterator for Elements<'_, T> {}

impl<T: Element> FusedIterator for Elements<'_, T> {}

impl<T: Element> core::fmt::Debug for Elements<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Elements")
            .field("dtype", &T::DTYPE)
            .field("remaining", &self.remaining)
            .finish()
    }
}
