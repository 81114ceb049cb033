//! The `stream` argument of `__dlpack__`, parsed per device type (spec section 2.4).
//!
//! This layer is pure: it turns the integer a consumer passes into a typed [`StreamRequest`],
//! refusing values the spec forbids with an error that lists the legal ones. It makes no driver
//! calls.
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

use core::num::NonZeroU64;

use crate::device::{Device, DeviceType};
use crate::error::StreamError;

/// What the consumer asked for with `stream=` (spec section 2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamRequest {
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
pub fn parse_stream(device: Device, stream: Option<i64>) -> Result<StreamRequest, StreamError> {
    let invalid = |allowed| StreamError::Invalid {
        found: stream,
        device,
        allowed,
    };
    match device.device_type {
        DeviceType::Cpu => match stream {
            None => Ok(StreamRequest::Host),
            Some(_) => Err(invalid(CPU_ALLOWED)),
        },
        DeviceType::Cuda | DeviceType::CudaHost | DeviceType::CudaManaged => match stream {
            None | Some(1) => Ok(StreamRequest::LegacyDefault),
            Some(-1) => Ok(StreamRequest::NoSync),
            Some(2) => Ok(StreamRequest::PerThreadDefault),
            Some(h) if h > 2 => Ok(StreamRequest::Handle(handle(h))),
            Some(_) => Err(invalid(CUDA_ALLOWED)),
        },
        DeviceType::Rocm | DeviceType::RocmHost => match stream {
            None | Some(0) => Ok(StreamRequest::LegacyDefault),
            Some(-1) => Ok(StreamRequest::NoSync),
            Some(h) if h > 2 => Ok(StreamRequest::Handle(handle(h))),
            Some(_) => Err(invalid(ROCM_ALLOWED)),
        },
        _ => match stream {
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
            "stream=0 is not valid for a cuda:0 tensor, expected None, -1, 1, 2, or a stream handle > 2"
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
                format!("stream={s} is not valid for a cpu:0 tensor, expected None")
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
        assert!(parse_stream(vk, Some(0)).is_err());
    }
}
