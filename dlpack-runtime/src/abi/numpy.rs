//! NumPy's C ABI, as far as this crate reads it (feature `python`): the first fields of an
//! `ndarray` object and of its dtype descriptor, as `ndarraytypes.h` declares them. Read by the
//! Python consumer, which imports NumPy arrays from their fields.

use core::ffi::{c_char, c_int};

use pyo3::ffi as pyffi;

/// The first fields of NumPy's `PyArrayObject_fields` (`ndarraytypes.h`), the same from NumPy
/// 1.0 to 2.x. The object header is the interpreter's, as pyo3 declares it for this build.
#[repr(C)]
pub(crate) struct ArrayFields {
    ob_base: pyffi::PyObject,
    pub(crate) data: *mut c_char,
    pub(crate) nd: c_int,
    pub(crate) dimensions: *const isize,
    pub(crate) strides: *const isize,
    pub(crate) base: *mut pyffi::PyObject,
    pub(crate) descr: *const DescrFields,
    pub(crate) flags: c_int,
}

/// The first fields of NumPy's `PyArray_Descr` (`ndarraytypes.h`), the same from NumPy 1.0 to
/// 2.x (2.0 renamed the char `flags` to `_former_flags`; `type_num` keeps its place).
#[repr(C)]
pub(crate) struct DescrFields {
    ob_base: pyffi::PyObject,
    typeobj: *mut pyffi::PyTypeObject,
    kind: c_char,
    type_: c_char,
    pub(crate) byteorder: c_char,
    former_flags: c_char,
    pub(crate) type_num: c_int,
}
