#!/usr/bin/env bash
# Runs every test: formatting, clippy, rustdoc, and the test suites with and without the `python`
# and `cuda` features (the Python interop tests use NumPy from ./.venv, created on the first run;
# the CUDA tests run on the CUDA simulator, crate cuda-sim, and once more without any driver), the
# packages of the published crates (each built from its own packaged sources, and tested from a
# local registry by a crate outside the repository), then the memory checks (valgrind, Miri) and
# a build on the declared minimum Rust version. The Miri and MSRV toolchains are installed with
# rustup; where that is impossible those steps are skipped with a message, as the valgrind step
# is without valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# The workspace's dev profile keeps line tables only (Cargo.toml); the fixtures outside the
# workspace build into the same target directory, so they get the same setting and reuse its builds.
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

echo "==> cargo fmt --check"
cargo fmt --all --check
cargo fmt --check --manifest-path tests/fixtures/kit-user/Cargo.toml
cargo fmt --check --manifest-path examples/python-ext/Cargo.toml
cargo fmt --check --manifest-path tests/python-peer/Cargo.toml
rustfmt --check --edition 2024 tests/fixtures/kit-packaged/tests/registry.rs
echo "==> cargo clippy (default features, all features, each of cuda, hip, python, burn and burn-cuda alone, python on abi3)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features cuda --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features hip --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features python --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features burn --locked -- -D warnings
cargo clippy -p dlpack-runtime --all-targets --features burn-cuda --locked -- -D warnings
# The limited API before 3.12 has no vectorcall: `from_dlpack` then calls with a keyword dict.
CARGO_TARGET_DIR=target/abi3 \
    cargo clippy -p dlpack-runtime --lib --features python,pyo3/abi3-py311 --locked -- -D warnings
# Free-threaded CPython (`Py_GIL_DISABLED`), configured by a pyo3 config file: no such interpreter needed.
for features in python python,hip; do
    PYO3_CONFIG_FILE="$PWD/scripts/pyo3-free-threaded.cfg" CARGO_TARGET_DIR=target/free-threaded \
        cargo clippy -p dlpack-runtime --lib --features "$features" --locked -- -D warnings
done
# With a free-threaded interpreter on PATH, one capsule consumed by 8 threads runs without the GIL
# (the test runs as a script, so the interpreter needs neither pytest nor NumPy; no downloads).
ft_python="$(command -v python3.14t || command -v python3.13t || true)"
if [ -z "$ft_python" ]; then
    echo "free-threaded pytest leg: skipped (no python3.14t on PATH)"
else
    ft_venv="$PWD/target/free-threaded-ext/venv"
    [ -x "$ft_venv/bin/python" ] || "$ft_python" -m venv "$ft_venv"
    CARGO_TARGET_DIR=target/free-threaded-ext timeout 1800 .venv/bin/maturin build --quiet --release \
        --features cuda,hip -i "$ft_venv/bin/python" -o target/free-threaded-ext/wheels \
        --manifest-path examples/python-ext/Cargo.toml
    env -u PYTHONPATH "$ft_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-index --no-deps --force-reinstall --find-links target/free-threaded-ext/wheels dlpack-example
    env -u PYTHONPATH timeout 300 "$ft_venv/bin/python" examples/python-ext/tests/test_free_threaded.py
fi
echo "==> cargo doc (all features, library crates) with rustdoc warnings as errors"
# docs.rs builds with all features ([package.metadata.docs.rs]) and no extra rustdoc flags.
RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" \
    cargo doc --workspace --lib --no-deps --all-features --locked
echo "==> cargo test (default features)"
cargo test --workspace --locked
echo "==> CUDA simulator: build it"
sim="$(./scripts/cuda-sim.sh)"
echo "==> cargo test (all features: python, cuda) with the CUDA simulator as the driver"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" DLPACK_TESTS_EXPECT_DRIVER=present \
    cargo test --workspace --all-features --locked
echo "==> the CUDA suites again, with every stream operation of the simulator delayed by 200 us"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" DLPACK_TESTS_EXPECT_DRIVER=present CUDA_SIM_OP_DELAY_US=200 \
    cargo test --locked -p dlpack-tests --all-features --test cuda --test cuda_checker --test cuda_sim_graphs --test cuda_sim_kernels --test cuda_sim_lifetimes --test cuda_driver --test cuda_multi_device --test burn_cuda
echo "==> the hand-off suite on both faces of the simulator (CUDA and HIP), delayed too: every shared case on each face, and each negative control's race"
# Each case is written once (tests/tests/handoff.rs) and runs as cuda::NAME and hip::NAME; the
# list must pair them. With --nocapture each negative control prints the violations it saw.
handoff_list="$(cargo test --locked -p dlpack-tests --all-features --test handoff -- --list 2>/dev/null)"
.venv/bin/python - "$handoff_list" <<'PY'
import sys
names = [line.split(": test")[0] for line in sys.argv[1].splitlines() if line.endswith(": test")]
cuda = {n.split("::", 1)[1] for n in names if n.startswith("cuda::")}
hip = {n.split("::", 1)[1] for n in names if n.startswith("hip::")}
missing = sorted(cuda - hip)
print(f"handoff: {len(cuda)} shared cases on the CUDA face, {len(cuda & hip)} of them on the HIP face, {len(hip - cuda)} more on the HIP face only")
sys.exit(f"cases of the CUDA face missing on the HIP face: {missing}" if missing or not cuda else 0)
PY
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" DLPACK_TESTS_EXPECT_DRIVER=present CUDA_SIM_OP_DELAY_US=200 timeout 600 \
    cargo test --locked -p dlpack-tests --all-features --test handoff -- --nocapture 2>&1 | grep -E "^negative control|^test result|FAILED|panicked"
echo "==> host tensors with feature cuda leave the CUDA driver alone: not loaded, no call counted by the simulator, and a forked child can use CUDA"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 \
    cargo test --locked -p dlpack-tests --all-features --test cuda_host_paths --test cuda_sim_fork -- --nocapture
echo "==> a crate outside the workspace tests its CUDA exports with cuda-sim-testing (plain cargo test)"
# tests/fixtures/kit-user depends on the kit as a user's crate would; no library path is set, the
# kit loads the simulator itself. The workspace's target directory keeps the build short.
(cd tests/fixtures/kit-user && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../../../target}" \
    cargo test --locked)
echo "==> a shared library (an extension module, say) with cuda-sim-testing as a dependency keeps its own SONAME and reaches the simulator"
# tests/fixtures/kit-cdylib: its test reads the library's SONAME (not the simulator's
# libcuda.so.1), then loads it by path and calls cuInit through the kit.
(cd tests/fixtures/kit-cdylib && cargo fmt --check && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../../../target}" \
    timeout 600 cargo test --locked)
echo "==> packaging: each published crate (dlpack-derive, dlpack-runtime, cuda-sim, cuda-sim-testing) built from its own packaged sources (cargo package)"
# Every member without `publish = false`; a path-only dependency or a file outside a package
# fails here. The packages land in target/package for the next step.
timeout 600 ./scripts/packaged-crates.sh package
echo "==> the packaged crates from a registry: a crate outside the repository runs its ordering test with cuda-sim-testing (plain cargo test)"
# tests/fixtures/kit-packaged (kit-user's sources, the crates by version) in a temporary
# directory, with the packages of the step above served in crates.io's place for them.
timeout 600 ./scripts/packaged-crates.sh kit
echo "==> the quick start's CUDA step (examples/cuda_handoff): the kit loads the simulator itself"
timeout 300 cargo run --quiet --locked -p dlpack-examples --example cuda_handoff --features cuda
echo "==> cargo test (cuda, hip, python) without a CUDA driver nor libamdhip64: the no-driver paths"
DLPACK_TESTS_EXPECT_DRIVER=absent \
    cargo test --locked -p dlpack-runtime -p dlpack-tests --features dlpack-tests/cuda,dlpack-tests/hip,dlpack-tests/python \
        --lib --test cuda --test exchange --test python_protocol --test handoff \
        -- cuda::tests:: without_a_driver_exports copies_of_cuda_memory_need_the_driver \
        c_exchange_api_of_cuda_memory a_host_copy_of_cuda_memory without_libamdhip64
echo "==> example extension module (features cuda and hip, release) and its borrow peer: maturin develop into .venv, then pytest"
# Release builds: the borrow tests (tests/test_borrows.py) call functions that a release build
# would miscompile if two imports of one array could both hand out `&mut [f32]`. The peer is a
# second extension module with its own copy of dlpack-runtime (one borrow registry per process).
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --release --features cuda,hip --manifest-path examples/python-ext/Cargo.toml
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --release --manifest-path tests/python-peer/Cargo.toml
timeout 900 .venv/bin/python -m pytest -q examples/python-ext/tests --ignore=examples/python-ext/tests/test_torch.py
# mpi4py and MPICH's wheel: our tensors through Send/Recv, Isend/Irecv, Bcast, Allreduce on 2 ranks.
./scripts/mpi-test.sh
echo "==> PyTorch interop: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
timeout 300 .venv/bin/python -m pytest -q examples/python-ext/tests/test_torch.py
echo "==> the candle example: candle tensors to and from NumPy"
cargo run --quiet --locked -p dlpack-examples --example candle --features python,candle
echo "==> the extension's CUDA functions from Python, on the CUDA simulator"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_cuda_numpy.py
echo "==> the extension's ROCm functions from Python, on the simulator's HIP face (libamdhip64.so in the same directory)"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_rocm.py
echo "==> copies across CUDA devices from Python, on the CUDA simulator with two devices and with four"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_multi_gpu.py
CUDA_SIM_DEVICES=4 LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_multi_gpu.py
echo "==> the CUDA Array Interface both ways from Python, on the CUDA simulator"
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_cuda_array_interface.py
echo "==> the example extension as an abi3 wheel (pyo3/abi3-py311, as most published extensions ship): the same suites"
# The GIL tests (host waits with a Python thread releasing the producer), the borrow conflicts,
# several threads at once and the deleter counts, against the limited-API build, which learns
# whether a thread is attached otherwise than the full-API build (`abi::gil`). Installed over
# the full-API build, which no later step uses.
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --quiet --release --features cuda,hip,abi3 --manifest-path examples/python-ext/Cargo.toml
.venv/bin/python -c 'import sys, dlpack_example.dlpack_example as m; print(m.__file__); sys.exit(0 if ".abi3." in m.__file__ else "the installed extension is not the abi3 build")'
timeout 900 .venv/bin/python -m pytest -q examples/python-ext/tests --ignore=examples/python-ext/tests/test_torch.py
LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q examples/python-ext/gpu_tests/test_cuda_numpy.py \
    examples/python-ext/gpu_tests/test_rocm.py
# The same GIL, thread and deleter tests with the fallback an abi3 wheel takes where the
# interpreter's PyGILState_Check cannot be looked up (Windows; PyPy): the entry points' marks.
DLPACK_RUNTIME_ATTACHED_QUERY=marks LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" timeout 600 .venv/bin/python -m pytest -q \
    examples/python-ext/gpu_tests/test_cuda_numpy.py examples/python-ext/tests/test_free_threaded.py \
    examples/python-ext/tests/test_consumer_styles.py examples/python-ext/tests/test_finalization.py
echo "==> leak and memory-error check: Rust-only tests under valgrind"
# Left out: the_index_decides_as_a_scan_of_every_borrow, the borrow registry's comparison with a
# scan (safe code, hundreds of operations a case: about ten minutes under valgrind at 256 cases);
# it runs in the plain test runs and under Miri.
if command -v valgrind >/dev/null 2>&1; then
    PROPTEST_CASES=256 \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect" \
        cargo test --locked -p dlpack-runtime --lib -p dlpack-tests --test exchange --test properties --test derive_roles --test imported_data_edges --test borrows --test borrow_at_import --test borrow_guards \
            -- --skip the_index_decides_as_a_scan_of_every_borrow
else
    echo "SKIPPED: valgrind is not installed, so the leak check did not run (apt-get install valgrind)"
fi
echo "==> undefined-behaviour check: the unsafe code's Rust-only tests under Miri"
# A dated nightly, so that a new Miri cannot turn the test command red on its own; override with
# MIRI_TOOLCHAIN=nightly. Left out: i64_span_agrees_with_exact_span (an exhaustive loop) and
# huge_broadcasts_give_errors_not_aborts (a deliberately huge allocation); `--skip` matches
# substrings of test names, and each of these matches only its own test.
miri_toolchain="${MIRI_TOOLCHAIN:-nightly-2026-10-30}"
if ! command -v rustup >/dev/null 2>&1; then
    echo "miri: skipped (rustup is not installed, so the $miri_toolchain toolchain cannot be installed)"
elif ! rustup toolchain install "$miri_toolchain" --profile minimal --component miri,rust-src; then
    echo "miri: skipped (rustup could not install $miri_toolchain with the miri and rust-src components)"
else
    PROPTEST_CASES=4 MIRIFLAGS="${MIRIFLAGS:+$MIRIFLAGS }-Zmiri-disable-isolation" \
        cargo +"$miri_toolchain" miri test --locked -p dlpack-runtime --lib \
            -p dlpack-tests --test exchange --test derive_roles --test ndarray_views --test properties --test imported_data_edges --test borrows --test borrow_at_import --test borrow_guards \
            -- --skip i64_span_agrees_with_exact_span --skip huge_broadcasts_give_errors_not_aborts
fi
echo "==> cargo test (no default features)"
cargo test -p dlpack-runtime --no-default-features --locked --lib
echo "==> a target without the x86-64 vector code: dlpack-runtime checked for aarch64"
# The host copies have an x86-64 path (SSE2 transposes) and a portable one; this keeps the
# portable one compiling and lint-clean. Checked, not run: no aarch64 machine here.
if ! command -v rustup >/dev/null 2>&1; then
    echo "aarch64 check: skipped (rustup is not installed, so the aarch64 standard library cannot be installed)"
elif ! rustup target add aarch64-unknown-linux-gnu; then
    echo "aarch64 check: skipped (rustup could not install the aarch64-unknown-linux-gnu target)"
else
    cargo clippy --locked --target aarch64-unknown-linux-gnu -p dlpack-runtime --no-default-features --lib -- -D warnings
fi
echo "==> MSRV: dlpack-runtime and dlpack-derive on their declared rust-version; cuda, cuda-sim and cuda-sim-testing on 1.88, burn and burn-cuda on 1.92, candle on 1.94"
msrv="$(cargo metadata --no-deps --format-version 1 --locked | .venv/bin/python -c '
import json, sys
versions = {p["rust_version"] for p in json.load(sys.stdin)["packages"]
            if p["name"] in ("dlpack-runtime", "dlpack-derive")}
if len(versions) != 1:
    sys.exit(f"dlpack-runtime and dlpack-derive declare different rust-versions: {sorted(map(str, versions))}")
v = versions.pop()
print(v + ".0" * (2 - v.count(".")))  # "1.85" means 1.85.0
')"
if ! command -v rustup >/dev/null 2>&1; then
    echo "msrv: skipped (rustup is not installed, so Rust $msrv cannot be installed)"
elif ! rustup toolchain install "$msrv" --profile minimal; then
    echo "msrv: skipped (rustup could not install Rust $msrv)"
else
    cargo +"$msrv" check --locked -p dlpack-runtime -p dlpack-derive \
        --features dlpack-runtime/python,dlpack-runtime/half,dlpack-runtime/num-complex,dlpack-runtime/ndarray,dlpack-runtime/float8
fi
# Some features need more than the crate's declared rust-version: `cuda` needs Rust 1.88
# (cudarc 0.19 and its libloading 0.9 require it), `candle` needs Rust 1.94 (candle-core 0.11
# uses intrinsics made safe in 1.94), `burn` and `burn-cuda` need Rust 1.92 (the rust-version
# of burn 0.21 and cubecl 0.10). cuda-sim and cuda-sim-testing, on cudarc, declare 1.88.
# `burn-cuda` (cubecl and its kernels, about two minutes of checking on two cores) is checked
# on 1.92 only: the 1.94 leg names every other feature instead of `--all-features`.
all_but_candle=dlpack-runtime/python,dlpack-runtime/half,dlpack-runtime/num-complex,dlpack-runtime/ndarray,dlpack-runtime/float8,dlpack-runtime/cuda,dlpack-runtime/hip
for pair in "1.88.0 -p cuda-sim -p cuda-sim-testing --features $all_but_candle" "1.92.0 --features dlpack-runtime/burn,dlpack-runtime/burn-cuda,dlpack-runtime/python" "1.94.0 --features $all_but_candle,dlpack-runtime/burn,dlpack-runtime/candle"; do
    version="${pair%% *}"
    features="${pair#* }"
    if ! command -v rustup >/dev/null 2>&1; then
        echo "msrv ($features): skipped (rustup is not installed, so Rust $version cannot be installed)"
    elif ! rustup toolchain install "$version" --profile minimal; then
        echo "msrv ($features): skipped (rustup could not install Rust $version)"
    else
        # shellcheck disable=SC2086
        cargo +"$version" check --locked -p dlpack-runtime -p dlpack-derive $features
    fi
done
