use dlpack_runtime::{DlpackImportStorage, ImportedData};

#[derive(DlpackImportStorage)]
enum Imported {
    F32(ImportedData<f32>),
    F64(Vec<f64>),
}

fn main() {}
