//! `#[repr(C)]` mirror of `dlpack.h` 1.3, under the header's own names.
//!
//! This module holds the ABI and nothing else: no logic, no validation. Every struct carries
//! compile-time size, alignment and offset assertions: the layout of the `dlpack.h` structs on
//! x86_64 / LP64.
//!
//! Enumerations of the header (`DLDeviceType`, `DLDataTypeCode`) are plain integers with one
//! constant per enumerator rather than Rust `enum`s: a foreign producer may hand over a code this
//! crate does not know, and a Rust `enum` holding an unlisted discriminant is undefined behaviour.
//! The safe layer ([`crate::Device`], [`crate::DataType`]) keeps unknown codes as values.

#![allow(non_upper_case_globals, non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::{align_of, offset_of, size_of};

/// `DLPACK_MAJOR_VERSION`: the major version this crate implements (header 1.3).
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION`: the minor version this crate implements (header 1.3).
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write to the data
/// (`dlpack.h`, `DLManagedTensorVersioned::flags`).
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the tensor is a copy made by the producer for this consumer,
/// which owns it until it calls the deleter (`dlpack.h`, `DLManagedTensorVersioned::flags`).
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: a sub-byte dtype is stored one element per byte
/// (padded) rather than packed (DLPack 1.1; `dlpack.h`, `DLManagedTensorVersioned::flags`).
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLPackVersion` (`dlpack.h`): 8 bytes, align 4.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DLPackVersion {
    /// A major bump means the layout of `DLManagedTensorVersioned` changed.
    pub major: u32,
    /// A minor bump means added enumerators; the ABI is unchanged.
    pub minor: u32,
}

/// `DLDeviceType` (`dlpack.h`): a C `enum`, 4 bytes (`int32_t` in C++). Kept as an integer so
/// that unknown codes from newer producers can be held without undefined behaviour.
pub type DLDeviceType = i32;
/// CPU device.
pub const kDLCPU: DLDeviceType = 1;
/// CUDA GPU device.
pub const kDLCUDA: DLDeviceType = 2;
/// Pinned CUDA host memory allocated by `cudaMallocHost`.
pub const kDLCUDAHost: DLDeviceType = 3;
/// OpenCL device.
pub const kDLOpenCL: DLDeviceType = 4;
/// Vulkan buffer.
pub const kDLVulkan: DLDeviceType = 7;
/// Apple Metal.
pub const kDLMetal: DLDeviceType = 8;
/// Verilog simulator buffer.
pub const kDLVPI: DLDeviceType = 9;
/// AMD ROCm GPU.
pub const kDLROCM: DLDeviceType = 10;
/// Pinned ROCm host memory allocated by `hipMallocHost`.
pub const kDLROCMHost: DLDeviceType = 11;
/// Reserved extension device type, with implementation-defined semantics.
pub const kDLExtDev: DLDeviceType = 12;
/// CUDA managed (unified) memory allocated by `cudaMallocManaged`.
pub const kDLCUDAManaged: DLDeviceType = 13;
/// oneAPI unified shared memory on a non-partitioned device.
pub const kDLOneAPI: DLDeviceType = 14;
/// WebGPU.
pub const kDLWebGPU: DLDeviceType = 15;
/// Qualcomm Hexagon DSP.
pub const kDLHexagon: DLDeviceType = 16;
/// Microsoft MAIA.
pub const kDLMAIA: DLDeviceType = 17;
/// AWS Trainium (DLPack 1.2).
pub const kDLTrn: DLDeviceType = 18;

/// `DLDevice` (`dlpack.h`): 8 bytes, align 4.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// One of the `kDL*` device type codes.
    pub device_type: DLDeviceType,
    /// The device ordinal, in the producer's numbering; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

/// `DLDataTypeCode` (`dlpack.h`): stored in `DLDataType::code` as a `uint8_t`.
pub type DLDataTypeCode = u8;
/// Signed integer.
pub const kDLInt: DLDataTypeCode = 0;
/// Unsigned integer.
pub const kDLUInt: DLDataTypeCode = 1;
/// IEEE floating point.
pub const kDLFloat: DLDataTypeCode = 2;
/// Opaque handle; for testing only, both parties must agree on its meaning.
pub const kDLOpaqueHandle: DLDataTypeCode = 3;
/// bfloat16.
pub const kDLBfloat: DLDataTypeCode = 4;
/// Complex number, a compact struct per element; `bits` is the total width (complex64: 64).
pub const kDLComplex: DLDataTypeCode = 5;
/// Boolean; 8 bits by convention.
pub const kDLBool: DLDataTypeCode = 6;
/// float8 e3m4.
pub const kDLFloat8_e3m4: DLDataTypeCode = 7;
/// float8 e4m3.
pub const kDLFloat8_e4m3: DLDataTypeCode = 8;
/// float8 e4m3b11fnuz.
pub const kDLFloat8_e4m3b11fnuz: DLDataTypeCode = 9;
/// float8 e4m3fn.
pub const kDLFloat8_e4m3fn: DLDataTypeCode = 10;
/// float8 e4m3fnuz.
pub const kDLFloat8_e4m3fnuz: DLDataTypeCode = 11;
/// float8 e5m2.
pub const kDLFloat8_e5m2: DLDataTypeCode = 12;
/// float8 e5m2fnuz.
pub const kDLFloat8_e5m2fnuz: DLDataTypeCode = 13;
/// float8 e8m0fnu.
pub const kDLFloat8_e8m0fnu: DLDataTypeCode = 14;
/// float6 e2m3fn; `bits` must be 6.
pub const kDLFloat6_e2m3fn: DLDataTypeCode = 15;
/// float6 e3m2fn; `bits` must be 6.
pub const kDLFloat6_e3m2fn: DLDataTypeCode = 16;
/// float4 e2m1fn; `bits` must be 4.
pub const kDLFloat4_e2m1fn: DLDataTypeCode = 17;

/// `DLDataType` (`dlpack.h`): 4 bytes, align 2.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// One of the `kDL*` type codes.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element; greater than 1 for vector types.
    pub lanes: u16,
}

/// `DLTensor` (`dlpack.h`): 48 bytes, align 8. Borrowed view of memory; does not own it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// Base pointer of the allocation (or an opaque handle on some devices).
    pub data: *mut c_void,
    /// Device the memory lives on.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents, in elements. May be NULL when `ndim == 0`.
    pub shape: *mut i64,
    /// `ndim` strides, in elements (not bytes). NULL means compact row-major for producers
    /// reporting minor version < 2 and for legacy tensors; may be NULL when `ndim == 0`.
    pub strides: *mut i64,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// Deleter of a legacy `DLManagedTensor`.
pub type DLManagedTensorDeleter = unsafe extern "C" fn(*mut DLManagedTensor);
/// Deleter of a `DLManagedTensorVersioned`.
pub type DLManagedTensorVersionedDeleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);

/// `DLManagedTensor` (`dlpack.h`; legacy, pre-1.0): 64 bytes, align 8.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// Producer context; may be NULL.
    pub manager_ctx: *mut c_void,
    /// Destroys `manager_ctx` and frees this struct. May be NULL.
    pub deleter: Option<DLManagedTensorDeleter>,
}

/// `DLManagedTensorVersioned` (`dlpack.h`, DLPack 1.x): 80 bytes, align 8.
///
/// Everything up to and including `flags` keeps its layout across major versions, so the
/// deleter can always be found (offset 16).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version of this struct.
    pub version: DLPackVersion,
    /// Producer context; may be NULL.
    pub manager_ctx: *mut c_void,
    /// Destroys `manager_ctx` and frees this struct. May be NULL.
    pub deleter: Option<DLManagedTensorVersionedDeleter>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// `DLPackExchangeAPIHeader` (`dlpack.h`): 16 bytes; the `header` of a `DLPackExchangeAPI`.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPIHeader {
    /// Version of the table; a consumer checks `major` before using it.
    pub version: DLPackVersion,
    /// An older table, or NULL.
    pub prev_api: *mut DLPackExchangeAPIHeader,
}

/// `DLPackManagedTensorAllocator` (`dlpack.h`): the type of
/// `DLPackExchangeAPI::managed_tensor_allocator`.
pub type DLPackManagedTensorAllocator = unsafe extern "C" fn(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char),
    >,
) -> c_int;
/// `DLPackManagedTensorFromPyObjectNoSync` (`dlpack.h`): the type of
/// `DLPackExchangeAPI::managed_tensor_from_py_object_no_sync`.
pub type DLPackManagedTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int;
/// `DLPackManagedTensorToPyObjectNoSync` (`dlpack.h`): the type of
/// `DLPackExchangeAPI::managed_tensor_to_py_object_no_sync`.
pub type DLPackManagedTensorToPyObjectNoSync = unsafe extern "C" fn(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> c_int;
/// `DLPackDLTensorFromPyObjectNoSync` (`dlpack.h`): the type of
/// `DLPackExchangeAPI::dltensor_from_py_object_no_sync`.
pub type DLPackDLTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int;
/// `DLPackCurrentWorkStream` (`dlpack.h`): the type of `DLPackExchangeAPI::current_work_stream`.
pub type DLPackCurrentWorkStream = unsafe extern "C" fn(
    device_type: DLDeviceType,
    device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> c_int;

/// `DLPackExchangeAPI` (`dlpack.h`): 56 bytes. Published by a Python type as the
/// `__dlpack_c_exchange_api__` attribute, a capsule named `"dlpack_exchange_api"`.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPI {
    /// Version and chain to older tables.
    pub header: DLPackExchangeAPIHeader,
    /// Never NULL.
    pub managed_tensor_allocator: Option<DLPackManagedTensorAllocator>,
    /// Never NULL.
    pub managed_tensor_from_py_object_no_sync: Option<DLPackManagedTensorFromPyObjectNoSync>,
    /// Never NULL.
    pub managed_tensor_to_py_object_no_sync: Option<DLPackManagedTensorToPyObjectNoSync>,
    /// May be NULL.
    pub dltensor_from_py_object_no_sync: Option<DLPackDLTensorFromPyObjectNoSync>,
    /// Never NULL.
    pub current_work_stream: Option<DLPackCurrentWorkStream>,
}

/// Capsule name of an unconsumed `DLManagedTensor` ("Implementation" section of the
/// [DLPack Python specification](https://dmlc.github.io/dlpack/latest/python_spec.html)).
pub const DLTENSOR_CAPSULE_NAME: &core::ffi::CStr = c"dltensor";
/// Capsule name of a consumed `DLManagedTensor` (DLPack Python specification, "Implementation").
pub const USED_DLTENSOR_CAPSULE_NAME: &core::ffi::CStr = c"used_dltensor";
/// Capsule name of an unconsumed `DLManagedTensorVersioned` (DLPack Python specification,
/// "Implementation").
pub const DLTENSOR_VERSIONED_CAPSULE_NAME: &core::ffi::CStr = c"dltensor_versioned";
/// Capsule name of a consumed `DLManagedTensorVersioned` (DLPack Python specification,
/// "Implementation").
pub const USED_DLTENSOR_VERSIONED_CAPSULE_NAME: &core::ffi::CStr = c"used_dltensor_versioned";
/// Capsule name of a `DLPackExchangeAPI` table (`dlpack.h`, `DLPackExchangeAPI`).
pub const DLPACK_EXCHANGE_API_CAPSULE_NAME: &core::ffi::CStr = c"dlpack_exchange_api";

// Layout assertions: the layout of the `dlpack.h` structs on x86_64 / LP64. On 32-bit targets
// pointer-sized fields shrink, so the pointer-dependent assertions are limited to 64-bit.
const _: () = {
    assert!(size_of::<DLPackVersion>() == 8 && align_of::<DLPackVersion>() == 4);
    assert!(offset_of!(DLPackVersion, major) == 0);
    assert!(offset_of!(DLPackVersion, minor) == 4);

    assert!(size_of::<DLDevice>() == 8 && align_of::<DLDevice>() == 4);
    assert!(offset_of!(DLDevice, device_type) == 0);
    assert!(offset_of!(DLDevice, device_id) == 4);

    assert!(size_of::<DLDataType>() == 4 && align_of::<DLDataType>() == 2);
    assert!(offset_of!(DLDataType, code) == 0);
    assert!(offset_of!(DLDataType, bits) == 1);
    assert!(offset_of!(DLDataType, lanes) == 2);
};

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLTensor>() == 48 && align_of::<DLTensor>() == 8);
    assert!(offset_of!(DLTensor, data) == 0);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);

    assert!(size_of::<DLManagedTensor>() == 64 && align_of::<DLManagedTensor>() == 8);
    assert!(offset_of!(DLManagedTensor, dl_tensor) == 0);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);

    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(align_of::<DLManagedTensorVersioned>() == 8);
    assert!(offset_of!(DLManagedTensorVersioned, version) == 0);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);

    assert!(size_of::<DLPackExchangeAPIHeader>() == 16);
    assert!(offset_of!(DLPackExchangeAPIHeader, prev_api) == 8);
    assert!(size_of::<DLPackExchangeAPI>() == 56);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_allocator) == 16);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync) == 24);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync) == 32);
    assert!(offset_of!(DLPackExchangeAPI, dltensor_from_py_object_no_sync) == 40);
    assert!(offset_of!(DLPackExchangeAPI, current_work_stream) == 48);

    // `Option<extern "C" fn>` is guaranteed to be a nullable function pointer.
    assert!(size_of::<Option<DLManagedTensorDeleter>>() == size_of::<*mut c_void>());
};
