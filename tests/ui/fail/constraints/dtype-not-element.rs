use dlpack_runtime::{DlpackImport, ManagedTensor};

#[derive(DlpackImport)]
#[dlpack(dtype = String)]
struct View {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
