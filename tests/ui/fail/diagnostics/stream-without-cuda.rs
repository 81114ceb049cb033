// A stream field without the `cuda` feature: one error, naming the feature.
use dlpack_runtime::DlpackExport;

struct MyStream;

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: MyStream,
}

fn main() {}
