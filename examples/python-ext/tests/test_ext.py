"""pytest suite of the example extension: a Rust tensor type used from Python."""

import gc
import inspect

import numpy as np
import pytest

import dlpack_example as de


def test_numpy_reads_a_rust_tensor_zero_copy_and_read_only():
    t = de.Tensor.arange(2, 3)
    a = np.from_dlpack(t)
    assert a.dtype == np.float32
    assert a.shape == (2, 3)
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert not a.flags.writeable
    b = np.from_dlpack(t)
    assert a.ctypes.data == b.ctypes.data, "both views share the Rust buffer"
    del t
    gc.collect()
    assert a.sum() == 15.0, "NumPy keeps the Rust tensor alive"


def test_protocol_arguments():
    t = de.Tensor.arange(3)
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(ValueError, match="stream=1 is not valid for a consumer on cpu:0"):
        t.__dlpack__(stream=1)
    # A read-only export reaches a legacy consumer (no max_version) as a writable copy only.
    assert type(t.__dlpack__()).__name__ == "PyCapsule"
    with pytest.raises(BufferError, match="legacy"):
        t.__dlpack__(copy=False)
    # A device no copy reaches (ROCm; a CUDA device is reached by a copy where the extension is
    # built with `--features cuda` and a driver is present: gpu_tests/test_multi_gpu.py).
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(10, 0))
    c = np.from_dlpack(t, copy=True)
    assert c.flags.writeable and c.tolist() == [0.0, 1.0, 2.0]
    assert type(t).__dlpack_c_exchange_api__ is not None


def test_every_spelling_of_the_arguments_is_served_alike():
    # Plain ints, tuples and bools are read directly; other spellings (a namedtuple, NumPy
    # scalars, a keyword name built at run time) take the general argument path, with the same
    # results and errors.
    import collections
    import ctypes

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    t = de.Tensor.arange(3)
    version = collections.namedtuple("version", "major minor")
    key = "".join(["max_", "version"])
    calls = [
        t.__dlpack__(max_version=(1, 0)),
        t.__dlpack__(stream=None, max_version=(1, 3), dl_device=(1, 0), copy=False),
        t.__dlpack__(max_version=version(1, 3)),
        t.__dlpack__(max_version=(np.int64(1), 3), dl_device=(np.int32(1), 0)),
        t.__dlpack__(copy=np.bool_(False), max_version=(1, 3)),
        t.__dlpack__(**{key: (1, 3)}),
    ]
    assert [get_name(c) for c in calls] == [b"dltensor_versioned"] * len(calls)
    # A value of the right kind that does not convert keeps its own error, with the parameter
    # named in a note, as pyo3 names its arguments.
    with pytest.raises(OverflowError) as raised:
        t.__dlpack__(max_version=(1, 2**40))
    assert raised.value.__notes__ == ["while processing 'max_version'"]
    with pytest.raises(ValueError) as raised:
        t.__dlpack__(max_version=(1,))
    assert raised.value.__notes__ == ["while processing 'max_version'"]
    with pytest.raises(OverflowError) as raised:
        t.__dlpack__(stream=2**70)
    assert raised.value.__notes__ == ["while processing 'stream'"]
    with pytest.raises(TypeError, match="'copy' must be a bool or None, not int"):
        t.__dlpack__(copy=1)


@pytest.mark.parametrize(
    "make, values",
    [(lambda: de.Tensor.arange(3), [0.0, 1.0, 2.0]), (lambda: de.ones(3), [1.0] * 3)],
    ids=["installed-vectorcall", "pymethods"],
)
def test_dlpack_arguments_are_keyword_only(make, values):
    # The array API's signature, `__dlpack__(self, /, *, stream=None, max_version=None,
    # dl_device=None, copy=None)`: a positional argument is a TypeError, as for NumPy and
    # PyTorch, on the installed method (its quick path and its general one) and on
    # `#[pymethods]` (`ExportOnce`).
    t = make()
    for args in [(None,), (None, (1, 3)), (-1,)]:
        with pytest.raises(TypeError, match="positional argument"):
            t.__dlpack__(*args)
    with pytest.raises(TypeError, match="positional argument"):
        t.__dlpack__(None, max_version=(1, 3))
    assert "*, stream=None" in str(inspect.signature(type(t).__dlpack__))
    # The refused calls exported nothing: the by-value tensor is still there to take once.
    assert np.from_dlpack(t).tolist() == values


def test_an_argument_that_is_not_an_array_is_named():
    # A TypeError that says what was found and what is expected, named the way pyo3 names the
    # argument of its own conversions (a note, "while processing 'value'", as for
    # `de.fill(x, "1")`).
    expected = r"^expected a DLPack producer \(an object with `__dlpack__`.* or a DLPack capsule, found `{}`\n"
    for call, argument, found in [
        (lambda: de.total("abc"), "x", "str"),
        (lambda: de.alias(np.zeros(2, dtype=np.float32), [1.0, 2.0]), "b", "list"),
        (lambda: de.fill(None, 1.0), "out", "NoneType"),
    ]:
        with pytest.raises(TypeError, match=expected.format(found)) as raised:
            call()
        assert raised.value.__notes__ == [f"while processing '{argument}'"]
    with pytest.raises(TypeError) as raised:
        de.fill(np.zeros(2, dtype=np.float32), "1")
    assert raised.value.__notes__ == ["while processing 'value'"]
    # An `AttributeError` raised inside a producer's own `__dlpack__` is the producer's.
    class Broken:
        def __dlpack__(self, **kwargs):
            raise AttributeError("inside")

    with pytest.raises(AttributeError, match="inside"):
        de.total(Broken())


def test_consume_imports_any_rank_from_any_producer():
    consume = de.consume
    t = de.Tensor.arange(2, 3)
    assert consume(t) == 2
    assert consume(t.__dlpack__(max_version=(1, 3))) == 2
    assert consume(np.zeros(())) == 0
    assert consume(np.zeros((1,) * 8, dtype=np.int8)[..., ::-1]) == 8
    assert consume(np.arange(10.0)[::3]) == 1
    with pytest.raises(TypeError, match="expected a DLPack producer .* found `object`"):
        consume(object())


def test_c_exchange_api_called_from_c():
    # `managed_tensor_from_py_object_no_sync` called as a C consumer calls it: with the GIL,
    # outside any Rust frame (ctypes.PYFUNCTYPE keeps the GIL and raises a set exception).
    import ctypes
    import sys

    t = de.Tensor.arange(2, 3)
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    table = get_pointer(type(t).__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    # `DLPackExchangeAPI`: a 16-byte header, then `managed_tensor_from_py_object_no_sync` at 24.
    address = ctypes.c_void_p.from_address(table + 24).value
    from_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))(
        address
    )
    before = sys.getrefcount(t)
    for _ in range(100):
        out = ctypes.c_void_p()
        assert from_py(t, ctypes.byref(out)) == 0
        # `DLManagedTensorVersioned`: deleter at 16, flags at 24, `dl_tensor` at 32 (`ndim` at 48).
        assert ctypes.c_uint64.from_address(out.value + 24).value & 1, "read-only"
        assert ctypes.c_int32.from_address(out.value + 48).value == 2
        data = ctypes.c_void_p.from_address(out.value + 32).value
        assert (ctypes.c_float * 6).from_address(data)[:] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        # The deleter, called without the GIL (CFUNCTYPE releases it): it takes it to let go.
        deleter = ctypes.c_void_p.from_address(out.value + 16).value
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(out.value)
        # An object of another type is refused with BufferError (consumers fall back).
        with pytest.raises(BufferError):
            from_py(np.zeros(3), ctypes.byref(out))
    assert sys.getrefcount(t) == before


def test_exports_and_refusals_release_the_object():
    import sys

    t = de.Tensor.arange(4)
    before = sys.getrefcount(t)
    for _ in range(1000):
        np.from_dlpack(t)
        with pytest.raises(ValueError):
            t.__dlpack__(stream=1, max_version=(1, 0))
        with pytest.raises(BufferError):
            t.__dlpack__(max_version=(1, 0), dl_device=(10, 0))
        with pytest.raises(TypeError):
            t.__dlpack__(max_version="1.0")
    gc.collect()
    assert sys.getrefcount(t) == before


def test_rust_reads_numpy_in_place():
    assert de.total(np.arange(10.0)) == 45.0
    assert de.total(np.arange(10.0)[::-2]) == 25.0
    assert de.strides(np.arange(12.0).reshape(3, 4)[:, ::-1]) == ([3, 4], [4, -1])


def test_rust_writes_into_numpy():
    a = np.zeros((2, 2), dtype=np.float32)
    assert de.fill(a, 7.5) == 4
    assert a.tolist() == [[7.5, 7.5], [7.5, 7.5]]
    ro = np.zeros(2, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        de.fill(ro, 1.0)
    with pytest.raises(BufferError, match="dtype is float64, expected float32"):
        de.fill(np.zeros(2), 1.0)


def test_by_value_tensors_are_writable_once():
    o = de.ones(2, 2)
    a = np.from_dlpack(o)
    assert a.flags.writeable
    a[0, 0] = 3.0
    assert a.sum() == 6.0
    with pytest.raises(BufferError, match="already exported"):
        np.from_dlpack(o)


@pytest.mark.parametrize(
    "layout, view",
    [("c", lambda a: a), ("t", lambda a: a.T), ("reversed", lambda a: a[:, ::-1])],
)
def test_strided_views_and_their_copies(layout, view):
    a = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    s = de.Strided(5, 7, layout)
    shared = np.from_dlpack(s)
    np.testing.assert_array_equal(shared, view(a))
    assert not shared.flags.writeable
    copied = np.from_dlpack(s, copy=True)
    np.testing.assert_array_equal(copied, view(a))
    assert copied.flags.c_contiguous and copied.flags.writeable
    assert not np.shares_memory(copied, shared)


def test_strided_views_share_their_values():
    s = de.Strided(5, 7, "c")
    base = np.from_dlpack(s)
    for layout, view in [("c", base), ("t", base.T), ("reversed", base[:, ::-1])]:
        seen = np.from_dlpack(s.view(layout))
        np.testing.assert_array_equal(seen, view)
        assert np.shares_memory(seen, base)
    with pytest.raises(ValueError, match="expected"):
        s.view("diagonal")


def test_strided_refuses_an_unknown_layout():
    with pytest.raises(ValueError, match="expected"):
        de.Strided(2, 2, "diagonal")
