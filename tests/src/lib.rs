//! Shared helpers for the integration tests: drop counters and hand-built foreign tensors.
//!
//! [`Foreign`] builds managed tensors the way a C producer would (one `Box` holding the header
//! and its context, a deleter that frees it), so that imports can be tested against any field
//! value, and every deleter call is counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpack_runtime::ffi::{
    self, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use dlpack_runtime::{DataType, Device};

/// Counts drops of the [`DropGuard`]s it hands out.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A guard that increments this counter when dropped.
    pub fn guard(&self) -> DropGuard {
        DropGuard(Some(self.0.clone()))
    }

    /// Drops counted so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Increments its [`Counter`] when dropped. `Default` counts nothing (for import targets).
#[derive(Debug, Default)]
pub struct DropGuard(Option<Arc<AtomicUsize>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(count) = &self.0 {
            count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Description of a foreign tensor. `storage` is the whole buffer (8-byte aligned);
/// `data_offset` is where `data` points inside it, in bytes.
#[derive(Debug, Clone)]
pub struct Foreign {
    /// Backing memory.
    pub storage: Vec<u64>,
    /// Bytes from the storage start to `data`; `None` makes `data` NULL.
    pub data_offset: Option<usize>,
    /// Element type.
    pub dtype: DataType,
    /// Device reported.
    pub device: Device,
    /// Extents; `None` makes `shape` NULL (with `ndim` from `ndim`).
    pub shape: Option<Vec<i64>>,
    /// `ndim` reported.
    pub ndim: i32,
    /// Strides in elements; `None` makes `strides` NULL.
    pub strides: Option<Vec<i64>>,
    /// `byte_offset`.
    pub byte_offset: u64,
    /// Version of a versioned tensor.
    pub version: DLPackVersion,
    /// Flags of a versioned tensor.
    pub flags: u64,
}

impl Foreign {
    /// A compact row-major tensor over `bytes` (copied into aligned storage), version 1.3, with
    /// its strides filled as DLPack 1.2+ requires.
    pub fn new(bytes: &[u8], dtype: DataType, shape: &[i64]) -> Self {
        let mut storage = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `storage` has at least `bytes.len()` bytes; u64 storage viewed as bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                storage.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        Self {
            storage,
            data_offset: Some(0),
            dtype,
            device: Device::CPU,
            shape: Some(shape.to_vec()),
            ndim: shape.len() as i32,
            strides: Some(dlpack_runtime::__testing::compact_strides(shape)),
            byte_offset: 0,
            version: DLPackVersion { major: 1, minor: 3 },
            flags: 0,
        }
    }

    /// Sets strides (elements).
    pub fn strides(mut self, strides: &[i64]) -> Self {
        self.strides = Some(strides.to_vec());
        self
    }

    /// Makes `strides` NULL.
    pub fn null_strides(mut self) -> Self {
        self.strides = None;
        self
    }

    /// Points `data` at `offset` bytes into the storage.
    pub fn data_offset(mut self, offset: usize) -> Self {
        self.data_offset = Some(offset);
        self
    }

    /// Makes `data` NULL.
    pub fn null_data(mut self) -> Self {
        self.data_offset = None;
        self
    }

    /// Sets `byte_offset`.
    pub fn byte_offset(mut self, byte_offset: u64) -> Self {
        self.byte_offset = byte_offset;
        self
    }

    /// Sets the version.
    pub fn version(mut self, major: u32, minor: u32) -> Self {
        self.version = DLPackVersion { major, minor };
        self
    }

    /// Sets the flags.
    pub fn flags(mut self, flags: u64) -> Self {
        self.flags = flags;
        self
    }

    /// Builds a `DLManagedTensorVersioned` whose deleter drops a guard of `counter`.
    pub fn versioned(self, counter: &Counter) -> *mut DLManagedTensorVersioned {
        let (version, flags) = (self.version, self.flags);
        let mut block = Box::new(VersionedBlock {
            header: DLManagedTensorVersioned {
                version,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor: empty_tensor(),
            },
            ctx: Ctx {
                foreign: self,
                _guard: counter.guard(),
            },
        });
        block.header.dl_tensor = block.ctx.tensor();
        Box::into_raw(block).cast()
    }

    /// Builds a legacy `DLManagedTensor` whose deleter drops a guard of `counter`.
    pub fn legacy(self, counter: &Counter) -> *mut DLManagedTensor {
        let mut block = Box::new(LegacyBlock {
            header: DLManagedTensor {
                dl_tensor: empty_tensor(),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            ctx: Ctx {
                foreign: self,
                _guard: counter.guard(),
            },
        });
        block.header.dl_tensor = block.ctx.tensor();
        Box::into_raw(block).cast()
    }
}

fn empty_tensor() -> DLTensor {
    DLTensor {
        data: std::ptr::null_mut(),
        device: Device::CPU.to_raw(),
        ndim: 0,
        dtype: DataType::U8.to_raw(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

struct Ctx {
    foreign: Foreign,
    _guard: DropGuard,
}

impl Ctx {
    fn tensor(&mut self) -> DLTensor {
        let f = &mut self.foreign;
        DLTensor {
            data: match f.data_offset {
                Some(offset) => f
                    .storage
                    .as_mut_ptr()
                    .cast::<u8>()
                    .wrapping_add(offset)
                    .cast(),
                None => std::ptr::null_mut(),
            },
            device: f.device.to_raw(),
            ndim: f.ndim,
            dtype: f.dtype.to_raw(),
            shape: f
                .shape
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            strides: f
                .strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: f.byte_offset,
        }
    }
}

#[repr(C)]
struct VersionedBlock {
    header: DLManagedTensorVersioned,
    ctx: Ctx,
}

#[repr(C)]
struct LegacyBlock {
    header: DLManagedTensor,
    ctx: Ctx,
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: `p` came from `Box::into_raw` of a `VersionedBlock` whose header is at offset 0;
    // the deleter contract says it is called once.
    drop(unsafe { Box::from_raw(p.cast::<VersionedBlock>()) });
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    // SAFETY: as for `delete_versioned`, for a `LegacyBlock`.
    drop(unsafe { Box::from_raw(p.cast::<LegacyBlock>()) });
}

/// One foreign buffer lent many times, as NumPy lends one array to every `__dlpack__` call:
/// each [`SharedBuffer::view`] is a managed tensor over the same memory (kept alive until the
/// buffer and every view are gone). Views reach the memory only through raw pointers derived
/// from one allocation, so Miri sees them as aliases of one another.
#[derive(Clone)]
pub struct SharedBuffer(Arc<RawWords>);

struct RawWords {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: `RawWords` owns its allocation (freed once, in `drop`); the memory is reached
// through raw pointers only, by views whose accesses the code under test orders.
unsafe impl Send for RawWords {}
// SAFETY: as above; shared access hands out raw pointers only.
unsafe impl Sync for RawWords {}

impl Drop for RawWords {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` come from `Box::into_raw` of a boxed slice (`SharedBuffer::new`),
        // freed here once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

impl SharedBuffer {
    /// A buffer of `bytes` (copied into 8-byte aligned storage).
    pub fn new(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
        // SAFETY: `words` has at least `bytes.len()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        let len = words.len();
        Self(Arc::new(RawWords {
            ptr: Box::into_raw(words).cast::<u64>(),
            len,
        }))
    }

    /// Address of the buffer's first byte.
    pub fn address(&self) -> usize {
        self.0.ptr as usize
    }

    /// Reads the `T` at byte `offset` (in bounds, aligned).
    pub fn read<T: Copy>(&self, offset: usize) -> T {
        assert!(offset + std::mem::size_of::<T>() <= self.0.len * 8);
        // SAFETY: in bounds (checked) of the live allocation; callers pass aligned offsets.
        unsafe { self.0.ptr.cast::<u8>().add(offset).cast::<T>().read() }
    }

    /// A versioned managed tensor over the buffer: `data` is the buffer's start, elements of
    /// `dtype` with `shape` and `strides` (elements) from `byte_offset`, flags `flags`. Its
    /// deleter drops a guard of `counter`.
    pub fn view(
        &self,
        dtype: DataType,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
        flags: u64,
        counter: &Counter,
    ) -> *mut DLManagedTensorVersioned {
        let mut block = Box::new(SharedViewBlock {
            header: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 3 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_shared_view),
                flags,
                dl_tensor: empty_tensor(),
            },
            buffer: self.clone(),
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            _guard: counter.guard(),
        });
        block.header.dl_tensor = DLTensor {
            data: self.0.ptr.cast(),
            device: Device::CPU.to_raw(),
            ndim: shape.len() as i32,
            dtype: dtype.to_raw(),
            shape: block.shape.as_mut_ptr(),
            strides: block.strides.as_mut_ptr(),
            byte_offset,
        };
        Box::into_raw(block).cast()
    }

    /// A float32 buffer holding 0, 1, ..., `n - 1`: the memory of the borrow tests' imports.
    pub fn counting_f32(n: usize) -> SharedBuffer {
        let values: Vec<f32> = (0..n).map(|v| v as f32).collect();
        SharedBuffer::new(&bytes_of(&values))
    }

    /// An import of the buffer's float32 elements: `shape`, `strides` in elements, from element
    /// `first`, validated as a derived consumer's import validates it.
    pub fn import_f32(
        &self,
        shape: &[i64],
        strides: &[i64],
        first: u64,
        counter: &Counter,
    ) -> dlpack_runtime::ImportedData<f32> {
        use dlpack_runtime::ImportBuffer;
        let managed = self.managed(DataType::F32, shape, strides, 4 * first, counter);
        managed.layout().expect("a valid layout");
        dlpack_runtime::ImportedData::from_managed(managed).expect("float32")
    }

    /// [`SharedBuffer::view`] taken as a [`dlpack_runtime::ManagedTensor`].
    pub fn managed(
        &self,
        dtype: DataType,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
        counter: &Counter,
    ) -> dlpack_runtime::ManagedTensor {
        let p = self.view(dtype, shape, strides, byte_offset, 0, counter);
        // SAFETY: `view` returns a valid, owned managed tensor.
        unsafe { dlpack_runtime::ManagedTensor::from_raw_versioned(p) }.expect("version 1.3")
    }
}

#[repr(C)]
struct SharedViewBlock {
    header: DLManagedTensorVersioned,
    buffer: SharedBuffer,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _guard: DropGuard,
}

unsafe extern "C" fn delete_shared_view(p: *mut DLManagedTensorVersioned) {
    // SAFETY: `p` came from `Box::into_raw` of a `SharedViewBlock` whose header is at offset 0;
    // the deleter contract says it is called once.
    drop(unsafe { Box::from_raw(p.cast::<SharedViewBlock>()) });
}

/// Bytes of a slice of plain values (native endianness).
pub fn bytes_of<T: Copy>(values: &[T]) -> Vec<u8> {
    let len = std::mem::size_of_val(values);
    // SAFETY: reading `len` bytes of initialized `Copy` values without padding (callers pass
    // primitives).
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), len) }.to_vec()
}

/// The read-only flag, for readability in tests.
pub const READ_ONLY: u64 = ffi::DLPACK_FLAG_BITMASK_READ_ONLY;

/// Cases per property test: `PROPTEST_CASES` from the environment when set (the leak check
/// under valgrind lowers it), else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Random strided layouts and the buffers that hold them, for the property tests.
pub mod strided {
    /// Element index (into the buffer) of every logical element, row-major, computed directly.
    pub fn reference_indices(shape: &[usize], strides: &[isize], first: isize) -> Vec<isize> {
        let numel: usize = shape.iter().product();
        let mut out = Vec::with_capacity(numel);
        let mut index = vec![0usize; shape.len()];
        for _ in 0..numel {
            out.push(
                first
                    + index
                        .iter()
                        .zip(strides)
                        .map(|(&i, &s)| i as isize * s)
                        .sum::<isize>(),
            );
            for axis in (0..shape.len()).rev() {
                index[axis] += 1;
                if index[axis] < shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
        out
    }

    /// A buffer that holds a layout with `slack` spare elements on each side, its values
    /// `value(i)` for buffer index `i`; the element offset of `(0, ..., 0)`; and the values of
    /// the layout's elements in row-major order.
    pub fn fixture<T: Copy>(
        shape: &[usize],
        strides: &[isize],
        slack: usize,
        value: impl Fn(i32) -> T,
    ) -> (Vec<T>, usize, Vec<T>) {
        let (mut lo, mut hi) = (0isize, 0isize);
        for (&e, &s) in shape.iter().zip(strides) {
            if e > 0 {
                let reach = (e as isize - 1) * s;
                if reach < 0 { lo += reach } else { hi += reach }
            }
        }
        let first = -lo + slack as isize;
        let len = (first + hi + 1) as usize + slack;
        let buffer: Vec<T> = (0..len as i32).map(value).collect();
        let expected: Vec<T> = if shape.contains(&0) {
            vec![]
        } else {
            reference_indices(shape, strides, first)
                .into_iter()
                .map(|i| buffer[i as usize])
                .collect()
        };
        (buffer, first as usize, expected)
    }
}

/// Derived producer and consumers shared by the interop tests.
pub mod types {
    use super::{Counter, DropGuard};
    use dlpack_runtime::{DlpackExport, DlpackImport, Element, ImportedData};

    /// A producer with strides and a byte offset, and a guard counting drops of the owner.
    #[derive(DlpackExport)]
    pub struct Tensor<T: Element> {
        /// Row-major values.
        #[dlpack(data)]
        pub data: Vec<T>,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: Vec<usize>,
        /// Strides in elements; `None`: compact row-major.
        #[dlpack(strides)]
        pub strides: Option<Vec<isize>>,
        /// Bytes to element `(0, ..., 0)`.
        #[dlpack(byte_offset)]
        pub offset: usize,
        /// Counts drops.
        pub guard: DropGuard,
    }

    /// A compact row-major tensor of `data` with `shape`, counted by `counter`.
    pub fn tensor<T: Element>(data: Vec<T>, shape: &[usize], counter: &Counter) -> Tensor<T> {
        Tensor {
            data,
            shape: shape.to_vec(),
            strides: None,
            offset: 0,
            guard: counter.guard(),
        }
    }

    /// A consumer of any strided layout.
    #[derive(DlpackImport)]
    pub struct Strided<T: Element> {
        /// The imported data.
        #[dlpack(data)]
        pub data: ImportedData<T>,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: Vec<usize>,
        /// Strides in elements.
        #[dlpack(strides)]
        pub strides: Vec<isize>,
    }

    /// A CUDA buffer described by hand: `len` `f32` at a made-up device address, for tests of
    /// what happens before any device memory is touched. Never read or written.
    pub struct FakeCuda {
        /// The made-up device address.
        pub address: usize,
        /// Elements.
        pub len: usize,
    }

    // SAFETY: the tests that use it never let the memory be read or written: without a driver
    // (or without the `cuda` feature) every export that would touch the device is refused
    // first, and consumers only check metadata.
    unsafe impl dlpack_runtime::ExportBuffer for FakeCuda {
        fn dtype(&self) -> dlpack_runtime::DataType {
            dlpack_runtime::DataType::F32
        }
        fn device(&self) -> dlpack_runtime::Device {
            dlpack_runtime::Device::cuda(0)
        }
        fn byte_len(&self) -> usize {
            self.len * 4
        }
        fn as_ptr(&self) -> *const core::ffi::c_void {
            self.address as *const core::ffi::c_void
        }
        fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
            Some(self.address as *mut core::ffi::c_void)
        }
    }

    /// A producer of a [`FakeCuda`] buffer.
    #[derive(DlpackExport)]
    pub struct CudaTensor {
        /// The buffer.
        #[dlpack(data)]
        pub data: FakeCuda,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: Vec<usize>,
        /// Counts drops.
        pub guard: DropGuard,
    }

    /// A [`CudaTensor`] of `len` elements at a made-up address, counted by `counter`.
    pub fn fake_cuda(len: usize, counter: &Counter) -> CudaTensor {
        CudaTensor {
            data: FakeCuda {
                address: 0x7f00_0000_0000,
                len,
            },
            shape: vec![len],
            guard: counter.guard(),
        }
    }

    /// A consumer that requires C-contiguous data.
    #[derive(DlpackImport)]
    pub struct Compact<T: Element> {
        /// The imported data.
        #[dlpack(data)]
        pub data: ImportedData<T>,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: Vec<usize>,
    }
}

#[cfg(feature = "cuda")]
pub mod gpu;

pub mod host_paths;

/// Whether the test command says a CUDA driver is on the library path: `Some(true)` with
/// `DLPACK_TESTS_EXPECT_DRIVER=present` (the CUDA simulator), `Some(false)` with `absent`,
/// `None` when unset. Tests whose checks depend on the driver probe assert it, so that neither
/// branch can pass by mistake.
pub fn expected_driver() -> Option<bool> {
    match std::env::var("DLPACK_TESTS_EXPECT_DRIVER").as_deref() {
        Ok("present") => Some(true),
        Ok("absent") => Some(false),
        _ => None,
    }
}

/// `#[pymethods]` giving a frozen pyclass that derives `DlpackExport` the protocol as the
/// `python` module docs write it: `__dlpack__` through `python::dlpack`, `__dlpack_device__`
/// through `python::dlpack_device` (feature `python`; the invoking crate depends on pyo3).
#[cfg(feature = "python")]
#[macro_export]
macro_rules! dlpack_pymethods {
    ($ty:ty) => {
        #[::pyo3::pymethods]
        impl $ty {
            #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
            fn __dlpack__<'py>(
                slf: &::pyo3::Bound<'py, Self>,
                stream: Option<i64>,
                max_version: Option<(u32, u32)>,
                dl_device: Option<(i32, i32)>,
                copy: Option<bool>,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'py, ::pyo3::types::PyCapsule>> {
                ::dlpack_runtime::python::dlpack(slf, stream, max_version, dl_device, copy)
            }

            fn __dlpack_device__(&self) -> (i32, i32) {
                ::dlpack_runtime::python::dlpack_device(self)
            }
        }
    };
}

/// Embedded-interpreter helpers for the Python interop tests (feature `python`).
#[cfg(feature = "python")]
pub mod py {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    /// NumPy from `.venv` (set up by `scripts/test.sh`).
    pub fn numpy(py: Python<'_>) -> Bound<'_, PyModule> {
        py.import("numpy")
            .expect("NumPy must be importable: run scripts/test.sh, which sets up .venv")
    }

    /// Imports `jax` and `jax.numpy` once for the process. The tests run on several threads: the
    /// first import runs on one while the others wait without the GIL. Imported concurrently,
    /// importlib's deadlock avoidance could hand a thread the partially initialized module.
    pub fn import_jax_once(py: Python<'_>) {
        use pyo3::sync::OnceLockExt;
        static IMPORTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        IMPORTED.get_or_init_py_attached(py, || {
            py.import("jax")
                .expect("jax must be importable: run scripts/test.sh, which sets up .venv");
            py.import("jax.numpy").expect("jax.numpy");
        });
    }

    /// Imports `torch` once for the process (see [`import_jax_once`]).
    pub fn import_torch_once(py: Python<'_>) {
        use pyo3::sync::OnceLockExt;
        static IMPORTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        IMPORTED.get_or_init_py_attached(py, || {
            py.import("torch")
                .expect("torch must be importable: run scripts/test.sh, which sets up .venv");
        });
    }

    /// Locals with `torch` and `np` (NumPy) bound, torch imported once for the process.
    pub fn with_torch(py: Python<'_>) -> Bound<'_, PyDict> {
        import_torch_once(py);
        let locals = with_numpy(py);
        locals
            .set_item("torch", py.import("torch").unwrap())
            .unwrap();
        locals.set_item("result", py.None()).unwrap();
        locals
    }

    /// Runs `code` with `locals` and returns the value it left in `result`.
    pub fn eval<'py>(
        py: Python<'py>,
        code: &str,
        locals: &Bound<'py, PyDict>,
    ) -> Bound<'py, PyAny> {
        let code = std::ffi::CString::new(code).unwrap();
        py.run(&code, None, Some(locals))
            .unwrap_or_else(|e| panic!("python failed: {e}"));
        locals
            .get_item("result")
            .unwrap()
            .expect("code sets `result`")
    }

    /// Runs `code` with `globals` as its globals (so that the functions, lambdas and classes it
    /// defines see its names) and returns the value it left in `result`.
    pub fn eval_globals<'py>(
        py: Python<'py>,
        code: &str,
        globals: &Bound<'py, PyDict>,
    ) -> Bound<'py, PyAny> {
        let code = std::ffi::CString::new(code).unwrap();
        py.run(&code, Some(globals), None)
            .unwrap_or_else(|e| panic!("python failed: {e}"));
        globals
            .get_item("result")
            .unwrap()
            .expect("code sets `result`")
    }

    /// Locals with `np` bound to NumPy.
    pub fn with_numpy(py: Python<'_>) -> Bound<'_, PyDict> {
        let locals = PyDict::new(py);
        locals.set_item("np", numpy(py)).unwrap();
        locals
    }

    /// Runs Python's garbage collector, so that unreachable arrays release their tensors.
    pub fn collect(py: Python<'_>) {
        py.import("gc").unwrap().call_method0("collect").unwrap();
    }
}
