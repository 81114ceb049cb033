//! Peer access between devices: which devices can reach each other's memory
//! (`cuDeviceCanAccessPeer`, configured by `CUDA_SIM_NO_PEER`), the access each context has
//! enabled to others (`cuCtxEnablePeerAccess`, `cuCtxDisablePeerAccess`), and the check of a
//! kernel launch reaching another device's memory.
//!
//! Copies between devices (`cuMemcpyPeer`, `cuMemcpyPeerAsync`, and the unified-addressing
//! copies) need no peer access: the driver stages them when the devices cannot reach each
//! other. They live with the other copies (`api`).

use std::ffi::{c_int, c_uint};

use cudarc::driver::sys::{CUcontext, CUdevice};

use crate::engine::{Alloc, Handle, State};
use crate::{driver, ops, out, state};

/// Device pairs that cannot access each other's memory (`CUDA_SIM_NO_PEER`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum NoPeer {
    /// Every pair of distinct devices can (the default).
    #[default]
    None,
    /// No pair can.
    All,
    /// These pairs cannot, either way (each stored as given).
    Pairs(Vec<(i32, i32)>),
}

impl NoPeer {
    /// Parses `all`, or pairs `a:b` separated by commas (`0:1,2:3`); blanks are ignored and
    /// an empty value is [`NoPeer::None`]. Ordinals are not checked against the device count
    /// here: a pair naming a device that does not exist changes nothing.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::None);
        }
        if text.eq_ignore_ascii_case("all") {
            return Ok(Self::All);
        }
        let mut pairs = Vec::new();
        for item in text.split(',') {
            let item = item.trim();
            let (a, b) = item
                .split_once(':')
                .ok_or_else(|| format!("expected a pair `a:b`, found {item:?}"))?;
            let ordinal = |s: &str| {
                s.trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (0..64).contains(n))
                    .ok_or_else(|| format!("expected a device ordinal from 0 to 63, found {s:?}"))
            };
            pairs.push((ordinal(a)?, ordinal(b)?));
        }
        Ok(Self::Pairs(pairs))
    }

    /// The setting from the environment: [`NoPeer::None`] when unset or unreadable (with a
    /// word on stderr).
    pub(crate) fn from_env() -> Self {
        let Ok(v) = std::env::var("CUDA_SIM_NO_PEER") else {
            return Self::None;
        };
        Self::parse(&v).unwrap_or_else(|why| {
            eprintln!(
                "cuda-sim: ignoring CUDA_SIM_NO_PEER={v:?}: {why} (or `all`); every pair of \
                 devices can access each other"
            );
            Self::None
        })
    }

    /// Whether `dev` can access `peer`'s memory directly: never a device itself (the driver
    /// answers 0 for a device with itself), every other pair unless listed.
    pub(crate) fn can_access(&self, dev: i32, peer: i32) -> bool {
        if dev == peer {
            return false;
        }
        match self {
            Self::None => true,
            Self::All => false,
            Self::Pairs(pairs) => !pairs
                .iter()
                .any(|&(a, b)| (a, b) == (dev, peer) || (b, a) == (dev, peer)),
        }
    }
}

impl State {
    /// Whether memory of allocation `a` is reachable by a kernel running in context `ctx`:
    /// memory of its own device, or of a context to which `ctx` has enabled peer access.
    fn reaches(&self, ctx: Handle, a: &Alloc) -> bool {
        let Some(c) = self.contexts.get(&ctx) else {
            return true;
        };
        c.device == a.device || self.peers.contains(&(ctx, a.ctx))
    }

    /// Reports a kernel launch described as `op`, running in context `ctx`, that reaches
    /// allocation `a` of another device without peer access enabled to the allocation's
    /// context: a GPU faults on such an access (`CUDA_ERROR_ILLEGAL_ADDRESS`, sticky, at a
    /// later synchronization). The launch itself goes on, as on a GPU.
    pub(crate) fn check_peer_reach(&mut self, ctx: Handle, a: &Alloc, op: &str) {
        if self.reaches(ctx, a) {
            return;
        }
        let device = self.contexts.get(&ctx).map_or(-1, |c| c.device);
        self.checker.misuse(format!(
            "{op} in context {ctx:#x} (device {device}) reaches allocation #{} at {:#x} of \
             device {} (context {:#x}) without peer access enabled from that context to it \
             (cuCtxEnablePeerAccess); a GPU faults (CUDA_ERROR_ILLEGAL_ADDRESS)",
            a.id, a.base, a.device, a.ctx
        ));
    }

    /// Forgets the peer access to and from a context being destroyed.
    pub(crate) fn forget_peers(&mut self, ctx: Handle) {
        self.peers.retain(|&(from, to)| from != ctx && to != ctx);
    }
}

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
        let me = state().current()?;
        ops::enable_peer_access(me, peer as Handle, flags)
    }

    /// Disables the access from the current context to `peer` that `cuCtxEnablePeerAccess`
    /// enabled: `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` if it is not enabled,
    /// `CUDA_ERROR_INVALID_CONTEXT` with no current context or for a `peer` that is not a live
    /// context.
    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        let me = state().current()?;
        ops::disable_peer_access(me, peer as Handle)
    }
}

#[cfg(test)]
mod tests {
    use super::NoPeer;

    #[test]
    fn the_setting_reads_all_pairs_or_nothing() {
        assert_eq!(NoPeer::parse(""), Ok(NoPeer::None));
        assert_eq!(NoPeer::parse(" ALL "), Ok(NoPeer::All));
        assert_eq!(
            NoPeer::parse("0:1, 2 : 3"),
            Ok(NoPeer::Pairs(vec![(0, 1), (2, 3)]))
        );
        assert!(NoPeer::parse("0-1").unwrap_err().contains("a pair `a:b`"));
        assert!(NoPeer::parse("0:64").unwrap_err().contains("from 0 to 63"));
    }

    #[test]
    fn a_device_never_accesses_itself_as_a_peer_and_listed_pairs_never_either_way() {
        let none = NoPeer::None;
        assert!(!none.can_access(1, 1));
        assert!(none.can_access(0, 1) && none.can_access(1, 0));
        assert!(!NoPeer::All.can_access(0, 1));
        let pairs = NoPeer::parse("1:2").unwrap();
        assert!(!pairs.can_access(1, 2) && !pairs.can_access(2, 1));
        assert!(pairs.can_access(0, 2) && pairs.can_access(2, 0) && pairs.can_access(3, 1));
    }
}
