//! The registry's C-ABI table ([`BorrowApi`]), this copy's own registry behind it, and the calls
//! through whichever table the process uses.
//!
//! The table is what copies of this crate share, so its layout is a stable ABI: version 1 is
//! the struct below, and later versions may only add fields at the end (`size` says how many
//! bytes the publisher's struct has). A copy accepts any table of version >= 1 whose `size`
//! covers version 1's fields, and reads a later field only when `size` covers it. The request
//! and answer structs passed to `acquire` carry their own `size` the same way.

use core::ffi::c_void;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::lock::RegistryLock;
use super::{Access, BorrowError, BorrowedRange, Footprint};

/// Version of [`BorrowApi`] this copy publishes.
pub(super) const API_VERSION: u64 = 1;
/// Bytes of version 1's [`BorrowApi`]: what a published table must have at least.
pub(super) const V1_SIZE: u64 = 5 * 8;
/// Bytes of version 1's [`RawRequest`].
const V1_REQUEST_SIZE: u64 = 9 * 8;
/// Bytes of version 1's [`RawHeld`].
const V1_HELD_SIZE: u64 = 4 * 8;

// Version 1's sizes, on 64-bit targets (where pointers are 8 bytes).
const _: () = {
    assert!(size_of::<BorrowApi>() as u64 == V1_SIZE || size_of::<usize>() != 8);
    assert!(size_of::<RawRequest>() as u64 == V1_REQUEST_SIZE || size_of::<usize>() != 8);
    assert!(size_of::<RawHeld>() as u64 == V1_HELD_SIZE);
};

/// The registry's C-ABI table, version 1.
#[repr(C)]
pub(super) struct BorrowApi {
    /// [`API_VERSION`] of the publisher.
    pub(super) version: u64,
    /// `size_of::<BorrowApi>()` of the publisher.
    pub(super) size: u64,
    /// Passed back to every function.
    pub(super) ctx: *const c_void,
    /// Borrows `request` for `request.owner`. Returns [`GRANTED`]; [`CONFLICT`], with `held`
    /// filled (as far as its `size` allows); [`INVALID`] for a request that describes no
    /// layout or is smaller than version 1's; [`FAILED`] otherwise. Never unwinds; callable
    /// from any thread, with or without the GIL.
    pub(super) acquire: unsafe extern "C" fn(
        ctx: *const c_void,
        request: *const RawRequest,
        held: *mut RawHeld,
    ) -> i32,
    /// Releases the borrow of `owner`, if any. Never unwinds; callable from any thread.
    pub(super) release: unsafe extern "C" fn(ctx: *const c_void, owner: u64),
}

// SAFETY: the table is immutable after it is built, and `ctx` is only passed back to its own
// functions, which synchronize (the registry's mutex).
unsafe impl Sync for BorrowApi {}

/// A borrow request as it crosses the ABI: the footprint's parts ([`Footprint::terms`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct RawRequest {
    /// `size_of::<RawRequest>()` of the caller.
    pub(super) size: u64,
    /// The import asking.
    pub(super) owner: u64,
    /// Address space: 0 is host memory (the only one borrowed today).
    pub(super) space: u64,
    /// 1 for exclusive, 0 for shared.
    pub(super) exclusive: u64,
    /// 1: the owner's held borrow, if any, is replaced by this one even when this one is
    /// weaker (exclusive to shared); 0: a held borrow that covers the request is kept.
    pub(super) replace: u64,
    /// Bytes per element.
    pub(super) element_bytes: u64,
    /// Address of the lowest element.
    pub(super) low: u64,
    /// `nterms` pairs (stride in bytes, extent).
    pub(super) terms: *const [u64; 2],
    /// Number of pairs at `terms`.
    pub(super) nterms: u64,
}

/// The borrow that refused a request, as it crosses the ABI.
#[repr(C)]
pub(super) struct RawHeld {
    /// `size_of::<RawHeld>()` of the caller: how many bytes the registry may write.
    pub(super) size: u64,
    /// 1 for exclusive, 0 for shared.
    pub(super) exclusive: u64,
    /// Lowest byte.
    pub(super) start: u64,
    /// One past the highest byte.
    pub(super) end: u64,
}

/// [`BorrowApi::acquire`]: the borrow is held.
pub(super) const GRANTED: i32 = 0;
/// [`BorrowApi::acquire`]: refused, another owner's borrow overlaps.
pub(super) const CONFLICT: i32 = 1;
/// [`BorrowApi::acquire`]: the request is malformed.
pub(super) const INVALID: i32 = 2;
/// [`BorrowApi::acquire`]: the registry failed (a panic was caught).
pub(super) const FAILED: i32 = 3;

/// This copy's registry: the live borrows, indexed by the bytes they reach and by owner.
static REGISTRY: RegistryLock<Registry> = RegistryLock::new(Registry::new());

/// Number of span length classes: class `c` holds spans of `2^c` to `2^(c + 1) - 1` bytes.
const CLASSES: usize = usize::BITS as usize;

/// Where a live borrow is kept in [`Registry::by_span`]: address space, 1 for exclusive (0 for
/// shared), span length class, lowest byte, owner. Ordered so that the borrows of one space,
/// access and class whose spans start in a range of addresses are one range of keys.
type Key = (u64, u8, u8, usize, u64);

/// A key of [`SpanIndex::Many`] that no request looks at (no borrow is of space `u64::MAX`,
/// nor of class 255), standing for no borrow: kept for good, so that the tree's root node is
/// not freed with its last borrow and allocated again with the next.
const SENTINEL: Key = (u64::MAX, 1, u8::MAX, usize::MAX, u64::MAX);

/// Borrows a [`SpanIndex`] keeps in a sorted vector before it moves them to a tree.
const FEW: usize = 32;

/// [`Registry::by_span`]: the live borrows by [`Key`], with one past the highest byte of each
/// one's span. A sorted vector while there are at most [`FEW`] (an insertion or a removal then
/// moves a few words, where a tree updates its nodes), a tree from then on.
enum SpanIndex {
    Few(Vec<(Key, usize)>),
    Many(BTreeMap<Key, usize>),
}

impl SpanIndex {
    fn insert(&mut self, key: Key, high: usize) {
        match self {
            SpanIndex::Few(few) => match few.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(at) => few[at].1 = high,
                Err(at) if few.len() < FEW => few.insert(at, (key, high)),
                Err(_) => {
                    let mut many: BTreeMap<Key, usize> = few.drain(..).collect();
                    many.insert(SENTINEL, 0);
                    many.insert(key, high);
                    *self = SpanIndex::Many(many);
                }
            },
            SpanIndex::Many(many) => {
                many.insert(key, high);
            }
        }
    }

    fn remove(&mut self, key: &Key) -> Option<usize> {
        match self {
            SpanIndex::Few(few) => {
                let at = few.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
                Some(few.remove(at).1)
            }
            SpanIndex::Many(many) => many.remove(key),
        }
    }

    /// The borrows whose keys are in `[from, to)`, in order.
    fn range(&self, from: Key, to: Key) -> SpanRange<'_> {
        match self {
            SpanIndex::Few(few) => {
                let start = few.partition_point(|(k, _)| *k < from);
                let end = start + few[start..].partition_point(|(k, _)| *k < to);
                SpanRange::Few(few[start..end].iter())
            }
            SpanIndex::Many(many) => SpanRange::Many(many.range(from..to)),
        }
    }

    #[cfg(test)]
    fn get(&self, key: &Key) -> Option<usize> {
        self.range(*key, (key.0, key.1, key.2, key.3, key.4.wrapping_add(1)))
            .next()
            .filter(|(k, _)| k == key)
            .map(|(_, high)| high)
    }

    /// Borrows kept, [`SENTINEL`] not counted.
    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            SpanIndex::Few(few) => few.len(),
            SpanIndex::Many(many) => many.len() - usize::from(many.contains_key(&SENTINEL)),
        }
    }
}

/// [`Registry::by_owner`]: each owner's key in [`Registry::by_span`] and its footprint. A vector
/// scanned by owner while there are at most [`FEW`] (an insertion or a removal then moves a few
/// entries, where a hash map hashes and probes), a hash map from then on.
enum OwnerIndex {
    Few(Vec<(u64, (Key, Footprint))>),
    Many(HashMap<u64, (Key, Footprint), BuildHasherDefault<OwnerHasher>>),
}

impl OwnerIndex {
    #[inline]
    fn get(&self, owner: u64) -> Option<&(Key, Footprint)> {
        match self {
            OwnerIndex::Few(few) => few.iter().find(|(o, _)| *o == owner).map(|(_, v)| v),
            OwnerIndex::Many(many) => many.get(&owner),
        }
    }

    #[inline]
    fn get_mut(&mut self, owner: u64) -> Option<&mut (Key, Footprint)> {
        match self {
            OwnerIndex::Few(few) => few.iter_mut().find(|(o, _)| *o == owner).map(|(_, v)| v),
            OwnerIndex::Many(many) => many.get_mut(&owner),
        }
    }

    /// Records `owner`, which holds no entry.
    fn insert(&mut self, owner: u64, value: (Key, Footprint)) {
        debug_assert!(self.get(owner).is_none(), "one entry per owner");
        match self {
            OwnerIndex::Few(few) if few.len() < FEW => few.push((owner, value)),
            OwnerIndex::Few(few) => {
                let mut many: HashMap<_, _, _> =
                    HashMap::with_capacity_and_hasher(2 * FEW, BuildHasherDefault::new());
                many.extend(few.drain(..));
                many.insert(owner, value);
                *self = OwnerIndex::Many(many);
            }
            OwnerIndex::Many(many) => {
                many.insert(owner, value);
            }
        }
    }

    #[inline]
    fn remove(&mut self, owner: u64) -> Option<(Key, Footprint)> {
        match self {
            OwnerIndex::Few(few) => {
                let at = few.iter().position(|(o, _)| *o == owner)?;
                Some(few.swap_remove(at).1)
            }
            OwnerIndex::Many(many) => many.remove(&owner),
        }
    }

    #[cfg(test)]
    fn iter(&self) -> Box<dyn Iterator<Item = (&u64, &(Key, Footprint))> + '_> {
        match self {
            OwnerIndex::Few(few) => Box::new(few.iter().map(|(o, v)| (o, v))),
            OwnerIndex::Many(many) => Box::new(many.iter()),
        }
    }
}

/// [`SpanIndex::range`]'s borrows.
enum SpanRange<'a> {
    Few(core::slice::Iter<'a, (Key, usize)>),
    Many(std::collections::btree_map::Range<'a, Key, usize>),
}

impl Iterator for SpanRange<'_> {
    type Item = (Key, usize);

    fn next(&mut self) -> Option<(Key, usize)> {
        match self {
            SpanRange::Few(few) => few.next().copied(),
            SpanRange::Many(many) => many.next().map(|(&k, &high)| (k, high)),
        }
    }
}

/// The live borrows.
///
/// A request must be checked against every borrow of its space whose footprint shares a byte
/// with it; only those whose byte spans meet the request's can. Borrows are kept ordered by
/// their span's lowest byte, apart for each class of span length (powers of two): a span of
/// class `c` that ends after the request's lowest byte `a` starts after `a - 2^(c + 1)`, so
/// the candidates of one class are one range of keys, `[a - 2^(c + 1) + 1, b)` for a request
/// `[a, b)`. That range may also hold spans of the class that end at or before `a`, all inside
/// `[a - 2^(c + 1), a)`: for disjoint borrows at most two per class. Shared
/// and exclusive borrows are kept apart too, so that a shared request looks at exclusive
/// borrows only. A request costs `O(log n)` per class in use plus the candidates it tests,
/// with the exact footprint test run on each candidate whose span meets the request's.
pub(super) struct Registry {
    /// The borrows, by [`Key`]: one past the highest byte of each one's span.
    by_span: SpanIndex,
    /// Each owner's key in `by_span`, and its footprint.
    by_owner: OwnerIndex,
    /// Borrows per (exclusive, class), of every space.
    per_class: [[usize; CLASSES]; 2],
    /// Per exclusive (0, 1), bit `c` set when `per_class` counts borrows of class `c`: the
    /// classes worth a look.
    in_use: [u64; 2],
}

const _: () = assert!(CLASSES <= u64::BITS as usize);

/// The hasher of [`Registry::by_owner`] (and of the rust-numpy bridge's entries): owners are addresses of distinct live objects (or
/// keys this crate makes unique), chosen by no adversary, so one multiplication spreads them.
/// The high bits of the product depend on every bit of the key (the low ones only on the
/// key's low bits, zero for aligned addresses): `finish` rotates them down, where the table
/// takes its bucket index.
#[derive(Default)]
pub(super) struct OwnerHasher(u64);

impl Hasher for OwnerHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, key: u64) {
        // Fibonacci hashing: 2^64 over the golden ratio, odd.
        self.0 = (self.0.rotate_left(5) ^ key).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The span length class of a span of `len` bytes.
fn class_of(len: usize) -> u8 {
    (usize::BITS - 1 - len.max(1).leading_zeros()) as u8
}

/// The longest span of class `class`, in bytes.
fn longest(class: usize) -> usize {
    if class + 1 >= CLASSES {
        usize::MAX
    } else {
        (1usize << (class + 1)) - 1
    }
}

impl Registry {
    pub(super) const fn new() -> Self {
        Self {
            by_span: SpanIndex::Few(Vec::new()),
            by_owner: OwnerIndex::Few(Vec::new()),
            per_class: [[0; CLASSES]; 2],
            in_use: [0; 2],
        }
    }

    /// A borrow of another owner than `owner` in `space` that `footprint`, borrowed as
    /// `access`, conflicts with: its key and one past its highest byte.
    fn conflict(
        &self,
        owner: u64,
        space: u64,
        footprint: &Footprint,
        access: Access,
    ) -> Option<(Key, usize)> {
        let (a, b) = footprint.span();
        let kinds: &[u8] = match access {
            Access::Shared => &[1],
            Access::Exclusive => &[1, 0],
        };
        for &exclusive in kinds {
            let mut classes = self.in_use[usize::from(exclusive)];
            while classes != 0 {
                let class = classes.trailing_zeros() as usize;
                classes &= classes - 1;
                let from = a.saturating_sub(longest(class));
                let tag = class as u8;
                let found = self
                    .by_span
                    .range(
                        (space, exclusive, tag, from, 0),
                        (space, exclusive, tag, b, 0),
                    )
                    .find(|&(key, high)| {
                        // A key without its owner's footprint (never) counts as overlapping.
                        key.4 != owner
                            && high > a
                            && self
                                .by_owner
                                .get(key.4)
                                .is_none_or(|(_, held)| held.overlaps(footprint))
                    });
                if found.is_some() {
                    return found;
                }
            }
        }
        None
    }

    /// Puts `key` (with one past its highest byte, `high`) in `by_span`.
    fn index(&mut self, key: Key, high: usize) {
        let (kind, class) = (usize::from(key.1), usize::from(key.2));
        self.per_class[kind][class] += 1;
        self.in_use[kind] |= 1 << class;
        self.by_span.insert(key, high);
    }

    /// Takes `key` out of `by_span`: one past its highest byte.
    fn unindex(&mut self, key: &Key) -> Option<usize> {
        let high = self.by_span.remove(key)?;
        let (kind, class) = (usize::from(key.1), usize::from(key.2));
        self.per_class[kind][class] -= 1;
        if self.per_class[kind][class] == 0 {
            self.in_use[kind] &= !(1 << class);
        }
        Some(high)
    }

    /// The registry's decision for one request: `Ok` when granted (recorded), or the
    /// overlapping borrow. A held borrow keeps its footprint: with `replace` it becomes
    /// `access` whatever it was (a downgrade from exclusive to shared always succeeds);
    /// without, it is kept when it is exclusive or `access` is shared, and upgraded otherwise.
    pub(super) fn grant(
        &mut self,
        owner: u64,
        space: u64,
        footprint: Footprint,
        access: Access,
        replace: bool,
    ) -> Result<(), Result<RawHeld, i32>> {
        if let Some((key, end)) = self.conflict(owner, space, &footprint, access) {
            return Err(Ok(RawHeld {
                size: size_of::<RawHeld>() as u64,
                exclusive: u64::from(key.1),
                start: key.3 as u64,
                end: end as u64,
            }));
        }
        let exclusive = u8::from(access == Access::Exclusive);
        match self.by_owner.get(owner).map(|&(key, _)| key) {
            // Kept: what is held covers what is asked.
            Some(key) if !replace && (key.1 == 1 || access == Access::Shared) => {}
            // Replaced or upgraded (nothing else overlaps): moved to its new access's keys.
            Some(key) => {
                if key.1 != exclusive {
                    let moved = (key.0, exclusive, key.2, key.3, key.4);
                    if let Some(high) = self.unindex(&key) {
                        self.index(moved, high);
                    }
                    if let Some((held, _)) = self.by_owner.get_mut(owner) {
                        *held = moved;
                    }
                }
            }
            None => {
                let (low, high) = footprint.span();
                let key = (space, exclusive, class_of(high - low), low, owner);
                self.index(key, high);
                self.by_owner.insert(owner, (key, footprint));
            }
        }
        Ok(())
    }

    /// Releases the borrow of `owner`, if any.
    pub(super) fn release(&mut self, owner: u64) {
        if let Some((key, _)) = self.by_owner.remove(owner) {
            self.unindex(&key);
        }
    }
}

/// This copy's table, over [`REGISTRY`].
pub(super) static LOCAL: BorrowApi = BorrowApi {
    version: API_VERSION,
    size: size_of::<BorrowApi>() as u64,
    ctx: core::ptr::null(),
    acquire: local_acquire,
    release: local_release,
};

impl RawHeld {
    fn new() -> Self {
        Self {
            size: size_of::<Self>() as u64,
            exclusive: 0,
            start: 0,
            end: 0,
        }
    }
}

/// [`BorrowApi::acquire`] of [`LOCAL`].
///
/// # Safety
///
/// `request` points to a valid [`RawRequest`] of at least version 1's size whose `terms`
/// point to `nterms` pairs, and `held` to writable memory for a [`RawHeld`] of its `size`.
unsafe extern "C" fn local_acquire(
    _ctx: *const c_void,
    request: *const RawRequest,
    held: *mut RawHeld,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the first field of every version of the request (caller).
        if unsafe { (*request).size } < V1_REQUEST_SIZE {
            return Err(Err(INVALID));
        }
        // SAFETY: a valid request of at least version 1's fields (caller, checked).
        let request = unsafe { &*request };
        let terms: &[[u64; 2]] = if request.nterms == 0 {
            &[]
        } else {
            // SAFETY: `terms` points to `nterms` pairs (caller).
            unsafe { core::slice::from_raw_parts(request.terms, request.nterms as usize) }
        };
        let pairs: Vec<(u64, u64)> = terms.iter().map(|&[s, e]| (s, e)).collect();
        let (Ok(low), Ok(element_bytes)) = (
            usize::try_from(request.low),
            usize::try_from(request.element_bytes),
        ) else {
            return Err(Err(INVALID));
        };
        let Some(footprint) = Footprint::from_parts(low, element_bytes, &pairs) else {
            return Err(Err(INVALID));
        };
        let access = if request.exclusive != 0 {
            Access::Exclusive
        } else {
            Access::Shared
        };
        grant(
            request.owner,
            request.space,
            footprint,
            access,
            request.replace != 0,
        )
    }));
    match result {
        Ok(Ok(())) => GRANTED,
        Ok(Err(Ok(conflict))) => {
            // SAFETY: `held` is writable for its `size` (caller); version 1's fields are
            // written only when it has them.
            unsafe {
                if (*held).size >= V1_HELD_SIZE {
                    (*held).exclusive = conflict.exclusive;
                    (*held).start = conflict.start;
                    (*held).end = conflict.end;
                }
            }
            CONFLICT
        }
        Ok(Err(Err(code))) => code,
        Err(_) => FAILED,
    }
}

/// The registry's decision for one request, under its lock (see [`Registry::grant`]).
fn grant(
    owner: u64,
    space: u64,
    footprint: Footprint,
    access: Access,
    replace: bool,
) -> Result<(), Result<RawHeld, i32>> {
    let mut registry = REGISTRY.lock();
    registry.grant(owner, space, footprint, access, replace)
}

/// [`BorrowApi::release`] of [`LOCAL`].
unsafe extern "C" fn local_release(_ctx: *const c_void, owner: u64) {
    // Nothing in here panics (no allocation, no indexing out of bounds); the guard keeps that
    // from mattering.
    let _ = catch_unwind(|| {
        REGISTRY.lock().release(owner);
    });
}

/// Borrows through `table`; with `replace`, the owner's held borrow becomes `access` even
/// when that is weaker.
pub(super) fn acquire(
    table: &BorrowApi,
    owner: usize,
    footprint: &Footprint,
    access: Access,
    replace: bool,
) -> Result<(), BorrowError> {
    if core::ptr::eq(table, &LOCAL) {
        // This copy's own registry: the decision `local_acquire` would take, without taking the
        // footprint apart and assembling it again on the other side of the ABI.
        return match grant(owner as u64, 0, footprint.clone(), access, replace) {
            Ok(()) => Ok(()),
            Err(Ok(held)) => Err(conflict(footprint, access, &held)),
            Err(Err(code)) => Err(failure(code)),
        };
    }
    // Most layouts have a term or two: kept on the stack.
    let mut inline = [[0u64; 2]; 8];
    let heap: Vec<[u64; 2]>;
    let terms: &[[u64; 2]] = if footprint.terms().len() <= inline.len() {
        for (slot, &(stride, extent)) in inline.iter_mut().zip(footprint.terms()) {
            *slot = [stride, extent];
        }
        &inline[..footprint.terms().len()]
    } else {
        heap = footprint.terms().iter().map(|&(s, e)| [s, e]).collect();
        &heap
    };
    let request = RawRequest {
        size: size_of::<RawRequest>() as u64,
        owner: owner as u64,
        space: 0,
        exclusive: u64::from(access == Access::Exclusive),
        replace: u64::from(replace),
        element_bytes: footprint.element_bytes() as u64,
        low: footprint.low() as u64,
        terms: terms.as_ptr(),
        nterms: terms.len() as u64,
    };
    let mut held = RawHeld::new();
    // SAFETY: `table` is this copy's table or a published one whose name and version were
    // checked (`process::table`); `request` and its `terms` live across the call, and `held`
    // is writable.
    let code = unsafe { (table.acquire)(table.ctx, &request, &mut held) };
    match code {
        GRANTED => Ok(()),
        CONFLICT => Err(conflict(footprint, access, &held)),
        code => Err(failure(code)),
    }
}

/// The borrow of another owner that a request of `footprint` as `access` by `owner` would
/// conflict with in `table`, asked without changing anything: the registry's own answer when
/// another registry (rust-numpy's) refused the request first. Answered for this copy's own
/// table only (a published table of another copy has no such question): `None` otherwise.
#[cfg(feature = "python")]
pub(super) fn conflict_in(
    table: &BorrowApi,
    owner: usize,
    footprint: &Footprint,
    access: Access,
) -> Option<BorrowError> {
    if !core::ptr::eq(table, &LOCAL) {
        return None;
    }
    let registry = REGISTRY.lock();
    let (key, high) = registry.conflict(owner as u64, 0, footprint, access)?;
    let held = RawHeld {
        size: size_of::<RawHeld>() as u64,
        exclusive: u64::from(key.1),
        start: key.3 as u64,
        end: high as u64,
    };
    Some(conflict(footprint, access, &held))
}

/// The error for a request of `footprint` as `access` that `held` refused.
#[cold]
fn conflict(footprint: &Footprint, access: Access, held: &RawHeld) -> BorrowError {
    let (start, end) = footprint.span();
    BorrowError::Conflict {
        requested: BorrowedRange { start, end, access },
        held: BorrowedRange {
            start: held.start as usize,
            end: held.end as usize,
            access: if held.exclusive != 0 {
                Access::Exclusive
            } else {
                Access::Shared
            },
        },
    }
}

/// The error for an answer of the registry other than granted or a conflict.
#[cold]
fn failure(code: i32) -> BorrowError {
    match code {
        INVALID => BorrowError::Unavailable {
            reason: "the registry refused a well-formed layout as malformed",
        },
        _ => BorrowError::Unavailable {
            reason: "the registry failed (a panic inside it was caught)",
        },
    }
}

/// Releases through `table`.
pub(super) fn release(table: &BorrowApi, owner: usize) {
    if core::ptr::eq(table, &LOCAL) {
        REGISTRY.lock().release(owner as u64);
        return;
    }
    // SAFETY: as in `acquire`.
    unsafe { (table.release)(table.ctx, owner as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn contiguous(first: usize, len: i64) -> Footprint {
        Footprint::new(first, &[len], &[4], 4).expect("elements")
    }

    /// What `LOCAL` itself decides without crossing the ABI (`acquire` calls the registry
    /// directly), the same table's functions decide through it.
    static VIA_ABI: BorrowApi = BorrowApi {
        version: API_VERSION,
        size: size_of::<BorrowApi>() as u64,
        ctx: core::ptr::null(),
        acquire: local_acquire,
        release: local_release,
    };

    #[test]
    fn shared_borrows_overlap_and_exclusive_ones_do_not() {
        shared_and_exclusive(&LOCAL);
        shared_and_exclusive(&VIA_ABI);
    }

    fn shared_and_exclusive(table: &BorrowApi) {
        let (a, b, c) = (0x1000_0001, 0x1000_0002, 0x1000_0003);
        let x = contiguous(0x7000, 8);
        acquire(table, a, &x, Access::Shared, false).expect("first shared");
        acquire(table, b, &x, Access::Shared, false).expect("second shared");
        let err =
            acquire(table, c, &x, Access::Exclusive, false).expect_err("exclusive over shared");
        let BorrowError::Conflict { requested, held } = err else {
            panic!("a conflict")
        };
        assert_eq!((requested.start, requested.end), (0x7000, 0x7020));
        assert_eq!(requested.access, Access::Exclusive);
        assert_eq!(
            (held.start, held.end, held.access),
            (0x7000, 0x7020, Access::Shared)
        );
        // Upgrading one of two shared borrows conflicts with the other; alone, it succeeds.
        assert!(acquire(table, a, &x, Access::Exclusive, false).is_err());
        release(table, b);
        acquire(table, a, &x, Access::Exclusive, false).expect("upgrade");
        // Held exclusive: a shared request of the owner keeps it, others are refused.
        acquire(table, a, &x, Access::Shared, false).expect("own shared");
        assert!(acquire(table, b, &contiguous(0x701c, 1), Access::Shared, false).is_err());
        acquire(table, b, &contiguous(0x7020, 4), Access::Exclusive, false)
            .expect("adjacent bytes");
        release(table, a);
        release(table, b);
        acquire(table, c, &x, Access::Exclusive, false).expect("all released");
        release(table, c);
        // Releasing what is not held does nothing.
        release(table, c);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let request = RawRequest {
            size: size_of::<RawRequest>() as u64,
            owner: 0x2000_0001,
            space: 0,
            exclusive: 1,
            replace: 0,
            element_bytes: 4,
            low: 0x9000,
            terms: [[0u64, 5u64]].as_ptr(),
            nterms: 1,
        };
        let mut held = RawHeld::new();
        // SAFETY: a valid request and a writable `held`.
        let code = unsafe { (LOCAL.acquire)(LOCAL.ctx, &request, &mut held) };
        assert_eq!(code, INVALID, "a zero stride is no term of a footprint");
        let short = RawRequest {
            size: 8,
            terms: [[4u64, 5u64]].as_ptr(),
            ..request
        };
        // SAFETY: as above; the registry reads only `size` of a request that says it is short.
        let code = unsafe { (LOCAL.acquire)(LOCAL.ctx, &short, &mut held) };
        assert_eq!(code, INVALID, "a request smaller than version 1's");
    }

    #[test]
    fn a_held_exclusive_borrow_is_downgraded_in_place() {
        let (a, b) = (0x3000_0001, 0x3000_0002);
        let x = contiguous(0xa000, 8);
        acquire(&LOCAL, a, &x, Access::Exclusive, false).expect("exclusive");
        assert!(acquire(&LOCAL, b, &x, Access::Shared, false).is_err());
        acquire(&LOCAL, a, &x, Access::Shared, true).expect("downgraded");
        acquire(&LOCAL, b, &x, Access::Shared, false).expect("shared beside shared");
        release(&LOCAL, a);
        release(&LOCAL, b);
    }

    /// One live borrow of [`Linear`].
    struct Entry {
        owner: u64,
        space: u64,
        access: Access,
        footprint: Footprint,
    }

    /// The reference: every live borrow in one vector, each request checked against all.
    #[derive(Default)]
    struct Linear(Vec<Entry>);

    impl Linear {
        /// The borrows that `footprint`, asked for by `owner` as `access`, conflicts with.
        fn conflicts(
            &self,
            owner: u64,
            space: u64,
            footprint: &Footprint,
            access: Access,
        ) -> Vec<&Entry> {
            self.0
                .iter()
                .filter(|entry| {
                    entry.owner != owner
                        && entry.space == space
                        && !(access == Access::Shared && entry.access == Access::Shared)
                        && entry.footprint.overlaps(footprint)
                })
                .collect()
        }

        fn grant(
            &mut self,
            owner: u64,
            space: u64,
            footprint: Footprint,
            access: Access,
            replace: bool,
        ) -> bool {
            if !self.conflicts(owner, space, &footprint, access).is_empty() {
                return false;
            }
            match self.0.iter_mut().find(|entry| entry.owner == owner) {
                Some(entry) if replace => entry.access = access,
                Some(entry) if entry.access == Access::Exclusive || access == Access::Shared => {}
                Some(entry) => entry.access = Access::Exclusive,
                None => self.0.push(Entry {
                    owner,
                    space,
                    access,
                    footprint,
                }),
            }
            true
        }

        fn release(&mut self, owner: u64) {
            self.0.retain(|entry| entry.owner != owner);
        }
    }

    /// The live borrows of `registry`, by owner: (space, exclusive, footprint).
    fn contents(registry: &Registry) -> Vec<(u64, u64, bool, Footprint)> {
        let mut all: Vec<_> = registry
            .by_owner
            .iter()
            .map(|(&owner, (key, footprint))| {
                assert_eq!(key.4, owner);
                assert_eq!(
                    (key.3, registry.by_span.get(key).unwrap()),
                    footprint.span()
                );
                (owner, key.0, key.1 == 1, footprint.clone())
            })
            .collect();
        assert_eq!(all.len(), registry.by_span.len());
        let counted: usize = registry.per_class.iter().flatten().sum();
        assert_eq!(counted, all.len());
        for (counts, in_use) in registry.per_class.iter().zip(registry.in_use) {
            for (class, &count) in counts.iter().enumerate() {
                assert_eq!(in_use >> class & 1 == 1, count > 0, "class {class} in use");
            }
        }
        all.sort_by_key(|entry| entry.0);
        all
    }

    fn linear_contents(linear: &Linear) -> Vec<(u64, u64, bool, Footprint)> {
        let mut all: Vec<_> = linear
            .0
            .iter()
            .map(|e| {
                let exclusive = e.access == Access::Exclusive;
                (e.owner, e.space, exclusive, e.footprint.clone())
            })
            .collect();
        all.sort_by_key(|entry| entry.0);
        all
    }

    /// A random strided footprint in a few KiB, its strides of one of several scales so that
    /// spans fall in many length classes; now and then one that covers everything.
    fn footprint() -> impl Strategy<Value = Footprint> {
        let layout = (
            0usize..4096,
            prop::sample::select(vec![1i64, 3, 16, 200]),
            prop::collection::vec((1i64..=5, -4i64..=4), 0..=3),
            prop::sample::select(vec![1usize, 2, 4, 8]),
        )
            .prop_map(|(low, scale, axes, size)| {
                let (shape, strides): (Vec<i64>, Vec<i64>) = axes.into_iter().unzip();
                let strides: Vec<i64> = strides.iter().map(|s| s * scale * size as i64).collect();
                let back: i64 = shape
                    .iter()
                    .zip(&strides)
                    .filter(|&(_, &s)| s < 0)
                    .map(|(&e, &s)| (e - 1) * -s)
                    .sum();
                let first = 0x10_0000 + low + back as usize;
                Footprint::new(first, &shape, &strides, size).expect("elements")
            });
        prop_oneof![
            50 => layout,
            1 => Just(Footprint::new(0, &[1], &[], 1).expect("everything")),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire {
            owner: u64,
            space: u64,
            footprint: Footprint,
            exclusive: bool,
            replace: bool,
        },
        Release(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..300, 0u64..2, footprint(), any::<bool>(), prop::bool::weighted(0.2))
                .prop_map(|(owner, space, footprint, exclusive, replace)| Op::Acquire {
                    owner,
                    space: space * 7,
                    footprint,
                    exclusive,
                    replace,
                }),
            1 => (0u64..300).prop_map(Op::Release),
        ]
    }

    proptest! {
        #[test]
        fn the_index_decides_as_a_scan_of_every_borrow(
            ops in prop::collection::vec(op(), 1..if cfg!(miri) { 60 } else { 600 }),
        ) {
            let mut registry = Registry::new();
            let mut linear = Linear::default();
            for op in ops {
                match op {
                    Op::Acquire { owner, space, footprint, exclusive, replace } => {
                        let access = if exclusive { Access::Exclusive } else { Access::Shared };
                        let conflicts: Vec<(u64, usize, usize)> = linear
                            .conflicts(owner, space, &footprint, access)
                            .iter()
                            .map(|e| {
                                let (start, end) = e.footprint.span();
                                (u64::from(e.access == Access::Exclusive), start, end)
                            })
                            .collect();
                        let granted =
                            linear.grant(owner, space, footprint.clone(), access, replace);
                        match registry.grant(owner, space, footprint, access, replace) {
                            Ok(()) => prop_assert!(granted),
                            Err(Ok(held)) => {
                                prop_assert!(!granted);
                                let held = (held.exclusive, held.start as usize, held.end as usize);
                                prop_assert!(conflicts.contains(&held), "{held:?} conflicts");
                            }
                            Err(Err(code)) => prop_assert!(false, "code {code}"),
                        }
                    }
                    Op::Release(owner) => {
                        linear.release(owner);
                        registry.release(owner);
                    }
                }
                prop_assert_eq!(contents(&registry), linear_contents(&linear));
            }
        }
    }
}
