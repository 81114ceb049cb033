use dlpack_runtime::DlpackStorage;

#[derive(DlpackStorage)]
#[dlpack(readonly, dtype = f32)]
enum Storage {
    F32(Vec<f32>),
    #[dlpack(data)]
    F64(Vec<f64>),
}

fn main() {}
