use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    offset: u64,
}

fn main() {}
