//! Interop with JAX (CPU) and array-api-strict, both ways, with value checks and deleter counts
//! (feature `python`; both come from `.venv`, set up by `scripts/test.sh`).
#![cfg(feature = "python")]

use dlpack_runtime::python::{self, export_once};
use dlpack_tests::Counter;
use dlpack_tests::py::{collect, eval as run};
use dlpack_tests::types::{Strided, tensor};
use half::bf16;
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn jax(py: Python<'_>) -> Bound<'_, PyDict> {
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
