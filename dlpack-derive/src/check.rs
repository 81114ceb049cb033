//! The rules between fields: each role at most once, `data` and `shape` exactly once.

use crate::ast::{Container, Field};
use crate::attr::Role;
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
    /// `#[dlpack(strides)]`, if any.
    pub strides: Option<&'c Field<'a>>,
    /// `#[dlpack(byte_offset)]`, if any.
    pub byte_offset: Option<&'c Field<'a>>,
    /// `#[dlpack(device)]`, if any.
    pub device: Option<&'c Field<'a>>,
}

impl<'c, 'a> Roles<'c, 'a> {
    /// The field playing `role`, if any.
    pub fn get(&self, role: Role) -> Option<&'c Field<'a>> {
        match role {
            Role::Data => Some(self.data),
            Role::Shape => Some(self.shape),
            Role::Strides => self.strides,
            Role::ByteOffset => self.byte_offset,
            Role::Device => self.device,
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
        for again in marked {
            cx.error_at(
                again.span,
                format_args!("{role} may only be specified once"),
            );
        }
        let quiet = !cont.attrs_complete || cont.refused_roles.contains(&role);
        if first.is_none() && REQUIRED.contains(&role) && !quiet {
            cx.error_spanned_by(
                cont.ident,
                format_args!("expected exactly one field marked {role}, found none"),
            );
        }
    }
    let find = |role| cont.fields.iter().find(|field| field.role() == Some(role));
    Some(Roles {
        cont,
        data: find(Role::Data)?,
        shape: find(Role::Shape)?,
        strides: find(Role::Strides),
        byte_offset: find(Role::ByteOffset),
        device: find(Role::Device),
    })
}
