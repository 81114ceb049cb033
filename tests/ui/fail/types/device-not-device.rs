use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Placed {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(device)]
    device: &'static str,
}

fn main() {}
