//! The CUDA face of modules and kernel launches: module images and launch parameters read
//! from the driver API's arguments, and the model's kernels (`model::kernel`) called.

use std::ffi::{CStr, c_char, c_uint, c_void};

use cudarc::driver::sys::{CUfunction, CUjit_option, CUlaunchConfig, CUmodule, CUresult, CUstream};

use super::driver::driver;
use crate::face::ffi::{guard, out};
use crate::model::base::{Handle, Res};
use crate::model::kernel;
use crate::model::ptx::{Param, Refusal};
use crate::model::state::Scope;

use CUresult::*;

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

/// Loads a module image at `image` (NUL-terminated PTX text; a cubin or fatbin is refused).
///
/// # Safety
/// `image` is NULL or a module image: at least 4 readable bytes, NUL-terminated if text.
unsafe fn load(call: &str, module: *mut CUmodule, image: *const c_void) -> Res {
    if module.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The first bytes, up to 4 or a NUL: a magic number, or the start of the text.
    let mut head = Vec::with_capacity(4);
    for k in 0..4 {
        // SAFETY: a binary image has its 4-byte magic number, and text is NUL-terminated: byte
        // `k` is readable since no NUL came before it (caller).
        let b = unsafe { image.cast::<u8>().add(k).read() };
        if b == 0 {
            break;
        }
        head.push(b);
    }
    kernel::check_image(call, &head)?;
    // SAFETY: not a binary image, so NUL-terminated text (caller).
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) };
    let text = text
        .to_str()
        .map_err(|_| kernel::refuse(call, Refusal::Invalid("the text is not UTF-8".into())))?;
    load_text(call, module, text)
}

fn load_text(call: &str, module: *mut CUmodule, text: &str) -> Res {
    let handle = kernel::load_module(Scope::Current, call, text)?;
    // SAFETY: an out-pointer, checked not NULL by the caller.
    unsafe { out(module, handle as CUmodule) }
}

/// The values of a kernel's pointer-sized parameters, from `kernelParams` (one pointer per
/// parameter) or from `extra` (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`,
/// `CU_LAUNCH_PARAM_END`: the parameters packed at their aligned offsets).
///
/// # Safety
/// As `cuLaunchKernel`'s contract: `params` has one valid pointer per parameter of the
/// kernel, or `extra` is a valid list whose buffer holds them all.
unsafe fn pointer_values(
    params: &[Param],
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res<Vec<(usize, u64)>> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    let mut values = Vec::new();
    if !kernel_params.is_null() {
        if !extra.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (k, p) in params.iter().enumerate() {
            // SAFETY: one pointer per parameter (caller).
            let arg = unsafe { *kernel_params.add(k) };
            if arg.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            if p.pointer {
                // SAFETY: the parameter's value, 8 bytes (caller); possibly unaligned.
                values.push((k, unsafe { arg.cast::<u64>().read_unaligned() }));
            }
        }
        return Ok(values);
    }
    if extra.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), None);
    let mut k = 0;
    loop {
        // SAFETY: a list of (key, value) pointers ended by `CU_LAUNCH_PARAM_END` (caller).
        let key = unsafe { *extra.add(k) } as usize;
        match key {
            0 => break,
            // SAFETY: the key's value follows it (caller).
            1 => buffer = unsafe { *extra.add(k + 1) }.cast::<u8>(),
            // SAFETY: the key's value, a pointer to the buffer's size (caller).
            2 => size = Some(unsafe { *(*extra.add(k + 1)).cast::<usize>() }),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        k += 2;
    }
    let size = size.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if buffer.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut offset = 0usize;
    for (k, p) in params.iter().enumerate() {
        offset = offset.next_multiple_of(p.align.max(1));
        if offset + p.size > size {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if p.pointer {
            // SAFETY: in the buffer, `size` bytes (caller), checked above.
            values.push((k, unsafe {
                buffer.add(offset).cast::<u64>().read_unaligned()
            }));
        }
        offset += p.size;
    }
    Ok(values)
}

/// A launch of `f` on `stream` ([`kernel::launch`]), its parameters read as [`pointer_values`]
/// reads them.
///
/// # Safety
/// As [`pointer_values`].
unsafe fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res {
    // SAFETY: as the caller promises.
    let values = |params: &[Param]| unsafe { pointer_values(params, kernel_params, extra) };
    kernel::launch(Scope::Current, h(f), grid, block, h(stream), values)
}

driver! {
    /// Loads a PTX module (NUL-terminated text) into the current context: its `.entry`
    /// directives become its kernels. A cubin or fatbin is not modelled:
    /// `CUDA_ERROR_NOT_SUPPORTED`, said on stderr; PTX whose entries cannot be read is
    /// `CUDA_ERROR_INVALID_PTX`.
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        // SAFETY: a module image (driver API contract).
        unsafe { load("cuModuleLoadData", module, image) }
    }

    /// [`cuModuleLoadData`]; the JIT options are ignored (nothing is compiled, no log is
    /// written).
    fn cuModuleLoadDataEx(
        module: *mut CUmodule,
        image: *const c_void,
        _num_options: c_uint,
        _options: *mut CUjit_option,
        _option_values: *mut *mut c_void,
    ) {
        // SAFETY: a module image (driver API contract).
        unsafe { load("cuModuleLoadDataEx", module, image) }
    }

    /// Loads a PTX file (a `.ptx` path); see [`cuModuleLoadData`].
    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) {
        if module.is_null() || fname.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path (driver API contract).
        let path = unsafe { CStr::from_ptr(fname) }.to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        kernel::check_image("cuModuleLoad", &bytes)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            kernel::refuse("cuModuleLoad", Refusal::Invalid("the text is not UTF-8".into()))
        })?;
        load_text("cuModuleLoad", module, text.trim_end_matches('\0'))
    }

    /// The kernel `name` of a module (`.entry name`); `CUDA_ERROR_NOT_FOUND` if it has none.
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) {
        if hfunc.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (driver API contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let f = kernel::function(h(hmod), &name)?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(hfunc, f as CUfunction) }
    }

    /// Unloads a module: its kernels' handles become invalid (`CUDA_ERROR_INVALID_HANDLE`);
    /// launches already enqueued stay in their streams.
    fn cuModuleUnload(hmod: CUmodule) {
        kernel::unload_module(h(hmod))
    }

    /// Enqueues a launch of `f` on `stream`, in stream order: an access (read and write, of the
    /// whole allocation) to every device allocation that a pointer-sized parameter (`.u64`,
    /// `.s64`, `.b64` in the `.entry` signature) points into, checked by the happens-before
    /// checker and counted as `cuLaunchKernel`. The kernel body does not run: no value is
    /// computed. Parameters come from `kernelParams` or from `extra`.
    fn cuLaunchKernel(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        _shared_mem_bytes: c_uint,
        stream: CUstream,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        // SAFETY: the launch's parameters (driver API contract).
        unsafe {
            launch(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z], stream, kernel_params, extra)
        }
    }

    /// [`cuLaunchKernel`] (the launch is not cooperative on the simulator: bodies do not run).
    fn cuLaunchCooperativeKernel(
        f: CUfunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        _shared_mem_bytes: c_uint,
        stream: CUstream,
        kernel_params: *mut *mut c_void,
    ) {
        // SAFETY: the launch's parameters (driver API contract).
        unsafe {
            launch(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z], stream, kernel_params, std::ptr::null_mut())
        }
    }

    /// [`cuLaunchKernel`] with its geometry and stream in `config`; the launch attributes are
    /// ignored.
    fn cuLaunchKernelEx(
        config: *const CUlaunchConfig,
        f: CUfunction,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        if config.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a valid configuration (driver API contract).
        let c = unsafe { &*config };
        // SAFETY: the launch's parameters (driver API contract).
        unsafe {
            launch(
                f,
                [c.gridDimX, c.gridDimY, c.gridDimZ],
                [c.blockDimX, c.blockDimY, c.blockDimZ],
                c.hStream,
                kernel_params,
                extra,
            )
        }
    }
}

/// Declares parameter `index` of kernel `f` read-only (`read_only != 0`) or read and written:
/// later launches of `f` read the allocation it points into, rather than read and write it.
/// `CUDA_ERROR_INVALID_HANDLE` for an unknown kernel, `CUDA_ERROR_INVALID_VALUE` for an index
/// that is not a pointer-sized parameter of it.
#[unsafe(no_mangle)]
pub extern "C" fn cuSimKernelParamReadOnly(
    f: CUfunction,
    index: c_uint,
    read_only: i32,
) -> CUresult {
    guard("cuSimKernelParamReadOnly", || {
        kernel::set_read_only(h(f), index as usize, read_only != 0)
    })
}
