//! What the C entry points of every face share: no panic across the C boundary, and the
//! writes through out-pointers.

use cudarc::driver::sys::CUresult;

/// Runs a driver call: its result as a `CUresult`, and never a panic across the C boundary.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            eprintln!("cuda-sim: {name} panicked; returning CUDA_ERROR_UNKNOWN");
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Runs `f` for a non-driver entry point: `default` instead of a panic across the C boundary.
pub(crate) fn guard_value<T>(f: impl FnOnce() -> T, default: T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("cuda-sim: a checker call panicked");
        default
    })
}

/// Writes a result through an out-pointer: `CUDA_ERROR_INVALID_VALUE` if it is NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn out<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: not NULL, and valid for a write (caller).
    unsafe { out.write(value) };
    Ok(())
}

/// Writes a result through an optional out-pointer: nothing if it is NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn maybe_out<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: not NULL, and valid for a write (caller).
        unsafe { out.write(value) };
    }
}
