#!/usr/bin/env bash
# The GPU suite, in two steps, because the GPU machine has no Rust toolchain and no network:
#
#   scripts/gpu-suite.sh build   here: builds the CUDA tests (one self-contained binary; libcuda
#                                is loaded at run time) and the example extension module (abi3,
#                                feature `cuda`) into gpu-bundle/, which git ignores and the
#                                device tool carries
#   scripts/gpu-suite.sh run     on the GPU machine: runs both and writes gpu-suite.log to $OUT
#
# What runs: tests/tests/cuda.rs with --include-ignored (cross-stream race without and with the
# event dependency over 100 trials, host time of an export with >= 50 ms pending, no event
# created per exchange after warm-up, stream-ordered release, ready events, copy=True on the
# consumer's stream and dl_device=(CPU, 0) copies of strided views, stream device checks,
# refusals), then examples/python-ext/gpu_tests (PyTorch and CuPy both ways with their current
# streams, copies for NumPy, PyTorch and CuPy, the C exchange API consumed from torch).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    source scripts/env.sh
    rm -rf gpu-bundle
    mkdir -p gpu-bundle
    cargo test --locked --release -p dlpack-tests --features cuda --test cuda --no-run --message-format=json \
        | .venv/bin/python -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda":
        print(m["executable"])' > gpu-bundle/.bin
    cp "$(cat gpu-bundle/.bin)" gpu-bundle/cuda-tests
    strip gpu-bundle/cuda-tests
    VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin build --quiet --release --features cuda \
        --manifest-path examples/python-ext/Cargo.toml --out gpu-bundle/wheel
    .venv/bin/python -m zipfile -e gpu-bundle/wheel/*.whl gpu-bundle/site
    cp examples/python-ext/gpu_tests/test_gpu.py gpu-bundle/
    du -sh gpu-bundle
    ;;
run)
    log="${OUT:-/tmp}/gpu-suite.log"
    # Both halves run even if the first fails; the exit status is that of the first failure.
    status=0
    {
        nvidia-smi -L || true
        ./gpu-bundle/cuda-tests --include-ignored --test-threads=1 --nocapture || status=$?
        PYTHONPATH="$PWD/gpu-bundle/site" PYTHONUNBUFFERED=1 python3 -m pytest -q -s gpu-bundle/test_gpu.py \
            || [ "$status" -ne 0 ] || status=$?
        echo "gpu-suite: exit status $status"
        exit "$status"
    } 2>&1 | tee "$log"
    ;;
*)
    echo "usage: scripts/gpu-suite.sh build|run" >&2
    exit 2
    ;;
esac
