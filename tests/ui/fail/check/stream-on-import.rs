use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: u64,
}

fn main() {}
