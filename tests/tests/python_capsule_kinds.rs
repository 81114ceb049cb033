//! Capsule round trips of hand-built legacy and versioned tensors (feature `python`): the
//! header pointer survives `into_raw` (the capsule) and `consume_capsule`, and the deleter runs
//! once whether the capsule is consumed or dropped.
#![cfg(feature = "python")]

use dlpack_runtime::python::{consume_capsule, to_capsule};
use dlpack_runtime::{DataType, ImportBuffer, ImportedData, ManagedTensor};
use dlpack_tests::{Counter, Foreign, bytes_of};
use pyo3::prelude::*;

#[test]
fn foreign_capsules_round_trip_both_kinds() {
    Python::initialize();
    let values = [1.0f32, 2.0, 3.0, 4.0];
    for is_legacy in [false, true] {
        for consume in [false, true] {
            let counter = Counter::new();
            let f = Foreign::new(&bytes_of(&values), DataType::F32, &[2, 2]);
            // SAFETY: valid, owned managed tensors.
            let m = unsafe {
                if is_legacy {
                    ManagedTensor::from_raw_legacy(f.legacy(&counter)).unwrap()
                } else {
                    ManagedTensor::from_raw_versioned(f.versioned(&counter)).unwrap()
                }
            };
            m.layout().unwrap(); // tagged VALIDATED before it becomes a capsule
            let before = m.as_raw();
            Python::attach(|py| {
                let capsule = to_capsule(py, m).unwrap();
                let name = capsule.name().unwrap().unwrap();
                // SAFETY: the capsule's name is a static C string.
                let name = unsafe { name.as_cstr() }.to_str().unwrap().to_owned();
                assert_eq!(
                    name,
                    if is_legacy {
                        "dltensor"
                    } else {
                        "dltensor_versioned"
                    }
                );
                assert_eq!(counter.get(), 0);
                if consume {
                    let m = consume_capsule(capsule.as_any()).unwrap();
                    assert_eq!(m.as_raw(), before);
                    assert_eq!(m.is_legacy(), is_legacy);
                    assert_eq!(m.version().is_none(), is_legacy);
                    let data = ImportedData::<f32>::from_managed(m).unwrap();
                    assert_eq!(data.as_slice().unwrap(), &values);
                    assert_eq!(data.get(&[1, 0]).unwrap(), 3.0);
                    drop(capsule);
                    assert_eq!(counter.get(), 0, "a consumed capsule frees nothing");
                    drop(data);
                } else {
                    drop(capsule);
                }
            });
            assert_eq!(counter.get(), 1, "legacy={is_legacy} consume={consume}");
        }
    }
}
