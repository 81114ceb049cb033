#!/usr/bin/env bash
# Runs the quick start: sets up ./.venv with NumPy (first run only), then builds and runs
# examples/quickstart against it, and examples/cuda_handoff, the stream-ordered CUDA hand-off
# (on the CUDA simulator, which cargo builds, where no CUDA driver is installed; on the GPU
# where one is).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo run --quiet -p dlpack-examples --example quickstart --features python
cargo run --quiet -p dlpack-examples --example cuda_handoff --features cuda
