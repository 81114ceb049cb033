//! The Python protocol beyond NumPy's defaults: `from_dlpack` options and fallbacks, the C
//! exchange API, deleters on other threads (feature `python`).
#![cfg(feature = "python")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dlpack_runtime::ffi::{self, DLManagedTensorVersioned};
use dlpack_runtime::python::{self, FromDlpackOptions, export_once};
use dlpack_runtime::{DataType, Device, DlpackExport, ManagedTensor};
use dlpack_tests::py::{collect, eval as run, eval_globals, with_numpy as locals};
use dlpack_tests::types::{Compact, tensor};
use dlpack_tests::{Counter, DropGuard};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A frozen pyclass that publishes the C exchange API and counts `__dlpack__` calls.
#[pyclass(frozen)]
#[derive(DlpackExport)]
struct Published {
    #[dlpack(data)]
    data: Vec<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    calls: Arc<AtomicUsize>,
    _guard: DropGuard,
}

/// The DLPack methods of a frozen pyclass with a `calls` counter of `__dlpack__` calls, and
/// the C exchange API.
macro_rules! published {
    ($ty:ty) => {
        #[pymethods]
        impl $ty {
            #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
            fn __dlpack__<'py>(
                slf: &Bound<'py, Self>,
                stream: Option<i64>,
                max_version: Option<(u32, u32)>,
                dl_device: Option<(i32, i32)>,
                copy: Option<bool>,
            ) -> PyResult<Bound<'py, PyCapsule>> {
                slf.get().calls.fetch_add(1, Ordering::SeqCst);
                python::dlpack(slf, stream, max_version, dl_device, copy)
            }

            fn __dlpack_device__(&self) -> (i32, i32) {
                python::dlpack_device(self)
            }

            #[classattr]
            fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
                python::dlpack_c_exchange_api::<Self>(py)
            }
        }
    };
}

published!(Published);

#[test]
fn copy_and_device_options_reach_the_producer() {
    Python::attach(|py| {
        let l = locals(py);
        let arr = run(py, "result = np.arange(4.0)", &l);
        let address: usize = arr
            .getattr("ctypes")
            .unwrap()
            .getattr("data")
            .unwrap()
            .extract()
            .unwrap();
        let copied: Compact<f64> =
            python::from_dlpack_with(&arr, &FromDlpackOptions::new().copy(Some(true))).unwrap();
        assert!(copied.data.managed().is_copied(), "NumPy set IS_COPIED");
        assert_ne!(copied.data.as_ptr() as usize, address);
        assert_eq!(copied.data.as_slice().unwrap(), [0.0, 1.0, 2.0, 3.0]);
        let same: Compact<f64> = python::from_dlpack_with(
            &arr,
            &FromDlpackOptions::new()
                .device(Device::CPU)
                .copy(Some(false)),
        )
        .unwrap();
        assert_eq!(same.data.as_ptr() as usize, address);
        // A device NumPy cannot reach: refused with copy=False; without it, our consumer
        // copies the array there itself with the `cuda` feature
        // (examples/python-ext/gpu_tests/test_multi_gpu.py), and refuses without the feature.
        let err = python::from_dlpack_with::<Compact<f64>>(
            &arr,
            &FromDlpackOptions::new()
                .device(Device::cuda(0))
                .copy(Some(false)),
        )
        .err()
        .unwrap();
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        #[cfg(not(feature = "cuda"))]
        {
            let err = python::from_dlpack_with::<Compact<f64>>(
                &arr,
                &FromDlpackOptions::new().device(Device::cuda(0)),
            )
            .err()
            .unwrap();
            assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        }
    });
}

#[test]
fn old_producers_get_the_keyword_free_retry() {
    Python::attach(|py| {
        let l = locals(py);
        let code = "
class Old:
    def __init__(self, a):
        self.a = a
        self.calls = []
    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.a.__dlpack__()
    def __dlpack_device__(self):
        return self.a.__dlpack_device__()
result = Old(np.arange(3, dtype=np.int32))
";
        let old = run(py, code, &l);
        let view: Compact<i32> = python::from_dlpack(&old).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [0, 1, 2]);
        assert!(view.data.managed().is_legacy());
        assert_eq!(
            old.getattr("calls").unwrap().len().unwrap(),
            1,
            "one retry, after the TypeError"
        );
        // copy=True with a producer that cannot copy: the consumer copies.
        let view: Compact<i32> =
            python::from_dlpack_with(&old, &FromDlpackOptions::new().copy(Some(true))).unwrap();
        assert!(view.data.managed().is_copied());
        assert_eq!(view.data.as_slice().unwrap(), [0, 1, 2]);
    });
}

/// A frozen pyclass over CUDA memory (made up: never touched) that publishes the C exchange API.
#[pyclass(frozen)]
#[derive(DlpackExport)]
struct CudaPublished {
    #[dlpack(data)]
    data: dlpack_tests::types::FakeCuda,
    #[dlpack(shape)]
    shape: Vec<usize>,
    calls: Arc<AtomicUsize>,
    _guard: DropGuard,
}

published!(CudaPublished);

#[cfg(feature = "cuda")]
impl CudaPublished {
    /// Four float32 at device `address`, as a Python object, and its `__dlpack__` call count.
    fn bound<'py>(
        py: Python<'py>,
        address: usize,
        counter: &Counter,
    ) -> (Bound<'py, Self>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let obj = Bound::new(
            py,
            Self {
                data: dlpack_tests::types::FakeCuda { address, len: 4 },
                shape: vec![4],
                calls: calls.clone(),
                _guard: counter.guard(),
            },
        )
        .unwrap();
        (obj, calls)
    }
}

/// CUDA memory taken through the C exchange API is ordered before the consumer's stream with
/// the driver (feature `cuda`); without a driver that is an error, and the tensor taken is
/// released. Host tensors with a `stream` go through `__dlpack__`, which refuses it.
#[cfg(feature = "cuda")]
#[test]
fn c_exchange_api_of_cuda_memory_is_ordered_with_the_driver() {
    use dlpack_runtime::cuda::{self, CudaError};
    if !matches!(cuda::init(), Err(CudaError::NoDriver)) {
        assert_ne!(dlpack_tests::expected_driver(), Some(false));
        return c_exchange_api_of_cuda_memory_with_a_driver();
    }
    assert_ne!(dlpack_tests::expected_driver(), Some(true));
    Python::attach(|py| {
        let counter = Counter::new();
        let (obj, calls) = CudaPublished::bound(py, 0x7f00_0000_0000, &counter);
        for options in [
            FromDlpackOptions::new(),
            FromDlpackOptions::new().stream(Some(0x5000)),
        ] {
            let err = python::managed_from_object(obj.as_any(), &options).unwrap_err();
            assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
            assert!(err.to_string().contains("no CUDA driver"), "{err}");
        }
        // `stream=-1`: the consumer orders its work itself; nothing to ask of the driver.
        let managed =
            python::managed_from_object(obj.as_any(), &FromDlpackOptions::new().stream(Some(-1)))
                .unwrap();
        assert_eq!(
            Device::from_raw(managed.dl_tensor().device),
            Device::cuda(0)
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "taken through the C exchange API"
        );
        drop((managed, obj));
        collect(py);
        assert_eq!(counter.get(), 1, "every tensor taken was released");

        // A host producer asked for a stream: the C path is left for `__dlpack__`, which
        // refuses a stream for host memory.
        let host = Bound::new(
            py,
            Published {
                data: vec![1.0],
                shape: vec![1],
                calls: calls.clone(),
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let err =
            python::managed_from_object(host.as_any(), &FromDlpackOptions::new().stream(Some(1)))
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("stream=1 is not valid for a consumer on cpu:0"),
            "{err}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(host);
        collect(py);
        assert_eq!(counter.get(), 2);
    });
}

/// The driver-present half of the test above (the CUDA simulator in the test command): the
/// producer's `current_work_stream` is ordered before the consumer's stream by an event, and a
/// consumer stream the driver does not know is refused, with the tensor released.
#[cfg(feature = "cuda")]
fn c_exchange_api_of_cuda_memory_with_a_driver() {
    use cudarc::driver::{CudaContext, DevicePtr};
    let ctx = CudaContext::new(0).unwrap();
    let consumer = ctx.new_stream().unwrap();
    // Real device memory: with a driver, every export checks its pointer.
    let memory = consumer.alloc_zeros::<f32>(4).unwrap();
    let address = memory.device_ptr(&consumer).0 as usize;
    consumer.synchronize().unwrap();
    // Taken before the GIL, as in every test here: a test holding the checker may wait with
    // the GIL released.
    let checker = cuda_sim_testing::Checker::attach();
    Python::attach(|py| {
        let counter = Counter::new();
        let (obj, calls) = CudaPublished::bound(py, address, &counter);
        for stream in [None, Some(consumer.cu_stream() as i64), Some(-1)] {
            let managed =
                python::managed_from_object(obj.as_any(), &FromDlpackOptions::new().stream(stream))
                    .unwrap();
            assert_eq!(
                Device::from_raw(managed.dl_tensor().device),
                Device::cuda(0)
            );
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "taken through the C exchange API"
        );
        // The producer's pending work on its current stream (the table reports NULL: the legacy
        // default stream) is ordered before the consumer's stream, without blocking the host.
        ctx.bind_to_thread().unwrap();
        let legacy = 0x1 as cudarc::driver::sys::CUstream;
        // SAFETY: the legacy default stream of the current (primary) context.
        let gate = unsafe { cuda_sim_testing::Gate::hold_raw(legacy) };
        // SAFETY: `address` is 4 u32 of live device memory; stream-ordered behind the gate.
        unsafe { cudarc::driver::sys::cuMemsetD32Async(address as u64, 7, 4, legacy) }
            .result()
            .unwrap();
        let managed = python::managed_from_object(
            obj.as_any(),
            &FromDlpackOptions::new().stream(Some(consumer.cu_stream() as i64)),
        )
        .unwrap();
        let mut result = consumer.alloc_zeros::<u32>(4).unwrap();
        let data = managed.dl_tensor().data as u64;
        // SAFETY: both are 4 u32 of live device memory; stream-ordered on the consumer's stream.
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoDAsync_v2(
                cudarc::driver::DevicePtrMut::device_ptr_mut(&mut result, &consumer).0,
                data,
                16,
                consumer.cu_stream(),
            )
        }
        .result()
        .unwrap();
        // The consumer's stream waits for the producer's held work (watched for 20 ms).
        let watch = std::time::Instant::now();
        while watch.elapsed() < std::time::Duration::from_millis(20) {
            // SAFETY: a live stream; query only.
            let pending = unsafe { cudarc::driver::sys::cuStreamQuery(consumer.cu_stream()) };
            assert_eq!(
                pending,
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY,
                "the consumer's stream ran ahead of the producer's held work"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        gate.release();
        assert_eq!(consumer.clone_dtoh(&result).unwrap(), [7; 4]);
        drop(managed);
        if let Some(c) = &checker {
            c.assert_clean("C exchange API ordering");
        }
        let err = python::managed_from_object(
            obj.as_any(),
            &FromDlpackOptions::new().stream(Some(0x5000)),
        )
        .unwrap_err();
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        drop(obj);
        collect(py);
        assert_eq!(counter.get(), 1, "every tensor taken was released");
    });
    consumer.synchronize().unwrap();
    drop(memory);
}

/// A Python producer that ignores `dl_device` and forwards `__dlpack__(stream=-1)` of `inner`:
/// it hands over CUDA memory carrying no event, whatever the consumer asked.
#[cfg(feature = "cuda")]
const IGNORES_DEVICE: &str = "
class IgnoresDevice:
    def __init__(self, inner):
        self.inner = inner
    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.inner.__dlpack__(stream=-1, max_version=max_version)
result = IgnoresDevice(inner)
";

/// CUDA memory handed over despite `dl_device=(CPU, 0)` (feature `cuda`): the consumer copies
/// it to the host after the work ordered before its `stream` (here: enqueued on it, held by a
/// gate); with `stream=-1` nothing orders the copy, which the simulator's checker reports.
/// Without a driver the copy is refused.
#[cfg(feature = "cuda")]
#[test]
fn a_host_copy_of_cuda_memory_handed_over_despite_dl_device_follows_the_consumer_stream() {
    use cudarc::driver::{CudaContext, DevicePtr, sys};
    use dlpack_runtime::cuda::{self, CudaError};
    let host_import = |obj: &Bound<'_, PyAny>, stream: i64| {
        python::from_dlpack_with::<Compact<f32>>(
            obj,
            &FromDlpackOptions::new()
                .device(Device::CPU)
                .stream(Some(stream)),
        )
    };
    if matches!(cuda::init(), Err(CudaError::NoDriver)) {
        assert_ne!(dlpack_tests::expected_driver(), Some(true));
        Python::attach(|py| {
            let counter = Counter::new();
            let (inner, _calls) = CudaPublished::bound(py, 0x7f00_0000_0000, &counter);
            let l = locals(py);
            l.set_item("inner", inner).unwrap();
            let obj = run(py, IGNORES_DEVICE, &l);
            let err = host_import(&obj, 0x5000).err().unwrap();
            assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
            assert!(err.to_string().contains("no CUDA driver"), "{err}");
            drop((obj, l));
            collect(py);
            assert_eq!(counter.get(), 1, "the tensor handed over was released");
        });
        return;
    }
    assert_ne!(dlpack_tests::expected_driver(), Some(false));
    let ctx = CudaContext::new(0).unwrap();
    let consumer = ctx.new_stream().unwrap();
    let memory = consumer.alloc_zeros::<f32>(4).unwrap();
    let address = memory.device_ptr(&consumer).0;
    consumer.synchronize().unwrap();
    // Taken before the GIL: the host copy waits with the GIL released, and another test may
    // then take the GIL and wait for the checker.
    let checker = cuda_sim_testing::Checker::attach();
    Python::attach(|py| {
        let counter = Counter::new();
        let (inner, _calls) = CudaPublished::bound(py, address as usize, &counter);
        let l = locals(py);
        l.set_item("inner", inner).unwrap();
        let obj = run(py, IGNORES_DEVICE, &l);
        for (value, stream) in [(7, consumer.cu_stream() as i64), (9, -1)] {
            ctx.bind_to_thread().unwrap();
            // The producer's write, ordered before the consumer's stream (enqueued on it) and
            // held there until another thread opens the gate.
            let gate = cuda_sim_testing::Gate::hold(&consumer);
            // SAFETY: `address` is 4 u32 of live device memory; stream-ordered behind the gate.
            unsafe { sys::cuMemsetD32Async(address, value, 4, consumer.cu_stream()) }
                .result()
                .unwrap();
            let opener = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                gate.release();
            });
            let host = host_import(&obj, stream).unwrap();
            opener.join().unwrap();
            consumer.synchronize().unwrap();
            assert!(host.data.managed().is_copied());
            let bits: Vec<u32> = host
                .data
                .as_slice()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            if stream != -1 {
                if let Some(c) = &checker {
                    c.assert_clean("host copy after the consumer's stream");
                }
                assert_eq!(bits, [value; 4]);
            } else if let Some(c) = &checker {
                // The negative control (its values may be anything): the copy read while the
                // write was held.
                assert!(
                    c.violations() >= 1,
                    "the checker missed the unordered host copy"
                );
                assert!(c.report().contains("cuMemcpyDtoH"), "{}", c.report());
                c.reset();
            }
        }
        drop((obj, l));
        collect(py);
        assert_eq!(counter.get(), 1, "every tensor handed over was released");
    });
    drop(memory);
}

#[test]
fn c_exchange_api_is_published_and_used() {
    Python::attach(|py| {
        let counter = Counter::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let obj = Bound::new(
            py,
            Published {
                data: vec![1.0, 2.0, 3.0],
                shape: vec![3],
                calls: calls.clone(),
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let capsule = obj.get_type().getattr("__dlpack_c_exchange_api__").unwrap();
        let capsule = capsule.cast::<PyCapsule>().unwrap();
        let name = capsule.name().unwrap().map(|n| {
            // SAFETY: the capsule is alive while its name is read.
            unsafe { n.as_cstr() }.to_owned()
        });
        assert_eq!(name.as_deref(), Some(c"dlpack_exchange_api"));

        // Our consumer takes the C path for host data: `__dlpack__` is not called.
        let view: Compact<f64> = python::from_dlpack(&obj).unwrap();
        assert_eq!(view.shape, [3]);
        assert_eq!(view.data.as_slice().unwrap(), [1.0, 2.0, 3.0]);
        assert!(
            view.data.is_read_only(),
            "the same shared, read-only export as `__dlpack__`"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Options that the C path cannot serve go through `__dlpack__`.
        let copied: Compact<f64> =
            python::from_dlpack_with(&obj, &FromDlpackOptions::new().copy(Some(true))).unwrap();
        assert!(copied.data.managed().is_copied());
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // The table itself.
        let api = capsule
            .pointer_checked(Some(ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME))
            .unwrap();
        // SAFETY: the capsule holds a process-lifetime `DLPackExchangeAPI`.
        let api = unsafe { &*api.as_ptr().cast::<ffi::DLPackExchangeAPI>() };
        assert_eq!((api.header.version.major, api.header.version.minor), (1, 3));
        assert!(api.dltensor_from_py_object_no_sync.is_none());
        let mut stream = std::ptr::dangling_mut::<core::ffi::c_void>();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (api.current_work_stream.unwrap())(ffi::kDLCPU, 0, &mut stream) };
        assert_eq!((rc, stream.is_null()), (0, true));

        // Allocator: a zeroed (2, 3) float32 tensor.
        let mut shape = [2i64, 3];
        let mut prototype = ffi::DLTensor {
            data: core::ptr::null_mut(),
            device: Device::CPU.to_raw(),
            ndim: 2,
            dtype: DataType::F32.to_raw(),
            shape: shape.as_mut_ptr(),
            strides: core::ptr::null_mut(),
            byte_offset: 0,
        };
        let mut out: *mut DLManagedTensorVersioned = core::ptr::null_mut();
        // SAFETY: valid prototype and out-pointer; no error callback needed on success.
        let rc = unsafe {
            (api.managed_tensor_allocator.unwrap())(
                &mut prototype,
                &mut out,
                core::ptr::null_mut(),
                None,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: on success `out` is an owned managed tensor.
        let allocated = unsafe { ManagedTensor::from_raw_versioned(out) }.unwrap();
        // To a Python object (stealing the tensor), then to NumPy.
        let mut py_obj: *mut core::ffi::c_void = core::ptr::null_mut();
        let raw = match allocated.into_raw() {
            dlpack_runtime::RawManagedTensor::Versioned(p) => p.as_ptr(),
            dlpack_runtime::RawManagedTensor::Legacy(_) => unreachable!(),
        };
        // SAFETY: `raw` is owned and handed over; `py_obj` receives a new reference.
        let rc = unsafe { (api.managed_tensor_to_py_object_no_sync.unwrap())(raw, &mut py_obj) };
        assert_eq!(rc, 0);
        // SAFETY: a new, owned reference to a live object.
        let wrapped = unsafe { Bound::from_owned_ptr(py, py_obj.cast()) };
        let arr = py
            .import("numpy")
            .unwrap()
            .call_method1("from_dlpack", (wrapped,))
            .unwrap();
        assert_eq!(
            arr.call_method0("tolist")
                .unwrap()
                .extract::<Vec<Vec<f32>>>()
                .unwrap(),
            [[0.0; 3]; 2]
        );
        assert!(
            arr.getattr("flags")
                .unwrap()
                .getattr("writeable")
                .unwrap()
                .extract::<bool>()
                .unwrap()
        );

        // An unsupported prototype reports through the error callback.
        prototype.device = Device::cuda(0).to_raw();
        unsafe extern "C" fn record(
            ctx: *mut core::ffi::c_void,
            kind: *const core::ffi::c_char,
            message: *const core::ffi::c_char,
        ) {
            // SAFETY: `ctx` is the `String` passed below; both strings are NUL-terminated.
            unsafe {
                let text = &mut *ctx.cast::<String>();
                *text = format!(
                    "{}: {}",
                    std::ffi::CStr::from_ptr(kind).to_string_lossy(),
                    std::ffi::CStr::from_ptr(message).to_string_lossy()
                );
            }
        }
        let mut message = String::new();
        // SAFETY: valid arguments; `record` writes into `message`.
        let rc = unsafe {
            (api.managed_tensor_allocator.unwrap())(
                &mut prototype,
                &mut out,
                (&mut message as *mut String).cast(),
                Some(record),
            )
        };
        assert_eq!(rc, -1);
        assert_eq!(
            message,
            "BufferError: this producer allocates cpu:0 tensors only, not cuda:0"
        );

        drop((view, copied, obj, arr));
        collect(py);
        assert_eq!(
            counter.get(),
            1,
            "the pyclass lived until its exports were released"
        );
    });
}

#[test]
fn deleters_run_on_another_thread_while_a_third_holds_the_gil() {
    use std::time::{Duration, Instant};
    let counter = Counter::new();
    let view = Python::attach(|py| {
        let obj = export_once(py, tensor(vec![1u8, 2, 3], &[3], &counter)).unwrap();
        let arr = py
            .import("numpy")
            .unwrap()
            .call_method1("from_dlpack", (obj,))
            .unwrap();
        // The import holds NumPy's array, whose deleter takes the GIL.
        let view: Compact<u8> = python::from_dlpack(&arr).unwrap();
        view
    });
    let (held_tx, held_rx) = std::sync::mpsc::channel::<Instant>();
    // Thread A holds the GIL for a while.
    let holder = std::thread::spawn(move || {
        Python::attach(|_py| {
            held_tx.send(Instant::now()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            Instant::now()
        })
    });
    let held_since = held_rx.recv().unwrap();
    // Thread B drops the import meanwhile: NumPy's deleter waits for the GIL, then runs once.
    let dropper = std::thread::spawn(move || {
        assert_eq!(view.data.as_slice().unwrap(), [1, 2, 3]);
        drop(view);
        Instant::now()
    });
    let released_at = holder.join().unwrap();
    let dropped_at = dropper.join().unwrap();
    assert!(dropped_at >= released_at, "the deleter waited for the GIL");
    assert!(released_at.duration_since(held_since) >= Duration::from_millis(200));
    Python::attach(collect);
    assert_eq!(
        counter.get(),
        1,
        "released exactly once, from another thread"
    );
}

/// Deleter calls of [`malformed_from_py`]'s tensors.
static MALFORMED_DELETES: AtomicUsize = AtomicUsize::new(0);

/// A tensor with a negative extent: what a buggy foreign table hands out.
#[repr(C)]
struct Malformed {
    header: DLManagedTensorVersioned,
    shape: [i64; 1],
    strides: [i64; 1],
    data: [f64; 1],
}

unsafe extern "C" fn malformed_delete(managed: *mut DLManagedTensorVersioned) {
    MALFORMED_DELETES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: made by `malformed_from_py` with `Box::into_raw`, deleted once (DLPack contract).
    drop(unsafe { Box::from_raw(managed.cast::<Malformed>()) });
}

/// `managed_tensor_from_py_object_no_sync` of a hand-made (foreign) table.
unsafe extern "C" fn malformed_from_py(
    _object: *mut core::ffi::c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> core::ffi::c_int {
    let block = Box::into_raw(Box::new(Malformed {
        header: DLManagedTensorVersioned {
            version: ffi::DLPackVersion {
                major: ffi::DLPACK_MAJOR_VERSION,
                minor: ffi::DLPACK_MINOR_VERSION,
            },
            manager_ctx: core::ptr::null_mut(),
            deleter: Some(malformed_delete),
            flags: 0,
            dl_tensor: ffi::DLTensor {
                data: core::ptr::null_mut(),
                device: Device::CPU.to_raw(),
                ndim: 1,
                dtype: DataType::F64.to_raw(),
                shape: core::ptr::null_mut(),
                strides: core::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: [-3],
        strides: [1],
        data: [0.0],
    }));
    // SAFETY: `block` is a fresh, exclusively owned allocation; the pointers stay inside it.
    unsafe {
        (*block).header.dl_tensor.data = (&raw mut (*block).data).cast();
        (*block).header.dl_tensor.shape = (&raw mut (*block).shape).cast();
        (*block).header.dl_tensor.strides = (&raw mut (*block).strides).cast();
        *out = block.cast();
    }
    0
}

/// A pyclass publishing a hand-made exchange API table, not one of this crate's.
#[pyclass(frozen)]
struct ForeignTable;

#[pymethods]
impl ForeignTable {
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
        /// The table, shared read-only (its `prev_api` pointer is NULL).
        struct Table(ffi::DLPackExchangeAPI);
        // SAFETY: never written; its only pointer is NULL.
        unsafe impl Sync for Table {}
        static TABLE: Table = Table(ffi::DLPackExchangeAPI {
            header: ffi::DLPackExchangeAPIHeader {
                version: ffi::DLPackVersion {
                    major: ffi::DLPACK_MAJOR_VERSION,
                    minor: ffi::DLPACK_MINOR_VERSION,
                },
                prev_api: core::ptr::null_mut(),
            },
            managed_tensor_allocator: None,
            managed_tensor_from_py_object_no_sync: Some(malformed_from_py),
            managed_tensor_to_py_object_no_sync: None,
            dltensor_from_py_object_no_sync: None,
            current_work_stream: None,
        });
        let pointer = std::ptr::NonNull::from(&TABLE.0).cast::<core::ffi::c_void>();
        // SAFETY: a static table, valid for the process; no destructor.
        unsafe { PyCapsule::new_with_pointer(py, pointer, ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME) }
    }
}

#[test]
fn tensors_of_a_foreign_exchange_api_table_are_validated() {
    Python::attach(|py| {
        let obj = Bound::new(py, ForeignTable).unwrap();
        // Only this crate's own tables hand out tensors its exporter validated; this one's
        // tensor is validated here, refused, and given back to its deleter once.
        let err = python::from_dlpack::<Compact<f64>>(obj.as_any())
            .err()
            .expect("a negative extent is refused");
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        assert!(err.to_string().contains("extent of axis 0 is -3"), "{err}");
        assert_eq!(MALFORMED_DELETES.load(Ordering::SeqCst), 1);
    });
}

/// A pyclass whose protocol `python::add_dlpack_methods` installs.
#[pyclass(frozen)]
#[derive(DlpackExport)]
struct Installed {
    #[dlpack(data)]
    data: Vec<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

#[test]
fn add_dlpack_methods_installs_the_protocol() {
    Python::attach(|py| {
        let counter = Counter::new();
        // Twice: installing again is harmless.
        python::add_dlpack_methods::<Installed>(py).unwrap();
        python::add_dlpack_methods::<Installed>(py).unwrap();
        let obj = Bound::new(
            py,
            Installed {
                data: vec![1.0, 2.0, 3.0],
                shape: vec![3],
                _guard: counter.guard(),
            },
        )
        .unwrap();
        // Globals, not locals: the snippets define functions and lambdas that read `t`.
        let l = locals(py);
        l.set_item("t", &obj).unwrap();
        let run = eval_globals;
        let read: (Vec<f64>, bool, (i32, i32)) = run(
            py,
            "a = np.from_dlpack(t)\nresult = (a.tolist(), a.flags.writeable, t.__dlpack_device__())",
            &l,
        )
        .extract()
        .unwrap();
        assert_eq!(read, (vec![1.0, 2.0, 3.0], false, (1, 0)));
        // Every spelling of the arguments: keywords interned or built at run time, `None` for
        // each.
        let names: Vec<String> = run(
            py,
            "key = ''.join(['max_', 'version'])
calls = [
    t.__dlpack__(max_version=(1, 3)),
    t.__dlpack__(stream=None, max_version=(1, 3), dl_device=None, copy=None),
    t.__dlpack__(stream=None, max_version=(1, 3), dl_device=(1, 0), copy=False),
    t.__dlpack__(**{key: (1, 3)}),
    t.__dlpack__(),
    t.__dlpack__(max_version=(1, 3), copy=True),
]
import ctypes
get_name = ctypes.pythonapi.PyCapsule_GetName
get_name.restype = ctypes.c_char_p
get_name.argtypes = [ctypes.py_object]
result = [get_name(c).decode() for c in calls]",
            &l,
        )
        .extract()
        .unwrap();
        // A legacy request (no `max_version`) of this read-only export gets a writable copy,
        // in a legacy capsule.
        assert_eq!(
            names,
            [
                "dltensor_versioned",
                "dltensor_versioned",
                "dltensor_versioned",
                "dltensor_versioned",
                "dltensor",
                "dltensor_versioned"
            ]
        );
        // Argument errors are `TypeError`s that name the argument; protocol errors are those of
        // `python::dlpack`.
        let errors: Vec<(String, String)> = run(
            py,
            "def error(f):
    try:
        f()
    except Exception as e:
        return (type(e).__name__, str(e))
    return ('none', '')
result = [
    error(lambda: t.__dlpack__(None, None)),
    error(lambda: t.__dlpack__(foo=1)),
    error(lambda: t.__dlpack__(None)),
    error(lambda: t.__dlpack__(max_version='1.3')),
    error(lambda: t.__dlpack__(copy=3)),
    error(lambda: t.__dlpack__(stream='x')),
    error(lambda: t.__dlpack__(max_version=(1, 3), dl_device=(2, 0), copy=False)),
    error(lambda: type(t).__dlpack__(np.zeros(1))),
    error(lambda: t.__dlpack__(stream=2**70)),
    error(lambda: t.__dlpack__(max_version=(-1, 0))),
    error(lambda: t.__dlpack__(max_version=(1, 3.0))),
]",
            &l,
        )
        .extract()
        .unwrap();
        let kinds: Vec<&str> = errors.iter().map(|(kind, _)| kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "TypeError",
                "TypeError",
                "TypeError",
                "TypeError",
                "TypeError",
                "TypeError",
                "BufferError",
                "TypeError",
                "OverflowError",
                "OverflowError",
                "TypeError"
            ],
            "{errors:?}"
        );
        // Python's own wording: the method named with its class.
        assert!(
            errors[1].1.starts_with("Installed.__dlpack__()"),
            "{errors:?}"
        );
        // Every parameter is keyword-only, as NumPy's and PyTorch's `__dlpack__` have them.
        assert!(
            errors[0]
                .1
                .contains("takes 0 positional arguments but 2 were given"),
            "{errors:?}"
        );
        assert!(
            errors[1].1.contains("unexpected keyword argument 'foo'"),
            "{errors:?}"
        );
        assert!(
            errors[2]
                .1
                .contains("takes 0 positional arguments but 1 was given"),
            "{errors:?}"
        );
        assert!(
            errors[3]
                .1
                .contains("'max_version' must be a (major, minor) tuple"),
            "{errors:?}"
        );
        assert!(
            errors[4]
                .1
                .contains("'copy' must be a bool or None, not int"),
            "{errors:?}"
        );

        // The C exchange API is published too, and this crate's consumer takes it.
        let view: Compact<f64> = python::from_dlpack(&obj).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [1.0, 2.0, 3.0]);
        assert!(obj.getattr("__dlpack_c_exchange_api__").is_ok());
        drop(view);
        l.del_item("t").unwrap();
        drop(obj);
        run(py, "del a, calls\nresult = None", &l);
        collect(py);
        assert_eq!(counter.get(), 1, "the tensor is freed once every export is");
    });
}

#[test]
fn a_copied_exchange_api_table_falls_back_to_dlpack() {
    Python::attach(|py| {
        let counter = Counter::new();
        let obj = Bound::new(
            py,
            Published {
                data: vec![1.0, 2.0],
                shape: vec![2],
                calls: Arc::new(AtomicUsize::new(0)),
                _guard: counter.guard(),
            },
        )
        .unwrap();
        let l = locals(py);
        l.set_item("Published", obj.get_type()).unwrap();
        // Another type publishing `Published`'s table: the table refuses its objects with a
        // `BufferError`, and the consumer asks `__dlpack__` instead.
        let impostor = eval_globals(
            py,
            "class Impostor:
    __dlpack_c_exchange_api__ = Published.__dlpack_c_exchange_api__
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return np.arange(3.0).__dlpack__(max_version=max_version)
    def __dlpack_device__(self):
        return (1, 0)
result = Impostor()",
            &l,
        );
        let view: Compact<f64> = python::from_dlpack(&impostor).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [0.0, 1.0, 2.0]);
    });
}

#[test]
fn the_exchange_api_cache_lets_go_of_types() {
    Python::attach(|py| {
        let l = locals(py);
        let code = "import weakref
def make():
    class K:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return np.arange(3.0).__dlpack__(max_version=max_version)
        def __dlpack_device__(self):
            return (1, 0)
    return K()
result = make()";
        let first = eval_globals(py, code, &l);
        let view: Compact<f64> = python::from_dlpack(&first).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [0.0, 1.0, 2.0]);
        l.set_item("first", &first).unwrap();
        let alive = eval_globals(py, "ref = weakref.ref(type(first))\nresult = ref", &l);
        drop(first);
        l.del_item("first").unwrap();
        // Producers of 100 more types made at run time pass through the cache.
        for _ in 0..100 {
            let other = eval_globals(py, "result = make()", &l);
            let _: Compact<f64> = python::from_dlpack(&other).unwrap();
        }
        collect(py);
        assert!(
            alive.call0().unwrap().is_none(),
            "the first type is freed once the cache has let go of it"
        );
    });
}
