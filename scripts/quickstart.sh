#!/usr/bin/env bash
# Runs the quick start: sets up ./.venv with NumPy (first run only), then builds and runs
# examples/quickstart against it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo run --quiet -p dlpack-examples --example quickstart --features python
