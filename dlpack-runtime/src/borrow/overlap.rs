//! Whether two strided tensor layouts on one address space share a byte.
//!
//! A [`Footprint`] is the set of bytes a strided layout reaches: every element
//! `first + sum_k i_k * stride_k` (with `0 <= i_k < extent_k`) covers `element_bytes` bytes from
//! its address. [`Footprint::overlaps`] decides whether two footprints share a byte, exactly,
//! within a bounded amount of work.
//!
//! # Method
//!
//! Each layout is first normalized: axes of extent 1 or stride 0 add no address and are dropped,
//! a negative stride is made positive by starting from the lowest element instead, and two axes
//! whose addresses together form a single arithmetic progression (a stride that is `k` times a
//! smaller one, with `k` at most the smaller axis's extent, as in any contiguous run of axes) are
//! merged into one axis. What is left is the lowest element address `low`, the element size and
//! a few (stride, extent) terms.
//!
//! Footprint A reaches byte `lowA + sum a_k i_k + u` (`0 <= u < eA`), B reaches
//! `lowB + sum b_k j_k + v` (`0 <= v < eB`). Counting B's indices and byte offset down from their
//! upper ends instead of up from zero turns "some byte is equal" into one equation
//!
//! ```text
//! sum_k c_k x_k = T,   0 <= x_k <= U_k,   every c_k >= 1,
//! ```
//!
//! whose terms are A's and B's strides (bounds extent - 1) and one coefficient-1 term for the two
//! byte offsets together (bound `(eA - 1) + (eB - 1)`), and whose target `T` is B's highest byte
//! minus A's lowest (counting A's down instead gives the mirrored problem, target `A's highest
//! byte minus B's lowest`; the search takes the smaller of the two targets, so that the answer
//! does not depend on the order of the operands). Terms of equal coefficient are merged by adding their bounds, and the
//! progression rule above merges more. The equation has a solution exactly when the footprints
//! share a byte.
//!
//! Quick answers come first: disjoint spans share nothing (this is also exactly `T < 0` or
//! `T > sum c_k U_k`), and a target that the gcd of the coefficients does not divide has no
//! solution. Otherwise a depth-first search assigns the terms from the largest coefficient down.
//! With remainder `r` at term `k`, the values of `x_k` worth trying lie in
//! `[ceil((r - R_k) / c_k), floor(r / c_k)]` clipped to `[0, U_k]`, where `R_k` is the most the
//! later terms can add, and `r - c_k x_k` must be a multiple of the gcd of the later
//! coefficients, which restricts `x_k` to one residue class that the search steps through. For
//! the layouts real arrays have (each stride beyond the reach of the smaller ones) that window
//! holds one or two values, so the search visits about as many candidates as there are terms.
//!
//! # Budget
//!
//! Adversarial layouts (many axes with coprime strides and large extents) can make the search
//! exponential. It counts the candidate values it visits and, past [`SEARCH_BUDGET`], stops and
//! answers "overlap": a borrow is then refused, never wrongly allowed. Below the budget the
//! answer is exact.
//!
//! NumPy's `np.shares_memory` decides the same question the same way: it reduces it to a bounded
//! linear Diophantine feasibility problem and gives up past a work limit (its `max_work`).

/// The most candidate values [`Footprint::overlaps`] visits before it stops searching and
/// answers "overlap".
pub(crate) const SEARCH_BUDGET: u32 = 1 << 16;

/// The bytes a strided tensor layout reaches on one address space: every element
/// `first + sum_k i_k * stride_k` (0 <= i_k < extent_k) covers `element_bytes` bytes from there.
///
/// Kept normalized: the lowest element address, the element size, the byte span, and the
/// (stride, extent) terms that remain once axes of extent 1 and stride 0 are dropped, negative
/// strides flipped and progression-forming axes merged, sorted by stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Footprint {
    /// Address of the lowest element.
    low: usize,
    /// One past the highest byte reached.
    high: usize,
    /// Bytes covered from each element address (at least 1).
    element_bytes: usize,
    /// (stride in bytes > 0, extent > 1), strictly increasing strides, no two mergeable.
    terms: Vec<(u64, u64)>,
}

impl Footprint {
    /// The footprint of the layout whose element `(0, ..., 0)` is at `first`, with extents
    /// `shape` and byte strides `strides` (any sign, zero allowed), each element covering
    /// `element_bytes` bytes.
    ///
    /// `None` when the layout has no elements (some extent is 0) or `element_bytes == 0`: it
    /// reaches no byte. The caller has validated the layout, so every byte reached lies in
    /// `[0, usize::MAX)`; inputs that break this (lengths that differ, a negative extent, an
    /// address outside that range) give a footprint covering the whole address space, so that
    /// nothing is ever wrongly found free of overlap.
    pub(crate) fn new(
        first: usize,
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
    ) -> Option<Footprint> {
        if shape.len() != strides.len() || shape.iter().any(|&extent| extent < 0) {
            return Some(Footprint::everything());
        }
        if element_bytes == 0 || shape.contains(&0) {
            return None;
        }
        // `first` fits in i128 exactly; each axis moves `low` by less than 2^127, and any
        // overflow of the running sum is an invalid layout.
        let mut low = first as i128;
        let mut terms = Vec::with_capacity(shape.len());
        for (&extent, &stride) in shape.iter().zip(strides) {
            if extent == 1 || stride == 0 {
                continue;
            }
            let step = stride.unsigned_abs();
            let count = extent.unsigned_abs();
            if stride < 0 {
                let back = i128::from(step) * i128::from(count - 1);
                match low.checked_sub(back) {
                    Some(moved) => low = moved,
                    None => return Some(Footprint::everything()),
                }
            }
            terms.push((step, count));
        }
        let built = u128::try_from(low)
            .ok()
            .and_then(|low| Footprint::assemble(low, element_bytes, &terms));
        Some(built.unwrap_or_else(Footprint::everything))
    }

    /// A footprint covering every byte in `[0, usize::MAX)`: the answer for inputs that break
    /// the caller's validation, which then overlaps everything.
    fn everything() -> Footprint {
        Footprint {
            low: 0,
            high: usize::MAX,
            element_bytes: usize::MAX,
            terms: Vec::new(),
        }
    }

    /// Checks and normalizes `(low, element_bytes, terms)`: `None` unless `element_bytes >= 1`,
    /// every term has stride >= 1 and extent >= 2, and one past the highest byte fits in `usize`.
    fn assemble(low: u128, element_bytes: usize, terms: &[(u64, u64)]) -> Option<Footprint> {
        if element_bytes == 0 {
            return None;
        }
        let mut reach = 0u128;
        let mut bounded = Vec::with_capacity(terms.len());
        for &(stride, extent) in terms {
            if stride == 0 || extent < 2 {
                return None;
            }
            let bound = u128::from(extent - 1);
            reach = reach.checked_add(u128::from(stride) * bound)?;
            bounded.push((u128::from(stride), bound));
        }
        let high = low.checked_add(reach)?.checked_add(element_bytes as u128)?;
        let high = usize::try_from(high).ok()?;
        // `low < high`, so it fits too.
        let low = usize::try_from(low).ok()?;
        merge_terms(&mut bounded);
        // Every merged term still has `stride * (extent - 1) <= reach < usize::MAX`, so its
        // extent fits; the conversion only guards that.
        let terms = bounded
            .into_iter()
            .map(|(stride, bound)| {
                Some((u64::try_from(stride).ok()?, u64::try_from(bound + 1).ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Footprint {
            low,
            high,
            element_bytes,
            terms,
        })
    }

    /// Lowest byte reached, one past the highest: `[low, high)`.
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.low, self.high)
    }

    /// The normalized (stride in bytes > 0, extent > 1) terms, strides increasing; with
    /// [`Footprint::low`] and [`Footprint::element_bytes`] they rebuild this footprint through
    /// [`Footprint::from_parts`].
    pub(crate) fn terms(&self) -> &[(u64, u64)] {
        &self.terms
    }

    /// Bytes covered from each element address.
    pub(crate) fn element_bytes(&self) -> usize {
        self.element_bytes
    }

    /// Address of the lowest element (also the lowest byte reached).
    pub(crate) fn low(&self) -> usize {
        self.low
    }

    /// Rebuilds a footprint from `low` (the lowest element address), `element_bytes` and
    /// (stride, extent) terms such as [`Footprint::terms`] returns; terms in another order or
    /// still mergeable are accepted and normalized. `None` on parts that describe no valid
    /// footprint: `element_bytes == 0`, a zero stride, an extent below 2, or a highest byte whose
    /// successor does not fit in `usize`.
    pub(crate) fn from_parts(
        low: usize,
        element_bytes: usize,
        terms: &[(u64, u64)],
    ) -> Option<Footprint> {
        Footprint::assemble(low as u128, element_bytes, terms)
    }

    /// Whether some byte is reached by both. Exact whenever the search finishes within
    /// [`SEARCH_BUDGET`] candidate values; when the budget runs out it answers `true`
    /// (conservative: a borrow is refused, never wrongly allowed). Symmetric:
    /// `a.overlaps(b) == b.overlaps(a)`, also when the budget runs out.
    pub(crate) fn overlaps(&self, other: &Footprint) -> bool {
        !matches!(self.search(other, SEARCH_BUDGET), Search::Absent)
    }

    /// The search behind [`Footprint::overlaps`], visiting at most `budget` candidate values.
    fn search(&self, other: &Footprint, budget: u32) -> Search {
        if self.high <= other.low || other.high <= self.low {
            return Search::Absent;
        }
        // The coefficients and bounds of the equation in the module docs: both footprints'
        // terms and one term for the two byte offsets. The sum of `c * U` over them is
        // `(high_a - low_a - 1) + (high_b - low_b - 1)`, far below `u128::MAX`.
        let mut terms = Vec::with_capacity(self.terms.len() + other.terms.len() + 1);
        for &(stride, extent) in self.terms.iter().chain(&other.terms) {
            terms.push((u128::from(stride), u128::from(extent - 1)));
        }
        terms.push((
            1,
            (self.element_bytes - 1) as u128 + (other.element_bytes - 1) as u128,
        ));
        // Counting `other`'s indices down gives target `high_b - 1 - low_a`; counting `self`'s
        // down gives `high_a - 1 - low_b`. Both are >= 0 (the spans intersect) and sum to the
        // total reach, and the two equations are the same problem mirrored (`x -> U - x`).
        // Solving the one with the smaller target makes the answer independent of the order of
        // the operands, budget included.
        let forward = (other.high - 1 - self.low) as u128;
        let backward = (self.high - 1 - other.low) as u128;
        solve(terms, forward.min(backward), budget)
    }
}

/// What a bounded search found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Search {
    /// A solution: the footprints share a byte.
    Found,
    /// No solution: they share none.
    Absent,
    /// The budget ran out first.
    GaveUp,
}

/// Merges terms `(coefficient, bound)`, each standing for `coefficient * x` with
/// `0 <= x <= bound`, into fewer terms reaching the same set of sums, and sorts them by
/// coefficient, smallest first.
///
/// Terms `(c, U)` and `(k * c, V)` with `k <= U + 1` reach together `c * y` for every
/// `0 <= y <= U + k * V` (the steps of `k` in `x + k * x'` leave no gap when `x` covers `k`
/// consecutive values), so they become `(c, U + k * V)`. Equal coefficients are the case
/// `k = 1`. Terms of bound 0 reach nothing and are dropped. Merging grows bounds, which can make
/// more pairs mergeable, so passes repeat until none merges.
fn merge_terms(terms: &mut Vec<(u128, u128)>) {
    terms.retain(|&(coefficient, bound)| coefficient > 0 && bound > 0);
    terms.sort_unstable();
    loop {
        let mut merged = false;
        let mut small = 0;
        while small < terms.len() {
            let mut large = small + 1;
            while large < terms.len() {
                let (c, u) = terms[small];
                let (kc, v) = terms[large];
                let k = kc / c;
                let grown = if kc % c == 0 && k <= u.saturating_add(1) {
                    k.checked_mul(v).and_then(|kv| kv.checked_add(u))
                } else {
                    None
                };
                match grown {
                    Some(bound) => {
                        terms[small].1 = bound;
                        terms.remove(large);
                        merged = true;
                    }
                    None => large += 1,
                }
            }
            small += 1;
        }
        if !merged {
            return;
        }
    }
}

/// One term of the search, largest coefficient first, with what the later terms allow.
struct Level {
    /// Coefficient `c_k`.
    coefficient: u128,
    /// Bound `U_k` on `x_k`.
    bound: u128,
    /// The most the later terms can add: `sum c_l U_l` over `l > k`.
    rest: u128,
    /// `gcd(c_k, g)` with `g` the gcd of the later coefficients (`c_k` when there are none): a
    /// remainder it does not divide has no solution.
    divisor: u128,
    /// `g / divisor` (1 when there are no later terms): `x_k` must lie in one residue class
    /// modulo it.
    modulus: u128,
    /// The inverse of `c_k / divisor` modulo `modulus` (0 when `modulus == 1`).
    inverse: u128,
}

/// Whether `sum c_k x_k = target` has a solution with `0 <= x_k <= U_k`, for `terms`
/// `(c_k, U_k)` with coefficients below 2^64 and `sum c_k U_k` below 2^127, visiting at most
/// `budget` candidate values.
fn solve(mut terms: Vec<(u128, u128)>, target: u128, budget: u32) -> Search {
    merge_terms(&mut terms);
    // Build the levels from the smallest coefficient up, accumulating what later terms allow.
    let mut levels = Vec::with_capacity(terms.len());
    let mut rest = 0u128;
    let mut later_gcd = 0u128;
    for &(coefficient, bound) in &terms {
        let divisor = gcd(coefficient, later_gcd);
        let modulus = if later_gcd == 0 {
            1
        } else {
            later_gcd / divisor
        };
        levels.push(Level {
            coefficient,
            bound,
            rest,
            divisor,
            modulus,
            inverse: inverse_mod(coefficient / divisor, modulus),
        });
        rest = rest.saturating_add(coefficient.saturating_mul(bound));
        later_gcd = divisor;
    }
    levels.reverse();
    // Quick exits: out of reach, or not a multiple of the gcd of all coefficients.
    if target > rest || (later_gcd != 0 && target % later_gcd != 0) {
        return Search::Absent;
    }
    let mut steps = 0u32;
    descend(&levels, target, &mut steps, budget)
}

/// Depth-first search for `x_k` on `levels` (largest coefficient first) summing to
/// `remainder`, counting candidate values in `steps`.
fn descend(levels: &[Level], remainder: u128, steps: &mut u32, budget: u32) -> Search {
    let Some((level, later)) = levels.split_first() else {
        return if remainder == 0 {
            Search::Found
        } else {
            Search::Absent
        };
    };
    let (quotient, leftover) = div_rem(remainder, level.divisor);
    if leftover != 0 {
        return Search::Absent;
    }
    let c = level.coefficient;
    // Large enough that the later terms can make up the rest, small enough not to overshoot.
    let lowest = if remainder > level.rest {
        let (q, r) = div_rem(remainder - level.rest, c);
        q + u128::from(r != 0)
    } else {
        0
    };
    let highest = level.bound.min(div_rem(remainder, c).0);
    if lowest > highest {
        return Search::Absent;
    }
    // `c x ≡ remainder (mod g)` <=> `x ≡ (remainder / d) * inverse (mod g / d)`: the residue
    // and inverse are below the modulus (< 2^64), so their product fits.
    let m = level.modulus;
    let residue = div_rem(div_rem(quotient, m).1 * level.inverse, m).1;
    let mut x = lowest + div_rem(residue + m - div_rem(lowest, m).1, m).1;
    while x <= highest {
        if *steps >= budget {
            return Search::GaveUp;
        }
        *steps += 1;
        match descend(later, remainder - c * x, steps, budget) {
            Search::Absent => {}
            found_or_gave_up => return found_or_gave_up,
        }
        x = match x.checked_add(m) {
            Some(next) => next,
            None => break,
        };
    }
    Search::Absent
}

/// `(a / b, a % b)`, in 64-bit arithmetic when both fit: the usual case, and several times
/// faster than 128-bit division.
fn div_rem(a: u128, b: u128) -> (u128, u128) {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => (u128::from(a / b), u128::from(a % b)),
        _ => (a / b, a % b),
    }
}

/// Greatest common divisor; `gcd(a, 0) = a`.
fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The inverse of `a` modulo `m` for coprime `a` and `m` below 2^64 (0 when `m <= 1`), by the
/// extended Euclidean algorithm.
fn inverse_mod(a: u128, m: u128) -> u128 {
    if m <= 1 {
        return 0;
    }
    // Both below 2^64, so the remainders and the Bezout coefficients (bounded by `m` in size)
    // fit in i128.
    let (mut r0, mut r1) = ((a % m) as i128, m as i128);
    let (mut s0, mut s1) = (1i128, 0i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (s0, s1) = (s1, s0 - q * s1);
    }
    s0.rem_euclid(m as i128) as u128
}

#[cfg(test)]
mod tests {
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
    fn bytes_of(
        first: usize,
        shape: &[i64],
        strides: &[i64],
        element_bytes: usize,
    ) -> BTreeSet<usize> {
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
}
