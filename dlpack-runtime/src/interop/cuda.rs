//! CUDA (feature `cuda`), on cudarc with dynamic loading: stream-ordered exchange of device
//! memory.
//!
//! Without a driver every entry point returns [`CudaError::NoDriver`] ([`init`] probes for
//! `libcuda` first, where cudarc itself would panic). With one, an export whose producer names
//! streams with pending work (`#[dlpack(stream)]` fields, a cudarc `CudaSlice`'s own stream):
//!
//! - makes the consumer's stream wait on them: an **event dependency**, a pooled event (timing
//!   disabled, reused) recorded on each producer stream and waited on by the consumer's stream
//!   (`cuEventRecord`, `cuStreamWaitEvent`); the host never blocks. The legacy (`1`) and
//!   per-thread (`2`) default streams map to `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`;
//! - blocks the host (`cuStreamSynchronize`) only for a consumer that reads on the host;
//! - copies CUDA memory when asked (`copy=True`, or `dl_device=(CPU, 0)`): compact row-major
//!   memory written by driver copies, one per 2-D block of the layout (`cuMemcpy2DAsync`), on
//!   the consumer's stream after the producer's work, flagged `IS_COPIED`; a device copy does
//!   not block the host, a host copy waits for the stream;
//! - checks that the data pointer (`cuPointerGetAttribute`) and every stream it uses
//!   (`cuStreamGetCtx`) belong to the tensor's device.
//!
//! Beyond the DLPack standard, for Rust-to-Rust exchange: [`ReadyEvents`], events recorded on
//! the producer's streams that a consumer waits on later, from any stream (events, never stream
//! handles, outlive the call); and [`release_after`], stream-ordered release: an imported
//! tensor is dropped only after the consumer's stream has passed a recorded event, by a reaper
//! thread (no CUDA call is made from a host callback).
//!
//! # Relays: lending an import on
//!
//! A tensor type that keeps an import ([`ImportedData`] or [`ManagedTensor`] as its data) and
//! exports it again is a relay. The import remembers what it was made ready after, as events
//! ([`ManagedTensor::ready_events`]): an export of this crate to a consumer stream keeps the
//! events it recorded on the producer's streams with pending work (and one on a producer
//! stream that is the consumer's own); a device copy keeps an event recorded after the copy;
//! and [`from_dlpack_with`](crate::python::from_dlpack_with) records one on the consumer's
//! stream when the CUDA tensor of another producer arrives. Lending the import on then, with no
//! `#[dlpack(stream)]` field to add:
//!
//! - a consumer stream waits on those events (`cuStreamWaitEvent`), so it is ordered after the
//!   original producer's work; the host does not block;
//! - a host consumer (`dl_device=(CPU, 0)`, `stream=None` on host memory) and host copies wait
//!   on the host for them; a device copy is enqueued after them;
//! - the exported tensor carries them on, so a relay of a relay is ordered too;
//! - [`release_after`] drops the import only after them as well as after its stream.
//!
//! What a relay does not order: work the relaying consumer enqueued itself on its own streams
//! after the import (name those with a `#[dlpack(stream)]` field), and imports made with
//! `stream=-1` (the consumer took the ordering on itself, so nothing is recorded), from a raw
//! capsule, or on a stream being captured into a graph (except for the events the export
//! recorded outside the capture, below).
//!
//! # CUDA graph capture
//!
//! A consumer that captures a region into a CUDA graph (`torch.cuda.graph`, `torch.compile`
//! with CUDA graphs, a serving engine) passes the capturing stream as `stream`. The graph runs
//! only when it is launched, as often as it is launched, so nothing may be ordered from
//! outside it by waiting on the host, and an ordinary event dependency would cross the
//! capture's boundary (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, which invalidates the capture).
//! The driver provides the one dependency that does cross it: a capturing stream may wait on
//! an event recorded outside the capture with `CU_EVENT_WAIT_EXTERNAL` (`cuStreamWaitEvent`);
//! the graph then has an event-wait node, and every launch waits for the event's most recent
//! record (`cuGraphAddEventWaitNode`). So an export to a stream being captured (checked with
//! `cuStreamIsCapturing`, which never invalidates a capture, and `cuStreamGetCaptureInfo`):
//!
//! - records an event on each producer stream with pending work, outside the capture, and
//!   makes the capturing stream wait on it as an external wait: every launch, the first one
//!   included even while the producer's work is still running, is ordered after the work the
//!   producer had enqueued when it exported. The host never blocks and the capture stays
//!   valid;
//! - the exported tensor owns those events ([`ManagedTensor::ready_events`], and
//!   [`ExportBuffer::ready_events`] on an [`ImportedData`]): a pooled event
//!   would be recorded again by a later exchange and move every later launch's wait, so these
//!   are never reused, and are destroyed when the tensor is released;
//! - a producer stream that is the capturing stream itself needs no event: work enqueued on it
//!   before the capture began runs before launches on that stream (a launch on another stream
//!   must be ordered after it by the caller). A `CudaSlice` of the capturing stream is exported
//!   too: cudarc's access tracking, which would make that stream wait on an event recorded
//!   before the capture, is handed a side stream of the context instead;
//! - a producer stream captured in the same capture (forked into it with an event) gets an
//!   event recorded inside the capture: an edge of the graph;
//! - a producer stream being captured with a consumer stream outside its capture is refused
//!   ([`CudaError::Capturing`]): its work runs only when its graph is launched.
//!
//! The rules a user keeps: the imported tensor lives as long as the graph may be launched (its
//! memory and the events the graph waits on go with it: a launch after its release reads freed
//! memory); a launch reads the memory as it is when the launch runs, ordered after the
//! producer's work at export time only: if the producer writes the memory again, order those
//! writes before the next launch yourself (for example, make the launch stream wait on
//! [`ReadyEvents`] recorded after them).
//!
//! What a cudarc user meets first under capture is cudarc's own event tracking, not this
//! crate. With it on (`CudaContext::is_managing_stream_synchronization`: the default once a
//! context has a second stream), each use of a `CudaSlice` on a stream makes that stream wait
//! (an ordinary `cuStreamWaitEvent`) on the event of the slice's last write, and records an
//! event of its own. Using, inside a capture, a slice whose last write was recorded before the
//! capture began (an upload or a `memset` before `begin_capture`, on any stream, however long
//! ago) makes the capturing stream wait on an event recorded outside the capture, which the
//! driver refuses with `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`; cudarc keeps that error in the
//! context (`CudaContext::check_err`) rather than returning it, and the capture is invalidated,
//! so the failure shows at `end_capture`. Synchronizing first does not help (the event stays the
//! slice's last write). What does: create the slices a graph uses with event tracking off
//! (`CudaContext::disable_event_tracking` before creating them, `unsafe` in cudarc: you then
//! order their streams yourself, for example with this crate's exports and [`ReadyEvents`]),
//! or create and first write them inside the capture. Exports of this crate do not trigger it: a
//! `CudaSlice` exported into a capture has its tracking handed a side stream (above).
//!
//! `stream=None` names the legacy default stream, which cannot be captured; while a blocking
//! stream of its context is being captured, any work on it would join that capture and
//! invalidate it (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`). An export to the legacy stream whose
//! producer names streams (`#[dlpack(stream)]` fields, a `CudaSlice`'s own stream: named
//! streams count as pending, whether or not they are idle) then is refused with
//! [`CudaError::LegacyStreamUnderCapture`] (`BufferError` in Python) before anything is
//! enqueued: the capture stays valid and nothing is read unordered. A producer that names no
//! stream needs nothing and the export succeeds; while only
//! non-blocking streams are captured, the legacy stream is ordered as usual (work captured on
//! another stream is not ordered by it: pass the capturing stream). PyTorch chose otherwise
//! (pytorch/pytorch#163242): its `__dlpack__` skips the synchronization while the current
//! stream is captured, which keeps the capture valid but leaves the read unordered; whether
//! `stream=None` should mean "no synchronization" is an open question of the array API
//! (data-apis/array-api#974). A consumer that orders the work itself can pass `stream=-1`
//! today.
//!
//! Copies (`copy=True`, or a `dl_device` the tensor is not on) to a stream being captured are
//! refused with [`CudaError::Capturing`] before anything is enqueued: the copy's memory would
//! be allocated once, now, and written at every launch. Copy before the capture begins or
//! after it ends, or import without a copy and copy inside the capture into memory kept for
//! the graph. A host copy (`dl_device=(CPU, 0)`) runs now, on the per-thread default stream
//! (outside any capture unless that stream is the one captured), and the host waits for it.
//! A copy to a stream outside every capture allocates in relaxed capture mode
//! (`cuThreadExchangeStreamCaptureMode`), as PyTorch's allocator does, so a capture in global
//! mode on another thread neither refuses it nor is invalidated by it. [`release_after`] a
//! stream being captured is refused and the tensor leaked.
//!
//! A refused export drops its producer, as every refused export does. A `CudaSlice` dropped
//! while its own stream is being captured frees itself on that stream, inside the capture,
//! which the driver may refuse (and the capture is then invalidated): keep slices of a
//! capturing stream alive until the capture ends, or export from a shared owner.
//!
//! The consumer: [`from_dlpack_with`](crate::python::from_dlpack_with) with the capturing
//! stream passes it to `__dlpack__`, so this crate's producers order themselves as above;
//! through a C exchange API (`dlpack.h`, `DLPackExchangeAPI`) the consumer orders the
//! producer's `current_work_stream` with the same external wait, and the import keeps the
//! event. A producer whose `__dlpack__` ignores `stream` is not ordered by anyone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, sys};

use crate::engine::cuda as driver;
pub use crate::engine::cuda::{CudaError, ReadyEvents, init};
use crate::engine::cuda::{CurrentContext, release_after_raw};
pub use crate::export::export_with_ready_events;

use crate::export::{AnyStream, AsProducerStream, ExportBuffer, ProducerStream};
use crate::import::ImportedData;
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::managed::ManagedTensor;

// SAFETY: a `CudaSlice<T>` owns `len` elements of `T` in device memory of its context's
// device; the pointers come from cudarc's accessors for the slice's own stream (recording the
// access as cudarc's event tracking expects), the mutable one from `&mut self`. `T: Element`
// gives the dtype; device allocations are aligned for every element type.
unsafe impl<T: Element + DeviceRepr> ExportBuffer for CudaSlice<T> {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn device(&self) -> Device {
        Device::cuda(self.ordinal() as i32)
    }
    fn byte_len(&self) -> usize {
        self.num_bytes()
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        // cudarc's access tracking may bind the slice's context: leave the thread's as it was.
        let _current = CurrentContext::save();
        let stream = tracking_stream(self.stream());
        let (ptr, _record) = self.device_ptr(&stream);
        ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        let _current = CurrentContext::save();
        let stream = tracking_stream(self.stream());
        let (ptr, _record) = self.device_ptr_mut(&stream);
        Some(ptr as usize as *mut core::ffi::c_void)
    }
    fn producer_stream(&self) -> Option<ProducerStream<'_>> {
        Some(ProducerStream::from(&**self.stream()))
    }
}

/// The stream to hand cudarc's access tracking when a slice of `stream` is exported: `stream`
/// itself, unless it is being captured into a CUDA graph. The tracking makes the stream it is
/// given wait on the slice's last write event, recorded outside any capture, which a capture
/// refuses (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, and the capture is invalidated). A stream
/// being captured hands the tracking to a side stream of its context instead (made once per
/// context, never captured); the export orders the consumer after the slice's stream itself.
fn tracking_stream(stream: &Arc<CudaStream>) -> Arc<CudaStream> {
    static SIDE: OnceLock<Mutex<HashMap<usize, Arc<CudaStream>>>> = OnceLock::new();
    let ctx = stream.context();
    if !ctx.is_managing_stream_synchronization() {
        return stream.clone();
    }
    // The slice's stream is live (it holds it); its default stream resolves in its context.
    let captured = driver::bind(ctx.cu_ctx())
        .and_then(|()| driver::capture_of(stream.cu_stream()))
        .is_ok_and(|capture| capture != driver::Capture::Not);
    if !captured {
        return stream.clone();
    }
    let key = ctx.cu_ctx() as usize;
    let side = SIDE.get_or_init(Default::default);
    if let Some(found) = side.lock().ok().and_then(|s| s.get(&key).cloned()) {
        return found;
    }
    // Made with the driver: cudarc's `new_stream` could synchronize the context, which a
    // capture forbids.
    match driver::kept_stream(ctx) {
        Ok(made) => match side.lock() {
            Ok(mut s) => s.entry(key).or_insert(made).clone(),
            Err(_) => made,
        },
        Err(_) => stream.clone(),
    }
}

/// Stream-ordered release: `tensor`'s deleter runs only after `stream` has completed the work
/// enqueued on it so far (the deleter carries no stream: `dlpack.h`,
/// `DLManagedTensorVersioned::deleter`), and after the events the tensor is ready after, if it
/// carries any ([`ManagedTensor::ready_events`]: its producer's pending work). An event is
/// recorded on `stream` now; a reaper thread waits for it and those, then drops the tensor.
///
/// # Errors
///
/// [`CudaError::Capturing`] when `stream` is being captured into a CUDA graph: the tensor is
/// leaked (said on stderr), since the captured work reads it whenever the graph is launched.
/// [`CudaError`] when the event cannot be recorded: the tensor is then released after a host
/// synchronization of `stream` (leaked, and said on stderr, if that fails too while the
/// context still runs: it may still be read).
pub fn release_after(tensor: ManagedTensor, stream: &CudaStream) -> Result<(), CudaError> {
    let after = tensor.ready_events().cloned().unwrap_or_default();
    // The tensor's deleter runs with its own device's primary context bound (the device of its
    // memory, which may not be the stream's).
    let device = tensor.dl_tensor().device;
    let owner = if device.device_type == crate::abi::ffi::kDLCUDA {
        crate::engine::cuda::context(device.device_id).ok()
    } else {
        None
    };
    release_after_raw(
        Box::new(tensor),
        after,
        stream.context(),
        stream.cu_stream(),
        owner,
    )
}

impl<T: Element> ImportedData<T> {
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
            DeviceType::Cuda | DeviceType::CudaManaged
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

impl<'a> From<&'a CudaStream> for ProducerStream<'a> {
    fn from(stream: &'a CudaStream) -> Self {
        Self(AnyStream::Cuda(stream))
    }
}

impl AsProducerStream for CudaStream {
    fn as_producer_stream(&self) -> Option<ProducerStream<'_>> {
        Some(ProducerStream::from(self))
    }
}

impl<S: AsProducerStream + ?Sized> AsProducerStream for std::sync::Arc<S> {
    fn as_producer_stream(&self) -> Option<ProducerStream<'_>> {
        (**self).as_producer_stream()
    }
}

impl<S: AsProducerStream> AsProducerStream for Option<S> {
    fn as_producer_stream(&self) -> Option<ProducerStream<'_>> {
        self.as_ref().and_then(AsProducerStream::as_producer_stream)
    }
}
