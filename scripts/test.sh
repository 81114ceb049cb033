#!/usr/bin/env bash
# Runs every test: formatting, clippy, and the test suites with and without the `python` and
# `cuda` features (the Python interop tests use NumPy from ./.venv, created on the first run; the
# CUDA tests run on the CUDA simulator, crate cuda-sim, and once more without any driver).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy (default features, all features, then each of cuda and python alone)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features cuda --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features python --locked -- -D warnings
echo "==> cargo test (default features)"
cargo test --workspace --locked
echo "==> CUDA simulator: build it"
sim="$(./scripts/cuda-sim.sh)"
echo "==> cargo test (all features: python, cuda) with the CUDA simulator as the driver"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" DLPACK_TESTS_EXPECT_DRIVER=present \
    cargo test --workspace --all-features --locked
echo "==> the CUDA suites again, with every stream operation of the simulator delayed by 200 us"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" DLPACK_TESTS_EXPECT_DRIVER=present CUDA_SIM_OP_DELAY_US=200 \
    cargo test --locked -p dlpack-tests --all-features --test cuda --test cuda_checker --test cuda_driver
echo "==> cargo test (cuda, python) without a CUDA driver: the no-driver paths"
DLPACK_TESTS_EXPECT_DRIVER=absent \
    cargo test --locked -p dlpack-runtime -p dlpack-tests --features dlpack-tests/cuda,dlpack-tests/python \
        --lib --test cuda --test exchange --test python_protocol \
        -- cuda::tests:: without_a_driver_exports copies_of_cuda_memory_need_the_driver \
        c_exchange_api_of_cuda_memory
echo "==> example extension module (feature cuda): maturin develop into .venv, then pytest"
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --features cuda --manifest-path examples/python-ext/Cargo.toml
.venv/bin/python -m pytest -q examples/python-ext/tests
echo "==> the extension's CUDA functions from Python, on the CUDA simulator"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_cuda_numpy.py
echo "==> leak and memory-error check: Rust-only tests under valgrind"
if command -v valgrind >/dev/null 2>&1; then
    PROPTEST_CASES=256 \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect" \
        cargo test --locked -p dlpack-runtime --lib -p dlpack-tests --test exchange --test properties --test derive_roles
else
    echo "SKIPPED: valgrind is not installed, so the leak check did not run (apt-get install valgrind)"
fi
echo "==> cargo test (no default features)"
cargo test -p dlpack-runtime --no-default-features --locked --lib
