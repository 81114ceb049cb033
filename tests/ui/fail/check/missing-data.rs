use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
