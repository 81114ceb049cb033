extern crate dlpack_runtime as dl;

use dl::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(crate = dl)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
