"""Deleters of our exports that run while the interpreter exits: from an `atexit` handler, from
module teardown, on threads that Python does not know (made by C: `pthread_create`, POSIX timer
threads), on daemon threads, and after `Py_FinalizeEx` has returned (a C exit handler).

A deleter that runs on a thread that is not attached while the interpreter finalizes, or after,
must leave the Python reference it holds rather than attach (attaching then would end or hang
the thread); one that runs earlier releases it as usual. Either way the process must exit
cleanly: each scenario runs in a child interpreter, which must exit with status 0 (a crash is a
negative status), print nothing on stderr (no "Fatal Python error", no panic, no report of the
crate), reach the end of its C exit handlers, and finish within the timeout (a hang fails the
test).
"""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="the scenarios call glibc (pthread_create, timer_create, __cxa_atexit) through ctypes",
)

TIMEOUT = 60

# What every child starts with: `take(x)` consumes a versioned capsule of `x` as a C consumer
# does (renames it, so the capsule no longer deletes) and returns the `DLManagedTensorVersioned`
# pointer and its deleter's address; `at_c_exit(message)` prints `message` from a C exit handler
# (run by `exit()` after `Py_FinalizeEx`; LIFO: register it first to run it last).
PRELUDE = """
import ctypes, os, sys
import dlpack_example as de

libc = ctypes.CDLL(None)
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
cxa_atexit = getattr(libc, "__cxa_atexit")
cxa_atexit.restype = ctypes.c_int
cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
libc.strdup.restype = ctypes.c_void_p
libc.strdup.argtypes = [ctypes.c_char_p]


def address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def take(x):
    capsule = x.__dlpack__(max_version=(1, 0))
    pointer = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    # The name must outlive the capsule, which dies here.
    assert api.PyCapsule_SetName(capsule, b"used_dltensor_versioned") == 0
    del capsule
    deleter = ctypes.c_void_p.from_address(pointer + 16).value  # DLManagedTensorVersioned
    return pointer, deleter


def at_c_exit(message):
    # puts(message) from exit(), after Py_FinalizeEx; the string is malloc'd and never freed.
    assert cxa_atexit(address(libc.puts), libc.strdup(message.encode()), None) == 0
"""


def run_child(body, timeout=TIMEOUT):
    """Runs PRELUDE + `body` in a child interpreter; fails on a hang."""
    code = PRELUDE + textwrap.dedent(body)
    try:
        return subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(
            f"the child hung (no exit within {timeout} s)\n"
            f"stdout: {hung.stdout!r}\nstderr: {hung.stderr!r}"
        )


def assert_clean_exit(result, *markers):
    """Exit status 0 (not a signal), nothing on stderr, and every marker printed."""
    report = f"status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, f"the child did not exit cleanly: {report}"
    assert result.stderr == "", f"the child wrote to stderr: {report}"
    for marker in markers:
        assert marker in result.stdout, f"{marker!r} missing: {report}"


def test_the_harness_sees_a_crash_a_hang_and_stderr():
    crashed = run_child("os.abort()")
    assert crashed.returncode < 0
    with pytest.raises(AssertionError, match="did not exit cleanly"):
        assert_clean_exit(crashed)
    with pytest.raises(pytest.fail.Exception, match="hung"):
        run_child("import time; time.sleep(60)", timeout=3)
    with pytest.raises(AssertionError, match="wrote to stderr"):
        assert_clean_exit(run_child("print('Fatal Python error: x', file=sys.stderr)"))
    with pytest.raises(AssertionError, match="missing"):
        assert_clean_exit(run_child("pass"), "never printed")


def test_atexit_handler_drops_the_last_references():
    # The last capsule (spec protocol: its destructor deletes) and a NumPy array of the export
    # are dropped in an `atexit` handler, where the interpreter is still whole: the deleters
    # release their references at once. Exports left in module globals are deleted during
    # module teardown, while the interpreter finalizes.
    result = run_child(
        """
        import atexit
        import numpy as np

        state = {"t": de.Tensor.arange(1000)}
        state["capsule"] = state["t"].__dlpack__(max_version=(1, 0))
        state["array"] = np.from_dlpack(state["t"])

        def release():
            t = state.pop("t")
            before = sys.getrefcount(t)
            state.clear()
            assert sys.getrefcount(t) == before - 2, (before, sys.getrefcount(t))
            print("atexit: both deleters released the tensor", flush=True)

        atexit.register(release)
        at_c_exit("c exit handlers ran")

        # Left for module teardown.
        leftover = de.Tensor.arange(1000)
        leftover_capsule = leftover.__dlpack__(max_version=(1, 0))
        leftover_array = np.from_dlpack(leftover)
        leftover_copy = leftover.__dlpack__()  # a legacy copy: the deleter frees memory only
        """
    )
    assert_clean_exit(result, "atexit: both deleters released the tensor", "c exit handlers ran")


def test_consumer_deletes_during_module_teardown():
    # A consumer object (a nanobind array, say) in module globals that calls the deleter itself
    # when collected at teardown, while the interpreter finalizes: with the GIL (PYFUNCTYPE)
    # and without it (CFUNCTYPE releases it around the call).
    result = run_child(
        """
        class Array:
            def __init__(self, x, gil):
                self.pointer, deleter = take(x)
                prototype = ctypes.PYFUNCTYPE if gil else ctypes.CFUNCTYPE
                self.deleter = prototype(None, ctypes.c_void_p)(deleter)
                self.gil = gil

            def __del__(self, write=os.write):
                self.deleter(self.pointer)
                write(1, b"teardown: deleter returned, gil=%d\\n" % self.gil)

        with_gil = Array(de.Tensor.arange(1000), gil=True)
        without_gil = Array(de.Strided(10, 10, "t"), gil=False)
        at_c_exit("c exit handlers ran")
        """
    )
    assert_clean_exit(
        result,
        "teardown: deleter returned, gil=1",
        "teardown: deleter returned, gil=0",
        "c exit handlers ran",
    )


def test_deleter_after_the_interpreter_finalized():
    # `exit()` runs C exit handlers after `Py_FinalizeEx` returned: there the deleter runs on
    # the main thread with no interpreter at all.
    result = run_child(
        """
        t = de.Tensor.arange(1000)
        at_c_exit("c exit handlers ran after the deleters")  # LIFO: runs last
        for x in [t, de.Strided(4, 5, "reversed"), t]:
            pointer, deleter = take(x)
            assert cxa_atexit(deleter, pointer, None) == 0  # deleter(pointer) at exit()
        print("main: done", flush=True)
        """
    )
    assert_clean_exit(result, "main: done", "c exit handlers ran after the deleters")


def test_non_python_thread_waits_for_the_gil_while_finalization_starts():
    # The deleter runs on a thread made by C (pthread_create with the deleter as its start
    # routine), started by the last `atexit` callback while the main thread holds the GIL:
    # it asks for the GIL (the interpreter is not finalizing yet) and waits. The main thread
    # keeps the GIL for 50 ms more in C (`usleep` called through PyDLL, no bytecode), then
    # finalization starts; the first Python code of finalization (a `__del__` run by the
    # collector) lets the waiting thread have the GIL, which CPython refuses to a thread
    # while finalizing (it ends or parks the thread). The process must still exit cleanly.
    result = run_child(
        """
        import atexit

        pylibc = ctypes.PyDLL(None)  # called with the GIL held
        pylibc.pthread_create.restype = ctypes.c_int
        pylibc.pthread_create.argtypes = [ctypes.c_void_p] * 4
        pylibc.usleep.argtypes = [ctypes.c_uint]
        thread = ctypes.c_ulong()
        start, argument = ctypes.c_void_p(), ctypes.c_void_p()
        # atexit callbacks run last-registered first, and these two are C calls: no bytecode
        # runs after them until finalization.
        atexit.register(pylibc.usleep, 50_000)
        atexit.register(pylibc.pthread_create, ctypes.addressof(thread), None, start, argument)

        t = de.Tensor.arange(1000)
        argument.value, start.value = take(t)

        class Cycle:
            def __del__(self, write=os.write):
                sum(range(100_000))
                write(1, b"finalizing: python code ran\\n")

        cycle = Cycle()
        cycle.self = cycle
        del cycle
        at_c_exit("c exit handlers ran")
        """
    )
    assert_clean_exit(result, "finalizing: python code ran", "c exit handlers ran")


def test_deleters_on_timer_threads_around_finalization():
    # POSIX timers with SIGEV_THREAD call the deleter on a new thread that Python does not
    # know, at set delays from the end of the main script: before, during and after
    # finalization. A C exit handler keeps the process alive until every timer has fired.
    result = run_child(
        """
        class sigevent(ctypes.Structure):  # struct sigevent, glibc x86-64 / aarch64 layout
            _fields_ = [
                ("sigev_value", ctypes.c_void_p),
                ("sigev_signo", ctypes.c_int),
                ("sigev_notify", ctypes.c_int),
                ("sigev_notify_function", ctypes.c_void_p),
                ("sigev_notify_attributes", ctypes.c_void_p),
                ("_pad", ctypes.c_int * 8),
            ]

        class timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        class itimerspec(ctypes.Structure):
            _fields_ = [("it_interval", timespec), ("it_value", timespec)]

        assert ctypes.sizeof(sigevent) == 64
        SIGEV_THREAD, CLOCK_MONOTONIC = 2, 1
        libc.timer_create.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        libc.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        libc.usleep.argtypes = [ctypes.c_uint]

        at_c_exit("c exit handlers ran")
        # Runs before the message (LIFO): waits until every timer has fired.
        assert cxa_atexit(address(libc.usleep), 500_000, None) == 0

        timers, tensors = [], [de.Tensor.arange(1000), de.Strided(8, 8, "t")]
        delays_ms = [0, 1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200, 300]
        for i, delay in enumerate(delays_ms):
            pointer, deleter = take(tensors[i % 2])
            event = sigevent(sigev_value=pointer, sigev_notify=SIGEV_THREAD,
                             sigev_notify_function=deleter)
            timer = ctypes.c_void_p()
            assert libc.timer_create(CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0
            timers.append(timer)
        # Armed last, back to back, so that the delays count from the end of the script.
        for timer, delay in zip(timers, delays_ms):
            when = itimerspec(it_value=timespec(0, int(max(delay, 0.001) * 1_000_000)))
            assert libc.timer_settime(timer, 0, ctypes.byref(when), None) == 0
        print("main: timers armed", flush=True)
        """
    )
    assert_clean_exit(result, "main: timers armed", "c exit handlers ran")


def test_deleters_on_daemon_threads_around_finalization():
    # Python daemon threads that sleep, then call the deleter through ctypes (which releases the
    # GIL around the call, so the deleter must attach by itself), while the main thread exits
    # at once: some run before finalization, some while the interpreter finalizes (a daemon
    # thread is ended when it asks for the GIL back), some never.
    result = run_child(
        """
        import threading, time

        sys.setswitchinterval(1e-5)
        tensors = [de.Tensor.arange(1000), de.Strided(8, 8, "reversed")]

        def late(pointer, deleter, delay):
            time.sleep(delay)
            ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(pointer)

        delays = [0, 0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012, 0.02, 0.05]
        for i, delay in enumerate(delays):
            pointer, deleter = take(tensors[i % 2])
            threading.Thread(target=late, args=(pointer, deleter, delay), daemon=True).start()
        at_c_exit("c exit handlers ran")
        print("main: threads started", flush=True)
        """
    )
    assert_clean_exit(result, "main: threads started", "c exit handlers ran")
