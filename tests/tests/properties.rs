//! Property tests: export then import of random strided layouts preserves every element, and
//! an export is refused exactly when its layout reaches outside the buffer.

use dlpack_runtime::{DlpackExport, DlpackImport, ExportError, ImportedData, LayoutError};
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

/// Element index (into the buffer) of every logical element, row-major, computed directly.
fn reference_indices(shape: &[usize], strides: &[isize], first: isize) -> Vec<isize> {
    let numel: usize = shape.iter().product();
    let mut out = Vec::with_capacity(numel);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..numel {
        out.push(
            first
                + index
                    .iter()
                    .zip(strides)
                    .map(|(&i, &s)| i as isize * s)
                    .sum::<isize>(),
        );
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
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
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn round_trip_preserves_every_element((shape, strides) in layout(), slack in 0usize..3) {
        let numel: usize = shape.iter().product();
        let (mut lo, mut hi) = (0isize, 0isize);
        for (&e, &s) in shape.iter().zip(&strides) {
            if e > 0 {
                let reach = (e as isize - 1) * s;
                if reach < 0 { lo += reach } else { hi += reach }
            }
        }
        let first = -lo + slack as isize;
        let len = (first + hi + 1) as usize + slack;
        let buffer: Vec<i32> = (0..len as i32).collect();
        let expected: Vec<i32> = if numel == 0 {
            vec![]
        } else {
            reference_indices(&shape, &strides, first).into_iter().map(|i| buffer[i as usize]).collect()
        };
        let counter = Counter::new();
        let tensor = Tensor { data: buffer, shape: shape.clone(), strides: strides.clone(), offset: first as usize * 4, _guard: counter.guard() };
        let view = Strided::from_managed(tensor.to_dlpack().unwrap()).unwrap();
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
        let tensor = Tensor { data: vec![7; len], shape, strides, offset: offset * 4, _guard: counter.guard() };
        match tensor.to_dlpack() {
            Ok(managed) => {
                prop_assert!(inside, "accepted a layout outside the buffer");
                let view = Strided::from_managed(managed).unwrap();
                prop_assert!(view.data.to_vec().unwrap().iter().all(|&v| v == 7));
            }
            Err(err) => {
                prop_assert!(!inside, "refused a layout inside the buffer: {}", err);
                let is_out_of_buffer = matches!(err, ExportError::Layout(LayoutError::OutOfBuffer { .. }));
                prop_assert!(is_out_of_buffer, "{}", err);
            }
        }
        prop_assert_eq!(counter.get(), 1);
    }
}
