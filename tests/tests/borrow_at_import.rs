//! Consumers that borrow at import (`#[dlpack(borrow = "shared" | "exclusive")]`): the borrow
//! is taken when the value is built, so a conflicting import is refused by `from_managed`
//! itself, with the typed [`BorrowError`] and a message that says what to do; the borrow lasts
//! until the import is dropped.
//!
//! The buffer is lent twice as NumPy lends one array to two `__dlpack__` calls
//! ([`SharedBuffer`]): two managed tensors over the same bytes.

use dlpack_runtime::borrow::{Access, BorrowedRange};
use dlpack_runtime::{
    BorrowError, DataType, DlpackImport, DlpackImportStorage, ImportError, ImportedData,
    LayoutError, ManagedTensor,
};
use dlpack_tests::{Counter, READ_ONLY, SharedBuffer};

/// A writable view that borrows its memory exclusively at import.
#[derive(DlpackImport)]
#[dlpack(writable, borrow = "exclusive")]
struct ViewMut {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// A view that borrows its memory shared at import.
#[derive(DlpackImport)]
#[dlpack(borrow = "shared")]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// A view that borrows nothing until it is accessed.
#[derive(DlpackImport)]
struct Lazy {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

#[derive(DlpackImportStorage)]
enum Numbers {
    F32(ImportedData<f32>),
    F64(ImportedData<f64>),
}

/// A storage enum's view that borrows exclusively at import.
#[derive(DlpackImport)]
#[dlpack(writable, borrow = "exclusive")]
struct AnyMut {
    #[dlpack(data)]
    data: Numbers,
    #[dlpack(shape)]
    shape: Vec<usize>,
}

/// A float32 tensor over `buffer`: `len` elements of stride `step`, from element `first`.
fn tensor(
    buffer: &SharedBuffer,
    len: i64,
    step: i64,
    first: u64,
    counter: &Counter,
) -> ManagedTensor {
    buffer.managed(DataType::F32, &[len], &[step], 4 * first, counter)
}

fn conflict(err: ImportError) -> (BorrowedRange, BorrowedRange) {
    match err {
        ImportError::Layout(LayoutError::Borrow(BorrowError::Conflict { requested, held })) => {
            (requested, held)
        }
        other => panic!("expected a borrow conflict at import, got {other:?}"),
    }
}

#[test]
fn a_second_exclusive_import_of_the_same_memory_is_refused_at_import() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("first import");
    assert_eq!(a.data.borrow_held(), Some(Access::Exclusive));
    assert_eq!(
        (a.shape.as_slice(), a.strides.as_slice()),
        (&[4][..], &[1][..])
    );

    let err = ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter))
        .err()
        .expect("the second import is refused");
    // The refused import's managed tensor was dropped: its deleter ran once.
    assert_eq!(counter.get(), 1);
    let message = err.to_string();
    let (requested, held) = conflict(err);
    let base = x.address();
    let range = |access| BorrowedRange {
        start: base,
        end: base + 16,
        access,
    };
    assert_eq!(requested, range(Access::Exclusive));
    assert_eq!(held, range(Access::Exclusive));
    assert_eq!(
        message,
        format!(
            "cannot import: cannot borrow bytes [{base:#x}, {:#x}) (16 bytes) of host memory exclusively: another live import of the same memory (an earlier argument of this call, or an import kept elsewhere) holds bytes [{base:#x}, {:#x}) (16 bytes) of host memory exclusively, and an exclusive borrow may overlap no other; pass memory that does not overlap (a copy), take the borrows in turn (drop a readonly() guard before readwrite(), or drop the other import first), or give the other back with release_borrow()",
            base + 16,
            base + 16,
        )
    );

    // The borrow is the import's: it lasts until the import is dropped.
    drop(a);
    let b = ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("after the drop");
    assert_eq!(b.data.borrow_held(), Some(Access::Exclusive));
    drop(b);
    assert_eq!(counter.get(), 3);
}

#[test]
fn shared_imports_coexist_and_refuse_an_exclusive_one() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = View::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("shared");
    let b = View::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("shared beside shared");
    assert_eq!(a.data.borrow_held(), Some(Access::Shared));
    assert_eq!(b.data.to_vec().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(
        (b.shape.as_slice(), b.strides.as_slice()),
        (&[4][..], &[1][..])
    );
    let (requested, held) = conflict(
        ViewMut::from_managed(tensor(&x, 2, 1, 2, &counter))
            .err()
            .expect("exclusive beside shared"),
    );
    assert_eq!(requested.access, Access::Exclusive);
    assert_eq!(held.access, Access::Shared);
    // And the other way round.
    drop((a, b));
    let _w = ViewMut::from_managed(tensor(&x, 2, 1, 2, &counter)).expect("alone");
    let (requested, held) = conflict(
        View::from_managed(tensor(&x, 4, 1, 0, &counter))
            .err()
            .expect("shared beside exclusive"),
    );
    assert_eq!(
        (requested.access, held.access),
        (Access::Shared, Access::Exclusive)
    );
}

#[test]
fn disjoint_views_borrow_at_import_side_by_side() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(8);
    // Interleaved (`x[::2]`, `x[1::2]`) and halves (`x[:4]`, `x[4:]`).
    let mut even = ViewMut::from_managed(tensor(&x, 4, 2, 0, &counter)).expect("x[::2]");
    let mut odd = ViewMut::from_managed(tensor(&x, 4, 2, 1, &counter)).expect("x[1::2]");
    even.data.set(&[0], 10.0).unwrap();
    odd.data.set(&[0], 11.0).unwrap();
    drop((even, odd));
    let mut low = ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("x[:4]");
    let mut high = ViewMut::from_managed(tensor(&x, 4, 1, 4, &counter)).expect("x[4:]");
    low.data.set(&[3], 13.0).unwrap();
    high.data.set(&[0], 14.0).unwrap();
    drop((low, high));
    let values: Vec<f32> = (0..8).map(|i| x.read::<f32>(4 * i)).collect();
    assert_eq!(values, [10.0, 11.0, 2.0, 13.0, 14.0, 5.0, 6.0, 7.0]);
}

#[test]
fn without_the_option_the_conflict_waits_for_the_first_access() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let _a = ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("exclusive");
    let lazy = Lazy::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("no borrow yet");
    assert_eq!(lazy.data.borrow_held(), None);
    assert!(matches!(
        lazy.data.to_vec(),
        Err(LayoutError::Borrow(BorrowError::Conflict { .. }))
    ));
    assert_eq!((lazy.shape.len(), lazy.strides.len()), (1, 1));
}

#[test]
fn storage_enums_borrow_the_variant_they_hold() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let a = AnyMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("first");
    match &a.data {
        Numbers::F32(data) => assert_eq!(data.borrow_held(), Some(Access::Exclusive)),
        Numbers::F64(_) => panic!("the buffer holds float32"),
    }
    assert_eq!(a.shape, [4]);
    conflict(
        AnyMut::from_managed(tensor(&x, 2, 1, 1, &counter))
            .err()
            .expect("overlapping"),
    );
}

#[test]
fn read_only_memory_is_refused_by_writable_before_any_borrow() {
    let counter = Counter::new();
    let x = SharedBuffer::counting_f32(4);
    let p = x.view(DataType::F32, &[4], &[1], 0, READ_ONLY, &counter);
    // SAFETY: `view` returns a valid, owned managed tensor.
    let managed = unsafe { ManagedTensor::from_raw_versioned(p) }.expect("version 1.3");
    let err = ViewMut::from_managed(managed)
        .err()
        .expect("read-only memory");
    assert!(matches!(err, ImportError::ReadOnly), "{err:?}");
    // Nothing was borrowed: an exclusive import of the same bytes succeeds.
    ViewMut::from_managed(tensor(&x, 4, 1, 0, &counter)).expect("exclusive");
}
