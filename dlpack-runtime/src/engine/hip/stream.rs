//! HIP streams ([`HipStream`]), events, the event dependency of a hand-off and host waits.

use core::ffi::c_void;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::sys::{self, hipEvent_t, hipStream_t};
use super::{Capture, CurrentDevice, HipError, api, capture_of, check, check_not_capturing};
use crate::engine::cuda::detached;
use crate::plan::stream::StreamRequest;

/// A HIP stream of one device: owned (made by [`HipStream::new`], destroyed on drop with its
/// device current) or borrowed (a handle of another library, [`HipStream::borrowed`], or the
/// device's default stream, [`HipStream::default_stream`]: never destroyed).
///
/// As a `#[dlpack(stream)]` field (`HipStream`, `Arc<HipStream>`, `Option` of either) it names
/// pending work on a ROCm tensor: the consumer's stream is made to wait on an event recorded on
/// it (`hipEventRecord`, `hipStreamWaitEvent`); the host never blocks. On a host (`cpu`)
/// tensor it names the stream's pending writes into host memory (a copy to the host, a host
/// function): the export waits on the host for the stream (`hipStreamSynchronize`, its capture
/// status asked first, the GIL released meanwhile) before anything reads the memory.
#[derive(Debug)]
pub struct HipStream {
    /// The `hipStream_t`, as an address (NULL: the device's default stream).
    raw: usize,
    device: i32,
    owned: bool,
    /// For `hipStreamPerThread`: the thread whose per-thread default stream it names.
    thread: Option<std::thread::ThreadId>,
}

impl HipStream {
    /// A new blocking stream of HIP device `device` (`hipStreamCreateWithFlags`,
    /// `hipStreamDefault`: it synchronizes with the default stream).
    ///
    /// # Errors
    ///
    /// [`HipError::NoDriver`] without ROCm; [`HipError::NoSuchDevice`]; [`HipError::Driver`].
    pub fn new(device: i32) -> Result<Self, HipError> {
        Self::with_flags(device, 0)
    }

    /// A new non-blocking stream of HIP device `device` (`hipStreamNonBlocking`: it does not
    /// synchronize with the default stream).
    ///
    /// # Errors
    ///
    /// As [`HipStream::new`].
    pub fn new_non_blocking(device: i32) -> Result<Self, HipError> {
        Self::with_flags(device, sys::STREAM_NON_BLOCKING)
    }

    fn with_flags(device: i32, flags: u32) -> Result<Self, HipError> {
        let api = api()?;
        let current = CurrentDevice::save()?;
        current.set(device)?;
        let mut raw: hipStream_t = core::ptr::null_mut();
        check(
            "hipStreamCreateWithFlags",
            // SAFETY: a valid out-pointer; the flags are `hipStreamDefault` or
            // `hipStreamNonBlocking`; the stream belongs to the current device, `device`.
            unsafe { (api.hipStreamCreateWithFlags)(&mut raw, flags) },
            api,
        )?;
        Ok(Self {
            raw: raw as usize,
            device,
            owned: true,
            thread: None,
        })
    }

    /// A stream of another library (a `hipStream_t` it owns), never destroyed by this value.
    /// `hipStreamPerThread` (2) names the calling thread's per-thread default stream: as a
    /// producer stream on another thread, where the handle would name that thread's stream, the
    /// export is refused ([`HipError::PerThreadStreamOnOtherThread`]).
    ///
    /// # Safety
    ///
    /// `raw` is a live stream of HIP device `device` (or NULL, its default stream), and stays
    /// alive as long as this value and every export that names it. For `hipStreamPerThread`
    /// (2), the value and every buffer made on it ([`HipSlice`]) are used on the calling thread
    /// only, and dropped on another thread only once the calling thread's per-thread stream has
    /// finished their work: on another thread the handle names that thread's stream, unordered
    /// with this one's.
    ///
    /// [`HipSlice`]: crate::hip::HipSlice
    pub unsafe fn borrowed(device: i32, raw: *mut c_void) -> Self {
        Self {
            raw: raw as usize,
            device,
            owned: false,
            thread: (raw as usize == sys::STREAM_PER_THREAD).then(|| std::thread::current().id()),
        }
    }

    /// The default (null) stream of HIP device `device`, with the legacy default stream's
    /// implicit synchronization with blocking streams. As a producer stream it names work of
    /// `device` alone: named for a tensor of another device (or `device` is one the runtime
    /// does not have), the export is refused with [`HipError::StreamOnOtherDevice`], as for any
    /// stream whose [`HipStream::device`] is not the tensor's.
    pub fn default_stream(device: i32) -> Self {
        Self {
            raw: 0,
            device,
            owned: false,
            thread: None,
        }
    }

    /// Whether the handle names the same stream on the calling thread as where it was made:
    /// false only for a borrowed `hipStreamPerThread` on another thread.
    pub(crate) fn on_its_thread(&self) -> bool {
        self.thread
            .is_none_or(|thread| thread == std::thread::current().id())
    }

    /// The `hipStream_t` (NULL for the default stream): the value a consumer passes as
    /// `stream=` to `__dlpack__` (`0` names the default stream on ROCm).
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// The HIP device ordinal of the stream.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Whether the stream is being captured into a HIP graph (`hipStreamIsCapturing`, which
    /// never invalidates a capture).
    ///
    /// # Errors
    ///
    /// [`HipError::NoDriver`]; [`HipError::Driver`].
    pub fn is_capturing(&self) -> Result<bool, HipError> {
        let current = CurrentDevice::save()?;
        current.set(self.device)?;
        Ok(capture_of(self.raw())? != Capture::Not)
    }

    /// Blocks the host until the stream has finished its work (`hipStreamSynchronize`), with the
    /// GIL released meanwhile where this thread holds it.
    ///
    /// # Errors
    ///
    /// [`HipError::Capturing`] for a stream being captured, asked before the wait (HIP before
    /// ROCm 7.14 would return success and invalidate the capture);
    /// [`HipError::DefaultStreamUnderCapture`];
    /// [`HipError::PerThreadStreamOnOtherThread`] for a borrowed `hipStreamPerThread` on another
    /// thread than its own; [`HipError::Driver`].
    pub fn synchronize(&self) -> Result<(), HipError> {
        if !self.on_its_thread() {
            return Err(HipError::PerThreadStreamOnOtherThread);
        }
        synchronize_streams(self.device, &[self.raw()])
    }
}

impl Drop for HipStream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let Ok(api) = api() else { return };
        let Ok(current) = CurrentDevice::save() else {
            return;
        };
        if current.set(self.device).is_ok() {
            // SAFETY: the stream is ours (made by `with_flags`), used no more; its device is
            // current. A failure leaves nothing to do (errors in drop are not raised).
            let _ = unsafe { (api.hipStreamDestroy)(self.raw()) };
        }
    }
}

/// An event of one HIP device (timing disabled), taken from a per-device pool and returned to
/// it when dropped: after warm-up an exchange creates no event. An event that a stream being
/// captured waited on (`hipEventWaitExternal`: every launch of the graph waits for its most
/// recent record) is never recorded again: it is destroyed, not pooled, when its holder lets it
/// go, so the graph sees the one record it was made with for as long as its holder keeps it.
#[derive(Debug)]
pub(crate) struct HipEvent {
    raw: hipEvent_t,
    device: i32,
    /// Whether a captured graph waits on the event (see the type's docs).
    captured: AtomicBool,
}

/// Free events of each HIP device, as addresses. The pool only grows to the number of events
/// in flight at once; its events live for the whole process (HIP devices are never destroyed
/// by this crate).
fn pool() -> &'static Mutex<HashMap<i32, Vec<usize>>> {
    static POOL: OnceLock<Mutex<HashMap<i32, Vec<usize>>>> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

// SAFETY: HIP events are plain runtime handles, usable from any thread; a shared event is only
// waited on (`hipStreamWaitEvent`, `hipEventSynchronize`): it was recorded before it was shared.
unsafe impl Send for HipEvent {}
// SAFETY: as above.
unsafe impl Sync for HipEvent {}

impl HipEvent {
    /// An event of the current device: one from the device's pool, or a new one
    /// (`hipEventCreateWithFlags`, `hipEventDisableTiming`) when the pool is empty.
    pub(crate) fn new() -> Result<Self, HipError> {
        let api = api()?;
        let mut device = 0;
        check(
            "hipGetDevice",
            // SAFETY: a valid out-pointer.
            unsafe { (api.hipGetDevice)(&mut device) },
            api,
        )?;
        let reused = pool()
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(&device).and_then(Vec::pop));
        let raw = match reused {
            Some(raw) => raw as hipEvent_t,
            None => {
                let mut raw: hipEvent_t = core::ptr::null_mut();
                check(
                    "hipEventCreateWithFlags",
                    // SAFETY: a valid out-pointer; a documented flag.
                    unsafe { (api.hipEventCreateWithFlags)(&mut raw, sys::EVENT_DISABLE_TIMING) },
                    api,
                )?;
                raw
            }
        };
        Ok(Self {
            raw,
            device,
            captured: AtomicBool::new(false),
        })
    }

    /// A new event of the current device, recorded on `stream` (valid for the call, of that
    /// device).
    pub(crate) fn recorded(stream: hipStream_t) -> Result<Self, HipError> {
        let event = Self::new()?;
        event.record(stream)?;
        Ok(event)
    }

    /// Records the event on `stream` (valid for the call, of the event's device).
    pub(crate) fn record(&self, stream: hipStream_t) -> Result<(), HipError> {
        let api = api()?;
        check(
            "hipEventRecord",
            // SAFETY: a live event of ours; `stream` is valid for the call (caller).
            unsafe { (api.hipEventRecord)(self.raw, stream) },
            api,
        )
    }

    /// Makes `stream` (valid for the call, of any device) wait for the event's recorded work
    /// (`hipStreamWaitEvent`): the host does not block. `external` for a stream being captured
    /// and an event recorded outside the capture (`hipEventWaitExternal`: the graph gets a wait
    /// node, and every launch waits for the event's record); flags 0 otherwise.
    pub(crate) fn wait_on(&self, stream: hipStream_t, external: bool) -> Result<(), HipError> {
        let api = api()?;
        let flags = if external {
            // Every launch of the graph waits for the event's most recent record: it is never
            // recorded again.
            self.captured.store(true, Ordering::Relaxed);
            sys::EVENT_WAIT_EXTERNAL
        } else {
            0
        };
        check(
            "hipStreamWaitEvent",
            // SAFETY: a live, recorded event of ours; `stream` is valid for the call (caller);
            // a documented flag.
            unsafe { (api.hipStreamWaitEvent)(stream, self.raw, flags) },
            api,
        )
    }

    /// Blocks the host until the event's recorded work has completed (`hipEventSynchronize`),
    /// with the GIL released meanwhile where this thread holds it. The event was recorded
    /// outside any capture (the only events this crate hands out), so no capture can be
    /// invalidated by the wait.
    pub(crate) fn synchronize(&self) -> Result<(), HipError> {
        let api = api()?;
        let raw = self.raw as usize;
        let wait = move || {
            check(
                "hipEventSynchronize",
                // SAFETY: a live event of ours, recorded outside any capture.
                unsafe { (api.hipEventSynchronize)(raw as hipEvent_t) },
                api,
            )
        };
        // SAFETY: one HIP call; nothing touches Python.
        unsafe { detached(wait) }
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // `hipStreamWaitEvent` took the event's state when it was called, so a stream waiting
        // on it is unaffected by a later record, or by its destruction.
        if !*self.captured.get_mut() {
            if let Ok(mut pool) = pool().lock() {
                pool.entry(self.device).or_default().push(self.raw as usize);
                return;
            }
        }
        if let Ok(api) = api() {
            // SAFETY: our event, used no more.
            let _ = unsafe { (api.hipEventDestroy)(self.raw) };
        }
    }
}

/// Orders the work pending on each of `producers` (live streams of HIP device `device`) before
/// the consumer's stream `consumer` (valid for the call, of `device`; NULL its default
/// stream): an event recorded on each producer stream other than the consumer's, which the
/// consumer's stream waits on (`hipEventRecord`, `hipStreamWaitEvent`). The host never blocks.
///
/// Returns what the consumer's stream is ready after, for whoever the tensor is lent to next:
/// each event recorded outside any capture, and one recorded on a producer stream that is the
/// consumer's own (unless it is being captured). An event recorded inside a capture can be
/// waited on only inside it and is not returned.
///
/// Capture status is asked of both streams first (`hipStreamIsCapturing`): a consumer stream
/// being captured waits as part of the capture, and every launch of its graph waits for the
/// event's one record (the caller keeps the returned events as long as the graph may be
/// launched: they are never recorded again); a producer stream captured in the same capture
/// gets an event inside it; a producer stream captured apart from the consumer is refused
/// ([`HipError::Capturing`]), as is the default stream while a blocking stream of the device
/// is captured ([`HipError::DefaultStreamUnderCapture`]). The thread's current device is left
/// as it was.
///
/// # Errors
///
/// As above; [`HipError::Driver`] from the runtime.
pub(crate) fn order_before(
    device: i32,
    producers: &[hipStream_t],
    consumer: hipStream_t,
) -> Result<Vec<HipEvent>, HipError> {
    order_before_on(device, producers, device, consumer)
}

/// [`order_before`], with the consumer's stream `consumer` on HIP device `consumer_device`
/// (a copy to another device: `hipStreamWaitEvent` takes an event of any device). Each event
/// is recorded with its producer's device current; the consumer's stream is asked about and
/// waits with its own device current (the default stream resolves there).
///
/// # Errors
///
/// As [`order_before`].
pub(crate) fn order_before_on(
    device: i32,
    producers: &[hipStream_t],
    consumer_device: i32,
    consumer: hipStream_t,
) -> Result<Vec<HipEvent>, HipError> {
    let current = CurrentDevice::save()?;
    current.set(consumer_device)?;
    let consumer_capture = capture_of(consumer)?;
    current.set(device)?;
    if consumer_capture == Capture::Implicit {
        return Err(HipError::DefaultStreamUnderCapture);
    }
    let mut seen: Vec<hipStream_t> = Vec::with_capacity(producers.len());
    let mut kept = Vec::with_capacity(producers.len());
    for &producer in producers {
        if seen.contains(&producer) {
            continue;
        }
        seen.push(producer);
        if producer == consumer && consumer_device == device {
            // Stream order alone orders the consumer; an event for whoever the tensor is lent
            // to next, unless the stream is being captured.
            if consumer_capture == Capture::Not {
                kept.push(HipEvent::recorded(producer)?);
            }
            continue;
        }
        let outside = match (capture_of(producer)?, consumer_capture) {
            (Capture::Implicit, _) | (_, Capture::Implicit) => {
                return Err(HipError::DefaultStreamUnderCapture);
            }
            (Capture::Active { id: p }, Capture::Active { id: c }) if p == c => false,
            (Capture::Active { .. }, _) => {
                return Err(HipError::Capturing {
                    stream: producer as u64,
                    operation: "ordering the producer's captured work before a consumer outside its capture",
                    instead: "export after the capture ends (and after a launch of its graph), or to a stream of the same capture",
                });
            }
            (Capture::Not, _) => true,
        };
        let event = HipEvent::recorded(producer)?;
        if consumer_device != device {
            current.set(consumer_device)?;
        }
        event.wait_on(consumer, outside && consumer_capture != Capture::Not)?;
        if consumer_device != device {
            current.set(device)?;
        }
        if outside {
            kept.push(event);
        }
    }
    Ok(kept)
}

/// Records one event on each of `streams` (live streams of HIP device `device`; NULL its
/// default stream), refusing a stream being captured first: an event recorded in a capture can
/// be waited on only inside it. The thread's current device is left as it was.
///
/// # Errors
///
/// [`HipError::Capturing`], [`HipError::DefaultStreamUnderCapture`]; [`HipError::Driver`].
pub(crate) fn record_events(
    device: i32,
    streams: &[hipStream_t],
) -> Result<Vec<HipEvent>, HipError> {
    let current = CurrentDevice::save()?;
    current.set(device)?;
    streams
        .iter()
        .map(|&stream| {
            check_not_capturing(
                stream,
                "recording ready events",
                "record them before the capture begins or after it ends",
            )?;
            HipEvent::recorded(stream)
        })
        .collect()
}

/// Orders a producer's work on its raw stream `producer` (a C exchange API's
/// `current_work_stream` for `kDLROCM`, a live stream of HIP device `device`; NULL is its
/// default stream) before the consumer's `request`, as [`order_before`] does: an event recorded
/// on `producer` that the consumer's stream waits on (the host does not block), nothing for the
/// same stream or `stream=-1`. A host consumer ([`StreamRequest::Host`]) waits on the host
/// ([`synchronize_streams`]). The consumer's stream is checked to belong to `device` first. A
/// consumer stream being captured waits at every launch of its graph on an event kept for the
/// process's lifetime, so nothing is returned for the import to keep.
///
/// # Errors
///
/// [`HipError::StreamOnOtherDevice`] for a consumer stream of another device; those of
/// [`order_before`] and [`synchronize_streams`].
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn order_raw(
    device: i32,
    producer: hipStream_t,
    request: StreamRequest,
) -> Result<(), HipError> {
    let consumer: hipStream_t = match request {
        StreamRequest::NoSync => return Ok(()),
        StreamRequest::Host => return synchronize_streams(device, &[producer]),
        StreamRequest::LegacyDefault => core::ptr::null_mut(),
        // `hipStreamPerThread`; the ROCm column of the stream table names no such value, but a
        // request may still carry it.
        StreamRequest::PerThreadDefault => 2 as hipStream_t,
        StreamRequest::Handle(handle) => handle.get() as usize as hipStream_t,
    };
    if consumer == producer {
        return Ok(());
    }
    super::check_stream(consumer, device, "consumer")?;
    let kept = order_before(device, &[producer], consumer)?;
    let current = CurrentDevice::save()?;
    current.set(device)?;
    if capture_of(consumer)? != Capture::Not {
        // Every launch of the consumer's graph waits on the event's one record, and nothing
        // here keeps it for the import: kept for the process's lifetime.
        core::mem::forget(kept);
    }
    Ok(())
}

/// Blocks the host until each of `streams` (live streams of HIP device `device`; NULL its
/// default stream) has finished (`hipStreamSynchronize`), with the GIL released meanwhile where
/// this thread holds it. Each stream's capture status is asked first: a stream being captured
/// is refused before any wait ([`HipError::Capturing`]), since HIP before ROCm 7.14 would
/// return success and silently invalidate the capture. The thread's current device is left as
/// it was.
///
/// # Errors
///
/// As above; [`HipError::Driver`] from the runtime.
pub(crate) fn synchronize_streams(device: i32, streams: &[hipStream_t]) -> Result<(), HipError> {
    let api = api()?;
    let current = CurrentDevice::save()?;
    current.set(device)?;
    for &stream in streams {
        check_not_capturing(
            stream,
            "a host wait for the producer's work",
            "read on the host after the capture ends, or pass the capturing stream as the consumer's stream",
        )?;
    }
    for &stream in streams {
        let stream = stream as usize;
        let wait = move || {
            check(
                "hipStreamSynchronize",
                // SAFETY: `stream` is a live stream of the current device (caller), not capturing
                // (checked above).
                unsafe { (api.hipStreamSynchronize)(stream as hipStream_t) },
                api,
            )
        };
        // SAFETY: one HIP call; nothing touches Python.
        unsafe { detached(wait) }?;
    }
    Ok(())
}
