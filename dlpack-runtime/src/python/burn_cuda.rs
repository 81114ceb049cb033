//! burn's CUDA backend and Python together (features `burn-cuda` and `python`): a Python object
//! made a tensor of burn's CUDA backend.

use burn_cubecl::cubecl::cuda::CudaDevice;
use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, Tensor};
use pyo3::prelude::*;

use crate::interop::burn::BurnError;
use crate::interop::burn_cuda::{CudaPrimitive, consumer_stream, tensor_from_managed};
use crate::tensor::device::Device;

/// Makes a Python object with `__dlpack__` (a PyTorch or CuPy CUDA tensor, a JAX array, a NumPy
/// array, a capsule, an object with `__cuda_array_interface__`) a tensor of burn's CUDA backend
/// (fused or not) on `device`, of rank `D` and kind `K`, keeping its dtype: a copy, as
/// `burn::cuda::tensor_from_managed` makes it.
///
/// The object is imported as [`from_dlpack_with`](crate::python::from_dlpack_with) imports it
/// with `device` the burn device (`kDLCUDA`) and `stream` the stream of
/// [`consumer_stream`] for it: the producer orders its pending work before that stream; host
/// memory, and memory of another CUDA device, are copied onto the device on that stream. The
/// elements are then copied into memory of burn's client on the same stream, and the host
/// waits for the copy (and for cubecl's stream, before it) with the GIL released: other Python
/// threads run meanwhile. The producer's deleter has run when this returns.
///
/// # Errors
///
/// The Python errors of `from_dlpack` (`BufferError`, `TypeError`, ...); `BufferError` for a
/// [`BurnError`] (a rank other than `D`, a dtype the kind cannot hold on the CUDA backend, ...)
/// and for a driver error, as `burn::cuda::tensor_from_managed` returns them.
pub fn tensor_from_py<B, const D: usize, K>(
    obj: &Bound<'_, PyAny>,
    device: &CudaDevice,
) -> PyResult<Tensor<B, D, K>>
where
    B: Backend<Device = CudaDevice>,
    K: BasicOps<B>,
    K::Primitive: CudaPrimitive,
{
    let py = obj.py();
    let ordinal = i32::try_from(device.index).map_err(|_| {
        pyo3::exceptions::PyOverflowError::new_err(format!(
            "CUDA device index {} does not fit a DLPack device_id (int32)",
            device.index
        ))
    })?;
    let stream = consumer_stream(ordinal).map_err(BurnError::from)?;
    let options = super::FromDlpackOptions::new()
        .device(Device::cuda(ordinal))
        .stream(Some(stream.cu_stream() as i64));
    let managed = super::managed_from_object(obj, &options)?;
    Ok(py.detach(|| tensor_from_managed::<B, D, K>(managed, device, &stream))?)
}
