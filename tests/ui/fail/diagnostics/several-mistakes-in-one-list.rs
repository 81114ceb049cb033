// Several mistakes in one `#[dlpack(...)]` list: each is reported, in one compile.
use dlpack_runtime::DlpackImport;
use dlpack_runtime::ImportedData;

#[derive(DlpackImport)]
#[dlpack(dtype = "f32", ndim = two, contigous = "C")]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {}
