// A vector element of zero lanes has no dtype: refused when the type is checked, not when the
// program is built.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<[f32; 0]>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
