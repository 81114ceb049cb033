//! `dlpack_example`: a Python extension module whose tensor type is a Rust struct speaking
//! DLPack through `dlpack-runtime`.
//!
//! ```python
//! import numpy as np, dlpack_example as de
//! t = de.Tensor.arange(2, 3)          # a Rust-owned float32 (2, 3) tensor
//! a = np.from_dlpack(t)               # zero-copy, read-only view in NumPy
//! de.total(np.arange(10.0)[::2])      # Rust reads any DLPack producer in place
//! ```

use std::sync::Arc;

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
use pyo3::prelude::*;

/// A float32 tensor owned by Rust: row-major data and a shape.
#[pyclass(frozen, module = "dlpack_example")]
#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[pymethods]
impl Tensor {
    /// `Tensor.arange(*shape)`: values 0, 1, 2, ... in row-major order.
    #[staticmethod]
    #[pyo3(signature = (*shape))]
    fn arange(shape: Vec<usize>) -> Self {
        let n: usize = shape.iter().product();
        Self {
            data: (0..n).map(|v| v as f32).collect(),
            shape,
        }
    }

    /// The shape, in elements.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// Sum of the elements, computed in Rust.
    fn sum(&self) -> f64 {
        self.data.iter().map(|&v| f64::from(v)).sum()
    }

    // `__dlpack__`, `__dlpack_device__` and `__dlpack_c_exchange_api__` are installed by
    // `python::add_dlpack_methods` in the module's init. (They can also be written as
    // `#[pymethods]` of one line each: see the `python` module docs.)
}

/// What Rust accepts from Python: any float64 tensor, strided or not.
#[derive(DlpackImport)]
struct F64View {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// What Rust writes into: a writable, C-contiguous float32 tensor.
#[derive(DlpackImport)]
struct F32Out {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// `total(x)`: the sum of any float64 DLPack producer (NumPy, JAX, ...), read in place, in
/// logical order whatever its strides. A derived consumer is a pyfunction argument type.
#[pyfunction]
fn total(x: F64View) -> PyResult<f64> {
    // A fold from 0.0: `Sum` for floats starts at -0.0, which an empty tensor would return.
    Ok(x.data.iter()?.fold(0.0, |total, v| total + v))
}

/// `strides(x)`: the element strides Rust sees for a float64 producer.
#[pyfunction]
fn strides(x: F64View) -> (Vec<usize>, Vec<isize>) {
    (x.shape, x.strides)
}

/// `fill(x, value)`: writes `value` into every element of a writable float32 producer, in
/// place.
#[pyfunction]
fn fill(mut out: F32Out, value: f32) -> PyResult<usize> {
    let slice = out.data.as_slice_mut()?;
    slice.fill(value);
    Ok(out.shape.iter().product())
}

/// `ones(*shape)`: a new float32 tensor handed over by value (writable in the consumer).
#[pyfunction]
#[pyo3(signature = (*shape))]
fn ones<'py>(py: Python<'py>, shape: Vec<usize>) -> PyResult<Bound<'py, python::ExportOnce>> {
    let n: usize = shape.iter().product();
    export_once(
        py,
        Tensor {
            data: vec![1.0; n],
            shape,
        },
    )
}

/// A float32 matrix seen through strides (a transposed or column-reversed view of its
/// row-major values): what `np.from_dlpack(x, copy=True)` copies into a compact array. Views
/// made by `view` share the values.
#[pyclass(frozen, module = "dlpack_example")]
#[derive(DlpackExport)]
struct Strided {
    #[dlpack(data)]
    data: Arc<Vec<f32>>,
    /// `(rows, cols)` of the row-major values.
    matrix: [usize; 2],
    #[dlpack(shape)]
    shape: [usize; 2],
    /// In elements.
    #[dlpack(strides)]
    strides: [isize; 2],
    /// Element `(0, 0)`, in elements from the start of `data`.
    #[dlpack(offset)]
    offset: usize,
}

#[pymethods]
impl Strided {
    /// `Strided(rows, cols, layout)`: the values 0, 1, 2, ... of a row-major `(rows, cols)`
    /// matrix, seen as `layout`: `"c"` (the matrix itself), `"t"` (its transpose, shape
    /// `(cols, rows)`) or `"reversed"` (its columns in reverse order, `a[:, ::-1]`).
    #[new]
    fn new(rows: usize, cols: usize, layout: &str) -> PyResult<Self> {
        let data = Arc::new((0..rows * cols).map(|v| v as f32).collect());
        Self::of(data, [rows, cols], layout)
    }

    /// `s.view(layout)`: the same values seen as `layout`, without copying them.
    fn view(&self, layout: &str) -> PyResult<Self> {
        Self::of(self.data.clone(), self.matrix, layout)
    }
}

impl Strided {
    fn of(data: Arc<Vec<f32>>, [rows, cols]: [usize; 2], layout: &str) -> PyResult<Self> {
        let (c, r) = (cols as isize, rows);
        let (shape, strides, offset) = match layout {
            "c" => ([rows, cols], [c, 1], 0),
            "t" => ([cols, r], [1, c], 0),
            "reversed" => ([rows, cols], [c, -1], cols.saturating_sub(1)),
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "layout {other:?}, expected \"c\", \"t\" or \"reversed\""
                )));
            }
        };
        Ok(Self {
            data,
            matrix: [rows, cols],
            shape,
            strides,
            offset,
        })
    }
}

/// Any tensor, any dtype, any layout: what `consume` builds.
#[derive(DlpackImport)]
struct AnyView {
    #[dlpack(data)]
    data: dlpack_runtime::ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// A one-dimensional float64 view with any stride: the rank is in the type, as in rust-numpy's
/// `PyReadonlyArray1`, so the shape and strides are arrays (no allocation), and a tensor of
/// another rank is refused at extraction (`BufferError` naming both ranks).
#[derive(DlpackImport)]
struct F64Vector {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: [usize; 1],
    #[dlpack(strides)]
    strides: [isize; 1],
}

/// `total_1d(x)`: `total` of a one-dimensional float64 producer, through a view of fixed rank.
#[pyfunction]
fn total_1d(x: F64Vector) -> PyResult<f64> {
    debug_assert_eq!(x.shape.len(), x.strides.len());
    Ok(x.data.iter()?.fold(0.0, |total, v| total + v))
}

/// A writable, contiguous, one-dimensional float32 view (rank in the type, as `F64Vector`).
#[derive(DlpackImport)]
struct F32VectorOut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

/// `fill_1d(x, value)`: `fill` of a one-dimensional float32 producer; the element count.
#[pyfunction]
fn fill_1d(mut out: F32VectorOut, value: f32) -> PyResult<usize> {
    out.data.as_slice_mut()?.fill(value);
    Ok(out.shape[0])
}

/// `ViewMut` of fixed rank 1: borrows exclusively at import.
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu", borrow = "exclusive")]
struct VectorMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

/// `alias_1d(a, b)`: `alias` of two one-dimensional float32 producers.
#[pyfunction]
fn alias_1d(mut a: VectorMut, mut b: VectorMut) -> PyResult<f32> {
    debug_assert!(a.shape[0] > 0 && b.shape[0] > 0);
    Ok(write_both(a.data.as_slice_mut()?, b.data.as_slice_mut()?))
}

/// `consume(x) -> ndim`: imports any DLPack producer or capsule into a Rust value and drops it;
/// the unit of the consumer benchmarks.
#[pyfunction]
fn consume(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    let view: AnyView = python::from_dlpack(x)?;
    debug_assert_eq!(view.shape.len(), view.strides.len());
    debug_assert!(!view.data.dl_tensor().data.is_null() || view.shape.contains(&0));
    Ok(view.shape.len())
}

/// A writable float32 view of host memory that borrows it exclusively at import: what `alias`
/// takes twice. As an argument, a conflicting borrow refuses the extraction of the argument,
/// whose `BufferError` then carries pyo3's note naming it (`while processing 'b'`).
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu", borrow = "exclusive")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A writable float32 view of host memory that borrows it at its first access only: what
/// `hold` and `relay` import, to borrow shared or exclusively, or not at all, as asked.
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu")]
struct HostMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// Writes 1.0 through `a` and 2.0 through `b`, then reads `a[0]`: if the two aliased, an
/// optimizer trusting `&mut` would return 1.0 with 2.0 in memory. The borrows of imported
/// memory keep them from aliasing.
#[inline(never)]
fn write_both(a: &mut [f32], b: &mut [f32]) -> f32 {
    a[0] = 1.0;
    b[0] = 2.0;
    a[0]
}

/// `alias(a, b)`: both tensors' slices at once, mutably; `BufferError` when they share memory
/// (`alias(x, x)`, `alias(x, x[1:])`), raised while extracting `b` (`ViewMut` borrows at import).
#[pyfunction]
fn alias(mut a: ViewMut, mut b: ViewMut) -> PyResult<f32> {
    debug_assert!(!a.shape.is_empty() && !b.shape.is_empty());
    Ok(write_both(a.data.as_slice_mut()?, b.data.as_slice_mut()?))
}

/// `alias_in_one(x, y)`: as `alias`, with both imports made inside the function.
#[pyfunction]
fn alias_in_one(x: &Bound<'_, PyAny>, y: &Bound<'_, PyAny>) -> PyResult<f32> {
    let mut a: ViewMut = python::from_dlpack(x)?;
    let mut b: ViewMut = python::from_dlpack(y)?;
    Ok(write_both(a.data.as_slice_mut()?, b.data.as_slice_mut()?))
}

/// A writable float32 view with any strides.
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu")]
struct StridedMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    /// In elements.
    #[dlpack(strides)]
    strides: [isize; 1],
}

/// `write_interleaved(a, b, va, vb)`: writes `va` into every element of the vector `a` and `vb`
/// into every element of `b`, alternating, both borrowed exclusively at once (`a = x[::2]`,
/// `b = x[1::2]` share no element).
#[pyfunction]
fn write_interleaved(mut a: StridedMut, mut b: StridedMut, va: f32, vb: f32) -> PyResult<()> {
    debug_assert!(a.strides[0] != 0 || a.shape[0] <= 1);
    for i in 0..a.shape[0].max(b.shape[0]) {
        if i < a.shape[0] {
            a.data.set(&[i], va)?;
        }
        if i < b.shape[0] {
            b.data.set(&[i], vb)?;
        }
    }
    Ok(())
}

/// A writable float32 vector with any strides that borrows its memory exclusively at import:
/// what `set_both` takes twice and `scale_into` writes.
#[derive(DlpackImport)]
#[dlpack(writable, device = "cpu", borrow = "exclusive")]
struct VecMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    /// In elements.
    #[dlpack(strides)]
    strides: [isize; 1],
}

/// A float32 vector with any strides that borrows its memory shared at import: what
/// `scale_into` reads.
#[derive(DlpackImport)]
#[dlpack(device = "cpu", borrow = "shared")]
struct VecRef {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    /// In elements.
    #[dlpack(strides)]
    strides: [isize; 1],
}

/// `set_both(a, b, va, vb)`: writes `va` into every element of the vector `a` and `vb` into
/// every element of `b`. Both borrow exclusively at extraction: `BufferError` naming `b` when
/// they share an element (`set_both(x, x, 1, 2)`), while `x[::2]` and `x[1::2]` are written.
#[pyfunction]
fn set_both(mut a: VecMut, mut b: VecMut, va: f32, vb: f32) -> PyResult<()> {
    debug_assert!(a.strides[0] != 0 || a.shape[0] <= 1);
    debug_assert!(b.strides[0] != 0 || b.shape[0] <= 1);
    for i in 0..a.shape[0] {
        a.data.set(&[i], va)?;
    }
    for i in 0..b.shape[0] {
        b.data.set(&[i], vb)?;
    }
    Ok(())
}

/// `scale_into(src, dst, factor=2.0)`: `dst[i] = factor * src[i]` for vectors of one length.
/// `src` borrows shared and `dst` exclusively at extraction: `BufferError` naming `dst` when
/// they share an element (`scale_into(x, x)`); `ValueError` for different lengths.
#[pyfunction]
#[pyo3(signature = (src, dst, factor=2.0))]
fn scale_into(src: VecRef, mut dst: VecMut, factor: f32) -> PyResult<()> {
    if src.shape != dst.shape {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "src has shape {:?} and dst {:?}, expected the same",
            src.shape, dst.shape
        )));
    }
    debug_assert!(src.strides[0] != 0 || src.shape[0] <= 1);
    for i in 0..src.shape[0] {
        dst.data.set(&[i], factor * src.data.get(&[i])?)?;
    }
    Ok(())
}

/// `read_then_write(a, b)`: sums the float32 vector `a` under a guard that ends before `b` is
/// written (every element set to the sum) under a guard of its own; returns the sum. `a` and `b`
/// may share memory (`read_then_write(x, x)`): the read's borrow has ended when the write
/// borrows.
#[pyfunction]
fn read_then_write(a: StridedMut, mut b: StridedMut) -> PyResult<f32> {
    let sum: f32 = {
        let a = a.data.readonly()?;
        a.iter()?.sum()
    };
    let mut b_data = b.data.readwrite()?;
    for i in 0..b.shape[0] {
        b_data.set(&[i], sum)?;
    }
    Ok(sum)
}

/// `read_while_write(a, b)`: as `read_then_write`, with `a`'s guard alive while `b` is written:
/// `BufferError` when `a` and `b` share memory; disjoint views (`x[::2]`, `x[1::2]`) are fine.
#[pyfunction]
fn read_while_write(a: StridedMut, mut b: StridedMut) -> PyResult<f32> {
    let a_data = a.data.readonly()?;
    let sum: f32 = a_data.iter()?.sum();
    let mut b_data = b.data.readwrite()?;
    for i in 0..b.shape[0] {
        b_data.set(&[i], sum)?;
    }
    // The read guard is still alive here: `a` is read again after the writes.
    let again: f32 = a_data.iter()?.sum();
    debug_assert_eq!(again, sum);
    Ok(again)
}

/// A tensor's memory held borrowed from Python: `hold(x, mutable)`. The borrow lasts until
/// `release()` (or until the holder is collected).
#[pyclass(frozen, module = "dlpack_example")]
struct Held(std::sync::Mutex<Option<ImportedData<f32>>>);

#[pymethods]
impl Held {
    /// Gives the borrow back.
    fn release(&self) {
        // Dropped after the lock: the producer's deleter may run Python code, during which
        // another thread may call this method.
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(held);
    }
}

/// `hold(x, mutable)`: imports the float32 tensor `x` and borrows its memory, exclusively when
/// `mutable`; `BufferError` when another import holds a conflicting borrow.
#[pyfunction]
fn hold(x: &Bound<'_, PyAny>, mutable: bool) -> PyResult<Held> {
    let mut view: HostMut = python::from_dlpack(x)?;
    if mutable {
        view.data.as_slice_mut()?;
    } else {
        view.data.as_slice()?;
    }
    Ok(Held(std::sync::Mutex::new(Some(view.data))))
}

/// An imported float32 vector kept by Rust and lent on to Python (a relay): made by
/// `relay(x, access)`, which first reads (`"read"`), writes (`"write"`) or does not touch
/// (`None`) the import.
#[pyclass(frozen, module = "dlpack_example")]
#[derive(DlpackExport)]
struct Relay {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// `relay(x, access=None)`: see [`Relay`].
#[pyfunction]
#[pyo3(signature = (x, access=None))]
fn relay(x: &Bound<'_, PyAny>, access: Option<&str>) -> PyResult<Relay> {
    let mut view: HostMut = python::from_dlpack(x)?;
    match access {
        Some("read") => drop(view.data.as_slice()?),
        Some("write") => view.data.as_slice_mut()?.fill(5.0),
        None => {}
        Some(other) => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "access {other:?}, expected \"read\", \"write\" or None"
            )));
        }
    }
    Ok(Relay {
        data: view.data,
        shape: view.shape,
    })
}

/// Any tensor of any dtype, imported as it is and lent on to Python (a relay for every dtype):
/// made by `any_relay(x, copy=None)`. Exported read-only, with the import's shape and strides
/// (which must not be negative: the export starts at element `(0, ..., 0)`).
#[pyclass(frozen, module = "dlpack_example")]
#[derive(DlpackExport, DlpackImport)]
struct AnyRelay {
    #[dlpack(data)]
    data: dlpack_runtime::ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(dtype)]
    dtype: dlpack_runtime::DataType,
}

#[pymethods]
impl AnyRelay {
    /// `(shape, strides)` as imported, strides in elements.
    #[getter]
    fn layout(&self) -> (Vec<usize>, Vec<isize>) {
        (self.shape.clone(), self.strides.clone())
    }

    /// The imported data's address (the producer's memory: no copy was made).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.data.dl_tensor().data as usize + self.data.dl_tensor().byte_offset as usize
    }
}

/// `any_relay(x, copy=None)`: see [`AnyRelay`]. `copy` is passed to `from_dlpack`: `False`
/// (no copy) or `True` make the import call `x.__dlpack__(...)` even where `x`'s type
/// publishes the C exchange API, which `None` uses.
#[pyfunction]
#[pyo3(signature = (x, copy=None))]
fn any_relay(x: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<AnyRelay> {
    python::from_dlpack_with(x, &python::FromDlpackOptions::new().copy(copy))
}

#[cfg(feature = "hip")]
mod rocm {
    //! ROCm tensors on the HIP runtime (feature `hip`), for `gpu_tests/test_rocm.py`: a
    //! producer (`RocmTensor`, whose write may be held behind a gate) and a consumer
    //! (`rocm_sum`) that imports on a stream and reads there.

    use core::ffi::c_void;
    use std::sync::{Arc, Condvar, Mutex, OnceLock};
    use std::time::Duration;

    use dlpack_runtime::hip::{HipSlice, HipStream};
    use dlpack_runtime::python::{self, FromDlpackOptions};
    use dlpack_runtime::{DeviceType, DlpackExport, DlpackImport, ImportedData};
    use pyo3::exceptions::{PyBufferError, PyIndexError, PyRuntimeError};
    use pyo3::prelude::*;

    type Stream = *mut c_void;
    /// `hipMemcpyDeviceToHost`, `hipMemcpyDeviceToDevice`.
    const DEVICE_TO_HOST: i32 = 2;
    const DEVICE_TO_DEVICE: i32 = 3;

    /// The HIP calls this module makes itself, beyond `HipStream` and `HipSlice`: from the
    /// same `libamdhip64.so` as `dlpack-runtime` loads (already loaded by `hip::init`).
    struct Hip {
        set_device: unsafe extern "C" fn(i32) -> i32,
        launch_host_func:
            unsafe extern "C" fn(Stream, unsafe extern "C" fn(*mut c_void), *mut c_void) -> i32,
        memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, Stream) -> i32,
        stream_synchronize: unsafe extern "C" fn(Stream) -> i32,
        host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32,
        host_free: unsafe extern "C" fn(*mut c_void) -> i32,
        _library: libloading::Library,
    }

    fn hip_err(e: impl std::fmt::Display) -> PyErr {
        PyRuntimeError::new_err(e.to_string())
    }

    fn hip_failed(call: &str, code: i32) -> PyErr {
        PyRuntimeError::new_err(format!("{call} failed with hipError_t {code}"))
    }

    fn hip_check(call: &str, code: i32) -> PyResult<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(hip_failed(call, code))
        }
    }

    /// The HIP runtime, after probing for it (no runtime is a `RuntimeError`), with the two
    /// module streams (`rocm_stream`) made once.
    fn hip() -> PyResult<&'static Hip> {
        static HIP: OnceLock<Hip> = OnceLock::new();
        if let Some(hip) = HIP.get() {
            return Ok(hip);
        }
        dlpack_runtime::hip::init()?;
        // SAFETY: the HIP runtime `hip::init` loaded and initialized; each symbol has the
        // prototype of `hip_runtime_api.h`.
        let loaded = unsafe {
            let library = libloading::Library::new("libamdhip64.so")
                .or_else(|_| libloading::Library::new("libamdhip64.so.7"))
                .or_else(|_| libloading::Library::new("libamdhip64.so.6"))
                .map_err(hip_err)?;
            Hip {
                set_device: *library.get(b"hipSetDevice\0").map_err(hip_err)?,
                launch_host_func: *library.get(b"hipLaunchHostFunc\0").map_err(hip_err)?,
                memcpy_async: *library.get(b"hipMemcpyAsync\0").map_err(hip_err)?,
                stream_synchronize: *library.get(b"hipStreamSynchronize\0").map_err(hip_err)?,
                host_malloc: *library.get(b"hipHostMalloc\0").map_err(hip_err)?,
                host_free: *library.get(b"hipHostFree\0").map_err(hip_err)?,
                _library: library,
            }
        };
        for slot in &STREAMS {
            let stream = HipStream::new_non_blocking(0)?;
            let _ = slot.get_or_init(|| Arc::new(stream));
        }
        Ok(HIP.get_or_init(|| loaded))
    }

    /// A float32 ROCm tensor and the stream its contents were written on: `RocmTensor` in
    /// Python, a frozen pyclass with `__dlpack__` and `__dlpack_device__` (installed by
    /// `python::add_dlpack_methods`). Consumers get an event dependency on `stream`.
    #[pyclass(frozen, name = "RocmTensor", module = "dlpack_example")]
    #[derive(DlpackExport)]
    pub struct RocmTensor {
        #[dlpack(data)]
        data: HipSlice<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
        #[dlpack(stream)]
        stream: Arc<HipStream>,
    }

    #[derive(DlpackImport)]
    struct RocmView {
        #[dlpack(data)]
        data: ImportedData<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
    }

    fn arange(n: usize) -> Vec<f32> {
        (0..n).map(|v| v as f32).collect()
    }

    /// `rocm_arange(n) -> RocmTensor`: 0..n as float32 on HIP device 0, written
    /// asynchronously on a non-blocking stream of its own.
    #[pyfunction]
    pub fn rocm_arange(n: usize) -> PyResult<RocmTensor> {
        hip()?;
        let stream = Arc::new(HipStream::new_non_blocking(0)?);
        let data = HipSlice::from_host(&stream, &arange(n))?;
        Ok(RocmTensor {
            data,
            shape: vec![n],
            stream,
        })
    }

    /// The streams `rocm_stream` hands out, made with the runtime (`hip`), alive until the
    /// process exits.
    static STREAMS: [OnceLock<Arc<HipStream>>; 2] = [OnceLock::new(), OnceLock::new()];

    /// `rocm_stream(index=0) -> int`: the handle (`hipStream_t`, as an integer) of one of two
    /// non-blocking streams of HIP device 0 that the module owns for the life of the process,
    /// for use as a consumer stream, as in `rocm_sum(x, rocm_stream())`.
    #[pyfunction]
    #[pyo3(signature = (index=0))]
    pub fn rocm_stream(index: usize) -> PyResult<usize> {
        let slot = STREAMS.get(index).ok_or_else(|| {
            PyIndexError::new_err(format!("stream index {index}, expected 0 or 1"))
        })?;
        hip()?;
        let stream = slot
            .get()
            .ok_or_else(|| PyRuntimeError::new_err("the module streams were not created"))?;
        Ok(stream.raw() as usize)
    }

    /// A gate on a HIP stream: work enqueued on the stream after the gate waits until
    /// `release()` is called, or until `timeout` seconds have passed (so that a test that goes
    /// wrong fails instead of hanging). Made by `rocm_arange_gated`.
    #[pyclass(frozen, module = "dlpack_example")]
    pub struct RocmGate {
        open: Arc<(Mutex<bool>, Condvar)>,
        stream: Arc<HipStream>,
    }

    /// The host function a gate enqueues (`hipLaunchHostFunc`): waits until the gate opens or
    /// its timeout passes.
    unsafe extern "C" fn wait_for_gate(user_data: *mut c_void) {
        // SAFETY: the `Box::into_raw` of `hold`, taken back here exactly once.
        let held = unsafe { Box::from_raw(user_data.cast::<(Arc<(Mutex<bool>, Condvar)>, f64)>()) };
        let (gate, timeout) = *held;
        let (open, cv) = &*gate;
        let guard = open.lock().unwrap_or_else(|e| e.into_inner());
        let _ = cv.wait_timeout_while(guard, Duration::from_secs_f64(timeout), |open| !*open);
    }

    fn open_gate(gate: &(Mutex<bool>, Condvar)) {
        let (open, cv) = gate;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }

    #[pymethods]
    impl RocmGate {
        /// Lets the stream go on. Any thread may call it.
        fn release(&self) {
            open_gate(&self.open);
        }

        /// The held stream's handle (`hipStream_t` as an integer).
        #[getter]
        fn stream(&self) -> usize {
            self.stream.raw() as usize
        }
    }

    /// `rocm_arange_gated(n, timeout) -> (RocmTensor, RocmGate)`: as `rocm_arange`, with the
    /// write held behind a gate on its stream until `gate.release()` (or `timeout` seconds):
    /// the values are uploaded first, then copied into the tensor on the device behind the
    /// gate, so nothing the host does waits for the gate.
    #[pyfunction]
    pub fn rocm_arange_gated(n: usize, timeout: f64) -> PyResult<(RocmTensor, RocmGate)> {
        let hip = hip()?;
        let stream = Arc::new(HipStream::new_non_blocking(0)?);
        let staged = HipSlice::from_host(&stream, &arange(n))?;
        let data = HipSlice::<f32>::alloc_zeros(&stream, n)?;
        stream.synchronize()?;
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let user_data = Box::into_raw(Box::new((open.clone(), timeout))).cast::<c_void>();
        // SAFETY: device 0 exists (the stream was made on it).
        hip_check("hipSetDevice", unsafe { (hip.set_device)(0) })?;
        // SAFETY: a live stream; the host function takes `user_data` back once.
        let code = unsafe { (hip.launch_host_func)(stream.raw(), wait_for_gate, user_data) };
        if code != 0 {
            // SAFETY: not handed over: taken back here.
            drop(unsafe { Box::from_raw(user_data.cast::<(Arc<(Mutex<bool>, Condvar)>, f64)>()) });
            return Err(hip_failed("hipLaunchHostFunc", code));
        }
        if n > 0 {
            // SAFETY: `n` f32 of two live allocations of device 0, stream-ordered on their
            // stream; `staged` is freed on drop in the same stream's order, after the copy.
            let code = unsafe {
                (hip.memcpy_async)(
                    data.device_ptr() as usize as *mut c_void,
                    staged.device_ptr() as usize as *const c_void,
                    n * 4,
                    DEVICE_TO_DEVICE,
                    stream.raw(),
                )
            };
            if code != 0 {
                open_gate(&open);
                return Err(hip_failed("hipMemcpyAsync", code));
            }
        }
        drop(staged);
        let tensor = RocmTensor {
            data,
            shape: vec![n],
            stream: stream.clone(),
        };
        Ok((tensor, RocmGate { open, stream }))
    }

    /// Pinned host memory (`hipHostMalloc`), freed on drop.
    struct Pinned {
        ptr: *mut c_void,
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            if let Ok(hip) = hip() {
                // SAFETY: our allocation, used no more (the stream that wrote it was waited
                // for).
                let _ = unsafe { (hip.host_free)(self.ptr) };
            }
        }
    }

    /// `rocm_sum(x, stream, release=None) -> float`: imports a ROCm producer with
    /// `from_dlpack(x, stream=stream)` (a `hipStream_t` as an integer, `None` or `0` for the
    /// default stream, `-1` for no synchronization), then copies it to pinned host memory on
    /// that stream (the default stream for `None`, `0` and `-1`), waits for the copy with the
    /// GIL released and sums the values. A gate passed as `release` is opened once the copy is
    /// enqueued, before the host waits: a test's read is then enqueued while the gated write is
    /// still pending, whatever the timing of the run.
    #[pyfunction]
    #[pyo3(signature = (x, stream, release=None))]
    pub fn rocm_sum(
        x: &Bound<'_, PyAny>,
        stream: Option<i64>,
        release: Option<PyRef<'_, RocmGate>>,
    ) -> PyResult<f64> {
        let hip = hip()?;
        let view: PyResult<RocmView> =
            python::from_dlpack_with(x, &FromDlpackOptions::new().stream(stream));
        let view = match view {
            Ok(view) => view,
            Err(err) => {
                if let Some(gate) = &release {
                    open_gate(&gate.open);
                }
                return Err(err);
            }
        };
        let device = view.data.device();
        if device.device_type != DeviceType::Rocm {
            if let Some(gate) = &release {
                open_gate(&gate.open);
            }
            return Err(PyBufferError::new_err(format!(
                "expected a ROCm tensor, found {device}"
            )));
        }
        let numel: usize = view.shape.iter().product();
        let bytes = numel * 4;
        let read_on = match stream {
            None | Some(0) | Some(-1) => 0usize,
            Some(handle) => handle as usize,
        };
        let src = view.data.as_ptr() as usize;
        let release = release.map(|gate| gate.open.clone());
        let pinned = if bytes == 0 {
            None
        } else {
            let mut ptr: *mut c_void = core::ptr::null_mut();
            // SAFETY: a valid out-pointer; flags 0 (`hipHostMallocDefault`).
            hip_check("hipHostMalloc", unsafe {
                (hip.host_malloc)(&mut ptr, bytes, 0)
            })?;
            Some(Pinned { ptr })
        };
        let dst = pinned.as_ref().map_or(0, |p| p.ptr as usize);
        let device_id = device.device_id;
        let waited = x.py().detach(move || -> PyResult<()> {
            // SAFETY: an ordinal the runtime has (the tensor's).
            hip_check("hipSetDevice", unsafe { (hip.set_device)(device_id) })?;
            let enqueued = if bytes == 0 {
                Ok(())
            } else {
                // SAFETY: `src` addresses `numel` contiguous f32 of the imported tensor
                // (C-contiguous: the view has no strides field), alive until this returns;
                // `dst` is pinned memory of `bytes` bytes; the stream is the caller's.
                hip_check("hipMemcpyAsync", unsafe {
                    (hip.memcpy_async)(
                        dst as *mut c_void,
                        src as *const c_void,
                        bytes,
                        DEVICE_TO_HOST,
                        read_on as Stream,
                    )
                })
            };
            if let Some(open) = &release {
                open_gate(open);
            }
            enqueued?;
            // SAFETY: a live stream (the caller's, or the default stream).
            hip_check("hipStreamSynchronize", unsafe {
                (hip.stream_synchronize)(read_on as Stream)
            })
        });
        waited?;
        let Some(pinned) = pinned else {
            return Ok(0.0);
        };
        // SAFETY: `numel` f32 written by the copy, which completed.
        let values = unsafe { core::slice::from_raw_parts(pinned.ptr.cast::<f32>(), numel) };
        Ok(values.iter().map(|&v| f64::from(v)).sum())
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    //! CUDA tensors, for the GPU suite (`scripts/gpu-suite.sh`).

    use std::sync::{Arc, Condvar, Mutex, OnceLock};
    use std::time::Duration;

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
    use dlpack_runtime::ffi::{self, DLManagedTensorVersioned};
    use dlpack_runtime::python::{self, FromDlpackOptions};
    use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData, ManagedTensor};
    use pyo3::exceptions::{PyBufferError, PyRuntimeError};
    use pyo3::prelude::*;

    fn cuda_err(e: impl std::fmt::Display) -> PyErr {
        PyRuntimeError::new_err(e.to_string())
    }

    /// Device 0's context, after probing for the driver: no driver is a `RuntimeError`, not the
    /// panic of cudarc's loader. Made once, with the two module streams (`cuda_stream`): cudarc
    /// synchronizes a context when its first stream is created, so that happens here, once,
    /// and never behind a tensor's pending work.
    fn device0() -> PyResult<Arc<CudaContext>> {
        static CONTEXT: OnceLock<Arc<CudaContext>> = OnceLock::new();
        if let Some(ctx) = CONTEXT.get() {
            return Ok(ctx.clone());
        }
        dlpack_runtime::cuda::init()?;
        let ctx = CudaContext::new(0).map_err(cuda_err)?;
        for slot in &STREAMS {
            let stream = ctx.new_stream().map_err(cuda_err)?;
            // Under a race the first stream stored wins; the other is destroyed on drop.
            let _ = slot.get_or_init(|| stream);
        }
        Ok(CONTEXT.get_or_init(|| ctx).clone())
    }

    /// A float32 CUDA tensor and the stream its contents were written on: `CudaTensor` in
    /// Python, a frozen pyclass with `__dlpack__`, `__dlpack_device__` and
    /// `__cuda_array_interface__` (all three installed by `python::add_dlpack_methods`).
    #[pyclass(frozen, name = "CudaTensor", module = "dlpack_example")]
    #[derive(DlpackExport)]
    pub struct GpuTensor {
        #[dlpack(data)]
        data: CudaSlice<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
        #[dlpack(stream)]
        stream: Arc<CudaStream>,
    }

    #[derive(DlpackImport)]
    struct GpuView {
        #[dlpack(data)]
        data: ImportedData<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
    }

    /// `cuda_arange(n) -> CudaTensor`: 0..n as float32 on device 0, written asynchronously on
    /// a stream of its own; DLPack consumers get an event dependency on it, and
    /// `__cuda_array_interface__` names that stream.
    #[pyfunction]
    pub fn cuda_arange(n: usize) -> PyResult<GpuTensor> {
        let stream = device0()?.new_stream().map_err(cuda_err)?;
        let host: Vec<f32> = (0..n).map(|v| v as f32).collect();
        let data = stream.clone_htod(&host).map_err(cuda_err)?;
        Ok(GpuTensor {
            data,
            shape: vec![n],
            stream,
        })
    }

    /// A float32 CUDA tensor with two streams that may have pending work on it: `first` (the
    /// stream its `__cuda_array_interface__` names) and `second`.
    #[pyclass(frozen, name = "CudaTensorTwoStreams", module = "dlpack_example")]
    #[derive(DlpackExport)]
    pub struct GpuTensorTwoStreams {
        #[dlpack(data)]
        data: CudaSlice<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
        #[dlpack(stream)]
        first: Arc<CudaStream>,
        #[dlpack(stream)]
        second: Arc<CudaStream>,
        /// `data`'s device pointer, read once when made.
        ptr: sys::CUdeviceptr,
    }

    #[pymethods]
    impl GpuTensorTwoStreams {
        /// The handles of the two streams (`CUstream` as integers): `(first, second)`.
        #[getter]
        fn streams(&self) -> (usize, usize) {
            (
                self.first.cu_stream() as usize,
                self.second.cu_stream() as usize,
            )
        }

        /// The device pointer of the data, read without any ordering (for the negative
        /// control of the tests).
        #[getter]
        fn data_ptr(&self) -> u64 {
            self.ptr
        }
    }

    /// `cuda_arange_two_streams(n, timeout) -> (CudaTensorTwoStreams, gate)`: 0..n as float32
    /// written on the tensor's second stream behind a gate (released by `gate.release()` or
    /// after `timeout` seconds); the first stream has nothing pending.
    #[pyfunction]
    pub fn cuda_arange_two_streams(
        n: usize,
        timeout: f64,
    ) -> PyResult<(GpuTensorTwoStreams, CudaGate)> {
        let ctx = device0()?;
        let first = ctx.new_stream().map_err(cuda_err)?;
        let second = ctx.new_stream().map_err(cuda_err)?;
        let open = gate_stream(&second, timeout)?;
        let host: Vec<f32> = (0..n).map(|v| v as f32).collect();
        let data = second.clone_htod(&host).map_err(cuda_err)?;
        let ptr = {
            use cudarc::driver::DevicePtr;
            let (ptr, _record) = data.device_ptr(&second);
            ptr
        };
        let tensor = GpuTensorTwoStreams {
            data,
            shape: vec![n],
            first,
            second: second.clone(),
            ptr,
        };
        Ok((
            tensor,
            CudaGate {
                open,
                stream: second,
            },
        ))
    }

    /// The streams `cuda_stream` hands out: created with the context (`device0`), alive until
    /// the process exits.
    static STREAMS: [OnceLock<Arc<CudaStream>>; 2] = [OnceLock::new(), OnceLock::new()];

    /// `cuda_stream(index=0) -> int`: the handle (`CUstream`, as an integer) of one of two
    /// non-blocking streams on device 0 that the module owns for the life of the process (the
    /// same one for an index on every call), for use as a consumer stream, as in
    /// `cuda_sum(x, cuda_stream())`.
    #[pyfunction]
    #[pyo3(signature = (index=0))]
    pub fn cuda_stream(index: usize) -> PyResult<usize> {
        let slot = STREAMS.get(index).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err(format!(
                "stream index {index}, expected 0 or 1"
            ))
        })?;
        device0()?;
        let stream = slot
            .get()
            .ok_or_else(|| PyRuntimeError::new_err("the module streams were not created"))?;
        Ok(stream.cu_stream() as usize)
    }

    /// Copies `view` to the host on `stream` and sums it. The copy to pageable memory and the
    /// wait block the host: they run with the GIL released (`py.detach`), so that other Python
    /// threads run meanwhile, as every host wait reached from Python should.
    fn sum_on(
        py: Python<'_>,
        view: &ImportedData<f32>,
        numel: usize,
        stream: sys::CUstream,
        release: Option<&CudaGate>,
    ) -> PyResult<f64> {
        let ptr = view.cuda_device_ptr()?;
        // Plain integers cross `detach` (raw pointers are not `Send`).
        let stream = stream as usize;
        let release = release.map(|gate| gate.open.clone());
        let host = py.detach(move || -> Result<Vec<f32>, cudarc::driver::DriverError> {
            let mut host = vec![0f32; numel];
            let stream = stream as sys::CUstream;
            // SAFETY: `ptr` addresses `numel` contiguous f32 of the imported tensor
            // (C-contiguous: the consumer has no strides field), which the caller keeps alive;
            // `host` has room for them; synchronized before it is read.
            let enqueued = unsafe {
                sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, numel * 4, stream)
            }
            .result();
            // The gate opens once the read is enqueued (or failed to be), before the host waits.
            if let Some(open) = &release {
                open_gate(open);
            }
            enqueued?;
            // SAFETY: a live stream handle (the caller's).
            unsafe { sys::cuStreamSynchronize(stream) }.result()?;
            Ok(host)
        });
        Ok(host.map_err(cuda_err)?.iter().map(|&v| f64::from(v)).sum())
    }

    /// `cuda_sum(x, stream, release=None)`: imports a CUDA producer passing `stream` (the
    /// caller's current stream handle; PyTorch reports its legacy default stream as 0, which
    /// DLPack spells 1), then reads it on that stream. A gate passed as `release` is opened once
    /// the read is enqueued, before the host waits for it: a test's read is then enqueued while
    /// the gated work is still pending, whatever the timing of the run. The read goes to
    /// pageable host memory, whose copy returns only once the stream has run it: `release` is
    /// for a read on a stream that the gate does not hold (else the gate opens at its timeout).
    #[pyfunction]
    #[pyo3(signature = (x, stream, release=None))]
    pub fn cuda_sum(
        x: &Bound<'_, PyAny>,
        stream: i64,
        release: Option<PyRef<'_, CudaGate>>,
    ) -> PyResult<f64> {
        let stream = if stream == 0 { 1 } else { stream };
        let view: GpuView =
            python::from_dlpack_with(x, &FromDlpackOptions::new().stream(Some(stream)))?;
        let numel = view.shape.iter().product();
        sum_on(
            x.py(),
            &view.data,
            numel,
            stream as usize as sys::CUstream,
            release.as_deref(),
        )
    }

    /// A gate on a CUDA stream: work enqueued on the stream after the gate waits until
    /// `release()` is called, or until `timeout` seconds have passed (so that a test that goes
    /// wrong fails instead of hanging). Made by `cuda_arange_gated`.
    #[pyclass(frozen, module = "dlpack_example")]
    pub struct CudaGate {
        open: Arc<(Mutex<bool>, Condvar)>,
        stream: Arc<CudaStream>,
    }

    /// The host function a gate enqueues: waits until the gate opens or its timeout passes.
    unsafe extern "C" fn wait_for_gate(user_data: *mut std::ffi::c_void) {
        // SAFETY: `user_data` is the `Box::into_raw` of `hold`, taken back here exactly once.
        let held = unsafe { Box::from_raw(user_data.cast::<(Arc<(Mutex<bool>, Condvar)>, f64)>()) };
        let (gate, timeout) = *held;
        let (open, cv) = &*gate;
        let guard = open.lock().unwrap_or_else(|e| e.into_inner());
        let _ = cv.wait_timeout_while(guard, Duration::from_secs_f64(timeout), |open| !*open);
    }

    /// Opens a gate: the host function waiting on it returns.
    fn open_gate(gate: &(Mutex<bool>, Condvar)) {
        let (open, cv) = gate;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }

    #[pymethods]
    impl CudaGate {
        /// Lets the stream go on. Any thread may call it.
        fn release(&self) {
            open_gate(&self.open);
        }

        /// The held stream's handle (`CUstream` as an integer).
        #[getter]
        fn stream(&self) -> usize {
            self.stream.cu_stream() as usize
        }
    }

    /// `cuda_arange_gated(n, timeout) -> (tensor, gate)`: as `cuda_arange`, with the write held
    /// behind a gate on its stream until `gate.release()` (or `timeout` seconds).
    #[pyfunction]
    pub fn cuda_arange_gated(n: usize, timeout: f64) -> PyResult<(GpuTensor, CudaGate)> {
        let stream = device0()?.new_stream().map_err(cuda_err)?;
        let open = gate_stream(&stream, timeout)?;
        let host: Vec<f32> = (0..n).map(|v| v as f32).collect();
        let data = stream.clone_htod(&host).map_err(cuda_err)?;
        let tensor = GpuTensor {
            data,
            shape: vec![n],
            stream: stream.clone(),
        };
        Ok((tensor, CudaGate { open, stream }))
    }

    /// The primary context of CUDA device `device`, made once per device (device 0's by
    /// `device0`, with its module streams).
    fn device_context(device: usize) -> PyResult<Arc<CudaContext>> {
        static CONTEXTS: Mutex<Vec<Option<Arc<CudaContext>>>> = Mutex::new(Vec::new());
        if device == 0 {
            return device0();
        }
        dlpack_runtime::cuda::init()?;
        let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        if contexts.len() <= device {
            contexts.resize(device + 1, None);
        }
        if let Some(ctx) = &contexts[device] {
            return Ok(ctx.clone());
        }
        let ctx = CudaContext::new(device).map_err(cuda_err)?;
        contexts[device] = Some(ctx.clone());
        Ok(ctx)
    }

    /// `cuda_device_count() -> int`: the devices the CUDA driver has.
    #[pyfunction]
    pub fn cuda_device_count() -> PyResult<usize> {
        dlpack_runtime::cuda::init()?;
        CudaContext::device_count()
            .map(|n| n as usize)
            .map_err(cuda_err)
    }

    /// `cuda_stream_on(device) -> int`: the handle of a non-blocking stream of CUDA device
    /// `device`, made once per device and alive until the process exits (the module's streams
    /// beside `cuda_stream`'s, for consumers on other devices).
    #[pyfunction]
    pub fn cuda_stream_on(device: usize) -> PyResult<usize> {
        static STREAMS: Mutex<Vec<Option<Arc<CudaStream>>>> = Mutex::new(Vec::new());
        let ctx = device_context(device)?;
        let mut streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
        if streams.len() <= device {
            streams.resize(device + 1, None);
        }
        if let Some(stream) = &streams[device] {
            return Ok(stream.cu_stream() as usize);
        }
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let handle = stream.cu_stream() as usize;
        streams[device] = Some(stream);
        Ok(handle)
    }

    /// `cuda_arange_gated_on(n, timeout, device) -> (tensor, gate)`: as `cuda_arange_gated`, on
    /// CUDA device `device`.
    #[pyfunction]
    pub fn cuda_arange_gated_on(
        n: usize,
        timeout: f64,
        device: usize,
    ) -> PyResult<(GpuTensor, CudaGate)> {
        let stream = device_context(device)?.new_stream().map_err(cuda_err)?;
        let host: Vec<f32> = (0..n).map(|v| v as f32).collect();
        // Uploaded before the gate (a copy from pageable memory would wait behind it), then
        // copied on the device behind it.
        let staged = stream.clone_htod(&host).map_err(cuda_err)?;
        let mut data = stream.alloc_zeros::<f32>(n).map_err(cuda_err)?;
        stream.synchronize().map_err(cuda_err)?;
        let open = gate_stream(&stream, timeout)?;
        stream.memcpy_dtod(&staged, &mut data).map_err(cuda_err)?;
        let tensor = GpuTensor {
            data,
            shape: vec![n],
            stream: stream.clone(),
        };
        Ok((tensor, CudaGate { open, stream }))
    }

    /// `cuda_sum_on(x, device, stream, copy=None, release=None) -> (sum, device, is_copied)`:
    /// imports `x` onto CUDA device `device` (`from_dlpack(x, device=(kDLCUDA, device),
    /// copy=copy)`, passing `stream`, a stream of that device, `None` or `-1`), then reads it on
    /// that stream (the legacy default stream for `None` and `-1`) with the device's context
    /// bound (and the caller's restored); returns the sum, the device of the memory read, and
    /// whether the import was a copy (`IS_COPIED`). A gate passed as `release` is opened once the
    /// read is enqueued, before the host waits for it (as `cuda_sum`).
    #[pyfunction]
    #[pyo3(signature = (x, device, stream, copy=None, release=None))]
    pub fn cuda_sum_on(
        x: &Bound<'_, PyAny>,
        device: i32,
        stream: Option<i64>,
        copy: Option<bool>,
        release: Option<PyRef<'_, CudaGate>>,
    ) -> PyResult<(f64, i32, bool)> {
        let ctx = device_context(device as usize)?;
        let view: GpuView = python::from_dlpack_with(
            x,
            &FromDlpackOptions::new()
                .device(dlpack_runtime::Device::cuda(device))
                .copy(copy)
                .stream(stream),
        )?;
        // `None` names the legacy default stream (`CU_STREAM_LEGACY`, 1); `-1` names no stream
        // (the caller vouches that the memory is ready), and the read goes on that one too.
        let stream = match stream {
            None | Some(-1) => 1,
            Some(stream) => stream,
        };
        let copied = view.data.managed().is_copied();
        let found = view.data.device().device_id;
        let numel = view.shape.iter().product();
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a live out-pointer.
        unsafe { sys::cuCtxGetCurrent(&mut current) }
            .result()
            .map_err(cuda_err)?;
        // SAFETY: a retained primary context.
        unsafe { sys::cuCtxSetCurrent(ctx.cu_ctx()) }
            .result()
            .map_err(cuda_err)?;
        let sum = sum_on(
            x.py(),
            &view.data,
            numel,
            stream as usize as sys::CUstream,
            release.as_deref(),
        );
        // SAFETY: the context (or NULL) that was current.
        unsafe { sys::cuCtxSetCurrent(current) }
            .result()
            .map_err(cuda_err)?;
        Ok((sum?, found, copied))
    }

    /// Enqueues a gate on `stream`: the work enqueued after it waits until the returned flag is
    /// set (`CudaGate::release`) or `timeout` seconds have passed.
    fn gate_stream(stream: &CudaStream, timeout: f64) -> PyResult<Arc<(Mutex<bool>, Condvar)>> {
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let user_data = Box::into_raw(Box::new((open.clone(), timeout)));
        // SAFETY: `wait_for_gate` matches `CUhostFn` and takes `user_data` back once it runs.
        unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(wait_for_gate), user_data.cast()) }
            .result()
            .map_err(cuda_err)?;
        Ok(open)
    }

    /// `cuda_synchronize_holding_gil(stream)`: `cuStreamSynchronize` called directly, keeping
    /// the GIL (what this crate never does): the negative control of the GIL tests.
    #[pyfunction]
    pub fn cuda_synchronize_holding_gil(stream: usize) -> PyResult<()> {
        // SAFETY: a live stream handle (the caller's, from `CudaGate.stream`).
        unsafe { sys::cuStreamSynchronize(stream as sys::CUstream) }
            .result()
            .map_err(cuda_err)
    }

    /// `host_sum(x, stream=None)`: imports `x` for the host (`from_dlpack(x, device=cpu)`,
    /// passing the consumer stream `stream` as `__dlpack__` takes it when given) and sums it. A
    /// producer that cannot copy to the host itself (one without the `dl_device` keyword, or
    /// one that ignores it) is copied by this consumer.
    #[pyfunction]
    #[pyo3(signature = (x, stream=None))]
    pub fn host_sum(x: &Bound<'_, PyAny>, stream: Option<i64>) -> PyResult<f64> {
        let view: GpuView = python::from_dlpack_with(
            x,
            &FromDlpackOptions::new()
                .device(dlpack_runtime::Device::CPU)
                .stream(stream),
        )?;
        Ok(view.data.as_slice()?.iter().map(|&v| f64::from(v)).sum())
    }

    /// `cuda_to_host(x) -> ExportOnce`: `x` (any layout, from `__dlpack__` or
    /// `__cuda_array_interface__`) imported for the host (`device=CPU`: a compact copy in
    /// row-major order), handed back for `numpy.from_dlpack`.
    #[pyfunction]
    pub fn cuda_to_host<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, python::ExportOnce>> {
        let managed = python::managed_from_object(
            x,
            &FromDlpackOptions::new().device(dlpack_runtime::Device::CPU),
        )?;
        python::export_managed(x.py(), managed)
    }

    /// `cuda_copy_to(x, device, stream) -> ExportOnce`: `x` imported onto CUDA device `device`
    /// (`from_dlpack(x, device=(kDLCUDA, device))`, with `stream` a stream of that device: a
    /// copy on it when `x` is elsewhere), handed back without reading it, for another consumer.
    #[pyfunction]
    pub fn cuda_copy_to<'py>(
        x: &Bound<'py, PyAny>,
        device: i32,
        stream: i64,
    ) -> PyResult<Bound<'py, python::ExportOnce>> {
        let managed = python::managed_from_object(
            x,
            &FromDlpackOptions::new()
                .device(dlpack_runtime::Device::cuda(device))
                .stream(Some(stream)),
        )?;
        python::export_managed(x.py(), managed)
    }

    /// `cuda_is_read_only(x) -> bool`: whether the import of `x` is read-only (the
    /// `DLPACK_FLAG_BITMASK_READ_ONLY` flag of what `from_dlpack` gets).
    #[pyfunction]
    pub fn cuda_is_read_only(x: &Bound<'_, PyAny>) -> PyResult<bool> {
        let managed = python::managed_from_object(x, &FromDlpackOptions::new())?;
        Ok(managed.is_read_only())
    }

    /// A CUDA tensor imported by Rust and lent on (a relay), with no stream field: made by
    /// `cuda_relay(x, stream)`.
    #[pyclass(frozen, module = "dlpack_example")]
    #[derive(DlpackExport)]
    pub struct CudaRelay {
        #[dlpack(data)]
        data: ImportedData<f32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
    }

    /// `cuda_relay(x, stream) -> CudaRelay`: imports `x` for the consumer stream `stream` (an
    /// int as `__dlpack__` takes it; `-1`: no synchronization) and keeps it, to lend it on.
    #[pyfunction]
    pub fn cuda_relay(x: &Bound<'_, PyAny>, stream: i64) -> PyResult<CudaRelay> {
        let view: GpuView =
            python::from_dlpack_with(x, &FromDlpackOptions::new().stream(Some(stream)))?;
        Ok(CudaRelay {
            data: view.data,
            shape: view.shape,
        })
    }

    /// Device memory of `n` float32 on device 0, allocated when made (never under a capture),
    /// that a captured region can copy into: made by `CudaBuffer(n)`.
    #[pyclass(module = "dlpack_example")]
    pub struct CudaBuffer {
        data: CudaSlice<f32>,
        /// `data`'s device pointer, read once (cudarc's access tracking would add waits on the
        /// buffer's own stream to every stream that asks, including one being captured).
        ptr: sys::CUdeviceptr,
    }

    /// An import kept alive for as long as a graph that reads it may be launched.
    #[pyclass(frozen, module = "dlpack_example")]
    pub struct CudaImport {
        _view: GpuView,
    }

    #[pymethods]
    impl CudaBuffer {
        #[new]
        fn new(n: usize) -> PyResult<Self> {
            let stream = device0()?.default_stream();
            let data = stream.alloc_zeros::<f32>(n).map_err(cuda_err)?;
            let ptr = {
                use cudarc::driver::DevicePtr;
                let (ptr, _record) = data.device_ptr(&stream);
                ptr
            };
            stream.synchronize().map_err(cuda_err)?;
            Ok(Self { data, ptr })
        }

        /// `copy_from(x, stream, sync=True, cai_sync=True) -> CudaImport`: imports `x` for
        /// `stream` (with `stream=-1` when `sync` is false: no ordering, the negative control;
        /// with `cai_sync` false an import through `__cuda_array_interface__` ignores its
        /// `stream`, the other negative control) and enqueues a device-to-device copy of it
        /// into this buffer on `stream`; under a capture, the copy is part of the graph. Keep
        /// the result as long as the copy may run.
        #[pyo3(signature = (x, stream, sync=true, cai_sync=true))]
        fn copy_from(
            &self,
            x: &Bound<'_, PyAny>,
            stream: usize,
            sync: bool,
            cai_sync: bool,
        ) -> PyResult<CudaImport> {
            let asked = if sync { stream as i64 } else { -1 };
            let mut options = FromDlpackOptions::new().stream(Some(asked));
            if !cai_sync {
                // SAFETY: the imported memory is only read by the device copy enqueued below,
                // never through a Rust reference; left unordered (the negative control of the
                // tests), that copy may read stale values, which is the point.
                options = unsafe { options.without_cuda_array_interface_sync() };
            }
            let view: GpuView = python::from_dlpack_with(x, &options)?;
            let n: usize = view.shape.iter().product();
            if n != self.data.len() {
                return Err(PyBufferError::new_err(format!(
                    "{n} elements, expected {}",
                    self.data.len()
                )));
            }
            // SAFETY: both are `n` float32 of live device memory (the import is kept by the
            // returned object, the buffer by `self`); stream-ordered on a live stream.
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    self.ptr,
                    view.data.cuda_device_ptr()?,
                    n * 4,
                    stream as sys::CUstream,
                )
            }
            .result()
            .map_err(cuda_err)?;
            Ok(CudaImport { _view: view })
        }

        /// `copy_from_pointer(ptr, stream)`: enqueues a device-to-device copy of the buffer's
        /// length in float32 from the device pointer `ptr` (as a CUDA Array Interface
        /// consumer finds it in `data`) into this buffer on `stream`, with no ordering of its
        /// own: the caller enqueues on the stream the interface names, as its
        /// "Synchronization" section allows.
        fn copy_from_pointer(&self, ptr: u64, stream: usize) -> PyResult<()> {
            let n = self.data.len();
            let (mut start, mut size): (sys::CUdeviceptr, usize) = (0, 0);
            // SAFETY: valid out-pointers of the attributes' types; the driver only reads its
            // own tables for `ptr`.
            unsafe {
                sys::cuPointerGetAttribute(
                    (&mut start as *mut sys::CUdeviceptr).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                    ptr,
                )
                .result()
                .map_err(cuda_err)?;
                sys::cuPointerGetAttribute(
                    (&mut size as *mut usize).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    ptr,
                )
                .result()
                .map_err(cuda_err)?;
            }
            if ptr + (n * 4) as u64 > start + size as u64 {
                return Err(PyBufferError::new_err(format!(
                    "{n} float32 at {ptr:#x} reach past the allocation"
                )));
            }
            // SAFETY: `ptr` starts `n` float32 inside one live allocation (checked above) that
            // the caller keeps alive (its producer's `__cuda_array_interface__`); the buffer is
            // `n` float32 kept by `self`; stream-ordered on a live stream.
            unsafe { sys::cuMemcpyDtoDAsync_v2(self.ptr, ptr, n * 4, stream as sys::CUstream) }
                .result()
                .map_err(cuda_err)
        }

        /// `zero(stream)`: enqueues a memset of the buffer to 0.0 on `stream`.
        fn zero(&self, stream: usize) -> PyResult<()> {
            // SAFETY: the buffer's `len` float32 (4 bytes each), live; stream-ordered.
            unsafe { sys::cuMemsetD32Async(self.ptr, 0, self.data.len(), stream as sys::CUstream) }
                .result()
                .map_err(cuda_err)
        }

        /// `read(stream) -> list[float]`: the buffer's values after `stream`'s work so far (the
        /// host waits, with the GIL released).
        fn read(&self, py: Python<'_>, stream: usize) -> PyResult<Vec<f32>> {
            let (ptr, n) = (self.ptr, self.data.len());
            py.detach(move || -> Result<Vec<f32>, cudarc::driver::DriverError> {
                let mut host = vec![0f32; n];
                let stream = stream as sys::CUstream;
                // SAFETY: `n` float32 of live device memory into `host`, which has room for
                // them; the stream is synchronized before `host` is read.
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr, n * 4, stream)
                        .result()?;
                    sys::cuStreamSynchronize(stream).result()?;
                }
                Ok(host)
            })
            .map_err(cuda_err)
        }
    }

    /// An instantiated CUDA graph: made by `cuda_capture_end`, launched by `launch(stream)`.
    #[pyclass(module = "dlpack_example")]
    pub struct CudaGraph {
        graph: usize,
        exec: usize,
    }

    #[pymethods]
    impl CudaGraph {
        /// `launch(stream)`: enqueues the graph's work on `stream` (`cuGraphLaunch`); the host
        /// does not wait.
        fn launch(&self, stream: usize) -> PyResult<()> {
            // SAFETY: a live graph exec; a live stream handle (the caller's).
            unsafe { sys::cuGraphLaunch(self.exec as sys::CUgraphExec, stream as sys::CUstream) }
                .result()
                .map_err(cuda_err)
        }
    }

    impl Drop for CudaGraph {
        fn drop(&mut self) {
            // SAFETY: made by `cuda_capture_end`, destroyed once, here.
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec as sys::CUgraphExec);
                let _ = sys::cuGraphDestroy(self.graph as sys::CUgraph);
            }
        }
    }

    /// `cuda_capture_begin(stream, mode="global")`: starts capturing `stream` into a graph
    /// (`cuStreamBeginCapture`, mode `"global"`, `"thread_local"` or `"relaxed"`).
    #[pyfunction]
    #[pyo3(signature = (stream, mode="global"))]
    pub fn cuda_capture_begin(stream: usize, mode: &str) -> PyResult<()> {
        use sys::CUstreamCaptureMode as M;
        let mode = match mode {
            "global" => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
            "thread_local" => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            "relaxed" => M::CU_STREAM_CAPTURE_MODE_RELAXED,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "capture mode {other:?}, expected \"global\", \"thread_local\" or \"relaxed\""
                )));
            }
        };
        device0()?.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: a live stream handle (the caller's).
        unsafe { sys::cuStreamBeginCapture_v2(stream as sys::CUstream, mode) }
            .result()
            .map_err(cuda_err)
    }

    /// `cuda_capture_end(stream) -> CudaGraph`: ends the capture and instantiates its graph.
    #[pyfunction]
    pub fn cuda_capture_end(stream: usize) -> PyResult<CudaGraph> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: a live stream handle being captured; a valid out-pointer.
        unsafe { sys::cuStreamEndCapture(stream as sys::CUstream, &mut graph) }
            .result()
            .map_err(cuda_err)?;
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a graph the capture returned; a valid out-pointer.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
        if let Err(err) = made {
            // SAFETY: the graph is ours and used no more.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(cuda_err(err));
        }
        Ok(CudaGraph {
            graph: graph as usize,
            exec: exec as usize,
        })
    }

    /// `cuda_stream_idle(stream) -> bool`: whether `stream` has no pending work
    /// (`cuStreamQuery`).
    #[pyfunction]
    pub fn cuda_stream_idle(stream: usize) -> PyResult<bool> {
        // SAFETY: a live stream handle (the caller's); a query only.
        match unsafe { sys::cuStreamQuery(stream as sys::CUstream) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(cuda_err(format!("cuStreamQuery: {code:?}"))),
        }
    }

    /// `cuda_blocking_stream() -> int`: a blocking stream of device 0 (one that synchronizes
    /// with the legacy default stream), made once and kept for the process.
    #[pyfunction]
    pub fn cuda_blocking_stream() -> PyResult<usize> {
        static STREAM: OnceLock<usize> = OnceLock::new();
        if let Some(&s) = STREAM.get() {
            return Ok(s);
        }
        device0()?.bind_to_thread().map_err(cuda_err)?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags 0 (`CU_STREAM_DEFAULT`), the context is current.
        unsafe { sys::cuStreamCreate(&mut stream, 0) }
            .result()
            .map_err(cuda_err)?;
        Ok(*STREAM.get_or_init(|| stream as usize))
    }

    /// `cuda_sum_via_c_api(x) -> (sum, used_c_api)`: the N0 pattern of the C exchange API
    /// (`dlpack.h`, `DLPackExchangeAPI` guidelines): convert without synchronization, ask the
    /// producer's current work stream, and read on that stream.
    #[pyfunction]
    pub fn cuda_sum_via_c_api(x: &Bound<'_, PyAny>) -> PyResult<(f64, bool)> {
        let capsule = x.get_type().getattr("__dlpack_c_exchange_api__")?;
        let api = capsule
            .cast::<pyo3::types::PyCapsule>()?
            .pointer_checked(Some(ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME))?;
        // SAFETY: the capsule holds a process-lifetime `DLPackExchangeAPI` (`dlpack.h`).
        let api = unsafe { &*api.as_ptr().cast::<ffi::DLPackExchangeAPI>() };
        if api.header.version.major != 1 {
            return Err(PyBufferError::new_err(
                "exchange API of another major version",
            ));
        }
        let (Some(from_py), Some(current)) = (
            api.managed_tensor_from_py_object_no_sync,
            api.current_work_stream,
        ) else {
            return Err(PyBufferError::new_err(
                "exchange API without the needed functions",
            ));
        };
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: `x` is an object of the table's type; GIL held; `out` receives an owned tensor.
        if unsafe { from_py(x.as_ptr().cast(), &mut out) } != 0 {
            return Err(PyErr::fetch(x.py()));
        }
        // SAFETY: an owned managed tensor (`dlpack.h`, `DLPackManagedTensorFromPyObjectNoSync`).
        let managed = unsafe { ManagedTensor::from_raw_versioned(out) }?;
        let device = managed.dl_tensor().device;
        let mut stream: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the stream is valid until control returns to Python.
        if unsafe { current(device.device_type, device.device_id, &mut stream) } != 0 {
            return Err(PyErr::fetch(x.py()));
        }
        let view = GpuView::from_managed(managed)?;
        let numel = view.shape.iter().product();
        Ok((
            sum_on(x.py(), &view.data, numel, stream.cast(), None)?,
            true,
        ))
    }
}

/// The module. Free-thread-safe (`gil_used = false`): its classes keep no state that relied on
/// the GIL (`ExportOnce` and `Held` lock theirs), and dlpack-runtime's own steps are safe without
/// it (the `python` module docs, "Free-threaded Python").
#[pymodule(gil_used = false)]
fn dlpack_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Tensor>()?;
    // A shared, read-only export: the tensor stays alive while consumers hold it.
    python::add_dlpack_methods::<Tensor>(m.py())?;
    m.add_class::<Strided>()?;
    // A shared, read-only export, or a compact copy with `copy=True`.
    python::add_dlpack_methods::<Strided>(m.py())?;
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(strides, m)?)?;
    m.add_function(wrap_pyfunction!(fill, m)?)?;
    m.add_function(wrap_pyfunction!(ones, m)?)?;
    m.add_function(wrap_pyfunction!(consume, m)?)?;
    m.add_function(wrap_pyfunction!(alias, m)?)?;
    m.add_function(wrap_pyfunction!(total_1d, m)?)?;
    m.add_function(wrap_pyfunction!(fill_1d, m)?)?;
    m.add_function(wrap_pyfunction!(alias_1d, m)?)?;
    m.add_function(wrap_pyfunction!(alias_in_one, m)?)?;
    m.add_function(wrap_pyfunction!(write_interleaved, m)?)?;
    m.add_function(wrap_pyfunction!(set_both, m)?)?;
    m.add_function(wrap_pyfunction!(scale_into, m)?)?;
    m.add_function(wrap_pyfunction!(read_then_write, m)?)?;
    m.add_function(wrap_pyfunction!(read_while_write, m)?)?;
    m.add_class::<Held>()?;
    m.add_class::<Relay>()?;
    // A shared, read-only export of the imported memory it holds.
    python::add_dlpack_methods::<Relay>(m.py())?;
    m.add_function(wrap_pyfunction!(relay, m)?)?;
    m.add_class::<AnyRelay>()?;
    python::add_dlpack_methods::<AnyRelay>(m.py())?;
    m.add_function(wrap_pyfunction!(any_relay, m)?)?;
    m.add_function(wrap_pyfunction!(hold, m)?)?;
    #[cfg(feature = "cuda")]
    {
        m.add_class::<gpu::GpuTensor>()?;
        // A shared, read-only export; `__cuda_array_interface__` too (CUDA memory).
        python::add_dlpack_methods::<gpu::GpuTensor>(m.py())?;
        m.add_class::<gpu::GpuTensorTwoStreams>()?;
        python::add_dlpack_methods::<gpu::GpuTensorTwoStreams>(m.py())?;
        m.add_function(wrap_pyfunction!(gpu::cuda_arange, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_arange_two_streams, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_sum, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_sum_via_c_api, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_stream, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_arange_gated, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_arange_gated_on, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_device_count, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_stream_on, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_sum_on, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_copy_to, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_synchronize_holding_gil, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::host_sum, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_to_host, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_is_read_only, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_relay, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_capture_begin, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_capture_end, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_stream_idle, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_blocking_stream, m)?)?;
        m.add_class::<gpu::CudaBuffer>()?;
        m.add_class::<gpu::CudaGraph>()?;
        m.add_class::<gpu::CudaGate>()?;
        m.add_class::<gpu::CudaRelay>()?;
        // A shared, read-only export of the imported CUDA memory it holds.
        python::add_dlpack_methods::<gpu::CudaRelay>(m.py())?;
    }
    #[cfg(feature = "hip")]
    {
        m.add_class::<rocm::RocmTensor>()?;
        // A shared, read-only export of ROCm memory.
        python::add_dlpack_methods::<rocm::RocmTensor>(m.py())?;
        m.add_class::<rocm::RocmGate>()?;
        m.add_function(wrap_pyfunction!(rocm::rocm_arange, m)?)?;
        m.add_function(wrap_pyfunction!(rocm::rocm_arange_gated, m)?)?;
        m.add_function(wrap_pyfunction!(rocm::rocm_stream, m)?)?;
        m.add_function(wrap_pyfunction!(rocm::rocm_sum, m)?)?;
    }
    Ok(())
}
