// A raw `CUstream` as the stream role: reported at the field's type, naming the accepted types
// and the way from a raw handle to one of them.
use cudarc::driver::sys;
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: sys::CUstream,
}

fn main() {}
