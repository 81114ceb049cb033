//! Other crates' types as producers and consumers: cudarc (`cuda`), HIP (`hip`), ndarray (`ndarray`),
//! candle (`candle`) and burn (`burn`), each behind its feature.

#[cfg(feature = "burn")]
pub mod burn;
#[cfg(feature = "burn-cuda")]
pub mod burn_cuda;
#[cfg(feature = "candle")]
pub mod candle;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(feature = "ndarray")]
mod ndarray;
