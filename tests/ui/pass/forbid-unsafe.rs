// The generated code holds no `unsafe`: it compiles in a crate that forbids it.
#![forbid(unsafe_code)]

use std::sync::Arc;

use dlpack_runtime::{
    DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage, ImportedData,
};

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

#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    I32(Arc<[i32]>),
}

#[derive(DlpackExport)]
#[dlpack(readonly)]
struct Shared {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: [usize; 1],
    #[dlpack(offset)]
    start: usize,
}

#[derive(DlpackImportStorage)]
enum Imported {
    F32(ImportedData<f32>),
    I32(ImportedData<i32>),
}

#[derive(DlpackImport)]
#[dlpack(dtype = i32, ndim = 1, device = "cpu")]
struct Ints {
    #[dlpack(data)]
    data: Imported,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    read_only: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m = Matrix {
        values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0].into(),
        shape: vec![2, 3],
    };
    let view = View::from_managed(m.into_dlpack()?)?;
    assert_eq!(view.shape, [2, 3]);
    assert_eq!(view.data.get(&[1, 2])?, 6.0);
    assert_eq!(view.data.as_slice()?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);

    let s = Shared {
        storage: Arc::new(Storage::I32(Arc::from(vec![1, 2, 3]))),
        shape: [2],
        start: 1,
    };
    let ints = Ints::from_dlpack(s)?;
    assert!(ints.read_only);
    assert_eq!(ints.shape, [2]);
    let Imported::I32(data) = ints.data else {
        return Err("int32 data".into());
    };
    assert_eq!(data.as_slice()?, [2, 3]);
    Ok(())
}
