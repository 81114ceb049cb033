// `#[dlpack(crate = "...")]`: the generated code reaches the runtime through the given path.
extern crate dlpack_runtime as dl;

use dl::{DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage, ImportedData};

#[derive(DlpackExport)]
#[dlpack(crate = "dl")]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

#[derive(DlpackImport)]
#[dlpack(crate = "dl")]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

#[derive(DlpackStorage)]
#[dlpack(crate = "dl")]
enum Storage {
    F64(Vec<f64>),
}

#[derive(DlpackExport)]
#[dlpack(crate = "dl")]
struct Column {
    #[dlpack(data)]
    storage: std::sync::Arc<Storage>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

#[derive(DlpackImportStorage)]
#[dlpack(crate = "dl")]
struct Floats(ImportedData<f64>);

#[derive(DlpackImport)]
#[dlpack(crate = "dl", dtype = f64, shape = [2])]
struct ColumnView {
    #[dlpack(data)]
    data: Floats,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m = Matrix {
        values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        shape: [2, 3],
    };
    let view = View::from_managed(m.into_dlpack()?)?;
    assert_eq!(view.shape, [2, 3]);
    assert_eq!(view.data.get(&[1, 2])?, 6.0);

    let c = Column {
        storage: std::sync::Arc::new(Storage::F64(vec![0.5, 1.5])),
        shape: [2],
    };
    let view = ColumnView::from_dlpack(c)?;
    assert_eq!(view.shape, [2]);
    assert_eq!(view.data.0.as_slice()?, [0.5, 1.5]);
    Ok(())
}
