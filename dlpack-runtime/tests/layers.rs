//! The module graph of `src/` points one way: every `crate::` or `super::` path in a module
//! names a module of a lower layer (or of its own). A module added to `src/` must be placed in
//! [`LAYERS`]; an upward `use` fails the test, naming the file, the line and both layers.

use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module belongs to the longest entry that prefixes its path; the
/// crate root (`lib.rs`) sits above them all.
const LAYERS: &[&str] = &[
    "words",
    "gil",
    "ffi",
    "dtype",
    "device",
    "borrow",
    "layout",
    "copy",
    "stream",
    "cuda::driver",
    "managed",
    "export",
    "import",
    "ndarray",
    "cuda",
    "python",
    "candle",
    "__private",
    "__testing",
];

/// The layer of a module path (`export::block`), as an index into [`LAYERS`].
fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .enumerate()
        .filter(|(_, layer)| module == **layer || module.starts_with(&format!("{layer}::")))
        .max_by_key(|(_, layer)| layer.len())
        .map(|(rank, _)| rank)
}

/// The module path of a source file, relative to `src/`: `export/mod.rs` is `export`,
/// `cuda/driver/event.rs` is `cuda::driver::event`.
fn module_of(relative: &Path) -> String {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts.join("::")
}

/// One `crate::` or `super::` path in code, resolved to the module it names.
#[derive(Debug)]
struct Edge {
    line: usize,
    target: String,
}

/// The paths `source` (the code of module `module`) names, comments left out. `super::` is
/// resolved against `module` (the parent of `export::block` is `export`, that of `export`, from
/// `export/mod.rs`, is the crate root).
fn edges(module: &str, source: &str) -> Vec<Edge> {
    let mut found = Vec::new();
    for (index, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (start, _) in code.match_indices("crate::") {
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let path = path_at(&code[start + "crate::".len()..]);
            if !path.is_empty() {
                found.push(Edge {
                    line: index + 1,
                    target: path,
                });
            }
        }
        for (start, _) in code.match_indices("super::") {
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut rest = &code[start..];
            let mut base: Vec<&str> = module.split("::").filter(|p| !p.is_empty()).collect();
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            let path = path_at(rest);
            let target = if path.is_empty() {
                base.join("::")
            } else if base.is_empty() {
                path
            } else {
                format!("{}::{path}", base.join("::"))
            };
            found.push(Edge {
                line: index + 1,
                target,
            });
        }
    }
    found
}

/// The module part of a path: its lowercase segments (`cuda::driver` of
/// `cuda::driver::{bind, ...}`), up to the first item, brace or glob.
fn path_at(rest: &str) -> String {
    let mut segments = Vec::new();
    let mut remaining = rest;
    loop {
        let end = remaining
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(remaining.len());
        let segment = &remaining[..end];
        let is_module = !segment.is_empty()
            && segment
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && remaining[end..].starts_with("::");
        if !is_module {
            break;
        }
        segments.push(segment);
        remaining = &remaining[end + 2..];
    }
    segments.join("::")
}

/// Every upward edge of the modules in `files` (module path, source), and every module that
/// belongs to no layer.
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (module, source) in files {
        if module.is_empty() {
            continue; // The crate root re-exports every layer.
        }
        let Some(from) = layer_of(module) else {
            found.push(format!(
                "module `{module}` belongs to no layer: add it to LAYERS in tests/layers.rs"
            ));
            continue;
        };
        for edge in edges(module, source) {
            let Some(to) = layer_of(&edge.target) else {
                continue; // The crate root, or an item of it.
            };
            if to > from {
                found.push(format!(
                    "{module}:{}: `{}` (layer `{}`) is above `{module}` (layer `{}`)",
                    edge.line, edge.target, LAYERS[to], LAYERS[from]
                ));
            }
        }
    }
    found
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("readable src directory")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under src");
            let source = fs::read_to_string(&path).expect("readable source");
            out.push((module_of(relative), source));
        }
    }
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(files.len() > 20, "the runtime's sources were found");
    let found = violations(&files);
    assert!(
        found.is_empty(),
        "upward dependencies between layers:\n{}",
        found.join("\n")
    );
}

#[test]
fn an_upward_use_is_caught() {
    let files = vec![
        (
            "layout::checks".to_owned(),
            "use super::LayoutError;\n// crate::export in a comment\nuse crate::export::ExportError;\n"
                .to_owned(),
        ),
        (
            "cuda::driver::event".to_owned(),
            "use super::super::ReadyEvents;\nuse crate::stream::SyncPlan;\n".to_owned(),
        ),
        (
            "export".to_owned(),
            "use crate::cuda::driver::{bind, init};\nfn f() { crate::python::dlpack(); }\n"
                .to_owned(),
        ),
        ("telemetry".to_owned(), String::new()),
    ];
    assert_eq!(
        violations(&files),
        [
            "layout::checks:3: `export` (layer `export`) is above `layout::checks` (layer `layout`)",
            "cuda::driver::event:1: `cuda` (layer `cuda`) is above `cuda::driver::event` (layer `cuda::driver`)",
            "export:2: `python` (layer `python`) is above `export` (layer `export`)",
            "module `telemetry` belongs to no layer: add it to LAYERS in tests/layers.rs",
        ]
    );
}

#[test]
fn paths_resolve_to_their_modules() {
    assert_eq!(path_at("cuda::driver::{bind, init};"), "cuda::driver");
    assert_eq!(path_at("layout::LayoutError"), "layout");
    assert_eq!(path_at("Element"), "");
    assert_eq!(layer_of("cuda::driver::event"), Some(9));
    assert_eq!(layer_of("cuda"), Some(14));
    assert_eq!(layer_of("cudax"), None);
    assert_eq!(module_of(Path::new("cuda/driver/mod.rs")), "cuda::driver");
    assert_eq!(module_of(Path::new("export/block.rs")), "export::block");
    assert_eq!(module_of(Path::new("lib.rs")), "");
}
