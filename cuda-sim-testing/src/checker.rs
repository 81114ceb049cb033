//! [`Checker`]: the CUDA simulator's happens-before checker, seen from a test.

use std::cell::Cell;
use std::ffi::{CString, c_char};
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{CudaFunction, DriverError, sys};

type Count = unsafe extern "C" fn() -> u64;
type Reset = unsafe extern "C" fn();
type Report = unsafe extern "C" fn(*mut u8, usize) -> usize;
type Operations = unsafe extern "C" fn(*const c_char) -> u64;
type ReadOnly = unsafe extern "C" fn(sys::CUfunction, u32, i32) -> sys::CUresult;

/// The simulator's entry points, found with `dlsym` in the driver library cudarc loaded.
#[derive(Clone, Copy)]
struct Entries {
    count: Count,
    reset: Reset,
    report: Report,
    operations: Operations,
    /// Absent from a simulator older than kernel launches.
    read_only: Option<ReadOnly>,
}

impl Entries {
    fn find() -> Option<Self> {
        // SAFETY: probing only; a library that loads is kept loaded by cudarc for the process.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        // SAFETY: `culib` is the library cudarc calls; the symbols, when present, have the
        // signatures the simulator documents (`cuda-sim`, module `control`).
        unsafe {
            let lib = sys::culib();
            Some(Self {
                count: *lib.get::<Count>(b"cuSimViolations").ok()?,
                reset: *lib.get::<Reset>(b"cuSimReset").ok()?,
                report: *lib.get::<Report>(b"cuSimReport").ok()?,
                operations: *lib.get::<Operations>(b"cuSimOperations").ok()?,
                read_only: lib
                    .get::<ReadOnly>(b"cuSimKernelParamReadOnly")
                    .ok()
                    .map(|f| *f),
            })
        }
    }
}

/// The CUDA simulator's happens-before checker, held by one test at a time.
///
/// The simulator checks every copy, memset, kernel launch (kernel bodies do not run on the
/// simulator: a launch is an access to every allocation its pointer parameters point into,
/// and computes nothing), stream-ordered allocation and free against the order that streams, events (`cuEventRecord` + `cuStreamWaitEvent`), the
/// legacy default stream's barriers and host synchronizations create, when the work is
/// enqueued, whatever the timing of the run: an access not ordered after a conflicting one (at
/// least one a write, overlapping bytes), a free not ordered after every access, and any use of
/// freed memory are violations.
///
/// The simulator counts the whole process's violations. [`Checker::attach`] therefore takes a
/// process-wide turn (released when the checker drops), so tests that attach one run one at a
/// time and each sees its own violations; tests that do not attach one may run beside it, and
/// a violation of theirs counts too. Attach a checker in every test that makes a violation on
/// purpose. `Checker` is not `Send`: it stays on the test's thread.
pub struct Checker {
    entries: Entries,
    _turn: MutexGuard<'static, ()>,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("violations", &self.violations())
            .finish()
    }
}

/// Why [`Checker::declare_read_only`] refused a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeclareError {
    /// The index names no pointer-sized parameter of the kernel (`CUDA_ERROR_INVALID_VALUE`).
    #[error(
        "parameter {index} of the kernel is not a pointer-sized parameter (or the kernel has no parameter {index}), expected the 0-based index of a pointer (.u64) parameter of its .entry signature"
    )]
    NotAPointer {
        /// The index refused.
        index: u32,
    },
    /// The kernel's module is not loaded in the simulator (`CUDA_ERROR_INVALID_HANDLE`).
    #[error("the kernel is not one of a module the simulator has loaded (unloaded since?)")]
    UnknownKernel,
    /// The simulator in use has no kernel support (no `cuSimKernelParamReadOnly`).
    #[error(
        "this CUDA simulator runs no kernels (it has no cuSimKernelParamReadOnly), expected the one built with this crate"
    )]
    NotSupported,
    /// Another failure of the simulator's entry point.
    #[error("cuSimKernelParamReadOnly failed: {0}")]
    Driver(DriverError),
}

thread_local! {
    /// Whether this thread holds a [`Checker`] (it is not `Send`, so it is dropped here too).
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

impl Drop for Checker {
    fn drop(&mut self) {
        HOLDING.set(false);
    }
}

impl Checker {
    /// The checker of the CUDA driver library of this process, with its counts reset, or
    /// `None` when that library is a real driver (or none can be loaded): the same test then
    /// runs on the hardware, without the checks. Loads the driver first ([`load`]), so it
    /// may come before or after [`driver`] in a test.
    ///
    /// Blocks while another thread holds a checker (see the type's docs).
    ///
    /// # Panics
    ///
    /// When this thread holds a checker already: the second would wait for ever for the first
    /// one's turn. Use the checker the test has, or drop it first.
    ///
    /// [`load`]: crate::load
    /// [`driver`]: crate::driver
    #[track_caller]
    pub fn attach() -> Option<Self> {
        static TURN: Mutex<()> = Mutex::new(());
        if crate::load() != Ok(crate::Driver::Simulator) {
            return None;
        }
        let entries = Entries::find()?;
        assert!(
            !HOLDING.get(),
            "Checker::attach: this thread holds a checker already, and a second would wait for ever for its turn; use that one, or drop it first"
        );
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        HOLDING.set(true);
        let checker = Self {
            entries,
            _turn: turn,
            _not_send: PhantomData,
        };
        checker.reset();
        Some(checker)
    }

    /// Forgets the violations found so far and the operation counts (`cuSimReset`).
    pub fn reset(&self) {
        // SAFETY: no arguments; the simulator's entry point.
        unsafe { (self.entries.reset)() }
    }

    /// How many violations were found since the last reset (`cuSimViolations`).
    pub fn violations(&self) -> u64 {
        // SAFETY: no arguments; the simulator's entry point.
        unsafe { (self.entries.count)() }
    }

    /// The violations since the last reset, one per line, each naming both accesses
    /// (operation, stream, byte range of which allocation); empty when there are none. The
    /// first 1000 are kept in full, then a count (`cuSimReport`).
    pub fn report(&self) -> String {
        // SAFETY: a NULL buffer asks for the length only.
        let len = unsafe { (self.entries.report)(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` has room for `len` bytes.
        let written = unsafe { (self.entries.report)(buf.as_mut_ptr(), buf.len()) };
        buf.truncate(written.min(len));
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// How many operations named `name` streams were given since the last reset
    /// (`cuSimOperations`): the driver function's name without its `_v2` suffix (such as
    /// `cuMemcpy2DAsync`, `cuMemsetD32Async`, `cuLaunchKernel`, `cuLaunchHostFunc`), or
    /// `event record` (`cuEventRecord`); 0 for a name with a NUL byte.
    pub fn operations(&self, name: &str) -> u64 {
        let Ok(name) = CString::new(name) else {
            return 0;
        };
        // SAFETY: a NUL-terminated string, alive for the call.
        unsafe { (self.entries.operations)(name.as_ptr()) }
    }

    /// Declares parameters `params` (0-based indices in the kernel's `.entry` signature) of
    /// `kernel` read-only: later launches read the allocations they point into rather than
    /// read and write them, so two unordered launches that only read one buffer are not
    /// reported.
    ///
    /// # Errors
    ///
    /// At the first index refused, the parameters before it declared:
    /// [`DeclareError::NotAPointer`] for an index that is not a pointer-sized parameter of the
    /// kernel (past its last one included), [`DeclareError::UnknownKernel`] for a kernel of an
    /// unloaded module, [`DeclareError::NotSupported`] from a simulator without kernels.
    pub fn declare_read_only(
        &self,
        kernel: &CudaFunction,
        params: &[u32],
    ) -> Result<(), DeclareError> {
        let Some(read_only) = self.entries.read_only else {
            return Err(DeclareError::NotSupported);
        };
        for &index in params {
            // SAFETY: the simulator's entry point; a kernel handle it made (or one it refuses).
            match unsafe { read_only(kernel.cu_function(), index, 1) } {
                sys::CUresult::CUDA_SUCCESS => {}
                sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                    return Err(DeclareError::NotAPointer { index });
                }
                sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
                    return Err(DeclareError::UnknownKernel);
                }
                other => return Err(DeclareError::Driver(DriverError(other))),
            }
        }
        Ok(())
    }

    /// Panics with the report, prefixed by `what`, if a violation was found since the last
    /// reset.
    #[track_caller]
    pub fn assert_clean(&self, what: &str) {
        let n = self.violations();
        if n != 0 {
            panic!("{what}: {n} happens-before violations:\n{}", self.report());
        }
    }
}
