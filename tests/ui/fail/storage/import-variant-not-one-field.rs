// A consumer's storage is told to hold imported buffers, `ImportedData<T>`.
use dlpack_runtime::{DlpackImportStorage, ImportedData};

#[derive(DlpackImportStorage)]
enum Storage {
    F32(ImportedData<f32>),
    Empty,
}

fn main() {}
