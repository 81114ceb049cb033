use dlpack_runtime::{DlpackImport, DlpackImportStorage, ImportedData, ManagedTensor};

// A managed tensor takes no borrow.
#[derive(DlpackImport)]
#[dlpack(borrow = "shared")]
struct Raw {
    #[dlpack(data)]
    data: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

// Nor does a storage enum with a variant that holds one.
#[derive(DlpackImportStorage)]
enum Mixed {
    F32(ImportedData<f32>),
    Other(ManagedTensor),
}

#[derive(DlpackImport)]
#[dlpack(writable, borrow = "exclusive")]
struct View {
    #[dlpack(data)]
    data: Mixed,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
