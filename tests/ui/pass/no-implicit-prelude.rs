// Hygiene: no prelude, and the prelude's names taken by the user's own items, so the
// generated code must name everything by absolute path. Field names match the derive's
// locals without clashing.
#![no_implicit_prelude]
#![allow(dead_code, non_camel_case_types)]

use ::dlpack_runtime::{
    DataType, Device, DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage, ImportedData,
};

struct Option;
struct Some;
struct None;
struct Result;
struct Ok;
struct Err;
struct Box;
struct Vec;
struct Default;
struct String;
struct usize;
struct bool;
struct Arc;
mod core {}
mod std {}

#[derive(DlpackExport)]
struct Matrix {
    #[dlpack(data)]
    managed: ::std::vec::Vec<f32>,
    #[dlpack(shape)]
    layout: [::core::primitive::usize; 2],
    #[dlpack(strides)]
    constraints: [::core::primitive::isize; 2],
    #[dlpack(byte_offset)]
    byte_offset: ::core::primitive::usize,
    #[dlpack(device)]
    device: Device,
    #[dlpack(readonly)]
    __dlpack_readonly: ::core::primitive::bool,
}

#[derive(DlpackStorage)]
enum Storage {
    F32(::std::vec::Vec<f32>),
    F64 {
        __dlpack_buffer: ::std::vec::Vec<f64>,
    },
}

#[derive(DlpackImportStorage)]
enum Imported {
    F32(ImportedData<f32>),
    F64 { __dlpack_buffer: ImportedData<f64> },
}

#[derive(DlpackExport)]
#[dlpack(readonly)]
struct Shared {
    #[dlpack(data)]
    storage: ::std::sync::Arc<Storage>,
    #[dlpack(shape)]
    shape: ::std::vec::Vec<::core::primitive::usize>,
    #[dlpack(offset)]
    offset: ::core::primitive::usize,
    #[dlpack(dtype)]
    dtype: DataType,
}

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    __dlpack_shape: ImportedData<f32>,
    #[dlpack(shape)]
    __dlpack_data: ::std::vec::Vec<::core::primitive::usize>,
    #[dlpack(device)]
    managed: Device,
    #[dlpack(byte_offset)]
    layout: ::core::primitive::usize,
    #[dlpack(readonly)]
    __dlpack_managed: ::core::primitive::bool,
    label: ::std::string::String,
}

#[derive(DlpackImport)]
#[dlpack(dtype = f64, shape = [_, 2], contiguous = "any", device = "cpu", writable)]
struct Constrained {
    #[dlpack(data)]
    data: Imported,
    #[dlpack(shape)]
    shape: [::core::primitive::usize; 2],
    #[dlpack(strides)]
    strides: ::std::vec::Vec<::core::primitive::isize>,
    #[dlpack(offset)]
    __dlpack_offset: ::core::primitive::usize,
    #[dlpack(dtype)]
    __dlpack_constraints: DataType,
}

fn main() -> ::core::result::Result<(), ::std::boxed::Box<dyn ::std::error::Error>> {
    // A 2x3 matrix after one skipped element: byte offset 4.
    let m = Matrix {
        managed: ::std::vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        layout: [2, 3],
        constraints: [3, 1],
        byte_offset: 4,
        device: Device::CPU,
        __dlpack_readonly: true,
    };
    let view = <View as DlpackImport>::from_managed(m.into_dlpack()?)?;
    ::std::assert_eq!(view.__dlpack_data, [2, 3]);
    ::std::assert_eq!(view.__dlpack_shape.get(&[1, 2])?, 6.0);
    ::std::assert_eq!(view.managed, Device::CPU);
    ::std::assert!(view.__dlpack_managed);
    // Host exports fold the offset into `data`.
    ::std::assert_eq!(view.layout, 0);
    ::std::assert!(view.label.is_empty());

    let s = Shared {
        storage: ::std::sync::Arc::new(Storage::F64 {
            __dlpack_buffer: ::std::vec![9.0, 1.0, 2.0, 3.0, 4.0],
        }),
        shape: ::std::vec![2, 2],
        offset: 1,
        dtype: DataType::F64,
    };
    // Read-only (the flag), so the `writable` consumer refuses it.
    ::std::assert!(<Constrained as DlpackImport>::from_dlpack(s).is_err());
    let s = Shared {
        storage: ::std::sync::Arc::new(Storage::F32(::std::vec![1.0, 2.0])),
        shape: ::std::vec![1, 2],
        offset: 0,
        dtype: DataType::F32,
    };
    ::std::assert!(<Constrained as DlpackImport>::from_dlpack(s).is_err());
    ::core::result::Result::Ok(())
}
