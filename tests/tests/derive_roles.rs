//! Runtime behaviour of the derive's roles and options beyond the basics of `exchange.rs`: the
//! `offset` (elements), `dtype` and `readonly` roles, the `readonly` flag, consumer constraints,
//! storage enums (`DlpackStorage`, `DlpackImportStorage`, hand-written `AsExportBuffer`),
//! `Arc`-shared storage and shared export. Every test counts deleter runs or owner drops.

use std::sync::Arc;

use dlpack_runtime::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
use dlpack_runtime::{
    AsExportBuffer, BufferAccess, Contiguity, DataType, Device, DeviceType, DlpackExport,
    DlpackImport, DlpackImportStorage, DlpackStorage, ExportBuffer, ExportError, ImportError,
    ImportedData, LayoutError, ManagedTensor,
};
use dlpack_tests::{Counter, DropGuard, Foreign, READ_ONLY, bytes_of};

/// Builds a versioned managed tensor from a [`Foreign`] description.
fn foreign(f: Foreign, counter: &Counter) -> ManagedTensor {
    // SAFETY: `versioned` returns a valid, owned managed tensor.
    unsafe { ManagedTensor::from_raw_versioned(f.versioned(counter)) }.unwrap()
}

// ---------------------------------------------------------------------------------------------
// `offset`: a start offset in elements, as candle keeps it.

/// A producer with a start offset in elements.
#[derive(DlpackExport)]
struct Narrowed {
    #[dlpack(data)]
    values: Vec<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    start: usize,
    _guard: DropGuard,
}

/// A consumer that receives the start offset in elements: where element `(0, 0)` lies in the
/// bytes its data field lends on when exported again.
#[derive(DlpackImport)]
struct WithOffset {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    start: usize,
}

#[test]
fn offset_in_elements_is_converted_to_bytes_and_folded_into_data() {
    // A 3x4 matrix of 0..12; the tensor is rows 1..3, columns 1..3: start 5, strides (4, 1).
    let counter = Counter::new();
    let values: Vec<f64> = (0..12).map(f64::from).collect();
    let base = values.as_ptr();
    let t = Narrowed {
        values,
        shape: vec![2, 2],
        strides: vec![4, 1],
        start: 5,
        _guard: counter.guard(),
    };
    let managed = t.into_dlpack().unwrap();
    let raw = managed.dl_tensor();
    assert_eq!(
        raw.data.cast::<f64>().cast_const(),
        base.wrapping_add(5),
        "5 elements of 8 bytes, folded into `data`"
    );
    assert_eq!(raw.byte_offset, 0);
    let view = WithOffset::from_managed(managed).unwrap();
    assert_eq!(
        view.start, 0,
        "the import lends the bytes its layout reaches, from element (0, 0)"
    );
    assert_eq!(view.shape, [2, 2]);
    assert_eq!(view.strides, [4, 1]);
    assert_eq!(view.data.to_vec().unwrap(), [5.0, 6.0, 9.0, 10.0]);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(
        counter.get(),
        1,
        "the owner is dropped once, by the deleter"
    );
}

#[test]
fn offset_beyond_the_buffer_or_overflowing_is_refused_and_drops_the_owner() {
    let counter = Counter::new();
    let t = Narrowed {
        values: vec![0.0; 12],
        shape: vec![2, 2],
        strides: vec![4, 1],
        start: 8,
        _guard: counter.guard(),
    };
    // Start 8 reaches element 8 + 4 + 1 = 13, one past the 12 elements: bytes [64, 112) of 96.
    assert_eq!(
        t.into_dlpack().unwrap_err(),
        ExportError::Layout(LayoutError::OutOfBuffer {
            start: 64,
            end: 112,
            len: 96
        })
    );
    assert_eq!(counter.get(), 1);

    let t = Narrowed {
        values: vec![0.0; 12],
        shape: vec![1],
        strides: vec![1],
        start: usize::MAX / 4,
        _guard: counter.guard(),
    };
    assert_eq!(
        t.into_dlpack().unwrap_err(),
        ExportError::Layout(LayoutError::Overflow {
            what: "offset in elements, converted to bytes"
        })
    );
    assert_eq!(counter.get(), 2);
}

#[test]
fn imported_offset_counts_elements_from_the_lowest_one_the_layout_reaches() {
    let values: Vec<f64> = (0..6).map(f64::from).collect();
    let counter = Counter::new();
    // `byte_offset` of a foreign producer is applied by the data, which lends the bytes from
    // element (0): nothing before it.
    let f = Foreign::new(&bytes_of(&values), DataType::F64, &[4]).byte_offset(16);
    let view = WithOffset::from_managed(foreign(f, &counter)).unwrap();
    assert_eq!(view.start, 0, "the lent bytes start at element (0)");
    assert_eq!(view.data.start_offset().unwrap(), 0);
    assert_eq!(view.data.to_vec().unwrap(), [2.0, 3.0, 4.0, 5.0]);
    drop(view);
    assert_eq!(counter.get(), 1);

    // Reversed: the lowest element reached is buffer element 0, two before element (0).
    let f = Foreign::new(&bytes_of(&values), DataType::F64, &[3])
        .strides(&[-1])
        .byte_offset(16);
    let view = WithOffset::from_managed(foreign(f, &counter)).unwrap();
    assert_eq!(view.start, 2, "16 bytes are 2 float64 elements");
    assert_eq!(view.data.start_offset().unwrap(), 2);
    assert_eq!(view.data.to_vec().unwrap(), [2.0, 1.0, 0.0]);
    drop(view);
    assert_eq!(counter.get(), 2);

    // An offset that splits an element leaves the element misaligned: the offset, counted from
    // the lent bytes, is 0, and host access refuses the element.
    let f = Foreign::new(&bytes_of(&values), DataType::F64, &[4]).byte_offset(12);
    let view = WithOffset::from_managed(foreign(f, &counter)).unwrap();
    assert_eq!(view.start, 0);
    assert!(matches!(
        view.data.to_vec(),
        Err(LayoutError::Misaligned { align: 8, .. })
    ));
    drop(view);
    assert_eq!(counter.get(), 3, "the deleter ran once each");
}

// ---------------------------------------------------------------------------------------------
// `dtype`: type-erased storage.

/// Raw 32-bit words exported as the dtype of a field.
#[derive(DlpackExport)]
struct Erased {
    #[dlpack(data)]
    words: Vec<u32>,
    #[dlpack(shape)]
    shape: [usize; 1],
    #[dlpack(dtype)]
    dtype: DataType,
    _guard: DropGuard,
}

/// A consumer of any dtype: the managed tensor itself, and the dtype it has.
#[derive(DlpackImport)]
struct AnyDtype {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(dtype)]
    dtype: DataType,
}

#[test]
fn dtype_field_overrides_the_buffer_dtype() {
    let counter = Counter::new();
    let words: Vec<u32> = [1.5f32, -2.0, 8.25].iter().map(|v| v.to_bits()).collect();
    let t = Erased {
        words,
        shape: [3],
        dtype: DataType::F32,
        _guard: counter.guard(),
    };
    assert_eq!(t.export_parts().dtype(), DataType::F32);
    let view = Dense::<f32>::from_dlpack(t).unwrap();
    assert_eq!(view.shape, [3]);
    assert_eq!(view.data.as_slice().unwrap(), [1.5, -2.0, 8.25]);
    drop(view);
    assert_eq!(counter.get(), 1);
}

#[test]
fn dtype_field_counts_elements_of_its_own_size_against_the_buffer_bytes() {
    // Two u32 words are 8 bytes: four float16 elements fit, five do not.
    let counter = Counter::new();
    let t = Erased {
        words: vec![0x3c00_3c00, 0x4000_4000],
        shape: [4],
        dtype: DataType::F16,
        _guard: counter.guard(),
    };
    let view = AnyDtype::from_dlpack(t).unwrap();
    assert_eq!(view.dtype, DataType::F16);
    assert_eq!(view.shape, [4]);
    assert_eq!(
        DataType::from_raw(view.managed.dl_tensor().dtype),
        DataType::F16
    );
    drop(view);
    assert_eq!(counter.get(), 1);

    let t = Erased {
        words: vec![0; 2],
        shape: [5],
        dtype: DataType::F16,
        _guard: counter.guard(),
    };
    assert_eq!(
        t.into_dlpack().unwrap_err(),
        ExportError::Layout(LayoutError::OutOfBuffer {
            start: 0,
            end: 10,
            len: 8
        })
    );
    assert_eq!(counter.get(), 2);
}

// ---------------------------------------------------------------------------------------------
// `readonly`: a field, or the container flag.

/// Read-only when its field says so.
#[derive(DlpackExport)]
struct MaybeFrozen {
    #[dlpack(data)]
    values: Vec<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    frozen: bool,
}

/// Always read-only.
#[derive(DlpackExport)]
#[dlpack(readonly)]
struct Frozen {
    #[dlpack(data)]
    values: Vec<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// Receives the read-only flag.
#[derive(DlpackImport)]
struct Flagged {
    #[dlpack(data)]
    data: ImportedData<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(readonly)]
    read_only: bool,
}

/// Requires writable memory.
#[derive(DlpackImport, Debug)]
#[dlpack(writable)]
struct Writable {
    #[dlpack(data)]
    data: ImportedData<i32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[test]
fn readonly_field_and_flag_mark_the_export_read_only() {
    for frozen in [false, true] {
        let t = MaybeFrozen {
            values: vec![1, 2, 3],
            shape: vec![3],
            frozen,
        };
        let managed = t.into_dlpack().unwrap();
        assert_eq!(managed.flags() & DLPACK_FLAG_BITMASK_READ_ONLY != 0, frozen);
        let mut view = Flagged::from_managed(managed).unwrap();
        assert_eq!(view.read_only, frozen);
        assert_eq!(view.shape, [3]);
        assert_eq!(view.data.set(&[0], 7).is_ok(), !frozen);
    }

    let t = Frozen {
        values: vec![1, 2, 3],
        shape: vec![3],
    };
    let managed = t.into_dlpack().unwrap();
    assert_eq!(managed.flags(), DLPACK_FLAG_BITMASK_READ_ONLY);
    let view = Flagged::from_managed(managed).unwrap();
    assert!(view.read_only);
    assert_eq!(view.data.as_slice().unwrap(), [1, 2, 3]);

    let t = Frozen {
        values: vec![1, 2, 3],
        shape: vec![3],
    };
    assert_eq!(Writable::from_dlpack(t).unwrap_err(), ImportError::ReadOnly);
}

#[test]
fn writable_constraint_refuses_read_only_and_legacy_tensors_and_calls_the_deleter() {
    let counter = Counter::new();
    let values = [4i32, 5, 6];
    let f = Foreign::new(&bytes_of(&values), DataType::I32, &[3]);
    let view = Writable::from_managed(foreign(f.clone(), &counter)).unwrap();
    assert_eq!(view.shape, [3]);
    assert_eq!(view.data.as_slice().unwrap(), values);
    drop(view);
    assert_eq!(counter.get(), 1);

    let err = Writable::from_managed(foreign(f.clone().flags(READ_ONLY), &counter)).unwrap_err();
    assert_eq!(err, ImportError::ReadOnly);
    assert_eq!(counter.get(), 2);

    // SAFETY: a valid, owned legacy tensor.
    let legacy = unsafe { ManagedTensor::from_raw_legacy(f.legacy(&counter)) }.unwrap();
    let err = Writable::from_managed(legacy).unwrap_err();
    assert_eq!(
        err,
        ImportError::ReadOnly,
        "a legacy tensor cannot say it is writable"
    );
    // The message names both reasons a tensor is read-only: the flag, or a legacy capsule.
    let message = err.to_string();
    assert!(
        message.contains("DLPACK_FLAG_BITMASK_READ_ONLY")
            && message.contains("legacy capsule, which carries no flags"),
        "{message}"
    );
    assert_eq!(counter.get(), 3);
}

// ---------------------------------------------------------------------------------------------
// Consumer constraints.

/// nanobind's `ndarray<float, shape<-1, 3>, c_contig, device::cpu>`, on a type-erased consumer.
#[derive(DlpackImport, Debug)]
#[dlpack(dtype = f32, shape = [_, 3], contiguous = "C", device = "cpu")]
struct Points {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// Column-major float64 matrices.
#[derive(DlpackImport, Debug)]
#[dlpack(ndim = 2, contiguous = "F")]
struct Fortran {
    #[dlpack(data)]
    data: ImportedData<f64>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// Either order.
#[derive(DlpackImport, Debug)]
#[dlpack(contiguous = "any", device = "cuda")]
struct AnyOrderCuda {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(device)]
    device: Device,
}

/// A ROCm consumer: `device = "rocm"` (`kDLROCM`, any ordinal).
#[derive(DlpackImport, Debug)]
#[dlpack(device = "rocm")]
struct OnRocm {
    #[dlpack(data)]
    managed: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(device)]
    device: Device,
}

#[test]
fn a_rocm_device_constraint_accepts_rocm_memory_and_refuses_host_memory() {
    let counter = Counter::new();
    let values: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let host = Foreign::new(&bytes_of(&values), DataType::F32, &[6]);
    let on_rocm = Foreign {
        device: Device::new(DeviceType::Rocm, 1),
        ..host.clone()
    };
    let view = OnRocm::from_managed(foreign(on_rocm, &counter)).unwrap();
    assert_eq!(view.device, Device::new(DeviceType::Rocm, 1));
    assert_eq!(view.shape, [6]);
    assert_eq!(view.managed.dl_tensor().device.device_id, 1);
    drop(view);
    assert_eq!(
        OnRocm::from_managed(foreign(host, &counter)).unwrap_err(),
        ImportError::Device {
            found: Device::CPU,
            expected: "rocm memory (kDLROCM)"
        }
    );
    assert_eq!(counter.get(), 2, "the deleter ran once for each");
}

#[test]
fn dtype_shape_contiguity_and_device_constraints_accept_what_they_describe() {
    let counter = Counter::new();
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let f = Foreign::new(&bytes_of(&values), DataType::F32, &[4, 3]);
    let points = Points::from_managed(foreign(f, &counter)).unwrap();
    assert_eq!(points.shape, [4, 3]);
    assert_eq!(points.strides, [3, 1]);
    assert_eq!(
        DataType::from_raw(points.managed.dl_tensor().dtype),
        DataType::F32
    );
    drop(points);
    assert_eq!(counter.get(), 1);
}

#[test]
fn each_constraint_refuses_with_a_typed_error_and_the_deleter_runs_once() {
    let counter = Counter::new();
    let floats: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let doubles: Vec<f64> = (0..12).map(f64::from).collect();
    let cases: Vec<(Foreign, ImportError, &str)> = vec![
        (
            Foreign::new(&bytes_of(&doubles), DataType::F64, &[4, 3]),
            ImportError::Dtype {
                found: DataType::F64,
                expected: DataType::F32,
            },
            "tensor has dtype float64, expected float32",
        ),
        (
            Foreign::new(&bytes_of(&floats), DataType::F32, &[12]),
            ImportError::Ndim {
                found: 1,
                expected: 2,
            },
            "tensor has ndim 1, expected 2",
        ),
        (
            Foreign::new(&bytes_of(&floats), DataType::F32, &[3, 4]),
            ImportError::Shape {
                found: vec![3, 4],
                expected: vec![None, Some(3)],
            },
            "tensor has shape [3, 4], expected [_, 3]",
        ),
        (
            Foreign::new(&bytes_of(&floats), DataType::F32, &[4, 3]).strides(&[1, 4]),
            ImportError::Layout(LayoutError::NotContiguous {
                expected: Contiguity::C,
                shape: vec![4, 3],
                strides: vec![1, 4],
            }),
            "cannot import: tensor of shape [4, 3] and strides [1, 4] (elements) is not C-contiguous (row-major)",
        ),
        (
            Foreign {
                device: Device::cuda(0),
                ..Foreign::new(&bytes_of(&floats), DataType::F32, &[4, 3])
            },
            ImportError::Device {
                found: Device::cuda(0),
                expected: "cpu memory (kDLCPU)",
            },
            "tensor lives on cuda:0, expected cpu memory (kDLCPU)",
        ),
    ];
    for (count, (f, expected, message)) in cases.into_iter().enumerate() {
        let err = Points::from_managed(foreign(f, &counter)).unwrap_err();
        assert_eq!(err, expected);
        assert_eq!(err.to_string(), message);
        assert_eq!(counter.get(), count + 1, "deleter ran once for {message}");
    }
}

#[test]
fn fortran_and_any_order_constraints() {
    let counter = Counter::new();
    let values: Vec<f64> = (0..6).map(f64::from).collect();
    // Column-major 2x3: element (i, j) at i + 2j.
    let column_major = Foreign::new(&bytes_of(&values), DataType::F64, &[2, 3]).strides(&[1, 2]);
    let view = Fortran::from_managed(foreign(column_major.clone(), &counter)).unwrap();
    assert_eq!(
        (view.shape.as_slice(), view.strides.as_slice()),
        (&[2, 3][..], &[1, 2][..])
    );
    assert_eq!(view.data.get(&[1, 2]).unwrap(), 5.0);
    drop(view);

    let row_major = Foreign::new(&bytes_of(&values), DataType::F64, &[2, 3]);
    assert_eq!(
        Fortran::from_managed(foreign(row_major.clone(), &counter)).unwrap_err(),
        ImportError::Layout(LayoutError::NotContiguous {
            expected: Contiguity::F,
            shape: vec![2, 3],
            strides: vec![3, 1]
        })
    );
    assert_eq!(counter.get(), 2);

    let on_cuda = |f: Foreign| Foreign {
        device: Device::cuda(1),
        ..f
    };
    for (f, strides) in [(column_major.clone(), [1, 2]), (row_major, [3, 1])] {
        let view = AnyOrderCuda::from_managed(foreign(on_cuda(f), &counter)).unwrap();
        assert_eq!(
            view.device,
            Device::cuda(1),
            "any ordinal of the device type"
        );
        assert_eq!(view.shape, [2, 3]);
        assert_eq!(view.strides, strides);
        assert!(!view.managed.is_read_only());
    }
    let strided = on_cuda(column_major.strides(&[2, 4]));
    assert!(matches!(
        AnyOrderCuda::from_managed(foreign(strided, &counter)),
        Err(ImportError::Layout(LayoutError::NotContiguous {
            expected: Contiguity::Any,
            ..
        }))
    ));
    let host = Foreign::new(&bytes_of(&values), DataType::F64, &[6]);
    assert_eq!(
        AnyOrderCuda::from_managed(foreign(host, &counter)).unwrap_err(),
        ImportError::Device {
            found: Device::CPU,
            expected: "cuda memory (kDLCUDA)"
        }
    );
    assert_eq!(counter.get(), 6);
}

#[test]
fn constraints_are_plain_values_too() {
    use dlpack_runtime::ImportConstraints;
    const C: ImportConstraints = ImportConstraints::new()
        .dtype(DataType::F32)
        .shape(&[None, Some(3)])
        .device(DeviceType::Cpu)
        .writable(true);
    assert_eq!(C.ndim, Some(2));
    let counter = Counter::new();
    let values = [0f32; 6];
    let managed = foreign(
        Foreign::new(&bytes_of(&values), DataType::F32, &[2, 3]),
        &counter,
    );
    let layout = C.check(&managed).unwrap();
    assert_eq!(layout.shape(), [2, 3]);
}

// ---------------------------------------------------------------------------------------------
// Storage enums and `Arc`-shared storage.

/// A candle-like storage enum: one buffer per element type.
#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    I64(Vec<i64>),
    Shared { values: Arc<[f64]> },
}

/// A tensor over shared storage.
#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    _guard: DropGuard,
}

/// A consumer of three element types, dispatched on the dtype.
#[derive(DlpackImportStorage, Debug)]
enum Imported {
    F32(ImportedData<f32>),
    I64(ImportedData<i64>),
    F64 { data: ImportedData<f64> },
}

/// A consumer over the import storage.
#[derive(DlpackImport, Debug)]
struct View {
    #[dlpack(data)]
    data: Imported,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A compact consumer of one element type.
#[derive(DlpackImport)]
struct Dense<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[test]
fn storage_enum_exports_each_variant_with_its_dtype() {
    let counter = Counter::new();
    let cases = [
        (Storage::F32(vec![1.0, 2.0]), DataType::F32),
        (Storage::I64(vec![-1, 7]), DataType::I64),
        (
            Storage::Shared {
                values: Arc::from(vec![0.5, 0.25]),
            },
            DataType::F64,
        ),
    ];
    for (count, (storage, dtype)) in cases.into_iter().enumerate() {
        let t = Tensor {
            storage: Arc::new(storage),
            shape: vec![2],
            _guard: counter.guard(),
        };
        let managed = t.into_dlpack().unwrap();
        assert_eq!(DataType::from_raw(managed.dl_tensor().dtype), dtype);
        assert_eq!(managed.flags(), 0, "a unique `Arc` is exported writable");
        let view = View::from_managed(managed).unwrap();
        assert_eq!(view.shape, [2]);
        match view.data {
            Imported::F32(d) => assert_eq!(d.to_vec().unwrap(), [1.0, 2.0]),
            Imported::I64(d) => assert_eq!(d.to_vec().unwrap(), [-1, 7]),
            Imported::F64 { data } => assert_eq!(data.to_vec().unwrap(), [0.5, 0.25]),
        }
        assert_eq!(counter.get(), count + 1);
    }
}

#[test]
fn arc_shared_storage_is_exported_read_only_and_kept_alive() {
    let counter = Counter::new();
    let storage = Arc::new(Storage::F32(vec![1.0, 2.0, 3.0]));
    let t = Tensor {
        storage: storage.clone(),
        shape: vec![3],
        _guard: counter.guard(),
    };
    let managed = t.into_dlpack().unwrap();
    assert_eq!(
        managed.flags(),
        DLPACK_FLAG_BITMASK_READ_ONLY,
        "another `Arc` sees the memory: read-only"
    );
    let view = Flagless::<f32>::from_managed(managed).unwrap();
    assert_eq!(view.shape, [3]);
    drop(storage);
    assert_eq!(view.data.as_slice().unwrap(), [1.0, 2.0, 3.0]);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(counter.get(), 1);
}

/// A consumer of any writability.
#[derive(DlpackImport)]
struct Flagless<T: dlpack_runtime::Element> {
    #[dlpack(data)]
    data: ImportedData<T>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

#[test]
fn import_storage_refuses_other_dtypes_naming_each_variant() {
    let counter = Counter::new();
    let values = [1i32, 2];
    let f = Foreign::new(&bytes_of(&values), DataType::I32, &[2]);
    let err = View::from_managed(foreign(f, &counter)).unwrap_err();
    let refused = |expected| {
        ImportError::Layout(LayoutError::DtypeMismatch {
            found: DataType::I32,
            expected,
        })
    };
    assert_eq!(
        err,
        ImportError::NoVariant {
            storage: "Imported",
            reasons: vec![
                ("F32", refused(DataType::F32)),
                ("I64", refused(DataType::I64)),
                ("F64", refused(DataType::F64)),
            ]
        }
    );
    assert_eq!(
        err.to_string(),
        "no variant of `Imported` accepts the tensor: `F32` refuses it (cannot import: dtype is int32, expected float32); \
         `I64` refuses it (cannot import: dtype is int32, expected int64); \
         `F64` refuses it (cannot import: dtype is int32, expected float64)"
    );
    assert_eq!(counter.get(), 1);
}

/// A hand-written storage: only the shared method, so exports by value are read-only.
enum HandWritten {
    Bytes(Vec<u8>),
    Words(Box<[u16]>),
}

impl AsExportBuffer for HandWritten {
    fn as_export_buffer(&self) -> &dyn ExportBuffer {
        match self {
            HandWritten::Bytes(b) => b,
            HandWritten::Words(w) => w,
        }
    }
}

/// A hand-written storage with both methods.
struct Writable16(Vec<u16>);

impl AsExportBuffer for Writable16 {
    fn as_export_buffer(&self) -> &dyn ExportBuffer {
        &self.0
    }
    fn as_export_buffer_mut(&mut self) -> BufferAccess<'_> {
        self.0.as_export_buffer_mut()
    }
}

#[derive(DlpackExport)]
struct Generic<S: AsExportBuffer> {
    #[dlpack(data)]
    storage: S,
    #[dlpack(shape)]
    shape: [usize; 1],
}

#[test]
fn hand_written_storage_is_read_only_unless_it_lends_mutably() {
    let t = Generic {
        storage: HandWritten::Words(vec![1u16, 2, 3].into()),
        shape: [3],
    };
    let managed = t.into_dlpack().unwrap();
    assert_eq!(managed.flags(), DLPACK_FLAG_BITMASK_READ_ONLY);
    let view = Flagless::<u16>::from_managed(managed).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [1, 2, 3]);

    let t = Generic {
        storage: HandWritten::Bytes(vec![9, 8]),
        shape: [2],
    };
    let view = Flagless::<u8>::from_dlpack(t).unwrap();
    assert_eq!(view.data.as_slice().unwrap(), [9, 8]);

    let t = Generic {
        storage: Writable16(vec![4, 5]),
        shape: [2],
    };
    let managed = t.into_dlpack().unwrap();
    assert_eq!(managed.flags(), 0);
}

// ---------------------------------------------------------------------------------------------
// Shared export: an `Arc` of a derived struct.

#[test]
fn shared_export_keeps_the_arc_alive_while_the_consumer_holds_the_tensor() {
    let counter = Counter::new();
    let t = Arc::new(Tensor {
        storage: Arc::new(Storage::I64(vec![10, 20, 30])),
        shape: vec![3],
        _guard: counter.guard(),
    });
    let view = Flagless::<i64>::from_dlpack(t.clone()).unwrap();
    assert!(view.data.is_read_only(), "a shared export is read-only");
    drop(t);
    assert_eq!(counter.get(), 0, "the consumer still holds the `Arc`");
    assert_eq!(view.data.as_slice().unwrap(), [10, 20, 30]);
    drop(view);
    assert_eq!(counter.get(), 1);
}

// ---------------------------------------------------------------------------------------------
// The `readonly` flag over an `Arc`.

/// A read-only type over an `Arc`: read-only even while the `Arc` is unique.
#[derive(DlpackExport)]
#[dlpack(readonly)]
struct FrozenShared {
    #[dlpack(data)]
    values: Arc<Vec<i32>>,
    #[dlpack(shape)]
    shape: [usize; 1],
    _guard: DropGuard,
}

#[test]
fn readonly_type_over_a_unique_arc_is_exported_read_only() {
    let counter = Counter::new();
    let t = FrozenShared {
        values: Arc::new(vec![1, 2, 3]),
        shape: [3],
        _guard: counter.guard(),
    };
    assert_eq!(Arc::strong_count(&t.values), 1);
    let managed = t.into_dlpack().unwrap();
    assert_eq!(managed.flags(), READ_ONLY);
    let view = Flagged::from_managed(managed).unwrap();
    assert!(view.read_only);
    assert_eq!(view.data.as_slice().unwrap(), [1, 2, 3]);
    assert_eq!(counter.get(), 0);
    drop(view);
    assert_eq!(counter.get(), 1, "the deleter dropped the owner");
}
