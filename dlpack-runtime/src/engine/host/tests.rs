//! The host engine against a reference, for every kind of plan.

use super::*;
use proptest::prelude::*;

/// The reference: element offsets in row-major order, by plain index arithmetic.
fn reference(shape: &[i64], strides: &[i64], size: usize) -> Vec<isize> {
    let numel: i64 = shape.iter().product();
    let mut out = Vec::new();
    for linear in 0..numel {
        let mut rest = linear;
        let mut offset = 0isize;
        for axis in (0..shape.len()).rev() {
            let i = rest % shape[axis];
            rest /= shape[axis];
            offset += (i * strides[axis]) as isize * size as isize;
        }
        out.push(offset);
    }
    out
}

/// Copies a source buffer of distinct bytes through the plan and through the reference.
fn check(shape: &[i64], strides: &[i64], size: usize, max_pitch: usize) -> StridedCopy {
    check_plan(
        StridedCopy::for_host(shape, strides, size).unwrap(),
        shape,
        strides,
        size,
        usize::MAX,
    );
    check_plan(
        StridedCopy::new(shape, strides, size, max_pitch).unwrap(),
        shape,
        strides,
        size,
        max_pitch,
    )
}

fn check_plan(
    plan: StridedCopy,
    shape: &[i64],
    strides: &[i64],
    size: usize,
    max_pitch: usize,
) -> StridedCopy {
    let offsets = reference(shape, strides, size);
    assert_eq!(plan.bytes(), offsets.len() * size);
    let lo = offsets.iter().copied().min().unwrap_or(0);
    let hi = offsets.iter().copied().max().unwrap_or(0) + size as isize;
    let len = (hi - lo).max(0) as usize;
    // Bytes without a short period, so that no two elements of a test agree by layout.
    let source: Vec<u8> = (0..len as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect();
    let first = (-lo) as usize;
    let expected: Vec<u8> = offsets
        .iter()
        .flat_map(|&o| {
            let at = (first as isize + o) as usize;
            source[at..at + size].iter().copied()
        })
        .collect();
    let mut copied = vec![0u8; plan.bytes()];
    if !copied.is_empty() {
        // SAFETY: `first` is element (0, ..., 0) of a buffer covering every element;
        // `copied` has `bytes()` bytes.
        unsafe { plan.run_on_host(source.as_ptr().add(first), copied.as_mut_ptr()) };
    }
    assert_eq!(
        copied, expected,
        "shape {shape:?} strides {strides:?} size {size}"
    );
    let mut written = 0;
    plan.try_for_each_block(|b| {
        assert!(
            b.height == 1
                || b.src_pitch >= b.width
                    && b.src_pitch <= max_pitch
                    && b.dst_pitch >= b.width
                    && b.dst_pitch <= max_pitch
        );
        written += b.width * b.height;
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(written, plan.bytes());
    plan
}

#[test]
fn contiguous_is_one_block() {
    let plan = check(&[4, 3, 2], &[6, 2, 1], 4, usize::MAX);
    assert_eq!(plan.blocks(), 1);
    assert_eq!((plan.width, plan.height), (96, 1));
}

#[test]
fn column_slice_is_one_block_of_rows() {
    // x[:, :2] of a 5x8 matrix: rows of 2 elements, 8 apart.
    let plan = check(&[5, 2], &[8, 1], 8, usize::MAX);
    assert_eq!(plan.blocks(), 1);
    assert_eq!((plan.width, plan.height, plan.src_pitch), (16, 5, 64));
}

#[test]
fn transposed_matrix_is_a_block_per_row() {
    let plan = check(&[3, 4], &[1, 3], 2, usize::MAX);
    assert_eq!((plan.width, plan.height, plan.src_pitch), (2, 4, 6));
    assert_eq!(plan.blocks(), 3);
}

#[test]
fn host_plans_write_in_destination_order() {
    // Reversed columns: no legal row axis just outside the row, so element by element, in
    // order.
    let plan = StridedCopy::for_host(&[5, 8], &[8, -1], 4).unwrap();
    assert_eq!((plan.height, plan.blocks()), (1, 40));
    let mut last = None;
    plan.try_for_each_block(|b| {
        assert!(last.is_none_or(|l| b.dst > l));
        last = Some(b.dst);
        Ok::<(), ()>(())
    })
    .unwrap();
    // A column slice: rows just outside the row.
    let plan = StridedCopy::for_host(&[5, 2], &[8, 1], 8).unwrap();
    assert_eq!((plan.width, plan.height, plan.dst_pitch), (16, 5, 16));
}

#[test]
fn reversed_columns_are_a_block_per_column() {
    // x[:, ::-1] of a 5x8 matrix: one block of 5 rows per column.
    let plan = check(&[5, 8], &[8, -1], 4, usize::MAX);
    assert_eq!(
        (plan.width, plan.height, plan.src_pitch, plan.dst_pitch),
        (4, 5, 32, 32)
    );
    assert_eq!(plan.blocks(), 8);
    // The longer axis gives the rows.
    let plan = check(&[3, 5, 8], &[40, 8, -1], 4, usize::MAX);
    assert_eq!((plan.height, plan.blocks()), (5, 24));
}

#[test]
fn pitch_limit_splits_rows() {
    let plan = check(&[3, 2], &[1000, 1], 4, 3999);
    assert_eq!((plan.height, plan.blocks()), (1, 3));
    let plan = check(&[3, 2], &[1000, 1], 4, 4000);
    assert_eq!((plan.height, plan.blocks()), (3, 1));
}

#[test]
fn reversed_and_broadcast_axes_copy_element_by_element() {
    let plan = check(&[4], &[-1], 4, usize::MAX);
    assert_eq!(plan.blocks(), 4);
    // A broadcast row: its rows cannot overlap in a 2-D copy.
    let plan = check(&[3, 4], &[0, 1], 4, usize::MAX);
    assert_eq!((plan.blocks(), plan.width), (3, 16));
    check(&[3, 4], &[1, 0], 4, usize::MAX);
}

#[test]
fn empty_and_scalar() {
    assert_eq!(check(&[3, 0, 2], &[0, 2, 1], 4, usize::MAX).blocks(), 0);
    let scalar = check(&[], &[], 8, usize::MAX);
    assert_eq!((scalar.blocks(), scalar.bytes()), (1, 8));
    // Extent-1 axes with any stride are skipped.
    assert_eq!(
        check(&[1, 5, 1], &[i64::MAX, 1, -7], 1, usize::MAX).blocks(),
        1
    );
}

#[test]
fn large_transposes_and_reversals_copy_like_the_reference() {
    // Several tiles, with partial tiles at the edges.
    check(&[45, 70], &[1, 45], 4, usize::MAX);
    check(&[3, 33, 65], &[1, 3, 99], 8, usize::MAX);
    check(&[70, 45], &[-45, 1], 2, usize::MAX);
    check(&[40, 90], &[90, -1], 4, usize::MAX);
    check(&[130], &[-1], 16, usize::MAX);
    check(&[30, 3], &[1, 30], 3, usize::MAX);
    check(&[64, 64], &[0, 1], 1, usize::MAX);
    // Transposes of every element size, tiles of one cache line a side (64, 32, 16, 8
    // and 4 elements), with partial tiles in both directions.
    check(&[70, 130], &[1, 70], 1, usize::MAX);
    check(&[40, 50], &[1, 40], 2, usize::MAX);
    check(&[33, 17], &[1, 33], 4, usize::MAX);
    check(&[20, 17], &[1, 20], 8, usize::MAX);
    check(&[9, 11], &[1, 9], 16, usize::MAX);
    check(&[2, 5, 7], &[35, 1, 5], 4, usize::MAX);
}

#[test]
fn transposes_of_whole_vector_tiles_copy_like_the_reference() {
    // Per element size, more than one whole tile of the vector path (sides of 128, 64, 64
    // and 32 elements for 1, 2, 4 and 8 bytes) with strips left on the right and at the
    // bottom; padded, negative and broadcast column strides; planes under an outer axis.
    for (size, side) in [(1usize, 128i64), (2, 64), (4, 64), (8, 32), (16, 4)] {
        if cfg!(miri) {
            // Miri (slow) checks the tiling's reach for one element size: two tiles each way
            // with strips on both sides, and a negative stride (the other sizes differ only
            // in the interleaving instruction and the tile's side).
            if size == 8 {
                let (r, c) = (2 * side + 3, 2 * side + 2);
                check(&[r, c], &[1, -r], size, usize::MAX);
            }
            continue;
        }
        let (r, c) = (2 * side + 13, 2 * side + 7);
        check(&[r, c], &[1, -r], size, usize::MAX);
        check(&[r, c], &[1, r], size, usize::MAX);
        check(&[r, c], &[1, r + 3], size, usize::MAX);
        // Exact multiples of the tile's side: no strips.
        check(&[side, 2 * side], &[1, side], size, usize::MAX);
        // Broadcast and overlapping columns.
        let (r, c) = (side + 5, side + 3);
        check(&[side, side], &[1, 0], size, usize::MAX);
        check(&[r, c], &[1, 0], size, usize::MAX);
        check(&[r, c], &[1, 3], size, usize::MAX);
        // Planes under an outer axis, with and without strips.
        check(
            &[2, side, 2 * side],
            &[2 * side * side, 1, side],
            size,
            usize::MAX,
        );
        check(&[2, r, c], &[r * c, 1, r], size, usize::MAX);
    }
}

proptest! {
    #[test]
    fn every_layout_copies_like_the_reference(
        axes in proptest::collection::vec((0i64..5, -7i64..8), 0..5),
        size in prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        max_pitch in prop::sample::select(vec![usize::MAX, 64, 7]),
    ) {
        let (shape, strides): (Vec<i64>, Vec<i64>) = axes.into_iter().unzip();
        check(&shape, &strides, size, max_pitch);
    }

    #[test]
    #[cfg_attr(miri, ignore = "large copies; Miri runs the fixed cases of transposes_of_whole_vector_tiles_copy_like_the_reference")]
    fn every_transpose_copies_like_the_reference(
        rows in 0i64..300,
        cols in 0i64..300,
        pad in 0i64..3,
        reversed in any::<bool>(),
        size in prop::sample::select(vec![1usize, 2, 4, 8, 16]),
    ) {
        let col_stride = (rows + pad) * if reversed { -1 } else { 1 };
        check(&[rows, cols], &[1, col_stride], size, usize::MAX);
    }
}
