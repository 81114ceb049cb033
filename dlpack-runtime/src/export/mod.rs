//! The producer side: building managed tensors from Rust owners.
//!
//! A type becomes a producer by implementing [`DlpackExport`] (usually with
//! `#[derive(DlpackExport)]`): it describes its memory as [`ExportParts`], a borrowed
//! [`ExportBuffer`] plus shape, strides, offset, dtype, device and writability.
//! [`DlpackExport::into_dlpack_with`]
//! then moves the owner into **one heap block** that holds the `DLManagedTensorVersioned` (or
//! legacy `DLManagedTensor`) header, the `shape` and `strides` arrays and the owner itself; the
//! `extern "C"` deleter drops the owner and frees exactly that block, and never unwinds. Blocks
//! of up to 512 bytes (25 axes with an owner of one word, fewer with larger owners) whose owner
//! needs no more than 16-byte alignment are freed into a cache of the freeing thread, which
//! keeps at most 4 of each size (in steps of 64 bytes) for its next exports and gives them back
//! to the allocator when it exits: a thread that exports and drops in turn allocates nothing.
//! Where one thread exports and another drops, the exporting thread allocates every block and
//! the dropping one keeps at most 9 KiB of them.
//!
//! Before anything is handed out, the described layout is validated with the same rules a
//! consumer applies ([`crate::tensor::layout::validate`], in the same pass that writes the `shape` and
//! `strides` arrays) and its byte span is checked to lie inside the buffer, so safe code cannot
//! describe memory it does not own. The [`ManagedTensor`] returned records that validation, so a
//! Rust consumer does not validate the same header again.
//!
//! Buffers are reached through the safe trait [`AsExportBuffer`]: every [`ExportBuffer`] is one,
//! an `Arc` of one is one (exported writable while the `Arc` is unique, read-only otherwise), and
//! a storage enum over buffers (`enum Storage { F32(Vec<f32>), F64(Vec<f64>) }`) becomes one
//! with `#[derive(DlpackStorage)]` or a hand-written `impl`, without `unsafe`.

use std::sync::Arc;

mod block;
pub(crate) mod block_cache;
mod buffer;
// The device work (CUDA streams and copies), or its no-op twin without the `cuda` feature.
mod copied;
#[cfg_attr(not(feature = "cuda"), path = "no_device.rs")]
mod device;
mod error;
mod parts;
#[cfg(feature = "cuda")]
mod ready;
mod request;

use block::{build, legacy_read_only};
pub(crate) use block_cache::DEPTH as CACHED_BLOCKS_PER_CLASS;
pub use buffer::{AsExportBuffer, BufferAccess, BufferLayout, ExportBuffer};
#[cfg(feature = "python")]
pub(crate) use copied::allocate_host;
use copied::copy_of;
#[cfg(feature = "cuda")]
pub use device::export_with_ready_events;
pub(crate) use device::{COPIES_CUDA_MEMORY, StreamWork, keep_current_context, touches_cuda};
#[cfg(all(feature = "hip", feature = "python"))]
pub(crate) use device::{made_ready_on_rocm, order_stream_before_host_copy};
pub use error::ExportError;
#[cfg(feature = "cuda")]
pub(crate) use parts::AnyStream;
#[cfg(feature = "cuda")]
pub use parts::ProducerStream;
pub use parts::{AsProducerStream, AsShape, AsStrides, ExportParts};
#[cfg(all(feature = "cuda", feature = "python"))]
pub(crate) use ready::{made_ready_on, wrap as carry_ready_events};
pub use request::ExportRequest;
#[cfg(feature = "python")]
pub(crate) use request::copies_between;

use crate::abi::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::managed::ManagedTensor;

/// A DLPack producer: a type whose memory can be lent as a managed tensor.
///
/// Usually derived with `#[derive(DlpackExport)]`. The two methods describe the memory; the
/// provided methods do the export.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a DLPack producer",
    label = "not `DlpackExport`",
    note = "a tensor type derives `#[derive(dlpack_runtime::DlpackExport)]`; a generic one exports when its fields do, so check bounds such as `T: dlpack_runtime::Element` on its element type",
    note = "a wrapper around a producer (a `#[pyclass]` around another crate's tensor) derives it with `#[dlpack(transparent)]`"
)]
pub trait DlpackExport {
    /// Describes the memory for a read-only export through `&self` (shared export).
    fn export_parts(&self) -> ExportParts<'_>;

    /// Describes the memory for an export by value: writable unless the buffer is shared or
    /// marked read-only.
    fn export_parts_mut(&mut self) -> ExportParts<'_>;

    /// `__dlpack_device__`: the device of the memory.
    fn dlpack_device(&self) -> Device {
        self.export_parts().device()
    }

    /// Moves `self` into a versioned managed tensor (DLPack 1.3), with no stream and no copy:
    /// the Rust-to-Rust default.
    ///
    /// # Errors
    ///
    /// As [`DlpackExport::into_dlpack_with`].
    #[inline]
    fn into_dlpack(self) -> Result<ManagedTensor, ExportError>
    where
        Self: Sized + Send + 'static,
    {
        self.into_dlpack_with(&ExportRequest::versioned())
    }

    /// Moves `self` into a managed tensor as `request` asks (the arguments of `__dlpack__`).
    ///
    /// # Errors
    ///
    /// [`ExportError::Layout`] when the described layout is invalid or reaches outside the
    /// buffer; [`ExportError::Stream`] for a `stream` illegal on the device;
    /// [`ExportError::ReadOnlyLegacy`] for a legacy request of a read-only tensor with
    /// `copy=False` (with `copy=None` or `True` that request gets a writable copy);
    /// [`ExportError::UnsupportedDevice`], [`ExportError::CopyRequired`] or
    /// [`ExportError::CopyUnsupported`] when `dl_device`/`copy` cannot be served;
    /// [`ExportError::DeviceMismatch`] when a device field disagrees with the buffer; (feature
    /// `cuda`) `ExportError::Cuda` for a driver failure, a pointer or stream of another device,
    /// and under CUDA graph capture `CudaError::Capturing` (a copy to a stream being captured,
    /// a producer stream captured apart from the consumer's) or
    /// `CudaError::LegacyStreamUnderCapture` (`stream=None` while a blocking stream is
    /// captured; the `cuda` module docs). `self` is dropped on error.
    #[inline]
    fn into_dlpack_with(self, request: &ExportRequest) -> Result<ManagedTensor, ExportError>
    where
        Self: Sized + Send + 'static,
    {
        export_with(self, |owner| owner.export_parts_mut(), request)
    }

    /// As [`DlpackExport::into_dlpack_with`], and returns events recorded on the producer's
    /// streams (feature `cuda`), for a consumer that waits later, on any of its streams.
    ///
    /// # Errors
    ///
    /// As [`DlpackExport::into_dlpack_with`].
    #[cfg(feature = "cuda")]
    fn into_dlpack_with_ready_events(
        self,
        request: &ExportRequest,
    ) -> Result<(ManagedTensor, crate::engine::cuda::ReadyEvents), ExportError>
    where
        Self: Sized + Send + 'static,
    {
        device::into_dlpack_with_ready_events(self, request)
    }
}

/// Shared export: the `Arc` stays alive while any consumer holds the tensor, and the export is
/// read-only.
impl<T: DlpackExport + Send + Sync + 'static> DlpackExport for Arc<T> {
    #[inline]
    fn export_parts(&self) -> ExportParts<'_> {
        (**self).export_parts()
    }
    #[inline]
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        (**self).export_parts()
    }
}

/// Exports `owner`, described by `parts_of`, as `request` asks. This is what
/// [`DlpackExport::into_dlpack_with`] calls; it serves owners that are not `DlpackExport`
/// themselves (a Python object holding a tensor, say).
///
/// `parts_of` is called on the owner at its final address inside the heap block, so buffers
/// whose address changes when moved are fine.
///
/// # Errors
///
/// As [`DlpackExport::into_dlpack_with`]. The owner is dropped on error.
// Inlined into the caller (the out-of-line part is `block::fill`): the owner then goes from
// where the caller built it straight into the block. Called, the owner would be copied in at
// once, in wider moves than the caller's writes, which stall until those writes land.
#[inline(always)]
pub fn export_with<O, F>(
    owner: O,
    parts_of: F,
    request: &ExportRequest,
) -> Result<ManagedTensor, ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    build_export(owner, &parts_of, request, &mut StreamWork::new(request))
}

/// [`export_with`], with the stream work `work` of the export.
#[inline(always)]
fn build_export<O, F>(
    owner: O,
    parts_of: &F,
    request: &ExportRequest,
    sync: &mut StreamWork<'_>,
) -> Result<ManagedTensor, ExportError>
where
    O: Send + 'static,
    F: Fn(&mut O) -> ExportParts<'_>,
{
    // The rank sizes the block, so `parts_of` is asked first where the owner was passed (for
    // the rank only), then again at the owner's final address in the block. The owner stays
    // where it is until it is copied into the block, after the allocation: copied right away
    // (or twice), it would be read back while the caller's writes to it are still in flight (a
    // store-forwarding stall).
    let mut owner = block::PendingOwner::new(owner);
    let ndim = parts_of(owner.get_mut()).shape.len();
    let managed = if request.wants_versioned() {
        let managed = build::<DLManagedTensorVersioned, O, F>(&mut owner, ndim, parts_of, sync);
        if request.stream.is_none() && request.dl_device.is_none() && request.copy != Some(true) {
            // `into_dlpack()`'s request: `finish` has nothing to do (see there), so the block is
            // the result as built (carrying what it is ready after, if anything).
            return managed.map(|managed| sync.carry(managed));
        }
        managed?
    } else {
        build::<DLManagedTensor, O, F>(&mut owner, ndim, parts_of, sync)?
    };
    finish(managed, request, sync).map(|managed| sync.carry(managed))
}

/// What `request` asks of a tensor `build` made, beyond building it.
fn finish(
    managed: ManagedTensor,
    request: &ExportRequest,
    sync: &mut StreamWork<'_>,
) -> Result<ManagedTensor, ExportError> {
    // Without `stream`, `dl_device` and `copy=True` nothing can fail or change (no stream is
    // legal on every device, and the target is the tensor's own device): skip the checks, as
    // for `into_dlpack()`.
    if request.stream.is_some() || request.dl_device.is_some() || request.copy.is_some() {
        let device = Device::from_raw(managed.dl_tensor().device);
        request.check(device)?;
        if request.needs_copy(device) {
            // The copy is fresh and writable, whatever the source was.
            return copy_for(managed, request, sync);
        }
    }
    // A versioned tensor carries its own read-only flag; a legacy one cannot, so a legacy
    // consumer of a read-only tensor gets a writable copy, unless `copy=False`.
    if managed.is_legacy() && legacy_read_only(&managed) {
        if !request.copies_for_legacy(true) {
            return Err(ExportError::ReadOnlyLegacy);
        }
        return copy_for(managed, request, sync);
    }
    Ok(managed)
}

/// Serves `request` with a managed tensor built before it came (a prebuilt export, or a
/// tensor a producer handed over without honouring `copy`): checks it, and copies when it asks
/// for a copy. The tensor is returned as it is otherwise.
///
/// # Errors
///
/// As [`ExportRequest::check`], and those of the copy.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn serve(
    managed: ManagedTensor,
    request: &ExportRequest,
) -> Result<ManagedTensor, ExportError> {
    let device = Device::from_raw(managed.dl_tensor().device);
    request.check(device)?;
    if request.needs_copy(device) {
        let mut sync = StreamWork::new(request);
        return copy_for(managed, request, &mut sync).map(|managed| sync.carry(managed));
    }
    Ok(managed)
}

/// The copy `request` asks for: on the host for host-accessible memory, with the driver on the
/// consumer's stream for CUDA memory (feature `cuda`).
fn copy_for(
    managed: ManagedTensor,
    request: &ExportRequest,
    sync: &mut StreamWork<'_>,
) -> Result<ManagedTensor, ExportError> {
    let device = Device::from_raw(managed.dl_tensor().device);
    if device.device_type == DeviceType::Cuda {
        return sync.copy_device_memory(managed, request);
    }
    #[cfg(feature = "hip")]
    if device.device_type == DeviceType::Rocm {
        return sync.copy_rocm_memory(managed, request);
    }
    let target = request.dl_device.unwrap_or(device);
    if COPIES_CUDA_MEMORY && request::copies_between(device, target) {
        // Host memory to a CUDA device, on the consumer's stream of that device.
        return sync.copy_host_to_device(managed, request);
    }
    // A host copy is `cpu:0` memory: it serves a request for `cpu:0` only.
    if target != Device::CPU {
        return Err(ExportError::CopyUnsupported { device });
    }
    copy_of(&managed, request.wants_versioned())
}
