//! The lowest layer: the DLPack ABI ([`ffi`], public as `dlpack_runtime::ffi`), word-level
//! helpers of the exporter's blocks (`words`), and (feature `python`) whether this thread holds
//! the GIL (`gil`).

pub mod ffi;
#[cfg(feature = "python")]
pub(crate) mod gil;
pub(crate) mod words;
