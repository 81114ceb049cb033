//! `dlpack_borrow_peer`: a second extension module, built on its own with its own copy of
//! `dlpack-runtime`, so that the tests of the example extension can show that borrows of
//! imported memory are checked across extension modules (one registry per process), and with
//! rust-numpy's borrows (`PyReadonlyArray`, `PyReadwriteArray`).

use std::sync::Mutex;

use dlpack_runtime::{DlpackImport, ImportedData, python};
use numpy::{PyReadonlyArray1, PyReadonlyArrayDyn, PyReadwriteArray1, PyReadwriteArrayDyn};
use pyo3::prelude::*;

/// A writable float32 view of host memory.
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A tensor's memory held borrowed: made by `hold`, given back by `release()`.
#[pyclass(frozen, module = "dlpack_borrow_peer")]
struct Held(Mutex<Option<ImportedData<f32>>>);

#[pymethods]
impl Held {
    /// Gives the borrow back.
    fn release(&self) {
        // Dropped after the lock: the producer's deleter may run Python code, during which
        // another thread may call this method.
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(held);
    }
}

/// `hold(x, mutable)`: imports the float32 tensor `x` and borrows its memory (exclusively when
/// `mutable`); `BufferError` when another import, of this module or any other, holds a
/// conflicting borrow.
#[pyfunction]
fn hold(x: &Bound<'_, PyAny>, mutable: bool) -> PyResult<Held> {
    let mut view: ViewMut = python::from_dlpack(x)?;
    debug_assert!(!view.shape.is_empty());
    if mutable {
        view.data.as_slice_mut()?;
    } else {
        view.data.as_slice()?;
    }
    Ok(Held(Mutex::new(Some(view.data))))
}

/// `write(x, value)`: writes `value` into every element of `x` through a mutable slice.
#[pyfunction]
fn write(x: &Bound<'_, PyAny>, value: f32) -> PyResult<()> {
    let mut view: ViewMut = python::from_dlpack(x)?;
    view.data.as_slice_mut()?.fill(value);
    Ok(())
}

/// `readwrite_while(x, f)`: holds rust-numpy's `PyReadwriteArray` of `x` while it calls
/// `f()`, writes 1.0 into `x[0]`, and returns what `f` returned.
#[pyfunction]
fn readwrite_while(mut x: PyReadwriteArray1<'_, f32>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let result = f.call0()?;
    x.as_slice_mut()?[0] = 1.0;
    Ok(result.unbind())
}

/// `readonly_sum(x)`: the sum of `x` through rust-numpy's `PyReadonlyArray`.
#[pyfunction]
fn readonly_sum(x: PyReadonlyArray1<'_, f32>) -> PyResult<f32> {
    Ok(x.as_array().sum())
}

/// `readonly_sum_f64(x)`: as `readonly_sum`, for float64.
#[pyfunction]
fn readonly_sum_f64(x: PyReadonlyArray1<'_, f64>) -> PyResult<f64> {
    Ok(x.as_array().iter().fold(0.0, |total, v| total + v))
}

/// `readwrite_fill(x, value)`: writes `value` into every element of `x` through rust-numpy's
/// `PyReadwriteArray`; the number of elements.
#[pyfunction]
fn readwrite_fill(mut x: PyReadwriteArray1<'_, f32>, value: f32) -> PyResult<usize> {
    let slice = x.as_slice_mut()?;
    slice.fill(value);
    Ok(slice.len())
}

/// `readwrite_pair(a, b)`: writes 1.0 into `a[0]` and 2.0 into `b[0]` through two
/// `PyReadwriteArray`s, then returns `a[0]` (the example's `alias`, on rust-numpy).
#[pyfunction]
fn readwrite_pair(
    mut a: PyReadwriteArray1<'_, f32>,
    mut b: PyReadwriteArray1<'_, f32>,
) -> PyResult<f32> {
    a.as_slice_mut()?[0] = 1.0;
    b.as_slice_mut()?[0] = 2.0;
    Ok(a.as_slice()?[0])
}

/// `readonly_sum_dyn(x)`: `readonly_sum_f64` of a float64 array of any rank
/// (`PyReadonlyArrayDyn`), summed in logical order.
#[pyfunction]
fn readonly_sum_dyn(x: PyReadonlyArrayDyn<'_, f64>) -> PyResult<f64> {
    Ok(x.as_array().iter().fold(0.0, |total, v| total + v))
}

/// `readwrite_fill_dyn(x, value)`: `readwrite_fill` of a contiguous float32 array of any rank.
#[pyfunction]
fn readwrite_fill_dyn(mut x: PyReadwriteArrayDyn<'_, f32>, value: f32) -> PyResult<usize> {
    let slice = x.as_slice_mut()?;
    slice.fill(value);
    Ok(slice.len())
}

/// `readwrite_pair_dyn(a, b)`: `readwrite_pair` of float32 arrays of any rank.
#[pyfunction]
fn readwrite_pair_dyn(
    mut a: PyReadwriteArrayDyn<'_, f32>,
    mut b: PyReadwriteArrayDyn<'_, f32>,
) -> PyResult<f32> {
    a.as_slice_mut()?[0] = 1.0;
    b.as_slice_mut()?[0] = 2.0;
    Ok(a.as_slice()?[0])
}

/// Free-thread-safe, as the example extension (`gil_used = false`).
#[pymodule(gil_used = false)]
fn dlpack_borrow_peer(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(readwrite_while, m)?)?;
    m.add_function(wrap_pyfunction!(readonly_sum, m)?)?;
    m.add_function(wrap_pyfunction!(readonly_sum_f64, m)?)?;
    m.add_function(wrap_pyfunction!(readwrite_fill, m)?)?;
    m.add_function(wrap_pyfunction!(readwrite_pair, m)?)?;
    m.add_function(wrap_pyfunction!(readonly_sum_dyn, m)?)?;
    m.add_function(wrap_pyfunction!(readwrite_fill_dyn, m)?)?;
    m.add_function(wrap_pyfunction!(readwrite_pair_dyn, m)?)?;
    m.add_class::<Held>()?;
    m.add_function(wrap_pyfunction!(hold, m)?)?;
    m.add_function(wrap_pyfunction!(write, m)?)?;
    Ok(())
}
