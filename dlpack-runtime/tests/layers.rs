//! The modules of `src/` depend one way: a module names only modules of its own layer or of a
//! lower one.
//!
//! The layers are the top-level folders of `src/`, lowest first in [`LAYERS`]; the crate root
//! (`lib.rs`) and the [`ABOVE_ALL`] modules (`__private`, `__testing`, `candle`, `burn`) sit
//! above them all. The checking engine (what it reads, what it checks, its limits) is
//! `support/layering.rs`, which `cuda-sim`'s layering check shares.

#[path = "support/layering.rs"]
mod layering;

use std::path::Path;

use layering::{Layers, files, module_of, resolve, sources, unplaced, violations};

/// The layers, lowest first: the top-level modules (folders) of `src/`. A module may name the
/// modules of its own layer and of the layers before it.
const LAYERS: &[&str] = &[
    "abi", "borrow", "tensor", "plan", "engine", "export", "import", "interop", "python",
];

/// Top-level modules that sit, with the crate root, above every layer of [`LAYERS`]: the hidden
/// modules of the derives and the tests, and `candle` and `burn`, the public modules that gather
/// the candle and burn interop of `interop/` and their Python halves of `python/` (re-exports
/// only).
const ABOVE_ALL: &[&str] = &["__private", "__testing", "candle", "burn"];

const RUNTIME: Layers = Layers {
    layers: LAYERS,
    above_all: ABOVE_ALL,
};

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `lib.rs` of the synthetic crates below.
const LIB: &str = "
mod abi;
pub mod borrow;
mod tensor;
mod engine;
mod export;
pub mod python;
pub mod __testing;
pub use borrow::BorrowError;
pub use export::{ExportError, DlpackExport};
pub use python as py;
pub use dlpack_derive::DlpackExport;
pub struct Defined;
";

#[test]
fn modules_only_name_the_layers_below_them() {
    let mut files = Vec::new();
    sources(&src(), "", &mut files);
    assert!(
        files.iter().any(|(path, _)| path == "lib.rs") && files.len() > 20,
        "the sources of src/ were found"
    );
    let found = violations(&RUNTIME, &files);
    assert!(
        found.is_empty(),
        "upward dependencies between the layers of src/ (lowest first: {}):\n{}",
        RUNTIME.layers.join(", "),
        found.join("\n")
    );
}

#[test]
fn every_top_level_module_of_src_is_placed() {
    let found = unplaced(&RUNTIME, &src());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn an_upward_use_is_caught() {
    let found = violations(
        &RUNTIME,
        &files(&[
            ("lib.rs", LIB),
            (
                "tensor/dtype.rs",
                "//! `crate::export` in a comment is no edge.\n\
             use crate::borrow::BorrowError;\n\
             use crate::export::ExportError;\n",
            ),
        ]),
    );
    assert_eq!(
        found,
        [
            "src/tensor/dtype.rs:3: `crate::export::ExportError` names `export::ExportError` of \
             layer `export`, above module `tensor::dtype` of layer `tensor`"
        ]
    );
}

#[test]
fn every_kind_of_path_is_seen() {
    let found = violations(
        &RUNTIME,
        &files(&[
            ("lib.rs", LIB),
            (
                "borrow/mod.rs",
                "use crate::{abi::ffi, tensor::{Device, self}};
pub(crate) struct A(crate::python::Capsule);
impl crate::export::Trait for A {}
fn f() { crate::ExportError::new(); }
pub(in crate::borrow) fn g<T: crate::DlpackExport>() { crate::py::call!(); }
fn h() -> crate::BorrowError { let _ = crate::Defined; todo!() }
#[cfg(test)]
mod tests {
    use super::super::__testing::cuda;
    fn t() { assert_eq!(1, crate::export::one()); let _ = vec![crate::python::unseen(); 2]; }
    macro_rules! m { () => { $crate::python::unseen() }; }
}
",
            ),
        ]),
    );
    assert_eq!(
        found,
        [
            "src/borrow/mod.rs:1: `crate::tensor::Device` names `tensor::Device` of layer \
             `tensor`, above module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:1: `crate::tensor` names `tensor` of layer `tensor`, above module \
             `borrow` of layer `borrow`",
            "src/borrow/mod.rs:2: `crate::python::Capsule` names `python::Capsule` of layer \
             `python`, above module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:3: `crate::export::Trait` names `export::Trait` of layer \
             `export`, above module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:4: `crate::ExportError::new` names `ExportError::new` of layer \
             `export`, above module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:5: `crate::DlpackExport` names `DlpackExport` of layer `export`, \
             above module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:5: `crate::py::call` names `py::call` of layer `python`, above \
             module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:6: `crate::Defined` names `Defined` of layer `crate root`, above \
             module `borrow` of layer `borrow`",
            "src/borrow/mod.rs:9: `super::super::__testing::cuda` names `__testing::cuda` of \
             layer `__testing`, above module `borrow::tests` of layer `borrow`",
            "src/borrow/mod.rs:10: `crate::export::one` names `export::one` of layer `export`, \
             above module `borrow::tests` of layer `borrow`",
        ]
    );
}

#[test]
fn super_resolves_against_the_module_it_is_written_in() {
    let event = ["engine", "cuda", "event"].map(String::from);
    let written = |path: &str| path.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(
        resolve(&event, &written("super::wait")),
        Some(Ok(written("engine::cuda::wait")))
    );
    assert_eq!(
        resolve(&event, &written("super::super::host::X")),
        Some(Ok(written("engine::host::X")))
    );
    assert_eq!(
        resolve(&event, &written("self::Event")),
        Some(Ok(written("engine::cuda::event::Event")))
    );
    assert_eq!(
        resolve(&event, &written("crate::plan")),
        Some(Ok(written("plan")))
    );
    assert_eq!(resolve(&event, &written("std::sync")), None);
    assert!(matches!(resolve(&[], &written("super::x")), Some(Err(_))));
    assert_eq!(module_of("engine/cuda/event.rs"), event);
    assert_eq!(module_of("tensor/layout/mod.rs"), ["tensor", "layout"]);
    assert_eq!(module_of("lib.rs"), Vec::<String>::new());
    assert_eq!(module_of("__testing.rs"), ["__testing"]);

    let found = violations(
        &RUNTIME,
        &files(&[
            ("lib.rs", LIB),
            (
                "engine/cuda/event.rs",
                "use super::super::super::tensor::Device;
use super::{wait, self};
fn f() { super::super::super::export::g(); }
mod tests {
    use super::*;
    use super::super::super::super::python::Capsule;
}
",
            ),
            ("engine/mod.rs", "use super::*;\nuse super::abi;\n"),
        ]),
    );
    assert_eq!(
        found,
        [
            "src/engine/cuda/event.rs:3: `super::super::super::export::g` names `export::g` of \
             layer `export`, above module `engine::cuda::event` of layer `engine`",
            "src/engine/cuda/event.rs:6: `super::super::super::super::python::Capsule` names \
             `python::Capsule` of layer `python`, above module `engine::cuda::event::tests` of \
             layer `engine`",
            "src/engine/mod.rs:1: `super::*` names `crate` of layer `crate root`, above module \
             `engine` of layer `engine`",
        ]
    );
}

#[test]
fn a_module_outside_the_layers_fails() {
    let found = violations(
        &RUNTIME,
        &files(&[
            ("lib.rs", "mod telemetry;\nmod inline { }\n"),
            ("telemetry/mod.rs", ""),
            ("abi/ffi.rs", "use crate::telemetry::Sink;\n"),
        ]),
    );
    assert_eq!(
        found,
        [
            "src/lib.rs:2: module `inline` belongs to no layer: place it in LAYERS in \
             tests/layers.rs",
            "src/telemetry/mod.rs: module `telemetry` belongs to no layer: place `telemetry` in \
             LAYERS in tests/layers.rs",
            "src/abi/ffi.rs:1: `crate::telemetry::Sink` names module `telemetry`, which belongs \
             to no layer: place it in LAYERS in tests/layers.rs",
        ]
    );
}
