//! Criterion benchmarks of `copy=True` on the host (the `copy` parameter of the array API's
//! [`__dlpack__`]): the export of a 1024 x 1024 `f32` tensor (4 MiB) compact, transposed and
//! with reversed columns, against the floor of one `memcpy` of the same bytes and a per-element
//! gather. `cargo bench -p dlpack-bench --bench copy`.
//!
//! [`__dlpack__`]: https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use dlpack_runtime::{DlpackExport, ExportRequest};

const SIDE: usize = 1024;

/// A shared view of `values` with strides and an offset, in elements.
#[derive(DlpackExport)]
struct View {
    #[dlpack(data)]
    values: Arc<Vec<f32>>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(strides)]
    strides: [isize; 2],
    #[dlpack(offset)]
    offset: usize,
}

fn views(values: &Arc<Vec<f32>>) -> [(&'static str, View); 3] {
    let n = SIDE as isize;
    let view = |strides: [isize; 2], offset: usize| View {
        values: values.clone(),
        shape: [SIDE, SIDE],
        strides,
        offset,
    };
    [
        ("compact", view([n, 1], 0)),
        ("transposed", view([1, n], 0)),
        ("reversed_columns", view([n, -1], SIDE - 1)),
    ]
}

fn copies(c: &mut Criterion) {
    let values: Arc<Vec<f32>> = Arc::new((0..SIDE * SIDE).map(|v| v as f32).collect());
    let mut g = c.benchmark_group("copy_true_4MiB");
    g.throughput(Throughput::Bytes((SIDE * SIDE * 4) as u64));
    let request = ExportRequest::versioned().copy(Some(true));
    for (name, view) in views(&values) {
        let view = Arc::new(view);
        g.bench_function(name, |b| {
            b.iter(|| black_box(view.clone().into_dlpack_with(&request).unwrap()))
        });
    }
    g.bench_function("floor_memcpy", |b| b.iter(|| black_box(values.to_vec())));
    g.bench_function("floor_gather_transposed", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(SIDE * SIDE);
            for i in 0..SIDE {
                for j in 0..SIDE {
                    out.push(values[j * SIDE + i]);
                }
            }
            black_box(out)
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    copies(&mut c);
    c.final_summary();
}
