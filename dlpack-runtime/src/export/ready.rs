//! Readiness that travels with a managed tensor (feature `cuda`): the events after which its
//! data is ready, so that whoever holds the tensor and lends it on (a relay) orders the next
//! consumer after the original producer.
//!
//! The events live in a small block that wraps the tensor: a header of the same kind whose
//! `dl_tensor` is the wrapped tensor's (the same data, shape and strides), followed by the
//! wrapped tensor and the events. Its deleter, a single non-generic function, drops both: the
//! wrapped tensor's deleter runs then, once. A tensor is recognized as such a block by that
//! deleter, so only tensors this copy of the crate wrapped are read as one.

use core::ffi::c_void;
use core::ptr::NonNull;

use cudarc::driver::sys;

use super::keep_current_context;
use crate::abi::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use crate::engine::cuda::{
    Capture, CudaError, CurrentContext, ReadyEvents, bind, capture_of, context, init, raw_stream,
};
use crate::plan::stream::{StreamId, StreamRequest};
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::managed::{ManagedTensor, RawManagedTensor};

/// A wrapping block with a versioned header.
#[repr(C)]
struct Versioned {
    header: DLManagedTensorVersioned,
    inner: ManagedTensor,
    events: ReadyEvents,
}

/// A wrapping block with a legacy header.
#[repr(C)]
struct Legacy {
    header: DLManagedTensor,
    inner: ManagedTensor,
    events: ReadyEvents,
}

/// The deleter of a [`Versioned`] block: drops the wrapped tensor (its deleter runs) and the
/// events. Never unwinds.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: a non-NULL pointer handed to this deleter is a block made by `wrap` (the only
    // place that installs it), called once by its owner (`dlpack.h`, `deleter`).
    let block = unsafe { Box::from_raw(managed.cast::<Versioned>()) };
    // A block of CUDA events keeps the thread's context; one of HIP events (a ROCm tensor)
    // never calls the CUDA driver.
    let _current = keep_current_context(block.events.has_cuda());
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(block)));
}

/// The deleter of a [`Legacy`] block: as [`delete_versioned`].
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for blocks with a legacy header.
    let block = unsafe { Box::from_raw(managed.cast::<Legacy>()) };
    let _current = keep_current_context(block.events.has_cuda());
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(block)));
}

/// `inner`, carrying `events` as the events after which its data is ready (added to those it
/// carries already). The result has the same kind of header, data, layout, flags and
/// validation as `inner`; dropping it drops `inner`.
pub(crate) fn wrap(inner: ManagedTensor, events: ReadyEvents) -> ManagedTensor {
    if events.is_empty() {
        return inner;
    }
    let (inner, events) = match unwrap(inner) {
        (inner, Some(mut carried)) => {
            carried.extend_from(&events);
            (inner, carried)
        }
        (inner, None) => (inner, events),
    };
    let dl_tensor = *inner.dl_tensor();
    let validated = inner.is_validated();
    let unaliased = inner.is_unaliased();
    let raw = match inner.as_raw() {
        RawManagedTensor::Versioned(header) => {
            // SAFETY: `inner` owns a valid versioned header.
            let header = unsafe { header.as_ref() };
            let (version, flags) = (header.version, header.flags);
            let block = Box::into_raw(Box::new(Versioned {
                header: DLManagedTensorVersioned {
                    version,
                    manager_ctx: core::ptr::null_mut(),
                    deleter: Some(delete_versioned),
                    flags,
                    dl_tensor,
                },
                inner,
                events,
            }));
            // SAFETY: just allocated; the header is the block's first field.
            unsafe { (*block).header.manager_ctx = block.cast::<c_void>() };
            // SAFETY: `Box::into_raw` is never NULL.
            RawManagedTensor::Versioned(unsafe { NonNull::new_unchecked(block.cast()) })
        }
        RawManagedTensor::Legacy(_) => {
            let block = Box::into_raw(Box::new(Legacy {
                header: DLManagedTensor {
                    dl_tensor,
                    manager_ctx: core::ptr::null_mut(),
                    deleter: Some(delete_legacy),
                },
                inner,
                events,
            }));
            // SAFETY: just allocated; the header is the block's first field.
            unsafe { (*block).header.manager_ctx = block.cast::<c_void>() };
            // SAFETY: `Box::into_raw` is never NULL.
            RawManagedTensor::Legacy(unsafe { NonNull::new_unchecked(block.cast()) })
        }
    };
    // SAFETY: the header is a valid managed tensor owned by nobody else: the wrapped tensor's
    // version (1.x, known flags: it was taken as a `ManagedTensor`), its flags and its
    // `DLTensor`, whose `shape` and `strides` arrays live in the wrapped tensor's header, which
    // the block keeps alive and unchanged. So it validates exactly when `inner` does, and
    // reaches exactly the memory `inner` reaches.
    unsafe {
        if validated {
            ManagedTensor::from_raw_validated(raw, unaliased)
        } else {
            ManagedTensor::from_raw_unchecked(raw)
        }
    }
}

/// Splits a wrapping block into the tensor it wraps and its events; any other tensor comes
/// back as it is, with `None`.
fn unwrap(managed: ManagedTensor) -> (ManagedTensor, Option<ReadyEvents>) {
    match block_of(&managed) {
        Some(Block::Versioned(block)) => {
            let _ = managed.into_raw();
            // SAFETY: the block `wrap` made, now owned here alone (released just above); taken
            // apart without running its deleter.
            let block = unsafe { Box::from_raw(block.as_ptr()) };
            let Versioned { inner, events, .. } = *block;
            (inner, Some(events))
        }
        Some(Block::Legacy(block)) => {
            let _ = managed.into_raw();
            // SAFETY: as above.
            let block = unsafe { Box::from_raw(block.as_ptr()) };
            let Legacy { inner, events, .. } = *block;
            (inner, Some(events))
        }
        None => (managed, None),
    }
}

/// The wrapping block a tensor is, if it is one.
enum Block {
    Versioned(NonNull<Versioned>),
    Legacy(NonNull<Legacy>),
}

fn block_of(managed: &ManagedTensor) -> Option<Block> {
    let deleter = managed.deleter_address();
    match managed.as_raw() {
        RawManagedTensor::Versioned(header)
            if deleter == delete_versioned as *const () as usize =>
        {
            Some(Block::Versioned(header.cast()))
        }
        RawManagedTensor::Legacy(header) if deleter == delete_legacy as *const () as usize => {
            Some(Block::Legacy(header.cast()))
        }
        _ => None,
    }
}

impl ManagedTensor {
    /// The events after which this tensor's data is ready (feature `cuda`), when the tensor
    /// carries them: a CUDA tensor (or, feature `hip`, a ROCm tensor, with HIP events) exported
    /// by this crate to a consumer stream while its producer had pending work, a device copy,
    /// or a CUDA import that this crate's Python consumer made ready on a stream. Lending the tensor on (as an
    /// [`ExportBuffer`](crate::ExportBuffer), directly or inside an
    /// [`ImportedData`](crate::ImportedData)) orders the next consumer after them, and
    /// [`release_after`](crate::interop::cuda::release_after) releases it only after them. `None` for
    /// every other tensor (host memory, tensors from elsewhere, `stream=-1` exchanges).
    pub fn ready_events(&self) -> Option<&ReadyEvents> {
        match block_of(self)? {
            // SAFETY: a block `wrap` made, alive while `self` owns it; its events are never
            // changed while it is shared.
            Block::Versioned(block) => Some(unsafe { &(*block.as_ptr()).events }),
            // SAFETY: as above.
            Block::Legacy(block) => Some(unsafe { &(*block.as_ptr()).events }),
        }
    }
}

/// `managed`, a tensor just imported for the consumer's stream `request` (a Python producer's
/// answer to `__dlpack__(stream=...)`, or its C exchange API tensor ordered before that
/// stream), made to carry an event recorded on that stream now, unless it carries readiness
/// already: what it is ready after, for whoever it is lent to next. Tensors not in CUDA
/// device memory, `stream=-1` and host requests, streams being captured into a graph, and
/// every tensor where no driver is loaded are left as they are.
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver; the tensor is dropped then.
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn made_ready_on(
    managed: ManagedTensor,
    request: StreamRequest,
) -> Result<ManagedTensor, CudaError> {
    let device = Device::from_raw(managed.dl_tensor().device);
    if device.device_type != DeviceType::Cuda || managed.ready_events().is_some() {
        return Ok(managed);
    }
    let Some(consumer) = StreamId::of_request(request) else {
        return Ok(managed);
    };
    // Without a driver no stream runs: there is nothing to be ready after.
    if init().is_err() {
        return Ok(managed);
    }
    let ctx = context(device.device_id)?;
    let _current = CurrentContext::save();
    bind(ctx.cu_ctx())?;
    let stream: sys::CUstream = raw_stream(consumer);
    if capture_of(stream)? != Capture::Not {
        return Ok(managed);
    }
    let events = ReadyEvents::record_raw(&ctx, stream)?;
    Ok(wrap(managed, events))
}
