//! The grammar of `#[dlpack(...)]`: field roles and container options.
//!
//! Both lists are comma-separated. A field's list holds role keywords ([`FieldAttr`]); the
//! container's holds `key = value` options ([`ContainerAttr`]). An unknown key is answered by
//! [`syn::parse::Lookahead1`], which lists what was expected; a key written in the wrong place
//! gets an error saying where it belongs.

use std::fmt;

use proc_macro2::Span;
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::{LitStr, Token, token};

/// The keywords of `#[dlpack(...)]` (`crate` is Rust's own keyword, `Token![crate]`).
pub mod kw {
    syn::custom_keyword!(data);
    syn::custom_keyword!(shape);
    syn::custom_keyword!(strides);
    syn::custom_keyword!(byte_offset);
    syn::custom_keyword!(device);
}

/// What a field is to the tensor. A field has at most one role; `data` and `shape` are
/// required, the others optional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `data`: the buffer.
    Data,
    /// `shape`: extents in elements.
    Shape,
    /// `strides`: strides in elements.
    Strides,
    /// `byte_offset`: bytes from the buffer start to element `(0, ..., 0)`.
    ByteOffset,
    /// `device`: where the memory lives.
    Device,
}

impl Role {
    /// Every role, in the order the generated code handles them.
    pub const ALL: [Role; 5] = [
        Role::Data,
        Role::Shape,
        Role::Strides,
        Role::ByteOffset,
        Role::Device,
    ];

    /// The keyword, as written in `#[dlpack(...)]`.
    pub fn keyword(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Shape => "shape",
            Role::Strides => "strides",
            Role::ByteOffset => "byte_offset",
            Role::Device => "device",
        }
    }
}

/// Displays as the attribute a user writes, `#[dlpack(data)]`, for error messages.
impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`#[dlpack({})]`", self.keyword())
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
        if input.peek(Token![crate]) {
            let token: Token![crate] = input.parse()?;
            return Err(syn::Error::new(
                token.span,
                "`#[dlpack(crate = ...)]` is a container option: write it on the struct, not on a field",
            ));
        }
        let lookahead = input.lookahead1();
        let (role, span) = if lookahead.peek(kw::data) {
            (Role::Data, input.parse::<kw::data>()?.span)
        } else if lookahead.peek(kw::shape) {
            (Role::Shape, input.parse::<kw::shape>()?.span)
        } else if lookahead.peek(kw::strides) {
            (Role::Strides, input.parse::<kw::strides>()?.span)
        } else if lookahead.peek(kw::byte_offset) {
            (Role::ByteOffset, input.parse::<kw::byte_offset>()?.span)
        } else if lookahead.peek(kw::device) {
            (Role::Device, input.parse::<kw::device>()?.span)
        } else {
            return Err(lookahead.error());
        };
        if input.peek(Token![=]) || input.peek(token::Paren) {
            let value = input.span();
            return Err(syn::Error::new(
                value,
                format_args!("`{}` takes no value: write {role}", role.keyword()),
            ));
        }
        Ok(FieldAttr { role, span })
    }
}

/// One item of the container's `#[dlpack(...)]`.
pub enum ContainerAttr {
    /// `crate = "path"`: the path of `dlpack_runtime` when it is renamed.
    Crate {
        /// The `crate` keyword, for errors about this option.
        token: Token![crate],
        /// The path, parsed from the string; its tokens carry the string's span.
        path: syn::Path,
    },
}

impl Parse for ContainerAttr {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if let Some(role) = peek_role(input) {
            return Err(syn::Error::new(
                input.span(),
                format_args!("{role} is a field role: write it on a field, not on the struct"),
            ));
        }
        let lookahead = input.lookahead1();
        if lookahead.peek(Token![crate]) {
            let token: Token![crate] = input.parse()?;
            input.parse::<Token![=]>()?;
            let path = parse_crate_path(input)?;
            Ok(ContainerAttr::Crate { token, path })
        } else {
            Err(lookahead.error())
        }
    }
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

/// The role whose keyword comes next, without consuming it.
fn peek_role(input: ParseStream<'_>) -> Option<Role> {
    if input.peek(kw::data) {
        Some(Role::Data)
    } else if input.peek(kw::shape) {
        Some(Role::Shape)
    } else if input.peek(kw::strides) {
        Some(Role::Strides)
    } else if input.peek(kw::byte_offset) {
        Some(Role::ByteOffset)
    } else if input.peek(kw::device) {
        Some(Role::Device)
    } else {
        None
    }
}
