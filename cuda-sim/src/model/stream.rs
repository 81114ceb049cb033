//! The executing half of a stream: a FIFO of operations run in order by one worker thread, and
//! the positions (records, host waits) that other work and the host wait for.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use cudarc::driver::sys::CUresult;

use super::base::{Res, lock};
use super::checker::VClock;

/// Work a stream runs in order.
pub(crate) type Work = Box<dyn FnOnce() + Send>;

pub(crate) struct Op {
    /// Positions of other streams this operation waits for.
    pub(crate) deps: Vec<(Arc<StreamCore>, u64)>,
    pub(crate) work: Option<Work>,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    completed: u64,
    closing: bool,
}

/// The executing half of a stream: a FIFO run by one worker thread.
pub(crate) struct StreamCore {
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl StreamCore {
    /// A stream's queue and the worker thread that runs it (which ends once the queue is
    /// closed and empty).
    pub(crate) fn start(name: String) -> (Arc<Self>, JoinHandle<()>) {
        let core = Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let worker = core.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run())
            .expect("cuda-sim: cannot start a stream thread");
        (core, thread)
    }

    fn run(&self) {
        let delay = super::config::config().op_delay;
        loop {
            let op = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            for (dep, seq) in &op.deps {
                dep.wait_for(*seq);
            }
            if let Some(work) = op.work {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
                    eprintln!("cuda-sim: an operation panicked on a stream thread");
                }
            }
            lock(&self.queue).completed += 1;
            self.cv.notify_all();
        }
    }

    pub(crate) fn push(&self, op: Op) {
        lock(&self.queue).ops.push_back(op);
        self.cv.notify_all();
    }

    pub(crate) fn close(&self) {
        lock(&self.queue).closing = true;
        self.cv.notify_all();
    }

    /// Blocks until `seq` operations have completed.
    pub(crate) fn wait_for(&self, seq: u64) {
        let mut q = lock(&self.queue);
        while q.completed < seq {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn completed(&self) -> u64 {
        lock(&self.queue).completed
    }
}

/// Where a recorded event stands: its stream's position at record time.
#[derive(Clone)]
pub(crate) struct Recorded {
    pub(crate) core: Arc<StreamCore>,
    pub(crate) seq: u64,
    pub(crate) clock: VClock,
    pub(crate) done_at: Arc<Mutex<Option<Instant>>>,
}

/// A snapshot for a host wait: what to wait for, and the clock to join afterwards.
pub(crate) struct Waiter {
    pub(crate) core: Arc<StreamCore>,
    pub(crate) seq: u64,
    pub(crate) clock: VClock,
}

impl Waiter {
    pub(crate) fn wait(&self) {
        self.core.wait_for(self.seq);
    }
}

/// Counts a never-recorded event as complete and maps queries to the driver's codes.
pub(crate) fn ready(done: bool) -> Res {
    if done {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_NOT_READY)
    }
}
