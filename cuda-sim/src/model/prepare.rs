//! Copies and memsets made ready to enqueue: their sides resolved against the memory table (a
//! freed side reported as a use after free), their accesses for the checker, and their work.
//! A direct call and a graph launch replaying a captured node prepare them alike.

use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CUresult};

use super::base::Res;
use super::checker::Pattern;
use super::memory::{self, Alloc, Copy2D, Loc, Resolved};
use super::request::{CopyRequest, Fill, Side};
use super::state::State;
use super::stream::Work;

use CUresult::*;

/// A copy or memset ready to enqueue: its accesses for the checker and its work.
pub(crate) struct Prepared {
    pub(crate) accesses: Vec<(Alloc, Pattern, bool)>,
    pub(crate) work: Work,
}

/// The bytes one side of a copy touches, from its first byte.
fn pattern_of(r: &CopyRequest, pitch: usize) -> Pattern {
    Pattern {
        start: 0,
        width: r.width as u64,
        pitch: pitch.max(r.width) as u64,
        height: r.height as u64,
    }
}

/// A device side of a copy: its location, with its access (`pattern` from `p`) added to
/// `accesses` for the checker.
fn device_loc(
    st: &mut State,
    p: CUdeviceptr,
    pattern: Pattern,
    write: bool,
    op: &str,
    accesses: &mut Vec<(Alloc, Pattern, bool)>,
) -> Res<Loc> {
    let extent = ((pattern.height - 1) * pattern.pitch + pattern.width) as usize;
    let a = device_side(st, p, extent, op)?;
    let offset = p - a.base;
    let loc = Loc::Device(a.buf.clone(), offset as usize);
    accesses.push((
        a,
        Pattern {
            start: offset,
            ..pattern
        },
        write,
    ));
    Ok(loc)
}

/// Whether host memory at `addr` is pinned (`cuMemHostAlloc`); a NULL or device address is
/// `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn host_is_pinned(st: &State, addr: usize, len: usize) -> Res<bool> {
    if addr == 0 || st.memory.is_device_address(addr as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(st.memory.pinned_at(addr, len).is_some())
}

/// Bytes from the first to one past the last of a side.
pub(crate) fn extent(r: &CopyRequest, pitch: usize) -> usize {
    if r.height == 0 {
        0
    } else {
        (r.height - 1) * pitch + r.width
    }
}

/// Resolves a device side for an operation: a live allocation, or a violation (freed) /
/// `CUDA_ERROR_INVALID_VALUE` (unknown).
fn device_side(st: &mut State, p: CUdeviceptr, len: usize, op: &str) -> Res<Alloc> {
    match st.memory.resolve(p, len) {
        Resolved::Live(a) => Ok(st.take_alloc_view(a.base)),
        Resolved::Freed(by) => {
            st.checker.use_after_free(p, op, &by);
            Err(CUDA_ERROR_INVALID_VALUE)
        }
        Resolved::Unknown => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// What a violation report calls operation `op`: its name, and the graph launch replaying it.
fn described(op: &str, replay: Option<&str>) -> String {
    match replay {
        Some(launch) => format!("{op} (replayed by {launch})"),
        None => op.to_string(),
    }
}

/// Resolves the sides of a copy and makes its work; also says whether the destination is
/// pageable host memory. A direct call (`replay` is `None`) stages a pageable source now (the
/// caller may reuse it on return); a graph launch (`replay` names it) replaying a captured copy
/// needs its host memory still pinned, or reports a violation and refuses it
/// (`CUDA_ERROR_INVALID_VALUE`). Freed device memory is reported as a use after free.
pub(crate) fn prepare_copy(
    st: &mut State,
    op: &str,
    r: &CopyRequest,
    replay: Option<&str>,
) -> Res<(Prepared, bool)> {
    let what = described(op, replay);
    let mut accesses = Vec::new();
    let src = match r.src {
        Side::Device(p) => {
            let pattern = pattern_of(r, r.src_pitch);
            device_loc(st, p, pattern, false, &what, &mut accesses)?
        }
        Side::Host(addr) => {
            let len = extent(r, r.src_pitch);
            if host_is_pinned(st, addr, len)? {
                Loc::Host(addr)
            } else if replay.is_some() {
                return Err(no_longer_pinned(st, &what, addr));
            } else {
                let mut staged = vec![0u8; len];
                // SAFETY: the caller's source of `len` bytes (contract).
                unsafe { memory::copy_bytes(staged.as_mut_ptr(), addr as *const u8, len) };
                Loc::Staged(Arc::new(staged), 0)
            }
        }
    };
    let (dst, pageable_dst) = match r.dst {
        Side::Device(p) => {
            let pattern = pattern_of(r, r.dst_pitch);
            let loc = device_loc(st, p, pattern, true, &what, &mut accesses)?;
            (loc, false)
        }
        Side::Host(addr) => {
            let pinned = host_is_pinned(st, addr, extent(r, r.dst_pitch))?;
            if !pinned && replay.is_some() {
                return Err(no_longer_pinned(st, &what, addr));
            }
            (Loc::Host(addr), !pinned)
        }
    };
    let job = Copy2D {
        src,
        src_pitch: r.src_pitch,
        dst,
        dst_pitch: r.dst_pitch,
        width: r.width,
        height: r.height,
    };
    let work: Work = Box::new(move || job.run());
    Ok((Prepared { accesses, work }, pageable_dst))
}

/// Reports a replayed copy whose host memory is no longer pinned (freed with
/// `cuMemFreeHost`): what it touched may be any memory of the process by now.
fn no_longer_pinned(st: &mut State, what: &str, addr: usize) -> CUresult {
    st.checker.misuse(format!(
        "{what} touches host memory at {addr:#x}, which is no longer pinned host memory \
         (freed with cuMemFreeHost); the launch was refused"
    ));
    CUDA_ERROR_INVALID_VALUE
}

/// Resolves a memset's destination and makes its work (see [`prepare_copy`] for `replay`).
pub(crate) fn prepare_memset(
    st: &mut State,
    op: &str,
    dst: CUdeviceptr,
    f: &Fill,
    replay: Option<&str>,
) -> Res<Prepared> {
    let (width, extent) = f.extent().ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let a = device_side(st, dst, extent, &described(op, replay))?;
    let offset = (dst - a.base) as usize;
    let buf = a.buf.clone();
    let f = *f;
    let work: Work = Box::new(move || {
        for row in 0..f.height {
            let p = buf.ptr().wrapping_add(offset + row * f.pitch);
            // SAFETY: every row lies in the allocation (checked against `extent`), which
            // `buf` keeps alive; rows are aligned to `size` (`dst` and `pitch` are).
            unsafe {
                if f.size == 4 {
                    memory::fill_u32(p, f.value, f.n)
                } else {
                    memory::fill_u8(p, f.value as u8, f.n)
                }
            }
        }
    });
    let p = Pattern {
        start: offset as u64,
        width: width as u64,
        pitch: f.pitch.max(width) as u64,
        height: f.height as u64,
    };
    Ok(Prepared {
        accesses: vec![(a, p, true)],
        work,
    })
}
