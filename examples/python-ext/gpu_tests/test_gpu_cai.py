"""GPU tests of the CUDA Array Interface
(https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html) against CuPy and Numba
(numba-cuda), both ways, run by `scripts/gpu-suite.sh run` on a CUDA machine. A library that is
not installed there makes its tests skip with the reason (`pytest -rs` prints it); they never
pass without running.

The producers' pending work is real: the extension's tensors are written behind a gate that
opens by itself after GATE seconds, and CuPy and Numba write on streams of their own, so a
consumer that did not order its reads after the exported stream would read unfinished memory.
"""

import numpy as np
import pytest

import dlpack_example as de

N = 1 << 20
GATE = 0.5


def expected():
    return np.arange(N, dtype=np.float32)


def expected_sum(scale=1.0, offset=0.0):
    return float(expected().astype(np.float64).sum() * scale + offset * N)


class CaiOnly:
    """Only the CUDA Array Interface of `inner` (read now, on the current stream), so that the
    consumer cannot use `__dlpack__`."""

    def __init__(self, inner):
        self.inner = inner
        self.__cuda_array_interface__ = inner.__cuda_array_interface__


def cupy():
    return pytest.importorskip("cupy", reason="CuPy is not installed on this GPU machine")


def numba_cuda():
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed on this GPU machine")
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("numba.cuda finds no usable GPU on this machine")
    return cuda


def test_cupy_reads_our_interface_after_the_held_write():
    cp = cupy()
    x, _gate = de.cuda_arange_gated(N, GATE)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.asarray(CaiOnly(x))  # CuPy orders itself after the exported stream
        host = cp.asnumpy(a)
    np.testing.assert_array_equal(host, expected())


def test_cupy_reads_the_interface_of_a_tensor_with_two_streams():
    cp = cupy()
    x, _gate = de.cuda_arange_two_streams(N, GATE)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        host = cp.asnumpy(cp.asarray(CaiOnly(x)))
    np.testing.assert_array_equal(host, expected())


def test_rust_reads_a_cupy_interface_on_its_stream():
    cp = cupy()
    producer = cp.cuda.Stream(non_blocking=True)
    with producer:
        a = cp.arange(N, dtype=cp.float32) * 3
        only = CaiOnly(a)  # `stream` is the producer's stream
    assert only.__cuda_array_interface__.get("stream") == producer.ptr
    assert de.cuda_sum(only, de.cuda_stream()) == expected_sum(3.0)


def test_numba_reads_our_interface_after_the_held_write():
    cuda = numba_cuda()
    x, _gate = de.cuda_arange_gated(N, GATE)
    d = cuda.as_cuda_array(CaiOnly(x))  # Numba synchronizes on the exported stream
    np.testing.assert_array_equal(d.copy_to_host(), expected())


def test_numba_reads_the_interface_of_a_tensor_with_two_streams():
    cuda = numba_cuda()
    x, _gate = de.cuda_arange_two_streams(N, GATE)
    d = cuda.as_cuda_array(CaiOnly(x))
    np.testing.assert_array_equal(d.copy_to_host(), expected())


def test_rust_reads_a_numba_interface_on_its_stream():
    cuda = numba_cuda()
    producer = cuda.stream()
    d = cuda.to_device(expected() + 1, stream=producer)  # asynchronous on `producer`
    only = CaiOnly(d)
    # Numba names the array's stream (its handle's spelling varies with the bindings used).
    assert only.__cuda_array_interface__.get("stream") not in (None, 0)
    assert de.cuda_sum(only, de.cuda_stream()) == expected_sum(1.0, 1.0)


# The import's bounds check reads the allocation range of the `data` pointer
# (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` / `_RANGE_SIZE`). For memory mapped with the virtual
# memory management API, the driver documents that range as the whole reserved address range
# (`cuMemAddressReserve`), not one mapped chunk: PyTorch's expandable segments map a tensor's
# bytes from several physical allocations into one reservation, and the import must not refuse
# a tensor that crosses from one to the next.
EXPANDABLE = r"""
import numpy as np
import torch
import dlpack_example as de

class CaiOnly:
    def __init__(self, inner):
        self.inner = inner
        self.__cuda_array_interface__ = inner.__cuda_array_interface__

torch.cuda.init()
# 96 MiB: more than the 20 MiB pages that expandable segments map one by one.
t = (torch.arange(24 << 20, device="cuda", dtype=torch.int64) % 1000).to(torch.float32)
torch.cuda.synchronize()
expected = float(t.cpu().numpy().astype(np.float64).sum())
got = de.cuda_sum(CaiOnly(t), 1)
assert got == expected, (got, expected)
print("expandable segments: ok", got)
"""


def test_rust_reads_a_torch_tensor_spanning_expandable_segments():
    import os
    import subprocess
    import sys

    torch = pytest.importorskip("torch", reason="PyTorch is not installed on this GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch finds no usable GPU on this machine")
    # The allocator's configuration is read once, at CUDA initialization: a process of its own.
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    run = subprocess.run(
        [sys.executable, "-c", EXPANDABLE], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "expandable segments: ok" in run.stdout, run.stdout + run.stderr
