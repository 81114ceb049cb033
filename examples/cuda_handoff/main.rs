//! Quick start, CUDA: a tensor of your own with work still pending on its producer's stream,
//! handed zero-copy to a consumer on another stream. The export returns at once (the host never
//! waits); the consumer's stream waits on an event recorded after the producer's work; the
//! consumer reads the right values. Then the same read without the dependency (`stream=-1`,
//! which asks for none), which the simulator's happens-before checker flags.
//!
//! Run with `./scripts/quickstart.sh`, on any machine: without a CUDA driver the CUDA simulator
//! (crate `cuda-sim`, built by cargo with this example) stands in for it; with one, the same
//! steps run on the GPU (the unordered read is then not checked: only the simulator sees it).

use std::time::Instant;

use cuda_sim_testing::{Checker, Driver, Gate};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use dlpack_runtime::{DlpackExport, DlpackImport, ExportRequest, ImportedData};

const N: usize = 1 << 16;
const VALUE: f32 = 7.0;

/// Your tensor type: device memory written on its own stream (a `CudaSlice` names it).
#[derive(DlpackExport)]
struct GpuTensor {
    #[dlpack(data)]
    data: CudaSlice<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

/// A consumer of float32 CUDA memory.
#[derive(DlpackImport)]
#[dlpack(dtype = f32, device = "cuda")]
struct GpuView {
    #[dlpack(data)]
    data: ImportedData<f32>,
    #[dlpack(shape)]
    shape: [usize; 1],
}

/// A tensor whose write (every element `VALUE`) is pending on `producer` behind a gate.
fn pending_tensor(
    producer: &std::sync::Arc<CudaStream>,
) -> Result<(GpuTensor, Gate), Box<dyn std::error::Error>> {
    let data = producer.alloc_zeros::<f32>(N)?;
    producer.synchronize()?;
    let gate = Gate::hold(producer);
    let (ptr, _record) = cudarc::driver::DevicePtr::device_ptr(&data, producer);
    // SAFETY: `ptr` is the `N` floats of `data`, alive until the tensor is released; the memset
    // is ordered on `producer`, the stream `data` belongs to.
    unsafe { sys::cuMemsetD32Async(ptr, VALUE.to_bits(), N, producer.cu_stream()) }.result()?;
    drop(_record);
    Ok((GpuTensor { data, shape: [N] }, gate))
}

/// Enqueues on `consumer` a copy of the view's memory into `out`: the consumer's read.
fn read_on(
    view: &GpuView,
    out: &CudaSlice<f32>,
    consumer: &CudaStream,
) -> Result<(), Box<dyn std::error::Error>> {
    let src = view.data.cuda_device_ptr()?;
    let (dst, _record) = cudarc::driver::DevicePtr::device_ptr(out, consumer);
    // SAFETY: both are `N` floats of live device memory (the import, and `out`), ordered on
    // `consumer`.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, N * 4, consumer.cu_stream()) }.result()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let driver = cuda_sim_testing::driver();
    match driver {
        Driver::Simulator => println!("CUDA: the simulator (no CUDA driver on this machine)"),
        Driver::Hardware => println!("CUDA: this machine's driver and GPU"),
    }
    let ctx = CudaContext::new(0)?;
    println!("device 0: {}", ctx.name()?);
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let checker = Checker::attach();
    let out = consumer.alloc_zeros::<f32>(N)?;
    consumer.synchronize()?;
    if let Some(checker) = &checker {
        checker.reset();
    }

    // 5. The hand-off: the consumer passes its stream, as `__dlpack__(stream=...)` does.
    let (tensor, gate) = pending_tensor(&producer)?;
    let start = Instant::now();
    let managed = tensor
        .into_dlpack_with(&ExportRequest::versioned().stream(Some(consumer.cu_stream() as i64)))?;
    let returned = start.elapsed();
    let view = GpuView::from_managed(managed)?;
    assert_eq!(view.shape, [N]);
    read_on(&view, &out, &consumer)?;
    println!(
        "\n5. CUDA hand-off: {N} floats written on the producer's stream, still pending (held)"
    );
    println!(
        "   the export to the consumer's stream returned in {} us, while the producer was still held: the host did not wait",
        returned.as_micros()
    );
    println!("   the consumer's stream waits on an event recorded after the producer's write");
    gate.release();
    let host = consumer.clone_dtoh(&out)?;
    let right = host.iter().all(|&v| v == VALUE);
    println!(
        "   the consumer read {:?}.. : every value {VALUE} = {right}",
        &host[..4]
    );
    assert!(right, "the consumer read before the producer's write");
    drop(view);
    match &checker {
        Some(checker) => {
            println!(
                "   happens-before checker: {} violations",
                checker.violations()
            );
            checker.assert_clean("the ordered hand-off");
        }
        None => println!("   (on a GPU: no happens-before checker; the values are the check)"),
    }

    // 6. The same read without the dependency: `stream=-1` asks the producer for none.
    let (tensor, gate) = pending_tensor(&producer)?;
    let view = GpuView::from_managed(
        tensor.into_dlpack_with(&ExportRequest::versioned().stream(Some(-1)))?,
    )?;
    read_on(&view, &out, &consumer)?;
    gate.release();
    consumer.synchronize()?;
    producer.synchronize()?;
    drop(view);
    println!("\n6. the same read with stream=-1 (no dependency asked, none made):");
    match &checker {
        Some(checker) => {
            let found = checker.violations();
            let report = checker.report();
            println!("   happens-before checker: {found} violation(s), flagged:");
            for line in report.lines().take(3) {
                println!("   | {line}");
            }
            assert!(found >= 1, "the checker missed the unordered read");
            checker.reset();
        }
        None => println!(
            "   (on a GPU the unordered read may see old or new values; only the simulator's checker shows it)"
        ),
    }
    Ok(())
}
