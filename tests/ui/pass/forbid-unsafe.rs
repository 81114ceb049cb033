// The generated code holds no `unsafe`: it compiles in a crate that forbids it.
#![forbid(unsafe_code)]

use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    values: Box<[f32]>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m = Matrix {
        values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0].into(),
        shape: vec![2, 3],
    };
    let view = View::from_managed(m.to_dlpack()?)?;
    assert_eq!(view.shape, [2, 3]);
    assert_eq!(view.data.get(&[1, 2])?, 6.0);
    assert_eq!(view.data.as_slice()?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    Ok(())
}
