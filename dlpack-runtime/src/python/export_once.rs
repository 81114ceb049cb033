//! [`ExportOnce`]: a Rust tensor owned by Python, exported once by value.

use std::sync::Mutex;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::export::{DlpackExport, ExportError, ExportRequest, serve};
use crate::tensor::device::Device;
use crate::tensor::managed::ManagedTensor;

use super::*;

/// A Rust tensor owned by Python, exported once by value (writable) through `__dlpack__`.
///
/// Made by [`export_once`]. A second `__dlpack__` call raises `BufferError`.
#[pyclass(frozen, name = "ExportOnce", module = "dlpack_runtime")]
pub struct ExportOnce {
    device: Device,
    inner: Mutex<Option<Box<dyn ErasedExport>>>,
}

trait ErasedExport: Send {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError>;
}

impl<T: DlpackExport + Send + 'static> ErasedExport for T {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError> {
        (*self).into_dlpack_with(request)
    }
}

/// A managed tensor already built, exported as it is (or copied).
struct Prebuilt(ManagedTensor);

impl ErasedExport for Prebuilt {
    fn export(self: Box<Self>, request: &ExportRequest) -> Result<ManagedTensor, ExportError> {
        if request.needs_copy(Device::from_raw(self.0.dl_tensor().device)) {
            return serve(self.0, request);
        }
        request.check(Device::from_raw(self.0.dl_tensor().device))?;
        if !self.0.is_legacy() && !request.wants_versioned() {
            // A versioned header cannot become a legacy one: a legacy consumer gets a copy,
            // unless `copy=False`.
            if request.copy == Some(false) {
                return Err(ExportError::VersionedOnly);
            }
            return serve(self.0, &request.copy(Some(true)));
        }
        Ok(self.0)
    }
}

/// Wraps a managed tensor in a Python object with `__dlpack__` and `__dlpack_device__`
/// (exported once, as it is; a legacy request of a versioned tensor gets a copy, or a
/// `BufferError` with `copy=False`).
///
/// # Errors
///
/// The Python error of creating the object; the tensor is then dropped (its deleter runs).
pub fn export_managed(py: Python<'_>, managed: ManagedTensor) -> PyResult<Bound<'_, ExportOnce>> {
    let device = Device::from_raw(managed.dl_tensor().device);
    Bound::new(
        py,
        ExportOnce {
            device,
            inner: Mutex::new(Some(Box::new(Prebuilt(managed)))),
        },
    )
}

/// Moves `tensor` into a Python object with `__dlpack__` and `__dlpack_device__`, for
/// `numpy.from_dlpack(obj)` and the like. The export is by value, so it is writable.
///
/// # Errors
///
/// The Python error of creating the object.
pub fn export_once<T: DlpackExport + Send + 'static>(
    py: Python<'_>,
    tensor: T,
) -> PyResult<Bound<'_, ExportOnce>> {
    let device = tensor.dlpack_device();
    Bound::new(
        py,
        ExportOnce {
            device,
            inner: Mutex::new(Some(Box::new(tensor))),
        },
    )
}

#[pymethods]
impl ExportOnce {
    /// `__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _attached = crate::abi::gil::Attached::enter(py);
        let request = export_request(stream, max_version, dl_device, copy);
        // Refuse bad arguments before taking the tensor, so that a corrected call can still
        // export it.
        request.check(self.device)?;
        let tensor = self
            .inner
            .lock()
            .map_err(|_| PyBufferError::new_err("tensor state was poisoned by a panic"))?
            .take()
            .ok_or_else(|| {
                PyBufferError::new_err(
                    "this tensor was already exported by value; it can be exported once",
                )
            })?;
        let managed = tensor.export(&request)?;
        to_capsule(py, managed)
    }

    /// `__dlpack_device__()`: `(device_type, device_id)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let device = self.device.to_raw();
        (device.device_type, device.device_id)
    }

    fn __repr__(&self) -> String {
        let exported = self.inner.lock().map_or(true, |inner| inner.is_none());
        format!(
            "ExportOnce(device={}, exported={})",
            self.device,
            if exported { "True" } else { "False" }
        )
    }
}
