//! Loads and copies one machine word at a time, for values that the code just before wrote one
//! word at a time: an export's owner, built by the caller moments before it moves into its
//! block, and the `shape` and `strides` arrays an export writes, read back by the import that
//! follows it.
//!
//! A load wider than the store that wrote its bytes (two 8-byte extents read as one 16-byte
//! vector, as the compiler merges adjacent copies) cannot take its value from that store while
//! the store is still in flight: x86-64 processors then wait until the store has reached the
//! cache, on the order of ten cycles per load (a small export's own work is a few dozen).
//! Word-sized loads take the value straight from the matching store. Volatile accesses keep
//! the compiler from merging them back into wider ones.

use core::mem::{MaybeUninit, align_of, size_of};
use core::ptr;

/// `*value`, read with one load of its own size, not merged with the loads of its neighbours.
#[inline(always)]
pub(crate) fn load<T: Copy>(value: &T) -> T {
    // SAFETY: a reference is valid for reads and aligned.
    unsafe { ptr::read_volatile(value) }
}

/// The owners [`move_to`] copies word by word: whole words, word-aligned, at most 16 of them
/// (larger ones, and others, are copied by `memcpy`).
const fn in_words<T>() -> bool {
    size_of::<T>() % size_of::<usize>() == 0
        && align_of::<T>() >= align_of::<usize>()
        && size_of::<T>() <= 16 * size_of::<usize>()
}

/// Moves the value at `src` to `dst`, one word at a time where it is made of whole words.
///
/// # Safety
///
/// As [`ptr::copy_nonoverlapping`] of one `T`: `src` is valid for reads and `dst` for writes of
/// a `T`, both aligned, and they do not overlap. The value is duplicated bitwise: the caller
/// keeps one of the two copies from being used as an owner.
#[inline(always)]
pub(crate) unsafe fn move_to<T>(src: *const T, dst: *mut T) {
    if in_words::<T>() {
        let (src, dst) = (
            src.cast::<MaybeUninit<usize>>(),
            dst.cast::<MaybeUninit<usize>>(),
        );
        for word in 0..size_of::<T>() / size_of::<usize>() {
            // SAFETY: `word` is inside `T` (whole words), and both pointers are word-aligned
            // (`align_of::<T>() >= align_of::<usize>()`) and valid for `T` (caller);
            // `MaybeUninit` takes padding bytes and pointers' provenance as they are.
            unsafe { dst.add(word).write(src.add(word).read_volatile()) };
        }
    } else {
        // SAFETY: as the caller guarantees.
        unsafe { ptr::copy_nonoverlapping(src, dst, 1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn move_to_copies_every_byte() {
        fn check<T: Copy + PartialEq + core::fmt::Debug>(value: T) {
            let mut out = MaybeUninit::<T>::uninit();
            // SAFETY: distinct locals, both valid and aligned for `T`.
            unsafe { move_to(&value, out.as_mut_ptr()) };
            // SAFETY: initialized by the move.
            assert_eq!(unsafe { out.assume_init() }, value);
        }
        check(0x0102_0304_0506_0708_u64);
        check([1usize, 2, 3]);
        check((1u8, 2u16, 3u32));
        check([7u8; 3]);
        // Padding inside whole words, and a 16-byte alignment.
        check((1u64, 2u8));
        check(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10_u128);
        check([9usize; 16]);
        check([9usize; 17]);
        let boxed = Box::new(5u32);
        let mut out = MaybeUninit::<Box<u32>>::uninit();
        // SAFETY: distinct locals; `boxed` is forgotten, so the copy is the one owner.
        unsafe { move_to(&boxed, out.as_mut_ptr()) };
        core::mem::forget(boxed);
        // SAFETY: initialized by the move.
        assert_eq!(*unsafe { out.assume_init() }, 5);
    }

    #[test]
    fn load_reads_the_value() {
        let shape = [2i64, 3, 4];
        assert_eq!(core::array::from_fn::<_, 3, _>(|i| load(&shape[i])), shape);
    }
}
