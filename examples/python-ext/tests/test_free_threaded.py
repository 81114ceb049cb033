"""One DLPack capsule consumed from 8 threads at once: exactly one import takes the tensor.

`dlpack_example` declares itself free-thread-safe (`gil_used = false`), so on a free-threaded
interpreter (3.13t, 3.14t) these threads run in parallel, and the capsule's check-then-rename
must be one step (the consumer takes the capsule's critical section): otherwise two threads
could both see the unconsumed name, both own the tensor, and its deleter would run twice. With
the GIL the threads take turns, and this is a regression test of the rename protocol: one
import succeeds, every later one raises the "already been consumed" `ValueError`, and the
deleter runs exactly once.

The deleter is counted through the reference the capsule's tensor holds on its producer: the
producer's reference count is back where it was once everything is dropped if the deleter ran
once, one higher if it never ran, and one lower if it ran twice.

Runs under pytest, or alone (`python test_free_threaded.py`, for an interpreter without pytest
or NumPy).
"""

import sys
import sysconfig
import threading

import dlpack_example as de

try:
    import numpy as np
except ImportError:
    np = None

THREADS = 8
ROUNDS = 200
CONSUMED = "DLPack capsule has already been consumed"


class Skipped(Exception):
    """A test that cannot run here (pytest's skip when running under pytest)."""


def skip(reason):
    if "pytest" in sys.modules:
        import pytest

        pytest.skip(reason)
    raise Skipped(reason)


def gil_enabled():
    """`sys._is_gil_enabled()` (3.13+); True before 3.13, where there is always a GIL."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_gil_enabled is None else is_gil_enabled()


def race(capsule):
    """Consumes `capsule` from `THREADS` threads released together: the outcome of each, as
    `("ok", ndim)` or `(exception type name, message)` (no exception objects are kept, since
    their tracebacks would hold the capsule)."""
    barrier = threading.Barrier(THREADS, timeout=60)
    outcomes = [None] * THREADS

    def work(i):
        barrier.wait()
        try:
            outcomes[i] = ("ok", de.consume(capsule))
        except Exception as e:  # every outcome is checked by the caller
            outcomes[i] = (type(e).__name__, str(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a consuming thread hung"
    return outcomes


def check_rounds(producer, make_capsule, ndim):
    """`ROUNDS` races on fresh capsules of `producer`, each checked: one import, `THREADS - 1`
    refusals, and the deleter run exactly once (`producer`'s reference count back)."""
    baseline = sys.getrefcount(producer)
    for round_ in range(ROUNDS):
        capsule = make_capsule()
        assert sys.getrefcount(producer) == baseline + 1, "the capsule holds the producer"
        outcomes = race(capsule)
        del capsule
        winners = [o for o in outcomes if o[0] == "ok"]
        losers = [o for o in outcomes if o[0] != "ok"]
        assert winners == [("ok", ndim)], f"round {round_}: {outcomes}"
        assert len(losers) == THREADS - 1, f"round {round_}: {outcomes}"
        for kind, message in losers:
            assert kind == "ValueError" and CONSUMED in message, f"round {round_}: {outcomes}"
        # Once exactly: not still held (0 runs), not one reference short (2 runs).
        assert sys.getrefcount(producer) == baseline, f"round {round_}"


def test_versioned_capsule_is_consumed_once_by_8_threads(record_property):
    """A `dltensor_versioned` capsule of `dlpack_example.Tensor` (the crate's own exporter),
    whose tensor holds a reference to the tensor object."""
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    record_property("free_threaded_build", free_threaded)
    record_property("gil_enabled", gil_enabled())
    print(f"free-threaded build: {free_threaded}; GIL enabled: {gil_enabled()}")
    tensor = de.Tensor.arange(2, 3)
    check_rounds(tensor, lambda: tensor.__dlpack__(max_version=(1, 0)), 2)


def test_legacy_capsule_is_consumed_once_by_8_threads(record_property):
    """A legacy `dltensor` capsule of a NumPy array, whose tensor holds a reference to it."""
    if np is None:
        skip("NumPy is not installed")
    record_property("gil_enabled", gil_enabled())
    array = np.arange(6.0).reshape(2, 3)
    check_rounds(array, array.__dlpack__, 2)


if __name__ == "__main__":
    print(sys.version)
    for test in (
        test_versioned_capsule_is_consumed_once_by_8_threads,
        test_legacy_capsule_is_consumed_once_by_8_threads,
    ):
        try:
            test(lambda name, value: None)
        except Skipped as e:
            print(f"{test.__name__}: skipped ({e})")
        else:
            print(f"{test.__name__}: passed")
