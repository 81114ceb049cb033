//! The typed front end: the struct, its fields and their roles, read from `syn`'s tree.
//!
//! Reading records every attribute error in the [`Ctxt`] and goes on, so that one run reports
//! them all; the rules between fields and options (each role once, `data` and `shape` present,
//! one kind of offset, constraints that agree) are in [`crate::check`].

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::parse::Parse;
use syn::{Attribute, Data, DeriveInput, Fields, Generics, Ident, Member, Type};

use crate::attr::{Constraint, ContainerAttr, ContainerKey, FieldAttr, Role};
use crate::ctxt::Ctxt;

/// Which derive is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Derive {
    /// `#[derive(DlpackExport)]`.
    Export,
    /// `#[derive(DlpackImport)]`.
    Import,
}

impl Derive {
    /// The trait's name, as in `dlpack_runtime::__private`.
    pub fn trait_name(self) -> &'static str {
        match self {
            Derive::Export => "DlpackExport",
            Derive::Import => "DlpackImport",
        }
    }

    /// The derive that turns an enum of buffers into a `#[dlpack(data)]` type for this one.
    fn storage_derive(self) -> &'static str {
        match self {
            Derive::Export => "DlpackStorage",
            Derive::Import => "DlpackImportStorage",
        }
    }
}

/// The container's `#[dlpack(...)]` options, read and checked for duplicates.
pub struct Options {
    /// Path of the runtime crate: `#[dlpack(crate = "...")]`, or `::dlpack_runtime`.
    pub krate: syn::Path,
    /// `#[dlpack(readonly)]`: the keyword's span.
    pub readonly: Option<Span>,
    /// `#[dlpack(transparent)]`: the keyword's span.
    pub transparent: Option<Span>,
    /// Consumer constraints, in the order written.
    pub constraints: Vec<Constraint>,
}

/// A struct with fields, as the derives see it.
pub struct Container<'a> {
    /// The struct's name.
    pub ident: &'a Ident,
    /// The struct's generics, where clause included.
    pub generics: &'a Generics,
    /// Path of the runtime crate: `#[dlpack(crate = "...")]`, or `::dlpack_runtime`.
    pub krate: syn::Path,
    /// `#[dlpack(readonly)]` on the struct: the keyword's span.
    pub readonly: Option<Span>,
    /// `#[dlpack(transparent)]` on the struct: the keyword's span.
    pub transparent: Option<Span>,
    /// Consumer constraints on the struct, in the order written.
    pub constraints: Vec<Constraint>,
    /// Which derive is reading.
    pub derive: Derive,
    /// Every field, in declaration order.
    pub fields: Vec<Field<'a>>,
    /// Whether every `#[dlpack(...)]` on the fields could be read. When one could not, the
    /// role it meant is unknown, so "found none" errors would be noise.
    pub attrs_complete: bool,
    /// Roles refused as a field's second role: written, only on the wrong field, so "found
    /// none" errors about them would be noise too.
    pub refused_roles: Vec<Role>,
}

/// One field of the struct.
pub struct Field<'a> {
    /// How to reach it: `self.name` or `self.0`.
    pub member: Member,
    /// Its type, as written (errors about the type point here).
    pub ty: &'a Type,
    /// Its role, if it has one.
    pub role: Option<FieldAttr>,
}

impl<'a> Container<'a> {
    /// Reads `input`. `None` when it is not a struct with fields; the reason is in `cx`.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput, derive: Derive) -> Option<Self> {
        let Options {
            krate,
            readonly,
            transparent,
            constraints,
        } = options(cx, &input.attrs);
        let fields = match &input.data {
            Data::Struct(data) => &data.fields,
            Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    format_args!(
                        "`{}` cannot be derived for enums: a storage enum derives `{}` and is the `#[dlpack(data)]` field of a struct that derives `{}`",
                        derive.trait_name(),
                        derive.storage_derive(),
                        derive.trait_name()
                    ),
                );
                return None;
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    format_args!("`{}` cannot be derived for unions", derive.trait_name()),
                );
                return None;
            }
        };
        if let Fields::Unit = fields {
            cx.error_spanned_by(&input.ident, "expected a struct with fields");
            return None;
        }
        if let Some(packed) = repr_packed(&input.attrs) {
            cx.error_spanned_by(
                packed,
                format_args!(
                    "`{}` cannot be derived for a `#[repr(packed)]` struct: its fields may be unaligned, and the tensor's fields are lent by reference; remove `packed` (put the packed struct's values in a struct of their own, aligned)",
                    derive.trait_name()
                ),
            );
            return None;
        }
        let mut attrs_complete = true;
        let mut refused_roles = Vec::new();
        let fields = fields
            .iter()
            .enumerate()
            .map(|(index, field)| Field {
                member: match &field.ident {
                    Some(ident) => Member::Named(ident.clone()),
                    None => Member::Unnamed(index.into()),
                },
                ty: &field.ty,
                role: field_role(cx, &field.attrs, &mut attrs_complete, &mut refused_roles),
            })
            .collect();
        Some(Container {
            ident: &input.ident,
            generics: &input.generics,
            krate,
            readonly,
            transparent,
            constraints,
            derive,
            fields,
            attrs_complete,
            refused_roles,
        })
    }
}

impl Field<'_> {
    /// The field's role, if any.
    pub fn role(&self) -> Option<Role> {
        self.role.as_ref().map(|attr| attr.role)
    }
}

/// The runtime crate's path from the container's `#[dlpack(...)]`, or `::dlpack_runtime`.
/// Errors in those attributes are reported by [`options`]; this is for stand-in impls.
pub fn crate_path(attrs: &[Attribute]) -> syn::Path {
    let cx = Ctxt::new();
    let krate = options(&cx, attrs).krate;
    // Reported by whoever read the options for real.
    let _ = cx.check();
    krate
}

/// The container's `#[dlpack(...)]` options. Reports unreadable items and options given twice.
pub fn options(cx: &Ctxt, attrs: &[Attribute]) -> Options {
    let mut krate = None;
    let mut readonly = None;
    let mut transparent = None;
    let mut constraints: Vec<Constraint> = Vec::new();
    for attr in dlpack_attrs(attrs) {
        let (items, _) = list_items::<ContainerAttr>(
            cx,
            attr,
            "an empty `#[dlpack()]` on the struct sets nothing: write an option, as in `#[dlpack(readonly)]` or `#[dlpack(dtype = f32)]`, or remove the attribute",
        );
        for item in items {
            match item {
                ContainerAttr::Crate { span, path } => {
                    if krate.is_some() {
                        cx.error_at(span, once(ContainerKey::Crate));
                    } else {
                        krate = Some(path);
                    }
                }
                ContainerAttr::Readonly { span } => {
                    if readonly.is_some() {
                        cx.error_at(span, once(ContainerKey::Readonly));
                    } else {
                        readonly = Some(span);
                    }
                }
                ContainerAttr::Transparent { span } => {
                    if transparent.is_some() {
                        cx.error_at(span, once(ContainerKey::Transparent));
                    } else {
                        transparent = Some(span);
                    }
                }
                ContainerAttr::Constraint(constraint) => {
                    let key = constraint.kind.key();
                    if constraints.iter().any(|c| c.kind.key() == key) {
                        cx.error_at(constraint.key, once(key));
                    } else {
                        constraints.push(constraint);
                    }
                }
            }
        }
    }
    Options {
        krate: krate.unwrap_or_else(|| syn::parse_quote!(::dlpack_runtime)),
        readonly,
        transparent,
        constraints,
    }
}

/// The error for a container key written twice.
fn once(key: ContainerKey) -> String {
    format!("{key} may only be specified once")
}

/// The role given by a field's `#[dlpack(...)]`; a second role is an error, and is added to
/// `refused`. `complete` is cleared when an attribute cannot be read.
fn field_role(
    cx: &Ctxt,
    attrs: &[Attribute],
    complete: &mut bool,
    refused: &mut Vec<Role>,
) -> Option<FieldAttr> {
    let mut role: Option<FieldAttr> = None;
    for attr in dlpack_attrs(attrs) {
        let (items, all_read) = list_items::<FieldAttr>(
            cx,
            attr,
            "an empty `#[dlpack()]` gives the field no role: write its role, as in `#[dlpack(data)]` or `#[dlpack(shape)]`, or remove the attribute",
        );
        *complete &= all_read;
        for item in items {
            match &role {
                None => role = Some(item),
                Some(first) if first.role == item.role => {
                    cx.error_at(
                        item.span,
                        format_args!("{} may only be specified once", item.role),
                    );
                }
                Some(first) => {
                    cx.error_at(
                        item.span,
                        format_args!(
                            "a field has exactly one role: this field is already {}, put {} on another field",
                            first.role, item.role
                        ),
                    );
                    refused.push(item.role);
                }
            }
        }
    }
    role
}

/// The `packed` (or `packed(N)`) of a `#[repr(...)]`, if the struct has one.
fn repr_packed(attrs: &[Attribute]) -> Option<TokenStream> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("repr"))
        .find_map(|attr| {
            let syn::Meta::List(list) = &attr.meta else {
                return None;
            };
            let mut tokens = list.tokens.clone().into_iter().peekable();
            while let Some(token) = tokens.next() {
                if matches!(&token, TokenTree::Ident(ident) if ident == "packed") {
                    let mut packed: TokenStream = core::iter::once(token).collect();
                    if let Some(TokenTree::Group(group)) = tokens.peek() {
                        packed.extend([TokenTree::Group(group.clone())]);
                    }
                    return Some(packed);
                }
            }
            None
        })
}

/// The attributes of this crate's namespace, `#[dlpack(...)]`.
pub fn dlpack_attrs(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|attr| attr.path().is_ident("dlpack"))
}

/// The items of `#[dlpack(a, b, ...)]` that could be read, each read on its own, so that every
/// unreadable item is reported (in `cx`), not only the first; and whether every item was read.
/// An empty list, `#[dlpack()]`, is reported with the message `empty`.
fn list_items<T: Parse>(cx: &Ctxt, attr: &Attribute, empty: &str) -> (Vec<T>, bool) {
    let list = match &attr.meta {
        syn::Meta::List(list) => list,
        _ => {
            // `#[dlpack]` or `#[dlpack = ...]`: syn's own error says what is expected.
            if let Err(error) = attr.parse_args::<proc_macro2::TokenStream>() {
                cx.syn_error(error);
            }
            return (Vec::new(), false);
        }
    };
    if list.tokens.is_empty() {
        cx.error_spanned_by(attr, empty);
        return (Vec::new(), false);
    }
    let mut items = Vec::new();
    let mut complete = true;
    let mut chunk = TokenStream::new();
    let mut chunks = Vec::new();
    for token in list.tokens.clone() {
        match &token {
            TokenTree::Punct(punct) if punct.as_char() == ',' => {
                chunks.push(core::mem::take(&mut chunk));
            }
            _ => chunk.extend([token]),
        }
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    for chunk in chunks {
        if chunk.is_empty() {
            cx.error_spanned_by(&list.tokens, "expected an item between two commas");
            complete = false;
            continue;
        }
        match syn::parse2::<T>(chunk) {
            Ok(item) => items.push(item),
            Err(error) => {
                cx.syn_error(error);
                complete = false;
            }
        }
    }
    (items, complete)
}
