//! Events: the per-context pool, event dependencies between streams, the plans of the stream
//! tier carried out, and [`ReadyEvents`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use super::{
    CudaError, CurrentContext, HostWait, bind, check_consumer_stream, check_not_capturing, context,
    driver_error, init, raw_stream, stream_context, stream_id,
};
use crate::stream::{StreamId, StreamRequest, SyncPlan};

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

/// An event taken from the per-context pool; returned to it when dropped. Driven with raw
/// driver calls: no error recorded on a cudarc context by unrelated work can fail them.
#[derive(Debug)]
pub(crate) struct PooledEvent(RawEvent);

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
            if let Some(event) = reused {
                return Ok(Self(event));
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
        Ok(Self(RawEvent {
            event,
            ctx: ctx.cu_ctx(),
            pooled,
        }))
    }

    /// The raw event handle.
    pub(crate) fn cu_event(&self) -> sys::CUevent {
        self.0.event
    }

    /// Records the event on `stream`, a stream of the event's context valid for the call.
    pub(crate) fn record_on(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.0.ctx)?;
        // SAFETY: a live event of the bound context; `stream` is of that context (caller).
        unsafe { result::event::record(self.0.event, stream) }
            .map_err(driver_error("cuEventRecord"))
    }

    /// Blocks the host until the event has completed.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.0.ctx)?;
        // A live event of the current context.
        HostWait::Event(self.0.event).run()
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if self.0.pooled {
            if let Ok(mut pool) = pool().lock() {
                pool.entry(self.0.ctx as usize).or_default().push(self.0);
            }
        } else {
            // SAFETY: the event is ours and used no more; a failure (its context is gone,
            // destroying it already) leaves nothing to do.
            let _ = unsafe { sys::cuEventDestroy_v2(self.0.event) };
        }
    }
}

/// Makes the `consumer` stream wait for a recorded `event`, with the stream's own context bound
/// (`primary`, the device's primary context, for the special handles). Restores nothing: the
/// caller holds a [`CurrentContext`].
fn wait_for(
    event: &PooledEvent,
    consumer: StreamId,
    primary: sys::CUcontext,
) -> Result<(), CudaError> {
    match consumer {
        StreamId::Handle(h) => bind(stream_context(h.get() as sys::CUstream)?)?,
        _ => bind(primary)?,
    }
    // A stream being captured into a graph cannot wait on an event recorded outside the
    // capture (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, and the capture is invalidated): refuse
    // it before the driver is asked.
    check_not_capturing(raw_stream(consumer))?;
    // SAFETY: the consumer's stream is valid for the duration of this call (the `stream`
    // parameter of the array API's `__dlpack__`,
    // https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html);
    // the event is recorded. `cuStreamWaitEvent` captures the event's state now, so the event
    // may be reused once this returns.
    unsafe {
        result::stream::wait_event(
            raw_stream(consumer),
            event.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(driver_error("cuStreamWaitEvent"))
}

/// Orders a producer's work on its raw stream `producer` (a C exchange API's
/// `current_work_stream`, of the primary context of CUDA device `device_id`; NULL is the legacy
/// default stream) before the consumer's `request`: an event recorded on `producer` that the
/// consumer's stream waits on, or nothing for the same stream or `stream=-1`. A host consumer
/// ([`StreamRequest::Host`]) waits on the host.
///
/// # Errors
///
/// [`CudaError`] from the probe, the device check of the consumer's stream, or the driver.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn order_raw(
    device_id: i32,
    producer: sys::CUstream,
    request: StreamRequest,
) -> Result<(), CudaError> {
    use StreamRequest;
    if request == StreamRequest::NoSync {
        return Ok(());
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
        return HostWait::Stream(producer).run();
    };
    if raw_stream(consumer) == producer {
        return Ok(());
    }
    check_consumer_stream(consumer, device_id)?;
    bind(ctx.cu_ctx())?;
    let event = PooledEvent::take(&ctx)?;
    // `producer` is a stream of the primary context, valid for this call (`dlpack.h`,
    // `DLPackExchangeAPI::current_work_stream`).
    event.record_on(producer)?;
    wait_for(&event, consumer, ctx.cu_ctx())
}

/// Carries out `plan` for the producer streams `pending` (the streams that named the plan's
/// identities, in this call). The thread's current context is left as it was.
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls.
pub(crate) fn execute(plan: &SyncPlan, pending: &[&CudaStream]) -> Result<(), CudaError> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        SyncPlan::EventDependency { record_on, wait_on } => {
            let recorded: Vec<&CudaStream> = pending
                .iter()
                .copied()
                .filter(|s| record_on.contains(&stream_id(s)))
                .collect();
            record_and_order(record_on, *wait_on, &recorded).map(drop)
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
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls.
pub(crate) fn record_and_order(
    record_on: &[StreamId],
    wait_on: StreamId,
    pending: &[&CudaStream],
) -> Result<ReadyEvents, CudaError> {
    init()?;
    let _current = CurrentContext::save();
    let mut seen: Vec<StreamId> = Vec::with_capacity(pending.len());
    let mut events = Vec::with_capacity(pending.len());
    for stream in pending {
        let id = stream_id(stream);
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let event = PooledEvent::take(stream.context())?;
        // The producer's stream is live (borrowed), of the event's context.
        event.record_on(stream.cu_stream())?;
        if record_on.contains(&id) {
            let primary = context(stream.context().ordinal() as i32)?;
            wait_for(&event, wait_on, primary.cu_ctx())?;
        }
        events.push(Arc::new(event));
    }
    Ok(ReadyEvents { events })
}

/// Events recorded on a producer's streams at export, owned by the consumer: it may make any of
/// its streams wait on them later ([`ReadyEvents::wait_on`]), or block the host
/// ([`ReadyEvents::synchronize`]). Beyond the DLPack standard, for Rust-to-Rust exchange.
///
/// Cloning shares the events (each is recorded once and never again while a clone holds it).
#[derive(Debug, Default, Clone)]
pub struct ReadyEvents {
    events: Vec<Arc<PooledEvent>>,
}

impl ReadyEvents {
    /// Records one event on each of `streams`.
    ///
    /// # Errors
    ///
    /// [`CudaError`] from the probe or the driver.
    pub fn record(streams: &[&CudaStream]) -> Result<Self, CudaError> {
        if streams.is_empty() {
            return Ok(Self::default());
        }
        init()?;
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            let event = PooledEvent::take(stream.context())?;
            event.record_on(stream.cu_stream())?;
            events.push(Arc::new(event));
        }
        Ok(Self { events })
    }

    /// Records one event on the raw stream `stream` of `ctx` (valid for the call).
    ///
    /// # Errors
    ///
    /// [`CudaError`] from the driver.
    pub(crate) fn record_raw(ctx: &CudaContext, stream: sys::CUstream) -> Result<Self, CudaError> {
        let event = PooledEvent::take(ctx)?;
        event.record_on(stream)?;
        Ok(Self {
            events: vec![Arc::new(event)],
        })
    }

    /// Adds clones of `other`'s events to these.
    pub(crate) fn extend_from(&mut self, other: &ReadyEvents) {
        self.events.extend(other.events.iter().cloned());
    }

    /// Makes `stream` wait for every event; the host does not block.
    ///
    /// # Errors
    ///
    /// [`CudaError::Capturing`] for a stream being captured into a CUDA graph (an event
    /// recorded outside the capture cannot be waited on inside it); [`CudaError::Driver`] from
    /// `cuStreamWaitEvent`.
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
    /// [`CudaError::Capturing`] for a stream being captured into a graph; [`CudaError::Driver`]
    /// from the driver.
    pub(crate) fn wait_on_raw(
        &self,
        consumer: StreamId,
        primary: &CudaContext,
    ) -> Result<(), CudaError> {
        if self.events.is_empty() {
            return Ok(());
        }
        let _current = CurrentContext::save();
        for event in &self.events {
            wait_for(event, consumer, primary.cu_ctx())?;
        }
        Ok(())
    }

    /// Blocks the host until every event has completed. Where this thread holds the GIL
    /// (feature `python`), it is released during the wait.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.events.iter().try_for_each(|event| event.synchronize())
    }

    /// Whether there are no events (no producer stream had pending work).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// How many events there are.
    pub fn len(&self) -> usize {
        self.events.len()
    }
}
