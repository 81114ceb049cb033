//! The simulator's HIP face (`hip*`, ROCm's `libamdhip64.so`): loaded as a test process loads
//! HIP, by the name `libamdhip64.so` (from the directory `scripts/cuda-sim.sh` lays out, where
//! `LD_LIBRARY_PATH` has it, else a link of that name to the simulator cargo built), it is the
//! same library, model and checker as the CUDA face. Cross-stream races are flagged without an
//! event wait and not with one, the null stream synchronizes with blocking streams, captures
//! become graphs whose launches are ordered like other work, the ROCm capture hazard (silent
//! success before ROCm 7.14, with a violation recorded; the error from 7.14 on) is modelled,
//! and pointer attributes, error names and call counts are HIP's.
//!
//! The tests of this binary share one process and its checker: each takes [`serial`] first.
//! The capture hazard's run in child processes, one per modelled version (the simulator reads
//! `CUDA_SIM_HIP_VERSION` once per process).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::null_mut;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

type Stream = *mut c_void;
type Event = *mut c_void;
type Err = c_int;

const SUCCESS: Err = 0;
const INVALID_VALUE: Err = 1;
const INVALID_DEVICE: Err = 101;
const INVALID_HANDLE: Err = 400;
const CAPTURE_UNSUPPORTED: Err = 900;
const CAPTURE_INVALIDATED: Err = 901;
const CAPTURED_EVENT: Err = 907;

const D2H: c_int = 2;
const D2D: c_int = 3;

const BYTES: usize = 4096;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PointerAttributes {
    type_: c_int,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
    is_managed: c_int,
    allocation_flags: c_uint,
}

/// The library, loaded once, as a test process loads HIP: `libamdhip64.so` by name where the
/// library path has it (the directory of `scripts/cuda-sim.sh` on `LD_LIBRARY_PATH`), else a
/// link of that name to the simulator that cargo built, by its path. Either way it must be the
/// library the kit loaded as the CUDA driver: one model, one checker.
fn library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| {
        // The CUDA face first, as a process using both would.
        assert_eq!(
            cuda_sim_testing::driver(),
            cuda_sim_testing::Driver::Simulator,
            "the HIP face is the simulator's"
        );
        // SAFETY: loading the simulator (already loaded: its initializers are Rust statics made
        // on first use).
        let hip = unsafe { libloading::Library::new("libamdhip64.so") }.unwrap_or_else(|_| {
            let target = cuda_sim_testing::simulator_path().unwrap();
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("hip-face-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let link = dir.join("libamdhip64.so");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link).unwrap();
            // SAFETY: as above.
            unsafe { libloading::Library::new(&link) }.unwrap()
        });
        // SAFETY: the CUDA driver the kit loaded, found by its SONAME.
        let cuda = unsafe { libloading::Library::new("libcuda.so.1") }.unwrap();
        // SAFETY: symbol look-ups only.
        unsafe {
            let a = hip
                .get::<unsafe extern "C" fn() -> u64>(b"cuSimViolations")
                .unwrap();
            let b = cuda
                .get::<unsafe extern "C" fn() -> u64>(b"cuSimViolations")
                .unwrap();
            assert_eq!(
                *a as usize, *b as usize,
                "libamdhip64.so and libcuda.so.1 are one library instance"
            );
        }
        hip
    })
}

/// A function of the library, by name (the type is the caller's promise).
macro_rules! hip {
    ($name:ident: fn($($ty:ty),*) -> $ret:ty) => {{
        // SAFETY: the symbol has this C signature (the HIP face's contract).
        let f = unsafe {
            library().get::<unsafe extern "C" fn($($ty),*) -> $ret>(stringify!($name).as_bytes())
        };
        *f.expect(stringify!($name))
    }};
}

/// Calls `name(args)` with HIP's signature and returns its code.
macro_rules! call {
    ($name:ident($($arg:expr),*): $($ty:ty),*) => {{
        let f = hip!($name: fn($($ty),*) -> Err);
        // SAFETY: arguments valid for the call (each test's responsibility).
        unsafe { f($($arg),*) }
    }};
}

/// One test at a time: they share the checker. Resets it.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    reset();
    assert_eq!(call!(hipSetDevice(0): c_int), SUCCESS);
    guard
}

fn reset() {
    let f = hip!(cuSimReset: fn() -> ());
    // SAFETY: no arguments.
    unsafe { f() }
}

fn violations() -> u64 {
    let f = hip!(cuSimViolations: fn() -> u64);
    // SAFETY: no arguments.
    unsafe { f() }
}

fn report() -> String {
    text_of(hip!(cuSimReport: fn(*mut u8, usize) -> usize))
}

fn call_report() -> String {
    text_of(hip!(cuSimDriverCallReport: fn(*mut u8, usize) -> usize))
}

fn text_of(f: unsafe extern "C" fn(*mut u8, usize) -> usize) -> String {
    // SAFETY: a NULL buffer asks for the length; then a buffer of that length.
    let len = unsafe { f(null_mut(), 0) };
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` has `len` bytes.
    unsafe { f(buf.as_mut_ptr(), len) };
    String::from_utf8(buf).unwrap()
}

#[track_caller]
fn ok(code: Err, what: &str) {
    assert_eq!(code, SUCCESS, "{what}");
}

fn stream(flags: c_uint) -> Stream {
    let mut s = null_mut();
    ok(
        call!(hipStreamCreateWithFlags(&mut s, flags): *mut Stream, c_uint),
        "hipStreamCreateWithFlags",
    );
    s
}

fn event() -> Event {
    let mut e = null_mut();
    ok(call!(hipEventCreate(&mut e): *mut Event), "hipEventCreate");
    e
}

fn malloc(bytes: usize) -> *mut c_void {
    let mut p = null_mut();
    ok(
        call!(hipMalloc(&mut p, bytes): *mut *mut c_void, usize),
        "hipMalloc",
    );
    p
}

fn sync(s: Stream) {
    ok(
        call!(hipStreamSynchronize(s): Stream),
        "hipStreamSynchronize",
    );
}

fn memset_async(p: *mut c_void, value: c_int, s: Stream) {
    ok(
        call!(hipMemsetAsync(p, value, BYTES, s): *mut c_void, c_int, usize, Stream),
        "hipMemsetAsync",
    );
}

fn copy_async(dst: *mut c_void, src: *mut c_void, s: Stream) {
    ok(
        call!(hipMemcpyAsync(dst, src, BYTES, D2D, s): *mut c_void, *const c_void, usize, c_int, Stream),
        "hipMemcpyAsync",
    );
}

/// The bytes of device memory `p` (a synchronous copy).
fn read(p: *mut c_void) -> Vec<u8> {
    let mut host = vec![0u8; BYTES];
    ok(
        call!(hipMemcpy(host.as_mut_ptr().cast(), p, BYTES, D2H): *mut c_void, *const c_void, usize, c_int),
        "hipMemcpy D2H",
    );
    host
}

/// Holds a stream until released: a host function that waits (at most 10 s).
struct Gate(&'static (Mutex<bool>, Condvar));

unsafe extern "C" fn wait_for_gate(data: *mut c_void) {
    // SAFETY: a leaked gate (`Gate::hold`).
    let (open, cv) = unsafe { &*data.cast::<(Mutex<bool>, Condvar)>() };
    let guard = open.lock().unwrap();
    let _ = cv.wait_timeout_while(guard, Duration::from_secs(10), |open| !*open);
}

impl Gate {
    fn hold(s: Stream) -> Self {
        let shared: &'static _ = Box::leak(Box::new((Mutex::new(false), Condvar::new())));
        let data = std::ptr::from_ref(shared).cast_mut().cast::<c_void>();
        let f: unsafe extern "C" fn(*mut c_void) = wait_for_gate;
        ok(
            call!(hipLaunchHostFunc(s, Some(f), data): Stream, Option<unsafe extern "C" fn(*mut c_void)>, *mut c_void),
            "hipLaunchHostFunc",
        );
        Self(shared)
    }

    fn release(self) {
        *self.0.0.lock().unwrap() = true;
        self.0.1.notify_all();
    }
}

#[test]
fn a_cross_stream_race_is_flagged_without_an_event_wait_and_not_with_one() {
    let _serial = serial();
    let (a, b) = (stream(0), stream(0));
    let (src, dst) = (malloc(BYTES), malloc(BYTES));
    ok(call!(hipDeviceSynchronize():), "hipDeviceSynchronize");
    reset();

    // Without a wait: the copy on `b` reads what `a` is still to write.
    let gate = Gate::hold(a);
    memset_async(src, 1, a);
    copy_async(dst, src, b);
    gate.release();
    sync(a);
    sync(b);
    assert!(violations() > 0, "the race is flagged");
    let r = report();
    assert!(
        r.contains("hipMemsetAsync") && r.contains("hipMemcpyAsync"),
        "{r}"
    );

    // With hipEventRecord + hipStreamWaitEvent: ordered, nothing flagged, and the bytes copied.
    reset();
    let e = event();
    let gate = Gate::hold(a);
    memset_async(src, 2, a);
    ok(call!(hipEventRecord(e, a): Event, Stream), "hipEventRecord");
    ok(
        call!(hipStreamWaitEvent(b, e, 0): Stream, Event, c_uint),
        "hipStreamWaitEvent",
    );
    copy_async(dst, src, b);
    gate.release();
    sync(b);
    assert_eq!(violations(), 0, "{}", report());
    assert!(read(dst).iter().all(|&x| x == 2));
    ok(
        call!(hipEventQuery(e): Event),
        "hipEventQuery after the wait",
    );
    for s in [a, b] {
        ok(call!(hipStreamDestroy(s): Stream), "hipStreamDestroy");
    }
    ok(call!(hipEventDestroy(e): Event), "hipEventDestroy");
    for p in [src, dst] {
        ok(call!(hipFree(p): *mut c_void), "hipFree");
    }
}

/// Frees `p` (as an address, so the thread can take it) on a new thread whose current device
/// is 0; the code `hipFree` returned is sent when it returns.
fn free_on_a_thread(p: usize) -> std::sync::mpsc::Receiver<Err> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(call!(hipFree(p as *mut c_void): *mut c_void));
    });
    rx
}

/// `hipFree` "performs an implicit hipDeviceSynchronize()" (`hip_runtime_api.h`): a free of
/// memory that a held stream of the current device still writes returns only once that write
/// is done, and the checker sees the free ordered after it. The device synchronized is the
/// current one: memory of device 1 freed while device 0 is current is freed at once, and the
/// checker reports the free racing with the write (the negative control).
#[test]
fn hip_free_waits_for_the_current_devices_work_first() {
    let _serial = serial();
    let a = stream(0);
    let p = malloc(BYTES);
    sync(a);
    reset();
    let gate = Gate::hold(a);
    memset_async(p, 3, a);
    let freed = free_on_a_thread(p as usize);
    assert_eq!(
        freed.recv_timeout(Duration::from_millis(300)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout),
        "hipFree returned while the device's work was held"
    );
    gate.release();
    assert_eq!(freed.recv_timeout(Duration::from_secs(10)), Ok(SUCCESS));
    assert_eq!(violations(), 0, "{}", report());

    // Negative control: memory of device 1, freed by a thread whose current device is 0.
    ok(call!(hipSetDevice(1): c_int), "hipSetDevice");
    let b = stream(0);
    let q = malloc(BYTES);
    sync(b);
    reset();
    let gate = Gate::hold(b);
    memset_async(q, 4, b);
    let freed = free_on_a_thread(q as usize);
    assert_eq!(
        freed.recv_timeout(Duration::from_secs(5)),
        Ok(SUCCESS),
        "device 1's work is not waited for"
    );
    assert_eq!(violations(), 1, "{}", report());
    assert!(report().contains("free of allocation"), "{}", report());
    gate.release();
    sync(b);
    ok(call!(hipStreamDestroy(b): Stream), "hipStreamDestroy");
    ok(call!(hipSetDevice(0): c_int), "hipSetDevice");
    ok(call!(hipStreamDestroy(a): Stream), "hipStreamDestroy");
}

#[test]
fn the_null_stream_waits_for_blocking_streams_and_not_for_non_blocking_ones() {
    let _serial = serial();
    let (src, dst) = (malloc(BYTES), malloc(BYTES));
    for (flags, ordered) in [(0, true), (1, false)] {
        let s = stream(flags);
        let mut got = u32::MAX;
        ok(
            call!(hipStreamGetFlags(s, &mut got): Stream, *mut c_uint),
            "hipStreamGetFlags",
        );
        assert_eq!(got, flags);
        ok(call!(hipDeviceSynchronize():), "hipDeviceSynchronize");
        reset();
        let gate = Gate::hold(s);
        memset_async(src, 3, s);
        // The null stream: after the blocking stream's earlier work, not the non-blocking one's.
        copy_async(dst, src, null_mut());
        gate.release();
        sync(null_mut());
        sync(s);
        if ordered {
            assert_eq!(violations(), 0, "blocking: {}", report());
            assert!(read(dst).iter().all(|&x| x == 3));
        } else {
            assert!(violations() > 0, "non-blocking: the race is flagged");
        }
        ok(call!(hipStreamDestroy(s): Stream), "hipStreamDestroy");
    }
    // The null stream and hipStreamPerThread belong to the current device.
    let mut device = -1;
    for special in [0usize, 2] {
        ok(
            call!(hipStreamGetDevice(special as Stream, &mut device): Stream, *mut c_int),
            "hipStreamGetDevice",
        );
        assert_eq!(device, 0);
    }
    assert_eq!(
        call!(hipStreamSynchronize(1usize as Stream): Stream),
        INVALID_HANDLE,
        "1 is CUDA's legacy stream handle, none of HIP's"
    );
    for p in [src, dst] {
        ok(call!(hipFree(p): *mut c_void), "hipFree");
    }
}

#[test]
fn a_captured_graph_launches_in_stream_order() {
    let _serial = serial();
    let (producer, consumer, capture) = (stream(1), stream(1), stream(1));
    let (buf, out) = (malloc(BYTES), malloc(BYTES));

    let mut status = -1;
    ok(
        call!(hipStreamIsCapturing(capture, &mut status): Stream, *mut c_int),
        "hipStreamIsCapturing",
    );
    assert_eq!(status, 0, "none");
    ok(
        call!(hipStreamBeginCapture(capture, 0): Stream, c_int),
        "hipStreamBeginCapture",
    );
    ok(
        call!(hipStreamIsCapturing(capture, &mut status): Stream, *mut c_int),
        "hipStreamIsCapturing",
    );
    assert_eq!(status, 1, "active");
    let mut id = 0u64;
    ok(
        call!(hipStreamGetCaptureInfo(capture, &mut status, &mut id): Stream, *mut c_int, *mut u64),
        "hipStreamGetCaptureInfo",
    );
    assert!(status == 1 && id != 0);
    memset_async(buf, 7, capture);
    copy_async(out, buf, capture);
    let mut graph = null_mut();
    ok(
        call!(hipStreamEndCapture(capture, &mut graph): Stream, *mut *mut c_void),
        "hipStreamEndCapture",
    );
    assert!(!graph.is_null());
    let mut exec = null_mut();
    ok(
        call!(hipGraphInstantiate(&mut exec, graph, null_mut(), null_mut(), 0): *mut *mut c_void, *mut c_void, *mut *mut c_void, *mut c_char, usize),
        "hipGraphInstantiate",
    );
    assert!(
        read(out).iter().all(|&x| x == 0),
        "captured work does not run"
    );

    for ordered in [true, false] {
        reset();
        let e = event();
        let gate = Gate::hold(producer);
        memset_async(buf, 1, producer);
        ok(
            call!(hipEventRecord(e, producer): Event, Stream),
            "hipEventRecord",
        );
        if ordered {
            ok(
                call!(hipStreamWaitEvent(consumer, e, 0): Stream, Event, c_uint),
                "hipStreamWaitEvent",
            );
        }
        ok(
            call!(hipGraphLaunch(exec, consumer): *mut c_void, Stream),
            "hipGraphLaunch",
        );
        gate.release();
        sync(consumer);
        sync(producer);
        if ordered {
            assert_eq!(violations(), 0, "{}", report());
            assert!(
                read(out).iter().all(|&x| x == 7),
                "the launch ran the graph"
            );
        } else {
            let r = report();
            assert!(violations() > 0 && r.contains("hipMemcpyAsync"), "{r}");
        }
    }
    ok(
        call!(hipGraphExecDestroy(exec): *mut c_void),
        "hipGraphExecDestroy",
    );
    ok(
        call!(hipGraphDestroy(graph): *mut c_void),
        "hipGraphDestroy",
    );
}

/// Begins a global capture on a new blocking stream.
fn capturing() -> Stream {
    let s = stream(0);
    ok(
        call!(hipStreamBeginCapture(s, 0): Stream, c_int),
        "hipStreamBeginCapture",
    );
    s
}

/// Ends the capture of `s`: its code, and whether the graph returned is NULL.
fn end(s: Stream) -> (Err, bool) {
    let mut graph = std::ptr::dangling_mut::<c_void>();
    let code = call!(hipStreamEndCapture(s, &mut graph): Stream, *mut *mut c_void);
    (code, graph.is_null())
}

const HAZARD: &str = "on a capturing stream, not reported by HIP before 7.14";

/// The hazard's calls, each on a fresh capture: `expected(name)` is what each returns.
fn each_capture_unsafe_call(expected: fn(&str) -> Err) {
    type Case = fn(Stream, [*mut c_void; 2]) -> Err;
    let cases: [(&str, Case); 7] = [
        (
            "hipStreamSynchronize",
            |s, _| call!(hipStreamSynchronize(s): Stream),
        ),
        ("hipStreamQuery", |s, _| call!(hipStreamQuery(s): Stream)),
        (
            "hipDeviceSynchronize",
            |_, _| call!(hipDeviceSynchronize():),
        ),
        ("hipEventQuery", |s, _| {
            let e = event();
            ok(call!(hipEventRecord(e, s): Event, Stream), "hipEventRecord");
            call!(hipEventQuery(e): Event)
        }),
        ("hipEventSynchronize", |s, _| {
            let e = event();
            ok(call!(hipEventRecord(e, s): Event, Stream), "hipEventRecord");
            call!(hipEventSynchronize(e): Event)
        }),
        (
            "hipMemset",
            |_, [p, _]| call!(hipMemset(p, 0, BYTES): *mut c_void, c_int, usize),
        ),
        (
            "hipMemcpy",
            |_, [p, q]| call!(hipMemcpy(q, p, BYTES, D2D): *mut c_void, *const c_void, usize, c_int),
        ),
    ];
    // Allocated before any capture: hipMalloc is refused during a global capture.
    let buffers = [malloc(BYTES), malloc(BYTES)];
    for (name, unsafe_call) in cases {
        reset();
        // A library that asks first is fine.
        let s = capturing();
        let mut status = -1;
        ok(
            call!(hipStreamIsCapturing(s, &mut status): Stream, *mut c_int),
            "hipStreamIsCapturing",
        );
        assert_eq!(status, 1);
        assert_eq!(violations(), 0, "{}", report());
        // The unsafe call: invalidates the capture, is recorded, returns `expected`.
        assert_eq!(unsafe_call(s, buffers), expected(name), "{name}");
        assert_eq!(violations(), 1, "{name}: {}", report());
        let r = report();
        assert!(
            r.contains(&format!("capture-unsafe {name} {HAZARD}")),
            "{r}"
        );
        ok(
            call!(hipStreamIsCapturing(s, &mut status): Stream, *mut c_int),
            "hipStreamIsCapturing",
        );
        assert_eq!(status, 2, "{name}: the capture is invalidated");
        assert_eq!(end(s), (CAPTURE_INVALIDATED, true), "{name}");
        ok(call!(hipStreamDestroy(s): Stream), "hipStreamDestroy");
    }
    for p in buffers {
        ok(call!(hipFree(p): *mut c_void), "hipFree");
    }
}

/// Run in a child process (a failure leaves a capture under way, which would refuse the other
/// tests' allocations) by `before_rocm_7_14_capture_unsafe_calls_succeed_silently_and_are_recorded`,
/// with `CUDA_SIM_HIP_VERSION` unset.
#[test]
#[ignore = "run by before_rocm_7_14_capture_unsafe_calls_succeed_silently_and_are_recorded"]
fn capture_unsafe_calls_before_7_14() {
    let _serial = serial();
    let mut version = 0;
    ok(
        call!(hipRuntimeGetVersion(&mut version): *mut c_int),
        "hipRuntimeGetVersion",
    );
    assert_eq!(version, 70_000_000, "the default: 7.0.0");
    ok(
        call!(hipDriverGetVersion(&mut version): *mut c_int),
        "hipDriverGetVersion",
    );
    assert_eq!(version, 70_000_000);
    each_capture_unsafe_call(|_| SUCCESS);

    // The CUDA face is unchanged: the error, and nothing recorded.
    reset();
    type Cu = c_int;
    let ctx_retain = hip!(cuDevicePrimaryCtxRetain: fn(*mut *mut c_void, c_int) -> Cu);
    let set_current = hip!(cuCtxSetCurrent: fn(*mut c_void) -> Cu);
    let create = hip!(cuStreamCreate: fn(*mut Stream, c_uint) -> Cu);
    let begin = hip!(cuStreamBeginCapture_v2: fn(Stream, c_int) -> Cu);
    let synchronize = hip!(cuStreamSynchronize: fn(Stream) -> Cu);
    let end_capture = hip!(cuStreamEndCapture: fn(Stream, *mut *mut c_void) -> Cu);
    // SAFETY: the driver API's signatures, live out-pointers.
    unsafe {
        let mut ctx = null_mut();
        assert_eq!(ctx_retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let mut s = null_mut();
        assert_eq!(create(&mut s, 0), 0);
        assert_eq!(begin(s, 0), 0);
        assert_eq!(synchronize(s), CAPTURE_UNSUPPORTED);
        let mut graph = null_mut();
        assert_eq!(end_capture(s, &mut graph), CAPTURE_INVALIDATED);
    }
    assert_eq!(violations(), 0, "{}", report());
}

/// Run in a child process, with `CUDA_SIM_HIP_VERSION` set to 7.14.0, by
/// `from_rocm_7_14_capture_unsafe_calls_return_their_error`.
#[test]
#[ignore = "run by from_rocm_7_14_capture_unsafe_calls_return_their_error"]
fn capture_unsafe_calls_at_7_14() {
    let _serial = serial();
    let mut version = 0;
    ok(
        call!(hipRuntimeGetVersion(&mut version): *mut c_int),
        "hipRuntimeGetVersion",
    );
    assert_eq!(version, 71_400_000);
    // The CUDA driver's codes: a host query or wait of an event recorded in a capture is
    // hipErrorCapturedEvent, the others hipErrorStreamCaptureUnsupported.
    each_capture_unsafe_call(|name| match name {
        "hipEventQuery" | "hipEventSynchronize" => CAPTURED_EVENT,
        _ => CAPTURE_UNSUPPORTED,
    });
}

/// Runs the ignored test `name` of this binary in a child process, `CUDA_SIM_HIP_VERSION` set
/// to `version` (or unset), and checks that it ran and passed.
fn in_child(name: &str, version: Option<&str>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([name, "--exact", "--ignored", "--test-threads=1"]);
    match version {
        Some(v) => command.env("CUDA_SIM_HIP_VERSION", v),
        None => command.env_remove("CUDA_SIM_HIP_VERSION"),
    };
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn before_rocm_7_14_capture_unsafe_calls_succeed_silently_and_are_recorded() {
    in_child("capture_unsafe_calls_before_7_14", None);
}

#[test]
fn from_rocm_7_14_capture_unsafe_calls_return_their_error() {
    in_child("capture_unsafe_calls_at_7_14", Some("71400000"));
}

fn attributes(p: *const c_void) -> (Err, PointerAttributes) {
    let mut a = PointerAttributes {
        type_: -1,
        device: -1,
        device_pointer: null_mut(),
        host_pointer: null_mut(),
        is_managed: -1,
        allocation_flags: 0,
    };
    let code = call!(hipPointerGetAttributes(&mut a, p): *mut PointerAttributes, *const c_void);
    (code, a)
}

#[test]
fn pointer_attributes_of_device_host_and_unknown_memory() {
    let _serial = serial();
    let mut count = 0;
    ok(
        call!(hipGetDeviceCount(&mut count): *mut c_int),
        "hipGetDeviceCount",
    );
    assert!(count >= 2, "the simulator's default is 2 devices");
    ok(call!(hipSetDevice(1): c_int), "hipSetDevice");
    let mut current = -1;
    ok(
        call!(hipGetDevice(&mut current): *mut c_int),
        "hipGetDevice",
    );
    assert_eq!(current, 1);
    let device = malloc(BYTES);
    let inside = device.wrapping_byte_add(100);
    let (code, a) = attributes(inside);
    ok(code, "device memory");
    assert_eq!((a.type_, a.device, a.is_managed), (2, 1, 0), "{a:?}");
    assert_eq!(a.device_pointer, inside);
    assert!(a.host_pointer.is_null());

    let mut pinned = null_mut();
    ok(
        call!(hipHostMalloc(&mut pinned, BYTES, 0): *mut *mut c_void, usize, c_uint),
        "hipHostMalloc",
    );
    let (code, a) = attributes(pinned);
    ok(code, "pinned host memory");
    assert_eq!((a.type_, a.device), (1, 1), "{a:?}");
    assert_eq!((a.host_pointer, a.device_pointer), (pinned, pinned));

    let local = [0u8; 16];
    let (code, a) = attributes(local.as_ptr().cast());
    ok(code, "pageable host memory: hipSuccess, as ROCm 6+");
    assert_eq!(a.type_, 0, "hipMemoryTypeUnregistered: {a:?}");
    ok(call!(hipFree(device): *mut c_void), "hipFree");
    let (code, a) = attributes(device);
    ok(code, "freed device memory");
    assert_eq!(a.type_, 0, "{a:?}");
    assert_eq!(attributes(std::ptr::null()).0, INVALID_VALUE);
    ok(call!(hipHostFree(pinned): *mut c_void), "hipHostFree");

    assert_eq!(call!(hipSetDevice(count): c_int), INVALID_DEVICE);
    ok(call!(hipSetDevice(0): c_int), "hipSetDevice");
}

fn name_and_string(code: Err) -> (String, String) {
    let name = hip!(hipGetErrorName: fn(c_int) -> *const c_char);
    let string = hip!(hipGetErrorString: fn(c_int) -> *const c_char);
    // SAFETY: static NUL-terminated strings.
    unsafe {
        (
            CStr::from_ptr(name(code)).to_str().unwrap().to_owned(),
            CStr::from_ptr(string(code)).to_str().unwrap().to_owned(),
        )
    }
}

#[test]
fn error_names_and_strings_are_hips() {
    let _serial = serial();
    assert_eq!(name_and_string(0), ("hipSuccess".into(), "no error".into()));
    assert_eq!(
        name_and_string(1),
        ("hipErrorInvalidValue".into(), "invalid argument".into())
    );
    for (code, name) in [
        (2, "hipErrorOutOfMemory"),
        (101, "hipErrorInvalidDevice"),
        (400, "hipErrorInvalidHandle"),
        (600, "hipErrorNotReady"),
        (704, "hipErrorPeerAccessAlreadyEnabled"),
        (801, "hipErrorNotSupported"),
        (900, "hipErrorStreamCaptureUnsupported"),
        (901, "hipErrorStreamCaptureInvalidated"),
        (906, "hipErrorStreamCaptureImplicit"),
        (907, "hipErrorCapturedEvent"),
        (21, "hipErrorInvalidMemcpyDirection"),
        (12345, "hipErrorUnknown"),
    ] {
        assert_eq!(name_and_string(code).0, name, "{code}");
    }
    assert_eq!(
        name_and_string(900).1,
        "operation not permitted when stream is capturing"
    );
    // Codes as HIP returns them.
    let mut p = null_mut();
    assert_eq!(
        call!(hipMemcpy(p, p, 1, 9): *mut c_void, *const c_void, usize, c_int),
        21,
        "an unknown copy kind"
    );
    ok(
        call!(hipMalloc(&mut p, 0): *mut *mut c_void, usize),
        "0 bytes",
    );
    assert!(p.is_null());
    let s = stream(0);
    ok(call!(hipStreamDestroy(s): Stream), "hipStreamDestroy");
    assert_eq!(call!(hipStreamDestroy(s): Stream), INVALID_HANDLE);
    let mut can = -1;
    ok(
        call!(hipDeviceCanAccessPeer(&mut can, 0, 1): *mut c_int, c_int, c_int),
        "hipDeviceCanAccessPeer",
    );
    assert_eq!(can, 1);
    ok(
        call!(hipDeviceEnablePeerAccess(1, 0): c_int, c_uint),
        "hipDeviceEnablePeerAccess",
    );
    assert_eq!(call!(hipDeviceEnablePeerAccess(1, 0): c_int, c_uint), 704);
    assert_eq!(
        call!(hipDeviceEnablePeerAccess(0, 0): c_int, c_uint),
        INVALID_DEVICE
    );
    ok(
        call!(hipDeviceDisablePeerAccess(1): c_int),
        "hipDeviceDisablePeerAccess",
    );
    assert_eq!(call!(hipDeviceDisablePeerAccess(1): c_int), 705);
}

/// `name count` lines of the call report, as a map.
fn counts() -> std::collections::HashMap<String, u64> {
    call_report()
        .lines()
        .filter_map(|l| {
            let (name, n) = l.split_once(' ')?;
            Some((name.to_owned(), n.parse().ok()?))
        })
        .collect()
}

#[test]
fn hip_calls_are_counted_by_entry_point() {
    let _serial = serial();
    let total = hip!(cuSimDriverCalls: fn() -> u64);
    let before = counts();
    // SAFETY: no arguments.
    let total_before = unsafe { total() };
    let mut n = 0;
    ok(
        call!(hipGetDeviceCount(&mut n): *mut c_int),
        "hipGetDeviceCount",
    );
    ok(
        call!(hipGetDeviceCount(&mut n): *mut c_int),
        "hipGetDeviceCount",
    );
    assert_eq!(
        call!(hipSetDevice(-1): c_int),
        INVALID_DEVICE,
        "counted too"
    );
    let _ = name_and_string(0);
    let after = counts();
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(delta("hipGetDeviceCount"), 2);
    assert_eq!(delta("hipSetDevice"), 1);
    assert_eq!(delta("hipGetErrorName"), 1);
    assert_eq!(delta("hipGetErrorString"), 1);
    // SAFETY: no arguments.
    assert_eq!(unsafe { total() } - total_before, 5);
}
