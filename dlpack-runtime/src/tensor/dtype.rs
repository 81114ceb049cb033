//! Element types: [`DataType`], [`DataTypeCode`] and the [`Element`] trait.
//!
//! A [`DataType`] is the safe form of `DLDataType` (`dlpack.h`): a type code, a width in
//! bits per lane and a lane count. Codes this crate does not know are kept as
//! [`DataTypeCode::Unknown`], never guessed; refusing them is the consumer's decision.

use core::fmt;

use crate::abi::ffi;

/// The `code` of a `DLDataType` (`dlpack.h`, `DLDataTypeCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataTypeCode {
    /// `kDLInt` (0): signed integer.
    Int,
    /// `kDLUInt` (1): unsigned integer.
    UInt,
    /// `kDLFloat` (2): IEEE floating point.
    Float,
    /// `kDLOpaqueHandle` (3): opaque handle (testing only).
    OpaqueHandle,
    /// `kDLBfloat` (4): bfloat16.
    Bfloat,
    /// `kDLComplex` (5): complex; `bits` is the total width of both parts.
    Complex,
    /// `kDLBool` (6): boolean, 8 bits by convention.
    Bool,
    /// `kDLFloat8_e3m4` (7).
    Float8E3M4,
    /// `kDLFloat8_e4m3` (8).
    Float8E4M3,
    /// `kDLFloat8_e4m3b11fnuz` (9).
    Float8E4M3B11Fnuz,
    /// `kDLFloat8_e4m3fn` (10).
    Float8E4M3Fn,
    /// `kDLFloat8_e4m3fnuz` (11).
    Float8E4M3Fnuz,
    /// `kDLFloat8_e5m2` (12).
    Float8E5M2,
    /// `kDLFloat8_e5m2fnuz` (13).
    Float8E5M2Fnuz,
    /// `kDLFloat8_e8m0fnu` (14).
    Float8E8M0Fnu,
    /// `kDLFloat6_e2m3fn` (15); 6 bits.
    Float6E2M3Fn,
    /// `kDLFloat6_e3m2fn` (16); 6 bits.
    Float6E3M2Fn,
    /// `kDLFloat4_e2m1fn` (17); 4 bits.
    Float4E2M1Fn,
    /// A code this crate does not know, kept as found.
    Unknown(u8),
}

impl DataTypeCode {
    /// Converts the raw `DLDataType::code`. Never fails: unknown codes become
    /// [`DataTypeCode::Unknown`].
    pub const fn from_raw(code: u8) -> Self {
        match code {
            ffi::kDLInt => Self::Int,
            ffi::kDLUInt => Self::UInt,
            ffi::kDLFloat => Self::Float,
            ffi::kDLOpaqueHandle => Self::OpaqueHandle,
            ffi::kDLBfloat => Self::Bfloat,
            ffi::kDLComplex => Self::Complex,
            ffi::kDLBool => Self::Bool,
            ffi::kDLFloat8_e3m4 => Self::Float8E3M4,
            ffi::kDLFloat8_e4m3 => Self::Float8E4M3,
            ffi::kDLFloat8_e4m3b11fnuz => Self::Float8E4M3B11Fnuz,
            ffi::kDLFloat8_e4m3fn => Self::Float8E4M3Fn,
            ffi::kDLFloat8_e4m3fnuz => Self::Float8E4M3Fnuz,
            ffi::kDLFloat8_e5m2 => Self::Float8E5M2,
            ffi::kDLFloat8_e5m2fnuz => Self::Float8E5M2Fnuz,
            ffi::kDLFloat8_e8m0fnu => Self::Float8E8M0Fnu,
            ffi::kDLFloat6_e2m3fn => Self::Float6E2M3Fn,
            ffi::kDLFloat6_e3m2fn => Self::Float6E3M2Fn,
            ffi::kDLFloat4_e2m1fn => Self::Float4E2M1Fn,
            other => Self::Unknown(other),
        }
    }

    /// The raw `DLDataType::code`.
    #[inline]
    pub const fn to_raw(self) -> u8 {
        match self {
            Self::Int => ffi::kDLInt,
            Self::UInt => ffi::kDLUInt,
            Self::Float => ffi::kDLFloat,
            Self::OpaqueHandle => ffi::kDLOpaqueHandle,
            Self::Bfloat => ffi::kDLBfloat,
            Self::Complex => ffi::kDLComplex,
            Self::Bool => ffi::kDLBool,
            Self::Float8E3M4 => ffi::kDLFloat8_e3m4,
            Self::Float8E4M3 => ffi::kDLFloat8_e4m3,
            Self::Float8E4M3B11Fnuz => ffi::kDLFloat8_e4m3b11fnuz,
            Self::Float8E4M3Fn => ffi::kDLFloat8_e4m3fn,
            Self::Float8E4M3Fnuz => ffi::kDLFloat8_e4m3fnuz,
            Self::Float8E5M2 => ffi::kDLFloat8_e5m2,
            Self::Float8E5M2Fnuz => ffi::kDLFloat8_e5m2fnuz,
            Self::Float8E8M0Fnu => ffi::kDLFloat8_e8m0fnu,
            Self::Float6E2M3Fn => ffi::kDLFloat6_e2m3fn,
            Self::Float6E3M2Fn => ffi::kDLFloat6_e3m2fn,
            Self::Float4E2M1Fn => ffi::kDLFloat4_e2m1fn,
            Self::Unknown(code) => code,
        }
    }

    /// The header's name for the code (`"kDLFloat"`), or `None` for an unknown code.
    pub const fn header_name(self) -> Option<&'static str> {
        Some(match self {
            Self::Int => "kDLInt",
            Self::UInt => "kDLUInt",
            Self::Float => "kDLFloat",
            Self::OpaqueHandle => "kDLOpaqueHandle",
            Self::Bfloat => "kDLBfloat",
            Self::Complex => "kDLComplex",
            Self::Bool => "kDLBool",
            Self::Float8E3M4 => "kDLFloat8_e3m4",
            Self::Float8E4M3 => "kDLFloat8_e4m3",
            Self::Float8E4M3B11Fnuz => "kDLFloat8_e4m3b11fnuz",
            Self::Float8E4M3Fn => "kDLFloat8_e4m3fn",
            Self::Float8E4M3Fnuz => "kDLFloat8_e4m3fnuz",
            Self::Float8E5M2 => "kDLFloat8_e5m2",
            Self::Float8E5M2Fnuz => "kDLFloat8_e5m2fnuz",
            Self::Float8E8M0Fnu => "kDLFloat8_e8m0fnu",
            Self::Float6E2M3Fn => "kDLFloat6_e2m3fn",
            Self::Float6E3M2Fn => "kDLFloat6_e3m2fn",
            Self::Float4E2M1Fn => "kDLFloat4_e2m1fn",
            Self::Unknown(_) => return None,
        })
    }
}

/// The element type of a tensor: the safe form of `DLDataType` (`dlpack.h`).
///
/// `bits` is the width of one lane in bits; an element holds `lanes` lanes. For complex types
/// `bits` is the width of the whole number (complex64: 64 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType {
    /// Type code.
    pub code: DataTypeCode,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

impl DataType {
    /// `bool`: code 6, 8 bits, 1 lane.
    pub const BOOL: Self = Self::scalar(DataTypeCode::Bool, 8);
    /// `int8`.
    pub const I8: Self = Self::scalar(DataTypeCode::Int, 8);
    /// `int16`.
    pub const I16: Self = Self::scalar(DataTypeCode::Int, 16);
    /// `int32`.
    pub const I32: Self = Self::scalar(DataTypeCode::Int, 32);
    /// `int64`.
    pub const I64: Self = Self::scalar(DataTypeCode::Int, 64);
    /// `uint8`.
    pub const U8: Self = Self::scalar(DataTypeCode::UInt, 8);
    /// `uint16`.
    pub const U16: Self = Self::scalar(DataTypeCode::UInt, 16);
    /// `uint32`.
    pub const U32: Self = Self::scalar(DataTypeCode::UInt, 32);
    /// `uint64`.
    pub const U64: Self = Self::scalar(DataTypeCode::UInt, 64);
    /// `float16`.
    pub const F16: Self = Self::scalar(DataTypeCode::Float, 16);
    /// `bfloat16`.
    pub const BF16: Self = Self::scalar(DataTypeCode::Bfloat, 16);
    /// `float32`.
    pub const F32: Self = Self::scalar(DataTypeCode::Float, 32);
    /// `float64`.
    pub const F64: Self = Self::scalar(DataTypeCode::Float, 64);
    /// `float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, finite (no infinities; NaN is
    /// `0x7f`/`0xff`), as `float8_e4m3fn` in JAX, PyTorch and ml_dtypes.
    pub const F8E4M3FN: Self = Self::scalar(DataTypeCode::Float8E4M3Fn, 8);
    /// `float8_e5m2`: 5 exponent bits, 2 mantissa bits, with infinities and NaNs (IEEE-style).
    pub const F8E5M2: Self = Self::scalar(DataTypeCode::Float8E5M2, 8);
    /// `complex64` (two `float32`).
    pub const C64: Self = Self::scalar(DataTypeCode::Complex, 64);
    /// `complex128` (two `float64`).
    pub const C128: Self = Self::scalar(DataTypeCode::Complex, 128);

    /// A data type of `lanes` lanes of `bits` bits each.
    pub const fn new(code: DataTypeCode, bits: u8, lanes: u16) -> Self {
        Self { code, bits, lanes }
    }

    /// A one-lane data type.
    pub const fn scalar(code: DataTypeCode, bits: u8) -> Self {
        Self::new(code, bits, 1)
    }

    /// Converts the raw header struct; unknown codes are kept.
    pub const fn from_raw(raw: ffi::DLDataType) -> Self {
        Self::new(DataTypeCode::from_raw(raw.code), raw.bits, raw.lanes)
    }

    /// The raw header struct.
    #[inline]
    pub const fn to_raw(self) -> ffi::DLDataType {
        ffi::DLDataType {
            code: self.code.to_raw(),
            bits: self.bits,
            lanes: self.lanes,
        }
    }

    /// Width of one element (all lanes) in bits.
    pub const fn element_bits(self) -> u32 {
        self.bits as u32 * self.lanes as u32
    }

    /// Width of one element in bytes, or `None` when an element is not a whole number of bytes
    /// (packed sub-byte types such as float4 or float6) or has zero width.
    pub const fn element_bytes(self) -> Option<usize> {
        let bits = self.element_bits();
        if bits == 0 || bits % 8 != 0 {
            None
        } else {
            Some((bits / 8) as usize)
        }
    }
}

impl From<ffi::DLDataType> for DataType {
    fn from(raw: ffi::DLDataType) -> Self {
        Self::from_raw(raw)
    }
}

impl From<DataType> for ffi::DLDataType {
    fn from(dtype: DataType) -> Self {
        dtype.to_raw()
    }
}

impl fmt::Debug for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Formats as NumPy-like names where one exists (`float32`, `bool`, `complex64`), and as
/// `code=N bits=B lanes=L` otherwise.
impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let base = match self.code {
            DataTypeCode::Int => Some("int"),
            DataTypeCode::UInt => Some("uint"),
            DataTypeCode::Float => Some("float"),
            DataTypeCode::Bfloat => Some("bfloat"),
            DataTypeCode::Complex => Some("complex"),
            DataTypeCode::Bool if self.bits == 8 => {
                return if self.lanes == 1 {
                    f.write_str("bool")
                } else {
                    write!(f, "boolx{}", self.lanes)
                };
            }
            _ => None,
        };
        match (base, self.code.header_name()) {
            (Some(base), _) => write!(f, "{base}{}", self.bits)?,
            (None, Some(name)) => write!(f, "{name}({} bits)", self.bits)?,
            (None, None) => {
                return write!(
                    f,
                    "unknown dtype (code={} bits={} lanes={})",
                    self.code.to_raw(),
                    self.bits,
                    self.lanes
                );
            }
        }
        if self.lanes != 1 {
            write!(f, "x{}", self.lanes)?;
        }
        Ok(())
    }
}

/// A Rust type that is one DLPack element: its size, alignment and bit layout match
/// [`Element::DTYPE`].
///
/// Implemented for `bool`, `i8`..`i64`, `u8`..`u64`, `f32` and `f64`; for `half::f16` and
/// `half::bf16` (feature `half`); for `float8::F8E4M3` (float8_e4m3fn) and `float8::F8E5M2`
/// (float8_e5m2) (feature `float8`); for `num_complex::Complex<f32>` (complex64) and
/// `Complex<f64>` (complex128) (feature `num-complex`); and for `[T; N]`, the vector element of
/// `N` lanes (`lanes > 1` is accessible only through such an array type).
///
/// # Safety
///
/// An implementation promises that `size_of::<Self>() * 8 == DTYPE.element_bits()`, that the
/// in-memory representation of `Self` is the one DLPack describes for `DTYPE` (native
/// endianness), that `Self` has no padding bytes, and that every bit pattern for which
/// [`Element::is_valid_bit_pattern`] returns `true` is a valid `Self`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a DLPack element type",
    label = "no DLPack dtype for `{Self}`",
    note = "element types are bool, i8..i64, u8..u64, f32, f64, [T; N] (lanes), half::f16/bf16 (feature `half`), float8::F8E4M3/F8E5M2 (feature `float8`), num_complex::Complex<f32/f64> (feature `num-complex`); implement `dlpack_runtime::Element` for others",
    note = "a generic tensor type (`Tensor<T>`) is a producer or consumer for element types with `T: dlpack_runtime::Element`"
)]
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The DLPack dtype of this element type.
    const DTYPE: DataType;

    /// Whether every bit pattern of `size_of::<Self>()` bytes is a valid `Self`; when `true`,
    /// imports skip the per-element check.
    const ALL_BIT_PATTERNS_VALID: bool = true;

    /// Whether `bytes` (exactly `size_of::<Self>()` of them) hold a valid value of `Self`.
    /// `true` for every type whose bit patterns are all valid (integers, floats); `bool` accepts
    /// only 0 and 1.
    #[inline]
    fn is_valid_bit_pattern(bytes: &[u8]) -> bool {
        let _ = bytes;
        true
    }
}

macro_rules! impl_element {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        // SAFETY: `$t` is a primitive of exactly `DataType::$dtype.bits` bits with no padding,
        // stored in native endianness; every bit pattern is a valid `$t`.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
        }
    )*};
}

impl_element!(
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    f32 => F32, f64 => F64,
);

// SAFETY: `bool` is one byte whose valid values are 0 and 1 (the Rust reference), matching
// DLPack's `kDLBool` with 8 bits; `is_valid_bit_pattern` rejects every other byte.
unsafe impl Element for bool {
    const DTYPE: DataType = DataType::BOOL;
    const ALL_BIT_PATTERNS_VALID: bool = false;

    #[inline]
    fn is_valid_bit_pattern(bytes: &[u8]) -> bool {
        matches!(bytes, [0] | [1])
    }
}

#[cfg(feature = "half")]
impl_element!(half::f16 => F16, half::bf16 => BF16);

#[cfg(feature = "num-complex")]
impl_element!(num_complex::Complex<f32> => C64, num_complex::Complex<f64> => C128);

// `float8::F8E4M3` decodes as the OCP `E4M3FN` format (448 is the largest finite value, `0x7f` is
// NaN), which is DLPack's `kDLFloat8_e4m3fn`; `F8E5M2` is `kDLFloat8_e5m2`. Both are
// `repr(transparent)` over `u8`, and every byte is a value.
#[cfg(feature = "float8")]
impl_element!(float8::F8E4M3 => F8E4M3FN, float8::F8E5M2 => F8E5M2);

// SAFETY: `[T; N]` is `N` consecutive `T` without padding (array layout), which is DLPack's
// vector element of `N` lanes (`dlpack.h`: float4 = code 2, bits 32, lanes 4). `T` is a one-lane
// element (asserted when `DTYPE` is evaluated), so `size_of * 8 == bits * lanes`, and a lane
// pattern is valid exactly when `T` accepts it.
unsafe impl<T: Element, const N: usize> Element for [T; N] {
    const DTYPE: DataType = {
        assert!(
            T::DTYPE.lanes == 1,
            "vector elements are arrays of one-lane elements"
        );
        assert!(
            N >= 1 && N <= u16::MAX as usize,
            "vector elements have 1 to 65535 lanes"
        );
        DataType::new(T::DTYPE.code, T::DTYPE.bits, N as u16)
    };
    const ALL_BIT_PATTERNS_VALID: bool = T::ALL_BIT_PATTERNS_VALID;

    fn is_valid_bit_pattern(bytes: &[u8]) -> bool {
        bytes
            .chunks(core::mem::size_of::<T>())
            .all(T::is_valid_bit_pattern)
    }
}

const _: () = {
    macro_rules! check_size {
        ($($t:ty),*) => {$(
            assert!(core::mem::size_of::<$t>() as u32 * 8 == <$t as Element>::DTYPE.element_bits());
        )*};
    }
    check_size!(
        bool, i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, [f32; 4], [bool; 3]
    );
    #[cfg(feature = "half")]
    check_size!(half::f16, half::bf16);
    #[cfg(feature = "num-complex")]
    check_size!(num_complex::Complex<f32>, num_complex::Complex<f64>);
    #[cfg(feature = "float8")]
    check_size!(float8::F8E4M3, float8::F8E5M2);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_raw() {
        for raw in 0..=u8::MAX {
            let code = DataTypeCode::from_raw(raw);
            assert_eq!(code.to_raw(), raw);
            assert_eq!(code.header_name().is_none(), raw > 17, "code {raw}");
        }
    }

    #[test]
    fn element_dtypes_match_the_header_examples() {
        assert_eq!(
            <i8 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 0,
                bits: 8,
                lanes: 1
            }
        );
        assert_eq!(
            <bool as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 6,
                bits: 8,
                lanes: 1
            }
        );
        assert_eq!(
            <f32 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 2,
                bits: 32,
                lanes: 1
            }
        );
        assert_eq!(
            <u64 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 1,
                bits: 64,
                lanes: 1
            }
        );
    }

    #[test]
    fn element_bytes_refuses_sub_byte_and_zero_width() {
        assert_eq!(DataType::F32.element_bytes(), Some(4));
        assert_eq!(
            DataType::new(DataTypeCode::Float, 32, 4).element_bytes(),
            Some(16)
        );
        assert_eq!(
            DataType::scalar(DataTypeCode::Float4E2M1Fn, 4).element_bytes(),
            None
        );
        assert_eq!(
            DataType::scalar(DataTypeCode::Float6E3M2Fn, 6).element_bytes(),
            None
        );
        assert_eq!(
            DataType::new(DataTypeCode::Float, 32, 0).element_bytes(),
            None
        );
    }

    #[test]
    fn display_names() {
        assert_eq!(DataType::F32.to_string(), "float32");
        assert_eq!(DataType::BOOL.to_string(), "bool");
        assert_eq!(DataType::C64.to_string(), "complex64");
        assert_eq!(
            DataType::new(DataTypeCode::Float, 32, 4).to_string(),
            "float32x4"
        );
        assert_eq!(
            DataType::scalar(DataTypeCode::Float8E4M3Fn, 8).to_string(),
            "kDLFloat8_e4m3fn(8 bits)"
        );
        assert_eq!(
            DataType::scalar(DataTypeCode::Unknown(99), 8).to_string(),
            "unknown dtype (code=99 bits=8 lanes=1)"
        );
    }

    #[test]
    fn vector_elements_are_lanes() {
        assert_eq!(
            <[f32; 4] as Element>::DTYPE,
            DataType::new(DataTypeCode::Float, 32, 4)
        );
        assert!(<[bool; 2] as Element>::is_valid_bit_pattern(&[1, 0]));
        assert!(!<[bool; 2] as Element>::is_valid_bit_pattern(&[1, 7]));
        const { assert!(!<[bool; 2] as Element>::ALL_BIT_PATTERNS_VALID) };
    }

    #[cfg(feature = "float8")]
    #[test]
    fn float8_types() {
        assert_eq!(
            <float8::F8E4M3 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: ffi::kDLFloat8_e4m3fn,
                bits: 8,
                lanes: 1
            }
        );
        assert_eq!(
            <float8::F8E5M2 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: ffi::kDLFloat8_e5m2,
                bits: 8,
                lanes: 1
            }
        );
        // The largest finite float8_e4m3fn is 448 (`0x7e`), and `0x7f` is NaN: E4M3FN.
        assert_eq!(float8::F8E4M3::from_bits(0x7e).to_f32(), 448.0);
        assert!(float8::F8E4M3::from_bits(0x7f).to_f32().is_nan());
        assert_eq!(float8::F8E5M2::from_bits(0x7c).to_f32(), f32::INFINITY);
    }

    #[cfg(feature = "half")]
    #[test]
    fn half_types() {
        assert_eq!(
            <half::f16 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 2,
                bits: 16,
                lanes: 1
            }
        );
        assert_eq!(
            <half::bf16 as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 4,
                bits: 16,
                lanes: 1
            }
        );
    }

    #[cfg(feature = "num-complex")]
    #[test]
    fn complex_types() {
        assert_eq!(
            <num_complex::Complex<f32> as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 5,
                bits: 64,
                lanes: 1
            }
        );
        assert_eq!(
            <num_complex::Complex<f64> as Element>::DTYPE.to_raw(),
            ffi::DLDataType {
                code: 5,
                bits: 128,
                lanes: 1
            }
        );
    }

    #[test]
    fn bool_accepts_only_zero_and_one() {
        assert!(bool::is_valid_bit_pattern(&[0]));
        assert!(bool::is_valid_bit_pattern(&[1]));
        assert!(!bool::is_valid_bit_pattern(&[2]));
        assert!(!bool::is_valid_bit_pattern(&[255]));
        assert!(f32::is_valid_bit_pattern(&[0xff; 4]));
    }
}
