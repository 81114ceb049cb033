//! The export's device work for ROCm tensors (feature `hip`), on the HIP driver tier: the
//! hand-off of `kDLROCM` (and `kDLROCMHost`) memory, and its copy to the host. The CUDA driver
//! is never called here.
//!
//! Ready events that outlive the call are HIP events in [`ReadyEvents`], and a ROCm tensor
//! carries those it is ready after, so that lending it on (a relay) orders the next consumer
//! after the original producer. Copies on a ROCm device (`copy=True`) and to another
//! (`dl_device=(kDLROCM, k)`) go on the consumer's stream of the target device after the
//! producer's events; their source is released stream-ordered.

use super::{DeviceCopy, StreamWork, device_copy_parts};
use crate::engine::cuda::{ReadyEvents, release_after_hip};
use crate::engine::hip::{
    self, HipError, HipEvent, HipMemory, HipStream, MAX_PITCH, check_not_capturing, check_pointer,
    check_producer_stream, check_stream, copy_on_device, copy_span_to_host, copy_stream,
    hipStream_t, order_before, order_before_on, record_events, synchronize_streams,
};
use crate::export::copied::{build_copied, copy_to_host as host_copy};
use crate::export::parts::AnyStream;
use crate::export::{ExportBuffer, ExportError, ExportRequest};
use crate::plan::copy::StridedCopy;
use crate::plan::stream::{
    CopyPlan, StreamId, StreamRequest, SyncPlan, parse_stream, plan_copy, plan_copy_to, plan_sync,
};
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::DataType;
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::ManagedTensor;

/// What a host wait or copy for a producer stream being captured is refused as, and what to do
/// instead.
const HOST_COPY_UNDER_CAPTURE: (&str, &str) = (
    "a copy to the host (dl_device=(CPU, 0)) after the producer's work",
    "copy to the host after the capture ends (and after a launch of its graph)",
);

/// Whether `device` is memory the HIP runtime orders: ROCm device or pinned host memory.
#[inline(always)]
pub(super) fn is_rocm_memory(device: Device) -> bool {
    matches!(device.device_type, DeviceType::Rocm | DeviceType::RocmHost)
}

/// The identity of a HIP stream handle within one exchange (NULL is the default stream,
/// `hipStreamPerThread` the per-thread one).
pub(super) fn hip_stream_id(raw: hipStream_t) -> StreamId {
    match raw as usize {
        0 => StreamId::LegacyDefault,
        2 => StreamId::PerThreadDefault,
        h => StreamId::Handle(
            core::num::NonZeroU64::new(h as u64).unwrap_or(core::num::NonZeroU64::MIN),
        ),
    }
}

/// The handle of a stream identity: NULL for the default stream, `hipStreamPerThread` (2), or
/// the handle itself.
fn raw_hip_stream(stream: StreamId) -> hipStream_t {
    match stream {
        StreamId::LegacyDefault => core::ptr::null_mut(),
        StreamId::PerThreadDefault => 2 as hipStream_t,
        StreamId::Handle(h) => h.get() as usize as hipStream_t,
    }
}

impl StreamWork<'_> {
    /// [`StreamWork::order_pending`] for a tensor on `device`, ROCm memory: checks that the data
    /// pointer (`hipPointerGetAttributes`) and the producer streams (`hipStreamGetDevice`)
    /// belong to the tensor's device, parses `stream` with the ROCm column, plans the
    /// synchronization and carries it out: an event dependency (the host never blocks), nothing
    /// for `stream=-1` or the producer's own stream, a host wait only where the plan says so.
    /// Capture status is asked before anything is waited for. For a copy to the host, the
    /// stream the copy goes on is made to wait for the producer's work.
    ///
    /// The HIP events the consumer's stream is ready after (one of each pending stream, and
    /// those of `upstream`, a relay's) go on with the tensor ([`StreamWork::carry`]), and to
    /// the caller of [`export_with_ready_events`](super::export_with_ready_events) when wanted.
    ///
    /// # Errors
    ///
    /// [`ExportError::Stream`]; [`ExportError::Hip`]: no HIP runtime with pending work, a
    /// pointer or stream of another device, a CUDA stream named
    /// ([`HipError::ForeignStream`]), CUDA events of a relay ([`HipError::ForeignEvents`]), a
    /// stream being captured ([`HipError::Capturing`]); [`ExportError::CopyUnsupported`] for a
    /// copy other than to the host.
    pub(super) fn order_rocm(
        &mut self,
        device: Device,
        data: u64,
        has_elements: bool,
        pending: &[AnyStream<'_>],
        upstream: Option<&ReadyEvents>,
    ) -> Result<(), ExportError> {
        let request = self.request;
        let streams = hip_streams(device, pending)?;
        let on_device = device.device_type == DeviceType::Rocm;
        let target = request.dl_device.unwrap_or(device);
        if self.copies {
            // A request that cannot be served is refused before the runtime is asked anything.
            request.check(device)?;
            if on_device && target != Device::CPU && target.device_type != DeviceType::Rocm {
                return Err(ExportError::CopyUnsupported { device });
            }
        }
        if on_device
            && has_elements
            && (!streams.is_empty() || upstream.is_some() || hip::init().is_ok())
        {
            check_pointer(data, device.device_id)?;
        }
        for stream in &streams {
            check_producer_stream(stream, device.device_id)?;
        }
        let raws: Vec<hipStream_t> = streams.iter().map(|s| s.raw()).collect();
        if self.copies {
            if (raws.is_empty() && upstream.is_none()) || !has_elements {
                return Ok(());
            }
            if !on_device {
                // Pinned host memory is copied by the host: it waits for the pending work.
                synchronize_streams(device.device_id, &raws)?;
                return Ok(upstream.map_or(Ok(()), ReadyEvents::synchronize_hip)?);
            }
            if target != Device::CPU {
                return self.order_rocm_copy(device, target, &raws, upstream);
            }
            // The copy reads after the producer's work: the copy's stream waits for it. Work
            // of a stream being captured runs only at a launch of its graph: refused first.
            let current = hip::CurrentDevice::save()?;
            current.set(device.device_id)?;
            let (operation, instead) = HOST_COPY_UNDER_CAPTURE;
            for &raw in &raws {
                check_not_capturing(raw, operation, instead)?;
            }
            let on = copy_stream(device.device_id)?;
            order_before(device.device_id, &raws, on)?;
            if let Some(upstream) = upstream {
                upstream.wait_on_hip_raw(device.device_id, on)?;
            }
            return Ok(());
        }
        if raws.is_empty() && upstream.is_none() {
            return Ok(());
        }
        let stream_request = parse_stream(target, request.stream)?;
        let consumer = StreamId::of_request(stream_request).map(raw_hip_stream);
        if let Some(consumer) = consumer {
            check_stream(consumer, device.device_id, "consumer")?;
        }
        let identities: Vec<StreamId> = raws.iter().map(|&raw| hip_stream_id(raw)).collect();
        // Whether `kept` holds an event of every pending stream.
        let recorded = match (plan_sync(device, &identities, stream_request)?, consumer) {
            // The consumer's stream waits on an event of each other pending stream; those
            // events, and one on a pending stream that is the consumer's own, are what the
            // tensor is ready after.
            (SyncPlan::EventDependency { .. }, Some(consumer))
            | (SyncPlan::Nothing, Some(consumer)) => {
                let kept = order_before(device.device_id, &raws, consumer)?;
                self.kept = ReadyEvents::of_hip(kept);
                true
            }
            (SyncPlan::HostSync { .. }, _) => {
                synchronize_streams(device.device_id, &raws)?;
                false
            }
            _ => raws.is_empty(),
        };
        self.follow_upstream(
            upstream,
            consumer,
            stream_request == StreamRequest::Host,
            |upstream, consumer| upstream.wait_on_hip_raw(device.device_id, consumer),
            ReadyEvents::synchronize_hip,
        )?;
        Ok(self.keep_ready_events(recorded, || {
            record_events(device.device_id, &raws).map(ReadyEvents::of_hip)
        })?)
    }

    /// Plans a copy of a ROCm tensor on `device` onto the ROCm device `target` (`copy=True` on
    /// its own device, or `dl_device=(kDLROCM, k)`) for the producer streams `raws` and the
    /// events `upstream`, and orders them before the stream the copy goes on: the consumer's
    /// stream of `target` ([`plan_copy`], [`plan_copy_to`] for another device; `stream=-1`
    /// puts it on the producer's stream, or the target's default stream, and the host waits).
    /// That stream's capture status is asked first: a copy under capture is refused (its
    /// memory would be allocated once and written at every launch).
    fn order_rocm_copy(
        &mut self,
        device: Device,
        target: Device,
        raws: &[hipStream_t],
        upstream: Option<&ReadyEvents>,
    ) -> Result<(), ExportError> {
        let identities: Vec<StreamId> = raws.iter().map(|&raw| hip_stream_id(raw)).collect();
        let copy = rocm_copy_plan(device, target, self.request, &identities)?;
        let on = raw_hip_stream(copy.on);
        refuse_rocm_copy_under_capture(target, on)?;
        if !raws.is_empty() {
            order_before_on(device.device_id, raws, target.device_id, on)?;
        }
        if let Some(upstream) = upstream {
            upstream.wait_on_hip_raw(target.device_id, on)?;
        }
        self.copy = Some(copy);
        Ok(())
    }

    /// The copy `request` asks of the ROCm tensor `managed`: to the host (`dl_device=(CPU, 0)`),
    /// on this crate's copy stream of the tensor's device, which [`StreamWork::order_rocm`] made
    /// wait for the producer's pending work; the host waits for the copy. The result is compact
    /// row-major `cpu:0` memory, flagged `IS_COPIED` and writable.
    ///
    /// # Errors
    ///
    /// [`ExportError::CopyUnsupported`] for any other copy (`copy=True` on the device, another
    /// device); [`ExportError::Hip`] from the runtime.
    pub(crate) fn copy_rocm_memory(
        &mut self,
        managed: ManagedTensor,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError> {
        let layout = managed.layout()?;
        let device = layout.device();
        if device.device_type != DeviceType::Rocm {
            return Err(ExportError::CopyUnsupported { device });
        }
        if request.dl_device != Some(Device::CPU) {
            let copied = self.copy_rocm_on_device(managed, request)?;
            return Ok(self.keep_ready(copied));
        }
        // Sub-byte elements are refused by `host_copy`, before the closure runs.
        let span = layout.span();
        let span_len = span.len();
        let first = layout.byte_offset() as isize - span.start;
        let base = (layout.data() as usize as u64).wrapping_add_signed(span.start as i64);
        let copied = host_copy(&layout, request.wants_versioned(), None, |dst, plan| {
            // The span comes over in one transfer and is compacted on the host.
            let mut staging: Vec<u8> = Vec::new();
            staging
                .try_reserve_exact(span_len)
                .map_err(|_| ExportError::CopyUnsupported { device })?;
            // SAFETY: `base` is the start of the tensor's validated span in device memory of
            // its device, `span_len` bytes, kept alive by `managed` until this returns;
            // `staging` has room for them.
            unsafe { copy_span_to_host(device.device_id, base, span_len, staging.as_mut_ptr()) }?;
            // SAFETY: the copy wrote all `span_len` bytes (it completed).
            unsafe { staging.set_len(span_len) };
            let host = plan.in_host_order(layout.shape(), &layout.strides_vec());
            debug_assert_eq!(host.bytes(), plan.bytes());
            if span_len > 0 {
                // SAFETY: element (0, ..., 0) is at `first` inside the staged span, which holds
                // every element of the layout; `dst` has `plan.bytes()` bytes (`host_copy`'s
                // contract), as `host` writes.
                unsafe { host.run_on_host(staging.as_ptr().offset(first), dst) };
            }
            Ok(())
        });
        drop(managed);
        copied
    }
}

impl StreamWork<'_> {
    /// The device copy `request` asks of the ROCm tensor `managed` (`copy=True`, or
    /// `dl_device=(kDLROCM, k)`), on the stream [`StreamWork::order_rocm`] planned and ordered
    /// after the producer's work (or, for a tensor built without stream work, after the ready
    /// events it carries): compact row-major memory of the target device, written with
    /// `hipMemcpyAsync`/`hipMemcpy2DAsync` (one device) or `hipMemcpyPeerAsync` (between
    /// devices) on that stream, flagged `IS_COPIED`. The source is released once the stream has
    /// passed the copy (stream-ordered release, no host wait) unless the host waits for the copy
    /// (`stream=-1`); an event recorded on the stream after the copy comes with the result.
    fn copy_rocm_on_device(
        &mut self,
        source: ManagedTensor,
        request: &ExportRequest,
    ) -> Result<(ManagedTensor, Option<ReadyEvents>), ExportError> {
        let device = Device::from_raw(source.dl_tensor().device);
        let target = request.dl_device.unwrap_or(device);
        if target.device_type != DeviceType::Rocm {
            return Err(ExportError::CopyUnsupported { device });
        }
        let layout = source.layout()?;
        let has_elements = layout.numel() > 0;
        let copy = match self.copy.take() {
            Some(copy) => copy,
            None => {
                let copy = rocm_copy_plan(device, target, request, &[])?;
                let on = raw_hip_stream(copy.on);
                refuse_rocm_copy_under_capture(target, on)?;
                if let Some(ready) = source.ready_events().filter(|_| has_elements) {
                    ready.wait_on_hip_raw(target.device_id, on)?;
                }
                copy
            }
        };
        let on = raw_hip_stream(copy.on);
        let dtype = layout.dtype();
        let Some(size) = dtype.element_bytes() else {
            return Err(LayoutError::SubByteAccess { dtype }.into());
        };
        let plan = StridedCopy::new(layout.shape(), &layout.strides_vec(), size, MAX_PITCH)?;
        let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
        let src = layout.first_element_ptr() as usize as u64;
        let memory = HipMemory::alloc(target.device_id, plan.bytes(), dtype)?;
        let current = hip::CurrentDevice::save()?;
        current.set(target.device_id)?;
        // SAFETY: `plan` was made for the source's validated layout, whose memory `source`
        // keeps alive until the stream has passed the copy (released after it below, or after
        // the host waited); `memory` has `plan.bytes()` bytes; `on` is the consumer's stream
        // of the target device, valid for the call (checked when the copy was planned).
        let enqueued = unsafe { copy_on_device(&plan, src, device.device_id, &memory, on) };
        if copy.host_wait || enqueued.is_err() {
            // The host waits for whatever was enqueued before the source goes.
            let waited = synchronize_streams(target.device_id, &[on]);
            drop(source);
            enqueued.and(waited)?;
        } else {
            release_after_hip(
                Box::new(source),
                ReadyEvents::default(),
                target.device_id,
                on,
            )?;
        }
        let ready = if copy.host_wait || memory.byte_len() == 0 {
            None
        } else {
            Some(ReadyEvents::of_hip(vec![HipEvent::recorded(on)?]))
        };
        drop(current);
        let copied = build_copied(
            DeviceCopy { memory, shape },
            &device_copy_parts,
            request.wants_versioned(),
        )?;
        Ok((copied, ready))
    }
}

super::copy_memory_buffer!(HipMemory, |m| Device::new(DeviceType::Rocm, m.device()));

/// Where a copy of a ROCm tensor on `device` to the ROCm device `target` goes, for the producer
/// streams `pending` ([`plan_copy`] on one device; [`plan_copy_to`] for another, whose stream
/// identities name streams of that device). The target device must exist.
fn rocm_copy_plan(
    device: Device,
    target: Device,
    request: &ExportRequest,
    pending: &[StreamId],
) -> Result<CopyPlan, ExportError> {
    let stream_request = parse_stream(target, request.stream)?;
    if target == device {
        return Ok(plan_copy(device, pending, stream_request)?);
    }
    let count = hip::device_count()?;
    if target.device_id < 0 || target.device_id >= count {
        return Err(ExportError::NoSuchDevice {
            requested: target,
            count,
        });
    }
    Ok(plan_copy_to(device, pending, stream_request)?)
}

/// Refuses a device copy on the stream `on` of `target` (valid for the call) when it is not of
/// that device or is being captured into a HIP graph, asked before anything is enqueued, so
/// the capture is left as it was.
fn refuse_rocm_copy_under_capture(target: Device, on: hipStream_t) -> Result<(), HipError> {
    check_stream(on, target.device_id, "consumer")?;
    let current = hip::CurrentDevice::save()?;
    current.set(target.device_id)?;
    check_not_capturing(
        on,
        "a copy for the consumer (copy=True or a dl_device the tensor is not on; its memory would be allocated once and written at every launch)",
        "copy before the capture begins or after it ends, or import without a copy and copy inside the capture into memory kept for the graph",
    )
}

/// Makes this crate's copy stream of `device` (ROCm memory) wait for the consumer's `stream`
/// (ROCm column of the stream table: `None` and `0` the default stream, a `hipStream_t`, `-1`
/// nothing): a consumer that copies to the host memory a producer handed over despite
/// `dl_device=(CPU, 0)` reads after the work that producer ordered before `stream`, as the
/// CUDA consumer does with an event recorded on its stream. The consumer's stream is checked
/// to belong to `device` and not to be captured (a host copy cannot wait for captured work)
/// before anything is recorded.
///
/// # Errors
///
/// [`ExportError::Stream`] for a value the ROCm column refuses (`1`, `2`); [`ExportError::Hip`]:
/// no HIP runtime, a stream of another device, a stream being captured.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn order_stream_before_host_copy(
    device: Device,
    stream: Option<i64>,
) -> Result<(), ExportError> {
    let Some(consumer) = StreamId::of_request(parse_stream(device, stream)?) else {
        return Ok(());
    };
    let consumer = raw_hip_stream(consumer);
    let current = hip::CurrentDevice::save()?;
    current.set(device.device_id)?;
    check_stream(consumer, device.device_id, "consumer")?;
    let (operation, instead) = HOST_COPY_UNDER_CAPTURE;
    check_not_capturing(consumer, operation, instead)?;
    // The copy stream is this crate's, never captured: the events may go once it has waited.
    order_before(
        device.device_id,
        &[consumer],
        copy_stream(device.device_id)?,
    )?;
    Ok(())
}

/// `managed` (memory of a ROCm device, imported for the consumer's `stream`, read by the ROCm
/// column: `None` and `0` the default stream, a `hipStream_t`, `-1` nothing) carrying a HIP
/// event recorded on that stream ([`ManagedTensor::ready_events`]), so that lending the import
/// on (a relay) orders the next consumer after the work its producer ordered before `stream`,
/// as `made_ready_on` does for CUDA memory. Unchanged when it carries ready events already, for
/// `-1`, and for a stream being captured (an event recorded inside a capture is no readiness
/// outside it).
///
/// # Errors
///
/// [`ExportError::Stream`] for a value the ROCm column refuses (`1`, `2`); [`ExportError::Hip`]
/// from the runtime (a stream of another device, say). `managed` is dropped then, and its
/// deleter runs.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn made_ready_on_rocm(
    managed: ManagedTensor,
    stream: Option<i64>,
) -> Result<ManagedTensor, ExportError> {
    let device = Device::from_raw(managed.dl_tensor().device);
    if device.device_type != DeviceType::Rocm || managed.ready_events().is_some() {
        return Ok(managed);
    }
    let Some(consumer) = StreamId::of_request(parse_stream(device, stream)?) else {
        return Ok(managed);
    };
    let consumer = raw_hip_stream(consumer);
    let current = hip::CurrentDevice::save()?;
    current.set(device.device_id)?;
    if hip::capture_of(consumer)? != hip::Capture::Not {
        return Ok(managed);
    }
    let event = HipEvent::recorded(consumer)?;
    drop(current);
    Ok(crate::export::ready::wrap(
        managed,
        ReadyEvents::of_hip(vec![event]),
    ))
}

/// The HIP streams of `pending`, the producer streams of a ROCm tensor on `device`.
///
/// # Errors
///
/// [`HipError::ForeignStream`] for a CUDA stream.
fn hip_streams<'a>(
    device: Device,
    pending: &[AnyStream<'a>],
) -> Result<Vec<&'a HipStream>, HipError> {
    pending
        .iter()
        .map(|stream| match *stream {
            AnyStream::Hip(stream) => Ok(stream),
            AnyStream::Cuda(_) => Err(HipError::ForeignStream {
                found: "CUDA",
                expected: "HIP",
                device,
            }),
        })
        .collect()
}
