//! PyTorch tensors as producers: which tensors the consumer refuses, and through which path a
//! torch tensor type is read.
//!
//! PyTorch's `Tensor.__dlpack__` refuses tensors whose meaning a DLPack tensor cannot carry: one
//! that requires grad (writes through the import would bypass autograd), one with the conjugate
//! bit set (its memory holds the unconjugated values), and one whose layout is not
//! `torch.strided` (sparse, say); its exporter refuses quantized dtypes. Its C exchange API
//! (`managed_tensor_from_py_object_no_sync` of `DLPackExchangeAPI` in `dlpack.h`) makes none of
//! the first two refusals, and raises `RuntimeError` for the last two. A tensor with the
//! negative bit set (`is_neg()`) is exported by both without refusal, as its memory: the
//! negated values. So for torch tensors this consumer checks itself, on both paths, with the
//! same messages: [`refuse_exported`] after the C exchange API, [`refuse`] before
//! `__dlpack__`. [`refuse`] reads a subclass's flags with subclasses' `__torch_function__`
//! disabled, as PyTorch's own subclasses do for their internals: an override may refuse every
//! torch function but the DLPack methods (`torch.utils.dlpack.ReadOnlyTensorWrapper`).

use pyo3::exceptions::{PyBufferError, PyException};
#[cfg(not(Py_LIMITED_API))]
use pyo3::ffi as pyffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::tensor::managed::ManagedTensor;

/// How a producer type relates to PyTorch, decided once per type by [`kind_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Not a torch tensor type (or PyTorch was not imported when the type was first seen).
    Other,
    /// A torch tensor type whose `__dlpack__`, `__torch_function__`, `__torch_dispatch__` and
    /// `__dlpack_c_exchange_api__` are PyTorch's own (`torch.Tensor`, `torch.nn.Parameter`):
    /// its C exchange API answers as its `__dlpack__` does, once [`refuse_exported`] has
    /// checked what `__dlpack__` checks.
    Plain,
    /// A torch tensor subclass that overrides `__torch_function__`, `__torch_dispatch__` or the
    /// exchange API table but not `__dlpack__`: read through `__dlpack__` only (its overrides
    /// may change what the tensor is), after [`refuse`].
    Dunder,
    /// A torch tensor subclass with a `__dlpack__` of its own: read through it, after the
    /// negative bit check alone (an override that calls PyTorch's would give the negated
    /// values; the rest is the override's to decide).
    Overridden,
}

/// The descriptors of `torch._C.TensorBase` the checks call, and `torch.strided`, found once.
struct Torch {
    requires_grad: Py<PyAny>,
    is_conj: Py<PyAny>,
    is_neg: Py<PyAny>,
    strided: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// The attribute `name` as the type's method resolution order finds it in a class `__dict__`
/// (not bound: a classmethod stays a classmethod object, so two lookups can be compared by
/// identity).
fn resolve<'py>(ty: &Bound<'py, PyType>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mro = ty.getattr(intern!(ty.py(), "__mro__"))?;
    for class in mro.cast::<PyTuple>()?.iter() {
        let found = class
            .getattr(intern!(ty.py(), "__dict__"))?
            .call_method1(intern!(ty.py(), "get"), (name,))?;
        if !found.is_none() {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Whether `ty` is a torch tensor type and how to read it; PyTorch is never imported here, only
/// looked up in `sys.modules`.
pub(super) fn kind_of(ty: &Bound<'_, PyType>) -> PyResult<Kind> {
    let py = ty.py();
    let Some(torch) = torch_module(py)? else {
        return Ok(Kind::Other);
    };
    let Some(tensor) = torch.getattr_opt(intern!(py, "Tensor"))? else {
        return Ok(Kind::Other);
    };
    let Ok(tensor) = tensor.cast_into::<PyType>() else {
        return Ok(Kind::Other);
    };
    if !ty.is_subclass(&tensor)? {
        return Ok(Kind::Other);
    }
    let same = |name: &str| -> PyResult<bool> {
        Ok(match (resolve(ty, name)?, resolve(&tensor, name)?) {
            (Some(ours), Some(theirs)) => ours.is(&theirs),
            (None, None) => true,
            _ => false,
        })
    };
    if !same("__dlpack__")? {
        return Ok(Kind::Overridden);
    }
    // `torch.nn.Parameter` disables `__torch_function__` (PyTorch's default for subclasses,
    // `torch._C._disabled_torch_function_impl`), which leaves `__dlpack__` as it is.
    let disabled = torch
        .getattr(intern!(py, "_C"))?
        .getattr_opt(intern!(py, "_disabled_torch_function_impl"))?;
    let function = resolve(ty, "__torch_function__")?;
    let function_kept = same("__torch_function__")?
        || matches!((&function, &disabled), (Some(f), Some(d)) if f.is(d));
    let plain = function_kept
        && same("__torch_dispatch__")?
        && same("__dlpack_c_exchange_api__")?
        && descriptors(py).is_ok();
    Ok(if plain { Kind::Plain } else { Kind::Dunder })
}

/// `sys.modules.get("torch")`: PyTorch if it was imported, without importing it.
fn torch_module(py: Python<'_>) -> PyResult<Option<Bound<'_, PyAny>>> {
    let modules = py
        .import(intern!(py, "sys"))?
        .getattr(intern!(py, "modules"))?;
    modules
        .call_method1(intern!(py, "get"), (intern!(py, "torch"),))
        .map(|torch| (!torch.is_none()).then_some(torch))
}

fn descriptors(py: Python<'_>) -> PyResult<&Torch> {
    TORCH.get_or_try_init(py, || {
        let torch =
            torch_module(py)?.ok_or_else(|| PyBufferError::new_err("torch is not imported"))?;
        let base = torch
            .getattr(intern!(py, "_C"))?
            .getattr(intern!(py, "TensorBase"))?
            .getattr(intern!(py, "__dict__"))?;
        let requires_grad = base.get_item(intern!(py, "requires_grad"))?;
        let is_conj = base.get_item(intern!(py, "is_conj"))?;
        let is_neg = base.get_item(intern!(py, "is_neg"))?;
        // The fast path calls these directly: a getter (a data descriptor) and two methods
        // (vectorcall objects); anything else is refused here and the type reads through
        // `__dlpack__`.
        let getter = requires_grad
            .get_type()
            .getattr_opt(intern!(py, "__set__"))?;
        if getter.is_none() || !is_conj.is_callable() || !is_neg.is_callable() {
            return Err(PyBufferError::new_err(
                "torch._C.TensorBase without the expected descriptors",
            ));
        }
        Ok(Torch {
            requires_grad: requires_grad.unbind(),
            is_conj: is_conj.unbind(),
            is_neg: is_neg.unbind(),
            strided: torch.getattr(intern!(py, "strided"))?.unbind(),
        })
    })
}

/// What makes a torch tensor unexportable, in the order PyTorch's `__dlpack__` checks.
enum Refusal {
    RequiresGrad,
    Conj,
    Layout(String),
    Quantized(String),
    Neg,
}

impl Refusal {
    fn into_err(self) -> PyErr {
        PyBufferError::new_err(match self {
            Self::RequiresGrad => "can't export a torch tensor that requires gradient \
                (writes through it would bypass autograd): expected requires_grad=False, \
                use tensor.detach()"
                .to_owned(),
            Self::Conj => "can't export a torch tensor with the conjugate bit set \
                (its memory holds the unconjugated values): expected is_conj()=False, \
                use tensor.resolve_conj()"
                .to_owned(),
            Self::Layout(layout) => format!(
                "can't export a torch tensor of layout {layout}: expected torch.strided, \
                 use tensor.to_dense()"
            ),
            Self::Quantized(dtype) => format!(
                "can't export a quantized torch tensor ({dtype}): DLPack has no quantized \
                 dtypes, use tensor.dequantize()"
            ),
            Self::Neg => "can't export a torch tensor with the negative bit set \
                (its memory holds the values before the negation): expected is_neg()=False, \
                use tensor.resolve_neg()"
                .to_owned(),
        })
    }
}

/// The flag a descriptor of [`Torch`] reads from `obj`: a getter's value or a method's
/// result, called directly (no attribute lookup, no bound method).
#[cfg(not(Py_LIMITED_API))]
fn flag(obj: &Bound<'_, PyAny>, descriptor: &Py<PyAny>, getter: bool) -> PyResult<bool> {
    let py = obj.py();
    let descriptor = descriptor.as_ptr();
    // SAFETY: GIL held; `descriptor` is a live descriptor of `torch._C.TensorBase` (kept by
    // `TORCH`) and `obj` a live instance of a subclass of it. A getter (a data descriptor,
    // checked in `descriptors`) has `tp_descr_get`, which checks `obj`'s type and returns a new
    // reference or NULL with an exception set; a method descriptor is a vectorcall object whose
    // call with `obj` as the one positional argument is `obj.method()`, same result convention.
    let result = unsafe {
        if getter {
            let ty = pyffi::Py_TYPE(descriptor);
            match (*ty).tp_descr_get {
                Some(get) => get(
                    descriptor,
                    obj.as_ptr(),
                    pyffi::Py_TYPE(obj.as_ptr()).cast(),
                ),
                None => core::ptr::null_mut(),
            }
        } else {
            let args = [obj.as_ptr()];
            pyffi::PyObject_Vectorcall(descriptor, args.as_ptr(), 1, core::ptr::null_mut())
        }
    };
    if result.is_null() {
        return Err(PyErr::take(py)
            .unwrap_or_else(|| PyBufferError::new_err("torch tensor flag without a value")));
    }
    // SAFETY: `result` is a new reference, owned here.
    let result = unsafe { Bound::from_owned_ptr(py, result) };
    // SAFETY: the two singletons are live for the whole interpreter.
    if result.as_ptr() == unsafe { pyffi::Py_True() } {
        return Ok(true);
    }
    // SAFETY: as above.
    if result.as_ptr() == unsafe { pyffi::Py_False() } {
        return Ok(false);
    }
    result.is_truthy()
}

/// As the full API's version, by attribute lookup (the limited API has no type slots to read).
#[cfg(Py_LIMITED_API)]
fn flag(obj: &Bound<'_, PyAny>, descriptor: &Py<PyAny>, getter: bool) -> PyResult<bool> {
    let descriptor = descriptor.bind(obj.py());
    if getter {
        descriptor
            .call_method1(intern!(obj.py(), "__get__"), (obj, obj.get_type()))?
            .is_truthy()
    } else {
        descriptor.call1((obj,))?.is_truthy()
    }
}

/// After PyTorch's C exchange API exported `obj` as `managed`: refuses, as `refuse` would
/// have, what its `__dlpack__` refuses or exports wrongly. Layouts other than strided and
/// quantized dtypes never get here: the exchange API raises for them, and the caller then
/// goes through `__dlpack__`. The conjugate bit is set only on complex tensors, so it is
/// asked only of those. On refusal `managed` is dropped (its deleter runs).
pub(super) fn refuse_exported(
    obj: &Bound<'_, PyAny>,
    managed: ManagedTensor,
) -> PyResult<ManagedTensor> {
    let torch = descriptors(obj.py())?;
    if flag(obj, &torch.requires_grad, true)? {
        return Err(Refusal::RequiresGrad.into_err());
    }
    if managed.dl_tensor().dtype.code == crate::abi::ffi::kDLComplex
        && flag(obj, &torch.is_conj, false)?
    {
        return Err(Refusal::Conj.into_err());
    }
    if flag(obj, &torch.is_neg, false)? {
        return Err(Refusal::Neg.into_err());
    }
    Ok(managed)
}

/// Before `obj.__dlpack__(...)`: refuses what PyTorch's `__dlpack__` (and its exporter)
/// refuses, with this module's messages, and the negative bit, which it exports wrongly; for
/// [`Kind::Overridden`] types the negative bit only.
///
/// A subclass's flags are read with subclasses' `__torch_function__` disabled ([`Unhooked`]):
/// an override may refuse the queries (`torch.utils.dlpack.ReadOnlyTensorWrapper` allows
/// nothing but its DLPack methods), and the flags are the tensor's whatever it answers. A query
/// that fails all the same (a torch function mode that refuses it, say) leaves the answer to
/// the subclass's `__dlpack__`.
pub(super) fn refuse(obj: &Bound<'_, PyAny>, kind: Kind) -> PyResult<()> {
    let py = obj.py();
    let refusal = match kind {
        Kind::Other => return Ok(()),
        // PyTorch's own `__torch_function__`, or its disabled one: nothing to step around.
        Kind::Plain => refusal(obj, kind)?,
        Kind::Dunder | Kind::Overridden => {
            let checked = {
                let _unhooked = Unhooked::enter(py);
                refusal(obj, kind)
            };
            match checked {
                Ok(refusal) => refusal,
                // A query refused all the same: the subclass's `__dlpack__` decides.
                Err(err) if err.is_instance_of::<PyException>(py) => None,
                Err(err) => return Err(err),
            }
        }
    };
    refusal.map_or(Ok(()), |refusal| Err(refusal.into_err()))
}

/// What [`refuse`] refuses `obj` for, if anything.
fn refusal(obj: &Bound<'_, PyAny>, kind: Kind) -> PyResult<Option<Refusal>> {
    let py = obj.py();
    if kind == Kind::Overridden {
        let neg = obj.call_method0(intern!(py, "is_neg"))?.is_truthy()?;
        return Ok(neg.then_some(Refusal::Neg));
    }
    if obj.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
        return Ok(Some(Refusal::RequiresGrad));
    }
    if obj.call_method0(intern!(py, "is_conj"))?.is_truthy()? {
        return Ok(Some(Refusal::Conj));
    }
    let layout = obj.getattr(intern!(py, "layout"))?;
    let strided = match TORCH.get(py) {
        Some(torch) => torch.strided.bind(py).clone(),
        None => torch_module(py)?
            .ok_or_else(|| PyBufferError::new_err("torch is not imported"))?
            .getattr(intern!(py, "strided"))?,
    };
    if !layout.is(&strided) {
        return Ok(Some(Refusal::Layout(layout.str()?.to_string())));
    }
    if obj.getattr(intern!(py, "is_quantized"))?.is_truthy()? {
        let dtype = obj.getattr(intern!(py, "dtype"))?;
        return Ok(Some(Refusal::Quantized(dtype.str()?.to_string())));
    }
    if obj.call_method0(intern!(py, "is_neg"))?.is_truthy()? {
        return Ok(Some(Refusal::Neg));
    }
    Ok(None)
}

/// While it lives, torch tensor subclasses' `__torch_function__` overrides are not called: a
/// `torch._C.DisableTorchFunctionSubclass()` entered (as PyTorch's own subclasses run their
/// internals), exited on drop. Torch function modes still run. Where PyTorch has no such
/// class, or it cannot be entered, nothing is disabled.
struct Unhooked<'py> {
    guard: Option<Bound<'py, PyAny>>,
}

impl<'py> Unhooked<'py> {
    fn enter(py: Python<'py>) -> Self {
        static DISABLE: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
        let guard = DISABLE
            .get_or_try_init(py, || -> PyResult<_> {
                let Some(torch) = torch_module(py)? else {
                    return Ok(None);
                };
                Ok(torch
                    .getattr(intern!(py, "_C"))?
                    .getattr_opt(intern!(py, "DisableTorchFunctionSubclass"))?
                    .map(Bound::unbind))
            })
            .ok()
            .and_then(Option::as_ref)
            .and_then(|class| {
                let guard = class.bind(py).call0().ok()?;
                guard.call_method0(intern!(py, "__enter__")).ok()?;
                Some(guard)
            });
        Self { guard }
    }
}

impl Drop for Unhooked<'_> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let py = guard.py();
            let none = py.None();
            if let Err(err) = guard.call_method1(intern!(py, "__exit__"), (&none, &none, &none)) {
                err.write_unraisable(py, Some(&guard));
            }
        }
    }
}
