use dlpack_runtime::DlpackImport;

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
