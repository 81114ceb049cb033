use dlpack_runtime::DlpackStorage;

#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    Empty,
    Pair(Vec<f32>, Vec<f32>),
}

fn main() {}
