//! A plain loop over one contender's round trip, for profilers (callgrind, perf), which want a
//! small binary rather than criterion's harness:
//!
//! ```sh
//! CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release -p dlpack-bench --example profile
//! valgrind --tool=callgrind target/release/examples/profile ours shared 100000
//! ```
//!
//! Arguments: contender (`ours`, `dlpark`, `floor`), what (`shared`: round trip of a shared
//! `[2, 3]` tensor; `owned`: round trip of an owned one, its `Vec` built in the loop;
//! `export`: export and drop of a shared one; `validate`: one full layout validation of a held
//! tensor's header; `layout`: the layout of a held, already validated tensor; `get`: one typed
//! read of a held view; `ptr`: one raw read of a held view; `ndim1` ... `ndim32`: round trip of
//! a shared `[6, 1, ..., 1]` tensor of that many axes, as the `ndim` benchmark),
//! iterations. Instructions per operation: callgrind's total over two iteration counts,
//! differenced and divided, removes the fixed start-up cost.

use std::hint::black_box;
use std::sync::Arc;

use dlpack_bench::{SharedTensor, Tensor, dlpark_side, floor, ours, shape_of};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let who = args.first().map_or("ours", String::as_str);
    let what = args.get(1).map_or("shared", String::as_str);
    let runs: usize = args
        .get(2)
        .map_or(1_000_000, |n| n.parse().expect("iterations"));
    let values = Arc::new(vec![1.0f32; 6]);
    let shared = || SharedTensor {
        values: Arc::clone(&values),
        shape: black_box([2, 3]),
    };
    let owned = || Tensor::ones(black_box([2, 3]));
    if let Some(n) = what.strip_prefix("ndim") {
        let n: usize = n
            .parse()
            .expect("ndim1, ndim2, ndim4, ndim8, ndim16 or ndim32");
        let sum = match n {
            1 => ndim::<1>(who, &values, runs),
            2 => ndim::<2>(who, &values, runs),
            4 => ndim::<4>(who, &values, runs),
            8 => ndim::<8>(who, &values, runs),
            16 => ndim::<16>(who, &values, runs),
            32 => ndim::<32>(who, &values, runs),
            _ => panic!("unsupported ndim {n}"),
        };
        println!("{sum}");
        return;
    }
    let held = ours::export(shared());
    let view = ours::import::<2>(ours::export(shared()));
    let theirs = dlpark_side::export_shared(shared());
    // The case is chosen once, and each arm runs its own loop: no dispatch per iteration, so
    // every contender's count holds its operation and the same loop overhead.
    let sum = match (who, what) {
        ("ours", "shared") => run(runs, || ours::round_trip::<2>(ours::export(shared()))),
        ("ours", "owned") => run(runs, || ours::round_trip::<2>(ours::export(owned()))),
        ("ours", "export") => run(runs, || {
            drop(black_box(ours::export(shared())));
            1.0
        }),
        ("ours", "validate") => run(runs, || ours::validate(black_box(&held)) as f32),
        ("ours", "layout") => run(runs, || {
            black_box(&held).layout().expect("layout").numel() as f32
        }),
        ("ours", "get") => run(runs, || ours::read(black_box(&view))),
        // SAFETY: the view holds a live tensor of six `f32`.
        ("ours", "ptr") => run(runs, || unsafe { black_box(&view).data.as_ptr().read() }),
        ("dlpark", "validate") => run(runs, || {
            black_box(&theirs).validate().expect("valid").num_elements() as f32
        }),
        ("dlpark", "shared") => run(runs, || {
            dlpark_side::round_trip::<2>(dlpark_side::export_shared(shared()))
        }),
        ("dlpark", "owned") => run(runs, || {
            dlpark_side::round_trip::<2>(dlpark_side::export(owned()))
        }),
        ("dlpark", "export") => run(runs, || {
            drop(black_box(dlpark_side::export_shared(shared())));
            1.0
        }),
        ("floor", "shared") => run(runs, || {
            floor::round_trip::<2>(floor::export_shared(shared()))
        }),
        ("floor", "owned") => run(runs, || floor::round_trip::<2>(floor::export(owned()))),
        ("floor", "export") => run(runs, || {
            let raw = black_box(floor::export_shared(shared()));
            // SAFETY: `raw` was just exported, is owned here, and its deleter runs once.
            unsafe { (raw.as_ref().deleter.expect("deleter"))(raw.as_ptr()) };
            1.0
        }),
        _ => panic!("unknown contender or case: {who} {what}"),
    };
    println!("{sum}");
}

/// Runs `step` `runs` times and sums what it returns.
fn run(runs: usize, mut step: impl FnMut() -> f32) -> f32 {
    let mut sum = 0.0f32;
    for _ in 0..runs {
        sum += step();
    }
    sum
}

/// `runs` shared round trips of shape `[6, 1, ..., 1]` (`N` axes), as the `ndim` benchmark.
fn ndim<const N: usize>(who: &str, values: &Arc<Vec<f32>>, runs: usize) -> f32 {
    let shared = || SharedTensor {
        values: Arc::clone(values),
        shape: black_box(shape_of::<N>(6)),
    };
    match who {
        "ours" => run(runs, || ours::round_trip::<N>(ours::export(shared()))),
        "dlpark" => run(runs, || {
            dlpark_side::round_trip::<N>(dlpark_side::export_shared(shared()))
        }),
        "floor" => run(runs, || {
            floor::round_trip::<N>(floor::export_shared(shared()))
        }),
        _ => panic!("unknown contender: {who}"),
    }
}
