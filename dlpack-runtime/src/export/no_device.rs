//! The export's device work without the `cuda` feature: there are no streams to order and no
//! device memory this crate can copy. The twin of `device.rs`, with the same items.

use core::marker::PhantomData;

use super::{ExportError, ExportParts, ExportRequest};
use crate::tensor::device::Device;
use crate::tensor::managed::ManagedTensor;

/// Whether CUDA device memory can be copied for a consumer: not without the `cuda` feature.
pub(crate) const COPIES_CUDA_MEMORY: bool = false;

/// The `#[dlpack(stream)]` fields of an export: none without the `cuda` feature.
pub(crate) type Streams<'a> = PhantomData<&'a ()>;

impl ExportParts<'_> {
    /// Whether the producer names streams with pending work on the data: never without the
    /// `cuda` feature.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn has_producer_streams(&self) -> bool {
        false
    }
}

/// No export owns CUDA resources without the `cuda` feature.
#[inline(always)]
pub(crate) fn touches_cuda(_parts: &ExportParts<'_>) -> bool {
    false
}

/// Nothing to keep: no CUDA context is bound without the `cuda` feature.
pub(crate) struct NoContext;

/// Nothing to keep: no CUDA context is bound without the `cuda` feature.
#[inline(always)]
pub(crate) fn keep_current_context(_cuda: bool) -> NoContext {
    NoContext
}

/// The stream work of one export: nothing to do without streams.
pub(crate) struct StreamWork<'r>(PhantomData<&'r ExportRequest>);

impl<'r> StreamWork<'r> {
    pub(crate) fn new(_request: &'r ExportRequest) -> Self {
        Self(PhantomData)
    }

    /// No pending work can be named without the `cuda` feature.
    #[inline(always)]
    pub(crate) fn order_pending(
        &mut self,
        _parts: &ExportParts<'_>,
        _device: Device,
        _data: u64,
        _has_elements: bool,
        _read_only: bool,
    ) -> Result<(), ExportError> {
        Ok(())
    }

    /// No CUDA work is named without the `cuda` feature.
    #[inline(always)]
    pub(crate) fn touched_cuda(&self) -> bool {
        false
    }

    /// Nothing is carried without the `cuda` feature.
    #[inline(always)]
    pub(crate) fn carry(&mut self, managed: ManagedTensor) -> ManagedTensor {
        managed
    }

    /// Host memory cannot be copied to a CUDA device without the `cuda` feature.
    pub(crate) fn copy_host_to_device(
        &mut self,
        managed: ManagedTensor,
        _request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError> {
        Err(ExportError::CopyUnsupported {
            device: Device::from_raw(managed.dl_tensor().device),
        })
    }

    /// CUDA memory cannot be copied without the `cuda` feature.
    pub(crate) fn copy_device_memory(
        &mut self,
        managed: ManagedTensor,
        _request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError> {
        Err(ExportError::CopyUnsupported {
            device: Device::from_raw(managed.dl_tensor().device),
        })
    }
}
