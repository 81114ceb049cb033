//! The simulated machine: devices, contexts, streams executed by worker threads, events, and
//! device memory behind a range table.
//!
//! One lock guards the enqueue side (handles, clocks, the checker); each stream's queue has its
//! own lock and condition variable, which its worker and the host's waits use. The worker never
//! takes the global lock, so a host function running on a stream may call the driver.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::Instant;

use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};

use crate::checker::{Actor, AllocInfo, Checker, HOST, Pattern, VClock};
use crate::graph::{CaptureSeq, Exec, Graph};

pub(crate) type Handle = usize;
pub(crate) type Res<T = ()> = Result<T, CUresult>;

use CUresult::*;

/// Locks, ignoring poisoning: a panic in one call is reported by that call, and the state is
/// kept consistent by never panicking while it is half-updated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Work a stream runs in order.
pub(crate) type Work = Box<dyn FnOnce() + Send>;

struct Op {
    /// Positions of other streams this operation waits for.
    deps: Vec<(Arc<StreamCore>, u64)>,
    work: Option<Work>,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    completed: u64,
    closing: bool,
}

/// The executing half of a stream: a FIFO run by one worker thread.
pub(crate) struct StreamCore {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl StreamCore {
    /// A stream's queue and the worker thread that runs it (which ends once the queue is
    /// closed and empty).
    fn start(name: String) -> (Arc<Self>, JoinHandle<()>) {
        let core = Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let worker = core.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run())
            .expect("cuda-sim: cannot start a stream thread");
        (core, thread)
    }

    fn run(&self) {
        let delay = crate::config().op_delay;
        loop {
            let op = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            for (dep, seq) in &op.deps {
                dep.wait_for(*seq);
            }
            if let Some(work) = op.work {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
                    eprintln!("cuda-sim: an operation panicked on a stream thread");
                }
            }
            lock(&self.queue).completed += 1;
            self.cv.notify_all();
        }
    }

    fn push(&self, op: Op) {
        lock(&self.queue).ops.push_back(op);
        self.cv.notify_all();
    }

    fn close(&self) {
        lock(&self.queue).closing = true;
        self.cv.notify_all();
    }

    /// Blocks until `seq` operations have completed.
    pub(crate) fn wait_for(&self, seq: u64) {
        let mut q = lock(&self.queue);
        while q.completed < seq {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn completed(&self) -> u64 {
        lock(&self.queue).completed
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Legacy,
    PerThread,
    Created { flags: u32, priority: i32 },
}

/// `CU_STREAM_NON_BLOCKING`.
pub(crate) const NON_BLOCKING: u32 = 0x1;

/// The enqueue half of a stream.
pub(crate) struct Stream {
    pub(crate) core: Arc<StreamCore>,
    /// The worker thread, until the stream ends (joined then if idle, else detached to finish
    /// its work).
    worker: Option<JoinHandle<()>>,
    pub(crate) handle: Handle,
    pub(crate) ctx: Handle,
    pub(crate) kind: Kind,
    submitted: u64,
    clock: VClock,
    /// The capture sequence the stream is in (its origin or a stream that joined it), by id.
    pub(crate) capture: Option<u64>,
    /// While capturing: the nodes of the capture's graph that the stream's next node depends
    /// on (indices into [`CaptureSeq::nodes`]).
    pub(crate) frontier: Vec<usize>,
    pub(crate) destroyed: bool,
    pub(crate) label: Arc<str>,
}

impl Stream {
    pub(crate) fn blocking(&self) -> bool {
        match self.kind {
            Kind::Legacy | Kind::PerThread => true,
            Kind::Created { flags, .. } => flags & NON_BLOCKING == 0,
        }
    }
}

pub(crate) struct Context {
    pub(crate) device: i32,
    pub(crate) primary: bool,
    pub(crate) retained: u32,
    pub(crate) legacy: usize,
    /// Blocking streams (created or per-thread), which the legacy stream synchronizes with.
    pub(crate) blocking: Vec<usize>,
    /// Every stream of the context, for `cuCtxSynchronize`.
    all: Vec<usize>,
    pub(crate) destroyed: bool,
}

/// Where a recorded event stands: its stream's position at record time.
#[derive(Clone)]
pub(crate) struct Recorded {
    pub(crate) core: Arc<StreamCore>,
    pub(crate) seq: u64,
    pub(crate) clock: VClock,
    pub(crate) done_at: Arc<Mutex<Option<Instant>>>,
}

/// An event's most recent record.
#[derive(Clone)]
pub(crate) enum LastRecord {
    /// Never recorded: an empty set of work, complete.
    Never,
    /// Recorded on a stream that was not capturing: a position of that stream.
    Stream(Recorded),
    /// Recorded (with default flags) on a stream capturing into capture sequence `id`: a set
    /// of nodes of that capture's graph, which only streams of that capture may wait on.
    Capture { id: u64, frontier: Vec<usize> },
}

pub(crate) struct Event {
    pub(crate) ctx: Handle,
    pub(crate) flags: u32,
    pub(crate) last: LastRecord,
}

/// `CU_EVENT_DISABLE_TIMING`.
pub(crate) const DISABLE_TIMING: u32 = 0x2;

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

/// The most devices `CUDA_SIM_DEVICES` allows: the address space is laid out for them.
pub(crate) const MAX_DEVICES: u64 = 64;

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
        let devices = crate::config().devices.max(1) as u64;
        ptr >= ADDRESS_BASE && ptr < ADDRESS_BASE + devices * DEVICE_SPAN
    }

    pub(crate) fn pinned_at(&self, addr: usize, len: usize) -> Option<&Pinned> {
        let (base, p) = self.pinned.range(..=addr).next_back()?;
        (addr + len <= base + p.len).then_some(p)
    }

    fn alloc(&mut self, len: usize, device: i32, ctx: Handle) -> Res<u64> {
        if len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if self.used.saturating_add(len) > crate::config().memory {
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

    fn free(&mut self, base: u64, by: String) -> Option<Alloc> {
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

thread_local! {
    /// The thread's context stack; the last entry is the current context.
    static CONTEXTS: RefCell<Vec<Handle>> = const { RefCell::new(Vec::new()) };
    /// `cuThreadExchangeStreamCaptureMode`.
    static CAPTURE_MODE: RefCell<CUstreamCaptureMode> =
        const { RefCell::new(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

/// Ends a thread's per-thread default streams when the thread ends (a thread-local's
/// destructor); made when the thread first uses one.
struct ThreadEnd(ThreadId);

impl Drop for ThreadEnd {
    fn drop(&mut self) {
        let thread = self.0;
        let ended = std::panic::catch_unwind(move || {
            let workers = crate::state().end_thread(thread);
            // Idle workers end at once; joined so that the thread's streams are gone when it is.
            for w in workers {
                let _ = w.join();
            }
        });
        if ended.is_err() {
            eprintln!("cuda-sim: ending a thread's per-thread default streams panicked");
        }
    }
}

thread_local! {
    static THREAD_END: ThreadEnd = ThreadEnd(std::thread::current().id());
}

pub(crate) fn current_raw() -> Option<Handle> {
    CONTEXTS.with(|s| s.borrow().last().copied())
}

pub(crate) fn set_current(ctx: Option<Handle>) {
    CONTEXTS.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
    })
}

pub(crate) fn push_current(ctx: Handle) {
    CONTEXTS.with(|s| s.borrow_mut().push(ctx))
}

pub(crate) fn pop_current() -> Option<Handle> {
    CONTEXTS.with(|s| s.borrow_mut().pop())
}

pub(crate) fn exchange_capture_mode(mode: CUstreamCaptureMode) -> CUstreamCaptureMode {
    CAPTURE_MODE.with(|m| std::mem::replace(&mut *m.borrow_mut(), mode))
}

fn thread_capture_mode() -> CUstreamCaptureMode {
    CAPTURE_MODE.with(|m| *m.borrow())
}

/// A snapshot for a host wait: what to wait for, and the clock to join afterwards.
pub(crate) struct Waiter {
    core: Arc<StreamCore>,
    seq: u64,
    clock: VClock,
}

/// The whole simulated machine.
pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) devices: i32,
    pub(crate) contexts: HashMap<Handle, Context>,
    primary: HashMap<i32, Handle>,
    /// Stream `i` has timeline `i + 1`.
    pub(crate) streams: Vec<Stream>,
    by_handle: HashMap<Handle, usize>,
    per_thread: HashMap<(ThreadId, Handle), usize>,
    /// Ended streams still in their context's lists (see [`State::sweep_ended`]).
    ended: Vec<usize>,
    pub(crate) events: HashMap<Handle, Event>,
    /// Capture sequences under way (begun and not yet ended), by id.
    pub(crate) captures: HashMap<u64, CaptureSeq>,
    /// Graphs returned by `cuStreamEndCapture` and not destroyed.
    pub(crate) graphs: HashMap<Handle, Graph>,
    /// Executable graphs (`cuGraphInstantiate*`) not destroyed.
    pub(crate) execs: HashMap<Handle, Exec>,
    pub(crate) memory: Memory,
    host: VClock,
    host_seq: u64,
    pub(crate) checker: Checker,
    /// Loaded PTX modules and their kernels.
    pub(crate) kernels: crate::kernel::Kernels,
    /// Operations enqueued, by name, since the start or the last reset (`cuSimOperations`).
    pub(crate) operations: HashMap<String, u64>,
    /// Peer access enabled (`cuCtxEnablePeerAccess`): from a context, to a peer context.
    pub(crate) peers: HashSet<(Handle, Handle)>,
    next_handle: Handle,
    pub(crate) next_capture: u64,
}

impl State {
    pub(crate) fn new() -> Self {
        Self {
            initialized: false,
            devices: crate::config().devices,
            contexts: HashMap::new(),
            primary: HashMap::new(),
            streams: Vec::new(),
            by_handle: HashMap::new(),
            per_thread: HashMap::new(),
            ended: Vec::new(),
            events: HashMap::new(),
            captures: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            memory: Memory {
                live: BTreeMap::new(),
                freed: BTreeMap::new(),
                freers: Vec::new(),
                freer_ids: HashMap::new(),
                pinned: BTreeMap::new(),
                next: HashMap::new(),
                next_id: 0,
                used: 0,
            },
            host: VClock::default(),
            host_seq: 0,
            checker: Checker::default(),
            kernels: Default::default(),
            operations: HashMap::new(),
            peers: HashSet::new(),
            next_handle: 0x1000,
            next_capture: 0,
        }
    }

    /// Handles are pointer-like, distinct across kinds and never reused, so a stale handle is
    /// always `CUDA_ERROR_INVALID_HANDLE`, never another object.
    pub(crate) fn handle(&mut self) -> Handle {
        self.next_handle += 0x10;
        self.next_handle
    }

    pub(crate) fn check_init(&self) -> Res {
        if self.initialized {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_INITIALIZED)
        }
    }

    pub(crate) fn check_device(&self, dev: i32) -> Res {
        self.check_init()?;
        if (0..self.devices).contains(&dev) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }

    pub(crate) fn context(&self, ctx: Handle) -> Res<&Context> {
        match self.contexts.get(&ctx) {
            Some(c) if !c.destroyed => Ok(c),
            _ => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    }

    /// The thread's current context, which must be live.
    pub(crate) fn current(&self) -> Res<Handle> {
        self.check_init()?;
        let ctx = current_raw().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        self.context(ctx)?;
        Ok(ctx)
    }

    fn new_context(&mut self, device: i32, primary: bool) -> Handle {
        let handle = self.handle();
        self.contexts.insert(
            handle,
            Context {
                device,
                primary,
                retained: 0,
                legacy: usize::MAX,
                blocking: Vec::new(),
                all: Vec::new(),
                destroyed: false,
            },
        );
        let legacy = self.new_stream(handle, Kind::Legacy, 0);
        self.contexts.get_mut(&handle).expect("just made").legacy = legacy;
        handle
    }

    pub(crate) fn primary(&mut self, device: i32) -> Handle {
        if let Some(&c) = self.primary.get(&device) {
            return c;
        }
        let c = self.new_context(device, true);
        self.primary.insert(device, c);
        c
    }

    pub(crate) fn create_context(&mut self, device: i32) -> Handle {
        self.new_context(device, false)
    }

    /// Adds a stream to `ctx` and starts its worker; returns its index.
    pub(crate) fn new_stream(&mut self, ctx: Handle, kind: Kind, handle: Handle) -> usize {
        let index = self.streams.len();
        let label: Arc<str> = match kind {
            Kind::Legacy => format!("the legacy default stream of context {ctx:#x}"),
            Kind::PerThread => format!(
                "the per-thread default stream of context {ctx:#x} ({:?})",
                std::thread::current().id()
            ),
            Kind::Created { .. } => format!("stream {handle:#x}"),
        }
        .into();
        let (core, worker) = StreamCore::start(format!("cuda-sim stream {}", index + 1));
        let stream = Stream {
            core,
            worker: Some(worker),
            handle,
            ctx,
            kind,
            submitted: 0,
            clock: VClock::default(),
            capture: None,
            frontier: Vec::new(),
            destroyed: false,
            label,
        };
        let blocking = stream.blocking();
        self.streams.push(stream);
        let c = self.contexts.get_mut(&ctx).expect("a live context");
        c.all.push(index);
        if blocking && kind != Kind::Legacy {
            c.blocking.push(index);
        }
        if handle != 0 {
            self.by_handle.insert(handle, index);
        }
        index
    }

    /// The stream a handle names: NULL and `CU_STREAM_LEGACY` are the legacy default stream of
    /// the current context, `CU_STREAM_PER_THREAD` this thread's default stream of it.
    pub(crate) fn stream(&mut self, handle: usize) -> Res<usize> {
        self.stream_in(crate::ops::Scope::Current, handle)
    }

    /// The stream a handle names, the special handles (NULL and 1: the legacy default stream,
    /// 2: this thread's per-thread default stream) resolving in the context of `scope`.
    pub(crate) fn stream_in(&mut self, scope: crate::ops::Scope, handle: usize) -> Res<usize> {
        self.check_init()?;
        match handle {
            0 | 1 => {
                let ctx = self.scope_context(scope)?;
                Ok(self.contexts[&ctx].legacy)
            }
            2 => {
                let ctx = self.scope_context(scope)?;
                let key = (std::thread::current().id(), ctx);
                if let Some(&i) = self.per_thread.get(&key) {
                    return Ok(i);
                }
                // The thread's streams end with it (`end_thread`).
                THREAD_END.with(|_| ());
                let i = self.new_stream(ctx, Kind::PerThread, 0);
                self.per_thread.insert(key, i);
                Ok(i)
            }
            h => {
                let &i = self.by_handle.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                let s = &self.streams[i];
                if s.destroyed {
                    return Err(CUDA_ERROR_INVALID_HANDLE);
                }
                self.context(s.ctx)?;
                Ok(i)
            }
        }
    }

    /// Ends stream `i` (`cuStreamDestroy`, its context's destruction, or its thread's end for a
    /// per-thread stream): its handle is invalid at once, its enqueued work still runs, and its
    /// worker thread ends after that work. Its bookkeeping shrinks once the host has seen that
    /// work complete ([`State::sweep_ended`]). Returns the worker thread if the stream is idle
    /// (it ends at once), for the caller to join outside the lock; a busy stream's worker is
    /// detached, so that the thread's stack is released when it ends, with no one to wait for
    /// it (a thread neither joined nor detached keeps its stack mapped after it ends).
    pub(crate) fn destroy_stream(&mut self, i: usize) -> Option<JoinHandle<()>> {
        if self.streams[i].destroyed {
            return None;
        }
        self.leave_capture(i);
        let s = &mut self.streams[i];
        s.destroyed = true;
        s.core.close();
        let idle = s.core.completed() >= s.submitted;
        // Dropping a `JoinHandle` detaches its thread.
        let worker = s.worker.take().filter(|_| idle);
        self.by_handle.remove(&s.handle);
        self.ended.push(i);
        self.sweep_ended();
        worker
    }

    /// Ends the per-thread default streams of `thread` (which is ending); returns the worker
    /// threads of the idle ones, for the caller to join outside the lock.
    fn end_thread(&mut self, thread: ThreadId) -> Vec<JoinHandle<()>> {
        let mine: Vec<_> = self
            .per_thread
            .keys()
            .filter(|(t, _)| *t == thread)
            .copied()
            .collect();
        let mut workers = Vec::new();
        for key in mine {
            if let Some(i) = self.per_thread.remove(&key) {
                workers.extend(self.destroy_stream(i));
            }
        }
        workers
    }

    /// Ends every stream of context `ctx` (being destroyed); returns the idle ones' worker
    /// threads, for the caller to join outside the lock.
    pub(crate) fn end_context_streams(&mut self, ctx: Handle) -> Vec<JoinHandle<()>> {
        self.per_thread.retain(|&(_, c), _| c != ctx);
        let mine: Vec<usize> = (0..self.streams.len())
            .filter(|&i| self.streams[i].ctx == ctx)
            .collect();
        mine.into_iter()
            .filter_map(|i| self.destroy_stream(i))
            .collect()
    }

    /// Drops ended streams whose work is complete and seen by the host from their context's
    /// lists, and their vector clocks: every later operation joins the host's clock, which
    /// covers them, so the legacy stream's barriers and `cuCtxSynchronize` need them no more.
    fn sweep_ended(&mut self) {
        let (streams, host) = (&self.streams, &self.host);
        let done: Vec<usize> = self
            .ended
            .iter()
            .copied()
            .filter(|&i| {
                let s = &streams[i];
                host.covers(i + 1, s.submitted) && s.core.completed() >= s.submitted
            })
            .collect();
        if done.is_empty() {
            return;
        }
        self.ended.retain(|i| !done.contains(i));
        for i in done {
            if let Some(c) = self.contexts.get_mut(&self.streams[i].ctx) {
                c.blocking.retain(|&j| j != i);
                c.all.retain(|&j| j != i);
            }
            self.streams[i].clock = VClock::default();
        }
    }

    pub(crate) fn actor(&self, i: usize, seq: u64, op: &str) -> Actor {
        Actor {
            timeline: i + 1,
            seq,
            stream: self.streams[i].label.clone(),
            op: op.into(),
        }
    }

    fn host_actor(&mut self, op: &str) -> Actor {
        self.host_seq += 1;
        self.host.set(HOST, self.host_seq);
        Actor {
            timeline: HOST,
            seq: self.host_seq,
            stream: "the host".into(),
            op: op.into(),
        }
    }

    /// Whether a "potentially unsafe" call (one that may synchronize implicitly) is refused
    /// because a stream capture is under way: a capture in global mode anywhere, or in
    /// thread-local mode on this thread, unless this thread's mode is relaxed. The refused call
    /// invalidates those captures, as the driver does.
    pub(crate) fn check_capture_safe(&mut self) -> Res {
        if thread_capture_mode() == CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED {
            return Ok(());
        }
        let me = std::thread::current().id();
        let mut refused = false;
        for c in self.captures.values_mut() {
            let applies = match c.mode {
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL => true,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL => c.thread == me,
                _ => false,
            };
            if applies {
                c.invalidated = true;
                refused = true;
            }
        }
        if refused {
            Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    /// Enqueues an operation on stream `i`: it runs after the stream's earlier work, after
    /// `wait` (a recorded event's position), and with the legacy default stream's barriers;
    /// its accesses are checked against the happens-before order.
    ///
    /// The legacy default stream is unusable while a blocking stream of its context captures
    /// (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, which invalidates those captures). Operations that
    /// can be captured are put into the capture by their callers before they get here; any
    /// other reaching a capturing stream is refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
    /// and invalidates the capture.
    pub(crate) fn enqueue(
        &mut self,
        i: usize,
        op: &str,
        accesses: &[(&Alloc, Pattern, bool)],
        wait: Option<&Recorded>,
        work: Option<Work>,
    ) -> Res<u64> {
        self.enqueue_as(i, op, op, accesses, wait, work)
    }

    /// [`State::enqueue`], counted under `count` (`cuSimOperations`) and reported as `op`
    /// (a kernel launch is counted as `cuLaunchKernel` and reported with the kernel's name).
    pub(crate) fn enqueue_as(
        &mut self,
        i: usize,
        count: &str,
        op: &str,
        accesses: &[(&Alloc, Pattern, bool)],
        wait: Option<&Recorded>,
        work: Option<Work>,
    ) -> Res<u64> {
        if self.capturing(i)?.is_some() {
            self.invalidate_stream_capture(i);
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        *self.operations.entry(count.to_string()).or_default() += 1;
        let mut deps = Vec::new();
        let mut clock = self.streams[i].clock.clone();
        let ctx = &self.contexts[&self.streams[i].ctx];
        let barrier: Vec<usize> = match self.streams[i].kind {
            Kind::Legacy => ctx.blocking.clone(),
            _ if self.streams[i].blocking() => vec![ctx.legacy],
            _ => Vec::new(),
        };
        for b in barrier {
            let other = &self.streams[b];
            if other.submitted > other.core.completed() {
                deps.push((other.core.clone(), other.submitted));
            }
            clock.join(&other.clock);
        }
        if let Some(r) = wait {
            deps.push((r.core.clone(), r.seq));
            clock.join(&r.clock);
        }
        clock.join(&self.host);
        let s = &mut self.streams[i];
        s.submitted += 1;
        let seq = s.submitted;
        clock.set(i + 1, seq);
        s.clock = clock.clone();
        let actor = self.actor(i, seq, op);
        for (alloc, pattern, write) in accesses {
            self.checker
                .access(alloc.info(), *pattern, *write, &actor, &clock);
        }
        self.streams[i].core.push(Op { deps, work });
        Ok(seq)
    }

    /// Records an event on stream `i`: its position now.
    pub(crate) fn record(&mut self, i: usize) -> Res<Recorded> {
        let done_at = Arc::new(Mutex::new(None));
        let stamp = done_at.clone();
        let work: Work = Box::new(move || *lock(&stamp) = Some(Instant::now()));
        let seq = self.enqueue(i, "event record", &[], None, Some(work))?;
        let s = &self.streams[i];
        Ok(Recorded {
            core: s.core.clone(),
            seq,
            clock: s.clock.clone(),
            done_at,
        })
    }

    /// Stream `i`'s position now (everything enqueued on it so far), as a record that later
    /// work can wait for.
    pub(crate) fn position(&self, i: usize) -> Recorded {
        let s = &self.streams[i];
        Recorded {
            core: s.core.clone(),
            seq: s.submitted,
            clock: s.clock.clone(),
            done_at: Arc::new(Mutex::new(None)),
        }
    }

    /// A host wait for everything enqueued on stream `i` so far.
    pub(crate) fn waiter(&self, i: usize) -> Waiter {
        let s = &self.streams[i];
        Waiter {
            core: s.core.clone(),
            seq: s.submitted,
            clock: s.clock.clone(),
        }
    }

    pub(crate) fn event_waiter(r: &Recorded) -> Waiter {
        Waiter {
            core: r.core.clone(),
            seq: r.seq,
            clock: r.clock.clone(),
        }
    }

    /// Whether the waiter's position has completed.
    pub(crate) fn is_done(w: &Waiter) -> bool {
        w.core.completed() >= w.seq
    }

    /// The host has seen the waiter's position complete: it is ordered after it.
    pub(crate) fn observed(&mut self, w: &Waiter) {
        self.host.join(&w.clock);
        self.checker.prune(&self.host);
        self.sweep_ended();
    }

    /// Waiters for every stream of a context (`cuCtxSynchronize`).
    pub(crate) fn context_waiters(&self, ctx: Handle) -> Vec<Waiter> {
        self.contexts[&ctx]
            .all
            .iter()
            .map(|&i| self.waiter(i))
            .collect()
    }

    pub(crate) fn alloc(&mut self, len: usize, ctx: Handle, stream: Option<usize>) -> Res<u64> {
        let device = self.context(ctx)?.device;
        let base = self.memory.alloc(len, device, ctx)?;
        let pattern = Pattern::range(0, len as u64);
        match stream {
            // Stream-ordered: usable by work ordered after this point of the stream.
            Some(i) => {
                let alloc = self.take_alloc_view(base);
                let queued =
                    self.enqueue(i, "cuMemAllocAsync", &[(&alloc, pattern, true)], None, None);
                if let Err(e) = queued {
                    self.memory.free(base, "a failed cuMemAllocAsync".into());
                    return Err(e);
                }
            }
            None => {
                let actor = self.host_actor("cuMemAlloc");
                let (info, clock) = (self.memory.live[&base].info(), self.host.clone());
                self.checker.access(info, pattern, true, &actor, &clock);
            }
        }
        Ok(base)
    }

    /// A copy of an allocation's bookkeeping (not its memory) to pass while `self` is borrowed.
    pub(crate) fn take_alloc_view(&self, base: u64) -> Alloc {
        let a = &self.memory.live[&base];
        Alloc {
            id: a.id,
            base: a.base,
            len: a.len,
            device: a.device,
            ctx: a.ctx,
            buf: a.buf.clone(),
        }
    }

    /// Frees the allocation at `base`: on the host (`stream == None`) or stream-ordered.
    pub(crate) fn free(&mut self, base: u64, stream: Option<usize>, op: &str) -> Res {
        let Some(alloc) = self.memory.find(base).map(|a| a.base) else {
            if let Resolved::Freed(by) = self.memory.resolve(base, 0) {
                self.checker
                    .use_after_free(base, &format!("{op} (a second free)"), &by);
            }
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if alloc != base {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let view = self.take_alloc_view(base);
        let (actor, clock, by) = match stream {
            Some(i) => {
                // Keeps the memory until the stream reaches the free.
                let keep = view.buf.clone();
                let seq = self.enqueue(i, op, &[], None, Some(Box::new(move || drop(keep))))?;
                let actor = self.actor(i, seq, op);
                let by = format!("{op} on {}", self.streams[i].label);
                (actor, self.streams[i].clock.clone(), by)
            }
            None => {
                let actor = self.host_actor(op);
                (actor, self.host.clone(), format!("{op} on the host"))
            }
        };
        self.checker.free(view.info(), &actor, &clock);
        self.memory.free(base, by);
        Ok(())
    }
}

impl Waiter {
    pub(crate) fn wait(&self) {
        self.core.wait_for(self.seq);
    }
}

/// Counts a never-recorded event as complete and maps queries to the driver's codes.
pub(crate) fn ready(done: bool) -> Res {
    if done {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
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
        let mut m = State::new().memory;
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
