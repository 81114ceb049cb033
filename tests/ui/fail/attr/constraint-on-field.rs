use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
struct Points {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape = [_, 3])]
    shape: Vec<usize>,
}

fn main() {}
