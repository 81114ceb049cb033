use dlpack_runtime::{DlpackImport, ImportedData};

#[derive(DlpackImport)]
#[dlpack(contiguous = "F")]
struct Fortran {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
