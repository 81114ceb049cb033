#!/usr/bin/env bash
# Runs every test: formatting, clippy, and the test suites with and without the `python`
# feature (the Python interop tests use NumPy from ./.venv, created on the first run).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy (default features, then all features)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
echo "==> cargo test (default features)"
cargo test --workspace --locked
echo "==> cargo test (all features: python)"
cargo test --workspace --all-features --locked
echo "==> cargo test (no default features)"
cargo test -p dlpack-runtime --no-default-features --locked --lib
