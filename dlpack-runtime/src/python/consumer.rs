//! The consumer side: `from_dlpack` for any `DlpackImport` type, negotiating `max_version`,
//! `dl_device` and `copy`, through the C exchange API when the producer publishes one.

use std::sync::Mutex;

use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError};
use pyo3::ffi as pyffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::abi::ffi::{self, DLManagedTensorVersioned};
use crate::export::{COPIES_CUDA_MEMORY, ExportRequest, copies_between, serve};
use crate::import::DlpackImport;
use crate::tensor::device::Device;
use crate::tensor::managed::ManagedTensor;

use super::torch;
use super::*;

/// Options of `from_dlpack(x, /, *, device=None, copy=None)` (the array API's
/// [`from_dlpack`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.from_dlpack.html)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FromDlpackOptions {
    /// Device the data must end up on; `None`: the producer's device. Passed to the producer as
    /// `dl_device`.
    pub device: Option<Device>,
    /// `Some(true)`: always copy; `Some(false)`: never copy; `None`: copy only if needed.
    pub copy: Option<bool>,
    /// The consumer's stream, passed as `stream=` (the `stream` parameter of the array API's
    /// [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html):
    /// for CUDA a `cudaStream_t` as an integer, `1` or `2` for the default streams, `-1` for no
    /// synchronization; for ROCm a `hipStream_t` as an integer, `0` for the default stream, `-1`
    /// for no synchronization, while `1` and `2` are refused with `ValueError`); `None` passes
    /// none, which a CUDA producer reads as the legacy default stream and a ROCm producer as the
    /// default stream.
    pub stream: Option<i64>,
    /// Whether an import through `__cuda_array_interface__` skips ordering the consumer's
    /// stream after the exported `stream` (set only by the `unsafe`
    /// [`without_cuda_array_interface_sync`](Self::without_cuda_array_interface_sync)).
    pub(crate) cai_unsynchronized: bool,
}

impl FromDlpackOptions {
    /// No device change, copy only if needed, no stream.
    pub const fn new() -> Self {
        Self {
            device: None,
            copy: None,
            stream: None,
            cai_unsynchronized: false,
        }
    }

    /// Imports through `__cuda_array_interface__` ignore its `stream` entry, as if it were
    /// `None`: the consumer's stream is not ordered after the producer's pending work (the
    /// interface's consumer option, "Synchronization" section; Numba's `sync=False`, CuPy's
    /// `CUPY_CUDA_ARRAY_INTERFACE_SYNC=0`). DLPack imports are not affected.
    ///
    /// # Safety
    ///
    /// The caller orders every access to the imported memory after the producer's pending work
    /// itself (a host synchronization of the producer's stream, an event of its own). Otherwise
    /// reads race with the producer's writes, and host-accessible memory read from Rust is a
    /// data race.
    pub const unsafe fn without_cuda_array_interface_sync(mut self) -> Self {
        self.cai_unsynchronized = true;
        self
    }

    /// Sets `stream`: the stream the consumer will use the data on.
    pub const fn stream(mut self, stream: Option<i64>) -> Self {
        self.stream = stream;
        self
    }

    /// Sets `device`.
    pub const fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Sets `copy`.
    pub const fn copy(mut self, copy: Option<bool>) -> Self {
        self.copy = copy;
        self
    }
}

/// `from_dlpack` for Rust: builds `T` from any Python object that has `__dlpack__`, or from a
/// raw DLPack capsule. Same as [`from_dlpack_with`] with default options.
///
/// # Errors
///
/// As [`from_dlpack_with`].
pub fn from_dlpack<T: DlpackImport>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    from_dlpack_with(obj, &FromDlpackOptions::new())
}

/// `from_dlpack(obj, device=..., copy=...)` for Rust.
///
/// Protocol (the [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html),
/// the array API's `from_dlpack` and the `max_version` Notes of its `__dlpack__`, and
/// `DLPackExchangeAPI` in `dlpack.h`): an object whose type is exactly NumPy's `ndarray`, with
/// no `device`, `copy` or `stream` asked, is read from its fields as its `__dlpack__` would
/// export it (writeable arrays of the fixed-size boolean, integer, floating-point and complex
/// dtypes in native byte order, strides a multiple of the item size, up to 8 dimensions; its
/// `manager_ctx` is the array, kept alive until the import is dropped), without calling it.
/// Otherwise, when the producer's type publishes the C exchange API
/// ([`__dlpack_c_exchange_api__`](https://data-apis.org/array-api/draft/API_specification/generated/array_api.array.__dlpack_c_exchange_api__.html),
/// version 1.x; looked up once per type) and no
/// `device`/`copy` is asked, the tensor is taken through `managed_tensor_from_py_object_no_sync`
/// and kept if it is host memory with no `stream` asked, or (feature `cuda`) CUDA device memory, whose
/// producer's `current_work_stream` is then ordered before the consumer's `stream` by an event
/// (`None`: the legacy default stream), as `__dlpack__(stream=...)` would; the same for ROCm
/// device memory (feature `hip`), whose `current_work_stream` is a HIP stream, with `stream`
/// read by the ROCm column (`None` and `0`: the default stream). A table whose call
/// fails with `BufferError`, or fails without setting an exception (which `dlpack.h` does not
/// allow, and some producers do), refuses that path. Otherwise, or then, with `device` a CUDA
/// device (feature `cuda`), it asks `__dlpack_device__()` first: a producer on the host (`cpu`
/// or `cuda_host`) is asked for its memory as it is, `__dlpack__(max_version=(1, 3))` with no
/// `stream` (which must be `None` for a host tensor) and no `dl_device` or `copy`, and that
/// memory is copied onto the device here, on the consumer's `stream` (a stream of that device;
/// `copy=False` is refused with `BufferError` before the producer is asked). Any other producer
/// is asked `__dlpack__(max_version=(1, 3), dl_device=..., copy=..., stream=...)` (no keyword
/// left at its default is passed), and on
/// `TypeError` retries `__dlpack__()` (with `stream` only, if one was given) for producers that
/// predate the keywords, then serves `copy=True` and `device` itself (copying CUDA memory with
/// the `cuda` feature) and checks `device`. CUDA memory handed over despite `device=CPU` (by
/// such a producer, or one that ignores `dl_device`) is copied to the host after an event
/// recorded on the consumer's `stream` (`None`: the legacy default stream; none for `-1`), so
/// the copy reads after the work the producer ordered before that stream; ROCm memory so
/// handed over (feature `hip`) is copied to the host after the consumer's `stream` too (ROCm
/// column: `None` and `0` the default stream; none for `-1`). With `device` a CUDA
/// device (feature `cuda`), host memory, or CUDA memory of another device, handed over where
/// that device was asked is copied onto it here, on the consumer's `stream` (a stream of that
/// device), unless `copy=False`. The capsule is
/// consumed as [`consume_capsule`] describes, and the tensor is validated by `T`'s import before
/// anything reads it.
///
/// An object without `__dlpack__` that has `__cuda_array_interface__` (feature `cuda`; the
/// [CUDA Array Interface](https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html),
/// versions 0 to 3) is read through it: its fields checked, the consumer's `stream` (`None`: the
/// legacy default stream) made to wait on an event recorded on the exported `stream` (unless
/// [`FromDlpackOptions::without_cuda_array_interface_sync`]), `device` and `copy` served as for
/// a producer that refused the keywords, and the object kept alive until the import is dropped.
/// `__dlpack__` is preferred where an object has both.
///
/// PyTorch tensors (types found once per type, from `sys.modules`, never importing torch): what
/// PyTorch's `Tensor.__dlpack__` refuses (requires grad, conjugate bit, a layout other than
/// strided, quantized dtypes) and the negative bit, which it exports wrongly, are refused with
/// `BufferError` on both paths; a C exchange API call that fails for a torch tensor falls back
/// to `__dlpack__`. Subclasses that override `__dlpack__`, `__torch_function__` or
/// `__torch_dispatch__` are read through `__dlpack__` (see the module docs).
///
/// # Errors
///
/// `TypeError` when `obj` is neither a DLPack producer (no `__dlpack__`), nor an object with
/// `__cuda_array_interface__` (feature `cuda`), nor a capsule, saying what it is (pyo3 prefixes
/// the argument's name when the import is a pyfunction argument's conversion); for a
/// `__cuda_array_interface__` that cannot be read, the exceptions of
/// [`CaiError`](crate::CaiError) (module docs); the producer's own exceptions; those of
/// [`consume_capsule`]; `BufferError` for the torch tensors above, when the result cannot be on
/// `device`, when `copy=False`
/// cannot be honoured, or when `T` refuses the tensor (its deleter then runs). After a C
/// exchange API call that failed without an exception, an import through `__dlpack__` that
/// fails too is a `BufferError` that names the producer's type and says so, with the error of
/// `__dlpack__` as its `__cause__`.
pub fn from_dlpack_with<T: DlpackImport>(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<T> {
    let _attached = crate::abi::gil::Attached::enter(obj.py());
    let managed = managed_from_object(obj, options)?;
    T::from_managed(managed).map_err(Into::into)
}

/// The managed tensor of `obj` (a producer or a capsule), as [`from_dlpack_with`] obtains it.
///
/// # Errors
///
/// As [`from_dlpack_with`].
pub fn managed_from_object(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<ManagedTensor> {
    let py = obj.py();
    let _attached = crate::abi::gil::Attached::enter(py);
    crate::borrow::prepare(py);
    // SAFETY: `obj` is a live object, GIL held.
    if unsafe { pyffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return settle(consume_capsule(obj)?, options, true);
    }
    // A NumPy array, asked for nothing: read from its fields, as its `__dlpack__` would export it.
    if let (None, None, None) = (options.device, options.copy, options.stream) {
        if let Some(ndarray) = crate::borrow::numpy_ndarray_type(py) {
            if let Some(managed) = super::numpy_array::import(obj, ndarray) {
                return Ok(managed);
            }
        }
    }
    let producer = producer_of(&obj.get_type())?;
    // The function of the producer's C exchange API that failed without setting an exception.
    let mut silent = None;
    if let (Some(api), None, None) = (producer.api, options.device, options.copy) {
        let torch = producer.torch == torch::Kind::Plain;
        match via_exchange_api(obj, api, producer.own) {
            Ok(managed) => {
                let managed = if torch {
                    torch::refuse_exported(obj, managed)?
                } else {
                    managed
                };
                match order_exchanged(py, managed, api, options) {
                    Ok(Some(managed)) => return made_ready(managed, options),
                    // Memory this consumer cannot order was given back: ask `__dlpack__`,
                    // which synchronizes.
                    Ok(None) => {}
                    Err(ExchangeFailure::Silent(function)) => silent = Some(function),
                    Err(ExchangeFailure::Raised(err)) => return Err(err),
                }
            }
            // A producer that cannot serve the C path (pending streams, say) may still
            // serve `__dlpack__`, which raises its own error otherwise. PyTorch's raises
            // `RuntimeError` for what its `__dlpack__` refuses with `BufferError` (sparse
            // layouts, quantized dtypes): its `__dlpack__` gives the answer.
            Err(ExchangeFailure::Raised(err))
                if torch || err.is_instance_of::<PyBufferError>(py) => {}
            Err(ExchangeFailure::Raised(err)) => return Err(err),
            // A failure that left no exception says nothing more: a refusal of the C path,
            // which `__dlpack__` may still serve.
            Err(ExchangeFailure::Silent(function)) => silent = Some(function),
        }
    }
    let imported = via_dunder(obj, producer.torch, options);
    match silent {
        Some(function) => imported.map_err(|err| silent_then_failed(obj, function, err)),
        None => imported,
    }
}

/// The error of an import through `__dlpack__` after `function` of the producer's C exchange
/// API failed without setting an exception: a `BufferError` that names the producer's type
/// and says both, with `err` as its cause.
#[cold]
fn silent_then_failed(obj: &Bound<'_, PyAny>, function: &str, err: PyErr) -> PyErr {
    let py = obj.py();
    let ty = obj.get_type();
    let name = ty
        .fully_qualified_name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string());
    let error = PyBufferError::new_err(format!(
        "the DLPack C exchange API of `{name}` ({function}) failed without setting a Python exception, and its import through `__dlpack__` failed too: {}",
        err.value(py)
            .str()
            .map_or_else(|_| "?".to_owned(), |text| text.to_string())
    ));
    error.set_cause(py, Some(err));
    error
}

/// The import of `obj` through its `__dlpack__` (or `__cuda_array_interface__`), as
/// [`from_dlpack_with`] describes, after the torch checks of `torch` types.
fn via_dunder(
    obj: &Bound<'_, PyAny>,
    torch: torch::Kind,
    options: &FromDlpackOptions,
) -> PyResult<ManagedTensor> {
    let py = obj.py();
    let plain = options.device.is_none() && options.copy.is_none() && options.stream.is_none();
    torch::refuse(obj, torch)?;
    // A host producer asked for a CUDA device is asked for its memory as it is: a CUDA `stream`
    // or `dl_device` is no request a host tensor can serve (its `stream` must be `None`).
    if let Some((found, wanted)) = host_producer_for_cuda(obj, options) {
        return via_host_memory(obj, found, wanted, options);
    }
    // Otherwise the consumer's stream, if any, is the caller's choice, passed as it is.
    let first = if plain {
        call_plain(obj)
    } else {
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "max_version"), max_version(py)?)?;
        if let Some(device) = options.device {
            let raw = device.to_raw();
            kwargs.set_item(intern!(py, "dl_device"), (raw.device_type, raw.device_id))?;
        }
        if let Some(copy) = options.copy {
            kwargs.set_item(intern!(py, "copy"), copy)?;
        }
        if let Some(stream) = options.stream {
            kwargs.set_item(intern!(py, "stream"), stream)?;
        }
        obj.getattr(intern!(py, "__dlpack__"))
            .and_then(|dunder| dunder.call((), Some(&kwargs)))
    };
    let (capsule, fell_back) = match first {
        Ok(capsule) => (capsule, false),
        Err(err) if err.is_instance_of::<PyAttributeError>(py) => {
            // No `__dlpack__`: an object with only `__cuda_array_interface__` (feature `cuda`).
            #[cfg(feature = "cuda")]
            if let Some(managed) = super::cai::without_dlpack(obj, options)? {
                return made_ready(settle(managed, options, true)?, options);
            }
            return Err(not_a_producer(obj, err));
        }
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            // A producer older than `max_version`: `stream` is as old as `__dlpack__` itself.
            let dunder = obj.getattr(intern!(py, "__dlpack__"))?;
            let retried = match options.stream {
                Some(stream) => {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item(intern!(py, "stream"), stream)?;
                    dunder.call((), Some(&kwargs))?
                }
                None => dunder.call0()?,
            };
            (retried, true)
        }
        Err(err) => return Err(err),
    };
    made_ready(
        settle(consume_capsule(&capsule)?, options, fell_back)?,
        options,
    )
}

/// The error for an object whose `__dlpack__` could not be called: a `TypeError` saying what
/// was found and what is expected when `obj` has no `__dlpack__` (a `str`, a list); `err` as
/// it is when the `AttributeError` came from inside the producer's own `__dlpack__`.
#[cold]
fn not_a_producer(obj: &Bound<'_, PyAny>, err: PyErr) -> PyErr {
    if obj.hasattr(intern!(obj.py(), "__dlpack__")).unwrap_or(true) {
        return err;
    }
    let cai = if cfg!(feature = "cuda") {
        ", an object with `__cuda_array_interface__`"
    } else {
        ""
    };
    let found = obj
        .get_type()
        .qualname()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string());
    let error = PyTypeError::new_err(format!(
        "expected a DLPack producer (an object with `__dlpack__`: a NumPy, PyTorch, JAX or CuPy array, say){cai} or a DLPack capsule, found `{found}`"
    ));
    error.set_cause(obj.py(), Some(err));
    error
}

/// `managed`, imported for `options.stream`, carrying what it is ready after (feature `cuda`:
/// CUDA device memory imported for a consumer stream carries an event recorded on that stream,
/// unless it carries readiness already; feature `hip`: ROCm device memory carries a HIP event
/// recorded on the consumer's stream, ROCm column), so that lending it on orders the next
/// consumer after its producer.
fn made_ready(managed: ManagedTensor, options: &FromDlpackOptions) -> PyResult<ManagedTensor> {
    #[cfg(feature = "hip")]
    if managed.dl_tensor().device.device_type == ffi::kDLROCM {
        return crate::export::made_ready_on_rocm(managed, options.stream).map_err(Into::into);
    }
    #[cfg(feature = "cuda")]
    if managed.dl_tensor().device.device_type == ffi::kDLCUDA {
        let device = Device::from_raw(managed.dl_tensor().device);
        let request = crate::plan::stream::parse_stream(device, options.stream)
            .map_err(crate::export::ExportError::from)?;
        return crate::export::made_ready_on(managed, request)
            .map_err(|err| crate::export::ExportError::from(err).into());
    }
    #[cfg(not(feature = "cuda"))]
    let _ = options;
    Ok(managed)
}

/// `(1, 3)`, the `max_version` this consumer asks for, built once.
fn max_version(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    static VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    VERSION
        .get_or_try_init(py, || {
            PyTuple::new(py, [ffi::DLPACK_MAJOR_VERSION, ffi::DLPACK_MINOR_VERSION])
                .map(Bound::unbind)
        })
        .map(|version| version.bind(py))
}

/// `PyObject_VectorcallMethod`'s signature (`Include/abstract.h`; in the stable ABI from 3.12).
type VectorcallMethod = unsafe extern "C" fn(
    *mut pyffi::PyObject,
    *const *mut pyffi::PyObject,
    usize,
    *mut pyffi::PyObject,
) -> *mut pyffi::PyObject;

/// `PyObject_VectorcallMethod` where the build's Python API names it (the full API, the limited
/// API from 3.12).
#[cfg(any(Py_3_12, not(any(Py_LIMITED_API, PyPy))))]
fn vectorcall_method() -> Option<VectorcallMethod> {
    Some(pyffi::PyObject_VectorcallMethod)
}

/// The limited API before 3.12 does not name it, but CPython exports it from 3.9 on with the
/// signature it keeps in the stable ABI of 3.12: found at run time, `None` on PyPy or where it
/// cannot be found (then `__dlpack__` is called with a keyword dict).
#[cfg(not(any(Py_3_12, not(any(Py_LIMITED_API, PyPy)))))]
fn vectorcall_method() -> Option<VectorcallMethod> {
    #[cfg(PyPy)]
    return None;
    #[cfg(not(PyPy))]
    {
        static FOUND: std::sync::OnceLock<Option<VectorcallMethod>> = std::sync::OnceLock::new();
        *FOUND.get_or_init(|| {
            crate::abi::symbol::global(c"PyObject_VectorcallMethod")
                // SAFETY: CPython's `PyObject_VectorcallMethod` (3.9 on), of this signature.
                .map(|f| unsafe {
                    core::mem::transmute::<*mut core::ffi::c_void, VectorcallMethod>(f.as_ptr())
                })
        })
    }
}

/// `obj.__dlpack__(max_version=(1, 3))`, the call of a `from_dlpack` without options, by
/// vectorcall (`PyObject_VectorcallMethod`, with the keyword's name in a tuple built once), as
/// NumPy calls it: no bound method and no keyword dict are made. Where the interpreter offers
/// no vectorcall ([`vectorcall_method`]), a call with a keyword dict built once.
fn call_plain<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    static KWNAMES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = obj.py();
    let Some(vectorcall_method) = vectorcall_method() else {
        return call_plain_with_dict(obj);
    };
    let kwnames = KWNAMES
        .get_or_try_init(py, || {
            PyTuple::new(py, [intern!(py, "max_version")]).map(Bound::unbind)
        })?
        .bind(py);
    let version = max_version(py)?;
    // `self`, then the value of the one keyword `kwnames` names.
    let args = [obj.as_ptr(), version.as_ptr()];
    // SAFETY: `PyObject_VectorcallMethod` (above); the GIL is held (`obj` is bound); the name,
    // both arguments and `kwnames` are live objects that outlive the call; `nargsf` is 1 (only
    // `self` is positional, and without `PY_VECTORCALL_ARGUMENTS_OFFSET`: `args` has no slot
    // before it), and `kwnames` names the one value after it. The result is a new reference,
    // or NULL with an exception set.
    unsafe {
        let result = vectorcall_method(
            intern!(py, "__dlpack__").as_ptr(),
            args.as_ptr(),
            1,
            kwnames.as_ptr(),
        );
        Bound::from_owned_ptr_or_err(py, result)
    }
}

/// [`call_plain`] where the interpreter offers no vectorcall (PyPy on the limited API before
/// 3.12): a call with a keyword dict built once.
#[cold]
fn call_plain_with_dict<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    obj.getattr(intern!(py, "__dlpack__"))?
        .call((), Some(&default_kwargs(py)?))
}

/// `{"max_version": (1, 3)}`, the keywords of a `__dlpack__` call without `device` and `copy`,
/// built once rather than on every call.
///
/// A callee written in C with `METH_VARARGS | METH_KEYWORDS` receives this very dict and could
/// change it, so it is checked before each use to hold exactly that one entry; a changed dict is
/// replaced by a fresh one for the call.
fn default_kwargs(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    static KWARGS: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let key = intern!(py, "max_version");
    let version = max_version(py)?;
    let fresh = || -> PyResult<Bound<'_, PyDict>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item(key, version)?;
        Ok(kwargs)
    };
    let kwargs = KWARGS
        .get_or_try_init(py, || fresh().map(Bound::unbind))?
        .bind(py);
    let intact = kwargs.len() == 1
        && kwargs
            .get_item(key)?
            .is_some_and(|value| value.is(version.as_any()));
    if intact { Ok(kwargs.clone()) } else { fresh() }
}

/// What the consumer knows of a producer type: the C exchange API table it publishes, if any,
/// whether that table is one this crate made (`python::dlpack_c_exchange_api`, whose tensors
/// come from this crate's exporter, validated), and how the type relates to PyTorch.
#[derive(Clone, Copy)]
struct Producer {
    api: Option<&'static ffi::DLPackExchangeAPI>,
    own: bool,
    torch: torch::Kind,
}

// The cache's words: a table's address (0 for none), with tag bits. Tables hold pointers, so
// their addresses are multiples of 8 (`lookup_exchange_api` refuses others).
/// The table is this crate's.
const OWN: usize = 1;
/// [`torch::Kind`], in two bits.
const TORCH_SHIFT: u32 = 1;
const TORCH_MASK: usize = 0b110;
const TAGS: usize = OWN | TORCH_MASK;

impl Producer {
    fn from_word(word: usize) -> Self {
        let address = word & !TAGS;
        let api = (address != 0).then(|| {
            // SAFETY: cached addresses are 0 or tables that live for the whole process
            // (`lookup_exchange_api`), with the tag bits cleared.
            unsafe { &*(address as *const ffi::DLPackExchangeAPI) }
        });
        let torch = match (word & TORCH_MASK) >> TORCH_SHIFT {
            0 => torch::Kind::Other,
            1 => torch::Kind::Plain,
            2 => torch::Kind::Dunder,
            _ => torch::Kind::Overridden,
        };
        Self {
            api,
            own: word & OWN != 0,
            torch,
        }
    }

    fn word(address: usize, own: bool, torch: torch::Kind) -> usize {
        let torch = match torch {
            torch::Kind::Other => 0,
            torch::Kind::Plain => 1,
            torch::Kind::Dunder => 2,
            torch::Kind::Overridden => 3,
        };
        address | usize::from(own) | torch << TORCH_SHIFT
    }
}

/// What the consumer knows of a type ([`Producer`]), found once per type and cached: the C
/// exchange API table it publishes (`__dlpack_c_exchange_api__`, a capsule named
/// `"dlpack_exchange_api"` of major version 1), as `dlpack.h` allows (`DLPackExchangeAPI`),
/// and its [`torch::Kind`]. Only a torch tensor type of [`torch::Kind::Plain`] keeps its table:
/// the other torch types are read through `__dlpack__`. The cache holds a reference to each
/// type, so a type's address is never reused while its entry exists; it holds at most
/// [`CACHED_TYPES`] types and is emptied when full, so a program that makes producer types at
/// run time does not keep them all alive.
fn producer_of(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<Producer> {
    use core::sync::atomic::{AtomicUsize, Ordering};
    type Cache = std::collections::HashMap<usize, (Py<pyo3::types::PyType>, usize)>;
    static CACHE: std::sync::OnceLock<Mutex<Cache>> = std::sync::OnceLock::new();
    /// Changes, under the cache's lock, each time the cache is emptied.
    static GENERATION: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        /// The last type this thread looked up, its cached word and the cache's generation
        /// then: a front for `CACHE` that spares the lock and the hash when one type is
        /// exchanged repeatedly. Used only while the generation is unchanged, that is while
        /// `CACHE` holds the type, whose address is therefore not reused.
        static LAST: core::cell::Cell<(usize, usize, usize)> =
            const { core::cell::Cell::new((0, 0, usize::MAX)) };
    }
    let key = ty.as_ptr() as usize;
    if let Ok((last, word, generation)) = LAST.try_with(core::cell::Cell::get) {
        if last == key && generation == GENERATION.load(Ordering::Acquire) {
            return Ok(Producer::from_word(word));
        }
    }
    let cache = CACHE.get_or_init(Default::default);
    // The generation is read under the lock that also finds or inserts the entry, so it is the
    // generation of a cache that holds the type.
    let cached = {
        let cache = cache.lock().map_err(|_| poisoned())?;
        cache
            .get(&key)
            .map(|(_, word)| (*word, GENERATION.load(Ordering::Acquire)))
    };
    let (word, generation) = match cached {
        Some(found) => found,
        None => {
            // Looked up without the lock: the lookup runs Python code.
            let torch = torch::kind_of(ty)?;
            let address = match torch {
                torch::Kind::Other | torch::Kind::Plain => lookup_exchange_api(ty)?,
                torch::Kind::Dunder | torch::Kind::Overridden => 0,
            };
            let own = address != 0 && super::exchange_api::is_own_table(address);
            let word = Producer::word(address, own, torch);
            let mut cache = cache.lock().map_err(|_| poisoned())?;
            // The types let go of are released after the lock: releasing a type can run Python
            // code (weak reference callbacks), which may exchange tensors itself.
            let evicted = if cache.len() >= CACHED_TYPES && !cache.contains_key(&key) {
                GENERATION.fetch_add(1, Ordering::Release);
                core::mem::take(&mut *cache)
            } else {
                Cache::new()
            };
            cache.insert(key, (ty.clone().unbind(), word));
            let found = (word, GENERATION.load(Ordering::Acquire));
            drop(cache);
            drop(evicted);
            found
        }
    };
    let _ = LAST.try_with(|last| last.set((key, word, generation)));
    Ok(Producer::from_word(word))
}

/// Producer types whose exchange API lookup [`producer_of`] keeps at most.
const CACHED_TYPES: usize = 64;

fn poisoned() -> PyErr {
    PyBufferError::new_err("exchange API cache poisoned by a panic")
}

/// Address of the type's exchange API table, or 0 when it publishes none usable (none, another
/// major version, or an address not a multiple of 8, which a table of pointers cannot have).
fn lookup_exchange_api(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<usize> {
    let Some(capsule) = ty.getattr_opt(intern!(ty.py(), "__dlpack_c_exchange_api__"))? else {
        return Ok(0);
    };
    let name = ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME.as_ptr();
    // SAFETY: `capsule` is a live object, GIL held; `PyCapsule_IsValid` sets no exception.
    if unsafe { pyffi::PyCapsule_IsValid(capsule.as_ptr(), name) } != 1 {
        return Ok(0);
    }
    // SAFETY: a valid capsule under this name holds a `const DLPackExchangeAPI*` that lives for
    // the whole process (`dlpack.h`, `DLPackExchangeAPI`).
    let api = unsafe { pyffi::PyCapsule_GetPointer(capsule.as_ptr(), name) }
        .cast::<ffi::DLPackExchangeAPI>();
    // SAFETY: as above; the header is readable.
    let usable = !api.is_null() && api as usize & TAGS == 0
        // SAFETY: as above.
        && unsafe { (*api).header.version.major } == ffi::DLPACK_MAJOR_VERSION
        // SAFETY: as above.
        && unsafe { (*api).managed_tensor_from_py_object_no_sync }.is_some();
    Ok(if usable { api as usize } else { 0 })
}

/// The host device of `obj` and the CUDA device asked for, when `options.device` is a CUDA device
/// (feature `cuda`) and `obj.__dlpack_device__()` names host memory (`cpu` or `cuda_host`), which
/// this consumer copies onto that device itself ([`via_host_memory`]). `None` otherwise,
/// including where `__dlpack_device__` is missing, fails or returns no `(int, int)`: such a
/// producer is asked with the keywords, and its `__dlpack__` answers.
fn host_producer_for_cuda(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> Option<(Device, Device)> {
    let wanted = options.device?;
    if !COPIES_CUDA_MEMORY || wanted.device_type != crate::DeviceType::Cuda {
        return None;
    }
    let (device_type, device_id) = obj
        .call_method0(intern!(obj.py(), "__dlpack_device__"))
        .and_then(|device| device.extract::<(i32, i32)>())
        .ok()?;
    let found = Device::from_raw(ffi::DLDevice {
        device_type,
        device_id,
    });
    matches!(
        found.device_type,
        crate::DeviceType::Cpu | crate::DeviceType::CudaHost
    )
    .then_some((found, wanted))
}

/// The import onto the CUDA device `wanted` of a producer whose memory is on the host device
/// `found`: `__dlpack__(max_version=(1, 3))` (`__dlpack__()` for a producer older than
/// `max_version`), as a host import asks, without `dl_device`, `copy` or `stream` (the `stream`
/// of a host tensor must be `None`; the DLPack Python specification's stream table), then
/// copied onto `wanted` here ([`settle`]) on the consumer's `stream`, after which the tensor is
/// made ready for that stream ([`made_ready`]). `copy=False` is refused with `BufferError`
/// before the producer is asked: host memory reaches a CUDA device only as a copy.
fn via_host_memory(
    obj: &Bound<'_, PyAny>,
    found: Device,
    wanted: Device,
    options: &FromDlpackOptions,
) -> PyResult<ManagedTensor> {
    let py = obj.py();
    if options.copy == Some(false) {
        return Err(PyBufferError::new_err(format!(
            "copy=False but importing a {found} tensor onto {wanted} needs a copy (from_dlpack(device=..., copy=False))"
        )));
    }
    let capsule = match call_plain(obj) {
        Ok(capsule) => capsule,
        Err(err) if err.is_instance_of::<PyAttributeError>(py) => {
            return Err(not_a_producer(obj, err));
        }
        Err(err) if err.is_instance_of::<PyTypeError>(py) => obj
            .getattr(intern!(py, "__dlpack__"))
            .and_then(|dunder| dunder.call0())?,
        Err(err) => return Err(err),
    };
    made_ready(settle(consume_capsule(&capsule)?, options, true)?, options)
}

/// Applies `device` and `copy` to a tensor obtained without them (a raw capsule, a producer
/// that refused the keywords, or one that ignored `dl_device`).
///
/// Host memory, or CUDA memory of another device, handed over where a CUDA device was asked
/// for (a host producer that cannot copy to a device, such as NumPy, or one that ignored
/// `dl_device`) is copied onto that device here (feature `cuda`), on the consumer's `stream`
/// of that device, after what the producer ordered before it; the host does not wait, unless
/// `stream=-1`.
///
/// CUDA memory handed over despite `dl_device=(CPU, 0)` is copied to the host here, on the
/// per-thread default stream, with the host waiting for the copy. The producer ordered its
/// pending work before the consumer's `stream` only (the `stream` parameter of `__dlpack__`),
/// so the tensor is first made to carry an event recorded on that stream ([`made_ready`];
/// `None`: the legacy default stream), which the copy's stream waits on
/// (`cuStreamWaitEvent`): the copy reads after everything ordered before the consumer's
/// stream. `stream=-1` asks for no synchronization, and gets none. ROCm memory handed over so
/// (feature `hip`) is copied the same way on the HIP runtime: this crate's copy stream waits for
/// the consumer's `stream` (ROCm column: `None` and `0` the default stream) before the copy.
fn settle(
    managed: ManagedTensor,
    options: &FromDlpackOptions,
    unasked: bool,
) -> PyResult<ManagedTensor> {
    let found = Device::from_raw(managed.dl_tensor().device);
    let unreachable = options.device.filter(|&wanted| {
        !(found == wanted || wanted == Device::CPU && found.is_host_accessible())
    });
    // CUDA memory a producer handed over despite `dl_device=(CPU, 0)` is copied here, as the
    // producer should have done (feature `cuda`).
    let copy_to_host = unreachable == Some(Device::CPU)
        && COPIES_CUDA_MEMORY
        && (found.device_type == crate::DeviceType::Cuda || is_rocm(found))
        && options.copy != Some(false);
    let copy_to_device = unreachable.filter(|&wanted| {
        COPIES_CUDA_MEMORY
            && wanted.device_type == crate::DeviceType::Cuda
            && copies_between(found, wanted)
            && options.copy != Some(false)
    });
    if let Some(wanted) = copy_to_device {
        let request = ExportRequest::versioned()
            .copy(Some(true))
            .dl_device(wanted)
            .stream(options.stream);
        return serve(managed, &request).map_err(Into::into);
    }
    if let Some(wanted) = unreachable {
        if !copy_to_host {
            return Err(PyBufferError::new_err(format!(
                "the producer handed over a {found} tensor, expected {wanted} (from_dlpack(device=...))"
            )));
        }
    }
    if copy_to_host || unasked && options.copy == Some(true) && !managed.is_copied() {
        // The copy is ours: versioned, writable, flagged IS_COPIED; a CUDA copy goes on the
        // stream the producer was asked to order its work on, a host copy waits on an event
        // of that stream.
        let request = ExportRequest::versioned().copy(Some(true));
        let (managed, request) = if copy_to_host && is_rocm(found) {
            // ROCm memory (feature `hip`): the copy's stream waits for the consumer's stream.
            #[cfg(feature = "hip")]
            crate::export::order_stream_before_host_copy(found, options.stream)?;
            (managed, request.dl_device(Device::CPU))
        } else if copy_to_host {
            (
                made_ready(managed, options)?,
                request.dl_device(Device::CPU),
            )
        } else {
            (managed, request.stream(options.stream))
        };
        return serve(managed, &request).map_err(Into::into);
    }
    Ok(managed)
}

/// Whether `device` is ROCm device memory this build copies to the host (feature `hip`).
const fn is_rocm(device: Device) -> bool {
    cfg!(feature = "hip") && matches!(device.device_type, crate::DeviceType::Rocm)
}

/// Makes a tensor taken through a C exchange API without synchronization safe to use as
/// `__dlpack__(stream=options.stream)` would (its `stream` parameter; `current_work_stream` in
/// `dlpack.h`): host memory needs nothing; CUDA memory (feature `cuda`) gets an event
/// dependency from the producer's `current_work_stream` to the consumer's stream (`None`: the
/// legacy default stream), which a consumer stream being captured into a CUDA graph keeps as
/// part of the graph: the tensor then carries that event, so it lives as long as the tensor.
/// ROCm device memory (feature `hip`) gets the same dependency from the producer's
/// `current_work_stream` for `kDLROCM` (a HIP stream; NULL its default stream) to the
/// consumer's stream, read with the ROCm column (`None` or `0`: the default stream, `-1`: none,
/// `1` and `2` refused); the event a capturing consumer stream waits on is kept by the HIP tier.
/// Gives memory this consumer cannot order back (drops it) and returns `None`; on failure,
/// including a `current_work_stream` that fails without setting an exception, the tensor is
/// given back too.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn order_exchanged(
    py: Python<'_>,
    managed: ManagedTensor,
    api: &ffi::DLPackExchangeAPI,
    options: &FromDlpackOptions,
) -> Result<Option<ManagedTensor>, ExchangeFailure> {
    let raw = managed.dl_tensor().device;
    let device = Device::from_raw(raw);
    if device.device_type == crate::DeviceType::Cpu {
        return Ok(options.stream.is_none().then_some(managed));
    }
    #[cfg(feature = "cuda")]
    // Host and managed CUDA memory: `current_work_stream` is per device, and these have none
    // (device 0 by convention), so `__dlpack__` orders them instead.
    if device.device_type == crate::DeviceType::Cuda {
        let Some((request, stream)) = current_work_stream(py, api, device, options)? else {
            return Ok(None);
        };
        let kept = crate::engine::cuda::order_raw(device.device_id, stream.cast(), request)
            .map_err(crate::export::ExportError::from)?;
        return Ok(Some(crate::export::carry_ready_events(managed, kept)));
    }
    #[cfg(feature = "hip")]
    // ROCm device memory: the producer's `current_work_stream` for `kDLROCM` is a HIP stream
    // (NULL: the default stream), ordered before the consumer's stream with the ROCm column
    // of the stream table. Pinned host memory (`kDLROCMHost`) is left to `__dlpack__`, as
    // `kDLCUDAHost` is.
    if device.device_type == crate::DeviceType::Rocm {
        // The stream is a `hipStream_t` of the device.
        let Some((request, stream)) = current_work_stream(py, api, device, options)? else {
            return Ok(None);
        };
        crate::engine::hip::order_raw(device.device_id, stream.cast(), request)
            .map_err(crate::export::ExportError::from)?;
        return Ok(Some(managed));
    }
    Ok(None)
}

/// The producer's `current_work_stream` for `device` (a CUDA or HIP stream handle; NULL its
/// default stream), with the consumer's `options.stream` parsed for that device; `None` when
/// the table has no `current_work_stream`.
#[cfg(feature = "cuda")]
fn current_work_stream(
    py: Python<'_>,
    api: &ffi::DLPackExchangeAPI,
    device: Device,
    options: &FromDlpackOptions,
) -> Result<Option<(crate::plan::stream::StreamRequest, *mut core::ffi::c_void)>, ExchangeFailure> {
    let Some(current) = api.current_work_stream else {
        return Ok(None);
    };
    let request = crate::plan::stream::parse_stream(device, options.stream)
        .map_err(crate::export::ExportError::from)?;
    let raw = ffi::DLDevice::from(device);
    let mut stream: *mut core::ffi::c_void = core::ptr::null_mut();
    // SAFETY: the table's contract (`dlpack.h`, `current_work_stream`): GIL held, a valid
    // out-pointer; the stream written is valid until control returns to Python.
    if unsafe { current(raw.device_type, raw.device_id, &mut stream) } != 0 {
        return Err(ExchangeFailure::taken(py, "current_work_stream"));
    }
    Ok(Some((request, stream)))
}

/// How a call into a producer's C exchange API failed.
enum ExchangeFailure {
    /// The function failed with a Python exception set, as `dlpack.h` asks, or the consumer
    /// could not use what it returned: that exception.
    Raised(PyErr),
    /// The function of the table named failed without setting an exception.
    Silent(&'static str),
}

impl ExchangeFailure {
    /// After the table's function `function` reported failure: the exception it set, if any.
    fn taken(py: Python<'_>, function: &'static str) -> Self {
        PyErr::take(py).map_or(Self::Silent(function), Self::Raised)
    }
}

impl From<PyErr> for ExchangeFailure {
    fn from(err: PyErr) -> Self {
        Self::Raised(err)
    }
}

impl From<crate::export::ExportError> for ExchangeFailure {
    fn from(err: crate::export::ExportError) -> Self {
        Self::Raised(err.into())
    }
}

/// Takes the tensor through a C exchange API table (`dlpack.h`,
/// `managed_tensor_from_py_object_no_sync`).
fn via_exchange_api(
    obj: &Bound<'_, PyAny>,
    api: &ffi::DLPackExchangeAPI,
    own: bool,
) -> Result<ManagedTensor, ExchangeFailure> {
    let from_py = api.managed_tensor_from_py_object_no_sync.ok_or_else(|| {
        PyBufferError::new_err("exchange API table without managed_tensor_from_py_object_no_sync")
    })?;
    let mut out: *mut DLManagedTensorVersioned = core::ptr::null_mut();
    // SAFETY: the table's contract: `py_object` is an object of the table's type (the type we
    // read it from), `out` receives an owned tensor; GIL held. 0 on success, -1 with a Python
    // exception set on failure (which some producers omit: `ExchangeFailure::taken`).
    let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
    if rc != 0 {
        return Err(ExchangeFailure::taken(
            obj.py(),
            "managed_tensor_from_py_object_no_sync",
        ));
    }
    if own {
        if let Some(out) = core::ptr::NonNull::new(out) {
            // SAFETY: an owned managed tensor (as below), made by this crate's exporter (the
            // table is one of ours): version 1.3, known flags, and a header it validated. Not
            // marked unaliased: a Python object's memory may be reached by other imports.
            return Ok(unsafe {
                ManagedTensor::from_raw_validated(
                    crate::tensor::managed::RawManagedTensor::Versioned(out),
                    false,
                )
            });
        }
    }
    // SAFETY: on success `out` is an owned managed tensor (`dlpack.h`,
    // `managed_tensor_from_py_object_no_sync`).
    unsafe { ManagedTensor::from_raw_versioned(out) }
        .map_err(|err| ExchangeFailure::Raised(err.into()))
}
