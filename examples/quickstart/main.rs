//! Quick start: a tensor type of your own, exchanged zero-copy with NumPy in both directions.
//!
//! Run with `./scripts/quickstart.sh` (it creates `.venv` with NumPy and sets up pyo3).

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Our own tensor type: a row-major buffer and a 2-d shape. The derive makes it a producer.
#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 2],
}

/// A consumer of any strided float32 tensor.
#[derive(DlpackImport)]
struct MatrixView {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// A consumer that only accepts C-contiguous float64 data (no strides field).
#[derive(DlpackImport)]
struct Contiguous {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A consumer of any strided float64 tensor.
#[derive(DlpackImport)]
struct Strided {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

fn run(py: Python<'_>) -> PyResult<()> {
    let np = py.import("numpy")?;
    println!("numpy {}", np.getattr("__version__")?);

    // 1. Rust -> NumPy, zero-copy.
    let matrix = Matrix {
        values: (0..6).map(|v| v as f32).collect(),
        shape: [2, 3],
    };
    let rust_address = matrix.values.as_ptr() as usize;
    let array = np.call_method1("from_dlpack", (export_once(py, matrix)?,))?;
    let numpy_address: usize = array.getattr("ctypes")?.getattr("data")?.extract()?;
    println!("\n1. np.from_dlpack(Matrix):\n{}", array.repr()?);
    println!(
        "   dtype={} shape={} strides={} (bytes)",
        array.getattr("dtype")?,
        array.getattr("shape")?,
        array.getattr("strides")?
    );
    println!(
        "   Rust buffer at {rust_address:#x}, NumPy data at {numpy_address:#x}: same memory = {}",
        rust_address == numpy_address
    );
    assert_eq!(rust_address, numpy_address);

    // 2. NumPy writes into the Rust buffer; Rust sees the write through the same memory.
    array.set_item((1, 2), 42.0)?;
    let view: MatrixView = python::from_dlpack(&array)?;
    println!("\n2. after `array[1, 2] = 42` in NumPy, imported back into Rust:");
    println!(
        "   shape={:?} strides={:?} (elements)",
        view.shape, view.strides
    );
    println!(
        "   view[1, 2] = {}, data at {:#x} (the original Rust buffer)",
        view.data.get(&[1, 2]).unwrap(),
        view.data.as_ptr() as usize
    );
    assert_eq!(view.data.get(&[1, 2]).unwrap(), 42.0);
    assert_eq!(view.data.as_ptr() as usize, rust_address);

    // 3. NumPy -> Rust, zero-copy, contiguous and strided.
    let locals = PyDict::new(py);
    locals.set_item("np", &np)?;
    let contiguous = py.eval(c"np.arange(6.0).reshape(2, 3)", None, Some(&locals))?;
    let c: Contiguous = python::from_dlpack(&contiguous)?;
    println!(
        "\n3. np.arange(6.0).reshape(2, 3) -> Rust: shape={:?} values={:?}",
        c.shape,
        c.data.as_slice().unwrap()
    );

    let sliced = py.eval(
        c"np.arange(12.0).reshape(3, 4)[:, ::-2]",
        None,
        Some(&locals),
    )?;
    let s: Strided = python::from_dlpack(&sliced)?;
    let sliced_address: usize = sliced.getattr("ctypes")?.getattr("data")?.extract()?;
    println!(
        "   np.arange(12.0).reshape(3, 4)[:, ::-2] -> Rust: shape={:?} strides={:?} (elements)",
        s.shape, s.strides
    );
    println!("   values read in place: {:?}", s.data.to_vec().unwrap());
    println!(
        "   NumPy says:           {}",
        sliced.call_method0("tolist")?
    );
    println!(
        "   same memory = {}",
        s.data.as_ptr() as usize == sliced_address
    );
    assert_eq!(s.data.to_vec().unwrap(), [3.0, 1.0, 7.0, 5.0, 11.0, 9.0]);

    // 4. A consumer that needs contiguous data refuses the slice with a typed error.
    match python::from_dlpack::<Contiguous>(&sliced) {
        Ok(_) => unreachable!("the slice is not contiguous"),
        Err(err) => println!(
            "\n4. Contiguous refuses the slice: {}: {}",
            err.get_type(py).name()?,
            err.value(py)
        ),
    }
    Ok(())
}

fn main() -> PyResult<()> {
    Python::attach(run)
}
