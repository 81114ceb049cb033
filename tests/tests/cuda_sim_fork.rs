//! The CUDA driver across `fork` (feature `cuda`): a process that only exchanged host tensors
//! has not initialized the driver, so a child it forks (a multiprocessing worker) uses CUDA as
//! any process does; a child of a process that called `cuInit` cannot (the simulator models
//! what drivers do: `CUDA_ERROR_NOT_INITIALIZED` for every call, `cuInit` included; a real
//! driver leaves it undefined, so that half is asserted on the simulator only). Each child
//! reports through its exit status, within a time limit.
//!
//! One test in this binary: the process must not have called `cuInit` before its first fork,
//! and a fork copies only the forking thread, so no other test may run beside it.
#![cfg(feature = "cuda")]

use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use cuda_sim_testing::{Driver, DriverCalls};
use cudarc::driver::{CudaContext, sys};
use dlpack_runtime::__testing::cuda as driver;
use dlpack_runtime::cuda::{self, CudaError};
use dlpack_runtime::{Device, DlpackExport, DlpackImport, ExportRequest};
use dlpack_tests::Counter;
use dlpack_tests::gpu::{GpuTensor, GpuView};
use dlpack_tests::host_paths;

/// How long a child may take.
const LIMIT: Duration = Duration::from_secs(60);

/// How a forked child ended.
#[derive(Debug, PartialEq, Eq)]
enum Child {
    /// It exited with this status: 0 when its body succeeded, 1 when the body failed, 2 when
    /// it panicked (the reason is on stderr).
    Exited(i32),
    /// A signal ended it.
    Signalled(i32),
    /// It ran past [`LIMIT`] and was killed.
    TimedOut,
}

/// Runs `body` in a forked child and waits for it, at most [`LIMIT`] (then kills it). The
/// child says why `body` failed on stderr (the process's own, not the test harness's capture,
/// which a child cannot hand back) and ends with `_exit`, never returning to the harness.
fn in_child(what: &str, body: impl FnOnce() -> Result<(), String>) -> Child {
    // SAFETY: `fork` has no preconditions. The child runs only this thread: it runs `body`,
    // which takes no lock that another thread of the parent could hold (the parent's other
    // threads only wait for this test), and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(())) => 0,
            Ok(Err(message)) => {
                let _ = writeln!(std::io::stderr(), "child ({what}): {message}");
                1
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("?");
                let _ = writeln!(std::io::stderr(), "child ({what}) panicked: {message}");
                2
            }
        };
        // SAFETY: ends the child at once, without the parent's exit handlers and destructors.
        unsafe { libc::_exit(code) }
    }
    let deadline = Instant::now() + LIMIT;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is this process's child; a valid out-pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if waited == pid {
            return if libc::WIFEXITED(status) {
                Child::Exited(libc::WEXITSTATUS(status))
            } else {
                Child::Signalled(libc::WTERMSIG(status))
            };
        }
        assert_eq!(waited, 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() >= deadline {
            // SAFETY: as above; the child is killed, then reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Child::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CUDA through this crate: the driver initialized, a tensor written on a stream of device 0,
/// exported with a copy to the host (`dl_device=cpu:0`) and read back.
fn uses_cuda() -> Result<(), String> {
    cuda::init().map_err(|e| format!("init: {e}"))?;
    let ctx = CudaContext::new(0).map_err(|e| format!("CudaContext::new: {e:?}"))?;
    let stream = ctx.new_stream().map_err(|e| format!("new_stream: {e:?}"))?;
    let data = stream
        .clone_htod(&[1u32, 2, 3, 4])
        .map_err(|e| format!("clone_htod: {e:?}"))?;
    let counter = Counter::new();
    let managed = GpuTensor::new(data, &stream, &counter)
        .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
        .map_err(|e| format!("export to the host: {e}"))?;
    let view = GpuView::from_managed(managed).map_err(|e| format!("import: {e}"))?;
    let values = view.data.to_vec().map_err(|e| format!("read: {e}"))?;
    if values != [1, 2, 3, 4] {
        return Err(format!("read back {values:?}"));
    }
    drop(view);
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e:?}"))
}

/// Every way a child of a process that called `cuInit` reaches the driver fails with
/// `CUDA_ERROR_NOT_INITIALIZED`: `cuInit`, a context, and this crate's own driver calls (its
/// probe's answer is the parent's, inherited).
fn cannot_use_cuda() -> Result<(), String> {
    const EXPECTED: sys::CUresult = sys::CUresult::CUDA_ERROR_NOT_INITIALIZED;
    match cudarc::driver::result::init() {
        Err(e) if e.0 == EXPECTED => {}
        other => return Err(format!("cuInit: {other:?}")),
    }
    match CudaContext::new(0) {
        Err(e) if e.0 == EXPECTED => {}
        other => {
            return Err(format!(
                "CudaContext::new: {:?}",
                other.map(|_| "a context")
            ));
        }
    }
    match driver::pointer_device(0x1000) {
        Err(CudaError::Driver { code, .. }) if code == EXPECTED => Ok(()),
        other => Err(format!("pointer_device: {other:?}")),
    }
}

#[test]
fn a_child_forked_after_host_exchanges_uses_cuda_and_one_forked_after_cu_init_cannot() {
    // The parent has the driver loaded, as a process with GPU tensors too would, and exchanges
    // host tensors only.
    let driver = cuda_sim_testing::driver();
    let before = DriverCalls::now();
    let cases = host_paths::rust_matrix();
    if let Some(before) = &before {
        let calls = DriverCalls::now().unwrap().since(before);
        assert_eq!(
            calls.total, 0,
            "the parent's host exchanges called: {calls}"
        );
    }
    assert_eq!(
        in_child("after host exchanges", uses_cuda),
        Child::Exited(0),
        "a child forked after the host-path matrix ({cases} cases) uses CUDA (its reason is on stderr)"
    );
    println!("a child forked after the host-path matrix ({cases} cases) used CUDA");

    // The negative control: the parent initializes the driver, then forks.
    cuda::init().expect("the driver initializes in the parent");
    let child = in_child("after cuInit", cannot_use_cuda);
    if driver == Driver::Simulator {
        assert_eq!(
            child,
            Child::Exited(0),
            "a child forked after cuInit gets CUDA_ERROR_NOT_INITIALIZED (its reason is on stderr)"
        );
        println!("a child forked after cuInit got CUDA_ERROR_NOT_INITIALIZED");
    } else {
        println!("a real driver in a child forked after cuInit (undefined): {child:?}");
    }
    // The parent's driver still works.
    uses_cuda().unwrap();
}
