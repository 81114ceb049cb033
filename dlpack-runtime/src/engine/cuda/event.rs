//! Events: the per-context pool, event dependencies between streams, the plans of the stream
//! tier carried out, and [`ReadyEvents`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use super::{
    Capture, CudaError, CurrentContext, HostWait, bind, capture_of, check_consumer_stream, context,
    driver_error, init, raw_stream, stream_context, stream_id,
};
use crate::plan::stream::{StreamId, StreamRequest, SyncPlan};

/// A raw event (timing disabled) and the context it was created in. Pooled events live for the
/// whole process: the pool only grows to the number of events in flight at once.
#[derive(Debug, Clone, Copy)]
struct RawEvent {
    event: sys::CUevent,
    ctx: sys::CUcontext,
    /// Whether the event goes back to the pool: events of primary contexts, which this crate
    /// keeps retained (so their events outlive every user of the context). Events of other
    /// contexts are destroyed after use: their context may be destroyed with them.
    pooled: bool,
}

// SAFETY: CUDA events and contexts are plain driver handles, usable from any thread.
unsafe impl Send for RawEvent {}
// SAFETY: as above; the driver API is thread-safe, and a shared event is only waited on
// (`cuStreamWaitEvent`, `cuEventSynchronize`): it was recorded before it was shared.
unsafe impl Sync for RawEvent {}

type Pool = Mutex<HashMap<usize, Vec<RawEvent>>>;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

static CREATED: AtomicUsize = AtomicUsize::new(0);

/// Events created by the pool so far, in this process. After warm-up an exchange takes its
/// events from the pool, so this stays constant.
pub fn events_created() -> usize {
    CREATED.load(Ordering::Relaxed)
}

/// An event taken from the per-context pool; returned to it when dropped, unless a stream
/// being captured into a CUDA graph waited on it (then destroyed). Driven with raw driver
/// calls: no error recorded on a cudarc context by unrelated work can fail them.
#[derive(Debug)]
pub(crate) struct PooledEvent {
    raw: RawEvent,
    /// Whether a captured graph waits on the event (`CU_EVENT_WAIT_EXTERNAL`): every launch of
    /// the graph waits for its most recent record, so it is never recorded again, and is
    /// destroyed, not pooled, when its holder lets it go.
    captured: AtomicBool,
}

impl PooledEvent {
    /// Takes an event of `ctx` from the pool, creating one (timing disabled) if it is empty.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when an event cannot be created.
    pub(crate) fn take(ctx: &CudaContext) -> Result<Self, CudaError> {
        let pooled = ctx.is_primary();
        if pooled {
            // Keeps the primary context retained for the process, so that pooled events are
            // never destroyed by a reset of the context when its users let it go.
            context(ctx.ordinal() as i32)?;
            let key = ctx.cu_ctx() as usize;
            let reused = pool()
                .lock()
                .ok()
                .and_then(|mut p| p.get_mut(&key).and_then(Vec::pop));
            if let Some(raw) = reused {
                return Ok(Self::new(raw));
            }
        }
        let _current = CurrentContext::save();
        bind(ctx.cu_ctx())?;
        let mut event: sys::CUevent = core::ptr::null_mut();
        // Timing disabled (cheapest), blocking sync: a host wait on it yields the CPU.
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as core::ffi::c_uint
            | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as core::ffi::c_uint;
        // SAFETY: a valid out-pointer; the context is current.
        unsafe { sys::cuEventCreate(&mut event, flags) }
            .result()
            .map_err(driver_error("cuEventCreate"))?;
        CREATED.fetch_add(1, Ordering::Relaxed);
        Ok(Self::new(RawEvent {
            event,
            ctx: ctx.cu_ctx(),
            pooled,
        }))
    }

    fn new(raw: RawEvent) -> Self {
        Self {
            raw,
            captured: AtomicBool::new(false),
        }
    }

    /// The raw event handle.
    pub(crate) fn cu_event(&self) -> sys::CUevent {
        self.raw.event
    }

    /// Records the event on `stream`, a stream of the event's context valid for the call.
    pub(crate) fn record_on(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.raw.ctx)?;
        // SAFETY: a live event of the bound context; `stream` is of that context (caller).
        unsafe { result::event::record(self.raw.event, stream) }
            .map_err(driver_error("cuEventRecord"))
    }

    /// Blocks the host until the event has completed.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.raw.ctx)?;
        // A live event of the current context.
        HostWait::Event(self.raw.event).run()
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if self.raw.pooled && !*self.captured.get_mut() {
            if let Ok(mut pool) = pool().lock() {
                pool.entry(self.raw.ctx as usize)
                    .or_default()
                    .push(self.raw);
            }
        } else {
            // SAFETY: the event is ours and used no more; a failure (its context is gone,
            // destroying it already) leaves nothing to do.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw.event) };
        }
    }
}

/// How a consumer's stream waits on an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// `CU_EVENT_WAIT_DEFAULT`: the stream runs its work now, or the event was recorded in the
    /// same capture as the stream's.
    Now,
    /// `CU_EVENT_WAIT_EXTERNAL`: the stream is being captured into a graph and the event was
    /// recorded outside the capture. The graph gets an event-wait node: each launch waits for
    /// the event's most recent record (`cuStreamWaitEvent`, `cuGraphAddEventWaitNode`).
    External,
}

/// How the consumer's stream `consumer` (the special handles resolve in `primary`) waits on
/// an event recorded outside any capture; binds the stream's context. Restores nothing: the
/// caller holds a [`CurrentContext`].
///
/// # Errors
///
/// [`CudaError::LegacyStreamUnderCapture`] for the legacy default stream while a blocking
/// stream of its context is being captured; [`CudaError::Driver`] from the driver.
fn outside_wait(consumer: StreamId, primary: sys::CUcontext) -> Result<Wait, CudaError> {
    match consumer {
        StreamId::Handle(h) => bind(stream_context(h.get() as sys::CUstream)?)?,
        _ => bind(primary)?,
    }
    match capture_of(raw_stream(consumer))? {
        Capture::Not => Ok(Wait::Now),
        Capture::Active { .. } => Ok(Wait::External),
        Capture::Implicit => Err(CudaError::LegacyStreamUnderCapture),
    }
}

/// Makes the `consumer` stream wait for a recorded `event`, with the stream's own context bound
/// (`primary`, the device's primary context, for the special handles). Restores nothing: the
/// caller holds a [`CurrentContext`].
fn wait_for(
    event: &PooledEvent,
    consumer: StreamId,
    primary: sys::CUcontext,
    how: Wait,
) -> Result<(), CudaError> {
    match consumer {
        StreamId::Handle(h) => bind(stream_context(h.get() as sys::CUstream)?)?,
        _ => bind(primary)?,
    }
    let flags = match how {
        Wait::Now => sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        Wait::External => {
            // Every launch of the graph waits for the event's most recent record: it is never
            // recorded again (nor pooled) from here on.
            event.captured.store(true, Ordering::Relaxed);
            sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL
        }
    };
    // SAFETY: the consumer's stream is valid for the duration of this call (the `stream`
    // parameter of the array API's `__dlpack__`,
    // https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html);
    // the event is recorded. Outside a capture `cuStreamWaitEvent` takes the event's state now,
    // so the event may be reused once this returns; inside one (`Wait::External`) the graph
    // refers to the event, which is marked never to be reused.
    unsafe { result::stream::wait_event(raw_stream(consumer), event.cu_event(), flags) }
        .map_err(driver_error("cuStreamWaitEvent"))
}

/// Records an event of `ctx` on the producer's stream `producer` (of `ctx`, valid for the
/// call) and makes the consumer's stream `consumer` wait on it, as their captures allow:
///
/// - neither is being captured: an ordinary event dependency;
/// - the consumer's stream is being captured and the producer's is not: an external wait
///   ([`Wait::External`]), part of the graph;
/// - both are captured in the same capture: an event recorded in the capture (an edge of the
///   graph);
/// - the producer's stream is captured and the consumer's is not in that capture: refused
///   ([`CudaError::Capturing`]); the legacy default stream while a blocking stream is captured:
///   refused ([`CudaError::LegacyStreamUnderCapture`]).
///
/// Returns the event when it was recorded outside any capture (what the tensor is ready after,
/// for whoever it is lent to next); `None` for an event recorded inside a capture, which no
/// stream outside it may wait on. Restores nothing: the caller holds a [`CurrentContext`].
fn record_and_wait(
    ctx: &CudaContext,
    producer: sys::CUstream,
    consumer: StreamId,
    consumer_capture: Capture,
    primary: sys::CUcontext,
) -> Result<Option<PooledEvent>, CudaError> {
    bind(ctx.cu_ctx())?;
    let how = match (capture_of(producer)?, consumer_capture) {
        (Capture::Implicit, _) | (_, Capture::Implicit) => {
            return Err(CudaError::LegacyStreamUnderCapture);
        }
        (Capture::Active { id: p }, Capture::Active { id: c }) if p == c => None,
        (Capture::Active { .. }, _) => {
            return Err(CudaError::Capturing {
                stream: producer as u64,
                operation: "ordering the producer's captured work before a consumer outside its capture",
                instead: "export after the capture ends (and after a launch of its graph), or to a stream of the same capture",
            });
        }
        (Capture::Not, Capture::Not) => Some(Wait::Now),
        (Capture::Not, Capture::Active { .. }) => Some(Wait::External),
    };
    let event = PooledEvent::take(ctx)?;
    // `producer` is a live stream of the event's context (caller).
    event.record_on(producer)?;
    wait_for(&event, consumer, primary, how.unwrap_or(Wait::Now))?;
    Ok(how.map(|_| event))
}

/// Orders a producer's work on its raw stream `producer` (a C exchange API's
/// `current_work_stream`, of the primary context of CUDA device `device_id`; NULL is the legacy
/// default stream) before the consumer's `request`: an event recorded on `producer` that the
/// consumer's stream waits on, or nothing for the same stream or `stream=-1`. A host consumer
/// ([`StreamRequest::Host`]) waits on the host. A consumer stream being captured into a graph
/// waits on the event at every launch of the graph: that event is returned, for the imported
/// tensor to keep (it must not be reused while the graph may be launched); otherwise nothing is.
///
/// # Errors
///
/// [`CudaError`] from the probe, the device check of the consumer's stream, the driver, or the
/// captures of the two streams ([`record_and_wait`]).
#[cfg_attr(not(any(feature = "python", test)), allow(dead_code))]
pub(crate) fn order_raw(
    device_id: i32,
    producer: sys::CUstream,
    request: StreamRequest,
) -> Result<ReadyEvents, CudaError> {
    use StreamRequest;
    if request == StreamRequest::NoSync {
        return Ok(ReadyEvents::default());
    }
    let ctx = context(device_id)?;
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx())?;
    let producer = if producer.is_null() {
        raw_stream(StreamId::LegacyDefault)
    } else {
        producer
    };
    let Some(consumer) = StreamId::of_request(request) else {
        // `producer` is the producer's current stream, valid for this call.
        super::check_not_capturing(
            producer,
            "a host wait for the producer's work",
            "read on the host after the capture ends",
        )?;
        return HostWait::Stream(producer)
            .run()
            .map(|()| ReadyEvents::default());
    };
    if raw_stream(consumer) == producer {
        return Ok(ReadyEvents::default());
    }
    check_consumer_stream(consumer, device_id)?;
    let consumer_capture = match outside_wait(consumer, ctx.cu_ctx())? {
        Wait::Now => Capture::Not,
        // The id is only compared with a captured producer stream's.
        Wait::External => capture_of(raw_stream(consumer))?,
    };
    // `producer` is a stream of the primary context, valid for this call (`dlpack.h`,
    // `DLPackExchangeAPI::current_work_stream`).
    let event = record_and_wait(&ctx, producer, consumer, consumer_capture, ctx.cu_ctx())?;
    Ok(match event {
        Some(event) if consumer_capture != Capture::Not => {
            ReadyEvents::of_cuda(vec![Arc::new(event)])
        }
        _ => ReadyEvents::default(),
    })
}

/// Carries out `plan` for the producer streams `pending` (the streams that named the plan's
/// identities, in this call). The thread's current context is left as it was.
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls.
pub(crate) fn execute(plan: &SyncPlan, pending: &[&CudaStream]) -> Result<(), CudaError> {
    execute_for(plan, pending, None)
}

/// [`execute`], with the consumer's stream of an event dependency on CUDA device
/// `consumer_device` (`None`: the producer's device): a stream of another device may wait on an
/// event of the producer's (`cuStreamWaitEvent` takes events of any context), and its special
/// handles resolve in that device's primary context.
///
/// # Errors
///
/// As [`execute`].
pub(crate) fn execute_for(
    plan: &SyncPlan,
    pending: &[&CudaStream],
    consumer_device: Option<i32>,
) -> Result<(), CudaError> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        SyncPlan::EventDependency { record_on, wait_on } => {
            let recorded: Vec<&CudaStream> = pending
                .iter()
                .copied()
                .filter(|s| record_on.contains(&stream_id(s)))
                .collect();
            record_and_order_for(record_on, *wait_on, consumer_device, &recorded).map(drop)
        }
        SyncPlan::HostSync { streams } => {
            init()?;
            let _current = CurrentContext::save();
            for stream in pending
                .iter()
                .copied()
                .filter(|s| streams.contains(&stream_id(s)))
            {
                bind(stream.context().cu_ctx())?;
                // A live stream (borrowed), of the current context.
                HostWait::Stream(stream.cu_stream()).run()?;
            }
            Ok(())
        }
    }
}

/// Carries out an [`SyncPlan::EventDependency`] for the producer streams `pending` (the
/// streams that named the plan's identities, in this call), and returns an event recorded on
/// each distinct pending stream, the consumer's own included: what the tensor is ready after,
/// for whoever it is lent to next. The thread's current context is left as it was.
///
/// Under CUDA graph capture ([`record_and_wait`]): a consumer stream being captured waits on
/// each event as part of the graph, at every launch, and the tensor keeps those events (never
/// reused while it lives); a pending stream that is the consumer's own, or is captured with it,
/// needs no event outside the capture and gets none.
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls; [`CudaError::Capturing`] and
/// [`CudaError::LegacyStreamUnderCapture`] as [`record_and_wait`] says.
pub(crate) fn record_and_order(
    record_on: &[StreamId],
    wait_on: StreamId,
    pending: &[&CudaStream],
) -> Result<ReadyEvents, CudaError> {
    record_and_order_for(record_on, wait_on, None, pending)
}

/// [`record_and_order`], with the consumer's stream `wait_on` on CUDA device
/// `consumer_device` (`None`: the device of the pending streams). Each event is recorded in the
/// context of the stream it is recorded on; the consumer's stream waits with its own context
/// bound.
fn record_and_order_for(
    record_on: &[StreamId],
    wait_on: StreamId,
    consumer_device: Option<i32>,
    pending: &[&CudaStream],
) -> Result<ReadyEvents, CudaError> {
    init()?;
    let _current = CurrentContext::save();
    let Some(first) = pending.first() else {
        return Ok(ReadyEvents::default());
    };
    // The consumer's stream is of the tensor's device, as every pending stream is (checked),
    // unless the consumer named another device (a copy to `dl_device`).
    let primary = context(consumer_device.unwrap_or(first.context().ordinal() as i32))?;
    let consumer_capture = if record_on.is_empty() {
        // Only the consumer's own stream is pending: nothing waits.
        Capture::Not
    } else {
        match outside_wait(wait_on, primary.cu_ctx())? {
            Wait::Now => Capture::Not,
            Wait::External => capture_of(raw_stream(wait_on))?,
        }
    };
    let mut seen: Vec<StreamId> = Vec::with_capacity(pending.len());
    let mut events = Vec::with_capacity(pending.len());
    for stream in pending {
        let id = stream_id(stream);
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        if record_on.contains(&id) {
            // The producer's stream is live (borrowed), of the event's context.
            let kept = record_and_wait(
                stream.context(),
                stream.cu_stream(),
                wait_on,
                consumer_capture,
                primary.cu_ctx(),
            )?;
            events.extend(kept.map(Arc::new));
            continue;
        }
        // The consumer's own stream: nothing to order; an event for whoever the tensor is lent
        // to next, unless the stream is being captured (an event recorded in a capture can only
        // be waited on inside it) or is the legacy stream while another is.
        bind(stream.context().cu_ctx())?;
        if capture_of(stream.cu_stream())? == Capture::Not {
            let event = PooledEvent::take(stream.context())?;
            event.record_on(stream.cu_stream())?;
            events.push(Arc::new(event));
        }
    }
    Ok(ReadyEvents::of_cuda(events))
}

/// Events recorded on a producer's streams at export, owned by the consumer: it may make any of
/// its streams wait on them later ([`ReadyEvents::wait_on`]; with the `hip` feature,
/// `ReadyEvents::wait_on_hip` for the HIP events of a ROCm export), or block the host
/// ([`ReadyEvents::synchronize`]). Beyond the DLPack standard, for Rust-to-Rust exchange.
///
/// The events are of the API of the tensor they came with: CUDA events for CUDA memory, HIP
/// events for ROCm memory (feature `hip`); a stream of the other API cannot wait on them
/// (`HipError::ForeignEvents`).
///
/// Cloning shares the events (each is recorded once and never again while a clone holds it).
///
/// Under graph capture: the events are always recorded outside any capture, and a stream
/// being captured waits on them as part of the graph (`CU_EVENT_WAIT_EXTERNAL` on CUDA): every
/// launch of the graph waits for them. Keep them (and the tensor they come with) alive as long
/// as the graph may be launched; once waited on in a capture, an event is destroyed, never
/// reused, when its last holder drops it (CUDA and HIP events alike).
#[derive(Debug, Default, Clone)]
pub struct ReadyEvents {
    events: Vec<Arc<PooledEvent>>,
    /// The HIP events of a ROCm export (pooled per device, as the CUDA events are).
    #[cfg(feature = "hip")]
    hip: Vec<Arc<crate::engine::hip::HipEvent>>,
}

impl ReadyEvents {
    /// CUDA events.
    pub(super) fn of_cuda(events: Vec<Arc<PooledEvent>>) -> Self {
        Self {
            events,
            #[cfg(feature = "hip")]
            hip: Vec::new(),
        }
    }

    /// HIP events (recorded outside any capture), for a ROCm tensor.
    #[cfg(feature = "hip")]
    pub(crate) fn of_hip(events: Vec<crate::engine::hip::HipEvent>) -> Self {
        Self {
            events: Vec::new(),
            hip: events.into_iter().map(Arc::new).collect(),
        }
    }

    /// Whether some of the events are CUDA events (a wrapping block's deleter then keeps the
    /// thread's current CUDA context).
    pub(crate) fn has_cuda(&self) -> bool {
        !self.events.is_empty()
    }

    /// Whether some of the events are HIP events.
    #[cfg(feature = "hip")]
    pub(crate) fn has_hip(&self) -> bool {
        !self.hip.is_empty()
    }

    /// The HIP events, for a HIP stream or the host to wait on.
    ///
    /// # Errors
    ///
    /// `HipError::ForeignEvents` when there are CUDA events.
    #[cfg(feature = "hip")]
    fn hip_only(
        &self,
    ) -> Result<&[Arc<crate::engine::hip::HipEvent>], crate::engine::hip::HipError> {
        if self.events.is_empty() {
            Ok(&self.hip)
        } else {
            Err(crate::engine::hip::HipError::ForeignEvents {
                found: "CUDA",
                expected: "HIP",
            })
        }
    }

    /// Blocks the host until every HIP event has completed, with the GIL released meanwhile.
    ///
    /// # Errors
    ///
    /// `HipError::ForeignEvents` when there are CUDA events; `HipError::Driver`.
    #[cfg(feature = "hip")]
    pub(crate) fn synchronize_hip(&self) -> Result<(), crate::engine::hip::HipError> {
        self.hip_only()?
            .iter()
            .try_for_each(|event| event.synchronize())
    }

    /// Makes `stream` wait for every event of a ROCm export (`hipStreamWaitEvent`); the host
    /// does not block. A stream being captured into a HIP graph waits on them as part of the
    /// graph, at every launch: keep `self` alive as long as the graph may be launched.
    ///
    /// # Errors
    ///
    /// `HipError::ForeignEvents` for the CUDA events of a CUDA export;
    /// `HipError::DefaultStreamUnderCapture` for the default stream while a blocking stream of
    /// its device is being captured; `HipError::Driver` from the runtime.
    #[cfg(feature = "hip")]
    pub fn wait_on_hip(
        &self,
        stream: &crate::engine::hip::HipStream,
    ) -> Result<(), crate::engine::hip::HipError> {
        self.wait_on_hip_raw(stream.device(), stream.raw())
    }

    /// [`ReadyEvents::wait_on_hip`] for the raw stream `consumer` (valid for the call; NULL the
    /// default stream) of HIP device `device`. The thread's current device is left as it was.
    #[cfg(feature = "hip")]
    pub(crate) fn wait_on_hip_raw(
        &self,
        device: i32,
        consumer: crate::engine::hip::hipStream_t,
    ) -> Result<(), crate::engine::hip::HipError> {
        use crate::engine::hip::{Capture, CurrentDevice, HipError, capture_of};
        let events = self.hip_only()?;
        if events.is_empty() {
            return Ok(());
        }
        let current = CurrentDevice::save()?;
        current.set(device)?;
        // The events were recorded outside any capture: a consumer stream being captured
        // waits on them as external events, at every launch.
        let external = match capture_of(consumer)? {
            Capture::Implicit => return Err(HipError::DefaultStreamUnderCapture),
            Capture::Active { .. } => true,
            Capture::Not => false,
        };
        events
            .iter()
            .try_for_each(|event| event.wait_on(consumer, external))
    }

    /// Records one event on each of `streams`.
    ///
    /// # Errors
    ///
    /// [`CudaError::Capturing`] for a stream being captured into a CUDA graph (an event
    /// recorded in a capture can be waited on only inside it);
    /// [`CudaError::LegacyStreamUnderCapture`] for the legacy default stream while a blocking
    /// stream is being captured; [`CudaError`] from the probe or the driver.
    pub fn record(streams: &[&CudaStream]) -> Result<Self, CudaError> {
        if streams.is_empty() {
            return Ok(Self::default());
        }
        init()?;
        let _current = CurrentContext::save();
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            bind(stream.context().cu_ctx())?;
            // A live stream (borrowed), of the bound context.
            super::check_not_capturing(
                stream.cu_stream(),
                "recording ready events",
                "record them before the capture begins or after it ends",
            )?;
            let event = PooledEvent::take(stream.context())?;
            event.record_on(stream.cu_stream())?;
            events.push(Arc::new(event));
        }
        Ok(Self::of_cuda(events))
    }

    /// Records one event on the raw stream `stream` of `ctx` (valid for the call).
    ///
    /// # Errors
    ///
    /// [`CudaError`] from the driver.
    pub(crate) fn record_raw(ctx: &CudaContext, stream: sys::CUstream) -> Result<Self, CudaError> {
        let event = PooledEvent::take(ctx)?;
        event.record_on(stream)?;
        Ok(Self::of_cuda(vec![Arc::new(event)]))
    }

    /// Adds clones of `other`'s events to these.
    pub(crate) fn extend_from(&mut self, other: &ReadyEvents) {
        self.events.extend(other.events.iter().cloned());
        #[cfg(feature = "hip")]
        self.hip.extend(other.hip.iter().cloned());
    }

    /// Makes `stream` wait for every event; the host does not block. A stream being captured
    /// into a CUDA graph waits on them as part of the graph, at every launch
    /// (`CU_EVENT_WAIT_EXTERNAL`): keep `self` alive as long as the graph may be launched.
    ///
    /// # Errors
    ///
    /// [`CudaError::LegacyStreamUnderCapture`] for the legacy default stream while a blocking
    /// stream of its context is being captured; [`CudaError::Driver`] from
    /// `cuStreamWaitEvent`.
    /// `CudaError::Hip` (`HipError::ForeignEvents`, feature `hip`) for the HIP events of a ROCm
    /// export.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<(), CudaError> {
        // A live stream (borrowed); its default stream resolves in its own context.
        self.wait_on_raw(stream_id(stream), stream.context())
    }

    /// Makes the consumer's stream `consumer` (named in this call, valid for it; the special
    /// handles resolve in `primary`, the device's primary context) wait for every event; the
    /// host does not block. The thread's current context is left as it was.
    ///
    /// # Errors
    ///
    /// As [`ReadyEvents::wait_on`].
    pub(crate) fn wait_on_raw(
        &self,
        consumer: StreamId,
        primary: &CudaContext,
    ) -> Result<(), CudaError> {
        #[cfg(feature = "hip")]
        if !self.hip.is_empty() {
            return Err(crate::engine::hip::HipError::ForeignEvents {
                found: "HIP",
                expected: "CUDA",
            }
            .into());
        }
        if self.events.is_empty() {
            return Ok(());
        }
        let _current = CurrentContext::save();
        let how = outside_wait(consumer, primary.cu_ctx())?;
        for event in &self.events {
            wait_for(event, consumer, primary.cu_ctx(), how)?;
        }
        Ok(())
    }

    /// Blocks the host until every event has completed. Where this thread holds the GIL
    /// (feature `python`), it is released during the wait.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuEventSynchronize`; `CudaError::Hip` (feature `hip`) from
    /// `hipEventSynchronize` for the events of a ROCm export.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.events
            .iter()
            .try_for_each(|event| event.synchronize())?;
        #[cfg(feature = "hip")]
        self.hip.iter().try_for_each(|event| event.synchronize())?;
        Ok(())
    }

    /// Whether there are no events (no producer stream had pending work).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many events there are.
    pub fn len(&self) -> usize {
        #[cfg(feature = "hip")]
        return self.events.len() + self.hip.len();
        #[cfg(not(feature = "hip"))]
        self.events.len()
    }
}
