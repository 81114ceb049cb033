// A generic tensor used with an element type that is not one: the hint names `T: Element`.
use dlpack_runtime::DlpackExport;

#[derive(DlpackExport)]
struct Tensor<T> {
    #[dlpack(data)]
    data: Vec<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn export<P: DlpackExport + Send + 'static>(p: P) {
    let _ = p.into_dlpack();
}

fn main() {
    export(Tensor { data: vec![String::new()], shape: vec![1] });
}
