//! Interop with real NumPy through the Python protocol (feature `python`): derived Rust tensors
//! consumed by `numpy.from_dlpack`, NumPy arrays consumed by `python::from_dlpack`, deleter
//! counts, and the exchange cases C02, C03, C04, C06, C07, C08, C10 through NumPy.
//!
//! Needs NumPy importable by the embedded interpreter: `scripts/test.sh` sets up `.venv`.
#![cfg(feature = "python")]

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{Device, DlpackExport, Element};
use dlpack_tests::py::{collect, eval, numpy, with_numpy};
use dlpack_tests::types::{Compact, Strided, tensor};
use dlpack_tests::{Counter, DropGuard};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

/// A frozen pyclass tensor with the protocol: shared, read-only export.
#[pyclass(frozen)]
#[derive(DlpackExport)]
struct PyTensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

dlpack_tests::dlpack_pymethods!(PyTensor);

fn numpy_sees<T>(values: Vec<T>, dtype: &str)
where
    T: Element + for<'a, 'py> FromPyObject<'a, 'py> + PartialEq + std::fmt::Debug,
{
    Python::attach(|py| {
        let np = numpy(py);
        let counter = Counter::new();
        let n = values.len();
        let address = values.as_ptr() as usize;
        let expected = values.clone();
        let obj = export_once(py, tensor(values, &[n], &counter)).unwrap();
        let arr = np.call_method1("from_dlpack", (obj,)).unwrap();
        assert_eq!(
            arr.getattr("dtype").unwrap().str().unwrap().to_string(),
            dtype
        );
        assert_eq!(
            arr.getattr("shape")
                .unwrap()
                .extract::<Vec<usize>>()
                .unwrap(),
            [n]
        );
        assert_eq!(
            arr.getattr("strides")
                .unwrap()
                .extract::<Vec<isize>>()
                .unwrap(),
            [std::mem::size_of::<T>() as isize]
        );
        let data_ptr: usize = arr
            .getattr("ctypes")
            .unwrap()
            .getattr("data")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(data_ptr, address, "NumPy's data pointer is the Rust buffer");
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .extract::<Vec<T>>()
                .unwrap(),
            expected
        );
        assert!(
            arr.getattr("flags")
                .unwrap()
                .getattr("writeable")
                .unwrap()
                .extract::<bool>()
                .unwrap()
        );
        drop(arr);
        collect(py);
        assert_eq!(
            counter.get(),
            1,
            "NumPy called the deleter once when the array died"
        );
    });
}

#[test]
fn numpy_reads_every_basic_dtype_zero_copy() {
    numpy_sees(vec![1.5f32, -2.0, 3.25], "float32");
    numpy_sees(vec![1.5f64, -2.0, 1e300], "float64");
    numpy_sees(vec![i32::MIN, 0, 7], "int32");
    numpy_sees(vec![i64::MIN, 0, i64::MAX], "int64");
    numpy_sees(vec![0u8, 128, 255], "uint8");
    numpy_sees(vec![true, false, true], "bool");
}

#[test]
fn numpy_writes_are_seen_from_rust() {
    Python::attach(|py| {
        let np = numpy(py);
        let counter = Counter::new();
        let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let address = values.as_ptr();
        let obj = export_once(py, tensor(values, &[2, 3], &counter)).unwrap();
        let locals = PyDict::new(py);
        locals.set_item("np", np).unwrap();
        locals.set_item("obj", obj).unwrap();
        let arr = eval(
            py,
            "a = np.from_dlpack(obj)\na[1, 2] = 42.0\nresult = a",
            &locals,
        );
        // Back into Rust, zero-copy: the same memory, with NumPy's write.
        let back: Compact<f32> = python::from_dlpack(&arr).unwrap();
        assert_eq!(back.data.as_ptr(), address);
        assert_eq!(
            back.data.as_slice().unwrap(),
            [0.0, 1.0, 2.0, 3.0, 4.0, 42.0]
        );
        assert_eq!(back.shape, [2, 3]);
        drop((arr, locals));
        collect(py);
        assert_eq!(
            counter.get(),
            0,
            "the Rust import still holds NumPy's array"
        );
        drop(back);
        collect(py);
        assert_eq!(counter.get(), 1);
    });
}

/// Imports `expr` (a NumPy array) into a strided consumer and checks the values and the
/// pointer against NumPy's.
fn import_matches_numpy(expr: &str) {
    Python::attach(|py| {
        let locals = with_numpy(py);
        let arr = eval(py, &format!("result = {expr}"), &locals);
        let view: Strided<f64> = python::from_dlpack(&arr).unwrap();
        let expected: Vec<f64> = arr
            .call_method0("ravel")
            .unwrap()
            .call_method0("tolist")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(view.data.to_vec().unwrap(), expected, "{expr}");
        assert_eq!(
            view.shape,
            arr.getattr("shape")
                .unwrap()
                .extract::<Vec<usize>>()
                .unwrap(),
            "{expr}"
        );
        let byte_strides: Vec<isize> = arr.getattr("strides").unwrap().extract().unwrap();
        let element_strides: Vec<isize> = byte_strides.iter().map(|s| s / 8).collect();
        // Extent-1 axes may carry any stride; compare the others.
        for (axis, &extent) in view.shape.iter().enumerate() {
            if extent > 1 {
                assert_eq!(
                    view.strides[axis], element_strides[axis],
                    "{expr} axis {axis}"
                );
            }
        }
        let data_ptr: usize = arr
            .getattr("ctypes")
            .unwrap()
            .getattr("data")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(view.data.as_ptr() as usize, data_ptr, "zero-copy: {expr}");
    });
}

#[test]
fn numpy_layouts_import_zero_copy() {
    import_matches_numpy("np.arange(12.0).reshape(3, 4)");
    import_matches_numpy("np.arange(12.0).reshape(3, 4).T");
    import_matches_numpy("np.arange(24.0).reshape(4, 6)[::2, 1::3]");
    import_matches_numpy("np.arange(12.0).reshape(3, 4)[::-1, ::-2]");
    import_matches_numpy("np.arange(10.0)[::-1]");
    import_matches_numpy("np.asfortranarray(np.arange(12.0).reshape(3, 4))");
    import_matches_numpy("np.array(7.5)");
}

#[test]
fn c02_numpy_negative_strides() {
    import_matches_numpy("np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::-1]");
    Python::attach(|py| {
        let locals = with_numpy(py);
        let arr = eval(
            py,
            "result = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::-1]",
            &locals,
        );
        let view: Strided<f64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.data.get(&[0, 0]).unwrap(), 3.0);
        assert_eq!(view.data.get(&[2, 3]).unwrap(), 8.0);
        let err = python::from_dlpack::<Compact<f64>>(&arr).err().unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "cannot import: tensor of shape [3, 4] and strides [4, -1] (elements) is not C-contiguous (row-major)"
        );
    });
}

#[test]
fn c04_zero_size_with_numpy_both_ways() {
    Python::attach(|py| {
        let np = numpy(py);
        for shape in [&[0usize][..], &[2, 0, 3]] {
            let counter = Counter::new();
            let obj = export_once(py, tensor(Vec::<f32>::new(), shape, &counter)).unwrap();
            let arr = np.call_method1("from_dlpack", (obj,)).unwrap();
            assert_eq!(
                arr.getattr("shape")
                    .unwrap()
                    .extract::<Vec<usize>>()
                    .unwrap(),
                shape
            );
            assert_eq!(arr.getattr("size").unwrap().extract::<usize>().unwrap(), 0);
            drop(arr);
            collect(py);
            assert_eq!(counter.get(), 1);

            let empty = np
                .call_method1("zeros", (shape.to_vec(),))
                .unwrap()
                .call_method1("astype", ("float32",))
                .unwrap();
            let view: Compact<f32> = python::from_dlpack(&empty).unwrap();
            assert_eq!(view.shape, shape);
            assert!(view.data.as_slice().unwrap().is_empty());
        }
    });
}

#[test]
fn c06_bool_with_numpy_both_ways() {
    Python::attach(|py| {
        let locals = with_numpy(py);
        let arr = eval(py, "result = np.array([True, False, True])", &locals);
        let view: Compact<bool> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [true, false, true]);
        let dtype = view.data.managed().dl_tensor().dtype;
        assert_eq!((dtype.code, dtype.bits, dtype.lanes), (6, 8, 1));
    });
    numpy_sees(vec![true, false, true], "bool");
}

#[test]
fn c07_numpy_read_only_flag() {
    Python::attach(|py| {
        let locals = with_numpy(py);
        let arr = eval(py, "result = np.arange(3, dtype=np.int64)", &locals);
        let mut view: Compact<i64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.data.managed().flags(), 0);
        view.data.as_slice_mut().unwrap()[0] = 10;
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .extract::<Vec<i64>>()
                .unwrap(),
            [10, 1, 2]
        );

        let arr = eval(
            py,
            "result = np.arange(3, dtype=np.int64)\nresult.flags.writeable = False",
            &locals,
        );
        let mut view: Compact<i64> = python::from_dlpack(&arr).unwrap();
        assert!(view.data.is_read_only());
        assert_eq!(
            view.data.as_slice_mut().unwrap_err(),
            dlpack_runtime::LayoutError::ReadOnly
        );
        assert_eq!(view.data.as_slice().unwrap(), [0, 1, 2]);

        // A legacy capsule carries no flag: read-only for this consumer.
        let capsule = eval(
            py,
            "result = np.arange(3, dtype=np.int64).__dlpack__()",
            &locals,
        );
        let mut view: Compact<i64> = python::from_dlpack(&capsule).unwrap();
        assert!(view.data.managed().is_legacy());
        assert!(view.data.as_slice_mut().is_err());
        assert_eq!(view.data.as_slice().unwrap(), [0, 1, 2]);
    });
}

#[test]
fn c08_one_capsule_consumed_twice() {
    Python::attach(|py| {
        let counter = Counter::new();
        let obj = export_once(py, tensor(vec![1i32, 2, 3], &[3], &counter)).unwrap();
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 3)).unwrap();
        let capsule = obj.call_method("__dlpack__", (), Some(&kwargs)).unwrap();
        let name = |c: &Bound<'_, PyAny>| {
            c.cast::<PyCapsule>()
                .unwrap()
                .name()
                .unwrap()
                .map(capsule_name)
        };
        assert_eq!(name(&capsule).as_deref(), Some("dltensor_versioned"));
        let first: Compact<i32> = python::from_dlpack(&capsule).unwrap();
        assert_eq!(name(&capsule).as_deref(), Some("used_dltensor_versioned"));
        let err = python::from_dlpack::<Compact<i32>>(&capsule).err().unwrap();
        assert!(err.is_instance_of::<PyValueError>(py));
        assert!(
            err.value(py).to_string().contains("already been consumed"),
            "{}",
            err.value(py)
        );
        drop(capsule);
        collect(py);
        assert_eq!(
            counter.get(),
            0,
            "the consumed capsule's destructor does nothing"
        );
        assert_eq!(first.data.as_slice().unwrap(), [1, 2, 3]);
        drop(first);
        assert_eq!(counter.get(), 1, "deleter ran exactly once in total");
    });
}

fn capsule_name(name: pyo3::types::capsule::CapsuleName) -> String {
    // SAFETY: the capsule is alive while the name is read (the caller holds it).
    unsafe { name.as_cstr() }.to_string_lossy().into_owned()
}

#[test]
fn deleter_counts_for_unconsumed_and_refused_capsules() {
    Python::attach(|py| {
        let counter = Counter::new();
        let obj = export_once(py, tensor(vec![1i32, 2], &[2], &counter)).unwrap();
        let capsule = obj.call_method0("__dlpack__").unwrap();
        drop(capsule);
        collect(py);
        assert_eq!(
            counter.get(),
            1,
            "an unconsumed capsule frees its tensor once"
        );

        let obj = export_once(py, tensor(vec![1i32, 2], &[2], &counter)).unwrap();
        let err = python::from_dlpack::<Compact<f32>>(&obj).err().unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "cannot import: dtype is int32, expected float32"
        );
        collect(py);
        assert_eq!(counter.get(), 2, "a refused import frees the tensor once");

        let err = obj.call_method0("__dlpack__").err().unwrap();
        assert!(
            err.is_instance_of::<PyBufferError>(py),
            "exported once by value"
        );
    });
}

#[test]
fn legacy_path_with_max_version_none() {
    Python::attach(|py| {
        let np = numpy(py);
        let counter = Counter::new();
        let obj = export_once(py, tensor(vec![1.0f64, 2.0], &[2], &counter)).unwrap();
        let capsule = obj.call_method0("__dlpack__").unwrap();
        let name = capsule
            .cast::<PyCapsule>()
            .unwrap()
            .name()
            .unwrap()
            .map(capsule_name);
        assert_eq!(name.as_deref(), Some("dltensor"));
        let view: Compact<f64> = python::from_dlpack(&capsule).unwrap();
        assert!(view.data.managed().is_legacy());
        assert_eq!(view.data.as_slice().unwrap(), [1.0, 2.0]);
        drop(view);
        assert_eq!(counter.get(), 1);

        // NumPy's legacy capsule through our consumer.
        let arr = np.call_method1("arange", (4.0,)).unwrap();
        let capsule = arr.call_method0("__dlpack__").unwrap();
        let view: Compact<f64> = python::from_dlpack(&capsule).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    });
}

#[test]
fn pyclass_tensor_is_shared_read_only_and_kept_alive() {
    Python::attach(|py| {
        let np = numpy(py);
        let counter = Counter::new();
        let obj = Bound::new(
            py,
            PyTensor {
                data: vec![1.0, 2.0, 3.0, 4.0],
                shape: vec![2, 2],
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let device: (i32, i32) = obj
            .call_method0("__dlpack_device__")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(device, (1, 0));
        let arr = np.call_method1("from_dlpack", (&obj,)).unwrap();
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .extract::<Vec<Vec<f32>>>()
                .unwrap(),
            [[1.0, 2.0], [3.0, 4.0]]
        );
        assert!(
            !arr.getattr("flags")
                .unwrap()
                .getattr("writeable")
                .unwrap()
                .extract::<bool>()
                .unwrap()
        );
        let data_ptr: usize = arr
            .getattr("ctypes")
            .unwrap()
            .getattr("data")
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(data_ptr, obj.get().data.as_ptr() as usize);
        // Exported many times; each export keeps the object alive.
        let second = np.call_method1("from_dlpack", (&obj,)).unwrap();
        drop(obj);
        collect(py);
        assert_eq!(counter.get(), 0, "NumPy's arrays keep the pyclass alive");
        assert_eq!(
            second
                .call_method0("sum")
                .unwrap()
                .extract::<f32>()
                .unwrap(),
            10.0
        );
        drop((arr, second));
        collect(py);
        assert_eq!(counter.get(), 1);
    });
}

#[test]
fn producer_argument_errors() {
    Python::attach(|py| {
        let counter = Counter::new();
        let obj = Bound::new(
            py,
            PyTensor {
                data: vec![1.0],
                shape: vec![1],
                _guard: counter.guard(),
            },
        )
        .unwrap();
        // A read-only export reaches a legacy consumer only as a copy: refused with copy=False.
        let kwargs = PyDict::new(py);
        kwargs.set_item("copy", false).unwrap();
        let err = obj
            .call_method("__dlpack__", (), Some(&kwargs))
            .err()
            .unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert!(
            err.value(py)
                .to_string()
                .starts_with("copy=False, but a read-only tensor")
        );
        // CPU accepts only stream=None (case C09).
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", 1).unwrap();
        let err = obj
            .call_method("__dlpack__", (), Some(&kwargs))
            .err()
            .unwrap();
        assert!(err.is_instance_of::<PyValueError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "stream=1 is not valid for a consumer on cpu:0, expected None"
        );
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", -1).unwrap();
        kwargs.set_item("max_version", (1, 0)).unwrap();
        assert!(
            obj.call_method("__dlpack__", (), Some(&kwargs))
                .err()
                .unwrap()
                .is_instance_of::<PyValueError>(py)
        );
        // dl_device elsewhere: BufferError (a device no copy reaches: ROCm); copy=False to a
        // device that needs a copy too.
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0)).unwrap();
        kwargs.set_item("dl_device", (10, 0)).unwrap();
        assert!(
            obj.call_method("__dlpack__", (), Some(&kwargs))
                .err()
                .unwrap()
                .is_instance_of::<PyBufferError>(py)
        );
        kwargs.set_item("dl_device", (2, 0)).unwrap();
        kwargs.set_item("copy", false).unwrap();
        let err = obj
            .call_method("__dlpack__", (), Some(&kwargs))
            .err()
            .unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "copy=False but exporting a cpu:0 tensor to dl_device cuda:0 needs a copy"
        );
        // Wrong argument types: TypeError.
        let kwargs = PyDict::new(py);
        kwargs.set_item("stream", "fast").unwrap();
        assert!(
            obj.call_method("__dlpack__", (), Some(&kwargs))
                .err()
                .unwrap()
                .is_instance_of::<PyTypeError>(py)
        );
        // dl_device=(CPU, 0) with copy=True: a writable copy flagged IS_COPIED.
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 3)).unwrap();
        kwargs.set_item("dl_device", (1, 0)).unwrap();
        kwargs.set_item("copy", true).unwrap();
        let capsule = obj.call_method("__dlpack__", (), Some(&kwargs)).unwrap();
        let view: Compact<f32> = python::from_dlpack(&capsule).unwrap();
        assert!(view.data.managed().is_copied());
        assert!(!view.data.is_read_only());
        assert_ne!(view.data.as_ptr(), obj.get().data.as_ptr());
    });
}

#[test]
fn consumer_argument_errors() {
    Python::attach(|py| {
        let np = numpy(py);
        let err = python::from_dlpack::<Compact<f64>>(
            &np.call_method1("arange", (3,))
                .unwrap()
                .call_method0("tolist")
                .unwrap(),
        )
        .err()
        .unwrap();
        // Not a producer: a TypeError saying what was found and what is expected.
        assert!(err.is_instance_of::<PyTypeError>(py), "{err}");
        // With feature `cuda` the message also names `__cuda_array_interface__`.
        let message = err.value(py).to_string();
        assert!(
            message.starts_with("expected a DLPack producer (an object with `__dlpack__`: a NumPy, PyTorch, JAX or CuPy array, say)")
                && message.ends_with(" or a DLPack capsule, found `list`"),
            "{message}"
        );
        let other = foreign_capsule(py);
        let err = python::from_dlpack::<Compact<f64>>(&other).err().unwrap();
        assert!(err.is_instance_of::<PyTypeError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "capsule is named \"not_dlpack\", expected \"dltensor_versioned\" or \"dltensor\""
        );
        let _ = Device::CPU;
    });
}

fn foreign_capsule(py: Python<'_>) -> Bound<'_, PyAny> {
    PyCapsule::new_with_value(py, 5u32, c"not_dlpack")
        .unwrap()
        .into_any()
}

#[test]
fn c03_step_broadcast_and_fortran_slices() {
    Python::attach(|py| {
        let locals = with_numpy(py);
        // (a) arange(10)[::2]: stride 2.
        let arr = eval(py, "result = np.arange(10, dtype=np.int64)[::2]", &locals);
        let view: Strided<i64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.strides, [2]);
        assert_eq!(view.data.to_vec().unwrap(), [0, 2, 4, 6, 8]);
        // (b) a broadcast of one value: stride 0 is legal.
        let arr = eval(py, "result = np.broadcast_to(np.int64(9), (10,))", &locals);
        let view: Strided<i64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.strides, [0]);
        assert_eq!(view.data.to_vec().unwrap(), [9; 10]);
        assert!(
            view.data.is_read_only(),
            "NumPy exports broadcasts read-only"
        );
        // (c) Fortran-order (3, 4) sliced [::2, :]: NumPy's rows 0 and 2.
        let arr = eval(
            py,
            "result = np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4))[::2, :]",
            &locals,
        );
        let view: Strided<i64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.strides, [2, 3]);
        assert_eq!(view.data.to_vec().unwrap(), [0, 1, 2, 3, 8, 9, 10, 11]);
        assert!(python::from_dlpack::<Compact<i64>>(&arr).is_err());
    });
}

unsafe extern "C" fn test_capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    let name = dlpack_runtime::ffi::DLTENSOR_VERSIONED_CAPSULE_NAME.as_ptr();
    // SAFETY: CPython calls this with the capsule and the GIL; the pointer of an unconsumed
    // "dltensor_versioned" capsule is a managed tensor whose deleter is at offset 16.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, name) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, name)
                .cast::<dlpack_runtime::ffi::DLManagedTensorVersioned>();
            if let Some(deleter) = (*p).deleter {
                deleter(p);
            }
        }
    }
}

#[test]
fn c10_versioned_capsules_and_a_foreign_major() {
    Python::attach(|py| {
        let locals = with_numpy(py);
        // NumPy's versioned capsule (max_version=(1, 0)) is read through the versioned layout.
        let capsule = eval(
            py,
            "result = np.arange(4.0).__dlpack__(max_version=(1, 0))",
            &locals,
        );
        let view: Compact<f64> = python::from_dlpack(&capsule).unwrap();
        let version = view.data.managed().version().unwrap();
        assert_eq!(version.major, 1);
        assert_eq!(view.data.as_slice().unwrap(), [0.0, 1.0, 2.0, 3.0]);

        // A capsule of major 2 is refused untouched; its producer's destructor frees it.
        let counter = Counter::new();
        let raw = dlpack_tests::Foreign::new(
            &dlpack_tests::bytes_of(&[1f32]),
            dlpack_runtime::DataType::F32,
            &[1],
        )
        .version(2, 0)
        .versioned(&counter);
        // SAFETY: `raw` is a live managed tensor; the destructor frees it once under the
        // unconsumed name.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                std::ptr::NonNull::new(raw.cast()).unwrap(),
                dlpack_runtime::ffi::DLTENSOR_VERSIONED_CAPSULE_NAME,
                Some(test_capsule_destructor),
            )
        }
        .unwrap();
        let err = python::from_dlpack::<Compact<f32>>(capsule.as_any())
            .err()
            .unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert_eq!(
            err.value(py).to_string(),
            "DLPack version 2.0 is not supported, expected major version 1"
        );
        assert_eq!(
            capsule.name().unwrap().map(capsule_name).as_deref(),
            Some("dltensor_versioned")
        );
        assert_eq!(counter.get(), 0);
        drop(capsule);
        assert_eq!(
            counter.get(),
            1,
            "the producer's destructor called the deleter"
        );
    });
}

#[test]
fn numpy_dtypes_without_a_basic_rust_type() {
    use half::{bf16, f16};
    use num_complex::Complex;
    Python::attach(|py| {
        let locals = with_numpy(py);
        let arr = eval(
            py,
            "result = np.array([0.5, -2.0], dtype=np.float16)",
            &locals,
        );
        let view: Compact<f16> = python::from_dlpack(&arr).unwrap();
        assert_eq!(
            view.data.as_slice().unwrap(),
            [f16::from_f32(0.5), f16::from_f32(-2.0)]
        );
        let arr = eval(
            py,
            "result = np.array([1+2j, -3j], dtype=np.complex64)",
            &locals,
        );
        let view: Compact<Complex<f32>> = python::from_dlpack(&arr).unwrap();
        assert_eq!(
            view.data.as_slice().unwrap(),
            [Complex::new(1.0, 2.0), Complex::new(0.0, -3.0)]
        );
        let arr = eval(
            py,
            "result = np.array([1+2j, -3j], dtype=np.complex128)[::-1]",
            &locals,
        );
        let view: Strided<Complex<f64>> = python::from_dlpack(&arr).unwrap();
        assert_eq!(
            view.data.to_vec().unwrap(),
            [Complex::new(0.0, -3.0), Complex::new(1.0, 2.0)]
        );
        for (dtype, rust) in [
            ("uint16", "u16"),
            ("int8", "i8"),
            ("uint32", "u32"),
            ("uint64", "u64"),
            ("int16", "i16"),
        ] {
            let arr = eval(
                py,
                &format!("result = np.arange(3, dtype=np.{dtype})"),
                &locals,
            );
            let values: Vec<i128> = match rust {
                "u16" => ints::<u16>(&arr),
                "i8" => ints::<i8>(&arr),
                "u32" => ints::<u32>(&arr),
                "u64" => ints::<u64>(&arr),
                _ => ints::<i16>(&arr),
            };
            assert_eq!(values, [0, 1, 2], "{dtype}");
        }
        // Rust-produced half and complex tensors read by NumPy.
        let counter = Counter::new();
        let obj =
            export_once(py, tensor(vec![Complex::new(1.0f64, -1.0)], &[1], &counter)).unwrap();
        let arr = numpy(py).call_method1("from_dlpack", (obj,)).unwrap();
        assert_eq!(
            arr.getattr("dtype").unwrap().str().unwrap().to_string(),
            "complex128"
        );
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .str()
                .unwrap()
                .to_string(),
            "[(1-1j)]"
        );
        let obj = export_once(py, tensor(vec![bf16::from_f32(1.5)], &[1], &counter)).unwrap();
        let err = numpy(py).call_method1("from_dlpack", (obj,)).err().unwrap();
        // NumPy has no bfloat16: it refuses (with its own RuntimeError), and the tensor is
        // still freed once.
        assert!(err.to_string().contains("Unsupported dtype"), "{err}");
        drop(arr);
        collect(py);
        assert_eq!(counter.get(), 2);
    });
}

/// Rust -> NumPy for every NumPy dtype that has a Rust element type here.
#[test]
fn numpy_reads_every_dtype_it_has() {
    use half::f16;
    use num_complex::Complex;
    numpy_sees(vec![-8i8, 7], "int8");
    numpy_sees(vec![-16i16, 15], "int16");
    numpy_sees(vec![0u16, u16::MAX], "uint16");
    numpy_sees(vec![0u32, u32::MAX], "uint32");
    numpy_sees(vec![0u64, u64::MAX], "uint64");
    Python::attach(|py| {
        let np = numpy(py);
        let counter = Counter::new();
        let obj = export_once(
            py,
            tensor(
                vec![f16::from_f32(0.5), f16::from_f32(-2.0)],
                &[2],
                &counter,
            ),
        )
        .unwrap();
        let arr = np.call_method1("from_dlpack", (obj,)).unwrap();
        assert_eq!(
            arr.getattr("dtype").unwrap().str().unwrap().to_string(),
            "float16"
        );
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .extract::<Vec<f64>>()
                .unwrap(),
            [0.5, -2.0]
        );
        let obj = export_once(py, tensor(vec![Complex::new(1.0f32, 2.0)], &[1], &counter)).unwrap();
        let arr2 = np.call_method1("from_dlpack", (obj,)).unwrap();
        assert_eq!(
            arr2.getattr("dtype").unwrap().str().unwrap().to_string(),
            "complex64"
        );
        assert_eq!(
            arr2.call_method0("tolist")
                .unwrap()
                .str()
                .unwrap()
                .to_string(),
            "[(1+2j)]"
        );
        drop((arr, arr2));
        collect(py);
        assert_eq!(counter.get(), 2);
    });
}

/// The values of an integer NumPy array, read through a compact consumer of `T`.
fn ints<T: Element + Into<i128>>(arr: &Bound<'_, PyAny>) -> Vec<i128> {
    let view: Compact<T> = python::from_dlpack(arr).unwrap();
    view.data
        .to_vec()
        .unwrap()
        .into_iter()
        .map(Into::into)
        .collect()
}
