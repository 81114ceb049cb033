use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(borrow = "shared")]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
