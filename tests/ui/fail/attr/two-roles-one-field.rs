use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data, shape)]
    values: Vec<f32>,
    shape: [usize; 2],
}

fn main() {}
