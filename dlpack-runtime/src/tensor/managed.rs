//! [`ManagedTensor`]: the owner of a managed tensor, versioned or legacy.
//!
//! Ownership follows `dlpack.h` (`DLManagedTensorVersioned::deleter`): whoever holds a managed
//! tensor calls its `deleter` exactly once when done (a NULL deleter is legal and means there is
//! nothing to call). A [`ManagedTensor`] does exactly that in its `Drop`, on whichever thread
//! drops it.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::abi::ffi::{self, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::tensor::layout::{self, LayoutError, NullStrides, TensorLayout};

/// The flag bits DLPack 1.3 defines (`dlpack.h`, `DLManagedTensorVersioned::flags`).
const KNOWN_FLAGS: u64 = ffi::DLPACK_FLAG_BITMASK_READ_ONLY
    | ffi::DLPACK_FLAG_BITMASK_IS_COPIED
    | ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;

/// A managed tensor that cannot be taken at all: NULL, a major version this crate does not read,
/// or flags it does not know. Raised by [`ManagedTensor::from_raw_versioned`] and
/// [`ManagedTensor::from_raw_legacy`]; imports carry it as [`ImportError::Header`].
///
/// [`ImportError::Header`]: crate::ImportError::Header
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The managed tensor is NULL.
    #[error("managed tensor pointer is NULL, expected a DLManagedTensor(Versioned)")]
    NullTensor,
    /// The managed tensor's address is not aligned for its struct (8 bytes on 64-bit targets):
    /// no field of it can be read in place. Its deleter (read unaligned) has been called.
    #[error(
        "managed tensor at address {address:#x} is not aligned to {align} bytes, expected a DLManagedTensor(Versioned) as C lays it out"
    )]
    Misaligned {
        /// The address.
        address: usize,
        /// The alignment the struct needs.
        align: usize,
    },
    /// `version.major` is not 1; the tensor was handed back to its deleter unread.
    #[error("DLPack version {}.{} is not supported, expected major version 1", found.major, found.minor)]
    UnsupportedVersion {
        /// The version found.
        found: DLPackVersion,
    },
    /// `flags` has bits this crate does not know; the tensor was handed back to its deleter.
    #[error(
        "flags {flags:#x} are not defined by DLPack 1.3 (tensor version {}.{}), expected only READ_ONLY (0x1), IS_COPIED (0x2) and IS_SUBBYTE_TYPE_PADDED (0x4)",
        version.major,
        version.minor
    )]
    UnknownFlags {
        /// The unknown bits.
        flags: u64,
        /// The tensor's version.
        version: DLPackVersion,
    },
}

/// Whether a consumer may write to a tensor's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writability {
    /// A versioned tensor without `DLPACK_FLAG_BITMASK_READ_ONLY`.
    Writable,
    /// A versioned tensor with `DLPACK_FLAG_BITMASK_READ_ONLY`.
    ReadOnly,
    /// A legacy tensor: it carries no flags, so the consumer cannot tell (`dlpack.h`,
    /// `DLManagedTensor`).
    /// Treated as read-only, as NumPy does.
    Unknown,
}

/// The raw pointer of a managed tensor released by [`ManagedTensor::into_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawManagedTensor {
    /// A `DLManagedTensorVersioned*` (capsule name `"dltensor_versioned"`).
    Versioned(NonNull<DLManagedTensorVersioned>),
    /// A legacy `DLManagedTensor*` (capsule name `"dltensor"`).
    Legacy(NonNull<DLManagedTensor>),
}

/// Owns one managed tensor (`DLManagedTensorVersioned` of major version 1, or legacy
/// `DLManagedTensor`) and calls its deleter exactly once when dropped.
///
/// Construction checks the version: a versioned tensor of another major version is handed back
/// to its deleter unread (`dlpack.h`, `DLPackVersion`), so every `ManagedTensor` has a known
/// layout. The data itself is validated by [`ManagedTensor::layout`] before any access.
///
/// **Validated once.** The header and its `shape` and `strides` arrays belong to the producer,
/// which must not change them while the tensor is lent (the DLPack ownership contract), and
/// safe code cannot change them through a `ManagedTensor`. So the first successful
/// [`layout`](ManagedTensor::layout) records that the header is valid,
/// and later calls rebuild the layout from the header without validating again. A
/// tensor made by this crate's exporter ([`DlpackExport::into_dlpack`](crate::DlpackExport::into_dlpack)
/// and friends) is validated by the exporter and arrives with that result already kept, so a
/// Rust-to-Rust exchange validates its layout once in all. Tensors from elsewhere (FFI, Python
/// capsules) are validated at their first `layout`.
///
/// `ManagedTensor` is `Send` and `Sync`: the DLPack deleter may be called from any thread
/// (the [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html),
/// "Implementation"), and shared access only reads the header (and the atomic record of its
/// validation).
pub struct ManagedTensor {
    /// The header's `dl_tensor` field (after `version`, `manager_ctx`, `deleter` and `flags` in a
    /// `DLManagedTensorVersioned`: offset 32 on 64-bit targets; first in a legacy
    /// `DLManagedTensor`), derived from the header pointer, whose provenance it keeps: the field
    /// every access reads, reached with no branch on the kind of header. Tagged in its low bits
    /// (a `DLTensor` holds pointers, so its address is a multiple of 4 at least): [`LEGACY`] for
    /// a legacy header, [`VALIDATED`] once the layout has been validated. One word, so that a
    /// `ManagedTensor` moves in one register (a pair of words, written as two and read back as
    /// one 16-byte move, stalls the load); atomic, because the validation mark is set through
    /// `&self` and `&ManagedTensor` is shared across threads (two threads that validate at once
    /// store the same word: the pointer never changes, and the header cannot).
    tensor: AtomicPtr<DLTensor>,
}

/// Tag of [`ManagedTensor::tensor`]: the header is a legacy `DLManagedTensor`.
const LEGACY: usize = 1;
/// Tag of [`ManagedTensor::tensor`]: the layout has been validated.
const VALIDATED: usize = 2;
/// Tag of [`ManagedTensor::tensor`]: this crate's exporter built the tensor over memory that no
/// other tensor can reach (see [`ManagedTensor::is_unaliased`]). A third tag bit, where a
/// `DLTensor` is aligned to 8 bytes (it holds a `u64`); elsewhere the tag is never set.
const UNALIASED: usize = if align_of::<DLTensor>() >= 8 { 4 } else { 0 };
const TAGS: usize = LEGACY | VALIDATED | UNALIASED;

/// The `DLTensor` address of a [`ManagedTensor::tensor`] word, its tags cleared.
#[inline]
fn untagged(word: *mut DLTensor) -> NonNull<DLTensor> {
    // SAFETY: every word is a valid (non-NULL) `DLTensor` address with tag bits added
    // (`ManagedTensor::new`, `validate_now`); clearing them gives that address back.
    unsafe { NonNull::new_unchecked(word.map_addr(|a| a & !TAGS)) }
}

/// Offset of `dl_tensor` in a versioned header (`dlpack.h`, `DLManagedTensorVersioned`).
const VERSIONED_TENSOR: usize = core::mem::offset_of!(DLManagedTensorVersioned, dl_tensor);
/// Offset of `dl_tensor` in a legacy header (`dlpack.h`, `DLManagedTensor`).
const LEGACY_TENSOR: usize = core::mem::offset_of!(DLManagedTensor, dl_tensor);

impl ManagedTensor {
    /// Owns `raw`; `validated`: whether its layout is known to be valid; `unaliased`: whether
    /// no other tensor can reach its memory.
    #[inline]
    fn new(raw: RawManagedTensor, validated: bool, unaliased: bool) -> Self {
        let (header, offset, legacy) = match raw {
            RawManagedTensor::Versioned(p) => (p.cast::<u8>(), VERSIONED_TENSOR, 0),
            RawManagedTensor::Legacy(p) => (p.cast::<u8>(), LEGACY_TENSOR, LEGACY),
        };
        // SAFETY: `dl_tensor` lies `offset` bytes inside the header `header` points to, so the
        // offset stays in the same allocation, and the pointer keeps the header's provenance.
        let tensor = unsafe { header.add(offset) }.cast::<DLTensor>();
        // A `DLTensor` holds a `u64` and pointers, and the header's alignment was checked
        // (`from_raw_*`, or this crate's exporter): its tag bits are clear.
        assert_eq!(tensor.as_ptr().addr() & TAGS, 0, "misaligned header");
        let tags =
            legacy | if validated { VALIDATED } else { 0 } | if unaliased { UNALIASED } else { 0 };
        Self {
            tensor: AtomicPtr::new(tensor.as_ptr().map_addr(|a| a | tags)),
        }
    }

    /// The tagged `dl_tensor` pointer. Relaxed: the pointer never changes, and the validation
    /// mark publishes nothing but itself (it is derived from the header, which does not change).
    #[inline]
    fn word(&self) -> *mut DLTensor {
        self.tensor.load(Ordering::Relaxed)
    }

    /// The `dl_tensor` pointer, untagged.
    #[inline]
    fn tensor_ptr(&self) -> NonNull<DLTensor> {
        untagged(self.word())
    }
}

impl core::fmt::Debug for ManagedTensor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ManagedTensor")
            .field("raw", &self.raw())
            .finish()
    }
}

// SAFETY: DLPack allows the deleter to run on any thread (DLPack Python specification,
// "Implementation"), and the header fields are plain data. Producers whose deleters need a
// particular thread state (Python) acquire it themselves, as that section requires.
unsafe impl Send for ManagedTensor {}
// SAFETY: `&ManagedTensor` only reads the header and the producer-owned `shape`/`strides`
// arrays, which the producer must keep unmodified while the tensor is lent out; the validation
// mark is set atomically.
unsafe impl Sync for ManagedTensor {}

impl ManagedTensor {
    /// Takes ownership of a `DLManagedTensorVersioned`.
    ///
    /// # Errors
    ///
    /// [`HeaderError::NullTensor`] for NULL (nothing to free). [`HeaderError::UnsupportedVersion`]
    /// when `version.major != 1`: the deleter (at the layout-stable offset 16) has then already
    /// been called and no other field was read. [`HeaderError::UnknownFlags`] when `flags` has
    /// bits DLPack 1.3 does not define; the deleter has then been called too.
    /// [`HeaderError::Misaligned`] for an address not aligned for the struct; its deleter,
    /// read unaligned, has then been called.
    ///
    /// # Safety
    ///
    /// `ptr` is NULL or points to a managed tensor laid out as `dlpack.h` describes, valid until
    /// its deleter is called; the caller transfers the duty to call the deleter (it must not call
    /// it, nor use `ptr` afterwards).
    pub unsafe fn from_raw_versioned(
        ptr: *mut DLManagedTensorVersioned,
    ) -> Result<Self, HeaderError> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(HeaderError::NullTensor);
        };
        // SAFETY: `ptr` points to a managed tensor (caller); if misaligned, its deleter, at the
        // layout-stable offset 16, is read unaligned and called once, there.
        refuse_misaligned(ptr, || unsafe {
            let deleter = core::ptr::addr_of!((*ptr.as_ptr()).deleter).read_unaligned();
            if let Some(deleter) = deleter {
                deleter(ptr.as_ptr());
            }
        })?;
        // SAFETY: `ptr` is valid (caller) and aligned (checked). `version` sits at offset 0 of
        // every major version, so reading it is legal whatever the major is.
        let version = unsafe { (*ptr.as_ptr()).version };
        if version.major != ffi::DLPACK_MAJOR_VERSION {
            // SAFETY: the deleter's offset (16) is stable across majors (`dlpack.h`,
            // `DLManagedTensorVersioned`); the caller handed us the duty to call it once, and we
            // do so here, exactly once.
            unsafe { call_versioned_deleter(ptr) };
            return Err(HeaderError::UnsupportedVersion { found: version });
        }
        // SAFETY: major version 1, so `flags` is at offset 24 (`dlpack.h`,
        // `DLManagedTensorVersioned`).
        let flags = unsafe { (*ptr.as_ptr()).flags };
        let unknown = flags & !KNOWN_FLAGS;
        if unknown != 0 {
            // A flag from a newer minor version may change how the data must be read (as
            // IS_SUBBYTE_TYPE_PADDED did): refuse rather than misread.
            // SAFETY: as above, the deleter is called exactly once, here.
            unsafe { call_versioned_deleter(ptr) };
            return Err(HeaderError::UnknownFlags {
                flags: unknown,
                version,
            });
        }
        Ok(Self::new(RawManagedTensor::Versioned(ptr), false, false))
    }

    /// Takes ownership of a legacy `DLManagedTensor`.
    ///
    /// # Errors
    ///
    /// [`HeaderError::NullTensor`] for NULL; [`HeaderError::Misaligned`] for an address not
    /// aligned for the struct (its deleter, read unaligned, has then been called).
    ///
    /// # Safety
    ///
    /// As for [`ManagedTensor::from_raw_versioned`], for a legacy `DLManagedTensor`.
    pub unsafe fn from_raw_legacy(ptr: *mut DLManagedTensor) -> Result<Self, HeaderError> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(HeaderError::NullTensor);
        };
        // SAFETY: as in `from_raw_versioned`, for a legacy tensor.
        refuse_misaligned(ptr, || unsafe {
            let deleter = core::ptr::addr_of!((*ptr.as_ptr()).deleter).read_unaligned();
            if let Some(deleter) = deleter {
                deleter(ptr.as_ptr());
            }
        })?;
        Ok(Self::new(RawManagedTensor::Legacy(ptr), false, false))
    }

    /// Wraps a tensor whose version is known to be 1.x (built by this crate).
    ///
    /// # Safety
    ///
    /// As for [`ManagedTensor::from_raw_versioned`], and a versioned tensor has major 1 and
    /// defines no flag bits beyond DLPack 1.3's.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) unsafe fn from_raw_unchecked(raw: RawManagedTensor) -> Self {
        Self::new(raw, false, false)
    }

    /// Wraps a tensor built by this crate's exporter, which validated its finished header:
    /// [`ManagedTensor::layout`] then validates nothing again. `unaliased` marks memory no
    /// other tensor can reach (see [`ManagedTensor::is_unaliased`]).
    ///
    /// # Safety
    ///
    /// As for [`ManagedTensor::from_raw_unchecked`], and [`layout::validate`] accepts the
    /// finished header (with the version's `NullStrides` rule and the header's sub-byte flag).
    /// With `unaliased`: while the tensor lives, nothing but it reaches the bytes its layout
    /// describes, except readers of a read-only tensor's bytes, which nothing writes
    /// ([`ExportBuffer::is_unaliased`](crate::ExportBuffer::is_unaliased)).
    #[inline]
    pub(crate) unsafe fn from_raw_validated(raw: RawManagedTensor, unaliased: bool) -> Self {
        Self::new(raw, true, unaliased)
    }

    /// Whether this crate's exporter built the tensor over memory that nothing else reaches
    /// while it lives (an owned `Vec` moved into the export, say), or, for a read-only tensor,
    /// that nothing writes: accesses to it need no borrow of the registry ([`crate::borrow`]),
    /// since no other import can describe the same bytes. False for every tensor from FFI or
    /// Python, and for relays of imports that are not themselves unaliased.
    #[inline]
    pub(crate) fn is_unaliased(&self) -> bool {
        UNALIASED != 0 && self.word().addr() & UNALIASED != 0
    }

    /// A key of the tensor unique among live tensors: the address of its `DLTensor`, which
    /// nothing else owns while `self` does, and which stays put when `self` moves.
    #[inline]
    pub(crate) fn id(&self) -> usize {
        self.tensor_ptr().as_ptr().addr()
    }

    /// Where the tensor's memory came from, as the borrow registry recognizes producers.
    pub(crate) fn origin(&self) -> crate::borrow::Origin {
        crate::borrow::Origin {
            deleter: self.deleter_address(),
            manager_ctx: self.dl_tensor_ctx(),
        }
    }

    /// The address of the tensor's deleter, 0 for none: which producer made it.
    pub(crate) fn deleter_address(&self) -> usize {
        let deleter = match self.raw() {
            // SAFETY: the pointer is valid while `self` owns it (constructor contract).
            RawManagedTensor::Versioned(p) => unsafe { p.as_ref() }.deleter.map(|d| d as usize),
            // SAFETY: as above.
            RawManagedTensor::Legacy(p) => unsafe { p.as_ref() }.deleter.map(|d| d as usize),
        };
        deleter.unwrap_or(0)
    }

    /// `manager_ctx` of the tensor.
    pub(crate) fn dl_tensor_ctx(&self) -> *mut core::ffi::c_void {
        match self.raw() {
            // SAFETY: the pointer is valid while `self` owns it (constructor contract).
            RawManagedTensor::Versioned(p) => unsafe { p.as_ref() }.manager_ctx,
            // SAFETY: as above.
            RawManagedTensor::Legacy(p) => unsafe { p.as_ref() }.manager_ctx,
        }
    }

    /// The version of a versioned tensor (major is always 1), or `None` for a legacy tensor.
    #[inline]
    pub fn version(&self) -> Option<DLPackVersion> {
        match self.raw() {
            // SAFETY: the pointer is valid while `self` owns it (constructor contract).
            RawManagedTensor::Versioned(p) => Some(unsafe { p.as_ref() }.version),
            RawManagedTensor::Legacy(_) => None,
        }
    }

    /// Whether this is a legacy (unversioned) `DLManagedTensor`.
    #[inline]
    pub fn is_legacy(&self) -> bool {
        self.word().addr() & LEGACY != 0
    }

    /// `DLPACK_FLAG_BITMASK_*` flags; 0 for a legacy tensor.
    #[inline]
    pub fn flags(&self) -> u64 {
        match self.raw() {
            // SAFETY: the pointer is valid while `self` owns it (constructor contract).
            RawManagedTensor::Versioned(p) => unsafe { p.as_ref() }.flags,
            RawManagedTensor::Legacy(_) => 0,
        }
    }

    /// Whether the consumer may write to the data.
    #[inline]
    pub fn writability(&self) -> Writability {
        match self.raw() {
            RawManagedTensor::Legacy(_) => Writability::Unknown,
            RawManagedTensor::Versioned(_)
                if self.flags() & ffi::DLPACK_FLAG_BITMASK_READ_ONLY != 0 =>
            {
                Writability::ReadOnly
            }
            RawManagedTensor::Versioned(_) => Writability::Writable,
        }
    }

    /// Whether the tensor must be treated as read-only (flagged, or legacy).
    #[inline]
    pub fn is_read_only(&self) -> bool {
        self.writability() != Writability::Writable
    }

    /// Whether the producer made a copy for this consumer (`DLPACK_FLAG_BITMASK_IS_COPIED`).
    pub fn is_copied(&self) -> bool {
        self.flags() & ffi::DLPACK_FLAG_BITMASK_IS_COPIED != 0
    }

    /// The raw `DLTensor`, unvalidated. Prefer [`ManagedTensor::layout`].
    #[inline]
    pub fn dl_tensor(&self) -> &DLTensor {
        // SAFETY: the pointer is the `dl_tensor` field of the header `self` owns, valid while
        // it owns it (constructor contract); a versioned header has the layout of major version
        // 1 (checked at construction).
        unsafe { self.tensor_ptr().as_ref() }
    }

    /// Validates the layout (`dlpack.h`, `DLTensor` and `DLPackVersion`): NULL strides are read
    /// by the version's rule, and `IS_SUBBYTE_TYPE_PADDED` is honoured.
    ///
    /// The validation runs once: its result is kept, and later calls (or every call, for a
    /// tensor this crate's exporter built and validated) rebuild the same layout from the header
    /// without checking it again. A refused layout is validated again on every call.
    ///
    /// # Errors
    ///
    /// The [`LayoutError`] of [`layout::validate`].
    #[inline]
    pub fn layout(&self) -> Result<TensorLayout<'_>, LayoutError> {
        self.validate()?;
        // SAFETY: validation accepted this header with this version's rule and this sub-byte
        // flag (`validate_now` just now or before, or the exporter: `from_raw_validated`); the
        // header and its `shape`/`strides` cannot have changed since (the producer's contract,
        // and `&self` offers no mutation), and they stay valid while `&self` borrows the owner.
        Ok(unsafe { TensorLayout::from_validated(self.dl_tensor(), self.padded_subbyte()) })
    }

    /// The layout of a tensor whose validation is kept, rebuilt from the header.
    ///
    /// # Safety
    ///
    /// [`is_validated`](Self::is_validated) returned true for `self`.
    #[inline]
    pub(crate) unsafe fn validated_layout(&self) -> TensorLayout<'_> {
        debug_assert!(self.is_validated());
        // SAFETY: validated (caller): validation accepted this header with this version's rule
        // and this sub-byte flag, and the header and its arrays cannot have changed since (see
        // `layout`).
        unsafe { TensorLayout::from_validated(self.dl_tensor(), self.padded_subbyte()) }
    }

    /// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`.
    #[inline]
    fn padded_subbyte(&self) -> bool {
        self.flags() & ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED != 0
    }

    /// Validates the header unless that is already done (and kept): the verdict of
    /// [`ManagedTensor::layout`] without the layout.
    #[inline]
    pub(crate) fn validate(&self) -> Result<(), LayoutError> {
        if self.is_validated() {
            return Ok(());
        }
        self.validate_now()
    }

    /// Validates the header and marks it validated. The layout is rebuilt from the header by
    /// the caller ([`TensorLayout::from_validated`]) rather than returned from here.
    fn validate_now(&self) -> Result<(), LayoutError> {
        // SAFETY: the producer guarantees `shape`/`strides` point to `ndim` entries (or NULL)
        // for as long as the managed tensor lives, which `&self` bounds.
        unsafe {
            layout::check_header(
                self.dl_tensor(),
                NullStrides::for_version(self.version()),
                self.padded_subbyte(),
            )
        }?;
        // A plain store, no read-modify-write: the pointer and `LEGACY` never change, so every
        // thread that sets the mark stores the same word.
        let word = self.word();
        self.tensor
            .store(word.map_addr(|a| a | VALIDATED), Ordering::Relaxed);
        Ok(())
    }

    /// Whether the layout has been validated and the result kept (by the exporter that built
    /// the tensor, or by a former [`ManagedTensor::layout`]).
    #[inline]
    pub fn is_validated(&self) -> bool {
        self.word().addr() & VALIDATED != 0
    }

    /// The raw pointer, still owned by `self`. The header it points to, and its `shape` and
    /// `strides` arrays, must not be modified while `self` owns the tensor: the validation of
    /// the layout is kept (see [`ManagedTensor::layout`]).
    #[inline]
    pub fn as_raw(&self) -> RawManagedTensor {
        self.raw()
    }

    /// The header pointer.
    #[inline]
    fn raw(&self) -> RawManagedTensor {
        // One load for the pointer and its kind.
        let word = self.word();
        let bytes = untagged(word).cast::<u8>();
        if word.addr() & LEGACY != 0 {
            // SAFETY: `tensor` is the header's `dl_tensor` field, `LEGACY_TENSOR` bytes into the
            // header (`new`), with the header's provenance.
            RawManagedTensor::Legacy(unsafe { bytes.sub(LEGACY_TENSOR) }.cast())
        } else {
            // SAFETY: as above, `VERSIONED_TENSOR` bytes into a versioned header.
            RawManagedTensor::Versioned(unsafe { bytes.sub(VERSIONED_TENSOR) }.cast())
        }
    }

    /// Releases ownership without calling the deleter; the caller must see that it is called
    /// exactly once (for example through a capsule destructor).
    #[must_use = "the deleter must still be called exactly once"]
    pub fn into_raw(self) -> RawManagedTensor {
        let raw = self.raw();
        core::mem::forget(self);
        raw
    }

    /// Sets flag bits on a versioned tensor that this process produced. Crate-internal. Never
    /// the sub-byte flag, which changes how the kept validation reads the layout.
    pub(crate) fn set_flags(&mut self, bits: u64) {
        debug_assert_eq!(bits & ffi::DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, 0);
        if let RawManagedTensor::Versioned(mut p) = self.raw() {
            // SAFETY: `&mut self` owns the tensor exclusively, and only tensors freshly built by
            // this crate's exporter, not yet lent to anyone, reach this function.
            unsafe { p.as_mut() }.flags |= bits;
        }
    }
}

impl Drop for ManagedTensor {
    fn drop(&mut self) {
        // What an export lending this tensor on recorded outside this crate's registry ends
        // with it (`crate::borrow::lend`); one load when nothing was lent so.
        crate::borrow::release_loans(self.id());
        match self.raw() {
            // SAFETY: `self` owns the tensor and this is the only place that calls the deleter;
            // `into_raw` forgets `self`, so drop never runs after ownership is released.
            RawManagedTensor::Versioned(p) => unsafe { call_versioned_deleter(p) },
            RawManagedTensor::Legacy(p) => {
                // SAFETY: as above; the struct is valid until its deleter runs.
                if let Some(deleter) = unsafe { p.as_ref() }.deleter {
                    // SAFETY: called once, with the pointer the producer handed out.
                    unsafe { deleter(p.as_ptr()) };
                }
            }
        }
    }
}

/// [`HeaderError::Misaligned`] for a header at an address not aligned for `H`, once
/// `call_deleter` has run; nothing for an aligned one.
fn refuse_misaligned<H>(ptr: NonNull<H>, call_deleter: impl FnOnce()) -> Result<(), HeaderError> {
    let (address, align) = (ptr.as_ptr().addr(), align_of::<H>());
    if address % align == 0 {
        return Ok(());
    }
    call_deleter();
    Err(HeaderError::Misaligned { address, align })
}

/// Calls the deleter of a versioned tensor, if any.
///
/// # Safety
///
/// `p` is a valid `DLManagedTensorVersioned` (any major version) whose deleter has not been
/// called; it must not be used afterwards.
unsafe fn call_versioned_deleter(p: NonNull<DLManagedTensorVersioned>) {
    // SAFETY: `deleter` is at offset 16 in every major version (`dlpack.h`,
    // `DLManagedTensorVersioned`) and `p` is valid (caller).
    let deleter = unsafe { (*p.as_ptr()).deleter };
    if let Some(deleter) = deleter {
        // SAFETY: called once, with the pointer the producer handed out (caller).
        unsafe { deleter(p.as_ptr()) };
    }
}
