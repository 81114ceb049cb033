//! Strided copies into compact row-major memory, as a sequence of 2-D block copies.
//!
//! A copy requested with `copy=True` or `dl_device` (parameters of the array API's
//! [`__dlpack__`]) turns any valid strided layout into a compact row-major one. [`StridedCopy`]
//! describes that copy as *blocks* shaped like the driver's 2-D copy (`cuMemcpy2D`: `height`
//! rows of `width` bytes, rows `src_pitch` bytes apart in the source, packed in the
//! destination), so the host and CUDA copies share one plan: the host copy (`engine::host`) runs each row as a
//! `memcpy`, the CUDA copy enqueues one driver call per block on the consumer's stream.
//!
//! The plan merges the trailing axes that are contiguous in the source into one row, takes as
//! the rows of a block the remaining axis of largest extent whose source and destination
//! strides are legal pitches (non-negative, at least the row width, at most `max_pitch`), and
//! steps the other axes one block at a time. So a contiguous tensor is one block; a column
//! slice, a transposed matrix or a matrix with reversed columns is one block per index of the
//! other axis; only a reversed or broadcast vector comes down to one block per element. The
//! plan is pure: it reads no memory.
//!
//! [`__dlpack__`]: https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html

use crate::tensor::layout::LayoutError;

/// Refuses a compact copy of `shape` (elements of `element_bytes`) whose bytes would not fit
/// in `isize` ([`LayoutError::CopyTooLarge`], `numel` saturated at `usize::MAX`).
fn check_copy_bytes(shape: &[i64], element_bytes: usize) -> Result<(), LayoutError> {
    let numel = shape.iter().try_fold(1usize, |acc, &e| {
        usize::try_from(e).ok().and_then(|e| acc.checked_mul(e))
    });
    let fits = numel
        .and_then(|n| n.checked_mul(element_bytes))
        .is_some_and(|bytes| bytes <= isize::MAX as usize);
    if fits {
        Ok(())
    } else {
        Err(LayoutError::CopyTooLarge {
            numel: numel.unwrap_or(usize::MAX),
            element_bytes,
        })
    }
}

/// One 2-D block of a [`StridedCopy`], all in bytes: `height` rows of `width` bytes; row `r`
/// is read at `src + r * src_pitch` (relative to the source's first element) and written at
/// `dst + r * dst_pitch` (relative to the start of the destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    /// Offset of the first row in the source, in bytes, relative to element `(0, ..., 0)`.
    pub src: isize,
    /// Offset of the first row in the destination, in bytes.
    pub dst: usize,
    /// Bytes per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Distance between rows in the source, in bytes (`>= width` when `height > 1`).
    pub src_pitch: usize,
    /// Distance between rows in the destination, in bytes (`>= width` when `height > 1`).
    pub dst_pitch: usize,
}

/// The blocks that copy a strided tensor into compact row-major memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StridedCopy {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) src_pitch: usize,
    pub(crate) dst_pitch: usize,
    /// Remaining axes, outermost first: (extent, source stride, destination stride), strides
    /// in bytes; every extent `>= 2`.
    pub(crate) outer: Vec<(usize, isize, usize)>,
    /// Whether the tensor has no elements (no blocks at all).
    pub(crate) empty: bool,
    /// For a host plan: the moving axes, outermost first, as (extent, source stride in bytes),
    /// and the element size, which the host engine (`engine::host`) copies with loops of its own
    /// rather than block by block.
    pub(crate) host: Option<(Vec<(usize, isize)>, usize)>,
}

impl StridedCopy {
    /// Plans the copy of a tensor of `shape` (elements) and `strides` (elements, one per axis)
    /// whose elements are `element_bytes` bytes, into `numel * element_bytes` compact bytes, for
    /// a copy engine (few blocks): the rows of a block are the legal axis of largest extent.
    /// Row pitches above `max_pitch` bytes are split into rows of their own.
    ///
    /// The layout must be valid (as [`crate::tensor::layout::validate`] checks): every
    /// `(extent - 1) * |stride| * element_bytes` of an axis with `extent >= 2` fits in `isize`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::CopyTooLarge`] when the compact copy has more than `isize::MAX` bytes: a
    /// valid layout can describe more elements than memory holds (a stride-0 broadcast of one
    /// element), and no allocation could hold its copy.
    pub(crate) fn new(
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
        max_pitch: usize,
    ) -> Result<Self, LayoutError> {
        check_copy_bytes(shape, element_bytes)?;
        Ok(Self::plan(shape, strides, element_bytes, max_pitch, false))
    }

    /// As [`StridedCopy::new`], for the host: the destination is written in order (the rows of
    /// a block are the axis just outside the row, when legal), which caches favour.
    ///
    /// # Errors
    ///
    /// As [`StridedCopy::new`].
    pub(crate) fn for_host(
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
    ) -> Result<Self, LayoutError> {
        check_copy_bytes(shape, element_bytes)?;
        Ok(Self::plan(shape, strides, element_bytes, usize::MAX, true))
    }

    /// This copy planned for the host ([`StridedCopy::for_host`]): `shape` and `strides` are
    /// the ones it was planned for, whose size was checked then.
    #[cfg(feature = "cuda")]
    pub(crate) fn in_host_order(&self, shape: &[i64], strides: &[i64]) -> Self {
        let numel: usize = shape.iter().map(|&e| e as usize).product();
        let element_bytes = self.bytes().checked_div(numel).unwrap_or(1);
        let host = Self::plan(shape, strides, element_bytes, usize::MAX, true);
        debug_assert_eq!(host.bytes(), self.bytes());
        host
    }

    /// Plans the copy; its bytes fit in `isize` ([`check_copy_bytes`]).
    fn plan(
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
        max_pitch: usize,
        in_order: bool,
    ) -> Self {
        debug_assert_eq!(shape.len(), strides.len());
        let empty = shape.contains(&0);
        // Axes of extent 1 never move; axes of extent >= 2 have a byte stride that fits (valid
        // layout). Extents fit in `usize`: they are factors of a validated element count. The
        // destination strides are compact row-major over the moving axes, which is the same as
        // over all axes.
        let mut axes: Vec<(usize, isize, usize)> = Vec::new();
        if !empty {
            let mut dst = element_bytes;
            for (&extent, &stride) in shape.iter().zip(strides).rev() {
                if extent > 1 {
                    let extent = extent as usize;
                    axes.push((extent, stride as isize * element_bytes as isize, dst));
                    dst *= extent;
                }
            }
            axes.reverse();
        }
        let host = in_order.then(|| {
            let moving = axes.iter().map(|&(extent, src, _)| (extent, src)).collect();
            (moving, element_bytes)
        });
        let mut width = element_bytes;
        while let Some(&(extent, stride, _)) = axes.last() {
            if stride != width as isize {
                break;
            }
            // The merged row is inside the tensor's span, so it fits.
            width *= extent;
            axes.pop();
        }
        // The rows of a block: the legal axis of largest extent (the innermost on a tie), or
        // in destination order the axis just outside the row.
        let legal = |&(_, src, dst): &(usize, isize, usize)| {
            src >= width as isize && src as usize <= max_pitch && dst <= max_pitch
        };
        let rows = if in_order {
            axes.len().checked_sub(1).filter(|&last| legal(&axes[last]))
        } else {
            axes.iter()
                .enumerate()
                .rev()
                .filter(|(_, axis)| legal(axis))
                .max_by_key(|(axis, (extent, _, _))| (*extent, *axis))
                .map(|(axis, _)| axis)
        };
        let (height, src_pitch, dst_pitch) = match rows {
            Some(axis) => {
                let (extent, src, dst) = axes.remove(axis);
                (extent, src as usize, dst)
            }
            None => (1, width, width),
        };
        Self {
            width,
            height,
            src_pitch,
            dst_pitch,
            outer: axes,
            empty,
            host,
        }
    }

    /// Number of blocks: the product of the extents of the axes not merged into a block.
    pub(crate) fn blocks(&self) -> usize {
        if self.empty {
            return 0;
        }
        self.outer.iter().map(|&(extent, _, _)| extent).product()
    }

    /// Bytes written to the destination: `numel * element_bytes`.
    pub(crate) fn bytes(&self) -> usize {
        self.blocks() * self.width * self.height
    }

    /// Calls `f` with every block; stops at the first error.
    pub(crate) fn try_for_each_block<E>(
        &self,
        mut f: impl FnMut(Block) -> Result<(), E>,
    ) -> Result<(), E> {
        let count = self.blocks();
        let mut index = vec![0usize; self.outer.len()];
        let (mut src, mut dst): (isize, usize) = (0, 0);
        for _ in 0..count {
            f(Block {
                src,
                dst,
                width: self.width,
                height: self.height,
                src_pitch: self.src_pitch,
                dst_pitch: self.dst_pitch,
            })?;
            // Odometer step over the outer axes, innermost fastest. Every running offset is
            // that of an element of the tensor (of the destination), inside its span.
            for (axis, &(extent, src_stride, dst_stride)) in self.outer.iter().enumerate().rev() {
                if index[axis] + 1 < extent {
                    index[axis] += 1;
                    src += src_stride;
                    dst += dst_stride;
                    break;
                }
                src -= src_stride * index[axis] as isize;
                dst -= dst_stride * index[axis];
                index[axis] = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod size_tests {
    use super::StridedCopy;
    use crate::tensor::layout::LayoutError;

    #[test]
    fn a_copy_whose_bytes_do_not_fit_in_isize_is_refused() {
        let too_large = |numel, element_bytes| {
            Err::<StridedCopy, _>(LayoutError::CopyTooLarge {
                numel,
                element_bytes,
            })
        };
        // One element broadcast 2^62 times: a valid layout, 2^64 bytes of copy.
        assert_eq!(
            StridedCopy::new(&[1 << 62], &[0], 4, usize::MAX),
            too_large(1 << 62, 4)
        );
        assert_eq!(
            StridedCopy::for_host(&[1 << 58, 16], &[0, 1], 4),
            too_large(1 << 62, 4)
        );
        // The element count itself overflows: saturated in the error.
        assert_eq!(
            StridedCopy::for_host(&[1 << 40, 1 << 40], &[0, 0], 1),
            too_large(usize::MAX, 1)
        );
        // The largest copy that fits is planned, and so is a copy with no elements.
        let max = isize::MAX as i64;
        assert_eq!(
            StridedCopy::for_host(&[max], &[0], 1).map(|p| p.bytes()),
            Ok(isize::MAX as usize)
        );
        assert_eq!(
            StridedCopy::new(&[1 << 62, 0], &[0, 0], 8, usize::MAX).map(|p| p.bytes()),
            Ok(0)
        );
    }
}
