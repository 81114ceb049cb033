//! Interop with JAX (CPU) and array-api-strict, both ways, with value checks and deleter counts
//! (feature `python`; both come from `.venv`, set up by `scripts/test.sh`).
#![cfg(feature = "python")]

use dlpack_runtime::DlpackExport;
use dlpack_runtime::python::{self, export_once};
use dlpack_tests::py::{collect, eval as run};
use dlpack_tests::types::{Strided, tensor};
use dlpack_tests::{Counter, DropGuard};
use half::bf16;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The README's producer: a frozen pyclass tensor, exported shared and read-only.
#[pyclass(frozen)]
#[derive(DlpackExport)]
struct Frozen {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

dlpack_tests::dlpack_pymethods!(Frozen);

fn jax(py: Python<'_>) -> Bound<'_, PyDict> {
    dlpack_tests::py::import_jax_once(py);
    let l = PyDict::new(py);
    run(
        py,
        "import jax, jax.numpy as jnp, ml_dtypes, numpy as np\njax.config.update('jax_platforms', 'cpu')\nresult = None",
        &l,
    );
    l
}

#[test]
fn jax_reads_rust_tensors() {
    Python::attach(|py| {
        let l = jax(py);
        let counter = Counter::new();
        let cases: Vec<(Bound<'_, PyAny>, &str, &str)> = vec![
            (
                export_once(py, tensor(vec![1.5f32, -2.0, 3.0, 4.0], &[2, 2], &counter))
                    .unwrap()
                    .into_any(),
                "float32",
                "[[1.5, -2.0], [3.0, 4.0]]",
            ),
            (
                export_once(py, tensor(vec![7i64, -8], &[2], &counter))
                    .unwrap()
                    .into_any(),
                "int64",
                "[7, -8]",
            ),
            (
                export_once(py, tensor(vec![true, false], &[2], &counter))
                    .unwrap()
                    .into_any(),
                "bool",
                "[True, False]",
            ),
            (
                export_once(
                    py,
                    tensor(
                        vec![bf16::from_f32(0.5), bf16::from_f32(-1.0)],
                        &[2],
                        &counter,
                    ),
                )
                .unwrap()
                .into_any(),
                "bfloat16",
                "[0.5, -1.0]",
            ),
        ];
        let n = cases.len();
        for (obj, dtype, values) in cases {
            l.set_item("obj", obj).unwrap();
            let arr = run(
                py,
                "jax.config.update('jax_enable_x64', True)\nresult = jnp.from_dlpack(obj)",
                &l,
            );
            assert_eq!(
                arr.getattr("dtype").unwrap().str().unwrap().to_string(),
                dtype
            );
            assert_eq!(
                arr.call_method0("tolist")
                    .unwrap()
                    .str()
                    .unwrap()
                    .to_string(),
                values,
                "{dtype}"
            );
            l.del_item("obj").unwrap();
            drop(arr);
        }
        run(py, "jax.clear_caches()\nresult = None", &l);
        collect(py);
        assert_eq!(counter.get(), n, "JAX released every tensor once");
    });
}

/// JAX asks with `stream=None` and no `max_version`: a legacy request, whose capsule cannot say
/// read-only. A frozen pyclass tensor then reaches JAX (and any legacy consumer) as a writable
/// copy; with `copy=False` the request is refused; NumPy's versioned request still shares.
#[test]
fn legacy_consumers_of_a_frozen_pyclass_get_a_copy() {
    Python::attach(|py| {
        let l = jax(py);
        let counter = Counter::new();
        let t = Bound::new(
            py,
            Frozen {
                data: vec![1.5, -2.0, 3.0, 4.0, 5.0, 6.0],
                shape: vec![2, 3],
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let address = t.get().data.as_ptr() as usize;
        l.set_item("t", &t).unwrap();
        let arr = run(py, "result = jnp.from_dlpack(t)", &l);
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .str()
                .unwrap()
                .to_string(),
            "[[1.5, -2.0, 3.0], [4.0, 5.0, 6.0]]"
        );
        let written = run(
            py,
            "a = jnp.from_dlpack(t)\nresult = a.at[0, 0].set(100.0).tolist()",
            &l,
        );
        assert_eq!(
            written.str().unwrap().to_string(),
            "[[100.0, -2.0, 3.0], [4.0, 5.0, 6.0]]"
        );
        // A legacy capsule is the consumer's own copy: writing it leaves the Rust tensor as it
        // was. (NumPy marks arrays from legacy capsules read-only, so the write goes through
        // the capsule's data pointer.)
        let capsule = t.call_method0("__dlpack__").unwrap();
        let managed = python::consume_capsule(&capsule).unwrap();
        assert!(managed.is_legacy());
        let data = managed.dl_tensor().data.cast::<f32>();
        assert_ne!(data as usize, address, "a copy, not the Rust buffer");
        // SAFETY: the legacy copy is a fresh, compact, writable host buffer of 6 float32 that
        // this test owns.
        let values = unsafe {
            data.write(100.0);
            core::slice::from_raw_parts(data, 6).to_vec()
        };
        assert_eq!(values, [100.0, -2.0, 3.0, 4.0, 5.0, 6.0]);
        drop(managed);
        assert_eq!(
            t.get().data,
            [1.5, -2.0, 3.0, 4.0, 5.0, 6.0],
            "the Rust tensor is unchanged"
        );
        // copy=False forbids the copy: BufferError, naming why.
        let kwargs = PyDict::new(py);
        kwargs.set_item("copy", false).unwrap();
        let err = t
            .call_method("__dlpack__", (), Some(&kwargs))
            .err()
            .unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py));
        assert!(err.value(py).to_string().contains("legacy"));
        // NumPy asks with max_version: the versioned capsule shares the Rust buffer, read-only.
        let shared = run(
            py,
            "s = np.from_dlpack(t)\nresult = (s.flags.writeable, s.ctypes.data, s.tolist())",
            &l,
        );
        let (writeable, shared_address, values): (bool, usize, Vec<Vec<f32>>) =
            shared.extract().unwrap();
        assert!(!writeable);
        assert_eq!(shared_address, address, "zero-copy: the same address");
        assert_eq!(values, [[1.5, -2.0, 3.0], [4.0, 5.0, 6.0]]);
    });
}

/// One float8 format both ways with JAX: every bit pattern, read by typed access from a JAX
/// array (values equal to ml_dtypes' conversion to float32, bits unchanged), and a Rust tensor
/// of every bit pattern read by JAX.
fn float8_both_ways<T>(
    name: &str,
    from_bits: fn(u8) -> T,
    to_bits: fn(&T) -> u8,
    to_f32: fn(&T) -> f32,
) where
    T: dlpack_runtime::Element,
{
    Python::attach(|py| {
        let l = jax(py);
        l.set_item("name", name).unwrap();
        let arr = run(
            py,
            "dt = getattr(ml_dtypes, name)\nbits = np.arange(256, dtype=np.uint8)\nresult = jnp.asarray(bits.view(dt))",
            &l,
        );
        let expected: Vec<f32> = run(py, "result = bits.view(dt).astype(np.float32).tolist()", &l)
            .extract()
            .unwrap();
        let view: Strided<T> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.shape, [256]);
        let values = view.data.to_vec().unwrap();
        let slice: Vec<u8> = view.data.as_slice().unwrap().iter().map(to_bits).collect();
        let array: Vec<u8> = view.data.as_array().unwrap().iter().map(to_bits).collect();
        assert_eq!(slice, (0..=255u8).collect::<Vec<_>>());
        assert_eq!(
            array, slice,
            "{name}: the ndarray view reads the same elements"
        );
        for (bits, (value, want)) in values.iter().zip(&expected).enumerate() {
            assert_eq!(
                to_bits(value) as usize,
                bits,
                "{name}: bits of element {bits}"
            );
            let got = to_f32(value);
            assert!(
                got == *want || got.is_nan() && want.is_nan(),
                "{name} {bits:#04x}: {got} here, {want} in ml_dtypes"
            );
            assert_eq!(view.data.get(&[bits]).map(|v| to_bits(&v)), Ok(bits as u8));
        }
        // A strided view (every other element, reversed) through typed access.
        let strided = run(py, "result = jnp.asarray(bits.view(dt))[::-2]", &l);
        let view: Strided<T> = python::from_dlpack(&strided).unwrap();
        let got: Vec<u8> = view.data.to_vec().unwrap().iter().map(to_bits).collect();
        let want: Vec<u8> = (0..=255u8).rev().step_by(2).collect();
        assert_eq!(got, want, "{name}: reversed, every other element");
        // Rust to JAX.
        let counter = Counter::new();
        let data: Vec<T> = (0..=255u8).map(from_bits).collect();
        l.set_item(
            "obj",
            export_once(py, tensor(data, &[256], &counter)).unwrap(),
        )
        .unwrap();
        let (dtype, bits): (String, Vec<u8>) = run(
            py,
            "a = jnp.from_dlpack(obj)\nresult = (str(a.dtype), np.asarray(a).view(np.uint8).tolist())",
            &l,
        )
        .extract()
        .unwrap();
        assert_eq!(dtype, name);
        assert_eq!(bits, (0..=255u8).collect::<Vec<_>>());
    });
}

#[test]
fn float8_e4m3fn_both_ways_with_jax() {
    float8_both_ways(
        "float8_e4m3fn",
        float8::F8E4M3::from_bits,
        float8::F8E4M3::to_bits,
        float8::F8E4M3::to_f32,
    );
}

#[test]
fn float8_e5m2_both_ways_with_jax() {
    float8_both_ways(
        "float8_e5m2",
        float8::F8E5M2::from_bits,
        float8::F8E5M2::to_bits,
        float8::F8E5M2::to_f32,
    );
}

#[test]
fn rust_reads_jax_arrays() {
    Python::attach(|py| {
        let l = jax(py);
        let arr = run(
            py,
            "result = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)",
            &l,
        );
        let view: Strided<f32> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.shape, [2, 3]);
        assert_eq!(view.data.to_vec().unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let arr = run(
            py,
            "result = jnp.array([0.5, -1.0, 2.0], dtype=jnp.bfloat16)",
            &l,
        );
        let view: Strided<bf16> = python::from_dlpack(&arr).unwrap();
        assert_eq!(
            view.data.to_vec().unwrap(),
            [
                bf16::from_f32(0.5),
                bf16::from_f32(-1.0),
                bf16::from_f32(2.0)
            ]
        );
        let arr = run(py, "result = jnp.array([True, False, True])", &l);
        let view: Strided<bool> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.data.to_vec().unwrap(), [true, false, true]);
        let arr = run(
            py,
            "jax.config.update('jax_enable_x64', True)\nresult = jnp.arange(4, dtype=jnp.int64)[::-1]",
            &l,
        );
        let view: Strided<i64> = python::from_dlpack(&arr).unwrap();
        assert_eq!(view.data.to_vec().unwrap(), [3, 2, 1, 0]);
        // JAX arrays are immutable: their capsules say so, and mutable access is refused.
        let arr = run(py, "result = jnp.ones(2, dtype=jnp.float32)", &l);
        let mut view: Strided<f32> = python::from_dlpack(&arr).unwrap();
        if view.data.is_read_only() {
            assert!(view.data.as_slice_mut().is_err());
        }
        assert_eq!(view.data.to_vec().unwrap(), [1.0, 1.0]);
    });
}

#[test]
fn array_api_strict_both_ways() {
    Python::attach(|py| {
        let l = PyDict::new(py);
        run(py, "import array_api_strict as xp\nresult = None", &l);
        let counter = Counter::new();
        let obj = export_once(py, tensor(vec![1i32, 2, 3, 4, 5, 6], &[3, 2], &counter)).unwrap();
        l.set_item("obj", obj).unwrap();
        let arr = run(
            py,
            "result = xp.from_dlpack(obj)\nassert result.shape == (3, 2)\nassert result.dtype == xp.int32",
            &l,
        );
        l.set_item("a", &arr).unwrap();
        let sum: i64 = run(py, "result = int(xp.sum(a))", &l).extract().unwrap();
        assert_eq!(sum, 21);
        let back: Strided<i32> = python::from_dlpack(&arr).unwrap();
        assert_eq!(back.data.to_vec().unwrap(), [1, 2, 3, 4, 5, 6]);
        let arr2 = run(
            py,
            "result = xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3)).mT",
            &l,
        );
        let view: Strided<f64> = python::from_dlpack(&arr2).unwrap();
        assert_eq!(view.shape, [3, 2]);
        assert_eq!(view.strides, [1, 3], "a transposed view, read in place");
        assert_eq!(view.data.to_vec().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        drop((arr, back, arr2));
        l.clear();
        collect(py);
        assert_eq!(counter.get(), 1);
    });
}
