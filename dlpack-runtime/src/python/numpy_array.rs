//! Imports of NumPy arrays read from the array's own fields, without a `__dlpack__` round trip.
//!
//! `from_dlpack(x)` with no `device`, `copy` or `stream` asked, on an object whose type is
//! exactly NumPy's `ndarray`, reads what NumPy's `__dlpack__` would export from the array's
//! fields (NumPy's C ABI: `PyArrayObject_fields` and `PyArray_Descr`, unchanged in their first
//! fields from NumPy 1.0 to 2.x, as in `ndarraytypes.h`) and builds the managed tensor itself:
//! its `manager_ctx` is the array (a strong reference, released by the deleter, with the GIL),
//! as in NumPy's own export, `data` the array's data pointer, `byte_offset` 0, the strides in
//! elements. This skips the method call, NumPy's argument parsing, its allocation and the
//! capsule (about 1,200 of the 1,800 instructions the import costs through `__dlpack__`).
//!
//! Only what NumPy's `__dlpack__` exports the same way takes this path: a writeable array (a
//! read-only one is exported or refused depending on the NumPy version), of a boolean, integer,
//! floating-point (half, single, double) or complex (single, double) dtype in native byte order,
//! whose byte strides are multiples of the item size, with at most [`INLINE_DIMS`] dimensions.
//! Everything else (subclasses, `np.memmap`, other dtypes) asks `__dlpack__`, which
//! exports it or raises its own error.

use core::ffi::{c_int, c_void};
use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use pyo3::ffi as pyffi;
use pyo3::prelude::*;

use std::alloc::Layout;

use super::producer::PyOwner;
use crate::abi::ffi::{self, DLDataType, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::abi::numpy::ArrayFields;
use crate::export::block_cache;
use crate::tensor::layout::{self, NullStrides, Reach, check_address, span_from_bounds};
use crate::tensor::managed::{ManagedTensor, RawManagedTensor};

/// Dimensions kept in the managed tensor's allocation; arrays with more take `__dlpack__`.
const INLINE_DIMS: usize = 8;

/// `NPY_ARRAY_WRITEABLE` (`ndarraytypes.h`).
const NPY_ARRAY_WRITEABLE: c_int = 0x0400;

/// The DLPack data type of NumPy's type number `type_num` (`NPY_TYPES`, `ndarraytypes.h`),
/// for the types NumPy's `__dlpack__` exports with a fixed size on every platform it builds
/// for; `None` for the others.
fn dtype_of(type_num: c_int) -> Option<DLDataType> {
    let long = core::ffi::c_long::BITS as u8;
    let (code, bits) = match type_num {
        0 => (ffi::kDLBool, 8),       // NPY_BOOL
        1 => (ffi::kDLInt, 8),        // NPY_BYTE
        2 => (ffi::kDLUInt, 8),       // NPY_UBYTE
        3 => (ffi::kDLInt, 16),       // NPY_SHORT
        4 => (ffi::kDLUInt, 16),      // NPY_USHORT
        5 => (ffi::kDLInt, 32),       // NPY_INT
        6 => (ffi::kDLUInt, 32),      // NPY_UINT
        7 => (ffi::kDLInt, long),     // NPY_LONG
        8 => (ffi::kDLUInt, long),    // NPY_ULONG
        9 => (ffi::kDLInt, 64),       // NPY_LONGLONG
        10 => (ffi::kDLUInt, 64),     // NPY_ULONGLONG
        11 => (ffi::kDLFloat, 32),    // NPY_FLOAT
        12 => (ffi::kDLFloat, 64),    // NPY_DOUBLE
        14 => (ffi::kDLComplex, 64),  // NPY_CFLOAT
        15 => (ffi::kDLComplex, 128), // NPY_CDOUBLE
        23 => (ffi::kDLFloat, 16),    // NPY_HALF
        _ => return None,
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// The managed tensor's allocation: the header first (its address is the holder's, which the
/// deleter frees), the shape and strides it points to, and the array it keeps alive.
#[repr(C)]
struct Holder {
    tensor: DLManagedTensorVersioned,
    shape: [i64; INLINE_DIMS],
    strides: [i64; INLINE_DIMS],
    array: PyOwner<PyAny>,
}

/// The layout of a [`Holder`]'s block: one of the export blocks' cache (a thread that imports
/// and drops arrays in turn reuses one block rather than asking the allocator each time).
fn holder_layout() -> Layout {
    block_cache::allocation_layout(Layout::new::<Holder>())
}

/// The deleter of tensors made here: frees the holder, releasing the array (attached to the
/// interpreter, see [`PyOwner`]'s drop).
unsafe extern "C" fn delete(tensor: *mut DLManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // A panic must not unwind into the caller (C); none is expected (a decref and a free).
    let _ = std::panic::catch_unwind(|| {
        let holder = tensor.cast::<Holder>();
        // SAFETY: `tensor` is the header of a `Holder` made by `import` (its first field, the
        // struct `repr(C)`) in a block of `holder_layout()` from the export blocks' cache,
        // dropped and freed only here: the deleter runs once (DLPack).
        unsafe {
            core::ptr::drop_in_place(holder);
            block_cache::free(holder.cast(), holder_layout());
        }
    });
}

/// The address of [`delete`]: NumPy memory to the borrow bridge (`borrow::rust_numpy`), whose
/// `manager_ctx` is the array, as in NumPy's own export.
fn deleter_address() -> usize {
    delete as unsafe extern "C" fn(*mut DLManagedTensorVersioned) as usize
}

/// The managed tensor NumPy's `__dlpack__` would export for `obj`, read from its fields, when
/// `obj` is exactly an `ndarray` of `ndarray_type` that NumPy exports as this module describes;
/// `None` otherwise (the caller then asks `__dlpack__`).
pub(super) fn import(
    obj: &Bound<'_, PyAny>,
    ndarray_type: *mut pyffi::PyTypeObject,
) -> Option<ManagedTensor> {
    // SAFETY: `obj` is a live object and the GIL is held (`Bound`).
    if unsafe { pyffi::Py_TYPE(obj.as_ptr()) } != ndarray_type {
        return None;
    }
    let array = obj.as_ptr().cast::<ArrayFields>();
    // SAFETY: an object of exactly NumPy's `ndarray` type is a `PyArrayObject`, whose first
    // fields are `ArrayFields` in every NumPy this runs with (`ndarraytypes.h`); its `descr`
    // is a live `PyArray_Descr` held by the array, whose first fields are `DescrFields`. Read
    // with the GIL held (free-threaded builds: as NumPy's `__dlpack__` reads them, unlocked).
    let (data, nd, dimensions, strides, descr, flags) = unsafe {
        let a = &*array;
        (a.data, a.nd, a.dimensions, a.strides, &*a.descr, a.flags)
    };
    if flags & NPY_ARRAY_WRITEABLE == 0 || !matches!(descr.byteorder as u8, b'=' | b'|') {
        return None;
    }
    let dtype = dtype_of(descr.type_num)?;
    // Before the first tensor with this deleter exists: its memory is then known as NumPy's.
    crate::borrow::NUMPY_FIELDS_DELETER.store(deleter_address(), Ordering::Release);
    let ndim = usize::try_from(nd).ok().filter(|&nd| nd <= INLINE_DIMS)?;
    let itemsize = isize::from(dtype.bits / 8);
    let mut shape = [0i64; INLINE_DIMS];
    let mut element_strides = [0i64; INLINE_DIMS];
    // The layout checks of `layout::validate`, made while the fields are read: the element
    // count and the elements' reach, in checked arithmetic. An array they refuse asks
    // `__dlpack__`, whose export is then validated (and refused) as any producer's.
    let mut numel: u64 = 1;
    let mut reach = Reach::new();
    for axis in 0..ndim {
        // SAFETY: `dimensions` and `strides` hold `nd` entries each (NumPy), `axis < nd`.
        let (extent, stride) = unsafe { (*dimensions.add(axis), *strides.add(axis)) };
        if stride % itemsize != 0 || extent < 0 {
            return None;
        }
        let (extent, stride) = (extent as i64, (stride / itemsize) as i64);
        numel = numel.checked_mul(extent as u64)?;
        if extent > 0 {
            reach.add(extent, stride);
        }
        shape[axis] = extent;
        element_strides[axis] = stride;
    }
    let numel = usize::try_from(numel)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)?;
    if numel > 0 {
        let (lo, hi) = reach.bounds().ok()?;
        let span = span_from_bounds(lo, hi, u64::from(dtype.bits), 0).ok()?;
        check_address(data.cast(), numel, span).ok()?;
    }
    let layout = holder_layout();
    // SAFETY: a layout of the cache's, of non-zero size.
    let holder = unsafe { block_cache::allocate(layout) }.cast::<Holder>();
    if holder.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    let value = Holder {
        tensor: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: ffi::DLPACK_MAJOR_VERSION,
                minor: ffi::DLPACK_MINOR_VERSION,
            },
            manager_ctx: obj.as_ptr().cast::<c_void>(),
            deleter: Some(delete),
            flags: 0,
            dl_tensor: DLTensor {
                data: data.cast::<c_void>(),
                device: ffi::DLDevice {
                    device_type: ffi::kDLCPU,
                    device_id: 0,
                },
                ndim: nd,
                dtype,
                shape: core::ptr::null_mut(),
                strides: core::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape,
        strides: element_strides,
        array: PyOwner(Some(obj.clone().unbind())),
    };
    // SAFETY: `holder` is a fresh block of `layout`, large and aligned enough for a `Holder`
    // (`holder_layout`); the header points into its own block, which does not move until the
    // deleter frees it.
    unsafe {
        holder.write(value);
        (*holder).tensor.dl_tensor.shape = (*holder).shape.as_mut_ptr();
        (*holder).tensor.dl_tensor.strides = (*holder).strides.as_mut_ptr();
    }
    let tensor = NonNull::new(holder.cast::<DLManagedTensorVersioned>())?;
    debug_assert!(
        // SAFETY: the header and the arrays it points to were just written, in one block.
        unsafe { layout::check_header(&(*tensor.as_ptr()).dl_tensor, NullStrides::Refuse, false) }
            .is_ok(),
        "the fields' checks accepted a layout that validation refuses"
    );
    // SAFETY: a managed tensor laid out as `dlpack.h` describes (version 1, no flags, in an
    // aligned block), valid until its deleter, whose duty is handed over here; its header
    // passes `layout::validate`: `0 <= ndim <= INLINE_DIMS < MAX_NDIM`, a dtype of whole bytes
    // from `dtype_of`, `byte_offset` 0, `shape` and `strides` non-NULL, every extent `>= 0`,
    // the element count and the byte span checked above as validation checks them, and the
    // span's address range by `check_address`. It is not `unaliased`: the array's memory is
    // NumPy's, reachable by any other view of it.
    Some(unsafe { ManagedTensor::from_raw_validated(RawManagedTensor::Versioned(tensor), false) })
}
