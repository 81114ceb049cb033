// A misspelt role or key gets a suggestion.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(readonyl)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shpae)]
    shape: Vec<usize>,
}

fn main() {}
