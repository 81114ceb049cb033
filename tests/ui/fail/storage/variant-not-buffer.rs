use dlpack_runtime::DlpackStorage;

#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    Text(String),
}

fn main() {}
