//! The [CUDA Array Interface](https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html)
//! (feature `cuda`), both ways: `__cuda_array_interface__` (version 3) of a frozen pyclass whose
//! tensor is in CUDA memory ([`cuda_array_interface`]), and objects that have only that
//! attribute read by [`from_dlpack`](super::from_dlpack) (versions 0 to 3).
//!
//! Synchronization (the interface's "Synchronization" section): the producer exports one stream
//! on which all its pending work is visible; the consumer orders its own stream after it.
//!
//! - Export: the `stream` entry is the first `#[dlpack(stream)]` field, else the buffer's own
//!   stream (a cudarc `CudaSlice`'s), else, for imported memory lent on that is ready after
//!   events, the legacy default stream (`1`); that stream is made to wait on an event recorded
//!   on each other pending stream (and on those events), so the host never blocks. `None` only
//!   when nothing is pending. The streams are fields of the pyclass, so they live as long as the
//!   object (the "Lifetime management" section's rule for exported streams). `0` is never
//!   written.
//! - Import: the consumer's stream (`FromDlpackOptions::stream`, `None` the legacy default
//!   stream) waits on a pooled event recorded on the exported `stream` now; `stream` absent or
//!   `None` means nothing to wait for. The import keeps a reference to the producer object until
//!   it is dropped (the interface has no deleter). Every byte the layout reaches must lie in the
//!   CUDA allocation of the `data` pointer (`cuPointerGetAttribute`,
//!   `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` and `CU_POINTER_ATTRIBUTE_RANGE_SIZE`), so that no
//!   copy or kernel reads a neighbouring allocation. For memory mapped with the virtual memory
//!   management API (`cuMemMap`, PyTorch's expandable segments) the driver documents that
//!   range as the whole reserved address range (`cuMemAddressReserve`), so a tensor that
//!   crosses from one mapped chunk to the next is accepted, and the check cannot tell mapped
//!   from unmapped parts of a reservation.

use pyo3::PyClass;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
use pyo3::ffi as pyffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::engine::cuda::{
    CudaError, CurrentContext, ReadyEvents, bind, check_not_capturing, check_producer_raw_stream,
    context, order_raw, pointer_device, pointer_range, raw_stream,
};
use crate::export::{DlpackExport, ExportBuffer, ExportError, ExportParts, ExportRequest};
use crate::plan::cai::{self, CaiError, CaiFields, CaiTensor, DescrEntry};
use crate::plan::stream::{StreamId, StreamRequest, parse_stream};
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::DataType;
use crate::tensor::managed::ManagedTensor;

use super::FromDlpackOptions;
use super::producer::{PyOwner, export_object};

/// The Python exceptions of a [`CaiError`]: `TypeError` for a missing field or a field of the
/// wrong type, `BufferError` for what the interface can say but this crate cannot represent
/// (a mask, a structured `descr`, a `typestr` without a DLPack data type, a data type without a
/// `typestr`, a layout the shared layout checks refuse) and for a `data` pointer or `stream`
/// the CUDA driver does not know, `ValueError` for every other invalid value (a layout that
/// reaches outside the allocation of its `data` pointer among them).
impl From<CaiError> for PyErr {
    fn from(err: CaiError) -> Self {
        match err {
            CaiError::Missing { .. } | CaiError::FieldType { .. } => {
                PyTypeError::new_err(err.to_string())
            }
            CaiError::Mask
            | CaiError::Descr { .. }
            | CaiError::Typestr { .. }
            | CaiError::Unspellable { .. }
            | CaiError::Layout { .. }
            | CaiError::NotDeviceMemory { .. }
            | CaiError::UnknownStream { .. } => PyBufferError::new_err(err.to_string()),
            _ => PyValueError::new_err(err.to_string()),
        }
    }
}

/// The `stream` value of a stream identity: `1`, `2` or the handle.
fn stream_value(stream: StreamId) -> i64 {
    match stream {
        StreamId::LegacyDefault => 1,
        StreamId::PerThreadDefault => 2,
        StreamId::Handle(h) => h.get() as i64,
    }
}

/// `__cuda_array_interface__` of a frozen pyclass that is a [`DlpackExport`] whose tensor is in
/// CUDA memory (`cuda`, `cuda_managed` or `cuda_host` devices): a version 3 dict with `shape`,
/// `typestr`, `data = (pointer, readonly)` (pointer 0 for an empty tensor; `readonly` is `True`,
/// as the export of a frozen pyclass is shared), `strides` in bytes (`None` when C-contiguous),
/// `version = 3` and `stream` (the module docs). Reading it never blocks the host.
///
/// For a `#[pymethods]` block: `#[getter] fn __cuda_array_interface__(slf: &Bound<'_, Self>)
/// -> PyResult<Bound<'_, PyDict>> { python::cuda_array_interface(slf) }`;
/// [`add_dlpack_methods`](super::add_dlpack_methods) installs the same attribute.
///
/// # Errors
///
/// `AttributeError` for a tensor not in CUDA memory, or of a data type the interface cannot
/// spell (bfloat16, float8, sub-byte and multi-lane types), so that `hasattr` is `False` for
/// them, as the interface's attribute check expects; `BufferError` for an export or driver
/// failure.
pub fn cuda_array_interface<'py, T>(slf: &Bound<'py, T>) -> PyResult<Bound<'py, PyDict>>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    let py = slf.py();
    let stream = {
        let parts = slf.get().export_parts();
        let device = parts.device();
        if !matches!(
            device.device_type,
            DeviceType::Cuda | DeviceType::CudaManaged | DeviceType::CudaHost
        ) {
            return Err(PyAttributeError::new_err(format!(
                "a {device} tensor has no __cuda_array_interface__, expected CUDA memory (use __dlpack__)"
            )));
        }
        if let Err(err) = cai::typestr_of(parts.dtype()) {
            return Err(PyAttributeError::new_err(format!(
                "no __cuda_array_interface__: {err} (use __dlpack__)"
            )));
        }
        parts.covering_stream()
    };
    // Exported with the covering stream as the consumer's: the export makes it wait on every
    // other pending stream and on carried events (no host wait).
    let request = ExportRequest::versioned().stream(stream.map(stream_value));
    let managed = export_object(slf, &request)?;
    let layout = managed.layout().map_err(ExportError::from)?;
    let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
    let strides: Option<Vec<isize>> = layout
        .raw_strides()
        .map(|s| s.iter().map(|&v| v as isize).collect());
    let described = cai::describe(
        layout.dtype(),
        layout.first_element_ptr() as usize as u64,
        &shape,
        strides.as_deref(),
        managed.is_read_only(),
        stream,
    )?;
    drop(managed);
    let dict = PyDict::new(py);
    dict.set_item(intern!(py, "shape"), PyTuple::new(py, &described.shape)?)?;
    dict.set_item(intern!(py, "typestr"), described.typestr)?;
    dict.set_item(intern!(py, "data"), (described.data, described.readonly))?;
    match &described.strides {
        Some(strides) => dict.set_item(intern!(py, "strides"), PyTuple::new(py, strides)?)?,
        None => dict.set_item(intern!(py, "strides"), py.None())?,
    }
    dict.set_item(intern!(py, "version"), cai::VERSION)?;
    dict.set_item(intern!(py, "stream"), described.stream)?;
    Ok(dict)
}

/// Installs `__cuda_array_interface__` on the pyclass `T` as a property (a getset descriptor)
/// that calls [`cuda_array_interface`]. Used by [`add_dlpack_methods`](super::add_dlpack_methods).
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
pub(super) fn install<T>(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<()>
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    static DEFS: super::installed::PerType<pyffi::PyGetSetDef> = super::installed::PerType::new();
    let def = DEFS.get::<T>("attribute", || pyffi::PyGetSetDef {
        name: c"__cuda_array_interface__".as_ptr(),
        get: Some(getter::<T>),
        set: None,
        doc: c"The CUDA Array Interface (version 3) of this CUDA tensor.".as_ptr(),
        closure: core::ptr::null_mut(),
    })?;
    // SAFETY: `def` is a leaked, never freed, never written definition (`PerType`), which
    // CPython may keep for the life of the type (it only reads it); `ty` is a live type
    // object. The result is a new reference or NULL with an exception set.
    let descr = unsafe {
        Bound::from_owned_ptr_or_err(
            ty.py(),
            pyffi::PyDescr_NewGetSet(ty.as_type_ptr(), core::ptr::from_ref(def).cast_mut()),
        )
    }?;
    ty.setattr("__cuda_array_interface__", descr)
}

/// The getter of the property [`install`] sets: [`cuda_array_interface`] of `slf`, run as the
/// installed methods run (errors raised, a panic a `SystemError`; never unwinds).
#[cfg(any(Py_3_10, not(Py_LIMITED_API)))]
unsafe extern "C" fn getter<T>(
    slf: *mut pyffi::PyObject,
    _closure: *mut core::ffi::c_void,
) -> *mut pyffi::PyObject
where
    T: PyClass<Frozen = True> + DlpackExport + Sync,
{
    // SAFETY: CPython calls a getter with its instance, borrowed for the call, with the GIL.
    unsafe {
        super::installed::method_call::<T>(slf, |_py, slf| {
            Ok(cuda_array_interface(&slf)?.into_ptr())
        })
    }
}

/// The managed tensor of an object that has `__cuda_array_interface__` but no `__dlpack__`, or
/// `None` when it has neither (or has `__dlpack__`, which is preferred: it carries ownership
/// and the device).
///
/// # Errors
///
/// As [`managed_from_interface`].
pub(super) fn without_dlpack(
    obj: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<Option<ManagedTensor>> {
    let py = obj.py();
    if obj.hasattr(intern!(py, "__dlpack__"))? {
        return Ok(None);
    }
    match obj.getattr_opt(intern!(py, "__cuda_array_interface__"))? {
        Some(interface) => managed_from_interface(obj, &interface, options).map(Some),
        None => Ok(None),
    }
}

/// Imports `obj` through its `__cuda_array_interface__` value `interface` (versions 0 to 3): the
/// fields checked ([`cai::parse`]), the device and the allocation found from the data pointer
/// (`cuPointerGetAttribute`: `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`,
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, `CU_POINTER_ATTRIBUTE_RANGE_SIZE`; CUDA device 0 for
/// an empty array with pointer 0), every byte the layout reaches checked to lie in that
/// allocation ([`cai::check_within`]), and, unless the caller opted out
/// ([`FromDlpackOptions::without_cuda_array_interface_sync`]), the consumer's stream made to
/// wait on an event recorded on the exported `stream`, once that `stream` is checked to be one
/// the driver knows, of that device (`cuStreamGetCtx`). The tensor keeps `obj` alive.
///
/// # Errors
///
/// The Python exceptions of [`CaiError`] (see its `From` impl), among them
/// [`CaiError::OutsideAllocation`] (`ValueError`), [`CaiError::NotDeviceMemory`] and
/// [`CaiError::UnknownStream`] (`BufferError`); `ValueError` for an illegal consumer `stream`;
/// `BufferError` for another driver failure.
pub(super) fn managed_from_interface(
    obj: &Bound<'_, PyAny>,
    interface: &Bound<'_, PyAny>,
    options: &FromDlpackOptions,
) -> PyResult<ManagedTensor> {
    let fields = read_fields(interface)?;
    let tensor = cai::parse(&fields)?;
    let numel = tensor.numel();
    let device = if numel == 0 {
        // Nothing is read: a pointer the driver does not know (0, or any other an empty array
        // may carry) is not an error.
        Device::cuda(match tensor.data {
            0 => 0,
            data => pointer_device(data).unwrap_or(0),
        })
    } else {
        let range = pointer_range(tensor.data).map_err(|err| match err {
            CudaError::Driver {
                call: "cuPointerGetAttribute",
                code: cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            } => PyErr::from(CaiError::NotDeviceMemory { data: tensor.data }),
            other => ExportError::from(other).into(),
        })?;
        cai::check_within(&tensor, range.start, range.len)?;
        Device::cuda(range.device)
    };
    let stream = tensor.stream;
    let managed = import(obj, tensor, device)?;
    let Some(stream) = stream.filter(|_| numel > 0 && !options.cai_unsynchronized) else {
        return Ok(managed);
    };
    check_producer_raw_stream(stream, device.device_id).map_err(|err| match err {
        CudaError::Driver {
            call: "cuStreamGetCtx",
            ..
        } => PyErr::from(CaiError::UnknownStream {
            found: stream_value(stream),
            cause: err.to_string(),
        }),
        other => ExportError::from(other).into(),
    })?;
    // A consumer on another CUDA device (`device=cuda:k`, served by a copy on its stream of
    // that device, `settle`): the tensor carries an event recorded on the exported stream, which
    // the copy's stream waits on (`cuStreamWaitEvent` takes another device's event).
    if options
        .device
        .is_some_and(|wanted| wanted.device_type == DeviceType::Cuda && wanted != device)
    {
        let ctx = context(device.device_id).map_err(ExportError::from)?;
        let _current = CurrentContext::save();
        bind(ctx.cu_ctx()).map_err(ExportError::from)?;
        // The exported stream is valid while `obj` lives (the interface's "Lifetime
        // management"), checked above to be of this device; its special handles resolve in the
        // bound primary context.
        check_not_capturing(
            raw_stream(stream),
            "ordering a copy to another device after the exported stream",
            "import after the capture ends",
        )
        .map_err(ExportError::from)?;
        let kept = ReadyEvents::record_raw(&ctx, raw_stream(stream)).map_err(ExportError::from)?;
        return Ok(crate::export::carry_ready_events(managed, kept));
    }
    // A consumer on the host (`device=CPU`, served by a copy to the host) waits on the host,
    // with the GIL released; any other waits with its stream.
    let request = if options.device == Some(Device::CPU) {
        StreamRequest::Host
    } else {
        parse_stream(device, options.stream).map_err(ExportError::from)?
    };
    let kept =
        order_raw(device.device_id, raw_stream(stream), request).map_err(ExportError::from)?;
    Ok(crate::export::carry_ready_events(managed, kept))
}

/// The memory a `__cuda_array_interface__` describes: from its lowest address, `byte_len`
/// bytes of `dtype` on `device`.
struct InterfaceMemory {
    start: u64,
    byte_len: usize,
    dtype: DataType,
    device: Device,
}

// SAFETY: `start` and `byte_len` are the span of the elements the producer described
// (`cai::parse`: checked not to overflow, aligned to the item size), inside the allocation of
// the pointer (`cai::check_within`, empty arrays excepted: they reach no byte), on the device
// that owns it (`cuPointerGetAttribute`; `check_pointer` again at export). The memory stays
// allocated while the producer object lives (the interface's "Lifetime management" section),
// and `Imported` holds a reference to it for as long as this buffer lives. Not unaliased: other
// objects may reach the same memory.
unsafe impl ExportBuffer for InterfaceMemory {
    fn dtype(&self) -> DataType {
        self.dtype
    }
    fn device(&self) -> Device {
        self.device
    }
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.start as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.start as usize as *mut core::ffi::c_void)
    }
}

/// The owner of an import through the interface: the producer object and the description.
struct Imported {
    _producer: PyOwner<PyAny>,
    memory: InterfaceMemory,
    shape: Vec<usize>,
    strides: Option<Vec<isize>>,
    offset: usize,
    read_only: bool,
}

fn imported_parts(owner: &mut Imported) -> ExportParts<'_> {
    let parts = if owner.read_only {
        ExportParts::shared(&owner.memory, &owner.shape)
    } else {
        ExportParts::unique(&mut owner.memory, &owner.shape)
    };
    parts
        .with_strides(owner.strides.as_deref())
        .with_byte_offset(owner.offset)
}

/// A managed tensor over the memory `tensor` describes, keeping `obj` alive; validated as every
/// export is (the layout, and its span inside the memory).
fn import(obj: &Bound<'_, PyAny>, tensor: CaiTensor, device: Device) -> PyResult<ManagedTensor> {
    let owner = Imported {
        _producer: PyOwner(Some(obj.clone().unbind())),
        memory: InterfaceMemory {
            start: tensor.start,
            byte_len: tensor.byte_len,
            dtype: tensor.dtype,
            device,
        },
        offset: (tensor.data - tensor.start) as usize,
        shape: tensor.shape,
        strides: tensor.strides,
        read_only: tensor.read_only,
    };
    crate::export::export_with(owner, imported_parts, &ExportRequest::versioned()).map_err(|err| {
        match err {
            // The shared layout checks speak of an export; this is an import.
            ExportError::Layout(layout) => CaiError::Layout {
                reason: layout.to_string(),
            }
            .into(),
            other => other.into(),
        }
    })
}

/// The fields of a `__cuda_array_interface__` value.
fn read_fields(interface: &Bound<'_, PyAny>) -> Result<CaiFields, CaiError> {
    let dict = interface
        .cast::<PyDict>()
        .map_err(|_| field_type("__cuda_array_interface__", interface, "a dict"))?;
    let py = dict.py();
    let get = |name: &'static str| -> Result<Option<Bound<'_, PyAny>>, CaiError> {
        match dict.get_item(PyString::intern(py, name)) {
            Ok(value) => Ok(value),
            Err(_) => Err(CaiError::Missing { field: name }),
        }
    };
    let required = |name: &'static str| get(name)?.ok_or(CaiError::Missing { field: name });
    let optional = |name: &'static str| Ok::<_, CaiError>(get(name)?.filter(|v| !v.is_none()));
    let version = int(&required("version")?, "version", "an int")?;
    let shape = ints(&required("shape")?, "shape", "a tuple of ints")?;
    let typestr_value = required("typestr")?;
    let typestr = typestr_value
        .cast::<PyString>()
        .map_err(|_| field_type("typestr", &typestr_value, "a str"))?
        .to_string();
    let data_value = required("data")?;
    let data = data_value
        .cast::<PyTuple>()
        .map_err(|_| field_type("data", &data_value, "a tuple (pointer, readonly)"))?;
    if data.len() != 2 {
        let n = data.len();
        return Err(CaiError::FieldType {
            field: "data",
            found: format!("a tuple of {n} item{}", if n == 1 { "" } else { "s" }),
            expected: "a tuple of 2 items (pointer, readonly)",
        });
    }
    let pointer = data
        .get_item(0)
        .map_err(|_| CaiError::Missing { field: "data" })?;
    let pointer = unsigned(&pointer, "data[0]")?;
    let readonly = data
        .get_item(1)
        .map_err(|_| CaiError::Missing { field: "data" })?;
    let readonly = readonly
        .cast::<PyBool>()
        .map_err(|_| field_type("data[1]", &readonly, "a bool (the readonly flag)"))?
        .is_true();
    let strides = match optional("strides")? {
        Some(s) => Some(ints(&s, "strides", "None or a tuple of ints")?),
        None => None,
    };
    let descr = match get("descr")? {
        Some(d) => Some(descr_entries(&d)?),
        None => None,
    };
    let mask = optional("mask")?.is_some();
    let stream = match optional("stream")? {
        Some(s) => Some(int(&s, "stream", "None or an int")?),
        None => None,
    };
    Ok(CaiFields {
        version,
        shape,
        typestr,
        data: pointer,
        readonly,
        strides,
        descr,
        mask,
        stream,
    })
}

fn field_type(field: &'static str, found: &Bound<'_, PyAny>, expected: &'static str) -> CaiError {
    let found = found.get_type().name().map_or_else(
        |_| "?".to_owned(),
        |n| {
            let article = match n.to_string().chars().next() {
                Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "an",
                _ => "a",
            };
            format!("{article} {n}")
        },
    );
    CaiError::FieldType {
        field,
        found,
        expected,
    }
}

fn int(
    value: &Bound<'_, PyAny>,
    field: &'static str,
    expected: &'static str,
) -> Result<i64, CaiError> {
    if !value.is_instance_of::<PyInt>() {
        return Err(field_type(field, value, expected));
    }
    value.extract::<i64>().map_err(|_| CaiError::OutOfRange {
        field,
        expected: "a 64-bit signed integer",
    })
}

fn unsigned(value: &Bound<'_, PyAny>, field: &'static str) -> Result<u64, CaiError> {
    if !value.is_instance_of::<PyInt>() || value.is_instance_of::<PyBool>() {
        return Err(field_type(field, value, "an int (the pointer)"));
    }
    value.extract::<u64>().map_err(|_| CaiError::OutOfRange {
        field,
        expected: "a pointer from 0 to 2**64 - 1",
    })
}

fn ints(
    value: &Bound<'_, PyAny>,
    field: &'static str,
    expected: &'static str,
) -> Result<Vec<i64>, CaiError> {
    // The interface says tuple; a list is read the same way.
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|item| int(&item, field, expected))
            .collect();
    }
    let list = value
        .cast::<PyList>()
        .map_err(|_| field_type(field, value, expected))?;
    list.iter()
        .map(|item| int(&item, field, expected))
        .collect()
}

fn descr_entries(value: &Bound<'_, PyAny>) -> Result<Vec<DescrEntry>, CaiError> {
    const EXPECTED: &str = "a list of (name, typestr) tuples";
    let list = value
        .cast::<PyList>()
        .map_err(|_| field_type("descr", value, EXPECTED))?;
    list.iter()
        .map(|item| {
            let entry = item
                .cast::<PyTuple>()
                .ok()
                .filter(|t| (2..=3).contains(&t.len()))
                .ok_or_else(|| field_type("descr", &item, EXPECTED))?;
            let text = |i| -> Result<String, CaiError> {
                let part = entry
                    .get_item(i)
                    .map_err(|_| CaiError::Missing { field: "descr" })?;
                Ok(part
                    .cast::<PyString>()
                    .map_err(|_| field_type("descr", &part, EXPECTED))?
                    .to_string())
            };
            Ok(DescrEntry {
                name: text(0)?,
                typestr: text(1)?,
                has_shape: entry.len() == 3,
            })
        })
        .collect()
}
