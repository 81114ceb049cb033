//! The checker's interface for tests: C functions that a test finds with `dlsym` in the loaded
//! driver library (absent from a real driver, so a test can tell which one it runs on).

use crate::state;

/// Violations found since the start or the last `cuSimReset`.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimViolations() -> u64 {
    crate::guard_value(|| state().checker.count(), 0)
}

/// Forgets the violations found so far.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimReset() {
    crate::guard_value(|| state().checker.reset(), ())
}

/// Writes the report of the violations (one per line: both accesses, with stream, operation
/// and byte range) into `buf`, at most `cap` bytes, and returns its full length in bytes. A
/// NULL `buf` asks for the length only.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSimReport(buf: *mut u8, cap: usize) -> usize {
    let report = crate::guard_value(|| state().checker.report(), String::new());
    if !buf.is_null() {
        let n = report.len().min(cap);
        // SAFETY: `buf` has room for `cap >= n` bytes (caller); `report` has `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(report.as_ptr(), buf, n) };
    }
    report.len()
}
