//! burn interop (feature `burn`): burn CPU tensors (`burn-ndarray`) of every dtype lent
//! zero-copy (transposed, sliced and broadcast views included) to our own consumers and back,
//! imports that keep the producer's memory (C-contiguous) or copy it (other strides), host data
//! of any backend (float16 and bfloat16 included), refusals, and the producer's deleter run
//! once on every path. With the `python` feature too: NumPy and PyTorch, both ways.
#![cfg(feature = "burn")]

use burn_ndarray::{NdArray, NdArrayTensor};
use burn_tensor::{Bool, DType, Float, Int, Tensor, TensorData, TensorPrimitive, f16};
use dlpack_runtime::burn::{
    BurnData, BurnError, BurnTensor, tensor_data_from_managed, tensor_from_dlpack,
    tensor_from_managed,
};
use dlpack_runtime::{DataType, DlpackExport, DlpackImport, Element, ImportBuffer, ImportedData};
use dlpack_tests::Counter;
use dlpack_tests::types::{Strided, tensor};

type B = NdArray;

/// The address of element `(0, ..., 0)` of a burn CPU tensor's storage, read through burn's own
/// view of it (owned or borrowed storage alike).
fn address(t: &NdArrayTensor) -> usize {
    macro_rules! first {
        ($($variant:ident),*) => {
            match t {
                $(NdArrayTensor::$variant(s) => s.view().as_ptr() as usize,)*
            }
        };
    }
    first!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool)
}

fn float_primitive<const D: usize>(t: &Tensor<B, D>) -> NdArrayTensor {
    match t.clone().into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => panic!("not quantized"),
    }
}

fn float_address<const D: usize>(t: &Tensor<B, D>) -> usize {
    address(&float_primitive(t))
}

/// A 3x4 float32 matrix 0..12.
fn matrix() -> Tensor<B, 2> {
    Tensor::<B, 1, Int>::arange(0..12, &Default::default())
        .float()
        .reshape([3, 4])
}

/// The strides (elements) of a burn CPU tensor's view of its storage.
fn strides(t: &NdArrayTensor) -> Vec<isize> {
    macro_rules! strides {
        ($($variant:ident),*) => {
            match t {
                $(NdArrayTensor::$variant(s) => s.view().strides().to_vec(),)*
            }
        };
    }
    strides!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool)
}

#[test]
fn a_transposed_burn_tensor_is_lent_zero_copy_with_its_strides() {
    let m = matrix();
    let base = float_address(&m);
    // Transposed: shape (4, 3), strides (1, 4), burn's storage as it is.
    let v = m.clone().transpose();
    let expected: Vec<f32> = v.to_data().to_vec().unwrap();
    assert_eq!(&expected[..4], [0.0, 4.0, 8.0, 1.0]);
    let managed = BurnTensor::new(v).unwrap().into_dlpack().unwrap();
    assert!(
        managed.is_read_only(),
        "burn storage is shared with every clone"
    );
    assert_eq!(
        managed.dl_tensor().data as usize + managed.dl_tensor().byte_offset as usize,
        base,
        "zero-copy: burn's own storage"
    );
    drop(m);
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.shape, [4, 3]);
    assert_eq!(view.strides, [1, 4]);
    // The export keeps the storage alive after every burn handle is gone.
    assert_eq!(view.data.to_vec().unwrap(), expected);
}

#[test]
fn sliced_flipped_and_expanded_tensors_are_lent_as_burn_holds_them() {
    let device = Default::default();
    let column = Tensor::<B, 2>::from_data([[1.0f32], [2.0], [3.0]], &device);
    let cases = [
        (
            "sliced and transposed",
            matrix().slice([1..3, 1..4]).transpose(),
        ),
        ("flipped", matrix().flip([0])),
        ("flipped columns", matrix().flip([1])),
        ("expanded", column.expand([3, 4])),
        (
            "swapped and narrowed",
            matrix().swap_dims(0, 1).narrow(0, 1, 2),
        ),
    ];
    for (name, t) in cases {
        // Whatever layout burn chose (a view or a copy), the export is that memory with those
        // strides, and the values read back are burn's.
        let expected: Vec<f32> = t.to_data().to_vec().unwrap();
        let p = float_primitive(&t);
        let (address, burn_strides) = (address(&p), strides(&p));
        let view = Strided::<f32>::from_dlpack(BurnTensor::from_primitive(p).unwrap()).unwrap();
        assert_eq!(view.data.as_ptr() as usize, address, "{name}: zero-copy");
        assert_eq!(view.strides, burn_strides, "{name}");
        assert_eq!(view.shape, t.shape().dims::<2>(), "{name}");
        assert_eq!(view.data.to_vec().unwrap(), expected, "{name}");
    }
}

#[test]
fn negative_strides_are_lent_with_their_offset() {
    // burn-ndarray's storage may hold any ndarray layout: rows reversed, strides (-3, 1).
    let array = burn_ndarray::SharedArray::<f32>::from_shape_vec(
        vec![2, 3],
        vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    )
    .unwrap();
    let base = array.as_ptr() as usize;
    let reversed = array.slice_move(ndarray::s![..;-1, ..]).into_dyn();
    let p = NdArrayTensor::from(reversed);
    assert_eq!(strides(&p), [-3, 1]);
    let managed = BurnTensor::from_primitive(p)
        .unwrap()
        .into_dlpack()
        .unwrap();
    assert_eq!(
        managed.dl_tensor().data as usize + managed.dl_tensor().byte_offset as usize,
        base + 3 * 4,
        "zero-copy: element (0, 0) is row 1 of the storage"
    );
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.strides, [-3, 1]);
    assert_eq!(view.data.to_vec().unwrap(), [3.0, 4.0, 5.0, 0.0, 1.0, 2.0]);
    // And back into burn: a copy, in row-major order.
    let view_again = NdArrayTensor::from(
        burn_ndarray::SharedArray::<f32>::from_shape_vec(
            vec![2, 3],
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        )
        .unwrap()
        .slice_move(ndarray::s![..;-1, ..;-1])
        .into_dyn(),
    );
    let back: Tensor<B, 2> =
        tensor_from_dlpack(BurnTensor::from_primitive(view_again).unwrap()).unwrap();
    assert_eq!(
        back.into_data().to_vec::<f32>().unwrap(),
        [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    );
}

/// Whether a burn CPU tensor's storage has no other holder (no clone, no export).
fn is_unique(t: &NdArrayTensor) -> bool {
    macro_rules! unique {
        ($($variant:ident),*) => {
            match t {
                $(NdArrayTensor::$variant(s) => s.is_unique(),)*
            }
        };
    }
    unique!(F64, F32, I64, I32, I16, I8, U64, U32, U16, U8, Bool)
}

/// One dtype's round trip: a burn tensor of `values` lent to our consumer (same address) and
/// back into burn (same address again), values asserted, and the storage unique again once
/// every export is gone (each export's deleter ran).
fn round_trip<T, K>(values: Vec<T>, dtype: DataType)
where
    T: Element + burn_tensor::Element + PartialEq + core::fmt::Debug,
    K: burn_tensor::BasicOps<B>,
    K::Primitive: dlpack_runtime::burn::NdArrayPrimitive,
{
    let n = values.len();
    let primitive = NdArrayTensor::from_data(TensorData::new(values.clone(), [2, n / 2]));
    let address = address(&primitive);
    let t = Tensor::<B, 2, K>::from_primitive(
        <K::Primitive as dlpack_runtime::burn::NdArrayPrimitive>::from_ndarray(primitive),
    );
    // To our own consumer.
    let managed = BurnTensor::new(t.clone()).unwrap().into_dlpack().unwrap();
    assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), dtype);
    let view = ImportedData::<T>::from_managed(managed).unwrap();
    assert_eq!(view.as_ptr() as usize, address, "{dtype}: zero-copy export");
    assert_eq!(view.to_vec().unwrap(), values, "{dtype}");
    drop(view);
    // And back into burn: the same memory, through two exports.
    let back: Tensor<B, 2, K> = tensor_from_dlpack(BurnTensor::new(t.clone()).unwrap()).unwrap();
    assert_eq!(back.shape().dims::<2>(), [2, n / 2]);
    assert_eq!(back.dtype(), t.dtype(), "{dtype}");
    assert_eq!(
        primitive_address(&back),
        address,
        "{dtype}: zero-copy import"
    );
    assert_eq!(back.to_data().to_vec::<T>().unwrap(), values, "{dtype}");
    let primitive =
        dlpack_runtime::burn::NdArrayPrimitive::into_ndarray(t.into_primitive()).unwrap();
    assert!(
        !is_unique(&primitive),
        "{dtype}: burn's tensor made of the export holds it"
    );
    drop(back);
    assert!(is_unique(&primitive), "{dtype}: every export released");
}

#[test]
fn every_burn_cpu_dtype_goes_both_ways_zero_copy() {
    round_trip::<f32, Float>(vec![0.0, 1.5, -2.25, 3.0], DataType::F32);
    round_trip::<f64, Float>(vec![0.0, 1.5, -2.25, 1e300], DataType::F64);
    round_trip::<i64, Int>(vec![i64::MIN, -1, 0, i64::MAX], DataType::I64);
    round_trip::<i32, Int>(vec![i32::MIN, -1, 0, i32::MAX], DataType::I32);
    round_trip::<i16, Int>(vec![i16::MIN, -1, 0, i16::MAX], DataType::I16);
    round_trip::<i8, Int>(vec![i8::MIN, -1, 0, i8::MAX], DataType::I8);
    round_trip::<u64, Int>(vec![0, 1, 2, u64::MAX], DataType::U64);
    round_trip::<u32, Int>(vec![0, 1, 2, u32::MAX], DataType::U32);
    round_trip::<u16, Int>(vec![0, 1, 2, u16::MAX], DataType::U16);
    round_trip::<u8, Int>(vec![0, 1, 2, u8::MAX], DataType::U8);
    round_trip::<bool, Bool>(vec![true, false, false, true], DataType::BOOL);
}

/// The address of element 0 of a burn tensor's storage, any kind.
fn primitive_address<const D: usize, K>(t: &Tensor<B, D, K>) -> usize
where
    K: burn_tensor::BasicOps<B>,
    K::Primitive: dlpack_runtime::burn::NdArrayPrimitive,
{
    let p =
        dlpack_runtime::burn::NdArrayPrimitive::into_ndarray(t.clone().into_primitive()).unwrap();
    address(&p)
}

#[test]
fn a_contiguous_import_keeps_the_producers_memory_until_burn_lets_go() {
    let counter = Counter::new();
    let producer = tensor(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &counter);
    let address = producer.data.as_ptr() as usize;
    let t: Tensor<B, 2> = tensor_from_dlpack(producer).unwrap();
    assert_eq!(
        float_address(&t),
        address,
        "zero-copy: the producer's memory"
    );
    assert_eq!(counter.get(), 0, "burn holds the producer's memory");
    // burn reads it in place and writes results to storage of its own.
    let doubled = t.clone() * 2.0;
    assert_ne!(float_address(&doubled), address);
    assert_eq!(
        doubled.to_data().to_vec::<f32>().unwrap(),
        [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    );
    let clone = t.clone();
    drop(t);
    assert_eq!(counter.get(), 0, "a clone still holds it");
    assert_eq!(
        clone.to_data().to_vec::<f32>().unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    drop(clone);
    assert_eq!(
        counter.get(),
        1,
        "the deleter ran once, with the last tensor"
    );
    drop(doubled);
    assert_eq!(counter.get(), 1);
}

#[test]
fn strided_imports_are_copied_in_row_major_order() {
    let counter = Counter::new();
    // A 2x3 int64 tensor stored reversed: strides (-3, -1) from the last element.
    let mut producer = tensor(vec![0i64, 1, 2, 3, 4, 5], &[2, 3], &counter);
    producer.strides = Some(vec![-3, -1]);
    producer.offset = 5 * 8;
    let t: Tensor<B, 2, Int> = tensor_from_dlpack(producer).unwrap();
    assert_eq!(
        counter.get(),
        1,
        "the producer's deleter ran after the copy"
    );
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(
        t.to_data().to_vec::<i64>().unwrap(),
        [5, 4, 3, 2, 1, 0],
        "row-major"
    );
    // A transposed burn view back into burn: the same values, now a copy.
    let v = matrix().transpose();
    let back: Tensor<B, 2> = tensor_from_dlpack(BurnTensor::new(v.clone()).unwrap()).unwrap();
    assert_eq!(back.shape().dims::<2>(), [4, 3]);
    assert_eq!(back.into_data(), v.into_data());
}

#[test]
fn imports_keep_their_dtype_whatever_the_backends_default() {
    let counter = Counter::new();
    let t: Tensor<B, 1> = tensor_from_dlpack(tensor(vec![0.5f64, 1e300], &[2], &counter)).unwrap();
    assert_eq!(t.dtype(), DType::F64, "NdArray<f32> holds a float64 tensor");
    assert_eq!(t.to_data().to_vec::<f64>().unwrap(), [0.5, 1e300]);
    let u: Tensor<B, 1, Int> =
        tensor_from_dlpack(tensor(vec![7u16, 65535], &[2], &counter)).unwrap();
    assert_eq!(u.dtype(), DType::U16);
    assert_eq!(u.to_data().to_vec::<u16>().unwrap(), [7, 65535]);
    drop((t, u));
    assert_eq!(counter.get(), 2);
}

#[test]
fn refusals_name_what_was_expected_after_the_deleter_ran() {
    let counter = Counter::new();
    let err =
        tensor_from_dlpack::<B, 1, Float, _>(tensor(vec![1i32, 2], &[2], &counter)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a DLPack int32 tensor cannot become a burn-ndarray Float tensor, expected float32 or float64"
    );
    assert_eq!(counter.get(), 1);
    let err = tensor_from_dlpack::<B, 2, Float, _>(tensor(vec![1.0f32, 2.0], &[2], &counter))
        .unwrap_err();
    assert!(
        matches!(
            err,
            BurnError::Rank {
                found: 1,
                expected: 2
            }
        ),
        "{err}"
    );
    assert_eq!(counter.get(), 2);
    // burn has no rank-0 tensors: a scalar is refused, not a panic in burn.
    let err =
        tensor_from_dlpack::<B, 0, Float, _>(tensor(vec![1.5f32], &[], &counter)).unwrap_err();
    assert!(matches!(err, BurnError::RankZero), "{err}");
    assert!(err.to_string().starts_with("burn has no rank-0 tensors"));
    assert_eq!(counter.get(), 3);
    let half = vec![f16::from_f32(1.0); 2];
    let err = tensor_from_dlpack::<B, 1, Float, _>(tensor(half, &[2], &counter)).unwrap_err();
    assert!(
        matches!(err, BurnError::Kind { found, kind: "Float", .. } if found == DataType::F16),
        "burn-ndarray has no float16 storage: {err}"
    );
    assert_eq!(counter.get(), 4);
    let complex = vec![num_complex::Complex::<f32>::new(1.0, 2.0)];
    let err = tensor_from_dlpack::<B, 1, Float, _>(tensor(complex, &[1], &counter)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "DLPack dtype complex64 has no burn dtype, expected float64, float32, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8 or bool"
    );
    assert_eq!(counter.get(), 5);
    let err =
        tensor_from_dlpack::<B, 1, Bool, _>(tensor(vec![1u8, 0], &[2], &counter)).unwrap_err();
    assert!(matches!(err, BurnError::Kind { kind: "Bool", .. }), "{err}");
    assert_eq!(counter.get(), 6);
}

#[test]
fn host_data_carries_every_dtype_burn_has_float16_and_bfloat16_included() {
    let counter = Counter::new();
    let halves = vec![f16::from_f32(0.5), f16::from_f32(-2.0)];
    let producer = tensor(halves.clone(), &[2], &counter);
    let address = producer.data.as_ptr() as usize;
    let data = tensor_data_from_managed(producer.into_dlpack().unwrap()).unwrap();
    assert_eq!(data.dtype, DType::F16);
    assert_eq!(
        data.as_bytes().as_ptr() as usize,
        address,
        "zero-copy host data"
    );
    assert_eq!(data.to_vec::<f16>().unwrap(), halves);
    // And out again: burn's host data lent to our consumer, the same bytes.
    let lent = BurnData::new(data).unwrap();
    let view = ImportedData::<half::f16>::from_managed(lent.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.as_ptr() as usize, address);
    assert_eq!(view.to_vec().unwrap(), halves);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(counter.get(), 1, "the deleter ran once");

    let brains = vec![half::bf16::from_f32(1.0), half::bf16::from_f32(3.0)];
    let lent = BurnData::new(TensorData::new(brains.clone(), [2, 1])).unwrap();
    let managed = lent.into_dlpack().unwrap();
    assert_eq!(
        DataType::from_raw(managed.dl_tensor().dtype),
        DataType::BF16
    );
    assert_eq!(
        tensor_data_from_managed(managed)
            .unwrap()
            .to_vec::<half::bf16>()
            .unwrap(),
        brains
    );
    // A tensor's host data (`into_data`), of the CPU backend here.
    let t = Tensor::<B, 1, Int>::arange(0..4, &Default::default());
    let view = Strided::<i64>::from_dlpack(BurnData::from_tensor(t).unwrap()).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), [0, 1, 2, 3]);
    assert_eq!(view.strides, [1]);
}

#[test]
fn an_import_lent_on_is_the_same_memory_in_every_hand() {
    // A producer's memory through burn to a second consumer: one address, one deleter call.
    let counter = Counter::new();
    let producer = tensor(vec![1u32, 2, 3, 4], &[4], &counter);
    let address = producer.data.as_ptr() as usize;
    let t: Tensor<B, 1, Int> = tensor_from_managed(producer.into_dlpack().unwrap()).unwrap();
    assert_eq!(primitive_address(&t), address);
    let view =
        ImportedData::<u32>::from_managed(BurnTensor::new(t).unwrap().into_dlpack().unwrap())
            .unwrap();
    assert_eq!(view.as_ptr() as usize, address);
    assert_eq!(view.to_vec().unwrap(), [1, 2, 3, 4]);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[cfg(feature = "python")]
mod python {
    use super::*;
    use dlpack_runtime::burn::tensor_from_py;
    use dlpack_runtime::python::export_once;
    use dlpack_tests::py::eval as run;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    fn locals(py: Python<'_>) -> Bound<'_, PyDict> {
        dlpack_tests::py::with_torch(py)
    }

    /// burn tensors of every CPU dtype, in several layouts, read by NumPy and PyTorch at burn's
    /// own address, with burn's values.
    #[test]
    fn numpy_and_torch_read_burn_tensors_in_place() {
        Python::attach(|py| {
            let l = locals(py);
            let device = Default::default();
            let floats = matrix();
            let float_case =
                |t: Tensor<B, 2>| (t.to_data().as_bytes().to_vec(), float_primitive(&t));
            let mut cases: Vec<(&str, (Vec<u8>, NdArrayTensor))> = vec![
                ("float32", float_case(floats.clone())),
                ("float32 transposed", float_case(floats.clone().transpose())),
                (
                    "float32 sliced",
                    float_case(floats.clone().slice([1..3, 1..3])),
                ),
                (
                    "float64",
                    float_case(Tensor::<B, 2>::from_data(
                        TensorData::new(vec![0.5f64, -1.0, 2.0, 1e300], [2, 2]),
                        (&device, DType::F64),
                    )),
                ),
            ];
            for (name, values) in [
                ("int64", TensorData::new(vec![-5i64, 0, 7, 9], [2, 2])),
                ("int32", TensorData::new(vec![-5i32, 0, 7, 9], [2, 2])),
                ("int16", TensorData::new(vec![-5i16, 0, 7, 9], [2, 2])),
                ("int8", TensorData::new(vec![-5i8, 0, 7, 9], [2, 2])),
                ("uint8", TensorData::new(vec![5u8, 0, 7, 255], [2, 2])),
                ("uint16", TensorData::new(vec![5u16, 0, 7, 65535], [2, 2])),
                (
                    "uint32",
                    TensorData::new(vec![5u32, 0, 7, u32::MAX], [2, 2]),
                ),
                (
                    "uint64",
                    TensorData::new(vec![5u64, 0, 7, u64::MAX], [2, 2]),
                ),
                (
                    "bool",
                    TensorData::new(vec![true, false, true, true], [2, 2]),
                ),
            ] {
                cases.push((
                    name,
                    (values.as_bytes().to_vec(), NdArrayTensor::from_data(values)),
                ));
            }
            for (name, (expected, p)) in cases {
                let address = address(&p);
                l.set_item(
                    "t",
                    export_once(py, BurnTensor::from_primitive(p.clone()).unwrap()).unwrap(),
                )
                .unwrap();
                let (np_address, np_bytes, writeable): (usize, Vec<u8>, bool) = run(
                    py,
                    "a = np.from_dlpack(t)\nresult = (a.__array_interface__['data'][0], list(np.ascontiguousarray(a).tobytes()), a.flags.writeable)",
                    &l,
                )
                .extract()
                .unwrap();
                assert_eq!(np_address, address, "{name}: NumPy reads burn's storage");
                assert_eq!(np_bytes, expected, "{name}: NumPy's values");
                assert!(!writeable, "{name}: read-only");
                l.set_item(
                    "t",
                    export_once(py, BurnTensor::from_primitive(p).unwrap()).unwrap(),
                )
                .unwrap();
                let (torch_address, torch_bytes): (usize, Vec<u8>) = run(
                    py,
                    "x = torch.from_dlpack(t)\nresult = (x.data_ptr(), x.contiguous().flatten().view(torch.uint8).tolist())",
                    &l,
                )
                .extract()
                .unwrap();
                assert_eq!(torch_address, address, "{name}: torch reads burn's storage");
                assert_eq!(torch_bytes, expected, "{name}: torch's values");
            }
        });
    }

    /// NumPy arrays and torch tensors of every dtype burn's CPU backend has become burn tensors
    /// at their own address (C-contiguous), or copies (strided), with their values.
    #[test]
    fn numpy_and_torch_arrays_become_burn_tensors() {
        Python::attach(|py| {
            let l = locals(py);
            let floats = [
                "np.arange(12.0, dtype=np.float32).reshape(3, 4)",
                "np.arange(12.0, dtype=np.float64).reshape(3, 4)",
                "torch.arange(12.0, dtype=torch.float32).reshape(3, 4)",
                "torch.arange(12.0, dtype=torch.float64).reshape(3, 4)",
            ];
            for code in floats {
                let arr = run(py, &format!("result = {code}"), &l);
                l.set_item("arr", &arr).unwrap();
                let (address, expected): (usize, Vec<f64>) = run(
                    py,
                    "a = np.asarray(arr)\nresult = (a.__array_interface__['data'][0], a.astype(np.float64).ravel().tolist())",
                    &l,
                )
                .extract()
                .unwrap();
                let t: Tensor<B, 2> = tensor_from_py(&arr).unwrap();
                assert_eq!(float_address(&t), address, "{code}: zero-copy");
                let values: Vec<f64> = t.to_data().convert::<f64>().to_vec().unwrap();
                assert_eq!(values, expected, "{code}");
                // And back: burn's result to NumPy, zero-copy.
                let doubled = t * 2.0;
                let address = float_address(&doubled);
                l.set_item(
                    "d",
                    export_once(py, BurnTensor::new(doubled).unwrap()).unwrap(),
                )
                .unwrap();
                let (back_address, back): (usize, Vec<f64>) = run(
                    py,
                    "b = np.from_dlpack(d)\nresult = (b.__array_interface__['data'][0], b.astype(np.float64).ravel().tolist())",
                    &l,
                )
                .extract()
                .unwrap();
                assert_eq!(back_address, address);
                let want: Vec<f64> = expected.iter().map(|x| x * 2.0).collect();
                assert_eq!(back, want, "{code}, doubled by burn");
            }
            let ints = [
                ("np.array([[-3, 0], [5, 7]], dtype=np.int64)", DType::I64),
                ("np.array([[-3, 0], [5, 7]], dtype=np.int32)", DType::I32),
                ("np.array([[-3, 0], [5, 7]], dtype=np.int16)", DType::I16),
                ("np.array([[-3, 0], [5, 7]], dtype=np.int8)", DType::I8),
                (
                    "np.array([[3, 0], [5, 65535]], dtype=np.uint16)",
                    DType::U16,
                ),
                ("np.array([[3, 0], [5, 7]], dtype=np.uint32)", DType::U32),
                ("np.array([[3, 0], [5, 7]], dtype=np.uint64)", DType::U64),
                (
                    "torch.tensor([[3, 0], [5, 255]], dtype=torch.uint8)",
                    DType::U8,
                ),
                (
                    "torch.tensor([[-3, 0], [5, 7]], dtype=torch.int64)",
                    DType::I64,
                ),
            ];
            for (code, dtype) in ints {
                let arr = run(py, &format!("result = {code}"), &l);
                l.set_item("arr", &arr).unwrap();
                let (address, expected): (usize, Vec<i64>) = run(
                    py,
                    "a = np.asarray(arr)\nresult = (a.__array_interface__['data'][0], a.astype(np.int64).ravel().tolist())",
                    &l,
                )
                .extract()
                .unwrap();
                let t: Tensor<B, 2, Int> = tensor_from_py(&arr).unwrap();
                assert_eq!(t.dtype(), dtype, "{code}");
                assert_eq!(primitive_address(&t), address, "{code}: zero-copy");
                let values: Vec<i64> = t.into_data().convert::<i64>().to_vec().unwrap();
                assert_eq!(values, expected, "{code}");
            }
            for code in [
                "np.array([[True, False], [False, True]])",
                "torch.tensor([[True, False], [False, True]])",
            ] {
                let arr = run(py, &format!("result = {code}"), &l);
                l.set_item("arr", &arr).unwrap();
                let address: usize = run(
                    py,
                    "result = np.asarray(arr).__array_interface__['data'][0]",
                    &l,
                )
                .extract()
                .unwrap();
                let t: Tensor<B, 2, Bool> = tensor_from_py(&arr).unwrap();
                assert_eq!(primitive_address(&t), address, "{code}: zero-copy");
                assert_eq!(
                    t.into_data().to_vec::<bool>().unwrap(),
                    [true, false, false, true]
                );
            }
            // Strided: copies, in row-major order.
            for code in [
                "np.arange(24.0, dtype=np.float32).reshape(6, 4)[::2, ::-1]",
                "torch.arange(24.0, dtype=torch.float32).reshape(6, 4)[::2].t()",
            ] {
                let arr = run(py, &format!("result = {code}"), &l);
                l.set_item("arr", &arr).unwrap();
                let expected: Vec<f32> = run(py, "result = np.asarray(arr).ravel().tolist()", &l)
                    .extract()
                    .unwrap();
                let t: Tensor<B, 2> = tensor_from_py(&arr).unwrap();
                assert_eq!(t.into_data().to_vec::<f32>().unwrap(), expected, "{code}");
            }
        });
    }

    /// Refusals reach Python as `BufferError`s naming what was expected, and release the
    /// array.
    #[test]
    fn refusals_are_buffer_errors() {
        Python::attach(|py| {
            let l = locals(py);
            for (code, message) in [
                (
                    "np.zeros(2, dtype=np.complex64)",
                    "DLPack dtype complex64 has no burn dtype",
                ),
                (
                    "np.zeros(2, dtype=np.int32)",
                    "a DLPack int32 tensor cannot become a burn-ndarray Float tensor",
                ),
                (
                    "np.zeros((2, 2), dtype=np.float32)",
                    "a DLPack tensor of rank 2 cannot become a burn tensor of rank 1",
                ),
            ] {
                let arr = run(py, &format!("result = {code}"), &l);
                let err = tensor_from_py::<B, 1, Float>(&arr).unwrap_err();
                assert!(
                    err.is_instance_of::<pyo3::exceptions::PyBufferError>(py),
                    "{code}: {err}"
                );
                assert!(err.to_string().contains(message), "{code}: {err}");
            }
        });
    }

    /// The Python object stays alive while burn holds its memory, and is released once: the
    /// capsule's deleter drops it when the last burn tensor goes.
    #[test]
    fn a_numpy_array_lives_as_long_as_the_burn_tensor() {
        Python::attach(|py| {
            let l = locals(py);
            run(
                py,
                "import weakref, sys\nclass A(np.ndarray): pass\narr = np.arange(4.0, dtype=np.float32).view(A)\nref = weakref.ref(arr)\nresult = None",
                &l,
            );
            let arr = l.get_item("arr").unwrap().unwrap();
            let t: Tensor<B, 1> = tensor_from_py(&arr).unwrap();
            drop(arr);
            l.del_item("arr").unwrap();
            dlpack_tests::py::collect(py);
            let alive: bool = run(py, "result = ref() is not None", &l).extract().unwrap();
            assert!(alive, "burn's tensor holds the array");
            assert_eq!(
                t.clone().into_data().to_vec::<f32>().unwrap(),
                [0.0, 1.0, 2.0, 3.0]
            );
            drop(t);
            dlpack_tests::py::collect(py);
            let alive: bool = run(py, "result = ref() is not None", &l).extract().unwrap();
            assert!(!alive, "released with the last burn tensor");
        });
    }
}
