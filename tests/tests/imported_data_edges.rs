//! Edge cases of `ManagedTensor` and `ImportedData`: legacy and versioned headers round-tripped
//! through `into_raw`, the deleter once on every refusal, empty and misaligned data, strided
//! views, failed validations, non-host devices, concurrent first validation, 0-d tensors.

use dlpack_runtime::ffi::{self, DLManagedTensor, DLManagedTensorVersioned};
use dlpack_runtime::{
    Contiguity, DataType, Device, DlpackImport, HeaderError, ImportBuffer, ImportError,
    ImportedData, LayoutError, ManagedTensor, RawManagedTensor, Writability,
};
use dlpack_tests::{Counter, Foreign, bytes_of};

#[derive(DlpackImport, Debug)]
#[allow(dead_code)] // fields filled by the derive, read by some tests only
struct Strided<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(device)]
    device: Device,
}

#[derive(DlpackImport, Debug)]
#[allow(dead_code)] // as `Strided`
struct Compact<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn versioned(f: Foreign, counter: &Counter) -> (ManagedTensor, *mut DLManagedTensorVersioned) {
    let p = f.versioned(counter);
    // SAFETY: `versioned` returns a valid, owned managed tensor.
    (unsafe { ManagedTensor::from_raw_versioned(p) }.unwrap(), p)
}

fn legacy(f: Foreign, counter: &Counter) -> (ManagedTensor, *mut DLManagedTensor) {
    let p = f.legacy(counter);
    // SAFETY: `legacy` returns a valid, owned managed tensor.
    (unsafe { ManagedTensor::from_raw_legacy(p) }.unwrap(), p)
}

fn f32s(n: usize) -> Vec<f32> {
    (0..n).map(|v| v as f32).collect()
}

#[test]
fn legacy_header_fields_and_round_trips() {
    let counter = Counter::new();
    let values = f32s(6);
    let (m, p) = legacy(
        Foreign::new(&bytes_of(&values), DataType::F32, &[2, 3]),
        &counter,
    );
    assert!(m.is_legacy());
    assert_eq!(m.version(), None);
    assert_eq!(m.flags(), 0);
    assert_eq!(m.writability(), Writability::Unknown);
    assert!(m.is_read_only());
    assert!(!m.is_copied());
    // SAFETY: `p` is owned by `m`, alive; read only.
    assert!(std::ptr::eq(m.dl_tensor(), unsafe { &(*p).dl_tensor }));
    assert_eq!(
        m.as_raw(),
        RawManagedTensor::Legacy(std::ptr::NonNull::new(p).unwrap())
    );
    assert_eq!(m.dl_tensor().ndim, 2);
    assert!(!m.is_validated());
    m.layout().unwrap();
    // The validation mark must not disturb the pointer or the kind.
    assert!(m.is_validated() && m.is_legacy());
    assert_eq!(
        m.as_raw(),
        RawManagedTensor::Legacy(std::ptr::NonNull::new(p).unwrap())
    );
    let raw = m.into_raw();
    assert_eq!(counter.get(), 0, "into_raw does not delete");
    let RawManagedTensor::Legacy(q) = raw else {
        panic!("kind lost: {raw:?}")
    };
    assert_eq!(q.as_ptr(), p);
    // SAFETY: ownership handed back by `into_raw`.
    let m = unsafe { ManagedTensor::from_raw_legacy(q.as_ptr()) }.unwrap();
    let data = ImportedData::<f32>::from_managed(m).unwrap();
    assert_eq!(data.as_slice().unwrap(), &values[..]);
    assert_eq!(data.get(&[1, 2]).unwrap(), 5.0);
    let mut data = data;
    assert_eq!(data.as_slice_mut().unwrap_err(), LayoutError::ReadOnly);
    drop(data);
    assert_eq!(counter.get(), 1);
}

#[test]
fn versioned_header_fields_and_round_trips() {
    let counter = Counter::new();
    let values = f32s(4);
    let flags = ffi::DLPACK_FLAG_BITMASK_READ_ONLY | ffi::DLPACK_FLAG_BITMASK_IS_COPIED;
    let f = Foreign::new(&bytes_of(&values), DataType::F32, &[4])
        .version(1, 1)
        .flags(flags);
    let (m, p) = versioned(f, &counter);
    assert!(!m.is_legacy());
    assert_eq!(m.version(), Some(ffi::DLPackVersion { major: 1, minor: 1 }));
    assert_eq!(m.flags(), flags);
    assert_eq!(m.writability(), Writability::ReadOnly);
    assert!(m.is_copied());
    // SAFETY: `p` is owned by `m`, alive; read only.
    assert!(std::ptr::eq(m.dl_tensor(), unsafe { &(*p).dl_tensor }));
    m.layout().unwrap();
    assert!(m.is_validated() && !m.is_legacy());
    let raw = m.into_raw();
    assert_eq!(
        raw,
        RawManagedTensor::Versioned(std::ptr::NonNull::new(p).unwrap())
    );
    assert_eq!(counter.get(), 0);
    let RawManagedTensor::Versioned(q) = raw else {
        unreachable!()
    };
    // SAFETY: ownership handed back by `into_raw`.
    let m = unsafe { ManagedTensor::from_raw_versioned(q.as_ptr()) }.unwrap();
    assert_eq!(m.flags(), flags);
    drop(m);
    assert_eq!(counter.get(), 1);
}

#[test]
fn deleter_runs_once_on_every_refusal() {
    let values = f32s(4);
    let base = || Foreign::new(&bytes_of(&values), DataType::F32, &[2, 2]);
    for major in [0, 2] {
        let counter = Counter::new();
        let p = base().version(major, 0).versioned(&counter);
        // SAFETY: valid, owned.
        let err = unsafe { ManagedTensor::from_raw_versioned(p) }.unwrap_err();
        assert!(matches!(err, HeaderError::UnsupportedVersion { .. }));
        assert_eq!(counter.get(), 1);
    }
    let counter = Counter::new();
    let p = base().flags(0x10).versioned(&counter);
    // SAFETY: valid, owned.
    let err = unsafe { ManagedTensor::from_raw_versioned(p) }.unwrap_err();
    assert!(matches!(err, HeaderError::UnknownFlags { flags: 0x10, .. }));
    assert_eq!(counter.get(), 1);

    // Constraint refusals, versioned and legacy: dtype, contiguity, validation.
    let refusals: Vec<Box<dyn Fn() -> Foreign>> = vec![
        Box::new(|| Foreign::new(&bytes_of(&values), DataType::I32, &[2, 2])),
        Box::new(|| base().strides(&[1, 2])),
        Box::new(|| {
            let mut f = base();
            f.shape = Some(vec![2, -2]);
            f
        }),
    ];
    for make in &refusals {
        let counter = Counter::new();
        let (m, _) = versioned(make(), &counter);
        Compact::<f32>::from_managed(m).unwrap_err();
        assert_eq!(counter.get(), 1);
        let counter = Counter::new();
        let (m, _) = legacy(make(), &counter);
        Compact::<f32>::from_managed(m).unwrap_err();
        assert_eq!(counter.get(), 1);
        let counter = Counter::new();
        let (m, _) = legacy(make(), &counter);
        ImportedData::<f64>::from_managed(m).unwrap_err();
        assert_eq!(counter.get(), 1);
    }
}

#[test]
fn empty_tensors_with_misaligned_or_null_data_import_and_read_as_empty() {
    for shape in [&[0i64][..], &[3, 0], &[0, 2, 5]] {
        let storage = [0u8; 16];
        for f in [
            Foreign::new(&storage, DataType::F32, shape).data_offset(1),
            Foreign::new(&storage, DataType::F32, shape)
                .data_offset(4)
                .byte_offset(1),
            Foreign::new(&storage, DataType::F32, shape).null_data(),
            Foreign::new(&storage, DataType::F32, shape)
                .null_data()
                .byte_offset(3),
        ] {
            for is_legacy in [false, true] {
                let counter = Counter::new();
                let m = if is_legacy {
                    legacy(f.clone(), &counter).0
                } else {
                    versioned(f.clone(), &counter).0
                };
                let mut view = Compact::<f32>::from_managed(m).unwrap();
                assert_eq!(view.data.as_slice().unwrap(), &[] as &[f32]);
                assert_eq!(view.data.to_vec().unwrap(), Vec::<f32>::new());
                assert_eq!(view.data.iter().unwrap().count(), 0);
                if is_legacy {
                    assert_eq!(view.data.as_slice_mut().unwrap_err(), LayoutError::ReadOnly);
                } else {
                    assert!(view.data.as_slice_mut().unwrap().is_empty());
                }
                drop(view);
                assert_eq!(counter.get(), 1);
            }
        }
    }
}

#[test]
fn non_empty_misaligned_data_is_refused_for_typed_access() {
    let storage = [0u8; 32];
    for f in [
        Foreign::new(&storage, DataType::F32, &[2]).data_offset(2),
        Foreign::new(&storage, DataType::F32, &[2])
            .data_offset(4)
            .byte_offset(1),
        Foreign::new(&storage, DataType::F64, &[1, 1]).data_offset(4),
        // Misaligned and not contiguous: alignment is reported first.
        Foreign::new(&storage, DataType::F32, &[2, 2])
            .strides(&[1, 2])
            .data_offset(1),
    ] {
        let counter = Counter::new();
        let (m, _) = versioned(f.clone(), &counter);
        let address = m.dl_tensor().data as usize + m.dl_tensor().byte_offset as usize;
        let align = if f.dtype == DataType::F64 { 8 } else { 4 };
        let expected = LayoutError::Misaligned { address, align };
        if f.dtype == DataType::F64 {
            let mut data = ImportedData::<f64>::from_managed(m).unwrap();
            assert_eq!(data.as_slice().unwrap_err(), expected);
            assert_eq!(data.as_slice_mut().unwrap_err(), expected);
            assert_eq!(data.get(&[0, 0]).unwrap_err(), expected);
            assert_eq!(data.set(&[0, 0], 1.0).unwrap_err(), expected);
            assert_eq!(data.to_vec().unwrap_err(), expected);
            assert_eq!(data.iter().err().unwrap(), expected);
            // Alignment is not part of validation.
            data.layout().unwrap();
        } else {
            let mut data = ImportedData::<f32>::from_managed(m).unwrap();
            let index = vec![0; f.ndim as usize];
            assert_eq!(data.as_slice().unwrap_err(), expected);
            assert_eq!(data.as_slice_mut().unwrap_err(), expected);
            assert_eq!(data.get(&index).unwrap_err(), expected);
            assert_eq!(data.to_vec().unwrap_err(), expected);
            assert_eq!(data.iter().err().unwrap(), expected);
            // The tensor stays validated; giving it back does not delete it.
            let m = data.into_managed();
            assert!(m.is_validated());
            assert_eq!(counter.get(), 0);
            drop(m);
        }
        assert_eq!(counter.get(), 1);
    }
}

#[test]
fn strided_views_refuse_slices_but_read_elements() {
    let values: Vec<f64> = (0..12).map(f64::from).collect();
    for is_legacy in [false, true] {
        let counter = Counter::new();
        let f = Foreign::new(&bytes_of(&values), DataType::F64, &[3, 4])
            .strides(&[4, -1])
            .data_offset(3 * 8);
        let m = if is_legacy {
            legacy(f, &counter).0
        } else {
            versioned(f, &counter).0
        };
        let mut view = Strided::<f64>::from_managed(m).unwrap();
        let expected = LayoutError::NotContiguous {
            expected: Contiguity::C,
            shape: vec![3, 4],
            strides: vec![4, -1],
        };
        assert_eq!(view.data.as_slice().unwrap_err(), expected);
        if is_legacy {
            assert_eq!(view.data.as_slice_mut().unwrap_err(), LayoutError::ReadOnly);
        } else {
            assert_eq!(view.data.as_slice_mut().unwrap_err(), expected);
        }
        assert_eq!(view.data.get(&[0, 0]).unwrap(), 3.0);
        assert_eq!(view.data.get(&[2, 3]).unwrap(), 8.0);
        let want = [3., 2., 1., 0., 7., 6., 5., 4., 11., 10., 9., 8.];
        assert_eq!(view.data.to_vec().unwrap(), want);
        assert_eq!(view.data.iter().unwrap().collect::<Vec<_>>(), want);
        if !is_legacy {
            view.data.set(&[0, 0], 30.0).unwrap();
            assert_eq!(view.data.get(&[0, 0]).unwrap(), 30.0);
        }
        drop(view);
        assert_eq!(counter.get(), 1);
    }

    // Transposed (F order), and a broadcast: slices refused, elements readable.
    let counter = Counter::new();
    let values = f32s(6);
    let cases: [(&[i64], &[i64], [f32; 6]); 2] = [
        (&[3, 2], &[1, 3], [0., 3., 1., 4., 2., 5.]),
        (&[2, 3], &[0, 1], [0., 1., 2., 0., 1., 2.]),
    ];
    for (shape, strides, elements) in cases {
        let f = Foreign::new(&bytes_of(&values), DataType::F32, shape).strides(strides);
        let view = Strided::<f32>::from_managed(versioned(f, &counter).0).unwrap();
        assert_eq!(
            view.data.as_slice().unwrap_err(),
            LayoutError::NotContiguous {
                expected: Contiguity::C,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            }
        );
        assert_eq!(view.data.to_vec().unwrap(), elements);
    }
    assert_eq!(counter.get(), 2);

    // Axes of extent 1 carry any stride and stay contiguous; NULL strides are compact.
    let counter = Counter::new();
    let f = Foreign::new(&bytes_of(&values), DataType::F32, &[1, 6]).strides(&[99, 1]);
    let view = Strided::<f32>::from_managed(versioned(f, &counter).0).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), &values[..]);
    let f = Foreign::new(&bytes_of(&values), DataType::F32, &[2, 3]).null_strides();
    let view2 = Compact::<f32>::from_managed(legacy(f, &counter).0).unwrap();
    assert_eq!(view2.data.as_slice().unwrap(), &values[..]);
    drop((view, view2));
    assert_eq!(counter.get(), 2);
}

#[test]
fn a_failed_validation_is_reported_on_every_access() {
    let values = f32s(4);
    let cases: Vec<(Foreign, LayoutError)> = vec![
        (
            {
                let mut f = Foreign::new(&bytes_of(&values), DataType::F32, &[2, 2]).data_offset(1);
                f.shape = Some(vec![2, -2]);
                f
            },
            LayoutError::NegativeExtent {
                axis: 1,
                extent: -2,
            },
        ),
        (
            Foreign::new(&bytes_of(&values), DataType::F32, &[2]).null_data(),
            LayoutError::NullData { numel: 2 },
        ),
        (
            Foreign::new(&bytes_of(&values), DataType::F32, &[2])
                .null_strides()
                .data_offset(1),
            LayoutError::NullStrides { ndim: 1 },
        ),
    ];
    for (f, expected) in cases {
        let counter = Counter::new();
        let (m, _) = versioned(f.clone(), &counter);
        let mut data = match ImportedData::<f32>::from_managed(m) {
            Ok(data) => data,
            Err(e) => panic!("ImportedData::from_managed validates nothing itself: {e}"),
        };
        assert_eq!(data.layout().unwrap_err(), expected);
        assert_eq!(data.as_slice().unwrap_err(), expected);
        assert_eq!(data.as_slice_mut().unwrap_err(), expected);
        assert_eq!(data.to_vec().unwrap_err(), expected);
        assert_eq!(data.iter().err().unwrap(), expected);
        let index = vec![0; f.ndim as usize];
        assert_eq!(data.get(&index).unwrap_err(), expected);
        assert!(!data.managed().is_validated());
        drop(data);
        assert_eq!(counter.get(), 1);
        // Through the derive: refused at import, deleter once.
        let counter = Counter::new();
        let (m, _) = versioned(f, &counter);
        assert_eq!(
            Strided::<f32>::from_managed(m).unwrap_err(),
            ImportError::Layout(expected)
        );
        assert_eq!(counter.get(), 1);
    }
}

#[test]
fn non_host_devices_are_refused_for_host_access() {
    let values = f32s(4);
    for (device, host) in [
        (Device::cuda(0), false),
        (Device::new(dlpack_runtime::DeviceType::Vulkan, 0), false),
        (Device::new(dlpack_runtime::DeviceType::CudaHost, 0), true),
        (
            Device::new(dlpack_runtime::DeviceType::CudaManaged, 0),
            true,
        ),
    ] {
        for shape in [&[4i64][..], &[0]] {
            let counter = Counter::new();
            let mut f = Foreign::new(&bytes_of(&values), DataType::F32, shape);
            f.device = device;
            let mut view = Strided::<f32>::from_managed(versioned(f, &counter).0).unwrap();
            assert_eq!(view.device, device);
            if host {
                assert_eq!(view.data.as_slice().unwrap().len(), shape[0] as usize);
            } else {
                let expected = LayoutError::NotHostAccessible { device };
                assert_eq!(view.data.as_slice().unwrap_err(), expected);
                assert_eq!(view.data.as_slice_mut().unwrap_err(), expected);
                assert_eq!(view.data.to_vec().unwrap_err(), expected);
                assert_eq!(view.data.iter().err().unwrap(), expected);
                if shape[0] > 0 {
                    assert_eq!(view.data.get(&[0]).unwrap_err(), expected);
                }
                // Device before alignment, as `check_typed` orders them.
            }
            drop(view);
            assert_eq!(counter.get(), 1);
        }
    }
    // A misaligned non-host tensor reports the device, not the alignment.
    let counter = Counter::new();
    let mut f = Foreign::new(&bytes_of(&values), DataType::F32, &[2]).data_offset(2);
    f.device = Device::cuda(1);
    let view = Strided::<f32>::from_managed(versioned(f, &counter).0).unwrap();
    assert_eq!(
        view.data.get(&[0]).unwrap_err(),
        LayoutError::NotHostAccessible {
            device: Device::cuda(1)
        }
    );
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn concurrent_first_validation_keeps_pointer_and_kind() {
    let values = f32s(8);
    let counter = Counter::new();
    let (m, p) = legacy(
        Foreign::new(&bytes_of(&values), DataType::F32, &[8]),
        &counter,
    );
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let l = m.layout().unwrap();
                assert_eq!(l.numel(), 8);
                assert!(m.is_legacy());
            });
        }
    });
    assert_eq!(
        m.as_raw(),
        RawManagedTensor::Legacy(std::ptr::NonNull::new(p).unwrap())
    );
    drop(m);
    assert_eq!(counter.get(), 1);
}

#[test]
fn zero_d_tensors_of_both_kinds_are_one_element() {
    for is_legacy in [false, true] {
        let counter = Counter::new();
        let f = Foreign::new(&bytes_of(&[7.5f32]), DataType::F32, &[]);
        let m = if is_legacy {
            legacy(f, &counter).0
        } else {
            versioned(f, &counter).0
        };
        let data = ImportedData::<f32>::from_managed(m).unwrap();
        assert_eq!(data.layout().unwrap().numel(), 1);
        assert_eq!(data.as_slice().unwrap(), &[7.5]);
        assert_eq!(data.get(&[]).unwrap(), 7.5);
        assert_eq!(data.to_vec().unwrap(), [7.5]);
        drop(data);
        assert_eq!(counter.get(), 1);
    }
    assert_eq!(
        size_of::<ManagedTensor>(),
        size_of::<usize>(),
        "one word, as before"
    );
}

static MISALIGNED_DELETES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn count_versioned(_: *mut DLManagedTensorVersioned) {
    MISALIGNED_DELETES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

unsafe extern "C" fn count_legacy(_: *mut DLManagedTensor) {
    MISALIGNED_DELETES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn misaligned_headers_are_refused_and_their_deleter_runs_once() {
    use std::sync::atomic::Ordering;
    let f = Foreign::new(&bytes_of(&[1.0f32]), DataType::F32, &[1]);
    let counter = Counter::new();
    // A well-formed header copied to an address 4 bytes off its alignment.
    let good = f.clone().versioned(&counter);
    let mut bytes = vec![0u64; size_of::<DLManagedTensorVersioned>() / 8 + 2];
    let at = bytes.as_mut_ptr().cast::<u8>().wrapping_add(4);
    // SAFETY: `good` is a valid header; `at` has room for one (two spare words), unaligned.
    unsafe {
        let mut header = good.read();
        header.deleter = Some(count_versioned);
        at.cast::<DLManagedTensorVersioned>()
            .write_unaligned(header);
    }
    let before = MISALIGNED_DELETES.load(Ordering::SeqCst);
    // SAFETY: a managed tensor (misaligned) whose deleter only counts.
    let err = unsafe { ManagedTensor::from_raw_versioned(at.cast()) }.unwrap_err();
    assert_eq!(
        err,
        HeaderError::Misaligned {
            address: at as usize,
            align: align_of::<DLManagedTensorVersioned>()
        }
    );
    assert_eq!(MISALIGNED_DELETES.load(Ordering::SeqCst), before + 1);
    // SAFETY: `good` is still owned here; its own deleter frees it.
    drop(unsafe { ManagedTensor::from_raw_versioned(good) }.unwrap());

    let good = f.legacy(&counter);
    // SAFETY: as above, for a legacy header.
    unsafe {
        let mut header = good.read();
        header.deleter = Some(count_legacy);
        at.cast::<DLManagedTensor>().write_unaligned(header);
    }
    // SAFETY: as above.
    let err = unsafe { ManagedTensor::from_raw_legacy(at.cast()) }.unwrap_err();
    assert!(matches!(err, HeaderError::Misaligned { .. }));
    assert_eq!(MISALIGNED_DELETES.load(Ordering::SeqCst), before + 2);
    // SAFETY: as above.
    drop(unsafe { ManagedTensor::from_raw_legacy(good) }.unwrap());
    assert_eq!(counter.get(), 2);
}
