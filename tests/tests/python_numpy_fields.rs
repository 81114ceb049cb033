//! NumPy arrays imported from their fields (no `__dlpack__` call, for an exact `ndarray` with
//! nothing asked) arrive exactly as NumPy's own `__dlpack__` exports them: the same dtype,
//! shape, strides, data address, device and flags, for every dtype and layout the shortcut
//! takes; arrays it leaves to `__dlpack__` (read-only, byte-swapped, subclasses, many
//! dimensions, other dtypes) get NumPy's answer, export or error. The array is kept alive by the
//! import and released once.
#![cfg(feature = "python")]

use dlpack_runtime::python::{self, FromDlpackOptions};
use dlpack_runtime::{ManagedTensor, RawManagedTensor};
use dlpack_tests::py::{eval_globals, with_numpy};
use pyo3::prelude::*;
use pyo3::types::PyList;

/// What a consumer reads of a managed tensor's header.
#[derive(Debug, PartialEq)]
struct Seen {
    dtype: (u8, u8, u16),
    device: (i32, i32),
    shape: Vec<i64>,
    strides: Vec<i64>,
    first_element: usize,
    read_only: bool,
    versioned: bool,
}

fn seen(managed: &ManagedTensor) -> Seen {
    let t = managed.dl_tensor();
    let ndim = t.ndim as usize;
    let read = |p: *mut i64| {
        if ndim == 0 {
            return Vec::new();
        }
        // SAFETY: a validated header of `ndim >= 1` dimensions holds `ndim` extents and (the
        // imports here all have them) strides.
        unsafe { std::slice::from_raw_parts(p, ndim).to_vec() }
    };
    let (shape, strides) = (read(t.shape), read(t.strides));
    Seen {
        dtype: (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        device: (t.device.device_type, t.device.device_id),
        shape,
        strides,
        first_element: (t.data as usize).wrapping_add(t.byte_offset as usize),
        read_only: managed.is_read_only(),
        versioned: !managed.is_legacy(),
    }
}

/// The header's deleter and `manager_ctx`, as addresses.
fn header(managed: &ManagedTensor) -> (usize, usize) {
    match managed.as_raw() {
        // SAFETY: the header of a live managed tensor.
        RawManagedTensor::Versioned(p) => unsafe {
            let h = p.as_ref();
            (h.deleter.map_or(0, |d| d as usize), h.manager_ctx as usize)
        },
        // SAFETY: as above.
        RawManagedTensor::Legacy(p) => unsafe {
            let h = p.as_ref();
            (h.deleter.map_or(0, |d| d as usize), h.manager_ctx as usize)
        },
    }
}

fn deleter(managed: &ManagedTensor) -> usize {
    header(managed).0
}

fn manager_ctx(managed: &ManagedTensor) -> usize {
    header(managed).1
}

/// NumPy's own export of `x` (a versioned capsule), consumed.
fn numpys_export(x: &Bound<'_, PyAny>) -> PyResult<ManagedTensor> {
    let capsule = x.call_method(
        "__dlpack__",
        (),
        Some(&{
            let kwargs = pyo3::types::PyDict::new(x.py());
            kwargs.set_item("max_version", (1, 0)).unwrap();
            kwargs
        }),
    )?;
    python::consume_capsule(&capsule)
}

const ARRAYS: &str = r#"
dtypes = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "intc", "uintc", "long",
          "ulong", "longlong", "ulonglong"]
base = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
layouts = [
    lambda a: a,
    lambda a: a[:, 1:, ::2],
    lambda a: a[::-1, :, ::-3],
    lambda a: a.transpose(3, 1, 0, 2),
    lambda a: a[0, 0, 0, 0, ...],
    lambda a: a[:, :0],
    lambda a: a[:, :, :, None],
    lambda a: np.broadcast_to(a[:1], (4, 3, 4, 5)).copy()[..., ::2],
    lambda a: a.reshape(-1)[::7],
    lambda a: np.zeros((1,) * 8, a.dtype),
]
result = [layout(base.astype(dtype)) for dtype in dtypes for layout in layouts]
"#;

#[test]
fn every_dtype_and_layout_arrives_as_numpys_export() {
    Python::attach(|py| {
        let globals = with_numpy(py);
        let arrays = eval_globals(py, ARRAYS, &globals);
        let arrays = arrays.cast::<PyList>().unwrap();
        assert_eq!(arrays.len(), 20 * 10);
        for x in arrays.iter() {
            let ours = python::managed_from_object(&x, &FromDlpackOptions::default())
                .unwrap_or_else(|e| panic!("{x:?}: {e}"));
            let theirs = numpys_export(&x).unwrap();
            // Read from the fields: another deleter than NumPy's, the array as `manager_ctx`.
            assert_ne!(deleter(&ours), deleter(&theirs));
            assert_eq!(manager_ctx(&ours), x.as_ptr() as usize);
            let (ours, theirs) = (seen(&ours), seen(&theirs));
            assert_eq!(ours, theirs, "{}", x.repr().unwrap());
            assert!(!ours.read_only);
        }
    });
}

#[test]
fn arrays_left_to_dunder_get_numpys_answer() {
    Python::attach(|py| {
        let globals = with_numpy(py);
        let code = r#"
ro = np.arange(6.0); ro.flags.writeable = False
class Sub(np.ndarray):
    pass
result = {
    "read-only": ro,
    "byte-swapped": np.arange(6, dtype=">f8" if np.little_endian else "<f8"),
    "subclass": np.arange(6.0).view(Sub),
    "nine dimensions": np.zeros((1,) * 9),
    "longdouble": np.zeros(3, np.longdouble),
    "datetime": np.zeros(3, "datetime64[s]"),
    "unaligned-view strides": np.ndarray((3,), dtype=np.int32, buffer=np.zeros(16, np.uint8), offset=1, strides=(5,)),
}
"#;
        let cases = eval_globals(py, code, &globals);
        for (name, x) in cases
            .cast::<pyo3::types::PyDict>()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.to_string(), v))
        {
            let ours = python::managed_from_object(&x, &FromDlpackOptions::default());
            let theirs = numpys_export(&x);
            match (ours, theirs) {
                (Ok(ours), Ok(theirs)) => assert_eq!(seen(&ours), seen(&theirs), "{name}"),
                (Err(ours), Err(theirs)) => {
                    assert_eq!(
                        ours.get_type(py).name().unwrap().to_string(),
                        theirs.get_type(py).name().unwrap().to_string(),
                        "{name}: {ours} / {theirs}"
                    );
                }
                (ours, theirs) => panic!(
                    "{name}: ours {:?}, NumPy's {:?}",
                    ours.map(|m| seen(&m)),
                    theirs.map(|m| seen(&m))
                ),
            }
        }
    });
}

#[test]
fn the_import_keeps_the_array_and_releases_it_once_on_any_thread() {
    let (managed, weak) = Python::attach(|py| {
        let globals = with_numpy(py);
        let code = "import weakref\nx = np.arange(5.0)\nw = weakref.ref(x)\nresult = x";
        let x = eval_globals(py, code, &globals);
        let weak = globals.get_item("w").unwrap().unwrap().unbind();
        // SAFETY: a live object, attached.
        let refcnt = |x: &Bound<'_, PyAny>| unsafe { pyo3::ffi::Py_REFCNT(x.as_ptr()) };
        let before = refcnt(&x);
        let managed = python::managed_from_object(&x, &FromDlpackOptions::default()).unwrap();
        assert_eq!(refcnt(&x), before + 1, "the import holds the array");
        drop(x);
        for name in ["x", "result"] {
            globals.del_item(name).unwrap();
        }
        assert!(
            !weak.bind(py).call0().unwrap().is_none(),
            "kept by the import"
        );
        let t = managed.dl_tensor();
        // SAFETY: 5 float64 elements, contiguous, kept alive by `managed`.
        let values = unsafe { std::slice::from_raw_parts(t.data.cast::<f64>(), 5) };
        assert_eq!(values, [0.0, 1.0, 2.0, 3.0, 4.0]);
        (managed, weak)
    });
    // Dropped on a thread that is not attached: the deleter attaches to release the array.
    std::thread::spawn(move || drop(managed)).join().unwrap();
    Python::attach(|py| {
        assert!(
            weak.bind(py).call0().unwrap().is_none(),
            "the array is freed once the import is dropped"
        );
    });
}

/// Layouts whose byte span does not fit in `isize` (made with `as_strided`, which NumPy does
/// not check) are not built from the fields: they go through `__dlpack__` (NumPy's deleter),
/// and validation then refuses them, as it refuses any producer's. A span that fits, made the
/// same way, is still read from the fields, already validated.
#[test]
fn spans_that_do_not_fit_are_left_to_dunder_and_refused() {
    Python::attach(|py| {
        let globals = with_numpy(py);
        let code = r#"
from numpy.lib.stride_tricks import as_strided
b = np.zeros(4)
result = [
    as_strided(b, shape=(4,), strides=(2**62,)),
    as_strided(b, shape=(4,), strides=(-2**62,)),
    as_strided(b, shape=(4, 4), strides=(2**61, 2**61)),
    as_strided(b, shape=(2,), strides=(2**62,)),
]
"#;
        let arrays = eval_globals(py, code, &globals);
        let arrays: Vec<_> = arrays.cast::<PyList>().unwrap().iter().collect();
        let fields_deleter = {
            let x = eval_globals(py, "result = np.zeros(2)", &globals);
            let m = python::managed_from_object(&x, &FromDlpackOptions::default()).unwrap();
            assert!(m.is_validated());
            deleter(&m)
        };
        for x in &arrays[..3] {
            let ours = python::managed_from_object(x, &FromDlpackOptions::default())
                .unwrap_or_else(|e| panic!("{x:?}: {e}"));
            assert_ne!(
                deleter(&ours),
                fields_deleter,
                "{x:?}: read from the fields"
            );
            let refused = ours.layout().expect_err("a span beyond isize");
            assert!(
                matches!(refused, dlpack_runtime::LayoutError::Overflow { .. }),
                "{x:?}: {refused}"
            );
        }
        // (2 - 1) * 2^62 bytes + 8 fits in `isize` and the address space from a heap address.
        let fits = python::managed_from_object(&arrays[3], &FromDlpackOptions::default()).unwrap();
        assert_eq!(deleter(&fits), fields_deleter);
        assert!(fits.is_validated());
        assert_eq!(seen(&fits), seen(&numpys_export(&arrays[3]).unwrap()));
    });
}
