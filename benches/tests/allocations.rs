//! Guards the targets the benchmarks report: at most one heap allocation per export (none when
//! the thread kept a freed block of its size), none per import, counted per thread by the
//! crate's counting allocator; and checks that the three contenders see the same tensor.

use std::sync::Arc;

use dlpack_bench::alloc_count::{CountingAllocator, measure};
use dlpack_bench::{SharedTensor, Tensor, dlpark_side, floor, ours, shape_of};
use dlpack_runtime::__testing::CACHED_BLOCKS_PER_CLASS;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const RUNS: usize = 1000;

/// The first release in a process may probe for a CUDA driver (feature `cuda`), which allocates
/// once: one tensor is released before anything is counted. Its block is then the one this
/// thread keeps for its next export of that size, and the thread's block cache is set up.
fn warm_up() {
    drop(ours::import::<2>(ours::export(Tensor::ones([2, 3]))));
}

#[test]
fn ours_allocates_at_most_once_per_export_and_never_per_import() {
    // A thread of its own, so that only the warm-up left a block behind.
    std::thread::spawn(count_the_exchange_allocations)
        .join()
        .expect("the exchanges ran");
}

fn count_the_exchange_allocations() {
    warm_up();
    let mut producers: Vec<Tensor<2>> = (0..RUNS).map(|_| Tensor::ones([2, 3])).collect();
    let mut exported = Vec::with_capacity(RUNS);
    let mut views = Vec::with_capacity(RUNS);
    let ((), export) = measure(|| exported.extend(producers.drain(..).map(ours::export)));
    let ((), import) = measure(|| views.extend(exported.drain(..).map(ours::import::<2>)));
    let (sum, read) = measure(|| views.iter().map(ours::read).sum::<f32>());
    let ((), drop) = measure(|| views.clear());
    assert_eq!(sum, RUNS as f32);
    assert_eq!(
        (export.allocs, export.reallocs),
        (RUNS - 1, 0),
        "one block per export, but for the block the warm-up left"
    );
    assert_eq!(
        (import.allocs, import.reallocs),
        (0, 0),
        "nothing per import"
    );
    assert_eq!((read.allocs, read.reallocs), (0, 0), "nothing per read");
    assert_eq!(
        drop.deallocs,
        2 * RUNS - CACHED_BLOCKS_PER_CLASS,
        "the block and the data, but for the blocks the thread keeps"
    );
}

#[test]
fn exports_reuse_the_blocks_their_thread_freed() {
    let values = Arc::new(vec![1.0f32; 6]);
    let shared = || SharedTensor {
        values: Arc::clone(&values),
        shape: [2, 3],
    };
    // A thread of its own, so that no earlier export left a block behind.
    let (cold, warm) = std::thread::scope(|s| {
        s.spawn(|| {
            // The first release in the process may probe for a CUDA driver (feature `cuda`),
            // and the thread's first use of its block cache registers the cache's destructor
            // (which may allocate on some platforms): one tensor of another size class (8
            // axes) is released before anything is counted.
            let other_class = SharedTensor {
                values: Arc::clone(&values),
                shape: shape_of::<8>(6),
            };
            drop(ours::import::<8>(ours::export(other_class)));
            let (first, cold) = measure(|| ours::round_trip::<2>(ours::export(shared())));
            assert_eq!(first, 1.0);
            let (first, warm) = measure(|| ours::round_trip::<2>(ours::export(shared())));
            assert_eq!(first, 1.0);
            (cold, warm)
        })
        .join()
        .expect("the round trips ran")
    });
    assert_eq!(
        (cold.allocs, cold.deallocs, cold.reallocs),
        (1, 0, 0),
        "the first export allocates its block, which the drop keeps"
    );
    assert_eq!(
        (warm.allocs, warm.deallocs, warm.reallocs),
        (0, 0, 0),
        "the next reuses it"
    );
    assert_eq!(
        Arc::strong_count(&values),
        1,
        "the deleters dropped the clones"
    );
}

#[test]
fn ours_validates_once_per_exchange() {
    let values = Arc::new(vec![1.0f32; 6]);
    let managed = ours::export(SharedTensor {
        values: Arc::clone(&values),
        shape: [2, 3],
    });
    assert!(
        managed.is_validated(),
        "the exporter's validation is kept, so the import does not validate again"
    );
    let view = ours::import::<2>(managed);
    assert!(view.data.managed().is_validated());
    assert_eq!(ours::read(&view), 1.0);
}

#[test]
fn contenders_see_the_same_tensor() {
    fn check<const N: usize>() {
        let shape = shape_of::<N>(6);
        let values = Arc::new(vec![1.0f32; 6]);
        let shared = || SharedTensor {
            values: Arc::clone(&values),
            shape,
        };
        let a = ours::import::<N>(ours::export(shared()));
        let b = dlpark_side::import::<N>(dlpark_side::export_shared(shared()));
        let raw = floor::export_shared(shared());
        // SAFETY: a fresh export of rank `N`, owned here.
        let c = unsafe { floor::import::<N>(raw) }.expect("import");
        assert_eq!((a.shape, a.strides), (b.shape, b.strides));
        assert_eq!((a.shape, a.strides), (c.shape, c.strides));
        assert_eq!(a.data.as_ptr(), values.as_ptr());
        assert!(a.data.is_read_only());
        // SAFETY: six elements.
        let floor_first = unsafe { c.first() };
        assert_eq!(
            (ours::read(&a), dlpark_side::read(&b), floor_first),
            (1.0, 1.0, 1.0)
        );
        drop((a, b, c));
        assert_eq!(Arc::strong_count(&values), 1, "every deleter ran");
    }
    check::<1>();
    check::<2>();
    check::<8>();
    check::<32>();

    let owned = || Tensor::ones([2, 3]);
    assert_eq!(ours::round_trip::<2>(ours::export(owned())), 1.0);
    assert_eq!(
        dlpark_side::round_trip::<2>(dlpark_side::export(owned())),
        1.0
    );
    assert_eq!(
        dlpark_side::round_trip::<2>(dlpark_side::export_dynamic(owned())),
        1.0
    );
    assert_eq!(floor::round_trip::<2>(floor::export(owned())), 1.0);
}
