#!/usr/bin/env bash
# Builds the CUDA simulator (crate cuda-sim) and prints the directory holding it as libcuda.so
# (and libcuda.so.1), inside the cargo target directory (CARGO_TARGET_DIR is honoured). Put that
# directory first on LD_LIBRARY_PATH and any program that loads the CUDA driver dynamically
# (cudarc does) runs on the simulator. The same file is there as ROCm's HIP runtime too,
# libamdhip64.so (and .so.6, .so.7): its HIP face, over the same model, so that a process
# loading both names gets one library, one checker:
#
#   sim="$(./scripts/cuda-sim.sh)" &&
#       LD_LIBRARY_PATH="$sim:$LD_LIBRARY_PATH" cargo test -p dlpack-tests --features cuda --test cuda
set -euo pipefail
cd "$(dirname "$0")/.."
# The library cargo built, as cargo reports it (wherever the target directory is; the crate is
# also an rlib, listed beside it).
lib="$(cargo build --locked --quiet -p cuda-sim --message-format=json-render-diagnostics \
    | sed -n 's/.*"filenames":\[[^]]*"\([^"]*libcuda_sim\.so\)".*/\1/p' | tail -n 1)"
if [ -z "$lib" ] || [ ! -f "$lib" ]; then
    echo "cuda-sim.sh: cargo built no libcuda_sim.so" >&2
    exit 1
fi
dir="$(dirname "$(dirname "$lib")")/cuda-sim"
mkdir -p "$dir"
# A new file renamed into place, so that a process running on the old one keeps its copy.
cp -f "$lib" "$dir/.libcuda.so.new"
mv -f "$dir/.libcuda.so.new" "$dir/libcuda.so"
for name in libcuda.so.1 libamdhip64.so libamdhip64.so.6 libamdhip64.so.7; do
    ln -sf libcuda.so "$dir/$name"
done
echo "$dir"
