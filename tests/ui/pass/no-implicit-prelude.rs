// Hygiene: no prelude, and the prelude's names taken by the user's own items, so the
// generated code must name everything by absolute path. Field names match the derive's
// locals without clashing.
#![no_implicit_prelude]
#![allow(dead_code, non_camel_case_types)]

use ::dlpack_runtime::{Device, DlpackExport, DlpackImport, ImportedData};

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
    label: ::std::string::String,
}

fn main() -> ::core::result::Result<(), ::std::boxed::Box<dyn ::std::error::Error>> {
    // A 2x3 matrix after one skipped element: byte offset 4.
    let m = Matrix {
        managed: ::std::vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        layout: [2, 3],
        constraints: [3, 1],
        byte_offset: 4,
        device: Device::CPU,
    };
    let view = <View as DlpackImport>::from_managed(m.to_dlpack()?)?;
    ::std::assert_eq!(view.__dlpack_data, [2, 3]);
    ::std::assert_eq!(view.__dlpack_shape.get(&[1, 2])?, 6.0);
    ::std::assert_eq!(view.managed, Device::CPU);
    // Host exports fold the offset into `data`.
    ::std::assert_eq!(view.layout, 0);
    ::std::assert!(view.label.is_empty());
    ::core::result::Result::Ok(())
}
