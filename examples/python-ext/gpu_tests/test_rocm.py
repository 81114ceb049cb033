"""ROCm tests of the example extension (built with `--features cuda,hip`) that need only NumPy:
no PyTorch (whose CPU build has no ROCm), no CuPy.

They run in two places:

* in the test command (`scripts/test.sh`), on the simulator (crate `cuda-sim`, whose directory
  holds `libamdhip64.so`, its HIP face, put first on `LD_LIBRARY_PATH`), with no GPU: there each
  test starts with a clean happens-before checker and, after it, the checker must report no
  violation (a copy or free not ordered after the work it depends on), except in the negative
  controls, which assert that a violation is reported;
* on a ROCm machine, against the real HIP runtime (which has no checker, so only the values are
  checked, and the negative controls are skipped).

The simulator's HIP face is the same library as its CUDA face, with one checker, read through
the `cuSim*` symbols of the library loaded here.

N is moderate because the simulator runs every copy on the CPU.
"""

import ctypes
import os
import sys
import threading

import numpy as np
import pytest

import dlpack_example as de

N = 1 << 16

KDLROCM = 10

# Seconds after which a gate opens by itself, so that a test that goes wrong fails instead of
# hanging.
GATE_TIMEOUT = 20.0

if not hasattr(de, "rocm_arange"):
    raise ImportError("dlpack_example was built without `--features hip`; these tests need it")


def _load_runtime():
    """The HIP runtime library the extension loads (libamdhip64.so first, as dlpack-runtime
    tries it; in the simulator's directory every name is the same file)."""
    for name in ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("no HIP runtime library (libamdhip64.so) on the library path: put the "
                  "simulator's directory (printed by scripts/cuda-sim.sh) first on "
                  "LD_LIBRARY_PATH, or run on a ROCm machine")


_runtime = _load_runtime()
SIMULATOR = hasattr(_runtime, "cuSimViolations")
if SIMULATOR:
    _runtime.cuSimViolations.restype = ctypes.c_uint64
    _runtime.cuSimViolations.argtypes = []
    _runtime.cuSimReset.restype = None
    _runtime.cuSimReset.argtypes = []
    _runtime.cuSimReport.restype = ctypes.c_size_t
    _runtime.cuSimReport.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

needs_checker = pytest.mark.skipif(
    not SIMULATOR, reason="needs the simulator's happens-before checker"
)


def _report():
    length = _runtime.cuSimReport(None, 0)
    buf = ctypes.create_string_buffer(length + 1)
    _runtime.cuSimReport(buf, length + 1)
    return buf.value.decode(errors="replace")


def _mapped_runtimes():
    """The distinct files mapped into this process under the HIP runtime's or the CUDA
    driver's names (Linux), resolved: on the simulator both names are one file."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {
                line.split(maxsplit=5)[-1].strip()
                for line in maps
                if "libamdhip64.so" in line or "libcuda.so" in line
            }
    except OSError:
        return set()
    return {os.path.realpath(p) for p in paths if p.startswith("/")}


@pytest.fixture(autouse=True)
def no_violations():
    """On the simulator: starts each test with a clean checker and fails it on any violation
    (the negative controls assert theirs, then reset the checker)."""
    if SIMULATOR:
        _runtime.cuSimReset()
    yield
    if SIMULATOR:
        runtimes = _mapped_runtimes()
        assert len(runtimes) <= 1, f"two runtimes mapped, the checker may watch the wrong one: {runtimes}"
        count = _runtime.cuSimViolations()
        assert count == 0, f"{count} happens-before violation(s) in the simulator:\n{_report()}"


def expected():
    return np.arange(N, dtype=np.float32)


def expected_sum():
    return float(expected().astype(np.float64).sum())


def gated():
    """A ROCm tensor whose write is held behind a gate on its stream until `gate.release()`."""
    return de.rocm_arange_gated(N, GATE_TIMEOUT)


def releasing_later(gate, delay=0.05):
    """A thread that opens `gate` after `delay` seconds (while the test's call waits on the
    host with the GIL released); join it after the call."""
    thread = threading.Timer(delay, gate.release)
    thread.daemon = True
    thread.start()
    return thread


def numpy_has_device_keyword():
    return tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 1)


def test_dlpack_device_is_rocm_device_0():
    x = de.rocm_arange(8)
    assert x.__dlpack_device__() == (KDLROCM, 0)
    assert de.rocm_sum(x, de.rocm_stream()) == float(sum(range(8)))


def test_rocm_stream_is_one_live_stream():
    s = de.rocm_stream()
    assert isinstance(s, int) and s > 2
    assert de.rocm_stream() == s
    assert de.rocm_stream(1) not in (s, 0)


def test_numpy_gets_a_host_copy_of_a_pending_rocm_tensor():
    # NumPy asks for dl_device=(CPU, 0): the producer copies to the host after its pending
    # write, which is held until a thread opens the gate while the host waits.
    if not numpy_has_device_keyword():
        pytest.skip(f"numpy {np.__version__} has no from_dlpack(device=...) (numpy >= 2.1 does)")
    x, gate = gated()
    releaser = releasing_later(gate)
    host = np.from_dlpack(x, device="cpu")
    releaser.join(5)
    assert host.flags.writeable
    assert host.dtype == np.float32 and host.shape == (N,)
    np.testing.assert_array_equal(host, expected())


def test_numpy_host_copy_with_copy_true_and_refusal_without_copy():
    if not numpy_has_device_keyword():
        pytest.skip(f"numpy {np.__version__} has no from_dlpack(device=...) (numpy >= 2.1 does)")
    x, gate = gated()
    releaser = releasing_later(gate)
    host = np.from_dlpack(x, device="cpu", copy=True)
    releaser.join(5)
    assert host.flags.writeable
    np.testing.assert_array_equal(host, expected())
    # ROCm memory cannot be seen on the host without a copy.
    with pytest.raises(BufferError):
        np.from_dlpack(de.rocm_arange(N), device="cpu", copy=False)


def test_our_consumer_reads_a_pending_producer_on_a_created_stream():
    # The producer orders its held write before the consumer's stream by an event; the read is
    # enqueued on that stream while the write is still held, then the gate opens.
    s = de.rocm_stream()
    x, gate = gated()
    assert de.rocm_sum(x, s, release=gate) == expected_sum()


@pytest.mark.parametrize("stream", [0, None], ids=["zero", "none"])
def test_stream_0_and_none_order_the_default_stream(stream):
    # ROCm's column of the stream table: None and 0 both name the default stream, which the
    # producer's (non-blocking) stream does not synchronize with by itself.
    x, gate = gated()
    assert de.rocm_sum(x, stream, release=gate) == expected_sum()


@pytest.mark.parametrize("stream", [1, 2])
def test_streams_1_and_2_are_refused_for_rocm(stream):
    x = de.rocm_arange(N)
    with pytest.raises(ValueError):
        x.__dlpack__(stream=stream, max_version=(1, 3))
    # Our consumer passes the value as it is, and the producer's error comes back.
    with pytest.raises(ValueError):
        de.rocm_sum(x, stream)


def test_many_exchanges_on_alternating_streams():
    streams = [de.rocm_stream(0), de.rocm_stream(1), 0, None]
    for i in range(12):
        n = 1000 + i
        assert de.rocm_sum(de.rocm_arange(n), streams[i % 4]) == float(n * (n - 1) // 2)


def test_an_empty_tensor():
    assert de.rocm_sum(de.rocm_arange(0), de.rocm_stream()) == 0.0


def test_each_export_is_deleted_once():
    # A shared export of the frozen pyclass holds a reference to it, which its deleter gives
    # back: the count returns to where it was, no lower (a second deleter call would take one
    # reference too many), after each kind of consumer.
    x = de.rocm_arange(N)
    s = de.rocm_stream()
    baseline = sys.getrefcount(x)
    capsule = x.__dlpack__(stream=s, max_version=(1, 3))
    assert sys.getrefcount(x) == baseline + 1
    del capsule  # never consumed: the capsule's destructor runs the deleter
    assert sys.getrefcount(x) == baseline
    for _ in range(3):
        assert de.rocm_sum(x, s) == expected_sum()
        assert sys.getrefcount(x) == baseline
    if numpy_has_device_keyword():
        np.testing.assert_array_equal(np.from_dlpack(x, device="cpu"), expected())
        assert sys.getrefcount(x) == baseline
    # A capsule consumed by our consumer is deleted by it, once.
    capsule = x.__dlpack__(stream=s, max_version=(1, 3))
    assert de.rocm_sum(capsule, s) == expected_sum()
    del capsule
    assert sys.getrefcount(x) == baseline


def test_our_consumer_gets_a_host_copy_from_the_producer():
    # from_dlpack(device=cpu) asks the producer for dl_device=(CPU, 0): it copies to the host
    # after its held write (the gate opened by a thread while the host waits).
    x, gate = gated()
    releaser = releasing_later(gate)
    assert de.host_sum(x) == expected_sum()
    releaser.join(5)
    # A stream names a stream of the device asked for, the host here: only None is valid.
    with pytest.raises(ValueError):
        de.host_sum(de.rocm_arange(N), de.rocm_stream())


class IgnoresDevice:
    """A producer that ignores `dl_device` and hands over its ROCm memory. As `__dlpack__`
    asks, it orders its pending write before the consumer's `stream` (an event dependency, by
    an export to that stream that it drops unused); the tensor it hands over is then taken
    with stream=-1: only the consumer's stream is ordered after the write."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.inner.__dlpack__(stream=stream, max_version=max_version)
        return self.inner.__dlpack__(stream=-1, max_version=max_version)


@pytest.mark.parametrize("which", ["created", "zero", "none"])
def test_our_host_copy_of_rocm_memory_handed_over_despite_dl_device_follows_the_consumer_stream(which):
    # Our consumer asks for dl_device=(CPU, 0) with a consumer stream; the producer hands over
    # ROCm memory whose held write only the consumer's stream is ordered after. The host copy
    # our consumer makes must wait for that stream (the gate opened by a thread meanwhile).
    stream = {"created": de.rocm_stream(), "zero": 0, "none": None}[which]
    x, gate = gated()
    releaser = releasing_later(gate)
    assert de.host_sum(IgnoresDevice(x), stream) == expected_sum()
    releaser.join(5)


@needs_checker
def test_the_checker_sees_a_host_copy_of_rocm_memory_handed_over_without_synchronization():
    # The negative control: the same import with stream=-1 (no synchronization asked, none
    # made); our host copy reads while the producer's write is held.
    x, gate = gated()
    de.host_sum(IgnoresDevice(x), -1)  # the value read may be anything
    report = _report()
    gate.release()
    assert _runtime.cuSimViolations() >= 1, "the checker missed the unordered host copy"
    assert "hipMemcpyAsync" in report, report
    _runtime.cuSimReset()


class SkipSync:
    """Forwards the DLPack protocol, asking the producer for no synchronization (stream=-1)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        kwargs["stream"] = -1
        return self.inner.__dlpack__(**kwargs)


@needs_checker
def test_the_checker_sees_a_read_with_stream_minus_1():
    # The negative control of the zero-violation checks: stream=-1 asks for no synchronization
    # and gets none; the read (on the default stream) is enqueued while the producer's write is
    # held, so nothing orders it after the write, and the checker reports it.
    x, gate = gated()
    de.rocm_sum(x, -1, release=gate)  # the value read may be anything
    report = _report()
    assert _runtime.cuSimViolations() >= 1, "the checker missed an unsynchronized read"
    assert "hipMemcpyAsync" in report, report
    _runtime.cuSimReset()


@needs_checker
def test_the_checker_sees_a_consumer_that_skips_synchronization():
    # The same on a created stream: the consumer passes the stream, the wrapper asks the
    # producer for stream=-1 instead.
    s = de.rocm_stream()
    x, gate = gated()
    de.rocm_sum(SkipSync(x), s, release=gate)  # the value read may be anything
    report = _report()
    assert _runtime.cuSimViolations() >= 1, "the checker missed an unsynchronized read"
    assert "hipMemcpyAsync" in report, report
    _runtime.cuSimReset()
