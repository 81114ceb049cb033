// A transparent struct forwards to its one field: more fields, or roles, are refused.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(transparent)]
struct Wrapper {
    #[dlpack(data)]
    values: Vec<f32>,
    shape: Vec<usize>,
}

fn main() {}
