"""Producers whose C exchange API (`__dlpack_c_exchange_api__`, `DLPackExchangeAPI` in
dlpack.h) fails without setting a Python exception.

dlpack.h asks `managed_tensor_from_py_object_no_sync` for "NULL/-1 on failure with a Python
exception set"; some producers return -1 with none set (cuda.core's `StridedMemoryView` for a
bfloat16 view). The consumer takes such a failure as a refusal of the C path and asks
`__dlpack__`; when that fails too, the error names the producer's type.

The stand-in producers publish a table built with ctypes whose
`managed_tensor_from_py_object_no_sync` returns -1 and sets nothing (a `CFUNCTYPE` callback:
ctypes takes the GIL for it and leaves no exception behind), and delegate `__dlpack__` and
`__dlpack_device__` to a NumPy array.
"""

import ctypes

import numpy as np
import pytest

import dlpack_example as de


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLPackExchangeAPIHeader(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", ctypes.c_void_p)]


# `DLPackManagedTensorFromPyObjectNoSync`: (PyObject *py_object, DLManagedTensorVersioned **out).
FROM_PY_OBJECT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


class DLPackExchangeAPI(ctypes.Structure):
    # The functions this stand-in never serves are NULL; a consumer needs the header and
    # `managed_tensor_from_py_object_no_sync`.
    _fields_ = [
        ("header", DLPackExchangeAPIHeader),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", FROM_PY_OBJECT),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


assert ctypes.sizeof(DLPackExchangeAPI) == 56

# Calls of the table's `managed_tensor_from_py_object_no_sync`.
CALLS = []


@FROM_PY_OBJECT
def fail_silently(py_object, out):
    CALLS.append(py_object)
    return -1


# Kept alive for the whole process, as dlpack.h requires of a published table: the callback,
# the table (at an address a multiple of 8, as a table of pointers is) and the capsule's name.
TABLE = DLPackExchangeAPI(
    header=DLPackExchangeAPIHeader(version=DLPackVersion(1, 3)),
    managed_tensor_from_py_object_no_sync=fail_silently,
)
assert ctypes.addressof(TABLE) % 8 == 0
CAPSULE_NAME = ctypes.create_string_buffer(b"dlpack_exchange_api")

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


class SilentExchange:
    """A producer whose C exchange API fails without an exception, and whose `__dlpack__`
    serves NumPy's export of its array."""

    __dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(TABLE), ctypes.addressof(CAPSULE_NAME), None)

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class SilentExchangeNoDunder(SilentExchange):
    """As `SilentExchange`, with a `__dlpack__` that refuses too."""

    def __dlpack__(self, **kwargs):
        raise BufferError("this stand-in exports nothing")


def test_the_stand_in_publishes_a_table_the_consumer_uses():
    capsule = SilentExchange.__dlpack_c_exchange_api__
    assert type(capsule).__name__ == "PyCapsule"
    assert "dlpack_exchange_api" in repr(capsule)
    # Tried once per import: the consumer prefers the table where no option is asked.
    before = len(CALLS)
    de.total(SilentExchange(np.arange(5.0)))
    assert len(CALLS) == before + 1


def test_a_silent_failure_falls_back_to_dunder_dlpack():
    a = np.arange(5.0)
    x = SilentExchange(a)
    for _ in range(2):
        assert de.total(x) == 10.0
        assert de.consume(x) == 1
    # Zero-copy, through NumPy's `__dlpack__`: the array's own memory, read-only in the relay.
    r = de.any_relay(x)
    assert r.data_ptr == a.ctypes.data
    assert r.layout == ([5], [1])
    assert np.array_equal(np.from_dlpack(r), a)
    # Writes through the fallback reach the array.
    b = np.zeros(3, dtype=np.float32)
    assert de.fill(SilentExchange(b), 2.0) == 3
    assert np.array_equal(b, np.full(3, 2.0, dtype=np.float32))


def test_the_fallback_leaves_no_exception_behind():
    # An exception left set by the failed call would surface in a later, unrelated call.
    x = SilentExchange(np.arange(3.0))
    assert de.total(x) == 3.0
    assert [i * 2 for i in range(3)] == [0, 2, 4]
    assert de.total(np.arange(4.0)) == 6.0


def test_when_dunder_dlpack_fails_too_the_error_names_the_producer():
    x = SilentExchangeNoDunder(np.arange(3.0))
    for import_ in (de.total, de.consume, de.any_relay):
        with pytest.raises(BufferError) as raised:
            import_(x)
        message = str(raised.value)
        assert "SilentExchangeNoDunder" in message
        assert "C exchange API" in message and "without setting a Python exception" in message
        # ... and what `__dlpack__` said, kept as the cause.
        assert "this stand-in exports nothing" in message
        assert isinstance(raised.value.__cause__, BufferError)
        assert "this stand-in exports nothing" in str(raised.value.__cause__)


def test_options_skip_the_table():
    # With `copy` asked, the consumer calls `__dlpack__` without trying the table.
    before = len(CALLS)
    r = de.any_relay(SilentExchange(np.arange(4.0)), copy=False)
    assert r.layout == ([4], [1])
    assert len(CALLS) == before
