use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(writable, borrow = "mut")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackImport)]
#[dlpack(borrow = shared)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
