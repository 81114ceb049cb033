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
use crate::attr::{BorrowKind, Constraint, ConstraintKind, DeviceKind, Order, Role};
use crate::check::{self, Roles};
use crate::ctxt::Ctxt;

/// Expands `#[derive(DlpackExport)]` or `#[derive(DlpackImport)]` on `input`; all errors at
/// once when the input is unfit.
pub fn derive(input: &DeriveInput, derive: Derive) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let cont = Container::from_ast(&cx, input, derive);
    if let Some(cont) = cont.as_ref().filter(|cont| cont.transparent.is_some()) {
        let body = transparent(&cx, cont);
        cx.check()?;
        return Ok(quote! {
            const _: () = {
                #body
            };
        });
    }
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
    let krate = crate::ast::crate_path(&input.attrs);
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
    stand_in(input, errors, &krate, trait_name, items)
}

/// `errors`, then `impl #krate::__private::#trait_name for` the input type with `items`: the
/// stand-in impl that every derive emits on error, so that uses of the type report nothing
/// more than the derive's errors.
pub fn stand_in(
    input: &DeriveInput,
    errors: syn::Error,
    krate: &syn::Path,
    trait_name: TokenStream,
    items: TokenStream,
) -> TokenStream {
    let errors = errors.into_compile_error();
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
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
    // Consumer constraints on a producer: an error at each, unless the type is also a consumer.
    let needs_import = cont.constraints.iter().map(|constraint| {
        respan(
            quote!(#krate::__private::constraint_needs_import::<Self>();),
            constraint.key,
        )
    });
    let shared = export_parts(roles, false);
    // A `readonly` type never hands out a writable pointer, so its by-value export borrows the
    // buffer shared too: no uniqueness query (an `Arc`'s count) for a pointer it would not use.
    let unique = export_parts(roles, cont.readonly.is_none());
    quote! {
        #[automatically_derived]
        impl #impl_generics #krate::__private::DlpackExport for #ident #ty_generics #where_clause {
            #[inline]
            fn export_parts(&self) -> #krate::__private::ExportParts<'_> {
                #(#needs_import)*
                #shared
            }
            #[inline]
            fn export_parts_mut(&mut self) -> #krate::__private::ExportParts<'_> {
                #unique
            }
        }
    }
}

/// `ExportParts` of the data and shape fields, borrowed shared or uniquely, then a builder call
/// per optional role. The where clause guarantees the trait calls; the plain-typed fields are
/// spanned at their type, where a type mismatch is reported.
fn export_parts(roles: &Roles<'_, '_>, unique: bool) -> TokenStream {
    let krate = &roles.cont.krate;
    let (data, data_ty) = (&roles.data.member, roles.data.ty);
    let (shape, shape_ty) = (&roles.shape.member, roles.shape.ty);
    // Trait calls name the field's type and are spanned at it: an unfit type is reported there,
    // once, whether or not the where clause names it (it names generic types only).
    let shape = TypeSpan::qualified(
        shape_ty,
        quote!(#krate::__private::AsShape),
        quote!(as_shape(&self.#shape)),
    );
    let call = if unique {
        quote!(as_export_buffer_mut(&mut self.#data))
    } else {
        quote!(as_export_buffer(&self.#data))
    };
    let buffer = TypeSpan::qualified(data_ty, quote!(#krate::__private::AsExportBuffer), call);
    let head = if unique {
        quote!(#krate::__private::ExportParts::new(#buffer, #shape))
    } else {
        quote!(#krate::__private::ExportParts::shared(#buffer, #shape))
    };
    let builders = Role::ALL.into_iter().filter_map(|role| {
        let field = roles.get(role)?;
        let member = &field.member;
        // The plain roles read their value through the role's trait, spanned at the field's
        // type, so that a field of another type is told what the role holds.
        let value = plain_role_trait(role).map(|role_trait| {
            TypeSpan::qualified(
                field.ty,
                quote!(#krate::__private::#role_trait),
                quote!(to_role(&self.#member)),
            )
        });
        match role {
            Role::Data | Role::Shape => None,
            Role::Strides => {
                let ty = field.ty;
                let strides = TypeSpan::qualified(
                    ty,
                    quote!(#krate::__private::AsStrides),
                    quote!(as_strides(&self.#member)),
                );
                Some(quote!(.with_strides(#strides)))
            }
            Role::ByteOffset => Some(quote!(.with_byte_offset(#value))),
            Role::Offset => Some(quote!(.with_offset(#value))),
            Role::Dtype => Some(quote!(.with_dtype(#value))),
            Role::Device => Some(quote!(.with_device(#value))),
            Role::Readonly => Some(quote!(.with_read_only(#value))),
            Role::Stream => None,
        }
    });
    // Through `__private::with_stream`, which without the runtime's `cuda` feature is an error
    // naming the feature. The call and its field argument are spanned at the field's type:
    // rustc reports an unmet bound of the argument (a type that is no producer stream) at the
    // argument.
    let streams: Vec<_> = roles
        .streams
        .iter()
        .map(|field| {
            let member = &field.member;
            let at_type = TypeSpan::of(field);
            let head = at_type.across(quote!(#krate::__private::with_stream));
            (head, at_type.across(quote!(&self.#member)))
        })
        .collect();
    let readonly = roles
        .cont
        .readonly
        .map(|span| respan(quote!(.with_read_only(true)), span));
    let mut parts = quote! {
        #head
        #(#builders)*
        #readonly
    };
    for (with_stream, field) in streams {
        parts = quote!(#with_stream(#parts, #field));
    }
    parts
}

/// `impl DlpackImport`: check the constraints and validate once, read the layout into the role
/// fields, then move the managed tensor into the data field. Other fields get
/// `Default::default()`.
fn import(roles: &Roles<'_, '_>) -> TokenStream {
    let cont = roles.cont;
    let (krate, ident) = (&cont.krate, cont.ident);
    let (impl_generics, ty_generics, _) = cont.generics.split_for_impl();
    let where_clause = where_clause(roles, Derive::Import);
    // Without a strides field the type cannot describe a strided layout: require C order.
    let contiguity = match roles.get(Role::Strides) {
        None => quote!(.contiguous(#krate::__private::Contiguity::C)),
        Some(_) => TokenStream::new(),
    };
    let constraints = cont
        .constraints
        .iter()
        .map(|constraint| constraint_builder(krate, constraint));
    // The producer-side flag on a consumer: an error, unless the type is also a producer.
    let needs_export = cont.readonly.map(|span| {
        respan(
            quote!(#krate::__private::readonly_needs_export::<Self>();),
            span,
        )
    });
    // Every role but `data` is read from the layout, which borrows the managed tensor, before
    // `data` takes it. Trait calls are guaranteed by the where clause; the plain-typed values
    // are spanned at their field's type, where a type mismatch is reported.
    let (locals, reads): (Vec<_>, Vec<_>) = cont
        .fields
        .iter()
        .filter_map(|field| {
            let role = field.role()?;
            let ty = field.ty;
            // A plain role's value, made the field's through the role's trait (spanned at the
            // field's type, so that a field of another type is told what the role holds).
            let plain = |value: TokenStream| {
                let role_trait = plain_role_trait(role);
                TypeSpan::qualified(
                    ty,
                    quote!(#krate::__private::#role_trait),
                    quote!(from_role(#value)),
                )
            };
            let read = match role {
                Role::Data => return None,
                Role::Shape => {
                    let call = TypeSpan::qualified(
                        ty,
                        quote!(#krate::__private::FromShape),
                        quote!(from_shape(__dlpack_layout.shape())),
                    );
                    quote!(#call?)
                }
                Role::Strides => {
                    let call = TypeSpan::qualified(
                        ty,
                        quote!(#krate::__private::FromStrides),
                        quote!(from_strides(&__dlpack_layout)),
                    );
                    quote!(#call?)
                }
                // Where element `(0, ..., 0)` lies in the buffer the data field lends when it
                // is exported again: what the export of the same data needs.
                Role::ByteOffset => plain(quote!(
                    #krate::__private::import_byte_offset(&__dlpack_layout)
                )),
                Role::Offset => plain(quote!(
                    #krate::__private::import_offset(&__dlpack_layout)?
                )),
                Role::Dtype => plain(quote!(__dlpack_layout.dtype())),
                Role::Device => plain(quote!(__dlpack_layout.device())),
                Role::Readonly => plain(quote!(__dlpack_managed.is_read_only())),
                // Refused on consumers by `check`.
                Role::Stream => return None,
            };
            Some((local(role), read))
        })
        .unzip();
    let data_ty = roles.data.ty;
    let import_data = TypeSpan::qualified(
        data_ty,
        quote!(#krate::__private::ImportBuffer),
        quote!(from_managed(__dlpack_managed)),
    );
    let inits = cont.fields.iter().map(|field| {
        let member = &field.member;
        // Spanned at the field's type, so a role field of the wrong type is reported there.
        let value = match field.role() {
            Some(role) => TypeSpan::of(field).across(local(role).into_token_stream()),
            None => TypeSpan::of(field).across(quote!(::core::default::Default::default())),
        };
        quote!(#member: #value)
    });
    let from_py_object = from_py_object_impl(cont, &where_clause);
    let dtype_agrees = dtype_agrees(roles);
    let (borrow_buffer_check, borrow_at_import) = borrow_at_import(roles).unzip();
    // Mutable only where the borrow at import sets the buffer's own flags.
    let data_binding = if borrow_at_import.is_some() {
        quote!(mut __dlpack_data)
    } else {
        quote!(__dlpack_data)
    };
    quote! {
        #dtype_agrees
        #borrow_buffer_check
        #[automatically_derived]
        impl #impl_generics #krate::__private::DlpackImport for #ident #ty_generics #where_clause {
            // Inlined into the caller, the value is built in place: returned through memory,
            // its fields, written one by one, are read back in wider moves that stall.
            #[inline(always)]
            fn from_managed(
                __dlpack_managed: #krate::__private::ManagedTensor,
            ) -> ::core::result::Result<Self, #krate::__private::ImportError> {
                #needs_export
                // A constant, so that the reference the out-of-line checks take is to static
                // memory: nothing is written to the stack for them on the inlined path.
                let __dlpack_constraints: &'static #krate::__private::ImportConstraints = &const {
                    #krate::__private::ImportConstraints::new()
                        #contiguity
                        #(#constraints)*
                };
                let (#(#locals,)*) = {
                    let __dlpack_layout = #krate::__private::import_layout(&__dlpack_managed, __dlpack_constraints)?;
                    (#(#reads,)*)
                };
                let #data_binding = #import_data?;
                #borrow_at_import
                ::core::result::Result::Ok(Self { #(#inits,)* })
            }
        }
        #from_py_object
    }
}

/// A `dtype = T` constraint beside a data field that accepts one element type only
/// (`ImportedData<U>`): a constant that fails to compile, at the constraint, when `T` and `U`
/// differ, for no tensor could be imported then. Only where neither type names a type
/// parameter (a free constant cannot name them).
fn dtype_agrees(roles: &Roles<'_, '_>) -> Option<TokenStream> {
    let cont = roles.cont;
    let krate = &cont.krate;
    let data_ty = roles.data.ty;
    if mentions_generics(data_ty, cont.generics) {
        return None;
    }
    let (constraint, ty) = cont.constraints.iter().find_map(|c| match &c.kind {
        ConstraintKind::Dtype(ty) => Some((c, ty)),
        _ => None,
    })?;
    if mentions_generics(ty, cont.generics) {
        return None;
    }
    let message = format!(
        "`dtype = {}` contradicts the `#[dlpack(data)]` field `{}`, whose elements have another dtype: no tensor could be imported; remove the constraint (the data field checks the dtype already) or make the two agree",
        ty.to_token_stream().to_string().replace(' ', ""),
        data_ty.to_token_stream().to_string().replace(' ', ""),
    );
    let private = quote!(#krate::__private);
    Some(respan(
        quote! {
            const _: () = ::core::assert!(
                #private::dtypes_agree(
                    <#data_ty as #private::ImportBuffer>::ELEMENT_DTYPE,
                    <#ty as #private::Element>::DTYPE,
                ),
                #message
            );
        },
        constraint.value_span,
    ))
}

/// `borrow = "..."`: a check that the data field's buffer borrows at import (a constant that
/// fails to compile, at the option's value, when it does not: a `ManagedTensor`, or storage with
/// such a variant), and the call that takes the borrow right after the data field is built. The
/// check is a free constant where the data field's type names no type parameter, an inline
/// constant in `from_managed` (evaluated where the type is used) otherwise.
fn borrow_at_import(roles: &Roles<'_, '_>) -> Option<(TokenStream, TokenStream)> {
    let cont = roles.cont;
    let krate = &cont.krate;
    let private = quote!(#krate::__private);
    let (constraint, kind) = cont.constraints.iter().find_map(|c| match &c.kind {
        ConstraintKind::Borrow(kind) => Some((c, *kind)),
        _ => None,
    })?;
    let data_ty = roles.data.ty;
    let written = match kind {
        BorrowKind::Shared => "shared",
        BorrowKind::Exclusive => "exclusive",
    };
    let message = format!(
        "`borrow = \"{written}\"` needs a `#[dlpack(data)]` field that borrows its memory, and `{}` does not (a `ManagedTensor` takes no borrow, nor does storage with a variant that holds one): hold the data in `ImportedData<T>`, or in a storage enum of those (`#[derive(DlpackImportStorage)]`), or remove the option",
        data_ty.to_token_stream().to_string().replace(' ', ""),
    );
    let assertion = respan(
        quote! {
            ::core::assert!(<#data_ty as #private::ImportBuffer>::BORROWS_AT_IMPORT, #message)
        },
        constraint.value_span,
    );
    let generic = mentions_generics(data_ty, cont.generics);
    let check = if generic {
        TokenStream::new()
    } else {
        quote!(const _: () = #assertion;)
    };
    let inline_check = generic.then(|| quote!(const { #assertion };));
    let access = match kind {
        BorrowKind::Shared => quote!(Shared),
        BorrowKind::Exclusive => quote!(Exclusive),
    };
    let call = TypeSpan::qualified(
        data_ty,
        quote!(#private::ImportBuffer),
        quote!(borrow_at_import(&mut __dlpack_data, #private::Access::#access)),
    );
    // On refusal `__dlpack_data` is dropped, and with it the managed tensor.
    Some((check, quote!(#inline_check #call?;)))
}

/// `impl pyo3::FromPyObject`, so that a pyfunction takes the type as an argument (`python::from_dlpack`
/// of the object). Emitted through the runtime's `__if_python!`, which keeps it only when the
/// runtime is built with its `python` feature; the impl names pyo3 through the runtime.
fn from_py_object_impl(cont: &Container<'_>, where_clause: &TokenStream) -> TokenStream {
    let (krate, ident) = (&cont.krate, cont.ident);
    let mut generics = cont.generics.clone();
    generics.params.insert(0, syn::parse_quote!('__dlpack_py));
    generics.params.insert(0, syn::parse_quote!('__dlpack_a));
    let (impl_generics, _, _) = generics.split_for_impl();
    let (_, ty_generics, _) = cont.generics.split_for_impl();
    let pyo3 = quote!(#krate::__private::pyo3);
    quote! {
        #krate::__if_python! {
            #[automatically_derived]
            impl #impl_generics #pyo3::FromPyObject<'__dlpack_a, '__dlpack_py> for #ident #ty_generics #where_clause {
                type Error = #pyo3::PyErr;

                fn extract(
                    obj: #pyo3::Borrowed<'__dlpack_a, '__dlpack_py, #pyo3::PyAny>,
                ) -> ::core::result::Result<Self, #pyo3::PyErr> {
                    #krate::__private::from_py_object(obj)
                }
            }
        }
    }
}

/// The `ImportConstraints` builder call of one consumer constraint. `dtype = T` is spanned at
/// `T`, so a type that is not an element type is reported there.
fn constraint_builder(krate: &syn::Path, constraint: &Constraint) -> TokenStream {
    let private = quote!(#krate::__private);
    match &constraint.kind {
        ConstraintKind::Dtype(ty) => {
            let element = TypeSpan::of_type(ty).across(quote!(<#ty as #private::Element>::DTYPE));
            quote!(.dtype(#element))
        }
        ConstraintKind::Ndim(ndim) => quote!(.ndim(#ndim)),
        ConstraintKind::Shape(pattern) => {
            let axes = pattern.iter().map(|axis| match axis {
                Some(extent) => quote!(::core::option::Option::Some(#extent)),
                None => quote!(::core::option::Option::None),
            });
            quote!(.shape(&[#(#axes),*]))
        }
        ConstraintKind::Contiguous(order) => {
            let order = match order {
                Order::C => quote!(C),
                Order::F => quote!(F),
                Order::Any => quote!(Any),
            };
            quote!(.contiguous(#private::Contiguity::#order))
        }
        ConstraintKind::Device(device) => {
            let device = match device {
                DeviceKind::Cpu => quote!(Cpu),
                DeviceKind::Cuda => quote!(Cuda),
                DeviceKind::Rocm => quote!(Rocm),
            };
            quote!(.device(#private::DeviceType::#device))
        }
        ConstraintKind::Writable => quote!(.writable(true)),
        // Not a constraint on the tensor: taken after the data field is built (`import`).
        ConstraintKind::Borrow(_) => TokenStream::new(),
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
    let generics = roles.cont.generics;
    // Bounds on generic field types only: a bound on a concrete type is a "trivial bound",
    // which rustc reports with a note on an unstable feature; the spanned trait calls report an
    // unfit concrete type at its field instead.
    // The element type of a generic buffer written as one (`Vec<T>`, `ImportedData<T>`), bound
    // first: a use with a non-element type (`Vec<f32>`) is then told that this type is not an
    // element type, even where rustc names only the impl's unmet bounds (a method call).
    let element = check::element_of(roles.data.ty)
        .filter(|element| mentions_generics(element, generics))
        .map(|element| spanned_bound(element, quote!(#krate::__private::Element)))
        .into_iter();
    let bounds = Role::ALL.into_iter().filter_map(|role| {
        let field = roles.get(role)?;
        let bound = bound_trait(role, derive)?;
        mentions_generics(field.ty, generics)
            .then(|| spanned_bound(field.ty, quote!(#krate::__private::#bound)))
    });
    let stream_bounds = roles
        .streams
        .iter()
        .filter(|_| derive == Derive::Export)
        .filter(|field| mentions_generics(field.ty, generics))
        .map(|field| spanned_bound(field.ty, quote!(#krate::__private::AsProducerStream)));
    quote!(where #(#existing,)* #(#element,)* #(#bounds,)* #(#stream_bounds,)*)
}

/// `#ty: #bound`, the bound spanned at the type's last token, so that rustc reports an unfit
/// type at the type, with the trait's `#[diagnostic::on_unimplemented]` message.
pub fn spanned_bound(ty: &syn::Type, bound: TokenStream) -> TokenStream {
    let colon_bound = respan(quote!(: #bound), TypeSpan::of_type(ty).last);
    quote!(#ty #colon_bound)
}

/// The runtime trait a role field's type must implement, for roles with one.
fn bound_trait(role: Role, derive: Derive) -> Option<TokenStream> {
    match (derive, role) {
        (Derive::Export, Role::Data) => Some(quote!(AsExportBuffer)),
        (Derive::Export, Role::Shape) => Some(quote!(AsShape)),
        (Derive::Export, Role::Strides) => Some(quote!(AsStrides)),
        (Derive::Import, Role::Data) => Some(quote!(ImportBuffer)),
        (Derive::Import, Role::Shape) => Some(quote!(FromShape)),
        (Derive::Import, Role::Strides) => Some(quote!(FromStrides)),
        // Plain types (`usize`, `DataType`, `Device`, `bool`), the same both ways.
        (_, Role::ByteOffset | Role::Offset | Role::Dtype | Role::Device | Role::Readonly) => {
            plain_role_trait(role)
        }
        // Several fields: bounded one by one in `where_clause`.
        (_, Role::Stream) => None,
    }
}

/// The runtime trait of a role whose field holds one plain value (`usize`, `bool`, `Device`,
/// `DataType`), read by an export and written by an import; its
/// `#[diagnostic::on_unimplemented]` message says what the role holds.
fn plain_role_trait(role: Role) -> Option<TokenStream> {
    match role {
        Role::ByteOffset => Some(quote!(ByteOffsetField)),
        Role::Offset => Some(quote!(OffsetField)),
        Role::Dtype => Some(quote!(DtypeField)),
        Role::Device => Some(quote!(DeviceField)),
        Role::Readonly => Some(quote!(ReadonlyField)),
        Role::Data | Role::Shape | Role::Strides | Role::Stream => None,
    }
}

/// Where errors about a field's type should point: its first and last token. Generated
/// tokens spanned from the first to the last make rustc underline the whole type (a
/// proc-macro span cannot cover several tokens by itself on stable).
#[derive(Clone, Copy)]
pub struct TypeSpan {
    first: Span,
    last: Span,
}

impl TypeSpan {
    fn of(field: &Field<'_>) -> Self {
        Self::of_type(field.ty)
    }

    /// `<ty as path>::rest`, a call of a trait function on `ty`, with `ty`'s own tokens kept and
    /// the rest spanned at the type, so that an unsatisfied bound is reported across the type.
    pub fn qualified(ty: &syn::Type, path: TokenStream, rest: TokenStream) -> TokenStream {
        let span = Self::of_type(ty);
        let mut out = respan(quote!(<), span.first);
        out.extend(ty.to_token_stream());
        out.extend(respan(quote!(as #path>::#rest), span.last));
        out
    }

    /// The first and last token of `ty`.
    pub fn of_type(ty: &syn::Type) -> Self {
        let mut tokens = ty.to_token_stream().into_iter().map(|token| token.span());
        let first = tokens.next().unwrap_or_else(Span::call_site);
        let last = tokens.last().unwrap_or(first);
        TypeSpan { first, last }
    }

    /// `tokens` spanned across the type: the first token at its first token, the others at
    /// its last, so that errors about the expression point at the field's type.
    pub fn across(self, tokens: TokenStream) -> TokenStream {
        let mut tokens = tokens.into_iter();
        let head: TokenStream = tokens.next().into_iter().collect();
        let mut out = respan(head, self.first);
        out.extend(respan(tokens.collect(), self.last));
        out
    }
}

/// `tokens` with every span set to `span`, so that errors in them point at the user's field.
pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
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

/// `#[dlpack(transparent)]`: the struct's one field is the tensor, and the impl forwards to the
/// field's own (a `#[pyclass]` around another crate's tensor type, say). The field has no role,
/// and the struct no other option.
fn transparent(cx: &Ctxt, cont: &Container<'_>) -> TokenStream {
    let span = cont.transparent.unwrap_or_else(Span::call_site);
    if cont.fields.len() != 1 {
        cx.error_at(
            span,
            format_args!(
                "`#[dlpack(transparent)]` forwards to the struct's one field, found {} fields",
                cont.fields.len()
            ),
        );
    }
    for attr in cont.fields.iter().filter_map(|field| field.role.as_ref()) {
        cx.error_at(
            attr.span,
            format_args!(
                "a `#[dlpack(transparent)]` struct forwards to its field's own impl: remove {}",
                attr.role
            ),
        );
    }
    for constraint in &cont.constraints {
        cx.error_at(
            constraint.key,
            "a `#[dlpack(transparent)]` struct forwards to its field's own impl: put consumer constraints on the field's type",
        );
    }
    if let Some(readonly) = cont.readonly {
        cx.error_at(
            readonly,
            "a `#[dlpack(transparent)]` struct forwards to its field's own impl: mark the field's type `#[dlpack(readonly)]`",
        );
    }
    let Some(field) = cont.fields.first() else {
        return TokenStream::new();
    };
    let (krate, ident) = (&cont.krate, cont.ident);
    let (impl_generics, ty_generics, _) = cont.generics.split_for_impl();
    let (ty, member) = (field.ty, &field.member);
    let trait_name = format_ident!("{}", cont.derive.trait_name());
    let trait_path = quote!(#krate::__private::#trait_name);
    // A bound only where the field's type is generic: a bound on a concrete type is a "trivial
    // bound", which rustc reports with an unstable-feature note; the calls below report an
    // unfit concrete type at the field all the same.
    let existing = cont
        .generics
        .where_clause
        .iter()
        .flat_map(|clause| clause.predicates.iter());
    let bound = mentions_generics(ty, cont.generics).then(|| spanned_bound(ty, trait_path.clone()));
    let where_clause = quote!(where #(#existing,)* #bound);
    let forward = |call: TokenStream| TypeSpan::qualified(ty, trait_path.clone(), call);
    match cont.derive {
        Derive::Export => {
            let shared = forward(quote!(export_parts(&self.#member)));
            let unique = forward(quote!(export_parts_mut(&mut self.#member)));
            quote! {
                #[automatically_derived]
                impl #impl_generics #trait_path for #ident #ty_generics #where_clause {
                    #[inline]
                    fn export_parts(&self) -> #krate::__private::ExportParts<'_> {
                        #shared
                    }
                    #[inline]
                    fn export_parts_mut(&mut self) -> #krate::__private::ExportParts<'_> {
                        #unique
                    }
                }
            }
        }
        Derive::Import => {
            let import = forward(quote!(from_managed(__dlpack_managed)));
            let from_py_object = from_py_object_impl(cont, &where_clause);
            quote! {
                #[automatically_derived]
                impl #impl_generics #trait_path for #ident #ty_generics #where_clause {
                    #[inline]
                    fn from_managed(
                        __dlpack_managed: #krate::__private::ManagedTensor,
                    ) -> ::core::result::Result<Self, #krate::__private::ImportError> {
                        ::core::result::Result::Ok(Self { #member: #import? })
                    }
                }
                #from_py_object
            }
        }
    }
}

/// Whether `ty` names one of the struct's type parameters.
pub fn mentions_generics(ty: &syn::Type, generics: &syn::Generics) -> bool {
    let params: Vec<&syn::Ident> = generics.type_params().map(|param| &param.ident).collect();
    fn walk(tokens: TokenStream, params: &[&syn::Ident]) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => params.iter().any(|param| **param == ident),
            TokenTree::Group(group) => walk(group.stream(), params),
            _ => false,
        })
    }
    !params.is_empty() && walk(ty.to_token_stream(), &params)
}
