//! The CUDA face of peer access: `cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess` and
//! `cuCtxDisablePeerAccess` over the model's operations.

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys::{CUcontext, CUdevice};

use super::driver::driver;
use crate::face::ffi::out;
use crate::model::base::Handle;
use crate::model::ops;

driver! {
    /// 1 if device `dev` can access the memory of device `peer_dev` directly, else 0: 0 for a
    /// device with itself, 1 for every other pair unless `CUDA_SIM_NO_PEER` lists it.
    /// `CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range.
    fn cuDeviceCanAccessPeer(can_access: *mut c_int, dev: CUdevice, peer_dev: CUdevice) {
        let answer = ops::can_access_peer(dev, peer_dev)?;
        // SAFETY: an out-pointer.
        unsafe { out(can_access, c_int::from(answer)) }
    }

    /// Enables access from the current context to the memory of `peer` (one way). Errors, as
    /// the driver documents them: `CUDA_ERROR_INVALID_VALUE` for flags other than 0,
    /// `CUDA_ERROR_INVALID_CONTEXT` with no current context, for a `peer` that is not a live
    /// context or is the current context, `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` when
    /// `cuDeviceCanAccessPeer` answers 0 for the two contexts' devices (so also for two contexts
    /// of one device), and `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` the second time.
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) {
        let me = ops::live_current_context()?;
        ops::enable_peer_access(me, peer as Handle, flags)
    }

    /// Disables the access from the current context to `peer` that `cuCtxEnablePeerAccess`
    /// enabled: `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` if it is not enabled,
    /// `CUDA_ERROR_INVALID_CONTEXT` with no current context or for a `peer` that is not a live
    /// context.
    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        let me = ops::live_current_context()?;
        ops::disable_peer_access(me, peer as Handle)
    }
}
