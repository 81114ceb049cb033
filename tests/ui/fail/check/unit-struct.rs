use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Empty;

fn main() {}
