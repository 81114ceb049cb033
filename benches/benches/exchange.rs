//! Criterion benchmarks of the Rust-to-Rust exchange: ours against dlpark 0.10 and the
//! hand-filled floor, over `ndim` and element count. `cargo bench -p dlpack-bench` runs them and
//! then prints the ratio tables of `BENCHMARKS.md` from this run's estimates.
//!
//! What each contender does is documented in `dlpack_bench` (the crate's `lib.rs`).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use criterion::{BatchSize, BenchmarkGroup, BenchmarkId, Criterion, measurement::WallTime};
use dlpack_bench::{SharedTensor, Tensor, dlpark_side, floor, ours, shape_of};

/// Element counts of the flatness sweep (1-D tensors, shared buffers).
const ELEMENTS: [usize; 5] = [1, 100, 10_000, 1_000_000, 100_000_000];
/// Ranks of the `ndim` sweep.
const NDIMS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// Elements of the round-trip and `ndim` tensors (`[2, 3]`, `[6, 1, ...]`).
const SMALL: usize = 6;
/// Repeats of the benchmarks whose ratios have targets (round trips, `ndim` sweep).
const REPEATS: usize = 3;

/// The round trip of a freshly built owned `[2, 3]` tensor (the `Vec` is built in the untimed
/// setup; its free, which the deleter does, is timed for every contender alike).
fn round_trip_owned(c: &mut Criterion, rep: usize) {
    let mut g = c.benchmark_group(format!("round_trip_owned_r{rep}"));
    let setup = || Tensor::ones([2, 3]);
    g.bench_function("ours", |b| {
        b.iter_batched(
            setup,
            |t| black_box(ours::round_trip::<2>(ours::export(black_box(t)))),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("dlpark_fixed", |b| {
        b.iter_batched(
            setup,
            |t| {
                black_box(dlpark_side::round_trip::<2>(dlpark_side::export(
                    black_box(t),
                )))
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("dlpark_dynamic", |b| {
        b.iter_batched(
            setup,
            |t| {
                black_box(dlpark_side::round_trip::<2>(dlpark_side::export_dynamic(
                    black_box(t),
                )))
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("floor", |b| {
        b.iter_batched(
            setup,
            |t| black_box(floor::round_trip::<2>(floor::export(black_box(t)))),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn shared<const N: usize>(values: &Arc<Vec<f32>>, shape: [usize; N]) -> SharedTensor<N> {
    SharedTensor {
        values: Arc::clone(values),
        shape,
    }
}

/// Registers the three shared round trips of rank `N` under `id(contender)`.
fn shared_round_trips<const N: usize>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    values: &Arc<Vec<f32>>,
    shape: [usize; N],
    id: impl Fn(&str) -> BenchmarkId,
) {
    g.bench_function(id("ours"), |b| {
        b.iter(|| {
            black_box(ours::round_trip::<N>(ours::export(shared(
                values,
                black_box(shape),
            ))))
        })
    });
    g.bench_function(id("dlpark"), |b| {
        b.iter(|| {
            black_box(dlpark_side::round_trip::<N>(dlpark_side::export_shared(
                shared(values, black_box(shape)),
            )))
        })
    });
    g.bench_function(id("floor"), |b| {
        b.iter(|| {
            black_box(floor::round_trip::<N>(floor::export_shared(shared(
                values,
                black_box(shape),
            ))))
        })
    });
}

/// The round trip of a `[2, 3]` tensor sharing one `Arc<Vec<f32>>` (no data allocation).
fn round_trip_shared(c: &mut Criterion, rep: usize) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group(format!("round_trip_shared_r{rep}"));
    shared_round_trips(&mut g, &values, [2, 3], |who| {
        BenchmarkId::from_parameter(who)
    });
    g.finish();
}

/// Export then drop, no import: the producer's share of the round trip.
fn export_drop_shared(c: &mut Criterion) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group("export_drop_shared");
    g.bench_function("ours", |b| {
        b.iter(|| drop(black_box(ours::export(shared(&values, black_box([2, 3]))))))
    });
    g.bench_function("dlpark", |b| {
        b.iter(|| {
            drop(black_box(dlpark_side::export_shared(shared(
                &values,
                black_box([2, 3]),
            ))))
        })
    });
    g.bench_function("floor", |b| {
        b.iter(|| {
            let raw = black_box(floor::export_shared(shared(&values, black_box([2, 3]))));
            // SAFETY: `raw` was just exported, is owned here, and its deleter runs once.
            unsafe { (raw.as_ref().deleter.expect("deleter"))(raw.as_ptr()) }
        })
    });
    g.finish();
}

/// Pieces of ours, each on a tensor held across iterations (nothing allocated or freed): one
/// full layout validation (`layout::validate`, what a tensor from FFI or Python gets once),
/// the layout of an already validated tensor (`ManagedTensor::layout`, what every later call
/// costs), the typed read `get`, and a raw read through `as_ptr`; dlpark's validation for
/// comparison.
fn parts(c: &mut Criterion) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group("parts");
    let managed = ours::export(shared(&values, [2, 3]));
    g.bench_function("ours_validate", |b| {
        b.iter(|| black_box(ours::validate(black_box(&managed))))
    });
    g.bench_function("ours_layout", |b| {
        b.iter(|| black_box(black_box(&managed).layout().expect("layout").numel()))
    });
    let view = ours::import::<2>(ours::export(shared(&values, [2, 3])));
    g.bench_function("ours_get", |b| b.iter(|| ours::read(black_box(&view))));
    g.bench_function("ours_as_ptr_read", |b| {
        // SAFETY: the view holds a live tensor of six `f32`.
        b.iter(|| unsafe { black_box(&view).data.as_ptr().read() })
    });
    let theirs = dlpark_side::export_shared(shared(&values, [2, 3]));
    g.bench_function("dlpark_validate", |b| {
        b.iter(|| black_box(black_box(&theirs).validate().expect("valid").num_elements()))
    });
    g.finish();
}

fn ndim_at<const N: usize>(g: &mut BenchmarkGroup<'_, WallTime>, values: &Arc<Vec<f32>>) {
    shared_round_trips(g, values, shape_of::<N>(SMALL), |who| {
        BenchmarkId::new(who, N)
    });
}

/// Cost against `ndim`: shape `[6, 1, 1, ...]`, shared buffer.
fn ndim(c: &mut Criterion, rep: usize) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group(format!("ndim_r{rep}"));
    ndim_at::<1>(&mut g, &values);
    ndim_at::<2>(&mut g, &values);
    ndim_at::<4>(&mut g, &values);
    ndim_at::<8>(&mut g, &values);
    ndim_at::<16>(&mut g, &values);
    ndim_at::<32>(&mut g, &values);
    g.finish();
}

/// Cost against element count: 1-D tensors over one shared buffer per size (built untimed,
/// freed before the next size), so only the exchange is timed.
fn elements(c: &mut Criterion) {
    let mut g = c.benchmark_group("elements");
    for n in ELEMENTS {
        let values = Arc::new(vec![1.0f32; n]);
        shared_round_trips(&mut g, &values, [n], |who| BenchmarkId::new(who, n));
    }
    g.finish();
}

/// Criterion's output folder: `$CRITERION_HOME`, else `target/criterion` next to this binary
/// (`target/<profile>/deps/exchange-*`).
fn output_directory() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

fn main() {
    let started = SystemTime::now();
    let out = output_directory();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .output_directory(&out)
        .configure_from_args();
    // The ratios with targets are measured REPEATS times, each repeat measuring every contender
    // back to back; the report gives the median and the worst of the repeats' ratios.
    for rep in 1..=REPEATS {
        round_trip_owned(&mut c, rep);
        round_trip_shared(&mut c, rep);
        ndim(&mut c, rep);
    }
    export_drop_shared(&mut c);
    parts(&mut c);
    elements(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        report(&out, started);
    }
}

/// Median time per iteration (ns) of `path` under `out`, if measured by this run.
fn median(out: &Path, path: &str, since: SystemTime) -> Option<f64> {
    let file = out.join(path).join("new/estimates.json");
    let fresh = std::fs::metadata(&file).ok()?.modified().ok()? >= since;
    if !fresh {
        return None;
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => "n/a".to_owned(),
    }
}

/// A ratio over the repeats: the median and the worst (largest) of the per-repeat ratios.
struct Spread {
    median: f64,
    worst: f64,
}

/// The ratio `a / b` of each repeat (each from criterion's median), summarized.
fn spread(per_repeat: impl Iterator<Item = Option<f64>>) -> Option<Spread> {
    let mut ratios: Vec<f64> = per_repeat.collect::<Option<_>>()?;
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    Some(Spread {
        median: ratios[ratios.len() / 2],
        worst: ratios[ratios.len() - 1],
    })
}

fn show(s: &Option<Spread>) -> String {
    match s {
        Some(s) => format!("{:.2}x ({:.2}x)", s.median, s.worst),
        None => "n/a".to_owned(),
    }
}

/// Met only when the worst repeat meets the target.
fn verdict(s: &Option<Spread>, target: f64) -> &'static str {
    match s {
        Some(s) if s.worst <= target => "met",
        Some(_) => "**missed**",
        None => "n/a",
    }
}

/// Prints the tables of `BENCHMARKS.md` from this run: ratios of criterion's medians, as the
/// median (and, in parentheses, the worst) of the repeats.
fn report(out: &Path, since: SystemTime) {
    let m = |path: String| median(out, &path, since);
    let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    let reps = 1..=REPEATS;
    println!("\n## Ratios from this run: median of {REPEATS} repeats (worst in parentheses)\n");

    println!("### Round trip (export, import, read first element, drop)\n");
    println!("| tensor | ours / dlpark | target <= 0.80x | ours / floor | target <= 1.30x |");
    println!("|---|---|---|---|---|");
    let owned = |who: &str, rep: usize| m(format!("round_trip_owned_r{rep}/{who}"));
    let dlpark_owned = |rep: usize| match (owned("dlpark_fixed", rep), owned("dlpark_dynamic", rep))
    {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let shared = |who: &str, rep: usize| m(format!("round_trip_shared_r{rep}/{who}"));
    let rows = [
        (
            "owned `Vec`, [2, 3]",
            spread(reps.clone().map(|r| div(owned("ours", r), dlpark_owned(r)))),
            spread(
                reps.clone()
                    .map(|r| div(owned("ours", r), owned("floor", r))),
            ),
        ),
        (
            "shared `Arc<Vec>`, [2, 3]",
            spread(
                reps.clone()
                    .map(|r| div(shared("ours", r), shared("dlpark", r))),
            ),
            spread(
                reps.clone()
                    .map(|r| div(shared("ours", r), shared("floor", r))),
            ),
        ),
    ];
    for (name, rd, rf) in rows {
        println!(
            "| {name} | {} | {} | {} | {} |",
            show(&rd),
            verdict(&rd, 0.8),
            show(&rf),
            verdict(&rf, 1.3)
        );
    }
    let ns = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
    println!("\nTimes per round trip (ns, criterion's median), repeat by repeat:\n");
    println!(
        "| repeat | owned: ours | dlpark (faster of fixed, dynamic) | floor | shared: ours | dlpark | floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in reps.clone() {
        println!(
            "| {r} | {} | {} | {} | {} | {} | {} |",
            ns(owned("ours", r)),
            ns(dlpark_owned(r)),
            ns(owned("floor", r)),
            ns(shared("ours", r)),
            ns(shared("dlpark", r)),
            ns(shared("floor", r)),
        );
    }

    println!("\n### Cost against ndim (shared, shape [6, 1, ..., 1])\n");
    println!("| ndim | ours / dlpark | target <= 0.90x | ours / floor | ours(ndim) / ours(1) |");
    println!("|---|---|---|---|---|");
    let nd = |who: &str, n: usize, rep: usize| m(format!("ndim_r{rep}/{who}/{n}"));
    for n in NDIMS {
        let rd = spread(
            reps.clone()
                .map(|r| div(nd("ours", n, r), nd("dlpark", n, r))),
        );
        let rf = spread(
            reps.clone()
                .map(|r| div(nd("ours", n, r), nd("floor", n, r))),
        );
        let growth = spread(
            reps.clone()
                .map(|r| div(nd("ours", n, r), nd("ours", 1, r))),
        );
        println!(
            "| {n} | {} | {} | {} | {} |",
            show(&rd),
            verdict(&rd, 0.9),
            show(&rf),
            show(&growth)
        );
    }

    println!("\n### Export + drop only (shared, [2, 3]; one measurement)\n");
    println!("| ours / dlpark | ours / floor | dlpark / floor |");
    println!("|---|---|---|");
    let ed = |who: &str| m(format!("export_drop_shared/{who}"));
    println!(
        "| {} | {} | {} |",
        ratio(ed("ours"), ed("dlpark")),
        ratio(ed("ours"), ed("floor")),
        ratio(ed("dlpark"), ed("floor"))
    );

    println!(
        "\n### Pieces (shared, [2, 3]; one measurement), as a share of ours' shared round trip\n"
    );
    println!("| piece | share |");
    println!("|---|---|");
    let rt = m("round_trip_shared_r1/ours".into());
    for (name, path) in [
        ("ours: export + drop", "export_drop_shared/ours"),
        (
            "ours: one full validation (`layout::validate`), once per foreign tensor",
            "parts/ours_validate",
        ),
        (
            "ours: layout of a validated tensor (`ManagedTensor::layout`)",
            "parts/ours_layout",
        ),
        (
            "ours: typed read `ImportedData::get` (index check only)",
            "parts/ours_get",
        ),
        ("ours: raw read through `as_ptr`", "parts/ours_as_ptr_read"),
        (
            "dlpark: one validation (`Managed::validate`)",
            "parts/dlpark_validate",
        ),
    ] {
        let share = div(m(path.into()), rt).map_or("n/a".to_owned(), |r| format!("{r:.3}"));
        println!("| {name} | {share} |");
    }

    println!("\n### Cost against element count (shared, 1-D; one measurement)\n");
    println!(
        "| elements | ours(n) / ours(1) | dlpark(n) / dlpark(1) | floor(n) / floor(1) | ours / dlpark | ours / floor |"
    );
    println!("|---|---|---|---|---|---|");
    let el = |who: &str, n: usize| m(format!("elements/{who}/{n}"));
    for n in ELEMENTS {
        println!(
            "| {n:.0e} | {} | {} | {} | {} | {} |",
            ratio(el("ours", n), el("ours", 1)),
            ratio(el("dlpark", n), el("dlpark", 1)),
            ratio(el("floor", n), el("floor", 1)),
            ratio(el("ours", n), el("dlpark", n)),
            ratio(el("ours", n), el("floor", n)),
        );
    }
    let flat = ELEMENTS
        .iter()
        .filter_map(|&n| div(el("ours", n), el("ours", 1)))
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(r), hi.max(r)));
    if flat.0 <= flat.1 {
        println!(
            "\nours over 1 to 1e8 elements: {:.2}x to {:.2}x of the 1-element cost.",
            flat.0, flat.1
        );
    }
}
