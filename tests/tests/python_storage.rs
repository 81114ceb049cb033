//! Imported memory inside a tensor type of the user's own (feature `python`): a storage enum
//! with an owned and an imported variant, re-exported zero-copy to NumPy and on to JAX, with the
//! original producer released once, after every consumer is done.
#![cfg(feature = "python")]

use std::sync::Arc;

use dlpack_runtime::python::{self, export_once};
use dlpack_runtime::{DlpackExport, DlpackStorage, ImportedData, ManagedTensor};
use dlpack_tests::py::{collect, eval as run};
use dlpack_tests::types::Strided;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A tensor library's storage: memory it allocated, or memory it imported.
#[derive(DlpackStorage)]
enum Storage {
    Owned(Vec<f32>),
    Imported(ImportedData<f32>),
    Untyped(ManagedTensor),
}

/// A tensor library's tensor: shared storage and a layout inside it.
#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    offset: usize,
}

impl Tensor {
    /// Imports `obj` (anything with `__dlpack__`) into the library's tensor, zero-copy.
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let view: Strided<f32> = python::from_dlpack(obj)?;
        let offset = view.data.start_offset()?;
        Ok(Self {
            storage: Arc::new(Storage::Imported(view.data)),
            shape: view.shape,
            strides: view.strides,
            offset,
        })
    }
}

fn locals(py: Python<'_>) -> Bound<'_, PyDict> {
    let l = PyDict::new(py);
    run(
        py,
        "import gc, weakref, jax, jax.numpy as jnp, numpy as np\njax.config.update('jax_platforms', 'cpu')\nresult = None",
        &l,
    );
    l
}

#[test]
fn numpy_to_a_rust_storage_enum_to_numpy_and_jax_without_copies() {
    Python::attach(|py| {
        let l = locals(py);
        run(
            py,
            // 64-byte aligned float32 memory, which JAX reads without a copy.
            "buf = np.zeros(28, np.float32)\nstart = (-buf.ctypes.data % 64) // 4\na = buf[start:start + 12].reshape(3, 4)\ndel buf\na[:] = np.arange(12).reshape(3, 4)\naddress = a.ctypes.data\nreleased = []\nkeep = weakref.ref(a, lambda _, r=released: r.append(1))\nresult = a",
            &l,
        );
        let a = l.get_item("a").unwrap().unwrap();
        let t = Tensor::from_py(&a).unwrap();
        assert!(matches!(*t.storage, Storage::Imported(_)));
        drop(a);
        // Python lets go of its own name for the array: the import keeps it alive.
        run(py, "del a\ngc.collect()\nresult = None", &l);
        l.set_item("t", export_once(py, t).unwrap()).unwrap();
        let (same, values, writeable): (bool, Vec<Vec<f32>>, bool) = run(
            py,
            "b = np.from_dlpack(t)\nresult = (b.ctypes.data == address, b.tolist(), b.flags.writeable)",
            &l,
        )
        .extract()
        .unwrap();
        assert!(same, "NumPy reads the original memory: the same address");
        assert_eq!(values[2], [8.0, 9.0, 10.0, 11.0]);
        assert!(
            writeable,
            "a writable import, exported by value, stays writable"
        );
        let jax_same: bool = run(
            py,
            "c = jnp.from_dlpack(b)\nresult = c.unsafe_buffer_pointer() == address",
            &l,
        )
        .extract()
        .unwrap();
        assert!(jax_same, "JAX reads the original memory too");
        let released = || -> usize {
            collect(py);
            run(py, "result = len(released)", &l).extract().unwrap()
        };
        assert_eq!(released(), 0, "both consumers hold the original");
        run(py, "del b\nresult = None", &l);
        assert_eq!(released(), 0, "JAX still holds it");
        run(py, "del c, t\nresult = None", &l);
        assert_eq!(
            released(),
            1,
            "released once, after both consumers are done"
        );
    });
}

#[test]
fn imports_with_negative_strides_are_lent_on_with_their_layout() {
    Python::attach(|py| {
        let l = locals(py);
        // Columns reversed: strides (4, -1) elements; the lowest byte is before element (0, 0).
        let a = run(
            py,
            "a = np.arange(12.0, dtype=np.float32).reshape(3, 4)[:, ::-1]\nresult = a",
            &l,
        );
        let t = Tensor::from_py(&a).unwrap();
        assert_eq!((t.strides.as_slice(), t.offset), ([4, -1].as_slice(), 3));
        // A read-only re-export: the storage is shared with a second handle.
        let shared = Arc::new(t);
        l.set_item("t", export_once(py, Arc::clone(&shared)).unwrap())
            .unwrap();
        let (same, values, writeable): (bool, Vec<Vec<f32>>, bool) = run(
            py,
            "b = np.from_dlpack(t)\nresult = (b.ctypes.data == a.ctypes.data and b.strides == a.strides, b.tolist(), b.flags.writeable)",
            &l,
        )
        .extract()
        .unwrap();
        assert!(same, "the same memory and the same strides");
        assert_eq!(values[0], [3.0, 2.0, 1.0, 0.0]);
        assert!(!writeable, "shared storage is lent read-only");
    });
}

#[test]
fn untyped_and_owned_variants_export_as_well() {
    Python::attach(|py| {
        let l = locals(py);
        let a = run(py, "result = np.arange(6.0, dtype=np.float32)", &l);
        let managed = python::managed_from_object(&a, &Default::default()).unwrap();
        let untyped = Tensor {
            storage: Arc::new(Storage::Untyped(managed)),
            shape: vec![2, 3],
            strides: vec![3, 1],
            offset: 0,
        };
        let owned = Tensor {
            storage: Arc::new(Storage::Owned(vec![7.0; 4])),
            shape: vec![4],
            strides: vec![1],
            offset: 0,
        };
        l.set_item("u", export_once(py, untyped).unwrap()).unwrap();
        l.set_item("o", export_once(py, owned).unwrap()).unwrap();
        let (u, o): (Vec<Vec<f32>>, Vec<f32>) = run(
            py,
            "result = (np.from_dlpack(u).tolist(), np.from_dlpack(o).tolist())",
            &l,
        )
        .extract()
        .unwrap();
        assert_eq!(u, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]);
        assert_eq!(o, [7.0; 4]);
    });
}
