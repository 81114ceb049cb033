//! candle and Python together (features `candle` and `python`): a Python object copied into
//! a candle tensor, and candle's errors as Python exceptions.

use candle_core::Tensor;

use crate::interop::candle::{CandleError, tensor_from_managed};
use crate::tensor::device::Device;

/// Copies a Python object with `__dlpack__` (a NumPy or JAX array, a PyTorch tensor, a
/// capsule) into a new candle CPU tensor (feature `python`). The producer is asked for host
/// memory (`dl_device=(CPU, 0)`), so it copies device memory to the host itself where it can.
///
/// # Errors
///
/// The Python errors of `from_dlpack` (`BufferError`, `TypeError`, ...), and `BufferError` for
/// a [`CandleError`].
pub fn tensor_from_py(obj: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<Tensor> {
    let options = super::FromDlpackOptions {
        device: Some(Device::CPU),
        ..Default::default()
    };
    let managed = super::managed_from_object(obj, &options)?;
    Ok(tensor_from_managed(managed, &candle_core::Device::Cpu)?)
}

/// `BufferError`, or the exception of the wrapped export or import error (feature `python`).
impl From<CandleError> for pyo3::PyErr {
    fn from(err: CandleError) -> Self {
        match err {
            CandleError::Import(err) => err.into(),
            CandleError::Export(err) => err.into(),
            err => pyo3::exceptions::PyBufferError::new_err(err.to_string()),
        }
    }
}
