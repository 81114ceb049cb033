use dlpack_runtime::DlpackImport;

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: dlpack_runtime::ManagedTensor,
    shape: Vec<usize>,
}

fn main() {}
