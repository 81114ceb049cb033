//! Peer access between devices in the model: which memory a kernel running in a context may
//! reach (its device's, or that of a context it has enabled peer access to), and the access
//! forgotten with a destroyed context. Which devices can reach each other at all is a setting
//! (`config::NoPeer`, `CUDA_SIM_NO_PEER`); enabling and disabling are operations (`ops`).
//!
//! Copies between devices (`cuMemcpyPeer`, `cuMemcpyPeerAsync`, and the unified-addressing
//! copies) need no peer access: the driver stages them when the devices cannot reach each
//! other. They are copies like the others (`ops`).

use super::base::Handle;
use super::memory::Alloc;
use super::state::State;

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
