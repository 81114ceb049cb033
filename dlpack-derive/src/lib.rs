//! Derive macros for [`dlpack-runtime`](https://docs.rs/dlpack-runtime):
//! `#[derive(DlpackExport)]` and `#[derive(DlpackImport)]`.
//!
//! Use them through `dlpack_runtime`, which re-exports them and documents the attributes. The
//! crate reads the input into a typed front end (`attr`, `ast`), checks the rules between
//! fields (`check`), collecting every error on the way (`ctxt`), and generates the impl
//! (`expand`).

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
#[cfg(test)]
mod snapshots;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

use crate::ast::Derive;

/// Derives `dlpack_runtime::DlpackExport`: the type becomes a DLPack producer. See the
/// documentation of `dlpack_runtime::DlpackExport` (the derive) for the attributes.
#[proc_macro_derive(DlpackExport, attributes(dlpack))]
pub fn derive_dlpack_export(input: TokenStream) -> TokenStream {
    run(input, Derive::Export)
}

/// Derives `dlpack_runtime::DlpackImport`: the type becomes a DLPack consumer. See the
/// documentation of `dlpack_runtime::DlpackImport` (the derive) for the attributes.
#[proc_macro_derive(DlpackImport, attributes(dlpack))]
pub fn derive_dlpack_import(input: TokenStream) -> TokenStream {
    run(input, Derive::Import)
}

/// Parses and expands; on error, the errors and a stand-in impl.
fn run(input: TokenStream, derive: Derive) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input, derive)
        .unwrap_or_else(|errors| expand::fallback(&input, derive, errors))
        .into()
}
