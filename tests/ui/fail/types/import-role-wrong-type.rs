// A consumer's role field of the wrong type is reported at the field.
use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    read_only: String,
}

fn main() {}
