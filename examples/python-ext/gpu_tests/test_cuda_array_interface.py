"""The CUDA Array Interface (https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html),
both ways, with only NumPy: the extension's CUDA tensors export `__cuda_array_interface__`
(version 3), read here by a consumer written as the interface's "Synchronization" section
describes; and the extension's consumer (`from_dlpack`) reads objects written in Python that have
only that attribute, over device memory with work pending on a stream held by a gate.

Runs where `test_cuda_numpy.py` runs: on the CUDA driver simulator in the test command, where
every test must leave the happens-before checker with no violation (the negative controls below
show that it reports the dependencies left out), and on a GPU through `scripts/gpu-suite.sh`.
"""

import gc
import weakref

import numpy as np
import pytest

import dlpack_example as de
from test_cuda_numpy import (  # noqa: F401 (`no_violations` is the autouse checker fixture)
    SIMULATOR,
    TICKS,
    Ticker,
    _driver,
    _report,
    no_violations,
    while_a_thread_releases,
)

N = 1 << 14
GATE_TIMEOUT = 20.0


def expected():
    return np.arange(N, dtype=np.float32)


class CaiOnly:
    """A producer that speaks only the CUDA Array Interface: a dict over memory that `owner`
    keeps alive."""

    def __init__(self, owner, **fields):
        self._owner = owner
        self.__cuda_array_interface__ = fields


def over(x, **changes):
    """A version 3 CAI-only producer over the float32 vector `x` (a CudaTensor), naming x's
    stream; `changes` replace or (with value `...`) remove fields."""
    exported = x.__cuda_array_interface__
    fields = dict(
        shape=exported["shape"],
        typestr="<f4",
        data=(exported["data"][0], False),
        version=3,
        strides=None,
        stream=exported["stream"],
    )
    fields.update(changes)
    return CaiOnly(x, **{k: v for k, v in fields.items() if v is not ...})


def ready_on_host(x):
    """Waits (on the host) for x's pending write: for producers that name no stream."""
    de.cuda_synchronize_holding_gil(x.__cuda_array_interface__["stream"])


def to_host(obj):
    return np.from_dlpack(de.cuda_to_host(obj))


# Export: our tensors' `__cuda_array_interface__`.


def test_a_cuda_tensor_has_a_version_3_interface_naming_its_stream():
    x, gate = de.cuda_arange_gated(N, GATE_TIMEOUT)
    d = x.__cuda_array_interface__
    assert d["version"] == 3
    assert d["shape"] == (N,) and d["typestr"] == "<f4" and d["strides"] is None
    pointer, readonly = d["data"]
    assert pointer != 0 and readonly is True
    assert d["stream"] == gate.stream and d["stream"] not in (0, 1, 2)
    # Reading it did not wait for the held write.
    assert not de.cuda_stream_idle(gate.stream)
    gate.release()
    de.cuda_synchronize_holding_gil(gate.stream)


def test_a_host_tensor_has_no_interface():
    t = de.Tensor.arange(3)
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="expected CUDA memory"):
        t.__cuda_array_interface__


def test_a_cai_consumer_enqueuing_on_the_exported_stream_reads_after_the_write():
    # The consumer the interface describes: it enqueues its read on the stream it finds.
    x, gate = de.cuda_arange_gated(N, GATE_TIMEOUT)
    d = x.__cuda_array_interface__
    dst = de.CudaBuffer(N)
    dst.copy_from_pointer(d["data"][0], d["stream"])
    assert not de.cuda_stream_idle(d["stream"])
    gate.release()
    np.testing.assert_array_equal(dst.read(d["stream"]), expected())


def test_the_exported_stream_covers_the_work_of_a_second_stream_field():
    # The write is held on the tensor's second stream; the interface names the first, which it
    # made wait on the second (an event, no host wait).
    x, gate = de.cuda_arange_two_streams(N, GATE_TIMEOUT)
    first, second = x.streams
    assert second == gate.stream
    d = x.__cuda_array_interface__
    assert d["stream"] == first
    assert d["data"][0] == x.data_ptr
    dst = de.CudaBuffer(N)
    dst.copy_from_pointer(d["data"][0], d["stream"])
    assert not de.cuda_stream_idle(d["stream"]), "the exported stream does not wait for the second"
    gate.release()
    np.testing.assert_array_equal(dst.read(d["stream"]), expected())


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_cai_consumer_that_reads_on_another_stream():
    # The negative control: the same read enqueued on a stream the interface did not name.
    other = de.cuda_stream(1)
    x, gate = de.cuda_arange_two_streams(N, GATE_TIMEOUT)
    d = x.__cuda_array_interface__
    dst = de.CudaBuffer(N)
    dst.copy_from_pointer(d["data"][0], other)
    report = _report()
    gate.release()
    dst.read(other)
    assert _driver.cuSimViolations() >= 1, "the checker missed the unordered read"
    assert "cuMemcpyDtoDAsync" in report, report
    _driver.cuSimReset()


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_read_on_the_first_stream_without_the_interface():
    # The negative control of the two-stream test: the same read on the first stream, with the
    # pointer taken without reading the interface, so the first stream never waits on the
    # second.
    x, gate = de.cuda_arange_two_streams(N, GATE_TIMEOUT)
    first, _second = x.streams
    dst = de.CudaBuffer(N)
    dst.copy_from_pointer(x.data_ptr, first)
    report = _report()
    gate.release()
    dst.read(first)
    assert _driver.cuSimViolations() >= 1, "the checker missed the read the interface orders"
    assert "cuMemcpyDtoDAsync" in report, report
    _driver.cuSimReset()


def test_a_relay_exports_the_legacy_stream_after_its_events():
    s0 = de.cuda_stream(0)
    relay = de.cuda_relay(de.cuda_arange(N), s0)
    d = relay.__cuda_array_interface__
    assert d["stream"] == 1
    dst = de.CudaBuffer(N)
    dst.copy_from_pointer(d["data"][0], 1)
    np.testing.assert_array_equal(dst.read(1), expected())


# Import: objects that have only `__cuda_array_interface__`.


def test_our_consumer_orders_its_stream_after_a_cai_producer_without_blocking():
    s = de.cuda_stream(0)
    x, gate = de.cuda_arange_gated(N, GATE_TIMEOUT)
    producer = over(x, stream=gate.stream)
    dst = de.CudaBuffer(N)
    keep = dst.copy_from(producer, s)
    # The import returned and the copy is enqueued behind the held write.
    assert not de.cuda_stream_idle(s)
    gate.release()
    np.testing.assert_array_equal(dst.read(s), expected())
    del keep


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_an_import_with_the_wait_turned_off():
    # The negative control: the unsafe opt-out leaves the consumer's stream unordered.
    s = de.cuda_stream(0)
    x, gate = de.cuda_arange_gated(N, GATE_TIMEOUT)
    dst = de.CudaBuffer(N)
    keep = dst.copy_from(over(x, stream=gate.stream), s, cai_sync=False)
    report = _report()
    gate.release()
    dst.read(s)
    del keep
    assert _driver.cuSimViolations() >= 1, "the checker missed the unordered import"
    assert "cuMemcpyDtoDAsync" in report, report
    _driver.cuSimReset()


@pytest.mark.parametrize("stream", ["created", 1, 2], ids=["created", "legacy", "per_thread"])
def test_cuda_sum_takes_a_cai_only_object(stream):
    s = de.cuda_stream() if stream == "created" else stream
    x = de.cuda_arange(N)
    assert de.cuda_sum(over(x), s) == float(expected().astype(np.float64).sum())


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_version_is_read(version):
    x = de.cuda_arange(N)
    ready_on_host(x)
    fields = dict(version=version, stream=...)
    if version == 0:
        fields["strides"] = ...
    np.testing.assert_array_equal(to_host(over(x, **fields)), expected())


def test_a_host_consumer_waits_with_the_gil_released():
    # `host_sum` imports for the host (device=CPU): it waits on the host for the exported
    # stream, during which a Python thread opens the gate.
    x, gate = de.cuda_arange_gated(N, GATE_TIMEOUT)
    producer = over(x, stream=gate.stream)
    with Ticker() as ticker:
        total, ticks = while_a_thread_releases(ticker, gate, lambda: de.host_sum(producer))
    assert ticks >= TICKS, f"the ticker ran only {ticks} times during the wait"
    assert total == float(expected().astype(np.float64).sum())


def test_shape_and_strides_as_lists_are_read():
    x = de.cuda_arange(N)
    np.testing.assert_array_equal(to_host(over(x, shape=[N], strides=[4])), expected())


def test_a_stream_of_none_or_absent_means_nothing_to_wait_for():
    x = de.cuda_arange(N)
    ready_on_host(x)
    np.testing.assert_array_equal(to_host(over(x, stream=None)), expected())


def test_explicit_and_negative_strides_are_read_in_order():
    x = de.cuda_arange(N)
    pointer = x.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(to_host(over(x, strides=(4,))), expected())
    np.testing.assert_array_equal(
        to_host(over(x, shape=(N // 2,), strides=(8,))), expected()[::2]
    )
    reversed_ = over(x, data=(pointer + (N - 1) * 4, False), strides=(-4,))
    np.testing.assert_array_equal(to_host(reversed_), expected()[::-1])
    grid = over(x, shape=(4, N // 4), strides=(N, 4))
    np.testing.assert_array_equal(to_host(grid), expected().reshape(4, N // 4))
    fortran = over(x, shape=(N // 4, 4), strides=(4, N))
    np.testing.assert_array_equal(to_host(fortran), expected().reshape(4, N // 4).T)


@pytest.mark.parametrize(
    "typestr, dtype",
    [("|b1", np.bool_), ("|i1", np.int8), ("<i2", np.int16), ("<i4", np.int32), ("<i8", np.int64),
     ("|u1", np.uint8), ("<u2", np.uint16), ("<u4", np.uint32), ("<u8", np.uint64),
     ("<f2", np.float16), ("<f4", np.float32), ("<f8", np.float64), ("<c8", np.complex64),
     ("<c16", np.complex128)],
)
def test_every_typestr_reads_the_bytes_as_its_dtype(typestr, dtype):
    x = de.cuda_arange(N)
    size = np.dtype(dtype).itemsize
    got = to_host(over(x, typestr=typestr, shape=(N * 4 // size,)))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(np.uint8), expected().view(np.uint8))


def test_an_empty_array_with_pointer_0_is_read():
    x = de.cuda_arange(N)
    for shape in [(0,), (2, 0, 3)]:
        got = to_host(over(x, shape=shape, data=(0, False), stream=None))
        assert got.shape == shape and got.dtype == np.float32


def test_the_read_only_flag_is_kept():
    x = de.cuda_arange(N)
    pointer = x.__cuda_array_interface__["data"][0]
    assert de.cuda_is_read_only(over(x, data=(pointer, True)))
    assert not de.cuda_is_read_only(over(x, data=(pointer, False)))


@pytest.mark.parametrize(
    "changes, error, match",
    [
        (dict(mask=object()), BufferError, "masked arrays are not supported"),
        (dict(descr=[("re", "<f2"), ("im", "<f2")]), BufferError, "structured type"),
        (dict(typestr=">f4"), BufferError, "big-endian"),
        (dict(typestr="|O8"), BufferError, "has no DLPack data type"),
        (dict(stream=0), ValueError, "stream 0 is not allowed"),
        (dict(version=4), ValueError, "version 4"),
        (dict(shape=(-1,)), ValueError, "extent -1"),
        (dict(strides=(6,)), ValueError, "not a multiple of the item size"),
        (dict(strides=(4, 4)), ValueError, "2 strides for 1 axes"),
        (dict(shape=(2**62,)), ValueError, "overflows"),
        (dict(data=(0, False)), ValueError, "data pointer is 0"),
        (dict(shape=...), TypeError, "no `shape`"),
        (dict(typestr=4), TypeError, "`typestr` is an int, expected a str"),
        (dict(data=[1, False]), TypeError, "`data` is a list"),
        (dict(data=(4096,)), TypeError,
         r"`data` is a tuple of 1 item, expected a tuple of 2 items \(pointer, readonly\)"),
        (dict(data=(4096, False, 0)), TypeError, "`data` is a tuple of 3 items"),
        (dict(data=(4096, 0)), TypeError, r"`data\[1\]` is an int, expected a bool"),
        (dict(data=("4096", False)), TypeError, r"`data\[0\]` is a str, expected an int"),
        (dict(descr=[("", "<f8")]), ValueError,
         r"descr \[\('', \"<f8\"\)\] contradicts typestr \"<f4\""),
        (dict(shape=(1,) * 65), BufferError,
         "^__cuda_array_interface__ cannot be imported: `ndim` is 65, expected at most 64"),
    ],
)
def test_every_field_rule_is_a_typed_error(changes, error, match):
    x = de.cuda_arange(N)
    with pytest.raises(error, match=match):
        to_host(over(x, **changes))


def small_over(**changes):
    """`over` a 10-element float32 vector (a 40-byte allocation), and its pointer."""
    x = de.cuda_arange(10)
    pointer = x.__cuda_array_interface__["data"][0]
    changes = {k: v(pointer) if callable(v) else v for k, v in changes.items()}
    return over(x, **changes), pointer


@pytest.mark.parametrize(
    "changes, start, end",
    [
        (dict(shape=(1000,)), 0, 4000),
        (dict(data=lambda p: (p + 36, False), shape=(2,)), 36, 44),
        (dict(shape=(2,), strides=(2**62,)), 0, 2**62 + 4),
        (dict(strides=(-4,)), -36, 4),
    ],
    ids=["too_long", "one_past_the_end", "huge_stride", "negative_stride_below_the_start"],
)
def test_a_layout_reaching_past_its_allocation_is_refused_at_import(changes, start, end):
    producer, pointer = small_over(**changes)
    match = (
        rf"reach bytes \[{pointer + start:#x}, {pointer + end:#x}\), outside the CUDA allocation "
        rf"\[{pointer:#x}, {pointer + 40:#x}\)"
    )
    with pytest.raises(ValueError, match=match):
        de.cuda_to_host(producer)


def test_in_bounds_negative_stride_views_read_the_right_values():
    values = np.arange(10, dtype=np.float32)
    reversed_, _ = small_over(data=lambda p: (p + 36, False), strides=(-4,))
    np.testing.assert_array_equal(to_host(reversed_), values[::-1])
    odd_down, _ = small_over(data=lambda p: (p + 36, False), shape=(5,), strides=(-8,))
    np.testing.assert_array_equal(to_host(odd_down), values[::-2])
    grid, _ = small_over(data=lambda p: (p + 20, False), shape=(2, 5), strides=(-20, 4))
    np.testing.assert_array_equal(to_host(grid), values.reshape(2, 5)[::-1])


def test_an_empty_array_needs_no_allocation():
    for shape in [(0,), (0, 1000)]:
        empty, _ = small_over(shape=shape, stream=None)
        got = to_host(empty)
        assert got.shape == shape and got.dtype == np.float32


def host_pointer():
    host = np.arange(16, dtype=np.float32)
    return host, host.ctypes.data


@pytest.mark.parametrize("kind", ["small_integer", "numpy_host"])
def test_a_pointer_the_driver_does_not_know_names_the_data_field(kind):
    x = de.cuda_arange(N)
    keep, pointer = (None, 0x1000) if kind == "small_integer" else host_pointer()
    producer = over(x, data=(pointer, False), shape=(4,), stream=None)
    match = (
        rf"the `data` pointer {pointer:#x} of the __cuda_array_interface__ is not CUDA device "
        "memory the driver knows"
    )
    with pytest.raises(BufferError, match=match):
        de.cuda_to_host(producer)
    del keep


@pytest.mark.skipif(
    not SIMULATOR, reason="a GPU's stream-ordered memory pool may keep freed memory mapped"
)
def test_a_freed_pointer_names_the_data_field():
    x = de.cuda_arange(10)
    exported = x.__cuda_array_interface__
    pointer = exported["data"][0]
    ready_on_host(x)
    owner = de.cuda_arange(10)
    del x
    gc.collect()
    freed = CaiOnly(owner, shape=(10,), typestr="<f4", data=(pointer, False), version=3)
    with pytest.raises(BufferError, match=rf"the `data` pointer {pointer:#x} .* is not CUDA"):
        de.cuda_to_host(freed)


def test_a_stream_the_driver_does_not_know_names_the_stream_field():
    x = de.cuda_arange(N)
    ready_on_host(x)
    match = (
        "the `stream` 0xdeadbeef of the __cuda_array_interface__ is not a CUDA stream the "
        "driver knows"
    )
    with pytest.raises(BufferError, match=match):
        de.cuda_to_host(over(x, stream=0xDEADBEEF))


def test_the_trivial_descr_is_accepted():
    x = de.cuda_arange(N)
    np.testing.assert_array_equal(to_host(over(x, descr=[("", "<f4")])), expected())


def test_the_import_keeps_the_producer_alive_and_releases_it_once():
    s = de.cuda_stream(0)
    x = de.cuda_arange(N)
    producer = over(x)
    alive = weakref.ref(producer)
    dst = de.CudaBuffer(N)
    keep = dst.copy_from(producer, s)
    del producer, x
    gc.collect()
    assert alive() is not None, "the producer was freed while its memory is imported"
    np.testing.assert_array_equal(dst.read(s), expected())
    del keep
    gc.collect()
    assert alive() is None


class Both:
    """A producer with `__dlpack__` and a `__cuda_array_interface__` that cannot be read."""

    def __init__(self, inner):
        self.inner = inner
        self.__cuda_array_interface__ = {"version": 99}

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self.inner.__dlpack__(**kwargs)


def test_dlpack_is_preferred_where_both_exist():
    x = de.cuda_arange(N)
    np.testing.assert_array_equal(to_host(Both(x)), expected())
