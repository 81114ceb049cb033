//! The consumer's C exchange API path for ROCm producers (features `python` and `hip`), on the
//! simulator's HIP face: a producer type that publishes a foreign `DLPackExchangeAPI` table
//! whose tensors are ROCm device memory and whose `current_work_stream` for `kDLROCM` is the
//! HIP stream its write is pending on. `from_dlpack` takes the tensor through the table and
//! orders that stream before the consumer's stream (ROCm column of the stream table); the
//! producer's `__dlpack__` raises, so a fall back to it fails the test. The import carries a
//! HIP event recorded on the consumer's stream, which orders a relay's next consumer.
//!
//! Run with the simulator on the library path (`scripts/cuda-sim.sh`), as the test command
//! does; without any HIP runtime each test says it is skipped (the no-runtime paths are covered
//! elsewhere), unless `DLPACK_TESTS_EXPECT_DRIVER=present`. On a ROCm machine (no checker) they
//! refuse to run.
#![cfg(all(feature = "python", feature = "hip"))]

use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_sim_testing::Checker;
use dlpack_runtime::ffi::{self, DLManagedTensorVersioned};
use dlpack_runtime::hip::{HipSlice, HipStream};
use dlpack_runtime::python::{self, FromDlpackOptions};
use dlpack_runtime::{DataType, Device, DeviceType, ManagedTensor};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// Elements of the tensor.
const N: usize = 1024;

/// The HIP calls of the test beyond `HipStream` and `HipSlice`.
struct Hip {
    launch_host_func:
        unsafe extern "C" fn(*mut c_void, unsafe extern "C" fn(*mut c_void), *mut c_void) -> i32,
    memset_async: unsafe extern "C" fn(*mut c_void, i32, usize, *mut c_void) -> i32,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, *mut c_void) -> i32,
    set_device: unsafe extern "C" fn(i32) -> i32,
    _library: libloading::Library,
}

fn hip() -> &'static Hip {
    static HIP: std::sync::OnceLock<Hip> = std::sync::OnceLock::new();
    HIP.get_or_init(|| {
        // SAFETY: the HIP runtime (the simulator's face); each symbol has the prototype of
        // `hip_runtime_api.h`.
        unsafe {
            let library = libloading::Library::new("libamdhip64.so").unwrap();
            Hip {
                launch_host_func: *library.get(b"hipLaunchHostFunc\0").unwrap(),
                memset_async: *library.get(b"hipMemsetAsync\0").unwrap(),
                memcpy_async: *library.get(b"hipMemcpyAsync\0").unwrap(),
                set_device: *library.get(b"hipSetDevice\0").unwrap(),
                _library: library,
            }
        }
    })
}

/// Whether the gate the producer's stream waits on is open.
static OPEN: AtomicBool = AtomicBool::new(true);

/// The host function of the gate: waits until `OPEN` (at most 20 s, so a test that goes wrong
/// fails instead of hanging).
unsafe extern "C" fn wait_for_gate(_user_data: *mut c_void) {
    let start = Instant::now();
    while !OPEN.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The producer's state, which the foreign table's functions read: the device pointer of its
/// tensor, its current work stream, and what the consumer asked.
static DATA: AtomicUsize = AtomicUsize::new(0);
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static ASKED_TYPE: AtomicI32 = AtomicI32::new(-1);
static DELETES: AtomicUsize = AtomicUsize::new(0);
/// One test at a time uses the statics above.
static SERIAL: Mutex<()> = Mutex::new(());

#[repr(C)]
struct Block {
    header: DLManagedTensorVersioned,
    shape: [i64; 1],
}

unsafe extern "C" fn delete(managed: *mut DLManagedTensorVersioned) {
    DELETES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: made by `from_py` with `Box::into_raw`, deleted once (DLPack contract).
    drop(unsafe { Box::from_raw(managed.cast::<Block>()) });
}

/// `managed_tensor_from_py_object_no_sync`: `N` u32 of ROCm memory at `DATA`, without
/// synchronization.
unsafe extern "C" fn from_py(
    _object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> core::ffi::c_int {
    let block = Box::into_raw(Box::new(Block {
        header: DLManagedTensorVersioned {
            version: ffi::DLPackVersion {
                major: ffi::DLPACK_MAJOR_VERSION,
                minor: ffi::DLPACK_MINOR_VERSION,
            },
            manager_ctx: core::ptr::null_mut(),
            deleter: Some(delete),
            flags: 0,
            dl_tensor: ffi::DLTensor {
                data: DATA.load(Ordering::SeqCst) as *mut c_void,
                device: Device::new(DeviceType::Rocm, 0).to_raw(),
                ndim: 1,
                dtype: DataType::U32.to_raw(),
                shape: core::ptr::null_mut(),
                strides: core::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: [N as i64],
    }));
    // SAFETY: just made; the shape lives in the same block.
    unsafe {
        (*block).header.dl_tensor.shape = (*block).shape.as_mut_ptr();
        out.write(block.cast());
    }
    0
}

/// `current_work_stream`: the producer's HIP stream for `kDLROCM`, NULL otherwise.
unsafe extern "C" fn current_work_stream(
    device_type: ffi::DLDeviceType,
    _device_id: i32,
    out: *mut *mut c_void,
) -> core::ffi::c_int {
    ASKED_TYPE.store(device_type, Ordering::SeqCst);
    let stream = if device_type == ffi::kDLROCM {
        CURRENT.load(Ordering::SeqCst) as *mut c_void
    } else {
        core::ptr::null_mut()
    };
    // SAFETY: a writable out-pointer (caller's contract).
    unsafe { out.write(stream) };
    0
}

struct Table(ffi::DLPackExchangeAPI);
// SAFETY: immutable after construction; function pointers and a null `prev_api` only.
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
    managed_tensor_from_py_object_no_sync: Some(from_py),
    managed_tensor_to_py_object_no_sync: None,
    dltensor_from_py_object_no_sync: None,
    current_work_stream: Some(current_work_stream),
});

/// A ROCm producer known only through its C exchange API table.
#[pyclass(frozen)]
struct RocmForeign;

#[pymethods]
impl RocmForeign {
    #[pyo3(signature = (**_kwargs))]
    fn __dlpack__(&self, _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>) -> PyResult<()> {
        Err(PyRuntimeError::new_err(
            "expected the C exchange API path, not __dlpack__",
        ))
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (ffi::kDLROCM, 0)
    }

    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
        let pointer = std::ptr::NonNull::from(&TABLE.0).cast::<c_void>();
        // SAFETY: a static table, valid for the process; no destructor.
        unsafe { PyCapsule::new_with_pointer(py, pointer, ffi::DLPACK_EXCHANGE_API_CAPSULE_NAME) }
    }
}

/// The producer's memory, with a write of `0x07` bytes on `producer` held behind the gate.
fn held_write(producer: &Arc<HipStream>) -> HipSlice<u32> {
    let data = HipSlice::<u32>::alloc_zeros(producer, N).unwrap();
    producer.synchronize().unwrap();
    DATA.store(data.device_ptr() as usize, Ordering::SeqCst);
    CURRENT.store(producer.raw() as usize, Ordering::SeqCst);
    OPEN.store(false, Ordering::SeqCst);
    // SAFETY: device 0 exists; a live stream; the host function takes no data.
    unsafe {
        assert_eq!((hip().set_device)(0), 0);
        assert_eq!(
            (hip().launch_host_func)(producer.raw(), wait_for_gate, core::ptr::null_mut()),
            0
        );
        assert_eq!(
            (hip().memset_async)(
                data.device_ptr() as usize as *mut c_void,
                7,
                N * 4,
                producer.raw()
            ),
            0
        );
    }
    data
}

/// Copies the imported tensor into a buffer of `reader`'s stream, on that stream, opens the
/// gate and returns what the copy read.
fn read_on(managed: &ManagedTensor, reader: &Arc<HipStream>) -> Vec<u32> {
    let result = HipSlice::<u32>::alloc_zeros(reader, N).unwrap();
    // SAFETY: both are `N` u32 of live device memory of device 0; stream-ordered on `reader`.
    let code = unsafe {
        (hip().memcpy_async)(
            result.device_ptr() as usize as *mut c_void,
            managed.dl_tensor().data.cast_const(),
            N * 4,
            3,
            reader.raw(),
        )
    };
    OPEN.store(true, Ordering::SeqCst);
    assert_eq!(code, 0, "hipMemcpyAsync");
    result.to_host().unwrap()
}

/// The checker, or `None` (the test says it is skipped) without a HIP runtime, which
/// `DLPACK_TESTS_EXPECT_DRIVER=present` does not allow.
fn setup() -> Option<Checker> {
    if dlpack_runtime::hip::init().is_err() {
        assert_ne!(
            dlpack_tests::expected_driver(),
            Some(true),
            "the simulator was expected on the library path"
        );
        eprintln!("skipped: no HIP runtime (put the simulator's directory on LD_LIBRARY_PATH)");
        return None;
    }
    Some(
        Checker::attach()
            .expect("the HIP runtime loaded is the simulator, whose checker the test reads"),
    )
}

#[test]
fn a_rocm_tensor_of_the_c_exchange_api_is_ordered_before_the_consumer_stream() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(checker) = setup() else { return };
    let producer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let consumer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let default = Arc::new(HipStream::default_stream(0));
    let deletes = DELETES.load(Ordering::SeqCst);
    let cases: [(Option<i64>, &Arc<HipStream>); 3] = [
        (Some(consumer.raw() as i64), &consumer),
        (Some(0), &default),
        (None, &default),
    ];
    for (stream, reader) in cases {
        let data = held_write(&producer);
        let managed = Python::attach(|py| {
            let obj = Bound::new(py, RocmForeign).unwrap();
            python::managed_from_object(obj.as_any(), &FromDlpackOptions::new().stream(stream))
                .unwrap()
        });
        assert_eq!(ASKED_TYPE.load(Ordering::SeqCst), ffi::kDLROCM);
        assert_eq!(
            Device::from_raw(managed.dl_tensor().device),
            Device::new(DeviceType::Rocm, 0)
        );
        assert_eq!(
            read_on(&managed, reader),
            vec![0x0707_0707; N],
            "stream={stream:?}"
        );
        drop(managed);
        producer.synchronize().unwrap();
        drop(data);
        checker.assert_clean(&format!(
            "C exchange API of a ROCm tensor, stream={stream:?}"
        ));
    }
    assert_eq!(
        DELETES.load(Ordering::SeqCst),
        deletes + 3,
        "each tensor deleted once"
    );
}

#[test]
fn a_rocm_tensor_of_the_c_exchange_api_with_stream_minus_1_is_not_ordered() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(checker) = setup() else { return };
    let producer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let consumer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let data = held_write(&producer);
    let managed = Python::attach(|py| {
        let obj = Bound::new(py, RocmForeign).unwrap();
        python::managed_from_object(obj.as_any(), &FromDlpackOptions::new().stream(Some(-1)))
            .unwrap()
    });
    // The negative control: nothing orders the read after the held write.
    let _ = read_on(&managed, &consumer);
    assert!(
        checker.violations() >= 1,
        "the checker missed the unordered read"
    );
    checker.reset();
    drop(managed);
    producer.synchronize().unwrap();
    drop(data);

    // `stream=1` and `2` are not ROCm values: refused, and the tensor taken is deleted.
    let deletes = DELETES.load(Ordering::SeqCst);
    Python::attach(|py| {
        let obj = Bound::new(py, RocmForeign).unwrap();
        for stream in [1, 2] {
            let err = python::managed_from_object(
                obj.as_any(),
                &FromDlpackOptions::new().stream(Some(stream)),
            )
            .unwrap_err();
            assert!(err.is_instance_of::<PyValueError>(py), "{err}");
        }
    });
    assert_eq!(DELETES.load(Ordering::SeqCst), deletes + 2);
    checker.assert_clean("refused streams");
}

#[test]
fn a_rocm_import_carries_an_event_that_orders_a_relay_after_the_producer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(checker) = setup() else { return };
    let producer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let consumer = Arc::new(HipStream::new_non_blocking(0).unwrap());
    // The next consumer of a relay: a stream the producer never heard of.
    let next = Arc::new(HipStream::new_non_blocking(0).unwrap());
    let import = |stream: Option<i64>| {
        Python::attach(|py| {
            let obj = Bound::new(py, RocmForeign).unwrap();
            python::managed_from_object(obj.as_any(), &FromDlpackOptions::new().stream(stream))
                .unwrap()
        })
    };
    // Right: the import for `consumer` carries an event recorded there, after the producer's
    // work; the next consumer waits on it (as a relay's export does) and reads the values.
    let data = held_write(&producer);
    let managed = import(Some(consumer.raw() as i64));
    let events = managed
        .ready_events()
        .expect("a ROCm import for a consumer stream carries ready events");
    events.wait_on_hip(&next).unwrap();
    assert_eq!(read_on(&managed, &next), vec![0x0707_0707; N]);
    drop(managed);
    producer.synchronize().unwrap();
    drop(data);
    checker.assert_clean("a relay that waits on the import's ready events");
    // With `-1` the producer ordered nothing, and the import carries nothing.
    let data = held_write(&producer);
    let managed = import(Some(-1));
    assert!(
        managed.ready_events().is_none(),
        "stream=-1: nothing to carry"
    );
    OPEN.store(true, Ordering::SeqCst);
    drop(managed);
    producer.synchronize().unwrap();
    drop(data);
    checker.reset();
    // The negative control: the next consumer reads without waiting on the events.
    let data = held_write(&producer);
    let managed = import(Some(consumer.raw() as i64));
    let _ = read_on(&managed, &next);
    assert!(
        checker.report().contains("is not ordered after the write"),
        "the checker missed the relay's unordered read: {}",
        checker.report()
    );
    checker.reset();
    drop(managed);
    producer.synchronize().unwrap();
    drop(data);
}
