//! [`ReadonlyData`] and [`ReadwriteData`]: borrows of an import's bytes scoped to a guard.

use super::{Elements, ImportedData};
use crate::borrow::ScopedBorrow;
use crate::tensor::dtype::Element;
use crate::tensor::layout::{LayoutError, TensorLayout};

/// A shared borrow of an [`ImportedData<T>`]'s bytes that ends when the guard is dropped: made
/// by [`ImportedData::readonly`]. Its accessors read without borrowing again; what they return
/// lives no longer than the guard (see [Borrows](ImportedData#borrows)).
///
/// The guard holds a borrow of its own in the registry, unless the import held one (or needed
/// none) when it was made: several guards of one import, on several threads, are as many
/// borrows, and none of them is the import's.
///
/// A guard that is never dropped (`core::mem::forget`) keeps its borrow registered for the life
/// of the process: it stays sound (later borrows of those bytes are refused, never wrongly
/// granted), but the bytes stay borrowed even once the memory is freed and reused by another
/// allocation, whose imports are then refused too.
#[must_use = "the borrow ends when the guard is dropped"]
pub struct ReadonlyData<'g, T: Element> {
    data: &'g ImportedData<T>,
    /// Released after the guard's last use: when it drops.
    borrow: ScopedBorrow,
}

impl<'g, T: Element> ReadonlyData<'g, T> {
    /// The guard of `data`, whose bytes `borrow` borrows shared (or that a borrow `data` holds
    /// covers, or that need none).
    pub(super) fn new(data: &'g ImportedData<T>, borrow: ScopedBorrow) -> Self {
        Self { data, borrow }
    }

    /// The import this guards.
    pub fn data(&self) -> &'g ImportedData<T> {
        self.data
    }

    /// Whether the guard registered a borrow of its own (`false` when the import held one that
    /// covers it, or needs none).
    pub fn holds_own_borrow(&self) -> bool {
        self.borrow.is_registered()
    }

    /// The validated layout, as [`ImportedData::layout`].
    ///
    /// # Errors
    ///
    /// As [`ImportedData::layout`].
    pub fn layout(&self) -> Result<TensorLayout<'g>, LayoutError> {
        self.data.layout()
    }

    /// The elements as a slice, for a C-contiguous tensor, as [`ImportedData::as_slice`] without
    /// borrowing again. The slice lives as long as this borrow of the guard.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_slice`], except [`LayoutError::Borrow`].
    pub fn as_slice(&self) -> Result<&[T], LayoutError> {
        // SAFETY: the bytes are borrowed shared (by the guard, or by the import, which keeps its
        // borrow while `&'g` of it lives) until the guard drops, after the slice.
        unsafe { self.data.as_slice_unchecked() }
    }

    /// Reads the element at `index`, as [`ImportedData::get`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::get`], except [`LayoutError::Borrow`].
    pub fn get(&self, index: &[usize]) -> Result<T, LayoutError> {
        // SAFETY: borrowed shared until the guard drops, after the read.
        unsafe { self.data.get_with(index, || Ok(())) }
    }

    /// The elements in logical row-major order, as [`ImportedData::iter`] without borrowing
    /// again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::iter`], except [`LayoutError::Borrow`].
    pub fn iter(&self) -> Result<Elements<'_, T>, LayoutError> {
        // SAFETY: borrowed shared until the guard drops, after the iterator.
        unsafe { Elements::covered(self.data) }
    }

    /// Copies the elements out, as [`ImportedData::to_vec`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::to_vec`], except [`LayoutError::Borrow`].
    pub fn to_vec(&self) -> Result<Vec<T>, LayoutError> {
        // SAFETY: borrowed shared until the guard drops, after the copy.
        unsafe { self.data.to_vec_with(|| Ok(())) }
    }

    /// A zero-copy `ndarray` view, as [`ImportedData::as_array`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_array`], except [`LayoutError::Borrow`].
    #[cfg(feature = "ndarray")]
    pub fn as_array(&self) -> Result<::ndarray::ArrayViewD<'_, T>, LayoutError> {
        // SAFETY: borrowed shared until the guard drops, after the view.
        unsafe { self.data.as_array_covered() }
    }
}

impl<T: Element> core::fmt::Debug for ReadonlyData<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadonlyData")
            .field("data", self.data)
            .field("borrow", &self.borrow)
            .finish()
    }
}

/// An exclusive borrow of an [`ImportedData<T>`]'s bytes that ends when the guard is dropped:
/// made by [`ImportedData::readwrite`]. Its accessors read and write without borrowing again;
/// what they return lives no longer than the guard (see [Borrows](ImportedData#borrows)).
///
/// As for [`ReadonlyData`], a guard that is never dropped keeps its borrow for good.
#[must_use = "the borrow ends when the guard is dropped"]
pub struct ReadwriteData<'g, T: Element> {
    data: &'g mut ImportedData<T>,
    /// Released after the guard's last use: when it drops.
    borrow: ScopedBorrow,
}

impl<'g, T: Element> ReadwriteData<'g, T> {
    /// The guard of `data`, whose bytes `borrow` borrows exclusively (or that an exclusive
    /// borrow `data` holds covers, or that need none); `data` is writable.
    pub(super) fn new(data: &'g mut ImportedData<T>, borrow: ScopedBorrow) -> Self {
        Self { data, borrow }
    }

    /// Whether the guard registered a borrow of its own (`false` when the import held an
    /// exclusive one, or needs none).
    pub fn holds_own_borrow(&self) -> bool {
        self.borrow.is_registered()
    }

    /// The validated layout, as [`ImportedData::layout`].
    ///
    /// # Errors
    ///
    /// As [`ImportedData::layout`].
    pub fn layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        self.data.layout()
    }

    /// The elements as a slice, as [`ImportedData::as_slice`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_slice`], except [`LayoutError::Borrow`].
    pub fn as_slice(&self) -> Result<&[T], LayoutError> {
        // SAFETY: the bytes are borrowed exclusively until the guard drops, after the slice, and
        // no `&mut` of them is alive beside `&self` of the guard.
        unsafe { self.data.as_slice_unchecked() }
    }

    /// The elements as a mutable slice, as [`ImportedData::as_slice_mut`] without borrowing
    /// again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_slice_mut`], except [`LayoutError::Borrow`].
    pub fn as_slice_mut(&mut self) -> Result<&mut [T], LayoutError> {
        // SAFETY: the bytes are borrowed exclusively until the guard drops, after the slice, and
        // `&mut self` of the guard (which holds `&mut` of the import) excludes every other
        // reference of this import.
        unsafe { self.data.as_slice_mut_unchecked() }
    }

    /// Reads the element at `index`, as [`ImportedData::get`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::get`], except [`LayoutError::Borrow`].
    pub fn get(&self, index: &[usize]) -> Result<T, LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the read.
        unsafe { self.data.get_with(index, || Ok(())) }
    }

    /// Writes the element at `index`, as [`ImportedData::set`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::set`], except [`LayoutError::Borrow`].
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the write; `&mut self`
        // excludes every reference of this import during it.
        unsafe { self.data.set_with(index, value, || Ok(())) }
    }

    /// The elements in logical row-major order, as [`ImportedData::iter`] without borrowing
    /// again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::iter`], except [`LayoutError::Borrow`].
    pub fn iter(&self) -> Result<Elements<'_, T>, LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the iterator, which `&self`
        // keeps from any write through the guard.
        unsafe { Elements::covered(self.data) }
    }

    /// Copies the elements out, as [`ImportedData::to_vec`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::to_vec`], except [`LayoutError::Borrow`].
    pub fn to_vec(&self) -> Result<Vec<T>, LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the copy.
        unsafe { self.data.to_vec_with(|| Ok(())) }
    }

    /// A zero-copy `ndarray` view, as [`ImportedData::as_array`] without borrowing again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_array`], except [`LayoutError::Borrow`].
    #[cfg(feature = "ndarray")]
    pub fn as_array(&self) -> Result<::ndarray::ArrayViewD<'_, T>, LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the view, which `&self`
        // keeps from any write through the guard.
        unsafe { self.data.as_array_covered() }
    }

    /// A zero-copy mutable `ndarray` view, as [`ImportedData::as_array_mut`] without borrowing
    /// again.
    ///
    /// # Errors
    ///
    /// As [`ImportedData::as_array_mut`], except [`LayoutError::Borrow`].
    #[cfg(feature = "ndarray")]
    pub fn as_array_mut(&mut self) -> Result<::ndarray::ArrayViewMutD<'_, T>, LayoutError> {
        // SAFETY: borrowed exclusively until the guard drops, after the view; `&mut self`
        // excludes every other reference of this import while it lives.
        unsafe { self.data.as_array_mut_with(|_| Ok(())) }
    }
}

impl<T: Element> core::fmt::Debug for ReadwriteData<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadwriteData")
            .field("data", &*self.data)
            .field("borrow", &self.borrow)
            .finish()
    }
}
