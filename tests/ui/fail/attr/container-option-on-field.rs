use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
struct View {
    #[dlpack(data, writable)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
