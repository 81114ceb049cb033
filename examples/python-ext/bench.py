"""Per-call cost of the Python protocol, side by side in one run (not a test).

Run: `./scripts/bench-python.sh` (builds the extension in release mode first). Prints the
median time per call of each pair, their ratio and its target: at most 1.5x NumPy for our
producer and our consumer, and below 1.0 for the C exchange API against the `__dlpack__`
capsule path.
"""

import statistics
import sys
import timeit

import numpy as np

import dlpack_example as de

N = 20_000
REPEAT = 15


def per_call(stmt):
    times = timeit.repeat(stmt, number=N, repeat=REPEAT)
    return statistics.median(times) / N * 1e9  # ns per call


def main():
    t = de.Tensor.arange(64, 64)
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    # (name, ours, theirs, target ratio)
    pairs = [
        (
            "np.from_dlpack(rust Tensor) vs np.from_dlpack(ndarray)",
            lambda: np.from_dlpack(t),
            lambda: np.from_dlpack(a),
            1.5,
        ),
        (
            "de.consume(ndarray) vs np.from_dlpack(ndarray)",
            lambda: de.consume(a),
            lambda: np.from_dlpack(a),
            1.5,
        ),
        (
            "de.consume(rust Tensor): C exchange API vs __dlpack__ capsule",
            lambda: de.consume(t),
            lambda: de.consume(t.__dlpack__(max_version=(1, 3))),
            1.0,
        ),
    ]
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}; median of {REPEAT} x {N} calls")
    print(f"{'pair':64} {'ours ns':>9} {'theirs ns':>10} {'ratio':>6} {'target':>7}")
    for name, ours, theirs, target in pairs:
        o, r = per_call(ours), per_call(theirs)
        ratio = o / r
        verdict = "met" if (ratio <= target if target > 1 else ratio < target) else "missed"
        print(f"{name:64} {o:9.0f} {r:10.0f} {ratio:6.2f} {'<=' if target > 1 else '<'}{target:.1f} {verdict}")


if __name__ == "__main__":
    main()
