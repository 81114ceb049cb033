use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack()]
struct Tensor {
    #[dlpack()]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
