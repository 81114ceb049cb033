use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(dims)]
    shape: [usize; 2],
}

fn main() {}
