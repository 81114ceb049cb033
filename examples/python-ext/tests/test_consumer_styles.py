"""Consumers that take our capsules other ways than the rename protocol of the DLPack Python
specification, emulated through the C API with ctypes:

* nanobind: takes the pointer out of the capsule, clears the capsule's destructor (the capsule
  keeps its name) and calls the deleter itself when its array dies, possibly long after the
  capsule is gone;
* mpi4py: calls ``__dlpack__(max_version=(1, 0), copy=False)`` (with ``stream=-1`` on
  devices), reads the pointer without renaming the capsule and keeps the capsule as the owner
  of the buffer: the capsule's destructor runs the deleter when it dies;
* a consumer that passes no ``max_version`` for read-only data (nanobind does for read-only
  views): what a read-only export answers.

In each, the deleter must run exactly once, and not before the consumer's last use. For the
shared exports of a frozen pyclass (``de.Tensor``, ``de.Strided``) the deleter releases the
reference the export holds: ``sys.getrefcount`` of the producer is above its baseline while
the export lives and back to it afterwards (a second call would take it below). For the
by-value exports of ``de.ones`` (and for the copies a legacy request gets) the deleter frees
the tensor's memory: with 64 MiB tensors, which glibc maps and unmaps on their own, the resident
set size shows when that happens.
"""

import ctypes
import gc
import os
import sys

import numpy as np
import pytest

import dlpack_example as de

# ---------------------------------------------------------------------------------------------
# dlpack.h, as ctypes structures


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),  # void (*)(DLManagedTensorVersioned *)
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),  # void (*)(DLManagedTensor *)
    ]


READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED
CPU = (1, 0)
FLOAT32 = (2, 32, 1)  # kDLFloat, 32 bits, 1 lane

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetDestructor.restype = ctypes.c_int
_api.PyCapsule_SetDestructor.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_name(capsule):
    return _api.PyCapsule_GetName(capsule)


def take_pointer(capsule, name):
    """`PyCapsule_GetPointer` under `name` (checked first, as mpi4py does with
    `PyCapsule_IsValid`), without renaming: the managed tensor's address."""
    assert _api.PyCapsule_IsValid(capsule, name) == 1, capsule_name(capsule)
    pointer = _api.PyCapsule_GetPointer(capsule, name)
    assert pointer
    return pointer


def versioned(pointer):
    return DLManagedTensorVersioned.from_address(pointer)


def legacy(pointer):
    return DLManagedTensor.from_address(pointer)


def call_deleter(managed, pointer, gil):
    """Calls `managed.deleter(pointer)` as a C consumer does: with the GIL held
    (`PYFUNCTYPE`, as nanobind frees an array from Python), or without it (`CFUNCTYPE` releases
    it around the call, as a consumer freeing from a worker thread)."""
    prototype = ctypes.PYFUNCTYPE if gil else ctypes.CFUNCTYPE
    prototype(None, ctypes.c_void_p)(managed.deleter)(pointer)


def describe(dl):
    """(device, dtype, shape, strides in elements or None) of a `DLTensor`."""
    shape = [dl.shape[i] for i in range(dl.ndim)]
    strides = [dl.strides[i] for i in range(dl.ndim)] if dl.strides else None
    return (
        (dl.device.device_type, dl.device.device_id),
        (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes),
        shape,
        strides,
    )


def element_address(dl, index):
    _, _, shape, strides = describe(dl)
    if strides is None:  # compact row-major
        strides, step = [], 1
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
    return dl.data + dl.byte_offset + 4 * sum(i * s for i, s in zip(index, strides))


def read_float32(dl):
    """The float32 elements of `dl` in logical (row-major) order, read through its strides."""
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == FLOAT32
    shape = [dl.shape[i] for i in range(dl.ndim)]
    return [
        ctypes.c_float.from_address(element_address(dl, index)).value
        for index in np.ndindex(*shape)
    ]


def write_float32(dl, index, value):
    ctypes.c_float.from_address(element_address(dl, index)).value = value


# ---------------------------------------------------------------------------------------------
# Seeing a by-value tensor's memory freed: 64 MiB, above glibc's largest mmap threshold
# (32 MiB), is mapped on its own and unmapped by free().

BIG = 16 << 20  # float32 elements: 64 MiB
MIB = 1 << 20


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


needs_rss = pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm (Linux)"
)


class Resident:
    """The resident set size relative to where it was made, in MiB."""

    def __init__(self):
        gc.collect()
        self.start = _rss()

    def mib(self):
        return (_rss() - self.start) / MIB

    def assert_held(self):
        assert self.mib() > 48, f"64 MiB tensor not resident: {self.mib():.1f} MiB"

    def assert_freed(self):
        assert self.mib() < 16, f"64 MiB tensor not freed: {self.mib():.1f} MiB still resident"


# ---------------------------------------------------------------------------------------------
# nanobind: pointer taken, destructor cleared, the deleter called by the consumer


@pytest.mark.parametrize("gil", [True, False], ids=["deleter-with-gil", "deleter-without-gil"])
def test_nanobind_style_versioned_export_of_a_pyclass(gil):
    t = de.Tensor.arange(2, 3)
    baseline = sys.getrefcount(t)
    capsule = t.__dlpack__(max_version=(1, 0))
    assert capsule_name(capsule) == b"dltensor_versioned"
    pointer = take_pointer(capsule, b"dltensor_versioned")
    assert _api.PyCapsule_SetDestructor(capsule, None) == 0
    assert capsule_name(capsule) == b"dltensor_versioned", "not renamed"
    managed = versioned(pointer)
    assert (managed.version.major, managed.version.minor) == (1, 3)
    assert managed.flags & READ_ONLY
    device, dtype, shape, strides = describe(managed.dl_tensor)
    assert (device, dtype, shape) == (CPU, FLOAT32, [2, 3])
    assert strides in (None, [3, 1])
    assert read_float32(managed.dl_tensor) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert sys.getrefcount(t) == baseline + 1, "the export keeps the tensor alive"
    call_deleter(managed, pointer, gil)
    assert sys.getrefcount(t) == baseline, "the deleter released the tensor"
    del capsule, managed
    gc.collect()
    assert sys.getrefcount(t) == baseline, "the capsule (destructor cleared) did not delete again"
    assert t.sum() == 15.0


def test_nanobind_style_export_outlives_its_capsule():
    # nanobind keeps the managed tensor in its array, not the capsule: the capsule dies first,
    # the data is read afterwards, and the deleter runs when the array dies.
    s = de.Strided(3, 4, "reversed")
    baseline = sys.getrefcount(s)
    capsule = s.__dlpack__(max_version=(1, 0))
    pointer = take_pointer(capsule, b"dltensor_versioned")
    assert _api.PyCapsule_SetDestructor(capsule, None) == 0
    del capsule
    gc.collect()
    assert sys.getrefcount(s) == baseline + 1, "the export outlives its capsule"
    managed = versioned(pointer)
    assert describe(managed.dl_tensor)[2:] == ([3, 4], [4, -1])
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]
    assert read_float32(managed.dl_tensor) == expected.ravel().tolist()
    call_deleter(managed, pointer, gil=True)
    assert sys.getrefcount(s) == baseline


def test_nanobind_style_legacy_request_of_a_read_only_export_gets_a_copy():
    # `__dlpack__()` of a read-only export: a legacy capsule of a compact, writable copy (a
    # legacy header cannot say read-only), which holds no reference to the tensor.
    t = de.Tensor.arange(2, 3)
    baseline = sys.getrefcount(t)
    shared = t.__dlpack__(max_version=(1, 0))
    original_data = versioned(take_pointer(shared, b"dltensor_versioned")).dl_tensor.data
    del shared
    assert sys.getrefcount(t) == baseline
    capsule = t.__dlpack__()
    assert capsule_name(capsule) == b"dltensor"
    pointer = take_pointer(capsule, b"dltensor")
    assert _api.PyCapsule_SetDestructor(capsule, None) == 0
    managed = legacy(pointer)
    device, dtype, shape, strides = describe(managed.dl_tensor)
    assert (device, dtype, shape) == (CPU, FLOAT32, [2, 3])
    assert strides in (None, [3, 1])
    assert managed.dl_tensor.data != original_data, "a copy"
    assert sys.getrefcount(t) == baseline, "the copy does not hold the tensor"
    assert read_float32(managed.dl_tensor) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    write_float32(managed.dl_tensor, (1, 2), -1.0)
    assert read_float32(managed.dl_tensor)[-1] == -1.0
    assert np.from_dlpack(t).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "original intact"
    call_deleter(managed, pointer, gil=True)
    del capsule, managed
    gc.collect()
    assert sys.getrefcount(t) == baseline


@needs_rss
@pytest.mark.parametrize("gil", [True, False], ids=["deleter-with-gil", "deleter-without-gil"])
def test_nanobind_style_legacy_copy_is_freed_by_the_deleter_once(gil):
    t = de.Tensor.arange(BIG)
    resident = Resident()
    capsule = t.__dlpack__()
    pointer = take_pointer(capsule, b"dltensor")
    assert _api.PyCapsule_SetDestructor(capsule, None) == 0
    resident.assert_held()  # the copy
    managed = legacy(pointer)
    assert ctypes.c_float.from_address(managed.dl_tensor.data + 4 * (BIG - 1)).value == BIG - 1
    del capsule
    gc.collect()
    resident.assert_held()  # the capsule did not free it: its destructor was cleared
    call_deleter(managed, pointer, gil)
    resident.assert_freed()


@needs_rss
@pytest.mark.parametrize("max_version", [(1, 0), None], ids=["versioned", "legacy"])
def test_nanobind_style_by_value_export(max_version):
    resident = Resident()
    o = de.ones(BIG)
    resident.assert_held()
    capsule = o.__dlpack__(max_version=max_version)
    name = b"dltensor_versioned" if max_version else b"dltensor"
    assert capsule_name(capsule) == name
    pointer = take_pointer(capsule, name)
    assert _api.PyCapsule_SetDestructor(capsule, None) == 0
    managed = versioned(pointer) if max_version else legacy(pointer)
    if max_version:
        assert managed.flags == 0, "by value: writable, not a copy"
    assert describe(managed.dl_tensor)[:3] == (CPU, FLOAT32, [BIG])
    resident.assert_held()  # handed over as it is: no copy
    data = (ctypes.c_float * BIG).from_address(managed.dl_tensor.data + managed.dl_tensor.byte_offset)
    assert data[0] == data[BIG - 1] == 1.0
    data[BIG - 1] = 7.0
    assert data[BIG - 1] == 7.0
    del data
    with pytest.raises(BufferError, match="already exported"):
        o.__dlpack__(max_version=(1, 0))
    del o, capsule
    gc.collect()
    resident.assert_held()  # neither the exporter's nor the capsule's death freed it
    call_deleter(managed, pointer, gil=True)
    resident.assert_freed()


# ---------------------------------------------------------------------------------------------
# mpi4py: `__dlpack__(max_version=(1, 0), copy=False)`, pointer read without renaming, the
# capsule kept as the buffer's owner


@pytest.mark.parametrize(
    "make, shape, strides, values",
    [
        (lambda: de.Tensor.arange(2, 3), [2, 3], (None, [3, 1]), list(range(6))),
        (lambda: de.Strided(2, 3, "t"), [3, 2], ([1, 3],), [0, 3, 1, 4, 2, 5]),
        (lambda: de.Strided(2, 3, "reversed"), [2, 3], ([3, -1],), [2, 1, 0, 5, 4, 3]),
    ],
    ids=["tensor", "strided-transposed", "strided-reversed"],
)
def test_mpi4py_style_capsule_owns_the_buffer(make, shape, strides, values):
    x = make()
    baseline = sys.getrefcount(x)
    device_type, _ = x.__dlpack_device__()
    assert device_type == 1  # CPU: mpi4py passes no stream
    capsule = x.__dlpack__(max_version=(1, 0), copy=False)
    pointer = take_pointer(capsule, b"dltensor_versioned")
    assert capsule_name(capsule) == b"dltensor_versioned", "not renamed"
    managed = versioned(pointer)
    assert managed.version.major == 1
    assert managed.flags & READ_ONLY, "mpi4py refuses it as a receive buffer from this flag"
    assert not managed.flags & IS_COPIED
    device, dtype, got_shape, got_strides = describe(managed.dl_tensor)
    assert (device, dtype, got_shape) == (CPU, FLOAT32, shape)
    assert got_strides in strides
    # The capsule is the owner while the buffer is used (a Py_buffer whose `obj` is the
    # capsule): the producer stays alive meanwhile.
    for _ in range(3):
        gc.collect()
        assert sys.getrefcount(x) == baseline + 1
        assert read_float32(managed.dl_tensor) == [float(v) for v in values]
    del managed
    del capsule  # the capsule's destructor runs the deleter
    assert sys.getrefcount(x) == baseline
    gc.collect()
    assert sys.getrefcount(x) == baseline


def test_mpi4py_style_capsule_then_a_spec_consumer():
    # A capsule read without renaming is still a valid capsule: a consumer that follows the
    # rename protocol may take it afterwards, and the deleter then runs once, from that
    # consumer, not from the capsule's destructor.
    t = de.Tensor.arange(4)
    baseline = sys.getrefcount(t)
    capsule = t.__dlpack__(max_version=(1, 0), copy=False)
    managed = versioned(take_pointer(capsule, b"dltensor_versioned"))
    assert read_float32(managed.dl_tensor) == [0.0, 1.0, 2.0, 3.0]
    del managed
    assert de.consume(capsule) == 1
    assert capsule_name(capsule) == b"used_dltensor_versioned"
    assert sys.getrefcount(t) == baseline, "the consumer's import was dropped: deleter ran"
    del capsule
    gc.collect()
    assert sys.getrefcount(t) == baseline


def test_mpi4py_style_stream_minus_one_is_for_devices_only():
    # mpi4py passes `stream=-1` for device buffers only; on CPU our producers refuse any
    # stream, before exporting anything.
    t = de.Tensor.arange(3)
    baseline = sys.getrefcount(t)
    for kwargs in [{}, {"copy": False}]:
        with pytest.raises(ValueError, match="stream=-1 is not valid for a consumer on cpu:0"):
            t.__dlpack__(stream=-1, max_version=(1, 0), **kwargs)
    assert sys.getrefcount(t) == baseline
    o = de.ones(3)
    with pytest.raises(ValueError, match="stream=-1 is not valid"):
        o.__dlpack__(stream=-1, max_version=(1, 0), copy=False)
    assert "exported=False" in repr(o), "a refused call does not take the by-value tensor"
    capsule = o.__dlpack__(max_version=(1, 0), copy=False)
    assert read_float32(versioned(take_pointer(capsule, b"dltensor_versioned")).dl_tensor) == [
        1.0
    ] * 3


@needs_rss
def test_mpi4py_style_by_value_receive_buffer():
    # What mpi4py does with a receive buffer: a writable export, written through the pointer
    # while the capsule owns it; the capsule's death frees it, once.
    resident = Resident()
    capsule = de.ones(BIG).__dlpack__(max_version=(1, 0), copy=False)
    pointer = take_pointer(capsule, b"dltensor_versioned")
    managed = versioned(pointer)
    assert not managed.flags & READ_ONLY
    data = (ctypes.c_float * BIG).from_address(managed.dl_tensor.data + managed.dl_tensor.byte_offset)
    ctypes.memset(data, 0, 4 * BIG)
    data[BIG // 2] = 3.5
    assert (data[0], data[BIG // 2], data[BIG - 1]) == (0.0, 3.5, 0.0)
    del data, managed
    gc.collect()
    resident.assert_held()
    del capsule
    resident.assert_freed()


# ---------------------------------------------------------------------------------------------
# No `max_version` for read-only data


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: de.Tensor.arange(2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
        (lambda: de.Strided(2, 3, "c"), np.arange(6, dtype=np.float32).reshape(2, 3)),
        (lambda: de.Strided(2, 3, "t"), np.arange(6, dtype=np.float32).reshape(2, 3).T),
        (
            lambda: de.Strided(2, 3, "reversed"),
            np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::-1],
        ),
        (
            lambda: de.any_relay(np.arange(12, dtype=np.float32)[::2]),
            np.arange(12, dtype=np.float32)[::2],
        ),
    ],
    ids=["tensor", "strided-c", "strided-transposed", "strided-reversed", "relay-strided"],
)
def test_no_max_version_on_read_only_data_is_a_compact_writable_copy(make, expected):
    x = make()
    baseline = sys.getrefcount(x)
    with pytest.raises(BufferError, match="legacy"):
        x.__dlpack__(copy=False)
    assert sys.getrefcount(x) == baseline
    capsule = x.__dlpack__()
    assert capsule_name(capsule) == b"dltensor"
    managed = legacy(take_pointer(capsule, b"dltensor"))
    device, dtype, shape, strides = describe(managed.dl_tensor)
    assert (device, dtype, shape) == (CPU, FLOAT32, list(expected.shape))
    compact = [int(s) // 4 for s in np.empty(expected.shape, dtype=np.float32).strides]
    assert strides in (None, compact), "compact row-major"
    assert read_float32(managed.dl_tensor) == expected.ravel().tolist()
    assert sys.getrefcount(x) == baseline, "a copy: the tensor is not held"
    # Writable, and writing never reaches the original.
    write_float32(managed.dl_tensor, (0,) * len(shape), 100.0)
    assert read_float32(managed.dl_tensor)[0] == 100.0
    np.testing.assert_array_equal(np.from_dlpack(x), expected)
    del managed
    # The spec consumer takes it as it is.
    assert de.consume(capsule) == len(shape)
    del capsule
    gc.collect()
    assert sys.getrefcount(x) == baseline


# ---------------------------------------------------------------------------------------------
# The READ_ONLY flag


@pytest.mark.parametrize(
    "make",
    [
        lambda: de.Tensor.arange(3),
        lambda: de.Strided(2, 3, "c"),
        lambda: de.Strided(2, 3, "t"),
        lambda: de.Strided(2, 3, "reversed"),
        lambda: de.any_relay(np.arange(6.0)),
        lambda: de.any_relay(np.arange(6, dtype=np.int32)[::3]),
    ],
    ids=["tensor", "strided-c", "strided-t", "strided-reversed", "relay-f64", "relay-i32"],
)
def test_read_only_flag_of_shared_exports(make):
    x = make()
    for kwargs in [{}, {"copy": False}, {"copy": None}]:
        capsule = x.__dlpack__(max_version=(1, 0), **kwargs)
        flags = versioned(take_pointer(capsule, b"dltensor_versioned")).flags
        assert flags & READ_ONLY, kwargs
        assert not flags & IS_COPIED, kwargs
    # A copy is the consumer's own: writable, and flagged as a copy.
    capsule = x.__dlpack__(max_version=(1, 0), copy=True)
    assert versioned(take_pointer(capsule, b"dltensor_versioned")).flags == IS_COPIED


def test_read_only_flag_is_clear_on_by_value_exports():
    capsule = de.ones(2, 3).__dlpack__(max_version=(1, 0))
    assert versioned(take_pointer(capsule, b"dltensor_versioned")).flags == 0
    capsule = de.ones(2, 3).__dlpack__(max_version=(1, 0), copy=True)
    assert versioned(take_pointer(capsule, b"dltensor_versioned")).flags == IS_COPIED
