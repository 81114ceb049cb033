//! What every driver entry point does before its body: counts the call (by name).
//!
//! The count lets a test prove that a code path never touches the driver: `cuSimDriverCalls`
//! before and after it. The names tell which entry points a failing test reached.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

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

/// Counts a call of the entry point that `counter` counts.
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
    Ok(())
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
    let report = crate::guard_value(
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
