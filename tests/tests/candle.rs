//! candle interop (feature `candle`): candle tensors lent zero-copy (views with a start offset
//! and strides included), candle tensors built from DLPack tensors (a copy, any strides), every
//! candle dtype both ways, and refusals that still run the producer's deleter once. With the
//! `python` feature too: NumPy and JAX, both ways.
#![cfg(feature = "candle")]

use candle_core::{CpuStorage, DType, Device as CandleDevice, IndexOp, Storage, Tensor};
use dlpack_runtime::candle::{CandleError, CandleTensor, tensor_from_dlpack, tensor_from_managed};
use dlpack_runtime::{DataType, DlpackExport, DlpackImport, ImportedData};
use dlpack_tests::Counter;
use dlpack_tests::types::{Strided, tensor};

/// The address of element 0 of `t`'s CPU storage.
fn storage_address(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        panic!("a CPU tensor")
    };
    match cpu {
        CpuStorage::F32(v) => v.as_ptr() as usize,
        CpuStorage::I64(v) => v.as_ptr() as usize,
        _ => panic!("f32 or i64 storage"),
    }
}

/// A 3x4 float32 matrix 0..12 and its view rows 1..3, columns 1..4, transposed: shape (3, 2),
/// strides (1, 4), start offset 5 elements.
fn matrix_and_view() -> (Tensor, Tensor) {
    let m = Tensor::arange(0f32, 12.0, &CandleDevice::Cpu)
        .unwrap()
        .reshape((3, 4))
        .unwrap();
    let v = m.i((1..3, 1..4)).unwrap().t().unwrap();
    (m, v)
}

#[test]
fn a_candle_view_is_lent_zero_copy_with_its_offset_and_strides() {
    let (m, v) = matrix_and_view();
    assert_eq!(v.layout().start_offset(), 5);
    let managed = CandleTensor::new(&v).unwrap().into_dlpack().unwrap();
    assert!(
        managed.is_read_only(),
        "candle storage is shared with every clone"
    );
    // The offset is folded into `data`: element (0, 0) is storage element 5.
    assert_eq!(
        managed.dl_tensor().data as usize,
        storage_address(&m) + 5 * 4,
        "zero-copy: candle's own storage"
    );
    drop(m);
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.shape, [3, 2]);
    assert_eq!(view.strides, [1, 4]);
    let expected: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(expected, [5.0, 9.0, 6.0, 10.0, 7.0, 11.0]);
    drop(v);
    // The export keeps the storage alive after every candle handle is gone.
    assert_eq!(view.data.to_vec().unwrap(), expected);
}

#[test]
fn dlpack_tensors_become_candle_tensors_in_row_major_order() {
    let counter = Counter::new();
    // A 2x3 int64 tensor stored reversed: strides (-3, -1) from the last element.
    let mut t = tensor(vec![0i64, 1, 2, 3, 4, 5], &[2, 3], &counter);
    t.strides = Some(vec![-3, -1]);
    t.offset = 5 * 8;
    let c = tensor_from_dlpack(t, &CandleDevice::Cpu).unwrap();
    assert_eq!(
        counter.get(),
        1,
        "the producer's deleter ran after the copy"
    );
    assert_eq!(c.dtype(), DType::I64);
    assert_eq!(c.to_vec2::<i64>().unwrap(), [[5, 4, 3], [2, 1, 0]]);
    // A candle view back into candle: the same values, now contiguous.
    let (_, v) = matrix_and_view();
    let back = tensor_from_dlpack(CandleTensor::new(&v).unwrap(), &CandleDevice::Cpu).unwrap();
    assert!(back.is_contiguous());
    assert_eq!(back.to_vec2::<f32>().unwrap(), v.to_vec2::<f32>().unwrap());
}

#[test]
fn every_candle_dtype_goes_both_ways() {
    let cpu = &CandleDevice::Cpu;
    let base = Tensor::new(&[0f32, 1.0, 2.5, -3.0], cpu).unwrap();
    let cases = [
        (DType::U8, DataType::U8),
        (DType::U32, DataType::U32),
        (DType::I16, DataType::I16),
        (DType::I32, DataType::I32),
        (DType::I64, DataType::I64),
        (DType::F16, DataType::F16),
        (DType::BF16, DataType::BF16),
        (DType::F32, DataType::F32),
        (DType::F64, DataType::F64),
        (DType::F8E4M3, DataType::F8E4M3FN),
    ];
    for (candle, dlpack) in cases {
        let input = if matches!(candle, DType::U8 | DType::U32) {
            base.abs().unwrap().to_dtype(candle).unwrap()
        } else {
            base.to_dtype(candle).unwrap()
        };
        let managed = CandleTensor::new(&input).unwrap().into_dlpack().unwrap();
        assert_eq!(
            DataType::from_raw(managed.dl_tensor().dtype),
            dlpack,
            "{candle:?}"
        );
        let back = tensor_from_managed(managed, cpu).unwrap();
        assert_eq!(back.dtype(), candle);
        if candle == DType::F8E4M3 {
            // candle 0.11's conversion out of F8E4M3 recurses forever: compare the bits.
            let bits = |t: &Tensor| -> Vec<u8> {
                let values = t.to_vec1::<float8::F8E4M3>().unwrap();
                values.iter().map(float8::F8E4M3::to_bits).collect()
            };
            assert_eq!(bits(&back), bits(&input));
            assert_eq!(bits(&back), [0x00, 0x38, 0x42, 0xc4], "0, 1, 2.5, -3");
            continue;
        }
        assert_eq!(
            back.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap(),
            input
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap(),
            "{candle:?}"
        );
    }
}

#[test]
fn dtypes_candle_lacks_are_refused_after_the_deleter_ran() {
    let counter = Counter::new();
    let err =
        tensor_from_dlpack(tensor(vec![1i8, 2], &[2], &counter), &CandleDevice::Cpu).unwrap_err();
    assert!(
        matches!(err, CandleError::Dtype { found } if found == DataType::I8),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "DLPack dtype int8 has no candle dtype, expected uint8, uint32, int16, int32, int64, float16, bfloat16, float32, float64 or float8_e4m3fn"
    );
    assert_eq!(counter.get(), 1);
    let err =
        tensor_from_dlpack(tensor(vec![true], &[1], &counter), &CandleDevice::Cpu).unwrap_err();
    assert!(matches!(err, CandleError::Dtype { .. }));
    assert_eq!(counter.get(), 2);
}

#[test]
fn a_candle_import_is_typed_access_of_the_lent_storage() {
    // The export is a plain DLPack producer: any consumer type reads it.
    #[derive(DlpackImport)]
    #[dlpack(dtype = f32, shape = [_, 2])]
    struct Pairs {
        #[dlpack(data)]
        data: ImportedData<f32>,
        #[dlpack(shape)]
        shape: [usize; 2],
        #[dlpack(strides)]
        strides: [isize; 2],
    }
    let (_, v) = matrix_and_view();
    let pairs = Pairs::from_dlpack(CandleTensor::new(&v).unwrap()).unwrap();
    assert_eq!((pairs.shape, pairs.strides), ([3, 2], [1, 4]));
    assert_eq!(pairs.data.get(&[2, 1]).unwrap(), 11.0);
    assert!(pairs.data.is_read_only());
}

#[cfg(feature = "python")]
mod python {
    use super::*;
    use dlpack_runtime::candle::tensor_from_py;
    use dlpack_runtime::python::export_once;
    use dlpack_tests::py::eval as run;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    fn locals(py: Python<'_>) -> Bound<'_, PyDict> {
        dlpack_tests::py::import_jax_once(py);
        let l = PyDict::new(py);
        run(
            py,
            "import jax, jax.numpy as jnp, numpy as np\njax.config.update('jax_platforms', 'cpu')\nresult = None",
            &l,
        );
        l
    }

    #[test]
    fn numpy_reads_candle_views_in_place() {
        Python::attach(|py| {
            let l = locals(py);
            let (m, v) = matrix_and_view();
            let address = storage_address(&m) + 5 * 4;
            l.set_item(
                "t",
                export_once(py, CandleTensor::new(&v).unwrap()).unwrap(),
            )
            .unwrap();
            let (data, strides, values, writeable): (usize, Vec<isize>, Vec<Vec<f32>>, bool) =
                run(
                    py,
                    "a = np.from_dlpack(t)\nresult = (a.ctypes.data, list(a.strides), a.tolist(), a.flags.writeable)",
                    &l,
                )
                .extract()
                .unwrap();
            assert_eq!(
                data, address,
                "NumPy reads candle's storage: the same address"
            );
            assert_eq!(
                strides,
                [4, 16],
                "strides in bytes: (1, 4) elements of float32"
            );
            assert_eq!(values, v.to_vec2::<f32>().unwrap());
            assert!(!writeable);
        });
    }

    #[test]
    fn numpy_and_jax_arrays_become_candle_tensors() {
        Python::attach(|py| {
            let l = locals(py);
            let cases = [
                // NumPy, contiguous and strided (reversed columns, every other row).
                "np.arange(12.0, dtype=np.float32).reshape(3, 4)",
                "np.arange(24.0, dtype=np.float32).reshape(6, 4)[::2, ::-1]",
                // JAX.
                "jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)",
                "jnp.arange(24.0, dtype=jnp.float32).reshape(6, 4)[::2, ::-1]",
            ];
            for code in cases {
                let arr = run(py, &format!("result = {code}"), &l);
                l.set_item("arr", &arr).unwrap();
                let expected: Vec<Vec<f32>> = run(py, "result = np.asarray(arr).tolist()", &l)
                    .extract()
                    .unwrap();
                let c = tensor_from_py(&arr).unwrap();
                assert_eq!(c.to_vec2::<f32>().unwrap(), expected, "{code}");
                // And back: candle's result to NumPy, zero-copy.
                let doubled = (c * 2.0).unwrap();
                l.set_item(
                    "d",
                    export_once(py, CandleTensor::new(&doubled).unwrap()).unwrap(),
                )
                .unwrap();
                let back: Vec<Vec<f32>> = run(py, "result = np.from_dlpack(d).tolist()", &l)
                    .extract()
                    .unwrap();
                let want: Vec<Vec<f32>> = expected
                    .iter()
                    .map(|row| row.iter().map(|x| x * 2.0).collect())
                    .collect();
                assert_eq!(back, want, "{code}, doubled by candle");
            }
        });
    }
}
