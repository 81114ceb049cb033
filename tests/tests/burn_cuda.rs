//! burn's CUDA backend (feature `burn-cuda`), on any CUDA driver: the simulator (`cuda-sim`,
//! run by the test command) or a GPU (`scripts/gpu-suite.sh`).
//!
//! What is this crate's, with no kernel of burn's (tensors made from host data, read back with
//! `into_data`, transposed by their strides): the export lends burn's device memory in place
//! after the host has waited for burn's work, and the import copies a producer's memory on a
//! stream of ours ordered after the producer's pending work (a [`Gate`] holds it), into memory
//! of burn's client, before burn sees the tensor. On the simulator its happens-before checker
//! reports no violation for either, and reports the race in the negative controls: an export
//! that skips the wait (`from_primitive_unsynchronized`), an import from a producer asked for no
//! ordering (`stream=-1`). Dtypes both ways, strided imports, a host copy, refusals, the
//! deleter once, tensors made on another thread and given back.
//!
//! Every case runs on both of burn's CUDA backends: `cube::NAME` on `CubeBackend` and
//! `fused::NAME` on `Fusion<CubeBackend>` (`burn_cuda::Cuda` with burn-cuda's default features),
//! whose tensors are entries in fusion's queue of deferred operations (the export has fusion
//! run those the tensor still waits for).
//!
//! burn's kernels need NVRTC and a GPU, which the simulator does not run: the round trips
//! through burn's operations (`gpu_` tests) run on a GPU only and say they are skipped on the
//! simulator.
#![cfg(feature = "burn-cuda")]

use std::sync::Arc;
use std::time::Duration;

use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::{Fusion, FusionTensor};
use burn_tensor::backend::Backend;
use burn_tensor::{
    BasicOps, Bool, DType, Float, Int, Tensor, TensorData, TensorPrimitive, bf16, f16,
};
use cuda_sim_testing::{Checker, Gate};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use dlpack_runtime::burn::BurnError;
use dlpack_runtime::burn::cuda::{
    BurnCudaTensor, CudaPrimitive, consumer_stream, tensor_from_dlpack, tensor_from_managed,
};
use dlpack_runtime::{
    DataType, Device, DlpackExport, ExportRequest, ImportBuffer, ImportedData, ManagedTensor,
};
use dlpack_tests::gpu::{GpuStrided, GpuTensor};
use dlpack_tests::types::tensor;
use dlpack_tests::{Counter, DropGuard};

/// burn's CUDA backend without fusion (`burn_cuda::Cuda` without burn-cuda's `fusion` feature).
type Unfused = CubeBackend<CudaRuntime, f32, i32, u8>;

/// burn's fused CUDA backend (`burn_cuda::Cuda` with burn-cuda's default features).
type Fused = Fusion<Unfused>;

/// A CUDA backend of burn, each of whose tensor kinds this crate exports and imports, and whose
/// tensors the tests can see the `CubeTensor` of. Every case runs on [`Unfused`] (module
/// `cube`) and on [`Fused`] (module `fused`).
trait CudaBackend:
    Backend<
        Device = CudaDevice,
        FloatElem = f32,
        FloatTensorPrimitive: CudaPrimitive + ToCube,
        IntTensorPrimitive: CudaPrimitive + ToCube,
        BoolTensorPrimitive: CudaPrimitive + ToCube,
    >
{
}

impl CudaBackend for Unfused {}
impl CudaBackend for Fused {}

/// The `CubeTensor` a primitive stands for.
trait ToCube {
    fn cube(self) -> CubeTensor<CudaRuntime>;
}

impl ToCube for CubeTensor<CudaRuntime> {
    fn cube(self) -> CubeTensor<CudaRuntime> {
        self
    }
}

impl ToCube for FusionTensor<FusionCubeRuntime<CudaRuntime>> {
    /// Runs what fusion still holds for the tensor and takes its handle.
    fn cube(self) -> CubeTensor<CudaRuntime> {
        let client = self.client.clone();
        client.resolve_tensor_float::<Unfused>(self)
    }
}

impl<B: Backend> ToCube for TensorPrimitive<B>
where
    B::FloatTensorPrimitive: ToCube,
{
    fn cube(self) -> CubeTensor<CudaRuntime> {
        match self {
            TensorPrimitive::Float(tensor) => tensor.cube(),
            TensorPrimitive::QFloat(_) => panic!("no test quantizes"),
        }
    }
}

const NEEDS_DRIVER: &str =
    "needs a CUDA driver: the CUDA simulator on the library path (scripts/cuda-sim.sh) or a GPU";
const NEEDS_SIMULATOR: &str = "needs the CUDA simulator on the library path (scripts/cuda-sim.sh): a real driver has no checker";

/// How long a releaser thread holds a gate: long enough that the code under test has enqueued
/// its work (and is waiting) before the producer's work runs.
const HELD: Duration = Duration::from_millis(100);

/// Device 0's primary context, bound to this thread, a stream of it, and the checker where the
/// driver is the simulator.
fn setup() -> (CudaDevice, Arc<CudaStream>, Option<Checker>) {
    let ctx = CudaContext::new(0).expect(NEEDS_DRIVER);
    ctx.bind_to_thread().unwrap();
    let checker = Checker::attach();
    (CudaDevice::new(0), ctx.new_stream().unwrap(), checker)
}

/// The checker, for a negative control: on a real driver (no checker) the test says it is
/// skipped.
fn needs_checker(checker: Option<Checker>, test: &str) -> Option<Checker> {
    if checker.is_none() {
        println!("{test}: skipped, {NEEDS_SIMULATOR}");
    }
    checker
}

fn assert_clean(checker: &Option<Checker>, what: &str) {
    if let Some(checker) = checker {
        checker.assert_clean(what);
    }
}

/// A 3x4 float32 matrix 0..12, uploaded by burn (no kernel).
fn matrix<B: CudaBackend>(device: &CudaDevice) -> Tensor<B, 2> {
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    Tensor::from_data(TensorData::new(values, [3, 4]), device)
}

/// The `CubeTensor` of a clone of `t`.
fn primitive<B: CudaBackend, const D: usize, K: BasicOps<B>>(
    t: &Tensor<B, D, K>,
) -> CubeTensor<CudaRuntime>
where
    K::Primitive: ToCube,
{
    t.clone().into_primitive().cube()
}

/// The device address cubecl's client gives for a tensor's handle.
fn address(t: &CubeTensor<CudaRuntime>) -> u64 {
    t.client
        .get_resource(t.handle.clone())
        .unwrap()
        .resource()
        .ptr
}

/// Copies `len` bytes of device memory at `ptr` to the host on `stream`, and waits for it.
fn read_on(ptr: u64, len: usize, stream: &CudaStream) -> Vec<u8> {
    let mut out = vec![0u8; len];
    stream.context().bind_to_thread().unwrap();
    // SAFETY: `ptr` is `len` bytes of a live allocation of the bound context; `out` has room
    // for them and is waited for below, before it is read.
    unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, len, stream.cu_stream()) }
        .result()
        .unwrap();
    stream.synchronize().unwrap();
    out
}

/// The elements of an exported tensor, read on `stream` as the layout says (strides in
/// elements, non-negative).
fn elements<T: Copy + Default>(managed: &ManagedTensor, stream: &CudaStream) -> Vec<T> {
    let dl = managed.dl_tensor();
    let layout = managed.layout().unwrap();
    let shape = layout.shape().to_vec();
    let strides = layout.strides_vec();
    let size = core::mem::size_of::<T>();
    let span = shape
        .iter()
        .zip(&strides)
        .map(|(&e, &s)| (e - 1) * s)
        .sum::<i64>() as usize
        + 1;
    let bytes = read_on(dl.data as u64 + dl.byte_offset, span * size, stream);
    let at = |i: usize| -> T {
        // SAFETY: `i` is below `span`, inside `bytes`; the bytes hold values of `T`.
        unsafe { bytes.as_ptr().add(i * size).cast::<T>().read_unaligned() }
    };
    let mut out = Vec::new();
    let mut index = vec![0i64; shape.len()];
    let numel: i64 = shape.iter().product();
    for _ in 0..numel {
        let offset: i64 = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.push(at(offset as usize));
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

fn to_stream(stream: &CudaStream) -> ExportRequest {
    ExportRequest::versioned().stream(Some(stream.cu_stream() as i64))
}

/// Enqueues a write of `value` to every element of `buf` on `stream`.
fn fill(buf: &CudaSlice<u32>, stream: &CudaStream, value: u32) {
    let (ptr, _record) = buf.device_ptr(stream);
    // SAFETY: `ptr` is `buf.len()` u32 of a live allocation; stream-ordered.
    unsafe { sys::cuMemsetD32Async(ptr, value, buf.len(), stream.cu_stream()) }
        .result()
        .unwrap();
}

/// Releases `gate` from another thread after [`HELD`].
fn release_later(gate: Gate) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(HELD);
        gate.release();
    })
}

fn a_burn_cuda_tensor_is_lent_in_place_after_burns_work<B: CudaBackend>() {
    let (device, b, checker) = setup();
    let t = matrix::<B>(&device);
    let at = address(&primitive(&t));
    let managed = BurnCudaTensor::new(t.clone())
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    let dl = managed.dl_tensor();
    assert_eq!(Device::from_raw(dl.device), Device::cuda(0));
    assert_eq!(DataType::from_raw(dl.dtype), DataType::F32);
    assert_eq!(
        dl.data as u64 + dl.byte_offset,
        at,
        "zero-copy: burn's own memory"
    );
    assert!(
        managed.is_read_only(),
        "burn's memory is shared with its clones"
    );
    assert_eq!(managed.layout().unwrap().shape(), [3, 4]);
    let values: Vec<f32> = elements(&managed, &b);
    assert_eq!(values, (0..12).map(|v| v as f32).collect::<Vec<_>>());
    // The export holds burn's handle: the memory outlives the tensor it came from.
    drop(t);
    let again: Vec<f32> = elements(&managed, &b);
    assert_eq!(again, values);
    drop(managed);
    assert_clean(&checker, "an export after the host wait");
}

fn without_the_wait_the_consumer_reads_while_burn_still_writes<B: CudaBackend>() {
    let (device, b, checker) = setup();
    let Some(checker) = needs_checker(checker, "the export without the wait") else {
        return;
    };
    // Wrong: burn's upload is pending on cubecl's stream, and nothing orders the consumer's
    // read after it.
    let t = matrix::<B>(&device);
    // SAFETY: deliberately broken (the negative control): the consumer below reads the memory
    // unordered with burn's upload; the simulator's memory is host memory, so the race is a
    // report of the checker, not undefined behaviour of this process.
    let lent = unsafe { BurnCudaTensor::from_primitive_unsynchronized(primitive(&t)) }.unwrap();
    let managed = lent.into_dlpack_with(&to_stream(&b)).unwrap();
    let _values: Vec<f32> = elements(&managed, &b);
    let report = checker.report();
    assert!(
        checker.violations() >= 1,
        "the read unordered with burn's upload is reported: {report}"
    );
    assert!(
        report.contains("is not ordered after the write"),
        "{report}"
    );
    drop(managed);
    // Right: the same with the wait.
    checker.reset();
    let t = matrix::<B>(&device);
    let managed = BurnCudaTensor::new(t)
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    let values: Vec<f32> = elements(&managed, &b);
    assert_eq!(values[11], 11.0);
    drop(managed);
    checker.assert_clean("the same export with the wait");
}

fn a_transposed_burn_cuda_tensor_is_lent_with_its_strides<B: CudaBackend>() {
    let (device, b, checker) = setup();
    let t = matrix::<B>(&device);
    let at = address(&primitive(&t));
    // cubecl transposes by swapping strides: no kernel, the same memory.
    let managed = BurnCudaTensor::new(t.transpose())
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    let layout = managed.layout().unwrap();
    assert_eq!(layout.shape(), [4, 3]);
    assert_eq!(layout.strides_vec(), [1, 4]);
    assert_eq!(layout.first_element_ptr() as u64, at);
    let values: Vec<f32> = elements(&managed, &b);
    assert_eq!(&values[..4], [0.0, 4.0, 8.0, 1.0]);
    drop(managed);
    assert_clean(&checker, "a transposed export");
}

fn a_lent_tensor_comes_back_as_a_tensor_of_its_backend<B: CudaBackend>() {
    let (device, b, checker) = setup();
    let t = matrix::<B>(&device);
    let lent = BurnCudaTensor::new(t.clone()).unwrap();
    let at = address(lent.primitive());
    let back: Tensor<B, 2> = lent.into_tensor().unwrap();
    assert_eq!(address(&primitive(&back)), at, "the same memory");
    assert_eq!(back.into_data(), t.clone().into_data());
    let err = BurnCudaTensor::new(t.clone())
        .unwrap()
        .into_tensor::<B, 3, Float>()
        .unwrap_err();
    assert!(
        matches!(
            err,
            BurnError::Rank {
                found: 2,
                expected: 3
            }
        ),
        "{err}"
    );
    // A float tensor is no Int tensor, and a bool tensor no Float tensor.
    let err = BurnCudaTensor::new(t)
        .unwrap()
        .into_tensor::<B, 2, Int>()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "a DLPack float32 tensor cannot become a burn-cuda Int tensor, expected an integer dtype"
    );
    let flags = Tensor::<B, 1, Bool>::from_data(TensorData::new(vec![true, false], [2]), &device);
    let err = BurnCudaTensor::new(flags)
        .unwrap()
        .into_tensor::<B, 1, Float>()
        .unwrap_err();
    assert!(
        matches!(err, BurnError::Kind { kind: "Float", found, .. } if found == DataType::BOOL),
        "{err}"
    );
    b.synchronize().unwrap();
    assert_clean(&checker, "a lent tensor given back");
}

fn a_tensor_made_on_another_thread_is_lent_after_its_work<B: CudaBackend>() {
    let (device, b, checker) = setup();
    // burn enqueues on the cubecl stream (and, fused, the fusion stream) of the thread that
    // makes the tensor: the export, on this thread, is ordered after that work all the same.
    // (The negative control of the wait is `without_the_wait_the_consumer_reads_while_burn_still_writes`:
    // across threads, the simulator's one host clock lets a host wait of a test running beside
    // this one order the other thread's upload, so a race here is not certain to be seen.)
    let (t, maker) = made_on_another_thread::<B>(&device);
    let managed = BurnCudaTensor::new(t)
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    let values: Vec<f32> = elements(&managed, &b);
    assert_eq!(&values[..4], [0.0, 4.0, 8.0, 1.0]);
    drop(managed);
    assert_clean(&checker, "an export of another thread's tensor");
    maker.finish();
}

/// A thread that made a tensor and is kept alive until [`finish`](Maker::finish): cubecl may
/// wait for a thread's stream when the thread ends, which would order its work before the
/// test's reads whatever the code under test did.
struct Maker {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Maker {
    fn finish(self) {
        self.done.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

/// The transpose of [`matrix`], made on another thread, which stays alive.
fn made_on_another_thread<B: CudaBackend>(device: &CudaDevice) -> (Tensor<B, 2>, Maker) {
    let (send, made) = std::sync::mpsc::channel();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let device = device.clone();
    let thread = std::thread::spawn(move || {
        send.send(matrix::<B>(&device).transpose()).unwrap();
        wait.recv().unwrap();
    });
    (made.recv().unwrap(), Maker { done, thread })
}

fn a_host_consumer_gets_a_copy_of_a_burn_cuda_tensor<B: CudaBackend>() {
    let (device, _b, checker) = setup();
    // `dl_device=(CPU, 0)`: the export copies the transposed tensor to compact host memory.
    let managed = BurnCudaTensor::new(matrix::<B>(&device).transpose())
        .unwrap()
        .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
        .unwrap();
    assert!(managed.is_copied());
    assert_eq!(Device::from_raw(managed.dl_tensor().device), Device::CPU);
    let view = ImportedData::<f32>::from_managed(managed).unwrap();
    assert_eq!(
        view.as_slice().unwrap(),
        [0.0, 4.0, 8.0, 1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0]
    );
    drop(view);
    assert_clean(&checker, "a host copy");
}

fn int_bool_and_half_burn_cuda_tensors_are_lent_with_their_dtypes<B: CudaBackend>() {
    let (device, b, checker) = setup();
    let ints = Tensor::<B, 1, Int>::from_data(TensorData::new(vec![-3i32, 0, 7], [3]), &device);
    let managed = BurnCudaTensor::new(ints)
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), DataType::I32);
    assert_eq!(elements::<i32>(&managed, &b), [-3, 0, 7]);
    let bools = Tensor::<B, 1, Bool>::from_data(
        TensorData::new(vec![true, false, true, true], [4]),
        &device,
    );
    let managed = BurnCudaTensor::new(bools)
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    assert_eq!(
        DataType::from_raw(managed.dl_tensor().dtype),
        DataType::BOOL
    );
    assert_eq!(elements::<u8>(&managed, &b), [1, 0, 1, 1]);
    let halves = Tensor::<B, 1>::from_data(
        TensorData::new(vec![f16::from_f32(0.5), f16::from_f32(-2.0)], [2]),
        (&device, DType::F16),
    );
    let managed = BurnCudaTensor::new(halves)
        .unwrap()
        .into_dlpack_with(&to_stream(&b))
        .unwrap();
    assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), DataType::F16);
    assert_eq!(
        elements::<u16>(&managed, &b),
        [f16::from_f32(0.5).to_bits(), f16::from_f32(-2.0).to_bits()]
    );
    assert_clean(&checker, "exports of each kind");
}

fn an_import_copies_after_the_producers_pending_work<B: CudaBackend>() {
    let (device, a, checker) = setup();
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(1024).unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 7);
    let producer = GpuTensor::new(buf, &a, &counter);
    let at = producer.data.device_ptr(&a).0;
    // The import waits on the host for its copy, which waits for the gated fill: let it go
    // from another thread once everything is enqueued.
    let releaser = release_later(gate);
    let t: Tensor<B, 1, Int> = tensor_from_dlpack(producer, &device).unwrap();
    releaser.join().unwrap();
    assert_eq!(counter.get(), 1, "the producer's deleter ran, once");
    assert_ne!(address(&primitive(&t)), at, "a copy");
    assert_eq!(t.dtype(), DType::U32);
    let values: Vec<u32> = t.into_data().to_vec().unwrap();
    assert_eq!(values, vec![7; 1024], "the copy ran after the fill");
    a.synchronize().unwrap();
    assert_clean(&checker, "an import after pending producer work");
}

fn an_import_whose_producer_was_asked_for_no_ordering_races_its_work<B: CudaBackend>() {
    let (device, a, checker) = setup();
    let Some(checker) = needs_checker(checker, "the import without ordering") else {
        return;
    };
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(1024).unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 7);
    // Wrong: `stream=-1` asks the producer for no ordering, and the copy on our stream then
    // reads while the fill is pending (held by the gate, so the race is certain).
    let managed = GpuTensor::new(buf, &a, &counter)
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(-1)))
        .unwrap();
    let stream = consumer_stream(0).unwrap();
    let t = tensor_from_managed::<B, 1, Int>(managed, &device, &stream).unwrap();
    let report = checker.report();
    let n = checker.violations();
    gate.release();
    a.synchronize().unwrap();
    assert!(n >= 1, "the unordered copy is reported: {report}");
    assert!(
        report.contains("is not ordered after the write"),
        "{report}"
    );
    drop(t);
    assert_eq!(counter.get(), 1);
}

fn a_strided_import_is_copied_compact_and_row_major<B: CudaBackend>() {
    let (device, a, checker) = setup();
    let counter = Counter::new();
    let host: Vec<u32> = (0..12).collect();
    let data = a.clone_htod(&host).unwrap();
    // The transpose of a 3x4 row-major matrix: shape (4, 3), strides (1, 4).
    let producer = GpuStrided {
        data,
        shape: vec![4, 3],
        strides: vec![1, 4],
        byte_offset: 0,
        stream: a.clone(),
        guard: counter.guard(),
    };
    let t: Tensor<B, 2, Int> = tensor_from_dlpack(producer, &device).unwrap();
    assert_eq!(counter.get(), 1);
    let p = primitive(&t);
    assert_eq!(p.meta.strides().to_vec(), [3, 1], "compact row-major");
    let values: Vec<u32> = t.into_data().to_vec().unwrap();
    assert_eq!(values, [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
    // Element (0, 0) at an offset, strides (4, 1) over a 2x2 window.
    let producer = GpuStrided {
        data: a.clone_htod(&host).unwrap(),
        shape: vec![2, 2],
        strides: vec![4, 1],
        byte_offset: 5 * 4,
        stream: a.clone(),
        guard: DropGuard::default(),
    };
    let t: Tensor<B, 2, Int> = tensor_from_dlpack(producer, &device).unwrap();
    let values: Vec<u32> = t.into_data().to_vec().unwrap();
    assert_eq!(values, [5, 6, 9, 10]);
    assert_clean(&checker, "strided imports");
}

fn burn_cuda_tensors_come_back_from_their_own_exports_as_copies<B: CudaBackend>() {
    let (device, _b, checker) = setup();
    // Float (float32 and float16, bfloat16), Int and Bool, through an export and an import.
    let t = matrix::<B>(&device);
    let back: Tensor<B, 2> =
        tensor_from_dlpack(BurnCudaTensor::new(t.clone()).unwrap(), &device).unwrap();
    assert_ne!(address(&primitive(&back)), address(&primitive(&t)));
    assert_eq!(back.into_data(), t.into_data());
    for data in [
        TensorData::new(vec![f16::from_f32(1.5), f16::from_f32(-0.25)], [2]),
        TensorData::new(vec![bf16::from_f32(3.0), bf16::from_f32(-8.0)], [2]),
    ] {
        let t = Tensor::<B, 1>::from_data(data.clone(), (&device, data.dtype));
        let back: Tensor<B, 1> =
            tensor_from_dlpack(BurnCudaTensor::new(t).unwrap(), &device).unwrap();
        assert_eq!(back.dtype(), data.dtype);
        assert_eq!(back.into_data(), data);
    }
    let ints = Tensor::<B, 2, Int>::from_data(
        TensorData::new(vec![i64::MIN, -1, 0, i64::MAX], [2, 2]),
        (&device, DType::I64),
    );
    let back: Tensor<B, 2, Int> =
        tensor_from_dlpack(BurnCudaTensor::new(ints.clone()).unwrap(), &device).unwrap();
    assert_eq!(back.dtype(), DType::I64);
    assert_eq!(back.into_data(), ints.into_data());
    let bools = Tensor::<B, 1, Bool>::from_data(TensorData::new(vec![false, true], [2]), &device);
    let back: Tensor<B, 1, Bool> =
        tensor_from_dlpack(BurnCudaTensor::new(bools.clone()).unwrap(), &device).unwrap();
    assert_eq!(back.into_data(), bools.into_data());
    assert_clean(&checker, "round trips");
}

fn host_tensors_are_uploaded_by_burn<B: CudaBackend>() {
    let (device, _b, checker) = setup();
    let counter = Counter::new();
    let t: Tensor<B, 2> = tensor_from_dlpack(
        tensor(vec![1.5f32, 2.5, 3.5, 4.5], &[2, 2], &counter),
        &device,
    )
    .unwrap();
    assert_eq!(t.into_data().to_vec::<f32>().unwrap(), [1.5, 2.5, 3.5, 4.5]);
    let flags: Tensor<B, 1, Bool> =
        tensor_from_dlpack(tensor(vec![true, false], &[2], &counter), &device).unwrap();
    // burn-cuda keeps bools as bytes (`Bool(U8)`).
    assert_eq!(flags.into_data().to_vec::<u8>().unwrap(), [1, 0]);
    assert_eq!(counter.get(), 2);
    assert_clean(&checker, "host imports");
}

fn imports_burn_cuda_cannot_hold_are_refused_and_the_deleter_runs<B: CudaBackend>() {
    let (device, a, checker) = setup();
    let counter = Counter::new();
    let producer = || GpuTensor::new(a.alloc_zeros::<u32>(4).unwrap(), &a, &counter);
    let err = tensor_from_dlpack::<B, 2, Int, _>(producer(), &device).unwrap_err();
    assert!(
        matches!(
            err,
            BurnError::Rank {
                found: 1,
                expected: 2
            }
        ),
        "{err}"
    );
    let err = tensor_from_dlpack::<B, 1, Float, _>(producer(), &device).unwrap_err();
    assert!(
        matches!(
            err,
            BurnError::Kind {
                kind: "Float",
                backend: "burn-cuda",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("a DLPack uint32 tensor cannot become a burn-cuda Float tensor"),
        "{err}"
    );
    let err = tensor_from_dlpack::<B, 1, Float, _>(tensor(vec![1.0f64], &[1], &counter), &device)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "a DLPack float64 tensor cannot become a burn-cuda Float tensor, expected float32, float16 or bfloat16 (burn-cuda registers no float64)"
    );
    // burn has no rank-0 tensors: a scalar is refused, from the host and from the device.
    let err = tensor_from_dlpack::<B, 0, Float, _>(tensor(vec![1.5f32], &[], &counter), &device)
        .unwrap_err();
    assert!(matches!(err, BurnError::RankZero), "{err}");
    let scalar = GpuStrided {
        data: a.clone_htod(&[3u32]).unwrap(),
        shape: vec![],
        strides: vec![],
        byte_offset: 0,
        stream: a.clone(),
        guard: counter.guard(),
    };
    let err = tensor_from_dlpack::<B, 0, Int, _>(scalar, &device).unwrap_err();
    assert!(matches!(err, BurnError::RankZero), "{err}");
    assert_eq!(counter.get(), 5, "every refused producer's deleter ran");
    // Memory of another device, given without a copy: refused with the two devices named.
    if let Ok(ctx1) = CudaContext::new(1) {
        let other = ctx1.new_stream().unwrap();
        let managed = GpuTensor::new(other.alloc_zeros::<u32>(4).unwrap(), &other, &counter)
            .into_dlpack_with(&to_stream(&other))
            .unwrap();
        let stream = consumer_stream(0).unwrap();
        let err = tensor_from_managed::<B, 1, Int>(managed, &device, &stream).unwrap_err();
        assert!(
            matches!(err, BurnError::Device { found, expected } if found == Device::cuda(1) && expected == Device::cuda(0)),
            "{err}"
        );
        assert_eq!(counter.get(), 6);
    } else {
        println!("one CUDA device: the refusal of another device's memory is not tested");
    }
    assert_clean(&checker, "refused imports");
}

/// Whether burn's kernels can run: on a GPU, not on the simulator (no NVRTC kernels run there);
/// says so when they cannot.
fn kernels_run(checker: &Option<Checker>, test: &str) -> bool {
    if checker.is_some() {
        println!("{test}: skipped on the CUDA simulator (burn's kernels need NVRTC and a GPU)");
        return false;
    }
    true
}

/// The 3x4 matrix `m` of [`matrix`], as burn's kernels below compute from it: `m mᵀ * 2 + 1`.
fn expected_gram() -> Vec<f32> {
    let m: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let mut out = Vec::new();
    for i in 0..3 {
        for j in 0..3 {
            let dot: f32 = (0..4).map(|k| m[i * 4 + k] * m[j * 4 + k]).sum();
            out.push(dot * 2.0 + 1.0);
        }
    }
    out
}

fn gpu_the_result_of_burns_kernels_is_lent_after_they_ran<B: CudaBackend>() {
    let (device, b, checker) = setup();
    if !kernels_run(
        &checker,
        "gpu_the_result_of_burns_kernels_is_lent_after_they_ran",
    ) {
        return;
    }
    for _ in 0..20 {
        let m = matrix::<B>(&device);
        // Enqueued on cubecl's stream and still running when the export begins.
        let y = m.clone().matmul(m.transpose()) * 2.0 + 1.0;
        let managed = BurnCudaTensor::new(y.clone())
            .unwrap()
            .into_dlpack_with(&to_stream(&b))
            .unwrap();
        let values: Vec<f32> = elements(&managed, &b);
        assert_eq!(values, expected_gram());
        assert_eq!(y.into_data().to_vec::<f32>().unwrap(), expected_gram());
    }
}

fn gpu_an_import_feeds_burns_kernels<B: CudaBackend>() {
    let (device, a, checker) = setup();
    if !kernels_run(&checker, "gpu_an_import_feeds_burns_kernels") {
        return;
    }
    let counter = Counter::new();
    let buf = a.alloc_zeros::<u32>(1 << 20).unwrap();
    let gate = Gate::hold(&a);
    fill(&buf, &a, 7);
    let releaser = release_later(gate);
    let t: Tensor<B, 1, Int> =
        tensor_from_dlpack(GpuTensor::new(buf, &a, &counter), &device).unwrap();
    releaser.join().unwrap();
    assert_eq!(counter.get(), 1);
    let sum: f32 = (t.float() * 2.0 + 1.0).sum().into_scalar();
    assert_eq!(
        sum,
        15.0 * (1 << 20) as f32,
        "every element was 7 when burn read it"
    );
    // A strided import (the transpose of a 3x4 matrix) into a matmul.
    let host: Vec<u32> = (0..12).collect();
    let producer = GpuStrided {
        data: a.clone_htod(&host).unwrap(),
        shape: vec![4, 3],
        strides: vec![1, 4],
        byte_offset: 0,
        stream: a.clone(),
        guard: DropGuard::default(),
    };
    let mt: Tensor<B, 2, Int> = tensor_from_dlpack(producer, &device).unwrap();
    let gram = matrix::<B>(&device).matmul(mt.float()) * 2.0 + 1.0;
    assert_eq!(gram.into_data().to_vec::<f32>().unwrap(), expected_gram());
}

fn gpu_half_precision_tensors_go_through_burns_kernels_both_ways<B: CudaBackend>() {
    let (device, _b, checker) = setup();
    if !kernels_run(
        &checker,
        "gpu_half_precision_tensors_go_through_burns_kernels_both_ways",
    ) {
        return;
    }
    for dtype in [DType::F16, DType::BF16] {
        let m = matrix::<B>(&device).cast(dtype);
        let y = m.clone() * 2.0 - 3.0;
        let back: Tensor<B, 2> =
            tensor_from_dlpack(BurnCudaTensor::new(y).unwrap(), &device).unwrap();
        assert_eq!(back.dtype(), dtype);
        let z = (back + 3.0).cast(DType::F32) / 2.0;
        let values: Vec<f32> = z.into_data().to_vec().unwrap();
        assert_eq!(values, (0..12).map(|v| v as f32).collect::<Vec<_>>());
    }
}

/// Python objects made burn CUDA tensors (`burn::cuda::tensor_from_py`, feature `python`).
#[cfg(feature = "python")]
mod python {
    use std::sync::atomic::{AtomicBool, Ordering};

    use dlpack_runtime::burn::cuda::tensor_from_py;
    use dlpack_runtime::python::{FromDlpackOptions, export_once, managed_from_object};
    use dlpack_tests::py::eval as run;
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::*;

    fn locals(py: Python<'_>) -> Bound<'_, PyDict> {
        dlpack_tests::py::with_torch(py)
    }

    pub fn numpy_and_torch_host_tensors_become_burn_cuda_tensors<B: CudaBackend>() {
        let (device, _b, checker) = setup();
        Python::attach(|py| {
            let l = locals(py);
            // A transposed view: copied onto the device as it is, then compact into burn's.
            let arr = run(
                py,
                "result = np.arange(12, dtype=np.float32).reshape(3, 4).T",
                &l,
            );
            let t: Tensor<B, 2> = tensor_from_py(&arr, &device).unwrap();
            assert_eq!(t.dtype(), DType::F32);
            assert_eq!(
                t.into_data().to_vec::<f32>().unwrap(),
                [0.0, 4.0, 8.0, 1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0]
            );
            let ints = run(
                py,
                "result = torch.tensor([[-5, 0], [7, 2**40]], dtype=torch.int64)",
                &l,
            );
            let t: Tensor<B, 2, Int> = tensor_from_py(&ints, &device).unwrap();
            assert_eq!(t.dtype(), DType::I64);
            assert_eq!(t.into_data().to_vec::<i64>().unwrap(), [-5, 0, 7, 1 << 40]);
            let flags = run(py, "result = np.array([True, False, True])", &l);
            let t: Tensor<B, 1, Bool> = tensor_from_py(&flags, &device).unwrap();
            assert_eq!(t.into_data().to_vec::<u8>().unwrap(), [1, 0, 1]);
            let halves = run(
                py,
                "result = torch.tensor([0.5, -2.0], dtype=torch.bfloat16)",
                &l,
            );
            let t: Tensor<B, 1> = tensor_from_py(&halves, &device).unwrap();
            assert_eq!(t.dtype(), DType::BF16);
            assert_eq!(
                t.into_data().to_vec::<bf16>().unwrap(),
                [bf16::from_f32(0.5), bf16::from_f32(-2.0)]
            );
            // Refused: a BufferError naming what was found and expected.
            let doubles = run(py, "result = np.zeros(2)", &l);
            let err = tensor_from_py::<B, 1, Float>(&doubles, &device).unwrap_err();
            assert!(err.is_instance_of::<pyo3::exceptions::PyBufferError>(py));
            assert!(
                err.to_string()
                    .contains("a DLPack float64 tensor cannot become a burn-cuda Float tensor"),
                "{err}"
            );
        });
        assert_clean(&checker, "imports of host tensors from Python");
    }

    pub fn a_python_producers_pending_work_is_ordered_before_the_copy_without_the_gil<
        B: CudaBackend,
    >() {
        let (device, a, checker) = setup();
        let counter = Counter::new();
        let buf = a.alloc_zeros::<u32>(1024).unwrap();
        let gate = Gate::hold(&a);
        fill(&buf, &a, 7);
        let producer = GpuTensor::new(buf, &a, &counter);
        // While the import waits on the host for its copy (held behind the gate), another
        // thread takes the GIL; the gate opens after that, or after 20 s if the GIL stays held
        // (another test may hold it for seconds, importing torch).
        let gil_free = Arc::new(AtomicBool::new(false));
        let releaser = {
            let gil_free = gil_free.clone();
            std::thread::spawn(move || {
                std::thread::sleep(HELD);
                let (took, taken) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    Python::attach(|_py| ());
                    let _ = took.send(());
                });
                let free = taken.recv_timeout(Duration::from_secs(20)).is_ok();
                gil_free.store(free, Ordering::SeqCst);
                gate.release();
            })
        };
        let t: Tensor<B, 1, Int> = Python::attach(|py| {
            let obj = export_once(py, producer).unwrap();
            tensor_from_py(&obj, &device).unwrap()
        });
        releaser.join().unwrap();
        assert!(
            gil_free.load(Ordering::SeqCst),
            "another thread took the GIL while the import waited"
        );
        assert_eq!(counter.get(), 1, "the producer's deleter ran, once");
        assert_eq!(t.dtype(), DType::U32);
        let values: Vec<u32> = t.into_data().to_vec().unwrap();
        assert_eq!(values, vec![7; 1024], "the copy ran after the fill");
        a.synchronize().unwrap();
        assert_clean(
            &checker,
            "an import from Python after pending producer work",
        );
        // The negative control: the same producer asked for no ordering (`stream=-1`).
        let Some(checker) = needs_checker(checker, "the Python import without ordering") else {
            return;
        };
        let buf = a.alloc_zeros::<u32>(1024).unwrap();
        let gate = Gate::hold(&a);
        fill(&buf, &a, 7);
        let producer = GpuTensor::new(buf, &a, &counter);
        let managed = Python::attach(|py| {
            let obj = export_once(py, producer).unwrap();
            let options = FromDlpackOptions::new()
                .device(Device::cuda(0))
                .stream(Some(-1));
            managed_from_object(&obj, &options).unwrap()
        });
        let stream = consumer_stream(0).unwrap();
        let t = tensor_from_managed::<B, 1, Int>(managed, &device, &stream).unwrap();
        let report = checker.report();
        gate.release();
        a.synchronize().unwrap();
        assert!(
            report.contains("is not ordered after the write"),
            "the unordered copy is reported: {report}"
        );
        drop(t);
        assert_eq!(counter.get(), 2);
    }
}

/// Each case as a test of each backend: `cube::NAME` and `fused::NAME`.
macro_rules! backend_tests {
    ($module:ident, $backend:ty) => {
        mod $module {
            #[cfg(feature = "python")]
            #[test]
            fn numpy_and_torch_host_tensors_become_burn_cuda_tensors() {
                super::python::numpy_and_torch_host_tensors_become_burn_cuda_tensors::<$backend>();
            }
            #[cfg(feature = "python")]
            #[test]
            fn a_python_producers_pending_work_is_ordered_before_the_copy_without_the_gil() {
                super::python::a_python_producers_pending_work_is_ordered_before_the_copy_without_the_gil::<$backend>();
            }
            #[test]
            fn a_burn_cuda_tensor_is_lent_in_place_after_burns_work() {
                super::a_burn_cuda_tensor_is_lent_in_place_after_burns_work::<$backend>();
            }
            #[test]
            fn without_the_wait_the_consumer_reads_while_burn_still_writes() {
                super::without_the_wait_the_consumer_reads_while_burn_still_writes::<$backend>();
            }
            #[test]
            fn a_transposed_burn_cuda_tensor_is_lent_with_its_strides() {
                super::a_transposed_burn_cuda_tensor_is_lent_with_its_strides::<$backend>();
            }
            #[test]
            fn a_lent_tensor_comes_back_as_a_tensor_of_its_backend() {
                super::a_lent_tensor_comes_back_as_a_tensor_of_its_backend::<$backend>();
            }
            #[test]
            fn a_tensor_made_on_another_thread_is_lent_after_its_work() {
                super::a_tensor_made_on_another_thread_is_lent_after_its_work::<$backend>();
            }
            #[test]
            fn a_host_consumer_gets_a_copy_of_a_burn_cuda_tensor() {
                super::a_host_consumer_gets_a_copy_of_a_burn_cuda_tensor::<$backend>();
            }
            #[test]
            fn int_bool_and_half_burn_cuda_tensors_are_lent_with_their_dtypes() {
                super::int_bool_and_half_burn_cuda_tensors_are_lent_with_their_dtypes::<$backend>();
            }
            #[test]
            fn an_import_copies_after_the_producers_pending_work() {
                super::an_import_copies_after_the_producers_pending_work::<$backend>();
            }
            #[test]
            fn an_import_whose_producer_was_asked_for_no_ordering_races_its_work() {
                super::an_import_whose_producer_was_asked_for_no_ordering_races_its_work::<$backend>();
            }
            #[test]
            fn a_strided_import_is_copied_compact_and_row_major() {
                super::a_strided_import_is_copied_compact_and_row_major::<$backend>();
            }
            #[test]
            fn burn_cuda_tensors_come_back_from_their_own_exports_as_copies() {
                super::burn_cuda_tensors_come_back_from_their_own_exports_as_copies::<$backend>();
            }
            #[test]
            fn host_tensors_are_uploaded_by_burn() {
                super::host_tensors_are_uploaded_by_burn::<$backend>();
            }
            #[test]
            fn imports_burn_cuda_cannot_hold_are_refused_and_the_deleter_runs() {
                super::imports_burn_cuda_cannot_hold_are_refused_and_the_deleter_runs::<$backend>();
            }
            #[test]
            fn gpu_the_result_of_burns_kernels_is_lent_after_they_ran() {
                super::gpu_the_result_of_burns_kernels_is_lent_after_they_ran::<$backend>();
            }
            #[test]
            fn gpu_an_import_feeds_burns_kernels() {
                super::gpu_an_import_feeds_burns_kernels::<$backend>();
            }
            #[test]
            fn gpu_half_precision_tensors_go_through_burns_kernels_both_ways() {
                super::gpu_half_precision_tensors_go_through_burns_kernels_both_ways::<$backend>();
            }
        }
    };
}

backend_tests!(cube, super::Unfused);
backend_tests!(fused, super::Fused);
