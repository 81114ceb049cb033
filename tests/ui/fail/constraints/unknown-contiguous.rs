use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(contiguous = "row-major")]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

fn main() {}
