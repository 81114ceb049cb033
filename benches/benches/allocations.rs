//! Heap allocations per export, per import and per drop, counted exactly with a counting global
//! allocator: each operation runs `RUNS` times in a row outside criterion, and the count is
//! divided by `RUNS`; then `RUNS` whole round trips, one after the other. Prints the allocation
//! table of `BENCHMARKS.md`.

use std::sync::Arc;

use dlpack_bench::alloc_count::{CountingAllocator, Counts, measure};
use dlpack_bench::{SharedTensor, Tensor, dlpark_side, floor, ours};
use dlpack_runtime::DlpackImport;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const RUNS: usize = 10_000;

/// Per-operation counts of one contender.
struct Row {
    name: &'static str,
    export: Counts,
    import: Counts,
    read: Counts,
    drop: Counts,
    /// Whole round trips (export, import, read, drop) one after the other.
    looped: Counts,
}

fn per_op(count: usize) -> String {
    if count.is_multiple_of(RUNS) {
        format!("{}", count / RUNS)
    } else {
        format!("{:.4}", count as f64 / RUNS as f64)
    }
}

/// Runs `export` on `RUNS` producers, then `import`, `read` and drop, each phase counted
/// separately; then `RUNS` whole round trips one after the other, each dropped before the next
/// (where an exporter can reuse what the previous drop freed). Inputs and outputs live in
/// vectors allocated before each phase.
fn phases<P, M, V>(
    name: &'static str,
    make: impl Fn() -> P + Send,
    export: impl Fn(P) -> M + Send,
    import: impl Fn(M) -> V + Send,
    read: impl Fn(&V) -> f32 + Send,
) -> Row {
    // A thread of its own for each contender: blocks an earlier one freed and its thread kept
    // are not counted as this one's.
    std::thread::scope(|s| {
        s.spawn(|| counted_phases(name, make, export, import, read))
            .join()
            .expect("the phases ran")
    })
}

fn counted_phases<P, M, V>(
    name: &'static str,
    make: impl Fn() -> P,
    export: impl Fn(P) -> M,
    import: impl Fn(M) -> V,
    read: impl Fn(&V) -> f32,
) -> Row {
    let mut producers: Vec<P> = (0..RUNS).map(|_| make()).collect();
    let mut exported: Vec<M> = Vec::with_capacity(RUNS);
    let mut views: Vec<V> = Vec::with_capacity(RUNS);
    let ((), export_counts) = measure(|| exported.extend(producers.drain(..).map(&export)));
    let ((), import_counts) = measure(|| views.extend(exported.drain(..).map(&import)));
    let (sum, read_counts) = measure(|| views.iter().map(&read).sum::<f32>());
    assert_eq!(sum, RUNS as f32, "every read sees the first element, 1.0");
    let ((), drop_counts) = measure(|| views.clear());
    let mut producers: Vec<P> = (0..RUNS).map(|_| make()).collect();
    let (sum, looped) = measure(|| {
        producers
            .drain(..)
            .map(|producer| read(&import(export(producer))))
            .sum::<f32>()
    });
    assert_eq!(
        sum, RUNS as f32,
        "every round trip reads the first element, 1.0"
    );
    Row {
        name,
        export: export_counts,
        import: import_counts,
        read: read_counts,
        drop: drop_counts,
        looped,
    }
}

fn print(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!(
        "| contender | allocations per export | per import | per read | frees per drop | round trips in a loop: allocations, frees per round trip |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        let reallocs = r.export.reallocs
            + r.import.reallocs
            + r.read.reallocs
            + r.drop.reallocs
            + r.looped.reallocs;
        assert_eq!(reallocs, 0, "{}: unexpected reallocations", r.name);
        println!(
            "| {} | {} | {} | {} | {} | {}, {} |",
            r.name,
            per_op(r.export.allocs),
            per_op(r.import.allocs),
            per_op(r.read.allocs),
            per_op(r.drop.deallocs),
            per_op(r.looped.allocs),
            per_op(r.looped.deallocs),
        );
    }
}

fn main() {
    println!("\n## Heap allocations ({RUNS} operations per phase, counted on this thread)");
    let owned = || Tensor::ones([2, 3]);
    print(
        "Owned `Vec<f32>`, shape [2, 3] (the drop frees the data too)",
        &[
            phases("ours", owned, ours::export, ours::import::<2>, ours::read),
            phases(
                "ours, `Vec` shape/strides consumer (README)",
                owned,
                ours::export,
                |m| ours::VecView::from_managed(m).expect("import"),
                |v| v.data.get(&[0, 0]).expect("read"),
            ),
            phases(
                "dlpark (`Fixed`)",
                owned,
                dlpark_side::export,
                dlpark_side::import::<2>,
                dlpark_side::read,
            ),
            phases(
                "dlpark (`Dynamic::compact`)",
                owned,
                dlpark_side::export_dynamic,
                dlpark_side::import::<2>,
                dlpark_side::read,
            ),
            phases(
                "floor",
                owned,
                floor::export,
                // SAFETY: fresh exports of `floor::export`: valid, rank 2, owned.
                |raw| unsafe { floor::import::<2>(raw) }.expect("import"),
                // SAFETY: six elements.
                |v| unsafe { v.first() },
            ),
        ],
    );
    let values = Arc::new(vec![1.0f32; 6]);
    let shared = || SharedTensor {
        values: Arc::clone(&values),
        shape: [2, 3],
    };
    print(
        "Shared `Arc<Vec<f32>>`, shape [2, 3]",
        &[
            phases("ours", shared, ours::export, ours::import::<2>, ours::read),
            phases(
                "dlpark (`Arc` as context)",
                shared,
                dlpark_side::export_shared,
                dlpark_side::import::<2>,
                dlpark_side::read,
            ),
            phases(
                "floor",
                shared,
                floor::export_shared,
                // SAFETY: fresh exports of `floor::export_shared`: valid, rank 2, owned.
                |raw| unsafe { floor::import::<2>(raw) }.expect("import"),
                // SAFETY: six elements.
                |v| unsafe { v.first() },
            ),
        ],
    );
}
