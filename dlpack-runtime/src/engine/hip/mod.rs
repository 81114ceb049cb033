//! The HIP driver tier (feature `hip`): the effects of a ROCm hand-off on the HIP runtime, for
//! devices, streams, raw pointers and stream plans only (it never sees an export or an import).
//! The binding itself is in `api` (hand-written, loaded at run time); errors, the probe, the
//! current-device guard, the checks of pointers and streams, capture status, events and host
//! waits live here; [`HipStream`] and [`HipSlice`] in the submodules.
//!
//! # Graph capture on ROCm
//!
//! Before ROCm 7.14, HIP does not report the errors of capture-unsafe calls made while a stream
//! is being captured (pytorch/pytorch#187110): a host synchronization of a capturing stream, a
//! query of captured work, a synchronous copy that touches the null stream while a blocking
//! stream captures all return `hipSuccess`, and the capture is silently invalidated. So this
//! tier never relies on an error from such a call: it asks `hipStreamIsCapturing` (and
//! `hipStreamGetCaptureInfo` for the capture's id) **before** any host-side query or
//! synchronization, and refuses with [`HipError::Capturing`] instead of making the call.

use core::ffi::c_void;
use std::sync::OnceLock;

use crate::tensor::device::Device;

mod memory;
mod stream;
mod sys;

pub use memory::HipSlice;
pub(crate) use memory::{
    HipMemory, MAX_PITCH, copy_on_device, copy_span_to_host, copy_stream, free_device_memory,
};
pub use stream::HipStream;
#[cfg(feature = "python")]
pub(crate) use stream::order_raw;
pub(crate) use stream::{
    HipEvent, order_before, order_before_on, record_events, synchronize_streams,
};
pub(crate) use sys::hipStream_t;
use sys::{Api, SUCCESS, hipError_t};

/// A HIP failure, or the absence of the HIP runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HipError {
    /// `libamdhip64.so` could not be loaded (nor `.so.7`, `.so.6`, nor from `$ROCM_PATH/lib` or
    /// `/opt/rocm/lib`): no ROCm runtime on this machine.
    #[error(
        "no HIP runtime: libamdhip64.so could not be loaded, expected a machine with ROCm (on the library path, in $ROCM_PATH/lib or in /opt/rocm/lib)"
    )]
    NoDriver,
    /// The library loaded lacks an entry point this crate calls: not a HIP runtime, or one
    /// older than ROCm 6.
    #[error("the HIP runtime loaded has no {name}, expected a HIP runtime of ROCm 6 or later")]
    MissingSymbol {
        /// The function looked up.
        name: &'static str,
    },
    /// A HIP call failed.
    #[error("HIP call {call} failed with {name} ({code})")]
    Driver {
        /// The HIP function.
        call: &'static str,
        /// Its `hipError_t`.
        code: i32,
        /// The code's name (`hipGetErrorName`).
        name: String,
    },
    /// A HIP device ordinal that the runtime does not have.
    #[error("HIP device {device} does not exist: the process has {count} HIP device(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        device: i32,
        /// The number of HIP devices of the process (`hipGetDeviceCount`).
        count: i32,
    },
    /// A data pointer lives on another device than the tensor says.
    #[error("data pointer {pointer:#x} belongs to HIP device {found}, expected device {expected}")]
    WrongDevice {
        /// The pointer.
        pointer: u64,
        /// Its device ordinal (`hipPointerGetAttributes`).
        found: i32,
        /// The device the tensor names.
        expected: i32,
    },
    /// A data pointer that is not device memory the HIP runtime knows.
    #[error(
        "data pointer {pointer:#x} is not HIP device memory (hipMemoryType {memory_type}), expected memory of HIP device {expected}"
    )]
    NotDeviceMemory {
        /// The pointer.
        pointer: u64,
        /// Its `hipMemoryType` (0: unregistered host memory, 1: host memory).
        memory_type: i32,
        /// The device the tensor names.
        expected: i32,
    },
    /// A stream belongs to another device than the tensor's (`hipStreamGetDevice`).
    #[error(
        "{role} stream {stream:#x} belongs to HIP device {found}, expected device {expected} (the tensor's)"
    )]
    StreamOnOtherDevice {
        /// `"consumer"` or `"producer"`.
        role: &'static str,
        /// The stream handle.
        stream: u64,
        /// The stream's device.
        found: i32,
        /// The device the stream must be of.
        expected: i32,
    },
    /// A borrowed `hipStreamPerThread` named as a producer stream on another thread than the one
    /// that made it ([`HipStream::borrowed`]): there the handle names that thread's per-thread
    /// stream, not the one the producer's work is on.
    #[error(
        "the per-thread default stream (hipStreamPerThread) of another thread was named as a producer stream, expected a stream that names the same stream on every thread (a created stream, or the default stream 0)"
    )]
    PerThreadStreamOnOtherThread,
    /// A stream of one API named for a tensor of the other: a CUDA stream as a producer
    /// stream of a ROCm tensor, or a HIP stream for a CUDA tensor.
    #[error(
        "a {found} stream was named as a producer stream of a {device} tensor, expected a {expected} stream"
    )]
    ForeignStream {
        /// The stream's API: `"CUDA"` or `"HIP"`.
        found: &'static str,
        /// The API the tensor's device needs.
        expected: &'static str,
        /// The tensor's device.
        device: Device,
    },
    /// A stream being captured into a HIP graph where `operation` needs a stream that runs its
    /// work now. Asked with `hipStreamIsCapturing` before the operation: HIP before ROCm 7.14
    /// would not report the error, and the capture would be silently invalidated.
    #[error(
        "{operation} cannot be done on HIP stream {stream:#x}, which is being captured into a HIP graph (captured work runs only at each launch of the graph): {instead}"
    )]
    Capturing {
        /// The stream handle.
        stream: u64,
        /// What could not be done.
        operation: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// Ready events of one API waited on by a stream of the other: the events of a CUDA export
    /// by a HIP stream, or of a ROCm export by a CUDA stream (`ReadyEvents`).
    #[error(
        "ready events of {found} work cannot be waited on by a {expected} stream, expected a stream of the API of the tensor they came with"
    )]
    ForeignEvents {
        /// The events' API: `"CUDA"` or `"HIP"`.
        found: &'static str,
        /// The waiting stream's API.
        expected: &'static str,
    },
    /// The stream-ordered release thread has stopped (`release_after`): the tensor was
    /// released at once after host waits.
    #[error(
        "the stream-ordered release thread has stopped; the tensor was released at once after a host synchronization"
    )]
    ReaperGone,
    /// The null (default) stream while a blocking stream of its device is being captured: work
    /// on it would join that capture and invalidate it (`hipErrorStreamCaptureImplicit`).
    #[error(
        "the default stream (stream=None or 0) cannot be ordered while a blocking stream of its device is being captured into a HIP graph (hipErrorStreamCaptureImplicit), expected the capturing stream itself as the consumer's stream, or stream=-1 with the order kept by the caller"
    )]
    DefaultStreamUnderCapture,
}

/// The HIP runtime, loaded and initialized (`hipInit`) once per process; later calls return the
/// first call's result.
///
/// # Errors
///
/// [`HipError::NoDriver`] when `libamdhip64` cannot be loaded; [`HipError::MissingSymbol`];
/// [`HipError::Driver`] when `hipInit` fails.
pub(crate) fn api() -> Result<&'static Api, HipError> {
    static API: OnceLock<Result<Api, HipError>> = OnceLock::new();
    API.get_or_init(|| {
        let api = sys::load()?;
        // SAFETY: `hipInit` takes flags, which must be 0.
        check("hipInit", unsafe { (api.hipInit)(0) }, &api)?;
        Ok(api)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether `code` is an error of a stream capture that forbade the call now
/// (`hipErrorStreamCaptureUnsupported`, `Invalidated`, `Implicit`, `WrongThread`): the call may
/// succeed once the capture has ended.
pub(crate) fn is_capture_error(code: hipError_t) -> bool {
    matches!(
        code,
        sys::ERROR_STREAM_CAPTURE_UNSUPPORTED
            | sys::ERROR_STREAM_CAPTURE_INVALIDATED
            | sys::ERROR_STREAM_CAPTURE_IMPLICIT
            | sys::ERROR_STREAM_CAPTURE_WRONG_THREAD
    )
}

/// Loads and initializes the HIP runtime, once per process.
///
/// # Errors
///
/// [`HipError::NoDriver`] without ROCm; [`HipError::MissingSymbol`]; [`HipError::Driver`] when
/// `hipInit` fails.
pub fn init() -> Result<(), HipError> {
    api().map(drop)
}

/// `code` as a result: [`HipError::Driver`] naming `call` and the code's name.
fn check(call: &'static str, code: hipError_t, api: &Api) -> Result<(), HipError> {
    if code == SUCCESS {
        return Ok(());
    }
    // SAFETY: `hipGetErrorName` takes any code and returns a static NUL-terminated string, or
    // NULL.
    let name = unsafe { (api.hipGetErrorName)(code) };
    let name = if name.is_null() {
        format!("hipError_t {code}")
    } else {
        // SAFETY: a non-NULL result is a static NUL-terminated string (`hip_runtime_api.h`).
        unsafe { core::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    };
    Err(HipError::Driver { call, code, name })
}

/// The number of HIP devices of the process (`hipGetDeviceCount`).
///
/// # Errors
///
/// [`HipError::NoDriver`] without ROCm; [`HipError::Driver`].
pub fn device_count() -> Result<i32, HipError> {
    let api = api()?;
    let mut count = 0;
    check(
        "hipGetDeviceCount",
        // SAFETY: a valid out-pointer.
        unsafe { (api.hipGetDeviceCount)(&mut count) },
        api,
    )?;
    Ok(count)
}

/// Restores the thread's current HIP device when dropped: PyTorch and CuPy on ROCm follow the
/// thread's current device, so every entry point leaves it as it found it.
pub(crate) struct CurrentDevice {
    api: &'static Api,
    saved: Option<i32>,
}

impl CurrentDevice {
    /// Saves the thread's current device.
    pub(crate) fn save() -> Result<Self, HipError> {
        let api = api()?;
        let mut device = 0;
        // SAFETY: a valid out-pointer.
        let saved = (unsafe { (api.hipGetDevice)(&mut device) } == SUCCESS).then_some(device);
        Ok(Self { api, saved })
    }

    /// Makes `device` current on this thread (`hipSetDevice`).
    ///
    /// # Errors
    ///
    /// [`HipError::NoSuchDevice`] for an ordinal the runtime does not have;
    /// [`HipError::Driver`].
    pub(crate) fn set(&self, device: i32) -> Result<(), HipError> {
        // SAFETY: `hipSetDevice` takes any ordinal and refuses unknown ones.
        let code = unsafe { (self.api.hipSetDevice)(device) };
        if code == sys::ERROR_INVALID_DEVICE || (code == sys::ERROR_INVALID_VALUE && device < 0) {
            return Err(HipError::NoSuchDevice {
                device,
                count: device_count()?,
            });
        }
        check("hipSetDevice", code, self.api)
    }
}

impl Drop for CurrentDevice {
    fn drop(&mut self) {
        if let Some(device) = self.saved {
            // SAFETY: `device` was current on this thread when saved.
            let _ = unsafe { (self.api.hipSetDevice)(device) };
        }
    }
}

/// The device a live stream belongs to (`hipStreamGetDevice`; the null stream resolves on the
/// current device).
///
/// # Errors
///
/// [`HipError::Driver`] for a handle the runtime refuses.
pub(crate) fn stream_device(stream: hipStream_t) -> Result<i32, HipError> {
    let api = api()?;
    let mut device = -1;
    check(
        "hipStreamGetDevice",
        // SAFETY: `stream` is valid for the call (caller); a valid out-pointer.
        unsafe { (api.hipStreamGetDevice)(stream, &mut device) },
        api,
    )?;
    Ok(device)
}

/// Where a HIP stream stands with graph capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Not being captured: its work runs as it is enqueued.
    Not,
    /// Being captured (valid or invalidated), in the capture sequence `id`.
    Active {
        /// The capture sequence (`hipStreamGetCaptureInfo`).
        id: u64,
    },
    /// The null stream while a blocking stream of its device is being captured.
    Implicit,
}

/// Where `stream` (valid for the call; the null stream resolves on the current device) stands
/// with graph capture: `hipStreamIsCapturing`, which never invalidates a capture, and the id
/// (`hipStreamGetCaptureInfo`) only for a stream being captured. This is the question asked
/// before every host-side query or synchronization (module docs).
///
/// # Errors
///
/// [`HipError::Driver`] from those calls.
pub(crate) fn capture_of(stream: hipStream_t) -> Result<Capture, HipError> {
    let api = api()?;
    let mut status = sys::CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is valid for the call (caller); a valid out-pointer.
    match unsafe { (api.hipStreamIsCapturing)(stream, &mut status) } {
        SUCCESS => {}
        sys::ERROR_STREAM_CAPTURE_IMPLICIT => return Ok(Capture::Implicit),
        code => check("hipStreamIsCapturing", code, api)?,
    }
    if status == sys::CAPTURE_STATUS_NONE {
        return Ok(Capture::Not);
    }
    let mut id = 0u64;
    check(
        "hipStreamGetCaptureInfo",
        // SAFETY: as above; two valid out-pointers.
        unsafe { (api.hipStreamGetCaptureInfo)(stream, &mut status, &mut id) },
        api,
    )?;
    Ok(Capture::Active { id })
}

/// Refuses a stream being captured (or the null stream while a blocking stream is) where this
/// crate would wait for its work on the host or run work that must run once.
///
/// # Errors
///
/// [`HipError::Capturing`], [`HipError::DefaultStreamUnderCapture`], or those of
/// [`capture_of`].
pub(crate) fn check_not_capturing(
    stream: hipStream_t,
    operation: &'static str,
    instead: &'static str,
) -> Result<(), HipError> {
    match capture_of(stream)? {
        Capture::Not => Ok(()),
        Capture::Active { .. } => Err(HipError::Capturing {
            stream: stream as u64,
            operation,
            instead,
        }),
        Capture::Implicit => Err(HipError::DefaultStreamUnderCapture),
    }
}

/// The device that owns the device memory at `pointer` (`hipPointerGetAttributes`).
///
/// # Errors
///
/// [`HipError::NotDeviceMemory`] for host or unknown memory; [`HipError::Driver`].
pub fn pointer_device(pointer: u64, expected: i32) -> Result<i32, HipError> {
    let api = api()?;
    let mut attributes = sys::hipPointerAttribute_t::default();
    // SAFETY: a valid out-pointer of the ROCm 6 layout; the runtime only reads its own tables
    // for `pointer`.
    let code = unsafe {
        (api.hipPointerGetAttributes)(&mut attributes, pointer as usize as *const c_void)
    };
    // Before ROCm 6 an unknown host pointer was `hipErrorInvalidValue`; from 6 on it is
    // `hipSuccess` with `hipMemoryTypeUnregistered`. Both mean: not device memory.
    if code == sys::ERROR_INVALID_VALUE {
        return Err(HipError::NotDeviceMemory {
            pointer,
            memory_type: 0,
            expected,
        });
    }
    check("hipPointerGetAttributes", code, api)?;
    match attributes.type_ {
        sys::MEMORY_TYPE_DEVICE | sys::MEMORY_TYPE_MANAGED | sys::MEMORY_TYPE_UNIFIED => {
            Ok(attributes.device)
        }
        memory_type => Err(HipError::NotDeviceMemory {
            pointer,
            memory_type,
            expected,
        }),
    }
}

/// Checks that `pointer` is device memory of HIP device `expected`.
///
/// # Errors
///
/// [`HipError::WrongDevice`], or those of [`pointer_device`].
pub fn check_pointer(pointer: u64, expected: i32) -> Result<(), HipError> {
    let found = pointer_device(pointer, expected)?;
    if found == expected {
        Ok(())
    } else {
        Err(HipError::WrongDevice {
            pointer,
            found,
            expected,
        })
    }
}

/// Checks that a stream handle (valid for the call; NULL is the default stream of `expected`,
/// which passes) belongs to HIP device `expected`, as `role` (`"consumer"` or `"producer"`).
///
/// # Errors
///
/// [`HipError::StreamOnOtherDevice`]; [`HipError::Driver`] for a handle the runtime refuses.
pub(crate) fn check_stream(
    stream: hipStream_t,
    expected: i32,
    role: &'static str,
) -> Result<(), HipError> {
    if stream.is_null() {
        return Ok(());
    }
    let found = stream_device(stream)?;
    if found == expected {
        Ok(())
    } else {
        Err(HipError::StreamOnOtherDevice {
            role,
            stream: stream as u64,
            found,
            expected,
        })
    }
}

/// Checks that a producer stream belongs to HIP device `expected`: first the device the
/// [`HipStream`] names ([`HipStream::device`]), whatever its handle (a default stream, NULL, of
/// another device, or of a device the runtime does not have, names no work of `expected`'s),
/// then the device of its handle ([`check_stream`]). A borrowed `hipStreamPerThread` is
/// refused on another thread than its own.
///
/// # Errors
///
/// [`HipError::PerThreadStreamOnOtherThread`]; [`HipError::StreamOnOtherDevice`] (role
/// `"producer"`); [`HipError::Driver`] for a handle the runtime refuses.
pub(crate) fn check_producer_stream(stream: &HipStream, expected: i32) -> Result<(), HipError> {
    if !stream.on_its_thread() {
        return Err(HipError::PerThreadStreamOnOtherThread);
    }
    if stream.device() != expected {
        return Err(HipError::StreamOnOtherDevice {
            role: "producer",
            stream: stream.raw() as u64,
            found: stream.device(),
            expected,
        });
    }
    check_stream(stream.raw(), expected, "producer")
}

/// Makes this thread's stream-capture mode relaxed (`hipThreadExchangeStreamCaptureMode`): a
/// global-mode capture on another thread then neither forbids this thread's waits nor is
/// invalidated by them. For the stream-ordered release thread only.
///
/// # Errors
///
/// [`HipError::NoDriver`]; [`HipError::Driver`].
pub(crate) fn relax_capture_mode() -> Result<(), HipError> {
    let api = api()?;
    let mut mode = sys::CAPTURE_MODE_RELAXED;
    check(
        "hipThreadExchangeStreamCaptureMode",
        // SAFETY: a valid in/out pointer; affects this thread only.
        unsafe { (api.hipThreadExchangeStreamCaptureMode)(&mut mode) },
        api,
    )
}
