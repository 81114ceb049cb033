//! Borrows of imported memory: two imports of one buffer never hand out aliasing references.
//!
//! The buffer is lent twice as NumPy lends one array to two `__dlpack__` calls
//! ([`SharedBuffer`]): two managed tensors over the same bytes. Each access of an import
//! borrows its bytes in the process's registry; a conflicting access gets
//! [`LayoutError::Borrow`] where it would otherwise make undefined behaviour (run under Miri).

use std::sync::{Arc, Barrier};

use dlpack_runtime::borrow::{Access, BorrowedRange};
use dlpack_runtime::{
    BorrowError, DataType, DlpackExport, DlpackImport, ImportedData, LayoutError, ManagedTensor,
};
use dlpack_tests::{Counter, READ_ONLY, SharedBuffer};

#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// The function of the release-mode miscompile: with `a` and `b` aliasing, an optimizer that
/// trusts `&mut` returns 1.0 while memory holds 2.0.
#[inline(never)]
fn write_both(a: &mut [f32], b: &mut [f32]) -> f32 {
    a[0] = 1.0;
    b[0] = 2.0;
    a[0]
}

fn conflict(err: LayoutError) -> (BorrowedRange, BorrowedRange) {
    match err {
        LayoutError::Borrow(BorrowError::Conflict { requested, held }) => (requested, held),
        other => panic!("expected a borrow conflict, got {other:?}"),
    }
}

#[test]
fn one_buffer_imported_twice_is_never_written_through_two_slices() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = x.import_f32(&[4], &[1], 0, &counter);
    let mut b = x.import_f32(&[4], &[1], 0, &counter);
    let first = a.as_slice_mut().expect("the first exclusive borrow");
    let (requested, held) = conflict(b.as_slice_mut().expect_err("the second"));
    let range = |access| BorrowedRange {
        start: x.address(),
        end: x.address() + 16,
        access,
    };
    assert_eq!(requested, range(Access::Exclusive));
    assert_eq!(held, range(Access::Exclusive));
    first[0] = 5.0;
    // Reads conflict too, and so does every other accessor.
    assert!(matches!(b.as_slice(), Err(LayoutError::Borrow(_))));
    assert!(matches!(b.get(&[3]), Err(LayoutError::Borrow(_))));
    assert!(matches!(b.set(&[3], 1.0), Err(LayoutError::Borrow(_))));
    assert!(matches!(b.to_vec(), Err(LayoutError::Borrow(_))));
    assert!(b.iter().is_err());
    assert!(matches!(b.as_array(), Err(LayoutError::Borrow(_))));
    assert!(matches!(b.as_array_mut(), Err(LayoutError::Borrow(_))));
    assert_eq!(b.borrow_held(), None, "a refused borrow holds nothing");
    assert_eq!(a.borrow_held(), Some(Access::Exclusive));
    drop(a);
    // Once `a` is gone, `b` borrows; with two distinct buffers both slices are fine.
    let y = SharedBuffer::counting_f32(4);
    let mut c = y.import_f32(&[4], &[1], 0, &counter);
    let read = write_both(b.as_slice_mut().unwrap(), c.as_slice_mut().unwrap());
    assert_eq!(read, 1.0);
    assert_eq!((x.read::<f32>(0), y.read::<f32>(0)), (1.0, 2.0));
    drop((b, c));
    assert_eq!(counter.get(), 3, "every deleter ran once");
}

#[test]
fn conflicts_are_decided_by_the_bytes_each_layout_reaches() {
    // (a: shape, strides, first element; b: the same; whether they share a byte), over eight
    // float32 values.
    type Layout = (&'static [i64], &'static [i64], u64);
    let cases: [(Layout, Layout, bool); 10] = [
        ((&[8], &[1], 0), (&[8], &[1], 0), true),   // x, x
        ((&[8], &[1], 0), (&[7], &[1], 1), true),   // x, x[1:]
        ((&[4], &[1], 0), (&[4], &[1], 4), false),  // x[:4], x[4:]
        ((&[4], &[2], 0), (&[4], &[2], 1), false),  // x[::2], x[1::2]
        ((&[8], &[-1], 7), (&[1], &[1], 0), true),  // x[::-1], x[:1]
        ((&[4], &[-2], 7), (&[4], &[2], 0), false), // x[::-2], x[::2]
        ((&[5], &[0], 3), (&[1], &[1], 3), true),   // broadcast of x[3], x[3:4]
        ((&[5], &[0], 3), (&[4], &[1], 4), false),  // broadcast of x[3], x[4:]
        ((&[2, 2], &[4, 1], 0), (&[2, 2], &[4, 1], 2), false), // columns :2 and 2: of 2x4
        ((&[2, 3], &[4, 1], 0), (&[2, 2], &[4, 1], 2), true), // columns :3 and 2:
    ];
    for ((sa, ta, fa), (sb, tb, fb), overlap) in cases {
        let counter = Counter::new();
        let x = SharedBuffer::counting_f32(8);
        let mut a = x.import_f32(sa, ta, fa, &counter);
        let mut b = x.import_f32(sb, tb, fb, &counter);
        let last = |shape: &[i64]| shape.iter().map(|&e| e as usize - 1).collect::<Vec<_>>();
        // Exclusive borrows through the strided writer `set`, then a shared one through `get`.
        a.set(&last(sa), -1.0).expect("the first write");
        let second = b.set(&last(sb), -2.0);
        assert_eq!(
            second.is_err(),
            overlap,
            "{sa:?} {ta:?} {fa} / {sb:?} {tb:?} {fb}"
        );
        assert_eq!(b.get(&last(sb)).is_err(), overlap);
        if !overlap {
            // Both written at once, each where its layout says.
            assert_eq!(a.get(&last(sa)).unwrap(), -1.0);
            assert_eq!(b.get(&last(sb)).unwrap(), -2.0);
        }
        drop((a, b));
        assert_eq!(counter.get(), 2);
    }
}

#[test]
fn shared_borrows_coexist_and_upgrade_only_alone() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(6);
    let mut a = x.import_f32(&[6], &[1], 0, &counter);
    let mut b = x.import_f32(&[2, 3], &[3, 1], 0, &counter);
    assert_eq!(a.as_slice().unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(b.to_vec().unwrap(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    // Upgrading `a` conflicts with `b`'s shared borrow; `a` keeps its shared one.
    let (requested, held) = conflict(a.as_slice_mut().unwrap_err());
    assert_eq!(
        (requested.access, held.access),
        (Access::Exclusive, Access::Shared)
    );
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    assert_eq!(a.get(&[5]).unwrap(), 5.0);
    b.release_borrow();
    assert_eq!(b.borrow_held(), None);
    a.as_slice_mut().unwrap()[5] = 50.0;
    assert_eq!(a.borrow_held(), Some(Access::Exclusive));
    assert!(b.get(&[1, 2]).is_err());
    // `into_managed` gives the borrow back too.
    let managed: ManagedTensor = a.into_managed();
    assert_eq!(b.get(&[1, 2]).unwrap(), 50.0);
    drop((managed, b));
    assert_eq!(counter.get(), 2);
}

#[test]
fn read_only_imports_borrow_shared() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let read_only = x.view(DataType::F32, &[4], &[1], 0, READ_ONLY, &counter);
    // SAFETY: `view` returns a valid, owned managed tensor.
    let managed = unsafe { ManagedTensor::from_raw_versioned(read_only) }.unwrap();
    let a = View::from_managed(managed).unwrap().data;
    let mut b = x.import_f32(&[4], &[1], 0, &counter);
    assert_eq!(a.as_slice().unwrap()[3], 3.0);
    assert_eq!(a.borrow_held(), Some(Access::Shared));
    assert!(matches!(b.as_slice_mut(), Err(LayoutError::Borrow(_))));
    drop(a);
    b.as_slice_mut().unwrap()[3] = 30.0;
    drop(b);
    assert_eq!(x.read::<f32>(12), 30.0);
    assert_eq!(counter.get(), 2);
}

#[test]
fn borrows_end_when_the_import_is_dropped_on_another_thread() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = x.import_f32(&[4], &[1], 0, &counter);
    let mut b = x.import_f32(&[4], &[1], 0, &counter);
    a.as_slice_mut().unwrap()[1] = 10.0;
    std::thread::spawn(move || drop(a)).join().unwrap();
    assert_eq!(b.as_slice_mut().unwrap()[1], 10.0);
    drop(b);
    assert_eq!(counter.get(), 2);
}

#[test]
fn one_of_several_threads_wins_an_exclusive_borrow() {
    let threads = 4;
    let x = SharedBuffer::counting_f32(4);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (x, barrier) = (x.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let counter = Counter::new();
                let mut a = x.import_f32(&[4], &[1], 0, &counter);
                let won = a.as_slice_mut().is_ok();
                // Everyone has tried before anyone lets go.
                barrier.wait();
                drop(a);
                assert_eq!(counter.get(), 1);
                won
            })
        })
        .collect();
    let winners = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|&won| won)
        .count();
    assert_eq!(winners, 1);
}

#[test]
fn empty_tensors_borrow_nothing() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = x.import_f32(&[0], &[1], 0, &counter);
    let mut b = x.import_f32(&[0], &[1], 0, &counter);
    assert!(a.as_slice_mut().unwrap().is_empty());
    assert!(b.as_slice_mut().unwrap().is_empty());
    assert_eq!((a.borrow_held(), b.borrow_held()), (None, None));
    // Nor does an empty import stand in the way of a full one.
    let mut c = x.import_f32(&[4], &[1], 0, &counter);
    c.as_slice_mut().unwrap()[0] = 1.0;
    drop((a, b, c));
    assert_eq!(counter.get(), 3);
}

#[test]
fn unchecked_slices_take_no_borrow() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = x.import_f32(&[4], &[1], 0, &counter);
    let mut b = x.import_f32(&[4], &[1], 0, &counter);
    // SAFETY: nothing writes the buffer while `read` lives.
    let read = unsafe { a.as_slice_unchecked() }.unwrap().to_vec();
    assert_eq!(read, [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(a.borrow_held(), None);
    // So `b` is not refused; the obligation was the caller's.
    b.as_slice_mut().unwrap()[2] = 20.0;
    drop(b);
    let mut a = a;
    // SAFETY: no other import of the buffer is alive.
    unsafe { a.as_slice_mut_unchecked() }.unwrap()[3] = 30.0;
    assert_eq!((x.read::<f32>(8), x.read::<f32>(12)), (20.0, 30.0));
    drop(a);
    assert_eq!(counter.get(), 2);
}

#[derive(DlpackExport)]
struct Owned {
    #[dlpack(data)]
    values: Vec<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

/// A tensor of one's own holding an import, lent on by value.
#[derive(DlpackExport)]
struct Relay {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

#[test]
fn memory_no_other_import_reaches_needs_no_borrow() {
    // An owned vector moved into its export: no other tensor can describe its bytes.
    let owned = Owned {
        values: vec![1.0, 2.0, 3.0],
        shape: [3],
    };
    let view = View::from_dlpack(owned).unwrap();
    assert_eq!(view.shape, [3]);
    let mut a = view.data;
    a.as_slice_mut().unwrap()[0] = 10.0;
    assert_eq!(a.get(&[0]).unwrap(), 10.0);
    assert_eq!(a.borrow_held(), None);
    // Lent on, it stays so.
    let mut relayed = View::from_dlpack(Relay {
        data: a,
        shape: [3],
    })
    .unwrap()
    .data;
    relayed.as_slice_mut().unwrap()[1] = 20.0;
    assert_eq!(relayed.borrow_held(), None);
    assert_eq!(relayed.to_vec().unwrap(), [10.0, 20.0, 3.0]);

    // A relay of memory other imports reach borrows like any import.
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(3);
    let held = x.import_f32(&[3], &[1], 0, &counter);
    assert_eq!(held.get(&[0]).unwrap(), 0.0);
    let lent = x.import_f32(&[3], &[1], 0, &counter);
    let mut relayed = View::from_dlpack(Relay {
        data: lent,
        shape: [3],
    })
    .unwrap()
    .data;
    assert!(matches!(
        relayed.as_slice_mut(),
        Err(LayoutError::Borrow(_))
    ));
    drop(held);
    relayed.as_slice_mut().unwrap()[2] = 7.0;
    assert_eq!(relayed.borrow_held(), Some(Access::Exclusive));
    drop(relayed);
    assert_eq!(x.read::<f32>(8), 7.0);
    assert_eq!(counter.get(), 2);
}

#[test]
fn conflicts_name_both_byte_ranges() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(8);
    let a = x.import_f32(&[4], &[1], 0, &counter);
    let mut b = x.import_f32(&[4], &[1], 2, &counter);
    a.as_slice().unwrap();
    let message = b.as_slice_mut().unwrap_err().to_string();
    let base = x.address();
    let expected = format!(
        "cannot borrow bytes [{:#x}, {:#x}) (16 bytes) of host memory exclusively: another live import of the same memory (an earlier argument of this call, or an import kept elsewhere) holds bytes [{:#x}, {:#x}) (16 bytes) of host memory shared, and an exclusive borrow may overlap no other; pass memory that does not overlap (a copy), take the borrows in turn (drop a readonly() guard before readwrite(), or drop the other import first), or give the other back with release_borrow()",
        base + 8,
        base + 24,
        base,
        base + 16
    );
    assert_eq!(message, expected);
}

#[test]
fn copies_of_a_relay_borrow_its_memory_while_they_read_it() {
    use dlpack_runtime::ExportRequest;

    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut writer = x.import_f32(&[4], &[1], 0, &counter);
    let lent = x.import_f32(&[4], &[1], 0, &counter);
    let mut request = ExportRequest::versioned();
    request.copy = Some(true);
    writer.as_slice_mut().unwrap()[0] = 9.0;
    // The copy would read what `writer`'s slice may be writing: refused.
    let err = Relay {
        data: lent,
        shape: [4],
    }
    .into_dlpack_with(&request)
    .expect_err("a copy over an exclusive borrow");
    assert!(
        err.to_string().contains("cannot borrow"),
        "a borrow error: {err}"
    );
    drop(writer);
    let lent = x.import_f32(&[4], &[1], 0, &counter);
    let copy = Relay {
        data: lent,
        shape: [4],
    }
    .into_dlpack_with(&request)
    .expect("a copy once nothing writes");
    assert!(copy.is_copied());
    let copied = View::from_managed(copy).unwrap();
    assert_eq!(copied.data.to_vec().unwrap(), [9.0, 1.0, 2.0, 3.0]);
    // The copy's borrow ended with it: the buffer can be written again.
    let mut again = x.import_f32(&[4], &[1], 0, &counter);
    again.as_slice_mut().unwrap()[1] = 10.0;
    drop((copied, again));
    assert_eq!(counter.get(), 4);
}

/// A relay kept in an `Arc`: lent on read-only through `&self`.
#[derive(DlpackExport)]
struct SharedRelay {
    #[dlpack(data)]
    data: Arc<ImportedData<f32>>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

#[test]
fn an_import_lent_on_read_only_keeps_a_shared_borrow_only() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let mut a = x.import_f32(&[4], &[1], 0, &counter);
    a.as_slice_mut().unwrap()[0] = 8.0;
    assert_eq!(a.borrow_held(), Some(Access::Exclusive));
    let a = Arc::new(a);
    let reader = x.import_f32(&[4], &[1], 0, &counter);
    assert!(reader.get(&[0]).is_err(), "exclusive before the loan");
    let lent = View::from_dlpack(SharedRelay {
        data: Arc::clone(&a),
        shape: [4],
    })
    .unwrap();
    assert!(lent.data.is_read_only());
    assert_eq!(
        a.borrow_held(),
        Some(Access::Shared),
        "downgraded by the loan"
    );
    assert_eq!(lent.data.get(&[0]).unwrap(), 8.0);
    assert_eq!(reader.get(&[0]).unwrap(), 8.0);
    let mut writer = x.import_f32(&[4], &[1], 0, &counter);
    assert!(writer.as_slice_mut().is_err(), "still shared");
    drop((lent, reader, a));
    writer.as_slice_mut().unwrap()[3] = 1.0;
    drop(writer);
    assert_eq!(counter.get(), 3);
}
