use dlpack_runtime::{DlpackImport, ManagedTensor};

#[derive(DlpackImport)]
#[dlpack(dtype = "float32")]
struct View {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
