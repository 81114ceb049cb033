//! `DriverCalls`: the simulator counts every driver entry point called, by name; its own
//! `cuSim*` functions are not counted. One test in this binary, so that no other test calls the
//! driver between its counts.

use cuda_sim_testing::{Driver, DriverCalls};
use cudarc::driver::result;

#[test]
fn every_driver_call_is_counted_by_entry_point() {
    if cuda_sim_testing::driver() != Driver::Simulator {
        assert_eq!(DriverCalls::now(), None, "a real driver counts nothing");
        return;
    }
    let before = DriverCalls::now().expect("the simulator counts its calls");
    assert_eq!(
        DriverCalls::now().unwrap().since(&before).total,
        0,
        "reading counts nothing"
    );
    result::init().unwrap();
    assert!(result::device::get_count().unwrap() > 0);
    assert!(result::device::get_count().unwrap() > 0);
    let calls = DriverCalls::now().unwrap().since(&before);
    assert_eq!(calls.total, 3);
    assert_eq!(
        calls.by_entry_point,
        [("cuInit".to_owned(), 1), ("cuDeviceGetCount".to_owned(), 2)]
    );
    assert_eq!(calls.to_string(), "3 (cuInit 1, cuDeviceGetCount 2)");
    // A failed call is a call too.
    assert!(result::device::get(-1).is_err());
    assert_eq!(DriverCalls::now().unwrap().since(&before).total, 4);
}
