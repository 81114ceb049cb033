//! Other crates' types as producers and consumers: cudarc (`cuda`), ndarray (`ndarray`) and
//! candle (`candle`), each behind its feature.

#[cfg(feature = "candle")]
pub mod candle;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "ndarray")]
mod ndarray;
