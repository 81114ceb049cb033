// Tuple structs: fields are reached as `self.0`, `self.1`, ...
use dlpack_runtime::{Device, DlpackExport, DlpackImport, ImportError, ImportedData};

#[derive(DlpackExport)]
struct Matrix(
    #[dlpack(data)] Vec<f32>,
    #[dlpack(shape)] [usize; 2],
    #[dlpack(byte_offset)] usize,
    #[dlpack(device)] Device,
);

#[derive(DlpackExport)]
struct Flat(#[dlpack(data)] Vec<f32>, #[dlpack(shape)] Vec<usize>);

#[derive(DlpackImport)]
struct View(
    #[dlpack(data)] ImportedData<f32>,
    #[dlpack(shape)] [usize; 2],
    #[dlpack(device)] Device,
    String,
);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m = Matrix(
        vec![-1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        [2, 3],
        4,
        Device::CPU,
    );
    let view = View::from_managed(m.into_dlpack()?)?;
    assert_eq!(view.1, [2, 3]);
    assert_eq!(view.0.get(&[0, 0])?, 1.0);
    assert_eq!(view.0.get(&[1, 2])?, 6.0);
    assert_eq!(view.2, Device::CPU);
    assert_eq!(view.3, "");

    // The fixed-rank shape `[usize; 2]` refuses another rank.
    let flat = Flat(vec![1.0, 2.0], vec![2]);
    assert!(matches!(
        View::from_dlpack(flat),
        Err(ImportError::Ndim {
            found: 1,
            expected: 2
        })
    ));
    Ok(())
}
