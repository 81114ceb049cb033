//! The export's device work (feature `cuda`): ordering the producer's pending stream work
//! before the consumer, and copies of CUDA memory, on the CUDA driver tier; with the `hip`
//! feature, the same for ROCm tensors on the HIP driver tier (`rocm`). `no_device.rs` is its
//! twin without the feature.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use super::copied::{build_copied, copy_of, copy_to_host as host_copy};
use super::parts::AnyStream;
use super::{
    DlpackExport, ExportBuffer, ExportError, ExportParts, ExportRequest, ProducerStream,
    build_export,
};
use crate::engine::cuda::{
    AfterFailedWait, CudaError, CurrentContext, DeviceMemory, PeerContexts, ReadyEvents,
    after_failed_wait, bind, check_consumer_stream, check_not_capturing, check_pointer,
    check_primary_stream, check_producer_stream, context, copy_to_device, copy_to_host, drop_in,
    enqueue_from_host, execute, execute_for, init, leak, max_pitch, raw_stream, record_and_order,
    release_after_raw, stream_id, synchronize,
};
use crate::plan::copy::StridedCopy;
use crate::plan::stream::{
    CopyPlan, StreamId, StreamRequest, SyncPlan, parse_stream, plan_copy, plan_copy_to, plan_sync,
};
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::DataType;
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::ManagedTensor;

/// Whether CUDA device memory can be copied for a consumer (`copy=True`, `dl_device=cpu:0`,
/// `dl_device` another CUDA device), and host memory to a CUDA device (`dl_device=cuda:k`).
pub(crate) const COPIES_CUDA_MEMORY: bool = true;

#[cfg(feature = "hip")]
mod rocm;
#[cfg(all(feature = "hip", feature = "python"))]
pub(crate) use rocm::{made_ready_on_rocm, order_stream_before_host_copy};

/// The `#[dlpack(stream)]` fields of an export: streams with pending work on the data.
pub(crate) type Streams<'a> = Vec<AnyStream<'a>>;

/// The identity of a producer stream within one exchange.
fn any_stream_id(stream: AnyStream<'_>) -> StreamId {
    match stream {
        AnyStream::Cuda(stream) => stream_id(stream),
        #[cfg(feature = "hip")]
        AnyStream::Hip(stream) => rocm::hip_stream_id(stream.raw()),
    }
}

impl<'a> ExportParts<'a> {
    /// Adds a stream with pending work on the data (a `#[dlpack(stream)]` field; `None`: no
    /// pending work): the consumer's stream is made to wait on an event recorded there.
    #[inline]
    pub fn with_stream(mut self, stream: Option<ProducerStream<'a>>) -> Self {
        if let Some(stream) = stream {
            self.streams.push(stream.0);
        }
        self
    }

    /// Whether the producer names pending work on the data: `#[dlpack(stream)]` fields, the
    /// buffer's own stream, or the ready events of an import lent on (a relay).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn has_producer_streams(&self) -> bool {
        let buffer = self.buffer();
        !self.streams.is_empty()
            || buffer.producer_stream().is_some()
            || buffer
                .ready_events()
                .is_some_and(|events| !events.is_empty())
    }

    /// The one stream a CUDA Array Interface export names as its `stream`: the first
    /// `#[dlpack(stream)]` field, else the buffer's own stream, else (a relay, ready after
    /// events) the legacy default stream; `None` when nothing is pending. Exported with this
    /// stream as the consumer's (`ExportRequest::stream`), the tensor makes it wait on every
    /// other pending stream and event, so that it covers all pending work.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn covering_stream(&self) -> Option<StreamId> {
        let buffer = self.buffer();
        if let Some(first) = self.streams.first() {
            return Some(any_stream_id(*first));
        }
        if let Some(stream) = buffer.producer_stream() {
            return Some(any_stream_id(stream.0));
        }
        buffer
            .ready_events()
            .filter(|events| !events.is_empty())
            .map(|_| StreamId::LegacyDefault)
    }
}

/// Whether an export may own CUDA resources, as its parts tell before anything is checked: its
/// buffer is CUDA memory (device, pinned host or managed: [`is_cuda_memory`]), or it names
/// `#[dlpack(stream)]` fields. Its deleter then keeps the thread's current context; exports of
/// host memory never touch the driver. [`StreamWork::touched_cuda`] adds the buffers of other
/// devices that name CUDA work of their own.
#[inline(always)]
pub(crate) fn touches_cuda(parts: &ExportParts<'_>) -> bool {
    is_cuda_memory(parts.facts.device)
        || parts
            .streams
            .iter()
            .any(|stream| matches!(stream, AnyStream::Cuda(_)))
}

/// The CUDA streams of `pending`, the producer streams of a tensor on `device` (not ROCm
/// memory).
///
/// # Errors
///
/// `HipError::ForeignStream` (feature `hip`) for a HIP stream.
fn cuda_streams<'a>(
    device: Device,
    pending: &[AnyStream<'a>],
) -> Result<Vec<&'a CudaStream>, ExportError> {
    let _ = device;
    pending
        .iter()
        .map(|stream| match *stream {
            AnyStream::Cuda(stream) => Ok(stream),
            #[cfg(feature = "hip")]
            AnyStream::Hip(_) => Err(crate::engine::hip::HipError::ForeignStream {
                found: "HIP",
                expected: "CUDA",
                device,
            }
            .into()),
        })
        .collect()
}

/// Whether `device` is memory of the CUDA driver: device, pinned host or managed memory.
#[inline(always)]
fn is_cuda_memory(device: Device) -> bool {
    matches!(
        device.device_type,
        DeviceType::Cuda | DeviceType::CudaHost | DeviceType::CudaManaged
    )
}

/// Keeps the thread's current CUDA context across a deleter whose owner holds CUDA resources
/// (`cuda`): their drop may bind their own context (cudarc buffers do), and the consumer's
/// thread keeps its context. Nothing, and no driver call, for any other owner.
#[inline(always)]
pub(crate) fn keep_current_context(cuda: bool) -> Option<CurrentContext> {
    if cuda {
        Some(CurrentContext::save())
    } else {
        None
    }
}

/// The stream work of one export: the request that names the consumer's stream (the input),
/// and what the work leaves for the rest of the export (the outcome): the copy plan of a CUDA
/// tensor, decided while the producer's streams were borrowed, and ready events when wanted.
pub(crate) struct StreamWork<'r> {
    request: &'r ExportRequest,
    /// Whether the export is copied for its consumer: `copy=True`, an unreachable
    /// `dl_device`, or a legacy request of a read-only tensor.
    copies: bool,
    want_ready: bool,
    ready: Option<ReadyEvents>,
    /// What the exported tensor is ready after, carried by it for whoever it is lent to next
    /// ([`StreamWork::carry`]).
    kept: ReadyEvents,
    copy: Option<CopyPlan>,
    /// Whether the export named CUDA work: producer streams, or the events of a relay.
    touched_cuda: bool,
}

impl<'r> StreamWork<'r> {
    pub(crate) fn new(request: &'r ExportRequest) -> Self {
        Self {
            request,
            copies: false,
            want_ready: false,
            ready: None,
            kept: ReadyEvents::default(),
            copy: None,
            touched_cuda: false,
        }
    }

    /// Whether [`StreamWork::order_pending`] found CUDA work to order (producer streams, ready
    /// events), whether or not it succeeded: the exported owner holds CUDA resources then.
    #[inline(always)]
    pub(crate) fn touched_cuda(&self) -> bool {
        self.touched_cuda
    }

    /// `managed`, the finished export, carrying the events it is ready after when there are
    /// any ([`ManagedTensor::ready_events`]).
    #[inline]
    pub(crate) fn carry(&mut self, managed: ManagedTensor) -> ManagedTensor {
        if self.kept.is_empty() {
            return managed;
        }
        super::ready::wrap(managed, core::mem::take(&mut self.kept))
    }

    /// Orders the producer's pending work before the consumer (called by the exporter while
    /// the producer's streams are borrowed, before the tensor is handed out): checks that a
    /// CUDA `data` pointer (the address of element `(0, ..., 0)`) and the producer streams
    /// belong to the tensor's device, parses the request's `stream` for the device the consumer
    /// will use, plans the synchronization ([`plan_sync`], or [`plan_copy`] when the request
    /// needs a copy of CUDA memory), checks the consumer's stream (`cuStreamGetCtx`) and
    /// carries the plan out; when wanted, also records [`ReadyEvents`] on the pending streams.
    ///
    /// # Errors
    ///
    /// [`ExportError::Stream`] for an illegal or unsupported `stream`; the errors of
    /// [`ExportRequest::check`] when a copy is needed; [`ExportError::Cuda`] for a driver
    /// failure, a missing driver with pending work, or a pointer or stream on another device.
    pub(crate) fn order_pending(
        &mut self,
        parts: &ExportParts<'_>,
        device: Device,
        data: u64,
        has_elements: bool,
        read_only: bool,
    ) -> Result<(), ExportError> {
        self.copies = self.request.needs_copy(device) || self.request.copies_for_legacy(read_only);
        let mut pending = parts.streams.clone();
        let buffer = parts.buffer();
        if let Some(stream) = buffer.producer_stream() {
            pending.push(stream.0);
        }
        if device.device_type == DeviceType::Cpu && !pending.is_empty() {
            // Host memory that producer streams write: whatever reads it (the host consumer,
            // the host's copy, a copy to a device) reads after a host wait for them.
            self.wait_for_host_writes(&pending)?;
            pending.clear();
        }
        // A relay: imported memory lent on, ready after the events it carries.
        let upstream = buffer.ready_events().filter(|events| !events.is_empty());
        #[cfg(feature = "hip")]
        if rocm::is_rocm_memory(device) {
            // ROCm work never touches the CUDA driver; a ROCm relay carries HIP events.
            return self.order_rocm(device, data, has_elements, &pending, upstream);
        }
        let pending = cuda_streams(device, &pending)?;
        if pending.is_empty()
            && upstream.is_none()
            && !(device.device_type == DeviceType::Cuda && has_elements)
        {
            return Ok(());
        }
        self.touched_cuda = true;
        self.order(device, data, has_elements, &pending, upstream)
    }

    /// Blocks the host until the producer streams `pending` of a host (`cpu`) tensor have
    /// finished their work, CUDA streams (`cuStreamSynchronize`) and HIP streams
    /// (`hipStreamSynchronize`, feature `hip`) alike, with the GIL released meanwhile where this
    /// thread holds it. Each stream's capture status is asked before any wait: captured work
    /// runs only at a launch of its graph, so a stream being captured is refused.
    ///
    /// # Errors
    ///
    /// [`ExportError::Cuda`]: no CUDA driver, [`CudaError::Capturing`], a driver failure;
    /// [`ExportError::Hip`]: no HIP runtime, [`HipError::Capturing`](crate::engine::hip::HipError::Capturing),
    /// a runtime failure.
    fn wait_for_host_writes(&mut self, pending: &[AnyStream<'_>]) -> Result<(), ExportError> {
        let (operation, instead) = HOST_WAIT_UNDER_CAPTURE;
        // Without `hip` every stream is a CUDA stream.
        #[cfg_attr(not(feature = "hip"), allow(clippy::unnecessary_filter_map))]
        let cuda: Vec<&CudaStream> = pending
            .iter()
            .filter_map(|stream| match *stream {
                AnyStream::Cuda(stream) => Some(stream),
                #[cfg(feature = "hip")]
                AnyStream::Hip(_) => None,
            })
            .collect();
        if !cuda.is_empty() {
            self.touched_cuda = true;
            init()?;
            let _current = CurrentContext::save();
            for stream in &cuda {
                bind(stream.context().cu_ctx())?;
                check_not_capturing(stream.cu_stream(), operation, instead)?;
            }
            let streams = cuda.iter().map(|stream| stream_id(stream)).collect();
            execute(&SyncPlan::HostSync { streams }, &cuda)?;
        }
        #[cfg(feature = "hip")]
        for stream in pending {
            if let AnyStream::Hip(stream) = *stream {
                // Asks the stream's capture status first (`synchronize_streams`).
                stream.synchronize()?;
            }
        }
        Ok(())
    }

    fn order(
        &mut self,
        device: Device,
        data: u64,
        has_elements: bool,
        pending: &[&CudaStream],
        upstream: Option<&ReadyEvents>,
    ) -> Result<(), ExportError> {
        let request = self.request;
        let cuda = device.device_type == DeviceType::Cuda;
        let needs_copy = self.copies;
        // A request that cannot be served is refused before the driver is asked anything, so the
        // error does not depend on whether a driver is present.
        if needs_copy {
            request.check(device)?;
        }
        if cuda && has_elements && init().is_ok() {
            check_pointer(data, device.device_id)?;
        }
        if cuda {
            for stream in pending {
                check_producer_stream(stream, device.device_id)?;
            }
        }
        let identities: Vec<StreamId> = pending.iter().map(|s| stream_id(s)).collect();
        if needs_copy {
            if cuda {
                let copy = copy_plan(device, request, &identities)?;
                // The device whose stream the copy goes on: `dl_device` when it names another
                // CUDA device (a copy between devices), else the tensor's own.
                let on = copy_device(device, request, &copy);
                refuse_copy_under_capture(&copy, on)?;
                // A copy of no elements reads nothing: nothing is ordered before it.
                if copy.before != SyncPlan::Nothing && has_elements {
                    init()?;
                    check_primary_stream(copy.on, on.device_id)?;
                    execute_for(&copy.before, pending, Some(on.device_id))?;
                }
                if let Some(upstream) = upstream.filter(|_| has_elements) {
                    wait_before_copy(upstream, &copy, on)?;
                }
                self.copy = Some(copy);
                return Ok(());
            }
            // Host-accessible memory is copied by the host: it waits for the pending work.
            let plan = plan_sync(device, &identities, StreamRequest::Host)?;
            execute(&plan, pending)?;
            if let Some(upstream) = upstream {
                upstream.synchronize()?;
            }
            return Ok(());
        }
        if pending.is_empty() && upstream.is_none() {
            return Ok(());
        }
        let target = request.dl_device.unwrap_or(device);
        let stream_request = parse_stream(target, request.stream)?;
        let consumer = StreamId::of_request(stream_request);
        if let (Some(consumer), true) = (consumer, cuda) {
            check_consumer_stream(consumer, device.device_id)?;
        }
        let plan = plan_sync(device, &identities, stream_request)?;
        // Whether `kept` holds an event of every pending stream.
        let recorded = match (&plan, consumer) {
            // The consumer's stream waits on an event of each other pending stream; those
            // events, and one on a pending stream that is the consumer's own, are what the
            // tensor is ready after.
            (SyncPlan::EventDependency { record_on, wait_on }, _) => {
                self.kept = record_and_order(record_on, *wait_on, pending)?;
                true
            }
            (SyncPlan::Nothing, Some(consumer)) if !pending.is_empty() => {
                self.kept = record_and_order(&[], consumer, pending)?;
                true
            }
            _ => {
                execute(&plan, pending)?;
                pending.is_empty()
            }
        };
        self.follow_upstream(
            upstream,
            consumer,
            stream_request == StreamRequest::Host,
            |upstream, consumer| upstream.wait_on_raw(consumer, &*context(device.device_id)?),
            ReadyEvents::synchronize,
        )?;
        Ok(self.keep_ready_events(recorded, || ReadyEvents::record(pending))?)
    }

    /// The events of a relay (`upstream`, what the lent tensor is ready after), once the pending
    /// streams are ordered: the consumer's stream waits on them (`wait`), or the host for a host
    /// consumer (`host_wait`); they go on with the tensor, for whoever it is lent to next
    /// (also with `stream=-1`, where the consumer orders itself).
    fn follow_upstream<S, E>(
        &mut self,
        upstream: Option<&ReadyEvents>,
        consumer: Option<S>,
        host: bool,
        wait: impl FnOnce(&ReadyEvents, S) -> Result<(), E>,
        host_wait: impl FnOnce(&ReadyEvents) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(upstream) = upstream else {
            return Ok(());
        };
        match consumer {
            Some(consumer) => {
                wait(upstream, consumer)?;
                self.kept.extend_from(upstream);
            }
            None if host => host_wait(upstream)?,
            None => self.kept.extend_from(upstream),
        }
        Ok(())
    }

    /// When ready events are wanted: what the tensor carries (`kept`) when it holds an event of
    /// every pending stream (`recorded`), else events `record`ed on the pending streams and
    /// those.
    fn keep_ready_events<E>(
        &mut self,
        recorded: bool,
        record: impl FnOnce() -> Result<ReadyEvents, E>,
    ) -> Result<(), E> {
        if self.want_ready {
            self.ready = Some(if recorded {
                self.kept.clone()
            } else {
                let mut ready = record()?;
                ready.extend_from(&self.kept);
                ready
            });
        }
        Ok(())
    }

    /// The copy `request` asks of the CUDA tensor `managed`, on the consumer's stream, after the
    /// producer's work (ordered by [`StreamWork::order_pending`] when the tensor was built).
    pub(crate) fn copy_device_memory(
        &mut self,
        managed: ManagedTensor,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError> {
        let device = Device::from_raw(managed.dl_tensor().device);
        let copy = match self.copy.take() {
            Some(copy) => copy,
            // Built without stream work (no producer stream, no elements, or prebuilt): nothing
            // is pending but what a prebuilt tensor carries as ready events, which the copy's
            // stream waits on.
            None => {
                let copy = copy_plan(device, request, &[])?;
                let has_elements = managed.layout().map_or(true, |layout| layout.numel() > 0);
                if let Some(ready) = managed.ready_events().filter(|_| has_elements) {
                    wait_before_copy(ready, &copy, copy_device(device, request, &copy))?;
                }
                copy
            }
        };
        let copied = copy_export(managed, request, &copy)?;
        Ok(self.keep_ready(copied))
    }

    /// The copy `request` asks of the host tensor `managed` (`cpu` or `cuda_host` memory) onto
    /// the CUDA device `request.dl_device` names, on the consumer's stream of that device
    /// ([`copy_from_host`]).
    ///
    /// # Errors
    ///
    /// [`ExportError::CopyUnsupported`] when `dl_device` is not a CUDA device; those of
    /// [`copy_from_host`].
    pub(crate) fn copy_host_to_device(
        &mut self,
        managed: ManagedTensor,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError> {
        let copied = copy_from_host(managed, request)?;
        Ok(self.keep_ready(copied))
    }

    /// The copy of a device copy, keeping the event recorded after it (if any) as what the
    /// tensor is ready after.
    fn keep_ready(
        &mut self,
        (copied, ready): (ManagedTensor, Option<ReadyEvents>),
    ) -> ManagedTensor {
        if let Some(ready) = ready {
            if self.want_ready {
                self.ready = Some(ready.clone());
            }
            self.kept = ready;
        }
        copied
    }
}

/// Exports `owner` as [`export_with`](super::export_with) does, and records one event on each
/// producer stream with pending work: beyond the DLPack standard, the consumer may make any of
/// its streams wait on them later. Events, never stream handles, outlive the call.
///
/// # Errors
///
/// As [`export_with`](super::export_with).
pub fn export_with_ready_events<O, F>(
    owner: O,
    parts_of: F,
    request: &ExportRequest,
) -> Result<(ManagedTensor, ReadyEvents), ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    let mut work = StreamWork::new(request);
    work.want_ready = true;
    let managed = build_export(owner, &parts_of, request, &mut work)?;
    Ok((managed, work.ready.unwrap_or_default()))
}

/// [`DlpackExport::into_dlpack_with_ready_events`] of `value`.
pub(crate) fn into_dlpack_with_ready_events<T: DlpackExport + Send + 'static>(
    value: T,
    request: &ExportRequest,
) -> Result<(ManagedTensor, ReadyEvents), ExportError> {
    export_with_ready_events(value, |owner| owner.export_parts_mut(), request)
}

/// Implements [`ExportBuffer`] for the device memory of a copy (`$memory`, with `ptr`,
/// `byte_len` and `dtype` methods), on the device `$device` computes from it.
macro_rules! copy_memory_buffer {
    ($memory:ty, |$m:ident| $device:expr) => {
        // SAFETY: `ptr` owns `byte_len` bytes of device memory of the device named here (or
        // is 0 with no bytes), allocated by the driver (`cuMemAlloc`, `hipMalloc`), which
        // aligns to at least 256 bytes, enough for every element type.
        unsafe impl ExportBuffer for $memory {
            fn dtype(&self) -> DataType {
                <$memory>::dtype(self)
            }
            fn device(&self) -> Device {
                let $m = self;
                $device
            }
            fn byte_len(&self) -> usize {
                <$memory>::byte_len(self)
            }
            fn as_ptr(&self) -> *const core::ffi::c_void {
                self.ptr() as usize as *const core::ffi::c_void
            }
            fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
                Some(self.ptr() as usize as *mut core::ffi::c_void)
            }
        }
    };
}
#[cfg(feature = "hip")]
use copy_memory_buffer;

copy_memory_buffer!(DeviceMemory, |m| Device::cuda(m.ordinal()));

/// Makes the stream a CUDA copy is enqueued on (`copy.on`, a stream of the device's primary
/// context) wait for `events`: the copy reads the source after them.
fn wait_before_copy(
    events: &ReadyEvents,
    copy: &CopyPlan,
    device: Device,
) -> Result<(), ExportError> {
    init()?;
    check_primary_stream(copy.on, device.device_id)?;
    Ok(events.wait_on_raw(copy.on, &*context(device.device_id)?)?)
}

/// What a device copy under CUDA graph capture is refused as (`CudaError::Capturing`), and what
/// to do instead.
const COPY_UNDER_CAPTURE: (&str, &str) = (
    "a copy for the consumer (copy=True, a dl_device the tensor is not on, or an unversioned request of a read-only tensor; its memory would be allocated once and written at every launch)",
    "copy before the capture begins or after it ends, or import without a copy (a versioned request, copy=None) and copy inside the capture into memory kept for the graph",
);
/// What a host wait for the producer streams of a host (`cpu`) tensor is refused as under
/// capture, and what to do instead.
const HOST_WAIT_UNDER_CAPTURE: (&str, &str) = (
    "a host wait for the producer's writes into host memory",
    "export the host tensor after the capture ends (and after a launch of its graph)",
);

/// The same for a copy to the host (`dl_device=(CPU, 0)`), which goes on the per-thread default
/// stream and is waited for by the host.
const HOST_COPY_UNDER_CAPTURE: (&str, &str) = (
    "a copy to the host (dl_device=(CPU, 0)), made on the per-thread default stream and waited for",
    "copy to the host before the capture begins or after it ends, or capture a stream other than the per-thread default one",
);

/// Refuses a copy whose stream (`copy.on`) is being captured into a CUDA graph, before
/// anything is enqueued, so the capture is left as it was. Without a driver nothing is
/// checked: the copy fails later for want of one.
fn refuse_copy_under_capture(copy: &CopyPlan, device: Device) -> Result<(), ExportError> {
    if init().is_err() {
        return Ok(());
    }
    let ctx = context(device.device_id)?;
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx())?;
    check_primary_stream(copy.on, device.device_id)?;
    bind(ctx.cu_ctx())?;
    let (operation, instead) = copy_refusal(copy);
    // The consumer's stream is valid for the call; the special handles resolve in the bound
    // primary context.
    Ok(check_not_capturing(
        raw_stream(copy.on),
        operation,
        instead,
    )?)
}

/// What a copy under capture is refused as, and what to do instead.
fn copy_refusal(copy: &CopyPlan) -> (&'static str, &'static str) {
    if copy.to_host {
        HOST_COPY_UNDER_CAPTURE
    } else {
        COPY_UNDER_CAPTURE
    }
}

/// A device copy's owner: its memory (CUDA's `DeviceMemory`, or with the `hip` feature a ROCm
/// copy's `HipMemory`) and its shape, in elements.
struct DeviceCopy<M> {
    memory: M,
    shape: Vec<usize>,
}

fn device_copy_parts<M: ExportBuffer>(c: &mut DeviceCopy<M>) -> ExportParts<'_> {
    ExportParts::unique(&mut c.memory, &c.shape)
}

/// Where a copy of a tensor on `device` for `request` goes, for the producer streams `pending`
/// ([`plan_copy`]; [`plan_copy_to`] for a copy to another CUDA device, whose stream identities
/// name streams of that device).
fn copy_plan(
    device: Device,
    request: &ExportRequest,
    pending: &[StreamId],
) -> Result<CopyPlan, ExportError> {
    let target = request.dl_device.unwrap_or(device);
    let stream_request = parse_stream(target, request.stream)?;
    if is_other_cuda_device(device, target) {
        let plan = plan_copy_to(device, pending, stream_request)?;
        // The device must exist before anything is asked of it (its primary context is retained
        // once per process, so this costs nothing after the first copy to it).
        context(target.device_id).map_err(|e| match e {
            CudaError::NoSuchDevice { count, .. } => ExportError::NoSuchDevice {
                requested: target,
                count,
            },
            e => e.into(),
        })?;
        return Ok(plan);
    }
    Ok(plan_copy(device, pending, stream_request)?)
}

/// Whether `target` is a CUDA device other than `device` (or `device` is not CUDA device memory):
/// a copy to it goes on a stream of `target`.
fn is_other_cuda_device(device: Device, target: Device) -> bool {
    target.device_type == DeviceType::Cuda && target != device
}

/// The CUDA device whose stream `copy` (of a tensor on `device`, for `request`) goes on: the
/// `dl_device` of a copy to a CUDA device, the tensor's own device otherwise (`copy=True`, or a
/// copy to the host, made on the tensor's device).
fn copy_device(device: Device, request: &ExportRequest, copy: &CopyPlan) -> Device {
    match request.dl_device {
        Some(target) if !copy.to_host && target.device_type == DeviceType::Cuda => target,
        _ => device,
    }
}

/// Copies a CUDA tensor for its consumer (`copy=True`, or `dl_device=(CPU, 0)`; the `copy`,
/// `dl_device` and `stream` parameters of the array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html))
/// as `copy` says, in the device's primary context: the strided source becomes
/// compact row-major memory, written by driver copies enqueued on `copy.on` (the consumer's
/// stream). A device copy is new device memory; unless `copy.host_wait`, the host does not
/// block and the source is released once the stream has passed the copy ([`release_after`]).
/// A host copy (`copy.to_host`) waits for the stream; a layout of many blocks whose span is not
/// much larger than its elements comes over in one transfer and is compacted on the host. The
/// result is flagged `IS_COPIED` and writable; an event recorded on `copy.on` after a device
/// copy that the host does not wait for comes with it.
fn copy_export(
    source: ManagedTensor,
    request: &ExportRequest,
    copy: &CopyPlan,
) -> Result<(ManagedTensor, Option<ReadyEvents>), ExportError> {
    // Declared before `source` is rebound, so restored after it is dropped (the source's
    // deleter may bind its own context).
    let _current = CurrentContext::save();
    let source = source;
    let layout = source.layout()?;
    let device = layout.device();
    if device.device_type != DeviceType::Cuda {
        return Err(ExportError::CopyUnsupported { device });
    }
    // The copy's device: the source's, or (a copy between devices) the `dl_device` asked for,
    // whose primary context allocates the copy and whose stream (the consumer's) runs it.
    let on = copy_device(device, request, copy);
    let src_ctx = context(device.device_id)?;
    let ctx = context(on.device_id)?;
    check_primary_stream(copy.on, on.device_id)?;
    bind(ctx.cu_ctx())?;
    let stream = raw_stream(copy.on);
    let (operation, instead) = copy_refusal(copy);
    check_not_capturing(stream, operation, instead)?;
    let peer = (on != device).then(|| PeerContexts {
        src: src_ctx.cu_ctx(),
        dst: ctx.cu_ctx(),
    });
    let max_pitch = if peer.is_some() {
        max_pitch(&ctx)?.min(max_pitch(&src_ctx)?)
    } else {
        max_pitch(&ctx)?
    };
    let src = layout.first_element_ptr() as usize as sys::CUdeviceptr;
    let versioned = request.wants_versioned();
    if copy.to_host {
        let copied = host_copy(&layout, versioned, Some(max_pitch), |dst, plan| {
            // SAFETY: `dst` has `plan.bytes()` bytes (`host_copy`'s contract), `plan` was made
            // for `layout` and this device's pitch; `source` keeps the memory alive until after
            // the copy has been waited for; `stream` is valid for the call.
            Ok(unsafe { copy_to_host(&layout, plan, dst, stream) }?)
        });
        drop(source);
        return Ok((copied?, None));
    }
    let dtype = layout.dtype();
    let Some(size) = dtype.element_bytes() else {
        return Err(LayoutError::SubByteAccess { dtype }.into());
    };
    let plan = StridedCopy::new(layout.shape(), &layout.strides_vec(), size, max_pitch)?;
    let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
    let memory = DeviceMemory::alloc(&ctx, plan.bytes(), dtype)?;
    let enqueued = copy_to_device(&plan, src, &memory, stream, peer);
    hand_over(
        source,
        Some(&src_ctx),
        DeviceCopy { memory, shape },
        &ctx,
        stream,
        copy,
        enqueued,
        versioned,
    )
}

/// Releases `source` once `stream` (of `ctx`, current) has passed the copy into `copy` just
/// enqueued on it (`enqueued`), without a host wait (stream-ordered release), or right after the
/// host has waited for the stream when `plan.host_wait`, with `source_ctx` bound (the context of
/// the source's device memory, another device's for a copy between devices; `None` for host
/// memory); then builds the export of the copy, flagged `IS_COPIED`, with an event recorded on
/// `stream` after it unless the host waited.
#[allow(clippy::too_many_arguments)] // each is one piece of the hand-over, named at the call
fn hand_over<S: Send + 'static>(
    source: S,
    source_ctx: Option<&Arc<CudaContext>>,
    copy: DeviceCopy<DeviceMemory>,
    ctx: &CudaContext,
    stream: sys::CUstream,
    plan: &CopyPlan,
    enqueued: Result<(), CudaError>,
    versioned: bool,
) -> Result<(ManagedTensor, Option<ReadyEvents>), ExportError> {
    // The copies read the source on `stream` (whether or not every block was enqueued); the
    // new memory's drop waits for the device.
    // A copy of no elements enqueued nothing: there is nothing to wait for.
    if plan.host_wait && copy.memory.byte_len() > 0 {
        let waited = synchronize(stream);
        match waited.as_ref().map_err(after_failed_wait) {
            Ok(()) | Err(AfterFailedWait::Free) => {
                drop_in(source_ctx.map(|c| &**c), source);
                // Back to the copy's context, where its export is built.
                bind(ctx.cu_ctx())?;
            }
            Err(_) => {
                leak("a tensor whose copy could not be waited for");
                core::mem::forget(source);
            }
        }
        enqueued.and(waited)?;
    } else {
        let _ = release_after_raw(
            Box::new(source),
            ReadyEvents::default(),
            ctx,
            stream,
            source_ctx.cloned(),
        );
        enqueued?;
    }
    let copied = build_copied(copy, &device_copy_parts, versioned)?;
    let ready = if !plan.host_wait {
        Some(ReadyEvents::record_raw(ctx, stream)?)
    } else {
        None
    };
    Ok((copied, ready))
}

/// Copies a host tensor (`cpu` or `cuda_host` memory) onto the CUDA device that
/// `request.dl_device` names, for its consumer (the `dl_device` and `stream` parameters of the
/// array API's
/// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html):
/// `stream` is a stream of that device): the host compacts the source into pageable memory of
/// its own (borrowed shared from other imports for that time), and the driver copies that
/// memory into new device memory of the device's primary context with one `cuMemcpyHtoDAsync`
/// on the consumer's stream. The source is released as soon as it is compacted; the staging
/// memory once the stream has passed the copy (stream-ordered release: an event, no host wait),
/// unless `stream=-1`, where the host waits for the copy. The result is flagged `IS_COPIED`.
///
/// Pageable, not pinned, staging: pinning memory for one transfer costs more than the transfer
/// it speeds up, and the driver stages pageable memory itself.
///
/// # Errors
///
/// [`ExportError::CopyUnsupported`] for a `dl_device` that is not a CUDA device;
/// [`ExportError::Stream`]; [`ExportError::Cuda`] for a driver failure (no driver, a consumer's
/// stream of another device or context, a stream being captured).
fn copy_from_host(
    source: ManagedTensor,
    request: &ExportRequest,
) -> Result<(ManagedTensor, Option<ReadyEvents>), ExportError> {
    let _current = CurrentContext::save();
    let device = Device::from_raw(source.dl_tensor().device);
    let Some(target) = request
        .dl_device
        .filter(|t| t.device_type == DeviceType::Cuda)
    else {
        return Err(ExportError::CopyUnsupported { device });
    };
    let copy = copy_plan(device, request, &[])?;
    init()?;
    refuse_copy_under_capture(&copy, target)?;
    let staged = copy_of(&source, true)?;
    drop(source);
    let (src, shape, dtype, bytes) = {
        let layout = staged.layout()?;
        let dtype = layout.dtype();
        let Some(size) = dtype.element_bytes() else {
            return Err(LayoutError::SubByteAccess { dtype }.into());
        };
        let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
        (
            layout.first_element_ptr().cast::<u8>(),
            shape,
            dtype,
            layout.numel() * size,
        )
    };
    let ctx = context(target.device_id)?;
    check_primary_stream(copy.on, target.device_id)?;
    bind(ctx.cu_ctx())?;
    let stream = raw_stream(copy.on);
    let (operation, instead) = COPY_UNDER_CAPTURE;
    check_not_capturing(stream, operation, instead)?;
    let memory = DeviceMemory::alloc(&ctx, bytes, dtype)?;
    // SAFETY: `src` is the first of `bytes` compact bytes of `staged`, fresh host memory of this
    // function that nothing else reaches; `hand_over` keeps it alive, unwritten, until the
    // stream has passed the copy (or the host has waited for it); `stream` is the consumer's,
    // valid for the call, checked to be of the bound primary context.
    let enqueued = unsafe { enqueue_from_host(src, &memory, stream) };
    hand_over(
        staged,
        None,
        DeviceCopy { memory, shape },
        &ctx,
        stream,
        &copy,
        enqueued,
        request.wants_versioned(),
    )
}
