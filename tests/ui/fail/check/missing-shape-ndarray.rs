use dlpack_runtime::DlpackExport;

// An array carries its shape, yet the struct declares it: the error says so.
#[derive(DlpackExport)]
struct Frame {
    #[dlpack(data)]
    pixels: ndarray::Array2<f32>,
}

fn main() {}
