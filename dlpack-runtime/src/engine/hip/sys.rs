//! The HIP runtime's C API, as far as this crate calls it: the types and constants of ROCm's
//! `hip_runtime_api.h` (HIP 6.x/7.x ABI) and a table of entry points loaded once from
//! `libamdhip64.so` at run time.
//!
//! Hand-written, not generated: the Rust HIP crates are young (`rocmrc`), link at build time
//! and need ROCm installed to build (`hip-runtime-sys`), or are pinned to ROCm releases
//! (`cubecl-hip-sys`). This crate needs a few dozen functions, loaded dynamically, and a build
//! with no ROCm at all; a missing library is an error ([`HipError::NoDriver`]), never a panic.

#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_void};
use std::path::PathBuf;

use libloading::Library;

use super::HipError;

/// `hipError_t`: a C enum, `int`.
pub(crate) type hipError_t = i32;
/// `hipStream_t`: an opaque handle (NULL: the device's default stream).
pub(crate) type hipStream_t = *mut c_void;
/// `hipEvent_t`: an opaque handle.
pub(crate) type hipEvent_t = *mut c_void;
/// `hipGraph_t`: an opaque handle.
pub(crate) type hipGraph_t = *mut c_void;
/// `hipGraphExec_t`: an opaque handle.
pub(crate) type hipGraphExec_t = *mut c_void;
/// `hipGraphNode_t`: an opaque handle.
pub(crate) type hipGraphNode_t = *mut c_void;
/// `hipHostFn_t`: a host function enqueued on a stream.
pub(crate) type hipHostFn_t = unsafe extern "C" fn(*mut c_void);

/// `hipSuccess`.
pub(crate) const SUCCESS: hipError_t = 0;
/// `hipErrorInvalidValue`.
pub(crate) const ERROR_INVALID_VALUE: hipError_t = 1;
/// `hipErrorInvalidDevice`.
pub(crate) const ERROR_INVALID_DEVICE: hipError_t = 101;
/// `hipErrorStreamCaptureUnsupported`: a call a stream capture forbids.
pub(crate) const ERROR_STREAM_CAPTURE_UNSUPPORTED: hipError_t = 900;
/// `hipErrorStreamCaptureInvalidated`.
pub(crate) const ERROR_STREAM_CAPTURE_INVALIDATED: hipError_t = 901;
/// `hipErrorStreamCaptureImplicit`: the null stream while a blocking stream is captured.
pub(crate) const ERROR_STREAM_CAPTURE_IMPLICIT: hipError_t = 906;
/// `hipErrorStreamCaptureWrongThread`.
pub(crate) const ERROR_STREAM_CAPTURE_WRONG_THREAD: hipError_t = 908;

/// `hipStreamPerThread`: the calling thread's per-thread default stream.
pub(crate) const STREAM_PER_THREAD: usize = 2;
/// `hipStreamNonBlocking`: a stream that does not synchronize with the null stream.
pub(crate) const STREAM_NON_BLOCKING: u32 = 1;
/// `hipEventWaitExternal`: a wait in a capture on an event recorded outside it.
pub(crate) const EVENT_WAIT_EXTERNAL: u32 = 1;
/// `hipEventDisableTiming`.
pub(crate) const EVENT_DISABLE_TIMING: u32 = 2;
/// `hipStreamCaptureModeRelaxed`.
pub(crate) const CAPTURE_MODE_RELAXED: i32 = 2;
/// `hipStreamCaptureStatusNone`.
pub(crate) const CAPTURE_STATUS_NONE: i32 = 0;
/// `hipMemcpyDeviceToHost`.
pub(crate) const MEMCPY_DEVICE_TO_HOST: i32 = 2;
/// `hipMemcpyDeviceToDevice`.
pub(crate) const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;
/// `hipMemcpyHostToDevice`.
pub(crate) const MEMCPY_HOST_TO_DEVICE: i32 = 1;
/// `hipMemoryTypeDevice`.
pub(crate) const MEMORY_TYPE_DEVICE: i32 = 2;
/// `hipMemoryTypeManaged`.
pub(crate) const MEMORY_TYPE_MANAGED: i32 = 3;
/// `hipMemoryTypeUnified`.
pub(crate) const MEMORY_TYPE_UNIFIED: i32 = 11;

/// `hipPointerAttribute_t`, the ROCm 6 layout (`type` replaced `memoryType`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct hipPointerAttribute_t {
    /// `hipMemoryType`: Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11.
    pub(crate) type_: i32,
    /// The device ordinal of the allocation.
    pub(crate) device: i32,
    pub(crate) devicePointer: *mut c_void,
    pub(crate) hostPointer: *mut c_void,
    pub(crate) isManaged: i32,
    pub(crate) allocationFlags: u32,
}

impl Default for hipPointerAttribute_t {
    fn default() -> Self {
        Self {
            type_: 0,
            device: -1,
            devicePointer: core::ptr::null_mut(),
            hostPointer: core::ptr::null_mut(),
            isManaged: 0,
            allocationFlags: 0,
        }
    }
}

/// Declares the table of entry points: one field per function, typed as its C prototype, and
/// the loader that looks each up by its exact name.
macro_rules! hip_api {
    ($( $name:ident ( $($arg:ty),* ) -> $ret:ty; )*) => {
        /// The HIP runtime's entry points, resolved from the loaded library, which the table
        /// keeps loaded.
        // The whole set of the contract is bound; this tier calls only some of them.
        #[allow(dead_code)]
        pub(crate) struct Api {
            $( pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
            _library: Library,
        }

        impl Api {
            /// Resolves every entry point of `library`.
            ///
            /// # Safety
            ///
            /// `library` is a HIP runtime: each symbol has the C prototype declared here
            /// (ROCm's `hip_runtime_api.h`).
            unsafe fn resolve(library: Library) -> Result<Self, HipError> {
                $(
                    // SAFETY: the symbol's type is its prototype in `hip_runtime_api.h` (the
                    // caller's contract); the pointer is copied out while `library`, which the
                    // table keeps, is loaded.
                    let $name = *unsafe {
                        library.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                    }
                    .map_err(|_| HipError::MissingSymbol { name: stringify!($name) })?;
                )*
                Ok(Self { $($name,)* _library: library })
            }
        }
    };
}

hip_api! {
    hipInit(u32) -> hipError_t;
    hipDriverGetVersion(*mut i32) -> hipError_t;
    hipRuntimeGetVersion(*mut i32) -> hipError_t;
    hipGetErrorName(hipError_t) -> *const c_char;
    hipGetErrorString(hipError_t) -> *const c_char;
    hipGetDeviceCount(*mut i32) -> hipError_t;
    hipGetDevice(*mut i32) -> hipError_t;
    hipSetDevice(i32) -> hipError_t;
    hipDeviceSynchronize() -> hipError_t;
    hipDeviceCanAccessPeer(*mut i32, i32, i32) -> hipError_t;
    hipDeviceEnablePeerAccess(i32, u32) -> hipError_t;
    hipDeviceDisablePeerAccess(i32) -> hipError_t;
    hipStreamCreate(*mut hipStream_t) -> hipError_t;
    hipStreamCreateWithFlags(*mut hipStream_t, u32) -> hipError_t;
    hipStreamDestroy(hipStream_t) -> hipError_t;
    hipStreamSynchronize(hipStream_t) -> hipError_t;
    hipStreamQuery(hipStream_t) -> hipError_t;
    hipStreamGetFlags(hipStream_t, *mut u32) -> hipError_t;
    hipStreamGetDevice(hipStream_t, *mut i32) -> hipError_t;
    hipStreamWaitEvent(hipStream_t, hipEvent_t, u32) -> hipError_t;
    hipStreamIsCapturing(hipStream_t, *mut i32) -> hipError_t;
    hipStreamGetCaptureInfo(hipStream_t, *mut i32, *mut u64) -> hipError_t;
    hipStreamBeginCapture(hipStream_t, i32) -> hipError_t;
    hipStreamEndCapture(hipStream_t, *mut hipGraph_t) -> hipError_t;
    hipThreadExchangeStreamCaptureMode(*mut i32) -> hipError_t;
    hipGraphInstantiate(*mut hipGraphExec_t, hipGraph_t, *mut hipGraphNode_t, *mut c_char, usize) -> hipError_t;
    hipGraphLaunch(hipGraphExec_t, hipStream_t) -> hipError_t;
    hipGraphExecDestroy(hipGraphExec_t) -> hipError_t;
    hipGraphDestroy(hipGraph_t) -> hipError_t;
    hipEventCreate(*mut hipEvent_t) -> hipError_t;
    hipEventCreateWithFlags(*mut hipEvent_t, u32) -> hipError_t;
    hipEventRecord(hipEvent_t, hipStream_t) -> hipError_t;
    hipEventQuery(hipEvent_t) -> hipError_t;
    hipEventSynchronize(hipEvent_t) -> hipError_t;
    hipEventDestroy(hipEvent_t) -> hipError_t;
    hipEventElapsedTime(*mut f32, hipEvent_t, hipEvent_t) -> hipError_t;
    hipLaunchHostFunc(hipStream_t, hipHostFn_t, *mut c_void) -> hipError_t;
    hipMalloc(*mut *mut c_void, usize) -> hipError_t;
    hipFree(*mut c_void) -> hipError_t;
    hipMallocAsync(*mut *mut c_void, usize, hipStream_t) -> hipError_t;
    hipFreeAsync(*mut c_void, hipStream_t) -> hipError_t;
    hipHostMalloc(*mut *mut c_void, usize, u32) -> hipError_t;
    hipHostFree(*mut c_void) -> hipError_t;
    hipMemcpy(*mut c_void, *const c_void, usize, i32) -> hipError_t;
    hipMemcpyAsync(*mut c_void, *const c_void, usize, i32, hipStream_t) -> hipError_t;
    hipMemcpy2DAsync(*mut c_void, usize, *const c_void, usize, usize, usize, i32, hipStream_t) -> hipError_t;
    hipMemcpyPeerAsync(*mut c_void, i32, *const c_void, i32, usize, hipStream_t) -> hipError_t;
    hipMemset(*mut c_void, i32, usize) -> hipError_t;
    hipMemsetAsync(*mut c_void, i32, usize, hipStream_t) -> hipError_t;
    hipPointerGetAttributes(*mut hipPointerAttribute_t, *const c_void) -> hipError_t;
}

/// The names the HIP runtime is looked up under, in order: the loader's search path (the
/// development name, then the sonames of ROCm 7 and 6), then `$ROCM_PATH/lib` and
/// `/opt/rocm/lib`.
fn candidates() -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(root) = std::env::var_os("ROCM_PATH") {
        names.push(PathBuf::from(root).join("lib").join("libamdhip64.so"));
    }
    names.push(PathBuf::from("/opt/rocm/lib/libamdhip64.so"));
    names
}

/// Loads the HIP runtime from the first of [`candidates`] that loads, and resolves its entry
/// points.
///
/// # Errors
///
/// [`HipError::NoDriver`] when no candidate loads; [`HipError::MissingSymbol`] when the library
/// lacks one of the entry points.
pub(super) fn load() -> Result<Api, HipError> {
    for name in candidates() {
        // SAFETY: loading the HIP runtime runs its initializers, which have no preconditions
        // on this process (ROCm documents `libamdhip64` as a shared library loaded at any time).
        let Ok(library) = (unsafe { Library::new(&name) }) else {
            continue;
        };
        // SAFETY: a library under the HIP runtime's name exports the HIP API of
        // `hip_runtime_api.h`.
        return unsafe { Api::resolve(library) };
    }
    Err(HipError::NoDriver)
}
