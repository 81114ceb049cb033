//! The `driver!` macro, which defines the CUDA face's exported functions.

/// Defines exported driver functions. Each body returns `Result<(), CUresult>`; each function
/// is checked at compile time against cudarc's binding of the same name, so its C signature is
/// the driver's. Every call is counted, and refused in a forked child of a process that
/// initialized the driver, before its body runs (`calls`).
macro_rules! driver {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        ///
        /// The arguments follow the CUDA driver API's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> cudarc::driver::sys::CUresult {
            static CALLS: $crate::face::calls::Counter = $crate::face::calls::Counter::new(stringify!($name));
            $crate::face::ffi::guard(stringify!($name), move || -> Result<(), cudarc::driver::sys::CUresult> {
                $crate::face::calls::enter(&CALLS)?;
                $body
            })
        }
        const _: unsafe fn($($ty),*) -> cudarc::driver::sys::CUresult =
            cudarc::driver::sys::$name;
    )*};
}
pub(crate) use driver;
