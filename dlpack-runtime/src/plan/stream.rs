//! Stream planning: the `stream` argument of the array API's
//! [`__dlpack__`](https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html),
//! parsed per device type, and what an exchange must do about pending work.
//!
//! This layer is pure: it turns the integer a consumer passes into a typed [`StreamRequest`],
//! refusing values `__dlpack__` forbids with a [`StreamError`] that lists the legal ones, and
//! decides the synchronization ([`SyncPlan`]) and copy placement ([`CopyPlan`]). It makes no
//! driver calls; the CUDA driver tier carries the plans out.
//!
//! | value | CUDA | ROCm | CPU |
//! |---|---|---|---|
//! | `None` | legacy default stream | default stream | accepted (the only legal value) |
//! | `-1` | no synchronization | no synchronization | refused |
//! | `0` | refused (ambiguous) | default stream | refused |
//! | `1` | legacy default stream | refused | refused |
//! | `2` | per-thread default stream | refused | refused |
//! | `> 2` | a `cudaStream_t` | a `hipStream_t` | refused |
//!
//! CUDA host and managed memory follow the CUDA column, ROCm host memory the ROCm column. Other
//! device types accept `None` and `-1`; their streams are not standardized.

// The plans are carried out by the CUDA driver tier; without the `cuda` feature only the parsing
// is used outside the tests.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use core::num::NonZeroU64;

#[cfg(test)]
use crate::tensor::device::DeviceType;
use crate::tensor::device::{Device, StreamApi};

/// What the consumer asked for with `stream=` (the `stream` parameter of `__dlpack__`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StreamRequest {
    /// Host memory with `stream=None`: the data must be ready for the host.
    Host,
    /// `stream=-1`: the producer must not synchronize.
    NoSync,
    /// The legacy default stream (CUDA `None` or `1`; ROCm `None` or `0`).
    LegacyDefault,
    /// The per-thread default stream (CUDA `2`).
    PerThreadDefault,
    /// A stream handle (`cudaStream_t` / `hipStream_t`), valid for the duration of the call.
    Handle(NonZeroU64),
}

const CUDA_ALLOWED: &str = "None, -1, 1, 2, or a stream handle > 2";
const ROCM_ALLOWED: &str = "None, -1, 0, or a stream handle > 2";
const CPU_ALLOWED: &str = "None";
const OTHER_ALLOWED: &str = "None or -1";

/// Parses `stream` for a tensor on `device` (or for the `dl_device` the consumer asked for).
///
/// # Errors
///
/// [`StreamError::Invalid`] for a value the table above refuses, naming the legal values
/// (for example `stream=0` on CUDA); [`StreamError::Unsupported`] for a stream handle on a
/// device type whose streams are not standardized.
pub(crate) fn parse_stream(
    device: Device,
    stream: Option<i64>,
) -> Result<StreamRequest, StreamError> {
    let invalid = |allowed| StreamError::Invalid {
        found: stream,
        device,
        allowed,
    };
    match device.device_type.streams() {
        StreamApi::Host => match stream {
            None => Ok(StreamRequest::Host),
            Some(_) => Err(invalid(CPU_ALLOWED)),
        },
        StreamApi::Cuda => match stream {
            None | Some(1) => Ok(StreamRequest::LegacyDefault),
            Some(-1) => Ok(StreamRequest::NoSync),
            Some(2) => Ok(StreamRequest::PerThreadDefault),
            Some(h) if h > 2 => Ok(StreamRequest::Handle(handle(h))),
            Some(_) => Err(invalid(CUDA_ALLOWED)),
        },
        StreamApi::Rocm => match stream {
            None | Some(0) => Ok(StreamRequest::LegacyDefault),
            Some(-1) => Ok(StreamRequest::NoSync),
            Some(h) if h > 2 => Ok(StreamRequest::Handle(handle(h))),
            Some(_) => Err(invalid(ROCM_ALLOWED)),
        },
        StreamApi::Unstandardized => match stream {
            None => Ok(StreamRequest::LegacyDefault),
            Some(-1) => Ok(StreamRequest::NoSync),
            Some(h) if h > 2 => Err(StreamError::Unsupported { found: h, device }),
            Some(_) => Err(invalid(OTHER_ALLOWED)),
        },
    }
}

fn handle(h: i64) -> NonZeroU64 {
    // `h > 2` was matched by every caller.
    NonZeroU64::new(h as u64).unwrap_or(NonZeroU64::MIN)
}

/// A CUDA stream named during one exchange: a producer stream with pending work on the
/// tensor, or the consumer's stream. Stream handles are recycled by the driver, so a `StreamId`
/// is compared with another only inside the call that named both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamId {
    /// The legacy default stream (`CU_STREAM_LEGACY`).
    LegacyDefault,
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`).
    PerThreadDefault,
    /// A stream handle (`CUstream`), non-zero.
    Handle(NonZeroU64),
}

impl StreamId {
    /// The consumer's stream of a request as a stream identity, if the request names one.
    pub(crate) fn of_request(request: StreamRequest) -> Option<Self> {
        match request {
            StreamRequest::LegacyDefault => Some(Self::LegacyDefault),
            StreamRequest::PerThreadDefault => Some(Self::PerThreadDefault),
            StreamRequest::Handle(h) => Some(Self::Handle(h)),
            StreamRequest::Host | StreamRequest::NoSync => None,
        }
    }
}

/// What the producer must do so that its pending work is visible to the consumer
/// (the `stream` parameter of `__dlpack__`). Decided by [`plan_sync`]; carried out by the `cuda`
/// layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SyncPlan {
    /// Nothing: no pending work, `stream=-1`, or the consumer uses the producer's stream.
    Nothing,
    /// Record an event on each of `record_on` and make `wait_on` wait for it: the host does
    /// not block.
    EventDependency {
        /// Producer streams with pending work, other than the consumer's.
        record_on: Vec<StreamId>,
        /// The consumer's stream.
        wait_on: StreamId,
    },
    /// Block the host until `streams` have finished: the consumer reads on the host
    /// (`stream=None` for a CPU request, as `__dlpack__`'s `stream` parameter requires).
    HostSync {
        /// Producer streams with pending work.
        streams: Vec<StreamId>,
    },
}

/// Decides the synchronization for one export: `pending` are the producer's streams with work
/// on the tensor (its `#[dlpack(stream)]` fields), `request` the parsed `stream` argument
/// ([`parse_stream`] for the device the consumer will use), and `device` the tensor's device.
///
/// Rules: no pending work or `stream=-1` needs nothing; a host request ([`StreamRequest::Host`],
/// the consumer reads on the CPU) needs a host synchronization; a consumer stream gets an event
/// dependency on every pending stream that is not the consumer's own.
///
/// # Errors
///
/// [`StreamError::Unsupported`] when pending work on a device type whose streams this crate
/// cannot order (ROCm without the `hip` feature, and others) would need synchronization.
pub(crate) fn plan_sync(
    device: Device,
    pending: &[StreamId],
    request: StreamRequest,
) -> Result<SyncPlan, StreamError> {
    if pending.is_empty() || request == StreamRequest::NoSync {
        return Ok(SyncPlan::Nothing);
    }
    if !orders_streams(device) {
        let found = match request {
            StreamRequest::Handle(h) => h.get() as i64,
            StreamRequest::PerThreadDefault => 2,
            _ => 0,
        };
        return Err(StreamError::Unsupported { found, device });
    }
    let mut unique: Vec<StreamId> = Vec::with_capacity(pending.len());
    for stream in pending {
        if !unique.contains(stream) {
            unique.push(*stream);
        }
    }
    match StreamId::of_request(request) {
        None => Ok(SyncPlan::HostSync { streams: unique }),
        Some(consumer) => {
            unique.retain(|s| *s != consumer);
            if unique.is_empty() {
                Ok(SyncPlan::Nothing)
            } else {
                Ok(SyncPlan::EventDependency {
                    record_on: unique,
                    wait_on: consumer,
                })
            }
        }
    }
}

/// Whether this build orders pending work on `device`'s streams: CUDA's (feature `cuda`), and
/// ROCm's with the `hip` feature.
fn orders_streams(device: Device) -> bool {
    match device.device_type.streams() {
        StreamApi::Cuda => true,
        StreamApi::Rocm => cfg!(feature = "hip"),
        StreamApi::Host | StreamApi::Unstandardized => false,
    }
}

/// How a producer copies device memory for its consumer (`copy=True`, or `dl_device=(CPU, 0)`
/// for CUDA memory; the `copy` and `dl_device` parameters of `__dlpack__`). Decided by
/// [`plan_copy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    /// The stream the copy is enqueued on: the consumer's stream when it names one (the `copy`
    /// parameter of `__dlpack__`: the copy "must be performed over `stream`").
    pub on: StreamId,
    /// What makes the producer's pending work visible on [`CopyPlan::on`] before the copy.
    pub before: SyncPlan,
    /// Whether the copy goes to host memory (`dl_device=(CPU, 0)`).
    pub to_host: bool,
    /// Whether the host waits for the copy to finish: the consumer reads on the host, or
    /// (`stream=-1`) has no stream the copy could be ordered before.
    pub host_wait: bool,
}

impl StreamRequest {
    /// The request that names `stream` as the consumer's stream.
    fn naming(stream: StreamId) -> Self {
        match stream {
            StreamId::LegacyDefault => Self::LegacyDefault,
            StreamId::PerThreadDefault => Self::PerThreadDefault,
            StreamId::Handle(h) => Self::Handle(h),
        }
    }
}

/// Decides where a copy of a tensor on `device` is enqueued, for the producer's `pending`
/// streams and the parsed `stream` argument `request` ([`parse_stream`] for the device the
/// consumer will use).
///
/// - A consumer stream (`None`, `1`, `2` or a handle on CUDA): the copy goes on it, after an
///   event dependency on every other pending producer stream; the host does not block.
/// - `stream=-1`: the consumer names no stream, so the copy goes on the producer's first
///   pending stream, or on the legacy default stream when nothing is pending (the producer's
///   other streams are ordered before it), and the host waits for it: a copy the consumer
///   cannot order itself after must be finished when it is handed over.
/// - A host consumer ([`StreamRequest::Host`], `dl_device=(CPU, 0)`): the copy goes on the
///   per-thread default stream after the pending work, and the host waits for it, as the
///   `stream` parameter of `__dlpack__` requires for a CPU consumer.
///
/// # Errors
///
/// As [`plan_sync`]: pending work on a device type whose streams this crate cannot order.
pub(crate) fn plan_copy(
    device: Device,
    pending: &[StreamId],
    request: StreamRequest,
) -> Result<CopyPlan, StreamError> {
    let (on, host_wait) = match request {
        StreamRequest::Host => (StreamId::PerThreadDefault, true),
        StreamRequest::NoSync => (
            pending.first().copied().unwrap_or(StreamId::LegacyDefault),
            true,
        ),
        StreamRequest::LegacyDefault => (StreamId::LegacyDefault, false),
        StreamRequest::PerThreadDefault => (StreamId::PerThreadDefault, false),
        StreamRequest::Handle(h) => (StreamId::Handle(h), false),
    };
    let before = plan_sync(device, pending, StreamRequest::naming(on))?;
    Ok(CopyPlan {
        on,
        before,
        to_host: request == StreamRequest::Host,
        host_wait,
    })
}

/// Decides where a copy of a tensor on `device` to another CUDA device is enqueued, for the
/// producer's `pending` streams (of `device`) and the parsed `stream` argument `request`
/// ([`parse_stream`] for the target device: the array API's `__dlpack__` says that with
/// `dl_device`, `stream` is a stream of that device).
///
/// As [`plan_copy`], except that the stream identities of the request name streams of the
/// target device, which are never the producer's (the legacy default stream of one device is
/// not another's), so every pending stream gets an event the copy's stream waits on
/// (`cuStreamWaitEvent` takes an event of another device); and `stream=-1`, which names no
/// stream, puts the copy on the target's legacy default stream, which the host waits for.
///
/// # Errors
///
/// As [`plan_copy`].
pub(crate) fn plan_copy_to(
    device: Device,
    pending: &[StreamId],
    request: StreamRequest,
) -> Result<CopyPlan, StreamError> {
    let mut copy = plan_copy(device, pending, request)?;
    if request == StreamRequest::NoSync {
        copy.on = StreamId::LegacyDefault;
    }
    let mut record_on: Vec<StreamId> = Vec::with_capacity(pending.len());
    for stream in pending {
        if !record_on.contains(stream) {
            record_on.push(*stream);
        }
    }
    copy.before = if record_on.is_empty() {
        SyncPlan::Nothing
    } else {
        SyncPlan::EventDependency {
            record_on,
            wait_on: copy.on,
        }
    };
    Ok(copy)
}

/// A `stream` argument that is not legal for the device (the `stream` parameter of the array
/// API's `__dlpack__`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream value is not one of the legal values for the device type.
    #[error("stream={} is not valid for a consumer on {device}, expected {allowed}", display_stream(*found))]
    Invalid {
        /// The stream value given (`None` for Python's `None`).
        found: Option<i64>,
        /// The device the consumer will use: `dl_device` when given, else the tensor's.
        device: Device,
        /// The legal values, in words.
        allowed: &'static str,
    },
    /// Streams on this device type are not supported by this crate yet.
    #[error(
        "stream={found} for a {device} tensor: synchronization on this device is not supported, expected stream=None or -1"
    )]
    Unsupported {
        /// The stream value given.
        found: i64,
        /// The tensor's device.
        device: Device,
    },
}

fn display_stream(s: Option<i64>) -> String {
    s.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(t: DeviceType) -> Device {
        Device::new(t, 0)
    }

    #[test]
    fn c09_cuda_refuses_zero_and_names_the_legal_values() {
        let err = parse_stream(Device::cuda(0), Some(0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stream=0 is not valid for a consumer on cuda:0, expected None, -1, 1, 2, or a stream handle > 2"
        );
        assert_eq!(
            parse_stream(Device::cuda(0), Some(-2)).unwrap_err(),
            StreamError::Invalid {
                found: Some(-2),
                device: Device::cuda(0),
                allowed: CUDA_ALLOWED
            }
        );
    }

    #[test]
    fn c09_rocm_refuses_one_and_two() {
        for s in [1, 2] {
            let err = parse_stream(dev(DeviceType::Rocm), Some(s)).unwrap_err();
            assert_eq!(
                err,
                StreamError::Invalid {
                    found: Some(s),
                    device: dev(DeviceType::Rocm),
                    allowed: ROCM_ALLOWED
                }
            );
        }
        assert_eq!(
            parse_stream(dev(DeviceType::Rocm), Some(0)),
            Ok(StreamRequest::LegacyDefault)
        );
    }

    #[test]
    fn c09_cpu_accepts_only_none() {
        assert_eq!(parse_stream(Device::CPU, None), Ok(StreamRequest::Host));
        for s in [-1, 0, 1, 2, 3, 0x7fff_0000] {
            let err = parse_stream(Device::CPU, Some(s)).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("stream={s} is not valid for a consumer on cpu:0, expected None")
            );
        }
    }

    #[test]
    fn cuda_table() {
        let cuda = Device::cuda(1);
        assert_eq!(parse_stream(cuda, None), Ok(StreamRequest::LegacyDefault));
        assert_eq!(
            parse_stream(cuda, Some(1)),
            Ok(StreamRequest::LegacyDefault)
        );
        assert_eq!(
            parse_stream(cuda, Some(2)),
            Ok(StreamRequest::PerThreadDefault)
        );
        assert_eq!(parse_stream(cuda, Some(-1)), Ok(StreamRequest::NoSync));
        assert_eq!(
            parse_stream(cuda, Some(3)),
            Ok(StreamRequest::Handle(NonZeroU64::new(3).unwrap()))
        );
        assert!(parse_stream(dev(DeviceType::CudaManaged), Some(0)).is_err());
    }

    #[test]
    fn other_devices_accept_none_and_minus_one_only() {
        let vk = dev(DeviceType::Vulkan);
        assert_eq!(parse_stream(vk, Some(-1)), Ok(StreamRequest::NoSync));
        assert_eq!(
            parse_stream(vk, Some(5)),
            Err(StreamError::Unsupported {
                found: 5,
                device: vk
            })
        );
        for small in [0, 1, 2] {
            assert!(
                matches!(
                    parse_stream(vk, Some(small)),
                    Err(StreamError::Invalid { found: Some(f), .. }) if f == small
                ),
                "{small}"
            );
        }
        // A plan for a device without CUDA's streams names the stream value it refuses.
        let pending = [StreamId::LegacyDefault];
        assert_eq!(
            plan_sync(vk, &pending, StreamRequest::PerThreadDefault),
            Err(StreamError::Unsupported {
                found: 2,
                device: vk
            })
        );
    }

    fn h(v: u64) -> StreamId {
        StreamId::Handle(NonZeroU64::new(v).unwrap())
    }

    /// Every stream value of the table against every set of pending streams, on CUDA.
    #[test]
    fn cuda_plans_for_every_stream_value_and_producer_set() {
        let cuda = Device::cuda(0);
        let sets: [&[StreamId]; 6] = [
            &[],
            &[StreamId::LegacyDefault],
            &[StreamId::PerThreadDefault],
            &[h(0x1000)],
            &[h(0x1000), h(0x2000), h(0x1000)],
            &[h(0x1000), StreamId::LegacyDefault],
        ];
        for value in [
            None,
            Some(-2),
            Some(-1),
            Some(0),
            Some(1),
            Some(2),
            Some(3),
            Some(0x1000),
            Some(0x3000),
        ] {
            for pending in sets {
                let parsed = parse_stream(cuda, value);
                if matches!(value, Some(-2) | Some(0)) {
                    assert!(parsed.is_err(), "{value:?} is illegal on CUDA");
                    continue;
                }
                let request = parsed.unwrap();
                let plan = plan_sync(cuda, pending, request).unwrap();
                let consumer = StreamId::of_request(request);
                let mut others: Vec<StreamId> = vec![];
                for s in pending {
                    if Some(*s) != consumer && !others.contains(s) {
                        others.push(*s);
                    }
                }
                let expected = if value == Some(-1) || others.is_empty() {
                    SyncPlan::Nothing
                } else {
                    SyncPlan::EventDependency {
                        record_on: others,
                        wait_on: consumer.unwrap(),
                    }
                };
                assert_eq!(plan, expected, "stream={value:?} pending={pending:?}");
            }
        }
    }

    #[test]
    fn same_stream_needs_nothing_and_distinct_streams_get_one_event_each() {
        let cuda = Device::cuda(0);
        let consumer = StreamRequest::Handle(NonZeroU64::new(0x1000).unwrap());
        assert_eq!(
            plan_sync(cuda, &[h(0x1000)], consumer),
            Ok(SyncPlan::Nothing)
        );
        assert_eq!(
            plan_sync(cuda, &[h(0x1000), h(0x2000)], consumer),
            Ok(SyncPlan::EventDependency {
                record_on: vec![h(0x2000)],
                wait_on: h(0x1000)
            })
        );
        // None means the legacy default stream: work on a created stream must be ordered.
        assert_eq!(
            plan_sync(cuda, &[h(0x2000)], parse_stream(cuda, None).unwrap()),
            Ok(SyncPlan::EventDependency {
                record_on: vec![h(0x2000)],
                wait_on: StreamId::LegacyDefault
            })
        );
        // The per-thread and legacy default streams are different streams.
        assert_eq!(
            plan_sync(
                cuda,
                &[StreamId::LegacyDefault],
                StreamRequest::PerThreadDefault
            ),
            Ok(SyncPlan::EventDependency {
                record_on: vec![StreamId::LegacyDefault],
                wait_on: StreamId::PerThreadDefault
            })
        );
    }

    #[test]
    fn host_reads_of_cuda_memory_need_a_host_sync() {
        let managed = dev(DeviceType::CudaManaged);
        // A CPU consumer of managed memory passes dl_device=CPU and stream=None: the stream is
        // parsed for the CPU and the producer must finish before the host reads.
        let request = parse_stream(Device::CPU, None).unwrap();
        assert_eq!(
            plan_sync(managed, &[h(0x1000), h(0x1000)], request),
            Ok(SyncPlan::HostSync {
                streams: vec![h(0x1000)]
            })
        );
        assert_eq!(plan_sync(managed, &[], request), Ok(SyncPlan::Nothing));
    }

    /// ROCm streams are ordered with the `hip` feature (an event dependency on the consumer's
    /// stream, nothing for the same stream or `stream=-1`) and refused without it; device
    /// types whose streams are not standardized refuse pending work always.
    #[test]
    fn devices_without_stream_support_refuse_pending_work() {
        let rocm = dev(DeviceType::Rocm);
        let request = parse_stream(rocm, Some(0x5000)).unwrap();
        if cfg!(feature = "hip") {
            assert_eq!(
                plan_sync(rocm, &[h(0x1000)], request),
                Ok(SyncPlan::EventDependency {
                    record_on: vec![h(0x1000)],
                    wait_on: h(0x5000)
                })
            );
            assert_eq!(
                plan_sync(rocm, &[h(0x5000)], request),
                Ok(SyncPlan::Nothing)
            );
            // `stream=0` and `None`: the default stream.
            assert_eq!(
                plan_sync(rocm, &[h(0x1000)], parse_stream(rocm, Some(0)).unwrap()),
                Ok(SyncPlan::EventDependency {
                    record_on: vec![h(0x1000)],
                    wait_on: StreamId::LegacyDefault
                })
            );
            // ROCm host memory read on the host: a host wait.
            let rocm_host = dev(DeviceType::RocmHost);
            assert_eq!(
                plan_sync(rocm_host, &[h(0x1000)], StreamRequest::Host),
                Ok(SyncPlan::HostSync {
                    streams: vec![h(0x1000)]
                })
            );
        } else {
            assert_eq!(
                plan_sync(rocm, &[h(0x1000)], request),
                Err(StreamError::Unsupported {
                    found: 0x5000,
                    device: rocm
                })
            );
        }
        // Nothing can order Vulkan's streams, whatever the features.
        let vulkan = dev(DeviceType::Vulkan);
        assert_eq!(
            plan_sync(vulkan, &[h(0x1000)], parse_stream(vulkan, None).unwrap()),
            Err(StreamError::Unsupported {
                found: 0,
                device: vulkan
            })
        );
        assert_eq!(
            plan_sync(rocm, &[h(0x1000)], StreamRequest::NoSync),
            Ok(SyncPlan::Nothing)
        );
        assert_eq!(plan_sync(rocm, &[], request), Ok(SyncPlan::Nothing));
        assert_eq!(
            plan_sync(Device::CPU, &[], StreamRequest::Host),
            Ok(SyncPlan::Nothing)
        );
    }

    /// A copy to another CUDA device goes on the consumer's stream of that device after an
    /// event of every pending stream, its own identity included (the same special handle is
    /// another stream on each device); `stream=-1` puts it on the target's legacy default
    /// stream, and the host waits.
    #[test]
    fn copies_to_another_device_order_every_pending_stream() {
        let (source, target) = (Device::cuda(0), Device::cuda(1));
        let sets: [&[StreamId]; 4] = [
            &[],
            &[StreamId::LegacyDefault],
            &[h(0x1000), h(0x2000), h(0x1000)],
            &[StreamId::PerThreadDefault],
        ];
        for pending in sets {
            let mut unique: Vec<StreamId> = Vec::new();
            for s in pending {
                if !unique.contains(s) {
                    unique.push(*s);
                }
            }
            for (value, on, host_wait) in [
                (None, StreamId::LegacyDefault, false),
                (Some(2), StreamId::PerThreadDefault, false),
                (Some(0x1000), h(0x1000), false),
                (Some(-1), StreamId::LegacyDefault, true),
            ] {
                let request = parse_stream(target, value).unwrap();
                let copy = plan_copy_to(source, pending, request).unwrap();
                assert_eq!(copy.on, on, "stream={value:?}");
                assert_eq!(copy.host_wait, host_wait, "stream={value:?}");
                assert!(!copy.to_host);
                let expected = if unique.is_empty() {
                    SyncPlan::Nothing
                } else {
                    SyncPlan::EventDependency {
                        record_on: unique.clone(),
                        wait_on: on,
                    }
                };
                assert_eq!(
                    copy.before, expected,
                    "pending={pending:?} stream={value:?}"
                );
            }
        }
    }

    /// Copies go on the consumer's stream after the producer's work, for every stream value
    /// legal on CUDA and every producer set; host consumers wait.
    #[test]
    fn copies_are_enqueued_on_the_consumers_stream() {
        let cuda = Device::cuda(0);
        let sets: [&[StreamId]; 4] = [
            &[],
            &[h(0x1000)],
            &[h(0x1000), h(0x2000)],
            &[StreamId::PerThreadDefault],
        ];
        for pending in sets {
            for (value, on) in [
                (None, StreamId::LegacyDefault),
                (Some(1), StreamId::LegacyDefault),
                (Some(2), StreamId::PerThreadDefault),
                (Some(0x3000), h(0x3000)),
                (Some(0x1000), h(0x1000)),
            ] {
                let request = parse_stream(cuda, value).unwrap();
                let copy = plan_copy(cuda, pending, request).unwrap();
                assert_eq!(copy.on, on, "stream={value:?}");
                assert!(!copy.host_wait && !copy.to_host);
                assert_eq!(copy.before, plan_sync(cuda, pending, request).unwrap());
            }
            // -1: the producer's own (first) stream, its other streams ordered before it, and the
            // host waits.
            let copy = plan_copy(cuda, pending, StreamRequest::NoSync).unwrap();
            let on = pending.first().copied().unwrap_or(StreamId::LegacyDefault);
            assert_eq!(copy.on, on);
            assert!(
                copy.host_wait && !copy.to_host,
                "-1: the host waits for a device copy"
            );
            let others: Vec<_> = pending.iter().copied().filter(|s| *s != on).collect();
            let expected = if others.is_empty() {
                SyncPlan::Nothing
            } else {
                SyncPlan::EventDependency {
                    record_on: others,
                    wait_on: on,
                }
            };
            assert_eq!(copy.before, expected, "pending={pending:?}");
            // dl_device=(CPU, 0): the per-thread stream, then the host waits.
            let request = parse_stream(Device::CPU, None).unwrap();
            let copy = plan_copy(cuda, pending, request).unwrap();
            assert_eq!(copy.on, StreamId::PerThreadDefault);
            assert!(copy.host_wait && copy.to_host);
            assert_eq!(
                copy.before,
                plan_sync(cuda, pending, StreamRequest::PerThreadDefault).unwrap()
            );
        }
    }
}
