//! Derive macros for [`dlpack-runtime`](https://docs.rs/dlpack-runtime):
//! `#[derive(DlpackExport)]` and `#[derive(DlpackImport)]`, and the storage derives
//! `#[derive(DlpackStorage)]` and `#[derive(DlpackImportStorage)]`.
//!
//! Use them through `dlpack_runtime`, which re-exports them and documents the attributes. The
//! crate reads the input into a typed front end (`attr`, `ast`), checks the rules between
//! fields (`check`), collecting every error on the way (`ctxt`), and generates the impl
//! (`expand`). The storage derives, `#[derive(DlpackStorage)]` and
//! `#[derive(DlpackImportStorage)]`, live in `storage`.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
#[cfg(test)]
mod snapshots;
mod storage;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

use crate::ast::Derive;
use crate::storage::Storage;

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

/// Derives `dlpack_runtime::AsExportBuffer` for a storage enum whose variants each hold one
/// buffer (or a struct with one field), so it can be the `#[dlpack(data)]` of a `DlpackExport`
/// type, alone or in an `Arc`. See the documentation of `dlpack_runtime::DlpackStorage`.
#[proc_macro_derive(DlpackStorage, attributes(dlpack))]
pub fn derive_dlpack_storage(input: TokenStream) -> TokenStream {
    run_storage(input, Storage::Export)
}

/// Derives `dlpack_runtime::ImportBuffer` for an enum whose variants each hold one imported
/// buffer (`ImportedData<f32>`, ...): the first variant that accepts the tensor is built. See the
/// documentation of `dlpack_runtime::DlpackImportStorage`.
#[proc_macro_derive(DlpackImportStorage, attributes(dlpack))]
pub fn derive_dlpack_import_storage(input: TokenStream) -> TokenStream {
    run_storage(input, Storage::Import)
}

/// Parses and expands a storage derive; on error, the errors and a stand-in impl.
fn run_storage(input: TokenStream, storage: Storage) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    storage::derive(&input, storage)
        .unwrap_or_else(|errors| storage::fallback(&input, storage, errors))
        .into()
}

/// Parses and expands; on error, the errors and a stand-in impl.
fn run(input: TokenStream, derive: Derive) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input, derive)
        .unwrap_or_else(|errors| expand::fallback(&input, derive, errors))
        .into()
}
