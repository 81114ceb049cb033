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

use core::fmt;

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
    terms: TermList,
}

/// A footprint's terms: most layouts keep one or two, held inline, so that a borrow of them
/// allocates nothing for its footprint.
#[derive(Clone)]
enum TermList {
    Inline(u8, [(u64, u64); 2]),
    Heap(Vec<(u64, u64)>),
}

impl TermList {
    fn collect(terms: impl ExactSizeIterator<Item = Option<(u64, u64)>>) -> Option<TermList> {
        let mut inline = [(0, 0); 2];
        if terms.len() > inline.len() {
            return terms.collect::<Option<Vec<_>>>().map(TermList::Heap);
        }
        let mut len = 0;
        for term in terms {
            inline[len] = term?;
            len += 1;
        }
        Some(TermList::Inline(len as u8, inline))
    }
}

impl core::ops::Deref for TermList {
    type Target = [(u64, u64)];

    fn deref(&self) -> &[(u64, u64)] {
        match self {
            TermList::Inline(len, terms) => &terms[..usize::from(*len)],
            TermList::Heap(terms) => terms,
        }
    }
}

impl PartialEq for TermList {
    fn eq(&self, other: &TermList) -> bool {
        **self == **other
    }
}

impl Eq for TermList {}

impl fmt::Debug for TermList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
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
        let mut inline = [(0u64, 0u64); INLINE_TERMS];
        let mut terms = Terms::new(&mut inline, shape.len());
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
            .and_then(|low| Footprint::assemble(low, element_bytes, terms.as_slice()));
        Some(built.unwrap_or_else(Footprint::everything))
    }

    /// The footprint of `count` elements of `element_bytes` bytes each, one after the other
    /// from `first`: what [`Footprint::new`] gives for a contiguous layout, without its general
    /// normalization. `None` for no elements, or where the general construction is needed (the
    /// end does not fit, or nothing is reached).
    #[inline]
    pub(crate) fn run(first: usize, count: usize, element_bytes: usize) -> Option<Footprint> {
        if count == 0 || element_bytes == 0 {
            return None;
        }
        let high = first.checked_add(count.checked_mul(element_bytes)?)?;
        let terms = if count > 1 {
            TermList::Inline(1, [(element_bytes as u64, count as u64), (0, 0)])
        } else {
            TermList::Inline(0, [(0, 0); 2])
        };
        Some(Footprint {
            low: first,
            high,
            element_bytes,
            terms,
        })
    }

    /// A footprint covering every byte in `[0, usize::MAX)`: the answer for inputs that break
    /// the caller's validation, which then overlaps everything.
    fn everything() -> Footprint {
        Footprint {
            low: 0,
            high: usize::MAX,
            element_bytes: usize::MAX,
            terms: TermList::Inline(0, [(0, 0); 2]),
        }
    }

    /// Checks and normalizes `(low, element_bytes, terms)`: `None` unless `element_bytes >= 1`,
    /// every term has stride >= 1 and extent >= 2, and one past the highest byte fits in `usize`.
    fn assemble(low: u128, element_bytes: usize, terms: &[(u64, u64)]) -> Option<Footprint> {
        if element_bytes == 0 {
            return None;
        }
        let mut reach = 0u128;
        let mut inline = [(0u128, 0u128); INLINE_TERMS];
        let mut bounded = Terms::new(&mut inline, terms.len());
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
        let bounded = merge_terms_in(bounded.as_mut_slice());
        // Every merged term still has `stride * (extent - 1) <= reach < usize::MAX`, so its
        // extent fits; the conversion only guards that.
        let terms = TermList::collect(bounded.iter().map(|&(stride, bound)| {
            Some((u64::try_from(stride).ok()?, u64::try_from(bound + 1).ok()?))
        }))?;
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
        for &(stride, extent) in self.terms.iter().chain(other.terms.iter()) {
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
    let len = merge_terms_in(terms).len();
    terms.truncate(len);
}

/// [`merge_terms`] in place in a slice: the merged terms are the returned front of `terms`.
fn merge_terms_in(terms: &mut [(u128, u128)]) -> &mut [(u128, u128)] {
    let mut len = 0;
    for i in 0..terms.len() {
        let (coefficient, bound) = terms[i];
        if coefficient > 0 && bound > 0 {
            terms[len] = terms[i];
            len += 1;
        }
    }
    let terms = &mut terms[..len];
    terms.sort_unstable();
    loop {
        let mut merged = false;
        let mut small = 0;
        while small < len {
            let mut large = small + 1;
            while large < len {
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
                        // Removed, the order of the others kept.
                        terms.copy_within(large + 1..len, large);
                        len -= 1;
                        merged = true;
                    }
                    None => large += 1,
                }
            }
            small += 1;
        }
        if !merged {
            return &mut terms[..len];
        }
    }
}

/// Terms of a footprint under construction held on the stack, the common case; layouts of more
/// axes than this use the heap.
const INLINE_TERMS: usize = 8;

/// A buffer of at most `capacity` terms, filled from the front: `inline` when it is large
/// enough, a vector otherwise. Building a footprint then allocates only the terms it keeps.
struct Terms<'a, T> {
    slots: TermSlots<'a, T>,
    len: usize,
}

enum TermSlots<'a, T> {
    Inline(&'a mut [T]),
    Heap(Vec<T>),
}

impl<'a, T: Copy + Default> Terms<'a, T> {
    fn new(inline: &'a mut [T], capacity: usize) -> Self {
        let slots = if capacity <= inline.len() {
            TermSlots::Inline(&mut inline[..capacity])
        } else {
            TermSlots::Heap(vec![T::default(); capacity])
        };
        Terms { slots, len: 0 }
    }

    /// Appends `term`; at most `capacity` terms are pushed (panics otherwise).
    fn push(&mut self, term: T) {
        let len = self.len;
        self.as_full_slice()[len] = term;
        self.len += 1;
    }

    fn as_full_slice(&mut self) -> &mut [T] {
        match &mut self.slots {
            TermSlots::Inline(slots) => slots,
            TermSlots::Heap(slots) => slots,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        let len = self.len;
        &mut self.as_full_slice()[..len]
    }

    fn as_slice(&self) -> &[T] {
        match &self.slots {
            TermSlots::Inline(slots) => &slots[..self.len],
            TermSlots::Heap(slots) => &slots[..self.len],
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
mod tests;
