//! What every entry point of both faces does before its body: counts the call (by name, `cu*`
//! and `hip*` alike), and refuses it in a child forked from a process that initialized the
//! simulator (`cuInit`, or any HIP call, since HIP initializes itself).
//!
//! The count lets a test prove that a code path never touches the driver: `cuSimDriverCalls`
//! before and after it. The names tell which entry points a failing test reached.
//!
//! After `fork`, the driver's state (its threads, its device handles) does not exist in the
//! child. NVIDIA's CUDA C++ guidelines call any use of CUDA in a forked child, before `exec`,
//! undefined. In practice a child of a process that never initialized the driver initializes
//! its own (multiprocessing workers rely on it), while in a child of one that did, drivers are
//! seen to fail every call that needs initialization with error 3, `CUDA_ERROR_NOT_INITIALIZED`
//! ("initialization error": the driver "has not been initialized with cuInit() or
//! initialization has failed"; `cudaErrorInitializationError` in the runtime API), `cuInit`
//! included, and PyTorch refuses CUDA in a forked child for that reason. The simulator models
//! that: once `cuInit` has succeeded in a process, every entry point called from another
//! process (a forked child: the process id differs) returns `CUDA_ERROR_NOT_INITIALIZED`,
//! except those that need no initialization (`cuDriverGetVersion`, `cuGetErrorName`,
//! `cuGetErrorString`, and HIP's version and error-text functions). A child of a process that
//! never called `cuInit` initializes the driver as any process does.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use cudarc::driver::sys::CUresult;

/// Driver entry points called in this process (inherited by a forked child).
static CALLS: AtomicU64 = AtomicU64::new(0);

/// The calls of one entry point: a static of its own, listed (lock-free, so that a fork never
/// inherits a held lock) at its first call.
pub(crate) struct Counter {
    name: &'static str,
    calls: AtomicU64,
    listed: AtomicBool,
    next: AtomicPtr<Counter>,
}

impl Counter {
    pub(crate) const fn new(name: &'static str) -> Self {
        Self {
            name,
            calls: AtomicU64::new(0),
            listed: AtomicBool::new(false),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// The counters of the entry points called so far, the latest first.
static LISTED: AtomicPtr<Counter> = AtomicPtr::new(std::ptr::null_mut());

/// The process in which `cuInit` succeeded first; 0 before.
static INITIALIZED_IN: AtomicU32 = AtomicU32::new(0);

/// Entry points that work without initialization, in a forked child too.
const NO_INIT_NEEDED: [&str; 7] = [
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    "hipGetErrorName",
    "hipGetErrorString",
];

/// Counts a call of the entry point that `counter` counts, and refuses it in a forked child of
/// a process that initialized the driver.
pub(crate) fn enter(counter: &'static Counter) -> Result<(), CUresult> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    counter.calls.fetch_add(1, Ordering::Relaxed);
    if !counter.listed.swap(true, Ordering::AcqRel) {
        let node = std::ptr::from_ref(counter).cast_mut();
        let mut head = LISTED.load(Ordering::Acquire);
        loop {
            counter.next.store(head, Ordering::Relaxed);
            match LISTED.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
    }
    let initialized_in = INITIALIZED_IN.load(Ordering::Relaxed);
    if initialized_in != 0
        && initialized_in != std::process::id()
        && !NO_INIT_NEEDED.contains(&counter.name)
    {
        return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
    }
    Ok(())
}

/// Records that `cuInit` succeeded in this process.
pub(crate) fn initialized() {
    let _ = INITIALIZED_IN.compare_exchange(
        0,
        std::process::id(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// How many driver entry points (the functions of the CUDA driver API, not the simulator's
/// `cuSim*` functions) this process has called since the library was loaded; a forked child
/// starts from its parent's count. `cuSimReset` leaves it.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimDriverCalls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// Writes the driver entry points called so far, one line each, `name count`, in the order of
/// their first calls, into `buf`, at most `cap` bytes, and returns the full length in bytes. A NULL
/// `buf` asks for the length only.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSimDriverCallReport(buf: *mut u8, cap: usize) -> usize {
    let report = super::ffi::guard_value(
        || {
            let mut lines = Vec::new();
            let mut node = LISTED.load(Ordering::Acquire);
            // SAFETY: every listed node is a `static` counter, never unlisted.
            while let Some(counter) = unsafe { node.as_ref() } {
                let calls = counter.calls.load(Ordering::Relaxed);
                lines.push(format!("{} {calls}\n", counter.name));
                node = counter.next.load(Ordering::Acquire);
            }
            lines.reverse();
            lines.concat()
        },
        String::new(),
    );
    if !buf.is_null() {
        let n = report.len().min(cap);
        // SAFETY: `buf` has room for `cap >= n` bytes (caller); `report` has `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(report.as_ptr(), buf, n) };
    }
    report.len()
}
