//! `ndarray` views of imported tensors and export of owned arrays (feature `ndarray`).

use dlpack_runtime::{
    DataType, DlpackExport, DlpackImport, ExportError, ExportRequest, ImportedData, LayoutError,
    ManagedTensor, export_with,
};
use dlpack_tests::{Counter, Foreign, READ_ONLY, bytes_of};
use ndarray::{Array, ArrayD, Ix2, IxDyn, array, s};

#[derive(DlpackImport)]
struct View<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

fn import<T: dlpack_runtime::Element>(foreign: Foreign, counter: &Counter) -> View<T> {
    // SAFETY: `versioned` returns a valid, owned managed tensor.
    let managed = unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(counter)) }.unwrap();
    View::from_managed(managed).unwrap()
}

#[test]
fn negative_strides_view() {
    // C02: arange(12).reshape(3, 4)[:, ::-1].
    let values: Vec<f64> = (0..12).map(f64::from).collect();
    let counter = Counter::new();
    let mut view = import::<f64>(
        Foreign::new(&bytes_of(&values), DataType::F64, &[3, 4])
            .strides(&[4, -1])
            .data_offset(3 * 8),
        &counter,
    );
    let expected = Array::from_shape_vec((3, 4), values)
        .unwrap()
        .slice_move(s![.., ..;-1]);
    let a = view
        .data
        .as_array()
        .unwrap()
        .into_dimensionality::<Ix2>()
        .unwrap();
    assert_eq!(a, expected);
    assert_eq!(a.strides(), [4, -1]);
    assert_eq!(a.as_ptr(), view.data.as_ptr(), "zero-copy");
    let mut m = view.data.as_array_mut().unwrap();
    m[[0, 0]] = -1.0;
    assert_eq!(view.data.get(&[0, 0]).unwrap(), -1.0);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn broadcast_views_read_and_refuse_mutation() {
    let counter = Counter::new();
    let mut view = import::<i64>(
        Foreign::new(&bytes_of(&[9i64]), DataType::I64, &[4, 3]).strides(&[0, 0]),
        &counter,
    );
    assert_eq!(
        view.data.as_array().unwrap(),
        ArrayD::from_elem(IxDyn(&[4, 3]), 9)
    );
    let err = view.data.as_array_mut().unwrap_err();
    assert_eq!(
        err,
        LayoutError::Overlapping {
            shape: vec![4, 3],
            strides: vec![0, 0]
        }
    );
    // Overlap without a zero stride: rows of 3 elements advancing by 2.
    let mut view = import::<i64>(
        Foreign::new(&bytes_of(&[0i64, 1, 2, 3, 4, 5, 6]), DataType::I64, &[3, 3]).strides(&[2, 1]),
        &counter,
    );
    assert_eq!(
        view.data
            .as_array()
            .unwrap()
            .into_dimensionality::<Ix2>()
            .unwrap(),
        array![[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    );
    assert!(matches!(
        view.data.as_array_mut(),
        Err(LayoutError::Overlapping { .. })
    ));
}

#[test]
fn read_only_zero_size_and_bool_checks() {
    let counter = Counter::new();
    let mut view = import::<u8>(
        Foreign::new(&[1, 2, 3], DataType::U8, &[3]).flags(READ_ONLY),
        &counter,
    );
    assert_eq!(view.data.as_array().unwrap().as_slice().unwrap(), [1, 2, 3]);
    assert_eq!(view.data.as_array_mut().unwrap_err(), LayoutError::ReadOnly);

    let view = import::<f32>(
        Foreign::new(&[], DataType::F32, &[2, 0, 3]).null_data(),
        &counter,
    );
    assert_eq!(view.data.as_array().unwrap().shape(), [2, 0, 3]);

    let view = import::<bool>(Foreign::new(&[1, 0, 5], DataType::BOOL, &[3]), &counter);
    assert_eq!(
        view.data.as_array().unwrap_err(),
        LayoutError::InvalidValue {
            index: 2,
            bytes: vec![5],
            dtype: DataType::BOOL
        }
    );
    let view = import::<bool>(Foreign::new(&[1, 0, 1], DataType::BOOL, &[3]), &counter);
    assert_eq!(
        view.data.as_array().unwrap().as_slice().unwrap(),
        [true, false, true]
    );
}

#[test]
fn fortran_sliced_view() {
    // C03 (c): Fortran-order (3, 4) sliced [::2, :], strides (2, 3).
    let values: Vec<i64> = (0..12).collect();
    let counter = Counter::new();
    let fortran: Vec<i64> = (0..4)
        .flat_map(|j| (0..3).map(move |i| i * 4 + j))
        .collect();
    let view = import::<i64>(
        Foreign::new(&bytes_of(&fortran), DataType::I64, &[2, 4]).strides(&[2, 3]),
        &counter,
    );
    let a = view
        .data
        .as_array()
        .unwrap()
        .into_dimensionality::<Ix2>()
        .unwrap();
    assert_eq!(a, array![[0, 1, 2, 3], [8, 9, 10, 11]]);
    assert_eq!(values.len(), 12);
}

#[test]
fn owned_arrays_export_zero_copy_with_their_strides() {
    let a = Array::from_shape_vec((3, 4), (0..12).map(|v| v as f32).collect()).unwrap();
    let flipped = a.slice_move(s![..;-1, 1..;2]);
    let expected = flipped.clone();
    let first = flipped.as_ptr();
    let managed = flipped.into_dlpack().unwrap();
    assert!(!managed.is_read_only());
    let view = View::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.shape, [3, 2]);
    assert_eq!(view.strides, [-4, 2]);
    assert_eq!(view.data.as_ptr(), first, "zero-copy");
    assert_eq!(
        view.data
            .as_array()
            .unwrap()
            .into_dimensionality::<Ix2>()
            .unwrap(),
        expected
    );

    let empty = Array::<f64, _>::zeros((0, 5));
    let view = View::<f64>::from_managed(empty.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.shape, [0, 5]);
    let scalar = ndarray::arr0(2.5f64);
    let view = View::<f64>::from_managed(scalar.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.data.get(&[]).unwrap(), 2.5);
}

/// A tensor type whose data is an `ndarray` array, beside a shape field: the array's own
/// layout is what is exported.
#[derive(DlpackExport)]
struct ArrayTensor {
    #[dlpack(data)]
    data: Array<i64, Ix2>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

/// An array wrapped as it is: what the derive's error for an array data field without a shape
/// field suggests.
#[derive(DlpackExport)]
#[dlpack(transparent)]
struct WrappedArray(Array<i64, Ix2>);

/// The same with strides and an offset declared too.
#[derive(DlpackExport)]
struct StridedArrayTensor {
    #[dlpack(data)]
    data: Array<i64, Ix2>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(strides)]
    strides: Option<Vec<isize>>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
}

/// The shape, strides and values (in logical, row-major order, read through the strides) of an
/// export.
type Exported = (Vec<usize>, Vec<isize>, Vec<i64>);

/// [`Exported`] of `managed`.
fn logical_values(managed: ManagedTensor) -> Exported {
    let view = View::<i64>::from_managed(managed).unwrap();
    let values = view.data.to_vec().unwrap();
    (view.shape, view.strides, values)
}

/// Both ways a derived type exports: by value (`export_parts_mut`) and shared (`export_parts`,
/// as `__dlpack__` of a frozen pyclass does).
fn both_exports<T: DlpackExport + Send + Sync + 'static>(
    tensor: T,
) -> [Result<Exported, ExportError>; 2] {
    let shared = std::sync::Arc::new(tensor);
    let by_reference = export_with(
        std::sync::Arc::clone(&shared),
        |t| t.export_parts(),
        // Versioned, so that the read-only export shares the memory (a legacy one would be a
        // compact copy).
        &ExportRequest::versioned(),
    )
    .map(logical_values);
    let owned = std::sync::Arc::into_inner(shared).unwrap();
    [owned.into_dlpack().map(logical_values), by_reference]
}

#[test]
fn an_array_data_field_exports_its_own_layout_or_is_refused() {
    use ndarray::ShapeBuilder;
    // Fortran order: memory holds 0..6, the logical order is [0, 2, 4, 1, 3, 5].
    let fortran = || Array::from_shape_vec((2, 3).f(), (0..6).collect()).unwrap();
    assert_eq!(fortran(), array![[0, 2, 4], [1, 3, 5]]);
    for export in both_exports(ArrayTensor {
        data: fortran(),
        shape: [2, 3],
    }) {
        let (shape, strides, values) = export.unwrap();
        assert_eq!(shape, [2, 3]);
        assert_eq!(strides, [1, 2], "the array's own strides, in elements");
        assert_eq!(
            values,
            [0, 2, 4, 1, 3, 5],
            "never the memory order [0, 1, 2, 3, 4, 5]"
        );
    }
    // A 2x3 array declared 3x2: refused, whatever its order.
    for data in [fortran(), fortran().as_standard_layout().into_owned()] {
        for export in both_exports(ArrayTensor {
            data,
            shape: [3, 2],
        }) {
            assert_eq!(
                export.unwrap_err(),
                ExportError::BufferLayout {
                    what: "shape",
                    declared: "[3, 2]".into(),
                    own: "[2, 3]".into(),
                }
            );
        }
    }
    // Declared strides must be the array's; absent (`None`) they are the array's own.
    let strided = |strides: Option<Vec<isize>>, byte_offset| StridedArrayTensor {
        data: fortran(),
        shape: [2, 3],
        strides,
        byte_offset,
    };
    for strides in [None, Some(vec![1, 2])] {
        for export in both_exports(strided(strides, 0)) {
            assert_eq!(export.unwrap().2, [0, 2, 4, 1, 3, 5]);
        }
    }
    for export in both_exports(strided(Some(vec![3, 1]), 0)) {
        assert_eq!(
            export.unwrap_err(),
            ExportError::BufferLayout {
                what: "strides",
                declared: "[3, 1]".into(),
                own: "[1, 2]".into(),
            }
        );
    }
    // A negative stride puts element (0, 0) above the lowest address: the array's own offset
    // is used, and another declared offset is refused.
    let flipped = || {
        Array::from_shape_vec((2, 3), (0..6).collect())
            .unwrap()
            .slice_move(s![.., ..;-1])
    };
    for export in both_exports(ArrayTensor {
        data: flipped(),
        shape: [2, 3],
    }) {
        let (_, strides, values) = export.unwrap();
        assert_eq!(strides, [3, -1]);
        assert_eq!(values, [2, 1, 0, 5, 4, 3]);
    }
    let declared_offset = StridedArrayTensor {
        data: flipped(),
        shape: [2, 3],
        strides: None,
        byte_offset: 8,
    };
    for export in both_exports(declared_offset) {
        assert_eq!(
            export.unwrap_err(),
            ExportError::BufferLayout {
                what: "byte_offset",
                declared: "8".into(),
                own: "16".into(),
            }
        );
    }
}

#[test]
fn a_transparent_wrapper_of_an_array_exports_the_array_as_it_is() {
    use ndarray::ShapeBuilder;
    let fortran = Array::from_shape_vec((2, 3).f(), (0..6).collect()).unwrap();
    for export in both_exports(WrappedArray(fortran)) {
        let (shape, strides, values) = export.unwrap();
        assert_eq!(shape, [2, 3]);
        assert_eq!(strides, [1, 2]);
        assert_eq!(values, [0, 2, 4, 1, 3, 5]);
    }
}
