//! Feeds raw managed-tensor fields through the import path: version and flag checks, layout
//! validation, and, for layouts that lie inside the real buffer, typed reads of every element
//! (so AddressSanitizer sees any read outside the span validation reported). Checks that the
//! deleter runs exactly once on every path.
//!
//! Run: `cargo +nightly fuzz run import -- -max_total_time=600` from the repository root.
#![no_main]

use std::sync::atomic::{AtomicUsize, Ordering};

use dlpack_runtime::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use dlpack_runtime::{DataType, ImportBuffer, ImportedData, ManagedTensor};
use libfuzzer_sys::fuzz_target;

static DELETED: AtomicUsize = AtomicUsize::new(0);

#[repr(C)]
struct Block {
    header: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
    buffer: Vec<u64>,
}

unsafe extern "C" fn deleter(p: *mut DLManagedTensorVersioned) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `p` is the header of a boxed `Block` (offset 0), freed once.
    drop(unsafe { Box::from_raw(p.cast::<Block>()) });
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(f, r)| (*f, r));
        self.0 = rest;
        first
    }
    fn i64(&mut self) -> i64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        // Bias toward small values, keep the extremes reachable.
        match b[7] {
            0xff => i64::from_le_bytes(b),
            0xfe => i64::MIN,
            0xfd => i64::MAX,
            _ => i64::from(b[0] as i8 % 9),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let ndim = i32::from(input.byte() as i8 % 8);
    let n = ndim.max(0) as usize;
    let shape: Vec<i64> = (0..n).map(|_| input.i64()).collect();
    let strides: Vec<i64> = (0..n).map(|_| input.i64()).collect();
    let mode = input.byte();
    let byte_offset = u64::from(input.byte()) | if mode & 0x80 != 0 { 1 << 62 } else { 0 };
    let dtype = match input.byte() % 6 {
        0 => DataType::U8.to_raw(),
        1 => DataType::F32.to_raw(),
        2 => DataType::BOOL.to_raw(),
        3 => DataType::I64.to_raw(),
        _ => DLDataType { code: input.byte(), bits: input.byte(), lanes: u16::from(input.byte()) },
    };
    let version = DLPackVersion { major: u32::from(input.byte() % 3), minor: u32::from(input.byte() % 5) };
    let flags = u64::from(input.byte() % 16);
    let buffer = vec![0x0101_0101_0101_0101u64; 32];
    let before = DELETED.load(Ordering::SeqCst);

    let mut block = Box::new(Block {
        header: DLManagedTensorVersioned {
            version,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
            flags,
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device: DLDevice { device_type: 1, device_id: 0 },
                ndim,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset,
            },
        },
        shape,
        strides,
        buffer,
    });
    let t = &mut block.header.dl_tensor;
    t.data = if mode & 1 == 0 { block.buffer.as_mut_ptr().cast::<u8>().wrapping_add(usize::from(mode >> 1 & 63)).cast() } else { std::ptr::null_mut() };
    t.shape = if mode & 2 == 0 { block.shape.as_mut_ptr() } else { std::ptr::null_mut() };
    t.strides = if mode & 4 == 0 { block.strides.as_mut_ptr() } else { std::ptr::null_mut() };
    let base = block.buffer.as_ptr() as isize;
    let len = (block.buffer.len() * 8) as isize;
    let raw = Box::into_raw(block);

    // SAFETY: `raw` is a valid managed tensor whose `shape`/`strides` point to `ndim` entries or
    // are NULL; ownership moves to the import.
    match unsafe { ManagedTensor::from_raw_versioned(raw.cast()) } {
        Err(_) => {}
        Ok(managed) => {
            let inside = managed.layout().ok().filter(|l| {
                let data = l.data() as isize;
                // Broadcasts can describe huge element counts in a tiny span: read those only
                // when the count is small enough to copy quickly.
                l.numel() <= 1 << 16
                    && (l.numel() == 0 || (data + l.span().start >= base && data + l.span().end <= base + len))
            });
            if inside.is_some() {
                let dtype = DataType::from_raw(managed.dl_tensor().dtype);
                if dtype == DataType::F32 {
                    read_all::<f32>(managed);
                } else if dtype == DataType::BOOL {
                    read_all::<bool>(managed);
                } else if dtype == DataType::I64 {
                    read_all::<i64>(managed);
                } else {
                    read_all::<u8>(managed);
                }
            }
        }
    }
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 1, "the deleter must run exactly once");
});

fn read_all<T: dlpack_runtime::Element>(managed: ManagedTensor) {
    if let Ok(data) = ImportedData::<T>::from_managed(managed) {
        let _ = data.to_vec();
        let _ = data.as_slice();
    }
}
