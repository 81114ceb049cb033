//! What every part of the model uses: handles, results, the lock, and the word on stderr for
//! what is not modelled.

use std::sync::{LazyLock, Mutex, MutexGuard};

use cudarc::driver::sys::CUresult;

/// A handle: pointer-like, distinct across kinds, never reused.
pub(crate) type Handle = usize;
/// A result with the driver's error codes, which the model speaks.
pub(crate) type Res<T = ()> = Result<T, CUresult>;

/// Locks, ignoring poisoning: a panic in one call is reported by that call, and the state is
/// kept consistent by never panicking while it is half-updated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Says on stderr (once per name) that `what` is not modelled.
pub(crate) fn unsupported(what: &str) {
    use std::collections::HashSet;
    static SAID: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);
    if lock(&SAID).insert(what.to_string()) {
        eprintln!("cuda-sim: {what} is not supported by the CUDA simulator");
    }
}
