#!/usr/bin/env bash
# Checks the crates a user depends on as crates.io will hold them, in two steps:
#
#   ./scripts/packaged-crates.sh package   cargo package: every publishable member of the
#       workspace (those without `publish = false`), each verified by a build from its own
#       packaged sources (dependencies between them come from the other packages, through a
#       temporary local registry), so a path-only dependency or a file outside a package fails;
#   ./scripts/packaged-crates.sh kit       a crate outside the repository
#       (tests/fixtures/kit-packaged, copied to a temporary directory) depends on dlpack-runtime
#       and cuda-sim-testing by version, as from crates.io, gets them from the packages of the
#       first step, and runs its ordering test with plain `cargo test`.
#
# The packages are served by a registry of their own (a git index and file:// downloads, under
# the target directory), which a `[patch.crates-io]` in the crate's cargo configuration puts in
# crates.io's place for them alone. A registry rather than a path patch: cargo treats registry
# crates as it treats crates.io's (a path patch would be a path dependency again; the
# simulator's library, for one, is named `libcuda_sim-<hash>.so` from a registry and
# `libcuda_sim.so` from a path). The registry's address names the packages' checksums, since
# cargo keeps what it downloaded from an address as that address's for good.
#
# CARGO_TARGET_DIR is honoured, and both steps build into the workspace's target directory, so
# the crates.io dependencies built by the earlier steps of the test command are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
target="$(mkdir -p "$target" && cd "$target" && pwd)"
export CARGO_TARGET_DIR="$target"

# The publishable members (`name@version` each), from cargo.
read -r -a crates <<<"$(cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
print(" ".join(p["name"] + "@" + p["version"] for p in json.load(sys.stdin)["packages"]
               if p["publish"] != []))
')"

case "${1:-}" in
package)
    # --allow-dirty: a working tree's changes are checked too (a clean clone has none).
    args=()
    for crate in "${crates[@]}"; do args+=(-p "$crate"); done
    cargo package --locked --allow-dirty "${args[@]}"
    ;;
kit)
    for crate in "${crates[@]}"; do
        if [ ! -f "$target/package/${crate%@*}-${crate#*@}.crate" ]; then
            echo "packaged-crates.sh: no package of $crate in $target/package: run '$0 package' first" >&2
            exit 1
        fi
    done
    registry_root="$target/packaged-registry"
    key="$(cd "$target/package" && for crate in "${crates[@]}"; do
        sha256sum "${crate%@*}-${crate#*@}.crate"
    done | sha256sum | cut -c1-16)"
    registry="$registry_root/$key"
    if [ ! -d "$registry/index/.git" ]; then
        rm -rf "$registry_root"
        mkdir -p "$registry"
        for crate in "${crates[@]}"; do
            cp "$target/package/${crate%@*}-${crate#*@}.crate" "$registry/"
        done
        # The index: one line per package, from the manifest that cargo wrote into it.
        python3 - "$registry" <<'EOF'
import glob, hashlib, json, os, subprocess, sys, tarfile, tempfile

registry = sys.argv[1]
crates_io = "https://github.com/rust-lang/crates.io-index"
with tempfile.TemporaryDirectory() as unpacked:
    for crate in sorted(glob.glob(os.path.join(registry, "*.crate"))):
        with tarfile.open(crate) as tar:
            root = tar.getnames()[0].split("/")[0]
            tar.extractall(unpacked, filter="data")
        manifest = os.path.join(unpacked, root, "Cargo.toml")
        package = json.loads(subprocess.check_output(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline",
             "--manifest-path", manifest]))["packages"][0]
        deps = [{
            "name": d["rename"] or d["name"],
            "package": d["name"] if d["rename"] else None,
            "req": d["req"],
            "features": d["features"],
            "optional": d["optional"],
            "default_features": d["uses_default_features"],
            "target": d["target"],
            "kind": d["kind"] or "normal",
            # Every dependency is a crates.io one (ours too: the patch brings them here).
            "registry": d["registry"] or crates_io,
        } for d in package["dependencies"]]
        new_syntax = {k: v for k, v in package["features"].items()
                      if any(f.startswith("dep:") or "?/" in f for f in v)}
        name = package["name"]
        entry = {
            "name": name,
            "vers": package["version"],
            "deps": deps,
            "features": {k: v for k, v in package["features"].items() if k not in new_syntax},
            "features2": new_syntax,
            "cksum": hashlib.sha256(open(crate, "rb").read()).hexdigest(),
            "yanked": False,
            "links": package["links"],
            "rust_version": package["rust_version"],
            "v": 2,
        }
        n = len(name)
        folder = {1: ["1"], 2: ["2"], 3: ["3", name[0]]}.get(n, [name[:2], name[2:4]])
        path = os.path.join(registry, "index", *folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
with open(os.path.join(registry, "index", "config.json"), "w") as f:
    json.dump({"dl": "file://" + registry + "/{crate}-{version}.crate"}, f)
EOF
        git -C "$registry/index" init --quiet
        git -C "$registry/index" add -A
        git -C "$registry/index" -c user.name=packaged-crates -c user.email=packaged-crates@localhost \
            commit --quiet -m "the packages of cargo package"
    fi

    # The crate, outside the repository: no cargo configuration of ours applies there.
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    cp -rL tests/fixtures/kit-packaged "$tmp/kit-packaged"
    # kit-user's lock: the crates.io dependencies at the versions the earlier steps built.
    cp tests/fixtures/kit-user/Cargo.lock "$tmp/kit-packaged/Cargo.lock"
    mkdir -p "$tmp/kit-packaged/.cargo"
    {
        echo '[registries.packaged]'
        echo "index = \"file://$registry/index\""
        echo '[patch.crates-io]'
        for crate in "${crates[@]}"; do
            echo "${crate%@*} = { version = \"=${crate#*@}\", registry = \"packaged\" }"
        done
    } >"$tmp/kit-packaged/.cargo/config.toml"
    # The CUDA version that cudarc's bindings are built for, as in the repository's
    # .cargo/config.toml (without a toolkit cudarc falls back to it anyway; set, cudarc's build
    # in the shared target directory stays the one the earlier steps made).
    (cd "$tmp/kit-packaged" && CUDARC_CUDA_VERSION=13040 cargo test)
    ;;
*)
    echo "usage: $0 package|kit" >&2
    exit 2
    ;;
esac
