//! The export's device work for ROCm tensors (feature `hip`), on the HIP driver tier: the
//! hand-off of `kDLROCM` (and `kDLROCMHost`) memory, and its copy to the host. The CUDA driver
//! is never called here.
//!
//! What is not done for ROCm yet: ready events that outlive the call
//! ([`export_with_ready_events`](super::export_with_ready_events) returns none for a ROCm
//! tensor), stream-ordered release of ROCm imports, copies on or between ROCm devices
//! (`copy=True` without `dl_device=cpu`), and relays.

use super::StreamWork;
use crate::engine::hip::{
    self, HipError, HipStream, check_not_capturing, check_pointer, check_stream, copy_span_to_host,
    copy_stream, hipStream_t, order_before, synchronize_streams,
};
use crate::export::copied::copy_to_host as host_copy;
use crate::export::parts::AnyStream;
use crate::export::{ExportError, ExportRequest};
use crate::plan::copy::StridedCopy;
use crate::plan::stream::{StreamId, SyncPlan, parse_stream, plan_sync};
use crate::tensor::device::{Device, DeviceType};
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
    /// # Errors
    ///
    /// [`ExportError::Stream`]; [`ExportError::Hip`]: no HIP runtime with pending work, a
    /// pointer or stream of another device, a CUDA stream named
    /// ([`HipError::ForeignStream`]), a stream being captured ([`HipError::Capturing`]);
    /// [`ExportError::CopyUnsupported`] for a copy other than to the host.
    pub(super) fn order_rocm(
        &mut self,
        device: Device,
        data: u64,
        has_elements: bool,
        pending: &[AnyStream<'_>],
    ) -> Result<(), ExportError> {
        let request = self.request;
        let streams = hip_streams(device, pending)?;
        let on_device = device.device_type == DeviceType::Rocm;
        if self.copies {
            // A request that cannot be served is refused before the runtime is asked anything.
            request.check(device)?;
            if on_device && request.dl_device.unwrap_or(device) != Device::CPU {
                return Err(ExportError::CopyUnsupported { device });
            }
        }
        if on_device && has_elements && (!streams.is_empty() || hip::init().is_ok()) {
            check_pointer(data, device.device_id)?;
        }
        for stream in &streams {
            check_stream(stream.raw(), device.device_id, "producer")?;
        }
        let raws: Vec<hipStream_t> = streams.iter().map(|s| s.raw()).collect();
        if self.copies {
            if raws.is_empty() || !has_elements {
                return Ok(());
            }
            if !on_device {
                // Pinned host memory is copied by the host: it waits for the pending work.
                return Ok(synchronize_streams(device.device_id, &raws)?);
            }
            // The copy reads after the producer's work: the copy's stream waits for it. Work
            // of a stream being captured runs only at a launch of its graph: refused first.
            let current = hip::CurrentDevice::save()?;
            current.set(device.device_id)?;
            let (operation, instead) = HOST_COPY_UNDER_CAPTURE;
            for &raw in &raws {
                check_not_capturing(raw, operation, instead)?;
            }
            order_before(device.device_id, &raws, copy_stream(device.device_id)?)?;
            return Ok(());
        }
        if raws.is_empty() {
            return Ok(());
        }
        let target = request.dl_device.unwrap_or(device);
        let stream_request = parse_stream(target, request.stream)?;
        let identities: Vec<StreamId> = raws.iter().map(|&raw| hip_stream_id(raw)).collect();
        match plan_sync(device, &identities, stream_request)? {
            SyncPlan::Nothing => Ok(()),
            SyncPlan::EventDependency { wait_on, .. } => {
                let consumer = raw_hip_stream(wait_on);
                check_stream(consumer, device.device_id, "consumer")?;
                Ok(order_before(device.device_id, &raws, consumer)?)
            }
            SyncPlan::HostSync { .. } => Ok(synchronize_streams(device.device_id, &raws)?),
        }
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
        if device.device_type != DeviceType::Rocm || request.dl_device != Some(Device::CPU) {
            return Err(ExportError::CopyUnsupported { device });
        }
        let dtype = layout.dtype();
        let Some(size) = dtype.element_bytes() else {
            return Err(LayoutError::SubByteAccess { dtype }.into());
        };
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
            let host = StridedCopy::for_host(layout.shape(), &layout.strides_vec(), size);
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
    Ok(order_before(
        device.device_id,
        &[consumer],
        copy_stream(device.device_id)?,
    )?)
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
