//! A candle-style tensor exchanged zero-copy with NumPy, in both directions.
//!
//! The tensor type is shaped like candle's: an `Arc`-shared storage enum over element types
//! (CPU buffers here; a `Cuda(CudaStorage)` variant joins it with the `cuda` feature, as its
//! buffer reports a CUDA device), a layout with shape, stride and start offset, a device and a
//! dtype. Views (`narrow`, `t`) share the storage and change only the layout, as in candle.
//!
//! candle keeps shape, stride and start offset together in a `Layout` struct. The derive reads
//! roles from the struct's own fields, so here those three are fields of the tensor itself; a
//! `layout()` method gives them back as one value for code that wants it.
//!
//! Run with:
//!
//! ```text
//! source scripts/env.sh && cargo run -p dlpack-examples --example candle_style --features python
//! ```

use std::sync::Arc;

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{
    Device, DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage, ImportedData,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// candle's `CpuStorage`: one buffer per element type.
#[derive(DlpackStorage)]
enum CpuStorage {
    U8(Vec<u8>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// candle's `Storage`: where the buffer lives. With CUDA, a second variant holds the device
/// buffer (`Cuda(CudaStorage)`); `#[derive(DlpackStorage)]` takes it as it is.
#[derive(DlpackStorage)]
enum Storage {
    Cpu(CpuStorage),
}

/// candle's `DType`, kept by the tensor for its own use; DLPack reads the dtype from the storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DType {
    U8,
    I64,
    F32,
    F64,
}

/// A candle-style tensor: a producer, zero-copy.
#[derive(DlpackExport)]
struct Tensor {
    /// Shared by every view of the same data.
    #[dlpack(data)]
    storage: Arc<Storage>,
    /// Layout: extents in elements.
    #[dlpack(shape)]
    shape: Vec<usize>,
    /// Layout: strides in elements.
    #[dlpack(strides)]
    stride: Vec<isize>,
    /// Layout: the first element's index in the storage, in elements.
    #[dlpack(offset)]
    start_offset: usize,
    #[dlpack(device)]
    device: Device,
    dtype: DType,
}

/// candle's `Layout`, rebuilt from the tensor's fields.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    shape: Vec<usize>,
    stride: Vec<isize>,
    start_offset: usize,
}

impl Tensor {
    /// A compact row-major tensor over `storage`.
    fn new(storage: CpuStorage, shape: &[usize]) -> Self {
        let dtype = match &storage {
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
        };
        let mut stride = vec![1isize; shape.len()];
        for axis in (0..shape.len().saturating_sub(1)).rev() {
            stride[axis] = stride[axis + 1] * shape[axis + 1] as isize;
        }
        Tensor {
            storage: Arc::new(Storage::Cpu(storage)),
            shape: shape.to_vec(),
            stride,
            start_offset: 0,
            device: Device::CPU,
            dtype,
        }
    }

    fn layout(&self) -> Layout {
        Layout {
            shape: self.shape.clone(),
            stride: self.stride.clone(),
            start_offset: self.start_offset,
        }
    }

    /// `len` indices of axis `dim` from `start`: a view sharing the storage.
    fn narrow(&self, dim: usize, start: usize, len: usize) -> Tensor {
        assert!(start + len <= self.shape[dim], "narrow out of range");
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Tensor {
            storage: self.storage.clone(),
            shape,
            stride: self.stride.clone(),
            start_offset: self.start_offset + start * self.stride[dim] as usize,
            device: self.device,
            dtype: self.dtype,
        }
    }

    /// The transpose of a matrix: a view sharing the storage.
    fn t(&self) -> Tensor {
        assert_eq!(self.shape.len(), 2, "t() needs a matrix");
        Tensor {
            storage: self.storage.clone(),
            shape: vec![self.shape[1], self.shape[0]],
            stride: vec![self.stride[1], self.stride[0]],
            start_offset: self.start_offset,
            device: self.device,
            dtype: self.dtype,
        }
    }

    /// Address of the first element of the view, for showing zero-copy.
    fn first_element_address(&self) -> usize {
        let Storage::Cpu(cpu) = &*self.storage;
        let (base, size) = match cpu {
            CpuStorage::U8(v) => (v.as_ptr() as usize, 1),
            CpuStorage::I64(v) => (v.as_ptr() as usize, 8),
            CpuStorage::F32(v) => (v.as_ptr() as usize, 4),
            CpuStorage::F64(v) => (v.as_ptr() as usize, 8),
        };
        base + self.start_offset * size
    }
}

/// The consumer's side of the storage: imported host buffers, chosen by the tensor's dtype.
#[derive(DlpackImportStorage, Debug)]
enum HostData {
    U8(ImportedData<u8>),
    I64(ImportedData<i64>),
    F32(ImportedData<f32>),
    F64(ImportedData<f64>),
}

/// A zero-copy view of any host tensor NumPy (or anything speaking DLPack) lends.
#[derive(DlpackImport, Debug)]
#[dlpack(device = "cpu")]
struct TensorView {
    #[dlpack(data)]
    data: HostData,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    stride: Vec<isize>,
    #[dlpack(device)]
    device: Device,
}

impl TensorView {
    /// Copies the view into a new compact tensor, as `Tensor::from_slice` would in candle.
    fn to_tensor(&self) -> Result<Tensor, Box<dyn std::error::Error>> {
        let storage = match &self.data {
            HostData::U8(d) => CpuStorage::U8(d.to_vec()?),
            HostData::I64(d) => CpuStorage::I64(d.to_vec()?),
            HostData::F32(d) => CpuStorage::F32(d.to_vec()?),
            HostData::F64(d) => CpuStorage::F64(d.to_vec()?),
        };
        Ok(Tensor::new(storage, &self.shape))
    }

    /// Address of the first element, for showing zero-copy.
    fn first_element_address(&self) -> usize {
        match &self.data {
            HostData::U8(d) => d.as_ptr() as usize,
            HostData::I64(d) => d.as_ptr() as usize,
            HostData::F32(d) => d.as_ptr() as usize,
            HostData::F64(d) => d.as_ptr() as usize,
        }
    }
}

fn numpy_address(array: &Bound<'_, PyAny>) -> PyResult<usize> {
    array.getattr("ctypes")?.getattr("data")?.extract()
}

fn run(py: Python<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let np = py.import("numpy")?;
    println!("numpy {}", np.getattr("__version__")?);

    // 1. Rust -> NumPy: a narrowed, transposed view of shared storage, zero-copy.
    let m = Tensor::new(
        CpuStorage::F32((0..12).map(|v| v as f32).collect()),
        &[3, 4],
    );
    let view = m.narrow(1, 1, 2).t();
    println!("\n1. m = arange(12) as 3x4 f32; view = m.narrow(1, 1, 2).t()");
    println!("   view layout: {:?}", view.layout());
    assert_eq!(
        view.layout(),
        Layout {
            shape: vec![2, 3],
            stride: vec![1, 4],
            start_offset: 1
        }
    );
    let rust_address = view.first_element_address();
    let array = np.call_method1("from_dlpack", (export_once(py, view)?,))?;
    println!("   np.from_dlpack(view):\n{}", array.repr()?);
    println!(
        "   dtype={} shape={} strides={} (bytes) writeable={}",
        array.getattr("dtype")?,
        array.getattr("shape")?,
        array.getattr("strides")?,
        array.getattr("flags")?.getattr("writeable")?
    );
    let values: Vec<Vec<f32>> = array.call_method0("tolist")?.extract()?;
    assert_eq!(values, [[1.0, 5.0, 9.0], [2.0, 6.0, 10.0]]);
    let strides: (isize, isize) = array.getattr("strides")?.extract()?;
    assert_eq!(strides, (4, 16));
    assert_eq!(numpy_address(&array)?, rust_address, "same memory");
    // `m` still shares the storage, so the export is read-only.
    let writeable: bool = array.getattr("flags")?.getattr("writeable")?.extract()?;
    assert!(!writeable);
    println!("   same memory as the Rust storage: true; read-only, as `m` shares it");

    // 2. A tensor that owns its storage alone is exported writable: NumPy writes into it.
    let owned = Tensor::new(CpuStorage::I64(vec![10, 20, 30, 40, 50, 60]), &[2, 3]);
    let owned_address = owned.first_element_address();
    let array = np.call_method1("from_dlpack", (export_once(py, owned)?,))?;
    array.set_item((1, 1), -50)?;
    println!("\n2. a unique i64 tensor exported by value; NumPy writes a[1, 1] = -50:");
    println!("{}", array.repr()?);

    // ... and Rust reads NumPy's write back through the same memory.
    let back: TensorView = python::from_dlpack(&array)?;
    println!(
        "   back in Rust: {}, shape={:?} stride={:?} on {}",
        match &back.data {
            HostData::I64(_) => "HostData::I64",
            _ => "another variant",
        },
        back.shape,
        back.stride,
        back.device
    );
    let HostData::I64(data) = &back.data else {
        return Err("an int64 array imports as HostData::I64".into());
    };
    assert_eq!(data.to_vec()?, [10, 20, 30, 40, -50, 60]);
    assert_eq!(back.first_element_address(), owned_address, "same memory");
    println!(
        "   values {:?}: NumPy's write, in the original Rust buffer",
        data.to_vec()?
    );

    // 3. NumPy -> Rust: a strided float64 slice, read in place, then copied into a Tensor.
    let locals = PyDict::new(py);
    locals.set_item("np", &np)?;
    let sliced = py.eval(
        c"np.arange(12.0).reshape(3, 4)[1:, ::-2]",
        None,
        Some(&locals),
    )?;
    let view: TensorView = python::from_dlpack(&sliced)?;
    println!("\n3. np.arange(12.0).reshape(3, 4)[1:, ::-2] -> Rust TensorView:");
    println!(
        "   variant F64: {}, shape={:?} stride={:?} (elements)",
        matches!(view.data, HostData::F64(_)),
        view.shape,
        view.stride
    );
    assert_eq!(view.shape, [2, 2]);
    assert_eq!(view.stride, [4, -2]);
    assert_eq!(view.first_element_address(), numpy_address(&sliced)?);
    let tensor = view.to_tensor()?;
    let HostData::F64(data) = &view.data else {
        return Err("a float64 array imports as HostData::F64".into());
    };
    println!("   read in place: {:?}", data.to_vec()?);
    assert_eq!(data.to_vec()?, [7.0, 5.0, 11.0, 9.0]);
    println!(
        "   copied into a Tensor: dtype={:?} layout={:?}",
        tensor.dtype,
        tensor.layout()
    );
    assert_eq!(tensor.dtype, DType::F64);
    assert_eq!(tensor.stride, [2, 1]);

    // The copy round-trips to NumPy with the same values.
    let again = np.call_method1("from_dlpack", (export_once(py, tensor)?,))?;
    let values: Vec<Vec<f64>> = again.call_method0("tolist")?.extract()?;
    assert_eq!(values, [[7.0, 5.0], [11.0, 9.0]]);
    println!("   and back to NumPy: {}", again.repr()?);

    // 4. A dtype the storage has no variant for is refused with a typed error.
    let halves = py.eval(c"np.ones(3, dtype=np.float16)", None, Some(&locals))?;
    match python::from_dlpack::<TensorView>(&halves) {
        Ok(_) => return Err("float16 has no HostData variant".into()),
        Err(err) => {
            let message = err.value(py).to_string();
            println!(
                "\n4. float16 refused: {}: {message}",
                err.get_type(py).name()?
            );
            assert!(message.starts_with("no variant of `HostData` accepts the tensor"));
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    Python::attach(run)
}
