//! `cuda-sim`: a stand-in for the CUDA driver library (`libcuda.so`) that runs on the CPU, so
//! stream-ordered code can be tested on machines without a GPU. The same library is a stand-in
//! for ROCm's HIP runtime (`libamdhip64.so`) too: its HIP face, over the same model (below).
//!
//! Streams are FIFOs executed asynchronously by worker threads; events capture a stream's
//! position when recorded; `cuStreamWaitEvent`, the legacy default stream's implicit barriers
//! and the host synchronizations order them as the CUDA driver API documents. Device memory is
//! host memory behind a range table, at addresses that no host mapping uses. Every copy and
//! memset is checked against the happens-before order those operations create (vector clocks
//! per stream and for the host, as in PyTorch's CUDA stream sanitizer): an access not ordered
//! after a conflicting one, a free not ordered after every access, and any access to freed
//! memory are reported as violations through `cuSimViolations`, `cuSimReport` and
//! `cuSimReset`. PTX modules load and kernel launches are checked as accesses to the memory
//! their pointer parameters point into, but kernel bodies do not run (below). Every call of a
//! driver entry point is counted (`cuSimDriverCalls`; by entry point, `cuSimDriverCallReport`),
//! so that a test can prove a code path leaves the driver alone.
//!
//! The crate is a model with thin driver faces above it, and its files depend one way
//! (`tests/layers.rs` checks it): `model/` holds the machine and its operations, knowing no
//! face; `face/cuda/` the `cu*` entry points and `face/hip.rs` the `hip*` ones, each a
//! translation of handles, codes and out-parameters into calls of the model.
//!
//! Tests reach the checker, a stream gate, and a loader that puts the simulator under plain
//! `cargo test`, through the crate `cuda-sim-testing`.
//!
//! # Use
//!
//! Cargo builds the crate as a shared library, SONAME `libcuda.so.1`: `libcuda_sim.so` in the
//! target directory's `<profile>/deps` (`libcuda_sim-<hash>.so` when the crate comes from a
//! registry; `cuda_sim_testing::simulator_path()` finds it). In this crate's repository,
//! `scripts/cuda-sim.sh` builds it, copies it to `target/cuda-sim/libcuda.so` (with a
//! `libcuda.so.1` link) and prints that directory. Put such a directory first on the library
//! path (`LD_LIBRARY_PATH`) and a program that loads the driver dynamically (cudarc with
//! dynamic loading does) gets the simulator, with no change to its code. The script links
//! `libamdhip64.so`, `libamdhip64.so.6` and `libamdhip64.so.7` there to the same file, so a
//! program that loads the HIP runtime by name gets the HIP face; a process that loads both
//! names gets one library (the dynamic loader opens one file once), one model and one checker.
//!
//! Settings, read once from the environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CUDA_SIM_DEVICES` | 2 | number of devices, 1 to 64 |
//! | `CUDA_SIM_MEMORY` | 4 GiB | bytes of device memory, all devices together |
//! | `CUDA_SIM_OP_DELAY_US` | 0 | a delay before each operation a stream runs, in microseconds |
//! | `CUDA_SIM_ABORT_ON_VIOLATION` | 0 | `1`: abort the process at the first violation |
//! | `CUDA_SIM_LOG` | 0 | `1`: print each violation to stderr |
//! | `CUDA_SIM_NO_PEER` | (empty) | device pairs that cannot access each other's memory: `all`, or pairs `a:b` separated by commas (`0:1,2:3`, either way round) |
//! | `CUDA_SIM_HIP_VERSION` | 70000000 (7.0.0) | the HIP version the HIP face models, `HIP_VERSION` encoded (major × 10000000 + minor × 100000 + patch): below 7.14 the ROCm capture hazard (below) |
//!
//! A value out of range is ignored, with a word on stderr.
//!
//! Long runs stay small: a destroyed stream's worker thread ends once its work is done, and
//! leaves no stack behind (joined if the stream was idle, detached if work was pending), and so
//! does a thread's per-thread default stream when the thread ends; freed allocations are kept
//! as runs of adjacent addresses freed alike (a few bytes per run, the free's description
//! stored once), so a use after free is reported however long ago the free was.
//!
//! # Modelled, and not
//!
//! Modelled: devices with primary and created contexts, the per-thread context stack, created
//! streams (blocking and non-blocking), the legacy (`NULL`, `CU_STREAM_LEGACY`) and per-thread
//! (`CU_STREAM_PER_THREAD`; it ends with its thread, whose pending work on it still runs)
//! default streams, events (positions, queries, waits, elapsed time),
//! host functions (`cuLaunchHostFunc`), device and pinned host memory (sync and stream-ordered
//! allocation), 1-D and 2-D copies and memsets, pointer attributes, stream capture into graphs
//! and their launch (below), error names and strings, and the driver in a child forked after
//! `cuInit`: every call there fails with `CUDA_ERROR_NOT_INITIALIZED` (3), except
//! `cuDriverGetVersion`, `cuGetErrorName` and `cuGetErrorString` (NVIDIA leaves CUDA in a
//! forked child undefined; that error is what drivers are seen to return). A child of a process
//! that never called `cuInit` uses the driver as any process does.
//!
//! Not modelled: kernel bodies (below), cubin and fatbin images, timing and throughput, unified memory faults and prefetching,
//! IPC and other multi-process use, and the device reset of a primary context
//! whose retain count drops to zero (its state is kept). Every driver function that cudarc
//! binds (for CUDA 13.4, the version `.cargo/config.toml` pins) is exported; those not modelled
//! return `CUDA_ERROR_NOT_SUPPORTED` and name themselves on stderr, once each. Nothing aborts,
//! except on request.
//!
//! Not modelled either: a host clock per thread. The checker keeps one host clock for the whole
//! process, and every host synchronization (`cuStreamSynchronize`, `cuEventSynchronize`,
//! `cuCtxSynchronize`, a query that returns `CUDA_SUCCESS`, a synchronous copy) joins into it
//! what the wait has seen complete, whichever thread made it. Every operation enqueued
//! afterwards, on any thread, is ordered after that work: threads of one process usually
//! synchronize with each other by other means (locks, channels, joins) that the driver cannot
//! see, and a clock per thread would report races between work that such means do order. The
//! cost is the other way round: a race is reported only if no host wait, on any thread, has seen
//! the first access complete before the second is enqueued. A library's background thread that
//! waits on events (to release memory, say) can thus order a later unordered access, depending
//! on the timing of the run. A test that wants a race flagged must make the first access
//! impossible to observe until the racing operation is enqueued: hold its stream behind a gate
//! (`cuda_sim_testing::Gate`, or a host function that waits) and open the gate only once the
//! racing operation is enqueued.
//!
//! # Devices and peer access
//!
//! `CUDA_SIM_DEVICES` devices, each with its own range of device addresses (unified
//! addressing: a pointer says its device): 1 TiB a device from `0x1000_0000_0000`, so that the
//! ranges of all 64 devices end at `0x5000_0000_0000`, below the executable, its heap and every
//! other mapping Linux gives a process; a host pointer is never taken for device memory. `cuDeviceCanAccessPeer(dev, peer)` answers 0 for a
//! device with itself and 1 for two distinct devices, unless `CUDA_SIM_NO_PEER` lists the pair
//! (or is `all`), so that the path of code that stages through the host when peer access is
//! impossible can be tested too.
//!
//! `cuCtxEnablePeerAccess(peer, flags)` enables access from the current context to the memory
//! of context `peer`, one way; the errors are those the driver API documents:
//! `CUDA_ERROR_INVALID_CONTEXT` with no current context, for a `peer` that is not a live
//! context, or for the current context itself; `CUDA_ERROR_INVALID_VALUE` for flags other than
//! 0; `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` when `cuDeviceCanAccessPeer` answers 0 for the two
//! contexts' devices (two contexts of one device included); and
//! `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` the second time. `cuCtxDisablePeerAccess(peer)`
//! undoes it (`CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` if not enabled). Destroying a context
//! forgets the access to and from it.
//!
//! Copies between devices need no peer access, as on a GPU (the driver stages them):
//! `cuMemcpyPeerAsync` is ordered on its stream (of any context; the checker sees a read of the
//! source and a write of the destination by that stream), `cuMemcpyPeer` runs on the legacy
//! default stream of the current context and the host waits for it, and the unified-addressing
//! copies (`cuMemcpyDtoD*`, `cuMemcpy*`) may name memory of any device. An event recorded on a
//! stream of one device and waited on by a stream of another (`cuStreamWaitEvent` takes an
//! event of any context) orders them as on one device; an event is recorded only on a stream of
//! its own context (`CUDA_ERROR_INVALID_HANDLE` otherwise).
//!
//! A kernel launch that reaches an allocation of another device, without peer access enabled
//! from the launch stream's context to the allocation's context, is reported as a violation
//! (a GPU faults on such an access, with the sticky `CUDA_ERROR_ILLEGAL_ADDRESS`); the launch
//! goes on. So is a peer copy given a pointer to memory of a device other than its context's.
//! Not modelled: the limit on the number of peers (`CUDA_ERROR_TOO_MANY_PEERS`), and peer
//! access rules between two contexts of one device (their memory is reachable from both).
//!
//! # Modules and kernels
//!
//! `cuModuleLoadData`, `cuModuleLoadDataEx` (JIT options ignored) and `cuModuleLoad` accept PTX
//! text: the `.entry` directives' signatures are read (parameter sizes and alignments), nothing
//! else. A cubin (an ELF image) or a fatbin is not modelled: `CUDA_ERROR_NOT_SUPPORTED`, said
//! on stderr; PTX whose entries cannot be read is `CUDA_ERROR_INVALID_PTX`, with the reason on
//! stderr. `cuModuleGetFunction` finds an entry by name (`CUDA_ERROR_NOT_FOUND` otherwise);
//! `cuModuleUnload` makes its kernels' handles invalid (`CUDA_ERROR_INVALID_HANDLE`).
//!
//! **Kernel bodies do not run: a launch computes no value.** `cuLaunchKernel` (also
//! `cuLaunchKernelEx`, launch attributes ignored, and `cuLaunchCooperativeKernel`) checks the
//! geometry as the driver does (`CUDA_ERROR_INVALID_VALUE` for a zero dimension, more than 1024
//! threads per block, block z above 64, grid y or z above 65535), reads the parameters from
//! `kernelParams` or `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER`/`_SIZE`, packed at their aligned
//! offsets), and enqueues the launch on its stream as an access to every live device allocation
//! that a pointer-sized parameter (`.u64`, `.s64`, `.b64`; not inside a by-value struct)
//! points into: a read and write of the whole allocation, or a read for a parameter declared
//! read-only with `cuSimKernelParamReadOnly(function, index, 1)`. The checker sees it like a
//! copy (reported as ``cuLaunchKernel `name` ``, counted as `cuLaunchKernel`), so ordering bugs
//! around real launches are caught; a parameter pointing into freed memory is a use after free,
//! reported, and the launch is refused with `CUDA_ERROR_INVALID_VALUE`. On a capturing stream a
//! launch becomes a kernel node (its pointer parameters' values taken at capture), which each
//! `cuGraphLaunch` replays the same way, resolving the allocations again.
//!
//! # Stream capture and graphs
//!
//! Capture (`cuStreamBeginCapture_v2`, `cuStreamEndCapture`): every operation enqueued on a
//! capturing stream becomes a node of the capture's graph, in captured order, and does not
//! run: 1-D and 2-D copies and memsets (their parameters kept; device addresses are resolved
//! again at each launch), host functions (`cuLaunchHostFunc`: the function and its user data),
//! kernel launches (above), and external event waits and records (below). A copy involving pageable host memory is
//! refused on a capturing stream with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, which
//! invalidates the capture (the simulator neither takes its bytes at capture time nor reads
//! them at each launch); pinned memory (`cuMemHostAlloc`, `cuMemAllocHost_v2`) is read or
//! written at each launch. Stream-ordered allocation (`cuMemAllocAsync`, `cuMemFreeAsync`) on a
//! capturing stream is not modelled: `CUDA_ERROR_NOT_SUPPORTED`, and the capture is
//! invalidated. Calls that may synchronize (`cuMemAlloc_v2`, `cuMemFree_v2`, synchronous copies
//! and memsets, `cuCtxSynchronize`, `cuEventQuery`, `cuEventSynchronize`, the legacy stream's
//! `cuStreamSynchronize`) are refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while a
//! capture in global mode is under way on any thread, or one in thread-local mode on the calling
//! thread, unless the calling thread's mode (`cuThreadExchangeStreamCaptureMode`) is relaxed;
//! the refusal invalidates those captures. Synchronizing or querying a capturing stream is
//! refused likewise. While a blocking stream (created without `CU_STREAM_NON_BLOCKING`, or a
//! per-thread default stream) is capturing, any use of the legacy default stream of its context
//! is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates the capture, except
//! `cuStreamIsCapturing` and `cuStreamGetCaptureInfo_v3`, which return that error and leave the
//! capture valid. The legacy stream cannot be captured.
//!
//! Events and captures (`cuEventRecord`, `cuEventRecordWithFlags`, `cuStreamWaitEvent`): an
//! event recorded on a capturing stream with default flags carries a dependency inside the
//! capture only. A stream of the capture waiting on it depends on the nodes captured before the
//! record; a stream that is not capturing and waits on it joins the capture (a fork: its later
//! work goes into the same graph), and the origin stream waiting on an event recorded on the
//! joined stream joins it back. `cuStreamEndCapture` on the origin ends the capture for all its
//! streams; it fails with `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` (and a NULL graph) if a node is
//! not ordered before the origin's last nodes, and on another stream of the capture with
//! `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`. A capturing stream waiting on an event recorded
//! outside the capture is `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`, on one recorded in another
//! capture under way `CUDA_ERROR_STREAM_CAPTURE_MERGE`; both invalidate. With
//! `CU_EVENT_WAIT_EXTERNAL` the wait is an event-wait node: each launch waits for the event's
//! most recent record as of the `cuGraphLaunch` call (as `cuStreamWaitEvent` takes an event's
//! record at call time); a never-recorded event, or one last recorded inside a capture, adds no
//! wait. With `CU_EVENT_RECORD_EXTERNAL`, `cuEventRecordWithFlags` is an event-record node that
//! records the event at that point of each launch. Host queries and waits of an event last
//! recorded inside a capture (`cuEventQuery`, `cuEventSynchronize`, `cuEventElapsedTime_v2`)
//! are `CUDA_ERROR_CAPTURED_EVENT` (invalidating the capture if still under way) until the
//! event is recorded again outside a capture, and so is `cuStreamWaitEvent` on it from a stream
//! outside any capture once that capture has ended.
//!
//! `cuStreamGetCaptureInfo_v3` gives the status, the capture sequence's id (unique, never 0
//! for a capture under way, 0 with none) and the graph being built; it returns no dependencies
//! (0, NULL arrays). `cuStreamIsCapturing` gives the status.
//!
//! Graphs: `cuStreamEndCapture` returns the graph (a node list); `cuGraphDestroy` destroys it.
//! `cuGraphInstantiateWithFlags` and `cuGraphInstantiateWithParams` (which sets `result_out`)
//! make an executable graph, a copy of the nodes that stays usable after `cuGraphDestroy`;
//! `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH` is `CUDA_ERROR_NOT_SUPPORTED`.
//! `cuGraphExecDestroy` destroys it (launches already enqueued still run); `cuGraphUpload`
//! has nothing to do. `cuGraphLaunch(exec, stream)` enqueues the nodes on the launch stream
//! in captured order, each through the same path as the operation it was captured from: legacy
//! stream barriers apply, the checker sees every access with the launch stream's order, and
//! `cuSimOperations` counts each replayed operation under its usual name, plus one
//! `cuGraphLaunch` per launch. Dependencies inside the capture need no operation in this
//! serialized replay. A launch is ordered after the previous launch of the same executable
//! graph (the driver orders launches of one executable graph), on whatever stream it ran.
//! Every node is resolved at the launch call: memory freed since the capture is reported as a
//! use after free and the launch is refused with `CUDA_ERROR_INVALID_VALUE`, nothing enqueued;
//! an event-wait or event-record node whose event was destroyed is reported as a violation (the
//! driver leaves it undefined) and adds no wait or record. Launching on a capturing stream (a
//! child graph) is `CUDA_ERROR_NOT_SUPPORTED` and invalidates that capture.
//!
//! Not modelled for graphs: concurrency inside a graph (the replay is serialized in captured
//! order on the launch stream, so a race between two branches of one graph is not reported),
//! graph memory nodes (`cuMemAllocAsync` in a capture), child graphs, graphs
//! built or edited node by node (`cuGraphCreate`, `cuGraphAdd*Node`, `cuGraphExecUpdate_v2`
//! and the other `cuGraph*` functions are stubs), and capture into an existing graph
//! (`cuStreamBeginCaptureToGraph`).

//!
//! # The HIP face
//!
//! The `hip*` functions a HIP consumer of streams, events and memory needs, exported beside the
//! `cu*` ones and calling the same model: `hipInit`, `hipDriverGetVersion`,
//! `hipRuntimeGetVersion`, `hipGetErrorName`, `hipGetErrorString`; `hipGetDeviceCount`,
//! `hipGetDevice`, `hipSetDevice`, `hipDeviceSynchronize`, `hipDeviceCanAccessPeer`,
//! `hipDeviceEnablePeerAccess`, `hipDeviceDisablePeerAccess`; `hipStreamCreate`,
//! `hipStreamCreateWithFlags`, `hipStreamDestroy`, `hipStreamSynchronize`, `hipStreamQuery`,
//! `hipStreamGetFlags`, `hipStreamGetDevice`, `hipStreamWaitEvent`, `hipLaunchHostFunc`;
//! `hipStreamIsCapturing`, `hipStreamGetCaptureInfo`, `hipStreamBeginCapture`,
//! `hipStreamEndCapture`, `hipThreadExchangeStreamCaptureMode`, `hipGraphInstantiate`,
//! `hipGraphLaunch`, `hipGraphExecDestroy`, `hipGraphDestroy`; `hipEventCreate`,
//! `hipEventCreateWithFlags`, `hipEventRecord`, `hipEventQuery`, `hipEventSynchronize`,
//! `hipEventDestroy`, `hipEventElapsedTime`; `hipMalloc`, `hipFree`, `hipMallocAsync`,
//! `hipFreeAsync`, `hipHostMalloc`, `hipHostFree`, `hipMemcpy`, `hipMemcpyAsync`,
//! `hipMemcpy2DAsync`, `hipMemcpyPeerAsync`, `hipMemset`, `hipMemsetAsync` and
//! `hipPointerGetAttributes`. Each call is counted by its name, with the driver's
//! (`cuSimDriverCalls`, `cuSimDriverCallReport`), and the checker's functions (`cuSim*`) serve
//! both faces.
//!
//! HIP has no contexts: each host thread has a current device (`hipSetDevice`, 0 until set),
//! and a call works in that device's primary context, the one `cuDevicePrimaryCtxRetain` gives.
//! The null stream is its legacy default stream, with the same implicit synchronization with
//! blocking streams (created with `hipStreamDefault`; `hipStreamNonBlocking` streams do not
//! synchronize with it), and `hipStreamPerThread` (2) the thread's per-thread default stream;
//! 1 (CUDA's `CU_STREAM_LEGACY`) is no HIP handle (`hipErrorInvalidHandle`). A stream or event
//! belongs to the device current at its creation. HIP initializes itself at its first call.
//! Codes are HIP's (`hipError_t`, the driver API's numbers; `hipErrorInvalidMemcpyDirection`
//! for an unknown copy kind), names as `hip_runtime_api.h` spells them, texts the driver's.
//! `hipStreamWaitEvent` takes flags 0 and 1 (`hipEventWaitExternal`) alike: on a capturing
//! stream, a wait on an event recorded outside the capture is an event-wait node, as with
//! `CU_EVENT_WAIT_EXTERNAL`. `hipMalloc` of 0 bytes gives NULL and `hipSuccess`; `hipFree` and
//! `hipHostFree` of NULL do nothing. Otherwise both first wait for every stream of the current
//! device, the "implicit hipDeviceSynchronize()" `hip_runtime_api.h` documents for them (refused
//! as that call is while a capture forbids it): the work enqueued there before the free is
//! ordered before it, and work on another device is not. `hipPointerGetAttributes` gives ROCm 6's
//! `hipPointerAttribute_t`: type Device (2) for device memory, Host (1) for pinned host memory
//! (host and device pointers both the pointer), and for memory the model does not know
//! (pageable host memory, freed device memory) type Unregistered (0) with `hipSuccess`, as
//! ROCm 6 and later answer.
//!
//! **The ROCm capture hazard.** Before ROCm 7.14 (pytorch/pytorch#187110), a capture-unsafe
//! call made while a stream captures returns `hipSuccess` instead of an error, and the capture
//! is silently invalidated. Those calls are: a host synchronization of a capturing stream
//! (`hipStreamSynchronize`) or of its device (`hipDeviceSynchronize`), `hipStreamQuery` and
//! `hipEventQuery` of captured work, `hipEventSynchronize` of an event recorded in a capture,
//! and a synchronous copy or memset (`hipMemcpy`, `hipMemset`, on the null stream) beside a
//! capturing blocking stream or during a capture in global mode. The model refuses them as the
//! CUDA driver does and invalidates the capture (`hipStreamEndCapture` then fails with
//! `hipErrorStreamCaptureInvalidated` and a NULL graph); below 7.14 the face returns
//! `hipSuccess`, from 7.14 the model's error (`hipErrorStreamCaptureUnsupported`,
//! `hipErrorStreamCaptureImplicit`, or `hipErrorCapturedEvent` for an event recorded in a
//! capture). At every version the checker records each such call as a violation
//! ("capture-unsafe `hipStreamSynchronize` on a capturing stream, not reported by HIP before
//! 7.14"), so a test proves that a library asked `hipStreamIsCapturing` first. The refused call
//! does nothing else: it neither waits nor copies. The CUDA face is unchanged.
//!
//! Not modelled on the HIP face: modules and kernel launches (`hipModuleLoad*`,
//! `hipModuleLaunchKernel`, `hipLaunchKernel` and code objects are not exported: a HIP kernel
//! launch cannot be checked on the simulator), contexts (`hipCtx*`), `hipStreamWaitEvent`'s
//! and the event functions' flags beyond those above, other `hip*` functions (not exported:
//! a program that needs one fails to find the symbol).

#![allow(non_snake_case)]

mod face;
mod model;
