use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(borrow = "exclusive")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
