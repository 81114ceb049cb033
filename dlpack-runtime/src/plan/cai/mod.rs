//! The CUDA Array Interface, both ways, as pure decisions: the fields of a
//! `__cuda_array_interface__` dict checked and turned into a tensor description
//! ([`parse`]), and a tensor described as those fields ([`describe`]). No Python and no driver:
//! the Python layer reads and writes the dict, the CUDA driver tier orders the streams.
//!
//! The source is the
//! [CUDA Array Interface](https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html),
//! versions 0 to 3 (section "Python Interface Specification"; the "Differences with ..."
//! sections give the history: version 1 added `mask`, version 2 said that `strides` `None`
//! means C-contiguous and that an empty array has data pointer 0, version 3 added `stream`),
//! whose `typestr` and `descr` are those of the
//! [NumPy array interface](https://numpy.org/doc/stable/reference/arrays.interface.html).
//!
//! | field | rule |
//! |---|---|
//! | `version` | 0, 1, 2 or 3 |
//! | `shape` | extents >= 0; their product, in elements and bytes, fits the address space |
//! | `typestr` | `<` (or `|` for one-byte types) then `b1`, `i1`..`i8`, `u1`..`u8`, `f2`, `f4`, `f8`, `c8`, `c16`; `>` (big-endian) and other kinds refused |
//! | `data` | `(pointer, readonly)`; pointer 0 only for an empty array, else aligned to the item size |
//! | `strides` | absent or `None`: C-contiguous (every version); else one stride per axis, in bytes, each a multiple of the item size (negative and zero strides allowed) |
//! | `descr` | absent, or the trivial `[("", typestr)]` with the `typestr` field's string; structured types refused |
//! | the allocation | at import, every byte the layout reaches (negative strides included) inside the CUDA allocation of the `data` pointer ([`check_within`]) |
//! | `mask` | absent or `None`; masked arrays refused |
//! | `stream` | absent or `None`: nothing to wait for; `1` legacy default stream, `2` per-thread default stream, `> 2` a `cudaStream_t`; `0` and negative values refused |

// Read and written by the Python layer with the `cuda` feature; elsewhere only the tests.
#![cfg_attr(not(all(feature = "python", feature = "cuda")), allow(dead_code))]

use core::num::NonZeroU64;

use super::stream::StreamId;
use crate::tensor::dtype::DataType;

/// The newest version of the interface, the one [`describe`] exports.
pub const VERSION: i64 = 3;

/// The `typestr` of each data type the interface can spell, little-endian (`|` where byte order
/// does not apply, as NumPy writes it).
const TYPESTRS: &[(DataType, &str)] = &[
    (DataType::BOOL, "|b1"),
    (DataType::I8, "|i1"),
    (DataType::I16, "<i2"),
    (DataType::I32, "<i4"),
    (DataType::I64, "<i8"),
    (DataType::U8, "|u1"),
    (DataType::U16, "<u2"),
    (DataType::U32, "<u4"),
    (DataType::U64, "<u8"),
    (DataType::F16, "<f2"),
    (DataType::F32, "<f4"),
    (DataType::F64, "<f8"),
    (DataType::C64, "<c8"),
    (DataType::C128, "<c16"),
];

/// The fields of a `__cuda_array_interface__` dict, as the Python layer read them (integers
/// already known to fit; what a field's Python type got wrong is reported there, as
/// [`CaiError::FieldType`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CaiFields {
    /// `version`.
    pub version: i64,
    /// `shape`, extents in elements.
    pub shape: Vec<i64>,
    /// `typestr`.
    pub typestr: String,
    /// The pointer of `data`: the address of element `(0, ..., 0)`.
    pub data: u64,
    /// The read-only flag of `data`.
    pub readonly: bool,
    /// `strides` in bytes; `None` when absent or `None`.
    pub strides: Option<Vec<i64>>,
    /// `descr`, when present: its entries.
    pub descr: Option<Vec<DescrEntry>>,
    /// Whether `mask` is present and not `None`.
    pub mask: bool,
    /// `stream`; `None` when absent or `None`.
    pub stream: Option<i64>,
}

/// One entry of `descr`: `(name, typestr)` or `(name, typestr, shape)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescrEntry {
    /// The field name (`""` for an unstructured type).
    pub name: String,
    /// The entry's type string.
    pub typestr: String,
    /// Whether the entry has a third item (a sub-array shape).
    pub has_shape: bool,
}

/// A checked `__cuda_array_interface__`: what an import of it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaiTensor {
    /// The element type.
    pub dtype: DataType,
    /// Extents, in elements.
    pub shape: Vec<usize>,
    /// Strides in elements (signed); `None`: C-contiguous.
    pub strides: Option<Vec<isize>>,
    /// The address of element `(0, ..., 0)`.
    pub data: u64,
    /// The lowest address an element reaches (`data` when no stride is negative).
    pub start: u64,
    /// The bytes from `start` to the end of the highest element; 0 for an empty array.
    pub byte_len: usize,
    /// The read-only flag.
    pub read_only: bool,
    /// The stream the producer may have work pending on; `None`: nothing to wait for.
    pub stream: Option<StreamId>,
}

impl CaiTensor {
    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A tensor described as the fields of a `__cuda_array_interface__` dict (version 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaiDescription {
    /// `typestr`.
    pub typestr: &'static str,
    /// `shape`, in elements.
    pub shape: Vec<i64>,
    /// `strides` in bytes; `None` when C-contiguous (extent-1 axes ignored) or empty.
    pub strides: Option<Vec<i64>>,
    /// The pointer of `data`: the address of element `(0, ..., 0)`, 0 for an empty tensor.
    pub data: u64,
    /// The read-only flag of `data`.
    pub readonly: bool,
    /// `stream`: `1`, `2` or a `cudaStream_t`; `None` when nothing is pending.
    pub stream: Option<i64>,
}

/// A `__cuda_array_interface__` that cannot be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaiError {
    /// A required field is missing.
    #[error("__cuda_array_interface__ has no `{field}`, a required field")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A field's value has the wrong Python type.
    #[error("__cuda_array_interface__ field `{field}` is {found}, expected {expected}")]
    FieldType {
        /// The field.
        field: &'static str,
        /// What was found (a Python type name, or a description).
        found: String,
        /// What was expected.
        expected: &'static str,
    },
    /// An integer out of the range of its field.
    #[error(
        "__cuda_array_interface__ field `{field}` holds an integer out of range, expected {expected}"
    )]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// The range expected.
        expected: &'static str,
    },
    /// A version of the interface this crate does not read.
    #[error("__cuda_array_interface__ version {found}, expected 0, 1, 2 or 3")]
    Version {
        /// The version found.
        found: i64,
    },
    /// A `typestr` this crate cannot read.
    #[error(
        "__cuda_array_interface__ typestr {found:?} {reason}, expected one of |b1, |i1, <i2, <i4, <i8, |u1, <u2, <u4, <u8, <f2, <f4, <f8, <c8, <c16"
    )]
    Typestr {
        /// The typestr found.
        found: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A data type the interface cannot spell (export).
    #[error(
        "{dtype} has no typestr in the CUDA Array Interface, expected bool, int8-64, uint8-64, float16/32/64 or complex64/128"
    )]
    Unspellable {
        /// The data type.
        dtype: DataType,
    },
    /// A negative extent.
    #[error("__cuda_array_interface__ shape has extent {found} on axis {axis}, expected >= 0")]
    NegativeExtent {
        /// The axis.
        axis: usize,
        /// The extent.
        found: i64,
    },
    /// `strides` and `shape` of different lengths.
    #[error(
        "__cuda_array_interface__ has {found} strides for {expected} axes, expected one per axis"
    )]
    StridesRank {
        /// Strides found.
        found: usize,
        /// Axes.
        expected: usize,
    },
    /// A byte stride that is not a multiple of the item size.
    #[error(
        "__cuda_array_interface__ stride {stride} bytes on axis {axis} is not a multiple of the item size ({itemsize} bytes), expected element-aligned strides"
    )]
    StrideAlignment {
        /// The axis.
        axis: usize,
        /// The stride, in bytes.
        stride: i64,
        /// The item size, in bytes.
        itemsize: usize,
    },
    /// Shape, strides or pointer whose byte span overflows the address space.
    #[error("__cuda_array_interface__ {what} overflows the address space")]
    Overflow {
        /// What overflowed.
        what: &'static str,
    },
    /// A NULL data pointer for an array that has elements.
    #[error(
        "__cuda_array_interface__ data pointer is 0 for an array of {numel} elements, expected a device pointer (0 only for an empty array)"
    )]
    NullData {
        /// The number of elements.
        numel: usize,
    },
    /// A data pointer not aligned to the item size.
    #[error(
        "__cuda_array_interface__ data pointer {data:#x} is not aligned to the item size ({itemsize} bytes), expected an aligned pointer"
    )]
    DataAlignment {
        /// The pointer.
        data: u64,
        /// The item size, in bytes.
        itemsize: usize,
    },
    /// A masked array.
    #[error(
        "__cuda_array_interface__ has a mask: masked arrays are not supported, expected `mask` absent or None"
    )]
    Mask,
    /// A structured `descr`.
    #[error(
        "__cuda_array_interface__ descr {found} describes a structured type, expected absent or [('', typestr)]"
    )]
    Descr {
        /// The entries, as found.
        found: String,
    },
    /// A `descr` of one unnamed entry whose typestr is not the `typestr` field's.
    #[error(
        "__cuda_array_interface__ descr [('', {descr:?})] contradicts typestr {typestr:?}, expected absent or [('', {typestr:?})]"
    )]
    DescrTypestr {
        /// The typestr of the `descr` entry.
        descr: String,
        /// The `typestr` field.
        typestr: String,
    },
    /// A layout whose bytes reach outside the allocation its `data` pointer is in (checked at
    /// import against `cuPointerGetAttribute`'s `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` and
    /// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`). Ranges are half-open, in bytes.
    #[error(
        "__cuda_array_interface__ shape, strides and data reach bytes [{start:#x}, {end:#x}), outside the CUDA allocation [{alloc_start:#x}, {alloc_end:#x}) that the data pointer is in, expected every element inside that allocation"
    )]
    OutsideAllocation {
        /// The lowest byte an element reaches.
        start: u64,
        /// One past the highest byte an element reaches.
        end: u64,
        /// The allocation's first byte.
        alloc_start: u64,
        /// One past the allocation's last byte.
        alloc_end: u64,
    },
    /// A `data` pointer the CUDA driver does not know (`cuPointerGetAttribute` fails with
    /// `CUDA_ERROR_INVALID_VALUE`): host memory, freed memory, or no pointer at all.
    #[error(
        "the `data` pointer {data:#x} of the __cuda_array_interface__ is not CUDA device memory the driver knows (cuPointerGetAttribute: CUDA_ERROR_INVALID_VALUE), expected a pointer into a live CUDA allocation"
    )]
    NotDeviceMemory {
        /// The pointer.
        data: u64,
    },
    /// A `stream` handle the CUDA driver refuses (`cuStreamGetCtx` fails). The driver does not
    /// validate arbitrary handles: a number that is not a live stream is refused by the
    /// simulator (`CUDA_ERROR_INVALID_HANDLE`), but may crash a real driver; the producer's
    /// `stream` is trusted, as by every consumer of the interface.
    #[error(
        "the `stream` {found:#x} of the __cuda_array_interface__ is not a CUDA stream the driver knows ({cause}), expected None, 1, 2 or a live cudaStream_t"
    )]
    UnknownStream {
        /// The stream value.
        found: i64,
        /// The driver's failure.
        cause: String,
    },
    /// A layout the shared layout checks refuse at import (such as more than 64 axes).
    #[error("__cuda_array_interface__ cannot be imported: {reason}")]
    Layout {
        /// The layout check's message.
        reason: String,
    },
    /// `stream` 0 or negative.
    #[error(
        "__cuda_array_interface__ stream {found} is not allowed, expected None, 1 (legacy default stream), 2 (per-thread default stream) or a cudaStream_t > 2"
    )]
    Stream {
        /// The stream value.
        found: i64,
    },
}

/// The data type of a `typestr`.
///
/// # Errors
///
/// [`CaiError::Typestr`] for a malformed string, a big-endian multi-byte type (`>`), `|` on a
/// multi-byte type, or a kind and size without a DLPack data type (objects, strings, dates,
/// `f16` long doubles, void).
pub fn dtype_of_typestr(typestr: &str) -> Result<DataType, CaiError> {
    let refuse = |reason| CaiError::Typestr {
        found: typestr.to_owned(),
        reason,
    };
    let mut chars = typestr.chars();
    let order = chars.next().ok_or_else(|| refuse("is empty"))?;
    let kind = chars.next().ok_or_else(|| refuse("has no kind"))?;
    let size: usize = chars
        .as_str()
        .parse()
        .map_err(|_| refuse("has no item size in bytes"))?;
    let dtype = match (kind, size) {
        ('b', 1) => DataType::BOOL,
        ('i', 1) => DataType::I8,
        ('i', 2) => DataType::I16,
        ('i', 4) => DataType::I32,
        ('i', 8) => DataType::I64,
        ('u', 1) => DataType::U8,
        ('u', 2) => DataType::U16,
        ('u', 4) => DataType::U32,
        ('u', 8) => DataType::U64,
        ('f', 2) => DataType::F16,
        ('f', 4) => DataType::F32,
        ('f', 8) => DataType::F64,
        ('c', 8) => DataType::C64,
        ('c', 16) => DataType::C128,
        _ => return Err(refuse("has no DLPack data type")),
    };
    match order {
        '<' => Ok(dtype),
        '|' if size == 1 => Ok(dtype),
        '|' => Err(refuse("has no byte order for a multi-byte type")),
        '>' if size == 1 => Ok(dtype),
        '>' => Err(refuse("is big-endian")),
        _ => Err(refuse("has no byte order (<, > or |)")),
    }
}

/// The `typestr` of `dtype`.
///
/// # Errors
///
/// [`CaiError::Unspellable`] for data types the interface has no string for (bfloat16, the
/// float8 families, sub-byte types, several lanes).
pub fn typestr_of(dtype: DataType) -> Result<&'static str, CaiError> {
    TYPESTRS
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, s)| *s)
        .ok_or(CaiError::Unspellable { dtype })
}

/// Checks the fields of a `__cuda_array_interface__` and describes the tensor they give (the
/// rules of the module docs' table).
///
/// # Errors
///
/// The [`CaiError`] of the first rule broken, checked in the order of the table.
pub fn parse(fields: &CaiFields) -> Result<CaiTensor, CaiError> {
    if !(0..=VERSION).contains(&fields.version) {
        return Err(CaiError::Version {
            found: fields.version,
        });
    }
    let mut shape = Vec::with_capacity(fields.shape.len());
    for (axis, &extent) in fields.shape.iter().enumerate() {
        let extent = usize::try_from(extent).map_err(|_| CaiError::NegativeExtent {
            axis,
            found: extent,
        })?;
        shape.push(extent);
    }
    let dtype = dtype_of_typestr(&fields.typestr)?;
    let itemsize = dtype.element_bytes().unwrap_or(1);
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &e| n.checked_mul(e))
        .ok_or(CaiError::Overflow { what: "shape" })?;
    numel
        .checked_mul(itemsize)
        .filter(|&bytes| bytes <= isize::MAX as usize)
        .ok_or(CaiError::Overflow { what: "shape" })?;
    if fields.data == 0 && numel > 0 {
        return Err(CaiError::NullData { numel });
    }
    if numel > 0 && fields.data % itemsize as u64 != 0 {
        return Err(CaiError::DataAlignment {
            data: fields.data,
            itemsize,
        });
    }
    let strides = match &fields.strides {
        None => None,
        Some(bytes) => Some(element_strides(bytes, &shape, itemsize)?),
    };
    if let Some(descr) = &fields.descr {
        check_descr(descr, &fields.typestr)?;
    }
    if fields.mask {
        return Err(CaiError::Mask);
    }
    let stream = match fields.stream {
        None => None,
        Some(1) => Some(StreamId::LegacyDefault),
        Some(2) => Some(StreamId::PerThreadDefault),
        Some(h) if h > 2 => Some(StreamId::Handle(
            NonZeroU64::new(h as u64).unwrap_or(NonZeroU64::MIN),
        )),
        Some(found) => return Err(CaiError::Stream { found }),
    };
    let (start, byte_len) = if numel == 0 {
        (fields.data, 0)
    } else {
        span(fields.data, &shape, strides.as_deref(), itemsize)?
    };
    Ok(CaiTensor {
        dtype,
        shape,
        strides,
        data: fields.data,
        start,
        byte_len,
        read_only: fields.readonly,
        stream,
    })
}

/// Byte strides as element strides, each checked to be a multiple of `itemsize`.
fn element_strides(
    bytes: &[i64],
    shape: &[usize],
    itemsize: usize,
) -> Result<Vec<isize>, CaiError> {
    if bytes.len() != shape.len() {
        return Err(CaiError::StridesRank {
            found: bytes.len(),
            expected: shape.len(),
        });
    }
    let size = itemsize as i64;
    bytes
        .iter()
        .enumerate()
        .map(|(axis, &stride)| {
            if stride % size != 0 {
                return Err(CaiError::StrideAlignment {
                    axis,
                    stride,
                    itemsize,
                });
            }
            isize::try_from(stride / size).map_err(|_| CaiError::Overflow { what: "strides" })
        })
        .collect()
}

/// The lowest address a non-empty array reaches and the bytes from there to the end of its
/// highest element.
fn span(
    data: u64,
    shape: &[usize],
    strides: Option<&[isize]>,
    itemsize: usize,
) -> Result<(u64, usize), CaiError> {
    let overflow = CaiError::Overflow { what: "strides" };
    let Some(strides) = strides else {
        let bytes = shape.iter().product::<usize>() * itemsize;
        data.checked_add(bytes as u64).ok_or(CaiError::Overflow {
            what: "data pointer",
        })?;
        return Ok((data, bytes));
    };
    // The lowest and highest element offsets, in elements.
    let (mut low, mut high) = (0i128, 0i128);
    for (&extent, &stride) in shape.iter().zip(strides) {
        let reach = (extent as i128 - 1) * stride as i128;
        if reach < 0 {
            low += reach;
        } else {
            high += reach;
        }
    }
    let size = itemsize as i128;
    let below = -low * size;
    let bytes = (high - low + 1) * size;
    if bytes > isize::MAX as i128 {
        return Err(overflow);
    }
    let start = i128::from(data) - below;
    if start < 0 || start + bytes > i128::from(u64::MAX) {
        return Err(CaiError::Overflow {
            what: "data pointer",
        });
    }
    Ok((start as u64, bytes as usize))
}

fn check_descr(descr: &[DescrEntry], typestr: &str) -> Result<(), CaiError> {
    match descr {
        [only] if only.name.is_empty() && !only.has_shape => {
            return if only.typestr == typestr {
                Ok(())
            } else {
                Err(CaiError::DescrTypestr {
                    descr: only.typestr.clone(),
                    typestr: typestr.to_owned(),
                })
            };
        }
        _ => {}
    }
    let found = descr
        .iter()
        .map(|e| {
            format!(
                "({:?}, {:?}{})",
                e.name,
                e.typestr,
                if e.has_shape { ", shape" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(CaiError::Descr {
        found: format!("[{found}]"),
    })
}

/// Checks that every byte `tensor` reaches lies in the allocation of `alloc_len` bytes from
/// `alloc_start` (the range `cuPointerGetAttribute` gives for its `data` pointer:
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`, `CU_POINTER_ATTRIBUTE_RANGE_SIZE`). An empty array
/// reaches no byte and always passes.
///
/// # Errors
///
/// [`CaiError::OutsideAllocation`] when the span `[start, start + byte_len)` is not inside
/// `[alloc_start, alloc_start + alloc_len)`.
pub fn check_within(tensor: &CaiTensor, alloc_start: u64, alloc_len: u64) -> Result<(), CaiError> {
    if tensor.numel() == 0 {
        return Ok(());
    }
    // `parse` checked that `start + byte_len` fits a `u64`.
    let end = tensor.start.saturating_add(tensor.byte_len as u64);
    let alloc_end = alloc_start.saturating_add(alloc_len);
    if tensor.start < alloc_start || end > alloc_end {
        return Err(CaiError::OutsideAllocation {
            start: tensor.start,
            end,
            alloc_start,
            alloc_end,
        });
    }
    Ok(())
}

/// Describes a tensor as the fields of a version 3 `__cuda_array_interface__`: `data` the
/// address of element `(0, ..., 0)`, `shape` in elements, `strides` in elements (signed; `None`
/// for compact row-major), `stream` the one stream that covers all pending work (`None` when
/// nothing is pending).
///
/// # Errors
///
/// [`CaiError::Unspellable`] for a data type without a `typestr`; [`CaiError::Overflow`] for
/// extents or strides whose bytes do not fit an `i64` (not reached by a validated tensor).
pub fn describe(
    dtype: DataType,
    data: u64,
    shape: &[usize],
    strides: Option<&[isize]>,
    readonly: bool,
    stream: Option<StreamId>,
) -> Result<CaiDescription, CaiError> {
    let typestr = typestr_of(dtype)?;
    let itemsize = dtype.element_bytes().unwrap_or(1) as i64;
    let overflow = |what| move |_| CaiError::Overflow { what };
    let extents: Vec<i64> = shape
        .iter()
        .map(|&e| i64::try_from(e).map_err(overflow("shape")))
        .collect::<Result<_, _>>()?;
    let empty = shape.contains(&0);
    let strides = match strides {
        Some(strides) if !empty && !is_row_major(shape, strides) => Some(
            strides
                .iter()
                .map(|&s| {
                    (s as i64)
                        .checked_mul(itemsize)
                        .ok_or(CaiError::Overflow { what: "strides" })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        _ => None,
    };
    Ok(CaiDescription {
        typestr,
        shape: extents,
        strides,
        data: if empty { 0 } else { data },
        readonly,
        stream: stream.map(|s| match s {
            StreamId::LegacyDefault => 1,
            StreamId::PerThreadDefault => 2,
            StreamId::Handle(h) => h.get() as i64,
        }),
    })
}

/// Whether element `strides` are those of compact row-major order, ignoring extent-1 axes.
fn is_row_major(shape: &[usize], strides: &[isize]) -> bool {
    let mut expected: isize = 1;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(extent as isize);
    }
    true
}

#[cfg(test)]
mod tests;
