use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Flagged {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    read_only: Option<bool>,
}

fn main() {}
