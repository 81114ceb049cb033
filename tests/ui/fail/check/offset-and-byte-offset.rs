use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Narrowed {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
    #[dlpack(offset)]
    start: usize,
}

fn main() {}
