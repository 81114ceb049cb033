#!/usr/bin/env bash
# The example extension built for this interpreter (full C API) and as an abi3 wheel, timed
# side by side (see examples/python-ext/bench_abi3.py). Not part of the test command.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
out="$PWD/target/bench-abi3"
rm -rf "$out"
for build in full abi3; do
    features=""
    [ "$build" = abi3 ] && features="--features abi3"
    # shellcheck disable=SC2086
    CARGO_TARGET_DIR="$PWD/target/bench-abi3-build" VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin build --quiet --release $features \
        --manifest-path examples/python-ext/Cargo.toml --out "$out/$build-wheel"
    .venv/bin/python -m zipfile -e "$out/$build-wheel"/*.whl "$out/$build"
done
# As bench-python.sh: without the OpenBLAS settings of some machines, one BLAS thread.
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 \
    .venv/bin/python examples/python-ext/bench_abi3.py "$out/full" "$out/abi3"
