"""CUDA tests of the example extension (built with `--features cuda`) that need only NumPy: no
PyTorch, no CuPy.

They run in two places:

* in the test command (`scripts/test.sh`), on the CUDA driver simulator (crate `cuda-sim`, whose
  `libcuda.so` is put first on `LD_LIBRARY_PATH`), with no GPU: there, after each test, the
  simulator's happens-before checker must report no violation (a copy or free not ordered after
  the work it depends on);
* on a GPU machine, through `scripts/gpu-suite.sh run`, against the real driver (which has no
  checker, so only the values are checked).

N is moderate because the simulator runs every copy on the CPU.
"""

import ctypes
import os
import threading
import time

import numpy as np
import pytest

import dlpack_example as de

N = 1 << 16

CU_STREAM_LEGACY = 1  # DLPack's `stream=1`: the legacy default stream
CU_STREAM_PER_THREAD = 2  # DLPack's `stream=2`: the per-thread default stream

if not hasattr(de, "cuda_arange"):
    raise ImportError("dlpack_example was built without `--features cuda`; these tests need it")


def _load_driver():
    """The CUDA driver library the extension loads (cudarc tries libcuda.so before
    libcuda.so.1; in the simulator's directory both name the same file)."""
    for name in ("libcuda.so", "libcuda.so.1"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no CUDA driver library (libcuda.so) on the library path: put the simulator's "
                  "directory (printed by scripts/cuda-sim.sh) first on LD_LIBRARY_PATH, or run on "
                  "a GPU machine")


_driver = _load_driver()
SIMULATOR = hasattr(_driver, "cuSimViolations")
if SIMULATOR:
    _driver.cuSimViolations.restype = ctypes.c_uint64
    _driver.cuSimViolations.argtypes = []
    _driver.cuSimReset.restype = None
    _driver.cuSimReset.argtypes = []
    _driver.cuSimReport.restype = ctypes.c_size_t
    _driver.cuSimReport.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _report():
    length = _driver.cuSimReport(None, 0)
    buf = ctypes.create_string_buffer(length + 1)
    _driver.cuSimReport(buf, length + 1)
    return buf.value.decode(errors="replace")


def _mapped_drivers():
    """The distinct libcuda files mapped into this process (Linux), resolved."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "libcuda.so" in line}
    except OSError:
        return set()
    return {os.path.realpath(p) for p in paths if p.startswith("/")}


@pytest.fixture(autouse=True)
def no_violations():
    """On the simulator: starts each test with a clean checker and fails it on any violation."""
    if SIMULATOR:
        _driver.cuSimReset()
    yield
    if SIMULATOR:
        drivers = _mapped_drivers()
        assert len(drivers) <= 1, f"two CUDA drivers mapped, the checker may watch the wrong one: {drivers}"
        count = _driver.cuSimViolations()
        assert count == 0, f"{count} happens-before violation(s) in the CUDA simulator:\n{_report()}"


def expected():
    return np.arange(N, dtype=np.float32)


def expected_sum():
    return float(expected().astype(np.float64).sum())


def test_numpy_gets_a_host_copy_of_a_rust_cuda_tensor():
    # NumPy asks for dl_device=(CPU, 0): the producer copies to the host after its pending work.
    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 1):
        pytest.skip(f"numpy {np.__version__} has no from_dlpack(device=...) (numpy >= 2.1 does)")
    host = np.from_dlpack(de.cuda_arange(N), device="cpu")
    assert host.flags.writeable
    assert host.dtype == np.float32 and host.shape == (N,)
    np.testing.assert_array_equal(host, expected())


def test_numpy_host_copy_with_copy_true_and_refusal_without_copy():
    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 1):
        pytest.skip(f"numpy {np.__version__} has no from_dlpack(device=...) (numpy >= 2.1 does)")
    host = np.from_dlpack(de.cuda_arange(N), device="cpu", copy=True)
    assert host.flags.writeable
    np.testing.assert_array_equal(host, expected())
    # A CUDA tensor cannot be seen on the host without a copy.
    with pytest.raises(BufferError):
        np.from_dlpack(de.cuda_arange(N), device="cpu", copy=False)


def test_cuda_stream_is_one_live_stream():
    s = de.cuda_stream()
    assert isinstance(s, int) and s not in (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
    assert de.cuda_stream() == s


def test_rust_reads_a_rust_cuda_tensor_on_a_created_stream():
    # The producer orders its write (on a stream of its own) before the consumer's stream.
    assert de.cuda_sum(de.cuda_arange(N), de.cuda_stream()) == expected_sum()


@pytest.mark.parametrize("stream", [CU_STREAM_LEGACY, CU_STREAM_PER_THREAD], ids=["legacy", "per_thread"])
def test_rust_reads_a_rust_cuda_tensor_on_a_default_stream(stream):
    assert de.cuda_sum(de.cuda_arange(N), stream) == expected_sum()


def test_rust_reads_a_rust_cuda_tensor_with_stream_0_as_legacy():
    # PyTorch reports its legacy default stream as 0; `cuda_sum` maps it to 1.
    assert de.cuda_sum(de.cuda_arange(N), 0) == expected_sum()


def test_many_exchanges_on_alternating_streams():
    streams = [de.cuda_stream(), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD]
    for i in range(12):
        n = 1000 + i
        assert de.cuda_sum(de.cuda_arange(n), streams[i % 3]) == float(n * (n - 1) // 2)


class SkipSync:
    """Forwards the DLPack protocol, asking the producer for no synchronization (stream=-1)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        kwargs["stream"] = -1
        return self.inner.__dlpack__(**kwargs)


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_consumer_that_skips_synchronization():
    # The negative control of the zero-violation checks: a read on the consumer's stream that
    # nothing orders after the producer's write is reported. The stream is created first, as
    # creating it synchronizes the context (which would order the write before the read). The
    # write is held behind a gate until the read is enqueued: no host wait, on any thread, can
    # have seen it complete and so ordered the read after it.
    s = de.cuda_stream()
    x, gate = gated()
    de.cuda_sum(SkipSync(x), s, release=gate)  # the value read may be anything
    report = _report()
    assert _driver.cuSimViolations() >= 1, "the checker missed an unsynchronized read"
    assert "cuMemcpyDtoHAsync" in report, report
    _driver.cuSimReset()


# Host waits and the GIL: with the producer's stream held by a gate, a host copy waits on the
# host. It must let other Python threads run meanwhile (one of them may be the one that opens
# the gate). The gate opens by itself after GATE_TIMEOUT seconds, so that a wait that kept the
# GIL fails the test instead of hanging it.

GATE_TIMEOUT = 20.0
# Ticks of the ticker thread (one per millisecond or so) that the releasing thread waits for.
TICKS = 20


class Ticker:
    """A Python thread that counts while it can run (it needs the GIL to count)."""

    def __init__(self):
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.count += 1
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def while_a_thread_releases(ticker, gate, call):
    """Runs `call()` while a Python thread opens `gate` once `ticker` has ticked TICKS times
    since the call began; returns its result and the ticks counted while it ran."""
    start = ticker.count

    def run():
        deadline = time.monotonic() + 2 * GATE_TIMEOUT
        while ticker.count < start + TICKS and time.monotonic() < deadline:
            time.sleep(0.001)
        gate.release()

    releaser = threading.Thread(target=run, daemon=True)
    releaser.start()
    result = call()
    ticks = ticker.count - start
    releaser.join(5)
    return result, ticks


def gated():
    return de.cuda_arange_gated(N, GATE_TIMEOUT)


def test_a_wait_that_keeps_the_gil_stops_python_threads():
    # The negative control of the tests below: a host synchronization that keeps the GIL (a
    # raw cuStreamSynchronize) lets the ticker run not once while it waits; the gate opens by
    # its own timeout.
    _x, gate = de.cuda_arange_gated(N, 0.5)
    with Ticker() as ticker:
        time.sleep(0.02)
        start = ticker.count
        de.cuda_synchronize_holding_gil(gate.stream)
        ticks = ticker.count - start
    assert ticks <= 2, f"the ticker ran {ticks} times while the GIL was held"


def test_numpy_host_copy_waits_with_the_gil_released():
    # np.from_dlpack(device="cpu") makes the producer copy to the host after its pending work:
    # a host wait, during which a Python thread opens the gate.
    x, gate = gated()
    with Ticker() as ticker:
        host, ticks = while_a_thread_releases(ticker, gate, lambda: np.from_dlpack(x, device="cpu"))
    assert ticks >= TICKS, f"the ticker ran only {ticks} times during the wait"
    np.testing.assert_array_equal(host, expected())


class NoKeywords:
    """A producer that predates `__dlpack__`'s keywords: the consumer copies to the host
    itself."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__(stream=stream, max_version=(1, 3))


def test_our_consumers_host_copy_waits_with_the_gil_released():
    x, gate = gated()
    with Ticker() as ticker:
        total, ticks = while_a_thread_releases(ticker, gate, lambda: de.host_sum(NoKeywords(x)))
    assert ticks >= TICKS, f"the ticker ran only {ticks} times during the wait"
    assert total == expected_sum()


class IgnoresDevice:
    """A producer that ignores `dl_device` and hands over its CUDA memory. As `__dlpack__`
    asks, it orders its pending write before the consumer's `stream` (an event dependency, by
    an export to that stream that it drops unused); the tensor it hands over carries no event,
    as a producer that is not this crate's hands over its tensors: only the consumer's stream
    is ordered after the write."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.inner.__dlpack__(stream=stream, max_version=max_version)
        return self.inner.__dlpack__(stream=-1, max_version=max_version)


@pytest.mark.parametrize(
    "which", ["created", "legacy", "per_thread", "none"],
)
def test_our_host_copy_of_memory_handed_over_despite_dl_device_follows_the_consumer_stream(which):
    # Our consumer asks for dl_device=(CPU, 0) with a consumer stream; the producer hands over
    # CUDA memory whose write (held by the gate) only the consumer's stream is ordered after.
    # The host copy our consumer makes must wait for that stream; the host waits for it with
    # the GIL released, while a Python thread opens the gate.
    stream = {
        "created": de.cuda_stream(),
        "legacy": CU_STREAM_LEGACY,
        "per_thread": CU_STREAM_PER_THREAD,
        "none": None,
    }[which]
    x, gate = gated()
    with Ticker() as ticker:
        total, ticks = while_a_thread_releases(
            ticker, gate, lambda: de.host_sum(IgnoresDevice(x), stream)
        )
    assert total == expected_sum()
    assert ticks >= TICKS, f"the ticker ran only {ticks} times during the wait"


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_host_copy_of_memory_handed_over_without_synchronization():
    # The negative control: the same import with stream=-1 (no synchronization asked, none
    # made); our host copy reads while the producer's write is held.
    x, gate = gated()
    de.host_sum(IgnoresDevice(x), -1)  # the value read may be anything
    report = _report()
    gate.release()
    assert _driver.cuSimViolations() >= 1, "the checker missed the unordered host copy"
    assert "cuMemcpyDtoH" in report, report
    _driver.cuSimReset()


def test_a_copy_without_synchronization_waits_with_the_gil_released():
    # stream=-1 with copy=True: the producer waits on the host for the copy it cannot order
    # before any consumer stream.
    x, gate = gated()
    with Ticker() as ticker:
        capsule, ticks = while_a_thread_releases(
            ticker, gate, lambda: x.__dlpack__(stream=-1, copy=True, max_version=(1, 3))
        )
    assert ticks >= TICKS, f"the ticker ran only {ticks} times during the wait"
    assert de.cuda_sum(capsule, de.cuda_stream()) == expected_sum()


# A relay: an import kept by Rust (CudaRelay, no stream field) and lent on to a second consumer
# stream. The second stream must be ordered after the original producer's write.


def test_a_relay_orders_the_second_consumer_stream_after_the_producer():
    # The streams exist before the tensors (creating a stream may synchronize the context,
    # which would order everything before it), and the exchange is repeated.
    s0, s1 = de.cuda_stream(0), de.cuda_stream(1)
    for _ in range(5):
        relay = de.cuda_relay(de.cuda_arange(N), s0)
        assert de.cuda_sum(relay, s1) == expected_sum()
        # Through our consumer's host copy, and through a relay of the relay.
        assert de.host_sum(de.cuda_relay(de.cuda_arange(N), s0)) == expected_sum()
        relay = de.cuda_relay(de.cuda_relay(de.cuda_arange(N), s0), s1)
        assert de.cuda_sum(relay, s0) == expected_sum()
        if SIMULATOR:
            count = _driver.cuSimViolations()
            assert count == 0, f"{count} violation(s):\n{_report()}"


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_relay_that_was_never_made_ready():
    # The negative control: the first import asks for no synchronization (stream=-1), so the
    # relay carries nothing to order the second stream after; its read is reported. The
    # producer's write is held behind a gate until the read is enqueued (as above).
    s1 = de.cuda_stream(1)
    x, gate = gated()
    relay = de.cuda_relay(x, -1)
    de.cuda_sum(relay, s1, release=gate)  # the value read may be anything
    report = _report()
    assert _driver.cuSimViolations() >= 1, "the checker missed the unordered read of the relay"
    assert "cuMemcpyHtoDAsync" in report, report
    _driver.cuSimReset()


# CUDA graph capture: `from_dlpack` called while the consumer's stream is being captured passes
# the capturing stream; the producer's pending work is ordered before every launch of the graph
# by an event recorded outside the capture and waited on inside it, and the host never waits.


def captured_copy(s, dst, x, sync=True):
    """A graph captured on `s` (global mode, as PyTorch captures) that copies `x` into `dst`,
    and the import it reads, which must outlive every launch."""
    de.cuda_capture_begin(s)
    try:
        keep = dst.copy_from(x, s, sync)
    finally:
        graph = de.cuda_capture_end(s)
    return graph, keep


def test_from_dlpack_inside_a_capture_orders_every_launch():
    s = de.cuda_stream(0)
    dst = de.CudaBuffer(N)
    x, gate = gated()
    graph, keep = captured_copy(s, dst, x)
    np.testing.assert_array_equal(dst.read(s), np.zeros(N, np.float32))
    graph.launch(s)
    # The launch is enqueued behind the producer's held write: the host did not wait for it.
    assert not de.cuda_stream_idle(s)
    gate.release()
    np.testing.assert_array_equal(dst.read(s), expected())
    for _ in range(2):
        dst.zero(s)
        graph.launch(s)
        np.testing.assert_array_equal(dst.read(s), expected())
    del graph, keep


@pytest.mark.skipif(not SIMULATOR, reason="needs the CUDA simulator's happens-before checker")
def test_the_checker_sees_a_captured_import_left_unordered():
    # The negative control: the same capture with stream=-1 (no dependency); the first launch's
    # copy reads while the producer's write is held.
    s = de.cuda_stream(0)
    dst = de.CudaBuffer(N)
    x, gate = gated()
    graph, keep = captured_copy(s, dst, x, sync=False)
    graph.launch(s)
    report = _report()
    gate.release()
    dst.read(s)
    del graph, keep
    assert _driver.cuSimViolations() >= 1, "the checker missed the unordered launch"
    assert "cuMemcpyDtoDAsync" in report, report
    _driver.cuSimReset()


def test_stream_none_under_a_blocking_capture_is_refused_and_the_capture_survives():
    # stream=None names the legacy default stream, whose implicit synchronization would join a
    # capture of a blocking stream and invalidate it: refused before anything is enqueued.
    b = de.cuda_blocking_stream()
    x = de.cuda_arange(N)
    de.cuda_capture_begin(b)
    try:
        with pytest.raises(BufferError, match="legacy default stream"):
            x.__dlpack__(stream=None, max_version=(1, 3))
    finally:
        graph = de.cuda_capture_end(b)  # raises if the capture was invalidated
    del graph
    # Outside the capture the same export orders on the legacy stream as usual.
    assert de.cuda_sum(de.cuda_arange(N), CU_STREAM_LEGACY) == expected_sum()


def test_a_copy_under_capture_is_refused_and_the_capture_survives():
    s = de.cuda_stream(0)
    x = de.cuda_arange(N)
    de.cuda_capture_begin(s)
    try:
        with pytest.raises(BufferError, match="a copy for the consumer"):
            x.__dlpack__(stream=s, copy=True, max_version=(1, 3))
    finally:
        graph = de.cuda_capture_end(s)
    del graph
