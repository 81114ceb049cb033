//! The modules of `src/` depend one way: a module names only modules of its own layer or of a
//! lower one.
//!
//! The layers are the top-level folders of `src/`, lowest first in [`LAYERS`]; the crate root
//! (`lib.rs`) and the [`ABOVE_ALL`] modules (`__private`, `__testing`, `candle`, `burn`) sit above them all. Every
//! `.rs` file under `src/` is parsed with `syn` and mapped to its module by its place
//! (`engine/cuda/event.rs` is `engine::cuda::event`, `tensor/layout/mod.rs` is
//! `tensor::layout`); inline modules (`mod tests { ... }`) extend the path of their file, and
//! `#[cfg(...)]` items, tests included, are read like any other code.
//!
//! # What it checks
//!
//! Every path that starts with `crate`, `super` or `self` is resolved to the module it names,
//! `super` against the module it is written in (inline modules count): the leaves of `use`
//! trees (grouped ones such as `use crate::{tensor::Device, plan::copy}` and globs included)
//! and every `syn::Path` of the code (expressions, patterns, types, trait bounds, `impl`
//! headers, attributes, the paths of macro invocations). The layer of the named module is the
//! first segment of its path; a name re-exported by `lib.rs` (`crate::BorrowError`) counts as
//! the module it is re-exported from, any other item of the root as the root itself. The test
//! fails, naming the file, the line, the path and both layers, when that layer is above the
//! layer of the module the path is written in. A module under `src/` that belongs to no layer
//! (a new top-level folder or file missing from [`LAYERS`]) fails it too, with a message
//! saying where to place it.
//!
//! # Limits
//!
//! - Macros are not expanded. The arguments of a macro call are read only when they parse as
//!   expressions separated by commas (`assert_eq!(a, crate::b())`, `format!`, `matches!` with
//!   a path pattern); any other macro body (`vec![x; n]`, `proptest! { .. }`, a
//!   `macro_rules!` definition and its `$crate::` paths) and the arguments of attributes
//!   (`#[cfg_attr(..)]`, `#[pyo3(..)]`) are tokens, not code: the paths in them are not seen.
//!   Neither is a `#[macro_export]` or `#[macro_use]` macro called by its bare name, nor a doc
//!   link.
//! - Only paths that start with `crate`, `super` or `self` are resolved. Any other path starts
//!   at a name in scope (a child module, an item imported by a `use`, which is itself checked
//!   where it is written, or an extern crate), so it adds no edge of its own.
//! - Names only: a method reached through a value (`x.method()`), whose trait the code never
//!   names, is not seen.
//! - A name brought to the crate root by a glob re-export (`pub use a::*;`) counts as an item of
//!   the root. A `#[path = ".."]` on a `mod` is refused, since files are mapped to modules by
//!   their place under `src/`.
//! - Visibilities (`pub(crate)`, `pub(super)`, `pub(in crate::a)`) name no dependency and are
//!   skipped.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, ItemMod, ItemUse, Token, UseTree};

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

/// A layer: its rank (an index into [`LAYERS`], or `LAYERS.len()` above them all) and its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layer {
    rank: usize,
    name: &'static str,
}

/// The layer of the crate root and of items defined in it.
const ROOT: Layer = Layer {
    rank: LAYERS.len(),
    name: "crate root",
};

/// The layer of the module at `module` (`["engine", "cuda", "event"]`), or the top-level name
/// that belongs to no layer.
fn layer_of(module: &[String]) -> Result<Layer, String> {
    let Some(first) = module.first() else {
        return Ok(ROOT);
    };
    if let Some(rank) = LAYERS.iter().position(|layer| layer == first) {
        return Ok(Layer {
            rank,
            name: LAYERS[rank],
        });
    }
    if let Some(name) = ABOVE_ALL.iter().find(|name| *name == first) {
        return Ok(Layer {
            rank: LAYERS.len(),
            name,
        });
    }
    Err(first.clone())
}

/// The module path of a file, given by its path relative to `src/` with `/` separators:
/// `engine/cuda/event.rs` is `engine::cuda::event`, `tensor/layout/mod.rs` is `tensor::layout`,
/// `lib.rs` the crate root.
fn module_of(relative: &str) -> Vec<String> {
    let mut parts: Vec<String> = relative.split('/').map(str::to_owned).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    let is_root = parts.is_empty() && stem == "lib";
    if stem != "mod" && !is_root {
        parts.push(stem.to_owned());
    }
    parts
}

/// `module` as Rust writes it: `engine::cuda`, or `crate` for the root.
fn display(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// The module-absolute path `written` names from inside `module`, when it starts with `crate`,
/// `super` or `self`: `super::host::X` from `engine::cuda` is `engine::host::X`. `None` for
/// paths that start elsewhere; `Some(Err(..))` for a `super` past the crate root.
fn resolve(module: &[String], written: &[String]) -> Option<Result<Vec<String>, String>> {
    let first = written.first()?;
    if !matches!(first.as_str(), "crate" | "super" | "self") {
        return None;
    }
    let mut base = module.to_vec();
    let mut rest = written;
    if first == "crate" {
        base.clear();
        rest = &rest[1..];
    }
    while let Some(segment) = rest.first() {
        match segment.as_str() {
            "self" => {}
            "super" => {
                if base.pop().is_none() {
                    return Some(Err(format!(
                        "`super` past the crate root from `{}`",
                        display(module)
                    )));
                }
            }
            _ => break,
        }
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(Ok(base))
}

/// One leaf of a `use` tree: the path it imports (`a::b` for the `self` of `a::b::{self}`,
/// `a` for the glob of `a::*`) and the name it binds there (none for a glob).
struct UseLeaf {
    path: Vec<String>,
    name: Option<String>,
    line: usize,
}

impl UseLeaf {
    /// The leaf as written, braces left out: `crate::tensor::Device`, `super::*`.
    fn written(&self) -> String {
        match &self.name {
            Some(_) => self.path.join("::"),
            None => format!("{}::*", self.path.join("::")),
        }
    }
}

/// The leaves of `tree`, under `prefix`.
fn use_leaves(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_leaves(&path.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(name) => out.push(named_leaf(prefix, &name.ident, None)),
        UseTree::Rename(rename) => {
            out.push(named_leaf(prefix, &rename.ident, Some(&rename.rename)));
        }
        UseTree::Glob(glob) => out.push(UseLeaf {
            path: prefix.clone(),
            name: None,
            line: glob.star_token.spans[0].start().line,
        }),
        UseTree::Group(group) => {
            for tree in &group.items {
                use_leaves(tree, prefix, out);
            }
        }
    }
}

/// The leaf `ident` (`as rename`) under `prefix`.
fn named_leaf(prefix: &[String], ident: &syn::Ident, rename: Option<&syn::Ident>) -> UseLeaf {
    let mut path = prefix.to_vec();
    if ident != "self" {
        path.push(ident.to_string());
    }
    let name = rename
        .map(ToString::to_string)
        .or_else(|| path.last().cloned());
    UseLeaf {
        path,
        name,
        line: ident.span().start().line,
    }
}

/// What `lib.rs` tells about the crate root: the modules it declares and the names it
/// re-exports from them.
#[derive(Default)]
struct Root {
    modules: Vec<String>,
    /// Name at the root -> the module-absolute paths it re-exports (a name may stand for a
    /// type and a macro at once). Re-exports of other crates are left out.
    reexports: HashMap<String, Vec<Vec<String>>>,
}

impl Root {
    fn new(lib: &syn::File) -> Self {
        let mut root = Root::default();
        for item in &lib.items {
            if let syn::Item::Mod(item) = item {
                root.modules.push(item.ident.to_string());
            }
        }
        for item in &lib.items {
            let syn::Item::Use(item) = item else { continue };
            if item.leading_colon.is_some() {
                continue;
            }
            let mut leaves = Vec::new();
            use_leaves(&item.tree, &mut Vec::new(), &mut leaves);
            for leaf in leaves {
                let Some(name) = leaf.name else {
                    continue; // A glob: its names count as the root's own.
                };
                // `crate::a::B`, `self::a::B` or `a::B`; `b::C` of another crate is left out.
                let path = match resolve(&[], &leaf.path) {
                    Some(Ok(path)) => path,
                    _ => leaf.path,
                };
                if path
                    .first()
                    .is_some_and(|first| root.modules.contains(first))
                {
                    root.reexports.entry(name).or_default().push(path);
                }
            }
        }
        root
    }

    /// The layer of the module-absolute path `path`: that of its first segment, through the
    /// root's re-exports; `Err` with the top-level module that belongs to no layer.
    fn layer(&self, path: &[String], depth: usize) -> Result<Layer, String> {
        let Some(first) = path.first() else {
            return Ok(ROOT);
        };
        if let Ok(layer) = layer_of(path) {
            return Ok(layer);
        }
        if let Some(targets) = self.reexports.get(first).filter(|_| depth < 8) {
            let mut layers = targets.iter().map(|target| {
                let mut full = target.clone();
                full.extend(path[1..].iter().cloned());
                self.layer(&full, depth + 1)
            });
            let first_layer = layers.next().expect("a re-export has a target");
            return layers.fold(first_layer, |a, b| match (a, b) {
                (Ok(a), Ok(b)) => Ok(if b.rank > a.rank { b } else { a }),
                (Err(e), _) | (_, Err(e)) => Err(e),
            });
        }
        if self.modules.contains(first) {
            return Err(first.clone());
        }
        Ok(ROOT)
    }
}

/// Walks one file: every path that starts with `crate`, `super` or `self`, checked against the
/// layer of the module it is written in.
struct Checker<'a> {
    root: &'a Root,
    /// `src/...`, for messages.
    file: &'a str,
    /// The module being walked: the file's, then its inline modules'.
    module: Vec<String>,
    found: &'a mut Vec<String>,
}

impl Checker<'_> {
    /// Checks `written` (`crate::export::ExportError`), shown as `shown`, at `line`.
    fn check(&mut self, written: &[String], shown: &str, line: usize) {
        let Some(target) = resolve(&self.module, written) else {
            return;
        };
        let Ok(from) = layer_of(&self.module) else {
            return; // Reported once, for the module itself.
        };
        let file = self.file;
        let module = display(&self.module);
        let target = match target {
            Ok(target) => target,
            Err(error) => {
                self.found.push(format!(
                    "{file}:{line}: `{shown}` does not resolve: {error}"
                ));
                return;
            }
        };
        match self.root.layer(&target, 0) {
            Ok(to) if to.rank > from.rank => self.found.push(format!(
                "{file}:{line}: `{shown}` names `{}` of layer `{}`, above module `{module}` of \
                 layer `{}`",
                display(&target),
                to.name,
                from.name,
            )),
            Ok(_) => {}
            Err(name) => self.found.push(format!(
                "{file}:{line}: `{shown}` names module `{name}`, which belongs to no layer: \
                 place it in LAYERS in tests/layers.rs"
            )),
        }
    }
}

/// Whether `attrs` hold a `#[path = ..]`.
fn has_path_attribute(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| attr.path().is_ident("path"))
}

impl<'ast> Visit<'ast> for Checker<'_> {
    fn visit_item_use(&mut self, item: &'ast ItemUse) {
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        if item.leading_colon.is_some() {
            return; // `use ::other_crate::..`
        }
        let mut leaves = Vec::new();
        use_leaves(&item.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            self.check(&leaf.path, &leaf.written(), leaf.line);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            if let Some(first) = path.segments.first() {
                let written: Vec<String> =
                    path.segments.iter().map(|s| s.ident.to_string()).collect();
                let line = first.ident.span().start().line;
                self.check(&written, &written.join("::"), line);
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        // Best effort: the arguments, when they are expressions (see the limits above).
        let parser = Punctuated::<syn::Expr, Token![,]>::parse_terminated;
        if let Ok(arguments) = mac.parse_body_with(parser) {
            for argument in &arguments {
                Visit::visit_expr(self, argument);
            }
        }
    }

    fn visit_item_macro(&mut self, item: &'ast syn::ItemMacro) {
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        if item.ident.is_some() {
            self.visit_path(&item.mac.path); // `macro_rules! name { .. }`: its body is not code.
        } else {
            self.visit_macro(&item.mac);
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)`, `pub(super)`, `pub(in crate::a)`: not a dependency.
    }

    fn visit_item_mod(&mut self, item: &'ast ItemMod) {
        for attr in &item.attrs {
            self.visit_attribute(attr);
        }
        if has_path_attribute(&item.attrs) {
            self.found.push(format!(
                "{}:{}: `#[path]` on `mod {}`: tests/layers.rs maps files to modules by their \
                 place under src/ and cannot follow it",
                self.file,
                item.ident.span().start().line,
                item.ident,
            ));
        }
        let Some((_, items)) = &item.content else {
            return; // `mod a;`: its file is walked on its own.
        };
        self.module.push(item.ident.to_string());
        if self.module.len() == 1 {
            if let Err(name) = layer_of(&self.module) {
                self.found.push(format!(
                    "{}:{}: module `{name}` belongs to no layer: place it in LAYERS in \
                     tests/layers.rs",
                    self.file,
                    item.ident.span().start().line,
                ));
            }
        }
        for item in items {
            self.visit_item(item);
        }
        self.module.pop();
    }
}

/// Every violation in `files` (path relative to `src/` with `/` separators, source text): the
/// upward paths, the modules of no layer, the files that do not parse.
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut parsed = Vec::new();
    for (relative, text) in files {
        match syn::parse_file(text) {
            Ok(file) => parsed.push((relative, file)),
            Err(error) => {
                let line = error.span().start().line;
                found.push(format!("src/{relative}:{line}: does not parse: {error}"));
            }
        }
    }
    let root = parsed
        .iter()
        .find(|(relative, _)| relative.as_str() == "lib.rs")
        .map(|(_, lib)| Root::new(lib))
        .unwrap_or_default();
    for (relative, file) in &parsed {
        let module = module_of(relative);
        let path = format!("src/{relative}");
        if let Err(name) = layer_of(&module) {
            found.push(format!(
                "{path}: module `{}` belongs to no layer: place `{name}` in LAYERS in \
                 tests/layers.rs",
                display(&module)
            ));
            continue;
        }
        let mut checker = Checker {
            root: &root,
            file: &path,
            module,
            found: &mut found,
        };
        checker.visit_file(file);
    }
    found
}

/// The `.rs` files under `dir`, as (path relative to `src/`, text), sorted.
fn sources(dir: &Path, relative: &str, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("a readable directory under src/")
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let relative = if relative.is_empty() {
            name
        } else {
            format!("{relative}/{name}")
        };
        if path.is_dir() {
            sources(&path, &relative, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let text = fs::read_to_string(&path).expect("a readable source file");
            out.push((relative, text));
        }
    }
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Files given as (path under `src/`, text), for the tests of the checker.
fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect()
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
    let found = violations(&files);
    assert!(
        found.is_empty(),
        "upward dependencies between the layers of src/ (lowest first: {}):\n{}",
        LAYERS.join(", "),
        found.join("\n")
    );
}

#[test]
fn every_top_level_module_of_src_is_placed() {
    for entry in fs::read_dir(src()).expect("src/") {
        let path = entry.expect("an entry of src/").path();
        let name = path.file_name().expect("a name").to_string_lossy();
        let module = if path.is_dir() {
            name.to_string()
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "lib" {
                continue;
            }
            stem.to_owned()
        } else {
            continue;
        };
        assert!(
            LAYERS.contains(&module.as_str()) || ABOVE_ALL.contains(&module.as_str()),
            "src/{name}: `{module}` is in no layer: place it in LAYERS in tests/layers.rs"
        );
    }
}

#[test]
fn an_upward_use_is_caught() {
    let found = violations(&files(&[
        ("lib.rs", LIB),
        (
            "tensor/dtype.rs",
            "//! `crate::export` in a comment is no edge.\n\
             use crate::borrow::BorrowError;\n\
             use crate::export::ExportError;\n",
        ),
    ]));
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
    let found = violations(&files(&[
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
    ]));
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

    let found = violations(&files(&[
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
    ]));
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
    let found = violations(&files(&[
        ("lib.rs", "mod telemetry;\nmod inline { }\n"),
        ("telemetry/mod.rs", ""),
        ("abi/ffi.rs", "use crate::telemetry::Sink;\n"),
    ]));
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
