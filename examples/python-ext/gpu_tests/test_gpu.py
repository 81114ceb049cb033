"""GPU tests of the example extension (built with `--features cuda`), run by
`scripts/gpu-suite.sh run` on a CUDA machine: PyTorch and CuPy both ways with their streams.
The tests that need only NumPy (host copies, Rust reading a Rust CUDA tensor on given streams)
are in test_cuda_numpy.py, which also runs on the CUDA simulator in the test command."""

import numpy as np
import pytest
import torch
import cupy

import dlpack_example as de

N = 1 << 20


def expected():
    return np.arange(N, dtype=np.float32)


def test_torch_reads_a_rust_cuda_tensor_on_its_current_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_dlpack(de.cuda_arange(N))  # torch passes `s` as the consumer stream
        assert t.device.type == "cuda"
        host = t.cpu().numpy()
    np.testing.assert_array_equal(host, expected())


def test_cupy_reads_a_rust_cuda_tensor_on_its_current_stream():
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        a = cupy.from_dlpack(de.cuda_arange(N))
        host = cupy.asnumpy(a)
    np.testing.assert_array_equal(host, expected())


def test_rust_reads_torch_on_the_consumer_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.arange(N, dtype=torch.float32, device="cuda") * 2
        total = de.cuda_sum(x, s.cuda_stream)
    assert total == float(expected().astype(np.float64).sum() * 2)


def test_rust_reads_cupy_on_the_consumer_stream():
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.arange(N, dtype=cupy.float32) + 1
        total = de.cuda_sum(x, s.ptr)
    assert total == float(expected().astype(np.float64).sum() + N)


def test_c_exchange_api_consumed_from_torch():
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if api is None:
        pytest.skip(f"torch {torch.__version__} publishes no __dlpack_c_exchange_api__ (torch >= 2.10 does)")
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    total, used_c_api = de.cuda_sum_via_c_api(x)
    assert used_c_api
    assert total == float(expected().astype(np.float64).sum())


class CopyRequest:
    """Forwards the DLPack protocol, asking the producer for a copy (copy=True)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        kwargs["copy"] = True
        return self.inner.__dlpack__(*args, **kwargs)


def test_torch_gets_a_copy_enqueued_on_its_current_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_dlpack(CopyRequest(de.cuda_arange(N)))
        assert t.device.type == "cuda"
        t += 1  # the copy is writable
        host = t.cpu().numpy()
    np.testing.assert_array_equal(host, expected() + 1)


def test_cupy_gets_a_copy_enqueued_on_its_current_stream():
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        a = cupy.from_dlpack(CopyRequest(de.cuda_arange(N)))
        host = cupy.asnumpy(a)
    np.testing.assert_array_equal(host, expected())


def test_torch_captures_from_dlpack_of_a_rust_tensor_and_every_replay_reads_it():
    # PyTorch captures on a side stream in global mode and passes the capturing stream to
    # `__dlpack__`: the producer's held write is ordered before every replay, the first one
    # included, by an external event wait inside the graph; the host never waits for it.
    x, gate = de.cuda_arange_gated(N, 60.0)
    out = torch.zeros(N, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            t = torch.from_dlpack(x)
            out.copy_(t)
        finally:
            graph.capture_end()
    graph.replay()
    # The replay waits behind the producer's gate: nothing of it has run yet.
    done = torch.cuda.Event()
    done.record()
    assert not done.query()
    gate.release()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), expected())
    for _ in range(2):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(out.cpu().numpy(), expected())
    del graph, t
