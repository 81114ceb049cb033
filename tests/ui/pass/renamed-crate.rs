// `#[dlpack(crate = "...")]`: the generated code reaches the runtime through the given path.
extern crate dlpack_runtime as dl;

use dl::{DlpackExport, DlpackImport, ImportedData};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m = Matrix {
        values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        shape: [2, 3],
    };
    let view = View::from_managed(m.to_dlpack()?)?;
    assert_eq!(view.shape, [2, 3]);
    assert_eq!(view.data.get(&[1, 2])?, 6.0);
    Ok(())
}
