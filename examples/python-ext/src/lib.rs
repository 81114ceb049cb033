//! `dlpack_example`: a Python extension module whose tensor type is a Rust struct speaking
//! DLPack through `dlpack-runtime`.
//!
//! ```python
//! import numpy as np, dlpack_example as de
//! t = de.Tensor.arange(2, 3)          # a Rust-owned float32 (2, 3) tensor
//! a = np.from_dlpack(t)               # zero-copy, read-only view in NumPy
//! de.total(np.arange(10.0)[::2])      # Rust reads any DLPack producer in place
//! ```

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A float32 tensor owned by Rust: row-major data and a shape.
#[pyclass(frozen, module = "dlpack_example")]
#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[pymethods]
impl Tensor {
    /// `Tensor.arange(*shape)`: values 0, 1, 2, ... in row-major order.
    #[staticmethod]
    #[pyo3(signature = (*shape))]
    fn arange(shape: Vec<usize>) -> Self {
        let n: usize = shape.iter().product();
        Self { data: (0..n).map(|v| v as f32).collect(), shape }
    }

    /// The shape, in elements.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// Sum of the elements, computed in Rust.
    fn sum(&self) -> f64 {
        self.data.iter().map(|&v| f64::from(v)).sum()
    }

    /// `__dlpack__`: a shared, read-only export; the tensor stays alive while consumers hold it.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        python::dlpack(slf, stream, max_version, dl_device, copy)
    }

    /// `__dlpack_device__`: `(1, 0)`, the CPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        python::dlpack_device(self)
    }

    /// The DLPack C exchange API table, for C consumers.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
        python::dlpack_exchange_api::<Self>(py)
    }
}

/// What Rust accepts from Python: any float64 tensor, strided or not.
#[derive(DlpackImport)]
struct F64View {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// What Rust writes into: a writable, C-contiguous float32 tensor.
#[derive(DlpackImport)]
struct F32Out {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// `total(x)`: the sum of any float64 DLPack producer (NumPy, JAX, ...), read in place.
#[pyfunction]
fn total(x: &Bound<'_, PyAny>) -> PyResult<f64> {
    let view: F64View = python::from_dlpack(x)?;
    let values = view.data.to_vec().map_err(|e| PyBufferError::new_err(e.to_string()))?;
    Ok(values.iter().sum())
}

/// `strides(x)`: the element strides Rust sees for a float64 producer.
#[pyfunction]
fn strides(x: &Bound<'_, PyAny>) -> PyResult<(Vec<usize>, Vec<isize>)> {
    let view: F64View = python::from_dlpack(x)?;
    Ok((view.shape, view.strides))
}

/// `fill(x, value)`: writes `value` into every element of a writable float32 producer, in
/// place.
#[pyfunction]
fn fill(x: &Bound<'_, PyAny>, value: f32) -> PyResult<usize> {
    let mut out: F32Out = python::from_dlpack(x)?;
    let slice = out.data.as_slice_mut().map_err(|e| PyBufferError::new_err(e.to_string()))?;
    slice.fill(value);
    Ok(out.shape.iter().product())
}

/// `ones(*shape)`: a new float32 tensor handed over by value (writable in the consumer).
#[pyfunction]
#[pyo3(signature = (*shape))]
fn ones<'py>(py: Python<'py>, shape: Vec<usize>) -> PyResult<Bound<'py, python::ExportOnce>> {
    let n: usize = shape.iter().product();
    export_once(py, Tensor { data: vec![1.0; n], shape })
}

/// Any tensor, any dtype, any layout: what `consume` builds.
#[derive(DlpackImport)]
struct AnyView {
    #[dlpack(data)]
    data: dlpack_runtime::ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// `consume(x) -> ndim`: imports any DLPack producer or capsule into a Rust value and drops it;
/// the unit of the consumer benchmarks.
#[pyfunction]
fn consume(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    let view: AnyView = python::from_dlpack(x)?;
    debug_assert_eq!(view.shape.len(), view.strides.len());
    debug_assert!(!view.data.dl_tensor().data.is_null() || view.shape.contains(&0));
    Ok(view.shape.len())
}

/// The module.
#[pymodule]
fn dlpack_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Tensor>()?;
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(strides, m)?)?;
    m.add_function(wrap_pyfunction!(fill, m)?)?;
    m.add_function(wrap_pyfunction!(ones, m)?)?;
    m.add_function(wrap_pyfunction!(consume, m)?)?;
    Ok(())
}
