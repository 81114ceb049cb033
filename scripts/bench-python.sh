#!/usr/bin/env bash
# Python per-call benchmarks: builds the example extension in release mode into ./.venv and
# times our producer and consumer against NumPy's own, the C exchange API against `__dlpack__`,
# and reading an argument against rust-numpy's (see examples/python-ext/bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --release --manifest-path examples/python-ext/Cargo.toml
# The test peer built on rust-numpy, for the pairs that read an argument on both sides.
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --release --manifest-path tests/python-peer/Cargo.toml
# A current NumPy runs slower with the OpenBLAS settings of some machines; they do not affect
# these calls, which never reach BLAS, but unset them for a like-for-like run. One BLAS thread:
# idle OpenBLAS threads spin, and take a core from the timed calls on small machines.
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
    .venv/bin/python examples/python-ext/bench.py
