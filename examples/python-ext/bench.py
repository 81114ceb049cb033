"""Per-call cost of the Python protocol and of host copies, side by side in one run (not a
test).

Run: `./scripts/bench-python.sh` (builds the extension in release mode first). Each pair is
measured REPEATS times; within a repeat its two sides are timed alternately, and the ratio of
the repeat is the median of the ratios of adjacent timings (ours / theirs). The report gives the
median and the worst of the repeats' ratios, and a target counts as met only when the worst
repeat meets it.
"""

import statistics
import sys
import timeit

import numpy as np
import torch

import dlpack_example as de

try:
    # The test peer built on rust-numpy (tests/python-peer): what a NumPy argument costs there.
    import dlpack_borrow_peer as peer
except ImportError:
    peer = None

REPEATS = 3
SIDE = 1024


def paired(ours, theirs, number, repeat):
    """`repeat` timings of `number` calls of each side, alternating which goes first; returns
    each side's median time per call (ns) and the median of the ratios of adjacent timings,
    which slow drifts in machine speed affect least."""
    timer_ours = timeit.Timer(ours)
    timer_theirs = timeit.Timer(theirs)
    o_times, r_times, ratios = [], [], []
    for i in range(repeat):
        if i % 2:
            r = timer_theirs.timeit(number)
            o = timer_ours.timeit(number)
        else:
            o = timer_ours.timeit(number)
            r = timer_theirs.timeit(number)
        o_times.append(o / number * 1e9)
        r_times.append(r / number * 1e9)
        ratios.append(o / r)
    return statistics.median(o_times), statistics.median(r_times), statistics.median(ratios)


def main():
    t = de.Tensor.arange(64, 64)
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    tt = torch.ones(4, dtype=torch.float64)
    small = de.Tensor.arange(4)
    matrix = de.Strided(SIDE, SIDE, "c")
    views = {layout: matrix.view(layout) for layout in ("c", "t", "reversed")}
    # Both sides of a copy read the same bytes: our views share `matrix`'s values, and NumPy's
    # side is a zero-copy ndarray of them. Two buffers of the same size need not copy at the
    # same speed: on one machine NumPy copied one 4 MiB array 5-20% slower than another, in
    # every process, which would be charged to one side.
    big = np.from_dlpack(matrix)
    # (calls per timing, timings of each side). Short timings, alternated, see the same machine:
    # on shared machines speed drifts within seconds.
    call = (500, 201)  # per-call pairs
    copy = (2, 41)  # 4 MiB copies
    # (name, ours, theirs, target, how many)
    pairs = [
        (
            "np.from_dlpack(our Tensor) / np.from_dlpack(ndarray)",
            lambda: np.from_dlpack(t),
            lambda: np.from_dlpack(a),
            1.2,
            call,
        ),
        (
            "de.consume(ndarray) / np.from_dlpack(ndarray)",
            lambda: de.consume(a),
            lambda: np.from_dlpack(a),
            1.0,
            call,
        ),
        (
            "de.consume(our Tensor): C exchange API / __dlpack__ capsule",
            lambda: de.consume(t),
            lambda: de.consume(t.__dlpack__(max_version=(1, 3))),
            0.5,
            call,
        ),
        (
            # PyTorch's C exchange API with the checks of its __dlpack__ refusals (requires
            # grad, negative bit) beside the same import of our own type. The target is 1.1x
            # the ratio before the checks (1.50x); torch's own accessors cost more than that.
            "de.consume(torch tensor) / de.consume(our Tensor): both C exchange API",
            lambda: de.consume(tt),
            lambda: de.consume(small),
            1.65,
            call,
        ),
        (
            "copy=True, compact 1024x1024 f32 / ndarray.copy()",
            lambda: np.from_dlpack(views["c"], copy=True),
            lambda: big.copy(),
            1.1,
            copy,
        ),
        (
            "copy=True, columns reversed / np.ascontiguousarray(a[:, ::-1])",
            lambda: np.from_dlpack(views["reversed"], copy=True),
            lambda: np.ascontiguousarray(big[:, ::-1]),
            1.0,
            copy,
        ),
        (
            "copy=True, transposed / np.ascontiguousarray(a.T)",
            lambda: np.from_dlpack(views["t"], copy=True),
            lambda: np.ascontiguousarray(big.T),
            0.3,
            copy,
        ),
    ]
    if peer is not None:
        # Reading a small array argument, borrow-checked on both sides: our derived consumer
        # (import, borrow in this crate's registry and, for NumPy memory, rust-numpy's) against
        # rust-numpy's `PyReadonlyArray1<f32>` (its registry only). The peer's first borrow
        # publishes rust-numpy's registry, so our side mirrors its borrows there, as it does
        # in a process that uses both.
        x64 = np.arange(6, dtype=np.float64)
        x32 = np.arange(6, dtype=np.float32)
        t64 = torch.arange(6, dtype=torch.float64)
        peer.readonly_sum(x32)
        pairs += [
            (
                "de.total(ndarray f64, 6) / peer.readonly_sum(ndarray f32, 6): read an argument",
                lambda: de.total(x64),
                lambda: peer.readonly_sum(x32),
                2.0,
                call,
            ),
            (
                # No rust-numpy registry for torch memory; PyTorch's exchange API costs more
                # than NumPy's `__dlpack__` (see the pair of de.consume above).
                "de.total(torch f64, 6) / peer.readonly_sum(ndarray f32, 6): read an argument",
                lambda: de.total(t64),
                lambda: peer.readonly_sum(x32),
                5.0,
                call,
            ),
        ]
    else:
        print("dlpack_borrow_peer is not installed: the pairs that read an argument are left out")
    for name, ours, theirs, _, (number, _) in pairs:
        if number == copy[0]:
            # The copies are compared element by element before they are timed.
            assert np.array_equal(ours(), theirs()), name
    for _, ours, theirs, _, (number, _) in pairs:
        # Warm-up: caches, allocator pools, the exchange API's per-type cache.
        timeit.Timer(ours).timeit(number)
        timeit.Timer(theirs).timeit(number)
    results = {name: [] for name, *_ in pairs}
    for _ in range(REPEATS):
        for name, ours, theirs, _, (number, repeat) in pairs:
            results[name].append(paired(ours, theirs, number, repeat))
    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}; {REPEATS} repeats of"
        " alternating timings"
    )
    print()
    print("| pair | ours (ns) | theirs (ns) | ratio: median (worst) | target |")
    print("|---|---|---|---|---|")
    for name, _, _, target, _ in pairs:
        ratios = sorted(ratio for _, _, ratio in results[name])
        median, worst = ratios[len(ratios) // 2], ratios[-1]
        ours_ns = statistics.median(o for o, _, _ in results[name])
        theirs_ns = statistics.median(r for _, r, _ in results[name])
        verdict = "met" if worst <= target else "**missed**"
        print(
            f"| {name} | {ours_ns:,.0f} | {theirs_ns:,.0f} | {median:.2f}x ({worst:.2f}x)"
            f" | <= {target:.1f}x: {verdict} |"
        )


if __name__ == "__main__":
    main()
