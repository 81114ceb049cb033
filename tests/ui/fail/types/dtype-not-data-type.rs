use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Erased {
    #[dlpack(data)]
    bytes: Vec<u8>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(dtype)]
    dtype: String,
}

fn main() {}
