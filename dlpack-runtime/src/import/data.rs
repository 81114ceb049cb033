//! [`ImportedData`]: imported memory of one element type, read in place.

use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::sync::atomic::{AtomicUsize, Ordering};

use super::guard::{ReadonlyData, ReadwriteData};
use super::{ImportBuffer, ImportError};
use crate::borrow::{self, Access, ScopedBorrow};
use crate::tensor::device::Device;
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::layout::{self, Contiguity, LayoutError, TensorLayout, raw_host_accessible};
use crate::tensor::managed::ManagedTensor;

/// Imported memory of element type `T`: owns the managed tensor and reads it through its
/// validated layout. The producer's deleter runs when this is dropped.
///
/// The dtype is checked at import; host access ([`as_slice`](Self::as_slice),
/// [`get`](Self::get), [`to_vec`](Self::to_vec)) additionally checks that the memory is
/// host-accessible and aligned; mutable access checks that the tensor is writable.
///
/// # Borrows
///
/// Two imports can describe the same memory (one NumPy array passed twice, say), and a
/// `&mut [T]` from one beside a reference from the other would be undefined behaviour. So every
/// host access *borrows* the bytes the layout reaches, in one registry for the whole process
/// (shared by every copy of this crate; see the [`borrow`](crate::borrow) module): reads
/// ([`as_slice`](Self::as_slice), [`get`](Self::get), [`iter`](Self::iter),
/// [`to_vec`](Self::to_vec), `as_array`) borrow them shared, writes
/// ([`as_slice_mut`](Self::as_slice_mut), [`set`](Self::set), `as_array_mut`) exclusively.
/// A borrow that overlaps another import's exclusive borrow, or an exclusive one that overlaps
/// any other, fails with [`LayoutError::Borrow`] (a `BufferError` in Python) naming both byte
/// ranges; it never panics or blocks. Overlap is exact: `x[::2]` and `x[1::2]` are disjoint.
///
/// A borrow lasts for one of three scopes:
///
/// - **Sticky** (the accessors above): the borrow is held by the import from its first access
///   until it is dropped, given back with [`release_borrow`](Self::release_borrow), turned into
///   its managed tensor, or lent on by value (as the buffer of an export: its consumers borrow
///   for themselves). Lent on read-only through `&self` (an import kept in an `Arc` or a frozen
///   `#[pyclass]`), an exclusive borrow becomes shared. The cheapest after the first access
///   (one word of flags is read), and what references with the import's lifetime need; but
///   the bytes stay borrowed for the import's whole life.
/// - **Guard**: [`readonly`](Self::readonly) and [`readwrite`](Self::readwrite) return a
///   [`ReadonlyData`] or [`ReadwriteData`] that borrows shared or exclusively until it is
///   dropped; its accessors borrow nothing more, and what they return lives no longer than the
///   guard (as rust-numpy's `readonly()` and `readwrite()`). For a function that reads one
///   argument and then writes another, which may be the same memory: the read's borrow ends
///   with its block. A guard registers a borrow of its own only when the import holds none
///   that covers it, and never sets the import's.
/// - **Per call**: [`get_scoped`](Self::get_scoped) and [`to_vec_scoped`](Self::to_vec_scoped)
///   borrow shared for the call only (when the import holds no borrow), since what they return
///   is a copy. For an occasional read; in a loop, one guard is cheaper.
///
/// A function that reads `a` and then writes `b`, called with the same memory twice (`f(x, x)`
/// from Python): with sticky borrows the read of `a` would keep the bytes borrowed shared and
/// the write through `b` would be refused; with a guard the read's borrow ends before the
/// write borrows.
///
/// ```
/// use dlpack_runtime::{DlpackImport, ImportedData, LayoutError};
///
/// #[derive(DlpackImport)]
/// #[dlpack(writable)]
/// struct View {
///     #[dlpack(data)]
///     data: ImportedData<f32>,
///     #[dlpack(shape)]
///     shape: Vec<usize>,
/// }
///
/// /// Sums `a`, then writes the sum into every element of `b`.
/// fn read_then_write(a: &View, b: &mut View) -> Result<f32, LayoutError> {
///     let sum: f32 = {
///         let a = a.data.readonly()?;
///         a.iter()?.sum()
///     }; // `a`'s borrow ends here
///     let mut b = b.data.readwrite()?;
///     b.as_slice_mut()?.fill(sum);
///     Ok(sum)
/// }
/// # use dlpack_runtime::ManagedTensor;
/// # use dlpack_runtime::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion};
/// # use dlpack_runtime::ffi::{DLTensor, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
/// # // Two managed tensors over one buffer, as two `__dlpack__` calls of one NumPy array.
/// # unsafe extern "C" fn free(m: *mut DLManagedTensorVersioned) {
/// #     // SAFETY: made by `Box::into_raw` below, freed once.
/// #     drop(unsafe { Box::from_raw(m) });
/// # }
/// # fn import(data: *mut f32) -> View {
/// #     let shape: &'static mut [i64; 2] = Box::leak(Box::new([3, 1])); // shape, strides
/// #     let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
/// #         version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
/// #         manager_ctx: std::ptr::null_mut(),
/// #         deleter: Some(free),
/// #         flags: 0,
/// #         dl_tensor: DLTensor {
/// #             data: data.cast(),
/// #             device: DLDevice { device_type: 1, device_id: 0 },
/// #             ndim: 1,
/// #             dtype: DLDataType { code: 2, bits: 32, lanes: 1 },
/// #             shape: shape[..1].as_mut_ptr(),
/// #             strides: shape[1..].as_mut_ptr(),
/// #             byte_offset: 0,
/// #         },
/// #     }));
/// #     // SAFETY: a valid versioned tensor over three live floats, owned from here on.
/// #     let managed = unsafe { ManagedTensor::from_raw_versioned(managed) }.unwrap();
/// #     View::from_managed(managed).unwrap()
/// # }
/// # let data = Box::leak(vec![1.0f32, 2.0, 3.0].into_boxed_slice()).as_mut_ptr();
/// # let (a, mut b) = (import(data), import(data));
/// // `a` and `b` are two imports of the same three floats 1, 2, 3.
/// assert_eq!(read_then_write(&a, &mut b)?, 6.0);
/// assert_eq!(b.data.to_vec_scoped()?, [6.0; 3]);
/// // With sticky borrows, the read would keep `a`'s bytes borrowed: the write is refused.
/// assert_eq!(a.data.get(&[0])?, 6.0);
/// assert!(matches!(b.data.readwrite(), Err(LayoutError::Borrow(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// An import that is never accessed never borrows, and a tensor this crate exported from
/// memory that nothing else reaches (an owned `Vec` moved into the export, see
/// [`ExportBuffer::is_unaliased`](crate::ExportBuffer::is_unaliased)) needs no borrow at all:
/// no other import can describe its bytes.
///
/// The registry sees Rust's borrows through this crate only. Python code, NumPy, or native code
/// writing the memory while Rust holds a borrow is out of reach of any checker, as it is for
/// rust-numpy: do not call back into code that writes the producer's array while a slice of it
/// is borrowed. The `unsafe` variants [`as_slice_unchecked`](Self::as_slice_unchecked) and
/// [`as_slice_mut_unchecked`](Self::as_slice_mut_unchecked) skip the registry.
///
/// What does not depend on the index is established once, at import: the layout is validated
/// (or its validation by this crate's exporter is reused, see [`ManagedTensor::layout`]), and
/// whether it is host-accessible and aligned for `T` is kept; a typed access rebuilds the layout
/// from the header without validating it again and checks only its index (and, for `bool`, the
/// bytes it reads). Whole-tensor accesses ([`as_slice`](Self::as_slice),
/// [`as_slice_mut`](Self::as_slice_mut)) check contiguity on the layout they rebuild: one pass
/// over the axes, paid by the accesses that need it rather than by every import.
pub struct ImportedData<T: Element> {
    managed: ManagedTensor,
    /// What the import established about the layout of `managed`: [`VALID`], [`HOST_OK`],
    /// [`UNALIASED`]; and the borrow it holds: [`SHARED`], [`EXCLUSIVE`]. The layout itself is
    /// rebuilt from the header when asked for (without validating it again: `managed` keeps its
    /// validation). Atomic: a shared borrow is taken through `&self`.
    flags: AtomicUsize,
    _element: PhantomData<T>,
}

// SAFETY: `ImportedData` holds the managed tensor and a word of flags; the data is written
// through only with `&mut self`, under the same rules as `managed` itself, which is `Send` and
// `Sync`, and `T: Element` is `Send + Sync`.
unsafe impl<T: Element> Send for ImportedData<T> {}
// SAFETY: as for `Send`: shared access only reads.
unsafe impl<T: Element> Sync for ImportedData<T> {}

/// Flag of [`ImportedData`]: the layout is valid (and `managed` keeps its validation).
const VALID: usize = 1;
/// Flag of [`ImportedData`]: the memory is host-accessible and element `(0, ..., 0)` is aligned
/// for `T` (the checks of [`TensorLayout::check_typed`] after the dtype, which the import
/// checked). Set only with [`VALID`].
const HOST_OK: usize = 2;
/// Flag of [`ImportedData`]: accesses need no borrow, since no other import can reach the
/// bytes: the managed tensor is unaliased ([`ManagedTensor::is_unaliased`]), or the layout
/// reaches no byte.
const UNALIASED: usize = 4;
/// Flag of [`ImportedData`]: the import holds a shared borrow in the registry.
const SHARED: usize = 8;
/// Flag of [`ImportedData`]: the import holds an exclusive borrow in the registry.
const EXCLUSIVE: usize = 16;
/// The flags under which a shared access needs no new borrow.
const READ_COVERED: usize = UNALIASED | SHARED | EXCLUSIVE;
/// The flags under which an exclusive access needs no new borrow.
const WRITE_COVERED: usize = UNALIASED | EXCLUSIVE;

/// The flags of an `ImportedData<T>` holding `managed`, whose dtype is `T::DTYPE`. Read from
/// the header: no layout is built unless the first element is misaligned, which is allowed
/// only for a tensor without elements.
#[inline(always)]
fn flags_of<T: Element>(managed: &ManagedTensor) -> usize {
    if managed.validate().is_err() {
        return 0;
    }
    let t = managed.dl_tensor();
    let first = (t.data as usize).wrapping_add(t.byte_offset as usize);
    let host_ok = raw_host_accessible(t.device.device_type)
        && (first % align_of::<T>() == 0 || is_empty(managed));
    VALID | if host_ok { HOST_OK } else { 0 } | if managed.is_unaliased() { UNALIASED } else { 0 }
}

/// Whether the validated tensor `managed` has no elements.
#[cold]
#[inline(never)]
fn is_empty(managed: &ManagedTensor) -> bool {
    managed.layout().is_ok_and(|layout| layout.numel() == 0)
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
    const ELEMENT_DTYPE: Option<DataType> = Some(T::DTYPE);

    // Always inlined, as `ImportConstraints::check` is: the result is built in place.
    #[inline(always)]
    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError> {
        Self::accepts(&managed)?;
        // Validated once: by the consumer's constraint check just before (derive), by the
        // exporter (tensors built by this crate), or here.
        let flags = flags_of::<T>(&managed);
        Ok(Self {
            managed,
            flags: AtomicUsize::new(flags),
            _element: PhantomData,
        })
    }

    /// Accepts tensors of dtype `T::DTYPE`.
    #[inline(always)]
    fn accepts(managed: &ManagedTensor) -> Result<(), ImportError> {
        let raw = managed.dl_tensor().dtype;
        if !layout::raw_dtype_is::<T>(raw) {
            return Err(LayoutError::DtypeMismatch {
                found: DataType::from_raw(raw),
                expected: T::DTYPE,
            }
            .into());
        }
        Ok(())
    }

    const BORROWS_AT_IMPORT: bool = true;

    /// Takes the borrow its first access would take, now. Memory the host
    /// cannot read as elements of `T` (device memory, or misaligned) has no borrow to take: its
    /// host accesses are refused anyway.
    #[inline]
    fn borrow_at_import(&mut self, access: Access) -> Result<(), ImportError> {
        let covered = match access {
            Access::Shared => READ_COVERED,
            Access::Exclusive => WRITE_COVERED,
        };
        let flags = *self.flags.get_mut();
        if flags & HOST_OK == 0 || flags & covered != 0 {
            return Ok(());
        }
        // The import is not shared yet (`&mut self`): its flags are set by a plain write.
        let held = self.acquire(access)?;
        *self.flags.get_mut() |= held;
        Ok(())
    }
}

impl<T: Element> ImportedData<T> {
    /// The owned managed tensor.
    pub fn managed(&self) -> &ManagedTensor {
        &self.managed
    }

    /// Gives back the managed tensor, releasing the borrow this import holds.
    pub fn into_managed(mut self) -> ManagedTensor {
        self.release_borrow();
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so `managed` is moved out of it exactly once, and
        // nothing else of it needs dropping (the flags and the marker are plain data).
        unsafe { core::ptr::read(&this.managed) }
    }

    /// Gives back the borrow this import holds in the registry, if any: other imports of the
    /// same memory can then borrow it as they like. `&mut self` guarantees that no slice,
    /// element iterator or array view of this import is alive. The next access borrows again.
    ///
    /// Dropping the import, or [`into_managed`](Self::into_managed), releases it too.
    pub fn release_borrow(&mut self) {
        let flags = self.flags.get_mut();
        if *flags & (SHARED | EXCLUSIVE) != 0 {
            borrow::release(self.managed.id());
            *flags &= !(SHARED | EXCLUSIVE);
        }
    }

    /// The borrow this import holds: `None` when it holds none, or needs none (its memory is
    /// unaliased, see [Borrows](Self#borrows)).
    pub fn borrow_held(&self) -> Option<Access> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & EXCLUSIVE != 0 {
            Some(Access::Exclusive)
        } else if flags & SHARED != 0 {
            Some(Access::Shared)
        } else {
            None
        }
    }

    /// Borrows the bytes of this import's host layout as `access`, unless the import holds a
    /// borrow that covers it or needs none. The fast path reads one word of flags; the layout
    /// is rebuilt on the slow path only, so that the caller's layout stays in registers.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Borrow`] when another import's borrow conflicts; the host-access error
    /// for memory the host cannot read (callers check that first).
    #[inline(always)]
    pub(crate) fn borrow(&self, access: Access) -> Result<(), LayoutError> {
        let covered = match access {
            Access::Shared => READ_COVERED,
            Access::Exclusive => WRITE_COVERED,
        };
        if self.flags.load(Ordering::Acquire) & covered != 0 {
            return Ok(());
        }
        self.borrow_now(access)
    }

    /// What an export lending this import on asks of it ([`ExportBuffer::lend`]): lent
    /// read-only, an exclusive borrow it holds becomes shared (`&self` proves that no `&mut`
    /// of it is alive), and its consumers' reads need not be refused; lent at all, the loan is
    /// recorded where its memory's borrows are tracked outside this crate's registry
    /// (rust-numpy's, for NumPy memory) for as long as the import lives.
    ///
    /// [`ExportBuffer::lend`]: crate::ExportBuffer::lend
    pub(crate) fn lend_memory(&self, writable: bool) -> Result<(), borrow::BorrowError> {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & UNALIASED != 0 {
            return Ok(());
        }
        let Some(footprint) = super::lend::host_footprint(&self.managed) else {
            return Ok(());
        };
        let origin = self.managed.origin();
        let id = self.managed.id();
        if !writable && flags & EXCLUSIVE != 0 {
            borrow::downgrade(id, &footprint, origin)?;
            self.flags.fetch_or(SHARED, Ordering::Release);
            self.flags.fetch_and(!EXCLUSIVE, Ordering::Release);
        }
        let access = if writable {
            Access::Exclusive
        } else {
            Access::Shared
        };
        borrow::lend(id, &footprint, origin, access)
    }

    /// The bytes this import's host layout reaches, as borrows take them; `None` when it
    /// reaches none, which is then recorded ([`UNALIASED`]): nothing to borrow, now or later.
    fn footprint(&self) -> Result<Option<borrow::Footprint>, LayoutError> {
        let footprint = self.host_layout()?.footprint(size_of::<T>());
        if footprint.is_none() {
            self.flags.fetch_or(UNALIASED, Ordering::Release);
        }
        Ok(footprint)
    }

    /// [`Self::borrow`] through the registry.
    #[cold]
    #[inline(never)]
    fn borrow_now(&self, access: Access) -> Result<(), LayoutError> {
        let held = self.acquire(access)?;
        if held != 0 {
            self.flags.fetch_or(held, Ordering::Release);
        }
        Ok(())
    }

    /// Borrows this import's bytes as `access` in the registry: the flag that records the
    /// borrow, for the caller to set (0 for a layout that reaches no byte, which needs none).
    #[inline]
    fn acquire(&self, access: Access) -> Result<usize, LayoutError> {
        let Some(footprint) = self.footprint()? else {
            return Ok(0);
        };
        borrow::acquire(self.managed.id(), &footprint, access, self.managed.origin())?;
        Ok(match access {
            Access::Shared => SHARED,
            Access::Exclusive => EXCLUSIVE,
        })
    }

    /// A borrow of this import's bytes as `access` held by a guard (see [`ReadonlyData`]): none
    /// when the import holds a borrow that covers it or needs none, otherwise one of its own,
    /// released when the value drops. Sets none of the import's borrow flags.
    ///
    /// # Errors
    ///
    /// As [`Self::borrow`].
    #[inline]
    pub(super) fn scoped(&self, access: Access) -> Result<ScopedBorrow, LayoutError> {
        let covered = match access {
            Access::Shared => READ_COVERED,
            Access::Exclusive => WRITE_COVERED,
        };
        if self.flags.load(Ordering::Acquire) & covered != 0 {
            return Ok(ScopedBorrow::NONE);
        }
        self.scoped_now(access)
    }

    /// [`Self::scoped`] through the registry.
    #[cold]
    #[inline(never)]
    fn scoped_now(&self, access: Access) -> Result<ScopedBorrow, LayoutError> {
        let Some(footprint) = self.footprint()? else {
            return Ok(ScopedBorrow::NONE);
        };
        Ok(ScopedBorrow::new(
            &footprint,
            access,
            self.managed.origin(),
        )?)
    }

    /// A guard that borrows this import's bytes shared until it is dropped, through which they
    /// are read without borrowing again (see [Borrows](Self#borrows)). It registers a borrow of
    /// its own (under a key of its own), unless the import holds one (sticky, taken by an
    /// earlier access through `&self`) or needs none; it never sets the import's own borrow.
    /// Several guards of one import can live at once, on several threads.
    ///
    /// ```
    /// use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
    ///
    /// #[derive(DlpackExport)]
    /// struct Owned {
    ///     #[dlpack(data)]
    ///     data: Vec<f32>,
    ///     #[dlpack(shape)]
    ///     shape: Vec<usize>,
    /// }
    ///
    /// #[derive(DlpackImport)]
    /// struct View {
    ///     #[dlpack(data)]
    ///     data: ImportedData<f32>,
    ///     #[dlpack(shape)]
    ///     shape: Vec<usize>,
    /// }
    ///
    /// let view = View::from_dlpack(Owned { data: vec![1.0, 2.0, 3.0], shape: vec![3] })?;
    /// let sum: f32 = {
    ///     let data = view.data.readonly()?;
    ///     data.iter()?.sum()
    /// }; // the borrow ends here
    /// assert_eq!(sum, 6.0);
    /// assert_eq!(view.data.borrow_held(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The host-access errors ([`LayoutError::NotHostAccessible`], [`LayoutError::Misaligned`],
    /// the validation error of an invalid layout); [`LayoutError::Borrow`] when another import
    /// or guard holds an exclusive borrow of some of the same bytes.
    pub fn readonly(&self) -> Result<ReadonlyData<'_, T>, LayoutError> {
        self.host_layout()?;
        let borrow = self.scoped(Access::Shared)?;
        Ok(ReadonlyData::new(self, borrow))
    }

    /// A guard that borrows this import's bytes exclusively until it is dropped, through which
    /// they are read and written without borrowing again (see [Borrows](Self#borrows)).
    /// `&mut self` proves that no slice, view or guard of this import is alive: when the import
    /// holds an exclusive borrow (or needs none) the guard registers nothing; when it holds a
    /// shared one, that borrow is **given back first** (as by
    /// [`release_borrow`](Self::release_borrow)), then the guard borrows exclusively under a
    /// key of its own. After a refusal the import holds no borrow; its next access borrows
    /// again.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`] for a read-only or legacy tensor; the host-access errors of
    /// [`readonly`](Self::readonly); [`LayoutError::Borrow`] when another import or guard holds
    /// a borrow of some of the same bytes.
    pub fn readwrite(&mut self) -> Result<ReadwriteData<'_, T>, LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        self.host_layout()?;
        let flags = *self.flags.get_mut();
        let borrow = if flags & WRITE_COVERED != 0 {
            ScopedBorrow::NONE
        } else {
            // A shared borrow of the import's own would refuse the exclusive one: nothing
            // relies on it (`&mut self`), so it is given back.
            self.release_borrow();
            self.scoped_now(Access::Exclusive)?
        };
        Ok(ReadwriteData::new(self, borrow))
    }

    /// The validated layout.
    ///
    /// # Errors
    ///
    /// Never for a value built by import (the layout was validated then); the `Result` keeps
    /// the check in place rather than assumed.
    #[inline]
    pub fn layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        self.managed.layout()
    }

    /// Device of the memory.
    pub fn device(&self) -> Device {
        Device::from_raw(self.managed.dl_tensor().device)
    }

    /// Whether mutable access is refused.
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.managed.is_read_only()
    }

    /// Pointer to element `(0, ..., 0)` (`data + byte_offset`), on the tensor's device. NULL or
    /// dangling for a zero-size tensor.
    #[inline]
    pub fn as_ptr(&self) -> *const T {
        let t = self.managed.dl_tensor();
        t.data
            .cast::<u8>()
            .wrapping_add(t.byte_offset as usize)
            .cast()
    }

    /// The validated layout, when the tensor is readable as host elements of `T`.
    #[inline]
    pub(crate) fn host_layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        if self.flags.load(Ordering::Relaxed) & HOST_OK == 0 {
            return Err(self.access_error());
        }
        // SAFETY: `HOST_OK` is set only with `VALID`, so the import validated `managed`, which
        // keeps that validation.
        Ok(unsafe { self.managed.validated_layout() })
    }

    /// Why [`Self::host_layout`] refused: the validation error, or that of the typed checks.
    #[cold]
    #[inline(never)]
    fn access_error(&self) -> LayoutError {
        match self.managed.layout() {
            Err(e) => e,
            Ok(layout) => match layout.check_typed::<T>() {
                Err(e) => e,
                Ok(()) => unreachable!("a refused host view fails the typed checks"),
            },
        }
    }

    /// The refusal of a non-C-contiguous layout, naming its shape and strides.
    #[cold]
    #[inline(never)]
    fn not_contiguous(&self) -> LayoutError {
        match self.managed.layout() {
            Err(e) => e,
            Ok(layout) => match layout.require_contiguous(Contiguity::C) {
                Err(e) => e,
                Ok(()) => unreachable!("a refused layout is not C-contiguous"),
            },
        }
    }

    /// The validated layout, when it is C-contiguous host memory readable as `T`.
    pub(super) fn contiguous_layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        let layout = self.host_layout()?;
        if !layout.is_contiguous(Contiguity::C) {
            return Err(self.not_contiguous());
        }
        Ok(layout)
    }

    /// The elements as a slice, for a C-contiguous tensor in host-accessible memory. `bool`
    /// elements are checked to be 0 or 1 (one pass over the data). Borrows the memory shared
    /// (see [Borrows](Self#borrows)).
    ///
    /// The memory is shared with its producer. While the slice is borrowed, nothing may write
    /// to it: do not call back into code that writes the producer's array (Python code writing
    /// the NumPy array this came from, say) while holding the slice. [`ImportedData::get`] and
    /// [`ImportedData::to_vec`] read values at the time of the call instead.
    ///
    /// # Errors
    ///
    /// [`LayoutError::NotContiguous`], [`LayoutError::NotHostAccessible`],
    /// [`LayoutError::Misaligned`], [`LayoutError::InvalidValue`]; [`LayoutError::Borrow`] when
    /// another import holds an exclusive borrow of some of the same bytes.
    pub fn as_slice(&self) -> Result<&[T], LayoutError> {
        let layout = self.contiguous_layout()?;
        self.borrow(Access::Shared)?;
        // SAFETY: the import's contiguous host layout, borrowed shared: no import writes the
        // bytes while `self` holds the borrow, which outlives the slice (it ends only with
        // `&mut self` or the drop of `self`).
        unsafe { slice_of(&layout) }
    }

    /// [`as_slice`](Self::as_slice) without the borrow registry: the slice is not counted as a
    /// borrow, and other imports' exclusive borrows are not looked at.
    ///
    /// # Errors
    ///
    /// As [`as_slice`](Self::as_slice), except [`LayoutError::Borrow`].
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing writes the bytes it covers: no `&mut` from another
    /// import of the same memory (through `as_slice_mut`, `set`, `as_array_mut` or their
    /// unchecked variants) is used, nor does other code write them.
    pub unsafe fn as_slice_unchecked(&self) -> Result<&[T], LayoutError> {
        let layout = self.contiguous_layout()?;
        // SAFETY: the import's contiguous host layout; no writer while the slice lives
        // (caller).
        unsafe { slice_of(&layout) }
    }

    /// The elements as a mutable slice, for a writable C-contiguous tensor in host memory.
    /// Borrows the memory exclusively (see [Borrows](Self#borrows)).
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`] for a read-only or legacy tensor; [`LayoutError::Borrow`] when
    /// another import holds a borrow of some of the same bytes; otherwise as
    /// [`ImportedData::as_slice`].
    pub fn as_slice_mut(&mut self) -> Result<&mut [T], LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.contiguous_layout()?;
        self.borrow(Access::Exclusive)?;
        // SAFETY: the import's contiguous host layout of a writable tensor, borrowed
        // exclusively: no other import reads or writes the bytes while `self` holds the
        // borrow, and `&mut self` excludes every other reference from this import.
        unsafe { slice_mut_of(&layout) }
    }

    /// [`as_slice_mut`](Self::as_slice_mut) without the borrow registry: the slice is not
    /// counted as a borrow, and other imports' borrows are not looked at.
    ///
    /// # Errors
    ///
    /// As [`as_slice_mut`](Self::as_slice_mut), except [`LayoutError::Borrow`].
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing else reads or writes the bytes it covers: no reference
    /// from another import of the same memory is used (checked or unchecked), nor does other
    /// code touch them.
    pub unsafe fn as_slice_mut_unchecked(&mut self) -> Result<&mut [T], LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.contiguous_layout()?;
        // SAFETY: the import's contiguous host layout of a writable tensor; exclusive access
        // (caller, and `&mut self` for this import).
        unsafe { slice_mut_of(&layout) }
    }

    /// Reads the element at `index` (one coordinate per axis), for any valid layout.
    ///
    /// # Errors
    ///
    /// [`LayoutError::IndexRank`], [`LayoutError::IndexOutOfBounds`], the host-access errors,
    /// [`LayoutError::InvalidValue`] for a bad `bool` byte, and [`LayoutError::Borrow`] when
    /// another import holds an exclusive borrow of some of the same bytes (a read borrows the
    /// whole tensor shared, see [Borrows](Self#borrows)).
    #[inline]
    pub fn get(&self, index: &[usize]) -> Result<T, LayoutError> {
        // SAFETY: `borrow` takes (or finds) this import's own borrow, which lasts until `&mut
        // self` or the drop of `self`: past the read.
        unsafe { self.get_with(index, || self.borrow(Access::Shared)) }
    }

    /// [`get`](Self::get) with a shared borrow held for the call only, unless this import
    /// holds one (see [Borrows](Self#borrows)): the bytes are free for other imports again
    /// when it returns. Each call borrows and releases (a lock of the registry, twice): in a
    /// loop, a [`readonly`](Self::readonly) guard taken once is cheaper.
    ///
    /// # Errors
    ///
    /// As [`get`](Self::get).
    pub fn get_scoped(&self, index: &[usize]) -> Result<T, LayoutError> {
        // SAFETY: `scoped` borrows the bytes shared until its value drops, at the end of the
        // read, or finds them covered by this import's own borrow, which outlives `&self`.
        unsafe { self.get_with(index, || self.scoped(Access::Shared)) }
    }

    /// Reads the element at `index`; `borrow` is called once the index is checked, and what
    /// it returns is kept until the element is read.
    ///
    /// # Safety
    ///
    /// When `borrow` returns `Ok(scope)`, nothing writes the bytes of this import's layout
    /// until `scope` is dropped: they are borrowed (shared or exclusively) for at least that
    /// long, or need no borrow.
    #[inline(always)]
    pub(super) unsafe fn get_with<S>(
        &self,
        index: &[usize],
        borrow: impl FnOnce() -> Result<S, LayoutError>,
    ) -> Result<T, LayoutError> {
        let layout = self.host_layout()?;
        let (offset, linear) = layout.locate(index, size_of::<T>())?;
        let _scope = borrow()?;
        // SAFETY: `offset` addresses an in-bounds element of the validated layout (checked by
        // `locate`), aligned and host-accessible (`host_ok`), and nothing writes it while
        // `_scope` lives (caller).
        unsafe { read_element::<T>(layout.first_element_ptr().offset(offset), linear) }
    }

    /// Writes the element at `index`, for a writable tensor.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ReadOnly`]; [`LayoutError::Borrow`] when another import holds any
    /// borrow of some of the same bytes (a write borrows the whole tensor exclusively);
    /// otherwise as [`ImportedData::get`].
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), LayoutError> {
        let this = &*self;
        // SAFETY: `borrow` takes (or finds) this import's own exclusive borrow, which lasts
        // until `&mut self` or the drop of `self`: past the write; `&mut self` excludes every
        // other access from this import.
        unsafe { self.set_with(index, value, || this.borrow(Access::Exclusive)) }
    }

    /// Writes the element at `index`; `borrow` is called once the index is checked.
    ///
    /// # Safety
    ///
    /// When `borrow` returns `Ok(())`, nothing else reads or writes the bytes of this import's
    /// layout until the write is done: they are borrowed exclusively for at least that long
    /// (or need no borrow), and no reference of this import to them is alive.
    #[inline(always)]
    pub(super) unsafe fn set_with(
        &self,
        index: &[usize],
        value: T,
        borrow: impl FnOnce() -> Result<(), LayoutError>,
    ) -> Result<(), LayoutError> {
        if self.managed.is_read_only() {
            return Err(LayoutError::ReadOnly);
        }
        let layout = self.host_layout()?;
        let (offset, _) = layout.locate(index, size_of::<T>())?;
        borrow()?;
        // SAFETY: in-bounds, aligned, host-accessible element of a writable tensor, and
        // nothing else reads or writes it during the write (caller).
        unsafe {
            layout
                .first_element_ptr()
                .offset(offset)
                .cast::<T>()
                .write(value)
        };
        Ok(())
    }

    /// The elements in logical row-major order, by value, read in place, for any valid layout
    /// (negative and zero strides included): a transposed or reversed view is read without a
    /// copy and without `ndarray`. `bool` elements are checked once, here.
    ///
    /// ```
    /// use dlpack_runtime::{DlpackExport, DlpackImport, ExportParts, ImportedData};
    ///
    /// #[derive(DlpackImport)]
    /// struct View {
    ///     #[dlpack(data)]
    ///     data: ImportedData<i32>,
    ///     #[dlpack(shape)]
    ///     shape: Vec<usize>,
    ///     #[dlpack(strides)]
    ///     strides: Vec<isize>,
    /// }
    ///
    /// /// A 2x3 matrix 0..6, transposed: shape (3, 2), strides (1, 3).
    /// struct Transposed(Vec<i32>);
    ///
    /// impl DlpackExport for Transposed {
    ///     fn export_parts(&self) -> ExportParts<'_> {
    ///         ExportParts::shared(&self.0, &[3, 2]).with_strides(Some(&[1, 3]))
    ///     }
    ///     fn export_parts_mut(&mut self) -> ExportParts<'_> {
    ///         ExportParts::unique(&mut self.0, &[3, 2]).with_strides(Some(&[1, 3]))
    ///     }
    /// }
    ///
    /// let view = View::from_dlpack(Transposed(vec![0, 1, 2, 3, 4, 5]))?;
    /// let columns: Vec<i32> = view.data.iter()?.collect();
    /// assert_eq!(columns, [0, 3, 1, 4, 2, 5]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The host-access errors ([`LayoutError::NotHostAccessible`], [`LayoutError::Misaligned`],
    /// the validation error of an invalid layout), [`LayoutError::InvalidValue`] for a bad
    /// `bool` byte, and [`LayoutError::Borrow`] as for [`ImportedData::get`].
    pub fn iter(&self) -> Result<super::Elements<'_, T>, LayoutError> {
        super::Elements::new(self)
    }

    /// Copies the elements out in logical row-major order, for any valid layout (negative and
    /// zero strides included).
    ///
    /// # Errors
    ///
    /// The host-access errors, [`LayoutError::InvalidValue`] for a bad `bool` byte,
    /// [`LayoutError::CopyTooLarge`] when the copy cannot be allocated (a broadcast with stride 0
    /// can describe far more elements than its memory holds), and [`LayoutError::Borrow`] as
    /// for [`ImportedData::get`].
    pub fn to_vec(&self) -> Result<Vec<T>, LayoutError> {
        // SAFETY: `borrow` takes (or finds) this import's own borrow, which lasts until `&mut
        // self` or the drop of `self`: past the copy.
        unsafe { self.to_vec_with(|| self.borrow(Access::Shared)) }
    }

    /// [`to_vec`](Self::to_vec) with a shared borrow held for the call only, unless this
    /// import holds one (see [Borrows](Self#borrows)), as [`get_scoped`](Self::get_scoped).
    ///
    /// # Errors
    ///
    /// As [`to_vec`](Self::to_vec).
    pub fn to_vec_scoped(&self) -> Result<Vec<T>, LayoutError> {
        // SAFETY: `scoped` borrows the bytes shared until its value drops, after the copy, or
        // finds them covered by this import's own borrow, which outlives `&self`.
        unsafe { self.to_vec_with(|| self.scoped(Access::Shared)) }
    }

    /// Copies the elements out; `borrow` is called once the layout is checked, and what it
    /// returns is kept until the copy is done.
    ///
    /// # Safety
    ///
    /// As for [`get_with`](Self::get_with).
    pub(super) unsafe fn to_vec_with<S>(
        &self,
        borrow: impl FnOnce() -> Result<S, LayoutError>,
    ) -> Result<Vec<T>, LayoutError> {
        let layout = self.host_layout()?;
        let _scope = borrow()?;
        let base = layout.first_element_ptr();
        let numel = layout.numel();
        let too_large = || LayoutError::CopyTooLarge {
            numel,
            element_bytes: core::mem::size_of::<T>(),
        };
        if numel.checked_mul(core::mem::size_of::<T>()).is_none() {
            return Err(too_large());
        }
        let mut out = Vec::new();
        out.try_reserve_exact(numel).map_err(|_| too_large())?;
        if layout.is_contiguous(Contiguity::C) && T::ALL_BIT_PATTERNS_VALID {
            if numel > 0 {
                // SAFETY: C-contiguous: `numel` elements of `T` from `base`, aligned and
                // host-accessible (`host_layout`), every bit pattern valid, not written while
                // `_scope` lives (caller); `out` has room for `numel` and does not overlap the
                // producer's memory.
                unsafe {
                    core::ptr::copy_nonoverlapping(base.cast::<T>(), out.as_mut_ptr(), numel);
                    out.set_len(numel);
                }
            }
            return Ok(out);
        }
        let mut failure = None;
        layout.for_each_offset(|offset| {
            if failure.is_some() {
                return;
            }
            // SAFETY: every offset produced by `for_each_offset` addresses an element of the
            // validated layout, aligned and host-accessible (`host_layout`), not written while
            // `_scope` lives (caller).
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
    pub(crate) fn check_all_elements(&self, layout: &TensorLayout<'_>) -> Result<(), LayoutError> {
        if T::ALL_BIT_PATTERNS_VALID {
            // Every byte pattern is a `T`: nothing to read.
            return Ok(());
        }
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

impl<T: Element> Drop for ImportedData<T> {
    #[inline]
    fn drop(&mut self) {
        // Before `managed` drops (fields drop after this), so the borrow ends before the
        // producer's deleter can free the memory or the header address be reused.
        if *self.flags.get_mut() & (SHARED | EXCLUSIVE) != 0 {
            borrow::release(self.managed.id());
        }
    }
}

/// The elements of `layout`, a C-contiguous layout of host memory readable as `T`.
///
/// # Safety
///
/// `layout` is an import's validated, host-accessible, aligned layout, C-contiguous, whose
/// memory lives for `'a`, and nothing writes its bytes during `'a`.
unsafe fn slice_of<'a, T: Element>(layout: &TensorLayout<'a>) -> Result<&'a [T], LayoutError> {
    let (ptr, numel) = (layout.first_element_ptr().cast::<T>(), layout.numel());
    if numel == 0 {
        return Ok(&[]);
    }
    check_bit_patterns::<T>(ptr, numel)?;
    // SAFETY: the layout is validated and C-contiguous, so `numel` elements of `T` start at
    // `ptr` (aligned) in host-accessible memory alive for `'a`; every element holds a valid `T`
    // (checked above), and nothing writes them during `'a` (caller).
    Ok(unsafe { core::slice::from_raw_parts(ptr, numel) })
}

/// The elements of `layout`, mutably.
///
/// # Safety
///
/// As for [`slice_of`], for a writable tensor, and nothing else reads or writes its bytes
/// during `'a`.
unsafe fn slice_mut_of<'a, T: Element>(
    layout: &TensorLayout<'a>,
) -> Result<&'a mut [T], LayoutError> {
    let (ptr, numel) = (layout.first_element_ptr().cast::<T>(), layout.numel());
    if numel == 0 {
        return Ok(&mut []);
    }
    check_bit_patterns::<T>(ptr, numel)?;
    // SAFETY: as in `slice_of`; the tensor is writable and access to its bytes is exclusive
    // during `'a` (caller).
    Ok(unsafe { core::slice::from_raw_parts_mut(ptr, numel) })
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
