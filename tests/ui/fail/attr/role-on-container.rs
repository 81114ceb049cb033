use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(data)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
