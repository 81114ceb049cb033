//! What a copy or a memset asks for, as the faces name it and as graph nodes keep it.

use cudarc::driver::sys::CUdeviceptr;

/// One side of a copy as the caller named it.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Device(CUdeviceptr),
    Host(usize),
}

/// A copy of `height` rows of `width` bytes; pitches in bytes.
#[derive(Clone, Copy)]
pub(crate) struct CopyRequest {
    pub(crate) src: Side,
    pub(crate) src_pitch: usize,
    pub(crate) dst: Side,
    pub(crate) dst_pitch: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
}

pub(crate) fn linear(src: Side, dst: Side, bytes: usize) -> CopyRequest {
    CopyRequest {
        src,
        src_pitch: bytes,
        dst,
        dst_pitch: bytes,
        width: bytes,
        height: 1,
    }
}

/// A memset of `height` rows of `n` values of `size` bytes (1 or 4), rows `pitch` bytes apart.
#[derive(Clone, Copy)]
pub(crate) struct Fill {
    pub(crate) value: u32,
    pub(crate) size: usize,
    pub(crate) n: usize,
    pub(crate) pitch: usize,
    pub(crate) height: usize,
}

impl Fill {
    /// Bytes per row and bytes from the first to one past the last (`None` on overflow).
    pub(crate) fn extent(&self) -> Option<(usize, usize)> {
        let width = self.n.checked_mul(self.size)?;
        let extent = (self.height - 1)
            .checked_mul(self.pitch)
            .and_then(|rows| rows.checked_add(width))?;
        Some((width, extent))
    }
}

pub(crate) fn fill_1d(value: u32, size: usize, n: usize) -> Fill {
    Fill {
        value,
        size,
        n,
        pitch: n * size,
        height: 1,
    }
}

pub(crate) fn fill_2d(value: u32, size: usize, pitch: usize, n: usize, height: usize) -> Fill {
    Fill {
        value,
        size,
        n,
        pitch,
        height,
    }
}
