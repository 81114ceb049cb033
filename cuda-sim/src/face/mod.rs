//! The driver faces: the C entry points of `libcuda.so` (`cuda`) and of ROCm's
//! `libamdhip64.so` (`hip`), each a thin translation of its handles, codes and out-parameters
//! into calls of the model; the call counting both share (`calls`), and the simulator's own
//! `cuSim*` functions (`control`).

pub(crate) mod calls;
pub(crate) mod control;
pub(crate) mod cuda;
pub(crate) mod ffi;
pub(crate) mod hip;
