//! `Checker::attach` as the first call of a process (its own test binary, so no other test has
//! loaded the driver before it): it loads the driver itself, and gives a checker exactly when
//! the driver is the simulator.

use cuda_sim_testing::{Checker, Driver};

#[test]
fn attach_before_anything_else_loads_the_driver_itself() {
    let checker = Checker::attach();
    let driver = cuda_sim_testing::load();
    assert_eq!(
        checker.is_some(),
        driver == Ok(Driver::Simulator),
        "attach() gave {checker:?} with the driver {driver:?}"
    );
    if let Some(checker) = checker {
        assert_eq!(checker.violations(), 0);
    }
}
