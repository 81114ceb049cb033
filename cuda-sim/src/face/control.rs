//! The checker's interface for tests: C functions that a test finds with `dlsym` in the loaded
//! driver library (absent from a real driver, so a test can tell which one it runs on).

use super::ffi::guard_value;
use crate::model::ops;

/// The text that identifies this build of the library: `cuda-sim build id: ` and the build
/// script's `OUT_DIR`, NUL-terminated. `cuda-sim-testing` reads it from the section
/// `.cuda_sim_build_id` of the libraries in the target directory, without loading them, to
/// tell this build's library from others there (the build script says why).
const BUILD_ID_TEXT: &str = concat!("cuda-sim build id: ", env!("CUDA_SIM_BUILD_ID"), "\0");

/// `BUILD_ID_TEXT` in a section of its own, kept by the exported function below.
// SAFETY: a section name of this crate alone, holding read-only bytes that nothing else
// places there.
#[unsafe(link_section = ".cuda_sim_build_id")]
#[used]
static BUILD_ID: [u8; BUILD_ID_TEXT.len()] = {
    let text = BUILD_ID_TEXT.as_bytes();
    let mut bytes = [0; BUILD_ID_TEXT.len()];
    let mut i = 0;
    while i < text.len() {
        bytes[i] = text[i];
        i += 1;
    }
    bytes
};

/// The build id of this library (`BUILD_ID_TEXT`), a NUL-terminated string.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimBuildId() -> *const std::ffi::c_char {
    BUILD_ID.as_ptr().cast()
}

/// Violations found since the start or the last `cuSimReset`.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimViolations() -> u64 {
    guard_value(ops::violations, 0)
}

/// Forgets the violations found so far and the operation counts.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimReset() {
    guard_value(ops::reset, ())
}

/// How many operations named `name` (the driver function without its `_v2` suffix, such as
/// `cuMemcpy2DAsync` or `cuMemcpyDtoHAsync`, or `event record`) streams were given since the
/// start or the last `cuSimReset`; 0 for a NULL or non-UTF-8 name.
///
/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSimOperations(name: *const std::ffi::c_char) -> u64 {
    if name.is_null() {
        return 0;
    }
    // SAFETY: a NUL-terminated string (caller).
    let Ok(name) = unsafe { std::ffi::CStr::from_ptr(name) }.to_str() else {
        return 0;
    };
    guard_value(|| ops::operations(name), 0)
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
    let report = guard_value(ops::report, String::new());
    if !buf.is_null() {
        let n = report.len().min(cap);
        // SAFETY: `buf` has room for `cap >= n` bytes (caller); `report` has `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(report.as_ptr(), buf, n) };
    }
    report.len()
}
