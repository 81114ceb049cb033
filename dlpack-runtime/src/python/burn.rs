//! burn and Python together (features `burn` and `python`): a Python object made a burn CPU
//! tensor, and burn's errors as Python exceptions.

use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, Tensor};

use crate::interop::burn::{BurnError, NdArrayPrimitive, tensor_from_managed};
use crate::tensor::device::Device;

/// Makes a Python object with `__dlpack__` (a NumPy or JAX array, a PyTorch tensor, a capsule)
/// a burn CPU tensor of rank `D` and kind `K` (feature `python`), as
/// `burn::tensor_from_managed` does: zero-copy for C-contiguous host memory (the Python object
/// stays alive while burn holds it), a copy otherwise. The producer is asked for host memory
/// (`dl_device=(CPU, 0)`), so it copies device memory to the host itself where it can.
///
/// # Errors
///
/// The Python errors of `from_dlpack` (`BufferError`, `TypeError`, ...), and `BufferError` for
/// a [`BurnError`].
pub fn tensor_from_py<B, const D: usize, K>(
    obj: &pyo3::Bound<'_, pyo3::PyAny>,
) -> pyo3::PyResult<Tensor<B, D, K>>
where
    B: Backend,
    K: BasicOps<B>,
    K::Primitive: NdArrayPrimitive,
{
    let options = super::FromDlpackOptions {
        device: Some(Device::CPU),
        ..Default::default()
    };
    let managed = super::managed_from_object(obj, &options)?;
    Ok(tensor_from_managed(managed)?)
}

/// `BufferError`, or the exception of the wrapped export or import error (feature `python`).
impl From<BurnError> for pyo3::PyErr {
    fn from(err: BurnError) -> Self {
        match err {
            BurnError::Import(err) => err.into(),
            BurnError::Export(err) => err.into(),
            err => pyo3::exceptions::PyBufferError::new_err(err.to_string()),
        }
    }
}
