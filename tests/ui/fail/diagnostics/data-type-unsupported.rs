// A data field whose type is not a buffer: one error at the type, no notes about unstable
// features, and nothing cascading from it.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<String>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
