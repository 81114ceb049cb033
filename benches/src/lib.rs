//! The contenders of the exchange benchmarks (see `BENCHMARKS.md` at the repository root).
//!
//! Every contender does the same Rust-to-Rust work on the same input, a Rust-owned `f32`
//! tensor ([`Tensor`], or [`SharedTensor`] when the buffer is an `Arc<Vec<f32>>`):
//!
//! 1. **export**: move the owner into a `DLManagedTensorVersioned` (DLPack 1.3) whose `shape`
//!    and `strides` are filled in (compact row-major strides, computed by the producer), with a
//!    deleter that drops the owner;
//! 2. **import**: take ownership of that managed tensor, check it is an `f32` CPU tensor of the
//!    expected rank, and copy its shape and strides into the consumer's own fixed-size arrays;
//! 3. **read**: read the first element through the data pointer (`data + byte_offset`);
//! 4. **drop**: drop the consumer, which calls the deleter exactly once.
//!
//! The three contenders are [`ours`] (`#[derive(DlpackExport)]` / `#[derive(DlpackImport)]`),
//! [`dlpark_side`] (dlpark 0.10 used as its documentation and its own producers use it) and
//! [`floor`] (a hand-filled `DLManagedTensorVersioned` read field by field: the least work
//! the exchange can be).
//!
//! [`alloc_count`] holds the counting global allocator used for the allocation table.

use std::sync::Arc;

use dlpack_runtime::{DlpackExport, DlpackImport, ImportedData};

/// A Rust-owned tensor: the producer of every contender (dlpark and the floor take it as
/// their owner, ours exports it through its derive).
#[derive(DlpackExport)]
pub struct Tensor<const N: usize> {
    /// The elements, owned: the export is writable.
    #[dlpack(data)]
    pub values: Vec<f32>,
    /// Extents in elements.
    #[dlpack(shape)]
    pub shape: [usize; N],
}

/// A tensor whose buffer is shared through an `Arc`: the export is read-only, and exporting
/// it costs no allocation of data (the sweeps over element count and `ndim` use it).
#[derive(DlpackExport)]
pub struct SharedTensor<const N: usize> {
    /// The elements, shared.
    #[dlpack(data)]
    pub values: Arc<Vec<f32>>,
    /// Extents in elements.
    #[dlpack(shape)]
    pub shape: [usize; N],
}

impl<const N: usize> Tensor<N> {
    /// A compact tensor of `shape` filled with `1.0`.
    pub fn ones(shape: [usize; N]) -> Self {
        Self {
            values: vec![1.0; shape.iter().product()],
            shape,
        }
    }
}

/// A shape of `N` axes holding `numel` elements: `numel` on the first axis, 1 on the others.
pub fn shape_of<const N: usize>(numel: usize) -> [usize; N] {
    let mut shape = [1; N];
    if N > 0 {
        shape[0] = numel;
    }
    shape
}

/// This crate's exchange: the derives of `dlpack-runtime`.
pub mod ours {
    use super::*;
    use dlpack_runtime::ManagedTensor;

    /// The consumer: any strided `f32` tensor of rank `N`, held in place.
    #[derive(DlpackImport)]
    pub struct View<const N: usize> {
        /// The imported memory; dropping it calls the producer's deleter.
        #[dlpack(data)]
        pub data: ImportedData<f32>,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: [usize; N],
        /// Strides in elements.
        #[dlpack(strides)]
        pub strides: [isize; N],
    }

    /// The README's consumer, whose shape and strides are `Vec`s: two allocations per import
    /// that belong to the consumer's own fields, not to validation (allocation table only).
    #[derive(DlpackImport)]
    pub struct VecView {
        /// The imported memory.
        #[dlpack(data)]
        pub data: ImportedData<f32>,
        /// Extents in elements.
        #[dlpack(shape)]
        pub shape: Vec<usize>,
        /// Strides in elements.
        #[dlpack(strides)]
        pub strides: Vec<isize>,
    }

    /// Export: `DlpackExport::into_dlpack` (versioned, no stream, no copy).
    #[inline]
    pub fn export<P: DlpackExport + Send + 'static>(producer: P) -> ManagedTensor {
        producer.into_dlpack().expect("export")
    }

    /// Import: `DlpackImport::from_managed` (layout validation, dtype check, shape and strides
    /// copied into the arrays).
    pub fn import<const N: usize>(managed: ManagedTensor) -> View<N> {
        View::from_managed(managed).expect("import")
    }

    /// One full layout validation of the tensor's header (`layout::validate`), which a tensor
    /// from FFI or Python gets once; a tensor `into_dlpack` built arrives validated and gets none.
    /// Returns the element count.
    pub fn validate(managed: &ManagedTensor) -> usize {
        use dlpack_runtime::__testing::{self as layout, NullStrides};
        let rule = NullStrides::for_version(managed.version());
        // SAFETY: the header belongs to a live managed tensor whose `shape` and `strides` point
        // to `ndim` entries each, unmodified while `managed` is borrowed.
        unsafe { layout::validate(managed.dl_tensor(), rule, false) }
            .expect("valid")
            .numel()
    }

    /// Reads the first element with the safe typed accessor `ImportedData::get`.
    pub fn read<const N: usize>(view: &View<N>) -> f32 {
        view.data.get(&[0; N]).expect("read")
    }

    /// Import (of what `export` made), read, drop; returns the element read.
    pub fn round_trip<const N: usize>(managed: ManagedTensor) -> f32 {
        let view = import::<N>(managed);
        std::hint::black_box((&view.shape, &view.strides, view.data.as_ptr()));
        read(&view)
    }
}

/// dlpark 0.10: `metadata::Fixed` (shape and strides inline in the managed allocation) with the
/// owner boxed as the `manager_ctx`, as dlpark's own producers (ndarray, candle) do; the consumer
/// validates with `Managed::validate` and reads with `DLTensor::offset_data_ptr`.
pub mod dlpark_side {
    use super::*;
    use dlpark::ffi::{DLDevice, DLDeviceType};
    use dlpark::metadata::{Dynamic, Fixed};
    use dlpark::tensor::compact_strides_array;
    use dlpark::{DlpackElement, DlpackFlags, versioned};

    fn shape_i64<const N: usize>(shape: [usize; N]) -> [i64; N] {
        shape.map(|extent| i64::try_from(extent).expect("extent fits in i64"))
    }

    /// Export of an owned tensor: `Fixed::new(shape, strides).initialize(Box::new(tensor))`, then
    /// data pointer, dtype and device. Two allocations: the managed tensor and the box.
    #[inline]
    pub fn export<const N: usize>(mut tensor: Tensor<N>) -> versioned::Dlpack {
        let data = tensor.values.as_mut_ptr().cast();
        let shape = shape_i64(tensor.shape);
        let strides = compact_strides_array(shape).expect("strides");
        let mut initialized = Fixed::new(shape, strides)
            .initialize(Box::new(tensor))
            .expect("allocation");
        initialized
            .set_data(data)
            .set_dtype(f32::DTYPE)
            .set_device(DLDevice::CPU);
        // SAFETY: `data` points to the boxed tensor's elements, which the box (the manager
        // context) keeps alive until the deleter; shape and strides are explicit and describe
        // exactly those elements; the tensor is owned, so writable (no flags) is accurate.
        unsafe { initialized.finish() }
    }

    /// As [`export`], with `metadata::Dynamic::compact` (runtime rank, strides computed by
    /// dlpark): the other producer path dlpark offers.
    #[inline]
    pub fn export_dynamic<const N: usize>(mut tensor: Tensor<N>) -> versioned::Dlpack {
        let data = tensor.values.as_mut_ptr().cast();
        let shape = shape_i64(tensor.shape);
        let mut initialized = Dynamic::compact(shape)
            .initialize(Box::new(tensor))
            .expect("allocation");
        initialized
            .set_data(data)
            .set_dtype(f32::DTYPE)
            .set_device(DLDevice::CPU);
        // SAFETY: as in `export`.
        unsafe { initialized.finish() }
    }

    /// Export of a shared tensor: the `Arc<Vec<f32>>` itself is the manager context (no box),
    /// flagged read-only. One allocation.
    #[inline]
    pub fn export_shared<const N: usize>(tensor: SharedTensor<N>) -> versioned::Dlpack {
        let data = tensor.values.as_ptr().cast_mut().cast();
        let shape = shape_i64(tensor.shape);
        let strides = compact_strides_array(shape).expect("strides");
        let mut initialized = Fixed::new(shape, strides)
            .initialize(tensor.values)
            .expect("allocation");
        initialized
            .set_data(data)
            .set_dtype(f32::DTYPE)
            .set_device(DLDevice::CPU)
            .set_flags(DlpackFlags::READ_ONLY)
            .expect("flags");
        // SAFETY: `data` points to the shared vector's elements, kept alive by the `Arc` that is
        // the manager context; shape and strides describe them; the export is flagged read-only.
        unsafe { initialized.finish() }
    }

    /// The consumer: the managed tensor and copies of its shape and strides.
    pub struct View<const N: usize> {
        /// The managed tensor; dropping it calls the deleter.
        pub managed: versioned::Dlpack,
        /// Extents in elements.
        pub shape: [usize; N],
        /// Strides in elements.
        pub strides: [isize; N],
    }

    /// Import: `Managed::validate`, dtype, device and rank checks, shape and strides copied.
    pub fn import<const N: usize>(managed: versioned::Dlpack) -> View<N> {
        let (shape, strides) = {
            let tensor = managed.validate().expect("valid tensor");
            assert!(tensor.dtype() == f32::DTYPE, "dtype");
            assert!(tensor.device().device_type == DLDeviceType::CPU, "device");
            assert!(tensor.ndim() == N, "ndim");
            let strides = tensor.strides_or_compact().expect("strides");
            (
                core::array::from_fn(|axis| tensor.shape()[axis] as usize),
                core::array::from_fn(|axis| strides[axis] as isize),
            )
        };
        View {
            managed,
            shape,
            strides,
        }
    }

    /// Reads the first element through `DLTensor::offset_data_ptr` (dtype, NULL, offset and
    /// alignment checks).
    pub fn read<const N: usize>(view: &View<N>) -> f32 {
        // SAFETY: the managed tensor is owned by `view` and was validated by `import`; it was
        // produced by `export*` above, so `data` points to at least one live `f32` (every
        // benchmark tensor has elements).
        unsafe {
            let ptr = view
                .managed
                .tensor()
                .offset_data_ptr::<f32>()
                .expect("data pointer");
            *ptr
        }
    }

    /// Export (by `export`), import, read, drop; returns the element read.
    pub fn round_trip<const N: usize>(managed: versioned::Dlpack) -> f32 {
        let view = import::<N>(managed);
        std::hint::black_box((&view.shape, &view.strides));
        read(&view)
    }
}

/// The floor: a `DLManagedTensorVersioned`, `shape`, `strides` and the owner in one boxed
/// `#[repr(C)]` struct filled by hand, an `extern "C"` deleter that drops the box, and a consumer
/// that checks version, rank, dtype and device and reads the fields directly. No layout
/// validation, no bounds check: the least work an exchange can do.
pub mod floor {
    use core::ffi::c_void;
    use core::ptr::{self, NonNull};

    use dlpack_runtime::ffi::{
        self, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor, kDLCPU,
    };
    use dlpack_runtime::{DataType, Element};

    use super::{SharedTensor, Tensor};

    #[repr(C)]
    struct Block<O, const N: usize> {
        header: DLManagedTensorVersioned,
        shape: [i64; N],
        strides: [i64; N],
        owner: O,
    }

    /// Drops the block.
    ///
    /// # Safety
    ///
    /// `managed` is the header of a `Block<O, N>` made by [`export_raw`], called once.
    unsafe extern "C" fn delete<O, const N: usize>(managed: *mut DLManagedTensorVersioned) {
        // SAFETY: the header is at offset 0 of a block leaked from a `Box` by `export_raw`, and
        // the deleter runs once (caller).
        drop(unsafe { Box::from_raw(managed.cast::<Block<O, N>>()) });
    }

    fn export_raw<O: Send + 'static, const N: usize>(
        owner: O,
        data: *mut c_void,
        shape: [usize; N],
        flags: u64,
    ) -> NonNull<DLManagedTensorVersioned> {
        let mut strides = [0i64; N];
        let mut acc = 1i64;
        for axis in (0..N).rev() {
            strides[axis] = acc;
            acc *= shape[axis].max(1) as i64;
        }
        let block = Box::into_raw(Box::new(Block {
            header: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: ffi::DLPACK_MAJOR_VERSION,
                    minor: ffi::DLPACK_MINOR_VERSION,
                },
                manager_ctx: ptr::null_mut(),
                deleter: Some(delete::<O, N>),
                flags,
                dl_tensor: DLTensor {
                    data,
                    device: DLDevice {
                        device_type: kDLCPU,
                        device_id: 0,
                    },
                    ndim: N as i32,
                    dtype: f32::DTYPE.to_raw(),
                    shape: ptr::null_mut(),
                    strides: ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            shape: shape.map(|extent| extent as i64),
            strides,
            owner,
        }));
        // SAFETY: `block` is a fresh, valid, exclusively owned allocation; the pointers stored
        // point into it and live as long as it.
        unsafe {
            (*block).header.manager_ctx = block.cast();
            (*block).header.dl_tensor.shape = (&raw mut (*block).shape).cast();
            (*block).header.dl_tensor.strides = (&raw mut (*block).strides).cast();
            NonNull::new_unchecked(&raw mut (*block).header)
        }
    }

    /// Export of an owned tensor: one allocation (the box), writable.
    #[inline]
    pub fn export<const N: usize>(mut tensor: Tensor<N>) -> NonNull<DLManagedTensorVersioned> {
        let data = tensor.values.as_mut_ptr().cast();
        let shape = tensor.shape;
        export_raw(tensor.values, data, shape, 0)
    }

    /// Export of a shared tensor: one allocation (the box), read-only.
    #[inline]
    pub fn export_shared<const N: usize>(
        tensor: SharedTensor<N>,
    ) -> NonNull<DLManagedTensorVersioned> {
        let data = tensor.values.as_ptr().cast_mut().cast();
        export_raw(
            tensor.values,
            data,
            tensor.shape,
            ffi::DLPACK_FLAG_BITMASK_READ_ONLY,
        )
    }

    /// The consumer: the raw managed tensor, copies of shape and strides, the first element's
    /// address. Dropping it calls the deleter.
    pub struct View<const N: usize> {
        raw: NonNull<DLManagedTensorVersioned>,
        /// Extents in elements.
        pub shape: [usize; N],
        /// Strides in elements.
        pub strides: [isize; N],
        data: *const f32,
    }

    impl<const N: usize> Drop for View<N> {
        fn drop(&mut self) {
            // SAFETY: `raw` is owned by `self` (taken over by `import`); this is the one call.
            unsafe { call_deleter(self.raw) };
        }
    }

    /// Calls the deleter.
    ///
    /// # Safety
    ///
    /// `raw` is a valid managed tensor whose deleter has not run; it is not used afterwards.
    unsafe fn call_deleter(raw: NonNull<DLManagedTensorVersioned>) {
        // SAFETY: valid until its deleter runs (caller).
        if let Some(deleter) = unsafe { raw.as_ref() }.deleter {
            // SAFETY: called once with the pointer the producer handed out (caller).
            unsafe { deleter(raw.as_ptr()) };
        }
    }

    /// Import: checks major version, rank, dtype and device, copies shape and strides; on a
    /// mismatch the deleter runs and `None` is returned.
    ///
    /// # Safety
    ///
    /// `raw` is a valid `DLManagedTensorVersioned` with `ndim` readable `shape` and `strides`
    /// entries; ownership (the duty to call the deleter) passes to the returned view.
    pub unsafe fn import<const N: usize>(
        raw: NonNull<DLManagedTensorVersioned>,
    ) -> Option<View<N>> {
        // SAFETY: valid (caller).
        let header = unsafe { raw.as_ref() };
        let t = &header.dl_tensor;
        if header.version.major != ffi::DLPACK_MAJOR_VERSION
            || t.ndim != N as i32
            || DataType::from_raw(t.dtype) != f32::DTYPE
            || t.device.device_type != kDLCPU
            || t.strides.is_null()
        {
            // SAFETY: ownership was passed to us (caller); nothing uses `raw` afterwards.
            unsafe { call_deleter(raw) };
            return None;
        }
        // SAFETY: `shape` and `strides` hold `ndim == N` entries (caller, `ndim` checked).
        let (shape, strides) = unsafe {
            (
                core::array::from_fn(|axis| *t.shape.add(axis) as usize),
                core::array::from_fn(|axis| *t.strides.add(axis) as isize),
            )
        };
        let data = t
            .data
            .cast::<u8>()
            .wrapping_add(t.byte_offset as usize)
            .cast::<f32>();
        Some(View {
            raw,
            shape,
            strides,
            data,
        })
    }

    impl<const N: usize> View<N> {
        /// Reads the first element.
        ///
        /// # Safety
        ///
        /// The tensor has at least one element, stored where the producer said.
        pub unsafe fn first(&self) -> f32 {
            // SAFETY: at least one element at `data + byte_offset` (caller), kept alive by the
            // managed tensor `self` owns.
            unsafe { self.data.read() }
        }
    }

    /// Import, read, drop; returns the element read.
    pub fn round_trip<const N: usize>(raw: NonNull<DLManagedTensorVersioned>) -> f32 {
        // SAFETY: `raw` comes from `export*` above: valid, `N` shape and strides entries, owned.
        let view = unsafe { import::<N>(raw) }.expect("import");
        std::hint::black_box((&view.shape, &view.strides));
        // SAFETY: every benchmark tensor has at least one element.
        unsafe { view.first() }
    }
}

/// A counting global allocator: each thread counts its own allocation calls, so counts are
/// exact even while other threads (a test harness) allocate.
pub mod alloc_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Wraps [`System`], counting calls per thread. Install it with `#[global_allocator]`.
    pub struct CountingAllocator;

    /// Allocation calls made by the current thread so far.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Counts {
        /// `alloc` and `alloc_zeroed` calls.
        pub allocs: usize,
        /// `realloc` calls.
        pub reallocs: usize,
        /// `dealloc` calls.
        pub deallocs: usize,
    }

    impl core::ops::Sub for Counts {
        type Output = Counts;
        fn sub(self, rhs: Counts) -> Counts {
            Counts {
                allocs: self.allocs - rhs.allocs,
                reallocs: self.reallocs - rhs.reallocs,
                deallocs: self.deallocs - rhs.deallocs,
            }
        }
    }

    thread_local! {
        static COUNTS: Cell<Counts> = const {
            Cell::new(Counts { allocs: 0, reallocs: 0, deallocs: 0 })
        };
    }

    fn bump(f: impl FnOnce(&mut Counts)) {
        // `try_with`: during thread teardown the slot may be gone; those calls go uncounted.
        let _ = COUNTS.try_with(|cell| {
            let mut counts = cell.get();
            f(&mut counts);
            cell.set(counts);
        });
    }

    /// The current thread's counts.
    pub fn counts() -> Counts {
        COUNTS.try_with(Cell::get).unwrap_or_default()
    }

    // SAFETY: every call is forwarded unchanged to `System`; the counting touches only a
    // const-initialized thread-local `Cell` without destructor, which never allocates.
    unsafe impl GlobalAlloc for CountingAllocator {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            bump(|c| c.allocs += 1);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            bump(|c| c.allocs += 1);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            bump(|c| c.reallocs += 1);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            bump(|c| c.deallocs += 1);
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// Runs `f` and returns what it allocated on this thread.
    pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Counts) {
        let before = counts();
        let r = f();
        (r, counts() - before)
    }
}
