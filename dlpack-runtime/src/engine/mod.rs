//! The engines that carry the plans out: the host copy engine with its SIMD kernels (`host`)
//! and (feature `cuda`) the CUDA driver tier (`cuda`: events, copies, host waits, the reaper);
//! (feature `hip`) the HIP driver tier (`hip`: a binding loaded at run time, streams, events,
//! host waits and copies of ROCm memory).

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "hip")]
pub(crate) mod hip;
pub(crate) mod host;
