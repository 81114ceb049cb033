//! The grammar of `#[dlpack(...)]`: field roles and container options.
//!
//! Both lists are comma-separated. A field's list holds role keywords ([`FieldAttr`]); the
//! container's holds options ([`ContainerAttr`]): `crate = "path"`, the flags `readonly` and
//! `transparent`, and the consumer constraints `dtype = T`, `ndim = N`, `shape = [_, 3]`,
//! `contiguous = "C"`, `device = "cpu"` and `writable`, and the consumer option
//! `borrow = "shared" | "exclusive"`, kept with the constraints (it is checked and written at
//! import too, but asks nothing of the tensor). An unknown key is answered by
//! [`syn::parse::Lookahead1`], which lists what was expected; a key written in the wrong place
//! gets an error saying where it belongs; a bad value gets an error saying what to write instead.
//!
//! The keys of each list are declared once, in a `keys!` table: [`Role`] for a field's,
//! [`ContainerKey`] for the container's. The table gives the keywords the parser peeks, the
//! order in which an unknown key's error lists them and the candidates of "did you mean"; what a
//! key means is in the exhaustive `match`es on its enum, here and in [`crate::expand`].

use std::fmt;

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Lookahead1, Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{LitInt, LitStr, Token, token};

/// Declares the keys of one `#[dlpack(...)]` list, each once, as a table of
/// `Variant = keyword` entries. From the table it generates:
///
/// - a module of keyword types for peeking, one [`syn::custom_keyword!`] per keyword (`crate` is
///   Rust's own keyword, peeked as `Token![crate]`);
/// - the enum, one variant per key, with the entry's doc comment;
/// - `ALL`, every key, and `KEYWORDS`, every keyword, both in the table's order;
/// - `keyword()`, the keyword as written;
/// - `peek(input)`, the key that comes next, and `peek_lookahead(lookahead)`, the same while
///   recording each keyword tried in the lookahead, so that its error lists them.
///
/// The table's order is the order in which an unknown key's error ("expected one of: ...")
/// names the keys, and the order of the candidates of "did you mean".
macro_rules! keys {
    // The keyword type of one entry: `Token![crate]` exists already.
    (@keyword_type crate) => {};
    (@keyword_type $keyword:ident) => {
        syn::custom_keyword!($keyword);
    };
    // The path of one entry's keyword type, for `peek`.
    (@keyword_token $kw:ident crate) => {
        Token![crate]
    };
    (@keyword_token $kw:ident $keyword:ident) => {
        $kw::$keyword
    };
    (
        $(#[$attr:meta])*
        $vis:vis enum $Enum:ident, keywords in mod $kw:ident {
            $(
                $(#[$doc:meta])*
                $Variant:ident = $keyword:ident,
            )*
        }
    ) => {
        #[doc = concat!("The keywords of [`", stringify!($Enum), "`], for peeking.")]
        pub mod $kw {
            $(keys!(@keyword_type $keyword);)*
        }

        $(#[$attr])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $Enum {
            $(
                $(#[$doc])*
                $Variant,
            )*
        }

        impl $Enum {
            /// Every key, in the table's order.
            pub const ALL: [Self; [$(stringify!($keyword)),*].len()] = [$(Self::$Variant),*];

            /// Every keyword, in the table's order: the candidates of "did you mean".
            const KEYWORDS: [&'static str; [$(stringify!($keyword)),*].len()] =
                [$(stringify!($keyword)),*];

            /// The keyword, as written in `#[dlpack(...)]`.
            pub fn keyword(self) -> &'static str {
                match self {
                    $(Self::$Variant => stringify!($keyword),)*
                }
            }

            /// The key whose keyword comes next, without consuming it.
            fn peek(input: ParseStream<'_>) -> Option<Self> {
                Self::ALL.into_iter().find(|key| match key {
                    $(Self::$Variant => input.peek(keys!(@keyword_token $kw $keyword)),)*
                })
            }

            /// The key whose keyword comes next, without consuming it; `lookahead` records
            /// every keyword tried, in the table's order, for its error when none matches.
            fn peek_lookahead(lookahead: &Lookahead1<'_>) -> Option<Self> {
                Self::ALL.into_iter().find(|key| match key {
                    $(Self::$Variant => lookahead.peek(keys!(@keyword_token $kw $keyword)),)*
                })
            }
        }
    };
}

keys! {
    /// What a field is to the tensor. A field has at most one role; `data` and `shape` are
    /// required, the others optional. The order is the order the generated code handles them.
    pub enum Role, keywords in mod role_kw {
        /// `data`: the buffer.
        Data = data,
        /// `shape`: extents in elements.
        Shape = shape,
        /// `strides`: strides in elements.
        Strides = strides,
        /// `byte_offset`: bytes from the start of the data field's buffer to element
        /// `(0, ..., 0)`, both ways (an import counts from the bytes its data lends on).
        ByteOffset = byte_offset,
        /// `offset`: the same in elements.
        Offset = offset,
        /// `dtype`: the element type, as a runtime `DataType`.
        Dtype = dtype,
        /// `device`: where the memory lives.
        Device = device,
        /// `readonly`: whether the memory may not be written.
        Readonly = readonly,
        /// `stream`: a producer stream with pending work on the data (feature `cuda`); the only
        /// role that several fields may play.
        Stream = stream,
    }
}

/// Displays as the attribute a user writes, `#[dlpack(data)]`, for error messages.
impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`#[dlpack({})]`", self.keyword())
    }
}

keys! {
    /// A key of the container's `#[dlpack(...)]`: an option ([`ContainerAttr`]) or a consumer
    /// constraint ([`ConstraintKind`]).
    pub enum ContainerKey, keywords in mod container_kw {
        /// `crate = "path"`.
        Crate = crate,
        /// `readonly`.
        Readonly = readonly,
        /// `transparent`.
        Transparent = transparent,
        /// `dtype = T`.
        Dtype = dtype,
        /// `ndim = N`.
        Ndim = ndim,
        /// `shape = [_, 3]`.
        Shape = shape,
        /// `contiguous = "C" | "F" | "any"`.
        Contiguous = contiguous,
        /// `device = "cpu" | "cuda" | "rocm"`.
        Device = device,
        /// `writable`.
        Writable = writable,
        /// `borrow = "shared" | "exclusive"`.
        Borrow = borrow,
    }
}

impl ContainerKey {
    /// Whether the key takes a value, `key = ...`; the others are flags.
    fn takes_value(self) -> bool {
        match self {
            ContainerKey::Crate
            | ContainerKey::Dtype
            | ContainerKey::Ndim
            | ContainerKey::Shape
            | ContainerKey::Contiguous
            | ContainerKey::Device
            | ContainerKey::Borrow => true,
            ContainerKey::Readonly | ContainerKey::Transparent | ContainerKey::Writable => false,
        }
    }
}

/// Displays as the attribute a user writes, `#[dlpack(ndim = ...)]` or `#[dlpack(writable)]`,
/// for error messages.
impl fmt::Display for ContainerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if self.takes_value() { " = ..." } else { "" };
        write!(f, "`#[dlpack({}{value})]`", self.keyword())
    }
}

/// One item of a field's `#[dlpack(...)]`: a role keyword and where it is written.
pub struct FieldAttr {
    /// The role.
    pub role: Role,
    /// The keyword's span, for errors about this role.
    pub span: Span,
}

impl Parse for FieldAttr {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let lookahead = input.lookahead1();
        let Some(role) = Role::peek_lookahead(&lookahead) else {
            return Err(not_a_role(input, lookahead));
        };
        let span = input.parse::<proc_macro2::Ident>()?.span();
        if input.peek(Token![=]) || input.peek(token::Paren) {
            let key = role.keyword();
            let error = match role {
                Role::Shape | Role::Dtype | Role::Device if input.peek(Token![=]) => {
                    syn::Error::new(
                        span,
                        format_args!(
                            "`{key} = ...` is a consumer constraint: write it on the struct; on a field, write `#[dlpack({key})]` with no value"
                        ),
                    )
                }
                _ => syn::Error::new(
                    input.span(),
                    format_args!("`{key}` takes no value: write {role}"),
                ),
            };
            return Err(error);
        }
        Ok(FieldAttr { role, span })
    }
}

/// The error for a field's key that is no role: a container option is told where it belongs;
/// anything else gets the list of roles, with a suggestion when it looks like a misspelling.
fn not_a_role(input: ParseStream<'_>, lookahead: Lookahead1<'_>) -> syn::Error {
    match ContainerKey::peek(input) {
        // `transparent` on a field is answered like an unknown key, with the list of roles.
        Some(key) if key != ContainerKey::Transparent => syn::Error::new(
            input.span(),
            format_args!(
                "`{}` is a container option: write {key} on the struct, not on a field",
                key.keyword()
            ),
        ),
        _ => unknown_key(input, lookahead, &Role::KEYWORDS, "role"),
    }
}

/// One item of the container's `#[dlpack(...)]`.
pub enum ContainerAttr {
    /// `crate = "path"`: the path of `dlpack_runtime` when it is renamed.
    Crate {
        /// The `crate` keyword, for errors about this option.
        span: Span,
        /// The path, parsed from the string; its tokens carry the string's span.
        path: syn::Path,
    },
    /// `readonly`: every export of the type is read-only.
    Readonly {
        /// The keyword.
        span: Span,
    },
    /// `transparent`: the struct's one field is the tensor; export and import go through it.
    Transparent {
        /// The keyword.
        span: Span,
    },
    /// A consumer constraint, checked at import.
    Constraint(Constraint),
}

/// A consumer constraint: `key = value`, or the flag `writable`; or the consumer option
/// `borrow = "..."`, which is read, checked for duplicates and refused where constraints are
/// refused (producers, transparent structs, storage) in the same way.
pub struct Constraint {
    /// The key's span, for errors about the constraint as a whole.
    pub key: Span,
    /// The value's span (the key's for `writable`), for errors about the value.
    pub value_span: Span,
    /// What it requires.
    pub kind: ConstraintKind,
}

/// What a consumer constraint requires.
pub enum ConstraintKind {
    /// `dtype = T`: elements of the Rust element type `T`.
    Dtype(syn::Type),
    /// `ndim = N`.
    Ndim(usize),
    /// `shape = [_, 3]`: one entry per axis, `None` for `_`.
    Shape(Vec<Option<usize>>),
    /// `contiguous = "C" | "F" | "any"`.
    Contiguous(Order),
    /// `device = "cpu" | "cuda" | "rocm"`.
    Device(DeviceKind),
    /// `writable`.
    Writable,
    /// `borrow = "shared" | "exclusive"`: the import borrows its memory at once.
    Borrow(BorrowKind),
}

impl ConstraintKind {
    /// The key it is written with.
    pub fn key(&self) -> ContainerKey {
        match self {
            ConstraintKind::Dtype(_) => ContainerKey::Dtype,
            ConstraintKind::Ndim(_) => ContainerKey::Ndim,
            ConstraintKind::Shape(_) => ContainerKey::Shape,
            ConstraintKind::Contiguous(_) => ContainerKey::Contiguous,
            ConstraintKind::Device(_) => ContainerKey::Device,
            ConstraintKind::Writable => ContainerKey::Writable,
            ConstraintKind::Borrow(_) => ContainerKey::Borrow,
        }
    }
}

/// The memory order of `contiguous = "..."`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `"C"`: row-major.
    C,
    /// `"F"`: column-major.
    F,
    /// `"any"`: either.
    Any,
}

/// The device of `device = "..."`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// `"cpu"`: `kDLCPU`.
    Cpu,
    /// `"cuda"`: `kDLCUDA`.
    Cuda,
    /// `"rocm"`: `kDLROCM`.
    Rocm,
}

/// The access of `borrow = "..."`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BorrowKind {
    /// `"shared"`: for reads.
    Shared,
    /// `"exclusive"`: for writes.
    Exclusive,
}

impl Parse for ContainerAttr {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if let Some(role) = Role::peek(input) {
            let is_option =
                matches!(role, Role::Shape | Role::Dtype | Role::Device) && input.peek2(Token![=]);
            if !is_option && role != Role::Readonly {
                let hint = match role {
                    Role::Shape => "; as a consumer constraint, write `shape = [_, 3]`",
                    Role::Dtype => "; as a consumer constraint, write `dtype = f32`",
                    Role::Device => "; as a consumer constraint, write `device = \"cpu\"`",
                    _ => "",
                };
                return Err(syn::Error::new(
                    input.span(),
                    format_args!(
                        "{role} is a field role: write it on a field, not on the struct{hint}"
                    ),
                ));
            }
        }
        let lookahead = input.lookahead1();
        let Some(key) = ContainerKey::peek_lookahead(&lookahead) else {
            return Err(unknown_key(
                input,
                lookahead,
                &ContainerKey::KEYWORDS,
                "option",
            ));
        };
        let span = input.call(syn::Ident::parse_any)?.span();
        if key.takes_value() {
            input.parse::<Token![=]>()?;
        } else {
            no_value(input, key)?;
        }
        Ok(match key {
            ContainerKey::Crate => ContainerAttr::Crate {
                span,
                path: parse_crate_path(input)?,
            },
            ContainerKey::Readonly => ContainerAttr::Readonly { span },
            ContainerKey::Transparent => ContainerAttr::Transparent { span },
            ContainerKey::Dtype => constraint(span, parse_dtype(input)?),
            ContainerKey::Ndim => constraint(span, parse_ndim(input)?),
            ContainerKey::Shape => constraint(span, parse_shape(input)?),
            ContainerKey::Contiguous => constraint(span, parse_contiguous(input)?),
            ContainerKey::Device => constraint(span, parse_device(input)?),
            ContainerKey::Writable => constraint(span, (span, ConstraintKind::Writable)),
            ContainerKey::Borrow => constraint(span, parse_borrow(input)?),
        })
    }
}

/// The constraint written at `key`, with its value's span and what it requires.
fn constraint(key: Span, (value_span, kind): (Span, ConstraintKind)) -> ContainerAttr {
    ContainerAttr::Constraint(Constraint {
        key,
        value_span,
        kind,
    })
}

/// A flag (`readonly`, `transparent`, `writable`) given a value.
fn no_value(input: ParseStream<'_>, key: ContainerKey) -> syn::Result<()> {
    if input.peek(Token![=]) || input.peek(token::Paren) {
        return Err(syn::Error::new(
            input.span(),
            format_args!(
                "`{}` is a flag and takes no value: write {key}",
                key.keyword()
            ),
        ));
    }
    Ok(())
}

/// The value of `crate = "path"`: a path, written as a string like serde's.
fn parse_crate_path(input: ParseStream<'_>) -> syn::Result<syn::Path> {
    if !input.peek(LitStr) {
        let unquoted = input.fork().parse::<syn::Path>();
        let message = match unquoted {
            Ok(path) => format!(
                "expected a string: write `crate = \"{}\"`",
                path.to_token_stream().to_string().replace(' ', "")
            ),
            Err(_) => {
                "expected a string holding a path, as in `crate = \"dlpack_runtime\"`".to_owned()
            }
        };
        return Err(syn::Error::new(input.span(), message));
    }
    let literal: LitStr = input.parse()?;
    literal.parse().map_err(|_| {
        syn::Error::new(
            literal.span(),
            "expected a path to the `dlpack_runtime` crate, as in `crate = \"dlpack_runtime\"`",
        )
    })
}

/// `dtype = f32`: a Rust element type, not a string.
fn parse_dtype(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    if input.peek(LitStr) {
        let literal: LitStr = input.parse()?;
        let message = match rust_element_type(&literal.value()) {
            Some(ty) => {
                format!("expected a Rust element type, not a string: write `dtype = {ty}`")
            }
            None => "expected a Rust element type such as `f32`, not a string".to_owned(),
        };
        return Err(syn::Error::new(literal.span(), message));
    }
    let ty: syn::Type = input.parse().map_err(|error| {
        syn::Error::new(
            error.span(),
            "expected a Rust element type, as in `dtype = f32`",
        )
    })?;
    Ok((ty.span(), ConstraintKind::Dtype(ty)))
}

/// The Rust element type for a dtype written as a string, in Rust's or NumPy's spelling.
fn rust_element_type(name: &str) -> Option<&'static str> {
    Some(match name {
        "bool" => "bool",
        "i8" | "int8" => "i8",
        "i16" | "int16" => "i16",
        "i32" | "int32" => "i32",
        "i64" | "int64" => "i64",
        "u8" | "uint8" => "u8",
        "u16" | "uint16" => "u16",
        "u32" | "uint32" => "u32",
        "u64" | "uint64" => "u64",
        "f16" | "float16" => "half::f16",
        "bf16" | "bfloat16" => "half::bf16",
        "f32" | "float32" => "f32",
        "f64" | "float64" => "f64",
        "complex64" => "num_complex::Complex<f32>",
        "complex128" => "num_complex::Complex<f64>",
        _ => return None,
    })
}

/// `ndim = 2`.
fn parse_ndim(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    let expected = "expected a number of axes, as in `ndim = 2`";
    let literal: LitInt = input
        .parse()
        .map_err(|error| syn::Error::new(error.span(), expected))?;
    let ndim = literal
        .base10_parse::<usize>()
        .map_err(|_| syn::Error::new(literal.span(), expected))?;
    Ok((literal.span(), ConstraintKind::Ndim(ndim)))
}

/// `shape = [_, 3]`.
fn parse_shape(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    if !input.peek(token::Bracket) {
        return Err(syn::Error::new(
            input.span(),
            "expected a list of extents in brackets, `_` for any, as in `shape = [_, 3]`",
        ));
    }
    let content;
    let brackets = syn::bracketed!(content in input);
    let mut pattern = Vec::new();
    while !content.is_empty() {
        if content.peek(Token![_]) {
            content.parse::<Token![_]>()?;
            pattern.push(None);
        } else if content.peek(Token![-]) {
            let minus: Token![-] = content.parse()?;
            return Err(syn::Error::new(
                minus.span,
                "a shape constraint writes an unconstrained extent as `_`, not `-1` (NumPy's spelling): `shape = [_, 3]`",
            ));
        } else if content.peek(LitInt) {
            let literal: LitInt = content.parse()?;
            let extent = literal.base10_parse::<usize>().map_err(|_| {
                syn::Error::new(literal.span(), "expected an extent that fits in `usize`")
            })?;
            pattern.push(Some(extent));
        } else {
            return Err(syn::Error::new(
                content.span(),
                "expected an extent or `_` (any extent), as in `shape = [_, 3]`",
            ));
        }
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    Ok((brackets.span.join(), ConstraintKind::Shape(pattern)))
}

/// `contiguous = "C" | "F" | "any"`.
fn parse_contiguous(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    let expected = "expected `\"C\"` (row-major), `\"F\"` (column-major) or `\"any\"` (either)";
    let literal = string_value(input, "contiguous", expected)?;
    let order = match literal.value().as_str() {
        "C" => Order::C,
        "F" => Order::F,
        "any" => Order::Any,
        other => {
            return Err(syn::Error::new(
                literal.span(),
                format_args!("{expected}, found `{other:?}`"),
            ));
        }
    };
    Ok((literal.span(), ConstraintKind::Contiguous(order)))
}

/// `device = "cpu" | "cuda" | "rocm"`.
fn parse_device(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    let expected = "expected `\"cpu\"`, `\"cuda\"` or `\"rocm\"`";
    let literal = string_value(input, "device", expected)?;
    let device = match literal.value().as_str() {
        "cpu" => DeviceKind::Cpu,
        "cuda" => DeviceKind::Cuda,
        "rocm" => DeviceKind::Rocm,
        other => {
            return Err(syn::Error::new(
                literal.span(),
                format_args!("{expected}, found `{other:?}`"),
            ));
        }
    };
    Ok((literal.span(), ConstraintKind::Device(device)))
}

/// `borrow = "shared" | "exclusive"`.
fn parse_borrow(input: ParseStream<'_>) -> syn::Result<(Span, ConstraintKind)> {
    let expected = "expected `\"shared\"` (borrow for reads) or `\"exclusive\"` (borrow for writes, with `writable`)";
    let literal = string_value(input, "borrow", expected)?;
    let kind = match literal.value().as_str() {
        "shared" => BorrowKind::Shared,
        "exclusive" => BorrowKind::Exclusive,
        other => {
            return Err(syn::Error::new(
                literal.span(),
                format_args!("{expected}, found `{other:?}`"),
            ));
        }
    };
    Ok((literal.span(), ConstraintKind::Borrow(kind)))
}

/// A string value; anything else gets "`expected`: write `key = "..."`".
fn string_value(input: ParseStream<'_>, key: &str, expected: &str) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        return input.parse();
    }
    let found = input
        .fork()
        .parse::<proc_macro2::TokenTree>()
        .map(|token| token.to_string());
    let message = match found {
        Ok(word) => format!("{expected} as a string: write `{key} = \"{word}\"`"),
        Err(_) => format!("{expected} as a string"),
    };
    Err(syn::Error::new(input.span(), message))
}

/// The error for a key that is none of `known`: the lookahead's list, preceded by the closest
/// known key when the unknown one looks like a misspelling of it.
fn unknown_key(
    input: ParseStream<'_>,
    lookahead: Lookahead1<'_>,
    known: &[&str],
    what: &str,
) -> syn::Error {
    let error = lookahead.error();
    let Ok(ident) = input.fork().call(syn::Ident::parse_any) else {
        return error;
    };
    let found = ident.to_string();
    match did_you_mean(&found, known) {
        Some(suggestion) => syn::Error::new(
            ident.span(),
            format_args!("unknown {what} `{found}`: did you mean `{suggestion}`? {error}"),
        ),
        None => error,
    }
}

/// The known key closest to `found`, when it is close enough to be a misspelling: at most a
/// third of its letters (and at least one) edited.
fn did_you_mean<'k>(found: &str, known: &[&'k str]) -> Option<&'k str> {
    let limit = (found.chars().count() / 3).max(1);
    known
        .iter()
        .map(|key| (edit_distance(found, key), *key))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, key)| key)
}

/// Edit distance between `a` and `b`, in characters: insertions, deletions, substitutions and
/// transpositions of neighbours (`shpae` is one edit from `shape`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // d[i][j]: distance between the first i characters of `a` and the first j of `b`.
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use syn::parse::Parser;

    use super::*;

    #[test]
    fn misspellings_suggest_the_closest_key() {
        let (roles, options) = (&Role::KEYWORDS, &ContainerKey::KEYWORDS);
        assert_eq!(did_you_mean("shpae", roles), Some("shape"));
        assert_eq!(did_you_mean("stride", roles), Some("strides"));
        assert_eq!(did_you_mean("byteoffset", roles), Some("byte_offset"));
        assert_eq!(did_you_mean("dims", roles), None);
        assert_eq!(did_you_mean("contigous", options), Some("contiguous"));
        assert_eq!(did_you_mean("order", options), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn every_keyword_is_peeked_as_its_key() {
        for role in Role::ALL {
            let attr: FieldAttr = syn::parse_str(role.keyword()).unwrap();
            assert_eq!(attr.role, role);
        }
        for key in ContainerKey::ALL {
            let peek = |input: ParseStream<'_>| {
                let peeked = ContainerKey::peek(input);
                input.parse::<proc_macro2::TokenStream>()?;
                Ok(peeked)
            };
            assert_eq!(peek.parse_str(key.keyword()).unwrap(), Some(key));
        }
    }
}
