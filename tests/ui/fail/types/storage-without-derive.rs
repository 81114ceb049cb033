// A storage enum used as data without `#[derive(DlpackStorage)]`.
use std::sync::Arc;

use dlpack_runtime::DlpackExport;

enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
