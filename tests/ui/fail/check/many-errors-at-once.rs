// Every mistake is reported in one run, not only the first.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(crate = "dlpack_runtime", crate = "dlpack_runtime")]
#[dlpack(strides)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(data)]
    more_values: Vec<f32>,
    #[dlpack(strides, device)]
    strides: Vec<isize>,
    dims: Vec<usize>,
}

fn main() {}
