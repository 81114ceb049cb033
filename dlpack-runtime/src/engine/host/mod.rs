//! The host copy engine, which runs a [`StridedCopy`] plan on host memory.
//!
//! The host's own copy loops: a contiguous row is one `memcpy`; a row whose elements are apart
//! (reversed, strided, broadcast) is a typed gather the compiler can vectorize; a transpose (the
//! next axis out is contiguous in the source) is copied in square tiles, so that reads and
//! writes both stay within a few cache lines: on x86-64, whole tiles of 1- to 8-byte elements
//! are transposed in SSE2 registers, the rest element by element.

use crate::plan::copy::StridedCopy;

impl StridedCopy {
    /// Runs the copy on the host.
    ///
    /// # Safety
    ///
    /// `src` points to element `(0, ..., 0)` of host-readable memory laid out as the shape and
    /// strides this plan was made from; `dst` is writable for [`Self::bytes`] bytes and does not
    /// overlap the source.
    pub(crate) unsafe fn run_on_host(&self, src: *const u8, dst: *mut u8) {
        if let Some((axes, element_bytes)) = &self.host {
            if !self.empty {
                // SAFETY: forwarded from the caller; `axes` are the moving axes of the layout.
                unsafe { loops::copy(axes, *element_bytes, src, dst) };
            }
            return;
        }
        let _ = self.try_for_each_block(|block| {
            for row in 0..block.height {
                // SAFETY: row `row` of a block addresses `width` bytes of elements of the
                // tensor (the plan covers exactly its elements) and `width` bytes inside the
                // destination's `bytes()` (caller); the two do not overlap (caller).
                unsafe {
                    copy_row(
                        src.offset(block.src + (row * block.src_pitch) as isize),
                        dst.add(block.dst + row * block.dst_pitch),
                        block.width,
                    );
                }
            }
            Ok::<(), core::convert::Infallible>(())
        });
    }
}

/// Copies `width` bytes; the widths of single elements are copied as fixed-size values.
///
/// # Safety
///
/// As `ptr::copy_nonoverlapping(src, dst, width)`; no alignment is required.
#[inline(always)]
unsafe fn copy_row(src: *const u8, dst: *mut u8, width: usize) {
    /// # Safety
    ///
    /// `src` readable and `dst` writable for `N` bytes, not overlapping.
    #[inline(always)]
    unsafe fn fixed<const N: usize>(src: *const u8, dst: *mut u8) {
        // SAFETY: caller; unaligned accesses of a byte array.
        unsafe {
            dst.cast::<[u8; N]>()
                .write_unaligned(src.cast::<[u8; N]>().read_unaligned())
        }
    }
    // SAFETY: caller, for each width.
    unsafe {
        match width {
            1 => fixed::<1>(src, dst),
            2 => fixed::<2>(src, dst),
            4 => fixed::<4>(src, dst),
            8 => fixed::<8>(src, dst),
            16 => fixed::<16>(src, dst),
            _ => core::ptr::copy_nonoverlapping(src, dst, width),
        }
    }
}

/// The loops and kernels of the engine.
mod loops {
    /// A cache line, in bytes: the tile edge of a transpose's element-by-element part.
    const LINE: usize = 64;

    /// Copies the elements of the layout with moving `axes` (extent >= 2, outermost first;
    /// source strides in bytes) and elements of `size` bytes from `src` (element `(0, ..., 0)`)
    /// to compact row-major `dst`.
    ///
    /// # Safety
    ///
    /// As [`super::StridedCopy::run_on_host`]: `src` and the strides describe readable elements
    /// of a valid layout; `dst` is writable for all of them and does not overlap the source.
    pub(super) unsafe fn copy(axes: &[(usize, isize)], size: usize, src: *const u8, dst: *mut u8) {
        // SAFETY: forwarded, with the element type of `size` bytes.
        unsafe {
            match size {
                1 => typed::<u8>(axes, src, dst),
                2 => typed::<u16>(axes, src, dst),
                4 => typed::<u32>(axes, src, dst),
                8 => typed::<u64>(axes, src, dst),
                16 => typed::<u128>(axes, src, dst),
                _ => bytes(axes, size, src, dst),
            }
        }
    }

    /// [`copy`] for elements of `size_of::<T>()` bytes, read and written unaligned.
    ///
    /// # Safety
    ///
    /// As [`copy`].
    unsafe fn typed<T: Copy>(axes: &[(usize, isize)], src: *const u8, dst: *mut u8) {
        let size = core::mem::size_of::<T>() as isize;
        // Trailing axes contiguous in the source are one row of `row` elements.
        let mut row = 1usize;
        let mut rest = axes;
        while let Some((&(extent, stride), outer)) = rest.split_last() {
            if stride != size * row as isize {
                break;
            }
            row *= extent;
            rest = outer;
        }
        if row > 1 || rest.is_empty() {
            // Rows of `row` contiguous elements.
            let width = row * size as usize;
            // SAFETY: each step addresses one row of the layout and its place in `dst`.
            unsafe {
                each(rest, width, src, dst, &mut |s, d| {
                    core::ptr::copy_nonoverlapping(s, d, width)
                })
            };
            return;
        }
        let (&(n0, s0), outer) = rest.split_last().unwrap_or((&(1, size), &[]));
        if let Some((&(n1, s1), outermost)) = outer.split_last() {
            if s1 == size {
                // A transpose: the next axis out is contiguous in the source.
                let plane = n1 * n0 * size as usize;
                // SAFETY: each step addresses one plane of the layout and its place in `dst`.
                unsafe {
                    each(outermost, plane, src, dst, &mut |s, d| {
                        transpose::<T>(s, s0, d, n1, n0)
                    })
                };
                return;
            }
        }
        let width = n0 * size as usize;
        // SAFETY: each step addresses one strided row of the layout and its place in `dst`.
        unsafe {
            each(outer, width, src, dst, &mut |s, d| {
                if s0 == -size {
                    reversed::<T>(s, d, n0)
                } else {
                    gather::<T>(s, s0, d, n0)
                }
            })
        };
    }

    /// Calls `f(src, dst)` for every index of `axes` (outermost first), `src` at the element of
    /// that index and `dst` at `width` bytes per index, in row-major order.
    ///
    /// # Safety
    ///
    /// The offsets reached are those of the layout's elements (valid layout, caller).
    unsafe fn each(
        axes: &[(usize, isize)],
        width: usize,
        src: *const u8,
        dst: *mut u8,
        f: &mut dyn FnMut(*const u8, *mut u8),
    ) {
        let count: usize = axes.iter().map(|&(extent, _)| extent).product();
        let mut index = vec![0usize; axes.len()];
        let mut offset: isize = 0;
        for step in 0..count {
            // SAFETY: `offset` is that of an element of the layout (odometer below); `dst` has
            // `count * width` bytes (caller).
            unsafe { f(src.offset(offset), dst.add(step * width)) };
            for (axis, &(extent, stride)) in axes.iter().enumerate().rev() {
                if index[axis] + 1 < extent {
                    index[axis] += 1;
                    offset += stride;
                    break;
                }
                offset -= stride * index[axis] as isize;
                index[axis] = 0;
            }
        }
    }

    /// `n` elements `stride` bytes apart, gathered into `dst`.
    ///
    /// # Safety
    ///
    /// The `n` source elements are readable, `dst` writable for `n` elements.
    #[inline(always)]
    unsafe fn gather<T: Copy>(src: *const u8, stride: isize, dst: *mut u8, n: usize) {
        let dst = dst.cast::<T>();
        for i in 0..n {
            // SAFETY: caller.
            unsafe {
                let v = src.offset(i as isize * stride).cast::<T>().read_unaligned();
                dst.add(i).write_unaligned(v);
            }
        }
    }

    /// `n` elements stored backwards from `src` (stride of minus one element), into `dst`.
    ///
    /// # Safety
    ///
    /// As [`gather`], with the stride of minus one element.
    #[inline(always)]
    unsafe fn reversed<T: Copy>(src: *const u8, dst: *mut u8, n: usize) {
        let (src, dst) = (src.cast::<T>(), dst.cast::<T>());
        for i in 0..n {
            // SAFETY: caller: elements `src - i` for `i < n` are readable.
            unsafe { dst.add(i).write_unaligned(src.sub(i).read_unaligned()) };
        }
    }

    /// The `rows x cols` plane whose source rows are contiguous (`src` row `r`, column `c` at
    /// `src + r * size_of::<T>() + c * col_stride`), written row-major to `dst`.
    ///
    /// Whole tiles go through the target's vector shuffles where it has them ([`simd`]); what
    /// they leave (a strip on the right and one at the bottom, or the whole plane) goes element
    /// by element through [`lines`].
    ///
    /// # Safety
    ///
    /// Every element of the plane is readable; `dst` writable for `rows * cols` elements.
    unsafe fn transpose<T: Copy>(
        src: *const u8,
        col_stride: isize,
        dst: *mut u8,
        rows: usize,
        cols: usize,
    ) {
        let size = core::mem::size_of::<T>();
        // SAFETY: forwarded (caller).
        let (tiled_rows, tiled_cols) =
            unsafe { simd::tiles::<T>(src, col_stride, dst, rows, cols) };
        debug_assert!(tiled_rows <= rows && tiled_cols <= cols);
        if tiled_rows > 0 && tiled_cols < cols {
            // SAFETY: the right strip, rows `0..tiled_rows` and columns `tiled_cols..cols`: part
            // of the plane (caller), from its element `(0, tiled_cols)` in the source and in
            // `dst`, whose rows stay `cols` apart.
            unsafe {
                lines::<T>(
                    src.offset(tiled_cols as isize * col_stride),
                    col_stride,
                    dst.add(tiled_cols * size),
                    (tiled_rows, cols - tiled_cols),
                    cols,
                )
            };
        }
        if tiled_rows < rows {
            // SAFETY: the bottom strip, rows `tiled_rows..rows` and every column: part of the
            // plane (caller), from its element `(tiled_rows, 0)`.
            unsafe {
                lines::<T>(
                    src.add(tiled_rows * size),
                    col_stride,
                    dst.add(tiled_rows * cols * size),
                    (rows - tiled_rows, cols),
                    cols,
                )
            };
        }
    }

    /// [`transpose`] of a `rows x cols` part of a plane, written to `dst` with rows `dst_row`
    /// elements apart, in tiles of one cache line by one cache line.
    ///
    /// Each tile is read a source line at a time (contiguous along `r`) into a buffer that stays
    /// in L1, then written a destination line at a time. Walking the plane directly instead
    /// touches, per tile, a line of each of many rows a power of two apart, which share one
    /// cache set and evict each other before they are used again.
    ///
    /// # Safety
    ///
    /// Every element of the part is readable (source element `(r, c)` as in [`transpose`]);
    /// for each `r < rows`, `dst` is writable for `cols` elements from element `r * dst_row`.
    unsafe fn lines<T: Copy>(
        src: *const u8,
        col_stride: isize,
        dst: *mut u8,
        (rows, cols): (usize, usize),
        dst_row: usize,
    ) {
        /// A tile: up to `LINE x LINE` bytes' worth of elements, `LINE / size` on a side.
        #[repr(C, align(64))]
        struct Tile([core::mem::MaybeUninit<u8>; LINE * LINE]);
        let size = core::mem::size_of::<T>();
        // Elements per cache line: 64 to 4 for the element sizes of `copy` (1 to 16 bytes).
        debug_assert!((1..=16).contains(&size));
        if rows == 0 || cols == 0 {
            return;
        }
        let edge = LINE / size;
        let mut tile = Tile([core::mem::MaybeUninit::uninit(); LINE * LINE]);
        let buf = tile.0.as_mut_ptr().cast::<T>();
        let (src, dst) = (src.cast::<T>(), dst.cast::<T>());
        let col_stride = col_stride / size as isize;
        for r0 in (0..rows).step_by(edge) {
            let tr = edge.min(rows - r0);
            for c0 in (0..cols).step_by(edge) {
                let tc = edge.min(cols - c0);
                for c in 0..tc {
                    // SAFETY: column `c0 + c`, rows `r0..r0 + tr`: elements of the plane, read
                    // contiguously into the tile's row `c` (caller; `c * edge + r < edge *
                    // edge`).
                    unsafe {
                        let column = src.offset(r0 as isize + (c0 + c) as isize * col_stride);
                        let line = buf.add(c * edge);
                        for r in 0..tr {
                            line.add(r).write_unaligned(column.add(r).read_unaligned());
                        }
                    }
                }
                for r in 0..tr {
                    // SAFETY: row `r0 + r`, columns `c0..c0 + tc` of `dst` (caller), from the
                    // tile's column `r`, written above for rows `0..tc`.
                    unsafe {
                        let row = dst.add((r0 + r) * dst_row + c0);
                        for c in 0..tc {
                            row.add(c)
                                .write_unaligned(buf.add(c * edge + r).read_unaligned());
                        }
                    }
                }
            }
        }
    }

    /// Whole tiles of a transpose in 16-byte vectors: SSE2, part of every x86-64 target.
    #[cfg(target_arch = "x86_64")]
    mod simd {
        use core::arch::x86_64::{
            __m128i, _MM_HINT_T0, _mm_loadu_si128, _mm_prefetch, _mm_storeu_si128,
            _mm_unpackhi_epi8, _mm_unpackhi_epi16, _mm_unpackhi_epi32, _mm_unpackhi_epi64,
            _mm_unpacklo_epi8, _mm_unpacklo_epi16, _mm_unpacklo_epi32, _mm_unpacklo_epi64,
        };
        use core::mem::MaybeUninit;

        /// A lane width: how two vectors interleave their low or high halves, lane by lane.
        trait Lanes {
            /// `[a0, b0, a1, b1, ...]` from the low halves of `a` and `b`.
            fn lo(a: __m128i, b: __m128i) -> __m128i;
            /// The same from the high halves.
            fn hi(a: __m128i, b: __m128i) -> __m128i;
        }

        macro_rules! lanes {
            ($name:ident, $lo:ident, $hi:ident) => {
                struct $name;
                impl Lanes for $name {
                    #[inline(always)]
                    fn lo(a: __m128i, b: __m128i) -> __m128i {
                        // SAFETY: SSE2 is enabled on every x86-64 target; no memory is read.
                        #[allow(unused_unsafe)]
                        unsafe {
                            $lo(a, b)
                        }
                    }
                    #[inline(always)]
                    fn hi(a: __m128i, b: __m128i) -> __m128i {
                        // SAFETY: as `lo`.
                        #[allow(unused_unsafe)]
                        unsafe {
                            $hi(a, b)
                        }
                    }
                }
            };
        }
        lanes!(L8, _mm_unpacklo_epi8, _mm_unpackhi_epi8);
        lanes!(L16, _mm_unpacklo_epi16, _mm_unpackhi_epi16);
        lanes!(L32, _mm_unpacklo_epi32, _mm_unpackhi_epi32);
        lanes!(L64, _mm_unpacklo_epi64, _mm_unpackhi_epi64);

        /// The tile buffer: 16 KiB, within L1 with room for the lines it is written to.
        const BUFFER: usize = 16 * 1024;

        /// Copies the largest part of the plane made of whole tiles, rows `0..tiled_rows` and
        /// columns `0..tiled_cols`, and returns `(tiled_rows, tiled_cols)`; `(0, 0)` when either
        /// side of the plane is shorter than a tile's, and for the element sizes without a lane
        /// width (16 bytes: a vector holds one element).
        ///
        /// # Safety
        ///
        /// As [`super::transpose`].
        #[inline(always)]
        pub(super) unsafe fn tiles<T>(
            src: *const u8,
            col_stride: isize,
            dst: *mut u8,
            rows: usize,
            cols: usize,
        ) -> (usize, usize) {
            // Tile sides in elements: lines of 128 or 256 bytes (fewer pages per byte moved),
            // a tile of at most `BUFFER` bytes.
            // SAFETY: forwarded (caller), with lanes of `size_of::<T>()` bytes.
            unsafe {
                match core::mem::size_of::<T>() {
                    1 => tiled::<L8, 16, 128>(src, col_stride, dst, rows, cols),
                    2 => tiled::<L16, 8, 64>(src, col_stride, dst, rows, cols),
                    4 => tiled::<L32, 4, 64>(src, col_stride, dst, rows, cols),
                    8 => tiled::<L64, 2, 32>(src, col_stride, dst, rows, cols),
                    _ => (0, 0),
                }
            }
        }

        /// [`tiles`] for elements of `16 / N` bytes (`N` to a vector) and tiles of `E x E`
        /// elements (`E` a multiple of `N`, `E * E * 16 / N <= BUFFER`).
        ///
        /// Each tile's source lines (`E` elements of one source column, contiguous) are copied
        /// into the buffer, then every `N x N` block of it is transposed in registers: `log2(N)`
        /// rounds of interleaving vector `i` with vector `i + N / 2`, which take lane `j` of
        /// vector `i` to lane `i` of vector `j`. Meanwhile the next tile's source lines are
        /// prefetched: each is a few cache lines of its own page, too short a run for the
        /// hardware prefetcher to follow.
        ///
        /// # Safety
        ///
        /// As [`super::transpose`].
        #[inline(always)]
        unsafe fn tiled<L: Lanes, const N: usize, const E: usize>(
            src: *const u8,
            col_stride: isize,
            dst: *mut u8,
            rows: usize,
            cols: usize,
        ) -> (usize, usize) {
            const { assert!(E % N == 0 && E * E * (16 / N) <= BUFFER) };
            let size = 16 / N;
            let line = E * size;
            let (tiled_rows, tiled_cols) = (rows - rows % E, cols - cols % E);
            if tiled_rows == 0 || tiled_cols == 0 {
                return (0, 0);
            }
            let mut buffer = [MaybeUninit::<__m128i>::uninit(); BUFFER / 16];
            let buf = buffer.as_mut_ptr().cast::<u8>();
            for r0 in (0..tiled_rows).step_by(E) {
                for c0 in (0..tiled_cols).step_by(E) {
                    for c in 0..E {
                        // SAFETY: rows `r0..r0 + E` of source column `c0 + c` (`line`
                        // contiguous bytes, elements of the plane: caller) into buffer row `c`
                        // (`(c + 1) * line <= E * line <= BUFFER`).
                        unsafe {
                            let from =
                                src.offset((r0 * size) as isize + (c0 + c) as isize * col_stride);
                            let to = buf.add(c * line);
                            for k in 0..line / 16 {
                                _mm_storeu_si128(
                                    to.add(k * 16).cast(),
                                    _mm_loadu_si128(from.add(k * 16).cast()),
                                );
                            }
                        }
                    }
                    // The next tile's source lines, fetched while this one is written: a
                    // share of them per block.
                    let next = if c0 + E < tiled_cols {
                        Some((r0, c0 + E))
                    } else if r0 + E < tiled_rows {
                        Some((r0 + E, 0))
                    } else {
                        None
                    };
                    let (lines_per_column, blocks) = (line / 64, (E / N) * (E / N));
                    let mut block_index = 0;
                    for r in (0..E).step_by(N) {
                        for c in (0..E).step_by(N) {
                            if let Some((nr, nc)) = next {
                                let first = block_index * E * lines_per_column / blocks;
                                let end = (block_index + 1) * E * lines_per_column / blocks;
                                for k in first..end {
                                    let (column, at) = (k / lines_per_column, k % lines_per_column);
                                    // SAFETY: rows `nr..nr + E` of source column `nc + column`
                                    // are elements of the plane (`nr + E <= tiled_rows`, `nc +
                                    // column < tiled_cols`); `at * 64 < line`. A prefetch reads
                                    // nothing.
                                    unsafe {
                                        let from = src.offset(
                                            (nr * size) as isize
                                                + (nc + column) as isize * col_stride,
                                        );
                                        _mm_prefetch::<_MM_HINT_T0>(from.add(at * 64).cast());
                                    }
                                }
                            }
                            block_index += 1;
                            // SAFETY: the `N x N` block at buffer row `c`, element `r`
                            // (written above), to rows `r0 + r..r0 + r + N`, columns `c0 + c..c0
                            // + c + N` of `dst`, inside its `rows * cols` elements (caller).
                            unsafe {
                                block::<L, N>(
                                    buf.add(c * line + r * size),
                                    line,
                                    dst.add(((r0 + r) * cols + c0 + c) * size),
                                    cols * size,
                                )
                            };
                        }
                    }
                }
            }
            (tiled_rows, tiled_cols)
        }

        /// Transposes the `N x N` block of `16 / N`-byte elements whose rows are the 16 bytes at
        /// `src + i * src_pitch` into the 16 bytes at `dst + j * dst_pitch`.
        ///
        /// # Safety
        ///
        /// Those `N` source rows are readable and the `N` destination rows writable.
        #[inline(always)]
        unsafe fn block<L: Lanes, const N: usize>(
            src: *const u8,
            src_pitch: usize,
            dst: *mut u8,
            dst_pitch: usize,
        ) {
            // SAFETY: row `i < N` of the source block (caller).
            let mut v: [__m128i; N] =
                core::array::from_fn(|i| unsafe { _mm_loadu_si128(src.add(i * src_pitch).cast()) });
            // `log2(N)` rounds.
            let mut round = 1;
            while round < N {
                v = core::array::from_fn(|j| {
                    let (a, b) = (v[j / 2], v[j / 2 + N / 2]);
                    if j % 2 == 0 { L::lo(a, b) } else { L::hi(a, b) }
                });
                round *= 2;
            }
            for (j, row) in v.iter().enumerate() {
                // SAFETY: row `j < N` of the destination block (caller).
                unsafe { _mm_storeu_si128(dst.add(j * dst_pitch).cast(), *row) };
            }
        }
    }

    /// No vector path for this target: every tile goes through [`super::lines`].
    #[cfg(not(target_arch = "x86_64"))]
    mod simd {
        /// `(0, 0)`: no whole tiles copied.
        ///
        /// # Safety
        ///
        /// None needed; unsafe to match the x86-64 version.
        #[inline(always)]
        #[allow(clippy::extra_unused_type_parameters)] // the x86-64 version's signature
        pub(super) unsafe fn tiles<T>(
            _src: *const u8,
            _col_stride: isize,
            _dst: *mut u8,
            _rows: usize,
            _cols: usize,
        ) -> (usize, usize) {
            (0, 0)
        }
    }

    /// [`copy`] for element sizes without a primitive type: a `memcpy` per element.
    ///
    /// # Safety
    ///
    /// As [`copy`].
    unsafe fn bytes(axes: &[(usize, isize)], size: usize, src: *const u8, dst: *mut u8) {
        // SAFETY: each step addresses one element of the layout and its place in `dst`.
        unsafe {
            each(axes, size, src, dst, &mut |s, d| {
                core::ptr::copy_nonoverlapping(s, d, size)
            })
        };
    }
}

#[cfg(test)]
mod tests;
