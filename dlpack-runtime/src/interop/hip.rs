//! ROCm/HIP (feature `hip`): stream-ordered hand-off of `kDLROCM` tensors, on a hand-written
//! binding of the HIP runtime loaded at run time from `libamdhip64.so` (then `.so.7`, `.so.6`,
//! `$ROCM_PATH/lib/` and `/opt/rocm/lib/`). The crate builds without ROCm; without the runtime
//! every entry point returns [`HipError::NoDriver`], never panics.
//!
//! The `hip` feature implies `cuda`: the export machinery of the hand-off is shared with the
//! CUDA tier, so cudarc is compiled, but a ROCm export never calls the CUDA driver.
//!
//! A producer names pending work on a ROCm tensor with a [`HipStream`] (`#[dlpack(stream)]`
//! field: `HipStream`, `Arc<HipStream>`, or `Option` of either), or holds its data in a
//! [`HipSlice`], whose own stream is pending. An export to a consumer's stream (the `stream`
//! argument of `__dlpack__`, ROCm column: `None` and `0` the default stream, `-1` no
//! synchronization, `> 2` a `hipStream_t`; `1` and `2` are refused):
//!
//! - makes the consumer's stream wait on an event recorded on each pending producer stream
//!   (`hipEventRecord`, `hipStreamWaitEvent`); the host never blocks. The producer's own stream
//!   and `stream=-1` need nothing;
//! - blocks the host only where the consumer reads on the host (`kDLROCMHost` memory with
//!   `dl_device=(CPU, 0)`), with the GIL released meanwhile;
//! - copies device memory to the host for `dl_device=(CPU, 0)`: one transfer of the tensor's
//!   span on a stream of this crate made to wait for the producer's work, compacted on the
//!   host, flagged `IS_COPIED`;
//! - with [`DlpackExport::into_dlpack_with_ready_events`](crate::DlpackExport::into_dlpack_with_ready_events),
//!   returns [`ReadyEvents`]: HIP events recorded on the pending producer streams, owned by the
//!   consumer, which any stream of the device may wait on later
//!   ([`ReadyEvents::wait_on_hip`]) or the host ([`ReadyEvents::synchronize`]);
//! - makes the exported tensor carry the events its consumer's stream is ready after
//!   ([`ManagedTensor::ready_events`](crate::ManagedTensor::ready_events)), so that an import of
//!   it lent on (a relay) orders the next consumer after the original producer;
//! - checks that the data pointer (`hipPointerGetAttributes`) and every stream
//!   (`hipStreamGetDevice`) belong to the tensor's device, and that no CUDA stream is named
//!   for a ROCm tensor (nor a HIP stream for a CUDA one): [`HipError::ForeignStream`].
//!
//! # Graph capture
//!
//! HIP before ROCm 7.14 does not report the errors of capture-unsafe calls made during a
//! capture (pytorch/pytorch#187110): a host synchronization of a capturing stream returns
//! success and the capture is silently invalidated. This crate therefore asks
//! `hipStreamIsCapturing` (and `hipStreamGetCaptureInfo`) before every host-side wait or query
//! and refuses with [`HipError::Capturing`]; it never relies on an error from the call. A
//! consumer stream being captured waits on the producer's event as part of the capture (the
//! exported tensor keeps the event, recorded once and never again, since every launch waits
//! on it: keep the tensor as long as the graph may be launched); a producer stream captured
//! apart from the consumer's is refused. Events come from a pool per device (after warm-up an
//! exchange creates none); one that a capture waited on is destroyed, not pooled.
//!
//! Stream-ordered release ([`release_after`], [`ImportedData::release_after_hip`]): an imported
//! tensor's deleter runs only after a HIP stream of the consumer has finished with it (a HIP
//! event recorded on it, waited for by a thread of this crate off the GIL), and after the
//! events it is ready after. The stream's capture status is asked first: a stream being
//! captured is refused and the tensor leaked (the graph reads it at every launch).
//!
//! Copies for ROCm consumers: `copy=True` on the tensor's device and `dl_device=(kDLROCM, k)`
//! for another ROCm device go on the consumer's stream of the target device (the `stream`
//! argument names a stream of that device), after the producer's events (`hipMemcpyAsync` or
//! `hipMemcpy2DAsync` on one device, `hipMemcpyPeerAsync` between devices): new compact
//! memory (`hipMalloc`), flagged `IS_COPIED`, with an event recorded after the copy that it carries. The
//! source is released once that stream has passed the copy; with `stream=-1` the host waits
//! for the copy instead. A consumer's stream being captured is refused before anything is
//! enqueued. The copy's deleter does not wait: a thread of this crate frees the memory with
//! `hipFree` on the copy's device, which first waits for that device's work submitted so far
//! (its implicit `hipDeviceSynchronize()`, `hip_runtime_api.h`), so work the consumer enqueued
//! before releasing the copy still reads it. (The deleter carries no stream, `dlpack.h`
//! `DLManagedTensorVersioned::deleter`: nothing narrower than the device can be waited for.)

pub use crate::engine::cuda::ReadyEvents;
use crate::engine::cuda::release_after_hip;
pub use crate::engine::hip::{
    HipError, HipSlice, HipStream, check_pointer, device_count, init, pointer_device,
};
use crate::export::{AnyStream, AsProducerStream, ExportBuffer, ProducerStream};
use crate::import::ImportedData;
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::{DataType, Element};
use crate::tensor::managed::ManagedTensor;

// SAFETY: a `HipSlice<T>` owns `len` elements of `T` in device memory of its stream's device
// (`hipMallocAsync`, aligned to at least 256 bytes, enough for every element type); the
// mutable pointer comes from `&mut self`. `T: Element` gives the dtype.
unsafe impl<T: Element> ExportBuffer for HipSlice<T> {
    fn dtype(&self) -> DataType {
        T::DTYPE
    }
    fn device(&self) -> Device {
        Device::new(DeviceType::Rocm, HipSlice::device(self))
    }
    fn byte_len(&self) -> usize {
        HipSlice::byte_len(self)
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.device_ptr() as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.device_ptr() as usize as *mut core::ffi::c_void)
    }
    fn producer_stream(&self) -> Option<ProducerStream<'_>> {
        Some(ProducerStream::from(&**self.stream()))
    }
}

impl<'a> From<&'a HipStream> for ProducerStream<'a> {
    fn from(stream: &'a HipStream) -> Self {
        Self(AnyStream::Hip(stream))
    }
}

impl AsProducerStream for HipStream {
    fn as_producer_stream(&self) -> Option<ProducerStream<'_>> {
        Some(ProducerStream::from(self))
    }
}

/// Stream-ordered release: `tensor`'s deleter runs only after the HIP stream `stream` has
/// completed the work enqueued on it so far (the deleter carries no stream: `dlpack.h`,
/// `DLManagedTensorVersioned::deleter`), and after the events the tensor is ready after, if it
/// carries any ([`ManagedTensor::ready_events`]: its producer's pending work). A HIP event is
/// recorded on `stream` now; a thread of this crate waits for it and those
/// (`hipEventSynchronize`, off the GIL), then drops the tensor. The stream's capture status is
/// asked before anything is recorded or waited for.
///
/// # Errors
///
/// [`HipError::Capturing`] (or [`HipError::DefaultStreamUnderCapture`]) when `stream` is being
/// captured into a HIP graph: the tensor is leaked (said on stderr), since the captured work
/// reads it whenever the graph is launched. [`HipError::NoDriver`] without a HIP runtime: the
/// tensor is released at once (no stream runs). [`HipError`] when the event cannot be recorded:
/// the tensor is then released after a host synchronization of `stream` (leaked, and said on
/// stderr, if that fails too: it may still be read).
pub fn release_after(tensor: ManagedTensor, stream: &HipStream) -> Result<(), HipError> {
    let after = tensor.ready_events().cloned().unwrap_or_default();
    release_after_hip(Box::new(tensor), after, stream.device(), stream.raw())
}

impl<T: Element> ImportedData<T> {
    /// Stream-ordered release of this import after a HIP stream: see [`release_after`].
    ///
    /// # Errors
    ///
    /// As [`release_after`]; the tensor is released (or leaked) either way.
    pub fn release_after_hip(self, stream: &HipStream) -> Result<(), HipError> {
        release_after(self.into_managed(), stream)
    }
}
