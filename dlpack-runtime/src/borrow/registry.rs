//! The registry's C-ABI table ([`BorrowApi`]), this copy's own registry behind it, and the calls
//! through whichever table the process uses.
//!
//! The table is what copies of this crate share, so its layout is a stable ABI: version 1 is
//! the struct below, and later versions may only add fields at the end (`size` says how many
//! bytes the publisher's struct has). A copy accepts any table of version >= 1 whose `size`
//! covers version 1's fields, and reads a later field only when `size` covers it. The request
//! and answer structs passed to `acquire` carry their own `size` the same way.

use core::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

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

/// One live borrow.
struct Entry {
    owner: u64,
    space: u64,
    access: Access,
    footprint: Footprint,
}

/// This copy's registry: the live borrows. A scan per request: processes hold few borrows at
/// once (one per accessed import), and a scan of a short vector beats a tree.
static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// This copy's table, over [`ENTRIES`].
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

/// The registry's decision for one request, under its lock: `Ok` when granted (recorded), or
/// the overlapping borrow. With `replace`, the owner's held borrow becomes `access` whatever it
/// was (a downgrade from exclusive to shared always succeeds).
fn grant(
    owner: u64,
    space: u64,
    footprint: Footprint,
    access: Access,
    replace: bool,
) -> Result<(), Result<RawHeld, i32>> {
    let mut entries = ENTRIES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut own = None;
    for (index, entry) in entries.iter().enumerate() {
        if entry.owner == owner {
            own = Some(index);
            continue;
        }
        if entry.space != space
            || (access == Access::Shared && entry.access == Access::Shared)
            || !entry.footprint.overlaps(&footprint)
        {
            continue;
        }
        let (start, end) = entry.footprint.span();
        return Err(Ok(RawHeld {
            size: size_of::<RawHeld>() as u64,
            exclusive: u64::from(entry.access == Access::Exclusive),
            start: start as u64,
            end: end as u64,
        }));
    }
    match own {
        // Replaced: nothing else overlaps the new access.
        Some(index) if replace => entries[index].access = access,
        // Kept: what is held covers what is asked.
        Some(index) if entries[index].access == Access::Exclusive || access == Access::Shared => {}
        // Upgraded: nothing else overlaps.
        Some(index) => entries[index].access = Access::Exclusive,
        None => entries.push(Entry {
            owner,
            space,
            access,
            footprint,
        }),
    }
    Ok(())
}

/// [`BorrowApi::release`] of [`LOCAL`].
unsafe extern "C" fn local_release(_ctx: *const c_void, owner: u64) {
    // Nothing in here panics (no allocation, no indexing out of bounds); the guard keeps that
    // from mattering.
    let _ = catch_unwind(|| {
        let mut entries = ENTRIES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = entries.iter().position(|e| e.owner == owner) {
            entries.swap_remove(index);
        }
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
    let terms: Vec<[u64; 2]> = footprint.terms().iter().map(|&(s, e)| [s, e]).collect();
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
        CONFLICT => {
            let (start, end) = footprint.span();
            Err(BorrowError::Conflict {
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
            })
        }
        INVALID => Err(BorrowError::Unavailable {
            reason: "the registry refused a well-formed layout as malformed",
        }),
        _ => Err(BorrowError::Unavailable {
            reason: "the registry failed (a panic inside it was caught)",
        }),
    }
}

/// Releases through `table`.
pub(super) fn release(table: &BorrowApi, owner: usize) {
    // SAFETY: as in `acquire`.
    unsafe { (table.release)(table.ctx, owner as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(first: usize, len: i64) -> Footprint {
        Footprint::new(first, &[len], &[4], 4).expect("elements")
    }

    #[test]
    fn shared_borrows_overlap_and_exclusive_ones_do_not() {
        let (a, b, c) = (0x1000_0001, 0x1000_0002, 0x1000_0003);
        let x = contiguous(0x7000, 8);
        acquire(&LOCAL, a, &x, Access::Shared, false).expect("first shared");
        acquire(&LOCAL, b, &x, Access::Shared, false).expect("second shared");
        let err =
            acquire(&LOCAL, c, &x, Access::Exclusive, false).expect_err("exclusive over shared");
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
        assert!(acquire(&LOCAL, a, &x, Access::Exclusive, false).is_err());
        release(&LOCAL, b);
        acquire(&LOCAL, a, &x, Access::Exclusive, false).expect("upgrade");
        // Held exclusive: a shared request of the owner keeps it, others are refused.
        acquire(&LOCAL, a, &x, Access::Shared, false).expect("own shared");
        assert!(acquire(&LOCAL, b, &contiguous(0x701c, 1), Access::Shared, false).is_err());
        acquire(&LOCAL, b, &contiguous(0x7020, 4), Access::Exclusive, false)
            .expect("adjacent bytes");
        release(&LOCAL, a);
        release(&LOCAL, b);
        acquire(&LOCAL, c, &x, Access::Exclusive, false).expect("all released");
        release(&LOCAL, c);
        // Releasing what is not held does nothing.
        release(&LOCAL, c);
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
}
