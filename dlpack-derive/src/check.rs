//! The rules between fields and options: each role at most once, `data` and `shape` exactly
//! once, one kind of offset, a read-only flag given once, and consumer constraints that agree
//! with each other and with the fields.

use proc_macro2::Span;

use crate::ast::{Container, Derive, Field};
use crate::attr::{BorrowKind, ConstraintKind, Order, Role};
use crate::ctxt::Ctxt;

/// Roles every tensor needs.
const REQUIRED: [Role; 2] = [Role::Data, Role::Shape];

/// The fields playing each role, once the rules hold.
pub struct Roles<'c, 'a> {
    /// The struct.
    pub cont: &'c Container<'a>,
    /// `#[dlpack(data)]`.
    pub data: &'c Field<'a>,
    /// `#[dlpack(shape)]`.
    pub shape: &'c Field<'a>,
    /// The optional roles, by [`Role`], in [`Role::ALL`] order.
    optional: Vec<(Role, &'c Field<'a>)>,
    /// Every `#[dlpack(stream)]` field, in declaration order.
    pub streams: Vec<&'c Field<'a>>,
}

impl<'c, 'a> Roles<'c, 'a> {
    /// The field playing `role`, if any.
    pub fn get(&self, role: Role) -> Option<&'c Field<'a>> {
        match role {
            Role::Data => Some(self.data),
            Role::Shape => Some(self.shape),
            _ => self
                .optional
                .iter()
                .find(|(r, _)| *r == role)
                .map(|(_, field)| *field),
        }
    }
}

/// Checks the rules, recording every violation in `cx`; the roles when `data` and `shape`
/// are present.
pub fn check<'c, 'a>(cx: &Ctxt, cont: &'c Container<'a>) -> Option<Roles<'c, 'a>> {
    for role in Role::ALL {
        let mut marked = cont
            .fields
            .iter()
            .filter_map(|field| field.role.as_ref())
            .filter(|attr| attr.role == role);
        let first = marked.next();
        if role == Role::Stream {
            // A producer may have pending work on several streams.
            if cont.derive == Derive::Import {
                if let Some(attr) = first {
                    cx.error_at(
                        attr.span,
                        "`#[dlpack(stream)]` is a producer role: the consumer names its own stream when it asks for the tensor (`stream=` of `__dlpack__`, `ExportRequest::stream`); remove it from this `DlpackImport` type",
                    );
                }
            }
            continue;
        }
        for again in marked {
            cx.error_at(
                again.span,
                format_args!("{role} may only be specified once"),
            );
        }
        let quiet = !cont.attrs_complete || cont.refused_roles.contains(&role);
        if first.is_none() && REQUIRED.contains(&role) && !quiet {
            let hint = if role == Role::Shape && data_is_ndarray(cont) {
                "; an `ndarray` array as data exports its own layout, but the struct still declares its shape, which must agree with the array's: add a shape field, or export the array itself (`Array` is a producer; `#[dlpack(transparent)]` on a struct whose one field is the array)"
            } else {
                ""
            };
            cx.error_spanned_by(
                cont.ident,
                format_args!("expected exactly one field marked {role}, found none{hint}"),
            );
        }
    }
    if let Some(data) = cont.fields.iter().find(|f| f.role() == Some(Role::Data)) {
        zero_lanes(cx, data.ty);
    }
    one_offset(cx, cont);
    if cont.derive == Derive::Export {
        readonly_once(cx, cont);
    }
    if cont.derive == Derive::Import {
        constraints_agree(cx, cont);
    }
    let find = |role| cont.fields.iter().find(|field| field.role() == Some(role));
    let optional = Role::ALL
        .into_iter()
        .filter(|role| !REQUIRED.contains(role) && *role != Role::Stream)
        .filter_map(|role| Some((role, find(role)?)))
        .collect();
    let streams = cont
        .fields
        .iter()
        .filter(|field| field.role() == Some(Role::Stream))
        .collect();
    Some(Roles {
        cont,
        data: find(Role::Data)?,
        shape: find(Role::Shape)?,
        optional,
        streams,
    })
}

/// Whether the `#[dlpack(data)]` field is written as an `ndarray` array type (`Array<T, D>`,
/// `Array0` to `Array6`, `ArrayD`, matched by the last path segment).
fn data_is_ndarray(cont: &Container<'_>) -> bool {
    let Some(data) = cont.fields.iter().find(|f| f.role() == Some(Role::Data)) else {
        return false;
    };
    let syn::Type::Path(path) = data.ty else {
        return false;
    };
    path.path.segments.last().is_some_and(|segment| {
        matches!(
            segment.ident.to_string().as_str(),
            "Array"
                | "ArrayD"
                | "Array0"
                | "Array1"
                | "Array2"
                | "Array3"
                | "Array4"
                | "Array5"
                | "Array6"
        )
    })
}

/// `offset` (elements) and `byte_offset` (bytes) say the same thing: one of them, at most.
fn one_offset(cx: &Ctxt, cont: &Container<'_>) {
    let mut offsets = cont
        .fields
        .iter()
        .filter_map(|field| field.role.as_ref())
        .filter(|attr| matches!(attr.role, Role::Offset | Role::ByteOffset));
    let Some(first) = offsets.next() else {
        return;
    };
    if let Some(second) = offsets.find(|attr| attr.role != first.role) {
        cx.error_at(
            second.span,
            format_args!(
                "a tensor has one start offset, and this struct already has {}: keep `#[dlpack(offset)]` (in elements) or `#[dlpack(byte_offset)]` (in bytes), not both",
                first.role
            ),
        );
    }
}

/// A struct marked `#[dlpack(readonly)]` is always exported read-only: a read-only field would
/// say nothing more.
fn readonly_once(cx: &Ctxt, cont: &Container<'_>) {
    if cont.readonly.is_none() {
        return;
    }
    let field = cont
        .fields
        .iter()
        .filter_map(|field| field.role.as_ref())
        .find(|attr| attr.role == Role::Readonly);
    if let Some(attr) = field {
        cx.error_at(
            attr.span,
            "the struct is marked `#[dlpack(readonly)]`, so every export is read-only: remove the flag to decide per value with this field, or remove the field's role",
        );
    }
}

/// Consumer constraints that contradict each other or the fields.
fn constraints_agree(cx: &Ctxt, cont: &Container<'_>) {
    let has_strides = cont
        .fields
        .iter()
        .any(|field| field.role() == Some(Role::Strides));
    let shape_pattern = cont.constraints.iter().find_map(|c| match &c.kind {
        ConstraintKind::Shape(pattern) => Some(pattern.len()),
        _ => None,
    });
    let writable = cont
        .constraints
        .iter()
        .any(|c| matches!(c.kind, ConstraintKind::Writable));
    let fixed_rank = cont
        .fields
        .iter()
        .find(|field| field.role() == Some(Role::Shape))
        .and_then(|field| array_len(field.ty));
    for constraint in &cont.constraints {
        match &constraint.kind {
            ConstraintKind::Contiguous(order @ (Order::F | Order::Any)) if !has_strides => {
                let written = if *order == Order::F { "F" } else { "any" };
                cx.error_at(
                    constraint.value_span,
                    format_args!(
                        "`contiguous = \"{written}\"` accepts column-major data, which a type without strides cannot describe: add a field marked `#[dlpack(strides)]`, or write `contiguous = \"C\"` (what a type without strides requires anyway)"
                    ),
                );
            }
            ConstraintKind::Ndim(ndim) => {
                if let Some(axes) = shape_pattern.filter(|&axes| axes != *ndim) {
                    cx.error_at(
                        constraint.value_span,
                        format_args!(
                            "`ndim = {ndim}` contradicts the `shape` constraint, which has {axes} axes: remove `ndim`, the shape implies it"
                        ),
                    );
                } else {
                    rank_agrees(cx, constraint.value_span, "ndim", *ndim, fixed_rank);
                }
            }
            ConstraintKind::Shape(pattern) => {
                rank_agrees(
                    cx,
                    constraint.value_span,
                    "shape",
                    pattern.len(),
                    fixed_rank,
                );
            }
            ConstraintKind::Borrow(BorrowKind::Exclusive) if !writable => {
                cx.error_at(
                    constraint.value_span,
                    "`borrow = \"exclusive\"` borrows the memory for writes, which a read-only tensor cannot be: add `writable` (`#[dlpack(writable, borrow = \"exclusive\")]`), or write `borrow = \"shared\"` to borrow for reads",
                );
            }
            _ => {}
        }
    }
}

/// A rank constraint against a shape field of fixed rank, `[usize; N]`.
fn rank_agrees(cx: &Ctxt, span: Span, key: &str, ndim: usize, fixed_rank: Option<usize>) {
    if let Some(len) = fixed_rank.filter(|&len| len != ndim) {
        cx.error_at(
            span,
            format_args!(
                "the `{key}` constraint asks for {ndim} axes, but the shape field `[usize; {len}]` holds {len}: make them agree"
            ),
        );
    }
}

/// `N` of an array type `[T; N]` written with a literal length.
fn array_len(ty: &syn::Type) -> Option<usize> {
    match ty {
        syn::Type::Array(array) => match &array.len {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(len),
                ..
            }) => len.base10_parse().ok(),
            _ => None,
        },
        syn::Type::Paren(inner) => array_len(&inner.elem),
        syn::Type::Group(inner) => array_len(&inner.elem),
        _ => None,
    }
}

/// A vector element of zero lanes, `[T; 0]`, written in the data field's type: it has no
/// DLPack dtype (`lanes` counts 1 to 65535), and the element's dtype would otherwise fail only
/// when the program is built.
fn zero_lanes(cx: &Ctxt, ty: &syn::Type) {
    match ty {
        syn::Type::Array(array) => {
            if array_len(ty) == Some(0) {
                let elem = quote::ToTokens::to_token_stream(&array.elem)
                    .to_string()
                    .replace(' ', "");
                cx.error_spanned_by(
                    array,
                    format_args!(
                        "a vector element of 0 lanes has no DLPack dtype (`DLDataType::lanes` counts 1 to 65535): write `[{elem}; N]` with N >= 1, or `{elem}` for one lane"
                    ),
                );
            } else {
                zero_lanes(cx, &array.elem);
            }
        }
        syn::Type::Path(path) => {
            for segment in &path.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &segment.arguments {
                    for arg in &args.args {
                        if let syn::GenericArgument::Type(ty) = arg {
                            zero_lanes(cx, ty);
                        }
                    }
                }
            }
        }
        syn::Type::Slice(slice) => zero_lanes(cx, &slice.elem),
        syn::Type::Reference(reference) => zero_lanes(cx, &reference.elem),
        syn::Type::Paren(inner) => zero_lanes(cx, &inner.elem),
        syn::Type::Group(inner) => zero_lanes(cx, &inner.elem),
        _ => {}
    }
}

/// The element type of a buffer type written as one of the buffers whose element type is a
/// parameter: `Vec<T>`, `Box<[T]>`, `Arc<[T]>`, `Arc<Vec<T>>`, `ImportedData<T>`,
/// `Array<T, D>` (matched by their last path segment).
pub fn element_of(ty: &syn::Type) -> Option<&syn::Type> {
    let syn::Type::Path(path) = ty else {
        return None;
    };
    let segment = path.path.segments.last()?;
    let syn::PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    let first = args.args.iter().find_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })?;
    match segment.ident.to_string().as_str() {
        "Vec" | "ImportedData" | "Array" => Some(first),
        "Box" | "Arc" => match first {
            syn::Type::Slice(slice) => Some(&slice.elem),
            inner @ syn::Type::Path(_) if segment.ident == "Arc" => element_of(inner)
                .filter(|_| matches!(inner, syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Vec"))),
            _ => None,
        },
        _ => None,
    }
}
