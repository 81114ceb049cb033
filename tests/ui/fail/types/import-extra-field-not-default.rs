use dlpack_runtime::{DlpackImport, ImportedData};

struct Label;

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    label: Label,
}

fn main() {}
