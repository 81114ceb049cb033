// A storage enum over element types, shared through an `Arc`, with a start offset in elements,
// as candle keeps its tensors; and the consumer's enum of imported buffers, built by dtype.
use std::sync::Arc;

use dlpack_runtime::{
    Device, DlpackExport, DlpackImport, DlpackImportStorage, DlpackStorage, ImportedData,
};

#[derive(DlpackStorage)]
enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    U8 { bytes: Box<[u8]> },
}

#[derive(DlpackExport)]
struct Tensor {
    #[dlpack(data)]
    storage: Arc<Storage>,
    #[dlpack(shape)]
    shape: Vec<usize>,
    #[dlpack(strides)]
    stride: Vec<isize>,
    #[dlpack(offset)]
    start_offset: usize,
    #[dlpack(device)]
    device: Device,
}

#[derive(DlpackImportStorage)]
enum Imported {
    F32(ImportedData<f32>),
    F64(ImportedData<f64>),
}

#[derive(DlpackImport)]
#[dlpack(ndim = 2, device = "cpu")]
struct View {
    #[dlpack(data)]
    data: Imported,
    #[dlpack(shape)]
    shape: [usize; 2],
    #[dlpack(strides)]
    strides: [isize; 2],
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The 2x2 lower-right block of a 3x3 matrix of 0..9: start 4, strides (3, 1).
    let t = Tensor {
        storage: Arc::new(Storage::F64((0..9).map(f64::from).collect())),
        shape: vec![2, 2],
        stride: vec![3, 1],
        start_offset: 4,
        device: Device::CPU,
    };
    let view = View::from_dlpack(t)?;
    assert_eq!(view.shape, [2, 2]);
    assert_eq!(view.strides, [3, 1]);
    match view.data {
        Imported::F64(data) => assert_eq!(data.to_vec()?, [4.0, 5.0, 7.0, 8.0]),
        Imported::F32(_) => unreachable!("the storage holds float64"),
    }

    // Bytes are neither float32 nor float64: refused, naming each variant.
    let t = Tensor {
        storage: Arc::new(Storage::U8 {
            bytes: vec![1, 2, 3, 4].into(),
        }),
        shape: vec![2, 2],
        stride: vec![2, 1],
        start_offset: 0,
        device: Device::CPU,
    };
    let err = View::from_dlpack(t).err().ok_or("u8 data is refused")?;
    assert!(
        err.to_string()
            .starts_with("no variant of `Imported` accepts the tensor")
    );
    Ok(())
}
