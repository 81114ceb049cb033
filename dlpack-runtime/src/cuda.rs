//! The CUDA effect layer (feature `cuda`), on cudarc with dynamic loading.
//!
//! The stream layer ([`crate::stream`]) decides *what* an exchange needs ([`SyncPlan`]); this
//! module does it with the driver:
//!
//! - [`driver`] probes for `libcuda` and initializes it; without a driver every entry point
//!   returns [`CudaError::NoDriver`] (cudarc itself would panic, so the probe comes first).
//! - An **event dependency** records a pooled event (timing disabled, created once per context
//!   and reused: [`events_created`] counts creations) on each producer stream with pending work
//!   and makes the consumer's stream wait on it (`cuStreamWaitEvent`): the host never blocks.
//!   The legacy (`1`) and per-thread (`2`) default streams map to `CU_STREAM_LEGACY` and
//!   `CU_STREAM_PER_THREAD`. The consumer's stream is borrowed for the call and only waited on.
//! - A **host synchronization** (`cuStreamSynchronize`) only where the spec requires it: a
//!   consumer that reads on the host.
//! - **Ready events** ([`ReadyEvents`]): beyond the standard, for Rust-to-Rust exchange, events
//!   recorded on the producer streams that the consumer can wait on later, from any stream.
//!   Events, never stream handles, outlive the call.
//! - **Stream-ordered release** ([`release_after`]): drops an imported tensor only after the
//!   consumer's stream has passed a recorded event. A reaper thread waits on the event and then
//!   calls the deleter; no CUDA call is made from a host callback.
//! - **Copies** (`copy=True`, or `dl_device=(CPU, 0)` for device memory; spec section 2.7):
//!   the strided source becomes compact row-major memory through driver copies, one per 2-D
//!   block of the layout (`cuMemcpy2DAsync`), enqueued on the consumer's stream after the
//!   producer's work ([`crate::stream::plan_copy`] decides where). A device copy is new memory
//!   (`cuMemAlloc`; freed after the device has drained, since the deleter carries no stream)
//!   and the host does not block; the source is released once the stream has passed the copy.
//!   A host copy waits for the stream. Copies are flagged `IS_COPIED`.
//! - [`check_pointer`]: the device a pointer belongs to (`cuPointerGetAttribute`);
//!   [`check_consumer_stream`] and [`check_producer_stream`]: the device a stream belongs to
//!   (`cuStreamGetCtx`; the stream's context). A CUDA export checks each one it uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use crate::managed::ManagedTensor;
use crate::stream::{CopySync, ProducerStream, SyncPlan};

/// A CUDA failure, or the absence of a driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver: libcuda could not be loaded, expected a machine with an NVIDIA driver"
    )]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver call {call} failed with {code:?}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result code.
        code: sys::CUresult,
    },
    /// A data pointer lives on another device than the tensor says.
    #[error("data pointer {pointer:#x} belongs to CUDA device {found}, expected device {expected}")]
    WrongDevice {
        /// The pointer.
        pointer: u64,
        /// Its device ordinal.
        found: i32,
        /// The device the tensor names.
        expected: i32,
    },
    /// A stream belongs to another device than the tensor (`cuStreamGetCtx`; for a producer
    /// stream, its context's device).
    #[error(
        "{role} stream {stream:#x} belongs to CUDA device {found}, expected the tensor's device {expected}"
    )]
    StreamOnOtherDevice {
        /// `"consumer"` or `"producer"`.
        role: &'static str,
        /// The stream handle.
        stream: u64,
        /// The device of the stream's context.
        found: i32,
        /// The tensor's device.
        expected: i32,
    },
    /// A stream of a context other than its device's primary context, where this crate needs
    /// the primary one: a consumer stream it enqueues work of its own on (a copy), or a
    /// producer's default stream (the special handles resolve in the primary context).
    #[error(
        "{role} stream {stream:#x} belongs to a context other than the primary context of CUDA device {device}, expected a stream of the primary context (the runtime API's)"
    )]
    NotPrimaryContext {
        /// `"consumer"` or `"producer"`.
        role: &'static str,
        /// The stream handle.
        stream: u64,
        /// The tensor's device.
        device: i32,
    },
    /// A stream being captured into a CUDA graph, where this crate would have to wait for work
    /// it enqueues (a copy, a stream-ordered release): captured work runs only at launch.
    #[error(
        "stream {stream:#x} is being captured into a CUDA graph, expected a stream that runs its work now (an event dependency, a copy or a stream-ordered release cannot be ordered from outside the capture)"
    )]
    Capturing {
        /// The stream handle.
        stream: u64,
    },
    /// The reaper thread of stream-ordered release is gone.
    #[error(
        "the stream-ordered release thread has stopped; the tensor was released at once after a host synchronization"
    )]
    ReaperGone,
}

fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver { call, code: e.0 }
}

/// Probes for the CUDA driver and initializes it (once per process).
///
/// # Errors
///
/// [`CudaError::NoDriver`] when `libcuda` cannot be loaded; [`CudaError::Driver`] when
/// `cuInit` fails (no device, driver too old).
pub fn driver() -> Result<(), CudaError> {
    static PROBE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to `dlopen` the driver library under its candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver);
            }
            result::init().map_err(driver_error("cuInit"))
        })
        .clone()
}

/// Restores the thread's current context when dropped. The CUDA runtime (PyTorch, CuPy, JAX)
/// follows the driver's current context, so every entry point here leaves it as it found it.
pub(crate) struct CurrentContext(Option<sys::CUcontext>);

impl CurrentContext {
    /// Saves the current context (nothing without a driver).
    pub(crate) fn save() -> Self {
        if driver().is_err() {
            return Self(None);
        }
        let mut ctx: sys::CUcontext = core::ptr::null_mut();
        // SAFETY: the driver is loaded (probed above); a valid out-pointer. On failure `ctx`
        // stays NULL, and NULL is restored: no context, as the driver reported.
        let _ = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        Self(Some(ctx))
    }
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: the context (or NULL) was current on this thread when saved.
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

/// Makes `ctx` current on this thread (`cuCtxSetCurrent`), without cudarc's check of errors
/// recorded on its context by other work.
fn bind(ctx: sys::CUcontext) -> Result<(), CudaError> {
    // SAFETY: `ctx` is a live context (a retained primary context, or one the driver returned
    // for a live stream).
    unsafe { sys::cuCtxSetCurrent(ctx) }
        .result()
        .map_err(driver_error("cuCtxSetCurrent"))
}

/// The raw handle of a stream identity, for the driver: `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`, or the handle itself.
pub fn raw_stream(stream: ProducerStream) -> sys::CUstream {
    match stream {
        ProducerStream::LegacyDefault => 0x1 as sys::CUstream,
        ProducerStream::PerThreadDefault => 0x2 as sys::CUstream,
        ProducerStream::Handle(h) => h.get() as sys::CUstream,
    }
}

/// The identity of a cudarc stream within one exchange (NULL is the legacy default stream).
pub fn identity(stream: &CudaStream) -> ProducerStream {
    match stream.cu_stream() as usize {
        0 | 1 => ProducerStream::LegacyDefault,
        2 => ProducerStream::PerThreadDefault,
        h => ProducerStream::Handle(
            core::num::NonZeroU64::new(h as u64).unwrap_or(core::num::NonZeroU64::MIN),
        ),
    }
}

/// The primary context of CUDA device `ordinal`, retained once per process.
///
/// # Errors
///
/// [`CudaError::NoDriver`]; [`CudaError::Driver`] for an ordinal the driver does not know.
pub fn context(ordinal: i32) -> Result<Arc<CudaContext>, CudaError> {
    driver()?;
    static CONTEXTS: OnceLock<Mutex<HashMap<i32, Arc<CudaContext>>>> = OnceLock::new();
    let contexts = CONTEXTS.get_or_init(Default::default);
    if let Some(ctx) = contexts.lock().ok().and_then(|c| c.get(&ordinal).cloned()) {
        return Ok(ctx);
    }
    let index = usize::try_from(ordinal).map_err(|_| CudaError::Driver {
        call: "cuDeviceGet",
        code: sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
    })?;
    // Creating (and dropping a context that lost a race) binds it: leave the thread's as it was.
    let _current = CurrentContext::save();
    let ctx = CudaContext::new(index).map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
    let kept = match contexts.lock() {
        Ok(mut c) => c.entry(ordinal).or_insert(ctx).clone(),
        Err(_) => ctx,
    };
    Ok(kept)
}

/// The device a context belongs to, as a `CUdevice` handle (`cuCtxGetDevice` with the context
/// pushed, then popped).
fn context_device(ctx: sys::CUcontext) -> Result<sys::CUdevice, CudaError> {
    // SAFETY: `ctx` is a live context (the driver returned it for a live stream); pushing it
    // and popping it right after leaves this thread's context stack as it was.
    unsafe {
        sys::cuCtxPushCurrent_v2(ctx)
            .result()
            .map_err(driver_error("cuCtxPushCurrent"))?;
        let mut device: sys::CUdevice = 0;
        let got = sys::cuCtxGetDevice(&mut device)
            .result()
            .map_err(driver_error("cuCtxGetDevice"));
        let mut popped: sys::CUcontext = core::ptr::null_mut();
        sys::cuCtxPopCurrent_v2(&mut popped)
            .result()
            .map_err(driver_error("cuCtxPopCurrent"))?;
        got.map(|()| device)
    }
}

/// The context a stream handle belongs to (`cuStreamGetCtx`).
fn stream_context(stream: sys::CUstream) -> Result<sys::CUcontext, CudaError> {
    let mut ctx: sys::CUcontext = core::ptr::null_mut();
    // SAFETY: `stream` is a live stream, valid for the call (caller); a valid out-pointer.
    unsafe { sys::cuStreamGetCtx(stream, &mut ctx) }
        .result()
        .map_err(driver_error("cuStreamGetCtx"))?;
    Ok(ctx)
}

/// Refuses a stream that is being captured into a CUDA graph, where this crate would enqueue
/// work whose completion it then waits for (a copy, a stream-ordered release): captured work
/// runs only when the graph is launched.
fn check_not_capturing(stream: sys::CUstream) -> Result<(), CudaError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is valid for the call (caller); a valid out-pointer.
    unsafe { sys::cuStreamIsCapturing(stream, &mut status) }
        .result()
        .map_err(driver_error("cuStreamIsCapturing"))?;
    if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        Ok(())
    } else {
        Err(CudaError::Capturing {
            stream: stream as u64,
        })
    }
}

/// The ordinal of a `CUdevice` handle.
fn ordinal_of(device: sys::CUdevice) -> i32 {
    let count = result::device::get_count().unwrap_or(0);
    (0..count)
        .find(|&i| result::device::get(i).is_ok_and(|d| d == device))
        .unwrap_or(-1)
}

/// Checks that the consumer's stream `stream` belongs to CUDA device `expected`
/// (`cuStreamGetCtx`). The special handles (legacy and per-thread default streams) pass: this
/// crate resolves them in the device's primary context, the one the CUDA runtime uses.
///
/// # Errors
///
/// [`CudaError::StreamOnOtherDevice`]; [`CudaError::Driver`] for a handle the driver does not
/// know.
pub fn check_consumer_stream(stream: ProducerStream, expected: i32) -> Result<(), CudaError> {
    consumer_context(stream, expected).map(|_| ())
}

/// As [`check_consumer_stream`], and whether the stream is in the device's primary context
/// (special handles are).
fn consumer_context(stream: ProducerStream, expected: i32) -> Result<bool, CudaError> {
    let ProducerStream::Handle(handle) = stream else {
        return Ok(true);
    };
    let ctx = context(expected)?;
    let _current = CurrentContext::save();
    // The consumer's stream is valid for the duration of the call (spec section 2.4).
    let found_ctx = stream_context(handle.get() as sys::CUstream)?;
    if found_ctx == ctx.cu_ctx() {
        return Ok(true);
    }
    // Another context: fine if it is on the same device (a non-primary context).
    let found = context_device(found_ctx)?;
    let wanted = result::device::get(expected).map_err(driver_error("cuDeviceGet"))?;
    if found == wanted {
        Ok(false)
    } else {
        Err(CudaError::StreamOnOtherDevice {
            role: "consumer",
            stream: handle.get(),
            found: ordinal_of(found),
            expected,
        })
    }
}

/// Checks that a consumer's stream is one this crate may enqueue its own work on: of the
/// tensor's device, in its primary context.
fn check_primary_stream(stream: ProducerStream, device: i32) -> Result<(), CudaError> {
    match (consumer_context(stream, device)?, stream) {
        (false, ProducerStream::Handle(h)) => Err(CudaError::NotPrimaryContext {
            role: "consumer",
            stream: h.get(),
            device,
        }),
        _ => Ok(()),
    }
}

/// Checks that a producer stream belongs to CUDA device `expected` (its context's ordinal), and
/// that a default stream (legacy or per-thread) is one of the primary context: the special
/// handles name the default stream of the current context, and this crate resolves them in
/// the primary one.
///
/// # Errors
///
/// [`CudaError::StreamOnOtherDevice`]; [`CudaError::NotPrimaryContext`] for a default stream of
/// another context.
pub fn check_producer_stream(stream: &CudaStream, expected: i32) -> Result<(), CudaError> {
    let found = stream.context().ordinal() as i32;
    if found != expected {
        return Err(CudaError::StreamOnOtherDevice {
            role: "producer",
            stream: stream.cu_stream() as u64,
            found,
            expected,
        });
    }
    if !matches!(identity(stream), ProducerStream::Handle(_)) && !stream.context().is_primary() {
        return Err(CudaError::NotPrimaryContext {
            role: "producer",
            stream: stream.cu_stream() as u64,
            device: expected,
        });
    }
    Ok(())
}

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
pub struct PooledEvent(RawEvent);

impl PooledEvent {
    /// Takes an event of `ctx` from the pool, creating one (timing disabled) if it is empty.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when an event cannot be created.
    pub fn take(ctx: &CudaContext) -> Result<Self, CudaError> {
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
    pub fn cu_event(&self) -> sys::CUevent {
        self.0.event
    }

    /// Records the event on `stream`, a stream of the event's context valid for the call.
    fn record_on(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.0.ctx)?;
        // SAFETY: a live event of the bound context; `stream` is of that context (caller).
        unsafe { result::event::record(self.0.event, stream) }
            .map_err(driver_error("cuEventRecord"))
    }

    /// Blocks the host until the event has completed.
    fn synchronize(&self) -> Result<(), CudaError> {
        let _current = CurrentContext::save();
        bind(self.0.ctx)?;
        // SAFETY: a live event of the current context.
        unsafe { result::event::synchronize(self.0.event) }
            .map_err(driver_error("cuEventSynchronize"))
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

/// Records a pooled event on `producer` and makes the `consumer` stream wait on it. A special
/// handle (legacy or per-thread default stream) is resolved in `primary`, the device's primary
/// context; the event may come from another context (`cuStreamWaitEvent` allows it).
fn record_and_wait(
    producer: &CudaStream,
    consumer: ProducerStream,
    primary: &CudaContext,
) -> Result<(), CudaError> {
    let event = PooledEvent::take(producer.context())?;
    // The producer's stream is live (borrowed), of the event's context.
    event.record_on(producer.cu_stream())?;
    wait_for(&event, consumer, primary.cu_ctx())
}

/// Makes the `consumer` stream wait for a recorded `event`, with the stream's own context bound
/// (`primary`, the device's primary context, for the special handles). Restores nothing: the
/// caller holds a [`CurrentContext`].
fn wait_for(
    event: &PooledEvent,
    consumer: ProducerStream,
    primary: sys::CUcontext,
) -> Result<(), CudaError> {
    match consumer {
        ProducerStream::Handle(h) => bind(stream_context(h.get() as sys::CUstream)?)?,
        _ => bind(primary)?,
    }
    // A stream being captured into a graph cannot wait on an event recorded outside the
    // capture (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, and the capture is invalidated): refuse
    // it before the driver is asked.
    check_not_capturing(raw_stream(consumer))?;
    // SAFETY: the consumer's stream is valid for the duration of this call (spec section 2.4);
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
/// ([`crate::stream::StreamRequest::Host`]) waits on the host.
///
/// # Errors
///
/// [`CudaError`] from the probe, the device check of the consumer's stream, or the driver.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn order_raw(
    device_id: i32,
    producer: sys::CUstream,
    request: crate::stream::StreamRequest,
) -> Result<(), CudaError> {
    use crate::stream::StreamRequest;
    if request == StreamRequest::NoSync {
        return Ok(());
    }
    let ctx = context(device_id)?;
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx())?;
    let producer = if producer.is_null() {
        raw_stream(ProducerStream::LegacyDefault)
    } else {
        producer
    };
    let Some(consumer) = ProducerStream::of_request(request) else {
        // SAFETY: `producer` is the producer's current stream, valid for this call.
        return unsafe { result::stream::synchronize(producer) }
            .map_err(driver_error("cuStreamSynchronize"));
    };
    if raw_stream(consumer) == producer {
        return Ok(());
    }
    check_consumer_stream(consumer, device_id)?;
    bind(ctx.cu_ctx())?;
    let event = PooledEvent::take(&ctx)?;
    // `producer` is a stream of the primary context, valid for this call (spec section 5.3).
    event.record_on(producer)?;
    wait_for(&event, consumer, ctx.cu_ctx())
}

/// Carries out `plan` for the producer streams `pending` (the streams that named the plan's
/// identities, in this call). The thread's current context is left as it was.
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls.
pub fn execute(plan: &SyncPlan, pending: &[&CudaStream]) -> Result<(), CudaError> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        SyncPlan::EventDependency { record_on, wait_on } => {
            driver()?;
            let _current = CurrentContext::save();
            let mut recorded = pending
                .iter()
                .copied()
                .filter(|s| record_on.contains(&identity(s)))
                .peekable();
            let Some(first) = recorded.peek() else {
                return Ok(());
            };
            let primary = context(first.context().ordinal() as i32)?;
            for stream in recorded {
                record_and_wait(stream, *wait_on, &primary)?;
            }
            Ok(())
        }
        SyncPlan::HostSync { streams } => {
            driver()?;
            let _current = CurrentContext::save();
            for stream in pending
                .iter()
                .copied()
                .filter(|s| streams.contains(&identity(s)))
            {
                bind(stream.context().cu_ctx())?;
                // SAFETY: a live stream (borrowed), of the current context.
                unsafe { result::stream::synchronize(stream.cu_stream()) }
                    .map_err(driver_error("cuStreamSynchronize"))?;
            }
            Ok(())
        }
    }
}

/// Events recorded on a producer's streams at export, owned by the consumer: it may make any of
/// its streams wait on them later ([`ReadyEvents::wait_on`]), or block the host
/// ([`ReadyEvents::synchronize`]). Beyond the DLPack standard, for Rust-to-Rust exchange.
#[derive(Debug, Default)]
pub struct ReadyEvents {
    events: Vec<PooledEvent>,
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
        driver()?;
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            let event = PooledEvent::take(stream.context())?;
            event.record_on(stream.cu_stream())?;
            events.push(event);
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
            events: vec![event],
        })
    }

    /// Makes `stream` wait for every event; the host does not block.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuStreamWaitEvent`.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<(), CudaError> {
        if self.events.is_empty() {
            return Ok(());
        }
        let _current = CurrentContext::save();
        bind(stream.context().cu_ctx())?;
        for event in &self.events {
            // SAFETY: a live stream (borrowed) of the bound context and a recorded event; an
            // event of another context may be waited on.
            unsafe {
                result::stream::wait_event(
                    stream.cu_stream(),
                    event.cu_event(),
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(driver_error("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Blocks the host until every event has completed.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.events.iter().try_for_each(PooledEvent::synchronize)
    }

    /// Whether there are no events (no producer stream had pending work).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// The device ordinal that owns `pointer` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
///
/// # Errors
///
/// [`CudaError::Driver`] for a pointer the driver does not know.
pub fn pointer_device(pointer: u64) -> Result<i32, CudaError> {
    driver()?;
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is a valid out-pointer for an `int` attribute; the driver only reads
    // its own tables for `pointer`.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            pointer as sys::CUdeviceptr,
        )
    }
    .result()
    .map_err(driver_error("cuPointerGetAttribute"))?;
    Ok(ordinal)
}

/// Checks that `pointer` belongs to CUDA device `expected`.
///
/// # Errors
///
/// [`CudaError::WrongDevice`], or the errors of [`pointer_device`].
pub fn check_pointer(pointer: u64, expected: i32) -> Result<(), CudaError> {
    let found = pointer_device(pointer)?;
    if found == expected {
        Ok(())
    } else {
        Err(CudaError::WrongDevice {
            pointer,
            found,
            expected,
        })
    }
}

/// What the stream work of one export leaves for the rest of it.
#[derive(Debug, Default)]
pub(crate) struct Synced {
    /// Ready events recorded on the producer streams, when asked for.
    pub ready: Option<ReadyEvents>,
    /// Where the copy of a CUDA tensor goes, when the request needs one: the producer's work is
    /// already ordered before it.
    pub copy: Option<CopySync>,
}

/// The stream work of one export (called by the exporter while the producer's streams are
/// borrowed): checks that a CUDA `data` pointer and the producer streams belong to the tensor's
/// device, parses the request's `stream` for the device the consumer will use, plans the
/// synchronization ([`crate::stream::plan_sync`], or [`crate::stream::plan_copy`] when the
/// request needs a copy of CUDA memory), checks the consumer's stream (`cuStreamGetCtx`) and
/// carries the plan out; with `want_ready`, also records [`ReadyEvents`] on the pending streams.
///
/// # Errors
///
/// [`ExportError::Stream`](crate::ExportError::Stream) for an illegal or unsupported `stream`;
/// the errors of [`crate::ExportRequest::check`] when a copy is needed;
/// [`ExportError::Cuda`](crate::ExportError::Cuda) for a driver failure, a missing driver with
/// pending work, or a pointer or stream on another device.
pub(crate) fn sync_export(
    device: crate::Device,
    data: u64,
    has_elements: bool,
    pending: &[&CudaStream],
    request: &crate::ExportRequest,
    want_ready: bool,
) -> Result<Synced, crate::ExportError> {
    let cuda = device.device_type == crate::DeviceType::Cuda;
    let needs_copy = request.needs_copy(device);
    // A request that cannot be served is refused before the driver is asked anything, so the
    // error does not depend on whether a driver is present.
    if needs_copy {
        request.check(device)?;
    }
    if cuda && has_elements && driver().is_ok() {
        check_pointer(data, device.device_id)?;
    }
    if cuda {
        for stream in pending {
            check_producer_stream(stream, device.device_id)?;
        }
    }
    let identities: Vec<ProducerStream> = pending.iter().map(|s| identity(s)).collect();
    if needs_copy {
        if cuda {
            let copy = copy_sync(device, request, &identities)?;
            if copy.before != SyncPlan::Nothing {
                driver()?;
                check_primary_stream(copy.on, device.device_id)?;
                execute(&copy.before, pending)?;
            }
            return Ok(Synced {
                ready: None,
                copy: Some(copy),
            });
        }
        // Host-accessible memory is copied by the host: it waits for the pending work.
        let plan =
            crate::stream::plan_sync(device, &identities, crate::stream::StreamRequest::Host)?;
        execute(&plan, pending)?;
        return Ok(Synced::default());
    }
    if pending.is_empty() {
        return Ok(Synced::default());
    }
    let target = request.dl_device.unwrap_or(device);
    let stream_request = crate::stream::parse_stream(target, request.stream)?;
    let plan = crate::stream::plan_sync(device, &identities, stream_request)?;
    if let SyncPlan::EventDependency { wait_on, .. } = &plan {
        if cuda {
            check_consumer_stream(*wait_on, device.device_id)?;
        }
    }
    execute(&plan, pending)?;
    Ok(Synced {
        ready: if want_ready {
            Some(ReadyEvents::record(pending)?)
        } else {
            None
        },
        copy: None,
    })
}

// SAFETY: a `CudaSlice<T>` owns `len` elements of `T` in device memory of its context's
// device; the pointers come from cudarc's accessors for the slice's own stream (recording the
// access as cudarc's event tracking expects), the mutable one from `&mut self`. `T: Element`
// gives the dtype; device allocations are aligned for every element type.
unsafe impl<T: crate::Element + cudarc::driver::DeviceRepr> crate::ExportBuffer
    for cudarc::driver::CudaSlice<T>
{
    fn dtype(&self) -> crate::DataType {
        T::DTYPE
    }
    fn device(&self) -> crate::Device {
        crate::Device::cuda(self.ordinal() as i32)
    }
    fn byte_len(&self) -> usize {
        self.num_bytes()
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        use cudarc::driver::DevicePtr;
        // cudarc's access tracking may bind the slice's context: leave the thread's as it was.
        let _current = CurrentContext::save();
        let stream = self.stream().clone();
        let (ptr, _record) = self.device_ptr(&stream);
        ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        use cudarc::driver::DevicePtrMut;
        let _current = CurrentContext::save();
        let stream = self.stream().clone();
        let (ptr, _record) = self.device_ptr_mut(&stream);
        Some(ptr as usize as *mut core::ffi::c_void)
    }
    fn producer_stream(&self) -> Option<&CudaStream> {
        Some(self.stream())
    }
}

/// Work for the reaper thread: frees that must wait for the device.
enum Job {
    /// Drop `tensor` once `event` has completed.
    Release {
        event: PooledEvent,
        tensor: ManagedTensor,
    },
    /// Free device memory of `ctx` once the device has finished all work submitted so far.
    Free {
        ctx: Arc<CudaContext>,
        ptr: sys::CUdeviceptr,
    },
}

/// What a wait that failed means for the memory waited on.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailedWait {
    /// The context is broken for good (a sticky error, or the driver shutting down): nothing
    /// runs in it any more, so the memory may be freed.
    Free,
    /// A stream capture forbids the wait now: try again later.
    Retry,
    /// Anything else: the memory may still be in use; leaking it is the safe choice.
    Leak,
}

fn after_failed_wait(err: &CudaError) -> AfterFailedWait {
    use sys::CUresult as R;
    let CudaError::Driver { code, .. } = err else {
        return AfterFailedWait::Leak;
    };
    match code {
        R::CUDA_ERROR_ILLEGAL_ADDRESS
        | R::CUDA_ERROR_LAUNCH_FAILED
        | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | R::CUDA_ERROR_MISALIGNED_ADDRESS
        | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | R::CUDA_ERROR_INVALID_PC
        | R::CUDA_ERROR_HARDWARE_STACK_ERROR
        | R::CUDA_ERROR_ECC_UNCORRECTABLE
        | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
        | R::CUDA_ERROR_DEINITIALIZED => AfterFailedWait::Free,
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        | R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => AfterFailedWait::Retry,
        _ => AfterFailedWait::Leak,
    }
}

impl Job {
    /// Waits, then frees. Returns the job when a stream capture forbids the wait now. A wait
    /// that fails otherwise leaves the memory alone (leaked, and said on stderr) unless the
    /// context is broken for good: freeing memory that may still be read is worse than a leak.
    fn run(self) -> Option<Job> {
        let _current = CurrentContext::save();
        let waited = match &self {
            Job::Release { event, .. } => event.synchronize(),
            // The deleter carries no stream (spec section 6, corner 7): wait for every stream
            // of the context, then free.
            Job::Free { ctx, .. } => bind(ctx.cu_ctx()).and_then(|()| {
                // SAFETY: the context is current.
                unsafe { sys::cuCtxSynchronize() }
                    .result()
                    .map_err(driver_error("cuCtxSynchronize"))
            }),
        };
        let verdict = match &waited {
            Ok(()) => AfterFailedWait::Free,
            Err(err) => after_failed_wait(err),
        };
        match (verdict, self) {
            (AfterFailedWait::Retry, job) => return Some(job),
            (AfterFailedWait::Free, Job::Release { event, tensor }) => {
                drop(tensor);
                drop(event);
            }
            (AfterFailedWait::Free, Job::Free { ptr, .. }) => {
                // SAFETY: `ptr` came from `cuMemAlloc` in the bound context and is freed once,
                // here, after every access enqueued before the free was asked has finished.
                let _ = unsafe { result::free_sync(ptr) };
            }
            (AfterFailedWait::Leak, Job::Release { tensor, .. }) => {
                leak("a tensor whose release could not wait for the consumer's stream");
                core::mem::forget(tensor);
            }
            (AfterFailedWait::Leak, Job::Free { .. }) => {
                leak("device memory of a copy that could not wait for the device");
            }
        }
        None
    }
}

fn leak(what: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "dlpack-runtime: leaked {what}");
}

fn reaper() -> Option<&'static Mutex<Sender<Job>>> {
    static REAPER: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let requeue = tx.clone();
            std::thread::Builder::new()
                .name("dlpack-release".into())
                .spawn(move || {
                    if driver().is_ok() {
                        // Another thread's global-mode stream capture must not forbid (nor be
                        // invalidated by) this thread's waits.
                        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                        // SAFETY: a valid in/out pointer; affects this thread only.
                        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
                    }
                    for job in rx {
                        // A panic in one job must not end the thread: the jobs queued behind
                        // it would be dropped without their waits.
                        let retry =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run()))
                                .unwrap_or(None);
                        if let Some(job) = retry {
                            // A capture forbids the wait now: behind the other jobs, later.
                            std::thread::sleep(std::time::Duration::from_millis(10));
                            if let Err(returned) = requeue.send(job) {
                                let _ = returned.0.run();
                            }
                        }
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Hands `job` to the reaper thread, or runs it here (blocking) if the thread is gone.
fn reap(job: Job) -> Result<(), CudaError> {
    let mut job = match reaper().and_then(|r| r.lock().ok()) {
        Some(sender) => match sender.send(job) {
            Ok(()) => return Ok(()),
            Err(returned) => returned.0,
        },
        None => job,
    };
    while let Some(pending) = job.run() {
        std::thread::sleep(std::time::Duration::from_millis(10));
        job = pending;
    }
    Err(CudaError::ReaperGone)
}

/// Stream-ordered release: `tensor`'s deleter runs only after `stream` has completed the work
/// enqueued on it so far (spec section 6, corner 7: the deleter carries no stream). An event is
/// recorded on `stream` now; a reaper thread waits for it, then drops the tensor.
///
/// # Errors
///
/// [`CudaError::Capturing`] when `stream` is being captured into a CUDA graph: the tensor is
/// leaked (said on stderr), since the captured work reads it whenever the graph is launched.
/// [`CudaError`] when the event cannot be recorded: the tensor is then released after a host
/// synchronization of `stream` (leaked, and said on stderr, if that fails too while the
/// context still runs: it may still be read).
pub fn release_after(tensor: ManagedTensor, stream: &CudaStream) -> Result<(), CudaError> {
    release_after_raw(tensor, stream.context(), stream.cu_stream())
}

/// [`release_after`] for a raw stream handle of `ctx` (a consumer's stream, or a special
/// handle), valid for the duration of the call.
pub(crate) fn release_after_raw(
    tensor: ManagedTensor,
    ctx: &CudaContext,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    let _current = CurrentContext::save();
    let recorded = driver()
        .and_then(|()| bind(ctx.cu_ctx()))
        .and_then(|()| check_not_capturing(stream))
        .and_then(|()| PooledEvent::take(ctx))
        .and_then(|event| event.record_on(stream).map(|()| event));
    match recorded {
        Ok(event) => reap(Job::Release { event, tensor }),
        Err(err @ CudaError::Capturing { .. }) => {
            // The captured work reads the tensor whenever the graph is launched: only a leak is
            // safe (and waiting on the stream would invalidate the capture).
            leak("a tensor released after a stream that is being captured into a CUDA graph");
            core::mem::forget(tensor);
            Err(err)
        }
        Err(err) => {
            let waited = bind(ctx.cu_ctx()).and_then(|()| {
                // SAFETY: `stream` is a stream of the bound context, valid for this call.
                unsafe { result::stream::synchronize(stream) }
                    .map_err(driver_error("cuStreamSynchronize"))
            });
            match waited.as_ref().map_err(after_failed_wait) {
                Ok(()) | Err(AfterFailedWait::Free) => drop(tensor),
                Err(_) => {
                    leak("a tensor whose release could not wait for the consumer's stream");
                    core::mem::forget(tensor);
                }
            }
            Err(err)
        }
    }
}

/// Device memory of one copy, from `cuMemAlloc`; freed by the reaper once the device has
/// finished the work submitted before the drop (the deleter carries no stream).
struct DeviceMemory {
    ptr: sys::CUdeviceptr,
    byte_len: usize,
    dtype: crate::DataType,
    ctx: Arc<CudaContext>,
}

impl DeviceMemory {
    fn alloc(
        ctx: &Arc<CudaContext>,
        byte_len: usize,
        dtype: crate::DataType,
    ) -> Result<Self, CudaError> {
        let ptr = if byte_len == 0 {
            0
        } else {
            bind(ctx.cu_ctx())?;
            // SAFETY: allocates `byte_len` bytes in the bound context; the memory is written by
            // the copy before anyone reads it, and freed once, in `drop`.
            unsafe { result::malloc_sync(byte_len) }.map_err(driver_error("cuMemAlloc"))?
        };
        Ok(Self {
            ptr,
            byte_len,
            dtype,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = reap(Job::Free {
                ctx: self.ctx.clone(),
                ptr: self.ptr,
            });
        }
    }
}

// SAFETY: `ptr` owns `byte_len` bytes of device memory of the context's device (or is 0 with
// no bytes); `cuMemAlloc` aligns to at least 256 bytes, enough for every element type.
unsafe impl crate::ExportBuffer for DeviceMemory {
    fn dtype(&self) -> crate::DataType {
        self.dtype
    }
    fn device(&self) -> crate::Device {
        crate::Device::cuda(self.ctx.ordinal() as i32)
    }
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.ptr as usize as *mut core::ffi::c_void)
    }
}

/// A copy's owner: its memory and its shape, in elements.
struct DeviceCopy {
    memory: DeviceMemory,
    shape: Vec<usize>,
}

fn device_copy_parts(c: &mut DeviceCopy) -> crate::ExportParts<'_> {
    crate::ExportParts::unique(&mut c.memory, &c.shape)
}

/// Where a copy writes.
#[derive(Clone, Copy)]
enum CopyTarget {
    Host(*mut u8),
    Device(sys::CUdeviceptr),
}

/// Enqueues one block of a strided copy from device memory (`src` is the source's first
/// element) on `stream`.
fn enqueue(
    block: crate::copy::Block,
    src: sys::CUdeviceptr,
    dst: CopyTarget,
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    let from = src.wrapping_add_signed(block.src as i64);
    if block.height == 1 {
        // The block addresses `width` bytes of the source tensor's elements (the plan covers
        // exactly them) and `width` bytes inside the destination, which the caller sized to
        // the plan; `stream` is valid for the call. The destination stays alive until the copy
        // has finished (the caller waits, or frees through the reaper).
        return match dst {
            // SAFETY: as above, into host memory.
            CopyTarget::Host(p) => unsafe {
                sys::cuMemcpyDtoHAsync_v2(p.add(block.dst).cast(), from, block.width, stream)
            }
            .result()
            .map_err(driver_error("cuMemcpyDtoHAsync")),
            // SAFETY: as above, into device memory.
            CopyTarget::Device(p) => unsafe {
                sys::cuMemcpyDtoDAsync_v2(p + block.dst as u64, from, block.width, stream)
            }
            .result()
            .map_err(driver_error("cuMemcpyDtoDAsync")),
        };
    }
    let (dst_type, dst_host, dst_device) = match dst {
        // SAFETY: `block.dst` is inside the destination (as above).
        CopyTarget::Host(p) => (
            sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            unsafe { p.add(block.dst) }.cast(),
            0,
        ),
        CopyTarget::Device(p) => (
            sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            core::ptr::null_mut(),
            p + block.dst as u64,
        ),
    };
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: core::ptr::null(),
        srcDevice: from,
        srcArray: core::ptr::null_mut(),
        srcPitch: block.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: core::ptr::null_mut(),
        dstPitch: block.dst_pitch,
        WidthInBytes: block.width,
        Height: block.height,
    };
    // SAFETY: `height` rows of `width` bytes, `src_pitch` apart, are elements of the source
    // (the plan covers exactly them; `src_pitch >= width`, within the device's maximum pitch);
    // the destination rows are packed inside memory sized to the plan; as above for lifetimes.
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream) }
        .result()
        .map_err(driver_error("cuMemcpy2DAsync"))
}

/// The device's largest pitch for 2-D copies, in bytes.
fn max_pitch(ctx: &CudaContext) -> Result<usize, CudaError> {
    // SAFETY: a device handle of a live context; an attribute query only.
    let pitch = unsafe {
        result::device::get_attribute(
            ctx.cu_device(),
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH,
        )
    }
    .map_err(driver_error("cuDeviceGetAttribute"))?;
    Ok(usize::try_from(pitch).unwrap_or(0))
}

/// Where a copy of a CUDA tensor for `request` goes, for the producer streams `pending`
/// (spec sections 2.5 and 2.7; [`crate::stream::plan_copy`]).
pub(crate) fn copy_sync(
    device: crate::Device,
    request: &crate::ExportRequest,
    pending: &[ProducerStream],
) -> Result<CopySync, crate::ExportError> {
    let target = request.dl_device.unwrap_or(device);
    let stream_request = crate::stream::parse_stream(target, request.stream)?;
    Ok(crate::stream::plan_copy(device, pending, stream_request)?)
}

/// Copies a CUDA tensor for its consumer (`copy=True`, or `dl_device=(CPU, 0)`; spec sections
/// 2.5 and 2.7) as `copy` says, in the device's primary context: the strided source becomes
/// compact row-major memory, written by driver copies enqueued on `copy.on` (the consumer's
/// stream). A device copy is new device memory; unless `copy.host_wait`, the host does not
/// block and the source is released once the stream has passed the copy ([`release_after`]).
/// A host copy (`copy.to_host`) waits for the stream; a layout of many blocks whose span is not
/// much larger than its elements comes over in one transfer and is compacted on the host. The
/// result is flagged `IS_COPIED` and writable; with `want_ready`, an event recorded on
/// `copy.on` after a device copy comes with it.
pub(crate) fn copy_export(
    source: ManagedTensor,
    request: &crate::ExportRequest,
    copy: &CopySync,
    want_ready: bool,
) -> Result<(ManagedTensor, Option<ReadyEvents>), crate::ExportError> {
    // Declared before `source` is rebound, so restored after it is dropped (the source's
    // deleter may bind its own context).
    let _current = CurrentContext::save();
    let source = source;
    let layout = source.layout()?;
    let device = layout.device();
    if device.device_type != crate::DeviceType::Cuda {
        return Err(crate::ExportError::CopyUnsupported { device });
    }
    let ctx = context(device.device_id)?;
    check_primary_stream(copy.on, device.device_id)?;
    bind(ctx.cu_ctx())?;
    let stream = raw_stream(copy.on);
    check_not_capturing(stream)?;
    let max_pitch = max_pitch(&ctx)?;
    let src = layout.first_element_ptr() as usize as sys::CUdeviceptr;
    let versioned = request.wants_versioned();
    if copy.to_host {
        let span = layout.span();
        let span_len = (span.end - span.start) as usize;
        let first = layout.byte_offset() as isize - span.start;
        let base =
            (layout.data() as usize as sys::CUdeviceptr).wrapping_add_signed(span.start as i64);
        let copied =
            crate::export::copy_to_host(&layout, versioned, Some(max_pitch), |dst, plan| {
                let staged = plan.blocks() > 1 && span_len <= 2 * plan.bytes() + (1 << 20);
                let mut staging: Vec<u8> = Vec::new();
                let enqueued = if staged {
                    staging
                        .try_reserve_exact(span_len)
                        .map_err(|_| CudaError::Driver {
                            call: "host staging allocation",
                            code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                        })
                        .and_then(|()| {
                            // SAFETY: `base` is the start of the tensor's validated span in device
                            // memory, `span_len` bytes; `staging` has room for them (reserved);
                            // synchronized below before anything reads it.
                            unsafe {
                                sys::cuMemcpyDtoHAsync_v2(
                                    staging.as_mut_ptr().cast(),
                                    base,
                                    span_len,
                                    stream,
                                )
                            }
                            .result()
                            .map_err(driver_error("cuMemcpyDtoHAsync"))
                        })
                } else {
                    plan.try_for_each_block(|block| {
                        enqueue(block, src, CopyTarget::Host(dst), stream)
                    })
                };
                // Wait even after a failed enqueue: the copies already enqueued write to host
                // memory.
                // SAFETY: `stream` is valid for the call.
                let waited = unsafe { result::stream::synchronize(stream) }
                    .map_err(driver_error("cuStreamSynchronize"));
                enqueued.and(waited)?;
                if staged {
                    // SAFETY: the transfer above wrote all `span_len` bytes (it completed).
                    unsafe { staging.set_len(span_len) };
                    // Compacted in destination order, which the host's caches favour.
                    let size = plan.bytes() / layout.numel();
                    let host = crate::copy::StridedCopy::for_host(
                        layout.shape(),
                        &layout.strides_vec(),
                        size,
                    );
                    // SAFETY: element (0, ..., 0) is at `first` inside the staged span, which holds
                    // every element of the layout; `dst` has `bytes()` bytes, as `host` writes.
                    unsafe { host.run_on_host(staging.as_ptr().offset(first), dst) };
                }
                Ok(())
            });
        drop(source);
        return Ok((copied?, None));
    }
    let dtype = layout.dtype();
    let Some(size) = dtype.element_bytes() else {
        return Err(crate::LayoutError::SubByteAccess { dtype }.into());
    };
    let plan =
        crate::copy::StridedCopy::new(layout.shape(), &layout.strides_vec(), size, max_pitch);
    let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
    let memory = DeviceMemory::alloc(&ctx, plan.bytes(), dtype)?;
    let enqueued = plan
        .try_for_each_block(|block| enqueue(block, src, CopyTarget::Device(memory.ptr), stream));
    // The copies read the source on `stream` (whether or not every block was enqueued); the
    // new memory's drop waits for the device.
    if copy.host_wait {
        // SAFETY: `stream` is valid for the call.
        let waited = unsafe { result::stream::synchronize(stream) }
            .map_err(driver_error("cuStreamSynchronize"));
        match waited.as_ref().map_err(after_failed_wait) {
            Ok(()) | Err(AfterFailedWait::Free) => drop(source),
            Err(_) => {
                leak("a tensor whose copy could not be waited for");
                core::mem::forget(source);
            }
        }
        enqueued.and(waited)?;
    } else {
        let _ = release_after_raw(source, &ctx, stream);
        enqueued?;
    }
    let copied =
        crate::export::build_copied(DeviceCopy { memory, shape }, &device_copy_parts, versioned)?;
    let ready = if want_ready && !copy.host_wait {
        Some(ReadyEvents::record_raw(&ctx, stream)?)
    } else {
        None
    };
    Ok((copied, ready))
}

impl<T: crate::Element> crate::ImportedData<T> {
    /// Stream-ordered release of this import: see [`release_after`].
    ///
    /// # Errors
    ///
    /// As [`release_after`]; the tensor is released either way.
    pub fn release_after(self, stream: &CudaStream) -> Result<(), CudaError> {
        release_after(self.into_managed(), stream)
    }

    /// The device pointer of element `(0, ..., 0)` of a CUDA tensor, for kernels launched by
    /// the consumer on its own stream. The memory belongs to the producer: never free it.
    ///
    /// # Errors
    ///
    /// [`crate::LayoutError::DtypeMismatch`] cannot happen here (checked at import); a non-CUDA
    /// tensor gives [`CudaError::WrongDevice`] with `found = -1`.
    pub fn cuda_device_ptr(&self) -> Result<sys::CUdeviceptr, CudaError> {
        let device = self.device();
        if !matches!(
            device.device_type,
            crate::DeviceType::Cuda | crate::DeviceType::CudaManaged
        ) {
            return Err(CudaError::WrongDevice {
                pointer: self.as_ptr() as u64,
                found: -1,
                expected: device.device_id,
            });
        }
        Ok(self.as_ptr() as sys::CUdeviceptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_streams_map_to_the_driver_handles() {
        assert_eq!(raw_stream(ProducerStream::LegacyDefault) as usize, 1);
        assert_eq!(raw_stream(ProducerStream::PerThreadDefault) as usize, 2);
        let h = core::num::NonZeroU64::new(0xdead_b000).unwrap();
        assert_eq!(raw_stream(ProducerStream::Handle(h)) as usize, 0xdead_b000);
    }

    #[test]
    fn without_a_driver_everything_is_an_error_not_a_panic() {
        // Set by the test command: `present` on the CUDA simulator, `absent` with no driver.
        let expected = std::env::var("DLPACK_TESTS_EXPECT_DRIVER").ok();
        match driver() {
            Err(CudaError::NoDriver) => {
                assert_ne!(expected.as_deref(), Some("present"));
                assert_eq!(pointer_device(0x1000), Err(CudaError::NoDriver));
                assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
                assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
                let plan = SyncPlan::HostSync {
                    streams: vec![ProducerStream::LegacyDefault],
                };
                assert_eq!(execute(&plan, &[]), Err(CudaError::NoDriver));
            }
            other => {
                assert_ne!(expected.as_deref(), Some("absent"), "{other:?}");
                other.expect("the driver initializes");
                assert!(matches!(
                    pointer_device(0x1000),
                    Err(CudaError::Driver {
                        call: "cuPointerGetAttribute",
                        ..
                    })
                ));
                assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
                assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
            }
        }
    }

    #[test]
    fn failed_waits_free_only_in_broken_contexts_and_retry_only_under_capture() {
        use sys::CUresult as R;
        let failed = |code| CudaError::Driver {
            call: "cuEventSynchronize",
            code,
        };
        for code in [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_LAUNCH_FAILED,
            R::CUDA_ERROR_ECC_UNCORRECTABLE,
            R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
            R::CUDA_ERROR_DEINITIALIZED,
        ] {
            assert_eq!(
                after_failed_wait(&failed(code)),
                AfterFailedWait::Free,
                "{code:?}"
            );
        }
        for code in [
            R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        ] {
            assert_eq!(
                after_failed_wait(&failed(code)),
                AfterFailedWait::Retry,
                "{code:?}"
            );
        }
        for code in [
            R::CUDA_ERROR_INVALID_HANDLE,
            R::CUDA_ERROR_NOT_READY,
            R::CUDA_ERROR_UNKNOWN,
        ] {
            assert_eq!(
                after_failed_wait(&failed(code)),
                AfterFailedWait::Leak,
                "{code:?}"
            );
        }
        assert_eq!(
            after_failed_wait(&CudaError::NoDriver),
            AfterFailedWait::Leak
        );
    }
}
