use dlpack_runtime::DlpackImport;

#[derive(DlpackImport)]
union Bits {
    float: f32,
    int: u32,
}

fn main() {}
