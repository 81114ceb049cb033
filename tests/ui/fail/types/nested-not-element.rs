// A buffer of buffers: the inner `Vec<f32>` is what is not an element type.
use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};

#[derive(DlpackExport)]
struct Tensor<B> {
    #[dlpack(data)]
    data: B,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[derive(DlpackExport)]
struct Elements<T> {
    #[dlpack(data)]
    data: Vec<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn export<P: DlpackExport + Send + 'static>(p: P) {
    let _ = p.into_dlpack();
}

#[derive(DlpackImport)]
struct View<T> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn main() {
    export(Tensor { data: vec![vec![1.0f32]], shape: vec![1] });
    export(Elements { data: vec![vec![1.0f32]], shape: vec![1] });
    let _ = Tensor { data: vec![vec![1.0f32]], shape: vec![1] }.into_dlpack();
    let _ = View::<Vec<f32>>::from_dlpack(Elements { data: vec![1.0f32], shape: vec![1] });
}
