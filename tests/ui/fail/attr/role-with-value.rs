use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data = "values")]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
