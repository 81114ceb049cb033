//! Rust-to-Rust exchange through DLPack: derived producers and consumers, hand-built foreign
//! tensors, deleter counts, and the exchange cases C01, C02, C04, C05, C06, C10. `copy` and
//! `dl_device` are parameters of the array API's `__dlpack__`:
//! <https://data-apis.org/array-api/latest/API_specification/generated/array_api.array.__dlpack__.html>.

use std::sync::Arc;

use dlpack_runtime::ffi::{self, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlpack_runtime::{
    Contiguity, DataType, Device, DlpackExport, DlpackImport, Element, ExportError, ExportRequest,
    HeaderError, ImportError, ImportedData, LayoutError, ManagedTensor, StreamError,
};
use dlpack_tests::{Counter, DropGuard, Foreign, READ_ONLY, bytes_of};

/// A producer with every role, and a guard that counts drops of the owner.
#[derive(DlpackExport)]
struct Tensor<T: Element> {
    #[dlpack(data)]
    data: Vec<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Option<Vec<isize>>,
    #[dlpack(byte_offset)]
    offset: usize,
    #[dlpack(device)]
    device: Device,
    _guard: DropGuard,
}

impl<T: Element> Tensor<T> {
    fn new(data: Vec<T>, shape: &[usize], counter: &Counter) -> Self {
        Self {
            data,
            shape: shape.to_vec(),
            strides: None,
            offset: 0,
            device: Device::CPU,
            _guard: counter.guard(),
        }
    }
}

/// A consumer of any strided layout.
#[derive(DlpackImport, Debug)]
struct Strided<T: Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
    #[dlpack(device)]
    device: Device,
}

/// A consumer that requires C-contiguous data (no strides field).
#[derive(DlpackImport, Debug)]
struct Compact<T: Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: Vec<T>) {
    let counter = Counter::new();
    let address = values.as_ptr();
    let n = values.len();
    let expected = values.clone();
    let managed = Tensor::new(values, &[n], &counter).into_dlpack().unwrap();
    assert_eq!(
        managed.version(),
        Some(ffi::DLPackVersion { major: 1, minor: 3 })
    );
    assert_eq!(managed.flags(), 0);
    let view = Strided::<T>::from_managed(managed).unwrap();
    assert_eq!(view.data.as_ptr(), address, "zero-copy");
    assert_eq!(view.shape, [n]);
    assert_eq!(view.strides, [1]);
    assert_eq!(view.device, Device::CPU);
    assert_eq!(view.data.as_slice().unwrap(), &expected[..]);
    assert_eq!(view.data.to_vec().unwrap(), expected);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(
        counter.get(),
        1,
        "deleter runs exactly once, when the consumer drops"
    );
}

#[test]
fn round_trips_every_basic_dtype_zero_copy() {
    round_trip(vec![1.5f32, -2.0, 3.25]);
    round_trip(vec![1.5f64, -2.0, f64::MAX]);
    round_trip(vec![i32::MIN, 0, 7]);
    round_trip(vec![i64::MIN, 0, i64::MAX]);
    round_trip(vec![0u8, 128, 255]);
    round_trip(vec![true, false, true]);
    round_trip(vec![u16::MAX, 1]);
    round_trip(vec![-1i8, 1]);
}

#[test]
fn deleter_runs_once_when_unconsumed() {
    let counter = Counter::new();
    let managed = Tensor::new(vec![1.0f32; 6], &[2, 3], &counter)
        .into_dlpack()
        .unwrap();
    assert_eq!(counter.get(), 0);
    drop(managed);
    assert_eq!(counter.get(), 1);
}

#[test]
fn deleter_runs_once_when_refused_by_the_consumer() {
    let counter = Counter::new();
    let managed = Tensor::new(vec![1i32, 2, 3], &[3], &counter)
        .into_dlpack()
        .unwrap();
    let err = Strided::<f32>::from_managed(managed).unwrap_err();
    assert_eq!(
        err,
        ImportError::Layout(LayoutError::DtypeMismatch {
            found: DataType::I32,
            expected: DataType::F32
        })
    );
    assert_eq!(
        err.to_string(),
        "cannot import: dtype is int32, expected float32"
    );
    assert_eq!(
        counter.get(),
        1,
        "refused import still calls the deleter exactly once"
    );
}

#[test]
fn iterating_a_huge_broadcast_reads_only_what_it_yields() {
    let counter = Counter::new();
    let mut t = Tensor::new(vec![7i64], &[1 << 40], &counter);
    t.strides = Some(vec![0]);
    let view = Strided::<i64>::from_managed(t.into_dlpack().unwrap()).unwrap();
    let elements = view.data.iter().unwrap();
    assert_eq!(elements.len(), 1 << 40);
    assert_eq!(elements.take(3).collect::<Vec<_>>(), [7, 7, 7]);
}

#[test]
fn strides_given_in_bytes_are_named_as_such() {
    let counter = Counter::new();
    // float32 2x3 with NumPy's byte strides (12, 4) instead of element strides (3, 1).
    let mut t = Tensor::new(vec![0f32; 6], &[2, 3], &counter);
    t.strides = Some(vec![12, 4]);
    let err = t.into_dlpack().unwrap_err();
    assert_eq!(
        err,
        ExportError::Layout(LayoutError::StridesInBytes {
            start: 0,
            end: 84,
            len: 24,
            element_bytes: 4
        })
    );
    assert_eq!(
        err.to_string(),
        "cannot export: layout reaches bytes [0, 84) of a buffer of 24 bytes, expected a span inside [0, 24); strides are in elements, and these look like bytes: divided by the element size (4 bytes) they would fit"
    );
    assert_eq!(counter.get(), 1);
}

#[test]
fn exporting_a_layout_outside_the_buffer_is_refused_and_drops_the_owner_once() {
    let counter = Counter::new();
    let err = Tensor::new(vec![0f32; 5], &[2, 3], &counter)
        .into_dlpack()
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::Layout(LayoutError::OutOfBuffer {
            start: 0,
            end: 24,
            len: 20
        })
    );
    assert_eq!(counter.get(), 1);

    let counter = Counter::new();
    let mut t = Tensor::new(vec![0f32; 6], &[2, 3], &counter);
    t.strides = Some(vec![3, -1]);
    let err = t.into_dlpack().unwrap_err();
    assert_eq!(
        err,
        ExportError::Layout(LayoutError::OutOfBuffer {
            start: -8,
            end: 16,
            len: 24
        })
    );
    assert_eq!(counter.get(), 1);

    let mut t = Tensor::new(vec![0f32; 6], &[2, 3], &counter);
    t.strides = Some(vec![3]);
    assert_eq!(
        t.into_dlpack().unwrap_err(),
        ExportError::Layout(LayoutError::StridesRank {
            shape: 2,
            strides: 1
        })
    );
    assert_eq!(counter.get(), 2);
}

#[test]
fn c01_flipped_then_transposed_exports_signed_strides() {
    // int32 (3, 4) = 0..12, flipped along axis 1, then transposed: shape (4, 3), strides (-1, 4),
    // logical element (0, 0) is original (0, 3), i.e. buffer index 3.
    let counter = Counter::new();
    let buffer: Vec<i32> = (0..12).collect();
    let base = buffer.as_ptr();
    let mut t = Tensor::new(buffer, &[4, 3], &counter);
    t.strides = Some(vec![-1, 4]);
    t.offset = 3 * 4;
    let expected: Vec<i32> = (0..4)
        .flat_map(|i| (0..3).map(move |j| 3 - i + 4 * j))
        .collect();
    let managed = t.into_dlpack().unwrap();
    let raw = managed.dl_tensor();
    // SAFETY: the exporter wrote `ndim` (2) strides.
    let strides = unsafe { std::slice::from_raw_parts(raw.strides, 2) };
    assert_eq!(strides, [-1, 4], "strides exported exactly, signed");
    let first = raw.data.cast::<u8>().wrapping_add(raw.byte_offset as usize);
    assert_eq!(
        first.cast::<i32>().cast_const(),
        base.wrapping_add(3),
        "data + byte_offset is element (0, 0)"
    );
    let view = Strided::<i32>::from_managed(managed).unwrap();
    assert_eq!(view.strides, [-1, 4]);
    assert_eq!(view.data.to_vec().unwrap(), expected);
    assert_eq!(view.data.get(&[0, 0]).unwrap(), 3);
    assert_eq!(view.data.get(&[3, 2]).unwrap(), 8);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn c02_negative_stride_import_and_contiguous_only_refusal() {
    // float64 arange(12).reshape(3, 4)[:, ::-1]: data at element 3, strides (4, -1).
    let values: Vec<f64> = (0..12).map(f64::from).collect();
    let counter = Counter::new();
    let foreign = Foreign::new(&bytes_of(&values), DataType::F64, &[3, 4])
        .strides(&[4, -1])
        .data_offset(3 * 8);
    // SAFETY: `versioned` returns a valid, owned managed tensor.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.clone().versioned(&counter)) }.unwrap();
    let view = Strided::<f64>::from_managed(managed).unwrap();
    assert_eq!(view.data.get(&[0, 0]).unwrap(), 3.0);
    assert_eq!(view.data.get(&[2, 3]).unwrap(), 8.0);
    assert_eq!(
        view.data.to_vec().unwrap(),
        [3., 2., 1., 0., 7., 6., 5., 4., 11., 10., 9., 8.]
    );
    assert_eq!(view.strides, [4, -1]);
    drop(view);
    assert_eq!(counter.get(), 1);

    // SAFETY: as above.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let err = Compact::<f64>::from_managed(managed).unwrap_err();
    assert_eq!(
        err,
        ImportError::Layout(LayoutError::NotContiguous {
            expected: Contiguity::C,
            shape: vec![3, 4],
            strides: vec![4, -1]
        })
    );
    assert_eq!(
        err.to_string(),
        "cannot import: tensor of shape [3, 4] and strides [4, -1] (elements) is not C-contiguous (row-major)"
    );
    assert_eq!(counter.get(), 2);
}

#[test]
fn c04_zero_size_tensors_both_ways() {
    for shape in [&[0usize][..], &[2, 0, 3]] {
        let counter = Counter::new();
        let managed = Tensor::new(Vec::<f32>::new(), shape, &counter)
            .into_dlpack()
            .unwrap();
        assert!(
            managed.dl_tensor().data.is_null(),
            "zero-size exports carry NULL data"
        );
        let view = Strided::<f32>::from_managed(managed).unwrap();
        assert_eq!(view.shape, shape);
        assert_eq!(view.data.to_vec().unwrap(), Vec::<f32>::new());
        assert!(view.data.as_slice().unwrap().is_empty());
        drop(view);
        assert_eq!(counter.get(), 1);

        let counter = Counter::new();
        let shape_i64: Vec<i64> = shape.iter().map(|&e| e as i64).collect();
        let foreign = Foreign::new(&[], DataType::F32, &shape_i64).null_data();
        // SAFETY: a valid, owned managed tensor.
        let managed =
            unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
        let view = Compact::<f32>::from_managed(managed).unwrap();
        assert_eq!(view.shape, shape);
        assert!(view.data.as_slice().unwrap().is_empty());
        drop(view);
        assert_eq!(counter.get(), 1);
    }
}

#[test]
fn c05_byte_offset_is_applied() {
    let values: Vec<f32> = (0..9).map(|v| v as f32).collect();
    let counter = Counter::new();
    let foreign = Foreign::new(&bytes_of(&values), DataType::F32, &[8]).byte_offset(4);
    // SAFETY: a valid, owned managed tensor.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(
        view.byte_offset, 0,
        "the data lends the bytes from element (0): the offset counts from there"
    );
    assert_eq!(
        view.data.as_ptr(),
        view.data
            .managed()
            .dl_tensor()
            .data
            .cast::<f32>()
            .wrapping_add(1)
            .cast_const()
    );
    assert_eq!(view.data.get(&[0]).unwrap(), 1.0);
    assert_eq!(view.data.get(&[7]).unwrap(), 8.0);
    assert_eq!(view.data.as_slice().unwrap(), &values[1..]);
}

#[test]
fn c06_bool_round_trips_and_invalid_bytes_are_refused() {
    let counter = Counter::new();
    let managed = Tensor::new(vec![true, false, true], &[3], &counter)
        .into_dlpack()
        .unwrap();
    let raw = managed.dl_tensor().dtype;
    assert_eq!((raw.code, raw.bits, raw.lanes), (6, 8, 1));
    let view = Compact::<bool>::from_managed(managed).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [true, false, true]);

    let foreign = Foreign::new(&[1, 2, 0], DataType::BOOL, &[3]);
    // SAFETY: a valid, owned managed tensor.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let view = Compact::<bool>::from_managed(managed).unwrap();
    let err = view.data.as_slice().unwrap_err();
    assert_eq!(
        err,
        LayoutError::InvalidValue {
            index: 1,
            bytes: vec![2],
            dtype: DataType::BOOL
        }
    );
    assert!(view.data.get(&[0]).unwrap());
    assert!(view.data.get(&[1]).is_err());
}

#[test]
fn c07_read_only_flag_refuses_mutable_access() {
    let values = [1i64, 2, 3];
    let counter = Counter::new();
    // SAFETY: valid, owned managed tensors.
    let writable = unsafe {
        ManagedTensor::from_raw_versioned(
            Foreign::new(&bytes_of(&values), DataType::I64, &[3]).versioned(&counter),
        )
    }
    .unwrap();
    let mut view = Compact::<i64>::from_managed(writable).unwrap();
    assert!(!view.data.is_read_only());
    view.data.as_slice_mut().unwrap()[0] = 10;
    view.data.set(&[2], 30).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [10, 2, 30]);
    drop(view);

    let foreign = Foreign::new(&bytes_of(&values), DataType::I64, &[3]).flags(READ_ONLY);
    // SAFETY: as above.
    let read_only =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let mut view = Compact::<i64>::from_managed(read_only).unwrap();
    assert!(view.data.is_read_only());
    assert_eq!(view.data.as_slice_mut().unwrap_err(), LayoutError::ReadOnly);
    assert_eq!(view.data.set(&[0], 5).unwrap_err(), LayoutError::ReadOnly);
    assert_eq!(view.data.as_slice().unwrap(), values);
    drop(view);

    // A legacy tensor cannot say whether it is writable: treated as read-only.
    // SAFETY: as above.
    let legacy = unsafe {
        ManagedTensor::from_raw_legacy(
            Foreign::new(&bytes_of(&values), DataType::I64, &[3]).legacy(&counter),
        )
    }
    .unwrap();
    let mut view = Compact::<i64>::from_managed(legacy).unwrap();
    assert_eq!(view.data.as_slice_mut().unwrap_err(), LayoutError::ReadOnly);
    assert_eq!(view.data.as_slice().unwrap(), values);
    drop(view);
    assert_eq!(counter.get(), 3);
}

#[test]
fn c10_foreign_major_version_is_refused_and_freed() {
    let counter = Counter::new();
    let foreign = Foreign::new(&bytes_of(&[1f32, 2.0]), DataType::F32, &[2]).version(2, 0);
    // SAFETY: a valid managed tensor of major 2 whose deleter is at offset 16.
    let err =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap_err();
    assert_eq!(
        err,
        HeaderError::UnsupportedVersion {
            found: ffi::DLPackVersion { major: 2, minor: 0 }
        }
    );
    assert_eq!(
        err.to_string(),
        "DLPack version 2.0 is not supported, expected major version 1"
    );
    assert_eq!(counter.get(), 1, "deleter still called");

    // Legacy tensors are read through the legacy layout.
    // SAFETY: a valid, owned legacy managed tensor.
    let legacy = unsafe {
        ManagedTensor::from_raw_legacy(
            Foreign::new(&bytes_of(&[1f32, 2.0]), DataType::F32, &[2]).legacy(&counter),
        )
    }
    .unwrap();
    assert!(legacy.is_legacy());
    assert_eq!(
        Compact::<f32>::from_managed(legacy)
            .unwrap()
            .data
            .as_slice()
            .unwrap(),
        [1.0, 2.0]
    );
    assert_eq!(counter.get(), 2);
}

#[test]
fn unknown_flags_are_refused_and_freed() {
    let counter = Counter::new();
    let foreign = Foreign::new(&bytes_of(&[1f32]), DataType::F32, &[1]).flags(READ_ONLY | 0x10);
    // SAFETY: a valid, owned managed tensor.
    let err =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap_err();
    assert_eq!(
        err,
        HeaderError::UnknownFlags {
            flags: 0x10,
            version: ffi::DLPackVersion { major: 1, minor: 3 }
        }
    );
    assert_eq!(counter.get(), 1);
}

#[test]
fn minor_versions_zero_to_three_are_accepted() {
    let counter = Counter::new();
    for minor in 0..=3 {
        let foreign = Foreign::new(&bytes_of(&[5u32, 6]), DataType::U32, &[2]).version(1, minor);
        // SAFETY: a valid, owned managed tensor.
        let managed =
            unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
        assert_eq!(
            Compact::<u32>::from_managed(managed)
                .unwrap()
                .data
                .as_slice()
                .unwrap(),
            [5, 6]
        );
    }
    assert_eq!(counter.get(), 4);
}

#[test]
fn null_strides_follow_the_version_rule() {
    let counter = Counter::new();
    let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
    // Version 1.1: NULL strides mean compact row-major.
    let foreign = Foreign::new(&bytes_of(&values), DataType::F32, &[2, 3])
        .version(1, 1)
        .null_strides();
    // SAFETY: a valid, owned managed tensor.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let view = Strided::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.strides, [3, 1]);
    assert_eq!(view.data.get(&[1, 0]).unwrap(), 3.0);
    // Version 1.3: NULL strides are refused for ndim > 0.
    let foreign = Foreign::new(&bytes_of(&values), DataType::F32, &[2, 3]).null_strides();
    // SAFETY: as above.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    assert_eq!(
        Strided::<f32>::from_managed(managed).unwrap_err(),
        ImportError::Layout(LayoutError::NullStrides { ndim: 2 })
    );
    drop(view);
    assert_eq!(counter.get(), 2);
}

#[test]
fn legacy_export_of_a_shared_tensor_is_a_writable_copy_or_refused_without_copies() {
    let counter = Counter::new();
    let shared = Arc::new(Tensor::new(vec![1u8, 2], &[2], &counter));
    // A legacy header cannot say read-only: the legacy consumer gets a copy of its own.
    for copy in [None, Some(true)] {
        let legacy = shared
            .clone()
            .into_dlpack_with(&ExportRequest::new().copy(copy))
            .unwrap();
        assert!(legacy.is_legacy());
        assert_ne!(
            legacy.dl_tensor().data.cast::<u8>().cast_const(),
            shared.data.as_ptr()
        );
        // SAFETY: a fresh, compact host copy of 2 bytes that this test owns.
        unsafe { legacy.dl_tensor().data.cast::<u8>().write(9) };
        let view = Compact::<u8>::from_managed(legacy).unwrap();
        assert_eq!(view.data.as_slice().unwrap(), [9, 2]);
        assert_eq!(shared.data, [1, 2], "the original is untouched");
    }
    let err = shared
        .clone()
        .into_dlpack_with(&ExportRequest::new().copy(Some(false)))
        .unwrap_err();
    assert_eq!(err, ExportError::ReadOnlyLegacy);
    let managed = shared.clone().into_dlpack().unwrap();
    assert_eq!(
        managed.flags() & DLPACK_FLAG_BITMASK_READ_ONLY,
        DLPACK_FLAG_BITMASK_READ_ONLY
    );
    drop(shared);
    assert_eq!(counter.get(), 0, "the export keeps the Arc alive");
    let view = Compact::<u8>::from_managed(managed).unwrap();
    assert!(view.data.is_read_only());
    assert_eq!(view.data.as_slice().unwrap(), [1, 2]);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn legacy_export_by_value() {
    let counter = Counter::new();
    let managed = Tensor::new(vec![4i16, 5], &[2], &counter)
        .into_dlpack_with(&ExportRequest::new())
        .unwrap();
    assert!(managed.is_legacy());
    let view = Compact::<i16>::from_managed(managed).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [4, 5]);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn copy_true_makes_a_compact_flagged_copy() {
    let counter = Counter::new();
    let buffer: Vec<i32> = (0..12).collect();
    let base = buffer.as_ptr();
    let mut t = Tensor::new(buffer, &[4, 3], &counter);
    t.strides = Some(vec![-1, 4]);
    t.offset = 12;
    let managed = t
        .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
        .unwrap();
    assert_eq!(counter.get(), 1, "the source is released once copied");
    assert_eq!(managed.flags(), DLPACK_FLAG_BITMASK_IS_COPIED);
    assert!(managed.is_copied());
    let view = Strided::<i32>::from_managed(managed).unwrap();
    assert_ne!(view.data.as_ptr(), base);
    assert_eq!(view.strides, [3, 1]);
    assert_eq!(
        view.data.as_slice().unwrap(),
        [3, 7, 11, 2, 6, 10, 1, 5, 9, 0, 4, 8]
    );
}

#[test]
fn copies_are_cache_line_aligned_at_every_size() {
    // Lengths around the alignment and an empty tensor; each twice, so that the second copy
    // may reuse the first one's freed memory (whose start the allocator aligns differently).
    for len in [0usize, 1, 3, 15, 16, 17, 63, 64, 65, 1000, 4097] {
        for _ in 0..2 {
            let counter = Counter::new();
            let buffer: Vec<i32> = (0..len as i32).rev().collect();
            let mut t = Tensor::new(buffer, &[len], &counter);
            // Reversed, so that the copy is a copy of elements, not a memcpy of the buffer.
            t.strides = Some(vec![-1]);
            t.offset = len.saturating_sub(1) * 4; // bytes
            let managed = t
                .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
                .unwrap();
            let data = managed.dl_tensor().data;
            // Zero-size tensors carry NULL data (`dlpack.h`, `DLTensor::data`).
            assert_eq!(data.is_null(), len == 0);
            assert_eq!(data as usize % 64, 0, "{len} elements at {data:p}");
            assert_eq!(managed.dl_tensor().byte_offset, 0);
            let view = Strided::<i32>::from_managed(managed).unwrap();
            let expected: Vec<i32> = (0..len as i32).collect();
            assert_eq!(view.data.as_slice().unwrap(), expected);
        }
    }
}

/// `copy=True` and `dl_device=(CPU, 0)` on CUDA memory (`__dlpack__`): a copy by the driver
/// with the `cuda` feature, so an error without a driver; refused without the feature;
/// `copy=False` is refused everywhere. The source is released exactly once on every path.
#[test]
fn copies_of_cuda_memory_need_the_driver() {
    let counter = Counter::new();
    let make = |len: usize| dlpack_tests::types::fake_cuda(len, &counter);
    let err = make(4)
        .into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::CPU)
                .copy(Some(false)),
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::CopyRequired {
            found: Device::cuda(0),
            requested: Device::CPU
        }
    );
    assert_eq!(
        err.to_string(),
        "copy=False but exporting a cuda:0 tensor to dl_device cpu:0 needs a copy"
    );
    assert_eq!(counter.get(), 1);
    let copy_true = ExportRequest::versioned().copy(Some(true));
    let to_host = ExportRequest::versioned().dl_device(Device::CPU);
    // Another CUDA device: a copy between devices with the `cuda` feature.
    let to_peer = ExportRequest::versioned().dl_device(Device::cuda(1));
    #[cfg(not(feature = "cuda"))]
    {
        let err = make(4).into_dlpack_with(&to_peer).unwrap_err();
        assert_eq!(
            err,
            ExportError::UnsupportedDevice {
                found: Device::cuda(0),
                requested: Device::cuda(1)
            }
        );
        assert_eq!(
            err.to_string(),
            "cannot export a cuda:0 tensor to dl_device cuda:1, expected cuda:0"
        );
        assert_eq!(
            make(4).into_dlpack_with(&copy_true).unwrap_err(),
            ExportError::CopyUnsupported {
                device: Device::cuda(0)
            }
        );
        assert_eq!(
            make(4).into_dlpack_with(&to_host).unwrap_err(),
            ExportError::UnsupportedDevice {
                found: Device::cuda(0),
                requested: Device::CPU
            }
        );
        assert_eq!(counter.get(), 4);
    }
    #[cfg(feature = "cuda")]
    {
        use dlpack_runtime::cuda::{self, CudaError};
        match cuda::init() {
            Err(CudaError::NoDriver) => {
                assert_ne!(dlpack_tests::expected_driver(), Some(true));
                let requests = [
                    copy_true,
                    to_host,
                    to_host.stream(None).copy(Some(true)),
                    to_peer,
                ];
                for request in requests {
                    for len in [0, 4] {
                        assert_eq!(
                            make(len).into_dlpack_with(&request).unwrap_err(),
                            ExportError::Cuda(CudaError::NoDriver),
                            "{request:?} of {len} elements"
                        );
                    }
                }
                // A stream illegal for the host is refused before the driver is asked.
                assert!(matches!(
                    make(4)
                        .into_dlpack_with(&to_host.stream(Some(1)))
                        .unwrap_err(),
                    ExportError::Stream(StreamError::Invalid { found: Some(1), .. })
                ));
                assert_eq!(counter.get(), 10);
            }
            other => {
                // With a driver (the simulator in the test command), the fake pointer is checked
                // and refused before anything is copied; tests/tests/cuda.rs covers real copies.
                assert_ne!(dlpack_tests::expected_driver(), Some(false), "{other:?}");
                other.expect("the driver initializes");
                for request in [
                    copy_true,
                    to_host,
                    to_host.stream(None).copy(Some(true)),
                    to_peer,
                ] {
                    let err = make(4).into_dlpack_with(&request).unwrap_err();
                    assert!(
                        matches!(err, ExportError::Cuda(CudaError::Driver { .. })),
                        "{request:?}: {err}"
                    );
                }
                assert_eq!(counter.get(), 5);
            }
        }
    }
}

/// Host memory that says it is pinned CUDA host memory (`kDLCUDAHost`): host-accessible.
struct PinnedLike(Vec<f32>);

// SAFETY: the `Vec` owns `len` initialized `f32` in host memory, readable by the host whatever
// device type it reports; `as_mut_ptr` derives from `&mut self`.
unsafe impl dlpack_runtime::ExportBuffer for PinnedLike {
    fn dtype(&self) -> DataType {
        DataType::F32
    }
    fn device(&self) -> Device {
        Device::new(dlpack_runtime::DeviceType::CudaHost, 0)
    }
    fn byte_len(&self) -> usize {
        self.0.len() * 4
    }
    fn as_ptr(&self) -> *const core::ffi::c_void {
        self.0.as_ptr().cast()
    }
    fn as_mut_ptr(&mut self) -> Option<*mut core::ffi::c_void> {
        Some(self.0.as_mut_ptr().cast())
    }
}

#[derive(DlpackExport)]
struct PinnedTensor {
    #[dlpack(data)]
    data: PinnedLike,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A host copy is `cpu:0` memory: it serves `copy=True` of host-accessible memory of another
/// device type only when `dl_device=(CPU, 0)` asks for the host (`__dlpack__`'s `dl_device`:
/// without it the export stays on the tensor's device).
#[test]
fn copies_of_host_accessible_memory_go_to_the_host_only_when_asked() {
    let pinned = Device::new(dlpack_runtime::DeviceType::CudaHost, 0);
    let make = || PinnedTensor {
        data: PinnedLike(vec![1.0, 2.0, 3.0]),
        shape: vec![3],
    };
    let err = make()
        .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
        .unwrap_err();
    assert_eq!(err, ExportError::CopyUnsupported { device: pinned });
    assert_eq!(
        err.to_string(),
        "cannot copy cuda_host:0 memory onto cuda_host:0, expected cpu:0 memory, a copy to dl_device cpu:0 of host-accessible memory, or CUDA device memory with the `cuda` feature"
    );
    let copied = make()
        .into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::CPU)
                .copy(Some(true)),
        )
        .unwrap();
    assert!(copied.is_copied());
    let view = Compact::<f32>::from_managed(copied).unwrap();
    assert_eq!(view.data.device(), Device::CPU);
    assert_eq!(view.data.as_slice().unwrap(), [1.0, 2.0, 3.0]);
    // Without a copy, dl_device=(CPU, 0) shares the memory as it is.
    let shared = make()
        .into_dlpack_with(&ExportRequest::versioned().dl_device(Device::CPU))
        .unwrap();
    assert!(!shared.is_copied());
    assert_eq!(Device::from_raw(shared.dl_tensor().device), pinned);
    // The devices an export can serve, named in the refusal: with the `cuda` feature, host
    // memory is also copied to any CUDA device.
    let rocm = Device::new(dlpack_runtime::DeviceType::Rocm, 0);
    let err = make()
        .into_dlpack_with(&ExportRequest::versioned().dl_device(rocm))
        .unwrap_err();
    let expected = if cfg!(feature = "cuda") {
        "cannot export a cuda_host:0 tensor to dl_device rocm:0, expected cuda_host:0, cpu:0 or a CUDA device"
    } else {
        "cannot export a cuda_host:0 tensor to dl_device rocm:0, expected cuda_host:0 or cpu:0"
    };
    assert_eq!(err.to_string(), expected);
}

#[test]
fn request_checks() {
    let counter = Counter::new();
    let err = Tensor::new(vec![1f32], &[1], &counter)
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(1)))
        .unwrap_err();
    assert!(matches!(
        err,
        ExportError::Stream(StreamError::Invalid { found: Some(1), .. })
    ));
    assert_eq!(
        err.to_string(),
        "stream=1 is not valid for a consumer on cpu:0, expected None"
    );
    // A host tensor reaches a CUDA device only as a copy, with the `cuda` feature
    // (tests/tests/cuda_multi_device.rs); ROCm never.
    let unreachable = if cfg!(feature = "cuda") {
        Device::new(dlpack_runtime::DeviceType::Rocm, 0)
    } else {
        Device::cuda(0)
    };
    let err = Tensor::new(vec![1f32], &[1], &counter)
        .into_dlpack_with(&ExportRequest::versioned().dl_device(unreachable))
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::UnsupportedDevice {
            found: Device::CPU,
            requested: unreachable
        }
    );
    let err = Tensor::new(vec![1f32], &[1], &counter)
        .into_dlpack_with(
            &ExportRequest::versioned()
                .dl_device(Device::cuda(0))
                .copy(Some(false)),
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::CopyRequired {
            found: Device::CPU,
            requested: Device::cuda(0)
        }
    );
    let ok = Tensor::new(vec![1f32], &[1], &counter).into_dlpack_with(
        &ExportRequest::versioned()
            .dl_device(Device::CPU)
            .copy(Some(false)),
    );
    assert!(ok.is_ok());
    let mut t = Tensor::new(vec![1f32], &[1], &counter);
    t.device = Device::cuda(0);
    assert_eq!(
        t.into_dlpack().unwrap_err(),
        ExportError::DeviceMismatch {
            field: Device::cuda(0),
            buffer: Device::CPU
        }
    );
    drop(ok);
    assert_eq!(counter.get(), 5);
}

#[test]
fn from_dlpack_exchanges_rust_to_rust() {
    let counter = Counter::new();
    let view = Compact::<f64>::from_dlpack(Tensor::new(vec![0.5f64, 1.5], &[2], &counter)).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [0.5, 1.5]);
    let err = Compact::<f64>::from_dlpack(Tensor::new(vec![0.5f64], &[2], &counter)).unwrap_err();
    assert!(matches!(
        err,
        ImportError::Export(ExportError::Layout(LayoutError::OutOfBuffer { .. }))
    ));
    drop(view);
    assert_eq!(counter.get(), 2);
}

#[test]
fn huge_broadcasts_give_errors_not_aborts() {
    // 2^40 elements, all the same 4 bytes: a valid stride-0 layout whose copy cannot fit.
    let counter = Counter::new();
    let mut t = Tensor::new(vec![7i32], &[1 << 40], &counter);
    t.strides = Some(vec![0]);
    let view = Strided::<i32>::from_managed(t.into_dlpack().unwrap()).unwrap();
    assert_eq!(view.data.get(&[(1 << 40) - 1]).unwrap(), 7);
    assert!(
        matches!(view.data.to_vec(), Err(LayoutError::CopyTooLarge { numel, element_bytes: 4 }) if numel == 1 << 40)
    );
    let mut t = Tensor::new(vec![7i32], &[1 << 62], &counter);
    t.strides = Some(vec![0]);
    let err = t
        .into_dlpack_with(&ExportRequest::versioned().copy(Some(true)))
        .unwrap_err();
    assert_eq!(
        err,
        ExportError::Layout(LayoutError::CopyTooLarge {
            numel: 1 << 62,
            element_bytes: 4
        })
    );
    drop(view);
    assert_eq!(counter.get(), 2);
}

#[test]
fn invalid_bool_errors_name_the_logical_index() {
    let counter = Counter::new();
    let foreign = Foreign::new(&[1, 1, 2, 1], DataType::BOOL, &[2, 2]);
    // SAFETY: a valid, owned managed tensor.
    let managed =
        unsafe { ManagedTensor::from_raw_versioned(foreign.versioned(&counter)) }.unwrap();
    let view = Strided::<bool>::from_managed(managed).unwrap();
    assert_eq!(
        view.data.get(&[1, 0]).unwrap_err(),
        LayoutError::InvalidValue {
            index: 2,
            bytes: vec![2],
            dtype: DataType::BOOL
        }
    );
    assert_eq!(
        view.data.to_vec().unwrap_err(),
        LayoutError::InvalidValue {
            index: 2,
            bytes: vec![2],
            dtype: DataType::BOOL
        }
    );
    // The strided iterator checks every byte before it reads any.
    assert_eq!(
        view.data.iter().unwrap_err(),
        LayoutError::InvalidValue {
            index: 2,
            bytes: vec![2],
            dtype: DataType::BOOL
        }
    );
}

/// A hand-written producer whose description panics on its second call (inside the export
/// block): the owner must still be dropped exactly once.
struct Flaky {
    data: Vec<f32>,
    shape: Vec<usize>,
    calls: std::cell::Cell<usize>,
    _guard: DropGuard,
}

impl DlpackExport for Flaky {
    fn export_parts(&self) -> dlpack_runtime::ExportParts<'_> {
        dlpack_runtime::ExportParts::shared(&self.data, &self.shape)
    }
    fn export_parts_mut(&mut self) -> dlpack_runtime::ExportParts<'_> {
        self.calls.set(self.calls.get() + 1);
        assert!(self.calls.get() < 2, "second description panics");
        dlpack_runtime::ExportParts::unique(&mut self.data, &self.shape)
    }
}

#[test]
fn a_panicking_producer_is_still_dropped_once() {
    let counter = Counter::new();
    let flaky = Flaky {
        data: vec![1.0],
        shape: vec![1],
        calls: std::cell::Cell::new(0),
        _guard: counter.guard(),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| flaky.into_dlpack()));
    assert!(result.is_err());
    assert_eq!(counter.get(), 1);
}

#[test]
fn byte_offsets_that_split_elements_are_refused() {
    let counter = Counter::new();
    let mut t = Tensor::new(vec![1.0f32, 2.0, 3.0], &[2], &counter);
    t.offset = 2;
    let err = t.into_dlpack().unwrap_err();
    assert_eq!(
        err,
        ExportError::Layout(LayoutError::OffsetNotElementAligned {
            byte_offset: 2,
            element_bytes: 4
        })
    );
    assert_eq!(
        err.to_string(),
        "cannot export: byte_offset is 2 bytes, expected a multiple of the element size (4 bytes); is it given in elements?"
    );
    assert_eq!(counter.get(), 1);
}

/// An owner that needs 64-byte alignment: its export's block is aligned to 64 bytes, more than
/// the block cache's classes are, so the block bypasses the cache.
#[repr(align(64))]
struct Aligned64;

/// A producer whose block has the alignment of [`Aligned64`].
#[derive(DlpackExport)]
struct OverAligned {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _aligned: Aligned64,
    _guard: DropGuard,
}

/// A producer of `u128` extra state, aligned to 16 bytes: the widest alignment the block cache
/// keeps.
#[derive(DlpackExport)]
struct Aligned16 {
    #[dlpack(data)]
    data: Vec<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _state: u128,
    _guard: DropGuard,
}

#[test]
fn blocks_of_every_size_and_alignment_round_trip_on_one_thread_or_two() {
    fn check(managed: ManagedTensor, shape: &[usize], counter: &Counter, expected_drops: usize) {
        let view = Strided::<f32>::from_managed(managed).unwrap();
        assert_eq!(view.shape, shape);
        assert_eq!(view.data.get(&vec![0; shape.len()]).unwrap(), 1.0);
        assert_eq!(counter.get(), expected_drops - 1);
        drop(view);
        assert_eq!(counter.get(), expected_drops, "the deleter ran once");
    }
    // Cached sizes (1 and 8 axes), a block too large for the cache (40 axes: 640 bytes of
    // shape and strides), each with an owner of 8-, 16- and 64-byte alignment, versioned or
    // one of them legacy (`ExportRequest::new()`: no `max_version`); every third dropped on
    // another thread, which keeps or frees the block.
    let counter = Counter::new();
    let mut drops = 0;
    for round in 0..3 {
        for ndim in [1, 8, 40] {
            let mut shape = vec![1; ndim];
            shape[0] = 6;
            let exports = [
                Tensor::new(vec![1.0f32; 6], &shape, &counter).into_dlpack(),
                Aligned16 {
                    data: vec![1.0; 6],
                    shape: shape.clone(),
                    _state: u128::MAX,
                    _guard: counter.guard(),
                }
                .into_dlpack(),
                OverAligned {
                    data: vec![1.0; 6],
                    shape: shape.clone(),
                    _aligned: Aligned64,
                    _guard: counter.guard(),
                }
                .into_dlpack_with(&ExportRequest::new()),
            ];
            for (which, managed) in exports.into_iter().enumerate() {
                let managed = managed.unwrap();
                drops += 1;
                if (round + which) % 3 == 0 {
                    let (shape, counter) = (&shape, &counter);
                    std::thread::scope(|s| {
                        s.spawn(move || check(managed, shape, counter, drops));
                    });
                } else {
                    check(managed, &shape, &counter, drops);
                }
            }
        }
    }
    assert_eq!(counter.get(), 27);
}
