use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Text {
    #[dlpack(data)]
    text: String,
    #[dlpack(shape)]
    shape: [usize; 1],
}

fn main() {}
