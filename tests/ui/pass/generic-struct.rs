// Generics: type and const parameters, the user's where clause kept, bounds on field types.
use dlpack_runtime::{DlpackExport, DlpackImport, Element, ImportError, ImportedData};

#[derive(DlpackExport)]
struct Tensor<T, const N: usize>
where
    T: Element,
{
    #[dlpack(data)]
    values: Vec<T>,
    #[dlpack(shape)]
    shape: [usize; N],
    #[dlpack(strides)]
    strides: Option<[isize; N]>,
}

#[derive(DlpackImport)]
struct View<T>
where
    T: Element,
{
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// A lifetime, a generic buffer and a where clause on a non-role field.
#[derive(DlpackExport)]
struct Labeled<'a, B, L>
where
    B: dlpack_runtime::AsExportBuffer,
    L: AsRef<str> + ?Sized + 'a,
{
    #[dlpack(data)]
    buffer: B,
    #[dlpack(shape)]
    shape: Vec<usize>,
    label: &'a L,
}

/// No strides field: the import requires C-contiguous data.
#[derive(DlpackImport)]
struct Dense<T: Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A constraint naming the type's parameter: each instance checks its own dtype.
#[derive(DlpackImport)]
#[dlpack(dtype = T, ndim = 2)]
struct Typed<T: Element> {
    #[dlpack(data)]
    data: dlpack_runtime::ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    element: std::marker::PhantomData<T>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A 2x3 matrix stored column-major: element (i, j) at i + 2 * j.
    let column_major = Tensor::<f64, 2> {
        values: vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0],
        shape: [2, 3],
        strides: Some([1, 2]),
    };
    let view = View::<f64>::from_managed(column_major.into_dlpack()?)?;
    assert_eq!(view.shape, [2, 3]);
    assert_eq!(view.strides, [1, 2]);
    assert_eq!(view.data.get(&[1, 2])?, 12.0);
    assert_eq!(view.data.to_vec()?, [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);

    let column_major = Tensor::<f64, 2> {
        values: vec![0.0; 6],
        shape: [2, 3],
        strides: Some([1, 2]),
    };
    assert!(matches!(
        Dense::<f64>::from_dlpack(column_major),
        Err(ImportError::Layout(_))
    ));

    // `None` strides: compact row-major.
    let row_major = Tensor::<i32, 1> {
        values: vec![7, 8, 9],
        shape: [3],
        strides: None,
    };
    let view = View::<i32>::from_dlpack(row_major)?;
    assert_eq!(view.shape, [3]);
    assert_eq!(view.strides, [1]);
    assert_eq!(view.data.as_slice()?, [7, 8, 9]);
    let row_major = Tensor::<i32, 1> {
        values: vec![7, 8, 9],
        shape: [3],
        strides: None,
    };
    let dense = Dense::<i32>::from_dlpack(row_major)?;
    assert_eq!(dense.shape, [3]);
    assert_eq!(dense.data.to_vec()?, [7, 8, 9]);

    // The dtype is the element type's: importing f64 as i32 is refused.
    let wrong = Tensor::<f64, 1> {
        values: vec![1.0],
        shape: [1],
        strides: None,
    };
    assert!(View::<i32>::from_dlpack(wrong).is_err());

    let typed = || Tensor::<f32, 2> {
        values: vec![0.0; 6],
        shape: [2, 3],
        strides: None,
    };
    let view = Typed::<f32>::from_dlpack(typed())?;
    assert_eq!((view.shape, view.strides), (vec![2, 3], vec![3, 1]));
    assert!(view.data.is_validated());
    assert!(matches!(
        Typed::<f64>::from_dlpack(typed()),
        Err(ImportError::Dtype { .. })
    ));

    let labeled = Labeled {
        buffer: vec![1u8, 2],
        shape: vec![2],
        label: "bytes",
    };
    assert_eq!(AsRef::<str>::as_ref(labeled.label), "bytes");
    assert_eq!(labeled.export_parts().shape(), [2]);
    let view = Dense::<u8>::from_dlpack(labeled)?;
    assert_eq!(view.data.as_slice()?, [1, 2]);
    Ok(())
}
