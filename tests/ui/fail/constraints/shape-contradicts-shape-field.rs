use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(shape = [_, 3])]
struct Points {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 3],
}

fn main() {}
