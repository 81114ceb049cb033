//! Modules and kernel launches: PTX modules are read for their `.entry` signatures, and a
//! launch is enqueued in stream order as an access to every device allocation that a
//! pointer-sized parameter points into. Kernel bodies do not run: no value is computed.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys::{CUfunction, CUjit_option, CUlaunchConfig, CUmodule, CUresult, CUstream};

use crate::checker::Pattern;
use crate::engine::{Alloc, Handle, Res, Resolved, State};
use crate::graph::Node;
use crate::ptx::{self, Param, Refusal};
use crate::{driver, out, state};

use CUresult::*;

/// A loaded module: its context and its kernels' handles, by name.
pub(crate) struct Module {
    ctx: Handle,
    functions: HashMap<String, Handle>,
}

/// A kernel of a loaded module.
pub(crate) struct Function {
    module: Handle,
    ctx: Handle,
    name: Arc<str>,
    params: Vec<Param>,
    /// Parameters declared read-only (`cuSimKernelParamReadOnly`), by index.
    read_only: Vec<bool>,
}

/// Modules not unloaded, and their kernels.
#[derive(Default)]
pub(crate) struct Kernels {
    modules: HashMap<Handle, Module>,
    functions: HashMap<Handle, Function>,
}

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

/// Says on stderr why a module image was refused, and gives the driver's code for it.
fn refuse(call: &str, why: Refusal) -> CUresult {
    match why {
        Refusal::NotPtx(what) => {
            eprintln!(
                "cuda-sim: {call}: {what} is not modelled; the CUDA simulator loads PTX text only \
                 (kernel signatures are read from its .entry directives, bodies do not run)"
            );
            CUDA_ERROR_NOT_SUPPORTED
        }
        Refusal::Invalid(text) => {
            eprintln!("cuda-sim: {call}: cannot read the PTX: {text}");
            CUDA_ERROR_INVALID_PTX
        }
    }
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
    ptx::check_magic(&head).map_err(|why| refuse(call, why))?;
    // SAFETY: not a binary image, so NUL-terminated text (caller).
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) };
    let text = text
        .to_str()
        .map_err(|_| refuse(call, Refusal::Invalid("the text is not UTF-8".into())))?;
    load_text(call, module, text)
}

fn load_text(call: &str, module: *mut CUmodule, text: &str) -> Res {
    let entries = ptx::entries(text).map_err(|why| refuse(call, why))?;
    let mut st = state();
    let ctx = st.current()?;
    let handle = st.handle();
    let mut functions = HashMap::new();
    for e in entries {
        let f = st.handle();
        functions.insert(e.name.clone(), f);
        st.kernels.functions.insert(
            f,
            Function {
                module: handle,
                ctx,
                read_only: vec![false; e.params.len()],
                name: e.name.into(),
                params: e.params,
            },
        );
    }
    st.kernels.modules.insert(handle, Module { ctx, functions });
    // SAFETY: an out-pointer, checked not NULL by the caller.
    unsafe { out(module, handle as CUmodule) }
}

/// The launch geometry, checked as the driver checks it: no dimension 0, at most 1024 threads
/// per block (x and y at most 1024, z at most 64), grid y and z at most 65535.
fn check_dims(grid: [c_uint; 3], block: [c_uint; 3]) -> Res {
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    let ok = grid.iter().chain(&block).all(|&d| d > 0)
        && threads <= 1024
        && block[2] <= 64
        && grid[1] <= 65535
        && grid[2] <= 65535;
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
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

/// A launch of `f` on `stream`: checked, then enqueued as a read and write (a read for a
/// parameter declared read-only) of every live allocation a pointer-sized parameter points
/// into. A parameter pointing into freed memory is a use after free: reported, and the launch
/// is refused with `CUDA_ERROR_INVALID_VALUE`. Values outside device memory (integers, host
/// pointers) are not accesses. An allocation of another device, reached without peer access
/// enabled from the stream's context to the allocation's, is reported (a GPU faults), and the
/// launch goes on.
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
    check_dims(grid, block)?;
    let mut st = state();
    let i = st.stream(h(stream))?;
    let func = st
        .kernels
        .functions
        .get(&h(f))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if func.ctx != st.streams[i].ctx {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (name, read_only) = (func.name.clone(), func.read_only.clone());
    // SAFETY: as the caller promises.
    let values = unsafe { pointer_values(&func.params, kernel_params, extra) }?;
    let pointers: Vec<KernelPointer> = values
        .into_iter()
        .map(|(index, value)| KernelPointer {
            index,
            value,
            write: !read_only[index],
        })
        .collect();
    let op = format!("cuLaunchKernel `{name}`");
    // Checked now on a capturing stream too: a launch given freed memory is refused either way.
    let accesses = prepare_launch(&mut st, &op, &pointers)?;
    if st.capturing(i)?.is_some() {
        st.add_node(i, Node::Kernel { name, pointers });
        return Ok(());
    }
    let ctx = st.streams[i].ctx;
    for (a, _, _) in &accesses {
        st.check_peer_reach(ctx, a, &op);
    }
    let refs: Vec<_> = accesses.iter().map(|(a, p, w)| (a, *p, *w)).collect();
    st.enqueue_as(i, "cuLaunchKernel", &op, &refs, None, None)?;
    Ok(())
}

/// A pointer-sized parameter of a launch: its index, its value, and whether the launch writes
/// what it points into (not declared read-only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KernelPointer {
    index: usize,
    value: u64,
    write: bool,
}

/// The accesses of a launch described as `op` (the kernel, and the graph launch replaying it):
/// the whole of every live allocation a pointer parameter points into, written if any
/// parameter into it writes. A parameter into freed memory is reported as a use after free and
/// refuses the launch (`CUDA_ERROR_INVALID_VALUE`); values outside device memory are not
/// accesses.
pub(crate) fn prepare_launch(
    st: &mut State,
    op: &str,
    pointers: &[KernelPointer],
) -> Res<Vec<(Alloc, Pattern, bool)>> {
    // Allocations touched, by base: whether any parameter writes it.
    let mut touched: Vec<(u64, bool)> = Vec::new();
    for p in pointers {
        match st.memory.resolve(p.value, 0) {
            Resolved::Live(a) => match touched.iter_mut().find(|(base, _)| *base == a.base) {
                Some((_, w)) => *w |= p.write,
                None => touched.push((a.base, p.write)),
            },
            Resolved::Freed(by) => {
                let what = format!("{op} (parameter {})", p.index);
                st.checker.use_after_free(p.value, &what, &by);
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            Resolved::Unknown => {}
        }
    }
    Ok(touched
        .into_iter()
        .map(|(base, write)| {
            let a = st.take_alloc_view(base);
            let whole = Pattern::range(0, a.len as u64);
            (a, whole, write)
        })
        .collect())
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
        ptx::check_magic(&bytes).map_err(|why| refuse("cuModuleLoad", why))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| refuse("cuModuleLoad", Refusal::Invalid("the text is not UTF-8".into())))?;
        load_text("cuModuleLoad", module, text.trim_end_matches('\0'))
    }

    /// The kernel `name` of a module (`.entry name`); `CUDA_ERROR_NOT_FOUND` if it has none.
    fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) {
        if hfunc.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (driver API contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let st = state();
        st.check_init()?;
        let m = st.kernels.modules.get(&h(hmod)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        st.context(m.ctx)?;
        let &f = m.functions.get(name.as_ref()).ok_or(CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: an out-pointer, not NULL.
        unsafe { out(hfunc, f as CUfunction) }
    }

    /// Unloads a module: its kernels' handles become invalid (`CUDA_ERROR_INVALID_HANDLE`);
    /// launches already enqueued stay in their streams.
    fn cuModuleUnload(hmod: CUmodule) {
        let mut st = state();
        st.check_init()?;
        let m = st.kernels.modules.remove(&h(hmod)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        st.kernels.functions.retain(|_, f| f.module != h(hmod));
        drop(m);
        Ok(())
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
    crate::guard("cuSimKernelParamReadOnly", || {
        let mut st = state();
        set_read_only(&mut st, h(f), index as usize, read_only != 0)
    })
}

fn set_read_only(st: &mut State, f: Handle, index: usize, read_only: bool) -> Res {
    let func = st
        .kernels
        .functions
        .get_mut(&f)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    match func.params.get(index) {
        Some(p) if p.pointer => {
            func.read_only[index] = read_only;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
