//! What a pyo3 user writes first (feature `python`): derived import types as pyfunction
//! arguments, and `?` on every runtime error inside a `PyResult` function, raising the exception
//! class the module docs of `python` name.
#![cfg(feature = "python")]

use dlpack_runtime::python::export_once;
use dlpack_runtime::{
    Contiguity, DataType, DlpackExport, DlpackImport, ExportError, ExportRequest, HeaderError,
    ImportError, LayoutError, ManagedTensor, StreamError,
};
use dlpack_tests::Counter;
use dlpack_tests::py::{eval, with_numpy};
use dlpack_tests::types::{Compact, Strided, tensor};
use pyo3::exceptions::{PyBufferError, PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A `#[pyclass]` around another crate's tensor type (here `dlpack_tests::types::Tensor`),
/// exporting through it: `#[dlpack(transparent)]` forwards to the field's own `DlpackExport`.
#[pyclass(frozen)]
#[derive(DlpackExport)]
#[dlpack(transparent)]
struct PyWrapped(dlpack_tests::types::Tensor<f64>);

dlpack_tests::dlpack_pymethods!(PyWrapped);

/// A consumer wrapping another crate's consumer type, importing through it.
#[derive(DlpackImport)]
#[dlpack(transparent)]
struct Wrapped(Strided<f64>);

/// The wrapper as a pyfunction argument.
#[pyfunction]
fn wrapped_total(v: Wrapped) -> PyResult<f64> {
    Ok(v.0.data.iter()?.sum())
}

/// A pyfunction that takes a derived consumer as its argument: the object's `__dlpack__` is
/// called as `python::from_dlpack` calls it.
#[pyfunction]
fn total(v: Strided<f64>) -> PyResult<f64> {
    Ok(v.data.to_vec()?.iter().sum())
}

/// `get` with an index of the caller's: `?` raises `IndexError` for one out of bounds.
#[pyfunction]
fn element(v: Compact<f64>, i: usize) -> PyResult<f64> {
    Ok(v.data.get(&[i])?)
}

/// `as_slice` of a strided view: `?` raises `BufferError` (not contiguous).
#[pyfunction]
fn first_of_slice(v: Strided<f64>) -> PyResult<f64> {
    Ok(v.data.as_slice()?[0])
}

#[test]
fn pyfunctions_take_derived_views_as_arguments() {
    Python::attach(|py| {
        let l = with_numpy(py);
        l.set_item("total", wrap_pyfunction!(total, py).unwrap())
            .unwrap();
        l.set_item("element", wrap_pyfunction!(element, py).unwrap())
            .unwrap();
        l.set_item(
            "first_of_slice",
            wrap_pyfunction!(first_of_slice, py).unwrap(),
        )
        .unwrap();
        let sum: f64 = eval(py, "result = total(np.arange(10.0))", &l)
            .extract()
            .unwrap();
        assert_eq!(sum, 45.0);
        let sum: f64 = eval(py, "result = total(np.arange(10.0)[::-3])", &l)
            .extract()
            .unwrap();
        assert_eq!(sum, 18.0, "a strided view: 9 + 6 + 3 + 0");
        // A Rust producer handed back in works the same way.
        let counter = Counter::new();
        l.set_item(
            "t",
            export_once(py, tensor(vec![1.5f64, 2.5], &[2], &counter)).unwrap(),
        )
        .unwrap();
        let sum: f64 = eval(py, "result = total(t)", &l).extract().unwrap();
        assert_eq!(sum, 4.0);
        let raised = |code: &str| -> PyErr {
            let code = std::ffi::CString::new(code).unwrap();
            py.run(&code, None, Some(&l)).unwrap_err()
        };
        // The wrong dtype: BufferError naming both dtypes.
        let err = raised("total(np.arange(3))");
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert!(
            err.value(py).to_string().contains("int64"),
            "{}",
            err.value(py)
        );
        // No `__dlpack__` at all: a TypeError saying what was found and what is expected,
        // with the argument named as pyo3 names it for its own conversions (a note).
        let err = raised("total([1.0, 2.0])");
        assert!(err.is_instance_of::<PyTypeError>(py), "{err}");
        // With feature `cuda` the message also names `__cuda_array_interface__`.
        let message = err.value(py).to_string();
        assert!(
            message.starts_with("expected a DLPack producer (an object with `__dlpack__`: a NumPy, PyTorch, JAX or CuPy array, say)")
                && message.ends_with(" or a DLPack capsule, found `list`"),
            "{message}"
        );
        let notes: Vec<String> = err
            .value(py)
            .getattr("__notes__")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(notes, ["while processing 'v'"]);
        // An index out of bounds: IndexError.
        let err = raised("element(np.arange(3.0), 5)");
        assert!(err.is_instance_of::<PyIndexError>(py), "{err}");
        // A slice of a strided view: BufferError.
        let err = raised("first_of_slice(np.arange(6.0)[::2])");
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
    });
}

#[test]
fn wrappers_export_and_import_through_their_field() {
    Python::attach(|py| {
        let l = with_numpy(py);
        let counter = Counter::new();
        let mut inner = tensor(vec![0.0f64, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3], &counter);
        inner.strides = Some(vec![1, 2]);
        let address = inner.data.as_ptr() as usize;
        let wrapped = Bound::new(py, PyWrapped(inner)).unwrap();
        l.set_item("w", &wrapped).unwrap();
        l.set_item(
            "wrapped_total",
            wrap_pyfunction!(wrapped_total, py).unwrap(),
        )
        .unwrap();
        let (same, values, total): (bool, Vec<Vec<f64>>, f64) = eval(
            py,
            &format!(
                "a = np.from_dlpack(w)\nresult = (a.ctypes.data == {address}, a.tolist(), wrapped_total(w))"
            ),
            &l,
        )
        .extract()
        .unwrap();
        assert!(same, "the wrapper lends the inner tensor's memory");
        assert_eq!(values, [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]);
        assert_eq!(total, 15.0);
    });
}

#[test]
fn every_runtime_error_becomes_its_exception_class() {
    Python::attach(|py| {
        let cases: Vec<(PyErr, &str)> = vec![
            (
                LayoutError::IndexOutOfBounds {
                    axis: 0,
                    index: 3,
                    extent: 2,
                }
                .into(),
                "IndexError",
            ),
            (
                LayoutError::IndexRank {
                    found: 1,
                    expected: 2,
                }
                .into(),
                "IndexError",
            ),
            (
                LayoutError::NotContiguous {
                    expected: Contiguity::C,
                    shape: vec![2, 2],
                    strides: vec![1, 2],
                }
                .into(),
                "BufferError",
            ),
            (LayoutError::ReadOnly.into(), "BufferError"),
            (
                StreamError::Invalid {
                    found: Some(0),
                    device: dlpack_runtime::Device::cuda(0),
                    allowed: "None, -1, 1, 2, or a stream handle > 2",
                }
                .into(),
                "ValueError",
            ),
            (HeaderError::NullTensor.into(), "BufferError"),
            (ExportError::ReadOnlyLegacy.into(), "BufferError"),
            (
                ImportError::Dtype {
                    found: DataType::I64,
                    expected: DataType::F64,
                }
                .into(),
                "BufferError",
            ),
            (
                ImportError::Layout(LayoutError::IndexRank {
                    found: 1,
                    expected: 2,
                })
                .into(),
                "IndexError",
            ),
        ];
        for (err, class) in cases {
            let name = err.get_type(py).name().unwrap().to_string();
            assert_eq!(name, class, "{err}");
        }
        assert!(PyErr::from(LayoutError::ReadOnly).is_instance_of::<PyBufferError>(py));
        assert!(
            PyErr::from(StreamError::Unsupported {
                found: 3,
                device: dlpack_runtime::Device::CPU,
            })
            .is_instance_of::<PyValueError>(py)
        );
        #[cfg(feature = "cuda")]
        assert!(
            PyErr::from(dlpack_runtime::cuda::CudaError::NoDriver)
                .is_instance_of::<PyBufferError>(py)
        );
        // `?` in a PyResult function: the conversions are what `?` uses.
        fn refuse() -> PyResult<()> {
            // SAFETY: NULL is refused before anything is read.
            unsafe { ManagedTensor::from_raw_versioned(core::ptr::null_mut()) }?;
            Ok(())
        }
        assert!(refuse().unwrap_err().is_instance_of::<PyBufferError>(py));
        fn export_legacy() -> PyResult<ManagedTensor> {
            let counter = Counter::new();
            let shared = std::sync::Arc::new(tensor(vec![1u8], &[1], &counter));
            Ok(dlpack_runtime::DlpackExport::into_dlpack_with(
                shared,
                &ExportRequest::new().copy(Some(false)),
            )?)
        }
        assert!(
            export_legacy()
                .unwrap_err()
                .is_instance_of::<PyBufferError>(py)
        );
    });
}

/// A writable float32 vector that borrows its memory exclusively at import.
#[derive(DlpackImport)]
#[dlpack(writable, borrow = "exclusive")]
struct WriteAtImport {
    #[dlpack(data)]
    data: dlpack_runtime::ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    #[dlpack(strides)]
    strides: [isize; 1],
}

/// Writes `va` into the first element of `a` and `vb` into that of `b`.
#[pyfunction]
fn set_first(mut a: WriteAtImport, mut b: WriteAtImport, va: f32, vb: f32) -> PyResult<()> {
    assert_eq!((a.strides.len(), b.shape.len()), (1, 1));
    a.data.set(&[0], va)?;
    b.data.set(&[0], vb)?;
    Ok(())
}

#[test]
fn arguments_that_borrow_at_import_name_the_parameter_of_a_conflict() {
    Python::attach(|py| {
        let l = with_numpy(py);
        l.set_item("set_first", wrap_pyfunction!(set_first, py).unwrap())
            .unwrap();
        let code = "\
x = np.zeros(4, np.float32)
try:
    set_first(x, x[1:], 1.0, 2.0)
    result = None
except BufferError as e:
    result = (str(e), e.__notes__, x.tolist())
";
        let (message, notes, values): (String, Vec<String>, Vec<f32>) =
            eval(py, code, &l).extract().unwrap();
        assert_eq!(notes, ["while processing 'b'"]);
        assert!(
            message.starts_with("cannot import: cannot borrow bytes [0x")
                && message.contains("another live import of the same memory")
                && message.ends_with("or give the other back with release_borrow()"),
            "{message}"
        );
        assert_eq!(values, [0.0; 4], "nothing was written");
        // Disjoint views, interleaved: both written, and no borrow outlives the call.
        let code = "\
x = np.zeros(4, np.float32)
set_first(x[::2], x[1::2], 1.0, 2.0)
set_first(x[2:3], x[3:], 3.0, 4.0)
result = x.tolist()
";
        let values: Vec<f32> = eval(py, code, &l).extract().unwrap();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.0]);
    });
}
