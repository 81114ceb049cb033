use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[repr(C, packed(2))]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
