//! The overlap test against brute force, and its edge cases.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

/// A float32 layout with strides in elements.
fn f32s(first: usize, shape: &[i64], strides: &[i64]) -> Footprint {
    let bytes: Vec<i64> = strides.iter().map(|s| s * 4).collect();
    Footprint::new(first, shape, &bytes, 4).expect("a non-empty layout")
}

/// Asserts the overlap answer both ways round.
fn check(a: &Footprint, b: &Footprint, expected: bool) {
    assert_eq!(a.overlaps(b), expected, "{a:?} vs {b:?}");
    assert_eq!(b.overlaps(a), expected, "{b:?} vs {a:?}");
}

/// Every byte a layout reaches, by enumerating its elements.
fn bytes_of(first: usize, shape: &[i64], strides: &[i64], element_bytes: usize) -> BTreeSet<usize> {
    let mut bytes = BTreeSet::new();
    if shape.contains(&0) {
        return bytes;
    }
    let mut index = vec![0i64; shape.len()];
    loop {
        let offset: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        let address = usize::try_from(first as i64 + offset).expect("in the buffer");
        bytes.extend(address..address + element_bytes);
        // Next index, last axis fastest.
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                return bytes;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

#[test]
fn contiguous_slices() {
    let x = f32s(1000, &[8], &[1]);
    check(&f32s(1000, &[4], &[2]), &f32s(1004, &[4], &[2]), false);
    check(&x, &f32s(1004, &[7], &[1]), true);
    check(&f32s(1000, &[4], &[1]), &f32s(1016, &[4], &[1]), false);
    check(&x, &x, true);
    assert_eq!(x.span(), (1000, 1032));
    assert_eq!(x.terms(), &[(4, 8)]);
}

#[test]
fn two_dimensional_slices() {
    // 4 x 6, C-contiguous at 1000.
    let whole = f32s(1000, &[4, 6], &[6, 1]);
    assert_eq!(whole.terms(), &[(4, 24)]);
    let left = f32s(1000, &[4, 3], &[6, 1]);
    let right = f32s(1012, &[4, 3], &[6, 1]);
    check(&left, &right, false);
    check(&f32s(1000, &[4, 4], &[6, 1]), &right, true);
    check(
        &f32s(1000, &[2, 6], &[12, 1]),
        &f32s(1024, &[2, 6], &[12, 1]),
        false,
    );
    check(&whole, &right, true);
    // A transpose reaches the same bytes and normalizes to the same footprint.
    assert_eq!(f32s(1000, &[6, 4], &[1, 6]), whole);
}

#[test]
fn negative_strides() {
    let reversed = f32s(1028, &[8], &[-1]);
    assert_eq!(reversed, f32s(1000, &[8], &[1]));
    check(&reversed, &f32s(1000, &[1], &[1]), true);
    check(&f32s(1028, &[4], &[-2]), &f32s(1000, &[4], &[2]), false);
    assert_eq!(f32s(1028, &[4], &[-2]).span(), (1004, 1032));
}

#[test]
fn broadcast_strides() {
    let broadcast = f32s(1012, &[5], &[0]);
    assert!(broadcast.terms().is_empty());
    check(&broadcast, &f32s(1012, &[1], &[1]), true);
    check(&broadcast, &f32s(1016, &[4], &[1]), false);
}

#[test]
fn different_element_sizes() {
    let element = Footprint::new(1000, &[], &[], 4).unwrap();
    check(
        &Footprint::new(1001, &[3], &[1], 1).unwrap(),
        &element,
        true,
    );
    check(&Footprint::new(1004, &[], &[], 1).unwrap(), &element, false);
    check(&Footprint::new(1003, &[], &[], 1).unwrap(), &element, true);
    // Strided bytes straddling wide elements.
    let wide = Footprint::new(1000, &[4], &[16], 8).unwrap();
    check(&Footprint::new(1008, &[4], &[16], 8).unwrap(), &wide, false);
    check(&Footprint::new(1009, &[2], &[16], 1).unwrap(), &wide, false);
    check(&Footprint::new(1007, &[2], &[16], 1).unwrap(), &wide, true);
}

#[test]
fn empty_layouts_reach_nothing() {
    assert_eq!(Footprint::new(1000, &[0], &[4], 4), None);
    assert_eq!(Footprint::new(1000, &[3, 0], &[4, 12], 4), None);
    assert_eq!(Footprint::new(1000, &[3], &[4], 0), None);
    assert_eq!(Footprint::new(1000, &[], &[], 0), None);
}

#[test]
fn invalid_layouts_cover_everything() {
    let everything = Footprint::everything();
    assert_eq!(Footprint::new(1000, &[3], &[], 4), Some(everything.clone()));
    assert_eq!(
        Footprint::new(1000, &[-1], &[4], 4),
        Some(everything.clone())
    );
    // Below address 0, past the end of the address space, arithmetic overflow.
    assert_eq!(Footprint::new(8, &[3], &[-8], 4), Some(everything.clone()));
    assert_eq!(
        Footprint::new(usize::MAX - 3, &[], &[], 4),
        Some(everything.clone())
    );
    assert_eq!(
        Footprint::new(usize::MAX - 4, &[], &[], 4).unwrap().span(),
        (usize::MAX - 4, usize::MAX)
    );
    assert_eq!(
        Footprint::new(0, &[i64::MAX, i64::MAX], &[i64::MAX, i64::MAX], 1),
        Some(everything.clone())
    );
    assert_eq!(
        Footprint::new(0, &[i64::MAX; 3], &[i64::MIN; 3], 1),
        Some(everything.clone())
    );
    check(&everything, &f32s(1000, &[1], &[1]), true);
    check(&everything, &everything, true);
    assert_eq!(
        Footprint::from_parts(
            everything.low(),
            everything.element_bytes(),
            everything.terms()
        ),
        Some(everything)
    );
}

#[test]
fn parts_are_validated() {
    assert_eq!(Footprint::from_parts(1000, 0, &[]), None);
    assert_eq!(Footprint::from_parts(1000, 4, &[(0, 3)]), None);
    assert_eq!(Footprint::from_parts(1000, 4, &[(4, 1)]), None);
    assert_eq!(Footprint::from_parts(1000, 4, &[(4, 0)]), None);
    assert_eq!(
        Footprint::from_parts(1000, 4, &[(u64::MAX, u64::MAX)]),
        None
    );
    assert_eq!(Footprint::from_parts(usize::MAX - 3, 4, &[]), None);
    assert_eq!(Footprint::from_parts(usize::MAX, 1, &[]), None);
    assert_eq!(Footprint::from_parts(1000, 4, &[(u64::MAX, 2); 130]), None);
    // Out-of-order and mergeable terms are accepted and normalized.
    assert_eq!(
        Footprint::from_parts(1000, 4, &[(24, 4), (4, 6)]),
        Some(f32s(1000, &[4, 6], &[6, 1]))
    );
    let x = f32s(1000, &[3, 5], &[7, 2]);
    assert_eq!(
        Footprint::from_parts(x.low(), x.element_bytes(), x.terms()),
        Some(x)
    );
}

#[test]
fn merging_keeps_the_reached_sums() {
    // (2, U=1) and (4, V): 2 * {0, 1} + 4 * {0..=V} is every even number up to 2 + 4V.
    let mut terms = vec![(4, 3), (2, 1)];
    merge_terms(&mut terms);
    assert_eq!(terms, vec![(2, 7)]);
    // (2, U=0) reaches nothing; (3, _) is not a multiple of 2; (6, _) is 3 steps of 2, more
    // than the 2 values of (2, 1) cover, but 2 steps of 3, which (3, 2) covers.
    let mut terms = vec![(2, 0), (3, 2), (2, 1), (6, 1)];
    merge_terms(&mut terms);
    assert_eq!(terms, vec![(2, 1), (3, 4)]);
    // (20, _) is 10 steps of 2 and 4 of 5, more than (2, 3) and (5, 1) cover.
    let mut terms = vec![(20, 1), (5, 1), (2, 3)];
    merge_terms(&mut terms);
    assert_eq!(terms, vec![(2, 3), (5, 1), (20, 1)]);
    // Growth enables a later merge: (1, 2) absorbs (3, 1) into (1, 5), which then absorbs
    // (5, 1).
    let mut terms = vec![(1, 2), (5, 1), (3, 1)];
    merge_terms(&mut terms);
    assert_eq!(terms, vec![(1, 10)]);
}

#[test]
fn solve_agrees_with_enumeration_on_small_problems() {
    let problems: [&[(u128, u128)]; 5] = [
        &[(6, 3), (10, 3), (15, 3)],
        &[(7, 4), (11, 2), (13, 3)],
        &[(4, 5), (6, 5)],
        &[(9, 2), (9, 3), (1, 0)],
        &[],
    ];
    for terms in problems {
        let mut sums = BTreeSet::from([0u128]);
        for &(c, bound) in terms {
            sums = sums
                .iter()
                .flat_map(|&s| (0..=bound).map(move |x| s + c * x))
                .collect();
        }
        let top = sums.last().copied().unwrap_or(0) + 2;
        for target in 0..=top {
            let expected = if sums.contains(&target) {
                Search::Found
            } else {
                Search::Absent
            };
            assert_eq!(
                solve(terms.to_vec(), target, SEARCH_BUDGET),
                expected,
                "{terms:?} = {target}"
            );
        }
    }
}

#[test]
fn exhausted_budget_answers_overlap() {
    // Seven axes of large, pairwise coprime strides: the search's windows stay wide at
    // every level, and almost no single byte in the span is reached, so it runs out of
    // budget long before it could rule the byte out.
    let strides = [
        1_000_000_007,
        1_000_000_009,
        1_000_000_021,
        1_000_000_033,
        1_000_000_087,
        1_000_000_093,
        1_000_000_097,
    ];
    let lattice = Footprint::new(0, &[16; 7], &strides, 1).unwrap();
    let byte = Footprint::new(52_500_000_001, &[], &[], 1).unwrap();
    // Miri is slow: there the same search runs out of a smaller budget.
    let budget = if cfg!(miri) { 1 << 10 } else { SEARCH_BUDGET };
    assert_eq!(lattice.search(&byte, budget), Search::GaveUp);
    assert_eq!(byte.search(&lattice, budget), Search::GaveUp);
    if !cfg!(miri) {
        assert!(lattice.overlaps(&byte));
        assert!(byte.overlaps(&lattice));
    }
}

/// A random small layout in one buffer: (lowest byte, shape, strides in elements).
fn layout() -> impl Strategy<Value = (usize, Vec<i64>, Vec<i64>)> {
    (
        0usize..64,
        proptest::collection::vec((0i64..=4, -5i64..=5), 0..=3),
    )
        .prop_map(|(low, axes)| {
            let (shape, strides): (Vec<i64>, Vec<i64>) = axes.into_iter().unzip();
            (low, shape, strides)
        })
}

/// The footprint and the brute-force byte set of `layout` with elements of `size` bytes.
fn build(
    layout: &(usize, Vec<i64>, Vec<i64>),
    size: usize,
) -> (Option<Footprint>, BTreeSet<usize>) {
    let (low, shape, elements) = layout;
    let strides: Vec<i64> = elements.iter().map(|s| s * size as i64).collect();
    // Place element (0, ..., 0) so that the lowest element lands on `low`.
    let back: i64 = shape
        .iter()
        .zip(&strides)
        .filter(|&(_, &s)| s < 0)
        .map(|(&e, &s)| (e - 1).max(0) * -s)
        .sum();
    let first = low + back as usize;
    (
        Footprint::new(first, shape, &strides, size),
        bytes_of(first, shape, &strides, size),
    )
}

proptest! {
    #[test]
    fn overlaps_agrees_with_brute_force(
        a in layout(),
        b in layout(),
        size_a in prop::sample::select(vec![1usize, 2, 4, 8]),
        size_b in prop::sample::select(vec![1usize, 2, 4, 8]),
    ) {
        let (fa, bytes_a) = build(&a, size_a);
        let (fb, bytes_b) = build(&b, size_b);
        for (footprint, bytes) in [(&fa, &bytes_a), (&fb, &bytes_b)] {
            match footprint {
                None => prop_assert!(bytes.is_empty()),
                Some(f) => {
                    let lowest = *bytes.first().unwrap();
                    let highest = *bytes.last().unwrap();
                    prop_assert_eq!(f.span(), (lowest, highest + 1));
                    prop_assert_eq!(f.low(), lowest);
                    let rebuilt = Footprint::from_parts(f.low(), f.element_bytes(), f.terms());
                    prop_assert_eq!(rebuilt.as_ref(), Some(f));
                    for &(stride, extent) in f.terms() {
                        prop_assert!(stride > 0 && extent > 1);
                    }
                }
            }
        }
        if let (Some(fa), Some(fb)) = (&fa, &fb) {
            let shared = !bytes_a.is_disjoint(&bytes_b);
            prop_assert_eq!(fa.overlaps(fb), shared);
            prop_assert_eq!(fb.overlaps(fa), shared);
        }
    }
}

proptest! {
    /// The contiguous shortcut is the general construction of a C-contiguous layout.
    #[test]
    fn a_run_is_the_footprint_of_a_contiguous_layout(
        first in 0usize..1 << 40,
        shape in prop::collection::vec(1i64..=5, 0..=4),
        size in prop::sample::select(vec![1usize, 2, 4, 8, 16]),
    ) {
        // Row-major strides in bytes.
        let mut strides = vec![0i64; shape.len()];
        let mut step = size as i64;
        for (stride, &extent) in strides.iter_mut().zip(&shape).rev() {
            *stride = step;
            step *= extent;
        }
        let count = shape.iter().product::<i64>() as usize;
        let general = Footprint::new(first, &shape, &strides, size);
        prop_assert_eq!(Footprint::run(first, count, size), general);
    }
}

#[test]
fn a_run_of_nothing_or_past_the_end_is_left_to_the_general_construction() {
    assert_eq!(Footprint::run(0x1000, 0, 4), None);
    assert_eq!(Footprint::run(0x1000, 4, 0), None);
    assert_eq!(Footprint::run(usize::MAX - 8, 4, 4), None);
    let one = Footprint::run(0x1000, 1, 8).expect("one element");
    assert_eq!((one.span(), one.terms()), ((0x1000, 0x1008), &[][..]));
}
