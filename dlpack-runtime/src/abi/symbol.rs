//! Functions of the running interpreter looked up by name at run time (feature `python`), for
//! builds whose declared Python API does not name them: an abi3 library built for CPython 3.11
//! may call a function that 3.11 exports with the same signature it has in a later stable ABI
//! (`PyObject_VectorcallMethod`), or one that a later version renamed (`_Py_IsFinalizing`,
//! `Py_IsFinalizing`).

use core::ffi::{CStr, c_void};
use core::ptr::NonNull;

/// The address of the global symbol `name` (the interpreter and the libraries it loaded, as
/// `dlsym(RTLD_DEFAULT, name)` finds it), or `None`; always `None` where there is no `dlsym`.
/// (Builds for CPython 3.13 or later name every function it is used for.)
#[cfg_attr(Py_3_13, allow(dead_code))]
pub(crate) fn global(name: &CStr) -> Option<NonNull<c_void>> {
    #[cfg(unix)]
    {
        use core::ffi::c_char;
        unsafe extern "C" {
            fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        }
        /// `dlfcn.h`: look in the global scope.
        #[cfg(any(target_os = "macos", target_os = "ios"))]
        const RTLD_DEFAULT: *mut c_void = -2isize as *mut c_void;
        #[cfg(not(any(target_os = "macos", target_os = "ios")))]
        const RTLD_DEFAULT: *mut c_void = core::ptr::null_mut();
        // SAFETY: `dlsym` with the global scope and a NUL-terminated name; NULL when absent.
        NonNull::new(unsafe { dlsym(RTLD_DEFAULT, name.as_ptr()) })
    }
    #[cfg(not(unix))]
    {
        let _ = name;
        None
    }
}
