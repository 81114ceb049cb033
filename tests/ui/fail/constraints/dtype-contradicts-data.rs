// A dtype constraint that no tensor could meet beside the data field's own element type.
use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(dtype = f64)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
