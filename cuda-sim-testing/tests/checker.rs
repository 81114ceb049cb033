//! A second `Checker::attach` on a thread that holds a checker fails at once, where it would
//! wait for ever for the first one's turn; after the first is dropped, attaching works again.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

use cuda_sim_testing::{Checker, Driver};

#[test]
fn a_second_attach_on_the_same_thread_panics_instead_of_deadlocking() {
    // Were the check gone, the second attach would deadlock: a watchdog ends the process.
    let (done, finished) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(60)) == Err(mpsc::RecvTimeoutError::Timeout) {
            eprintln!("a second Checker::attach on one thread deadlocked");
            std::process::exit(101);
        }
    });
    let Some(first) = Checker::attach() else {
        // A real driver: no checker, nothing to hold.
        assert_eq!(cuda_sim_testing::load(), Ok(Driver::Hardware));
        return;
    };
    let payload = catch_unwind(AssertUnwindSafe(Checker::attach)).unwrap_err();
    let message = payload.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(
        message.contains("holds a checker already"),
        "unexpected panic: {message:?}"
    );
    drop(first);
    // The failed attach took no turn: this one gets it at once.
    let again = Checker::attach().expect("the simulator is still the driver");
    assert_eq!(again.violations(), 0);
    // Another thread waits for the turn, and gets it once this thread's checker is dropped.
    let other = std::thread::spawn(|| Checker::attach().map(|c| c.violations()));
    drop(again);
    assert_eq!(other.join().unwrap(), Some(0));
    done.send(()).unwrap();
}
