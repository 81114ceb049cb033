// Consumers that borrow at import (`tests/borrow_at_import.rs` runs them on aliased memory):
// through a plain `ImportedData`, a storage enum, and a generic consumer.
use dlpack_runtime::{DlpackExport, DlpackImport, DlpackImportStorage, Element, ImportedData};

#[derive(DlpackImport)]
#[dlpack(writable, borrow = "exclusive")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackImportStorage)]
enum Numbers {
    F32(ImportedData<f32>),
    F64(ImportedData<f64>),
}

#[derive(DlpackImport)]
#[dlpack(borrow = "shared")]
struct AnyView {
    #[dlpack(data)]
    data: Numbers,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackImport)]
#[dlpack(borrow = "shared")]
struct View<T: Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackExport)]
struct Column {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let column = || Column {
        values: vec![1.0, 2.0, 3.0],
        shape: [3],
    };
    let mut view = ViewMut::from_dlpack(column())?;
    view.data.as_slice_mut()?[0] = 4.0;
    assert_eq!(view.shape, [3]);
    let any = AnyView::from_dlpack(column())?;
    assert!(matches!(any.data, Numbers::F32(_)));
    assert_eq!(any.shape, [3]);
    let view = View::<f32>::from_dlpack(column())?;
    assert_eq!(view.data.to_vec()?, [1.0, 2.0, 3.0]);
    assert_eq!(view.shape, [3]);
    Ok(())
}
