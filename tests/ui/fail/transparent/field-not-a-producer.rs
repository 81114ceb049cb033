// The field of a transparent producer must be a producer itself: one error, at the field.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
#[dlpack(transparent)]
struct Wrapper(Vec<f32>);

fn main() {}
