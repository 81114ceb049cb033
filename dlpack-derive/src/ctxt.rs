//! Error collection: every mistake in one derive is reported at once, not only the first.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors of one derive invocation.
///
/// Must be consumed by [`Ctxt::check`]; dropping it unchecked is a bug in this crate and panics,
/// so no error can be lost silently.
pub struct Ctxt {
    /// `None` once checked.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    /// An empty collector.
    pub fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records `message`, pointing at `span`.
    pub fn error_at<M: Display>(&self, span: Span, message: M) {
        self.syn_error(syn::Error::new(span, message));
    }

    /// Records `message`, pointing at all of `tokens`.
    pub fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, message: M) {
        self.syn_error(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error from syn, typically a parse error.
    pub fn syn_error(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("`Ctxt` used after `check`")
            .push(error);
    }

    /// Consumes the collector: all recorded errors, combined into one.
    pub fn check(self) -> syn::Result<()> {
        let errors = self
            .errors
            .borrow_mut()
            .take()
            .expect("`Ctxt` checked twice");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("dlpack-derive: errors were collected but never checked");
        }
    }
}
