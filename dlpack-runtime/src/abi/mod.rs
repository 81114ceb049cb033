//! The lowest layer: the DLPack ABI ([`ffi`], public as `dlpack_runtime::ffi`), word-level
//! helpers of the exporter's blocks (`words`), and (feature `python`) whether this thread holds
//! the GIL (`gil`), the interpreter's functions looked up at run time (`symbol`) and the fields
//! of NumPy's objects that this crate reads (`numpy`).

pub mod ffi;
#[cfg(feature = "python")]
pub(crate) mod gil;
#[cfg(feature = "python")]
pub(crate) mod numpy;
#[cfg(feature = "python")]
pub(crate) mod symbol;
pub(crate) mod words;
