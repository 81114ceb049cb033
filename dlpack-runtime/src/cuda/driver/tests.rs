//! Unit tests of the driver tier: special stream handles, the driver probe, and the verdicts on
//! failed waits.

use super::*;
use crate::stream::SyncPlan;

#[test]
fn special_streams_map_to_the_driver_handles() {
    assert_eq!(raw_stream(StreamId::LegacyDefault) as usize, 1);
    assert_eq!(raw_stream(StreamId::PerThreadDefault) as usize, 2);
    let h = core::num::NonZeroU64::new(0xdead_b000).unwrap();
    assert_eq!(raw_stream(StreamId::Handle(h)) as usize, 0xdead_b000);
}

#[test]
fn without_a_driver_everything_is_an_error_not_a_panic() {
    // Set by the test command: `present` on the CUDA simulator, `absent` with no driver.
    let expected = std::env::var("DLPACK_TESTS_EXPECT_DRIVER").ok();
    match init() {
        Err(CudaError::NoDriver) => {
            assert_ne!(expected.as_deref(), Some("present"));
            assert_eq!(pointer_device(0x1000), Err(CudaError::NoDriver));
            assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
            assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
            let plan = SyncPlan::HostSync {
                streams: vec![StreamId::LegacyDefault],
            };
            assert_eq!(execute(&plan, &[]), Err(CudaError::NoDriver));
        }
        other => {
            assert_ne!(expected.as_deref(), Some("absent"), "{other:?}");
            other.expect("the driver initializes");
            assert!(matches!(
                pointer_device(0x1000),
                Err(CudaError::Driver {
                    call: "cuPointerGetAttribute",
                    ..
                })
            ));
            assert_eq!(ReadyEvents::record(&[]).map(|r| r.is_empty()), Ok(true));
            assert_eq!(execute(&SyncPlan::Nothing, &[]), Ok(()));
        }
    }
}

#[test]
fn failed_waits_free_only_in_broken_contexts_and_retry_only_under_capture() {
    use sys::CUresult as R;
    let failed = |code| CudaError::Driver {
        call: "cuEventSynchronize",
        code,
    };
    for code in [
        R::CUDA_ERROR_ILLEGAL_ADDRESS,
        R::CUDA_ERROR_LAUNCH_FAILED,
        R::CUDA_ERROR_ECC_UNCORRECTABLE,
        R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
        R::CUDA_ERROR_DEINITIALIZED,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Free,
            "{code:?}"
        );
    }
    for code in [
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Retry,
            "{code:?}"
        );
    }
    for code in [
        R::CUDA_ERROR_INVALID_HANDLE,
        R::CUDA_ERROR_NOT_READY,
        R::CUDA_ERROR_UNKNOWN,
    ] {
        assert_eq!(
            after_failed_wait(&failed(code)),
            AfterFailedWait::Leak,
            "{code:?}"
        );
    }
    assert_eq!(
        after_failed_wait(&CudaError::NoDriver),
        AfterFailedWait::Leak
    );
}
