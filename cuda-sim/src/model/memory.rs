//! Device memory (host buffers behind a range table, at addresses no host mapping uses) and
//! pinned host memory, and the copies and fills that stream workers run on them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use cudarc::driver::sys::CUresult;

use super::base::{Handle, Res};
use super::checker::AllocInfo;
use super::config::MAX_DEVICES;

use CUresult::*;

/// Device memory: a host buffer that nothing dereferences directly, only the copies and
/// memsets of stream workers (through atomics, since unordered accesses are exactly what the
/// simulator exists to run).
pub(crate) struct DevBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory accessed only through atomic operations.
unsafe impl Send for DevBuf {}
// SAFETY: as above; shared references only reach the memory through atomics.
unsafe impl Sync for DevBuf {}

const ALIGN: usize = 256;

impl DevBuf {
    fn new(len: usize) -> Option<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Self { ptr, len })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), ALIGN)
            .expect("the layout was valid at allocation");
        // SAFETY: allocated in `new` with this layout; dropped once.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// Where bytes of a copy are.
#[derive(Clone)]
pub(crate) enum Loc {
    Device(Arc<DevBuf>, usize),
    /// Host memory (pageable or pinned) at this address.
    Host(usize),
    /// Host bytes staged at enqueue time (copies from pageable memory).
    Staged(Arc<Vec<u8>>, usize),
}

impl Loc {
    fn at(&self, offset: usize) -> *mut u8 {
        match self {
            Loc::Device(buf, start) => buf.ptr().wrapping_add(start + offset),
            Loc::Host(addr) => (*addr as *mut u8).wrapping_add(offset),
            Loc::Staged(v, start) => v.as_ptr().wrapping_add(start + offset).cast_mut(),
        }
    }
}

/// Copies `len` bytes with relaxed atomic accesses, 8 bytes at a time where both sides allow.
///
/// # Safety
/// Both ranges are valid for `len` bytes.
pub(crate) unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    if (dst as usize) % 8 == (src as usize) % 8 {
        while i < len && !(dst as usize + i).is_multiple_of(8) {
            // SAFETY: in range (caller); byte accesses need no alignment.
            unsafe { copy_byte(dst.add(i), src.add(i)) };
            i += 1;
        }
        while i + 8 <= len {
            // SAFETY: in range and 8-aligned (both addresses share their alignment).
            unsafe {
                let v = AtomicU64::from_ptr(src.add(i).cast_mut().cast()).load(Ordering::Relaxed);
                AtomicU64::from_ptr(dst.add(i).cast()).store(v, Ordering::Relaxed);
            }
            i += 8;
        }
    }
    while i < len {
        // SAFETY: in range (caller).
        unsafe { copy_byte(dst.add(i), src.add(i)) };
        i += 1;
    }
}

/// # Safety
/// Both pointers are valid for one byte.
unsafe fn copy_byte(dst: *mut u8, src: *const u8) {
    // SAFETY: valid for one byte (caller); `AtomicU8` has no alignment requirement.
    unsafe {
        let v = AtomicU8::from_ptr(src.cast_mut()).load(Ordering::Relaxed);
        AtomicU8::from_ptr(dst).store(v, Ordering::Relaxed);
    }
}

/// A 2-D copy: `height` rows of `width` bytes; pitches in bytes.
pub(crate) struct Copy2D {
    pub(crate) src: Loc,
    pub(crate) src_pitch: usize,
    pub(crate) dst: Loc,
    pub(crate) dst_pitch: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
}

impl Copy2D {
    pub(crate) fn run(self) {
        for row in 0..self.height {
            // SAFETY: the enqueuing call checked both sides: device ranges against their
            // allocation (kept alive by the `Arc`), host ranges are the caller's contract.
            unsafe {
                copy_bytes(
                    self.dst.at(row * self.dst_pitch),
                    self.src.at(row * self.src_pitch),
                    self.width,
                )
            };
        }
    }
}

pub(crate) struct Alloc {
    pub(crate) id: u64,
    pub(crate) base: u64,
    pub(crate) len: usize,
    pub(crate) device: i32,
    pub(crate) ctx: Handle,
    pub(crate) buf: Arc<DevBuf>,
}

impl Alloc {
    pub(crate) fn info(&self) -> AllocInfo {
        AllocInfo {
            id: self.id,
            base: self.base,
        }
    }
}

/// Freed device addresses: a run of allocations, adjacent in the address space (each with the
/// gap after it) and freed by the same kind of call, kept as one range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreedRun {
    /// One past the run's last address.
    end: u64,
    /// Who freed it: an index into [`Memory::freers`].
    by: u32,
}

/// Pinned host memory (`cuMemHostAlloc`, `cuMemAllocHost`).
pub(crate) struct Pinned {
    pub(crate) len: usize,
    pub(crate) ctx: Handle,
    pub(crate) device: i32,
    buf: DevBuf,
}

/// The addresses an allocation of `len` bytes takes: rounded up to [`ALIGN`], and a gap of
/// `ALIGN` after it, so that one past the end is never another allocation's byte.
fn extent(len: usize) -> u64 {
    (len as u64).div_ceil(ALIGN as u64) * ALIGN as u64 + ALIGN as u64
}

/// Device address space: per device, a span of [`DEVICE_SPAN`] addresses from
/// `ADDRESS_BASE + device * DEVICE_SPAN`, never reused, so a stale pointer is always recognized.
/// The spans of all 64 devices `CUDA_SIM_DEVICES` allows, `[0x1000_0000_0000,
/// 0x5000_0000_0000)` (16 to 80 TiB), lie where Linux maps nothing for a process: above a
/// non-PIE executable and its heap (from 4 MiB up), below the lowest address a PIE executable
/// and its heap take (`0x5555_5555_4000` on x86-64, higher on 64-bit Arm), and far below the
/// shared libraries and `mmap` area, which grow down from under the stack at the top of the
/// 47-bit (x86-64) or 48-bit (Arm) address space. A host pointer is thus never taken for device
/// memory, whatever the number of devices. Nothing is reserved with `mmap`: the addresses are
/// only numbers, never dereferenced, and a reservation of 64 TiB of address space would fail
/// under an address-space limit (`ulimit -v`, valgrind, sanitizers).
const ADDRESS_BASE: u64 = 0x1000_0000_0000;

/// The device addresses of one device: 1 TiB, the most `CUDA_SIM_MEMORY` allows for all
/// devices together. Addresses are not reused, so a long run can use them all up: an
/// allocation past the end is refused (`CUDA_ERROR_OUT_OF_MEMORY`), never given an address of
/// the next device.
const DEVICE_SPAN: u64 = 1 << 40;

const _: () = assert!(ADDRESS_BASE + MAX_DEVICES * DEVICE_SPAN <= 0x5000_0000_0000);

pub(crate) struct Memory {
    pub(crate) live: BTreeMap<u64, Alloc>,
    /// Every freed address, by run start: a use after free is reported however long ago the
    /// free was, in a few bytes per run rather than per allocation.
    freed: BTreeMap<u64, FreedRun>,
    /// The descriptions of the frees ("cuMemFreeAsync on stream 0x1040"), each kept once.
    freers: Vec<Arc<str>>,
    freer_ids: HashMap<Arc<str>, u32>,
    pub(crate) pinned: BTreeMap<usize, Pinned>,
    next: HashMap<i32, u64>,
    next_id: u64,
    pub(crate) used: usize,
}

/// What a device address resolves to.
pub(crate) enum Resolved<'a> {
    Live(&'a Alloc),
    Freed(String),
    Unknown,
}

impl Memory {
    pub(crate) fn new() -> Self {
        Self {
            live: BTreeMap::new(),
            freed: BTreeMap::new(),
            freers: Vec::new(),
            freer_ids: HashMap::new(),
            pinned: BTreeMap::new(),
            next: HashMap::new(),
            next_id: 0,
            used: 0,
        }
    }

    /// A copy of an allocation's bookkeeping (not its memory), to pass on while the memory
    /// table is borrowed.
    pub(crate) fn view(&self, base: u64) -> Alloc {
        let a = &self.live[&base];
        Alloc {
            id: a.id,
            base: a.base,
            len: a.len,
            device: a.device,
            ctx: a.ctx,
            buf: a.buf.clone(),
        }
    }

    pub(crate) fn find(&self, ptr: u64) -> Option<&Alloc> {
        let (_, a) = self.live.range(..=ptr).next_back()?;
        (ptr < a.base + a.len as u64).then_some(a)
    }

    /// Resolves `[ptr, ptr + len)`, which must lie in one live allocation.
    pub(crate) fn resolve(&self, ptr: u64, len: usize) -> Resolved<'_> {
        if let Some(a) = self.find(ptr) {
            let offset = (ptr - a.base) as usize;
            return if offset.checked_add(len).is_some_and(|end| end <= a.len) {
                Resolved::Live(a)
            } else {
                Resolved::Unknown
            };
        }
        if let Some((_, run)) = self.freed.range(..=ptr).next_back()
            && ptr < run.end
        {
            return Resolved::Freed(self.freers[run.by as usize].to_string());
        }
        Resolved::Unknown
    }

    /// Whether `ptr` is in the simulated device address space (live, freed or never handed
    /// out): one range per device, which no host mapping of a process uses.
    pub(crate) fn is_device_address(&self, ptr: u64) -> bool {
        let devices = super::config::config().devices.max(1) as u64;
        ptr >= ADDRESS_BASE && ptr < ADDRESS_BASE + devices * DEVICE_SPAN
    }

    pub(crate) fn pinned_at(&self, addr: usize, len: usize) -> Option<&Pinned> {
        let (base, p) = self.pinned.range(..=addr).next_back()?;
        (addr + len <= base + p.len).then_some(p)
    }

    pub(crate) fn alloc(&mut self, len: usize, device: i32, ctx: Handle) -> Res<u64> {
        if len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if self.used.saturating_add(len) > super::config::config().memory {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let start = ADDRESS_BASE + device as u64 * DEVICE_SPAN;
        let next = self.next.entry(device).or_insert(start);
        let base = *next;
        if extent(len) > start + DEVICE_SPAN - base {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let buf = DevBuf::new(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        *next += extent(len);
        self.next_id += 1;
        self.used += len;
        self.live.insert(
            base,
            Alloc {
                id: self.next_id,
                base,
                len,
                device,
                ctx,
                buf: Arc::new(buf),
            },
        );
        Ok(base)
    }

    pub(crate) fn free(&mut self, base: u64, by: String) -> Option<Alloc> {
        let a = self.live.remove(&base)?;
        self.used -= a.len;
        let by = self.freer(by);
        let mut run = FreedRun {
            end: base + extent(a.len),
            by,
        };
        let mut start = base;
        // Joins the run before, and the one after, when adjacent and freed alike.
        if let Some((&before, prev)) = self.freed.range(..base).next_back()
            && prev.end == base
            && prev.by == by
        {
            start = before;
        }
        if let Some(next) = self.freed.get(&run.end).copied()
            && next.by == by
        {
            self.freed.remove(&run.end);
            run.end = next.end;
        }
        self.freed.insert(start, run);
        Some(a)
    }

    /// The index of a free's description, adding it the first time.
    fn freer(&mut self, by: String) -> u32 {
        if let Some(&id) = self.freer_ids.get(by.as_str()) {
            return id;
        }
        let id = self.freers.len() as u32;
        let by: Arc<str> = by.into();
        self.freers.push(by.clone());
        self.freer_ids.insert(by, id);
        id
    }

    /// Freed runs kept (for tests of their compaction).
    #[cfg(test)]
    pub(crate) fn freed_runs(&self) -> usize {
        self.freed.len()
    }

    pub(crate) fn alloc_pinned(&mut self, len: usize, ctx: Handle, device: i32) -> Res<usize> {
        let buf = DevBuf::new(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let addr = buf.ptr() as usize;
        self.pinned.insert(
            addr,
            Pinned {
                len,
                ctx,
                device,
                buf,
            },
        );
        Ok(addr)
    }

    pub(crate) fn free_pinned(&mut self, addr: usize) -> Res {
        let p = self.pinned.remove(&addr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        drop(p.buf);
        Ok(())
    }
}

/// Stores `n` copies of `value` with relaxed atomic stores (memsets).
///
/// # Safety
/// `dst` is valid and 4-aligned for `n` values.
pub(crate) unsafe fn fill_u32(dst: *mut u8, value: u32, n: usize) {
    for k in 0..n {
        // SAFETY: in range and aligned (caller).
        unsafe { AtomicU32::from_ptr(dst.cast::<u32>().add(k)).store(value, Ordering::Relaxed) };
    }
}

/// # Safety
/// `dst` is valid for `n` bytes.
pub(crate) unsafe fn fill_u8(dst: *mut u8, value: u8, n: usize) {
    let wide = u64::from_ne_bytes([value; 8]);
    let mut k = 0;
    while k < n && !(dst as usize + k).is_multiple_of(8) {
        // SAFETY: in range (caller).
        unsafe { AtomicU8::from_ptr(dst.add(k)).store(value, Ordering::Relaxed) };
        k += 1;
    }
    while k + 8 <= n {
        // SAFETY: in range (caller) and 8-aligned.
        unsafe { AtomicU64::from_ptr(dst.add(k).cast()).store(wide, Ordering::Relaxed) };
        k += 8;
    }
    while k < n {
        // SAFETY: in range (caller).
        unsafe { AtomicU8::from_ptr(dst.add(k)).store(value, Ordering::Relaxed) };
        k += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST_FREE: &str = "cuMemFree on the host";

    fn freed_by(m: &Memory, ptr: u64) -> Option<String> {
        match m.resolve(ptr, 0) {
            Resolved::Freed(by) => Some(by),
            _ => None,
        }
    }

    #[test]
    fn freed_allocations_merge_into_runs_that_still_resolve_every_address() {
        let mut m = Memory::new();
        let bases: Vec<u64> = (0..1000)
            .map(|k| m.alloc(100 + k % 300, 0, 0x10).unwrap())
            .collect();
        // Out of order: every seventh first, then the others.
        for pass in [true, false] {
            for (k, &b) in bases.iter().enumerate() {
                if (k % 7 == 0) == pass {
                    m.free(b, HOST_FREE.into()).unwrap();
                }
            }
        }
        assert_eq!(
            m.freed_runs(),
            1,
            "one run for 1000 allocations freed alike"
        );
        for (k, &b) in bases.iter().enumerate() {
            assert_eq!(freed_by(&m, b).as_deref(), Some(HOST_FREE));
            let last = b + (100 + k % 300) as u64 - 1;
            assert_eq!(freed_by(&m, last).as_deref(), Some(HOST_FREE));
        }
        // A free of another kind keeps a run of its own, which names it.
        let c = m.alloc(64, 0, 0x10).unwrap();
        let d = m.alloc(64, 0, 0x10).unwrap();
        let e = m.alloc(64, 0, 0x10).unwrap();
        m.free(d, "cuMemFreeAsync on stream 0x1040".into()).unwrap();
        m.free(c, HOST_FREE.into()).unwrap();
        assert_eq!(m.freed_runs(), 2);
        assert_eq!(freed_by(&m, c).as_deref(), Some(HOST_FREE));
        assert_eq!(
            freed_by(&m, d + 8).as_deref(),
            Some("cuMemFreeAsync on stream 0x1040")
        );
        assert!(matches!(m.resolve(e, 64), Resolved::Live(_)));
        assert!(matches!(m.resolve(bases[0] - 1, 0), Resolved::Unknown));
        m.free(e, HOST_FREE.into()).unwrap();
        assert_eq!(m.freed_runs(), 3, "not adjacent to a run freed alike");
    }
}
