#!/usr/bin/env bash
# Instructions per operation of each contender, counted by callgrind (deterministic, so usable on
# shared CPUs where times are noisy). Each case runs 100k and 200k iterations of the `profile`
# example; the difference divided by 100k is the cost of one operation, start-up excluded.
# Usage: benches/callgrind.sh   (needs valgrind; takes about two minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/callgrind"
CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release --quiet -p dlpack-bench --example profile
bin="$CARGO_TARGET_DIR/release/examples/profile"
ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 |
        awk '/Collected/ { print $4 }'
}
per_op() {
    local a b
    a=$(ir "$1" "$2" 100000)
    b=$(ir "$1" "$2" 200000)
    echo $(((b - a) / 100000))
}
echo "| case | ours | dlpark | floor |"
echo "|---|---|---|---|"
for what in shared owned export ndim1 ndim2 ndim4 ndim8 ndim16 ndim32; do
    echo "| $what | $(per_op ours $what) | $(per_op dlpark $what) | $(per_op floor $what) |"
done
echo
echo "| piece | instructions |"
echo "|---|---|"
echo "| ours: one full validation (\`layout::validate\`) | $(per_op ours validate) |"
echo "| ours: layout of a validated tensor (\`ManagedTensor::layout\`) | $(per_op ours layout) |"
echo "| ours: \`ImportedData::get\` | $(per_op ours get) |"
echo "| ours: read through \`as_ptr\` (loop overhead only) | $(per_op ours ptr) |"
echo "| dlpark: \`Managed::validate\` | $(per_op dlpark validate) |"
