//! The borrow registry's cost: one acquire + release pair of an exclusive borrow of a small
//! buffer while N other borrows (of disjoint small buffers) are live, on one thread, and from 4
//! threads at once at 20,000 live borrows. Prints nanoseconds per pair, the worst of 3
//! repeats. `cargo bench -p dlpack-bench --bench borrows`.

use std::hint::black_box;
use std::time::Instant;

use dlpack_runtime::__testing::borrow;

/// Where the live borrows' buffers start; each takes `SLOT` bytes, of which it borrows
/// `BORROWED`. The measured pairs borrow the bytes in between.
const BASE: usize = 0x1000_0000;
const SLOT: usize = 64;
const BORROWED: i64 = 8; // elements of 4 bytes
/// Owners of the live borrows count up from here; those of measured pairs from `PAIR_OWNERS`.
const LIVE_OWNERS: usize = 0x4000_0000;
const PAIR_OWNERS: usize = 0x8000_0000;
const REPEATS: usize = 3;

fn hold(live: usize) {
    for i in 0..live {
        let granted = borrow::acquire(LIVE_OWNERS + i, BASE + i * SLOT, &[BORROWED], &[4], 4, true);
        assert!(granted, "live borrows are disjoint");
    }
}

fn drop_all(live: usize) {
    for i in 0..live {
        borrow::release(LIVE_OWNERS + i);
    }
}

/// Nanoseconds per pair of `pairs` acquire + release pairs, owners from `owner`, each over
/// 8 bytes (lane `lane`) of the gap after a live buffer, spread over `live` slots.
fn pairs(owner: usize, live: usize, pairs: usize, lane: usize) -> f64 {
    let slots = live.max(1);
    let start = Instant::now();
    for n in 0..pairs {
        let slot = (n * 7919) % slots;
        let first = BASE + slot * SLOT + 32 + lane * 8;
        let granted = borrow::acquire(black_box(owner + n), first, &[2], &[4], 4, true);
        assert!(granted, "the gap is free");
        borrow::release(owner + n);
    }
    start.elapsed().as_nanos() as f64 / pairs as f64
}

fn main() {
    // `cargo bench` passes `--bench`; a filter of other benchmarks' names is ignored.
    println!("borrow registry: ns per acquire + release pair, worst of {REPEATS}");
    for live in [0usize, 100, 20_000, 200_000] {
        hold(live);
        let n = if live >= 200_000 { 200 } else { 20_000 };
        let n = if live >= 20_000 && cfg!(debug_assertions) {
            20
        } else {
            n
        };
        pairs(PAIR_OWNERS, live, n.min(100), 0); // warm up
        let worst = (0..REPEATS)
            .map(|_| pairs(PAIR_OWNERS, live, n, 0))
            .fold(0.0, f64::max);
        println!("  1 thread,  {live:>7} live: {worst:>10.0} ns");
        drop_all(live);
    }
    let live = 20_000;
    hold(live);
    let n = 2_000;
    let worst = (0..REPEATS)
        .map(|_| {
            std::thread::scope(|scope| {
                let threads: Vec<_> = (0..4)
                    .map(|t| scope.spawn(move || pairs(PAIR_OWNERS + t * 0x100_0000, live, n, t)))
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().expect("no panic"))
                    .fold(0.0, f64::max)
            })
        })
        .fold(0.0, f64::max);
    println!("  4 threads, {live:>7} live: {worst:>10.0} ns (per pair, per thread)");
    drop_all(live);
}
