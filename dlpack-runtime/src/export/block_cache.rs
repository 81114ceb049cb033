//! A per-thread cache of freed export blocks: a thread that exports and drops tensors in turn
//! (a producer's loop, a Python function taking a tensor per call) reuses the same few blocks
//! instead of asking the global allocator for one per export and giving it back at the drop.
//!
//! A block of at most [`MAX_BYTES`] bytes with an alignment of at most [`ALIGN`] bytes (a block
//! of up to 25 axes with an owner of one word, fewer with larger owners, whose owner needs no
//! wider alignment than 16 bytes) belongs to a *class*: it is allocated with its size rounded
//! up to a multiple of [`CLASS_BYTES`] and an alignment of [`ALIGN`]. When such a block is
//! freed, the freeing thread keeps it for its next export of that class, unless it already
//! keeps [`DEPTH`] of them; its kept blocks are given back to the global allocator when the
//! thread exits. Other blocks come from the global allocator and go back to it directly, as do
//! all blocks freed while the thread exits.
//!
//! A thread thus holds at most `DEPTH * (64 + 128 + ... + 512)` bytes, 9 KiB, of blocks, and
//! only after dropping tensors. Freeing on another thread than the exporting one (deleters run
//! on any thread) is fine: a block is plain memory of its class's layout, wherever it is kept.

use core::cell::Cell;
use core::ptr;
use std::alloc::{self, Layout};

/// Size step of the classes, in bytes.
const CLASS_BYTES: usize = 64;
/// Number of classes: blocks of `1..=64`, `65..=128`, ... bytes.
const CLASSES: usize = 8;
/// Largest cached block, in bytes.
const MAX_BYTES: usize = CLASSES * CLASS_BYTES;
/// Alignment of cached blocks, in bytes: what `malloc` gives anyway on 64-bit targets.
const ALIGN: usize = 16;
/// Blocks a thread keeps per class.
pub(crate) const DEPTH: usize = 4;

/// The blocks one thread keeps: per class, a stack of `len` blocks.
struct Cache {
    blocks: [[Cell<*mut u8>; DEPTH]; CLASSES],
    len: [Cell<u8>; CLASSES],
}

impl Cache {
    const fn new() -> Self {
        Self {
            blocks: [const { [const { Cell::new(ptr::null_mut()) }; DEPTH] }; CLASSES],
            len: [const { Cell::new(0) }; CLASSES],
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (class, len) in self.len.iter().enumerate() {
            for block in &self.blocks[class][..usize::from(len.get())] {
                #[cfg(test)]
                tests::freed_at_exit(block.get());
                // SAFETY: a kept block was allocated with its class's layout by the global
                // allocator and is owned by this cache alone.
                unsafe { alloc::dealloc(block.get(), class_layout(class)) };
            }
        }
    }
}

thread_local! {
    static CACHE: Cache = const { Cache::new() };
}

/// The layout of the blocks of `class` (`class < CLASSES`).
#[inline(always)]
fn class_layout(class: usize) -> Layout {
    debug_assert!(class < CLASSES);
    // SAFETY: `ALIGN` is a power of two, and the size a non-zero multiple of it, far below
    // `isize::MAX` (`class < CLASSES`).
    unsafe { Layout::from_size_align_unchecked((class + 1) * CLASS_BYTES, ALIGN) }
}

/// The class of a block of `layout`, `None` for a block that is not cached.
#[inline(always)]
fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size();
    (layout.align() <= ALIGN && size <= MAX_BYTES && size > 0).then(|| (size - 1) / CLASS_BYTES)
}

/// The layout to allocate a block of `layout` with: its class's, or `layout` itself for a block
/// that is not cached. Applied to its own result, it returns it unchanged.
#[inline(always)]
pub(crate) fn allocation_layout(layout: Layout) -> Layout {
    match class_of(layout) {
        Some(class) => class_layout(class),
        None => layout,
    }
}

/// A block of `layout`: one this thread keeps for its class, else a fresh one from the global
/// allocator. NULL when the allocator fails.
///
/// # Safety
///
/// `layout` was returned by [`allocation_layout`], and its size is not zero.
#[inline(always)]
pub(crate) unsafe fn allocate(layout: Layout) -> *mut u8 {
    debug_assert_eq!(
        layout,
        allocation_layout(layout),
        "not an allocation layout"
    );
    if let Some(class) = class_of(layout) {
        let kept = CACHE.try_with(|cache| match cache.len[class].get() {
            0 => ptr::null_mut(),
            len => {
                cache.len[class].set(len - 1);
                cache.blocks[class][usize::from(len - 1)].get()
            }
        });
        // `Err`: the thread is exiting and its cache is gone.
        if let Ok(block) = kept {
            if !block.is_null() {
                return block;
            }
        }
    }
    // SAFETY: a non-zero size (caller).
    unsafe { alloc::alloc(layout) }
}

/// Frees `block`: this thread keeps it if it has room in its class, the global allocator takes
/// it back otherwise.
///
/// # Safety
///
/// `block` was returned by [`allocate`] with `layout`, and nothing uses it afterwards.
#[inline(always)]
pub(crate) unsafe fn free(block: *mut u8, layout: Layout) {
    debug_assert_eq!(
        layout,
        allocation_layout(layout),
        "not an allocation layout"
    );
    if let Some(class) = class_of(layout) {
        let kept = CACHE.try_with(|cache| {
            let len = cache.len[class].get();
            if usize::from(len) == DEPTH {
                return false;
            }
            cache.blocks[class][usize::from(len)].set(block);
            cache.len[class].set(len + 1);
            true
        });
        if kept == Ok(true) {
            return;
        }
    }
    // SAFETY: `block` came from the global allocator with `layout` (caller): either freshly
    // from `allocate`, or kept, which only blocks of `layout`'s class, allocated with its
    // layout, are.
    unsafe { alloc::dealloc(block, layout) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Addresses of the blocks exiting threads' caches gave back, all threads together.
    static FREED_AT_EXIT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

    pub(super) fn freed_at_exit(block: *mut u8) {
        FREED_AT_EXIT
            .lock()
            .expect("not poisoned")
            .push(block.addr());
    }

    /// A block moved to another thread.
    struct Block(*mut u8);
    // SAFETY: a block is plain memory, owned by whoever holds it.
    unsafe impl Send for Block {}

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).expect("a layout")
    }

    #[test]
    fn classes_round_sizes_up_to_multiples_of_64_bytes() {
        for (size, class_size) in [(1, 64), (64, 64), (65, 128), (168, 192), (512, 512)] {
            for align in [1, 8, 16] {
                assert_eq!(
                    allocation_layout(layout(size, align)),
                    layout(class_size, ALIGN),
                    "{size} bytes aligned to {align}"
                );
            }
        }
        // Too large or too aligned: not cached, allocated as asked.
        for (size, align) in [(513, 8), (4096, 16), (64, 32), (128, 64)] {
            let asked = layout(size, align);
            assert_eq!(allocation_layout(asked), asked);
            assert_eq!(class_of(asked), None);
        }
        // A class's layout maps to itself, which `free` relies on.
        for class in 0..CLASSES {
            assert_eq!(allocation_layout(class_layout(class)), class_layout(class));
        }
    }

    #[test]
    fn a_freed_block_is_the_next_one_of_its_class() {
        let class = allocation_layout(layout(168, 8));
        // SAFETY: a class layout; each block is freed once, with it, and not used after.
        unsafe {
            let first = allocate(class);
            assert!(!first.is_null());
            first.write_bytes(0xab, class.size());
            free(first, class);
            let again = allocate(class);
            assert_eq!(again, first, "the kept block is reused");
            // Another class does not take it.
            let other = allocation_layout(layout(300, 8));
            let elsewhere = allocate(other);
            assert_ne!(elsewhere, first);
            free(elsewhere, other);
            free(again, class);
        }
    }

    #[test]
    fn a_thread_keeps_at_most_depth_blocks_per_class() {
        let class = allocation_layout(layout(100, 8));
        // SAFETY: as above.
        unsafe {
            let blocks: Vec<*mut u8> = (0..DEPTH + 3).map(|_| allocate(class)).collect();
            assert!(blocks.iter().all(|b| !b.is_null()));
            for &block in &blocks {
                free(block, class);
            }
            // The first `DEPTH` freed are kept, and handed out last kept first.
            let reused: Vec<*mut u8> = (0..DEPTH).map(|_| allocate(class)).collect();
            let kept: Vec<*mut u8> = blocks[..DEPTH].iter().rev().copied().collect();
            assert_eq!(reused, kept);
            for block in reused {
                free(block, class);
            }
        }
    }

    #[test]
    fn blocks_freed_on_another_thread_are_kept_there_and_freed_when_it_exits() {
        let class = allocation_layout(layout(200, 16));
        // SAFETY: as above.
        let block = Block(unsafe { allocate(class) });
        let address = block.0.addr();
        let reused = std::thread::spawn(move || {
            let block = block;
            // SAFETY: the block moved to this thread; freed once, then reused and freed again.
            unsafe {
                free(block.0, class);
                let again = allocate(class);
                free(again, class);
                again.addr()
            }
        })
        .join()
        .expect("the thread ran");
        assert_eq!(
            reused, address,
            "the freeing thread reused the block it kept"
        );
        assert!(
            FREED_AT_EXIT
                .lock()
                .expect("not poisoned")
                .contains(&address),
            "the exiting thread gave its kept block back"
        );
    }
}
