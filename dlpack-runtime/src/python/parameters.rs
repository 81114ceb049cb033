//! The parameters of the array API's
//! [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html),
//! declared once ([`dlpack_parameters!`]): their names, Rust types and Python kinds, from which
//! the installed methods ([`super::methods`]) get their interned names, their text signature,
//! the general conversion of each argument and the quick read of its plain forms, and from
//! which [`DlpackArguments::request`] builds the [`ExportRequest`]. Every parameter is
//! keyword-only, as the array API's signature makes them
//! (`__dlpack__(self, /, *, stream=None, max_version=None, dl_device=None, copy=None)`).

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::ffi as pyffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};

use crate::export::ExportRequest;

/// Declares the parameters of `__dlpack__`, in order: `name: RustType, quick_reader, Kind`.
macro_rules! dlpack_parameters {
    ($($name:ident: $ty:ty, $quick:ident, $kind:expr;)*) => {
        /// The arguments of one `__dlpack__` call, one field per parameter (`None`: absent or
        /// Python's `None`).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub(crate) struct DlpackArguments {
            $(pub(crate) $name: Option<$ty>,)*
        }

        /// The parameter names, in parameter order.
        pub(crate) const NAMES: [&str; COUNT] = [$(stringify!($name)),*];

        /// `__dlpack__`'s text signature and docstring (`__text_signature__`, `__doc__`): every
        /// parameter keyword-only.
        pub(crate) const DOC: &core::ffi::CStr = match core::ffi::CStr::from_bytes_with_nul(
            text_signature!($($name)*).as_bytes(),
        ) {
            Ok(doc) => doc,
            Err(_) => panic!("a parameter name with a NUL"),
        };

        impl DlpackArguments {
            /// Converts the arguments sorted by parameter, as pyo3 converts arguments; a value
            /// of another kind is a `TypeError` naming the parameter (see [`optional`]).
            pub(crate) fn extract(
                method: &dyn Fn() -> String,
                sorted: [Option<Borrowed<'_, '_, PyAny>>; COUNT],
            ) -> PyResult<Self> {
                let [$($name),*] = sorted;
                Ok(Self {
                    $($name: optional::<$ty>(method, $name, stringify!($name), $kind)?,)*
                })
            }

            /// Reads the arguments sorted by parameter when each is in a plain form (absent,
            /// `None`, an exact `int` in range, an exact tuple of two such ints, `True` or
            /// `False`), with no Python object or exception made; `None` otherwise.
            ///
            /// # Safety
            ///
            /// Each pointer is NULL or a live object borrowed for the call, GIL held.
            pub(crate) unsafe fn quick(sorted: [*mut pyffi::PyObject; COUNT]) -> Option<Self> {
                let [$($name),*] = sorted;
                // SAFETY: NULL or live objects, GIL held (caller).
                unsafe { Some(Self { $($name: $quick($name)?,)* }) }
            }
        }
    };
}

/// The text signature of `__dlpack__` for the parameter names given, NUL-terminated.
macro_rules! text_signature {
    ($first:ident $($rest:ident)*) => {
        concat!(
            "__dlpack__($self, /, *, ",
            stringify!($first),
            "=None",
            $(", ", stringify!($rest), "=None",)*
            ")\n--\n\nA DLPack capsule of this tensor (the array API's __dlpack__).\0"
        )
    };
}

/// The number of parameters.
pub(crate) const COUNT: usize = 4;

dlpack_parameters! {
    stream: i64, quick_int, Kind::Int("an int from -2**63 to 2**63 - 1");
    max_version: (u32, u32), quick_pair,
        Kind::Pair("a (major, minor) tuple", "a tuple of two ints from 0 to 2**32 - 1");
    dl_device: (i32, i32), quick_pair,
        Kind::Pair("a (device_type, device_id) tuple", "a tuple of two ints from -2**31 to 2**31 - 1");
    copy: bool, quick_bool, Kind::Bool;
}

impl DlpackArguments {
    /// The [`ExportRequest`] these arguments ask for ([`super::export_request`]).
    pub(crate) fn request(self) -> ExportRequest {
        super::export_request(self.stream, self.max_version, self.dl_device, self.copy)
    }
}

/// The Python kind a `__dlpack__` argument must have.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// An int, with its range in words.
    Int(&'static str),
    /// A tuple of two ints, described in words, then with the range of its ints.
    Pair(&'static str, &'static str),
    Bool,
}

/// `value` converted to `V`, `None` for an absent argument or Python's `None`. An int out of
/// range is an `OverflowError` naming the parameter, the value and the range (the conversion's
/// own error as its cause). Another value of the expected kind that does not convert (a tuple of
/// another length or with a non-integer) keeps its own error (`ValueError`, `TypeError`). Both
/// carry the note `while processing '<parameter>'`, as pyo3 does for its arguments; a value of
/// another kind is a `TypeError` naming the parameter.
fn optional<'py, V: for<'a> FromPyObject<'a, 'py>>(
    method: &dyn Fn() -> String,
    value: Option<Borrowed<'_, 'py, PyAny>>,
    parameter: &str,
    kind: Kind,
) -> PyResult<Option<V>> {
    let Some(value) = value.filter(|value| !value.is_none()) else {
        return Ok(None);
    };
    value.extract::<V>().map(Some).map_err(|err| {
        let (of_kind, expected, range) = match kind {
            Kind::Int(range) => (value.is_instance_of::<PyInt>(), "an int", range),
            Kind::Pair(expected, range) => (value.is_instance_of::<PyTuple>(), expected, range),
            Kind::Bool => (value.is_instance_of::<PyBool>(), "a bool", "a bool"),
        };
        if of_kind {
            let mut err: PyErr = err.into();
            let py = value.py();
            if err.is_instance_of::<PyOverflowError>(py) {
                let overflow = PyOverflowError::new_err(format!(
                    "{}() argument '{parameter}' is out of range: {}, expected {range}",
                    method(),
                    value
                        .repr()
                        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
                ));
                overflow.set_cause(py, Some(err));
                err = overflow;
            }
            // As pyo3's `argument_extraction_error`: a note where the interpreter has notes
            // (3.11 and later); the error is kept as it is where adding one fails.
            let _ = err.value(py).call_method1(
                pyo3::intern!(py, "add_note"),
                (format!("while processing '{parameter}'"),),
            );
            return err;
        }
        PyTypeError::new_err(format!(
            "{}() argument '{parameter}' must be {expected} or None, not {}",
            method(),
            value
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    })
}

/// The length of a tuple.
///
/// # Safety
///
/// `tuple` is a live tuple, GIL held.
#[inline]
pub(super) unsafe fn tuple_size(tuple: *mut pyffi::PyObject) -> pyffi::Py_ssize_t {
    // SAFETY: a tuple (caller): the size is read from it, no exception is set.
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
    return unsafe { pyffi::PyTuple_GET_SIZE(tuple) };
    // SAFETY: as above, through the function (the limited API, PyPy and GraalPy have no macro).
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
    return unsafe { pyffi::PyTuple_Size(tuple) };
}

/// Item `i` of a tuple, borrowed.
///
/// # Safety
///
/// `tuple` is a live tuple and `0 <= i <` its length, GIL held.
#[inline]
pub(super) unsafe fn tuple_item(
    tuple: *mut pyffi::PyObject,
    i: pyffi::Py_ssize_t,
) -> *mut pyffi::PyObject {
    // SAFETY: a tuple and an index in bounds (caller): a borrowed item, no exception set.
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
    return unsafe { pyffi::PyTuple_GET_ITEM(tuple, i) };
    // SAFETY: as above, through the function (the limited API, PyPy and GraalPy have no macro).
    #[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
    return unsafe { pyffi::PyTuple_GetItem(tuple, i) };
}

/// Whether an argument is absent (NULL) or `None`.
///
/// # Safety
///
/// `value` is NULL or a live object, GIL held.
unsafe fn is_absent(value: *mut pyffi::PyObject) -> bool {
    // SAFETY: `Py_None` only reads the `None` singleton's address.
    value.is_null() || value == unsafe { pyffi::Py_None() }
}

/// An exact `int` that fits in `i64` (or absent or `None`); `None` for any other value.
///
/// # Safety
///
/// As [`is_absent`].
unsafe fn quick_int(value: *mut pyffi::PyObject) -> Option<Option<i64>> {
    // SAFETY: NULL or a live object (caller).
    if unsafe { is_absent(value) } {
        return Some(None);
    }
    // SAFETY: a live object (caller); for an exact `int`, `PyLong_AsLongLongAndOverflow`
    // reports overflow through the flag and sets no exception.
    unsafe {
        if pyffi::PyLong_CheckExact(value) == 0 {
            return None;
        }
        let mut overflow = 0;
        let v = pyffi::PyLong_AsLongLongAndOverflow(value, &mut overflow);
        (overflow == 0).then_some(Some(v))
    }
}

/// An exact tuple of two exact `int`s that fit in `A` (or absent or `None`); `None` otherwise.
///
/// # Safety
///
/// As [`is_absent`].
unsafe fn quick_pair<A: TryFrom<i64>>(value: *mut pyffi::PyObject) -> Option<Option<(A, A)>> {
    // SAFETY: NULL or a live object (caller).
    if unsafe { is_absent(value) } {
        return Some(None);
    }
    // SAFETY: a live object (caller); a tuple of size 2 has items 0 and 1 (borrowed), and
    // neither call sets an exception on a tuple.
    unsafe {
        if pyffi::PyTuple_CheckExact(value) == 0 || tuple_size(value) != 2 {
            return None;
        }
        let item = |i| quick_int(tuple_item(value, i)).flatten();
        let (a, b) = (item(0)?, item(1)?);
        Some(Some((A::try_from(a).ok()?, A::try_from(b).ok()?)))
    }
}

/// `True` or `False` (or absent or `None`); `None` for any other value.
///
/// # Safety
///
/// As [`is_absent`].
unsafe fn quick_bool(value: *mut pyffi::PyObject) -> Option<Option<bool>> {
    // SAFETY: NULL or a live object (caller); `Py_True`/`Py_False` only read addresses.
    unsafe {
        if is_absent(value) {
            Some(None)
        } else if value == pyffi::Py_True() {
            Some(Some(true))
        } else if value == pyffi::Py_False() {
            Some(Some(false))
        } else {
            None
        }
    }
}
