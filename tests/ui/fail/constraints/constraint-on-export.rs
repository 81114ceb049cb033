// Consumer constraints on a type that only derives `DlpackExport`: nothing would check them.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(dtype = f32, writable)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
