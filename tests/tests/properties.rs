//! Property tests: export then import of random strided layouts preserves every element, a
//! `copy=True` export is the compact row-major copy of every element, and an export is refused
//! exactly when its layout reaches outside the buffer.

use dlpack_runtime::{
    DlpackExport, DlpackImport, ExportError, ExportRequest, ImportedData, LayoutError,
};
use dlpack_tests::strided::{fixture, reference_indices};
use dlpack_tests::{Counter, DropGuard};
use proptest::prelude::*;

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    data: Vec<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(byte_offset)]
    offset: usize,
    _guard: DropGuard,
}

#[derive(DlpackImport)]
struct Strided {
    #[dlpack(data)]
    data: ImportedData<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

fn layout() -> impl Strategy<Value = (Vec<usize>, Vec<isize>)> {
    (0usize..=4).prop_flat_map(|ndim| {
        (
            prop::collection::vec(0usize..=4, ndim),
            prop::collection::vec(-7isize..=7, ndim),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(dlpack_tests::proptest_cases(2048)))]

    #[test]
    fn round_trip_preserves_every_element((shape, strides) in layout(), slack in 0usize..3) {
        let numel: usize = shape.iter().product();
        let (buffer, first, expected) = fixture(&shape, &strides, slack, |i| i);
        let counter = Counter::new();
        let tensor = Tensor { data: buffer, shape: shape.clone(), strides: strides.clone(), offset: first * 4, _guard: counter.guard() };
        let view = Strided::from_managed(tensor.into_dlpack().unwrap()).unwrap();
        prop_assert_eq!(&view.shape, &shape);
        prop_assert_eq!(view.data.to_vec().unwrap(), expected);
        for (axis, &extent) in shape.iter().enumerate() {
            if extent > 1 && numel > 0 {
                prop_assert_eq!(view.strides[axis], strides[axis]);
            }
        }
        drop(view);
        prop_assert_eq!(counter.get(), 1);
    }

    #[test]
    fn the_strided_iterator_reads_what_to_vec_copies((shape, strides) in layout(), slack in 0usize..3) {
        let (buffer, first, expected) = fixture(&shape, &strides, slack, |i| i * 3 + 1);
        let counter = Counter::new();
        let tensor = Tensor { data: buffer, shape, strides, offset: first * 4, _guard: counter.guard() };
        let view = Strided::from_managed(tensor.into_dlpack().unwrap()).unwrap();
        let elements = view.data.iter().unwrap();
        prop_assert_eq!(elements.len(), expected.len());
        let read: Vec<_> = elements.collect();
        prop_assert_eq!(&read, &expected);
        prop_assert_eq!(read, view.data.to_vec().unwrap());
    }

    #[test]
    fn copy_true_is_the_compact_copy_of_every_element((shape, strides) in layout(), slack in 0usize..3) {
        let (buffer, first, expected) = fixture(&shape, &strides, slack, |i| i * 7 - 3);
        let counter = Counter::new();
        let tensor = Tensor { data: buffer, shape: shape.clone(), strides, offset: first * 4, _guard: counter.guard() };
        let managed = tensor.into_dlpack_with(&ExportRequest::versioned().copy(Some(true))).unwrap();
        prop_assert_eq!(counter.get(), 1, "the source is released once copied");
        prop_assert!(managed.is_copied());
        let view = Strided::from_managed(managed).unwrap();
        prop_assert_eq!(&view.shape, &shape);
        prop_assert_eq!(view.data.as_slice().unwrap(), &expected[..]);
    }

    #[test]
    fn export_is_refused_exactly_when_outside_the_buffer(
        (shape, strides) in layout(),
        offset in 0usize..40,
        len in 0usize..40,
    ) {
        let numel: usize = shape.iter().product();
        let inside = numel == 0 || reference_indices(&shape, &strides, offset as isize)
            .iter()
            .all(|&i| i >= 0 && (i as usize) < len);
        let counter = Counter::new();
        let (shape_copy, strides_copy) = (shape.clone(), strides.clone());
        let tensor = Tensor { data: vec![7; len], shape, strides, offset: offset * 4, _guard: counter.guard() };
        match tensor.into_dlpack() {
            Ok(managed) => {
                prop_assert!(inside, "accepted a layout outside the buffer");
                let view = Strided::from_managed(managed).unwrap();
                prop_assert!(view.data.to_vec().unwrap().iter().all(|&v| v == 7));
            }
            Err(err) => {
                prop_assert!(!inside, "refused a layout inside the buffer: {}", err);
                match err {
                    ExportError::Layout(LayoutError::OutOfBuffer { .. }) => {}
                    // Named only when the strides, divided by the element size (4 bytes),
                    // would keep the layout inside the buffer.
                    ExportError::Layout(LayoutError::StridesInBytes { element_bytes: 4, .. }) => {
                        let divided: Vec<isize> = strides_copy.iter().map(|s| s / 4).collect();
                        prop_assert!(strides_copy.iter().zip(&shape_copy).all(|(s, &e)| e <= 1 || s % 4 == 0));
                        prop_assert!(reference_indices(&shape_copy, &divided, offset as isize)
                            .iter()
                            .all(|&i| i >= 0 && (i as usize) < len));
                    }
                    err => prop_assert!(false, "{}", err),
                }
            }
        }
        prop_assert_eq!(counter.get(), 1);
    }
}

mod raw_validation {
    use dlpack_runtime::__testing::{self as layout, NullStrides};
    use dlpack_runtime::ffi::{DLDataType, DLDevice, DLTensor};
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct Raw {
        ndim: i32,
        shape: Option<Vec<i64>>,
        strides: Option<Vec<i64>>,
        byte_offset: u64,
        dtype: DLDataType,
        data: usize,
        refuse_null_strides: bool,
        padded: bool,
    }

    fn extent() -> impl Strategy<Value = i64> {
        prop_oneof![8 => -2i64..6, 1 => any::<i64>(), 1 => Just(i64::MAX), 1 => Just(1 << 40)]
    }

    fn stride() -> impl Strategy<Value = i64> {
        prop_oneof![8 => -9i64..9, 1 => any::<i64>(), 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
    }

    fn raw() -> impl Strategy<Value = Raw> {
        (0usize..6, -2i32..=1, any::<bool>(), any::<bool>())
            .prop_flat_map(|(len, ndim_delta, null_shape, null_strides)| {
                (
                    Just(len as i32 + if len == 0 { ndim_delta.min(0) } else { 0 }),
                    prop::collection::vec(extent(), len)
                        .prop_map(move |s| (!null_shape).then_some(s)),
                    prop::collection::vec(stride(), len)
                        .prop_map(move |s| (!null_strides).then_some(s)),
                    prop_oneof![4 => 0u64..64, 1 => any::<u64>()],
                    (
                        any::<u8>(),
                        prop_oneof![4 => Just(8u8), 4 => Just(32u8), 1 => any::<u8>()],
                        prop_oneof![4 => Just(1u16), 1 => any::<u16>()],
                    ),
                    prop_oneof![
                        Just(0usize),
                        Just(0x1000usize),
                        Just(usize::MAX - 64),
                        Just(64usize)
                    ],
                    any::<bool>(),
                    any::<bool>(),
                )
            })
            .prop_map(
                |(ndim, shape, strides, byte_offset, (code, bits, lanes), data, refuse, padded)| {
                    Raw {
                        ndim,
                        shape,
                        strides,
                        byte_offset,
                        dtype: DLDataType { code, bits, lanes },
                        data,
                        refuse_null_strides: refuse,
                        padded,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(dlpack_tests::proptest_cases(4096)))]

        /// Validation never panics, and an accepted layout's every element lies inside the span
        /// it reports, which fits the address space.
        #[test]
        fn validation_is_total_and_sound(mut r in raw()) {
            let ndim = r.ndim;
            let t = DLTensor {
                data: r.data as *mut core::ffi::c_void,
                device: DLDevice { device_type: 1, device_id: 0 },
                ndim,
                dtype: r.dtype,
                shape: r.shape.as_mut().map_or(core::ptr::null_mut(), |s| s.as_mut_ptr()),
                strides: r.strides.as_mut().map_or(core::ptr::null_mut(), |s| s.as_mut_ptr()),
                byte_offset: r.byte_offset,
            };
            let rule = if r.refuse_null_strides { NullStrides::Refuse } else { NullStrides::MeanCompact };
            // SAFETY: `shape`/`strides` are NULL or point to `ndim` live entries (`len` entries,
            // and `ndim == len` whenever `len > 0`).
            let Ok(l) = (unsafe { layout::validate(&t, rule, r.padded) }) else { return Ok(()) };
            let numel: i128 = l.shape().iter().map(|&e| e as i128).product();
            prop_assert_eq!(l.numel() as i128, numel);
            let span = l.span();
            prop_assert!(span.start <= span.end);
            if numel > 0 {
                prop_assert!(r.data != 0);
                let base = r.data as i128;
                prop_assert!(base + span.start as i128 >= 0 && base + span.end as i128 <= usize::MAX as i128);
            }
            if let Some(size) = l.dtype().element_bytes().filter(|_| numel <= 4096) {
                let (start, end) = (span.start - l.byte_offset() as isize, span.end - l.byte_offset() as isize);
                let mut count = 0usize;
                l.for_each_offset(|offset| {
                    count += 1;
                    assert!(offset >= start && offset + size as isize <= end, "element at {offset} outside {start}..{end}");
                }).unwrap();
                prop_assert_eq!(count as i128, numel);
            }
        }
    }
}
