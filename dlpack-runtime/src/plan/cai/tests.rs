use super::*;

/// A version 3 float32 vector of 4 elements at 0x1000.
fn fields() -> CaiFields {
    CaiFields {
        version: 3,
        shape: vec![4],
        typestr: "<f4".to_owned(),
        data: 0x1000,
        readonly: false,
        strides: None,
        descr: None,
        mask: false,
        stream: None,
    }
}

#[test]
fn a_plain_interface_is_c_contiguous_and_spans_its_elements() {
    let t = parse(&fields()).unwrap();
    assert_eq!(t.dtype, DataType::F32);
    assert_eq!(t.shape, vec![4]);
    assert_eq!(t.strides, None);
    assert_eq!((t.data, t.start, t.byte_len), (0x1000, 0x1000, 16));
    assert!(!t.read_only);
    assert_eq!(t.stream, None);
    assert_eq!(t.numel(), 4);
}

#[test]
fn every_version_0_to_3_is_read_and_strides_none_is_c_contiguous_in_each() {
    for version in 0..=3 {
        let t = parse(&CaiFields {
            version,
            shape: vec![2, 3],
            ..fields()
        })
        .unwrap();
        assert_eq!(t.strides, None, "version {version}");
        assert_eq!(t.byte_len, 24);
    }
    for found in [-1, 4, 99] {
        assert_eq!(
            parse(&CaiFields {
                version: found,
                ..fields()
            }),
            Err(CaiError::Version { found })
        );
    }
}

#[test]
fn every_typestr_maps_to_its_dtype_and_back() {
    let cases = [
        ("|b1", DataType::BOOL),
        ("|i1", DataType::I8),
        ("<i2", DataType::I16),
        ("<i4", DataType::I32),
        ("<i8", DataType::I64),
        ("|u1", DataType::U8),
        ("<u2", DataType::U16),
        ("<u4", DataType::U32),
        ("<u8", DataType::U64),
        ("<f2", DataType::F16),
        ("<f4", DataType::F32),
        ("<f8", DataType::F64),
        ("<c8", DataType::C64),
        ("<c16", DataType::C128),
    ];
    for (typestr, dtype) in cases {
        assert_eq!(dtype_of_typestr(typestr), Ok(dtype), "{typestr}");
        assert_eq!(typestr_of(dtype), Ok(typestr));
    }
    // One-byte types read in any byte order.
    assert_eq!(dtype_of_typestr("<b1"), Ok(DataType::BOOL));
    assert_eq!(dtype_of_typestr(">u1"), Ok(DataType::U8));
}

#[test]
fn typestrs_without_a_dlpack_dtype_are_refused_with_the_reason() {
    let reason = |s: &str| match dtype_of_typestr(s) {
        Err(CaiError::Typestr { found, reason }) => {
            assert_eq!(found, s);
            reason
        }
        other => panic!("{s}: {other:?}"),
    };
    assert_eq!(reason(">f4"), "is big-endian");
    assert_eq!(reason("|f4"), "has no byte order for a multi-byte type");
    assert_eq!(reason("=f4"), "has no byte order (<, > or |)");
    for s in [
        "<f16", "|O8", "<U4", "|S3", "<M8", "|V8", "<f3", "<b2", "<t1",
    ] {
        assert_eq!(reason(s), "has no DLPack data type", "{s}");
    }
    assert_eq!(reason(""), "is empty");
    assert_eq!(reason("<"), "has no kind");
    assert_eq!(reason("<f"), "has no item size in bytes");
    let err = parse(&CaiFields {
        typestr: ">i8".to_owned(),
        ..fields()
    })
    .unwrap_err();
    assert!(err.to_string().contains("\">i8\" is big-endian"), "{err}");
}

#[test]
fn dtypes_without_a_typestr_are_refused_on_export() {
    for dtype in [
        DataType::BF16,
        DataType::F8E4M3FN,
        DataType::F8E5M2,
        DataType::new(crate::DataTypeCode::Float, 32, 4),
        DataType::new(crate::DataTypeCode::Int, 4, 1),
    ] {
        assert_eq!(typestr_of(dtype), Err(CaiError::Unspellable { dtype }));
        assert_eq!(
            describe(dtype, 0x1000, &[1], None, true, None),
            Err(CaiError::Unspellable { dtype })
        );
    }
}

#[test]
fn explicit_byte_strides_become_element_strides() {
    let t = parse(&CaiFields {
        shape: vec![3, 2],
        typestr: "<i4".to_owned(),
        strides: Some(vec![4, 12]),
        ..fields()
    })
    .unwrap();
    assert_eq!(t.strides, Some(vec![1, 3]));
    // Highest element: 2 * 1 + 1 * 3 = 5, so 6 elements of 4 bytes.
    assert_eq!((t.start, t.byte_len), (0x1000, 24));
}

#[test]
fn negative_strides_start_the_span_below_the_data_pointer() {
    // int32 (3, 4) flipped on axis 1: element (0, 0) is the last of its row.
    let t = parse(&CaiFields {
        shape: vec![3, 4],
        typestr: "<i4".to_owned(),
        data: 0x1000 + 12,
        strides: Some(vec![16, -4]),
        ..fields()
    })
    .unwrap();
    assert_eq!(t.strides, Some(vec![4, -1]));
    assert_eq!(t.data, 0x100c);
    assert_eq!((t.start, t.byte_len), (0x1000, 48));
    // Below address 0: refused.
    assert_eq!(
        parse(&CaiFields {
            data: 4,
            strides: Some(vec![-8]),
            ..fields()
        }),
        Err(CaiError::Overflow {
            what: "data pointer"
        })
    );
}

#[test]
fn zero_strides_broadcast_one_element() {
    let t = parse(&CaiFields {
        shape: vec![10],
        strides: Some(vec![0]),
        ..fields()
    })
    .unwrap();
    assert_eq!(t.strides, Some(vec![0]));
    assert_eq!(t.byte_len, 4);
}

#[test]
fn strides_of_the_wrong_rank_or_misaligned_are_refused() {
    assert_eq!(
        parse(&CaiFields {
            strides: Some(vec![4, 4]),
            ..fields()
        }),
        Err(CaiError::StridesRank {
            found: 2,
            expected: 1
        })
    );
    assert_eq!(
        parse(&CaiFields {
            shape: vec![2, 2],
            strides: Some(vec![8, 6]),
            ..fields()
        }),
        Err(CaiError::StrideAlignment {
            axis: 1,
            stride: 6,
            itemsize: 4
        })
    );
}

#[test]
fn shapes_and_strides_that_overflow_are_refused() {
    assert_eq!(
        parse(&CaiFields {
            shape: vec![-1],
            ..fields()
        }),
        Err(CaiError::NegativeExtent { axis: 0, found: -1 })
    );
    assert_eq!(
        parse(&CaiFields {
            shape: vec![i64::MAX, 4],
            ..fields()
        }),
        Err(CaiError::Overflow { what: "shape" })
    );
    assert_eq!(
        parse(&CaiFields {
            shape: vec![1 << 62],
            ..fields()
        }),
        Err(CaiError::Overflow { what: "shape" })
    );
    assert_eq!(
        parse(&CaiFields {
            shape: vec![1 << 40, 2],
            strides: Some(vec![1 << 62, 4]),
            ..fields()
        }),
        Err(CaiError::Overflow { what: "strides" })
    );
    assert_eq!(
        parse(&CaiFields {
            data: u64::MAX - 11,
            ..fields()
        }),
        Err(CaiError::Overflow {
            what: "data pointer"
        })
    );
}

#[test]
fn an_empty_array_may_have_data_0_and_spans_nothing() {
    for shape in [vec![0], vec![2, 0, 3]] {
        let t = parse(&CaiFields {
            shape: shape.clone(),
            data: 0,
            ..fields()
        })
        .unwrap();
        assert_eq!((t.data, t.byte_len, t.numel()), (0, 0, 0), "{shape:?}");
    }
    // A zero-dimensional array has one element: its pointer must not be 0.
    assert_eq!(
        parse(&CaiFields {
            shape: vec![],
            data: 0,
            ..fields()
        }),
        Err(CaiError::NullData { numel: 1 })
    );
    assert_eq!(
        parse(&CaiFields {
            data: 0,
            ..fields()
        }),
        Err(CaiError::NullData { numel: 4 })
    );
}

#[test]
fn a_misaligned_data_pointer_is_refused() {
    assert_eq!(
        parse(&CaiFields {
            data: 0x1002,
            ..fields()
        }),
        Err(CaiError::DataAlignment {
            data: 0x1002,
            itemsize: 4
        })
    );
}

#[test]
fn the_read_only_flag_is_kept() {
    let t = parse(&CaiFields {
        readonly: true,
        ..fields()
    })
    .unwrap();
    assert!(t.read_only);
}

#[test]
fn a_mask_is_refused() {
    assert_eq!(
        parse(&CaiFields {
            mask: true,
            ..fields()
        }),
        Err(CaiError::Mask)
    );
}

#[test]
fn only_the_trivial_descr_is_read() {
    let entry = |name: &str, typestr: &str, has_shape| DescrEntry {
        name: name.to_owned(),
        typestr: typestr.to_owned(),
        has_shape,
    };
    assert!(
        parse(&CaiFields {
            descr: Some(vec![entry("", "<f4", false)]),
            ..fields()
        })
        .is_ok()
    );
    for descr in [
        vec![],
        vec![entry("x", "<f4", false)],
        vec![entry("", "<f4", true)],
        vec![entry("re", "<f2", false), entry("im", "<f2", false)],
    ] {
        match parse(&CaiFields {
            descr: Some(descr.clone()),
            ..fields()
        }) {
            Err(CaiError::Descr { .. }) => {}
            other => panic!("{descr:?}: {other:?}"),
        }
    }
}

#[test]
fn a_trivial_descr_with_another_typestr_contradicts_the_typestr() {
    let err = parse(&CaiFields {
        descr: Some(vec![DescrEntry {
            name: String::new(),
            typestr: "<f8".to_owned(),
            has_shape: false,
        }]),
        ..fields()
    })
    .unwrap_err();
    assert_eq!(
        err,
        CaiError::DescrTypestr {
            descr: "<f8".to_owned(),
            typestr: "<f4".to_owned(),
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("contradicts typestr \"<f4\"") && !message.contains("structured"),
        "{message}"
    );
}

/// `fields()` changed by `f`, parsed, then checked against the allocation of 40 bytes at
/// 0x1000 (ten float32 elements).
fn within_ten(f: impl FnOnce(&mut CaiFields)) -> Result<(), CaiError> {
    let mut fields = fields();
    f(&mut fields);
    check_within(&parse(&fields)?, 0x1000, 40)
}

#[test]
fn layouts_inside_the_allocation_pass_including_negative_strides_and_the_last_byte() {
    assert_eq!(within_ten(|f| f.shape = vec![10]), Ok(()));
    assert_eq!(
        within_ten(|f| {
            f.data = 0x1000 + 36;
            f.shape = vec![10];
            f.strides = Some(vec![-4]);
        }),
        Ok(())
    );
    assert_eq!(
        within_ten(|f| {
            f.data = 0x1000 + 4;
            f.shape = vec![2, 3];
            f.strides = Some(vec![-4, 12]);
        }),
        Ok(())
    );
}

#[test]
fn every_layout_reaching_past_the_allocation_is_refused_with_both_ranges() {
    let outside = |start, end| {
        Err(CaiError::OutsideAllocation {
            start,
            end,
            alloc_start: 0x1000,
            alloc_end: 0x1028,
        })
    };
    // Too long.
    assert_eq!(
        within_ten(|f| f.shape = vec![1000]),
        outside(0x1000, 0x1000 + 4000)
    );
    // Starts inside, runs one element past the end.
    assert_eq!(
        within_ten(|f| {
            f.data = 0x1000 + 36;
            f.shape = vec![2];
        }),
        outside(0x1024, 0x102c)
    );
    // A huge stride.
    assert_eq!(
        within_ten(|f| {
            f.shape = vec![2];
            f.strides = Some(vec![1 << 62]);
        }),
        outside(0x1000, 0x1000 + (1 << 62) + 4)
    );
    // A negative stride from the allocation's first element reaches below it.
    assert_eq!(
        within_ten(|f| {
            f.shape = vec![10];
            f.strides = Some(vec![-4]);
        }),
        outside(0x1000 - 36, 0x1004)
    );
    let message = within_ten(|f| f.shape = vec![1000])
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("[0x1000, 0x1fa0)") && message.contains("allocation [0x1000, 0x1028)"),
        "{message}"
    );
}

#[test]
fn an_empty_array_needs_no_allocation() {
    assert_eq!(
        within_ten(|f| {
            f.shape = vec![0, 1000];
            f.data = 0;
        }),
        Ok(())
    );
    assert_eq!(within_ten(|f| f.shape = vec![3, 0]), Ok(()));
}

#[test]
fn stream_values_follow_the_interface_and_0_is_refused() {
    let stream = |s| {
        parse(&CaiFields {
            stream: s,
            ..fields()
        })
        .map(|t| t.stream)
    };
    assert_eq!(stream(None), Ok(None));
    assert_eq!(stream(Some(1)), Ok(Some(StreamId::LegacyDefault)));
    assert_eq!(stream(Some(2)), Ok(Some(StreamId::PerThreadDefault)));
    assert_eq!(
        stream(Some(0x7f00)),
        Ok(Some(StreamId::Handle(NonZeroU64::new(0x7f00).unwrap())))
    );
    assert_eq!(stream(Some(0)), Err(CaiError::Stream { found: 0 }));
    assert_eq!(stream(Some(-1)), Err(CaiError::Stream { found: -1 }));
    let message = stream(Some(0)).unwrap_err().to_string();
    assert!(message.contains("stream 0 is not allowed"), "{message}");
}

#[test]
fn describe_writes_c_contiguous_strides_as_none() {
    let d = describe(DataType::F32, 0x2000, &[2, 3], Some(&[3, 1]), true, None).unwrap();
    assert_eq!(d.typestr, "<f4");
    assert_eq!(d.shape, vec![2, 3]);
    assert_eq!(d.strides, None);
    assert_eq!((d.data, d.readonly, d.stream), (0x2000, true, None));
    // Extent-1 axes do not matter.
    let d = describe(DataType::F32, 0x2000, &[1, 3], Some(&[7, 1]), false, None).unwrap();
    assert_eq!(d.strides, None);
    let d = describe(DataType::F32, 0x2000, &[2, 3], None, false, None).unwrap();
    assert_eq!(d.strides, None);
}

#[test]
fn describe_writes_other_strides_in_bytes_and_round_trips() {
    let d = describe(
        DataType::I32,
        0x100c,
        &[3, 4],
        Some(&[4, -1]),
        false,
        Some(StreamId::Handle(NonZeroU64::new(0x55).unwrap())),
    )
    .unwrap();
    assert_eq!(d.strides, Some(vec![16, -4]));
    assert_eq!(d.stream, Some(0x55));
    let back = parse(&CaiFields {
        version: VERSION,
        shape: d.shape.clone(),
        typestr: d.typestr.to_owned(),
        data: d.data,
        readonly: d.readonly,
        strides: d.strides.clone(),
        descr: None,
        mask: false,
        stream: d.stream,
    })
    .unwrap();
    assert_eq!(back.strides, Some(vec![4, -1]));
    assert_eq!(back.start, 0x1000);
}

#[test]
fn describe_writes_the_default_streams_as_1_and_2_and_empty_data_as_0() {
    let stream = |s| {
        describe(DataType::U8, 0x10, &[1], None, false, Some(s))
            .unwrap()
            .stream
    };
    assert_eq!(stream(StreamId::LegacyDefault), Some(1));
    assert_eq!(stream(StreamId::PerThreadDefault), Some(2));
    let d = describe(DataType::F64, 0x10, &[2, 0], Some(&[5, 9]), false, None).unwrap();
    assert_eq!((d.data, d.strides), (0, None));
}
