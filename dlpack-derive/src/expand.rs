//! Code generation.
//!
//! The output is one `const _: () = { ... };` holding one `#[automatically_derived]` impl. It
//! names everything by absolute path (`#krate::__private::...`, `::core::...`) and holds no
//! `unsafe`, so it compiles in crates with `#![no_implicit_prelude]` or
//! `#![forbid(unsafe_code)]`. Trait requirements on role fields are where-clause bounds on the
//! field *types*, spanned at the type, so an unsuitable type is reported on the user's field
//! with the runtime trait's `#[diagnostic::on_unimplemented]` message.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote};
use syn::DeriveInput;

use crate::ast::{Container, Derive, Field};
use crate::attr::Role;
use crate::check::{self, Roles};
use crate::ctxt::Ctxt;

/// Expands `#[derive(DlpackExport)]` or `#[derive(DlpackImport)]` on `input`; all errors at
/// once when the input is unfit.
pub fn derive(input: &DeriveInput, derive: Derive) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let cont = Container::from_ast(&cx, input, derive);
    let roles = cont.as_ref().and_then(|cont| check::check(&cx, cont));
    cx.check()?;
    let Some(roles) = roles else {
        unreachable!(
            "`Container::from_ast` and `check::check` report an error whenever they return `None`"
        )
    };
    let body = match derive {
        Derive::Export => export(&roles),
        Derive::Import => import(&roles),
    };
    Ok(quote! {
        const _: () = {
            #body
        };
    })
}

/// `errors`, followed by a stand-in impl, as thiserror does: code that uses the type as a
/// producer or consumer then compiles, and the user sees the derive's errors only.
pub fn fallback(input: &DeriveInput, derive: Derive, errors: syn::Error) -> TokenStream {
    let errors = errors.into_compile_error();
    let cx = Ctxt::new();
    let krate = crate::ast::crate_path(&cx, &input.attrs);
    // Already reported by `derive`.
    let _ = cx.check();
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let (trait_name, items) = match derive {
        Derive::Export => (
            quote!(DlpackExport),
            quote! {
                fn export_parts(&self) -> #krate::__private::ExportParts<'_> {
                    ::core::unreachable!()
                }
                fn export_parts_mut(&mut self) -> #krate::__private::ExportParts<'_> {
                    ::core::unreachable!()
                }
            },
        ),
        Derive::Import => (
            quote!(DlpackImport),
            quote! {
                fn from_managed(
                    _: #krate::__private::ManagedTensor,
                ) -> ::core::result::Result<Self, #krate::__private::ImportError> {
                    ::core::unreachable!()
                }
            },
        ),
    };
    quote! {
        #errors
        const _: () = {
            #[automatically_derived]
            impl #impl_generics #krate::__private::#trait_name for #ident #ty_generics #where_clause {
                #items
            }
        };
    }
}

/// `impl DlpackExport`: the fields, borrowed, as `ExportParts`.
fn export(roles: &Roles<'_, '_>) -> TokenStream {
    let cont = roles.cont;
    let (krate, ident) = (&cont.krate, cont.ident);
    let (impl_generics, ty_generics, _) = cont.generics.split_for_impl();
    let where_clause = where_clause(roles, Derive::Export);
    let shared = export_parts(roles, quote!(shared), quote!(&));
    let unique = export_parts(roles, quote!(unique), quote!(&mut));
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::__private::DlpackExport for #ident #ty_generics #where_clause {
            fn export_parts(&self) -> #krate::__private::ExportParts<'_> {
                #shared
            }
            fn export_parts_mut(&mut self) -> #krate::__private::ExportParts<'_> {
                #unique
            }
        }
    }
}

/// `ExportParts::#constructor(#borrow self.data, shape)`, then a builder call per optional
/// role. The where clause guarantees the trait calls; the plain-typed fields are spanned at
/// their type, where a type mismatch is reported.
fn export_parts(
    roles: &Roles<'_, '_>,
    constructor: TokenStream,
    borrow: TokenStream,
) -> TokenStream {
    let krate = &roles.cont.krate;
    let data = &roles.data.member;
    let shape = &roles.shape.member;
    let strides = roles.strides.map(|field| {
        let member = &field.member;
        quote!(.with_strides(#krate::__private::AsStrides::as_strides(&self.#member)))
    });
    let byte_offset = roles.byte_offset.map(|field| {
        let member = &field.member;
        let value = TypeSpan::of(field).across(quote!(self.#member));
        quote!(.with_byte_offset(#value))
    });
    let device = roles.device.map(|field| {
        let member = &field.member;
        let value = TypeSpan::of(field).across(quote!(self.#member));
        quote!(.with_device(#value))
    });
    quote! {
        #krate::__private::ExportParts::#constructor(
            #borrow self.#data,
            #krate::__private::AsShape::as_shape(&self.#shape),
        )
        #strides
        #byte_offset
        #device
    }
}

/// `impl DlpackImport`: validate once, read the layout into the role fields, then move the
/// managed tensor into the data field. Other fields get `Default::default()`.
fn import(roles: &Roles<'_, '_>) -> TokenStream {
    let cont = roles.cont;
    let (krate, ident) = (&cont.krate, cont.ident);
    let (impl_generics, ty_generics, _) = cont.generics.split_for_impl();
    let where_clause = where_clause(roles, Derive::Import);
    // Without a strides field the type cannot describe a strided layout: require C order.
    let contiguity = match roles.strides {
        None => quote!(.contiguous(#krate::__private::Contiguity::C)),
        Some(_) => TokenStream::new(),
    };
    // Every role but `data` is read from the layout, which borrows the managed tensor, before
    // `data` takes it. Trait calls are guaranteed by the where clause; the plain-typed values
    // are spanned at their field's type, where a type mismatch is reported.
    let (locals, reads): (Vec<_>, Vec<_>) = cont
        .fields
        .iter()
        .filter_map(|field| {
            let role = field.role()?;
            let ty = field.ty;
            let read = match role {
                Role::Data => return None,
                Role::Shape => quote! {
                    <#ty as #krate::__private::FromShape>::from_shape(__dlpack_layout.shape())?
                },
                Role::Strides => quote! {
                    <#ty as #krate::__private::FromStrides>::from_strides(&__dlpack_layout)?
                },
                Role::ByteOffset => {
                    TypeSpan::of(field).across(quote!(__dlpack_layout.byte_offset()))
                }
                Role::Device => TypeSpan::of(field).across(quote!(__dlpack_layout.device())),
            };
            Some((local(role), read))
        })
        .unzip();
    let data_ty = roles.data.ty;
    let inits = cont.fields.iter().map(|field| {
        let member = &field.member;
        let value = match field.role() {
            Some(role) => local(role).into_token_stream(),
            None => TypeSpan::of(field).across(quote!(::core::default::Default::default())),
        };
        quote!(#member: #value)
    });
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::__private::DlpackImport for #ident #ty_generics #where_clause {
            fn from_managed(
                __dlpack_managed: #krate::__private::ManagedTensor,
            ) -> ::core::result::Result<Self, #krate::__private::ImportError> {
                let __dlpack_constraints = #krate::__private::ImportConstraints::new() #contiguity;
                let (#(#locals,)*) = {
                    let __dlpack_layout = #krate::__private::import_layout(&__dlpack_managed, &__dlpack_constraints)?;
                    (#(#reads,)*)
                };
                let __dlpack_data = <#data_ty as #krate::__private::ImportBuffer>::from_managed(__dlpack_managed)?;
                ::core::result::Result::Ok(Self { #(#inits,)* })
            }
        }
    }
}

/// The local variable holding a role's value in `from_managed`; the `__dlpack_` prefix keeps
/// it apart from anything the user names.
fn local(role: Role) -> syn::Ident {
    format_ident!("__dlpack_{}", role.keyword())
}

/// The user's where clause plus one bound per role field whose type must implement a runtime
/// trait. The bound is spanned across the field's type, so an unfit type is reported there,
/// with the trait's `#[diagnostic::on_unimplemented]` message.
fn where_clause(roles: &Roles<'_, '_>, derive: Derive) -> TokenStream {
    let krate = &roles.cont.krate;
    let existing = roles
        .cont
        .generics
        .where_clause
        .iter()
        .flat_map(|clause| clause.predicates.iter());
    let bounds = Role::ALL.into_iter().filter_map(|role| {
        let field = roles.get(role)?;
        let bound = bound_trait(role, derive)?;
        let ty = field.ty;
        let colon_bound = respan(
            quote!(: #krate::__private::#bound),
            TypeSpan::of(field).last,
        );
        Some(quote!(#ty #colon_bound))
    });
    quote!(where #(#existing,)* #(#bounds,)*)
}

/// The runtime trait a role field's type must implement, for roles with one.
fn bound_trait(role: Role, derive: Derive) -> Option<TokenStream> {
    match (derive, role) {
        (Derive::Export, Role::Data) => Some(quote!(ExportBuffer)),
        (Derive::Export, Role::Shape) => Some(quote!(AsShape)),
        (Derive::Export, Role::Strides) => Some(quote!(AsStrides)),
        (Derive::Import, Role::Data) => Some(quote!(ImportBuffer)),
        (Derive::Import, Role::Shape) => Some(quote!(FromShape)),
        (Derive::Import, Role::Strides) => Some(quote!(FromStrides)),
        // Plain types (`usize` or `u64`, `Device`): a mismatch is a type error at the field.
        (_, Role::ByteOffset | Role::Device) => None,
    }
}

/// Where errors about a field's type should point: its first and last token. Generated
/// tokens spanned from the first to the last make rustc underline the whole type (a
/// proc-macro span cannot cover several tokens by itself on stable).
#[derive(Clone, Copy)]
struct TypeSpan {
    first: Span,
    last: Span,
}

impl TypeSpan {
    fn of(field: &Field<'_>) -> Self {
        let mut tokens = field
            .ty
            .to_token_stream()
            .into_iter()
            .map(|token| token.span());
        let first = tokens.next().unwrap_or_else(Span::call_site);
        let last = tokens.last().unwrap_or(first);
        TypeSpan { first, last }
    }

    /// `tokens` spanned across the type: the first token at its first token, the others at
    /// its last, so that errors about the expression point at the field's type.
    fn across(self, tokens: TokenStream) -> TokenStream {
        let mut tokens = tokens.into_iter();
        let head: TokenStream = tokens.next().into_iter().collect();
        let mut out = respan(head, self.first);
        out.extend(respan(tokens.collect(), self.last));
        out
    }
}

/// `tokens` with every span set to `span`, so that errors in them point at the user's field.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                token = TokenTree::Group(respanned);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}
