//! Python glue (feature `python`): `__dlpack__`, `__dlpack_device__` and `from_dlpack` on pyo3.
//!
//! # Producer: give a `#[pyclass]` tensor the protocol
//!
//! A frozen pyclass that derives [`DlpackExport`](crate::DlpackExport) gets the two methods with one line each. The
//! export is shared and read-only: the Python object stays alive while any consumer holds the
//! tensor, and a frozen class cannot be mutated from Rust in the meantime.
//!
//! ```
//! use dlpack_runtime::{DlpackExport, python};
//! use pyo3::prelude::*;
//! use pyo3::types::PyCapsule;
//!
//! #[pyclass(frozen)]
//! #[derive(DlpackExport)]
//! struct Tensor {
//!     #[dlpack(data)]
//!     data: Vec<f32>,
//!     #[dlpack(shape)]
//!     shape: Vec<usize>,
//! }
//!
//! #[pymethods]
//! impl Tensor {
//!     #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
//!     fn __dlpack__<'py>(
//!         slf: &Bound<'py, Self>,
//!         stream: Option<i64>,
//!         max_version: Option<(u32, u32)>,
//!         dl_device: Option<(i32, i32)>,
//!         copy: Option<bool>,
//!     ) -> PyResult<Bound<'py, PyCapsule>> {
//!         python::dlpack(slf, stream, max_version, dl_device, copy)
//!     }
//!
//!     fn __dlpack_device__(&self) -> (i32, i32) {
//!         python::dlpack_device(self)
//!     }
//!
//!     // Optional: the DLPack 1.3 C exchange API (`DLPackExchangeAPI`), for C consumers.
//!     #[classattr]
//!     fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
//!         python::dlpack_c_exchange_api::<Self>(py)
//!     }
//! }
//! ```
//!
//! Or install all three on the type with one call in the module's init,
//! [`add_dlpack_methods`]`::<Tensor>(m.py())`: the same protocol, as vectorcall methods whose
//! argument handling is written for `__dlpack__` (faster per call than pyo3's general one).
//!
//! To hand a Rust tensor to Python **by value** (writable, exported once), wrap it with
//! [`export_once`]: the result is a Python object with `__dlpack__` that `numpy.from_dlpack`
//! and friends accept.
//!
//! # Consumer
//!
//! [`from_dlpack`] builds any [`DlpackImport`](crate::DlpackImport) type from a Python object that has `__dlpack__`
//! (calling `__dlpack_device__` first and asking for `max_version=(1, 3)`, with the fallback on
//! `TypeError` that the Notes of the array API's
//! [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html)
//! recommend), or from a raw capsule; [`from_dlpack_with`] adds `device` and `copy`. Producers
//! whose type publishes the C exchange API are read through it when no synchronization is
//! needed. A NumPy `ndarray` (exactly that type) with nothing asked is read from the array's
//! fields, as its `__dlpack__` would export it, without calling it.
//!
//! PyTorch tensors get one answer on both paths: PyTorch's
//! [`Tensor.__dlpack__`](https://github.com/pytorch/pytorch/blob/main/torch/_tensor.py) refuses
//! tensors that require grad, have the conjugate bit set, have a layout other than
//! `torch.strided` (sparse) or a quantized dtype, and its C exchange API does not; it exports a
//! tensor with the negative bit set as its memory (the values before the negation) on both.
//! The consumer refuses all five with `BufferError`, whichever path it takes, naming the fix
//! (`tensor.detach()`, `tensor.resolve_conj()`, `tensor.to_dense()`, `tensor.dequantize()`,
//! `tensor.resolve_neg()`). A torch subclass is read through the C exchange API only when its
//! `__dlpack__`, `__torch_function__` (or PyTorch's disabled one, as `torch.nn.Parameter` has),
//! `__torch_dispatch__` and table are PyTorch's own; otherwise through `__dlpack__` (an
//! overridden `__dlpack__` after the negative bit check alone). These checks call PyTorch's own
//! accessors (`requires_grad`, `is_neg()`, and `is_conj()` for complex tensors): they roughly
//! double the cost of a torch import through the C exchange API. A subclass's are called with
//! subclasses' `__torch_function__` disabled, as PyTorch's own subclasses call them, so a
//! subclass that refuses torch functions (`torch.utils.dlpack.ReadOnlyTensorWrapper`, which
//! allows only its DLPack methods) is read through its `__dlpack__` (read-only, for that one);
//! a check that fails all the same (under a torch function mode that refuses it) leaves the
//! answer to the subclass's `__dlpack__`.
//!
//! # CUDA Array Interface (feature `cuda`)
//!
//! The other protocol of the same exchange, the
//! [CUDA Array Interface](https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html)
//! (the producer names one stream, the consumer orders itself after it), is served both ways:
//! [`add_dlpack_methods`] also installs `__cuda_array_interface__` (version 3; see
//! `cuda_array_interface`) on a pyclass whose tensor is in CUDA memory, and [`from_dlpack`]
//! reads objects that have only that attribute (versions 0 to 3), ordering the consumer's
//! stream after the exported `stream` with an event. Where an object has both, `__dlpack__` is
//! used: it carries ownership (a deleter) and the device, which the interface leaves to the
//! caller's care and to pointer queries.
//!
//! # C exchange API (`DLPackExchangeAPI` in `dlpack.h`)
//!
//! [`dlpack_c_exchange_api`] builds the
//! [`__dlpack_c_exchange_api__`](https://data-apis.org/array-api/draft/API_specification/generated/array_api.array.__dlpack_c_exchange_api__.html)
//! capsule for a pyclass, so C consumers (tvm-ffi, PyTorch extensions) skip the Python-level
//! call.
//!
//! # Capsules
//!
//! As the "Implementation" section of the
//! [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html) has it,
//! capsules are named `"dltensor_versioned"` or `"dltensor"`. Their destructor calls the tensor's
//! deleter only while the capsule still has that name; a consumer that takes ownership renames it
//! to `"used_dltensor_versioned"` / `"used_dltensor"`. [`from_dlpack`] renames only once it has
//! taken ownership, and leaves the capsule untouched when it refuses it (a foreign major
//! version), so the producer frees it.
//!
//! # Threads and the GIL
//!
//! A tensor imported from Python (a NumPy array, say) is freed by its producer's deleter, which
//! takes the GIL. Dropping such an import on a thread other than the one holding the GIL blocks
//! until the GIL is released; drop it while attached, or from a thread that can wait.
//!
//! No host wait of this crate holds the GIL (feature `cuda`): a copy of CUDA memory to the host
//! (`dl_device=(CPU, 0)`, or [`from_dlpack_with`] with `device` CPU), a copy with `stream=-1`,
//! a host synchronization with a producer's streams, and [`ReadyEvents::synchronize`] release
//! it for the duration of the driver calls that block (pyo3's `Python::detach`), wherever they
//! are reached from: `__dlpack__`, `from_dlpack`, or your own code while attached. Other Python
//! threads run meanwhile, so a wait for work that a Python thread lets go on (a gate, a
//! callback) ends. Only the driver calls run detached, and no lock of this crate is held across
//! them.
//!
//! This holds on every build. Full-API builds ask `PyGILState_Check`; builds on the limited
//! API (`abi3`) ask `PyThreadState_GetDict` when the running interpreter is CPython 3.12 or
//! later (it reads the thread's own state there), and on CPython 3.11 the `PyGILState_Check`
//! that 3.11 exports, looked up at run time. Where neither can be had (an abi3 wheel on CPython
//! 3.11 on Windows, PyPy, GraalPy), the entry points of this module (`__dlpack__`,
//! [`from_dlpack`], the C exchange API) mark the thread attached from their `Python<'py>`
//! token, so every wait they reach detaches, and a wait reached from your own code keeps the
//! GIL (detach around it yourself); code that runs inside an entry point (a hand-written
//! `export_parts`, a `Drop`) must then not call into this crate from inside a `py.detach` of
//! its own there.
//!
//! A deleter that runs on a thread that is not attached while the interpreter finalizes (or
//! after) leaves the Python reference it holds to the interpreter's end instead of attaching,
//! which would end or hang the thread (`Py_IsFinalizing`), as NumPy and nanobind do.
//!
//! Do the same for your own waits: a `cuStreamSynchronize`, or a copy to pageable host memory
//! (which the driver completes before returning), called while attached, belongs in
//! `py.detach(|| ...)`, with nothing inside that needs the GIL and no lock held that a Python
//! thread may wait for. The example extension's `sum_on` does so.
//!
//! [`ReadyEvents::synchronize`]: crate::interop::cuda::ReadyEvents::synchronize
//!
//! # Free-threaded Python (3.13t, 3.14t)
//!
//! A `#[pymodule]` of pyo3 0.28 or later declares itself free-thread-safe unless it says
//! `gil_used = true`, and this crate is written to be used from such a module:
//!
//! - each check-then-act on a capsule (name check, pointer, rename in [`consume_capsule`]) runs
//!   in a critical section on the capsule (pyo3's `with_critical_section`, a no-op with a GIL):
//!   one capsule handed to several threads at once is owned by exactly one of them, the others
//!   get the `ValueError` of a consumed capsule, and the deleter runs once;
//! - the process-wide tables (the borrow registry published in `sys.modules` with
//!   `dict.setdefault`, the per-type caches and definitions) are made once under concurrent
//!   first use, behind locks of their own;
//! - no lock of this crate is held across a call that can run Python code or attach, and a
//!   borrow conflict raises at once, never waits.
//!
//! So declare `#[pymodule(gil_used = false)]` (or leave pyo3's default) unless your own module
//! keeps state that relied on the GIL (a `static` behind a `RefCell`-like cell, `unsendable`
//! classes shared across threads): that is the only part this crate cannot vouch for. The
//! example extension declares it explicitly. `cargo clippy` of this crate for a free-threaded
//! target (pyo3's `Py_GIL_DISABLED` build configuration) is part of the test command.
//!
//! # Exceptions
//!
//! | error | Python exception |
//! |---|---|
//! | [`StreamError`], [`ExportError::Stream`] (illegal `stream` value) | `ValueError` |
//! | every other [`ExportError`] (`dl_device`, a `dl_device` CUDA device the process does not have, `copy=False`, read-only legacy, layout) | `BufferError` |
//! | [`ImportError`] (version, layout, dtype, constraints), [`HeaderError`] | `BufferError` |
//! | [`LayoutError::IndexRank`], [`LayoutError::IndexOutOfBounds`] (typed access: `get`, `set`) | `IndexError` |
//! | [`LayoutError::Borrow`] (another import of the same memory holds a conflicting borrow, in this crate's registry or in rust-numpy's: [`BorrowError`](crate::BorrowError)), at an access or, for a consumer marked `#[dlpack(borrow = "...")]`, at import, where pyo3 adds a note naming the argument (`while processing 'b'`) | `BufferError` |
//! | rust-numpy's own refusal of its `PyReadonlyArray`/`PyReadwriteArray` argument that conflicts with a borrow of this crate (not this crate's error) | `TypeError` "The given array is already borrowed" (rust-numpy's `BorrowError`) |
//! | every other [`LayoutError`] (not host-accessible, not contiguous, read-only, ...) | `BufferError` |
//! | `cuda::CudaError` (feature `cuda`) | `BufferError` |
//! | `hip::HipError` (feature `hip`; inside `ExportError::Hip` too): no HIP runtime, a pointer or stream of another device, a CUDA stream for a ROCm tensor, a stream being captured | `BufferError` |
//! | [`CaiError`](crate::CaiError) (a `__cuda_array_interface__` that cannot be read): a missing or mistyped field | `TypeError` |
//! | [`CaiError`](crate::CaiError): a mask, a structured `descr`, a `typestr` without a DLPack dtype, a layout the shared layout checks refuse (more than 64 axes) | `BufferError` |
//! | [`CaiError`](crate::CaiError): a `data` pointer that is not CUDA memory the driver knows, a `stream` the driver does not know | `BufferError` |
//! | [`CaiError`](crate::CaiError): any other invalid value (`version`, `stream=0`, extents, strides, pointer, a `descr` that contradicts `typestr`, a layout reaching outside the allocation of its `data` pointer) | `ValueError` |
//! | `__cuda_array_interface__` of a host tensor, or of a dtype without a `typestr` | `AttributeError` |
//! | a capsule that was already consumed | `ValueError` |
//! | a capsule of another kind | `TypeError` |
//! | an object without `__dlpack__` that is not a capsule (a `str`, a list) | `TypeError`, with a note naming the argument (`while processing 'x'`, printed by Python 3.11+ tracebacks) when pyo3 converts a pyfunction argument |
//! | wrong argument types (`stream` not an int, `max_version` not a tuple), unknown or repeated keywords | `TypeError` (from pyo3, or from the methods [`add_dlpack_methods`] installs) |
//! | a `max_version` or `dl_device` tuple whose length is not 2 | `ValueError` (pyo3's conversion, on both paths) |
//! | integers out of range (`stream=2**70`, `max_version=(-1, 0)`, `dl_device=(2, 2**31)`) | `OverflowError`; from the methods [`add_dlpack_methods`] installs, naming the parameter, the value and the range (`argument 'dl_device' is out of range: (2, 2147483648), expected a tuple of two ints from -2**31 to 2**31 - 1`) |

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyValueError};

use crate::export::ExportError;
use crate::import::ImportError;
use crate::plan::stream::StreamError;
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::HeaderError;

#[cfg(feature = "burn")]
pub(crate) mod burn;
#[cfg(feature = "burn-cuda")]
pub(crate) mod burn_cuda;
#[cfg(feature = "cuda")]
mod cai;
#[cfg(feature = "candle")]
pub(crate) mod candle;
mod capsule;
mod consumer;
mod exchange_api;
mod export_once;
// The registry and call wrapper of definitions installed at run time (`methods`, `cai`).
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
mod installed;
// Vectorcall methods (`METH_FASTCALL`): the full C API, or the limited API of Python 3.10+.
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
mod methods;
mod numpy_array;
mod parameters;
mod producer;
mod torch;

#[cfg(feature = "cuda")]
pub use cai::cuda_array_interface;
pub use capsule::{consume_capsule, to_capsule};
pub use consumer::{FromDlpackOptions, from_dlpack, from_dlpack_with, managed_from_object};
pub use exchange_api::dlpack_c_exchange_api;
pub use export_once::{ExportOnce, export_managed, export_once};
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
pub use methods::add_dlpack_methods;
pub use producer::{dlpack, dlpack_device, export_request};

/// Sets the Python exception `err` makes, with pyo3 attached: the error path of the functions
/// CPython and C consumers call with the GIL held, whose common path runs on
/// `Python::assume_attached` (where pyo3 must not build or drop a `PyErr`, which may hold
/// references it would defer releasing). Where pyo3 refuses to attach (the interpreter is
/// finalizing), a plain `SystemError` is set instead of `err`. Never unwinds.
///
/// # Safety
///
/// The GIL is held (what a caller of a method or of the C exchange API guarantees).
#[cold]
unsafe fn restore_attached(err: impl FnOnce() -> PyErr) {
    let restored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pyo3::Python::try_attach(|py| err().restore(py))
    }));
    if !matches!(restored, Ok(Some(()))) {
        // SAFETY: the GIL is held (caller); the message is a static C string.
        unsafe { raise_unattached(c"a DLPack call failed while Python could not be attached") };
    }
}

/// Sets `SystemError(message)` with the C API alone, for when pyo3 cannot be attached (the
/// interpreter is finalizing, or a garbage collector traversal is running).
///
/// # Safety
///
/// The GIL is held.
#[cold]
unsafe fn raise_unattached(message: &core::ffi::CStr) {
    // SAFETY: the GIL is held (caller); `PyExc_SystemError` is a live static type object.
    unsafe { pyo3::ffi::PyErr_SetString(pyo3::ffi::PyExc_SystemError, message.as_ptr()) };
}

impl From<ExportError> for PyErr {
    fn from(err: ExportError) -> Self {
        match err {
            ExportError::Stream(_) => PyValueError::new_err(err.to_string()),
            _ => PyBufferError::new_err(err.to_string()),
        }
    }
}

impl From<HeaderError> for PyErr {
    fn from(err: HeaderError) -> Self {
        PyBufferError::new_err(err.to_string())
    }
}

impl From<ImportError> for PyErr {
    fn from(err: ImportError) -> Self {
        match err {
            ImportError::Export(export) => export.into(),
            ImportError::Layout(
                layout @ (LayoutError::IndexRank { .. } | LayoutError::IndexOutOfBounds { .. }),
            ) => layout.into(),
            _ => PyBufferError::new_err(err.to_string()),
        }
    }
}

impl From<LayoutError> for PyErr {
    fn from(err: LayoutError) -> Self {
        match err {
            LayoutError::IndexRank { .. } | LayoutError::IndexOutOfBounds { .. } => {
                PyIndexError::new_err(err.to_string())
            }
            _ => PyBufferError::new_err(err.to_string()),
        }
    }
}

impl From<StreamError> for PyErr {
    fn from(err: StreamError) -> Self {
        PyValueError::new_err(err.to_string())
    }
}

#[cfg(feature = "cuda")]
impl From<crate::interop::cuda::CudaError> for PyErr {
    fn from(err: crate::interop::cuda::CudaError) -> Self {
        PyBufferError::new_err(err.to_string())
    }
}

#[cfg(feature = "hip")]
impl From<crate::interop::hip::HipError> for PyErr {
    fn from(err: crate::interop::hip::HipError) -> Self {
        PyBufferError::new_err(err.to_string())
    }
}
