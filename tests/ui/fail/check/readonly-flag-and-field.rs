use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(readonly)]
struct Frozen {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    frozen: bool,
}

fn main() {}
