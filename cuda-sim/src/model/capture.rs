//! Stream capture into graphs, and the replay of instantiated graphs.
//!
//! A capture sequence begins on its origin stream (`cuStreamBeginCapture_v2`). Every operation
//! enqueued on a stream of the sequence becomes a node of its graph, in captured order, with
//! the nodes it depends on: the stream's frontier, which an event recorded in the capture
//! carries to the streams that wait on it (a stream outside the capture that waits on such an
//! event joins the capture). `cuStreamEndCapture` on the origin takes every stream of the
//! sequence out of capture mode and returns the graph, if every node is ordered before the
//! origin's last nodes (every fork joined back).
//!
//! An executable graph (`cuGraphInstantiate*`) keeps its own copy of the nodes.
//! `cuGraphLaunch` enqueues them on the launch stream in captured order, each through
//! [`State::enqueue`] like the operation it was captured from, so the checker sees every
//! access with the launch stream's clock: the replay is serialized, never concurrent.

use std::ffi::c_void;

use cudarc::driver::sys::{CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};

use super::base::{Handle, Res, unsupported};
use super::checker::Pattern;
use super::kernel::prepare_launch;
use super::memory::Alloc;
use super::nodes::{CaptureSeq, Exec, Graph, GraphNode, Node};
use super::prepare::{prepare_copy, prepare_memset};
use super::state::{Kind, LastRecord, State};
use super::stream::{Recorded, Work};

use CUresult::*;

impl State {
    /// Refuses a use of the legacy default stream `i` while a blocking stream of its context is
    /// capturing (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): the use would depend implicitly on
    /// the capture. With `invalidate`, those captures are invalidated.
    pub(crate) fn check_implicit(&mut self, i: usize, invalidate: bool) -> Res {
        if self.streams[i].kind != Kind::Legacy {
            return Ok(());
        }
        let ctx = self.streams[i].ctx;
        let ids: Vec<u64> = self.contexts[&ctx]
            .blocking
            .iter()
            .filter_map(|&b| self.streams[b].capture)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        if invalidate {
            for id in ids {
                self.invalidate(id);
            }
        }
        Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    }

    /// The capture sequence stream `i` is capturing into, if any: for an operation about to
    /// be enqueued on it. An invalidated capture is `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`;
    /// the legacy stream beside a capturing blocking stream is
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (see [`State::check_implicit`]).
    pub(crate) fn capturing(&mut self, i: usize) -> Res<Option<u64>> {
        self.check_implicit(i, true)?;
        match self.streams[i].capture {
            None => Ok(None),
            Some(id) if self.captures[&id].invalidated => {
                Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            }
            Some(id) => Ok(Some(id)),
        }
    }

    pub(crate) fn invalidate(&mut self, id: u64) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.invalidated = true;
        }
    }

    /// Invalidates the capture stream `i` is in, if any.
    pub(crate) fn invalidate_stream_capture(&mut self, i: usize) {
        if let Some(id) = self.streams[i].capture {
            self.invalidate(id);
        }
    }

    /// Begins a capture sequence on stream `i` (not the legacy default stream, not already
    /// capturing).
    pub(crate) fn begin_capture(&mut self, i: usize, mode: CUstreamCaptureMode) -> Res {
        let s = &self.streams[i];
        if s.kind == Kind::Legacy {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if s.capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        self.next_capture += 1;
        let id = self.next_capture;
        let graph = self.handle();
        self.captures.insert(
            id,
            CaptureSeq {
                origin: i,
                mode,
                thread: std::thread::current().id(),
                invalidated: false,
                graph,
                nodes: Vec::new(),
                streams: vec![i],
            },
        );
        let s = &mut self.streams[i];
        s.capture = Some(id);
        s.frontier.clear();
        Ok(())
    }

    pub(crate) fn capture_status(&self, i: usize) -> CUstreamCaptureStatus {
        match self.streams[i]
            .capture
            .map(|id| self.captures[&id].invalidated)
        {
            None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(true) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            Some(false) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        }
    }

    /// Appends a node to the graph of the capture stream `i` is in, after the stream's frontier;
    /// the node becomes the frontier.
    pub(crate) fn add_node(&mut self, i: usize, node: Node) {
        let Some(id) = self.streams[i].capture else {
            return;
        };
        let deps = std::mem::take(&mut self.streams[i].frontier);
        let c = self
            .captures
            .get_mut(&id)
            .expect("a stream's capture is under way");
        c.nodes.push(GraphNode { node, deps });
        self.streams[i].frontier = vec![c.nodes.len() - 1];
    }

    /// `cuStreamWaitEvent(i, event)`: a wait for the event's last record, a join of the
    /// event's capture (a stream outside any capture waiting on an event recorded in one), a
    /// dependency inside a capture, or an external event-wait node (`external`).
    pub(crate) fn wait_event(&mut self, i: usize, event: Handle, external: bool) -> Res {
        self.check_implicit(i, true)?;
        let last = self
            .events
            .get(&event)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?
            .last
            .clone();
        if let Some(mine) = self.streams[i].capture {
            if self.captures[&mine].invalidated {
                return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            return match last {
                LastRecord::Capture { id, frontier } if id == mine => {
                    let f = &mut self.streams[i].frontier;
                    for n in frontier {
                        if !f.contains(&n) {
                            f.push(n);
                        }
                    }
                    Ok(())
                }
                // Two captures would be merged into one.
                LastRecord::Capture { id, .. } if !external && self.captures.contains_key(&id) => {
                    self.invalidate(mine);
                    self.invalidate(id);
                    Err(CUDA_ERROR_STREAM_CAPTURE_MERGE)
                }
                _ if external => {
                    self.add_node(i, Node::WaitEvent { event });
                    Ok(())
                }
                LastRecord::Never => Ok(()),
                // A dependency on work outside the capture.
                LastRecord::Stream(_) | LastRecord::Capture { .. } => {
                    self.invalidate(mine);
                    Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
                }
            };
        }
        match last {
            LastRecord::Never => Ok(()),
            LastRecord::Stream(r) => {
                self.enqueue(i, "cuStreamWaitEvent", &[], Some(&r), None)?;
                Ok(())
            }
            LastRecord::Capture { id, frontier } => match self.captures.get(&id) {
                None => Err(CUDA_ERROR_CAPTURED_EVENT),
                Some(c) if c.invalidated => Err(CUDA_ERROR_INVALID_VALUE),
                Some(_) if self.streams[i].kind == Kind::Legacy => {
                    self.invalidate(id);
                    Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
                }
                Some(_) => {
                    let c = self.captures.get_mut(&id).expect("checked");
                    c.streams.push(i);
                    let s = &mut self.streams[i];
                    s.capture = Some(id);
                    s.frontier = frontier;
                    Ok(())
                }
            },
        }
    }

    /// `cuEventRecord*(event, i)`: on a capturing stream, a record inside the capture (the
    /// stream's frontier) or, `external`, an event-record node; otherwise the stream's
    /// position.
    pub(crate) fn record_event(&mut self, i: usize, event: Handle, external: bool) -> Res {
        if !self.events.contains_key(&event) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let last = match self.capturing(i)? {
            Some(_) if external => {
                self.add_node(i, Node::RecordEvent { event });
                return Ok(());
            }
            Some(id) => LastRecord::Capture {
                id,
                frontier: self.streams[i].frontier.clone(),
            },
            None => LastRecord::Stream(self.record(i)?),
        };
        self.events.get_mut(&event).expect("checked").last = last;
        Ok(())
    }

    /// Ends the capture begun on stream `i` (`cuStreamEndCapture`): every stream of the
    /// sequence leaves capture mode, and the graph is returned unless the capture was
    /// invalidated or a stream that joined it was not joined back into the origin.
    pub(crate) fn end_capture(&mut self, i: usize) -> Res<Handle> {
        let id = self.streams[i].capture.ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        let c = &self.captures[&id];
        if c.origin != i {
            self.invalidate(id);
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if c.thread != std::thread::current().id()
            && c.mode != CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
        {
            return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let joined = every_node_before(&c.nodes, &self.streams[i].frontier);
        let c = self.captures.remove(&id).expect("checked");
        for &s in &c.streams {
            self.streams[s].capture = None;
            self.streams[s].frontier.clear();
        }
        if c.invalidated {
            return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        if !joined {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
        }
        self.graphs.insert(
            c.graph,
            Graph {
                nodes: c.nodes.into(),
            },
        );
        Ok(c.graph)
    }

    /// Takes stream `i` (being destroyed) out of its capture: the capture ends if `i` is its
    /// origin, and is invalidated otherwise.
    pub(crate) fn leave_capture(&mut self, i: usize) {
        let Some(id) = self.streams[i].capture else {
            return;
        };
        let members = if self.captures[&id].origin == i {
            self.captures
                .remove(&id)
                .map(|c| c.streams)
                .unwrap_or_default()
        } else {
            let c = self
                .captures
                .get_mut(&id)
                .expect("a stream's capture is under way");
            c.invalidated = true;
            c.streams.retain(|&s| s != i);
            vec![i]
        };
        for s in members {
            self.streams[s].capture = None;
            self.streams[s].frontier.clear();
        }
    }

    /// `cuGraphInstantiate*`: an executable graph of `graph`'s nodes.
    pub(crate) fn instantiate(&mut self, graph: Handle) -> Res<Handle> {
        let nodes = self
            .graphs
            .get(&graph)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
            .nodes
            .clone();
        let handle = self.handle();
        self.execs.insert(handle, Exec { nodes, last: None });
        Ok(handle)
    }

    /// `cuGraphLaunch(exec, i)`: enqueues the nodes on stream `i` in captured order, after the
    /// previous launch of `exec`. Every node is resolved first (device addresses, pinned host
    /// memory, the events waited on as of now); if one cannot be, nothing is enqueued.
    pub(crate) fn launch(&mut self, exec: Handle, i: usize) -> Res {
        let e = self.execs.get(&exec).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let (nodes, previous) = (e.nodes.clone(), e.last.clone());
        if let Some(id) = self.capturing(i)? {
            unsupported("cuGraphLaunch into a capturing stream (a child graph)");
            self.invalidate(id);
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let launch = format!("cuGraphLaunch of graph exec {exec:#x}");
        let mut steps = Vec::with_capacity(nodes.len());
        let mut failed = None;
        for (k, n) in nodes.iter().enumerate() {
            let step = match n.node {
                Node::Copy { op, ref req } => prepare_copy(self, op, req, Some(&launch))
                    .map(|(p, _)| Some(Step::Op(op, p.accesses, Some(p.work), None))),
                Node::Memset { op, dst, ref fill } => {
                    prepare_memset(self, op, dst, fill, Some(&launch))
                        .map(|p| Some(Step::Op(op, p.accesses, Some(p.work), None)))
                }
                Node::Host { f, data } => {
                    // SAFETY: the caller's host function and its argument, called once per
                    // launch as the driver does (driver API contract of cuLaunchHostFunc).
                    let work: Work = Box::new(move || unsafe { f(data as *mut c_void) });
                    Ok(Some(Step::Op(
                        "cuLaunchHostFunc",
                        Vec::new(),
                        Some(work),
                        None,
                    )))
                }
                Node::WaitEvent { event } => match self.events.get(&event).map(|e| &e.last) {
                    None => {
                        self.checker.misuse(format!(
                            "{launch} on {}: node #{k} waits on event {event:#x}, which was \
                             destroyed; no wait was added",
                            self.streams[i].label
                        ));
                        Ok(None)
                    }
                    Some(LastRecord::Stream(r)) => Ok(Some(Step::Op(
                        "cuStreamWaitEvent",
                        Vec::new(),
                        None,
                        Some(r.clone()),
                    ))),
                    // Never recorded, or last recorded inside a capture: nothing to wait for.
                    Some(_) => Ok(None),
                },
                Node::Kernel {
                    ref name,
                    ref pointers,
                } => {
                    let op = format!("cuLaunchKernel `{name}` (replayed by {launch})");
                    prepare_launch(self, &op, pointers).map(|a| {
                        let ctx = self.streams[i].ctx;
                        for (alloc, _, _) in &a {
                            self.check_peer_reach(ctx, alloc, &op);
                        }
                        Some(Step::Kernel(op, a))
                    })
                }
                Node::RecordEvent { event } => {
                    if self.events.contains_key(&event) {
                        Ok(Some(Step::Record(event)))
                    } else {
                        self.checker.misuse(format!(
                            "{launch} on {}: node #{k} records event {event:#x}, which was \
                             destroyed; nothing was recorded",
                            self.streams[i].label
                        ));
                        Ok(None)
                    }
                }
            };
            match step {
                Ok(Some(s)) => steps.push(s),
                Ok(None) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.enqueue(i, "cuGraphLaunch", &[], previous.as_ref(), None)?;
        for step in steps {
            match step {
                Step::Op(op, accesses, work, wait) => {
                    let refs: Vec<_> = accesses.iter().map(|(a, p, w)| (a, *p, *w)).collect();
                    self.enqueue(i, op, &refs, wait.as_ref(), work)?;
                }
                Step::Kernel(op, accesses) => {
                    let refs: Vec<_> = accesses.iter().map(|(a, p, w)| (a, *p, *w)).collect();
                    self.enqueue_as(i, "cuLaunchKernel", &op, &refs, None, None)?;
                }
                Step::Record(event) => {
                    let r = self.record(i)?;
                    self.events.get_mut(&event).expect("checked").last = LastRecord::Stream(r);
                }
            }
        }
        let end = self.position(i);
        if let Some(e) = self.execs.get_mut(&exec) {
            e.last = Some(end);
        }
        Ok(())
    }
}

/// One node of a launch, ready to enqueue: an operation (its name, accesses, work and the
/// recorded position it waits for), or an event record.
enum Step {
    Op(
        &'static str,
        Vec<(Alloc, Pattern, bool)>,
        Option<Work>,
        Option<Recorded>,
    ),
    Record(Handle),
    /// A kernel launch: its description for reports, and its accesses.
    Kernel(String, Vec<(Alloc, Pattern, bool)>),
}

/// Whether every node is `frontier` or ordered before it (an ancestor through the nodes'
/// dependencies): whether every stream that joined the capture was joined back.
fn every_node_before(nodes: &[GraphNode], frontier: &[usize]) -> bool {
    let mut seen = vec![false; nodes.len()];
    let mut stack = frontier.to_vec();
    while let Some(n) = stack.pop() {
        if !std::mem::replace(&mut seen[n], true) {
            stack.extend(&nodes[n].deps);
        }
    }
    seen.into_iter().all(|s| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(deps: &[usize]) -> GraphNode {
        GraphNode {
            node: Node::WaitEvent { event: 0 },
            deps: deps.to_vec(),
        }
    }

    #[test]
    fn a_capture_is_joined_when_every_node_is_before_the_origins_last_nodes() {
        // Origin: 0, then (after the join) 3; the forked stream: 1 after 0, then 2.
        let joined = [node(&[]), node(&[0]), node(&[1]), node(&[0, 2])];
        assert!(every_node_before(&joined, &[3]));
        // Without the join, 2 is after nothing the origin ends with.
        let unjoined = [node(&[]), node(&[0]), node(&[1]), node(&[0])];
        assert!(!every_node_before(&unjoined, &[3]));
        assert!(every_node_before(&unjoined, &[2, 3]));
        assert!(every_node_before(&[], &[]), "an empty capture");
        assert!(
            !every_node_before(&[node(&[])], &[]),
            "a node on a forked stream only"
        );
    }
}
