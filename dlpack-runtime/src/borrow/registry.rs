//! The registry's C-ABI table ([`BorrowApi`]), this copy's own registry behind it, and the calls
//! through whichever table the process uses.
//!
//! The table is what copies of this crate share, so its layout is a stable ABI: version 1 is
//! the struct below, and later versions may only add fields at the end (`size` says how many
//! bytes the publisher's struct has). A copy that needs a field reads `size` first.

use core::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

use super::{Access, BorrowError, BorrowedRange, Footprint};

/// Version of [`BorrowApi`] this copy publishes and requires at least.
pub(super) const API_VERSION: u64 = 1;

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
    /// filled; [`INVALID`] for a request that describes no layout; [`FAILED`] otherwise. Never
    /// unwinds; callable from any thread, with or without the GIL.
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
pub(super) struct RawRequest {
    /// The import asking.
    pub(super) owner: u64,
    /// Address space: 0 is host memory (the only one borrowed today).
    pub(super) space: u64,
    /// 1 for exclusive, 0 for shared.
    pub(super) exclusive: u64,
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
#[derive(Default)]
pub(super) struct RawHeld {
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

/// [`BorrowApi::acquire`] of [`LOCAL`].
///
/// # Safety
///
/// `request` points to a valid [`RawRequest`] whose `terms` point to `nterms` pairs, and
/// `held` to writable memory for a [`RawHeld`].
unsafe extern "C" fn local_acquire(
    _ctx: *const c_void,
    request: *const RawRequest,
    held: *mut RawHeld,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: valid request (caller).
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
        grant(request.owner, request.space, footprint, access)
    }));
    match result {
        Ok(Ok(())) => GRANTED,
        Ok(Err(Ok(conflict))) => {
            // SAFETY: writable (caller).
            unsafe { held.write(conflict) };
            CONFLICT
        }
        Ok(Err(Err(code))) => code,
        Err(_) => FAILED,
    }
}

/// The registry's decision for one request, under its lock: `Ok` when granted (recorded), or
/// the overlapping borrow.
fn grant(
    owner: u64,
    space: u64,
    footprint: Footprint,
    access: Access,
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
            exclusive: u64::from(entry.access == Access::Exclusive),
            start: start as u64,
            end: end as u64,
        }));
    }
    match own {
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

/// Borrows through `table`.
pub(super) fn acquire(
    table: &BorrowApi,
    owner: usize,
    footprint: &Footprint,
    access: Access,
) -> Result<(), BorrowError> {
    let terms: Vec<[u64; 2]> = footprint.terms().iter().map(|&(s, e)| [s, e]).collect();
    let request = RawRequest {
        owner: owner as u64,
        space: 0,
        exclusive: u64::from(access == Access::Exclusive),
        element_bytes: footprint.element_bytes() as u64,
        low: footprint.low() as u64,
        terms: terms.as_ptr(),
        nterms: terms.len() as u64,
    };
    let mut held = RawHeld::default();
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
        acquire(&LOCAL, a, &x, Access::Shared).expect("first shared");
        acquire(&LOCAL, b, &x, Access::Shared).expect("second shared");
        let err = acquire(&LOCAL, c, &x, Access::Exclusive).expect_err("exclusive over shared");
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
        assert!(acquire(&LOCAL, a, &x, Access::Exclusive).is_err());
        release(&LOCAL, b);
        acquire(&LOCAL, a, &x, Access::Exclusive).expect("upgrade");
        // Held exclusive: a shared request of the owner keeps it, others are refused.
        acquire(&LOCAL, a, &x, Access::Shared).expect("own shared");
        assert!(acquire(&LOCAL, b, &contiguous(0x701c, 1), Access::Shared).is_err());
        acquire(&LOCAL, b, &contiguous(0x7020, 4), Access::Exclusive).expect("adjacent bytes");
        release(&LOCAL, a);
        release(&LOCAL, b);
        acquire(&LOCAL, c, &x, Access::Exclusive).expect("all released");
        release(&LOCAL, c);
        // Releasing what is not held does nothing.
        release(&LOCAL, c);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let request = RawRequest {
            owner: 0x2000_0001,
            space: 0,
            exclusive: 1,
            element_bytes: 4,
            low: 0x9000,
            terms: [[0u64, 5u64]].as_ptr(),
            nterms: 1,
        };
        let mut held = RawHeld::default();
        // SAFETY: a valid request and a writable `held`.
        let code = unsafe { (LOCAL.acquire)(LOCAL.ctx, &request, &mut held) };
        assert_eq!(code, INVALID, "a zero stride is no term of a footprint");
    }
}
