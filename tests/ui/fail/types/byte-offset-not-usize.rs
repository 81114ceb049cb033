use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(byte_offset)]
    byte_offset: u64,
}

fn main() {}
