use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Window {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    #[dlpack(byte_offset)]
    byte_offset: i64,
}

fn main() {}
