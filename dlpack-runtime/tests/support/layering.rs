//! The engine of the layering checks (`tests/layers.rs` of `dlpack-runtime` and of `cuda-sim`,
//! which include this file with `#[path]`): the modules of a crate's `src/` depend one way, a
//! module naming only modules of its own layer or of a lower one.
//!
//! Each check gives its [`Layers`]: module paths of `src/`, lowest first (top-level folders,
//! or finer: `model::state`); the crate root (`lib.rs`) and the modules listed above them all
//! sit above every layer. Every
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
//! longest layer that is a prefix of its path; a name re-exported by `lib.rs` (`crate::BorrowError`) counts as
//! the module it is re-exported from, any other item of the root as the root itself. The test
//! fails, naming the file, the line, the path and both layers, when that layer is above the
//! layer of the module the path is written in. A module under `src/` that belongs to no layer
//! (a new top-level folder or file missing from the layers) fails it too, with a message
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

/// The layers of a crate's `src/`, lowest first, and the modules that sit with the crate root
/// above them all. A layer is a module path (`engine`, or `model::state` for a finer grain):
/// a module belongs to the longest layer that is a prefix of its path, and may name the
/// modules of its own layer and of the layers before it.
pub(crate) struct Layers {
    /// The layers, lowest first.
    pub(crate) layers: &'static [&'static str],
    /// Top-level modules that sit, with the crate root, above every layer.
    pub(crate) above_all: &'static [&'static str],
}

/// A layer: its rank (an index into [`Layers::layers`], or its length above them all) and its
/// name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layer {
    rank: usize,
    name: &'static str,
}

impl Layers {
    /// The layer of the crate root and of items defined in it.
    fn root(&self) -> Layer {
        Layer {
            rank: self.layers.len(),
            name: "crate root",
        }
    }

    /// The layer of the module at `module` (`["engine", "cuda", "event"]`): the longest layer
    /// that is a prefix of it; or the top-level name that belongs to no layer.
    fn layer_of(&self, module: &[String]) -> Result<Layer, String> {
        let Some(first) = module.first() else {
            return Ok(self.root());
        };
        let mut best: Option<(usize, usize)> = None;
        for (rank, layer) in self.layers.iter().enumerate() {
            let parts: Vec<&str> = layer.split("::").collect();
            let matches = parts.len() <= module.len()
                && parts
                    .iter()
                    .zip(module)
                    .all(|(part, segment)| part == segment);
            if matches && best.is_none_or(|(_, len)| parts.len() > len) {
                best = Some((rank, parts.len()));
            }
        }
        if let Some((rank, _)) = best {
            return Ok(Layer {
                rank,
                name: self.layers[rank],
            });
        }
        if let Some(name) = self.above_all.iter().find(|name| *name == first) {
            return Ok(Layer {
                rank: self.layers.len(),
                name,
            });
        }
        Err(first.clone())
    }
}

/// The module path of a file, given by its path relative to `src/` with `/` separators:
/// `engine/cuda/event.rs` is `engine::cuda::event`, `tensor/layout/mod.rs` is `tensor::layout`,
/// `lib.rs` the crate root.
pub(crate) fn module_of(relative: &str) -> Vec<String> {
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
pub(crate) fn resolve(
    module: &[String],
    written: &[String],
) -> Option<Result<Vec<String>, String>> {
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
    fn layer(&self, layers: &Layers, path: &[String], depth: usize) -> Result<Layer, String> {
        let Some(first) = path.first() else {
            return Ok(layers.root());
        };
        if let Ok(layer) = layers.layer_of(path) {
            return Ok(layer);
        }
        if let Some(targets) = self.reexports.get(first).filter(|_| depth < 8) {
            let mut layers = targets.iter().map(|target| {
                let mut full = target.clone();
                full.extend(path[1..].iter().cloned());
                self.layer(layers, &full, depth + 1)
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
        Ok(layers.root())
    }
}

/// Walks one file: every path that starts with `crate`, `super` or `self`, checked against the
/// layer of the module it is written in.
struct Checker<'a> {
    layers: &'a Layers,
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
        let Ok(from) = self.layers.layer_of(&self.module) else {
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
        match self.root.layer(self.layers, &target, 0) {
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
            if let Err(name) = self.layers.layer_of(&self.module) {
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
pub(crate) fn violations(layers: &Layers, files: &[(String, String)]) -> Vec<String> {
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
        if let Err(name) = layers.layer_of(&module) {
            found.push(format!(
                "{path}: module `{}` belongs to no layer: place `{name}` in LAYERS in \
                 tests/layers.rs",
                display(&module)
            ));
            continue;
        }
        let mut checker = Checker {
            layers,
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
pub(crate) fn sources(dir: &Path, relative: &str, out: &mut Vec<(String, String)>) {
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

/// The top-level modules of the `src/` at `src` (its folders and files, `lib.rs` left out)
/// that belong to no layer and are not above them all.
pub(crate) fn unplaced(layers: &Layers, src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir(src).expect("src/") {
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
        if layers.layer_of(std::slice::from_ref(&module)).is_err() {
            found.push(format!(
                "src/{name}: `{module}` is in no layer: place it in LAYERS in tests/layers.rs"
            ));
        }
    }
    found
}

/// Files given as (path under `src/`, text), for the tests of the checker.
pub(crate) fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect()
}
