"""Our tensors through MPI with mpi4py, on 2 ranks: `mpiexec -n 2 python mpi_worker.py`
(`test_mpi.py` runs it and reports each check).

mpi4py takes a CPU buffer through `__dlpack__(max_version=(1, 0), copy=False)`, reads the
pointer without renaming the capsule, and keeps the capsule as the buffer's owner until the
operation completes: the capsule's destructor then runs our deleter. Send buffers are the
read-only shared exports of `de.Tensor`, `de.Strided` and `de.any_relay`; receive buffers are
the writable by-value exports of `de.ones` (see `Received`).

Every check runs on both ranks, in the order defined, and prints `rank R: PASS name`. A check
that fails prints its traceback and aborts the job (`MPI_Abort`), so that the other rank never
waits for a message that will not come.
"""

import gc
import os
import sys
import traceback

import numpy as np
from mpi4py import MPI

import dlpack_example as de

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
other = 1 - rank
CPU_CALL = {"max_version": (1, 0), "copy": False}


class Received:
    """A by-value tensor (`de.ones(*shape)`, float32, writable) as a receive buffer.

    mpi4py drops the capsule it took when the operation completes, and with it the tensor and
    the values received into it (by value, the capsule owns them). This wrapper keeps the
    capsule, as a consumer that owns its buffer does; `values()` then takes it by the spec
    (`de.any_relay`, which renames it) and lends the values to NumPy: the deleter runs once,
    when the last of those is gone.
    """

    def __init__(self, *shape):
        self.tensor = de.ones(*shape)
        self.calls = []
        self.capsule = None

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        self.capsule = self.tensor.__dlpack__(**kwargs)
        return self.capsule

    def values(self, dtype=np.float32):
        assert self.calls == [CPU_CALL], self.calls
        return np.from_dlpack(de.any_relay(self.capsule)).view(dtype)


class Spy:
    """Forwards `__dlpack__` to `x`, recording the arguments mpi4py passes."""

    def __init__(self, x):
        self.x = x
        self.calls = []

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.x.__dlpack__(**kwargs)


class Counted:
    """Producers whose references must be back to where they were once MPI is done with them:
    each export holds one, released by its deleter."""

    def __init__(self, *producers):
        self.producers = producers
        self.baselines = None

    def start(self):
        # Not in `__init__`: the caller's frame holds the arguments of a call while it runs.
        gc.collect()
        self.baselines = [sys.getrefcount(p) for p in self.producers]
        return self

    def held(self):
        now = [sys.getrefcount(p) for p in self.producers]  # counted as in `start`
        return [n - b for n, b in zip(now, self.baselines)]

    def assert_released(self):
        gc.collect()
        assert self.held() == [0] * len(self.producers), self.held()


def arange(*shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------


def check_mpi4py_asks_for_a_versioned_capsule_without_copy():
    t = de.Tensor.arange(4)
    counted = Counted(t).start()
    spy, received = Spy(t), Received(4)
    comm.Sendrecv(spy, dest=other, recvbuf=received, source=other)
    assert spy.calls == [CPU_CALL], spy.calls
    assert received.calls == [CPU_CALL], received.calls
    assert received.values().tolist() == [0.0, 1.0, 2.0, 3.0]
    del spy
    counted.assert_released()


def check_send_recv_float32_contiguous():
    # Rank 0 sends a `de.Tensor`, rank 1 a relay of other values; both directions, in order:
    # 0 -> 1, then 1 -> 0.
    sent = [arange(3, 4), 100 + arange(3, 4)]
    t = de.Tensor.arange(3, 4) if rank == 0 else de.any_relay(sent[1])
    counted = Counted(t).start()
    received = Received(3, 4)
    if rank == 0:
        comm.Send(t, dest=1, tag=7)
        comm.Recv(received, source=1, tag=8)
    else:
        comm.Recv(received, source=0, tag=7)
        comm.Send(t, dest=0, tag=8)
    np.testing.assert_array_equal(received.values(), sent[other])
    np.testing.assert_array_equal(np.from_dlpack(t), sent[rank], "the send buffer is unchanged")
    counted.assert_released()


def check_isend_irecv_wait():
    t = de.Tensor.arange(1000)
    counted = Counted(t).start()
    received = Received(1000)
    requests = [comm.Irecv(received, source=other, tag=3), comm.Isend(t, dest=other, tag=3)]
    # The pending send holds its buffer (the capsule, which holds the tensor) until completed.
    assert counted.held() == [1], counted.held()
    MPI.Request.Waitall(requests)
    counted.assert_released()
    np.testing.assert_array_equal(received.values(), arange(1000))
    # One at a time, with Wait.
    received = Received(1000)
    recv = comm.Irecv(received, source=other, tag=4)
    send = comm.Isend(t, dest=other, tag=4)
    send.Wait()
    recv.Wait()
    counted.assert_released()
    np.testing.assert_array_equal(received.values(), arange(1000))
    # Completed by Test.
    received = Received(1000)
    requests = [comm.Irecv(received, source=other, tag=5), comm.Isend(t, dest=other, tag=5)]
    while not all(request.Test() for request in requests):
        pass
    counted.assert_released()
    np.testing.assert_array_equal(received.values(), arange(1000))


def check_bcast_from_each_root():
    for root in (0, 1):
        t = de.Tensor.arange(2, 5)
        counted = Counted(t).start()
        if rank == root:
            comm.Bcast(t, root=root)  # a read-only export is fine where it is only read
        else:
            received = Received(2, 5)
            comm.Bcast(received, root=root)
            np.testing.assert_array_equal(received.values(), arange(2, 5))
        counted.assert_released()


def check_allreduce_sum_and_max():
    t = de.Tensor.arange(2, 3)
    counted = Counted(t).start()
    received = Received(2, 3)
    comm.Allreduce(t, received, op=MPI.SUM)
    np.testing.assert_array_equal(received.values(), 2 * arange(2, 3))
    mine = de.any_relay(np.full(5, 10 * rank + 1, dtype=np.float32))
    received = Received(5)
    comm.Allreduce(mine, received, op=MPI.MAX)
    np.testing.assert_array_equal(received.values(), np.full(5, 11, dtype=np.float32))
    counted.assert_released()


def check_other_dtypes_with_explicit_datatypes():
    # Relays of NumPy memory of any dtype are sent as they are; the float32 receive buffers take
    # them as bytes of the message's datatype ([buffer, datatype]: the count follows from size).
    for dtype, mpi_type in [(np.float64, MPI.DOUBLE), (np.int32, MPI.INT32_T), (np.int8, MPI.INT8_T)]:
        values = (np.arange(16) * (rank + 2)).astype(dtype)
        relay = de.any_relay(values)
        counted = Counted(relay).start()
        received = Received(values.nbytes // 4)
        comm.Sendrecv([relay, mpi_type], dest=other, recvbuf=[received, mpi_type], source=other)
        expected = (np.arange(16) * (other + 2)).astype(dtype)
        np.testing.assert_array_equal(received.values(dtype), expected)
        counted.assert_released()


def check_layouts():
    # A transposed matrix is Fortran-contiguous: mpi4py sends its memory, in memory order (the
    # row-major values of the matrix it views).
    s = de.Strided(3, 4, "t")
    counted = Counted(s).start()
    received = Received(12)
    comm.Sendrecv(s, dest=other, recvbuf=received, source=other)
    np.testing.assert_array_equal(received.values(), arange(12))
    counted.assert_released()
    # MPI needs a contiguous buffer: mpi4py refuses the others, before anything is sent, and
    # the refused exports are released.
    refused = [
        (de.Strided(3, 4, "reversed"), "dlpack: strides item is negative"),
        (de.any_relay(np.arange(12, dtype=np.float32)[::2]), "dlpack: buffer is not contiguous"),
        (
            de.any_relay(np.arange(12, dtype=np.float32).reshape(3, 4)[:, :2]),
            "dlpack: buffer is not contiguous",
        ),
    ]
    counted = Counted(*[x for x, _ in refused]).start()
    for x, message in refused:
        for call in (lambda: comm.Send(x, dest=other), lambda: comm.Isend(x, dest=other)):
            try:
                call()
            except BufferError as error:
                assert str(error) == message, str(error)
            else:
                raise AssertionError(f"{x!r} was sent")
    del x  # the loop's last
    counted.assert_released()


def check_read_only_export_refused_as_receive_buffer():
    t = de.Tensor.arange(6)
    counted = Counted(t).start()
    received = Received(6)
    for call in (
        lambda: comm.Recv(t, source=other),
        lambda: comm.Irecv(t, source=other),
        lambda: comm.Sendrecv(received, dest=other, recvbuf=t, source=other),
        lambda: comm.Allreduce(received, t),
    ):
        try:
            call()
        except BufferError as error:
            assert str(error) == "dlpack: buffer is not writable", str(error)
        else:
            raise AssertionError("a read-only export was taken as a receive buffer")
    counted.assert_released()
    # Away from the root, `Bcast` receives: refused too, before taking part; the rank then
    # takes part with a writable buffer.
    if rank == 0:
        comm.Bcast(t, root=0)
    else:
        try:
            comm.Bcast(t, root=0)
        except BufferError as error:
            assert str(error) == "dlpack: buffer is not writable", str(error)
        else:
            raise AssertionError("a read-only export was taken as a Bcast receive buffer")
        received = Received(6)
        comm.Bcast(received, root=0)
        np.testing.assert_array_equal(received.values(), arange(6))
    counted.assert_released()
    # Nothing was posted: the next exchange sees only its own messages.
    received = Received(6)
    comm.Sendrecv(t, dest=other, recvbuf=received, source=other)
    np.testing.assert_array_equal(received.values(), arange(6))
    counted.assert_released()


def check_many_exchanges_release_every_export():
    t = de.Tensor.arange(64)
    s = de.Strided(8, 8, "t")
    counted = Counted(t, s).start()
    for i in range(200):
        received = Received(64)
        comm.Sendrecv(t if i % 2 else s, dest=other, recvbuf=received, source=other)
        requests = [comm.Isend(t, dest=other, tag=i), comm.Irecv(Received(64), source=other, tag=i)]
        MPI.Request.Waitall(requests)
        summed = Received(64)
        comm.Allreduce(s, summed)
        if i % 50 == 0:
            np.testing.assert_array_equal(received.values(), arange(64))
            np.testing.assert_array_equal(summed.values(), 2 * arange(64))
    del requests, received, summed
    counted.assert_released()


def check_receive_buffer_is_freed_once_after_its_last_use():
    # 64 MiB: mapped and unmapped by glibc on its own, so the resident size shows when the
    # deleter frees it.
    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)

    n = 16 << 20
    t = de.Tensor.arange(n)
    counted = Counted(t).start()
    gc.collect()
    start = resident_mib()
    received = Received(n)
    comm.Sendrecv(t, dest=other, recvbuf=received, source=other)
    assert resident_mib() - start > 48, "received into the tensor, which the capsule keeps"
    values = received.values()
    assert (values[0], values[n // 2], values[-1]) == (0.0, n // 2, n - 1)
    del received
    gc.collect()
    assert resident_mib() - start > 48, "NumPy's view keeps it"
    del values
    gc.collect()
    assert resident_mib() - start < 16, "the deleter freed it"
    counted.assert_released()


# ---------------------------------------------------------------------------------------------


def main():
    # The report goes to stdout and, given a directory, to `rank<R>.log` in it (the ranks'
    # stdout reaches mpiexec's interleaved).
    log = open(os.path.join(sys.argv[1], f"rank{rank}.log"), "w") if len(sys.argv) > 1 else None

    def report(line):
        print(line, flush=True)
        if log:
            log.write(line + "\n")
            log.flush()

    assert comm.Get_size() == 2, f"run on 2 ranks, not {comm.Get_size()}"
    checks = [f for name, f in globals().items() if name.startswith("check_")]
    for check in checks:
        comm.Barrier()
        try:
            check()
        except BaseException:
            report(f"rank {rank}: FAIL {check.__name__}\n{traceback.format_exc()}")
            comm.Abort(1)
            os._exit(1)
        report(f"rank {rank}: PASS {check.__name__}")
    comm.Barrier()
    report(f"rank {rank}: all {len(checks)} checks passed")


if __name__ == "__main__":
    main()
