//! One set of hand-off cases, written once against a small [`Backend`] trait and run on each
//! driver face of the simulator: CUDA (cudarc streams and `CudaSlice`) and, with the `hip`
//! feature, HIP (`HipStream` and `HipSlice`). Each face runs the same cases (modules `cuda` and
//! `hip`). Pending producer work is a gate on the producer's stream (a host function that
//! blocks until the test releases it), so every ordering asserted is deterministic; the
//! simulator's happens-before checker must report no violation where the hand-off is ordered,
//! and must report the race of the negative controls.
//!
//! Run: `sim=$(./scripts/cuda-sim.sh); LD_LIBRARY_PATH=$sim cargo test -p dlpack-tests
//! --features cuda,hip --test handoff`.
#![cfg(feature = "cuda")]

use std::time::Duration;

use cuda_sim_testing::Checker;
use dlpack_runtime::cuda::ReadyEvents;
use dlpack_runtime::{
    DeviceType, DlpackExport, DlpackImport, ExportError, ExportRequest, ImportedData, ManagedTensor,
};

/// Elements of every tensor.
const N: usize = 256;
/// The byte the producer's pending write sets (each `u32` is four of them).
const BYTE: u8 = 0x5a;

const NEEDS_SIMULATOR: &str =
    "needs the simulator on the library path (scripts/cuda-sim.sh), whose checker the cases assert";

/// What an export error is, across the faces.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// A stream being captured refused (`CudaError::Capturing`, `HipError::Capturing`).
    Capturing,
    /// A data pointer of another device.
    WrongDevice,
    /// A stream of another device, as `"producer"` or `"consumer"`.
    StreamOnOtherDevice(&'static str),
    /// A stream of the other API.
    #[cfg_attr(not(feature = "hip"), allow(dead_code))]
    Foreign,
    /// Anything else, in words.
    Other(String),
}

/// A driver face: its streams, buffers, gates and captures, and how its errors read.
trait Backend {
    /// A stream of the face, which a derived tensor may name as its producer stream.
    type Stream: Clone + Send + Sync + 'static + dlpack_runtime::AsProducerStream;
    /// `u32` device memory.
    type Buffer: Send + 'static;
    /// Pending work held on a stream until released.
    type Gate: Send + 'static;

    /// A new stream of `device` (the runtime loaded first).
    fn stream(device: i32) -> Self::Stream;
    /// The stream as the `stream=` argument of `__dlpack__`.
    fn value(stream: &Self::Stream) -> i64;
    /// `N` zeroed elements, in the order of `stream`.
    fn zeros(stream: &Self::Stream) -> Self::Buffer;
    /// `values` (`N` of them) uploaded, in the order of `stream`.
    fn upload(values: &[u32], stream: &Self::Stream) -> Self::Buffer;
    /// The device address of the buffer.
    fn ptr(buffer: &Self::Buffer) -> u64;
    /// Enqueues a write of `byte` to every byte of the `N` elements at `ptr` on `stream`.
    fn fill(ptr: u64, stream: &Self::Stream);
    /// Enqueues a device copy of `N` elements from `src` to `dst` on `stream`.
    fn copy(dst: u64, src: u64, stream: &Self::Stream);
    /// The buffer's values, after its stream's work.
    fn read(buffer: &Self::Buffer) -> Vec<u32>;
    /// Waits for the stream.
    fn sync(stream: &Self::Stream);
    /// Holds `stream` (everything enqueued after waits) until released; opens by itself after
    /// `timeout`.
    fn hold(stream: &Self::Stream, timeout: Duration) -> Self::Gate;
    /// Releases the gate; whether it had opened by itself (a host wait for the held stream).
    fn release(gate: Self::Gate) -> bool;
    /// Starts capturing `stream` (relaxed mode).
    fn begin_capture(stream: &Self::Stream);
    /// Ends the capture of `stream`: the driver's code when the capture failed (invalidated).
    fn end_capture(stream: &Self::Stream) -> Result<(), i64>;
    /// A captured graph, instantiated; destroyed on drop.
    type Graph;
    /// Ends the capture of `stream`, instantiates its graph and launches it on `stream`.
    fn end_capture_and_launch(stream: &Self::Stream) -> Self::Graph;
    /// A derived tensor of `data` with the producer stream `stream`, exported for `request`.
    fn export(
        data: Self::Buffer,
        stream: &Self::Stream,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError>;
    /// [`Backend::export`], with the events it is ready after, owned by the caller.
    fn export_with_ready_events(
        data: Self::Buffer,
        stream: &Self::Stream,
        request: &ExportRequest,
    ) -> Result<(ManagedTensor, ReadyEvents), ExportError>;
    /// Makes `stream` wait for `events` (the host does not block).
    fn wait_ready(events: &ReadyEvents, stream: &Self::Stream);
    /// The face's device type (`kDLCUDA`, `kDLROCM`).
    const DEVICE_TYPE: DeviceType;
    /// Stream-ordered release of `tensor` after `stream`: what its error is.
    fn release_after(tensor: ManagedTensor, stream: &Self::Stream) -> Result<(), Kind>;
    /// The memory of `data` (on one device) exported as if it lived on `device`, with no
    /// producer stream.
    fn export_claimed(
        data: Self::Buffer,
        device: i32,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError>;
    /// [`Backend::export`] with a stream of the other API as one more producer stream.
    #[cfg(feature = "hip")]
    fn export_with_foreign_stream(
        data: Self::Buffer,
        stream: &Self::Stream,
        request: &ExportRequest,
    ) -> Result<ManagedTensor, ExportError>;
    /// Makes a stream of the other API wait for `events`: what its error is.
    #[cfg(feature = "hip")]
    fn wait_ready_on_the_other_api(events: &ReadyEvents) -> Result<(), Kind>;
    /// Enqueues on `stream` a host function that writes `BYTE` to every byte of the `N`
    /// elements at `dst` (host memory written in the stream's order).
    fn write_host(dst: *mut u32, stream: &Self::Stream);
    /// The default stream of `device` as a producer stream, where the face can name one for a
    /// device that it may not have (`None` where it cannot).
    fn default_stream(device: i32) -> Option<Self::Stream>;
    /// What `err` is.
    fn kind(err: &ExportError) -> Kind;
    /// Makes `device` the calling thread's current device (CUDA: its primary context).
    fn make_current(device: i32);
    /// Whether `ptr` is in live device memory (the simulator forgets freed memory).
    fn is_allocated(ptr: u64) -> bool;
    /// `N` elements of device memory of `stream`'s device, allocated in its order
    /// (`cuMemAllocAsync`, `hipMallocAsync`); the caller frees it with [`Backend::free_on`].
    fn alloc_on(stream: &Self::Stream) -> u64;
    /// Frees `ptr` from [`Backend::alloc_on`] in the order of `stream` (`cuMemFreeAsync`,
    /// `hipFreeAsync`).
    fn free_on(ptr: u64, stream: &Self::Stream);
}

/// The face's device 0 streams `a` (producer) and `b` (consumer), and the checker, reset.
fn setup<B: Backend>() -> (B::Stream, B::Stream, Checker) {
    let a = B::stream(0);
    let b = B::stream(0);
    let checker = Checker::attach().expect(NEEDS_SIMULATOR);
    (a, b, checker)
}

fn versioned(stream: Option<i64>) -> ExportRequest {
    ExportRequest::versioned().stream(stream)
}

fn filled() -> Vec<u32> {
    vec![u32::from_ne_bytes([BYTE; 4]); N]
}

/// Exports a tensor whose write is pending on `a` (behind a gate) to the consumer `request`
/// names, and copies it on `b` (the consumer's read) into a scratch buffer, still behind the
/// gate; returns the violations the checker saw then, and the values read after the release.
fn consumer_read<B: Backend>(
    a: &B::Stream,
    b: &B::Stream,
    checker: &Checker,
    stream: Option<i64>,
) -> (u64, Vec<u32>) {
    let (data, scratch, gate) = held_write::<B>(a, b, checker);
    let managed = B::export(data, a, &versioned(stream)).expect("the export succeeds");
    let read = read_behind::<B>(
        &scratch,
        managed.dl_tensor().data as u64,
        a,
        b,
        gate,
        checker,
    );
    drop(managed);
    B::sync(a);
    read
}

/// A tensor whose write of `BYTE` is pending on `a` behind a gate, and a zeroed scratch buffer
/// in the order of `c`; the checker is reset once both are ready.
fn held_write<B: Backend>(
    a: &B::Stream,
    c: &B::Stream,
    checker: &Checker,
) -> (B::Buffer, B::Buffer, B::Gate) {
    let data = B::zeros(a);
    let scratch = B::zeros(c);
    B::sync(a);
    B::sync(c);
    checker.reset();
    let gate = B::hold(a, Duration::from_secs(30));
    B::fill(B::ptr(&data), a);
    (data, scratch, gate)
}

/// Copies `N` elements at `src` into `scratch` on `c`, behind the write [`held_write`] holds on
/// `a`: returns the violations the checker saw then and, after the gate is released (it must
/// not have opened by itself: nothing waited for it on the host), the values read.
fn read_behind<B: Backend>(
    scratch: &B::Buffer,
    src: u64,
    a: &B::Stream,
    c: &B::Stream,
    gate: B::Gate,
    checker: &Checker,
) -> (u64, Vec<u32>) {
    B::copy(B::ptr(scratch), src, c);
    let violations = checker.violations();
    assert!(!B::release(gate), "the exchange waited for the held stream");
    B::sync(c);
    let values = B::read(scratch);
    B::sync(a);
    (violations, values)
}

/// Asserts that the checker reported the unordered read of a negative control (`violations`
/// of them were seen), saying `what` otherwise.
/// Says so on stderr when it holds, so that a run with `--nocapture` lists every negative
/// control of each face with what it saw.
fn assert_race_reported(violations: u64, checker: &Checker, what: &str) {
    assert_reported(violations, checker, "read of bytes", what);
}

/// [`assert_race_reported`] for a race whose report names `access` ("read of bytes", "free of
/// allocation").
fn assert_reported(violations: u64, checker: &Checker, access: &str, what: &str) {
    assert!(violations >= 1, "{what}");
    assert!(checker.report().contains(access), "{}", checker.report());
    eprintln!(
        "negative control {}: {what}: {violations} violation(s)",
        std::thread::current().name().unwrap_or("(unnamed test)")
    );
}

fn pending_work_is_ordered_before_the_consumer_stream<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let (violations, values) = consumer_read::<B>(&a, &b, &checker, Some(B::value(&b)));
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        values,
        filled(),
        "the consumer read after the producer's write"
    );
}

fn without_ordering_the_race_is_reported<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    // Negative control: `stream=-1`, the consumer takes the ordering on itself and does not.
    let (violations, _) = consumer_read::<B>(&a, &b, &checker, Some(-1));
    assert_race_reported(violations, &checker, "the unordered read is reported");
}

fn the_producers_own_stream_needs_nothing<B: Backend>() {
    let (a, _b, checker) = setup::<B>();
    // The consumer reads on the producer's stream: stream order alone orders it.
    let (violations, values) = consumer_read::<B>(&a, &a, &checker, Some(B::value(&a)));
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(values, filled());
}

fn the_host_is_not_blocked<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let data = B::zeros(&a);
    B::sync(&a);
    // A gate that opens by itself after 5 s: an export that waited on the host for the held
    // stream would return only then, and the release would say so.
    let gate = B::hold(&a, Duration::from_secs(5));
    B::fill(B::ptr(&data), &a);
    let started = std::time::Instant::now();
    let managed = B::export(data, &a, &versioned(Some(B::value(&b)))).unwrap();
    let took = started.elapsed();
    assert!(
        !B::release(gate),
        "the export blocked the host for {took:?}"
    );
    B::sync(&b);
    drop(managed);
    B::sync(&a);
    checker.assert_clean("an export behind a held producer stream");
}

fn a_copy_to_the_host_has_the_producers_values<B: Backend>() {
    let (a, _b, checker) = setup::<B>();
    let data = B::zeros(&a);
    B::sync(&a);
    let gate = B::hold(&a, Duration::from_secs(30));
    B::fill(B::ptr(&data), &a);
    // The copy waits for the held write on the host: the gate is opened from another thread.
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        B::release(gate)
    });
    let request = ExportRequest::versioned()
        .dl_device(dlpack_runtime::Device::CPU)
        .copy(Some(true));
    let managed = B::export(data, &a, &request).expect("a copy to the host");
    assert!(!opener.join().unwrap(), "the gate opened by itself");
    assert_eq!(
        managed.dl_tensor().device.device_type,
        DeviceType::Cpu.to_raw()
    );
    // SAFETY: a compact host tensor of `N` u32 values (a fresh copy this test owns).
    let values =
        unsafe { std::slice::from_raw_parts(managed.dl_tensor().data as *const u32, N) }.to_vec();
    assert_eq!(
        values,
        filled(),
        "the copy is ordered after the producer's write"
    );
    drop(managed);
    B::sync(&a);
    checker.assert_clean("a copy to the host");
}

fn a_producer_stream_captured_apart_from_the_consumer_is_refused<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let c = B::stream(0);
    // The data lives on `c` (never captured), so that dropping the refused export frees
    // nothing inside the capture; `a` names the captured pending work.
    let data = B::zeros(&c);
    B::sync(&c);
    B::begin_capture(&a);
    let err = B::export(data, &a, &versioned(Some(B::value(&b)))).unwrap_err();
    assert_eq!(B::kind(&err), Kind::Capturing, "{err}");
    assert_eq!(B::end_capture(&a), Ok(()), "the capture stays valid");
    B::sync(&c);
    checker.assert_clean("a refused export from a capturing stream");
}

fn a_consumer_stream_being_captured_waits_inside_the_capture<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let data = B::zeros(&a);
    let scratch = B::zeros(&b);
    B::sync(&a);
    B::sync(&b);
    checker.reset();
    // The producer's write is held while the graph is captured and launched: the launch's read
    // must wait for it, through the wait the export put into the capture.
    let gate = B::hold(&a, Duration::from_secs(30));
    B::fill(B::ptr(&data), &a);
    // Asked before the capture: cudarc's access tracking of a buffer of the capturing stream
    // would make it wait on an event recorded outside the capture (the `cuda` module docs).
    let scratch_ptr = B::ptr(&scratch);
    B::begin_capture(&b);
    let managed = B::export(data, &a, &versioned(Some(B::value(&b))))
        .expect("an export to a capturing consumer");
    B::copy(scratch_ptr, managed.dl_tensor().data as u64, &b);
    let graph = B::end_capture_and_launch(&b);
    let violations = checker.violations();
    assert!(!B::release(gate), "the export waited for the held stream");
    B::sync(&b);
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        B::read(&scratch),
        filled(),
        "the launch read after the write"
    );
    drop(graph);
    drop(managed);
    B::sync(&a);
    checker.assert_clean("an export to a capturing consumer");
}

fn a_pointer_of_another_device_is_refused<B: Backend>() {
    let (_a, b, _checker) = setup::<B>();
    let other = B::stream(1);
    let data = B::zeros(&other);
    B::sync(&other);
    let err = B::export_claimed(data, 0, &versioned(Some(B::value(&b)))).unwrap_err();
    assert_eq!(B::kind(&err), Kind::WrongDevice, "{err}");
}

fn a_producer_stream_of_another_device_is_refused<B: Backend>() {
    let (a, b, _checker) = setup::<B>();
    let other = B::stream(1);
    let data = B::zeros(&a);
    B::sync(&a);
    let err = B::export(data, &other, &versioned(Some(B::value(&b)))).unwrap_err();
    assert_eq!(
        B::kind(&err),
        Kind::StreamOnOtherDevice("producer"),
        "{err}"
    );
}

/// `N` `u32` of host memory, zeroed, freed on drop: shared by a test and the tensor it exports,
/// so that a stream's pending write into it stays in live memory whatever the export does.
struct HostCells(*mut u32);

// SAFETY: plain host memory, written only by a stream's host function and read by the test
// after the stream's work.
unsafe impl Send for HostCells {}
// SAFETY: as above.
unsafe impl Sync for HostCells {}

impl HostCells {
    fn new() -> std::sync::Arc<Self> {
        let memory: Box<[u32]> = vec![0u32; N].into_boxed_slice();
        std::sync::Arc::new(Self(Box::into_raw(memory).cast::<u32>()))
    }
    /// The values now (after the writing stream's work, or the test's wait for it).
    fn values(&self) -> Vec<u32> {
        // SAFETY: `N` u32 of live memory.
        unsafe { std::slice::from_raw_parts(self.0, N) }.to_vec()
    }
}

impl Drop for HostCells {
    fn drop(&mut self) {
        // SAFETY: the `Box<[u32]>` of `new`, freed once.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(self.0, N)) });
    }
}

/// A host tensor (`cpu:0`) whose values a stream of the face writes: the stream is its
/// producer stream.
#[derive(DlpackExport)]
struct HostWrittenByStream<S: dlpack_runtime::AsProducerStream + Send + 'static> {
    #[dlpack(data)]
    data: Claimed<std::sync::Arc<HostCells>>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: Option<S>,
}

/// The host function of [`Backend::write_host`]: `user_data` is the `N` `u32` to fill.
unsafe extern "C" fn write_filled(user_data: *mut core::ffi::c_void) {
    // SAFETY: `N` u32 of host memory kept alive until the stream's work is done
    // (`Backend::write_host`'s callers).
    unsafe { core::ptr::write_bytes(user_data.cast::<u32>(), BYTE, N) };
}

/// Host memory written asynchronously by a stream (a host function behind a gate): the host
/// consumer's read (`cpu:0`, no `stream`) comes after a host wait for the producer's stream,
/// so it sees every value; the gate is released by another thread meanwhile. Negative control:
/// the same tensor without its producer stream is handed over while the write is still held,
/// and its values are still the zeros.
fn host_memory_written_by_a_stream_is_complete_when_the_host_reads<B: Backend + 'static>() {
    let (a, _b, _checker) = setup::<B>();
    let export = |with_stream: bool| {
        let cells = HostCells::new();
        let gate = B::hold(&a, Duration::from_secs(30));
        B::write_host(cells.0, &a);
        let tensor = HostWrittenByStream {
            data: Claimed {
                ptr: cells.0 as u64,
                device: dlpack_runtime::Device::CPU,
                _memory: cells.clone(),
            },
            shape: vec![N],
            stream: with_stream.then(|| a.clone()),
        };
        (cells, tensor, gate)
    };
    let (cells, tensor, gate) = export(true);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        B::release(gate)
    });
    let managed = tensor.into_dlpack_with(&ExportRequest::versioned());
    // What the host consumer reads once it has the tensor.
    let read = cells.values();
    let opened_by_itself = releaser.join().unwrap();
    B::sync(&a);
    let managed = managed.expect("a host tensor with a producer stream");
    assert_eq!(
        managed.dl_tensor().device,
        dlpack_runtime::Device::CPU.into()
    );
    assert_eq!(read, filled(), "the host read after the stream's write");
    assert!(!opened_by_itself, "the gate was released, not timed out");
    drop(managed);
    drop(cells);

    // Negative control: no producer stream, nothing waited for.
    let (cells, tensor, gate) = export(false);
    let managed = tensor
        .into_dlpack_with(&ExportRequest::versioned())
        .expect("a host tensor");
    assert_eq!(cells.values(), vec![0u32; N], "the write was still held");
    assert!(!B::release(gate), "nothing waited for the held stream");
    B::sync(&a);
    assert_eq!(cells.values(), filled());
    drop(managed);
}

/// A default stream names no handle of its own: the device it is the default stream of is what
/// says whose work it orders. That of another device (1), or of a device the process does not
/// have (9), is refused as a producer stream of a device-0 tensor, before anything is ordered.
fn a_default_stream_of_another_device_is_refused<B: Backend>() {
    let (a, b, _checker) = setup::<B>();
    for device in [1, 9] {
        let Some(other) = B::default_stream(device) else {
            continue;
        };
        let data = B::zeros(&a);
        B::sync(&a);
        let err = B::export(data, &other, &versioned(Some(B::value(&b))))
            .expect_err("a default stream of another device is refused");
        assert_eq!(
            B::kind(&err),
            Kind::StreamOnOtherDevice("producer"),
            "device {device}: {err}"
        );
    }
}

fn a_consumer_stream_of_another_device_is_refused<B: Backend>() {
    let (a, _b, _checker) = setup::<B>();
    let other = B::stream(1);
    let data = B::zeros(&a);
    B::sync(&a);
    let err = B::export(data, &a, &versioned(Some(B::value(&other)))).unwrap_err();
    assert_eq!(
        B::kind(&err),
        Kind::StreamOnOtherDevice("consumer"),
        "{err}"
    );
}

#[cfg(feature = "hip")]
fn ready_events_of_the_other_api_are_refused<B: Backend>() {
    let (a, b, _checker) = setup::<B>();
    let data = B::zeros(&a);
    B::sync(&a);
    let (managed, ready) =
        B::export_with_ready_events(data, &a, &versioned(Some(B::value(&b)))).unwrap();
    assert!(!ready.is_empty());
    assert_eq!(B::wait_ready_on_the_other_api(&ready), Err(Kind::Foreign));
    // Negative control: a stream of the events' own API waits on them.
    B::wait_ready(&ready, &b);
    B::sync(&b);
    drop(managed);
}

#[cfg(feature = "hip")]
fn a_stream_of_the_other_api_is_refused<B: Backend>() {
    let (a, b, _checker) = setup::<B>();
    let data = B::zeros(&a);
    B::sync(&a);
    let err = B::export_with_foreign_stream(data, &a, &versioned(Some(B::value(&b)))).unwrap_err();
    assert_eq!(B::kind(&err), Kind::Foreign, "{err}");
}

/// How the consumer waits on the ready events of an export before it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Its stream waits on them (`ReadyEvents::wait_on`, `wait_on_hip`).
    Stream,
    /// The host waits for them (`ReadyEvents::synchronize`) while another thread releases the
    /// producer's work.
    Host,
    /// It does not wait (the negative control).
    Not,
}

/// Exports a tensor whose write is pending on `a` (behind a gate) with `stream=-1`, keeping its
/// ready events, waits on them as `wait` says, and copies it on `b` into a scratch buffer;
/// returns the number of events, the violations the checker saw then, and the values read
/// after the release.
fn read_after_ready_events<B: Backend>(
    a: &B::Stream,
    b: &B::Stream,
    checker: &Checker,
    wait: Wait,
) -> (usize, u64, Vec<u32>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let (data, scratch, gate) = held_write::<B>(a, b, checker);
    let (managed, ready) =
        B::export_with_ready_events(data, a, &versioned(Some(-1))).expect("the export succeeds");
    let released = Arc::new(AtomicBool::new(false));
    let mut gate = Some(gate);
    let opener = (wait == Wait::Host).then(|| {
        let (gate, released) = (gate.take().unwrap(), released.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            released.store(true, Ordering::SeqCst);
            B::release(gate)
        })
    });
    match wait {
        Wait::Stream => B::wait_ready(&ready, b),
        Wait::Host => {
            ready.synchronize().expect("a host wait on the events");
            assert!(
                released.load(Ordering::SeqCst),
                "synchronize returned before the producer's work was let go"
            );
        }
        Wait::Not => {}
    }
    B::copy(B::ptr(&scratch), managed.dl_tensor().data as u64, b);
    let violations = checker.violations();
    let timed_out = match (gate, opener) {
        (Some(gate), _) => B::release(gate),
        (None, Some(opener)) => opener.join().unwrap(),
        (None, None) => unreachable!("the gate is released by the test or by the opener"),
    };
    assert!(!timed_out, "the gate opened by itself");
    B::sync(b);
    let values = B::read(&scratch);
    B::sync(a);
    drop(managed);
    (ready.len(), violations, values)
}

/// The consumer reads after waiting on the ready events as `wait` says (its stream, or the
/// host: a read then enqueued on B with no stream wait is ordered after the producer's write
/// by that host wait); negative control: the same read without the wait is reported.
fn ready_events_order_a_read<B: Backend>(wait: Wait) {
    let (a, b, checker) = setup::<B>();
    let (events, violations, values) = read_after_ready_events::<B>(&a, &b, &checker, wait);
    assert!(events >= 1, "an event of the pending producer stream");
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        values,
        filled(),
        "the consumer read after the producer's write"
    );
    let (events, violations, _) = read_after_ready_events::<B>(&a, &b, &checker, Wait::Not);
    assert!(events >= 1);
    assert_race_reported(
        violations,
        &checker,
        "the read without the wait is reported",
    );
}

fn ready_events_let_the_consumer_wait_later<B: Backend>() {
    ready_events_order_a_read::<B>(Wait::Stream);
}

fn ready_events_block_the_host_until_the_producers_work<B: Backend>() {
    ready_events_order_a_read::<B>(Wait::Host);
}

/// Ready events of an export whose write is pending on `a` (behind a gate) are waited on by
/// `b` while `b` is being captured (when `wait`), and the graph's read is launched, still
/// behind the gate: returns the violations the checker saw then and the values read after the
/// release. The events are kept (with the tensor) until the launch has finished.
fn captured_read_after_ready_events<B: Backend>(
    a: &B::Stream,
    b: &B::Stream,
    checker: &Checker,
    wait: bool,
) -> (u64, Vec<u32>) {
    let (data, scratch, gate) = held_write::<B>(a, b, checker);
    let (managed, ready) =
        B::export_with_ready_events(data, a, &versioned(Some(-1))).expect("the export succeeds");
    // Asked before the capture: cudarc's access tracking of a buffer of the capturing stream
    // would make it wait on an event recorded outside the capture (the `cuda` module docs).
    let scratch_ptr = B::ptr(&scratch);
    B::begin_capture(b);
    if wait {
        B::wait_ready(&ready, b);
    }
    B::copy(scratch_ptr, managed.dl_tensor().data as u64, b);
    let graph = B::end_capture_and_launch(b);
    let violations = checker.violations();
    assert!(!B::release(gate), "the wait held the host");
    B::sync(b);
    let values = B::read(&scratch);
    drop(graph);
    drop(ready);
    drop(managed);
    B::sync(a);
    (violations, values)
}

fn ready_events_waited_on_inside_a_capture_order_the_launch<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let (violations, values) = captured_read_after_ready_events::<B>(&a, &b, &checker, true);
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        values,
        filled(),
        "the launch read after the producer's write"
    );
    checker.assert_clean("ready events waited on inside a capture");
    // Negative control: the same capture without the wait races with the write.
    let (violations, _) = captured_read_after_ready_events::<B>(&a, &b, &checker, false);
    assert_race_reported(
        violations,
        &checker,
        "the launch without the wait is reported",
    );
}

/// A user's own tensor type that keeps an import and lends it on (a relay): no stream field.
#[derive(DlpackImport, DlpackExport)]
struct Relay {
    #[dlpack(data)]
    data: ImportedData<u32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A tensor whose write is pending on `a` behind a gate, imported into a [`Relay`] for the
/// consumer stream `first` (`-1`: no synchronization), then lent on to `c` (with `copy`) and
/// imported there; a copy of it is enqueued on `c` into a scratch buffer, still behind the
/// gate. Returns the events the relayed tensor carries, the violations the checker saw then,
/// and the values read after the release.
fn relayed<B: Backend>(
    a: &B::Stream,
    first: i64,
    c: &B::Stream,
    checker: &Checker,
    copy: Option<bool>,
) -> (usize, u64, Vec<u32>) {
    let (data, scratch, gate) = held_write::<B>(a, c, checker);
    let relay = Relay::from_managed(B::export(data, a, &versioned(Some(first))).unwrap())
        .expect("the first import");
    assert_eq!(relay.shape, [N]);
    let next = Relay::from_managed(
        relay
            .into_dlpack_with(&versioned(Some(B::value(c))).copy(copy))
            .expect("the relay lends it on"),
    )
    .expect("the second import");
    assert_eq!(next.data.managed().is_copied(), copy == Some(true));
    let carried = next
        .data
        .managed()
        .ready_events()
        .map_or(0, ReadyEvents::len);
    let src = next.data.managed().dl_tensor().data as u64;
    let (violations, values) = read_behind::<B>(&scratch, src, a, c, gate, checker);
    drop(next);
    (carried, violations, values)
}

/// A relay lent on to C (as it is, or copied on C with `copy=True`) orders C after the
/// producer's write with nothing added by the user; negative control: imported first with
/// `stream=-1`, it carries nothing, and C races with the write.
fn a_relay_case<B: Backend>(copy: Option<bool>) {
    let (a, b, checker) = setup::<B>();
    let c = B::stream(0);
    let (carried, violations, values) = relayed::<B>(&a, B::value(&b), &c, &checker, copy);
    assert_eq!(carried, 1, "the relayed tensor carries an event on");
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(values, filled(), "C read after the producer's write");
    B::sync(&b);
    let (carried, violations, _) = relayed::<B>(&a, -1, &c, &checker, copy);
    // A copy carries the event recorded after it, whatever its source carried.
    assert_eq!(carried, usize::from(copy == Some(true)));
    assert_race_reported(
        violations,
        &checker,
        "the unordered read of the relay is reported",
    );
}

fn a_relay_orders_the_next_consumer_after_the_producer<B: Backend>() {
    a_relay_case::<B>(None);
}

fn a_relay_copied_for_the_next_consumer_is_copied_after_the_producer<B: Backend>() {
    a_relay_case::<B>(Some(true));
}

/// Sets its flag when dropped: a tensor's deleter has run.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Imports a tensor of `N` elements of the face's device memory with no pending producer work,
/// whose deleter sets the returned flag, and enqueues a read of it on `b` behind a gate;
/// returns the import, its flag, the gate and the scratch buffer read into.
fn held_read<B: Backend>(
    a: &B::Stream,
    b: &B::Stream,
) -> (
    ImportedData<u32>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    B::Gate,
    B::Buffer,
) {
    let data = B::zeros(a);
    let scratch = B::zeros(b);
    B::sync(a);
    B::sync(b);
    let ptr = B::ptr(&data);
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let device = dlpack_runtime::Device::new(B::DEVICE_TYPE, 0);
    let managed = export_claimed(
        ptr,
        device,
        (data, DropFlag(dropped.clone())),
        &versioned(Some(B::value(b))),
    )
    .expect("the export succeeds");
    let import = Relay::from_managed(managed).expect("the import").data;
    let gate = B::hold(b, Duration::from_secs(30));
    B::copy(B::ptr(&scratch), ptr, b);
    (import, dropped, gate, scratch)
}

/// Waits (10 s at most) until the deleter that sets `dropped` has run.
fn wait_until_dropped(dropped: &std::sync::atomic::AtomicBool) {
    let started = std::time::Instant::now();
    while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the deleter never ran after the consumer's stream finished"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn a_release_after_the_consumers_stream_waits_for_its_work<B: Backend>() {
    use std::sync::atomic::Ordering;

    let (a, b, checker) = setup::<B>();
    checker.reset();
    let (import, dropped, gate, scratch) = held_read::<B>(&a, &b);
    B::release_after(import.into_managed(), &b).expect("a stream-ordered release");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the deleter ran while the consumer's stream still held its read"
    );
    assert!(!B::release(gate), "the release waited for the held stream");
    B::sync(&b);
    wait_until_dropped(&dropped);
    assert_eq!(B::read(&scratch), vec![0; N]);
    checker.assert_clean("a stream-ordered release");
    // Negative control: a plain drop runs the deleter at once, while the read is still held.
    let (import, dropped, gate, _scratch) = held_read::<B>(&a, &b);
    drop(import);
    assert!(
        dropped.load(Ordering::SeqCst),
        "a plain drop runs the deleter before the consumer's stream is done"
    );
    assert!(!B::release(gate));
    B::sync(&b);
}

/// A tensor of `N` elements at `ptr` on `device` with the producer stream `stream`, keeping
/// `memory` alive.
#[derive(DlpackExport)]
struct WithStream<M: Send + 'static, S: Send + 'static> {
    #[dlpack(data)]
    data: Claimed<M>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(stream)]
    stream: S,
}

/// A tensor whose write is pending on `a` behind a gate, with a deleter that sets the returned
/// flag, imported for the consumer stream `first` (`-1`: no synchronization), then released
/// after `c`, a stream that never used it.
fn released_relay<B: Backend>(
    a: &B::Stream,
    first: i64,
    c: &B::Stream,
    checker: &Checker,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, B::Gate) {
    let (data, _scratch, gate) = held_write::<B>(a, c, checker);
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let managed = WithStream {
        data: Claimed {
            ptr: B::ptr(&data),
            device: dlpack_runtime::Device::new(B::DEVICE_TYPE, 0),
            _memory: (data, DropFlag(dropped.clone())),
        },
        shape: vec![N],
        stream: a.clone(),
    }
    .into_dlpack_with(&versioned(Some(first)))
    .expect("the export succeeds");
    let relay = Relay::from_managed(managed).expect("the import");
    B::release_after(relay.data.into_managed(), c).expect("a stream-ordered release");
    (dropped, gate)
}

fn a_relay_released_after_a_stream_is_released_after_its_producer_too<B: Backend>() {
    use std::sync::atomic::Ordering;

    let (a, b, checker) = setup::<B>();
    let c = B::stream(0);
    // Imported for B, released after C, which never used it: the release still waits for the
    // producer's write, which the import carries as ready events.
    let (dropped, gate) = released_relay::<B>(&a, B::value(&b), &c, &checker);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the deleter ran while the producer's write was held"
    );
    assert!(!B::release(gate));
    wait_until_dropped(&dropped);
    B::sync(&a);
    checker.assert_clean("a relay released after a stream");
    // Negative control: imported with `stream=-1`, the import carries nothing to wait for, and
    // the release after C runs the deleter while the producer's write is still held.
    let (dropped, gate) = released_relay::<B>(&a, -1, &c, &checker);
    wait_until_dropped(&dropped);
    assert!(
        !B::release(gate),
        "the gate was still held when the deleter ran"
    );
    B::sync(&a);
}

fn a_release_after_a_capturing_stream_is_refused_and_leaked<B: Backend>() {
    use std::sync::atomic::Ordering;

    let (a, b, checker) = setup::<B>();
    let (import, dropped, gate, _scratch) = held_read::<B>(&a, &b);
    assert!(!B::release(gate));
    B::sync(&b);
    checker.reset();
    // The graph would read the tensor at every launch: the release is refused before anything
    // is recorded or waited for on the capturing stream, and the tensor is leaked.
    B::begin_capture(&b);
    let refused = B::release_after(import.into_managed(), &b);
    assert_eq!(refused, Err(Kind::Capturing));
    assert_eq!(checker.violations(), 0, "{}", checker.report());
    assert_eq!(B::end_capture(&b), Ok(()), "the capture stays valid");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the refused tensor is leaked"
    );
    // Negative control: the same release after the capture has ended runs the deleter.
    let (import, dropped, gate, _scratch) = held_read::<B>(&a, &b);
    assert!(!B::release(gate));
    B::release_after(import.into_managed(), &b).expect("a stream-ordered release");
    B::sync(&b);
    wait_until_dropped(&dropped);
    checker.assert_clean("a release refused under capture");
}

/// Exports a tensor whose write is pending on `a` (behind a gate) as a copy (`copy=True`) for
/// the consumer stream `c` of device `target` (`dl_device` when not 0), naming the producer's
/// stream when `named` (else the export knows of no pending work), and copies the result on
/// `c` into a scratch buffer, still behind the gate; returns whether the result is flagged as
/// a copy and its device ordinal, the violations the checker saw then, and the values read
/// after the release.
fn copied_read<B: Backend>(
    a: &B::Stream,
    c: &B::Stream,
    target: i32,
    checker: &Checker,
    named: bool,
) -> (bool, i32, u64, Vec<u32>) {
    let (data, scratch, gate) = held_write::<B>(a, c, checker);
    let mut request = versioned(Some(B::value(c))).copy(Some(true));
    if target != 0 {
        request = request.dl_device(dlpack_runtime::Device::new(B::DEVICE_TYPE, target));
    }
    let managed = if named {
        B::export(data, a, &request)
    } else {
        B::export_claimed(data, 0, &request)
    }
    .expect("a copy for the consumer");
    let (copied, device) = (managed.is_copied(), managed.dl_tensor().device.device_id);
    assert_eq!(
        managed.dl_tensor().device.device_type,
        B::DEVICE_TYPE.to_raw(),
        "a copy on the face's devices"
    );
    let src = managed.dl_tensor().data as u64;
    let (violations, values) = read_behind::<B>(&scratch, src, a, c, gate, checker);
    drop(managed);
    B::sync(c);
    (copied, device, violations, values)
}

fn a_copy_on_the_device_is_ordered_after_the_producer<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let (copied, device, violations, values) = copied_read::<B>(&a, &b, 0, &checker, true);
    assert!(copied, "the result is flagged IS_COPIED");
    assert_eq!(device, 0);
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        values,
        filled(),
        "the copy was made after the producer's write"
    );
    checker.assert_clean("a copy on the device");
    // Negative control: the producer's stream not named, the copy races with its write.
    let (copied, _, violations, _) = copied_read::<B>(&a, &b, 0, &checker, false);
    assert!(copied);
    assert_race_reported(violations, &checker, "the unordered copy is reported");
}

fn a_copy_to_another_device_is_ordered_after_the_producer<B: Backend>() {
    let (a, _b, checker) = setup::<B>();
    let c = B::stream(1);
    let (copied, device, violations, values) = copied_read::<B>(&a, &c, 1, &checker, true);
    assert!(copied, "the result is flagged IS_COPIED");
    assert_eq!(device, 1, "the copy is on the device asked for");
    assert_eq!(violations, 0, "{}", checker.report());
    assert_eq!(
        values,
        filled(),
        "the copy was made after the producer's write"
    );
    checker.assert_clean("a copy to another device");
    // Negative control: the producer's stream not named, the copy races with its write.
    let (_, _, violations, _) = copied_read::<B>(&a, &c, 1, &checker, false);
    assert_race_reported(violations, &checker, "the unordered copy is reported");
}

/// A 16 x 16 matrix of `N` elements viewed transposed (strides `[1, 16]`) on `device`, over
/// `memory`.
#[derive(DlpackExport)]
struct Transposed<M: Send + 'static> {
    #[dlpack(data)]
    data: Claimed<M>,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(strides)]
    strides: [isize; 2],
}

/// `data` (`N` elements of device 0 of the face) viewed as a transposed 16 x 16 matrix.
fn transposed_view<B: Backend>(data: B::Buffer) -> Transposed<B::Buffer> {
    Transposed {
        data: Claimed {
            ptr: B::ptr(&data),
            device: dlpack_runtime::Device::new(B::DEVICE_TYPE, 0),
            _memory: data,
        },
        shape: [16, 16],
        strides: [1, 16],
    }
}

fn a_strided_copy_is_compact<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let values: Vec<u32> = (0..N as u32).collect();
    // Row-major order of the transposed view: element (i, j) is `values[j * 16 + i]`.
    let transposed: Vec<u32> = (0..N).map(|k| values[(k % 16) * 16 + k / 16]).collect();
    for target in [0, 1] {
        let c = if target == 0 { b.clone() } else { B::stream(1) };
        let data = B::upload(&values, &a);
        let scratch = B::zeros(&c);
        B::sync(&a);
        B::sync(&c);
        let view = |copy| {
            let mut request = versioned(Some(B::value(&c))).copy(copy);
            if target != 0 {
                request = request.dl_device(dlpack_runtime::Device::new(B::DEVICE_TYPE, target));
            }
            request
        };
        let managed = transposed_view::<B>(data)
            .into_dlpack_with(&view(Some(true)))
            .expect("a strided copy");
        assert!(managed.is_copied());
        assert_eq!(managed.dl_tensor().device.device_id, target);
        let layout = managed.layout().unwrap();
        assert!(
            layout.is_contiguous(dlpack_runtime::Contiguity::C),
            "the copy is compact row-major"
        );
        B::copy(B::ptr(&scratch), managed.dl_tensor().data as u64, &c);
        assert_eq!(B::read(&scratch), transposed, "target {target}");
        drop(managed);
        B::sync(&c);
    }
    // Negative control: the view shared without a copy keeps its strides, and its memory read
    // in order is the untransposed matrix.
    let data = B::upload(&values, &a);
    B::sync(&a);
    let shared = transposed_view::<B>(data)
        .into_dlpack_with(&versioned(Some(B::value(&b))))
        .unwrap();
    assert!(!shared.is_copied());
    assert!(
        !shared
            .layout()
            .unwrap()
            .is_contiguous(dlpack_runtime::Contiguity::C)
    );
    let scratch = B::zeros(&b);
    B::copy(B::ptr(&scratch), shared.dl_tensor().data as u64, &b);
    assert_eq!(B::read(&scratch), values);
    assert_ne!(values, transposed);
    drop(shared);
    B::sync(&a);
    checker.assert_clean("strided copies");
}

/// A broadcast that no memory could hold as a copy: one row of 16 elements repeated 2^58 times
/// (stride 0), 2^62 elements of 4 bytes, over `data`.
fn huge_broadcast<B: Backend>(data: B::Buffer) -> Transposed<B::Buffer> {
    Transposed {
        data: Claimed {
            ptr: B::ptr(&data),
            device: dlpack_runtime::Device::new(B::DEVICE_TYPE, 0),
            _memory: data,
        },
        shape: [1 << 58, 16],
        strides: [0, 1],
    }
}

/// A copy of a broadcast too large for any memory is refused with a typed error
/// (`LayoutError::CopyTooLarge`, naming the elements and their size) before anything is
/// allocated or enqueued: on the tensor's device, to another device and to the host. Shared
/// without a copy, the same view is exported.
fn a_copy_too_large_for_memory_is_refused<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    let c = B::stream(1);
    let on = |stream: &B::Stream| versioned(Some(B::value(stream)));
    let requests = [
        ("on the device", on(&b).copy(Some(true))),
        (
            "to another device",
            on(&c).dl_device(dlpack_runtime::Device::new(B::DEVICE_TYPE, 1)),
        ),
        (
            "to the host",
            versioned(None).dl_device(dlpack_runtime::Device::CPU),
        ),
    ];
    for (what, request) in &requests {
        let data = B::upload(&filled(), &a);
        B::sync(&a);
        let err = huge_broadcast::<B>(data)
            .into_dlpack_with(request)
            .expect_err(what);
        assert!(
            matches!(
                err,
                ExportError::Layout(dlpack_runtime::LayoutError::CopyTooLarge {
                    numel,
                    element_bytes: 4,
                }) if numel == 1 << 62
            ),
            "{what}: {err}"
        );
    }
    let data = B::upload(&filled(), &a);
    B::sync(&a);
    let shared = huge_broadcast::<B>(data)
        .into_dlpack_with(&on(&b))
        .expect("shared without a copy");
    assert!(!shared.is_copied());
    assert_eq!(shared.dl_tensor().ndim, 2);
    drop(shared);
    B::sync(&b);
    checker.assert_clean("copies refused");
}

/// A copy (`copy=True`, on device `target`) released by the consumer while its stream still
/// reads it, the releasing thread's current device being 0: the deleter returns without waiting
/// for the device, and the copy's memory stays allocated until the read is done (the checker
/// sees no free racing with it), then is freed. Negative control: memory freed in the order of
/// another stream of the copy's device, not ordered after the read, is reported.
fn copy_released_during_its_read<B: Backend>(target: i32) {
    use std::time::Instant;

    let (a, _b, checker) = setup::<B>();
    let c = B::stream(target);
    let values: Vec<u32> = (0..N as u32).collect();
    let data = B::upload(&values, &a);
    let scratch = B::zeros(&c);
    B::sync(&a);
    B::sync(&c);
    let mut request = versioned(Some(B::value(&c))).copy(Some(true));
    if target != 0 {
        request = request.dl_device(dlpack_runtime::Device::new(B::DEVICE_TYPE, target));
    }
    let managed = B::export(data, &a, &request).expect("a copy for the consumer");
    assert!(managed.is_copied());
    assert_eq!(managed.dl_tensor().device.device_id, target);
    let copy = managed.dl_tensor().data as u64;
    B::sync(&c);
    checker.reset();
    // The consumer's read of the copy, held on its stream; the gate opens by itself after 5 s,
    // which the release below reports.
    let gate = B::hold(&c, Duration::from_secs(5));
    B::copy(B::ptr(&scratch), copy, &c);
    B::make_current(0);
    let started = Instant::now();
    drop(managed);
    let took = started.elapsed();
    assert!(
        B::is_allocated(copy),
        "the copy was freed while its read was held (the release took {took:?}): {}",
        checker.report()
    );
    assert!(
        !B::release(gate),
        "releasing the copy blocked the host for {took:?}"
    );
    B::sync(&c);
    assert_eq!(B::read(&scratch), values, "the read saw the copy's values");
    let waited = Instant::now();
    while B::is_allocated(copy) {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the copy's memory was never freed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    checker.assert_clean("a copy released while its read was held");
    // Negative control: memory of the copy's device freed in the order of another stream of
    // that device, which the held read is not ordered before.
    let d = B::stream(target);
    let memory = B::alloc_on(&c);
    B::sync(&c);
    checker.reset();
    let gate = B::hold(&c, Duration::from_secs(5));
    B::copy(B::ptr(&scratch), memory, &c);
    B::free_on(memory, &d);
    let violations = checker.violations();
    assert!(!B::release(gate));
    B::sync(&c);
    B::sync(&d);
    assert_reported(
        violations,
        &checker,
        "free of allocation",
        "the unordered free is reported",
    );
}

fn a_copy_released_during_its_read_is_freed_after_it<B: Backend>() {
    copy_released_during_its_read::<B>(0);
}

fn a_copy_on_another_device_released_during_its_read_is_freed_after_it<B: Backend>() {
    copy_released_during_its_read::<B>(1);
}

/// The cases, instantiated for one face.
macro_rules! handoff_cases {
    ($backend:ty) => {
        #[test]
        fn pending_work_is_ordered_before_the_consumer_stream() {
            super::pending_work_is_ordered_before_the_consumer_stream::<$backend>();
        }
        #[test]
        fn without_ordering_the_race_is_reported() {
            super::without_ordering_the_race_is_reported::<$backend>();
        }
        #[test]
        fn the_producers_own_stream_needs_nothing() {
            super::the_producers_own_stream_needs_nothing::<$backend>();
        }
        #[test]
        fn the_host_is_not_blocked() {
            super::the_host_is_not_blocked::<$backend>();
        }
        #[test]
        fn a_copy_to_the_host_has_the_producers_values() {
            super::a_copy_to_the_host_has_the_producers_values::<$backend>();
        }
        #[test]
        fn a_producer_stream_captured_apart_from_the_consumer_is_refused() {
            super::a_producer_stream_captured_apart_from_the_consumer_is_refused::<$backend>();
        }
        #[test]
        fn a_consumer_stream_being_captured_waits_inside_the_capture() {
            super::a_consumer_stream_being_captured_waits_inside_the_capture::<$backend>();
        }
        #[test]
        fn a_pointer_of_another_device_is_refused() {
            super::a_pointer_of_another_device_is_refused::<$backend>();
        }
        #[test]
        fn a_producer_stream_of_another_device_is_refused() {
            super::a_producer_stream_of_another_device_is_refused::<$backend>();
        }
        #[test]
        fn a_default_stream_of_another_device_is_refused() {
            super::a_default_stream_of_another_device_is_refused::<$backend>();
        }
        #[test]
        fn host_memory_written_by_a_stream_is_complete_when_the_host_reads() {
            super::host_memory_written_by_a_stream_is_complete_when_the_host_reads::<$backend>();
        }
        #[test]
        fn a_consumer_stream_of_another_device_is_refused() {
            super::a_consumer_stream_of_another_device_is_refused::<$backend>();
        }
        #[test]
        fn ready_events_let_the_consumer_wait_later() {
            super::ready_events_let_the_consumer_wait_later::<$backend>();
        }
        #[test]
        fn ready_events_block_the_host_until_the_producers_work() {
            super::ready_events_block_the_host_until_the_producers_work::<$backend>();
        }
        #[test]
        fn ready_events_waited_on_inside_a_capture_order_the_launch() {
            super::ready_events_waited_on_inside_a_capture_order_the_launch::<$backend>();
        }
        #[test]
        fn a_relay_copied_for_the_next_consumer_is_copied_after_the_producer() {
            super::a_relay_copied_for_the_next_consumer_is_copied_after_the_producer::<$backend>();
        }
        #[test]
        fn a_relay_orders_the_next_consumer_after_the_producer() {
            super::a_relay_orders_the_next_consumer_after_the_producer::<$backend>();
        }
        #[test]
        fn a_release_after_the_consumers_stream_waits_for_its_work() {
            super::a_release_after_the_consumers_stream_waits_for_its_work::<$backend>();
        }
        #[test]
        fn a_relay_released_after_a_stream_is_released_after_its_producer_too() {
            super::a_relay_released_after_a_stream_is_released_after_its_producer_too::<$backend>();
        }
        #[test]
        fn a_release_after_a_capturing_stream_is_refused_and_leaked() {
            super::a_release_after_a_capturing_stream_is_refused_and_leaked::<$backend>();
        }
        #[test]
        fn a_copy_on_the_device_is_ordered_after_the_producer() {
            super::a_copy_on_the_device_is_ordered_after_the_producer::<$backend>();
        }
        #[test]
        fn a_copy_to_another_device_is_ordered_after_the_producer() {
            super::a_copy_to_another_device_is_ordered_after_the_producer::<$backend>();
        }
        #[test]
        fn a_strided_copy_is_compact() {
            super::a_strided_copy_is_compact::<$backend>();
        }
        #[test]
        fn a_byte_offset_past_the_buffer_is_refused_as_such() {
            super::a_byte_offset_past_the_buffer_is_refused_as_such::<$backend>();
        }
        #[test]
        fn a_copy_too_large_for_memory_is_refused() {
            super::a_copy_too_large_for_memory_is_refused::<$backend>();
        }
        #[test]
        fn a_copy_released_during_its_read_is_freed_after_it() {
            super::a_copy_released_during_its_read_is_freed_after_it::<$backend>();
        }
        #[test]
        fn a_copy_on_another_device_released_during_its_read_is_freed_after_it() {
            super::a_copy_on_another_device_released_during_its_read_is_freed_after_it::<$backend>(
            );
        }
        #[cfg(feature = "hip")]
        #[test]
        fn ready_events_of_the_other_api_are_refused() {
            super::ready_events_of_the_other_api_are_refused::<$backend>();
        }
        #[cfg(feature = "hip")]
        #[test]
        fn a_stream_of_the_other_api_is_refused() {
            super::a_stream_of_the_other_api_is_refused::<$backend>();
        }
    };
}

/// A data buffer that says it lives on `device`, whatever its memory is (keeping `memory`
/// alive): how a wrong-device pointer reaches an export.
struct Claimed<M> {
    ptr: u64,
    device: dlpack_runtime::Device,
    _memory: M,
}

// SAFETY: `ptr` is `N` u32 of device memory kept alive by `_memory`; only the device is wrong,
// which the export checks against the pointer.
unsafe impl<M> dlpack_runtime::ExportBuffer for Claimed<M> {
    fn dtype(&self) -> dlpack_runtime::DataType {
        dlpack_runtime::DataType::U32
    }
    fn device(&self) -> dlpack_runtime::Device {
        self.device
    }
    fn byte_len(&self) -> usize {
        N * 4
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.ptr as usize as *mut core::ffi::c_void)
    }
}

#[derive(DlpackExport)]
struct ClaimedTensor<M: Send + 'static> {
    #[dlpack(data)]
    data: Claimed<M>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// [`ClaimedTensor`] with a byte offset.
#[derive(DlpackExport)]
struct OffsetTensor<M: Send + 'static> {
    #[dlpack(data)]
    data: Claimed<M>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
}

/// Two elements at `byte_offset` bytes into `N` elements of the face's device 0, exported for
/// the consumer stream `b`.
fn export_at_offset<B: Backend>(
    a: &B::Stream,
    b: &B::Stream,
    byte_offset: usize,
) -> (u64, Result<ManagedTensor, ExportError>) {
    let data = B::zeros(a);
    B::sync(a);
    let ptr = B::ptr(&data);
    let managed = OffsetTensor {
        data: Claimed {
            ptr,
            device: dlpack_runtime::Device::new(B::DEVICE_TYPE, 0),
            _memory: data,
        },
        shape: vec![2],
        byte_offset,
    }
    .into_dlpack_with(&versioned(Some(B::value(b))));
    (ptr, managed)
}

/// A byte offset that puts the elements past the end of the buffer is refused as such
/// (`LayoutError::OutOfBuffer`, naming the bytes reached and the buffer's length), before any
/// device or stream is asked about: never as a pointer that is not device memory. The offset
/// of the last two elements is exported, with `data` at that offset.
fn a_byte_offset_past_the_buffer_is_refused_as_such<B: Backend>() {
    let (a, b, checker) = setup::<B>();
    for byte_offset in [N * 4, N * 4 - 4, N * 4 + 64, 1 << 40] {
        let (_, exported) = export_at_offset::<B>(&a, &b, byte_offset);
        let err = exported.expect_err("an offset past the buffer");
        assert!(
            matches!(
                err,
                ExportError::Layout(dlpack_runtime::LayoutError::OutOfBuffer { start, end, len })
                    if start == byte_offset as isize && end == byte_offset as isize + 8 && len == N * 4
            ),
            "byte_offset {byte_offset}: {err}"
        );
    }
    let byte_offset = (N - 2) * 4;
    let (ptr, exported) = export_at_offset::<B>(&a, &b, byte_offset);
    let managed = exported.expect("the last two elements");
    assert_eq!(
        managed.dl_tensor().data as u64 + managed.dl_tensor().byte_offset,
        ptr + byte_offset as u64
    );
    drop(managed);
    B::sync(&b);
    checker.assert_clean("offsets");
}

fn export_claimed<M: Send + 'static>(
    ptr: u64,
    device: dlpack_runtime::Device,
    memory: M,
    request: &ExportRequest,
) -> Result<ManagedTensor, ExportError> {
    ClaimedTensor {
        data: Claimed {
            ptr,
            device,
            _memory: memory,
        },
        shape: vec![N],
    }
    .into_dlpack_with(request)
}

/// The CUDA face, on cudarc.
mod cuda_face {
    use std::sync::Arc;
    use std::time::Duration;

    use cuda_sim_testing::Gate;
    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
    use dlpack_runtime::cuda::{self, CudaError, ReadyEvents};
    use dlpack_runtime::{Device, DlpackExport, ExportError, ExportRequest, ManagedTensor};
    use dlpack_tests::Counter;
    use dlpack_tests::gpu::{CapturedGraph, GpuTensor};

    use super::{Backend, Kind, N};

    pub(super) struct Cuda;

    fn bound(stream: &CudaStream) {
        stream.context().bind_to_thread().unwrap();
    }

    /// A CUDA tensor with one more producer stream, of HIP.
    #[cfg(feature = "hip")]
    #[derive(DlpackExport)]
    struct WithHipStream {
        #[dlpack(data)]
        data: CudaSlice<u32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
        #[dlpack(stream)]
        stream: Arc<CudaStream>,
        #[dlpack(stream)]
        hip: dlpack_runtime::hip::HipStream,
    }

    impl Backend for Cuda {
        type Stream = Arc<CudaStream>;
        type Buffer = CudaSlice<u32>;
        type Gate = Gate;

        fn stream(device: i32) -> Self::Stream {
            cuda::init().expect(super::NEEDS_SIMULATOR);
            CudaContext::new(device as usize)
                .unwrap()
                .new_stream()
                .unwrap()
        }
        fn value(stream: &Self::Stream) -> i64 {
            stream.cu_stream() as i64
        }
        fn zeros(stream: &Self::Stream) -> Self::Buffer {
            stream.alloc_zeros::<u32>(N).unwrap()
        }
        fn upload(values: &[u32], stream: &Self::Stream) -> Self::Buffer {
            stream.clone_htod(values).unwrap()
        }
        fn ptr(buffer: &Self::Buffer) -> u64 {
            buffer.device_ptr(buffer.stream()).0
        }
        fn fill(ptr: u64, stream: &Self::Stream) {
            bound(stream);
            // SAFETY: `N` u32 of a live allocation; stream-ordered.
            unsafe { sys::cuMemsetD8Async(ptr, super::BYTE, N * 4, stream.cu_stream()) }
                .result()
                .unwrap();
        }
        fn copy(dst: u64, src: u64, stream: &Self::Stream) {
            bound(stream);
            // SAFETY: both are `N` u32 of live allocations; stream-ordered.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, N * 4, stream.cu_stream()) }
                .result()
                .unwrap();
        }
        fn read(buffer: &Self::Buffer) -> Vec<u32> {
            buffer.stream().clone_dtoh(buffer).unwrap()
        }
        fn sync(stream: &Self::Stream) {
            stream.synchronize().unwrap();
        }
        fn hold(stream: &Self::Stream, timeout: Duration) -> Self::Gate {
            Gate::hold(stream).with_timeout(Some(timeout))
        }
        fn release(gate: Self::Gate) -> bool {
            let timed_out = gate.timed_out();
            if !timed_out {
                gate.release();
            } else {
                std::mem::forget(gate);
            }
            timed_out
        }
        fn begin_capture(stream: &Self::Stream) {
            bound(stream);
            // SAFETY: a live stream of the bound context.
            unsafe {
                CapturedGraph::begin(
                    stream.cu_stream(),
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            };
        }
        fn end_capture(stream: &Self::Stream) -> Result<(), i64> {
            bound(stream);
            // SAFETY: a live stream being captured.
            unsafe { CapturedGraph::end(stream.cu_stream()) }
                .map(drop)
                .map_err(|code| code as i64)
        }
        type Graph = CapturedGraph;
        fn end_capture_and_launch(stream: &Self::Stream) -> Self::Graph {
            bound(stream);
            // SAFETY: a live stream being captured.
            let graph = unsafe { CapturedGraph::end(stream.cu_stream()) }.expect("a valid capture");
            graph.launch(stream);
            graph
        }
        fn export(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            GpuTensor::new(data, stream, &Counter::new()).into_dlpack_with(request)
        }
        fn export_with_ready_events(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<(ManagedTensor, ReadyEvents), ExportError> {
            GpuTensor::new(data, stream, &Counter::new()).into_dlpack_with_ready_events(request)
        }
        fn wait_ready(events: &ReadyEvents, stream: &Self::Stream) {
            events
                .wait_on(stream)
                .expect("a CUDA stream waits on CUDA events");
        }
        const DEVICE_TYPE: dlpack_runtime::DeviceType = dlpack_runtime::DeviceType::Cuda;
        fn release_after(tensor: ManagedTensor, stream: &Self::Stream) -> Result<(), Kind> {
            cuda::release_after(tensor, stream).map_err(|err| match err {
                CudaError::Capturing { .. } => Kind::Capturing,
                other => Kind::Other(other.to_string()),
            })
        }
        fn export_claimed(
            data: Self::Buffer,
            device: i32,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            let ptr = Self::ptr(&data);
            super::export_claimed(ptr, Device::cuda(device), data, request)
        }
        #[cfg(feature = "hip")]
        fn export_with_foreign_stream(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            WithHipStream {
                data,
                shape: vec![N],
                stream: stream.clone(),
                hip: dlpack_runtime::hip::HipStream::default_stream(0),
            }
            .into_dlpack_with(request)
        }
        #[cfg(feature = "hip")]
        fn wait_ready_on_the_other_api(events: &ReadyEvents) -> Result<(), Kind> {
            use dlpack_runtime::hip::{HipError, HipStream};
            events
                .wait_on_hip(&HipStream::default_stream(0))
                .map_err(|err| match err {
                    HipError::ForeignEvents { found: "CUDA", .. } => Kind::Foreign,
                    other => Kind::Other(other.to_string()),
                })
        }
        fn write_host(dst: *mut u32, stream: &Self::Stream) {
            bound(stream);
            // SAFETY: a live stream; the callers keep `N` u32 at `dst` alive until its work is
            // done.
            unsafe {
                sys::cuLaunchHostFunc(stream.cu_stream(), Some(super::write_filled), dst.cast())
            }
            .result()
            .unwrap();
        }
        fn default_stream(device: i32) -> Option<Self::Stream> {
            // cudarc streams carry their context: a device the driver does not have has none.
            CudaContext::new(device as usize)
                .ok()
                .map(|ctx| ctx.default_stream())
        }
        fn kind(err: &ExportError) -> Kind {
            match err {
                ExportError::Cuda(CudaError::Capturing { .. }) => Kind::Capturing,
                ExportError::Cuda(CudaError::WrongDevice { .. }) => Kind::WrongDevice,
                ExportError::Cuda(CudaError::StreamOnOtherDevice { role, .. }) => {
                    Kind::StreamOnOtherDevice(role)
                }
                #[cfg(feature = "hip")]
                ExportError::Hip(dlpack_runtime::hip::HipError::ForeignStream {
                    found: "HIP",
                    ..
                }) => Kind::Foreign,
                other => Kind::Other(other.to_string()),
            }
        }
        fn make_current(device: i32) {
            CudaContext::new(device as usize)
                .unwrap()
                .bind_to_thread()
                .unwrap();
        }
        fn is_allocated(ptr: u64) -> bool {
            let mut ctx: sys::CUcontext = core::ptr::null_mut();
            // SAFETY: a valid out-pointer of the attribute's type; any address may be asked.
            unsafe {
                sys::cuPointerGetAttribute(
                    (&raw mut ctx).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                    ptr,
                )
            }
            .result()
            .is_ok()
        }
        fn alloc_on(stream: &Self::Stream) -> u64 {
            bound(stream);
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: a valid out-pointer; a live stream of the bound context.
            unsafe { sys::cuMemAllocAsync(&mut ptr, N * 4, stream.cu_stream()) }
                .result()
                .unwrap();
            ptr
        }
        fn free_on(ptr: u64, stream: &Self::Stream) {
            bound(stream);
            // SAFETY: memory of `alloc_on`, freed once; a live stream of its context.
            unsafe { sys::cuMemFreeAsync(ptr, stream.cu_stream()) }
                .result()
                .unwrap();
        }
    }
}

mod cuda {
    handoff_cases!(super::cuda_face::Cuda);
}

/// The HIP face, on this crate's `HipStream` and `HipSlice`, with the few HIP calls a test
/// needs beyond them (host functions, raw copies, captures) from the same library.
#[cfg(feature = "hip")]
mod hip_face {
    use core::ffi::c_void;
    use std::sync::{Arc, Condvar, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaContext, CudaStream};
    use dlpack_runtime::ManagedTensor;
    use dlpack_runtime::cuda::ReadyEvents;
    use dlpack_runtime::hip::{HipError, HipSlice, HipStream};
    use dlpack_runtime::{Device, DeviceType, DlpackExport, ExportError, ExportRequest};

    use super::{Backend, Kind, N};

    type Stream = *mut c_void;

    /// The HIP calls of the tests, from `libamdhip64.so`.
    pub(super) struct Hip {
        pub(super) launch_host_func:
            unsafe extern "C" fn(Stream, unsafe extern "C" fn(*mut c_void), *mut c_void) -> i32,
        memset_async: unsafe extern "C" fn(*mut c_void, i32, usize, Stream) -> i32,
        memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, Stream) -> i32,
        begin_capture: unsafe extern "C" fn(Stream, i32) -> i32,
        end_capture: unsafe extern "C" fn(Stream, *mut *mut c_void) -> i32,
        graph_destroy: unsafe extern "C" fn(*mut c_void) -> i32,
        graph_instantiate: unsafe extern "C" fn(
            *mut *mut c_void,
            *mut c_void,
            *mut *mut c_void,
            *mut core::ffi::c_char,
            usize,
        ) -> i32,
        graph_launch: unsafe extern "C" fn(*mut c_void, Stream) -> i32,
        graph_exec_destroy: unsafe extern "C" fn(*mut c_void) -> i32,
        pub(super) stream_synchronize: unsafe extern "C" fn(Stream) -> i32,
        set_device: unsafe extern "C" fn(i32) -> i32,
        malloc_async: unsafe extern "C" fn(*mut *mut c_void, usize, Stream) -> i32,
        free_async: unsafe extern "C" fn(*mut c_void, Stream) -> i32,
        pointer_get_attributes: unsafe extern "C" fn(*mut c_void, *const c_void) -> i32,
        _library: libloading::Library,
    }

    /// The HIP calls, loaded once.
    pub(super) fn hip() -> &'static Hip {
        static HIP: OnceLock<Hip> = OnceLock::new();
        HIP.get_or_init(|| {
            // SAFETY: the HIP runtime (the simulator's face), whose initializers have no
            // preconditions; each symbol below has the prototype of `hip_runtime_api.h`.
            unsafe {
                let library =
                    libloading::Library::new("libamdhip64.so").expect(super::NEEDS_SIMULATOR);
                Hip {
                    launch_host_func: *library.get(b"hipLaunchHostFunc\0").unwrap(),
                    memset_async: *library.get(b"hipMemsetAsync\0").unwrap(),
                    memcpy_async: *library.get(b"hipMemcpyAsync\0").unwrap(),
                    begin_capture: *library.get(b"hipStreamBeginCapture\0").unwrap(),
                    end_capture: *library.get(b"hipStreamEndCapture\0").unwrap(),
                    graph_destroy: *library.get(b"hipGraphDestroy\0").unwrap(),
                    graph_instantiate: *library.get(b"hipGraphInstantiate\0").unwrap(),
                    graph_launch: *library.get(b"hipGraphLaunch\0").unwrap(),
                    graph_exec_destroy: *library.get(b"hipGraphExecDestroy\0").unwrap(),
                    stream_synchronize: *library.get(b"hipStreamSynchronize\0").unwrap(),
                    set_device: *library.get(b"hipSetDevice\0").unwrap(),
                    malloc_async: *library.get(b"hipMallocAsync\0").unwrap(),
                    free_async: *library.get(b"hipFreeAsync\0").unwrap(),
                    pointer_get_attributes: *library.get(b"hipPointerGetAttributes\0").unwrap(),
                    _library: library,
                }
            }
        })
    }

    /// What the test and a gate's host function share: (open, timed out).
    type Shared = (Mutex<(bool, bool)>, Condvar, Duration, Instant);

    /// A host function on a HIP stream that blocks until released (or its timeout).
    pub(super) struct HipGate(Arc<Shared>);

    unsafe extern "C" fn wait_for_gate(user_data: *mut c_void) {
        // SAFETY: the `Arc::into_raw` of `HipGate::hold`, taken back once (a host function
        // runs once).
        let gate = unsafe { Arc::from_raw(user_data.cast::<Shared>()) };
        let mut state = gate.0.lock().unwrap_or_else(|e| e.into_inner());
        while !state.0 {
            let held = gate.3.elapsed();
            if held >= gate.2 {
                *state = (true, true);
                break;
            }
            state = gate
                .1
                .wait_timeout(state, gate.2 - held)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    impl HipGate {
        pub(super) fn hold(stream: Stream, timeout: Duration) -> Self {
            let shared: Arc<Shared> = Arc::new((
                Mutex::new((false, false)),
                Condvar::new(),
                timeout,
                Instant::now(),
            ));
            let user_data = Arc::into_raw(shared.clone()) as *mut c_void;
            // SAFETY: a live stream; the host function takes the reference back.
            let code = unsafe { (hip().launch_host_func)(stream, wait_for_gate, user_data) };
            assert_eq!(code, 0, "hipLaunchHostFunc refused a gate");
            Self(shared)
        }

        /// Opens the gate; whether it had opened by itself.
        pub(super) fn release(self) -> bool {
            let mut state = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
            let timed_out = state.1;
            state.0 = true;
            self.0.1.notify_all();
            timed_out
        }
    }

    /// A captured HIP graph and its instantiation, destroyed on drop.
    pub(super) struct HipGraph {
        graph: *mut c_void,
        exec: *mut c_void,
    }

    impl Drop for HipGraph {
        fn drop(&mut self) {
            // SAFETY: made by `end_capture_and_launch`, destroyed once, here, after the test
            // waited for its launch.
            unsafe {
                if !self.exec.is_null() {
                    (hip().graph_exec_destroy)(self.exec);
                }
                (hip().graph_destroy)(self.graph);
            }
        }
    }

    /// A ROCm tensor: the derive takes `HipSlice` as data and `Arc<HipStream>` as a stream.
    #[derive(DlpackExport)]
    pub(super) struct HipTensor {
        #[dlpack(data)]
        pub(super) data: HipSlice<u32>,
        #[dlpack(shape)]
        pub(super) shape: Vec<usize>,
        #[dlpack(stream)]
        pub(super) stream: Arc<HipStream>,
    }

    /// A ROCm tensor with one more producer stream, of CUDA.
    #[derive(DlpackExport)]
    struct WithCudaStream {
        #[dlpack(data)]
        data: HipSlice<u32>,
        #[dlpack(shape)]
        shape: Vec<usize>,
        #[dlpack(stream)]
        stream: Arc<HipStream>,
        #[dlpack(stream)]
        cuda: Option<Arc<CudaStream>>,
    }

    pub(super) struct HipFace;

    fn on(stream: &HipStream) {
        // SAFETY: a device ordinal the runtime has.
        assert_eq!(unsafe { (hip().set_device)(stream.device()) }, 0);
    }

    impl Backend for HipFace {
        type Stream = Arc<HipStream>;
        type Buffer = HipSlice<u32>;
        type Gate = HipGate;

        fn stream(device: i32) -> Self::Stream {
            Arc::new(HipStream::new(device).expect(super::NEEDS_SIMULATOR))
        }
        fn value(stream: &Self::Stream) -> i64 {
            stream.raw() as i64
        }
        fn zeros(stream: &Self::Stream) -> Self::Buffer {
            HipSlice::alloc_zeros(stream, N).unwrap()
        }
        fn upload(values: &[u32], stream: &Self::Stream) -> Self::Buffer {
            HipSlice::from_host(stream, values).unwrap()
        }
        fn ptr(buffer: &Self::Buffer) -> u64 {
            buffer.device_ptr()
        }
        fn fill(ptr: u64, stream: &Self::Stream) {
            on(stream);
            // SAFETY: `N` u32 of a live allocation; stream-ordered.
            let code = unsafe {
                (hip().memset_async)(
                    ptr as usize as *mut c_void,
                    i32::from(super::BYTE),
                    N * 4,
                    stream.raw(),
                )
            };
            assert_eq!(code, 0, "hipMemsetAsync");
        }
        fn copy(dst: u64, src: u64, stream: &Self::Stream) {
            on(stream);
            // SAFETY: both are `N` u32 of live allocations; stream-ordered (device to device).
            let code = unsafe {
                (hip().memcpy_async)(
                    dst as usize as *mut c_void,
                    src as usize as *const c_void,
                    N * 4,
                    3,
                    stream.raw(),
                )
            };
            assert_eq!(code, 0, "hipMemcpyAsync");
        }
        fn read(buffer: &Self::Buffer) -> Vec<u32> {
            buffer.to_host().unwrap()
        }
        fn sync(stream: &Self::Stream) {
            stream.synchronize().unwrap();
        }
        fn hold(stream: &Self::Stream, timeout: Duration) -> Self::Gate {
            on(stream);
            HipGate::hold(stream.raw(), timeout)
        }
        fn release(gate: Self::Gate) -> bool {
            gate.release()
        }
        fn begin_capture(stream: &Self::Stream) {
            on(stream);
            // SAFETY: a live stream; mode relaxed (2).
            assert_eq!(unsafe { (hip().begin_capture)(stream.raw(), 2) }, 0);
        }
        fn end_capture(stream: &Self::Stream) -> Result<(), i64> {
            on(stream);
            let mut graph: *mut c_void = core::ptr::null_mut();
            // SAFETY: a live stream being captured; a valid out-pointer.
            let code = unsafe { (hip().end_capture)(stream.raw(), &mut graph) };
            if !graph.is_null() {
                // SAFETY: the graph the capture returned, used no more.
                unsafe { (hip().graph_destroy)(graph) };
            }
            if code == 0 {
                Ok(())
            } else {
                Err(i64::from(code))
            }
        }
        type Graph = HipGraph;
        fn end_capture_and_launch(stream: &Self::Stream) -> Self::Graph {
            on(stream);
            let mut graph: *mut c_void = core::ptr::null_mut();
            // SAFETY: a live stream being captured; a valid out-pointer.
            assert_eq!(unsafe { (hip().end_capture)(stream.raw(), &mut graph) }, 0);
            let mut exec: *mut c_void = core::ptr::null_mut();
            // SAFETY: the graph the capture returned; a valid out-pointer; no error log.
            let made = unsafe {
                (hip().graph_instantiate)(
                    &mut exec,
                    graph,
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                    0,
                )
            };
            let kept = HipGraph { graph, exec };
            assert_eq!(made, 0, "hipGraphInstantiate");
            // SAFETY: a live exec; a live stream.
            assert_eq!(unsafe { (hip().graph_launch)(exec, stream.raw()) }, 0);
            kept
        }
        fn export(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            HipTensor {
                data,
                shape: vec![N],
                stream: stream.clone(),
            }
            .into_dlpack_with(request)
        }
        fn export_with_ready_events(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<(ManagedTensor, ReadyEvents), ExportError> {
            HipTensor {
                data,
                shape: vec![N],
                stream: stream.clone(),
            }
            .into_dlpack_with_ready_events(request)
        }
        fn wait_ready(events: &ReadyEvents, stream: &Self::Stream) {
            events
                .wait_on_hip(stream)
                .expect("a HIP stream waits on HIP events");
        }
        const DEVICE_TYPE: DeviceType = DeviceType::Rocm;
        fn release_after(tensor: ManagedTensor, stream: &Self::Stream) -> Result<(), Kind> {
            dlpack_runtime::hip::release_after(tensor, stream).map_err(|err| match err {
                HipError::Capturing { .. } => Kind::Capturing,
                other => Kind::Other(other.to_string()),
            })
        }
        fn export_claimed(
            data: Self::Buffer,
            device: i32,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            let ptr = data.device_ptr();
            super::export_claimed(ptr, Device::new(DeviceType::Rocm, device), data, request)
        }
        fn export_with_foreign_stream(
            data: Self::Buffer,
            stream: &Self::Stream,
            request: &ExportRequest,
        ) -> Result<ManagedTensor, ExportError> {
            let cuda = CudaContext::new(0)
                .expect(super::NEEDS_SIMULATOR)
                .new_stream()
                .unwrap();
            WithCudaStream {
                data,
                shape: vec![N],
                stream: stream.clone(),
                cuda: Some(cuda),
            }
            .into_dlpack_with(request)
        }
        fn wait_ready_on_the_other_api(events: &ReadyEvents) -> Result<(), Kind> {
            let cuda = CudaContext::new(0)
                .expect(super::NEEDS_SIMULATOR)
                .new_stream()
                .unwrap();
            events.wait_on(&cuda).map_err(|err| match err {
                dlpack_runtime::cuda::CudaError::Hip(HipError::ForeignEvents {
                    found: "HIP",
                    ..
                }) => Kind::Foreign,
                other => Kind::Other(other.to_string()),
            })
        }
        fn write_host(dst: *mut u32, stream: &Self::Stream) {
            on(stream);
            // SAFETY: a live stream; the callers keep `N` u32 at `dst` alive until its work is
            // done.
            let code =
                unsafe { (hip().launch_host_func)(stream.raw(), super::write_filled, dst.cast()) };
            assert_eq!(code, 0, "hipLaunchHostFunc");
        }
        fn default_stream(device: i32) -> Option<Self::Stream> {
            Some(Arc::new(HipStream::default_stream(device)))
        }
        fn kind(err: &ExportError) -> Kind {
            match err {
                ExportError::Hip(HipError::Capturing { .. }) => Kind::Capturing,
                ExportError::Hip(HipError::WrongDevice { .. }) => Kind::WrongDevice,
                ExportError::Hip(HipError::StreamOnOtherDevice { role, .. }) => {
                    Kind::StreamOnOtherDevice(role)
                }
                ExportError::Hip(HipError::ForeignStream { found: "CUDA", .. }) => Kind::Foreign,
                other => Kind::Other(other.to_string()),
            }
        }
        fn make_current(device: i32) {
            // SAFETY: a device ordinal the runtime has.
            assert_eq!(unsafe { (hip().set_device)(device) }, 0);
        }
        fn is_allocated(ptr: u64) -> bool {
            // `hipPointerAttribute_t` (32 bytes; its first field, `type`, is 2 for device
            // memory and 0 for memory the runtime does not know, freed memory included).
            let mut attributes = [0u64; 8];
            // SAFETY: room for the attributes; any address may be asked.
            let code = unsafe {
                (hip().pointer_get_attributes)(
                    attributes.as_mut_ptr().cast(),
                    ptr as usize as *const c_void,
                )
            };
            assert_eq!(code, 0, "hipPointerGetAttributes");
            attributes[0] as u32 == 2
        }
        fn alloc_on(stream: &Self::Stream) -> u64 {
            on(stream);
            let mut ptr: *mut c_void = core::ptr::null_mut();
            // SAFETY: a valid out-pointer; a live stream of the current device.
            let code = unsafe { (hip().malloc_async)(&mut ptr, N * 4, stream.raw()) };
            assert_eq!(code, 0, "hipMallocAsync");
            ptr as u64
        }
        fn free_on(ptr: u64, stream: &Self::Stream) {
            on(stream);
            // SAFETY: memory of `alloc_on`, freed once; a live stream of its device.
            let code = unsafe { (hip().free_async)(ptr as usize as *mut c_void, stream.raw()) };
            assert_eq!(code, 0, "hipFreeAsync");
        }
    }
}

#[cfg(feature = "hip")]
mod hip {
    handoff_cases!(super::hip_face::HipFace);

    use std::sync::Arc;

    use cuda_sim_testing::Checker;
    use dlpack_runtime::hip::{self, HipError, HipSlice, HipStream};
    use dlpack_runtime::{Device, DlpackExport, ExportError, ExportRequest};
    use dlpack_tests::expected_driver;

    use super::hip_face::{HipFace, HipTensor, hip};
    use super::{Backend, N, NEEDS_SIMULATOR};

    /// How many times this process has called the HIP entry point `name` (the simulator's
    /// count).
    fn calls(name: &str) -> u64 {
        cuda_sim_testing::DriverCalls::now()
            .expect(NEEDS_SIMULATOR)
            .by_entry_point
            .iter()
            .find(|(entry, _)| entry == name)
            .map_or(0, |(_, n)| *n)
    }

    /// A borrowed `hipStreamPerThread` (2) names the per-thread default stream of the thread
    /// that borrowed it. Named as the producer stream on that thread, the export orders its
    /// work before the consumer's stream (values right, checker clean). Moved to another
    /// thread, where the handle names that thread's stream, the export and a host wait are
    /// refused with a typed error, not handed over unordered.
    #[test]
    fn a_per_thread_stream_is_refused_on_another_thread() {
        let (_a, b, checker) = super::setup::<HipFace>();
        let consumer = HipFace::value(&b);
        let values: Vec<u32> = (0..N as u32).collect();
        let made = |values: Vec<u32>| {
            // SAFETY: the calling thread's per-thread default stream of device 0, alive for the
            // process; each tensor is used on this thread, and the one dropped on another
            // thread (the refused export's) only after this thread synchronized its stream.
            let stream = Arc::new(unsafe { HipStream::borrowed(0, 2 as *mut core::ffi::c_void) });
            let data = HipSlice::from_host(&stream, &values).unwrap();
            HipTensor {
                data,
                shape: vec![N],
                stream,
            }
        };
        let on_its_thread = std::thread::spawn({
            let values = values.clone();
            move || {
                let tensor = made(values);
                let stream = tensor.stream.clone();
                let managed = tensor
                    .into_dlpack_with(&ExportRequest::versioned().stream(Some(consumer)))
                    .map(|m| m.dl_tensor().data as u64);
                stream.synchronize().unwrap();
                managed
            }
        })
        .join()
        .unwrap();
        assert!(on_its_thread.is_ok(), "{on_its_thread:?}");
        checker.assert_clean("a per-thread stream on its own thread");

        let (tensor, done) = std::thread::spawn(move || {
            let tensor = made(values);
            let done = tensor.stream.synchronize();
            (tensor, done)
        })
        .join()
        .unwrap();
        done.unwrap();
        let stream = tensor.stream.clone();
        assert_eq!(
            stream.synchronize(),
            Err(HipError::PerThreadStreamOnOtherThread)
        );
        let err = tensor
            .into_dlpack_with(&ExportRequest::versioned().stream(Some(consumer)))
            .expect_err("another thread's per-thread stream");
        assert!(
            matches!(
                err,
                ExportError::Hip(HipError::PerThreadStreamOnOtherThread)
            ),
            "{err}"
        );
        checker.assert_clean("refused before anything was enqueued");
    }

    /// ROCm exchanges take their events from a per-device pool: after warm-up, 200 exchanges
    /// (an event on the producer's stream each, which the consumer's stream waits on) create
    /// and destroy no event. Negative control: ready events that a stream being captured waited
    /// on (`hipEventWaitExternal`: every launch of the graph waits for their record) are
    /// destroyed, not pooled, when let go.
    #[test]
    fn after_warm_up_no_hip_event_is_created_per_exchange() {
        let (a, b, checker) = super::setup::<HipFace>();
        let exchange = || {
            let managed = HipFace::export(
                HipFace::zeros(&a),
                &a,
                &super::versioned(Some(HipFace::value(&b))),
            )
            .expect("the export succeeds");
            assert!(
                managed.ready_events().is_some(),
                "the export carries its event"
            );
            drop(managed);
        };
        for _ in 0..10 {
            exchange();
        }
        let (created, destroyed) = (calls("hipEventCreateWithFlags"), calls("hipEventDestroy"));
        let recorded = calls("hipEventRecord");
        for _ in 0..200 {
            exchange();
        }
        println!(
            "200 exchanges after warm-up: {} events recorded, {} created, {} destroyed",
            calls("hipEventRecord") - recorded,
            calls("hipEventCreateWithFlags") - created,
            calls("hipEventDestroy") - destroyed
        );
        assert!(calls("hipEventRecord") - recorded >= 200);
        assert_eq!(calls("hipEventCreateWithFlags"), created);
        assert_eq!(calls("hipEventDestroy"), destroyed);
        HipFace::sync(&a);
        HipFace::sync(&b);
        checker.assert_clean("pooled events");

        // Negative control: waited on inside a capture, the ready events are destroyed.
        let c = HipFace::stream(0);
        let (managed, events) = HipFace::export_with_ready_events(
            HipFace::zeros(&a),
            &a,
            &super::versioned(Some(HipFace::value(&b))),
        )
        .expect("the export succeeds");
        HipFace::begin_capture(&c);
        HipFace::wait_ready(&events, &c);
        assert_eq!(HipFace::end_capture(&c), Ok(()));
        let destroyed = calls("hipEventDestroy");
        drop(events);
        drop(managed);
        assert_eq!(
            calls("hipEventDestroy"),
            destroyed + 1,
            "the event a capture waited on is destroyed"
        );
        HipFace::sync(&a);
        HipFace::sync(&b);
    }

    /// The ROCm hazard (pytorch/pytorch#187110): before ROCm 7.14 a host wait on a capturing
    /// stream returns success and silently invalidates the capture. Asked for a host wait (a
    /// copy to the host after the producer's work) while the producer's stream is capturing,
    /// the export refuses with the typed error, having asked `hipStreamIsCapturing` first: the
    /// simulator records no violation and the capture stays valid. The negative control makes
    /// that wait directly, and the simulator records it.
    #[test]
    fn a_host_wait_on_a_capturing_producer_stream_is_refused_before_it_is_made() {
        let a = Arc::new(HipStream::new(0).expect(NEEDS_SIMULATOR));
        let c = Arc::new(HipStream::new(0).unwrap());
        let checker = Checker::attach().expect(NEEDS_SIMULATOR);
        let data = HipSlice::<u32>::alloc_zeros(&c, N).unwrap();
        c.synchronize().unwrap();
        checker.reset();
        HipFace::begin_capture(&a);
        let request = ExportRequest::versioned()
            .dl_device(Device::CPU)
            .copy(Some(true));
        let err = HipTensor {
            data,
            shape: vec![N],
            stream: a.clone(),
        }
        .into_dlpack_with(&request)
        .unwrap_err();
        assert!(
            matches!(err, ExportError::Hip(HipError::Capturing { .. })),
            "{err}"
        );
        // The public wait asks first too.
        assert!(matches!(a.synchronize(), Err(HipError::Capturing { .. })));
        assert_eq!(checker.violations(), 0, "{}", checker.report());
        assert_eq!(HipFace::end_capture(&a), Ok(()));
        // Negative control: the wait made directly, during a capture.
        HipFace::begin_capture(&a);
        // SAFETY: a live stream (being captured: the call the hazard is about).
        let code = unsafe { (hip().stream_synchronize)(a.raw()) };
        let violations = checker.violations();
        let _ = HipFace::end_capture(&a);
        assert!(
            violations >= 1,
            "a direct hipStreamSynchronize of a capturing stream is recorded (it returned {code})"
        );
        c.synchronize().unwrap();
    }

    /// A `dl_device` of a ROCm device the process does not have is refused with
    /// [`ExportError::NoSuchDevice`], in words that name the ROCm devices there are.
    #[test]
    fn a_rocm_dl_device_the_process_does_not_have_names_the_rocm_devices() {
        let a = HipFace::stream(0);
        let count = hip::device_count().unwrap();
        assert!(count >= 2, "the simulator has two devices");
        let data = HipFace::zeros(&a);
        a.synchronize().unwrap();
        let requested = Device::new(dlpack_runtime::DeviceType::Rocm, count + 3);
        let request = ExportRequest::versioned()
            .dl_device(requested)
            .stream(Some(HipFace::value(&a)));
        let err = HipFace::export(data, &a, &request).unwrap_err();
        assert_eq!(err, ExportError::NoSuchDevice { requested, count });
        assert_eq!(
            err.to_string(),
            format!(
                "dl_device rocm:{} does not exist: the process has {count} ROCm devices (0 to {})",
                count + 3,
                count - 1
            )
        );
    }

    /// The derive takes `HipSlice<f32>` as data and `Arc<HipStream>` as a stream unchanged: the
    /// export is `kDLROCM` memory of the stream's device, float32, and its copy to the host
    /// has the values uploaded.
    #[test]
    fn a_derived_f32_tensor_is_rocm_memory() {
        #[derive(DlpackExport)]
        struct Floats {
            #[dlpack(data)]
            data: HipSlice<f32>,
            #[dlpack(shape)]
            shape: [usize; 2],
            #[dlpack(stream)]
            stream: Arc<HipStream>,
        }
        let stream = Arc::new(HipStream::new(1).expect(NEEDS_SIMULATOR));
        let values: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        let make = || Floats {
            data: HipSlice::from_host(&stream, &values).unwrap(),
            shape: [2, 3],
            stream: stream.clone(),
        };
        let t = make();
        assert_eq!(
            t.dlpack_device(),
            Device::new(dlpack_runtime::DeviceType::Rocm, 1)
        );
        let managed = t
            .into_dlpack_with(&ExportRequest::versioned().stream(Some(stream.raw() as i64)))
            .unwrap();
        assert_eq!(
            dlpack_runtime::DataType::from_raw(managed.dl_tensor().dtype),
            dlpack_runtime::DataType::F32
        );
        assert_eq!(managed.dl_tensor().device.device_id, 1);
        drop(managed);
        let copied = make()
            .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
            .unwrap();
        assert!(copied.is_copied());
        // SAFETY: a compact host tensor of 6 f32 (a fresh copy this test owns).
        let got = unsafe { std::slice::from_raw_parts(copied.dl_tensor().data as *const f32, 6) };
        assert_eq!(got, values.as_slice());
    }

    /// ROCm pinned host memory read on the host (`dl_device=(CPU, 0)`, shared or copied): the
    /// plan is a host wait for the producer's stream, made only after its capture status is
    /// asked; a capturing producer stream is refused and the simulator records nothing.
    #[test]
    fn rocm_host_memory_is_read_on_the_host_after_a_host_wait() {
        use std::sync::atomic::{AtomicBool, Ordering};

        #[derive(DlpackExport)]
        struct Pinned {
            #[dlpack(data)]
            data: super::Claimed<Vec<u32>>,
            #[dlpack(shape)]
            shape: Vec<usize>,
            #[dlpack(stream)]
            stream: Arc<HipStream>,
        }
        let a = Arc::new(HipStream::new(0).expect(NEEDS_SIMULATOR));
        let checker = Checker::attach().expect(NEEDS_SIMULATOR);
        let pinned = |stream: &Arc<HipStream>| {
            let memory = vec![7u32; N];
            Pinned {
                data: super::Claimed {
                    ptr: memory.as_ptr() as u64,
                    device: Device::new(dlpack_runtime::DeviceType::RocmHost, 0),
                    _memory: memory,
                },
                shape: vec![N],
                stream: stream.clone(),
            }
        };
        for copy in [None, Some(true)] {
            let gate = HipFace::hold(&a, std::time::Duration::from_secs(30));
            let opened = Arc::new(AtomicBool::new(false));
            let opener = {
                let opened = opened.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    opened.store(true, Ordering::SeqCst);
                    HipFace::release(gate)
                })
            };
            let managed = pinned(&a)
                .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU).copy(copy))
                .unwrap();
            assert!(
                opened.load(Ordering::SeqCst),
                "copy={copy:?}: the export returned before the producer's stream was released"
            );
            assert!(!opener.join().unwrap());
            assert_eq!(managed.is_copied(), copy == Some(true));
        }
        checker.assert_clean("host waits for ROCm pinned memory");
        HipFace::begin_capture(&a);
        let err = pinned(&a)
            .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
            .unwrap_err();
        assert!(
            matches!(err, ExportError::Hip(HipError::Capturing { .. })),
            "{err}"
        );
        assert_eq!(checker.violations(), 0, "{}", checker.report());
        assert_eq!(HipFace::end_capture(&a), Ok(()));
    }

    /// Without `libamdhip64.so` on the library path (the test command runs this test without
    /// the simulator too), the HIP tier is a typed error, never a panic.
    #[test]
    fn without_libamdhip64_hip_is_an_error_not_a_panic() {
        match hip::init() {
            Err(HipError::NoDriver) => {
                assert_ne!(expected_driver(), Some(true), "a HIP runtime was expected");
                assert_eq!(HipStream::new(0).unwrap_err(), HipError::NoDriver);
                assert_eq!(hip::check_pointer(0x1000, 0), Err(HipError::NoDriver));
                assert_eq!(
                    HipStream::default_stream(0).synchronize(),
                    Err(HipError::NoDriver)
                );
                // A stream-ordered release with no runtime releases at once: no stream runs.
                let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let managed = super::export_claimed(
                    0x1000,
                    Device::new(dlpack_runtime::DeviceType::Rocm, 0),
                    super::DropFlag(dropped.clone()),
                    &ExportRequest::versioned(),
                )
                .expect("an export with nothing to order");
                assert_eq!(
                    hip::release_after(managed, &HipStream::default_stream(0)),
                    Err(HipError::NoDriver)
                );
                assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
            }
            other => {
                assert_ne!(
                    expected_driver(),
                    Some(false),
                    "no HIP runtime was expected: {other:?}"
                );
                other.expect("the HIP runtime initializes");
                let host = 0u64;
                assert!(matches!(
                    hip::check_pointer(&host as *const u64 as u64, 0),
                    Err(HipError::NotDeviceMemory { .. })
                ));
            }
        }
    }
}
