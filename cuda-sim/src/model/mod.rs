//! The model: devices, contexts, memory, streams, events, captures and graphs, kernels and the
//! happens-before checker, with the operations every driver face calls (`ops`, `kernel`). It
//! knows no face: handles are numbers, results the driver's codes.
//!
//! Its files depend one way, lowest first: `base`, `config`, `checker`, `ptx`; `stream`,
//! `memory`, `request`, `module`; `nodes`; `state` (the machine); `prepare`, `peer`,
//! `kernel`, `capture`; `ops`.

pub(crate) mod base;
pub(crate) mod capture;
pub(crate) mod checker;
pub(crate) mod config;
pub(crate) mod kernel;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod nodes;
pub(crate) mod ops;
pub(crate) mod peer;
pub(crate) mod prepare;
pub(crate) mod ptx;
pub(crate) mod request;
pub(crate) mod state;
pub(crate) mod stream;
