//! Unit tests of validation and layout arithmetic.

use super::*;
use core::ptr;

use super::checks::*;
use crate::tensor::dtype::DataTypeCode;

fn tensor(
    data: *mut c_void,
    shape: &mut [i64],
    strides: Option<&mut [i64]>,
    dtype: DataType,
) -> ffi::DLTensor {
    ffi::DLTensor {
        data,
        device: Device::CPU.to_raw(),
        ndim: shape.len() as i32,
        dtype: dtype.to_raw(),
        shape: if shape.is_empty() {
            ptr::null_mut()
        } else {
            shape.as_mut_ptr()
        },
        strides: strides.map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
        byte_offset: 0,
    }
}

fn check(t: &ffi::DLTensor) -> Result<TensorLayout<'_>, LayoutError> {
    // SAFETY: every test tensor points `shape`/`strides` at live arrays of `ndim` entries.
    unsafe { validate(t, NullStrides::MeanCompact, false) }
}

#[test]
fn c01_negative_strides_span_below_data() {
    let mut buf = [0i32; 12];
    // Flipped along axis 1 then transposed: element (0, 0) is buf[3].
    let mut shape = [4i64, 3];
    let mut strides = [-1i64, 4];
    let mut t = tensor(
        buf.as_mut_ptr().cast(),
        &mut shape,
        Some(&mut strides),
        DataType::I32,
    );
    t.byte_offset = 12;
    let layout = check(&t).unwrap();
    assert_eq!(layout.span(), ByteSpan { start: 0, end: 48 });
    assert!(!layout.is_contiguous(Contiguity::Any));
    let mut offsets = vec![];
    layout.for_each_offset(|o| offsets.push(o / 4)).unwrap();
    assert_eq!(offsets, [0, 4, 8, -1, 3, 7, -2, 2, 6, -3, 1, 5]);
}

#[test]
fn zero_size_allows_null_data_and_is_contiguous() {
    let mut shape = [2i64, 0, 3];
    let t = tensor(ptr::null_mut(), &mut shape, None, DataType::F32);
    let layout = check(&t).unwrap();
    assert_eq!(layout.numel(), 0);
    assert!(layout.span().is_empty());
    assert!(layout.is_contiguous(Contiguity::C));
    let mut n = 0;
    layout.for_each_offset(|_| n += 1).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn zero_d_may_have_null_shape_and_strides() {
    let mut x = 7.0f64;
    let t = tensor((&mut x as *mut f64).cast(), &mut [], None, DataType::F64);
    // SAFETY: ndim is 0, nothing is read through shape/strides.
    let layout = unsafe { validate(&t, NullStrides::Refuse, false) }.unwrap();
    assert_eq!(layout.numel(), 1);
    assert_eq!(layout.span(), ByteSpan { start: 0, end: 8 });
}

#[test]
fn refusals_name_what_was_found() {
    let mut x = 0u8;
    let p: *mut c_void = (&mut x as *mut u8).cast();
    let mut shape = [3i64, -2];
    assert_eq!(
        check(&tensor(p, &mut shape, None, DataType::U8)).unwrap_err(),
        LayoutError::NegativeExtent {
            axis: 1,
            extent: -2
        }
    );
    let mut shape = [1i64 << 40, 1 << 40];
    assert!(matches!(
        check(&tensor(p, &mut shape, None, DataType::U8)),
        Err(LayoutError::Overflow { .. })
    ));
    let mut shape = [3i64];
    assert_eq!(
        check(&tensor(ptr::null_mut(), &mut shape, None, DataType::U8)).unwrap_err(),
        LayoutError::NullData { numel: 3 }
    );
    let mut t = tensor(p, &mut shape, None, DataType::U8);
    t.ndim = -1;
    assert_eq!(
        check(&t).unwrap_err(),
        LayoutError::NegativeNdim { ndim: -1 }
    );
    t.ndim = 65;
    assert_eq!(
        check(&t).unwrap_err(),
        LayoutError::TooManyDims { ndim: 65, max: 64 }
    );
    t.ndim = 1;
    // SAFETY: shape points at one live entry.
    let refused = unsafe { validate(&t, NullStrides::Refuse, false) };
    assert_eq!(refused.unwrap_err(), LayoutError::NullStrides { ndim: 1 });
    t.shape = ptr::null_mut();
    assert_eq!(check(&t).unwrap_err(), LayoutError::NullShape { ndim: 1 });
    let mut shape = [3i64];
    let t = tensor(
        p,
        &mut shape,
        None,
        DataType::new(DataTypeCode::Float, 32, 0),
    );
    assert!(matches!(check(&t), Err(LayoutError::ZeroWidthDtype { .. })));
    let t = tensor(
        p,
        &mut shape,
        None,
        DataType::scalar(DataTypeCode::Float4E2M1Fn, 8),
    );
    assert!(matches!(
        check(&t),
        Err(LayoutError::DtypeWidth {
            expected_bits: 4,
            ..
        })
    ));
}

#[test]
fn huge_strides_overflow_instead_of_wrapping() {
    let mut x = 0u64;
    let mut shape = [3i64];
    let mut strides = [i64::MAX / 2];
    let t = tensor(
        (&mut x as *mut u64).cast(),
        &mut shape,
        Some(&mut strides),
        DataType::U64,
    );
    assert!(matches!(check(&t), Err(LayoutError::Overflow { .. })));
}

#[test]
fn contiguity_ignores_extent_one_axes() {
    let mut x = [0f32; 6];
    let mut shape = [1i64, 6, 1];
    let mut strides = [999i64, 1, -5];
    let t = tensor(
        x.as_mut_ptr().cast(),
        &mut shape,
        Some(&mut strides),
        DataType::F32,
    );
    let layout = check(&t).unwrap();
    assert!(layout.is_contiguous(Contiguity::C));
    assert!(layout.is_contiguous(Contiguity::F));
    let mut shape = [2i64, 3];
    let mut strides = [1i64, 2];
    let t = tensor(
        x.as_mut_ptr().cast(),
        &mut shape,
        Some(&mut strides),
        DataType::F32,
    );
    let layout = check(&t).unwrap();
    assert!(!layout.is_contiguous(Contiguity::C));
    assert!(layout.is_contiguous(Contiguity::F));
    let mut shape = [2i64, 3];
    let t = tensor(x.as_mut_ptr().cast(), &mut shape, None, DataType::F32);
    let layout = check(&t).unwrap();
    assert!(layout.is_contiguous(Contiguity::C));
    assert!(!layout.is_contiguous(Contiguity::F));
    assert_eq!(layout.strides_vec(), [3, 1]);
}

#[test]
fn extent_one_axes_with_huge_strides_are_never_stepped() {
    let mut x = [1u16, 2];
    let mut shape = [2i64, 1, 1];
    let mut strides = [1i64, i64::MAX, i64::MIN];
    let t = tensor(
        x.as_mut_ptr().cast(),
        &mut shape,
        Some(&mut strides),
        DataType::U16,
    );
    let layout = check(&t).unwrap();
    assert_eq!(layout.span(), ByteSpan { start: 0, end: 4 });
    let mut offsets = vec![];
    layout.for_each_offset(|o| offsets.push(o)).unwrap();
    assert_eq!(offsets, [0, 2]);
    assert_eq!(layout.offset_of(&[1, 0, 0]).unwrap(), 2);
    // A zero-size tensor with NULL strides and huge extents: strides saturate, no overflow.
    let mut shape = [0i64, 1 << 40, 1 << 40];
    let t = tensor(ptr::null_mut(), &mut shape, None, DataType::U16);
    let layout = check(&t).unwrap();
    assert_eq!(layout.stride(0), i64::MAX);
    assert!(layout.is_contiguous(Contiguity::C));
}

#[test]
fn sub_byte_span_is_packed_unless_padded() {
    let mut x = [0u8; 8];
    let mut shape = [5i64];
    let t = tensor(
        x.as_mut_ptr().cast(),
        &mut shape,
        None,
        DataType::scalar(DataTypeCode::Float4E2M1Fn, 4),
    );
    assert_eq!(check(&t).unwrap().span(), ByteSpan { start: 0, end: 3 });
    // SAFETY: shape points at one live entry.
    let padded = unsafe { validate(&t, NullStrides::MeanCompact, true) }.unwrap();
    assert_eq!(padded.span(), ByteSpan { start: 0, end: 5 });
}

#[test]
fn typed_checks() {
    let mut x = [0u32; 4];
    let mut shape = [3i64];
    let mut t = tensor(x.as_mut_ptr().cast(), &mut shape, None, DataType::U32);
    let layout = check(&t).unwrap();
    assert!(layout.check_typed::<u32>().is_ok());
    assert_eq!(
        layout.check_typed::<f32>().unwrap_err(),
        LayoutError::DtypeMismatch {
            found: DataType::U32,
            expected: DataType::F32
        }
    );
    t.byte_offset = 2;
    let layout = check(&t).unwrap();
    assert!(matches!(
        layout.check_typed::<u32>(),
        Err(LayoutError::Misaligned { align: 4, .. })
    ));
    t.byte_offset = 0;
    t.device = Device::cuda(0).to_raw();
    let layout = check(&t).unwrap();
    assert_eq!(
        layout.check_typed::<u32>().unwrap_err(),
        LayoutError::NotHostAccessible {
            device: Device::cuda(0)
        }
    );
}

#[test]
fn offset_of_checks_rank_and_bounds() {
    let mut x = [0i64; 12];
    let mut shape = [3i64, 4];
    let mut strides = [1i64, 3];
    let t = tensor(
        x.as_mut_ptr().cast(),
        &mut shape,
        Some(&mut strides),
        DataType::I64,
    );
    let layout = check(&t).unwrap();
    assert_eq!(layout.offset_of(&[2, 3]).unwrap(), (2 + 9) * 8);
    assert_eq!(
        layout.offset_of(&[2]).unwrap_err(),
        LayoutError::IndexRank {
            found: 1,
            expected: 2
        }
    );
    assert_eq!(
        layout.offset_of(&[3, 0]).unwrap_err(),
        LayoutError::IndexOutOfBounds {
            axis: 0,
            index: 3,
            extent: 3
        }
    );
}

#[test]
fn compact_strides_of_shapes() {
    assert_eq!(compact_strides(&[2, 3, 4]), [12, 4, 1]);
    assert_eq!(compact_strides(&[]), Vec::<i64>::new());
    assert_eq!(compact_strides(&[2, 0, 3]), [3, 3, 1]);
}

#[test]
fn raw_host_access_agrees_with_device_type() {
    for code in -3..64 {
        assert_eq!(
            raw_host_accessible(code),
            crate::DeviceType::from_raw(code).is_host_accessible(),
            "device type {code}"
        );
    }
}

#[test]
fn the_host_access_error_names_every_host_accessible_device_type() {
    let named: Vec<&str> = (-3..64)
        .map(crate::DeviceType::from_raw)
        .filter(|t| t.is_host_accessible())
        .filter_map(|t| t.name())
        .collect();
    assert_eq!(named, ["cpu", "cuda_host", "rocm_host", "cuda_managed"]);
    let message = LayoutError::NotHostAccessible {
        device: crate::Device::cuda(0),
    }
    .to_string();
    assert_eq!(
        message,
        "data lives on cuda:0, expected host-accessible memory (cpu, cuda_host, rocm_host or cuda_managed)"
    );
}

/// The span as it was computed before the `i64` arithmetic: every index and byte in
/// `i128`, bounds checked at each axis. The reference the fast span must agree with.
fn exact_span(
    shape: &[i64],
    strides: Option<&[i64]>,
    element_bits: u64,
    byte_offset: u64,
) -> Result<ByteSpan, LayoutError> {
    const OVERFLOW: LayoutError = LayoutError::Overflow { what: "byte span" };
    let (mut lo, mut hi): (i128, i128) = (0, 0);
    match strides {
        Some(strides) => {
            for (&extent, &stride) in shape.iter().zip(strides) {
                let reach = (extent as i128 - 1) * stride as i128;
                if reach < 0 {
                    lo += reach
                } else {
                    hi += reach
                }
                if lo < i64::MIN as i128 || hi > i64::MAX as i128 {
                    return Err(OVERFLOW);
                }
            }
        }
        None => hi = shape.iter().map(|&e| e as i128).product::<i128>() - 1,
    }
    let bits = element_bits as i128;
    let offset_bits = byte_offset as i128 * 8;
    let start = (offset_bits + lo * bits).div_euclid(8);
    let end = (offset_bits + (hi + 1) * bits + 7).div_euclid(8);
    if start < isize::MIN as i128 || end > isize::MAX as i128 || end - start > isize::MAX as i128 {
        return Err(OVERFLOW);
    }
    Ok(ByteSpan {
        start: start as isize,
        end: end as isize,
    })
}

/// The checked `i64` span agrees with the exact `i128` computation, results and refusals
/// alike, on values around every bound, for whole-byte and sub-byte widths.
#[test]
fn i64_span_agrees_with_exact_span() {
    let edges = [
        i64::MIN,
        i64::MIN + 1,
        i64::MIN / 2,
        i64::MIN / 3,
        -(1 << 40),
        -(1 << 32),
        -7,
        -1,
        0,
        1,
        2,
        3,
        7,
        1 << 32,
        1 << 40,
        i64::MAX / 3,
        i64::MAX / 2,
        i64::MAX - 1,
        i64::MAX,
    ];
    let extents = [
        1i64,
        2,
        3,
        1 << 20,
        1 << 31,
        1 << 40,
        i64::MAX / 2,
        i64::MAX,
    ];
    let offsets = [
        0u64,
        1,
        8,
        1 << 40,
        isize::MAX as u64 / 2,
        isize::MAX as u64,
    ];
    let mut checked = 0;
    for bits in [4u64, 6, 8, 12, 16, 64, 8 * 255, 255 * 65535] {
        for &offset in &offsets {
            for &e0 in &extents {
                for &e1 in &extents {
                    for &s0 in &edges {
                        for &s1 in &edges {
                            let shape = [e0, e1];
                            let strides = [s0, s1];
                            let fast = byte_span(&shape, Some(&strides), 1, bits, offset);
                            let exact = exact_span(&shape, Some(&strides), bits, offset);
                            assert_eq!(fast, exact, "{shape:?} {strides:?} {bits} {offset}");
                            checked += 1;
                        }
                    }
                }
            }
            for numel in [1usize, 2, 1 << 40, isize::MAX as usize] {
                let shape = [numel as i64];
                let fast = byte_span(&shape, None, numel, bits, offset);
                let exact = exact_span(&shape, None, bits, offset);
                assert_eq!(fast, exact, "{numel} {bits} {offset}");
            }
        }
    }
    assert!(checked > 10_000);
}

#[test]
fn raw_dtype_comparison_is_exact() {
    assert!(is_canonical(DataType::F32));
    assert!(is_canonical(DataType::new(
        DataTypeCode::Unknown(200),
        8,
        1
    )));
    assert!(!is_canonical(DataType::new(
        DataTypeCode::Unknown(2),
        32,
        1
    )));
    assert!(raw_dtype_is::<f32>(DataType::F32.to_raw()));
    assert!(!raw_dtype_is::<f32>(DataType::I32.to_raw()));
    assert!(!raw_dtype_is::<f32>(
        DataType::new(DataTypeCode::Float, 32, 2).to_raw()
    ));
    assert!(raw_dtype_is::<[f32; 2]>(
        DataType::new(DataTypeCode::Float, 32, 2).to_raw()
    ));
}

#[test]
fn packed_fields_round_trip() {
    for (code, bits, lanes, element_bits) in [
        (0u8, 0u8, 0u16, 0u32),
        (2, 32, 1, 32),
        (17, 4, 65535, 8),
        (255, 255, 65535, u32::MAX),
    ] {
        let raw = ffi::DLDataType { code, bits, lanes };
        let word = Packed::dtype(raw, element_bits);
        assert_eq!(Packed::raw_dtype(word), raw);
        assert_eq!(Packed::element_bits(word), element_bits as u64);
    }
    for (device_type, device_id) in [(1, 0), (-1, -7), (i32::MAX, i32::MIN), (i32::MIN, i32::MAX)] {
        let raw = ffi::DLDevice {
            device_type,
            device_id,
        };
        assert_eq!(Packed::raw_device(Packed::device(raw)), raw);
    }
}

#[test]
fn raw_conversions_round_trip() {
    for code in 0..=u8::MAX {
        for (bits, lanes) in [(8, 1), (32, 4)] {
            let raw = ffi::DLDataType { code, bits, lanes };
            let dtype = DataType::from_raw(raw);
            assert_eq!(dtype.to_raw(), raw);
        }
    }
    for device_type in -3..64 {
        let raw = ffi::DLDevice {
            device_type,
            device_id: 3,
        };
        let device = Device::from_raw(raw);
        assert_eq!(device.to_raw(), raw);
    }
}
