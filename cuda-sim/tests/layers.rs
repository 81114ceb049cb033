//! The simulator's files depend one way: the model at the ground, file by file; the driver
//! faces above it; the crate root (`lib.rs`) on top. A module names only modules of its own
//! layer or of a lower one, checked by the engine of `dlpack-runtime`'s layering check
//! (`dlpack-runtime/tests/support/layering.rs`: what it reads, what it checks, its limits),
//! with the layers below.
//!
//! The model's layers are its files, so that the model has no circle inside either: `state`
//! (the machine) stands above the data it holds (streams, memory, graph nodes, loaded
//! modules), and the operations on it (`prepare`, `peer`, `kernel`, `capture`, `ops`) above
//! `state`. The faces come after the whole model: what their C entry points share (`ffi`,
//! `calls`, `control`), then the CUDA face, then the HIP face.

// Shared with dlpack-runtime, whose minimum Rust (1.85) has no `if let` chains: clippy's advice
// to collapse nested `if`s into them does not apply.
#[path = "../../dlpack-runtime/tests/support/layering.rs"]
#[allow(dead_code, clippy::collapsible_if)]
mod layering;

use std::path::Path;

use layering::{Layers, files, sources, unplaced, violations};

/// The layers, lowest first.
const LAYERS: &[&str] = &[
    // `model/mod.rs` declares the model's files and names nothing.
    "model",
    "model::base",
    "model::config",
    "model::checker",
    "model::ptx",
    "model::stream",
    "model::memory",
    "model::request",
    "model::module",
    "model::nodes",
    "model::state",
    "model::prepare",
    "model::peer",
    "model::kernel",
    "model::capture",
    "model::ops",
    // `face/mod.rs` declares the faces' files and names nothing.
    "face",
    "face::ffi",
    "face::calls",
    "face::control",
    "face::cuda",
    "face::hip",
];

const SIMULATOR: Layers = Layers {
    layers: LAYERS,
    above_all: &[],
};

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_model_and_the_faces_only_name_the_layers_below_them() {
    let mut files = Vec::new();
    sources(&src(), "", &mut files);
    let found_model = files.iter().any(|(path, _)| path == "model/state.rs");
    let found_faces = files.iter().any(|(path, _)| path == "face/hip.rs");
    assert!(found_model && found_faces, "the sources of src/ were found");
    let found = violations(&SIMULATOR, &files);
    assert!(
        found.is_empty(),
        "upward dependencies between the layers of src/ (lowest first: {}):\n{}",
        LAYERS.join(", "),
        found.join("\n")
    );
}

#[test]
fn every_top_level_module_of_src_is_placed() {
    let found = unplaced(&SIMULATOR, &src());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The layers of the two `mod.rs` files: a file under `model/` or `face/` is not placed by
/// them (it would sit at the bottom of the model, or of the faces, unnoticed).
const FOLDERS: [&str; 2] = ["model", "face"];

/// Every file of the model and of the faces is a layer, or in a folder that is one: a new file
/// must be placed.
#[test]
fn every_file_is_placed() {
    let mut files = Vec::new();
    sources(&src(), "", &mut files);
    for (path, _) in &files {
        let module = path.trim_end_matches(".rs").trim_end_matches("/mod");
        if module == "lib" {
            continue;
        }
        let module = module.replace('/', "::");
        let placed = LAYERS.iter().any(|layer| {
            module == *layer
                || (!FOLDERS.contains(layer) && module.starts_with(&format!("{layer}::")))
        });
        assert!(
            placed,
            "src/{path}: `{module}` is in no layer: place it in LAYERS in tests/layers.rs"
        );
    }
}

/// The checks fail where they should: a model file naming a face, a lower model file naming a
/// higher one, and a face naming a face above it.
#[test]
fn an_upward_name_is_caught() {
    let lib = "mod face;\nmod model;\n";
    let found = violations(
        &SIMULATOR,
        &files(&[
            ("lib.rs", lib),
            ("model/memory.rs", "use super::state::State;\n"),
            ("model/ops.rs", "use crate::face::hip::hipInit;\n"),
            (
                "face/cuda/api.rs",
                "use crate::face::hip::code;\nuse crate::model::ops;\n",
            ),
            ("model/state.rs", "use super::memory::Memory;\n"),
        ]),
    );
    assert_eq!(
        found,
        [
            "src/model/memory.rs:1: `super::state::State` names `model::state::State` of layer \
             `model::state`, above module `model::memory` of layer `model::memory`",
            "src/model/ops.rs:1: `crate::face::hip::hipInit` names `face::hip::hipInit` of layer \
             `face::hip`, above module `model::ops` of layer `model::ops`",
            "src/face/cuda/api.rs:1: `crate::face::hip::code` names `face::hip::code` of layer \
             `face::hip`, above module `face::cuda::api` of layer `face::cuda`",
        ]
    );
}
