//! Real candle tensors exchanged with NumPy: a candle view lent zero-copy, and NumPy arrays
//! (strided ones included) copied into candle tensors, computed on, and lent back.
//!
//! Run with:
//!
//! ```text
//! source scripts/env.sh && cargo run -p dlpack-examples --example candle --features python,candle
//! ```

use candle_core::{Device, IndexOp, Tensor};
use dlpack_runtime::candle::{CandleTensor, tensor_from_py};
use dlpack_runtime::python::export_once;
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    Python::attach(|py| -> Result<(), Box<dyn std::error::Error>> {
        let np = py.import("numpy")?;
        let locals = PyDict::new(py);
        locals.set_item("np", &np)?;

        // candle to NumPy: a narrowed, transposed view (start offset 5 elements, strides
        // (1, 4)) is lent as it is; NumPy reads candle's storage in place, read-only.
        let m = Tensor::arange(0f32, 12.0, &Device::Cpu)?.reshape((3, 4))?;
        let v = m.i((1..3, 1..4))?.t()?;
        locals.set_item("v", export_once(py, CandleTensor::new(&v)?)?)?;
        py.run(c"a = np.from_dlpack(v)", None, Some(&locals))?;
        let a = locals.get_item("a")?.expect("set above");
        println!("candle view {:?} in NumPy: {}", v.dims(), a.str()?);
        let values: Vec<Vec<f32>> = a.call_method0("tolist")?.extract()?;
        assert_eq!(values, v.to_vec2::<f32>()?);
        assert!(
            !a.getattr("flags")?
                .getattr("writeable")?
                .extract::<bool>()?
        );

        // NumPy to candle: any layout (here every other row, columns reversed) is copied into
        // new candle storage in row-major order, then candle computes on it.
        let strided = np
            .call_method1("arange", (24.0f32,))?
            .call_method1("reshape", ((6, 4),))?
            .get_item((
                pyo3::types::PySlice::new(py, 0, 6, 2),
                pyo3::types::PySlice::new(py, 3, -5, -1),
            ))?;
        let c = tensor_from_py(&strided)?;
        println!("NumPy {} in candle: {c}", strided.str()?);
        let summed = c.sum_keepdim(1)?;

        // ... and back to NumPy, zero-copy.
        locals.set_item("s", export_once(py, CandleTensor::new(&summed)?)?)?;
        py.run(c"b = np.from_dlpack(s)", None, Some(&locals))?;
        let b: Vec<Vec<f32>> = locals
            .get_item("b")?
            .expect("set above")
            .call_method0("tolist")?
            .extract()?;
        println!("row sums from candle in NumPy: {b:?}");
        assert_eq!(b, [[6.0], [38.0], [70.0]]);
        Ok(())
    })
}
