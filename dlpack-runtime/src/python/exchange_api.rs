//! The DLPack C exchange API ([`__dlpack_c_exchange_api__`], `DLPackExchangeAPI` in
//! `dlpack.h`) of a pyclass, for C consumers that skip the Python-level call.
//!
//! [`__dlpack_c_exchange_api__`]: https://data-apis.org/array-api/draft/API_specification/generated/array_api.array.__dlpack_c_exchange_api__.html

use core::ffi::c_void;
use core::ptr::NonNull;
use std::sync::Mutex;

use pyo3::PyClass;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::types::PyCapsule;

use crate::abi::ffi::{self, DLManagedTensorVersioned, DLPackVersion};
use crate::export::{DlpackExport, ExportRequest, allocate_host};
use crate::tensor::device::Device;
use crate::tensor::managed::{ManagedTensor, RawManagedTensor};

use super::export_once::export_managed;

/// The C exchange API table of pyclass `T` (`DLPackExchangeAPI` in `dlpack.h`), as the capsule
/// to publish as the class attribute `__dlpack_c_exchange_api__`:
///
/// a `#[classattr]` method returning `python::dlpack_c_exchange_api::<Self>(py)`, as in the
/// module example.
///
/// The table (version 1.3) lives for the whole process, one per type:
/// `managed_tensor_from_py_object_no_sync` makes the same shared, read-only export as
/// [`dlpack`](super::dlpack); `managed_tensor_allocator` allocates zeroed host tensors;
/// `managed_tensor_to_py_object_no_sync` wraps a tensor in an [`ExportOnce`](super::ExportOnce) object;
/// `dltensor_from_py_object_no_sync` is NULL (optional; the shape is not stored as `int64_t`);
/// `current_work_stream` reports NULL (no current stream). The conversion performs no
/// synchronization, as `dlpack.h` requires of its `_no_sync` functions; a tensor whose producer
/// names CUDA streams with pending work (`#[dlpack(stream)]` fields, `CudaSlice` buffers, the
/// ready events of an import lent on) is
/// refused with `BufferError`, since the C exchange API cannot name those streams:
/// `__dlpack__(stream=...)` orders them before the consumer's stream. This crate's consumer
/// then falls back to `__dlpack__`.
///
/// `managed_tensor_from_py_object_no_sync` runs on the GIL its caller holds, without pyo3's
/// attach bookkeeping, and so does `T`'s
/// [`DlpackExport::export_parts`](crate::DlpackExport::export_parts) within it: a derived
/// implementation never touches Python; a hand-written one must not clone or drop `Py<...>`
/// values there (see [`add_dlpack_methods`](super::add_dlpack_methods)).
///
/// # Errors
///
/// The Python error of creating the capsule.
pub fn dlpack_c_exchange_api<T>(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let tables = TABLES.get_or_init(Default::default);
    let address = *tables
        .lock()
        .map_err(|_| PyBufferError::new_err("exchange API registry poisoned by a panic"))?
        .entry(std::any::TypeId::of::<T>())
        .or_insert_with(|| {
            let table = Box::new(ffi::DLPackExchangeAPI {
                header: ffi::DLPackExchangeAPIHeader {
                    version: DLPackVersion {
                        major: ffi::DLPACK_MAJOR_VERSION,
                        minor: ffi::DLPACK_MINOR_VERSION,
                    },
                    prev_api: core::ptr::null_mut(),
                },
                managed_tensor_allocator: Some(c_api_allocate),
                managed_tensor_from_py_object_no_sync: Some(c_api_from_py::<T>),
                managed_tensor_to_py_object_no_sync: Some(c_api_to_py),
                dltensor_from_py_object_no_sync: None,
                current_work_stream: Some(c_api_current_work_stream),
            });
            // Leaked on purpose: the table must live for the whole process (`dlpack.h`,
            // `DLPackExchangeAPI`).
            Box::into_raw(table) as usize
        });
    let pointer = NonNull::new(address as *mut c_void)
        .ok_or_else(|| PyBufferError::new_err("null exchange API table"))?;
    // SAFETY: `pointer` is a leaked, never-freed table, valid for the process; no destructor.
    unsafe { PyCapsule::new_with_pointer(py, pointer, ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME) }
}

/// The tables made by [`dlpack_c_exchange_api`], one per type, by address.
type Tables = Mutex<std::collections::HashMap<std::any::TypeId, usize>>;
static TABLES: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();

/// Whether the table at `address` is one [`dlpack_c_exchange_api`] made: its
/// `managed_tensor_from_py_object_no_sync` hands out tensors of this crate's exporter, whose
/// headers that exporter validated.
pub(super) fn is_own_table(address: usize) -> bool {
    TABLES.get().is_some_and(|tables| {
        tables
            .lock()
            .is_ok_and(|tables| tables.values().any(|&own| own == address))
    })
}

/// Runs `f` with the GIL, turning a Rust panic into a Python `SystemError` and an error into a
/// raised exception: the C API functions return 0 or -1 and never unwind.
///
/// # Safety
///
/// The GIL is held (the C exchange API's callers hold it).
unsafe fn c_api_call(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> core::ffi::c_int {
    // `try_attach`: where pyo3 refuses to attach (a finalizing interpreter), `attach` would
    // panic, and a panic here cannot unwind.
    let called = Python::try_attach(|py| {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(py)));
        match result {
            Ok(Ok(())) => 0,
            Ok(Err(err)) => {
                err.restore(py);
                -1
            }
            Err(_) => {
                pyo3::exceptions::PySystemError::new_err(
                    "panic in a DLPack C exchange API function",
                )
                .restore(py);
                -1
            }
        }
    });
    called.unwrap_or_else(|| {
        // SAFETY: the GIL is held (caller).
        unsafe {
            super::raise_unattached(
                c"a DLPack C exchange API function called while Python is finalizing",
            )
        };
        -1
    })
}

/// `managed_tensor_from_py_object_no_sync` for objects of type `T`.
unsafe extern "C" fn c_api_from_py<T>(
    py_object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> core::ffi::c_int
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    // SAFETY: the C exchange API's callers hold the GIL for the call (`dlpack.h`).
    let _attached = unsafe { crate::abi::gil::Attached::assume() };
    // SAFETY: the caller holds the GIL and passes a live object, borrowed for the call, and an
    // out-pointer (`dlpack.h`, `DLPackManagedTensorFromPyObjectNoSync`).
    if let Some(status) = unsafe { quick_from_py::<T>(py_object, out) } {
        return status;
    }
    let body = |py: Python<'_>| {
        if py_object.is_null() || out.is_null() {
            return Err(PyValueError::new_err(
                "NULL argument to managed_tensor_from_py_object_no_sync",
            ));
        }
        // SAFETY: the caller passes a live object (borrowed for the call), GIL held.
        let obj = unsafe { Bound::from_borrowed_ptr(py, py_object.cast()) };
        // Another type publishing this type's table (a class attribute copied over) gets a
        // `BufferError`, on which consumers fall back to `__dlpack__`.
        let obj = obj.cast_into::<T>().map_err(|err| {
            PyBufferError::new_err(format!(
                "this DLPack C exchange API table serves only the type it was published on: {}",
                PyErr::from(err)
            ))
        })?;
        // SAFETY: `out` is a valid out-pointer (checked non-NULL; caller's contract).
        match unsafe { export_to(&obj, out) } {
            Some(exported) => exported.map_err(Into::into),
            None => Err(PyBufferError::new_err(format!(
                "this {} tensor names CUDA streams with pending work, which the C exchange API cannot order before the consumer's stream; expected a __dlpack__(stream=...) call",
                obj.get().dlpack_device()
            ))),
        }
    };
    // SAFETY: the C exchange API's callers hold the GIL (`dlpack.h`).
    unsafe { c_api_call(body) }
}

/// [`c_api_from_py`] for its common call (non-NULL arguments, an instance of `T` with no
/// pending producer streams), without pyo3's attach bookkeeping, as `__dlpack__`'s quick path
/// (`methods::quick_dlpack`) and with its rules: no `Py<T>` dropped, no `PyErr` built outside
/// [`super::restore_attached`]. `None`, before anything is done, when the call needs the
/// general path (which reports the errors).
///
/// # Safety
///
/// The GIL is held; `py_object` is NULL or a live object borrowed for the call; `out` is NULL
/// or valid for a write.
unsafe fn quick_from_py<T>(
    py_object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> Option<core::ffi::c_int>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    if out.is_null() {
        return None;
    }
    let quick = std::panic::catch_unwind(|| {
        // SAFETY: the GIL is held (caller).
        let py = unsafe { Python::assume_attached() };
        // SAFETY: NULL or a live object borrowed for the call (caller).
        let obj = unsafe { Borrowed::from_ptr_or_opt(py, py_object.cast()) }?;
        if !obj.is_instance_of::<T>() {
            return None;
        }
        // SAFETY: an instance of `T` (checked).
        let obj = unsafe { obj.cast_unchecked::<T>() };
        // SAFETY: `out` is valid for a write (caller; checked non-NULL).
        unsafe { export_to(&obj, out) }
    });
    match quick {
        Ok(None) => None,
        Ok(Some(Ok(()))) => Some(0),
        Ok(Some(Err(err))) => {
            // SAFETY: the GIL is held (caller).
            unsafe { super::restore_attached(move || err.into()) };
            Some(-1)
        }
        Err(_) => {
            // SAFETY: the GIL is held (caller).
            unsafe {
                super::restore_attached(|| {
                    pyo3::exceptions::PySystemError::new_err(
                        "panic in a DLPack C exchange API function",
                    )
                })
            };
            Some(-1)
        }
    }
}

/// The export `managed_tensor_from_py_object_no_sync` hands out for `obj`, written to `out`.
/// No synchronization (`dlpack.h`, `managed_tensor_from_py_object_no_sync`): `stream=-1` where
/// a stream is legal. The table carries no stream per tensor, so a tensor with work pending on
/// the producer's own streams cannot be ordered before the consumer's: `None` for those, which
/// are refused, for `__dlpack__(stream=...)` to serve them, rather than handed over unordered.
/// Builds no `PyErr` (see [`super::producer::export_object`]).
///
/// # Safety
///
/// `out` is valid for a write.
unsafe fn export_to<T>(
    obj: &Bound<'_, T>,
    out: *mut *mut DLManagedTensorVersioned,
) -> Option<Result<(), crate::ExportError>>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let (device, pending) = {
        let parts = obj.get().export_parts();
        (parts.device(), parts.has_producer_streams())
    };
    if pending {
        return None;
    }
    let request = match device.device_type {
        crate::DeviceType::Cpu => ExportRequest::versioned(),
        _ => ExportRequest::versioned().stream(Some(-1)),
    };
    Some(
        super::producer::export_object(obj, &request).map(|managed| match managed.into_raw() {
            // SAFETY: `out` is valid for a write (caller).
            RawManagedTensor::Versioned(p) => unsafe { out.write(p.as_ptr()) },
            RawManagedTensor::Legacy(_) => {
                unreachable!("a versioned request builds a versioned tensor")
            }
        }),
    )
}

/// `managed_tensor_allocator`: a zeroed host tensor of the prototype's dtype and shape.
unsafe extern "C" fn c_api_allocate(
    prototype: *mut ffi::DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(*mut c_void, *const core::ffi::c_char, *const core::ffi::c_char),
    >,
) -> core::ffi::c_int {
    let result = std::panic::catch_unwind(|| -> Result<*mut DLManagedTensorVersioned, String> {
        if prototype.is_null() || out.is_null() {
            return Err("NULL argument to managed_tensor_allocator".to_owned());
        }
        // SAFETY: a non-NULL prototype is a readable `DLTensor` whose `shape` holds `ndim`
        // entries (`dlpack.h`, `managed_tensor_allocator`: only dtype, ndim, shape and device
        // are used).
        let prototype = unsafe { &*prototype };
        let device = Device::from_raw(prototype.device);
        if device != Device::CPU {
            return Err(format!(
                "this producer allocates cpu:0 tensors only, not {device}"
            ));
        }
        let ndim = usize::try_from(prototype.ndim)
            .map_err(|_| format!("ndim is {}, expected >= 0", prototype.ndim))?;
        if ndim > crate::tensor::layout::MAX_NDIM || ndim > 0 && prototype.shape.is_null() {
            return Err(format!(
                "ndim is {ndim} with shape {:?}, expected at most 64 extents",
                prototype.shape
            ));
        }
        let extents: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: non-NULL, `ndim` entries (prototype contract).
            unsafe { core::slice::from_raw_parts(prototype.shape, ndim) }
        };
        let shape = extents
            .iter()
            .map(|&e| usize::try_from(e).map_err(|_| format!("extent {e} is negative")))
            .collect::<Result<Vec<_>, _>>()?;
        let managed = allocate_host(crate::DataType::from_raw(prototype.dtype), shape)
            .map_err(|e| e.to_string())?;
        match managed.into_raw() {
            RawManagedTensor::Versioned(p) => Ok(p.as_ptr()),
            RawManagedTensor::Legacy(_) => Err("allocator built a legacy tensor".to_owned()),
        }
    });
    match result {
        Ok(Ok(tensor)) => {
            // SAFETY: `out` is non-NULL (checked) and writable (caller's contract).
            unsafe { out.write(tensor) };
            0
        }
        Ok(Err(message)) => {
            report_c_error(error_ctx, set_error, &message);
            -1
        }
        Err(_) => {
            report_c_error(error_ctx, set_error, "panic in managed_tensor_allocator");
            -1
        }
    }
}

fn report_c_error(
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(*mut c_void, *const core::ffi::c_char, *const core::ffi::c_char),
    >,
    message: &str,
) {
    if let Some(set_error) = set_error {
        let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's callback, with its context and two NUL-terminated strings that
        // outlive the call (`dlpack.h`, `managed_tensor_allocator`: `SetError` is called
        // exactly on failure).
        unsafe { set_error(error_ctx, c"BufferError".as_ptr(), message.as_ptr()) };
    }
}

/// `managed_tensor_to_py_object_no_sync`: steals `tensor` into an [`ExportOnce`] object.
unsafe extern "C" fn c_api_to_py(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> core::ffi::c_int {
    let body = |py: Python<'_>| {
        if out_py_object.is_null() {
            // SAFETY: the tensor was handed over (stolen) even on failure: free it once.
            drop(unsafe { ManagedTensor::from_raw_versioned(tensor) });
            return Err(PyValueError::new_err("NULL out_py_object"));
        }
        // SAFETY: the caller hands over an owned managed tensor (`dlpack.h`,
        // `managed_tensor_to_py_object_no_sync`).
        let managed = unsafe { ManagedTensor::from_raw_versioned(tensor) }?;
        let obj = export_managed(py, managed)?;
        // SAFETY: `out_py_object` is non-NULL and writable; the new reference goes to the caller.
        unsafe { out_py_object.write(obj.into_ptr().cast()) };
        Ok(())
    };
    // SAFETY: the C exchange API's callers hold the GIL (`dlpack.h`).
    unsafe { c_api_call(body) }
}

/// `current_work_stream`: NULL. This producer has no current stream: its CUDA tensors carry
/// their own streams, which the C exchange API cannot name.
unsafe extern "C" fn c_api_current_work_stream(
    _device_type: ffi::DLDeviceType,
    _device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> core::ffi::c_int {
    if !out_current_stream.is_null() {
        // SAFETY: a non-NULL out-pointer is writable (caller's contract).
        unsafe { out_current_stream.write(core::ptr::null_mut()) };
    }
    0
}
