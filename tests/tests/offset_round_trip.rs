//! A tensor type that derives both `DlpackExport` and `DlpackImport` round-trips every layout
//! it can describe: its storage is owned memory or an import, and its `offset` (elements) or
//! `byte_offset` (bytes) field means the same both ways, the start of element `(0, ..., 0)`
//! in the `data` field's buffer. An import fills the field with what the re-export of the same
//! `data` needs: negative strides, narrowed starts, transposes, broadcasts (stride 0), 0-d and
//! empty tensors keep their logical values through any number of round trips.

use dlpack_runtime::{
    DataType, DataTypeCode, DlpackExport, DlpackImport, DlpackStorage, ImportBuffer, ImportError,
    ImportedData, LayoutError, ManagedTensor,
};
use dlpack_tests::strided::fixture;
use dlpack_tests::{Counter, Foreign, bytes_of};
use proptest::prelude::*;

/// A tensor library's storage: memory it allocated, or memory it imported.
#[derive(DlpackStorage, Debug)]
enum Storage {
    Owned(Vec<f32>),
    Imported(ImportedData<f32>),
}

/// An import lands in the imported variant.
impl ImportBuffer for Storage {
    const ELEMENT_DTYPE: Option<dlpack_runtime::DataType> = ImportedData::<f32>::ELEMENT_DTYPE;

    fn from_managed(managed: ManagedTensor) -> Result<Self, ImportError> {
        ImportedData::from_managed(managed).map(Storage::Imported)
    }

    fn accepts(managed: &ManagedTensor) -> Result<(), ImportError> {
        ImportedData::<f32>::accepts(managed)
    }
}

impl Storage {
    /// The imported data (a tensor built by import holds nothing else).
    fn imported(&self) -> &ImportedData<f32> {
        match self {
            Storage::Imported(data) => data,
            Storage::Owned(_) => panic!("expected imported storage"),
        }
    }
}

/// The tensor, with its start offset in elements.
#[derive(DlpackExport, DlpackImport, Debug)]
struct Tensor {
    #[dlpack(data)]
    storage: Storage,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(offset)]
    offset: usize,
}

/// The same tensor, with its start offset in bytes.
#[derive(DlpackExport, DlpackImport, Debug)]
struct ByteTensor {
    #[dlpack(data)]
    storage: Storage,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
}

/// A plain consumer, reading what a tensor exports.
#[derive(DlpackImport)]
struct View {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
}

/// What the round trips need of either tensor type.
trait BothWays: DlpackExport + DlpackImport + Send + 'static {
    /// Owned `values`, seen as `shape` and `strides` from element `first` of the buffer.
    fn owned(values: Vec<f32>, shape: &[usize], strides: &[isize], first: usize) -> Self;
    fn storage(&self) -> &Storage;
    fn shape(&self) -> &[usize];
    fn strides(&self) -> &[isize];
    /// The start offset, in elements.
    fn first(&self) -> usize;
}

impl BothWays for Tensor {
    fn owned(values: Vec<f32>, shape: &[usize], strides: &[isize], first: usize) -> Self {
        Tensor {
            storage: Storage::Owned(values),
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset: first,
        }
    }
    fn storage(&self) -> &Storage {
        &self.storage
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn strides(&self) -> &[isize] {
        &self.strides
    }
    fn first(&self) -> usize {
        self.offset
    }
}

impl BothWays for ByteTensor {
    fn owned(values: Vec<f32>, shape: &[usize], strides: &[isize], first: usize) -> Self {
        ByteTensor {
            storage: Storage::Owned(values),
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            byte_offset: first * 4,
        }
    }
    fn storage(&self) -> &Storage {
        &self.storage
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn strides(&self) -> &[isize] {
        &self.strides
    }
    fn first(&self) -> usize {
        assert_eq!(
            self.byte_offset % 4,
            0,
            "a whole number of float32 elements"
        );
        self.byte_offset / 4
    }
}

/// Elements from the lowest element the layout reaches to element `(0, ..., 0)`: where an
/// import's lent buffer puts it.
fn lowest_to_first(shape: &[usize], strides: &[isize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    shape
        .iter()
        .zip(strides)
        .map(|(&extent, &stride)| ((extent as isize - 1) * stride).min(0).unsigned_abs())
        .sum()
}

/// Imports `producer` into `T`, checks the import against the original view (`shape`,
/// `strides`, logical `expected` values) and returns it.
fn import_checked<T: BothWays, P: DlpackExport + Send + 'static>(
    producer: P,
    shape: &[usize],
    strides: &[isize],
    expected: &[f32],
) -> Result<T, TestCaseError> {
    let tensor = T::from_dlpack(producer).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(tensor.shape(), shape);
    prop_assert_eq!(tensor.storage().imported().to_vec().unwrap(), expected);
    let numel: usize = shape.iter().product();
    for (axis, &extent) in shape.iter().enumerate() {
        if extent > 1 && numel > 0 {
            prop_assert_eq!(tensor.strides()[axis], strides[axis]);
        }
    }
    Ok(tensor)
}

/// Owned values seen as the view, exported into `T`, re-exported into `T` again, and read by a
/// plain consumer: the logical values at every step.
fn round_trip<T: BothWays>(
    shape: &[usize],
    strides: &[isize],
    slack: usize,
) -> Result<(), TestCaseError> {
    let (buffer, first, expected) = fixture(shape, strides, slack, |i| i as f32 * 0.5 - 3.0);
    let original = T::owned(buffer, shape, strides, first);
    let once: T = import_checked(original, shape, strides, &expected)?;
    let first_once = once.first();
    let twice: T = import_checked(once, shape, strides, &expected)?;
    let first_twice = twice.first();
    let view = View::from_dlpack(twice).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&view.shape[..], shape);
    prop_assert_eq!(view.data.to_vec().unwrap(), expected);
    // Each import's offset counts from the lowest element its layout reaches.
    let lowest = lowest_to_first(shape, strides);
    prop_assert_eq!((first_once, first_twice), (lowest, lowest));
    Ok(())
}

/// A 3x4 matrix of 0..12, flipped along axis 0 (`flip(0)`): shape (3, 4), strides (-4, 1),
/// element (0, 0) is buffer element 8.
fn flipped<T: BothWays>() -> (T, Vec<f32>) {
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let expected: Vec<f32> = [8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3]
        .map(|v| v as f32)
        .to_vec();
    (T::owned(values, &[3, 4], &[-4, 1], 8), expected)
}

fn flip_round_trips<T: BothWays>() {
    let (tensor, expected) = flipped::<T>();
    let once = T::from_dlpack(tensor).unwrap();
    assert_eq!(once.shape(), [3, 4]);
    assert_eq!(once.strides(), [-4, 1]);
    let data = once.storage().imported();
    assert_eq!(data.to_vec().unwrap(), expected);
    assert_eq!(data.get(&[0, 0]).unwrap(), 8.0);
    assert_eq!(data.get(&[2, 3]).unwrap(), 3.0);
    let (address, start) = (data.as_ptr(), data.start_offset().unwrap());
    let first_once = once.first();

    let twice = T::from_dlpack(once).unwrap();
    assert_eq!(
        (twice.shape(), twice.strides()),
        ([3, 4].as_slice(), [-4, 1].as_slice())
    );
    assert_eq!(
        (first_once, twice.first()),
        (8, 8),
        "element (0, 0) is 8 elements into the bytes each import lends"
    );
    assert_eq!(first_once, start, "the `start_offset` of the imported data");
    let data = twice.storage().imported();
    assert_eq!(data.as_ptr(), address, "re-exported zero-copy");
    assert_eq!(data.to_vec().unwrap(), expected);

    let view = View::from_dlpack(twice).unwrap();
    assert_eq!(
        (view.shape.as_slice(), view.strides.as_slice()),
        ([3, 4].as_slice(), [-4, 1].as_slice())
    );
    assert_eq!(view.data.as_ptr(), address);
    assert_eq!(view.data.to_vec().unwrap(), expected);
}

#[test]
fn a_flipped_view_round_trips_through_a_type_with_an_offset_in_elements() {
    flip_round_trips::<Tensor>();
}

#[test]
fn a_flipped_view_round_trips_through_a_type_with_an_offset_in_bytes() {
    flip_round_trips::<ByteTensor>();
}

#[test]
fn the_offset_of_an_import_counts_from_the_bytes_it_lends() {
    // Rows 1..3 of the flipped matrix, then its transpose: strides (1, -4), element (0, 0) is
    // buffer element 4; the lowest element reached is 0.
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let t = Tensor::owned(values, &[4, 2], &[1, -4], 4);
    let once = Tensor::from_dlpack(t).unwrap();
    assert_eq!(once.offset, 4);
    let bytes = ByteTensor::from_dlpack(once).unwrap();
    assert_eq!(bytes.byte_offset, 16, "the same start, in bytes");
    let back = Tensor::from_dlpack(bytes).unwrap();
    assert_eq!(back.offset, 4);
    assert_eq!(
        back.storage.imported().to_vec().unwrap(),
        [4.0, 0.0, 5.0, 1.0, 6.0, 2.0, 7.0, 3.0]
    );
}

/// Builds a versioned managed tensor from a [`Foreign`] description.
fn foreign(f: Foreign, counter: &Counter) -> ManagedTensor {
    // SAFETY: `versioned` returns a valid, owned managed tensor.
    unsafe { ManagedTensor::from_raw_versioned(f.versioned(counter)) }.unwrap()
}

#[test]
fn a_foreign_offset_that_is_not_folded_into_data_is_counted_from_the_lent_bytes() {
    // The flipped 3x4 matrix as a C producer may describe it: `data` at the buffer's start (or
    // 16 bytes into it), element (0, 0) `byte_offset` bytes further, at buffer element 8.
    let values: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let expected = flipped::<Tensor>().1;
    let counter = Counter::new();
    for (data_offset, byte_offset) in [(0, 32), (16, 16)] {
        let f = Foreign::new(&bytes_of(&values), DataType::F32, &[3, 4])
            .strides(&[-4, 1])
            .data_offset(data_offset)
            .byte_offset(byte_offset);
        let once = Tensor::from_managed(foreign(f, &counter)).unwrap();
        assert_eq!(
            (once.strides.as_slice(), once.offset),
            ([-4, 1].as_slice(), 8)
        );
        let twice = ByteTensor::from_dlpack(once).unwrap();
        assert_eq!(twice.byte_offset, 32);
        assert_eq!(twice.storage.imported().to_vec().unwrap(), expected);
        let view = View::from_dlpack(twice).unwrap();
        assert_eq!(view.data.to_vec().unwrap(), expected);
    }
    assert_eq!(counter.get(), 2, "each producer released once");

    // A positive layout starts where the import's lent bytes start: offset 0, whatever
    // `byte_offset` the producer wrote.
    let f = Foreign::new(&bytes_of(&values), DataType::F32, &[8]).byte_offset(16);
    let once = Tensor::from_managed(foreign(f, &counter)).unwrap();
    assert_eq!(once.offset, 0);
    let twice = Tensor::from_dlpack(once).unwrap();
    assert_eq!(twice.storage.imported().to_vec().unwrap(), &values[4..]);
}

/// A relay of any dtype: the managed tensor itself as storage, its dtype and its start in bytes.
#[derive(DlpackExport, DlpackImport)]
struct AnyRelay {
    #[dlpack(data)]
    data: ManagedTensor,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    strides: Vec<isize>,
    #[dlpack(byte_offset)]
    byte_offset: usize,
    #[dlpack(dtype)]
    dtype: DataType,
}

/// The same, with its start in elements.
#[derive(DlpackImport)]
struct AnyRelayInElements {
    #[dlpack(data)]
    _data: ManagedTensor,
    #[dlpack(shape)]
    _shape: Vec<usize>,
    #[dlpack(strides)]
    _strides: Vec<isize>,
    #[dlpack(offset)]
    _offset: usize,
}

#[test]
fn a_start_inside_packed_sub_byte_elements_round_trips_in_bytes_and_is_refused_in_elements() {
    // Six float4 elements packed two a byte, reversed: element 0 at byte 3, element 5 at bit 4.
    let float4 = DataType::scalar(DataTypeCode::Float4E2M1Fn, 4);
    let bytes = [0x10, 0x32, 0x54, 0x76];
    let counter = Counter::new();
    let reversed = || {
        Foreign::new(&bytes, float4, &[6])
            .strides(&[-1])
            .byte_offset(3)
    };
    let once = AnyRelay::from_managed(foreign(reversed(), &counter)).unwrap();
    assert_eq!((once.dtype, once.byte_offset), (float4, 3));
    let first_bit = |managed: &ManagedTensor| {
        let t = managed.dl_tensor();
        (t.data as usize + t.byte_offset as usize) * 8
    };
    let address = first_bit(&once.data);
    let twice = AnyRelay::from_dlpack(once).unwrap();
    assert_eq!(
        (twice.shape.as_slice(), twice.strides.as_slice()),
        ([6].as_slice(), [-1].as_slice())
    );
    assert_eq!(twice.byte_offset, 3);
    assert_eq!(
        first_bit(&twice.data),
        address,
        "the same element (0), zero-copy"
    );
    let thrice = AnyRelay::from_dlpack(twice).unwrap();
    assert_eq!(first_bit(&thrice.data), address);
    drop(thrice);
    assert_eq!(counter.get(), 1);

    let err = AnyRelayInElements::from_managed(foreign(reversed(), &counter))
        .err()
        .unwrap();
    assert_eq!(
        err,
        ImportError::Layout(LayoutError::SubByteAccess { dtype: float4 })
    );
    assert_eq!(counter.get(), 2, "refused, and the deleter ran once");
}

fn layout() -> impl Strategy<Value = (Vec<usize>, Vec<isize>)> {
    (0usize..=4).prop_flat_map(|ndim| {
        (
            prop::collection::vec(0usize..=4, ndim),
            prop::collection::vec(-7isize..=7, ndim),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(dlpack_tests::proptest_cases(1024)))]

    #[test]
    fn every_view_round_trips_twice_with_an_offset_in_elements(
        (shape, strides) in layout(),
        slack in 0usize..3,
    ) {
        round_trip::<Tensor>(&shape, &strides, slack)?;
    }

    #[test]
    fn every_view_round_trips_twice_with_an_offset_in_bytes(
        (shape, strides) in layout(),
        slack in 0usize..3,
    ) {
        round_trip::<ByteTensor>(&shape, &strides, slack)?;
    }
}
