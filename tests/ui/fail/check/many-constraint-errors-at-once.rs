// Errors in options, constraints and roles are all reported in one run.
use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(contiguous = "rows")]
#[dlpack(ndim = 3, shape = [_, 2])]
#[dlpack(device = "gpu")]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(offset)]
    start: usize,
    #[dlpack(byte_offset)]
    bytes: usize,
}

fn main() {}
