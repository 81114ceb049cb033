//! The registry's lock: taken by one compare-and-swap and given back by one plain store.
//!
//! Every borrow of imported memory takes the registry's lock twice (its acquire and its
//! release), on every thread, so the lock is on the path of each read of a pyfunction
//! argument. `std::sync::Mutex` gives its lock back with an atomic swap (to learn whether a
//! thread sleeps on it): two locked instructions per lock and unlock. Here the unlock is a
//! release store, which x86 performs without a locked instruction, so an uncontended lock and
//! unlock cost one locked instruction instead of two.
//!
//! Nothing sleeps on this lock: a thread that finds it taken spins briefly, then yields its
//! time slice until the holder gives it back. That is right for the registry, whose critical
//! sections are short and call nothing that blocks (they compute, and at most allocate a node
//! or grow a vector); it would be wrong for a lock held across a wait. No lock is ever taken
//! while this one is held, so a holder always finishes and every waiter gets its turn.
//!
//! A panic while the lock is held (none is expected: the registry's code is also called behind
//! `catch_unwind`) gives it back as the guard unwinds; the registry is then used as it is, as
//! `Mutex::lock().unwrap_or_else(PoisonError::into_inner)` did.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// Spins before a waiter starts yielding: about a microsecond, longer than most critical
/// sections of the registry.
const SPINS: u32 = 64;

/// A value behind a lock of one compare-and-swap and one store (see the module docs).
pub(super) struct RegistryLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `RegistryGuard`, and at most one exists at a time
// (`locked`, taken with acquire ordering and given back with release ordering, orders every
// access of one holder before every access of the next); `T: Send` because the value is used
// by whichever thread holds the lock.
unsafe impl<T: Send> Sync for RegistryLock<T> {}

impl<T> RegistryLock<T> {
    pub(super) const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting (spinning, then yielding) while another thread holds it.
    #[inline]
    pub(super) fn lock(&self) -> RegistryGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        RegistryGuard { lock: self }
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            // Wait on a plain load, which keeps the cache line shared, before trying again.
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    core::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

/// The lock, held: the value, given back when dropped.
pub(super) struct RegistryGuard<'a, T> {
    lock: &'a RegistryLock<T>,
}

impl<T> Deref for RegistryGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for RegistryGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this reference the only one of this guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for RegistryGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::RegistryLock;

    /// Increments from several threads, each read-modify-write under the lock, add up: the
    /// lock excludes. (With the lock taken out of `add`, the count comes short under Miri
    /// and usually natively.)
    #[test]
    fn excludes_other_threads() {
        static COUNT: RegistryLock<(u64, u64)> = RegistryLock::new((0, 0));
        fn add() {
            let mut held = COUNT.lock();
            // Two fields written apart: a reader between the two writes would see them differ.
            let (a, b) = *held;
            assert_eq!(a, b);
            held.0 = a + 1;
            std::hint::black_box(&mut *held);
            held.1 = b + 1;
        }
        let per_thread = if cfg!(miri) { 50 } else { 20_000 };
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..per_thread).for_each(|_| add()));
            }
        });
        assert_eq!(*COUNT.lock(), (4 * per_thread, 4 * per_thread));
    }

    /// A panic while the lock is held gives it back.
    #[test]
    fn a_panic_gives_the_lock_back() {
        let lock = RegistryLock::new(1);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = lock.lock();
            panic!("inside");
        }));
        assert!(caught.is_err());
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 2);
    }
}
