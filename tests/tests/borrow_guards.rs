//! Borrows scoped to guards ([`ImportedData::readonly`], [`ImportedData::readwrite`]) and to one
//! call ([`ImportedData::get_scoped`], [`ImportedData::to_vec_scoped`]), beside the imports' own
//! (sticky) borrows.
//!
//! Two imports of one buffer are made as NumPy lends one array to two `__dlpack__` calls
//! ([`SharedBuffer`]); a random sequence of accesses over two or three imports of overlapping
//! and disjoint views of one buffer is checked against a model of what must be granted.

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;

use dlpack_runtime::borrow::Access;
use dlpack_runtime::{
    BorrowError, DataType, ImportBuffer, ImportedData, LayoutError, ManagedTensor,
};
use dlpack_tests::{Counter, READ_ONLY, SharedBuffer};
use proptest::prelude::*;

/// The whole buffer of `n` elements.
fn whole(buffer: &SharedBuffer, n: i64, counter: &Counter) -> ImportedData<f32> {
    buffer.import_f32(&[n], &[1], 0, counter)
}

fn is_conflict<T: std::fmt::Debug>(result: Result<T, LayoutError>) -> bool {
    match result {
        Err(LayoutError::Borrow(BorrowError::Conflict { .. })) => true,
        Err(other) => panic!("expected a borrow conflict, got {other:?}"),
        Ok(_) => false,
    }
}

#[test]
fn a_readonly_guard_borrows_until_it_is_dropped() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = whole(&x, 4, &counter);
    let mut b = whole(&x, 4, &counter);
    {
        let read = a.readonly().unwrap();
        assert!(read.holds_own_borrow());
        assert_eq!(read.as_slice().unwrap(), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(read.get(&[2]).unwrap(), 2.0);
        assert_eq!(
            read.iter().unwrap().collect::<Vec<_>>(),
            [0.0, 1.0, 2.0, 3.0]
        );
        assert_eq!(read.to_vec().unwrap(), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(read.as_array().unwrap().sum(), 6.0);
        assert_eq!(read.layout().unwrap().shape(), [4]);
        // The guard is a borrow: while it lives, the other import cannot write.
        assert!(is_conflict(b.readwrite()));
        assert!(is_conflict(b.as_slice_mut()));
        // Nor is a guard the import's own borrow.
        assert_eq!(a.borrow_held(), None);
        // Shared borrows coexist.
        assert_eq!(b.get_scoped(&[3]).unwrap(), 3.0);
    }
    assert_eq!((a.borrow_held(), b.borrow_held()), (None, None));
    {
        let mut write = b.readwrite().unwrap();
        assert!(write.holds_own_borrow());
        write.as_slice_mut().unwrap()[0] = 10.0;
        write.set(&[1], 11.0).unwrap();
        write.as_array_mut().unwrap()[[2]] = 12.0;
        assert_eq!(write.as_slice().unwrap(), [10.0, 11.0, 12.0, 3.0]);
        assert_eq!(write.get(&[1]).unwrap(), 11.0);
        assert_eq!(write.iter().unwrap().sum::<f32>(), 36.0);
        assert_eq!(write.as_array().unwrap().sum(), 36.0);
        // While the exclusive guard lives, every access of the other import is refused.
        assert!(is_conflict(a.readonly()));
        assert!(is_conflict(a.get_scoped(&[0])));
        assert!(is_conflict(a.to_vec_scoped()));
        assert!(is_conflict(a.get(&[0])));
        assert_eq!(a.borrow_held(), None, "a refused borrow holds nothing");
    }
    assert_eq!(b.borrow_held(), None);
    assert_eq!(
        a.readonly().unwrap().to_vec().unwrap(),
        [10.0, 11.0, 12.0, 3.0]
    );
    assert_eq!((x.read::<f32>(0), x.read::<f32>(8)), (10.0, 12.0));
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

/// `read_then_write(x, x)`: the read's guard is dropped before the write borrows.
#[test]
fn one_buffer_is_read_then_written_through_two_imports() {
    fn read_then_write(
        a: &ImportedData<f32>,
        b: &mut ImportedData<f32>,
    ) -> Result<f32, LayoutError> {
        let sum: f32 = {
            let a = a.readonly()?;
            a.iter()?.sum()
        };
        let mut b = b.readwrite()?;
        b.as_slice_mut()?.fill(sum);
        Ok(sum)
    }
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = whole(&x, 4, &counter);
    let mut b = whole(&x, 4, &counter);
    assert_eq!(read_then_write(&a, &mut b).unwrap(), 6.0);
    assert_eq!(b.to_vec_scoped().unwrap(), [6.0; 4]);
    // With the sticky read, the same function is refused: `a` keeps its borrow.
    assert_eq!(a.to_vec().unwrap(), [6.0; 4]);
    assert!(is_conflict(read_then_write(&a, &mut b)));
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

#[test]
fn guards_inside_a_sticky_borrow_register_nothing() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = whole(&x, 4, &counter);
    let mut b = whole(&x, 4, &counter);
    assert_eq!(a.as_slice().unwrap()[1], 1.0);
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    {
        let read = a.readonly().unwrap();
        assert!(!read.holds_own_borrow());
        assert_eq!(read.get(&[1]).unwrap(), 1.0);
        assert_eq!(a.get_scoped(&[1]).unwrap(), 1.0);
    }
    // The import's own borrow outlives the guard.
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    assert!(is_conflict(b.readwrite()));
    // Held exclusive, the import covers both guards.
    a.release_borrow();
    a.set(&[0], 5.0).unwrap();
    assert_eq!(a.borrow_held(), Some(Access::Exclusive));
    {
        let read = a.readonly().unwrap();
        assert!(!read.holds_own_borrow());
        assert_eq!(read.get(&[0]).unwrap(), 5.0);
    }
    {
        let mut write = a.readwrite().unwrap();
        assert!(!write.holds_own_borrow());
        write.set(&[1], 6.0).unwrap();
    }
    assert_eq!(a.borrow_held(), Some(Access::Exclusive));
    assert!(is_conflict(b.to_vec_scoped()));
    drop(a);
    assert_eq!(b.to_vec_scoped().unwrap(), [5.0, 6.0, 2.0, 3.0]);
    drop(b);
    assert_eq!(counter.get(), 2);
}

#[test]
fn readwrite_gives_back_a_sticky_shared_borrow() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = whole(&x, 4, &counter);
    let b = whole(&x, 4, &counter);
    assert_eq!(a.get(&[0]).unwrap(), 0.0);
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    {
        let mut write = a.readwrite().unwrap();
        assert!(write.holds_own_borrow());
        write.set(&[0], 1.0).unwrap();
        assert!(is_conflict(b.get_scoped(&[0])));
    }
    // The shared borrow was given back, and the guard's is gone with it.
    assert_eq!(a.borrow_held(), None);
    assert_eq!(b.get(&[0]).unwrap(), 1.0);
    // Refused (`b` reads), `a` holds nothing either: its next access borrows again.
    assert_eq!(a.get(&[0]).unwrap(), 1.0);
    assert!(is_conflict(a.readwrite()));
    assert_eq!(a.borrow_held(), None);
    assert_eq!(a.get(&[0]).unwrap(), 1.0);
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

#[test]
fn several_readonly_guards_live_on_several_threads() {
    let threads = 4;
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(8);
    let a = whole(&x, 8, &counter);
    let mut b = whole(&x, 8, &counter);
    let taken = Barrier::new(threads + 1);
    let checked = Barrier::new(threads + 1);
    thread::scope(|s| {
        for t in 0..threads {
            let (a, taken, checked) = (&a, &taken, &checked);
            s.spawn(move || {
                let read = a.readonly();
                taken.wait();
                // Every guard is alive while the writer is refused.
                checked.wait();
                let read = read.unwrap();
                assert!(read.holds_own_borrow());
                assert_eq!(read.get(&[t]).unwrap(), t as f32);
                assert_eq!(read.iter().unwrap().sum::<f32>(), 28.0);
            });
        }
        taken.wait();
        // Checked after the barrier, so that a failure does not leave the readers waiting.
        let refused = is_conflict(b.readwrite());
        let read = b.get_scoped(&[7]);
        checked.wait();
        assert!(refused, "the readers' guards refuse the writer");
        assert_eq!(read.unwrap(), 7.0);
    });
    assert_eq!(a.borrow_held(), None);
    b.readwrite().unwrap().set(&[7], 70.0).unwrap();
    drop((a, b));
    assert_eq!(x.read::<f32>(28), 70.0);
    assert_eq!(counter.get(), 2);
}

#[test]
fn guards_dropped_on_other_threads_end_their_borrows() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = whole(&x, 4, &counter);
    let mut b = whole(&x, 4, &counter);
    thread::scope(|s| {
        let read = a.readonly().unwrap();
        s.spawn(move || drop(read)).join().unwrap();
    });
    {
        let mut write = b.readwrite().unwrap();
        write.set(&[0], 1.0).unwrap();
        thread::scope(|s| {
            s.spawn(move || drop(write)).join().unwrap();
        });
    }
    assert_eq!(a.readwrite().unwrap().get(&[0]).unwrap(), 1.0);
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

#[test]
fn interleaved_views_are_guarded_apart() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(8);
    let evens = x.import_f32(&[4], &[2], 0, &counter);
    let mut odds = x.import_f32(&[4], &[2], 1, &counter);
    let read = evens.readonly().unwrap();
    {
        let mut write = odds.readwrite().unwrap();
        for i in 0..4 {
            let value = read.get(&[i]).unwrap() + 100.0;
            write.set(&[i], value).unwrap();
        }
        // Strided: no slice, and the refusal is the contiguity one, not a borrow.
        assert!(matches!(
            write.as_slice(),
            Err(LayoutError::NotContiguous { .. })
        ));
    }
    assert_eq!(read.to_vec().unwrap(), [0.0, 2.0, 4.0, 6.0]);
    drop(read);
    assert_eq!(odds.to_vec_scoped().unwrap(), [100.0, 102.0, 104.0, 106.0]);
    drop((evens, odds));
    assert_eq!(counter.get(), 2);
}

#[test]
fn read_only_tensors_are_read_through_guards_only() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let read_only = x.view(DataType::F32, &[4], &[1], 0, READ_ONLY, &counter);
    // SAFETY: `view` returns a valid, owned managed tensor.
    let managed = unsafe { ManagedTensor::from_raw_versioned(read_only) }.unwrap();
    let mut a = <ImportedData<f32> as ImportBuffer>::from_managed(managed).unwrap();
    assert!(matches!(a.readwrite(), Err(LayoutError::ReadOnly)));
    assert_eq!(a.readonly().unwrap().get(&[3]).unwrap(), 3.0);
    assert_eq!(a.borrow_held(), None);
    drop(a);
    assert_eq!(counter.get(), 1);
}

#[test]
fn per_call_reads_borrow_for_the_call_only() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = whole(&x, 4, &counter);
    let mut b = whole(&x, 4, &counter);
    assert_eq!(a.get_scoped(&[1]).unwrap(), 1.0);
    assert_eq!(a.to_vec_scoped().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(a.borrow_held(), None);
    b.as_slice_mut().unwrap()[1] = 10.0;
    assert!(is_conflict(a.get_scoped(&[1])));
    assert!(is_conflict(a.to_vec_scoped()));
    // An index out of bounds is refused before any borrow.
    assert!(matches!(
        a.get_scoped(&[4]),
        Err(LayoutError::IndexOutOfBounds { .. })
    ));
    b.release_borrow();
    assert_eq!(a.get_scoped(&[1]).unwrap(), 10.0);
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

#[test]
fn empty_tensors_need_no_guard_borrow() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = x.import_f32(&[0], &[1], 0, &counter);
    let mut b = whole(&x, 4, &counter);
    let mut write = b.readwrite().unwrap();
    assert!(!a.readonly().unwrap().holds_own_borrow());
    assert!(a.readwrite().unwrap().as_slice_mut().unwrap().is_empty());
    write.set(&[0], 1.0).unwrap();
    drop(write);
    drop((a, b));
    assert_eq!(counter.get(), 2);
}

// ---------------------------------------------------------------------------------------------
// A random sequence of accesses against a model.

/// Views of a buffer of 8 float32 elements: (shape, stride, first element).
const VIEWS: [(i64, i64, u64); 7] = [
    (8, 1, 0),  // x
    (4, 1, 0),  // x[:4]
    (4, 1, 4),  // x[4:]
    (4, 2, 0),  // x[::2]
    (4, 2, 1),  // x[1::2]
    (4, 1, 2),  // x[2:6]
    (8, -1, 7), // x[::-1]
];

/// The buffer elements of view `v`, in logical order.
fn elements(v: usize) -> Vec<usize> {
    let (n, stride, first) = VIEWS[v];
    (0..n)
        .map(|i| (first as i64 + i * stride) as usize)
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// `to_vec` (a sticky read), on this thread or another.
    StickyRead(usize, bool),
    /// `set` of the first element (a sticky write).
    StickyWrite(usize),
    Release(usize),
    /// `to_vec_scoped`.
    Scoped(usize),
    /// A readonly guard, held by a thread of its own until dropped.
    Readonly(usize),
    /// Drops the `n`th live readonly guard (modulo their number).
    DropReadonly(usize),
    /// A readwrite guard that writes every element, held by a thread of its own until dropped.
    Readwrite(usize),
    DropReadwrite(usize),
    DropImport(usize),
    Reimport(usize),
}

fn op(imports: usize) -> impl Strategy<Value = Op> {
    let i = 0..imports;
    prop_oneof![
        1 => (i.clone(), any::<bool>()).prop_map(|(i, t)| Op::StickyRead(i, t)),
        1 => i.clone().prop_map(Op::StickyWrite),
        1 => i.clone().prop_map(Op::Release),
        1 => i.clone().prop_map(Op::Scoped),
        3 => i.clone().prop_map(Op::Readonly),
        3 => (0usize..4).prop_map(Op::DropReadonly),
        3 => i.clone().prop_map(Op::Readwrite),
        3 => i.clone().prop_map(Op::DropReadwrite),
        1 => i.clone().prop_map(Op::DropImport),
        1 => i.prop_map(Op::Reimport),
    ]
}

/// Who holds a borrow in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// An import's own borrow.
    Sticky(usize),
    /// A guard's, by a serial number.
    Guard(usize),
}

/// What must be granted: the live borrows, by the buffer elements they reach.
#[derive(Default)]
struct Model {
    borrows: Vec<(Holder, Vec<usize>, Access)>,
    /// The buffer's contents.
    values: Vec<f32>,
}

impl Model {
    fn granted(&self, holder: Holder, elements: &[usize], access: Access) -> bool {
        !self.borrows.iter().any(|(h, e, a)| {
            *h != holder
                && e.iter().any(|x| elements.contains(x))
                && (access == Access::Exclusive || *a == Access::Exclusive)
        })
    }

    /// Borrows as the registry does: an owner's held borrow is kept, or replaced when granted.
    fn acquire(&mut self, holder: Holder, elements: &[usize], access: Access) -> bool {
        if !self.granted(holder, elements, access) {
            return false;
        }
        self.release(holder);
        self.borrows.push((holder, elements.to_vec(), access));
        true
    }

    fn release(&mut self, holder: Holder) {
        self.borrows.retain(|(h, _, _)| *h != holder);
    }

    fn sticky(&self, import: usize) -> Option<Access> {
        self.borrows
            .iter()
            .find(|(h, _, _)| *h == Holder::Sticky(import))
            .map(|(_, _, a)| *a)
    }

    fn read(&self, view: usize) -> Vec<f32> {
        elements(view).iter().map(|&e| self.values[e]).collect()
    }
}

/// A guard held by a thread until told to drop it.
struct Held<R> {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<R>,
    /// The guard's holder in the model, if it registered a borrow of its own.
    holder: Option<Holder>,
}

impl<R> Held<R> {
    fn release(self) -> R {
        drop(self.stop);
        self.thread.join().expect("guard thread")
    }
}

enum Slot {
    Dead,
    Here(Arc<ImportedData<f32>>),
    /// Moved to the thread that holds its readwrite guard.
    Lent(Held<Arc<ImportedData<f32>>>),
}

/// Runs `ops` over imports of `views` of one buffer, checking every result against the model.
fn run(views: &[usize], ops: &[Op]) -> Result<(), TestCaseError> {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(8);
    let created = std::cell::Cell::new(0);
    let new_import = |v: usize| {
        created.set(created.get() + 1);
        let (n, stride, first) = VIEWS[v];
        Arc::new(x.import_f32(&[n], &[stride], first, &counter))
    };
    let mut slots: Vec<Slot> = views.iter().map(|&v| Slot::Here(new_import(v))).collect();
    let mut readonly: Vec<(usize, Held<()>)> = Vec::new();
    let mut model = Model {
        values: (0..8).map(|v| v as f32).collect(),
        ..Model::default()
    };
    let mut serial = 0;
    for (step, op) in ops.iter().enumerate() {
        let value = 100.0 + step as f32;
        match *op {
            Op::StickyRead(i, on_thread) => {
                let Slot::Here(data) = &slots[i] else {
                    continue;
                };
                let result = if on_thread {
                    let data = Arc::clone(data);
                    thread::spawn(move || data.to_vec()).join().unwrap()
                } else {
                    data.to_vec()
                };
                let granted = model.sticky(i).is_some()
                    || model.acquire(Holder::Sticky(i), &elements(views[i]), Access::Shared);
                match result {
                    Ok(read) => {
                        prop_assert!(granted, "step {step}: {op:?} granted");
                        prop_assert_eq!(read, model.read(views[i]));
                    }
                    Err(e) => prop_assert!(!granted && is_conflict::<()>(Err(e)), "step {step}"),
                }
            }
            Op::StickyWrite(i) => {
                // `&mut`: only without guards of the import.
                if readonly.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let Slot::Here(data) = &mut slots[i] else {
                    continue;
                };
                let data = Arc::get_mut(data).expect("no guard of the import is alive");
                let result = data.set(&[0], value);
                let granted = model.sticky(i) == Some(Access::Exclusive)
                    || model.acquire(Holder::Sticky(i), &elements(views[i]), Access::Exclusive);
                prop_assert_eq!(result.is_ok(), granted, "step {}: {:?}", step, op);
                if granted {
                    model.values[elements(views[i])[0]] = value;
                } else {
                    prop_assert!(is_conflict(result));
                }
            }
            Op::Release(i) => {
                if readonly.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let Slot::Here(data) = &mut slots[i] else {
                    continue;
                };
                Arc::get_mut(data).unwrap().release_borrow();
                model.release(Holder::Sticky(i));
            }
            Op::Scoped(i) => {
                let Slot::Here(data) = &slots[i] else {
                    continue;
                };
                let result = data.to_vec_scoped();
                let granted = model.sticky(i).is_some()
                    || model.granted(Holder::Sticky(i), &elements(views[i]), Access::Shared);
                match result {
                    Ok(read) => {
                        prop_assert!(granted, "step {step}: {op:?} granted");
                        prop_assert_eq!(read, model.read(views[i]));
                    }
                    Err(e) => prop_assert!(!granted && is_conflict::<()>(Err(e)), "step {step}"),
                }
            }
            Op::Readonly(i) => {
                let Slot::Here(data) = &slots[i] else {
                    continue;
                };
                let data = Arc::clone(data);
                let (report, reported) = mpsc::channel();
                let (stop, stopped) = mpsc::channel::<()>();
                let thread = thread::spawn(move || match data.readonly() {
                    Ok(guard) => {
                        let read = guard.to_vec().map(|v| (v, guard.holds_own_borrow()));
                        report.send(Some(read)).unwrap();
                        let _ = stopped.recv();
                        drop(guard);
                    }
                    Err(e) => {
                        assert!(is_conflict::<()>(Err(e)));
                        report.send(None).unwrap();
                    }
                });
                let result = reported.recv().unwrap();
                let covered = model.sticky(i).is_some();
                serial += 1;
                let holder = Holder::Guard(serial);
                let granted = covered || model.acquire(holder, &elements(views[i]), Access::Shared);
                match result {
                    Some(read) => {
                        prop_assert!(granted, "step {step}: {op:?} granted");
                        let (read, own) = read.unwrap();
                        prop_assert_eq!(read, model.read(views[i]));
                        prop_assert_eq!(own, !covered);
                        let holder = (!covered).then_some(holder);
                        readonly.push((
                            i,
                            Held {
                                stop,
                                thread,
                                holder,
                            },
                        ));
                    }
                    None => {
                        prop_assert!(!granted, "step {step}: {op:?} refused");
                        thread.join().unwrap();
                    }
                }
            }
            Op::DropReadonly(n) => {
                if readonly.is_empty() {
                    continue;
                }
                let (_, held) = readonly.remove(n % readonly.len());
                if let Some(holder) = held.holder {
                    model.release(holder);
                }
                held.release();
            }
            Op::Readwrite(i) => {
                if readonly.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let Slot::Here(_) = &slots[i] else { continue };
                let Slot::Here(mut data) = std::mem::replace(&mut slots[i], Slot::Dead) else {
                    unreachable!()
                };
                let n = elements(views[i]).len();
                let (report, reported) = mpsc::channel();
                let (stop, stopped) = mpsc::channel::<()>();
                let thread = thread::spawn(move || {
                    let import = Arc::get_mut(&mut data).expect("no guard of the import is alive");
                    match import.readwrite() {
                        Ok(mut guard) => {
                            let own = guard.holds_own_borrow();
                            for k in 0..n {
                                guard.set(&[k], value).unwrap();
                            }
                            report.send(Some(own)).unwrap();
                            let _ = stopped.recv();
                            drop(guard);
                        }
                        Err(e) => {
                            assert!(is_conflict::<()>(Err(e)));
                            report.send(None).unwrap();
                        }
                    }
                    data
                });
                let result = reported.recv().unwrap();
                let covered = model.sticky(i) == Some(Access::Exclusive);
                serial += 1;
                let holder = Holder::Guard(serial);
                if !covered {
                    // A shared borrow of the import's own is given back first.
                    model.release(Holder::Sticky(i));
                }
                let granted =
                    covered || model.acquire(holder, &elements(views[i]), Access::Exclusive);
                match result {
                    Some(own) => {
                        prop_assert!(granted, "step {step}: {op:?} granted");
                        prop_assert_eq!(own, !covered);
                        for e in elements(views[i]) {
                            model.values[e] = value;
                        }
                        let holder = (!covered).then_some(holder);
                        slots[i] = Slot::Lent(Held {
                            stop,
                            thread,
                            holder,
                        });
                    }
                    None => {
                        prop_assert!(!granted, "step {step}: {op:?} refused");
                        slots[i] = Slot::Here(thread.join().unwrap());
                    }
                }
            }
            Op::DropReadwrite(i) => {
                let Slot::Lent(_) = &slots[i] else { continue };
                let Slot::Lent(held) = std::mem::replace(&mut slots[i], Slot::Dead) else {
                    unreachable!()
                };
                if let Some(holder) = held.holder {
                    model.release(holder);
                }
                slots[i] = Slot::Here(held.release());
            }
            Op::DropImport(i) => {
                if readonly.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let Slot::Here(_) = &slots[i] else { continue };
                slots[i] = Slot::Dead;
                model.release(Holder::Sticky(i));
            }
            Op::Reimport(i) => {
                if let Slot::Dead = slots[i] {
                    slots[i] = Slot::Here(new_import(views[i]));
                }
            }
        }
        // Every import's own borrow is the model's.
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::Here(data) = slot {
                prop_assert_eq!(
                    data.borrow_held(),
                    model.sticky(i),
                    "step {}: import {}",
                    step,
                    i
                );
            }
        }
    }
    for (_, held) in readonly.drain(..) {
        held.release();
    }
    for slot in slots.drain(..) {
        if let Slot::Lent(held) = slot {
            drop(held.release());
        }
    }
    // Every borrow ended: the whole buffer can be written, and holds what the model says.
    let mut last = whole(&x, 8, &counter);
    let values = last.readwrite().unwrap().to_vec().unwrap();
    prop_assert_eq!(values, model.values);
    drop(last);
    prop_assert_eq!(counter.get(), created.get() + 1, "every deleter ran once");
    Ok(())
}

fn case() -> impl Strategy<Value = (Vec<usize>, Vec<Op>)> {
    (2usize..=3).prop_flat_map(|imports| {
        (
            prop::collection::vec(0..VIEWS.len(), imports),
            prop::collection::vec(op(imports), 1..40),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(dlpack_tests::proptest_cases(256)))]

    #[test]
    fn guards_and_sticky_borrows_are_granted_as_the_model_says((views, ops) in case()) {
        run(&views, &ops)?;
    }
}
