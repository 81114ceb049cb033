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

/// The borrow registry, for its benchmark: borrows through the process's registry as imports
/// do.
pub mod borrow {
    use crate::borrow::{self, Access, Footprint, Origin};

    /// Borrows the layout (`first`, `shape`, byte `strides`, `element_bytes`) for `owner`,
    /// exclusive or shared: whether it was granted. A layout that reaches no byte is granted.
    pub fn acquire(
        owner: usize,
        first: usize,
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
        exclusive: bool,
    ) -> bool {
        let Some(footprint) = Footprint::new(first, shape, strides, element_bytes) else {
            return true;
        };
        let access = if exclusive {
            Access::Exclusive
        } else {
            Access::Shared
        };
        let origin = Origin {
            deleter: 0,
            manager_ctx: core::ptr::null_mut(),
        };
        borrow::acquire(owner, &footprint, access, origin).is_ok()
    }

    /// Releases the borrow of `owner`, if any.
    pub fn release(owner: usize) {
        borrow::release(owner);
    }
}
