//! Modules and kernel launches: PTX modules are read for their `.entry` signatures, and a
//! launch is enqueued in stream order as an access to every device allocation that a
//! pointer-sized parameter points into. Kernel bodies do not run: no value is computed.

use std::collections::HashMap;

use cudarc::driver::sys::CUresult;

use super::base::{Handle, Res};
use super::checker::Pattern;
use super::memory::{Alloc, Resolved};
use super::module::{Function, KernelPointer, Module};
use super::nodes::Node;
use super::ptx::{self, Param, Refusal};
use super::state::{Scope, State, state};

use CUresult::*;

/// Says on stderr why a module image was refused, and gives the driver's code for it.
pub(crate) fn refuse(call: &str, why: Refusal) -> CUresult {
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

/// Checks the first bytes of a module image (up to 4): a cubin or fatbin is refused.
pub(crate) fn check_image(call: &str, head: &[u8]) -> Res {
    ptx::check_magic(head).map_err(|why| refuse(call, why))
}

/// Loads PTX text as a module of the context of `scope`: its `.entry` directives become its
/// kernels.
pub(crate) fn load_module(scope: Scope, call: &str, text: &str) -> Res<Handle> {
    let entries = ptx::entries(text).map_err(|why| refuse(call, why))?;
    let mut st = state();
    let ctx = st.scope_context(scope)?;
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
    Ok(handle)
}

/// The kernel `name` of a module (`CUDA_ERROR_NOT_FOUND` if it has none).
pub(crate) fn function(module: Handle, name: &str) -> Res<Handle> {
    let st = state();
    st.check_init()?;
    let m = st
        .kernels
        .modules
        .get(&module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.context(m.ctx)?;
    m.functions.get(name).copied().ok_or(CUDA_ERROR_NOT_FOUND)
}

/// Unloads a module: its kernels' handles become invalid; launches already enqueued stay.
pub(crate) fn unload_module(module: Handle) -> Res {
    let mut st = state();
    st.check_init()?;
    st.kernels
        .modules
        .remove(&module)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.kernels.functions.retain(|_, f| f.module != module);
    Ok(())
}

/// The launch geometry, checked as the driver checks it: no dimension 0, at most 1024 threads
/// per block (x and y at most 1024, z at most 64), grid y and z at most 65535.
fn check_dims(grid: [u32; 3], block: [u32; 3]) -> Res {
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

/// A launch of `f` on `stream`: checked, then enqueued as a read and write (a read for a
/// parameter declared read-only) of every live allocation a pointer-sized parameter points
/// into. `values` reads the values of the pointer-sized parameters from the caller's arguments,
/// given the kernel's parameters. A parameter pointing into freed memory is a use after free:
/// reported, and the launch is refused with `CUDA_ERROR_INVALID_VALUE`. Values outside device
/// memory (integers, host pointers) are not accesses. An allocation of another device, reached
/// without peer access enabled from the stream's context to the allocation's, is reported (a
/// GPU faults), and the launch goes on.
pub(crate) fn launch(
    scope: Scope,
    f: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    stream: Handle,
    values: impl FnOnce(&[Param]) -> Res<Vec<(usize, u64)>>,
) -> Res {
    check_dims(grid, block)?;
    let mut st = state();
    let i = st.stream_in(scope, stream)?;
    let func = st
        .kernels
        .functions
        .get(&f)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if func.ctx != st.streams[i].ctx {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (name, read_only) = (func.name.clone(), func.read_only.clone());
    let values = values(&func.params)?;
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

/// Declares parameter `index` of kernel `f` read-only or read and written.
pub(crate) fn set_read_only(f: Handle, index: usize, read_only: bool) -> Res {
    let mut st = state();
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
