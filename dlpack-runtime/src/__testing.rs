//! Internals that the workspace's own tests and benchmarks reach. Not public API: no stability
//! promise.

pub use crate::plan::stream::StreamId;
pub use crate::tensor::layout::{NullStrides, compact_strides, validate};

/// Freed export blocks a thread keeps per size class for its next exports (the rest go back
/// to the global allocator).
pub const CACHED_BLOCKS_PER_CLASS: usize = crate::export::CACHED_BLOCKS_PER_CLASS;

/// The CUDA driver tier's checks, for the driver conformance tests.
#[cfg(feature = "cuda")]
pub mod cuda {
    pub use crate::engine::cuda::{
        check_consumer_stream, check_pointer, check_producer_stream, events_created, pointer_device,
    };
}
