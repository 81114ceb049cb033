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
    /// Extents, and strides in bytes, of the axes that step (extent > 1), outermost first.
    axes: Vec<(usize, isize)>,
    /// The position on each of `axes`.
    index: Vec<usize>,
    /// Byte offset of the next element from `first`.
    offset: isize,
    /// Elements not yet yielded.
    remaining: usize,
    _data: PhantomData<&'a ImportedData<T>>,
}

impl<'a, T: Element> Elements<'a, T> {
    /// The iterator over `data`'s elements, whose bit patterns have all been checked.
    pub(super) fn new(data: &'a ImportedData<T>) -> Result<Self, LayoutError> {
        let layout = data.host_layout()?;
        data.borrow(crate::borrow::Access::Shared)?;
        data.check_all_elements(&layout)?;
        let size = core::mem::size_of::<T>() as isize;
        let axes: Vec<(usize, isize)> = (0..layout.ndim())
            .filter(|&axis| layout.shape()[axis] > 1)
            // Only axes of extent > 1 step: their reach is inside the validated span, so these
            // products fit in `isize`.
            .map(|axis| {
                (
                    layout.shape()[axis] as usize,
                    layout.stride(axis) as isize * size,
                )
            })
            .collect();
        let index = vec![0; axes.len()];
        Ok(Self {
            first: layout.first_element_ptr(),
            axes,
            index,
            offset: 0,
            remaining: layout.numel(),
            _data: PhantomData,
        })
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
        // whose bit pattern was checked at construction; the import stays borrowed, so the
        // memory stays alive.
        let value = unsafe { self.first.offset(self.offset).cast::<T>().read() };
        // Odometer step, the last axis fastest.
        for (axis, &(extent, stride)) in self.axes.iter().enumerate().rev() {
            if self.index[axis] + 1 < extent {
                self.index[axis] += 1;
                self.offset += stride;
                break;
            }
            self.offset -= stride * self.index[axis] as isize;
            self.index[axis] = 0;
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
