//! Criterion benchmarks of the Rust-to-Rust exchange: ours against dlpark 0.10 and the
//! hand-filled floor, over `ndim` and element count. `cargo bench -p dlpack-bench` runs them,
//! then times the targeted comparisons once more as paired, alternating blocks (see
//! [`paired`]), and prints the ratio tables of `BENCHMARKS.md` from this run.
//!
//! What each contender does is documented in `dlpack_bench` (the crate's `lib.rs`).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use criterion::{BatchSize, BenchmarkGroup, BenchmarkId, Criterion, measurement::WallTime};
use dlpack_bench::{SharedTensor, Tensor, dlpark_side, floor, ours, shape_of};

/// Element counts of the flatness sweep (1-D tensors, shared buffers).
const ELEMENTS: [usize; 5] = [1, 100, 10_000, 1_000_000, 100_000_000];
/// Ranks of the `ndim` sweep.
const NDIMS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// Elements of the round-trip and `ndim` tensors (`[2, 3]`, `[6, 1, ...]`).
const SMALL: usize = 6;
/// Repeats of the paired timings of the ratios with targets (round trips, `ndim` sweep), each
/// in a process of its own.
const REPEATS: usize = 5;
/// Operations per timed block of a paired timing: about 50-150 us of round trips, long against
/// the clock's resolution, short against the machine's drifts in speed.
const BLOCK: usize = 2_000;
/// Rounds of a paired timing (each round times one block of every contender).
const ROUNDS: usize = 301;

/// The round trip of a freshly built owned `[2, 3]` tensor (the `Vec` is built in the untimed
/// setup; its free, which the deleter does, is timed for every contender alike).
fn round_trip_owned(c: &mut Criterion) {
    let mut g = c.benchmark_group("round_trip_owned");
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
fn round_trip_shared(c: &mut Criterion) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group("round_trip_shared");
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
fn ndim(c: &mut Criterion) {
    let values = Arc::new(vec![1.0f32; SMALL]);
    let mut g = c.benchmark_group("ndim");
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

fn main() {
    if std::env::var_os(paired::CHILD).is_some() {
        paired::child();
        return;
    }
    let started = SystemTime::now();
    let out = output_directory();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .output_directory(&out)
        .configure_from_args();
    round_trip_owned(&mut c);
    round_trip_shared(&mut c);
    ndim(&mut c);
    export_drop_shared(&mut c);
    parts(&mut c);
    elements(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        let paired = paired::measure();
        report(&out, started, &paired);
    }
}

/// Paired timing of the comparisons with targets. Criterion measures one benchmark after the
/// other, each for seconds, so a drift in the machine's speed between two contenders' turns
/// (on a shared VM, 30% within a minute is common) goes straight into their ratio. Here the
/// contenders of one comparison take turns instead: each round times one block of [`BLOCK`]
/// operations of every contender (the order rotating from round to round), and a repeat's ratio
/// is the median over its [`ROUNDS`] rounds of the ratio of the blocks timed side by side.
///
/// Each of the [`REPEATS`] repeats runs in a process of its own (this binary again, with
/// [`CHILD`] set). Within one process the ratios agree to 1-2%, but from one process to the
/// next they can move by 20%: a shared VM may run a process in a faster or a slower state of
/// the host (seen as two clusters of times, 25 ns or 41 ns for the floor's shared round trip),
/// and the contenders gain unequally from the faster one. Repeats in one process would share
/// its state, and their worst would hide the other's; the report gives the median and the
/// worst process.
mod paired {
    use super::*;

    /// A contender: times `n` operations and returns the elapsed time (any setup untimed).
    type Timed<'a> = Box<dyn FnMut(usize) -> Duration + 'a>;

    /// Nanoseconds per operation of each contender, round by round.
    fn rounds(contenders: &mut [Timed<'_>]) -> Vec<Vec<f64>> {
        let k = contenders.len();
        let mut times = vec![Vec::with_capacity(ROUNDS); k];
        // Warm-up: caches, branch predictors, the allocator's free lists.
        for contender in contenders.iter_mut() {
            contender(BLOCK);
        }
        for round in 0..ROUNDS {
            for j in 0..k {
                let i = (round + j) % k;
                let elapsed = contenders[i](BLOCK);
                times[i].push(elapsed.as_secs_f64() * 1e9 / BLOCK as f64);
            }
        }
        times
    }

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }

    /// One repeat of a comparison: per contender, the median time per operation (ns); and the
    /// median over rounds of `ours / contender` for each contender (index 0 is ours).
    #[derive(Debug, Clone)]
    pub struct Repeat {
        /// Median ns per operation, by contender.
        pub ns: Vec<f64>,
        /// Median per-round ratio of ours to each contender (1.0 for ours itself).
        pub ratio: Vec<f64>,
    }

    fn repeat(contenders: &mut [Timed<'_>], combine: &[&[usize]]) -> Repeat {
        let times = rounds(contenders);
        // A combined contender (dlpark's two owned producers) is, in each round, the faster of
        // the ones it combines.
        let side = |members: &[usize], round: usize| {
            members
                .iter()
                .map(|&m| times[m][round])
                .fold(f64::INFINITY, f64::min)
        };
        let ns = combine
            .iter()
            .map(|members| median((0..ROUNDS).map(|r| side(members, r)).collect()))
            .collect();
        let ratio = combine
            .iter()
            .map(|members| {
                median(
                    (0..ROUNDS)
                        .map(|r| times[0][r] / side(members, r))
                        .collect(),
                )
            })
            .collect();
        Repeat { ns, ratio }
    }

    /// The repeats of one comparison.
    pub type Comparison = Vec<Repeat>;

    /// Every paired comparison of the report.
    pub struct Results {
        /// Owned `[2, 3]`: ours, dlpark (faster of fixed and dynamic), floor.
        pub owned: Comparison,
        /// Shared `[2, 3]`: ours, dlpark, floor.
        pub shared: Comparison,
        /// Shared `[6, 1, ...]` by rank ([`NDIMS`]): ours, dlpark, floor.
        pub ndim: Vec<Comparison>,
    }

    fn owned_contenders() -> Vec<Timed<'static>> {
        /// Times `n` round trips of freshly built owned tensors (built before the clock starts).
        fn timed(n: usize, trip: impl Fn(Tensor<2>) -> f32) -> Duration {
            let inputs: Vec<Tensor<2>> = (0..n).map(|_| Tensor::ones([2, 3])).collect();
            let start = Instant::now();
            for t in inputs {
                black_box(trip(black_box(t)));
            }
            start.elapsed()
        }
        vec![
            Box::new(|n| timed(n, |t| ours::round_trip::<2>(ours::export(t)))),
            Box::new(|n| timed(n, |t| dlpark_side::round_trip::<2>(dlpark_side::export(t)))),
            Box::new(|n| {
                timed(n, |t| {
                    dlpark_side::round_trip::<2>(dlpark_side::export_dynamic(t))
                })
            }),
            Box::new(|n| timed(n, |t| floor::round_trip::<2>(floor::export(t)))),
        ]
    }

    fn shared_contenders<const N: usize>(
        values: &Arc<Vec<f32>>,
        shape: [usize; N],
    ) -> Vec<Timed<'_>> {
        /// Times `n` round trips of shared tensors over `values`.
        fn timed<const N: usize>(
            n: usize,
            values: &Arc<Vec<f32>>,
            shape: [usize; N],
            trip: impl Fn(SharedTensor<N>) -> f32,
        ) -> Duration {
            let start = Instant::now();
            for _ in 0..n {
                black_box(trip(shared(values, black_box(shape))));
            }
            start.elapsed()
        }
        vec![
            Box::new(move |n| timed(n, values, shape, |t| ours::round_trip::<N>(ours::export(t)))),
            Box::new(move |n| {
                timed(n, values, shape, |t| {
                    dlpark_side::round_trip::<N>(dlpark_side::export_shared(t))
                })
            }),
            Box::new(move |n| {
                timed(n, values, shape, |t| {
                    floor::round_trip::<N>(floor::export_shared(t))
                })
            }),
        ]
    }

    fn ndim_at<const N: usize>(values: &Arc<Vec<f32>>) -> Repeat {
        repeat(
            &mut shared_contenders(values, shape_of::<N>(SMALL)),
            &[&[0], &[1], &[2]],
        )
    }

    /// Environment variable that makes this binary run one repeat of every comparison, print
    /// it as JSON and exit (set for the child processes of [`measure`]).
    pub const CHILD: &str = "DLPACK_BENCH_PAIRED_CHILD";

    /// One repeat of every comparison, in this process: owned, shared, then each rank.
    fn one_repeat() -> Vec<Repeat> {
        let values = Arc::new(vec![1.0f32; SMALL]);
        let mut repeats = vec![repeat(&mut owned_contenders(), &[&[0], &[1, 2], &[3]])];
        repeats.push(repeat(
            &mut shared_contenders(&values, [2, 3]),
            &[&[0], &[1], &[2]],
        ));
        for n in NDIMS {
            repeats.push(match n {
                1 => ndim_at::<1>(&values),
                2 => ndim_at::<2>(&values),
                4 => ndim_at::<4>(&values),
                8 => ndim_at::<8>(&values),
                16 => ndim_at::<16>(&values),
                32 => ndim_at::<32>(&values),
                _ => unreachable!("NDIMS holds the ranks above"),
            });
        }
        repeats
    }

    /// The child's part: one repeat, printed as JSON on stdout.
    pub fn child() {
        let repeats: Vec<serde_json::Value> = one_repeat()
            .into_iter()
            .map(|r| serde_json::json!({ "ns": r.ns, "ratio": r.ratio }))
            .collect();
        println!("{}", serde_json::Value::Array(repeats));
    }

    /// Runs [`REPEATS`] child processes, one repeat of every comparison each.
    ///
    /// # Panics
    ///
    /// When a child cannot be started, fails, or prints something else than its repeat.
    pub fn measure() -> Results {
        eprintln!(
            "paired timings: {REPEATS} processes, each timing {ROUNDS} rounds of {BLOCK}-operation blocks per comparison"
        );
        let exe = std::env::current_exe().expect("path of this benchmark binary");
        let mut results = Results {
            owned: Vec::new(),
            shared: Vec::new(),
            ndim: vec![Vec::new(); NDIMS.len()],
        };
        for _ in 0..REPEATS {
            let output = std::process::Command::new(&exe)
                .env(CHILD, "1")
                .output()
                .expect("start a paired-timing process");
            assert!(
                output.status.success(),
                "paired-timing process failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let json: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("a paired-timing repeat as JSON");
            let floats = |v: &serde_json::Value| -> Vec<f64> {
                v.as_array()
                    .expect("an array")
                    .iter()
                    .map(|x| x.as_f64().expect("a number"))
                    .collect()
            };
            let mut repeats = json
                .as_array()
                .expect("one entry per comparison")
                .iter()
                .map(|r| Repeat {
                    ns: floats(&r["ns"]),
                    ratio: floats(&r["ratio"]),
                });
            results.owned.push(repeats.next().expect("owned"));
            results.shared.push(repeats.next().expect("shared"));
            for comparison in &mut results.ndim {
                comparison.push(repeats.next().expect("one entry per rank"));
            }
        }
        results
    }
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

/// The ratio of ours to contender `side` over the repeats of a paired comparison.
fn spread(comparison: &paired::Comparison, side: usize) -> Spread {
    let mut ratios: Vec<f64> = comparison.iter().map(|r| r.ratio[side]).collect();
    ratios.sort_by(f64::total_cmp);
    Spread {
        median: ratios[ratios.len() / 2],
        worst: ratios[ratios.len() - 1],
    }
}

fn show(s: &Spread) -> String {
    format!("{:.2}x ({:.2}x)", s.median, s.worst)
}

/// Met only when the worst repeat meets the target.
fn verdict(s: &Spread, target: f64) -> &'static str {
    if s.worst <= target {
        "met"
    } else {
        "**missed**"
    }
}

/// Prints the tables of `BENCHMARKS.md` from this run: the targeted ratios from the paired
/// timings (median and, in parentheses, the worst of the repeats), the rest from criterion's
/// medians (one measurement each).
fn report(out: &Path, since: SystemTime, paired: &paired::Results) {
    let m = |path: String| median(out, &path, since);
    let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    println!(
        "\n## Ratios from this run: paired timings, median of {REPEATS} repeats (worst in parentheses)\n"
    );

    println!("### Round trip (export, import, read first element, drop)\n");
    println!("| tensor | ours / dlpark | target <= 0.80x | ours / floor | target <= 1.30x |");
    println!("|---|---|---|---|---|");
    for (name, comparison) in [
        ("owned `Vec`, [2, 3]", &paired.owned),
        ("shared `Arc<Vec>`, [2, 3]", &paired.shared),
    ] {
        let (rd, rf) = (spread(comparison, 1), spread(comparison, 2));
        println!(
            "| {name} | {} | {} | {} | {} |",
            show(&rd),
            verdict(&rd, 0.8),
            show(&rf),
            verdict(&rf, 1.3)
        );
    }
    println!("\nTimes per round trip (ns, median over the rounds of each paired repeat):\n");
    println!(
        "| repeat | owned: ours | dlpark (faster of fixed, dynamic) | floor | shared: ours | dlpark | floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (r, (o, s)) in paired.owned.iter().zip(&paired.shared).enumerate() {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r + 1,
            o.ns[0],
            o.ns[1],
            o.ns[2],
            s.ns[0],
            s.ns[1],
            s.ns[2],
        );
    }
    let ns = |x: Option<f64>| x.map_or("n/a".to_owned(), |v| format!("{v:.1}"));
    let owned = |who: &str| m(format!("round_trip_owned/{who}"));
    let shared = |who: &str| m(format!("round_trip_shared/{who}"));
    let dlpark_owned = match (owned("dlpark_fixed"), owned("dlpark_dynamic")) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    println!("\nThe same round trips measured by criterion, one after the other (ns, median):\n");
    println!("| owned: ours | dlpark | floor | shared: ours | dlpark | floor |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} |",
        ns(owned("ours")),
        ns(dlpark_owned),
        ns(owned("floor")),
        ns(shared("ours")),
        ns(shared("dlpark")),
        ns(shared("floor")),
    );

    println!("\n### Cost against ndim (shared, shape [6, 1, ..., 1])\n");
    println!(
        "| ndim | ours / dlpark | target <= 0.90x | ours / floor | ours (ns) | dlpark (ns) | floor (ns) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (n, comparison) in NDIMS.iter().zip(&paired.ndim) {
        let (rd, rf) = (spread(comparison, 1), spread(comparison, 2));
        let ns_of = |side: usize| {
            let mut v: Vec<f64> = comparison.iter().map(|r| r.ns[side]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "| {n} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            show(&rd),
            verdict(&rd, 0.9),
            show(&rf),
            ns_of(0),
            ns_of(1),
            ns_of(2),
        );
    }

    println!("\n### Export + drop only (shared, [2, 3]; criterion, one measurement)\n");
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
        "\n### Pieces (shared, [2, 3]; criterion, one measurement), as a share of ours' shared round trip\n"
    );
    println!("| piece | share |");
    println!("|---|---|");
    let rt = m("round_trip_shared/ours".into());
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

    println!("\n### Cost against element count (shared, 1-D; criterion, one measurement)\n");
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
