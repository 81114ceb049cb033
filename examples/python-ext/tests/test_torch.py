"""PyTorch and the example extension, both ways: torch tensors read by this crate's consumer
(through PyTorch's C exchange API, `__dlpack_c_exchange_api__`, or through `__dlpack__`), and
this crate's exports read by `torch.from_dlpack`.

`de.any_relay(x)` imports `x` whatever its dtype and strides (through the C exchange API where
`x`'s type publishes one); `de.any_relay(x, copy=False)` forces `x.__dlpack__(...)`. The result
is lent on to Python with the import's dtype, shape and strides, so `torch.from_dlpack` of it
shows what the consumer saw.

PyTorch is required (requirements-dev.txt): without it this module fails to import.
"""

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import dlpack_example as de

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

# Every torch dtype DLPack carries (bfloat16, complex32 and the float8 kinds included).
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]

# The two import paths: PyTorch's C exchange API (no options) and `__dlpack__` (forced by
# `copy=False`, which the C exchange API cannot honour).
PATHS = {"c_api": lambda x: de.any_relay(x), "dunder": lambda x: de.any_relay(x, copy=False)}


def random_tensor(dtype, n=12, seed=0):
    """`n` elements of `dtype` with random bits (0 or 1 for bool)."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool()
    return raw.view(dtype)


def same_bits(a, b):
    """Same dtype, shape and element bits (NaN payloads included)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_both_ways(dtype, path):
    x = random_tensor(dtype)
    r = PATHS[path](x)
    # The consumer read torch's memory in place, with torch's shape and strides ...
    assert r.data_ptr == x.data_ptr()
    assert r.layout == ([12], [1])
    # ... and torch reads this crate's export of it as the same values.
    y = torch.from_dlpack(r)
    assert same_bits(y, x)
    assert y.data_ptr() == x.data_ptr()


NUMPY_DTYPES = [d for d in DTYPES if d.is_complex or d.itemsize > 1 or d in (torch.bool, torch.uint8, torch.int8)]
NUMPY_DTYPES = [d for d in NUMPY_DTYPES if d not in (torch.bfloat16, torch.complex32)]


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
def test_numpy_agrees_with_what_the_consumer_read(dtype):
    # An independent reader of what the consumer imported: NumPy, for the dtypes it has.
    x = random_tensor(dtype)
    a = np.from_dlpack(de.any_relay(x))
    assert a.dtype == x.numpy().dtype
    assert a.tobytes() == x.numpy().tobytes()


LAYOUTS = {
    "0-d": lambda: torch.tensor(2.5, dtype=torch.float64),
    "empty": lambda: torch.zeros(0, 3),
    "step": lambda: torch.arange(20.0)[::3],
    "transposed": lambda: torch.arange(12.0).reshape(3, 4).T,
    "offset": lambda: torch.arange(12.0).reshape(3, 4)[1:, 2:],
    "broadcast": lambda: torch.arange(3.0).expand(4, 3),
    "complex-columns": lambda: torch.arange(24.0).view(torch.complex64).reshape(3, 4)[:, ::2],
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_tensors_keep_their_layout_both_ways(layout, path):
    x = LAYOUTS[layout]()
    r = PATHS[path](x)
    assert r.layout == (list(x.shape), list(x.stride()))
    if x.numel():
        assert r.data_ptr == x.data_ptr()
    y = torch.from_dlpack(r)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(y, x)
    if x.numel():
        assert y.stride() == x.stride() and y.data_ptr() == x.data_ptr()


def test_legacy_and_versioned_capsules_from_torch():
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    capsules = [
        torch.utils.dlpack.to_dlpack(x),  # legacy "dltensor"
        x.__dlpack__(),  # legacy: no max_version
        x.__dlpack__(max_version=(1, 0)),  # "dltensor_versioned"
    ]
    for capsule in capsules:
        r = de.any_relay(capsule)
        assert r.data_ptr == x.data_ptr()
        assert torch.equal(torch.from_dlpack(r), x)


def test_legacy_and_versioned_capsules_to_torch():
    t = de.Tensor.arange(2, 3)
    want = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    # The shared, read-only export: versioned zero-copy, legacy as a writable copy.
    versioned = torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    legacy = torch.from_dlpack(t.__dlpack__())
    assert torch.equal(versioned, want) and torch.equal(legacy, want)
    assert versioned.data_ptr() == torch.from_dlpack(t).data_ptr()
    assert legacy.data_ptr() != versioned.data_ptr()
    # torch.from_dlpack of the object itself (it asks for max_version=(1, 0)), and a by-value
    # export, writable in torch.
    assert torch.equal(torch.from_dlpack(t), want)
    ones = torch.from_dlpack(de.ones(2, 2))
    ones += 1
    assert torch.equal(ones, torch.full((2, 2), 2.0))


def test_torch_reads_strided_exports():
    # Transposed, zero-copy. (Torch has no negative strides: `Strided(3, 4, "reversed")` is
    # refused by torch.from_dlpack itself.)
    s = de.Strided(3, 4, "t")
    y = torch.from_dlpack(s)
    assert torch.equal(y, torch.arange(12.0).reshape(3, 4).T)
    assert y.stride() == (1, 4)


def test_the_c_exchange_api_is_published_on_both_sides():
    # PyTorch publishes it on torch.Tensor (not on torch._C.TensorBase); this crate's types
    # publish theirs. torch.from_dlpack (2.15) calls `__dlpack__` and does not use it.
    assert "__dlpack_c_exchange_api__" in torch.Tensor.__dict__
    for ours in (de.Tensor.arange(2), de.any_relay(torch.ones(2))):
        assert type(type(ours).__dlpack_c_exchange_api__).__name__ == "PyCapsule"


def complex_pair():
    return torch.tensor([1 + 1j, 2 - 2j])


REFUSED = {
    "requires_grad": (lambda: torch.ones(3, requires_grad=True), "requires gradient.*tensor.detach"),
    "parameter": (lambda: torch.nn.Parameter(torch.ones(3)), "requires gradient.*tensor.detach"),
    "conj": (lambda: complex_pair().conj(), "conjugate bit.*tensor.resolve_conj"),
    "conj-view": (lambda: complex_pair().conj()[1:], "conjugate bit.*tensor.resolve_conj"),
    "neg": (lambda: complex_pair().conj().imag, "negative bit.*tensor.resolve_neg"),
    "sparse": (lambda: torch.ones(3).to_sparse(), "layout torch.sparse_coo.*torch.strided.*to_dense"),
    "sparse_csr": (lambda: torch.eye(3).to_sparse_csr(), "layout torch.sparse_csr.*to_dense"),
    "quantized": (
        lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
        r"quantized torch tensor \(torch.quint8\).*dequantize",
    ),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path", [*PATHS, "consume"])
@pytest.mark.parametrize("case", REFUSED)
def test_what_torch_cannot_export_is_refused_on_every_path(case, path):
    make, message = REFUSED[case]
    x = make()
    import_ = de.consume if path == "consume" else PATHS[path]
    with pytest.raises(BufferError, match=message):
        import_(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", [c for c in REFUSED if c != "neg"])
def test_torch_refuses_the_same_tensors(case):
    # What this consumer refuses, torch's own `__dlpack__` refuses (NumPy asks it), save the
    # negative bit: torch exports that tensor's memory, the values before the negation.
    with pytest.raises(BufferError):
        np.from_dlpack(REFUSED[case][0]())


@pytest.mark.parametrize("path", PATHS)
def test_the_resolved_tensors_are_served(path):
    c = complex_pair().conj()
    assert torch.equal(torch.from_dlpack(PATHS[path](c.resolve_conj())), torch.tensor([1 - 1j, 2 + 2j]))
    n = complex_pair().conj().imag
    assert torch.equal(torch.from_dlpack(PATHS[path](n.resolve_neg())), torch.tensor([-1.0, 2.0]))
    g = torch.ones(3, requires_grad=True)
    assert torch.equal(torch.from_dlpack(PATHS[path](g.detach())), torch.ones(3))
    p = torch.nn.Parameter(torch.arange(3.0), requires_grad=False)
    assert torch.equal(torch.from_dlpack(PATHS[path](p)), torch.arange(3.0))
    # A complex tensor without the conjugate bit, and a real view of one, are not refused.
    z = complex_pair()
    assert torch.equal(torch.from_dlpack(PATHS[path](z.imag)), torch.tensor([1.0, -2.0]))


class Plain(torch.Tensor):
    """A subclass that changes nothing: PyTorch's C exchange API answers for it."""


class Dunder(torch.Tensor):
    """Overrides `__dlpack__` (and counts its calls): read through it."""

    calls = 0

    def __dlpack__(self, **kwargs):
        Dunder.calls += 1
        return super().__dlpack__(**kwargs)


class Function(torch.Tensor):
    """Overrides `__torch_function__` (and counts the `__dlpack__` it sees): read through
    `__dlpack__`, which its override may change."""

    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__dlpack__:
            Function.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("path", PATHS)
def test_subclasses_read_through_the_path_that_gives_their_answer(path):
    base = torch.arange(4.0)
    for cls in (Plain, Dunder, Function):
        x = base.as_subclass(cls)
        before = (Dunder.calls, Function.seen)
        r = PATHS[path](x)
        assert torch.equal(torch.from_dlpack(r), base)
        assert r.data_ptr == base.data_ptr()
        after = (Dunder.calls, Function.seen)
        # The overrides are reached on both paths; the plain subclass takes the C API when it
        # may (nothing observable but the values).
        if cls is Dunder:
            assert after[0] == before[0] + 1
        if cls is Function:
            assert after[1] > before[1]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cls", [Plain, Dunder, Function], ids=lambda c: c.__name__)
def test_subclasses_with_the_negative_bit_are_refused(cls, path):
    n = complex_pair().conj().imag.as_subclass(cls)
    assert n.is_neg()
    with pytest.raises(BufferError, match="negative bit"):
        PATHS[path](n)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cls", [Plain, Function], ids=lambda c: c.__name__)
def test_subclasses_that_require_grad_are_refused(cls, path):
    g = torch.ones(3).as_subclass(cls).requires_grad_()
    with pytest.raises(BufferError, match="requires gradient"):
        PATHS[path](g)


def test_writes_through_an_import_reach_torch():
    x = torch.zeros(4, dtype=torch.float32)
    assert de.fill(x, 3.0) == 4
    assert torch.equal(x, torch.full((4,), 3.0))
    # ... and not through a tensor that requires grad (autograd would not see them).
    g = torch.zeros(4, requires_grad=True)
    with pytest.raises(BufferError, match="requires gradient"):
        de.fill(g, 3.0)
    assert not g.detach().any()


# PyTorch's read-only wrapper overrides `__dlpack__` (it asks for `read_only=True`) and
# `__torch_function__` (it refuses every torch function but the DLPack methods): both calls
# read it through its `__dlpack__`; the capsule it hands out is read as one too.
READ_ONLY_PATHS = {**PATHS, "capsule": lambda x: de.any_relay(x.__dlpack__(max_version=(1, 3)))}


@pytest.mark.parametrize("path", READ_ONLY_PATHS)
def test_pytorchs_read_only_wrapper_is_imported_read_only(path):
    base = torch.arange(4.0)
    x = torch.utils.dlpack.ReadOnlyTensorWrapper(base)
    # Zero-copy: torch's memory, the values 0..3.
    r = READ_ONLY_PATHS[path](x)
    assert r.data_ptr == base.data_ptr()
    assert r.layout == ([4], [1])
    assert np.array_equal(np.from_dlpack(r), np.arange(4.0, dtype=np.float32))


@pytest.mark.parametrize("path", PATHS)
def test_pytorchs_read_only_wrapper_with_the_negative_bit_is_refused(path):
    # The flags are read, not skipped: the negative bit the wrapper's `__dlpack__` would export
    # as the values before the negation is refused.
    n = complex_pair().conj().imag
    assert n.is_neg()
    with pytest.raises(BufferError, match="negative bit"):
        PATHS[path](torch.utils.dlpack.ReadOnlyTensorWrapper(n))


@pytest.mark.parametrize("path", ["object", "capsule"])
def test_writes_through_pytorchs_read_only_wrapper_are_refused(path):
    base = torch.arange(4.0)
    x = torch.utils.dlpack.ReadOnlyTensorWrapper(base)
    source = (lambda: x) if path == "object" else (lambda: x.__dlpack__(max_version=(1, 3)))
    # Read-only: the writable imports refuse it, and the memory is untouched ...
    with pytest.raises(BufferError, match="read-only"):
        de.fill(source(), 7.0)
    with pytest.raises(BufferError, match="read-only"):
        de.hold(source(), True)
    assert torch.equal(base, torch.arange(4.0))
    # ... where reading is served.
    assert de.consume(source()) == 1
    # NumPy agrees: read-only, same memory.
    a = np.from_dlpack(x)
    assert not a.flags.writeable and a.ctypes.data == base.data_ptr()


class OnlyDLPack(torch.overrides.TorchFunctionMode):
    """Refuses every torch function but the DLPack methods, the flag queries included."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__dlpack__, torch.Tensor.__dlpack_device__):
            return func(*args, **(kwargs or {}))
        raise RuntimeError(f"{getattr(func, '__name__', func)} is not allowed here")


@pytest.mark.parametrize("path", PATHS)
def test_a_flag_query_refused_all_the_same_leaves_the_answer_to_the_subclass(path):
    # A mode that refuses the queries, subclasses' overrides disabled or not: the consumer
    # cannot read the flags, and the wrapper's own `__dlpack__` decides, as for NumPy.
    base = torch.arange(4.0)
    address = base.data_ptr()
    x = torch.utils.dlpack.ReadOnlyTensorWrapper(base)
    with OnlyDLPack():
        with pytest.raises(RuntimeError, match="is_neg is not allowed"):
            x.is_neg()
        assert np.from_dlpack(x).ctypes.data == address
        r = PATHS[path](x)
    assert r.data_ptr == address
    assert np.array_equal(np.from_dlpack(r), np.arange(4.0, dtype=np.float32))
