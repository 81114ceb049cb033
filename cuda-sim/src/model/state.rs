//! The simulated machine: devices, contexts, streams (their enqueue half), events, memory and
//! the checker, under one lock, and the thread-local state of the calling threads (the context
//! stack, the capture mode, the end of per-thread default streams).
//!
//! One lock guards the enqueue side (handles, clocks, the checker); each stream's queue has its
//! own lock and condition variable, which its worker and the host's waits use. The worker never
//! takes the global lock, so a host function running on a stream may call the driver.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::Instant;

use cudarc::driver::sys::{CUresult, CUstreamCaptureMode};

use super::base::{Handle, Res, lock};
use super::checker::{Actor, Checker, HOST, Pattern, VClock};
use super::memory::{Alloc, Memory, Resolved};
use super::module::Kernels;
use super::nodes::{CaptureSeq, Exec, Graph};
use super::stream::{Op, Recorded, StreamCore, Waiter, Work};

use CUresult::*;

/// The machine, locked.
pub(crate) fn state() -> MutexGuard<'static, State> {
    static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::new()));
    lock(&STATE)
}

/// Where a call's implicit context, and the special stream handles it names, resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The calling thread's current context (the CUDA driver's context stack).
    Current,
    /// The primary context of a device (a runtime-style face with a current device per thread).
    Device(i32),
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
            let workers = state().end_thread(thread);
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
    pub(crate) kernels: Kernels,
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
            devices: super::config::config().devices,
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
            memory: Memory::new(),
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

    /// The stream a handle names, the special handles (NULL and 1: the legacy default stream,
    /// 2: this thread's per-thread default stream) resolving in the context of `scope`.
    pub(crate) fn stream_in(&mut self, scope: Scope, handle: usize) -> Res<usize> {
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
        self.memory.view(base)
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

impl State {
    /// The context a call in `scope` works in: the current one (`CUDA_ERROR_INVALID_CONTEXT`
    /// with none), or the device's primary context (`CUDA_ERROR_INVALID_DEVICE` for an ordinal
    /// out of range).
    pub(crate) fn scope_context(&mut self, scope: Scope) -> Res<Handle> {
        match scope {
            Scope::Current => self.current(),
            Scope::Device(dev) => {
                self.check_device(dev)?;
                Ok(self.primary(dev))
            }
        }
    }
}
