use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Pair {
    #[dlpack(data)]
    left: Vec<f32>,
    #[dlpack(data)]
    right: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

fn main() {}
