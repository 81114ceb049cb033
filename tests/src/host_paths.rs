//! The host-path matrix: every way host tensors are exported, imported, copied and dropped,
//! run by tests that prove those paths leave the CUDA driver alone when the crate is built
//! with feature `cuda` (as any crate that also has GPU tensors builds it). Each case checks its
//! own result, so a case that stopped doing its work would not pass for one that touched no
//! driver. Nothing here names a CUDA device or stream.

use std::sync::Arc;

use dlpack_runtime::{
    DataType, Device, DeviceType, DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage,
    ExportError, ExportRequest, ImportedData, ManagedTensor,
};

use crate::types::{Strided, Tensor, tensor};
use crate::{Counter, DropGuard, Foreign, bytes_of};

/// A consumer that requires C-contiguous data.
#[derive(DlpackImport)]
struct Compact<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// Storage of several element types (the derive's `DlpackStorage`).
#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// A producer over shared storage: exported read-only while the `Arc` is shared.
#[derive(DlpackExport)]
struct Stored {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

/// The consumer's side of [`Storage`] (the derive's `DlpackImportStorage`).
#[derive(DlpackImportStorage)]
enum Imported {
    F32(ImportedData<f32>),
    I64(ImportedData<i64>),
}

/// A consumer over [`Imported`].
#[derive(DlpackImport)]
struct StoredView {
    #[dlpack(data)]
    data: Imported,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A wrapper that exports what it wraps (`#[dlpack(transparent)]`).
#[derive(DlpackExport)]
#[dlpack(transparent)]
struct Wrapper(Tensor<f64>);

/// A producer marked read-only, with a dtype and a device field.
#[derive(DlpackExport)]
#[dlpack(readonly)]
struct Frozen {
    #[dlpack(data)]
    bytes: Vec<u8>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(dtype)]
    dtype: DataType,
    #[dlpack(device)]
    device: Device,
    _guard: DropGuard,
}

/// A consumer that lends its import on: its data is exported again (a relay).
#[derive(DlpackImport, DlpackExport)]
struct Relay {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn counted(n: usize, counter: &Counter) -> Tensor<f32> {
    tensor((0..n).map(|i| i as f32).collect(), &[n], counter)
}

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// Drops `value` on a thread of its own, as a consumer's thread would.
fn drop_elsewhere<T: Send + 'static>(value: T) {
    std::thread::spawn(move || drop(value)).join().unwrap();
}

/// Runs every Rust case of the matrix; returns how many ran.
pub fn rust_matrix() -> usize {
    let cases: &[(&str, fn())] = &[
        ("versioned export, import, drop", versioned_round_trip),
        ("legacy export, import, drop", legacy_round_trip),
        ("copy=True, versioned and legacy", copies),
        ("dl_device=cpu:0", dl_device_cpu),
        ("read-only export to a legacy consumer", read_only_legacy),
        ("strided copy, zero-size export", strided_and_empty),
        ("refused exports and requests", refusals),
        #[cfg(feature = "cuda")]
        ("ready events of a host export", ready_events),
        ("drops on other threads", drops_on_other_threads),
        ("lent on (a relay)", relay),
        (
            "derived storage enums, transparent, read-only",
            derived_types,
        ),
        ("foreign tensors, versioned and legacy", foreign),
        ("ndarray arrays", ndarray_arrays),
        ("managed tensors lent as buffers", managed_as_buffer),
        #[cfg(feature = "candle")]
        ("candle tensors both ways", candle_tensors),
    ];
    for &(name, case) in cases {
        let outcome = std::panic::catch_unwind(case);
        assert!(outcome.is_ok(), "host-path case `{name}` failed");
    }
    cases.len()
}

fn versioned_round_trip() {
    let counter = Counter::new();
    let managed = counted(6, &counter).into_dlpack().unwrap();
    assert!(!managed.is_legacy());
    let view = Compact::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.shape, [6]);
    assert_eq!(view.data.as_slice().unwrap(), values(6));
    drop(view);
    assert_eq!(counter.get(), 1);
    let view = Compact::<f32>::from_dlpack(counted(3, &counter)).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), values(3));
    drop(view);
    assert_eq!(counter.get(), 2);
}

fn legacy_round_trip() {
    let counter = Counter::new();
    let managed = counted(4, &counter)
        .into_dlpack_with(&ExportRequest::new())
        .unwrap();
    assert!(managed.is_legacy());
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.strides, [1]);
    assert_eq!(view.data.to_vec().unwrap(), values(4));
    drop(view);
    assert_eq!(counter.get(), 1);
}

fn copies() {
    let counter = Counter::new();
    for request in [
        ExportRequest::versioned().copy(Some(true)),
        ExportRequest::new().copy(Some(true)),
    ] {
        let managed = counted(5, &counter).into_dlpack_with(&request).unwrap();
        assert!(managed.is_copied() || managed.is_legacy());
        let view = Compact::<f32>::from_managed(managed).unwrap();
        assert_eq!(view.data.to_vec().unwrap(), values(5));
    }
    assert_eq!(counter.get(), 2, "the sources are dropped once copied");
}

fn dl_device_cpu() {
    let counter = Counter::new();
    for copy in [None, Some(false), Some(true)] {
        let request = ExportRequest::versioned().dl_device(Device::CPU).copy(copy);
        let managed = counted(2, &counter).into_dlpack_with(&request).unwrap();
        assert_eq!(managed.is_copied(), copy == Some(true));
        drop(managed);
    }
    assert_eq!(counter.get(), 3);
}

fn read_only_legacy() {
    let counter = Counter::new();
    let shared = Arc::new(counted(3, &counter));
    let managed = shared.clone().into_dlpack().unwrap();
    assert!(managed.is_read_only());
    drop(managed);
    let legacy = shared
        .clone()
        .into_dlpack_with(&ExportRequest::new())
        .unwrap();
    assert!(legacy.is_legacy(), "a legacy copy of read-only data");
    let view = Compact::<f32>::from_managed(legacy).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), values(3));
    drop(view);
    assert_eq!(
        shared
            .clone()
            .into_dlpack_with(&ExportRequest::new().copy(Some(false)))
            .unwrap_err(),
        ExportError::ReadOnlyLegacy
    );
    drop(shared);
    assert_eq!(counter.get(), 1);
}

fn strided_and_empty() {
    let counter = Counter::new();
    // Every other element of 2 x 3 x 2 f32, transposed: a strided host copy.
    let t = Tensor {
        data: (0..24).map(|i| i as f32).collect(),
        shape: vec![3, 2],
        strides: Some(vec![2, 12]),
        offset: 0,
        guard: counter.guard(),
    };
    let copied = t
        .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
        .unwrap();
    let view = Compact::<f32>::from_managed(copied).unwrap();
    assert_eq!(
        view.data.to_vec().unwrap(),
        [0.0, 12.0, 2.0, 14.0, 4.0, 16.0]
    );
    drop(view);
    let empty = tensor(Vec::<f32>::new(), &[0, 3], &counter);
    let view = Compact::<f32>::from_managed(empty.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.shape, [0, 3]);
    drop(view);
    assert_eq!(counter.get(), 2);
}

fn refusals() {
    let counter = Counter::new();
    // A layout beyond the buffer: the owner is dropped by the export's own cleanup.
    let t = Tensor {
        data: vec![0.0f32; 4],
        shape: vec![5],
        strides: None,
        offset: 0,
        guard: counter.guard(),
    };
    assert!(t.into_dlpack().is_err());
    // A stream for host memory other than None, a device no copy reaches (ROCm), and a CUDA
    // device with copy=False: all refused before the driver is asked (with copy=None a CUDA
    // device is a copy with the driver, tests/tests/cuda_multi_device.rs).
    assert!(
        counted(2, &counter)
            .into_dlpack_with(&ExportRequest::versioned().stream(Some(1)))
            .is_err()
    );
    assert!(
        counted(2, &counter)
            .into_dlpack_with(
                &ExportRequest::versioned().dl_device(Device::new(DeviceType::Rocm, 0))
            )
            .is_err()
    );
    assert!(
        counted(2, &counter)
            .into_dlpack_with(
                &ExportRequest::versioned()
                    .dl_device(Device::cuda(0))
                    .copy(Some(false))
            )
            .is_err()
    );
    // A consumer that refuses the tensor gives it back to its deleter.
    let managed = tensor(vec![1i64, 2], &[2], &counter).into_dlpack().unwrap();
    assert!(Compact::<f32>::from_managed(managed).is_err());
    assert_eq!(counter.get(), 5);
}

#[cfg(feature = "cuda")]
fn ready_events() {
    let counter = Counter::new();
    let (managed, events) = counted(3, &counter)
        .into_dlpack_with_ready_events(&ExportRequest::versioned())
        .unwrap();
    assert!(
        events.is_empty(),
        "host memory has nothing to be ready after"
    );
    assert!(managed.ready_events().is_none());
    drop(events);
    drop(managed);
    assert_eq!(counter.get(), 1);
}

fn drops_on_other_threads() {
    let counter = Counter::new();
    drop_elsewhere(counted(3, &counter).into_dlpack().unwrap());
    drop_elsewhere(
        counted(3, &counter)
            .into_dlpack_with(&ExportRequest::new())
            .unwrap(),
    );
    drop_elsewhere(Compact::<f32>::from_dlpack(counted(3, &counter)).unwrap());
    let copied = counted(3, &counter)
        .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
        .unwrap();
    drop_elsewhere(copied);
    // Exported on another thread, dropped here.
    let c = counter.clone();
    let managed = std::thread::spawn(move || counted(3, &c).into_dlpack().unwrap())
        .join()
        .unwrap();
    drop(managed);
    assert_eq!(counter.get(), 5);
}

fn relay() {
    let counter = Counter::new();
    for request in [
        ExportRequest::versioned(),
        ExportRequest::new(),
        ExportRequest::versioned().copy(Some(true)),
    ] {
        let imported = Relay::from_dlpack(counted(4, &counter)).unwrap();
        let managed = imported.into_dlpack_with(&request).unwrap();
        let view = Compact::<f32>::from_managed(managed).unwrap();
        assert_eq!(view.data.to_vec().unwrap(), values(4));
        drop_elsewhere(view);
    }
    assert_eq!(counter.get(), 3);
}

fn derived_types() {
    let counter = Counter::new();
    let stored = Stored {
        storage: Arc::new(Storage::I64(vec![7, 8, 9])),
        shape: vec![3],
        _guard: counter.guard(),
    };
    let view = StoredView::from_dlpack(stored).unwrap();
    assert_eq!(view.shape, [3]);
    match &view.data {
        Imported::I64(data) => assert_eq!(data.to_vec().unwrap(), [7, 8, 9]),
        Imported::F32(data) => panic!("an i64 tensor imported as f32: {:?}", data.to_vec()),
    }
    drop(view);
    let stored = Stored {
        storage: Arc::new(Storage::F32(values(2))),
        shape: vec![2],
        _guard: counter.guard(),
    };
    let legacy = stored.into_dlpack_with(&ExportRequest::new()).unwrap();
    drop_elsewhere(legacy);
    let wrapped = Wrapper(tensor(vec![1.0f64, 2.0], &[2], &counter));
    let view = Compact::<f64>::from_dlpack(wrapped).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), [1.0, 2.0]);
    drop(view);
    let frozen = Frozen {
        bytes: bytes_of(&[1.5f32, 2.5]),
        shape: vec![2],
        dtype: DataType::F32,
        device: Device::CPU,
        _guard: counter.guard(),
    };
    // Read-only, so a legacy consumer gets a copy.
    let legacy = frozen.into_dlpack_with(&ExportRequest::new()).unwrap();
    let view = Compact::<f32>::from_managed(legacy).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), [1.5, 2.5]);
    drop(view);
    assert_eq!(counter.get(), 4);
}

fn foreign() {
    let counter = Counter::new();
    let bytes = bytes_of(&values(6));
    let described = Foreign::new(&bytes, DataType::F32, &[2, 3]);
    // SAFETY: `versioned` and `legacy` return valid, owned managed tensors.
    let versioned =
        unsafe { ManagedTensor::from_raw_versioned(described.clone().versioned(&counter)) }
            .unwrap();
    let view = Compact::<f32>::from_managed(versioned).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), values(6));
    drop_elsewhere(view);
    // SAFETY: as above.
    let legacy =
        unsafe { ManagedTensor::from_raw_legacy(described.strides(&[1, 2]).legacy(&counter)) }
            .unwrap();
    let view = Strided::<f32>::from_managed(legacy).unwrap();
    assert_eq!(view.strides, [1, 2]);
    drop(view);
    assert_eq!(counter.get(), 2);
}

fn ndarray_arrays() {
    let a = ndarray::Array2::from_shape_vec((2, 3), values(6)).unwrap();
    let flipped = a.reversed_axes();
    let view = Strided::<f32>::from_managed(flipped.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.shape, [3, 2]);
    let array = view.data.as_array().unwrap();
    assert_eq!(array[[2, 1]], 5.0);
    drop(view);
    let a = ndarray::Array1::from_vec(values(3));
    let copied = a
        .into_dlpack_with(&ExportRequest::new().copy(Some(true)))
        .unwrap();
    drop_elsewhere(copied);
}

fn managed_as_buffer() {
    /// A producer whose buffer is a managed tensor of host memory.
    #[derive(DlpackExport)]
    struct Lent {
        #[dlpack(data)]
        managed: ManagedTensor,
        #[dlpack(shape)]
        shape: Vec<usize>,
    }
    let counter = Counter::new();
    let inner = counted(4, &counter).into_dlpack().unwrap();
    let outer = Lent {
        managed: inner,
        shape: vec![4],
    }
    .into_dlpack_with(&ExportRequest::new())
    .unwrap();
    let view = Compact::<f32>::from_managed(outer).unwrap();
    assert_eq!(view.data.to_vec().unwrap(), values(4));
    drop_elsewhere(view);
    assert_eq!(counter.get(), 1);
}

/// A frozen pyclass of host memory whose protocol `python::add_dlpack_methods` installs:
/// `__dlpack__`, `__dlpack_device__`, the C exchange API and (feature `cuda`)
/// `__cuda_array_interface__`.
#[cfg(feature = "python")]
#[pyo3::pyclass(frozen)]
#[derive(DlpackExport)]
pub struct HostTensor {
    #[dlpack(data)]
    data: Vec<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

/// What the Python part of the matrix runs, with `t` a [`HostTensor`] of `[0.0, 1.0, 2.0]`,
/// `once` a one-time export of the same values, `np` NumPy. Every capsule and array it makes is
/// gone when it ends (after a garbage collection).
#[cfg(feature = "python")]
const PYTHON_MATRIX: &str = r#"
import gc, threading
expected = [0.0, 1.0, 2.0]
# NumPy consumes our exports: versioned, shared and read-only; by value and writable.
a = np.from_dlpack(t)
assert a.tolist() == expected and not a.flags.writeable
b = np.from_dlpack(once)
assert b.tolist() == expected and b.flags.writeable
del a, b
# copy=True and dl_device: fresh host copies.
c = np.from_dlpack(t, copy=True)
assert c.tolist() == expected and c.flags.writeable
d = np.from_dlpack(t, device="cpu")
assert d.tolist() == expected
del c, d
# Legacy `__dlpack__()`: a consumer that passes no max_version gets a copy of read-only data.
class Legacy:
    def __dlpack__(self, stream=None):
        return t.__dlpack__()
    def __dlpack_device__(self):
        return t.__dlpack_device__()
e = np.from_dlpack(Legacy())
assert e.tolist() == expected
del e
# Capsules dropped unconsumed run their deleters: legacy, versioned, copied.
for kwargs in [{}, {"max_version": (1, 3)}, {"max_version": (1, 3), "copy": True},
               {"max_version": (1, 3), "dl_device": (1, 0)}]:
    capsule = t.__dlpack__(**kwargs)
    del capsule
assert t.__dlpack_device__() == (1, 0)
# Host memory has no CUDA Array Interface.
assert not hasattr(t, "__cuda_array_interface__")
# Arrays dropped on another thread.
arrays = [np.from_dlpack(t), np.from_dlpack(t, copy=True)]
worker = threading.Thread(target=arrays.clear)
worker.start()
worker.join()
gc.collect()
result = True
"#;

/// Runs the Python part of the matrix in the embedded interpreter (feature `python`): NumPy
/// consuming our host exports (versioned, legacy `__dlpack__()`, `copy=True`, `device="cpu"`),
/// capsules dropped unconsumed, our consumer taking NumPy arrays and our own objects (through
/// `__dlpack__`, the C exchange API and capsules), drops on other threads; returns how many
/// groups ran (the NumPy script, our consumer's options, capsules, relays and refusals).
#[cfg(feature = "python")]
pub fn python_matrix() -> usize {
    use dlpack_runtime::python::{self, FromDlpackOptions};
    use pyo3::prelude::*;

    use crate::py::{collect, with_numpy};

    // Globals, not locals: the class the matrix defines reads `t`.
    use crate::py::eval_globals as eval;

    Python::attach(|py| {
        let counter = Counter::new();
        python::add_dlpack_methods::<HostTensor>(py).unwrap();
        let t = Bound::new(
            py,
            HostTensor {
                data: vec![0.0, 1.0, 2.0],
                shape: vec![3],
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let once = python::export_once(py, tensor(vec![0.0f64, 1.0, 2.0], &[3], &counter)).unwrap();
        let locals = with_numpy(py);
        locals.set_item("t", &t).unwrap();
        locals.set_item("once", once).unwrap();
        assert!(eval(py, PYTHON_MATRIX, &locals).extract::<bool>().unwrap());

        // Our consumer: NumPy arrays (by `__dlpack__`, with copy and device options), our own
        // object (the C exchange API), capsules of both kinds.
        let array = eval(py, "result = np.arange(4, dtype=np.float64)", &locals);
        let options = [
            FromDlpackOptions::new(),
            FromDlpackOptions::new().copy(Some(true)),
            FromDlpackOptions::new().device(Device::CPU),
        ];
        for options in &options {
            let view: Compact<f64> = python::from_dlpack_with(&array, options).unwrap();
            assert_eq!(view.data.to_vec().unwrap(), [0.0, 1.0, 2.0, 3.0]);
            drop(view);
            let view: Compact<f64> = python::from_dlpack_with(&t, options).unwrap();
            assert_eq!(view.data.to_vec().unwrap(), [0.0, 1.0, 2.0]);
            // Dropped on a thread that is not attached to the interpreter.
            py.detach(|| drop_elsewhere(view));
        }
        for code in [
            "result = t.__dlpack__()",
            "result = t.__dlpack__(max_version=(1, 3))",
            "result = np.arange(2.0).__dlpack__()",
            "result = np.arange(2.0).__dlpack__(max_version=(1, 3))",
        ] {
            let capsule = eval(py, code, &locals);
            let view: Compact<f64> = python::from_dlpack(&capsule).unwrap();
            assert!(view.data.to_vec().unwrap().len() >= 2);
            drop(view);
        }
        // What is not a producer is refused without asking the driver about it.
        let list = eval(py, "result = [1.0, 2.0]", &locals);
        assert!(python::from_dlpack::<Compact<f64>>(&list).is_err());
        // A managed tensor of NumPy's, exported again to NumPy (a relay through Python).
        let managed = python::managed_from_object(&array, &FromDlpackOptions::new()).unwrap();
        let relayed = python::export_managed(py, managed).unwrap();
        locals.set_item("relayed", relayed).unwrap();
        let sum: f64 = eval(py, "result = float(np.from_dlpack(relayed).sum())", &locals)
            .extract()
            .unwrap();
        assert_eq!(sum, 6.0);
        let capsule = python::to_capsule(
            py,
            tensor(vec![1.0f64], &[1], &counter).into_dlpack().unwrap(),
        )
        .unwrap();
        drop(capsule);
        locals.clear();
        drop(t);
        collect(py);
        assert_eq!(counter.get(), 3, "every Python-side owner was dropped");
    });
    4
}

#[cfg(feature = "candle")]
fn candle_tensors() {
    use dlpack_runtime::candle::{CandleTensor, tensor_from_dlpack, tensor_from_managed};
    let cpu = candle_core::Device::Cpu;
    let t = candle_core::Tensor::from_vec(values(6), (2, 3), &cpu).unwrap();
    let managed = CandleTensor::new(&t.t().unwrap())
        .unwrap()
        .into_dlpack()
        .unwrap();
    let back = tensor_from_managed(managed, &cpu).unwrap();
    assert_eq!(back.dims(), [3, 2]);
    let back = tensor_from_dlpack(counted(4, &Counter::new()), &cpu).unwrap();
    assert_eq!(back.to_vec1::<f32>().unwrap(), values(4));
}
