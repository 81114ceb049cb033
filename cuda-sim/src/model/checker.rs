//! The happens-before checker: vector clocks per timeline (the host and every stream) and the
//! access history of every allocation.
//!
//! The order is the one the CUDA programming model promises, computed when work is enqueued,
//! not observed when it runs: stream order, `cuEventRecord` + `cuStreamWaitEvent`, the legacy
//! default stream's implicit barriers, and host synchronizations (`cuStreamSynchronize`,
//! `cuEventSynchronize`, `cuCtxSynchronize`, queries that return `CUDA_SUCCESS`). An access
//! that conflicts with an earlier one (at least one of them a write, overlapping bytes) and is
//! not ordered after it is a violation, whatever the timing of the run. This is the design of
//! PyTorch's CUDA stream sanitizer, applied at the driver API.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Timeline 0 is the host; stream `i` has timeline `i` (never reused).
pub(crate) const HOST: usize = 0;

/// A vector clock: for each timeline, the last of its operations known to happen before.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VClock(Vec<u64>);

impl VClock {
    pub(crate) fn get(&self, timeline: usize) -> u64 {
        self.0.get(timeline).copied().unwrap_or(0)
    }

    pub(crate) fn set(&mut self, timeline: usize, seq: u64) {
        if self.0.len() <= timeline {
            self.0.resize(timeline + 1, 0);
        }
        self.0[timeline] = seq;
    }

    pub(crate) fn join(&mut self, other: &VClock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
    }

    /// Whether operation `seq` of `timeline` happens before whatever holds this clock.
    pub(crate) fn covers(&self, timeline: usize, seq: u64) -> bool {
        self.get(timeline) >= seq
    }
}

/// Bytes of one allocation touched by an operation: `height` rows of `width` bytes, `pitch`
/// bytes apart, from byte `start` of the allocation (a 1-D range has `height == 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pattern {
    pub(crate) start: u64,
    pub(crate) width: u64,
    pub(crate) pitch: u64,
    pub(crate) height: u64,
}

impl Pattern {
    pub(crate) fn range(start: u64, len: u64) -> Self {
        Self {
            start,
            width: len,
            pitch: len,
            height: 1,
        }
    }

    /// One past the last byte.
    fn end(&self) -> u64 {
        self.start + (self.height - 1) * self.pitch + self.width
    }

    fn is_contiguous(&self) -> bool {
        self.height == 1 || self.width >= self.pitch
    }

    fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// Whether the two touch a common byte.
    fn overlaps(&self, other: &Pattern) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        if self.end() <= other.start || other.end() <= self.start {
            return false;
        }
        if self.is_contiguous() && other.is_contiguous() {
            return true;
        }
        // Walk the rows of the pattern with fewer rows; for each, only the rows of the other
        // that can reach it.
        let (a, b) = if self.height <= other.height {
            (self, other)
        } else {
            (other, self)
        };
        (0..a.height).any(|r| {
            let s = a.start + r * a.pitch;
            b.row_hits(s, s + a.width)
        })
    }

    /// Whether any row of `self` intersects `[s, e)`.
    fn row_hits(&self, s: u64, e: u64) -> bool {
        if e <= self.start {
            return false;
        }
        let pitch = self.pitch.max(1);
        let first = s.saturating_sub(self.start + self.width.saturating_sub(1)) / pitch;
        let last = ((e - 1).saturating_sub(self.start) / pitch).min(self.height - 1);
        (first..=last).any(|k| {
            let rs = self.start + k * self.pitch;
            rs < e && s < rs + self.width
        })
    }

    /// Whether every byte of `other` is in `self` (exact for a contiguous `self`).
    fn contains(&self, other: &Pattern) -> bool {
        self.is_contiguous() && self.start <= other.start && other.end() <= self.end()
    }
}

/// Who did an access: the timeline, its operation number, and words for the report.
#[derive(Debug, Clone)]
pub(crate) struct Actor {
    pub(crate) timeline: usize,
    pub(crate) seq: u64,
    pub(crate) stream: Arc<str>,
    pub(crate) op: Arc<str>,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} (op #{})", self.op, self.stream, self.seq)
    }
}

#[derive(Debug, Clone)]
struct Record {
    pattern: Pattern,
    write: bool,
    actor: Actor,
}

/// What the checker knows of one allocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocInfo {
    pub(crate) id: u64,
    pub(crate) base: u64,
}

fn bytes(alloc: AllocInfo, p: &Pattern) -> String {
    if p.height == 1 {
        format!(
            "bytes [{:#x}, {:#x}) of allocation #{} at {:#x}",
            alloc.base + p.start,
            alloc.base + p.start + p.width,
            alloc.id,
            alloc.base
        )
    } else {
        format!(
            "{} rows of {} bytes, pitch {}, from {:#x} in allocation #{} at {:#x}",
            p.height,
            p.width,
            p.pitch,
            alloc.base + p.start,
            alloc.id,
            alloc.base
        )
    }
}

/// Access histories and the violations found.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    history: HashMap<u64, Vec<Record>>,
    violations: Vec<String>,
    /// Violations since the last reset, also those whose text was dropped past the cap.
    count: u64,
}

/// Texts kept for the report; the count goes on past it.
const KEPT: usize = 1000;

impl Checker {
    fn violation(&mut self, text: String) {
        if super::config::config().log {
            eprintln!("cuda-sim: violation: {text}");
        }
        if super::config::config().abort_on_violation {
            eprintln!("cuda-sim: violation (CUDA_SIM_ABORT_ON_VIOLATION is set): {text}");
            std::process::abort();
        }
        self.count += 1;
        if self.violations.len() < KEPT {
            self.violations.push(text);
        }
    }

    /// Checks an access by `actor`, whose clock is `clock`, against the history of `alloc`,
    /// then records it.
    pub(crate) fn access(
        &mut self,
        alloc: AllocInfo,
        pattern: Pattern,
        write: bool,
        actor: &Actor,
        clock: &VClock,
    ) {
        if pattern.is_empty() {
            return;
        }
        let history = self.history.entry(alloc.id).or_default();
        // One violation per access: the first earlier access it is not ordered after.
        let mut found = None;
        for r in history.iter() {
            if (r.write || write)
                && !clock.covers(r.actor.timeline, r.actor.seq)
                && r.pattern.overlaps(&pattern)
            {
                found = Some(format!(
                    "{} of {} by {} is not ordered after the {} of {} by {}",
                    if write { "write" } else { "read" },
                    bytes(alloc, &pattern),
                    actor,
                    if r.write { "write" } else { "read" },
                    bytes(alloc, &r.pattern),
                    r.actor,
                ));
                break;
            }
        }
        // Records this access makes redundant: covered by it, ordered before it, and of a kind
        // it subsumes (a write subsumes both, a read only reads). A later access unordered with
        // such a record is unordered with this one too, so one violation is still reported.
        history.retain(|r| {
            !(pattern.contains(&r.pattern)
                && clock.covers(r.actor.timeline, r.actor.seq)
                && (write || !r.write))
        });
        history.push(Record {
            pattern,
            write,
            actor: actor.clone(),
        });
        if let Some(text) = found {
            self.violation(text);
        }
    }

    /// Checks a free of `alloc` by `actor`: every earlier access must be ordered before it.
    /// Forgets the history.
    pub(crate) fn free(&mut self, alloc: AllocInfo, actor: &Actor, clock: &VClock) {
        let history = self.history.remove(&alloc.id).unwrap_or_default();
        for r in history {
            if !clock.covers(r.actor.timeline, r.actor.seq) {
                self.violation(format!(
                    "free of allocation #{} at {:#x} by {} is not ordered after the {} of {} by {}",
                    alloc.id,
                    alloc.base,
                    actor,
                    if r.write { "write" } else { "read" },
                    bytes(alloc, &r.pattern),
                    r.actor,
                ));
            }
        }
    }

    /// An access to memory already freed.
    pub(crate) fn use_after_free(&mut self, address: u64, what: &str, freed_by: &str) {
        self.violation(format!(
            "{what} touches {address:#x}, in an allocation already freed by {freed_by}"
        ));
    }

    /// A misuse of the driver API that a GPU would turn into undefined behaviour (such as a
    /// graph launch reaching a destroyed event), described by `text`.
    pub(crate) fn misuse(&mut self, text: String) {
        self.violation(text);
    }

    /// Drops records that the host knows to be complete: every later operation is enqueued
    /// after the host's clock and so is ordered after them.
    pub(crate) fn prune(&mut self, host: &VClock) {
        for history in self.history.values_mut() {
            history.retain(|r| !host.covers(r.actor.timeline, r.actor.seq));
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn report(&self) -> String {
        let mut out = String::new();
        for v in &self.violations {
            out.push_str(v);
            out.push('\n');
        }
        if self.count > self.violations.len() as u64 {
            out.push_str(&format!(
                "... and {} more\n",
                self.count - self.violations.len() as u64
            ));
        }
        out
    }

    pub(crate) fn reset(&mut self) {
        self.violations.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(timeline: usize, seq: u64) -> Actor {
        Actor {
            timeline,
            seq,
            stream: format!("stream {timeline}").into(),
            op: "op".into(),
        }
    }

    fn clock(entries: &[(usize, u64)]) -> VClock {
        let mut c = VClock::default();
        for &(t, s) in entries {
            c.set(t, s);
        }
        c
    }

    const A: AllocInfo = AllocInfo {
        id: 1,
        base: 0x1000,
    };

    #[test]
    fn clocks_join_elementwise() {
        let mut a = clock(&[(0, 3), (2, 1)]);
        a.join(&clock(&[(1, 5), (2, 4)]));
        assert_eq!(a, clock(&[(0, 3), (1, 5), (2, 4)]));
        assert!(a.covers(1, 5) && !a.covers(1, 6) && a.covers(7, 0));
    }

    #[test]
    fn patterns_overlap_exactly() {
        let rows = Pattern {
            start: 0,
            width: 4,
            pitch: 16,
            height: 4,
        };
        let shifted = Pattern { start: 4, ..rows };
        assert!(!rows.overlaps(&shifted), "interleaved columns are disjoint");
        assert!(rows.overlaps(&Pattern::range(50, 1)));
        assert!(!rows.overlaps(&Pattern::range(52, 12)));
        assert!(!rows.overlaps(&Pattern::range(64, 8)), "past the last row");
        assert!(Pattern::range(0, 10).overlaps(&Pattern::range(9, 1)));
        assert!(!Pattern::range(0, 10).overlaps(&Pattern::range(10, 1)));
        assert!(!Pattern::range(0, 0).overlaps(&Pattern::range(0, 10)));
        let tall = Pattern {
            start: 2,
            width: 1,
            pitch: 3,
            height: 100,
        };
        assert!(tall.overlaps(&rows) && rows.overlaps(&tall));
        let miss = Pattern {
            start: 8,
            width: 8,
            pitch: 16,
            height: 4,
        };
        assert!(!miss.overlaps(&rows));
    }

    #[test]
    fn unordered_conflicts_are_violations_and_ordered_ones_are_not() {
        let mut c = Checker::default();
        c.access(
            A,
            Pattern::range(0, 64),
            true,
            &actor(1, 1),
            &clock(&[(1, 1)]),
        );
        // A read on stream 2 that never waited for stream 1.
        c.access(
            A,
            Pattern::range(8, 8),
            false,
            &actor(2, 1),
            &clock(&[(2, 1)]),
        );
        assert_eq!(c.count(), 1, "{}", c.report());
        assert!(c.report().contains("read of bytes [0x1008, 0x1010)"));
        // A read ordered after the write (stream 3 waited on an event after it).
        c.access(
            A,
            Pattern::range(0, 64),
            false,
            &actor(3, 1),
            &clock(&[(1, 1), (3, 1)]),
        );
        assert_eq!(c.count(), 1);
        // Two unordered reads do not conflict.
        c.access(
            A,
            Pattern::range(0, 8),
            false,
            &actor(4, 1),
            &clock(&[(1, 1), (4, 1)]),
        );
        assert_eq!(c.count(), 1);
        // A write to other bytes does not conflict.
        c.access(
            A,
            Pattern::range(64, 8),
            true,
            &actor(5, 1),
            &clock(&[(5, 1)]),
        );
        assert_eq!(c.count(), 1);
    }

    #[test]
    fn frees_need_every_access_ordered_before() {
        let mut c = Checker::default();
        c.access(
            A,
            Pattern::range(0, 4),
            false,
            &actor(1, 1),
            &clock(&[(1, 1)]),
        );
        c.free(A, &actor(2, 1), &clock(&[(2, 1)]));
        assert_eq!(c.count(), 1);
        assert!(c.report().contains("free of allocation #1"));
        c.reset();
        c.access(
            A,
            Pattern::range(0, 4),
            false,
            &actor(1, 2),
            &clock(&[(1, 2)]),
        );
        c.free(A, &actor(2, 2), &clock(&[(1, 2), (2, 2)]));
        assert_eq!(c.count(), 0);
    }

    #[test]
    fn pruning_keeps_what_can_still_conflict() {
        let mut c = Checker::default();
        c.access(
            A,
            Pattern::range(0, 4),
            true,
            &actor(1, 1),
            &clock(&[(1, 1)]),
        );
        c.access(
            A,
            Pattern::range(0, 4),
            true,
            &actor(2, 1),
            &clock(&[(2, 1)]),
        );
        assert_eq!(c.count(), 1);
        // The host synchronized with stream 1 only: stream 2's write can still conflict.
        c.prune(&clock(&[(1, 1)]));
        c.access(
            A,
            Pattern::range(0, 4),
            false,
            &actor(3, 1),
            &clock(&[(1, 1), (3, 1)]),
        );
        assert_eq!(c.count(), 2, "{}", c.report());
    }
}
