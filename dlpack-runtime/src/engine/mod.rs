//! The engines that carry the plans out: the host copy engine with its SIMD kernels (`host`)
//! and (feature `cuda`) the CUDA driver tier (`cuda`: events, copies, host waits, the reaper).

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod host;
