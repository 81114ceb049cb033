use dlpack_runtime::{DlpackImport, ImportedData};

const N: usize = 3;

#[derive(DlpackImport)]
#[dlpack(shape = [_, N])]
struct Points {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
