//! Borrows of imported memory: one process-wide registry, keyed by memory, that keeps safe code
//! from holding a `&mut` to bytes that anything else it can reach also references.
//!
//! Two imports of one NumPy array (two `from_dlpack(x)` calls, or `f(x, x)` for a function taking
//! two writable views) are two [`ImportedData`](crate::ImportedData) values over the same bytes.
//! Each one alone is sound, but a `&mut [T]` from one beside any reference from the other is
//! undefined behaviour (release builds assume the two do not alias). So every access that hands
//! out references to imported host memory, or reads and writes it, first *borrows* the bytes it
//! reaches here: shared for reads, exclusive for writes. A borrow that overlaps an exclusive one,
//! or an exclusive borrow that overlaps any other, is refused with a [`BorrowError`].
//!
//! - **Keyed by memory**, not by Python object or capsule (each `__dlpack__` call makes a new
//!   capsule): the bytes a layout reaches, exactly. Interleaved views (`x[::2]` and `x[1::2]`)
//!   do not overlap, `x` and `x[1:]` do. Whether two strided layouts share a byte is a bounded
//!   linear Diophantine problem (as NumPy's `np.shares_memory` poses it); it is solved exactly
//!   by a search with a work budget, and a search that exhausts its budget (only adversarial
//!   layouts do) counts as an overlap: a borrow may be refused, never wrongly allowed.
//!   Host-accessible memory of every device type (`kDLCPU`, `kDLCUDAHost`, `kDLCUDAManaged`,
//!   ...) is one address space: a pinned buffer can be seen under more than one device type.
//! - **Held by the import**: the first access of an import takes its borrow, which lasts until
//!   the import is dropped or its borrow released
//!   ([`ImportedData::release_borrow`](crate::ImportedData::release_borrow)); or **held by a
//!   guard** ([`ImportedData::readonly`](crate::ImportedData::readonly),
//!   [`ImportedData::readwrite`](crate::ImportedData::readwrite), and the per-call reads
//!   [`ImportedData::get_scoped`](crate::ImportedData::get_scoped) and
//!   [`ImportedData::to_vec_scoped`](crate::ImportedData::to_vec_scoped)), until the guard is
//!   dropped, under a key of its own (odd numbers: an import's key, the address of its
//!   managed tensor's header, is even). A consumer marked
//!   `#[dlpack(borrow = "shared")]` or `#[dlpack(borrow = "exclusive")]` takes the import's
//!   borrow at import instead ([`ImportBuffer::borrow_at_import`](crate::ImportBuffer::borrow_at_import)), so
//!   that a `#[pyfunction]` argument is refused while pyo3 extracts it, with a note naming the
//!   parameter, as rust-numpy's `PyReadonlyArray` and `PyReadwriteArray` are. An import that is
//!   never accessed (nor borrows at import) never touches the registry, and neither does an import of memory that no
//!   other import can reach (a tensor this crate exported from an owned `Vec`, see
//!   [`ExportBuffer::is_unaliased`](crate::ExportBuffer::is_unaliased)).
//! - **One per process**: every copy of this crate in the process (several extension modules,
//!   each linking its own) uses one registry, found through a versioned C-ABI table. With the
//!   `python` feature the first copy to look publishes its table as a capsule in `sys.modules`
//!   (module `_dlpack_runtime_shared`, attribute `BORROW_CHECKING_API`), where the others find
//!   it. A copy looks with the GIL held (in its Python consumer, or at a borrow on a thread
//!   that holds the GIL), never waiting for it; until then it uses its own table, which it
//!   publishes when it looks if no copy has. Without the `python` feature a copy uses its own.
//!   The accesses after an import's first borrow check one word of its flags.
//!
//! # What no registry sees
//!
//! Only borrows made through this crate, and rust-numpy's (below), are registered. Python code,
//! NumPy, or native code that writes the memory while Rust holds a borrow is out of reach of any
//! checker (as it is for rust-numpy): do not call back into code that writes a producer's array
//! while holding a slice of it.
//!
//! # rust-numpy
//!
//! With the `python` feature, a borrow of memory that NumPy exported is also taken in
//! rust-numpy's registry (the `numpy` crate's `PyReadonlyArray` and `PyReadwriteArray`), when an
//! extension built on it has published one: a `PyReadwriteArray` held elsewhere refuses this
//! crate's borrows of the same array, and this crate's exclusive borrow refuses its
//! `readwrite()`. It is taken on a private view of the exporting array (found through NumPy's
//! `manager_ctx`, once a probe export confirmed that NumPy keeps the array there), since
//! rust-numpy reads the array's shape and strides again when the borrow is released: Python
//! code may reshape or retype the array itself meanwhile, never the view. An import
//! lent on by an export (kept in a tensor type of one's own) records the loan there too, for as
//! long as it lives.
//!
//! rust-numpy compares borrows of one base array only, by range and stride gcd: it can refuse
//! disjoint views that this crate allows, and it does not see two arrays over the same memory
//! through different base objects (`np.from_dlpack(x)` and `x`): a `PyReadwriteArray` of one
//! and a borrow of ours of the other are both granted there (this crate's own registry, keyed by
//! memory, still refuses two of its own). rust-numpy publishes its registry when an extension
//! built on it first borrows an array: a borrow this crate took before that is not mirrored.
//! Mirroring needs the GIL: a borrow of NumPy memory on a thread without it waits for it (do not
//! wait for such a thread while holding the GIL); memory that is not NumPy's never does.
//!
//! # Limits
//!
//! - The registry is found in `sys.modules`: a program that deletes
//!   `sys.modules['_dlpack_runtime_shared']` splits it for the copies that look after that.
//! - Memory mapped twice (two `np.memmap` of one file) is two address ranges to the registry.
//! - A borrow costs a lock of the registry, a look-up of the live borrows whose byte ranges may
//!   meet its own (they are kept ordered by address, apart per power-of-two class of range
//!   length: `O(log n)` per class in use), an overlap test for those whose ranges do meet and,
//!   for NumPy memory once rust-numpy is loaded, the GIL and a call into rust-numpy; once per
//!   import and access kind. Releasing a borrow costs `O(log n)`.

mod lock;
pub(crate) mod overlap;
mod process;
mod registry;
#[cfg(feature = "python")]
mod rust_numpy;

use core::ffi::c_void;
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

pub(crate) use overlap::Footprint;

/// How memory is borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Shared: read through `&[T]`, `&T` or by value; any number may overlap.
    Shared,
    /// Exclusive: written (through `&mut [T]` or in place); overlaps nothing.
    Exclusive,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Shared => "shared",
            Access::Exclusive => "exclusive",
        })
    }
}

/// A borrowed range of host memory, for error messages: the bytes `[start, end)` (addresses)
/// that a layout reaches, from its lowest byte to one past its highest. A strided layout need
/// not reach every byte in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BorrowedRange {
    /// Address of the lowest byte reached.
    pub start: usize,
    /// One past the highest byte reached.
    pub end: usize,
    /// How the bytes are borrowed.
    pub access: Access,
}

impl fmt::Display for BorrowedRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bytes [{:#x}, {:#x}) ({} bytes, {})",
            self.start,
            self.end,
            self.end - self.start,
            self.access
        )
    }
}

/// Imported memory that cannot be borrowed as asked.
///
/// Returned (inside [`LayoutError::Borrow`](crate::LayoutError::Borrow)) by the accessors of
/// [`ImportedData`](crate::ImportedData), and by the import of a consumer that borrows at import
/// (`#[dlpack(borrow = "...")]`, inside [`ImportError::Layout`](crate::ImportError::Layout)).
/// The message names the byte ranges, which import holds the other borrow, and what to do.
///
/// # In Python
///
/// Every variant is a `BufferError`, whichever registry refused: this crate's
/// ([`Conflict`](Self::Conflict)) or rust-numpy's ([`RustNumpy`](Self::RustNumpy)). Raised
/// while pyo3 extracts an argument (a consumer that borrows at import), it carries pyo3's note
/// naming the parameter, `while processing 'b'` (in `e.__notes__`, printed by tracebacks since
/// Python 3.11).
///
/// The opposite refusal is rust-numpy's own: when an argument of an extension built on
/// rust-numpy (`PyReadonlyArray`, `PyReadwriteArray`) conflicts with a borrow this crate holds,
/// rust-numpy raises its error, a `TypeError` "The given array is already borrowed" at the
/// extraction of the argument (`try_readwrite()` returns it as `numpy::BorrowError`, and
/// `readwrite()` panics). Code that mixes the two should expect both.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BorrowError {
    /// Another import holds a borrow of some of the same bytes, and one of the two is exclusive.
    #[error(
        "cannot borrow {} {}: another live import of the same memory (an earlier argument of this call, or an import kept elsewhere) holds {} {}, and an exclusive borrow may overlap no other; pass memory that does not overlap (a copy), take the borrows in turn (drop a readonly() guard before readwrite(), or drop the other import first), or give the other back with release_borrow()",
        Bytes(requested),
        Adverb(requested.access),
        Bytes(held),
        Adverb(held.access)
    )]
    Conflict {
        /// The borrow asked for.
        requested: BorrowedRange,
        /// The borrow that overlaps it.
        held: BorrowedRange,
    },
    /// rust-numpy's registry refused the borrow of a NumPy array's memory (see
    /// [rust-numpy](self#rust-numpy)). Borrows of NumPy memory are taken there before this
    /// crate's registry, so while an extension built on rust-numpy has published it, this is
    /// also how a conflict between two imports of one array through this crate is reported.
    #[error(
        "cannot borrow {} {}: {reason}{}",
        Bytes(requested),
        Adverb(requested.access),
        rust_numpy_hint(reason)
    )]
    RustNumpy {
        /// The borrow asked for.
        requested: BorrowedRange,
        /// Why, in words.
        reason: &'static str,
    },
    /// The process's registry cannot be used: another library published a table of the same
    /// name that is not one (`reason` says how), or the registry failed.
    #[error("the borrow registry is unavailable: {reason}")]
    Unavailable {
        /// What is wrong.
        reason: &'static str,
    },
}

/// The bytes of a [`BorrowedRange`], for messages: `bytes [0x.., 0x..) (16 bytes) of host
/// memory`.
struct Bytes<'a>(&'a BorrowedRange);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let BorrowedRange { start, end, .. } = *self.0;
        write!(
            f,
            "bytes [{start:#x}, {end:#x}) ({} bytes) of host memory",
            end - start
        )
    }
}

/// How a borrow is taken, for messages: `shared` or `exclusively`.
struct Adverb(Access);

impl fmt::Display for Adverb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Access::Shared => "shared",
            Access::Exclusive => "exclusively",
        })
    }
}

/// What to do about a refusal by rust-numpy's registry: for a conflict, who may hold the other
/// borrow there and how to end it; nothing for the other refusals, whose reason says it all.
/// Borrows of NumPy memory are taken in rust-numpy's registry first, so while it is published a
/// conflict between two imports of this crate over one array is found there too: it is
/// reported as this crate's own [`BorrowError::Conflict`] when this crate's registry sees it
/// (it names both byte ranges), as this refusal when only rust-numpy's does (a
/// `PyReadwriteArray`, or views that rust-numpy's coarser test cannot tell apart).
fn rust_numpy_hint(reason: &str) -> &'static str {
    if reason.starts_with("rust-numpy holds") {
        "; the other borrow is held there by another live import of the same array through this crate, which records its borrows there too (an earlier argument of this call, or an import kept elsewhere), or by a PyReadonlyArray or PyReadwriteArray of an extension built on rust-numpy (a caller up the stack that holds one while calling this); pass memory that does not overlap (a copy), take the borrows in turn (drop a readonly() guard before readwrite(), or drop the other import or array first), or give the other back with release_borrow()"
    } else {
        ""
    }
}

/// Where an import's memory came from: its header's deleter and `manager_ctx`, by which a
/// NumPy array's memory is recognized (see [rust-numpy](self#rust-numpy)).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "python"), allow(dead_code))] // read by the rust-numpy bridge only
pub(crate) struct Origin {
    /// The address of the deleter (0 for none).
    pub(crate) deleter: usize,
    /// `manager_ctx`.
    pub(crate) manager_ctx: *mut c_void,
}

/// Borrows the bytes of `footprint` for the import `owner` (a unique, stable address of the
/// import, such as its managed tensor's header), as `access`. A held borrow is kept, or
/// upgraded from shared to exclusive; a borrow is released by [`release`].
pub(crate) fn acquire(
    owner: usize,
    footprint: &Footprint,
    access: Access,
    origin: Origin,
) -> Result<(), BorrowError> {
    acquire_as(owner, footprint, access, origin, false)
}

/// Turns the exclusive borrow `owner` holds of `footprint` into a shared one (which always
/// succeeds in this crate's registry).
pub(crate) fn downgrade(
    owner: usize,
    footprint: &Footprint,
    origin: Origin,
) -> Result<(), BorrowError> {
    acquire_as(owner, footprint, Access::Shared, origin, true)
}

fn acquire_as(
    owner: usize,
    footprint: &Footprint,
    access: Access,
    origin: Origin,
    replace: bool,
) -> Result<(), BorrowError> {
    let table = process::table()?;
    let then = || registry::acquire(table, owner, footprint, access, replace);
    #[cfg(feature = "python")]
    if rust_numpy::is_numpy(origin) {
        let (start, end) = footprint.span();
        let requested = BorrowedRange { start, end, access };
        // When rust-numpy's registry refuses first, this crate's own conflict, if it sees one,
        // is the one to report: it names the bytes the other import holds.
        let ours = || registry::conflict_in(table, owner, footprint, access);
        return rust_numpy::acquire(owner, origin, requested, replace, then, ours);
    }
    let _ = origin;
    then()
}

/// Records that `owner`'s memory (`footprint`) is lent by an export, as `access`, where
/// borrows are tracked outside this crate's registry (rust-numpy's, for NumPy memory), until
/// `owner`'s managed tensor is dropped. This crate's registry sees the loan's consumers when
/// they borrow.
pub(crate) fn lend(
    owner: usize,
    footprint: &Footprint,
    origin: Origin,
    access: Access,
) -> Result<(), BorrowError> {
    #[cfg(feature = "python")]
    if rust_numpy::is_numpy(origin) {
        let (start, end) = footprint.span();
        let requested = BorrowedRange { start, end, access };
        return rust_numpy::acquire(owner, origin, requested, true, || Ok(()), || None);
    }
    let _ = (owner, footprint, origin, access);
    Ok(())
}

/// Releases what [`lend`] recorded for `owner`: called when a managed tensor is dropped, so
/// cheap when nothing was lent.
#[inline]
pub(crate) fn release_loans(owner: usize) {
    #[cfg(feature = "python")]
    if rust_numpy::any() {
        rust_numpy::release(owner);
    }
    let _ = owner;
}

/// Readies what borrows of Python objects' memory need, with the GIL held: finds (or
/// publishes) the process's registry, and recognizes NumPy's memory. Called by this crate's
/// Python consumer before it imports anything, so that a later borrow on a thread without the
/// GIL does not need it for that.
#[cfg(feature = "python")]
pub(crate) fn prepare(py: pyo3::Python<'_>) {
    process::prepare(py);
    rust_numpy::prepare(py);
}

/// The deleter of the NumPy imports that the Python consumer reads from the arrays' fields,
/// stored by it before its first such import (0 until then): their `manager_ctx` is the array,
/// as in NumPy's own export, so their memory is NumPy's to the rust-numpy bridge.
#[cfg(feature = "python")]
pub(crate) static NUMPY_FIELDS_DELETER: core::sync::atomic::AtomicUsize =
    core::sync::atomic::AtomicUsize::new(0);

/// NumPy's `ndarray` type, when NumPy has been imported (and recognized, [`prepare`]).
#[cfg(feature = "python")]
pub(crate) fn numpy_ndarray_type(py: pyo3::Python<'_>) -> Option<*mut pyo3::ffi::PyTypeObject> {
    rust_numpy::ndarray_type(py)
}

/// A shared borrow held for the time of one read of memory that no import holds (a copy made
/// by this crate's exporter): released when dropped.
#[must_use = "the borrow ends when the guard is dropped"]
pub(crate) struct ReadBorrow(Option<usize>);

impl ReadBorrow {
    /// Borrows `footprint` shared for `owner` (the address of the managed tensor read, unique
    /// while it lives), or nothing for a layout that reaches no byte (`None`).
    pub(crate) fn new(
        owner: usize,
        footprint: Option<Footprint>,
        origin: Origin,
    ) -> Result<Self, BorrowError> {
        let Some(footprint) = footprint else {
            return Ok(Self(None));
        };
        acquire(owner, &footprint, Access::Shared, origin)?;
        Ok(Self(Some(owner)))
    }
}

impl Drop for ReadBorrow {
    fn drop(&mut self) {
        if let Some(owner) = self.0 {
            release(owner);
        }
    }
}

/// The next guard key: odd numbers from a process-wide counter, `(n << 1) | 1`.
///
/// A borrow is kept in the registry under its owner's key. An import's own (sticky) borrow is
/// keyed by the address of its managed tensor's header, which is at least 4-aligned (8 on
/// 64-bit targets), so an even number; a borrow held by a guard ([`ScopedBorrow`]) is keyed by
/// an odd number that no other live borrow has: each is taken once from this counter, which
/// never wraps (once it has handed out every odd `usize`, after 2^63 guards on a 64-bit target,
/// guards are refused with [`BorrowError::Unavailable`]).
fn next_guard_key() -> Result<usize, BorrowError> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < usize::MAX >> 1).then_some(n + 1)
        })
        .map_err(|_| BorrowError::Unavailable {
            reason: "every guard key has been used",
        })?;
    Ok((n << 1) | 1)
}

/// A borrow held by a guard rather than by an import: registered under a key of its own
/// ([`next_guard_key`]), so that several guards of one import, and the import's own borrow,
/// are distinct borrows; released when dropped.
#[must_use = "the borrow ends when the guard is dropped"]
#[derive(Debug)]
pub(crate) struct ScopedBorrow(Option<usize>);

impl ScopedBorrow {
    /// Borrows nothing: for memory that a borrow lasting longer than this value covers, or that
    /// needs none.
    pub(crate) const NONE: Self = Self(None);

    /// Borrows `footprint` as `access` under a new guard key.
    pub(crate) fn new(
        footprint: &Footprint,
        access: Access,
        origin: Origin,
    ) -> Result<Self, BorrowError> {
        let key = next_guard_key()?;
        acquire(key, footprint, access, origin)?;
        Ok(Self(Some(key)))
    }

    /// Whether a borrow is registered (not [`ScopedBorrow::NONE`]).
    pub(crate) fn is_registered(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for ScopedBorrow {
    fn drop(&mut self) {
        if let Some(key) = self.0 {
            release(key);
        }
    }
}

/// Releases the borrow of `owner`, if it holds one.
pub(crate) fn release(owner: usize) {
    if let Ok(table) = process::table() {
        registry::release(table, owner);
    }
    // As in `release_loans`: an owner's mirrored borrow is counted before its acquire returns.
    #[cfg(feature = "python")]
    if rust_numpy::any() {
        rust_numpy::release(owner);
    }
}
