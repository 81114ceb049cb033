//! Helpers for the GPU suite that work the same on a real CUDA driver and on the CUDA simulator
//! (`cuda-sim`): a [`Gate`] that holds a stream until the test releases it, and the simulator's
//! happens-before [`Checker`], which is present only when the loaded `libcuda.so` is the
//! simulator.

use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream, sys};
use dlpack_runtime::{Device, DlpackExport, DlpackImport, ExportRequest, ImportedData};

use crate::{Counter, DropGuard};

/// Holds a stream: everything enqueued on it after [`Gate::hold`] waits until
/// [`Gate::release`] (or the gate's drop).
///
/// Built on `cuLaunchHostFunc`: the stream runs a host function that blocks on a condition
/// variable, which the driver documents as stream-ordered. Pending work is therefore a fact the
/// test controls, not a matter of timing, on hardware and on the simulator alike.
#[derive(Debug)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

unsafe extern "C" fn wait_for_gate(user_data: *mut c_void) {
    // SAFETY: `user_data` is the `Arc::into_raw` of `Gate::hold`; this call takes that reference
    // back, exactly once (the driver calls a host function once).
    let gate = unsafe { Arc::from_raw(user_data.cast::<(Mutex<bool>, Condvar)>()) };
    let (open, cv) = &*gate;
    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
    while !*open {
        open = cv.wait(open).unwrap_or_else(|e| e.into_inner());
    }
}

impl Gate {
    /// Enqueues the gate on `stream`; panics if the driver refuses it.
    pub fn hold(stream: &CudaStream) -> Self {
        // SAFETY: a live stream of a live context.
        unsafe { Self::hold_raw(stream.cu_stream()) }
    }

    /// [`Gate::hold`] for a raw stream handle (including the special handles 0x1 and 0x2).
    ///
    /// # Safety
    ///
    /// `stream` is a live stream handle, or a special handle with a current context.
    pub unsafe fn hold_raw(stream: sys::CUstream) -> Self {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let user_data = Arc::into_raw(gate.clone()) as *mut c_void;
        // SAFETY: `wait_for_gate` matches `CUhostFn`; `user_data` is a leaked `Arc` that the host
        // function takes back.
        let result = unsafe { sys::cuLaunchHostFunc(stream, Some(wait_for_gate), user_data) };
        if result != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the driver refused, so the host function will never take the reference.
            drop(unsafe { Arc::from_raw(user_data.cast::<(Mutex<bool>, Condvar)>()) });
            panic!("cuLaunchHostFunc: {result:?}");
        }
        Self(gate)
    }

    /// Lets the stream go on.
    pub fn release(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

type Count = unsafe extern "C" fn() -> u64;
type Reset = unsafe extern "C" fn();
type Report = unsafe extern "C" fn(*mut u8, usize) -> usize;
type Operations = unsafe extern "C" fn(*const std::ffi::c_char) -> u64;

/// The simulator's happens-before checker, reached through the symbols `cuSimViolations`,
/// `cuSimReport`, `cuSimReset` and `cuSimOperations` of the loaded `libcuda.so`.
#[derive(Debug, Clone)]
pub struct Checker {
    count: Count,
    reset: Reset,
    report: Report,
    operations: Operations,
    /// This test's turn at the checker (see [`checker`]).
    _turn: Option<Rc<MutexGuard<'static, ()>>>,
}

impl Checker {
    /// The checker of the loaded driver library, or `None` when it is a real driver (or none is
    /// loaded).
    pub fn attach() -> Option<Self> {
        // SAFETY: probing only; a library that loads is kept loaded by cudarc for the process.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        // SAFETY: `culib` loads the same library cudarc uses; the symbols, when present, have
        // the simulator's documented signatures.
        unsafe {
            let lib = sys::culib();
            let count = *lib.get::<Count>(b"cuSimViolations").ok()?;
            let reset = *lib.get::<Reset>(b"cuSimReset").ok()?;
            let report = *lib.get::<Report>(b"cuSimReport").ok()?;
            let operations = *lib.get::<Operations>(b"cuSimOperations").ok()?;
            Some(Self {
                count,
                reset,
                report,
                operations,
                _turn: None,
            })
        }
    }

    /// Forgets the violations found so far and the operation counts.
    pub fn reset(&self) {
        // SAFETY: no arguments; the simulator's entry point.
        unsafe { (self.reset)() }
    }

    /// Violations found since the last reset.
    pub fn violations(&self) -> u64 {
        // SAFETY: no arguments; the simulator's entry point.
        unsafe { (self.count)() }
    }

    /// The violations since the last reset, one per line: both accesses (stream, operation,
    /// byte range).
    pub fn report(&self) -> String {
        // SAFETY: a zero-capacity buffer asks for the length only.
        let len = unsafe { (self.report)(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` has room for `len` bytes.
        let written = unsafe { (self.report)(buf.as_mut_ptr(), buf.len()) };
        buf.truncate(written.min(len));
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// How many operations named `name` (such as `cuMemcpy2DAsync`) streams were given since
    /// the last reset.
    pub fn operations(&self, name: &str) -> u64 {
        let name = std::ffi::CString::new(name).expect("no NUL in an operation name");
        // SAFETY: a NUL-terminated string, alive for the call.
        unsafe { (self.operations)(name.as_ptr()) }
    }

    /// Panics with the report if any violation was found since the last reset.
    pub fn assert_clean(&self, what: &str) {
        let n = self.violations();
        assert_eq!(
            n,
            0,
            "{what}: {n} happens-before violations:\n{}",
            self.report()
        );
    }
}

/// The checker, if there is one, reset, and held for the calling test: the checker counts the
/// whole process's violations, so tests that read it run one at a time (the guard drops with
/// the checker).
pub fn checker() -> Option<Checker> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let checker = Checker::attach().map(|c| Checker {
        _turn: Some(Rc::new(guard)),
        ..c
    });
    if let Some(c) = &checker {
        c.reset();
    }
    checker
}

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
