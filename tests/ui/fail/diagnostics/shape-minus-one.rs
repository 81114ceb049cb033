// NumPy writes an unconstrained extent as -1; a shape constraint writes `_`.
use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(shape = [-1, 3])]
struct Points {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

fn main() {}
