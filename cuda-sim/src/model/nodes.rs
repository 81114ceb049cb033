//! What a stream capture builds: the nodes of a capture sequence under way, the graphs it
//! ends in, and the executable graphs instantiated from them.

use std::ffi::c_void;
use std::sync::Arc;
use std::thread::ThreadId;

use cudarc::driver::sys::{CUdeviceptr, CUstreamCaptureMode};

use super::base::Handle;
use super::module::KernelPointer;
use super::request::{CopyRequest, Fill};
use super::stream::Recorded;

/// What a node does at each launch.
pub(crate) enum Node {
    /// A 1-D or 2-D copy (`op` names the driver function captured); device addresses are
    /// resolved again at each launch, host memory is pinned memory.
    Copy { op: &'static str, req: CopyRequest },
    /// A 1-D or 2-D memset of `dst`, resolved again at each launch.
    Memset {
        op: &'static str,
        dst: CUdeviceptr,
        fill: Fill,
    },
    /// A host function (`cuLaunchHostFunc`) and its user data.
    Host {
        f: unsafe extern "C" fn(*mut c_void),
        data: usize,
    },
    /// An external event wait (`cuStreamWaitEvent` with `CU_EVENT_WAIT_EXTERNAL`): each launch
    /// waits for the event's most recent record as of the `cuGraphLaunch` call.
    WaitEvent { event: Handle },
    /// An external event record (`cuEventRecordWithFlags` with `CU_EVENT_RECORD_EXTERNAL`):
    /// each launch records the event at this point of the launch stream.
    RecordEvent { event: Handle },
    /// A kernel launch (`cuLaunchKernel`): the kernel's name and its pointer parameters' values,
    /// taken at capture; the allocations they point into are resolved again at each launch.
    Kernel {
        name: Arc<str>,
        pointers: Vec<KernelPointer>,
    },
}

/// A node and the nodes (indices of earlier nodes) it depends on.
pub(crate) struct GraphNode {
    pub(crate) node: Node,
    pub(crate) deps: Vec<usize>,
}

/// A capture sequence under way.
pub(crate) struct CaptureSeq {
    /// The stream the capture began on, where it must end.
    pub(crate) origin: usize,
    pub(crate) mode: CUstreamCaptureMode,
    /// The thread that began it (`cuStreamEndCapture` must come from it unless relaxed).
    pub(crate) thread: ThreadId,
    pub(crate) invalidated: bool,
    /// The graph being built: its handle, as `cuStreamGetCaptureInfo_v3` reports it and
    /// `cuStreamEndCapture` returns it.
    pub(crate) graph: Handle,
    pub(crate) nodes: Vec<GraphNode>,
    /// The streams in the capture: the origin, then those that joined.
    pub(crate) streams: Vec<usize>,
}

/// A graph from `cuStreamEndCapture`.
pub(crate) struct Graph {
    pub(crate) nodes: Arc<[GraphNode]>,
}

/// An executable graph: the nodes at instantiation (independent of the graph afterwards).
pub(crate) struct Exec {
    pub(crate) nodes: Arc<[GraphNode]>,
    /// Where the previous launch ends: the next launch is ordered after it.
    pub(crate) last: Option<Recorded>,
}
