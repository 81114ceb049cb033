use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
enum Tensor {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

fn main() {}
