#!/usr/bin/env bash
# The GPU suite, in two steps, because the GPU machine has no Rust toolchain and no network:
#
#   scripts/gpu-suite.sh build   here: builds the CUDA tests (one self-contained binary; libcuda
#                                is loaded at run time) and the example extension module (features
#                                `abi3` and `cuda`) into gpu-bundle/, which git ignores and the
#                                device tool carries
#   scripts/gpu-suite.sh run     on the GPU machine: runs both and writes gpu-suite.log to $OUT
#
# What runs on the GPU: tests/tests/cuda.rs (the hand-off: race without and with the event
# dependency, host not blocked, no event created per exchange after warm-up, stream-ordered
# release, ready events, copy=True on the consumer's stream and dl_device=(CPU, 0) copies,
# device checks; pending work is a gate on the producer's stream, so the same assertions hold
# on hardware and on the simulator), tests/tests/cuda_driver.rs (the simulator's conformance
# suite, so the model is checked against the hardware), tests/tests/cuda_multi_device.rs (copies
# to another GPU with dl_device after the producer's pending work, host tensors copied to a GPU,
# the current context kept; on a machine with one GPU each of its tests says it is skipped, and
# the suite says how many GPUs it found), then examples/python-ext/gpu_tests (NumPy, PyTorch and
# CuPy both ways with their streams, copies, the C exchange API from torch; the CUDA Array
# Interface both ways with the extension alone, CuPy and Numba; test_multi_gpu.py across GPUs).
# Then tests/tests/burn_cuda.rs (feature `burn-cuda`): burn's CUDA backend both ways, its
# `gpu_` tests through burn's kernels (matmul, elementwise, sum, casts to and from float16 and
# bfloat16; cubecl compiles them when they first run, with NVRTC and the CUDA headers: the run
# step takes those of the nvidia wheels that PyTorch installs where the system has none), the
# other tests as on the simulator, without its checker.
# The simulator-only negative controls (tests/tests/cuda_checker.rs, cuda_sim_kernels.rs,
# cuda_sim_graphs.rs, and those of burn_cuda.rs, which say they need the simulator) do not run
# here. Nor does examples/python-ext/gpu_tests/test_rocm.py: it needs a ROCm machine
# (libamdhip64), not an NVIDIA one. There, build the extension with `--features cuda,hip` and run
# that file with pytest (values only: the checker and the negative controls are the simulator's).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    source scripts/env.sh
    rm -rf gpu-bundle
    mkdir -p gpu-bundle
    cargo test --locked --release -p dlpack-tests --features cuda --test cuda --test cuda_driver \
        --test cuda_multi_device --no-run --message-format=json \
        | .venv/bin/python -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda", "cuda_driver", "cuda_multi_device"):
        print(m["target"]["name"], m["executable"])' > gpu-bundle/.bin
    # burn's CUDA backend (cubecl): a binary of its own, so the other suites build without it.
    cargo test --locked --release -p dlpack-tests --features burn-cuda --test burn_cuda \
        --no-run --message-format=json \
        | .venv/bin/python -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "burn_cuda":
        print(m["target"]["name"], m["executable"])' >> gpu-bundle/.bin
    while read -r name exe; do
        cp "$exe" "gpu-bundle/$name-tests"
        strip "gpu-bundle/$name-tests"
    done < gpu-bundle/.bin
    VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin build --quiet --release --features cuda,abi3 \
        --manifest-path examples/python-ext/Cargo.toml --out gpu-bundle/wheel
    .venv/bin/python -m zipfile -e gpu-bundle/wheel/*.whl gpu-bundle/site
    cp examples/python-ext/gpu_tests/test_gpu.py examples/python-ext/gpu_tests/test_cuda_numpy.py \
        examples/python-ext/gpu_tests/test_cuda_array_interface.py \
        examples/python-ext/gpu_tests/test_gpu_cai.py examples/python-ext/gpu_tests/test_multi_gpu.py \
        gpu-bundle/
    du -sh gpu-bundle
    ;;
run)
    log="${OUT:-/tmp}/gpu-suite.log"
    # Both halves run even if the first fails; the exit status is that of the first failure.
    status=0
    {
        nvidia-smi -L || true
        ./gpu-bundle/cuda-tests --test-threads=1 --nocapture || status=$?
        ./gpu-bundle/cuda_driver-tests --test-threads=1 --nocapture || [ "$status" -ne 0 ] || status=$?
        gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
        if [ "${gpus:-0}" -lt 2 ]; then
            echo "gpu-suite: ${gpus:-0} GPU(s): the multi-device tests need two, and say they are skipped"
        else
            echo "gpu-suite: $gpus GPUs: the multi-device tests run"
        fi
        ./gpu-bundle/cuda_multi_device-tests --test-threads=1 --nocapture || [ "$status" -ne 0 ] || status=$?
        # cubecl compiles burn's kernels when they first run, with NVRTC (libnvrtc.so.13 or .12,
        # loaded from the library path) and the CUDA headers ($CUDA_PATH/include, else
        # /usr/local/cuda/include): those of the nvidia wheels PyTorch installs where the
        # system has none.
        nvrtc="$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "libnvrtc.so*"))})))' 2>/dev/null || true)"
        headers="$(python3 -c 'import glob, os, nvidia; print(next(iter(sorted(os.path.dirname(os.path.dirname(p)) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "include", "cuda_fp16.h")))), ""))' 2>/dev/null || true)"
        if [ -z "${CUDA_PATH:-}" ] && [ ! -d /usr/local/cuda/include ] && [ -n "$headers" ]; then
            export CUDA_PATH="$headers"
        fi
        echo "gpu-suite: NVRTC from ${nvrtc:-the system library path}, CUDA headers from ${CUDA_PATH:-/usr/local/cuda}/include"
        LD_LIBRARY_PATH="${nvrtc:+$nvrtc:}${LD_LIBRARY_PATH:-}" \
            ./gpu-bundle/burn_cuda-tests --test-threads=1 --nocapture || [ "$status" -ne 0 ] || status=$?
        PYTHONPATH="$PWD/gpu-bundle/site" PYTHONUNBUFFERED=1 python3 -m pytest -q -s \
            gpu-bundle/test_cuda_numpy.py gpu-bundle/test_gpu.py gpu-bundle/test_multi_gpu.py \
            || [ "$status" -ne 0 ] || status=$?
        # The CUDA Array Interface both ways: the extension alone, then CuPy and Numba
        # (numba-cuda); a library missing here is a skip whose reason -rs prints.
        PYTHONPATH="$PWD/gpu-bundle/site:$PWD/gpu-bundle" PYTHONUNBUFFERED=1 python3 -m pytest -q -s -rs \
            gpu-bundle/test_cuda_array_interface.py gpu-bundle/test_gpu_cai.py \
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
