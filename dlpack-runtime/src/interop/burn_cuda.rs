//! burn CUDA interop: the items of `dlpack_runtime::burn::cuda` (documented there, at the crate
//! root).

use core::ffi::c_void;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::OperationStreams;
use burn_fusion::{FusionTensor, NoOp, get_client};
use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use burn_tensor::backend::{Backend, get_device_settings};
use burn_tensor::{BasicOps, BoolStore, DType, Shape, Tensor, TensorData, TensorPrimitive};
use cudarc::driver::CudaStream;

use super::burn::{BurnError, burn_dtype, dlpack_dtype, tensor_data_from_managed};
use crate::engine::cuda::{
    AfterFailedWait, CudaError, CurrentContext, after_failed_wait, bind, context, copy_into_device,
    kept_stream, leak, max_pitch, synchronize,
};
use crate::export::{DlpackExport, ExportBuffer, ExportParts, ExportRequest};
use crate::plan::copy::StridedCopy;
use crate::tensor::device::{Device, DeviceType};
use crate::tensor::dtype::DataType;
use crate::tensor::layout::LayoutError;
use crate::tensor::managed::ManagedTensor;

/// A tensor of burn's CUDA backend: `burn_cubecl::tensor::CubeTensor<CudaRuntime>`.
type CudaTensor = CubeTensor<CudaRuntime>;

/// A tensor of burn's fused CUDA backend (`burn_fusion::Fusion<CubeBackend<CudaRuntime, ..>>`,
/// `burn_cuda::Cuda` with burn-cuda's default features): the same primitive for every element
/// type, bool type and tensor kind.
type FusedTensor = FusionTensor<FusionCubeRuntime<CudaRuntime>>;

/// The backend under the fused one that hands out and takes in its `CubeTensor`s. Its element
/// types are not used: a fused tensor's `CubeTensor` keeps the dtype fusion recorded for it.
type Unfused = CubeBackend<CudaRuntime, f32, i32, u8>;

/// A cubecl error, as a [`BurnError::Backend`].
fn backend_error(err: impl core::fmt::Display) -> BurnError {
    BurnError::Backend {
        reason: err.to_string(),
    }
}

/// A burn tensor primitive of the CUDA backend: the
/// [`TensorKind::Primitive`](burn_tensor::TensorKind::Primitive) of `Float`, `Int` and `Bool`
/// tensors of
/// - `burn_cuda::Cuda<F, I>` as burn-cuda's default features make it, the fused backend
///   `burn_fusion::Fusion<burn_cubecl::CubeBackend<CudaRuntime, F, I, BT>>` (its primitives
///   are `FusionTensor<FusionCubeRuntime<CudaRuntime>>`s);
/// - `burn_cubecl::CubeBackend<CudaRuntime, F, I, BT>` (`burn_cuda::Cuda` without
///   burn-cuda's `fusion` feature; primitives `CubeTensor<CudaRuntime>`).
///
/// Float primitives are [`TensorPrimitive`]s over either. Sealed.
pub trait CudaPrimitive: sealed::Sealed + Sized {
    /// The `CubeTensor` inside, or [`BurnError::Quantized`]. A fused tensor's pending
    /// operations are enqueued first.
    #[doc(hidden)]
    fn into_cube(self) -> Result<CudaTensor, BurnError>;
    /// The primitive around `tensor`: for the fused backend, `tensor` registered with fusion as
    /// a new tensor.
    #[doc(hidden)]
    fn from_cube(tensor: CudaTensor) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::CudaTensor {}
    impl Sealed for super::FusedTensor {}
    impl<B: burn_tensor::backend::Backend> Sealed for burn_tensor::TensorPrimitive<B> {}
}

impl CudaPrimitive for CudaTensor {
    fn into_cube(self) -> Result<CudaTensor, BurnError> {
        Ok(self)
    }
    fn from_cube(tensor: CudaTensor) -> Self {
        tensor
    }
}

impl CudaPrimitive for FusedTensor {
    fn into_cube(self) -> Result<CudaTensor, BurnError> {
        let client = self.client.clone();
        // Fusion defers operations to fuse them: resolving enqueues those still pending on the
        // tensor's fusion stream (their kernels run on cubecl's streams, ordered before any
        // later use of the handle from any thread) and gives the `CubeTensor` the fused
        // tensor stands for. Its handle is shared with fusion while other fused tensors refer
        // to it, so burn never writes it in place while the `CubeTensor` is held. Every kind
        // resolves alike (`float_tensor`, `int_tensor` and `bool_tensor` of `CubeBackend`
        // build the same `CubeTensor`, of the dtype fusion recorded).
        Ok(client.resolve_tensor_float::<Unfused>(self))
    }
    fn from_cube(tensor: CudaTensor) -> Self {
        // As burn-fusion's own `float_from_data`: the handle is registered as the output of an
        // initialization that runs nothing.
        let client = get_client::<Unfused>(&tensor.device);
        let shape = tensor.meta.shape().clone();
        let dtype = tensor.dtype;
        let handle = Unfused::float_tensor_handle(tensor);
        let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
        client
            .register(
                OperationStreams::default(),
                OperationIr::Init(desc),
                NoOp::<Unfused>::new(),
            )
            .output()
    }
}

impl<B: Backend> CudaPrimitive for TensorPrimitive<B>
where
    B::FloatTensorPrimitive: CudaPrimitive,
{
    fn into_cube(self) -> Result<CudaTensor, BurnError> {
        match self {
            TensorPrimitive::Float(tensor) => tensor.into_cube(),
            TensorPrimitive::QFloat(_) => Err(BurnError::Quantized),
        }
    }
    fn from_cube(tensor: CudaTensor) -> Self {
        TensorPrimitive::Float(B::FloatTensorPrimitive::from_cube(tensor))
    }
}

/// The device memory of a burn CUDA tensor, lent read-only: the address cubecl gave for the
/// tensor's handle (its first byte), the length of the handle's memory in bytes, the dtype and
/// the device.
struct DeviceLent {
    ptr: u64,
    byte_len: usize,
    dtype: DataType,
    device: Device,
}

// SAFETY: `ptr` and `byte_len` are the address and size cubecl's storage gives for the handle of
// the `CubeTensor` held beside this value in a `BurnCudaTensor` (`ComputeClient::get_resource`:
// the allocation's address plus the handle's offset, and the handle's size), device memory of
// `device`, aligned for every element type (cubecl aligns allocations to 512 bytes and burn's
// offsets to the element size). The handle is held as long as this value, so cubecl does not
// give the memory to another tensor; burn writes a buffer in place only through its sole handle,
// and this one is never used for writing, so the memory holds the tensor's values of `dtype`.
// Never handed out writable.
unsafe impl ExportBuffer for DeviceLent {
    fn dtype(&self) -> DataType {
        self.dtype
    }
    fn device(&self) -> Device {
        self.device
    }
    fn byte_len(&self) -> usize {
        self.byte_len
    }
    fn as_ptr(&self) -> *const c_void {
        self.ptr as usize as *const c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut c_void> {
        None
    }
}

/// A tensor of burn's CUDA backend, ready to be lent zero-copy: a [`DlpackExport`] producer whose
/// exports are read-only views of the tensor's own device memory (`kDLCUDA`), with the tensor's
/// strides as cubecl keeps them (a transposed tensor has its axes' strides swapped; cubecl's
/// layouts may pad rows), kept alive while any consumer holds them.
///
/// See the module documentation for how the export is ordered after burn's pending work.
pub struct BurnCudaTensor {
    tensor: CudaTensor,
    lent: DeviceLent,
    shape: Vec<usize>,
    strides: Vec<isize>,
}

impl core::fmt::Debug for BurnCudaTensor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BurnCudaTensor")
            .field("dtype", &self.lent.dtype)
            .field("device", &self.lent.device)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .finish()
    }
}

impl BurnCudaTensor {
    /// Takes `tensor` (clone it first to keep using it: burn's clones share the memory) and
    /// waits on the host until burn's pending work on it has finished, so that any consumer,
    /// on any stream, reads the tensor's values. A tensor of the fused backend first has the
    /// operations fusion still holds for it enqueued (burn-fusion's `resolve_tensor_float`).
    ///
    /// # Errors
    ///
    /// [`BurnError::Quantized`] for a quantized float tensor; [`BurnError::BurnDtype`] for a
    /// dtype without a DLPack counterpart (`Flex32`, bools stored as 32-bit integers);
    /// [`BurnError::Backend`] when cubecl reports an error of the device.
    pub fn new<B, const D: usize, K>(tensor: Tensor<B, D, K>) -> Result<Self, BurnError>
    where
        B: Backend,
        K: BasicOps<B>,
        K::Primitive: CudaPrimitive,
    {
        Self::from_primitive(tensor.into_primitive().into_cube()?)
    }

    /// [`new`](Self::new), from the primitive.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_primitive(tensor: CudaTensor) -> Result<Self, BurnError> {
        // SAFETY: the synchronization below finishes burn's pending work on the tensor before
        // `this` is returned, so before any consumer can reach its memory.
        let this = unsafe { Self::from_primitive_unsynchronized(tensor) }?;
        // `get_resource` (in `from_primitive_unsynchronized`) made this thread's cubecl stream
        // wait for the stream that last wrote the tensor: waiting for this thread's stream
        // waits for that work too.
        block_on(this.tensor.client.sync()).map_err(backend_error)?;
        Ok(this)
    }

    /// [`from_primitive`](Self::from_primitive) without the host wait: for a caller that has
    /// already waited for burn's work (one `B::sync(&device)` on the thread that enqueued it,
    /// before exporting many tensors, say).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    ///
    /// # Safety
    ///
    /// burn's work on the tensor (the kernels or copies that wrote it, enqueued on cubecl's
    /// streams, which cubecl does not hand out) has finished before any consumer of the export
    /// accesses the memory. Otherwise the consumer reads values still being written: a data
    /// race on the device, which a consumer in Rust may turn into undefined behaviour (a host
    /// copy of `bool` values that are not yet 0 or 1, say).
    pub unsafe fn from_primitive_unsynchronized(tensor: CudaTensor) -> Result<Self, BurnError> {
        if tensor.qparams.is_some() {
            return Err(BurnError::Quantized);
        }
        let dtype = dlpack_dtype(tensor.dtype).ok_or(BurnError::BurnDtype(tensor.dtype))?;
        let resource = tensor
            .client
            .get_resource(tensor.handle.clone())
            .map_err(backend_error)?;
        let (ptr, byte_len) = {
            let resource = resource.resource();
            (resource.ptr, resource.size as usize)
        };
        let shape = tensor.meta.shape().to_vec();
        let strides = tensor.meta.strides().iter().map(|&s| s as isize).collect();
        let lent = DeviceLent {
            ptr,
            byte_len,
            dtype,
            device: Device::cuda(tensor.device.index as i32),
        };
        Ok(Self {
            tensor,
            lent,
            shape,
            strides,
        })
    }

    /// The tensor primitive.
    pub fn primitive(&self) -> &CudaTensor {
        &self.tensor
    }

    /// Gives back the tensor primitive (`Tensor::from_primitive` makes it a tensor of
    /// `CubeBackend` again; [`into_tensor`](Self::into_tensor) makes it a tensor of any CUDA
    /// backend).
    pub fn into_primitive(self) -> CudaTensor {
        self.tensor
    }

    /// Gives back the tensor, as a tensor of backend `B` (the fused backend too, where the
    /// tensor is registered with fusion anew), rank `D` and kind `K`.
    ///
    /// # Errors
    ///
    /// [`BurnError::Rank`] when the tensor's rank is not `D`; [`BurnError::Kind`] when its
    /// dtype is not of kind `K` (a float dtype for `Float`, an integer for `Int`, bool for
    /// `Bool`).
    pub fn into_tensor<B, const D: usize, K>(self) -> Result<Tensor<B, D, K>, BurnError>
    where
        B: Backend,
        K: BasicOps<B>,
        K::Primitive: CudaPrimitive,
    {
        if self.shape.len() != D {
            return Err(BurnError::Rank {
                found: self.shape.len(),
                expected: D,
            });
        }
        let kind = K::name();
        let dtype = self.tensor.dtype;
        let (holds, expected) = match kind {
            "Float" => (dtype.is_float(), "a float dtype"),
            "Int" => (dtype.is_int() || dtype.is_uint(), "an integer dtype"),
            _ => (dtype.is_bool(), "bool"),
        };
        if !holds {
            return Err(BurnError::Kind {
                found: self.lent.dtype,
                backend: "burn-cuda",
                kind,
                expected,
            });
        }
        Ok(Tensor::from_primitive(K::Primitive::from_cube(self.tensor)))
    }
}

impl DlpackExport for BurnCudaTensor {
    fn export_parts(&self) -> ExportParts<'_> {
        ExportParts::shared(&self.lent, &self.shape).with_strides(Some(&self.strides))
    }

    /// Read-only all the same: the memory is shared with every clone of the tensor.
    fn export_parts_mut(&mut self) -> ExportParts<'_> {
        self.export_parts()
    }
}

/// The stream of this crate that imports into burn tensors on CUDA device `ordinal` copy on: a
/// non-blocking stream of the device's primary context (cubecl's context too), made once per
/// device (without waiting for the device's work) and kept for the process.
///
/// # Errors
///
/// [`CudaError`] without a driver, for a device the driver does not have, or from
/// `cuStreamCreate`.
pub fn consumer_stream(ordinal: i32) -> Result<Arc<CudaStream>, CudaError> {
    static STREAMS: OnceLock<Mutex<HashMap<i32, Arc<CudaStream>>>> = OnceLock::new();
    let ctx = context(ordinal)?;
    let streams = STREAMS.get_or_init(Default::default);
    let mut streams = streams.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(stream) = streams.get(&ordinal) {
        return Ok(stream.clone());
    }
    // Not `ctx.new_stream()`, which would wait for every stream of the device.
    let stream = kept_stream(&ctx)?;
    streams.insert(ordinal, stream.clone());
    Ok(stream)
}

/// The burn dtype a DLPack `dtype` becomes in a tensor of kind `kind` on the CUDA backend
/// (`bool_dtype`: the device's bool dtype in burn's settings), or why not.
fn cuda_dtype(found: DataType, kind: &'static str, bool_dtype: DType) -> Result<DType, BurnError> {
    let dtype = burn_dtype(found).ok_or(BurnError::Dtype { found })?;
    let (accepted, expected) = match kind {
        "Float" => (
            matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "float32, float16 or bfloat16 (burn-cuda registers no float64)",
        ),
        "Int" => (
            matches!(
                dtype,
                DType::I8
                    | DType::I16
                    | DType::I32
                    | DType::I64
                    | DType::U8
                    | DType::U16
                    | DType::U32
                    | DType::U64
            ),
            "int8, int16, int32, int64, uint8, uint16, uint32 or uint64",
        ),
        _ => (
            dtype == DType::Bool(BoolStore::Native) && bool_dtype == DType::Bool(BoolStore::U8),
            "bool, on a device whose burn bool dtype is one byte (`BoolStore::U8`)",
        ),
    };
    if !accepted {
        return Err(BurnError::Kind {
            found,
            backend: "burn-cuda",
            kind,
            expected,
        });
    }
    Ok(if kind == "Float" || kind == "Int" {
        dtype
    } else {
        bool_dtype
    })
}

/// A tensor of burn's CUDA backend on `device` of `managed`'s elements, of rank `D` and kind
/// `K` (`Float`, `Int` or `Bool`), keeping the tensor's dtype: a copy (see the module
/// documentation).
///
/// `managed` must be ready on `stream` (the stream of [`consumer_stream`] for `device`, or
/// another stream of the device's primary context): its producer was given `stream` as the
/// consumer's stream, or its work on the memory has finished. [`tensor_from_dlpack`] asks the
/// producer so. Events the tensor carries ([`ManagedTensor::ready_events`]) are waited on too.
/// `bool` elements in device memory are copied as they are (checking that each is 0 or 1 would
/// take a read of the device's memory); host `bool` elements are checked.
/// Host memory (`kDLCPU`) is uploaded by burn (`Tensor::from_data`); `stream` is then not
/// used.
///
/// # Errors
///
/// [`BurnError::RankZero`] when `D` is 0 (burn has no rank-0 tensors);
/// [`BurnError::Rank`] when the tensor's rank is not `D`; [`BurnError::Dtype`] for a dtype
/// burn has no type for; [`BurnError::Kind`] for a dtype the kind cannot hold on the CUDA
/// backend (`Float`: float32, float16, bfloat16; `Int`: the signed and unsigned integers;
/// `Bool`: bool, where burn's bool dtype for the device is one byte);
/// [`BurnError::Device`] for memory of another device; [`BurnError::Import`] for an invalid
/// layout; [`BurnError::Cuda`] from the driver; [`BurnError::Backend`] from cubecl. The
/// producer's deleter has run when this returns, with a tensor or an error.
pub fn tensor_from_managed<B, const D: usize, K>(
    managed: ManagedTensor,
    device: &CudaDevice,
    stream: &CudaStream,
) -> Result<Tensor<B, D, K>, BurnError>
where
    B: Backend<Device = CudaDevice>,
    K: BasicOps<B>,
    K::Primitive: CudaPrimitive,
{
    if D == 0 {
        return Err(BurnError::RankZero);
    }
    let ndim = managed.dl_tensor().ndim;
    let found = usize::try_from(ndim).unwrap_or(usize::MAX);
    if found != D {
        return Err(BurnError::Rank { found, expected: D });
    }
    let bool_dtype: DType = get_device_settings::<B>(device).bool_dtype.into();
    let dtype = cuda_dtype(
        DataType::from_raw(managed.dl_tensor().dtype),
        K::name(),
        bool_dtype,
    )?;
    let on = Device::from_raw(managed.dl_tensor().device);
    let expected = Device::cuda(device.index as i32);
    match on.device_type {
        DeviceType::Cpu => {
            // burn's own upload, from the host data (zero-copy up to the upload).
            let data = tensor_data_from_managed(managed)?;
            let data = TensorData::from_bytes(data.bytes, data.shape, dtype);
            // With its dtype: `from_data` alone would convert to the device's default.
            return Ok(Tensor::from_data(data, (device, dtype)));
        }
        DeviceType::Cuda if on == expected => {}
        _ => {
            return Err(BurnError::Device {
                found: on,
                expected,
            });
        }
    }
    let layout = managed.layout()?;
    let Some(size) = layout.dtype().element_bytes() else {
        return Err(LayoutError::SubByteAccess {
            dtype: layout.dtype(),
        }
        .into());
    };
    let shape: Vec<usize> = layout.shape().iter().map(|&e| e as usize).collect();
    let ctx = context(expected.device_id)?;
    let plan = StridedCopy::new(
        layout.shape(),
        &layout.strides_vec(),
        size,
        max_pitch(&ctx)?,
    )?;
    let client = CudaRuntime::client(device);
    // cubecl allocates on its own stream, possibly memory a tensor it freed was still using
    // there: the host waits for that stream (after `get_resource`, which orders it after the
    // allocation) before this crate's stream writes the memory.
    let handle = client.empty(plan.bytes().max(1));
    let dst = client
        .get_resource(handle.clone())
        .map_err(backend_error)?
        .resource()
        .ptr;
    block_on(client.sync()).map_err(backend_error)?;
    {
        let _current = CurrentContext::save();
        bind(ctx.cu_ctx())?;
        if let Some(events) = managed.ready_events() {
            events.wait_on(stream)?;
        }
        let src = layout.first_element_ptr() as usize as u64;
        // SAFETY: `dst` is the first byte of `plan.bytes()` (or more) bytes of device memory of
        // this device that the handle holds (alive until the end of this function at least, in
        // the tensor built below); nothing else reaches the handle's memory (cubecl finished
        // with it, waited above, and burn sees the tensor only after the wait below); `src` is
        // element (0, ..., 0) of `layout`, the validated layout `plan` was made for, alive while
        // `managed` is (dropped after the wait below); `stream` is a live stream borrowed for
        // the call, of the bound primary context.
        let enqueued = unsafe { copy_into_device(&plan, src, dst, stream.cu_stream()) };
        // Wait even after a failed enqueue: the copies already enqueued read the producer's
        // memory and write the handle's.
        let waited = synchronize(stream.cu_stream());
        if let Err(err) = &waited {
            if !matches!(after_failed_wait(err), AfterFailedWait::Free) {
                // The copies may still run: neither memory may be reused while they might.
                leak("an import into burn whose copy could not be waited for");
                core::mem::forget(handle);
                core::mem::forget(managed);
                return Err(err.clone().into());
            }
        }
        enqueued.and(waited)?;
    }
    drop(managed);
    let primitive =
        CudaTensor::new_contiguous(client, device.clone(), Shape::from(shape), handle, dtype);
    Ok(Tensor::from_primitive(K::Primitive::from_cube(primitive)))
}

/// Exports `producer` to [`consumer_stream`] of `device` (device memory: the producer orders
/// its pending work before that stream; memory of another CUDA device is asked for on
/// `device`, as `dl_device`) or with no stream (host memory), and makes a tensor of burn's
/// CUDA backend of it, as [`tensor_from_managed`] does.
///
/// # Errors
///
/// [`BurnError::Export`] when the producer cannot export, [`BurnError::Cuda`] when the stream
/// cannot be made, otherwise as [`tensor_from_managed`].
pub fn tensor_from_dlpack<B, const D: usize, K, P>(
    producer: P,
    device: &CudaDevice,
) -> Result<Tensor<B, D, K>, BurnError>
where
    B: Backend<Device = CudaDevice>,
    K: BasicOps<B>,
    K::Primitive: CudaPrimitive,
    P: DlpackExport + Send + 'static,
{
    let expected = Device::cuda(device.index as i32);
    let on = producer.dlpack_device();
    let stream = consumer_stream(expected.device_id)?;
    let managed = match on.device_type {
        DeviceType::Cpu => producer.into_dlpack()?,
        _ => {
            let mut request = ExportRequest::versioned().stream(Some(stream.cu_stream() as i64));
            if on != expected {
                request = request.dl_device(expected);
            }
            producer.into_dlpack_with(&request)?
        }
    };
    tensor_from_managed(managed, device, &stream)
}
