#!/usr/bin/env bash
# Builds the CUDA simulator (crate cuda-sim) and prints the directory holding its libcuda.so and
# libcuda.so.1. Put that directory first on LD_LIBRARY_PATH and any program that loads the CUDA
# driver dynamically (cudarc does) runs on the simulator:
#
#   LD_LIBRARY_PATH="$(./scripts/cuda-sim.sh):$LD_LIBRARY_PATH" cargo test -p dlpack-tests --features cuda --test cuda
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --quiet -p cuda-sim
dir="$PWD/target/cuda-sim"
mkdir -p "$dir"
cp -f target/debug/libcuda_sim.so "$dir/libcuda.so"
ln -sf libcuda.so "$dir/libcuda.so.1"
echo "$dir"
