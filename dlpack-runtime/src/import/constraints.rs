//! [`ImportConstraints`]: what a consumer requires of a tensor (`#[dlpack(dtype = f32, ...)]`),
//! checked once at import.

use super::ImportError;
use crate::tensor::device::DeviceType;
use crate::tensor::dtype::DataType;
use crate::tensor::layout::{self, Contiguity, TensorLayout, validated_numel};
use crate::tensor::managed::ManagedTensor;

/// What a consumer requires of a tensor, checked once at import, in the spirit of nanobind's
/// `ndarray<float, shape<-1, 3>, c_contig, device::cuda>`.
///
/// `#[derive(DlpackImport)]` builds one from its container options (`dtype = f32`, `ndim = 2`,
/// `shape = [_, 3]`, `contiguous = "C"`, `device = "cpu"`, `writable`); by hand:
///
/// ```
/// use dlpack_runtime::{Contiguity, DataType, DeviceType, ImportConstraints};
///
/// const POINTS: ImportConstraints = ImportConstraints::new()
///     .dtype(DataType::F32)
///     .shape(&[None, Some(3)])
///     .contiguous(Contiguity::C)
///     .device(DeviceType::Cpu);
/// assert_eq!(POINTS.ndim, Some(2));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportConstraints {
    /// Required memory order; `None` accepts any valid strided layout.
    pub contiguous: Option<Contiguity>,
    /// Whether writable memory is required (`DLPACK_FLAG_BITMASK_READ_ONLY` clear, versioned).
    pub writable: bool,
    /// Required `ndim`.
    pub ndim: Option<usize>,
    /// Required dtype.
    pub dtype: Option<DataType>,
    /// Required extents, one entry per axis: `Some(n)` requires extent `n`, `None` accepts any
    /// (`shape = [_, 3]` is `[None, Some(3)]`). Implies `ndim`.
    pub shape: Option<&'static [Option<usize>]>,
    /// Required device type (any ordinal).
    pub device: Option<DeviceType>,
}

impl ImportConstraints {
    /// No constraint beyond a valid layout.
    #[inline]
    pub const fn new() -> Self {
        Self {
            contiguous: None,
            writable: false,
            ndim: None,
            dtype: None,
            shape: None,
            device: None,
        }
    }

    /// Requires compact storage in `order`.
    #[inline]
    pub const fn contiguous(mut self, order: Contiguity) -> Self {
        self.contiguous = Some(order);
        self
    }

    /// Requires writable memory when `writable` is true.
    #[inline]
    pub const fn writable(mut self, writable: bool) -> Self {
        self.writable = writable;
        self
    }

    /// Requires `ndim` axes.
    #[inline]
    pub const fn ndim(mut self, ndim: usize) -> Self {
        self.ndim = Some(ndim);
        self
    }

    /// Requires elements of `dtype`.
    #[inline]
    pub const fn dtype(mut self, dtype: DataType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Requires extents matching `pattern`, one entry per axis (`None`: any extent); sets
    /// `ndim` to the pattern's length.
    #[inline]
    pub const fn shape(mut self, pattern: &'static [Option<usize>]) -> Self {
        self.shape = Some(pattern);
        self.ndim = Some(pattern.len());
        self
    }

    /// Requires memory on a device of type `device_type`, whatever its ordinal.
    #[inline]
    pub const fn device(mut self, device_type: DeviceType) -> Self {
        self.device = Some(device_type);
        self
    }

    /// Validates `managed` and checks the constraints, in this order: layout, dtype, device,
    /// `ndim`, shape, contiguity, writability.
    ///
    /// # Errors
    ///
    /// [`ImportError::Layout`] for an invalid layout or a contiguity mismatch;
    /// [`ImportError::Dtype`], [`ImportError::Device`], [`ImportError::Ndim`],
    /// [`ImportError::Shape`] and [`ImportError::ReadOnly`] for the other constraints.
    // Always inlined: its result is large, and returned through memory it is read back in
    // wider moves than it was written with, which stall. The out-of-line part is `check_slow`.
    #[inline(always)]
    pub fn check<'a>(&self, managed: &'a ManagedTensor) -> Result<TensorLayout<'a>, ImportError> {
        // The common case, inlined into the consumer: a validated tensor (every tensor this
        // crate's exporter built) that meets the constraints, whose layout is rebuilt from the
        // header without checking it again. Everything else takes the out-of-line path.
        if !(managed.is_validated() && self.hold_validated(managed)) {
            self.check_slow(managed)?;
        }
        // SAFETY: validated, by the exporter or before (`is_validated`), or by `check_slow` just
        // now: validation accepted this header, which cannot have changed since (see
        // `ManagedTensor::validated_layout`).
        Ok(unsafe { managed.validated_layout() })
    }

    /// [`check`](Self::check) of a tensor not yet validated (a foreign one, once), or one the
    /// constraints refuse. Gives the verdict only: the caller rebuilds the layout from the
    /// header, so that it is not returned through memory from here.
    #[inline(never)]
    fn check_slow(&self, managed: &ManagedTensor) -> Result<(), ImportError> {
        managed.validate()?;
        if !self.hold_validated(managed) {
            return Err(refused(self, managed));
        }
        Ok(())
    }

    /// Whether the constraints hold, read straight from the header of `managed`, which is
    /// validated.
    #[inline(always)]
    fn hold_validated(&self, managed: &ManagedTensor) -> bool {
        let t = managed.dl_tensor();
        // Validated: `0 <= ndim <= MAX_NDIM`, arrays non-NULL where read.
        let ndim = t.ndim as usize;
        let dtype_ok = self
            .dtype
            .is_none_or(|expected| DataType::from_raw(t.dtype) == expected);
        let device_ok = self
            .device
            .is_none_or(|expected| DeviceType::from_raw(t.device.device_type) == expected);
        if !dtype_ok || !device_ok || self.ndim.is_some_and(|expected| ndim != expected) {
            return false;
        }
        if self.shape.is_some() || self.contiguous.is_some() {
            let shape: &[i64] = if ndim == 0 {
                &[]
            } else {
                // SAFETY: a validated header's `shape` points to `ndim` readable entries,
                // unmodified while `managed` owns the tensor.
                unsafe { core::slice::from_raw_parts(t.shape, ndim) }
            };
            let shape_ok = self.shape.is_none_or(|pattern| {
                ndim == pattern.len()
                    && shape
                        .iter()
                        .zip(pattern)
                        .all(|(&extent, want)| want.is_none_or(|want| extent as usize == want))
            });
            let contiguous_ok = self.contiguous.is_none_or(|order| {
                let strides: Option<&[i64]> = if ndim == 0 || t.strides.is_null() {
                    None
                } else {
                    // SAFETY: as for `shape`.
                    Some(unsafe { core::slice::from_raw_parts(t.strides, ndim) })
                };
                layout::is_contiguous(shape, strides, validated_numel(shape), order)
            });
            if !shape_ok || !contiguous_ok {
                return false;
            }
        }
        !(self.writable && managed.is_read_only())
    }

    /// The constraints, on a validated `layout` of `managed`, with the errors they name.
    fn check_constraints(
        &self,
        managed: &ManagedTensor,
        layout: &TensorLayout<'_>,
    ) -> Result<(), ImportError> {
        if let Some(expected) = self.dtype {
            if layout.dtype() != expected {
                return Err(ImportError::Dtype {
                    found: layout.dtype(),
                    expected,
                });
            }
        }
        if let Some(expected) = self.device {
            if layout.device().device_type != expected {
                return Err(ImportError::Device {
                    found: layout.device(),
                    expected: device_type_name(expected),
                });
            }
        }
        if let Some(expected) = self.ndim {
            if layout.ndim() != expected {
                return Err(ImportError::Ndim {
                    found: layout.ndim(),
                    expected,
                });
            }
        }
        if let Some(pattern) = self.shape {
            let matches = layout.ndim() == pattern.len()
                && layout
                    .shape()
                    .iter()
                    .zip(pattern)
                    .all(|(&extent, want)| want.is_none_or(|want| extent as usize == want));
            if !matches {
                return Err(ImportError::Shape {
                    found: layout.shape().iter().map(|&e| e as usize).collect(),
                    expected: pattern.to_vec(),
                });
            }
        }
        if let Some(order) = self.contiguous {
            layout.require_contiguous(order)?;
        }
        if self.writable && managed.is_read_only() {
            return Err(ImportError::ReadOnly);
        }
        Ok(())
    }
}

/// The error of a validated tensor that `constraints` refuse: the first constraint it fails,
/// named with what was found.
#[cold]
#[inline(never)]
fn refused(constraints: &ImportConstraints, managed: &ManagedTensor) -> ImportError {
    match managed.layout() {
        Err(err) => err.into(),
        Ok(layout) => match constraints.check_constraints(managed, &layout) {
            Err(err) => err,
            Ok(()) => unreachable!("a refused tensor fails a constraint"),
        },
    }
}

/// The name a consumer constraint gives a device type, for [`ImportError::Device`].
fn device_type_name(device_type: DeviceType) -> &'static str {
    device_type.memory_name()
}
