//! Types and helpers of the GPU suite, which work the same on a real CUDA driver and on the
//! CUDA simulator (`cuda-sim`). The gate and the checker come from `cuda-sim-testing`, as a
//! user's tests would take them.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys};
use dlpack_runtime::{Device, DlpackExport, DlpackImport, ExportRequest, ImportedData};

use crate::{Counter, DropGuard};

/// A producer with device memory and the stream its writes were enqueued on.
#[derive(DlpackExport)]
pub struct GpuTensor {
    /// The device memory.
    #[dlpack(data)]
    pub data: CudaSlice<u32>,
    /// Extents in elements.
    #[dlpack(shape)]
    pub shape: Vec<usize>,
    /// The stream its writes were enqueued on.
    #[dlpack(stream)]
    pub stream: Arc<CudaStream>,
    _guard: DropGuard,
}

impl GpuTensor {
    /// A 1-D tensor of `data`, with pending work on `stream`, counted by `counter`.
    pub fn new(data: CudaSlice<u32>, stream: &Arc<CudaStream>, counter: &Counter) -> Self {
        Self {
            shape: vec![data.len()],
            data,
            stream: stream.clone(),
            _guard: counter.guard(),
        }
    }
}

/// A consumer of compact `u32` tensors on any device.
#[derive(DlpackImport)]
pub struct GpuView {
    /// The imported memory.
    #[dlpack(data)]
    pub data: ImportedData<u32>,
    /// Extents in elements.
    #[dlpack(shape)]
    pub shape: Vec<usize>,
    /// Where the memory is.
    #[dlpack(device)]
    pub device: Device,
}

/// A strided view of device memory; strides in elements, the start in bytes from the buffer's
/// (the `byte_offset` role).
#[derive(DlpackExport)]
pub struct GpuStrided {
    /// The device memory.
    #[dlpack(data)]
    pub data: CudaSlice<u32>,
    /// Extents in elements.
    #[dlpack(shape)]
    pub shape: Vec<usize>,
    /// Strides in elements.
    #[dlpack(strides)]
    pub strides: Vec<isize>,
    /// Bytes from the buffer's start to element `(0, ..., 0)`.
    #[dlpack(byte_offset)]
    pub byte_offset: usize,
    /// The stream its writes were enqueued on.
    #[dlpack(stream)]
    pub stream: Arc<CudaStream>,
    /// Counts the drop (`DropGuard::default()` counts nothing).
    pub guard: DropGuard,
}

/// A CUDA graph captured from a stream (`cuStreamBeginCapture`, `cuStreamEndCapture`) and
/// instantiated (`cuGraphInstantiateWithFlags`); both are destroyed on drop.
#[derive(Debug)]
pub struct CapturedGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl CapturedGraph {
    /// Starts capturing `stream` in `mode`; panics if the driver refuses.
    ///
    /// # Safety
    ///
    /// `stream` is a live stream handle of the current context.
    pub unsafe fn begin(stream: sys::CUstream, mode: sys::CUstreamCaptureMode) {
        // SAFETY: a live stream (caller).
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }
            .result()
            .expect("cuStreamBeginCapture");
    }

    /// Ends the capture of `stream` and instantiates its graph: the driver's error when the
    /// capture fails (an invalidated capture gives `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
    ///
    /// # Safety
    ///
    /// `stream` is a live stream handle being captured.
    pub unsafe fn end(stream: sys::CUstream) -> Result<Self, sys::CUresult> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: a live stream (caller); a valid out-pointer.
        let ended = unsafe { sys::cuStreamEndCapture(stream, &mut graph) };
        if ended != sys::CUresult::CUDA_SUCCESS {
            return Err(ended);
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the graph the capture returned; a valid out-pointer.
        let made = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if made != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the graph is ours and used no more.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(made);
        }
        Ok(Self { graph, exec })
    }

    /// Enqueues the graph's work on `stream` (`cuGraphLaunch`); panics if the driver refuses.
    pub fn launch(&self, stream: &CudaStream) {
        self.try_launch(stream).result().expect("cuGraphLaunch");
    }

    /// [`CapturedGraph::launch`], returning the driver's result.
    pub fn try_launch(&self, stream: &CudaStream) -> sys::CUresult {
        // SAFETY: a live exec; a live stream.
        unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) }
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // SAFETY: made by `end`, destroyed once, here.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// Where `stream` stands with graph capture (`cuStreamIsCapturing`); panics on an error.
///
/// # Safety
///
/// `stream` is a live stream handle of the current context.
pub unsafe fn capture_status(stream: sys::CUstream) -> sys::CUstreamCaptureStatus {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a valid out-pointer; a live stream (caller).
    unsafe { sys::cuStreamIsCapturing(stream, &mut status) }
        .result()
        .expect("cuStreamIsCapturing");
    status
}

/// A graph captured on `b` in `mode` that copies an import of `t` (exported for `request`
/// while `b` is being captured) into `dst_ptr` (as many bytes as the import has); and the
/// import, which must outlive every launch.
///
/// A global capture forbids calls that may synchronize on every thread: tests that run beside
/// others capture in thread-local mode, tests that hold the checker (one at a time) may
/// capture globally, as PyTorch does.
pub fn captured_copy(
    t: GpuTensor,
    request: &ExportRequest,
    b: &Arc<CudaStream>,
    dst_ptr: sys::CUdeviceptr,
    mode: sys::CUstreamCaptureMode,
) -> (CapturedGraph, GpuView) {
    // SAFETY: a live stream of the current context (cudarc bound it when it made `b`).
    unsafe { CapturedGraph::begin(b.cu_stream(), mode) };
    let view = GpuView::from_managed(t.into_dlpack_with(request).unwrap()).unwrap();
    let n = view.shape[0];
    // SAFETY: `n` u32 of the import (kept alive by the caller for every launch) into `dst_ptr`,
    // `n` u32 of live memory; captured on `b`.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            dst_ptr,
            view.data.cuda_device_ptr().unwrap(),
            n * 4,
            b.cu_stream(),
        )
    }
    .result()
    .unwrap();
    // SAFETY: `b` is being captured (begun above).
    let graph = unsafe { CapturedGraph::end(b.cu_stream()) }.expect("the capture stays valid");
    (graph, view)
}

/// A PTX module of two kernels, for launches on the simulator (which reads the `.entry`
/// signatures and runs no body) and on GPUs (which run them, PTX JIT-compiled from `sm_52`):
/// `fill_u32(out: *mut u32, value: u32, n: u32)` sets `out[i] = value` and
/// `copy_u32(dst: *mut u32, src: *const u32, n: u32)` sets `dst[i] = src[i]`, for `i < n`, one
/// thread per element.
pub const KERNELS_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry fill_u32(
	.param .u64 fill_u32_out,
	.param .u32 fill_u32_value,
	.param .u32 fill_u32_n
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<7>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [fill_u32_out];
	ld.param.u32 	%r1, [fill_u32_value];
	ld.param.u32 	%r2, [fill_u32_n];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r6, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r6, %r2;
	@%p1 bra 	$L__fill_done;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r6, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r1;
$L__fill_done:
	ret;
}

.visible .entry copy_u32(
	.param .u64 copy_u32_dst,
	.param .u64 copy_u32_src,
	.param .u32 copy_u32_n
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<7>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [copy_u32_dst];
	ld.param.u64 	%rd2, [copy_u32_src];
	ld.param.u32 	%r1, [copy_u32_n];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	setp.ge.u32 	%p1, %r5, %r1;
	@%p1 bra 	$L__copy_done;
	cvta.to.global.u64 	%rd3, %rd2;
	mul.wide.u32 	%rd4, %r5, 4;
	add.s64 	%rd5, %rd3, %rd4;
	ld.global.u32 	%r6, [%rd5];
	cvta.to.global.u64 	%rd6, %rd1;
	add.s64 	%rd7, %rd6, %rd4;
	st.global.u32 	[%rd7], %r6;
$L__copy_done:
	ret;
}
"#;
