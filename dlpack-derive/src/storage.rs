//! `#[derive(DlpackStorage)]` and `#[derive(DlpackImportStorage)]`: a storage enum whose
//! variants each hold one buffer (or a struct with one field) becomes the buffer of a tensor's
//! `#[dlpack(data)]` field.
//!
//! - `DlpackStorage` implements the safe `AsExportBuffer` by matching on the variant and lending
//!   its buffer; an `Arc<Storage>` is then exportable too.
//! - `DlpackImportStorage` implements `ImportBuffer` by asking each variant's buffer, in
//!   declaration order, whether it accepts the tensor (`ImportedData<f32>` accepts float32, say),
//!   and building the first that does.
//!
//! Each variant's type is bound in the where clause, spanned at the type, so an unfit buffer is
//! reported on the variant with the runtime trait's message.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Data, DeriveInput, Fields, Ident, Member};

use crate::ast::{Options, dlpack_attrs, options};
use crate::ctxt::Ctxt;
use crate::expand::{TypeSpan, mentions_generics, spanned_bound};

/// Which storage derive is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `#[derive(DlpackStorage)]`: `AsExportBuffer`.
    Export,
    /// `#[derive(DlpackImportStorage)]`: `ImportBuffer`.
    Import,
}

impl Storage {
    fn derive_name(self) -> &'static str {
        match self {
            Storage::Export => "DlpackStorage",
            Storage::Import => "DlpackImportStorage",
        }
    }

    /// A variant holding one buffer of this kind, for error messages: an owned buffer for a
    /// producer's storage, an imported one for a consumer's.
    fn example_variant(self) -> &'static str {
        match self {
            Storage::Export => "F32(Vec<f32>)",
            Storage::Import => "F32(ImportedData<f32>)",
        }
    }
}

/// One way the storage can be: an enum variant or the struct itself, with its one buffer.
struct Arm<'a> {
    /// `Self::Variant` or `Self`.
    path: TokenStream,
    /// The variant's name, for import errors (the struct's name for a struct).
    name: String,
    /// The buffer: how to reach it in a pattern, and its type.
    member: Member,
    ty: &'a syn::Type,
}

/// Expands a storage derive; all errors at once when the input is unfit.
pub fn derive(input: &DeriveInput, storage: Storage) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let Options {
        krate,
        readonly,
        transparent,
        constraints,
    } = options(&cx, &input.attrs);
    let options_elsewhere = readonly
        .into_iter()
        .map(|span| (span, "readonly", "DlpackExport"))
        .chain(
            transparent
                .into_iter()
                .map(|span| (span, "transparent", "DlpackExport` or `DlpackImport")),
        )
        .chain(
            constraints
                .iter()
                .map(|c| (c.key, c.kind.key().keyword(), "DlpackImport")),
        );
    for (span, key, belongs_to) in options_elsewhere {
        cx.error_at(
            span,
            format_args!(
                "`{key}` is an option of a tensor struct, not of its storage: `{}` takes only `#[dlpack(crate = \"...\")]`; write `{key}` on the struct that derives `{belongs_to}`",
                storage.derive_name(),
            ),
        );
    }
    let arms = arms(&cx, input, storage);
    cx.check()?;
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let existing = where_clause.into_iter().flat_map(|w| w.predicates.iter());
    let trait_name = match storage {
        Storage::Export => quote!(AsExportBuffer),
        Storage::Import => quote!(ImportBuffer),
    };
    // Bounds on generic variant types only (a bound on a concrete type is a "trivial bound",
    // reported with a note on an unstable feature); the calls report unfit concrete types.
    let bounds = arms
        .iter()
        .filter(|arm| mentions_generics(arm.ty, &input.generics))
        .map(|arm| spanned_bound(arm.ty, quote!(#krate::__private::#trait_name)));
    let items = match storage {
        Storage::Export => export_items(&krate, &arms),
        Storage::Import if matches!(input.data, Data::Struct(_)) => {
            let items = import_struct_items(&krate, &arms);
            let borrows = import_borrow_items(&krate, &arms);
            quote!(#items #borrows)
        }
        Storage::Import => {
            let items = import_items(&krate, ident, &arms);
            let borrows = import_borrow_items(&krate, &arms);
            quote!(#items #borrows)
        }
    };
    Ok(quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #krate::__private::#trait_name for #ident #ty_generics
            where
                #(#existing,)*
                #(#bounds,)*
            {
                #items
            }
        };
    })
}

/// `errors`, then a stand-in impl, so that uses of the storage report nothing more.
pub fn fallback(input: &DeriveInput, storage: Storage, errors: syn::Error) -> TokenStream {
    let krate = crate::ast::crate_path(&input.attrs);
    let (trait_name, items) = match storage {
        Storage::Export => (
            quote!(AsExportBuffer),
            quote! {
                fn as_export_buffer(&self) -> &dyn #krate::__private::ExportBuffer {
                    ::core::unreachable!()
                }
            },
        ),
        Storage::Import => (
            quote!(ImportBuffer),
            quote! {
                fn from_managed(
                    _: #krate::__private::ManagedTensor,
                ) -> ::core::result::Result<Self, #krate::__private::ImportError> {
                    ::core::unreachable!()
                }
            },
        ),
    };
    crate::expand::stand_in(input, errors, &krate, trait_name, items)
}

/// The arms of the storage, each with one buffer; errors for variants that are not.
fn arms<'a>(cx: &Ctxt, input: &'a DeriveInput, storage: Storage) -> Vec<Arm<'a>> {
    let name = storage.derive_name();
    let example = storage.example_variant();
    match &input.data {
        Data::Enum(data) => {
            if data.variants.is_empty() {
                cx.error_spanned_by(
                    &input.ident,
                    format_args!(
                        "`{name}` needs at least one variant, each holding one buffer, as in `{example}`"
                    ),
                );
            }
            data.variants
                .iter()
                .filter_map(|variant| {
                    no_roles(cx, &variant.attrs, name);
                    let variant_ident = &variant.ident;
                    let (member, ty) = one_field(cx, &variant.fields, variant_ident, storage)?;
                    Some(Arm {
                        path: quote!(Self::#variant_ident),
                        name: variant_ident.to_string(),
                        member,
                        ty,
                    })
                })
                .collect()
        }
        Data::Struct(data) => one_field(cx, &data.fields, &input.ident, storage)
            .map(|(member, ty)| Arm {
                path: quote!(Self),
                name: input.ident.to_string(),
                member,
                ty,
            })
            .into_iter()
            .collect(),
        Data::Union(data) => {
            cx.error_spanned_by(
                data.union_token,
                format_args!("`{name}` cannot be derived for unions"),
            );
            Vec::new()
        }
    }
}

/// The single field of a variant (or struct): how to reach it and its type.
fn one_field<'a>(
    cx: &Ctxt,
    fields: &'a Fields,
    ident: &Ident,
    storage: Storage,
) -> Option<(Member, &'a syn::Type)> {
    let (name, example) = (storage.derive_name(), storage.example_variant());
    for field in fields {
        no_roles(cx, &field.attrs, name);
    }
    if fields.len() != 1 {
        let found = match fields.len() {
            0 => "none".to_owned(),
            n => format!("{n} fields"),
        };
        cx.error_spanned_by(
            ident,
            format_args!(
                "`{name}` needs exactly one field here, the buffer, as in `{example}`; `{ident}` holds {found}"
            ),
        );
        return None;
    }
    let field = fields.iter().next()?;
    let member = match &field.ident {
        Some(ident) => Member::Named(ident.clone()),
        None => Member::Unnamed(0.into()),
    };
    Some((member, &field.ty))
}

/// Storage has no roles: its one field per variant is the buffer.
fn no_roles(cx: &Ctxt, attrs: &[syn::Attribute], name: &str) {
    for attr in dlpack_attrs(attrs) {
        cx.error_spanned_by(
            attr,
            format_args!(
                "`{name}` takes no `#[dlpack(...)]` on variants or fields: each variant's one field is its buffer"
            ),
        );
    }
}

/// `as_export_buffer` and `as_export_buffer_mut`: the variant's buffer, lent through its own
/// `AsExportBuffer`.
fn export_items(krate: &syn::Path, arms: &[Arm<'_>]) -> TokenStream {
    let private = quote!(#krate::__private);
    let patterns: Vec<_> = arms
        .iter()
        .map(|Arm { path, member, .. }| quote!(#path { #member: __dlpack_buffer }))
        .collect();
    let lend = |call: TokenStream| -> Vec<TokenStream> {
        arms.iter()
            .map(|arm| TypeSpan::qualified(arm.ty, quote!(#private::AsExportBuffer), call.clone()))
            .collect()
    };
    let shared = lend(quote!(as_export_buffer(__dlpack_buffer)));
    let unique = lend(quote!(as_export_buffer_mut(__dlpack_buffer)));
    quote! {
        fn as_export_buffer(&self) -> &dyn #private::ExportBuffer {
            match self {
                #(#patterns => #shared,)*
            }
        }
        fn as_export_buffer_mut(&mut self) -> #private::BufferAccess<'_> {
            match self {
                #(#patterns => #unique,)*
            }
        }
    }
}

/// `from_managed` and `accepts` of a struct with one buffer: the buffer's.
fn import_struct_items(krate: &syn::Path, arms: &[Arm<'_>]) -> TokenStream {
    let private = quote!(#krate::__private);
    let Some(Arm { member, ty, .. }) = arms.first() else {
        return TokenStream::new();
    };
    let import = TypeSpan::qualified(
        ty,
        quote!(#private::ImportBuffer),
        quote!(from_managed(__dlpack_managed)),
    );
    let accepts = TypeSpan::qualified(
        ty,
        quote!(#private::ImportBuffer),
        quote!(accepts(__dlpack_managed)),
    );
    quote! {
        fn from_managed(
            __dlpack_managed: #private::ManagedTensor,
        ) -> ::core::result::Result<Self, #private::ImportError> {
            #import.map(|__dlpack_buffer| Self { #member: __dlpack_buffer })
        }
        fn accepts(
            __dlpack_managed: &#private::ManagedTensor,
        ) -> ::core::result::Result<(), #private::ImportError> {
            #accepts
        }
    }
}

/// `BORROWS_AT_IMPORT` and `borrow_at_import`: the storage borrows at import when every
/// variant's buffer does, and takes the borrow of the variant it holds.
fn import_borrow_items(krate: &syn::Path, arms: &[Arm<'_>]) -> TokenStream {
    let private = quote!(#krate::__private);
    let borrows = arms
        .iter()
        .map(|Arm { ty, .. }| quote!(<#ty as #private::ImportBuffer>::BORROWS_AT_IMPORT));
    let patterns = arms
        .iter()
        .map(|Arm { path, member, .. }| quote!(#path { #member: __dlpack_buffer }));
    let calls = arms.iter().map(|Arm { ty, .. }| {
        TypeSpan::qualified(
            ty,
            quote!(#private::ImportBuffer),
            quote!(borrow_at_import(__dlpack_buffer, __dlpack_access)),
        )
    });
    quote! {
        const BORROWS_AT_IMPORT: ::core::primitive::bool = true #(&& #borrows)*;
        fn borrow_at_import(
            &mut self,
            __dlpack_access: #private::Access,
        ) -> ::core::result::Result<(), #private::ImportError> {
            match self {
                #(#patterns => #calls,)*
            }
        }
    }
}

/// `from_managed` and `accepts`: the first variant, in declaration order, whose buffer accepts
/// the tensor; otherwise every variant's reason.
fn import_items(krate: &syn::Path, ident: &Ident, arms: &[Arm<'_>]) -> TokenStream {
    let private = quote!(#krate::__private);
    let storage_name = ident.to_string();
    let reasons: Vec<_> = (0..arms.len())
        .map(|index| Ident::new(&format!("__dlpack_refused_{index}"), Span::call_site()))
        .collect();
    let names = arms.iter().map(|arm| &arm.name);
    let refusals = quote! {
        #private::no_variant(#storage_name, [#((#names, #reasons),)*])
    };
    let tries = arms.iter().zip(&reasons).map(|(arm, reason)| {
        let Arm {
            path, member, ty, ..
        } = arm;
        let accepts = TypeSpan::qualified(
            ty,
            quote!(#private::ImportBuffer),
            quote!(accepts(&__dlpack_managed)),
        );
        let import = TypeSpan::qualified(
            ty,
            quote!(#private::ImportBuffer),
            quote!(from_managed(__dlpack_managed)),
        );
        quote! {
            let #reason = match #accepts {
                ::core::result::Result::Ok(()) => {
                    return #import.map(|__dlpack_buffer| #path { #member: __dlpack_buffer });
                }
                ::core::result::Result::Err(__dlpack_error) => __dlpack_error,
            };
        }
    });
    let asks = arms.iter().zip(&reasons).map(|(Arm { ty, .. }, reason)| {
        let accepts = TypeSpan::qualified(
            ty,
            quote!(#private::ImportBuffer),
            quote!(accepts(__dlpack_managed)),
        );
        quote! {
            let #reason = match #accepts {
                ::core::result::Result::Ok(()) => return ::core::result::Result::Ok(()),
                ::core::result::Result::Err(__dlpack_error) => __dlpack_error,
            };
        }
    });
    quote! {
        fn from_managed(
            __dlpack_managed: #private::ManagedTensor,
        ) -> ::core::result::Result<Self, #private::ImportError> {
            #(#tries)*
            ::core::result::Result::Err(#refusals)
        }
        fn accepts(
            __dlpack_managed: &#private::ManagedTensor,
        ) -> ::core::result::Result<(), #private::ImportError> {
            #(#asks)*
            ::core::result::Result::Err(#refusals)
        }
    }
}
