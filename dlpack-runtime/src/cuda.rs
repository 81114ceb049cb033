//! The CUDA effect layer (feature `cuda`), on cudarc with dynamic loading.
//!
//! The stream layer ([`crate::stream`]) decides *what* an exchange needs ([`SyncPlan`]); this
//! module does it with the driver:
//!
//! - [`driver`] probes for `libcuda` and initializes it; without a driver every entry point
//!   returns [`CudaError::NoDriver`] (cudarc itself would panic, so the probe comes first).
//! - An **event dependency** records a pooled event (timing disabled, created once per context
//!   and reused: [`events_created`] counts creations) on each producer stream with pending work
//!   and makes the consumer's stream wait on it (`cuStreamWaitEvent`): the host never blocks.
//!   The legacy (`1`) and per-thread (`2`) default streams map to `CU_STREAM_LEGACY` and
//!   `CU_STREAM_PER_THREAD`. The consumer's stream is borrowed for the call and only waited on.
//! - A **host synchronization** (`cuStreamSynchronize`) only where the spec requires it: a
//!   consumer that reads on the host.
//! - **Ready events** ([`ReadyEvents`]): beyond the standard, for Rust-to-Rust exchange, events
//!   recorded on the producer streams that the consumer can wait on later, from any stream.
//!   Events, never stream handles, outlive the call.
//! - **Stream-ordered release** ([`release_after`]): drops an imported tensor only after the
//!   consumer's stream has passed a recorded event. A reaper thread waits on the event and then
//!   calls the deleter; no CUDA call is made from a host callback.
//! - [`check_pointer`]: the device a pointer belongs to (`cuPointerGetAttribute`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};

use crate::managed::ManagedTensor;
use crate::stream::{ProducerStream, SyncPlan};

/// A CUDA failure, or the absence of a driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver: libcuda could not be loaded, expected a machine with an NVIDIA driver"
    )]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver call {call} failed with {code:?}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its result code.
        code: sys::CUresult,
    },
    /// A data pointer lives on another device than the tensor says.
    #[error("data pointer {pointer:#x} belongs to CUDA device {found}, expected device {expected}")]
    WrongDevice {
        /// The pointer.
        pointer: u64,
        /// Its device ordinal.
        found: i32,
        /// The device the tensor names.
        expected: i32,
    },
    /// The reaper thread of stream-ordered release is gone.
    #[error(
        "the stream-ordered release thread has stopped; the tensor was released at once after a host synchronization"
    )]
    ReaperGone,
}

fn driver_error(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver { call, code: e.0 }
}

/// Probes for the CUDA driver and initializes it (once per process).
///
/// # Errors
///
/// [`CudaError::NoDriver`] when `libcuda` cannot be loaded; [`CudaError::Driver`] when
/// `cuInit` fails (no device, driver too old).
pub fn driver() -> Result<(), CudaError> {
    static PROBE: OnceLock<Result<(), CudaError>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to `dlopen` the driver library under its candidate names.
            if !unsafe { sys::is_culib_present() } {
                return Err(CudaError::NoDriver);
            }
            result::init().map_err(driver_error("cuInit"))
        })
        .clone()
}

/// The raw handle of a stream identity, for the driver: `CU_STREAM_LEGACY`,
/// `CU_STREAM_PER_THREAD`, or the handle itself.
pub fn raw_stream(stream: ProducerStream) -> sys::CUstream {
    match stream {
        ProducerStream::LegacyDefault => 0x1 as sys::CUstream,
        ProducerStream::PerThreadDefault => 0x2 as sys::CUstream,
        ProducerStream::Handle(h) => h.get() as sys::CUstream,
    }
}

/// The identity of a cudarc stream within one exchange (NULL is the legacy default stream).
pub fn identity(stream: &CudaStream) -> ProducerStream {
    match stream.cu_stream() as usize {
        0 | 1 => ProducerStream::LegacyDefault,
        2 => ProducerStream::PerThreadDefault,
        h => ProducerStream::Handle(
            core::num::NonZeroU64::new(h as u64).unwrap_or(core::num::NonZeroU64::MIN),
        ),
    }
}

type Pool = Mutex<HashMap<usize, Vec<CudaEvent>>>;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

static CREATED: AtomicUsize = AtomicUsize::new(0);

/// Events created by the pool so far, in this process. After warm-up an exchange takes its
/// events from the pool, so this stays constant.
pub fn events_created() -> usize {
    CREATED.load(Ordering::Relaxed)
}

/// An event taken from the per-context pool; returned to it when dropped.
#[derive(Debug)]
pub struct PooledEvent {
    event: Option<CudaEvent>,
}

impl PooledEvent {
    /// Takes an event of `ctx` from the pool, creating one (timing disabled) if it is empty.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when an event cannot be created.
    pub fn take(ctx: &Arc<CudaContext>) -> Result<Self, CudaError> {
        let key = ctx.cu_ctx() as usize;
        let reused = pool()
            .lock()
            .ok()
            .and_then(|mut p| p.get_mut(&key).and_then(Vec::pop));
        let event = match reused {
            Some(event) => event,
            None => {
                let event = ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(driver_error("cuEventCreate"))?;
                CREATED.fetch_add(1, Ordering::Relaxed);
                event
            }
        };
        Ok(Self { event: Some(event) })
    }

    /// The event.
    pub fn event(&self) -> &CudaEvent {
        self.event
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only in drop"))
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            let key = event.context().cu_ctx() as usize;
            if let Ok(mut pool) = pool().lock() {
                pool.entry(key).or_default().push(event);
            }
        }
    }
}

/// Records a pooled event on `producer` and makes the raw `consumer` stream wait on it.
fn record_and_wait(producer: &CudaStream, consumer: sys::CUstream) -> Result<(), CudaError> {
    producer
        .context()
        .bind_to_thread()
        .map_err(driver_error("cuCtxSetCurrent"))?;
    let event = PooledEvent::take(producer.context())?;
    event
        .event()
        .record(producer)
        .map_err(driver_error("cuEventRecord"))?;
    // SAFETY: `consumer` is the consumer's stream, valid for the duration of this call (spec
    // section 2.4); the event is valid and recorded. `cuStreamWaitEvent` captures the event's
    // state now, so the event may be reused once this returns.
    unsafe {
        result::stream::wait_event(
            consumer,
            event.event().cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(driver_error("cuStreamWaitEvent"))
}

/// Carries out `plan` for the producer streams `pending` (the streams that named the plan's
/// identities, in this call).
///
/// # Errors
///
/// [`CudaError`] from the probe or the driver calls; nothing has been waited on then.
pub fn execute(plan: &SyncPlan, pending: &[&CudaStream]) -> Result<(), CudaError> {
    match plan {
        SyncPlan::Nothing => Ok(()),
        SyncPlan::EventDependency { record_on, wait_on } => {
            driver()?;
            let consumer = raw_stream(*wait_on);
            for stream in pending
                .iter()
                .copied()
                .filter(|s| record_on.contains(&identity(s)))
            {
                record_and_wait(stream, consumer)?;
            }
            Ok(())
        }
        SyncPlan::HostSync { streams } => {
            driver()?;
            for stream in pending
                .iter()
                .copied()
                .filter(|s| streams.contains(&identity(s)))
            {
                stream
                    .synchronize()
                    .map_err(driver_error("cuStreamSynchronize"))?;
            }
            Ok(())
        }
    }
}

/// Events recorded on a producer's streams at export, owned by the consumer: it may make any of
/// its streams wait on them later ([`ReadyEvents::wait_on`]), or block the host
/// ([`ReadyEvents::synchronize`]). Beyond the DLPack standard, for Rust-to-Rust exchange.
#[derive(Debug, Default)]
pub struct ReadyEvents {
    events: Vec<PooledEvent>,
}

impl ReadyEvents {
    /// Records one event on each of `streams`.
    ///
    /// # Errors
    ///
    /// [`CudaError`] from the probe or the driver.
    pub fn record(streams: &[&CudaStream]) -> Result<Self, CudaError> {
        if streams.is_empty() {
            return Ok(Self::default());
        }
        driver()?;
        let mut events = Vec::with_capacity(streams.len());
        for stream in streams {
            let event = PooledEvent::take(stream.context())?;
            event
                .event()
                .record(stream)
                .map_err(driver_error("cuEventRecord"))?;
            events.push(event);
        }
        Ok(Self { events })
    }

    /// Makes `stream` wait for every event; the host does not block.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuStreamWaitEvent`.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<(), CudaError> {
        for event in &self.events {
            stream
                .wait(event.event())
                .map_err(driver_error("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Blocks the host until every event has completed.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] from `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        for event in &self.events {
            event
                .event()
                .synchronize()
                .map_err(driver_error("cuEventSynchronize"))?;
        }
        Ok(())
    }

    /// Whether there are no events (no producer stream had pending work).
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// The device ordinal that owns `pointer` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
///
/// # Errors
///
/// [`CudaError::Driver`] for a pointer the driver does not know.
pub fn pointer_device(pointer: u64) -> Result<i32, CudaError> {
    driver()?;
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is a valid out-pointer for an `int` attribute; the driver only reads
    // its own tables for `pointer`.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            pointer as sys::CUdeviceptr,
        )
    }
    .result()
    .map_err(driver_error("cuPointerGetAttribute"))?;
    Ok(ordinal)
}

/// Checks that `pointer` belongs to CUDA device `expected`.
///
/// # Errors
///
/// [`CudaError::WrongDevice`], or the errors of [`pointer_device`].
pub fn check_pointer(pointer: u64, expected: i32) -> Result<(), CudaError> {
    let found = pointer_device(pointer)?;
    if found == expected {
        Ok(())
    } else {
        Err(CudaError::WrongDevice {
            pointer,
            found,
            expected,
        })
    }
}

/// The stream work of one export (called by the exporter while the producer's streams are
/// borrowed): checks that a CUDA `data` pointer belongs to the tensor's device, parses the
/// request's `stream` for the device the consumer will use, plans the synchronization
/// ([`crate::stream::plan_sync`]) and carries it out; with `want_ready`, also records
/// [`ReadyEvents`] on the pending streams.
///
/// # Errors
///
/// [`ExportError::Stream`] for an illegal or unsupported `stream`; [`ExportError::Cuda`] for a
/// driver failure, a missing driver with pending work, or a pointer on another device.
pub(crate) fn sync_export(
    device: crate::Device,
    data: u64,
    has_elements: bool,
    pending: &[&CudaStream],
    request: &crate::ExportRequest,
    want_ready: bool,
) -> Result<Option<ReadyEvents>, crate::ExportError> {
    if device.device_type == crate::DeviceType::Cuda && has_elements && driver().is_ok() {
        check_pointer(data, device.device_id)?;
    }
    if pending.is_empty() {
        return Ok(None);
    }
    let target = request.dl_device.unwrap_or(device);
    let stream_request = crate::stream::parse_stream(target, request.stream)?;
    let identities: Vec<ProducerStream> = pending.iter().map(|s| identity(s)).collect();
    let plan = crate::stream::plan_sync(device, &identities, stream_request)?;
    execute(&plan, pending)?;
    Ok(if want_ready {
        Some(ReadyEvents::record(pending)?)
    } else {
        None
    })
}

// SAFETY: a `CudaSlice<T>` owns `len` elements of `T` in device memory of its context's
// device; the pointers come from cudarc's accessors for the slice's own stream (recording the
// access as cudarc's event tracking expects), the mutable one from `&mut self`. `T: Element`
// gives the dtype; device allocations are aligned for every element type.
unsafe impl<T: crate::Element + cudarc::driver::DeviceRepr> crate::ExportBuffer
    for cudarc::driver::CudaSlice<T>
{
    fn dtype(&self) -> crate::DataType {
        T::DTYPE
    }
    fn device(&self) -> crate::Device {
        crate::Device::cuda(self.ordinal() as i32)
    }
    fn byte_len(&self) -> usize {
        self.num_bytes()
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        use cudarc::driver::DevicePtr;
        let stream = self.stream().clone();
        let (ptr, _record) = self.device_ptr(&stream);
        ptr as usize as *const core::ffi::c_void
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        use cudarc::driver::DevicePtrMut;
        let stream = self.stream().clone();
        let (ptr, _record) = self.device_ptr_mut(&stream);
        Some(ptr as usize as *mut core::ffi::c_void)
    }
    fn producer_stream(&self) -> Option<&CudaStream> {
        Some(self.stream())
    }
}

struct Release {
    event: PooledEvent,
    tensor: ManagedTensor,
}

fn reaper() -> Option<&'static Mutex<Sender<Release>>> {
    static REAPER: OnceLock<Option<Mutex<Sender<Release>>>> = OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Release>();
            std::thread::Builder::new()
                .name("dlpack-release".into())
                .spawn(move || {
                    for release in rx {
                        // Wait until the consumer's stream has passed the event, then free. On a
                        // driver error the wait is over all the same (the context is broken):
                        // free rather than leak.
                        let _ = release.event.event().synchronize();
                        drop(release.tensor);
                        drop(release.event);
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Stream-ordered release: `tensor`'s deleter runs only after `stream` has completed the work
/// enqueued on it so far (spec section 6, corner 7: the deleter carries no stream). An event is
/// recorded on `stream` now; a reaper thread waits for it, then drops the tensor.
///
/// # Errors
///
/// [`CudaError`] when the event cannot be recorded: the tensor is then released after a host
/// synchronization of `stream` (or at once if that fails too), never leaked.
pub fn release_after(tensor: ManagedTensor, stream: &CudaStream) -> Result<(), CudaError> {
    let recorded = driver().and_then(|()| {
        let event = PooledEvent::take(stream.context())?;
        event
            .event()
            .record(stream)
            .map_err(driver_error("cuEventRecord"))?;
        Ok(event)
    });
    let event = match recorded {
        Ok(event) => event,
        Err(err) => {
            let _ = stream.synchronize();
            drop(tensor);
            return Err(err);
        }
    };
    match reaper().and_then(|r| r.lock().ok()) {
        Some(sender) => match sender.send(Release { event, tensor }) {
            Ok(()) => Ok(()),
            Err(returned) => {
                let Release { event, tensor } = returned.0;
                let _ = event.event().synchronize();
                drop(tensor);
                Err(CudaError::ReaperGone)
            }
        },
        None => {
            let _ = event.event().synchronize();
            drop(tensor);
            Err(CudaError::ReaperGone)
        }
    }
}

impl<T: crate::Element> crate::ImportedData<T> {
    /// Stream-ordered release of this import: see [`release_after`].
    ///
    /// # Errors
    ///
    /// As [`release_after`]; the tensor is released either way.
    pub fn release_after(self, stream: &CudaStream) -> Result<(), CudaError> {
        release_after(self.into_managed(), stream)
    }

    /// The device pointer of element `(0, ..., 0)` of a CUDA tensor, for kernels launched by
    /// the consumer on its own stream. The memory belongs to the producer: never free it.
    ///
    /// # Errors
    ///
    /// [`crate::LayoutError::DtypeMismatch`] cannot happen here (checked at import); a non-CUDA
    /// tensor gives [`CudaError::WrongDevice`] with `found = -1`.
    pub fn cuda_device_ptr(&self) -> Result<sys::CUdeviceptr, CudaError> {
        let device = self.device();
        if !matches!(
            device.device_type,
            crate::DeviceType::Cuda | crate::DeviceType::CudaManaged
        ) {
            return Err(CudaError::WrongDevice {
                pointer: self.as_ptr() as u64,
                found: -1,
                expected: device.device_id,
            });
        }
        Ok(self.as_ptr() as sys::CUdeviceptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_streams_map_to_the_driver_handles() {
        assert_eq!(raw_stream(ProducerStream::LegacyDefault) as usize, 1);
        assert_eq!(raw_stream(ProducerStream::PerThreadDefault) as usize, 2);
        let h = core::num::NonZeroU64::new(0xdead_b000).unwrap();
        assert_eq!(raw_stream(ProducerStream::Handle(h)) as usize, 0xdead_b000);
    }

    #[test]
    fn without_a_driver_everything_is_an_error_not_a_panic() {
        match driver() {
            Err(CudaError::NoDriver) => {
                assert_eq!(pointer_device(0x1000), Err(CudaError::NoDriver));
                assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
                assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
                let plan = SyncPlan::HostSync {
                    streams: vec![ProducerStream::LegacyDefault],
                };
                assert_eq!(execute(&plan, &[]), Err(CudaError::NoDriver));
            }
            Ok(()) => eprintln!(
                "a CUDA driver is present: the GPU suite (scripts/gpu-suite.sh) covers this machine"
            ),
            Err(other) => eprintln!("CUDA driver present but unusable: {other}"),
        }
    }
}
