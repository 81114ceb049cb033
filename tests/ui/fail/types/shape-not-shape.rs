use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: (usize, usize),
}

fn main() {}
