//! Loaded modules and their kernels (signatures only), and the pointer parameters of a launch.

use std::collections::HashMap;
use std::sync::Arc;

use super::base::Handle;
use super::ptx::Param;

/// A loaded module: its context and its kernels' handles, by name.
pub(crate) struct Module {
    pub(crate) ctx: Handle,
    pub(crate) functions: HashMap<String, Handle>,
}

/// A kernel of a loaded module.
pub(crate) struct Function {
    pub(crate) module: Handle,
    pub(crate) ctx: Handle,
    pub(crate) name: Arc<str>,
    pub(crate) params: Vec<Param>,
    /// Parameters declared read-only (`cuSimKernelParamReadOnly`), by index.
    pub(crate) read_only: Vec<bool>,
}

/// Modules not unloaded, and their kernels.
#[derive(Default)]
pub(crate) struct Kernels {
    pub(crate) modules: HashMap<Handle, Module>,
    pub(crate) functions: HashMap<Handle, Function>,
}

/// A pointer-sized parameter of a launch: its index, its value, and whether the launch writes
/// what it points into (not declared read-only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KernelPointer {
    pub(crate) index: usize,
    pub(crate) value: u64,
    pub(crate) write: bool,
}
