"""Borrows of imported memory from Python: two imports of one array never alias mutably.

The extension is built in release mode (scripts/test.sh), where a `&mut [f32]` aliasing another
reference is miscompiled: `alias(x, x)` would return 1.0 with 2.0 in memory. The borrow registry
refuses the second borrow with `BufferError` instead. `dlpack_borrow_peer` is a second extension
module with its own copy of dlpack-runtime: borrows conflict across the two, since every copy in
the process uses one registry.
"""

import gc
import sys

import numpy as np

import pytest

import dlpack_borrow_peer as peer
import dlpack_example as de


def zeros(n=8):
    return np.zeros(n, np.float32)


@pytest.mark.parametrize(
    "second",
    [lambda x: x, lambda x: x[:], lambda x: x[1:], lambda x: x[3:5]],
    ids=["x", "x[:]", "x[1:]", "x[3:5]"],
)
@pytest.mark.parametrize("function", [de.alias, de.alias_in_one], ids=["args", "from_dlpack"])
def test_overlapping_writable_views_are_refused(function, second):
    x = zeros()
    y = second(x)
    with pytest.raises(BufferError, match=r"cannot borrow bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) .*exclusive.* holds bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\)"):
        function(x, y)
    # The first borrow was given back with its import: nothing stays borrowed.
    assert function(x[:4], x[4:]) == 1.0


@pytest.mark.parametrize("function", [de.alias, de.alias_in_one], ids=["args", "from_dlpack"])
def test_disjoint_views_and_distinct_arrays_are_written(function):
    x = zeros()
    assert function(x[:4], x[4:]) == 1.0
    assert x.tolist() == [1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]
    a, b = zeros(3), zeros(3)
    assert function(a, b) == 1.0
    assert (a[0], b[0]) == (1.0, 2.0)


def test_the_refusal_names_both_ranges():
    x = zeros()
    base = x.ctypes.data
    with pytest.raises(BufferError) as info:
        de.alias(x, x[1:])
    message = str(info.value)
    requested = f"bytes [{base + 4:#x}, {base + 32:#x}) (28 bytes) of host memory exclusively"
    held = f"bytes [{base:#x}, {base + 32:#x}) (32 bytes) of host memory exclusively"
    assert requested in message and held in message, message


def test_interleaved_views_are_written_at_once():
    x = zeros()
    de.write_interleaved(x[::2], x[1::2], 1.0, 2.0)
    assert x.tolist() == [1.0, 2.0] * 4
    # Reversed and interleaved: still disjoint.
    de.write_interleaved(x[::-2], x[-2::-2], 3.0, 4.0)
    assert x.tolist() == [4.0, 3.0] * 4
    # Overlapping strided views are refused.
    with pytest.raises(BufferError, match="cannot borrow"):
        de.write_interleaved(x[::2], x[2::2], 5.0, 6.0)


def test_a_held_borrow_refuses_others_until_released():
    x = zeros()
    held = de.hold(x, True)
    with pytest.raises(BufferError):
        de.hold(x[2:], False)
    with pytest.raises(BufferError):
        de.fill(x, 1.0)
    de.fill(np.zeros(2, np.float32), 1.0)  # other memory is free
    held.release()
    assert de.fill(x, 1.0) == 8
    shared = de.hold(x, False)
    assert de.hold(x, False) is not None, "shared borrows coexist"
    with pytest.raises(BufferError):
        de.hold(x, True)
    del shared
    gc.collect()
    de.hold(x, True).release()


def test_borrows_are_checked_across_extension_modules():
    x = zeros()
    held = peer.hold(x, True)
    with pytest.raises(BufferError, match="cannot borrow"):
        de.alias(x[2:4], x[6:])
    with pytest.raises(BufferError, match="cannot borrow"):
        de.hold(x[7:], False)
    held.release()
    assert de.alias(x[2:4], x[6:]) == 1.0

    held = de.hold(x[:4], True)
    with pytest.raises(BufferError, match="cannot borrow"):
        peer.write(x, 9.0)
    peer.write(x[4:], 9.0)
    assert x[4:].tolist() == [9.0] * 4
    held.release()
    peer.write(x, 7.0)
    assert x.tolist() == [7.0] * 8


def test_one_registry_is_published_for_the_process():
    shared = sys.modules["_dlpack_runtime_shared"]
    assert type(shared.BORROW_CHECKING_API).__name__ == "PyCapsule"


def test_a_foreign_object_in_the_registry_slot_is_an_error_not_a_crash():
    # A fresh interpreter, so that no copy of the crate has found the registry yet.
    import subprocess

    code = (
        "import sys, types, numpy as np\n"
        "m = types.ModuleType('_dlpack_runtime_shared'); m.BORROW_CHECKING_API = 42\n"
        "sys.modules['_dlpack_runtime_shared'] = m\n"
        "import dlpack_example as de\n"
        "try:\n"
        "    de.fill(np.zeros(2, np.float32), 1.0)\n"
        "except BufferError as e:\n"
        "    print('BufferError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BufferError: the borrow registry is unavailable" in out.stdout, out.stdout


@pytest.fixture
def rust_numpy_registry():
    """rust-numpy publishes its registry at the first borrow an extension built on it takes."""
    assert peer.readonly_sum(np.ones(2, np.float32)) == 2.0
    import numpy._core.multiarray as multiarray

    assert hasattr(multiarray, "_RUST_NUMPY_BORROW_CHECKING_API")


def test_rust_numpy_readwrite_borrows_refuse_ours(rust_numpy_registry):
    x = zeros()
    # While rust-numpy holds a PyReadwriteArray of `x`, our borrows of `x`'s memory are refused.
    with pytest.raises(BufferError, match="rust-numpy holds a conflicting borrow"):
        peer.readwrite_while(x, lambda: de.alias(x[:2], x[4:6]))
    with pytest.raises(BufferError, match="rust-numpy holds a conflicting borrow"):
        peer.readwrite_while(x, lambda: de.hold(x[6:], False))
    # Other memory is free meanwhile, and so is `x` once the PyReadwriteArray is gone.
    y = zeros()
    assert peer.readwrite_while(x, lambda: de.alias(y[:2], y[4:6])) == 1.0
    assert x[0] == 1.0 and y[0] == 1.0 and y[4] == 2.0
    assert de.alias(x[:2], x[4:6]) == 1.0


def test_our_borrows_refuse_rust_numpy_ones(rust_numpy_registry):
    x = zeros()
    held = de.hold(x[:4], True)
    # rust-numpy's refusal is its own: a TypeError.
    with pytest.raises(TypeError, match="already borrowed"):
        peer.readonly_sum(x)
    # rust-numpy compares ranges of one base array: a disjoint half is free there too.
    assert peer.readonly_sum(x[4:]) == 0.0
    held.release()
    assert peer.readonly_sum(x) == 0.0
    # A shared borrow of ours lets rust-numpy read, not write.
    shared = de.hold(x, False)
    assert peer.readonly_sum(x) == 0.0
    with pytest.raises(TypeError, match="already borrowed"):
        peer.readwrite_while(x, lambda: None)
    shared.release()
    peer.readwrite_while(x, lambda: None)
    assert x[0] == 1.0


def test_a_refused_borrow_leaves_nothing_in_rust_numpy(rust_numpy_registry):
    x = zeros()
    # `z` shares `x`'s memory through another base object (NumPy's capsule): rust-numpy, which
    # compares borrows of one base array only, does not see them overlap; our registry does.
    z = np.from_dlpack(x)
    held = de.hold(z, True)
    # Granted by rust-numpy, refused by our registry: taken back in rust-numpy too.
    with pytest.raises(BufferError, match="another live import of the same memory"):
        peer.hold(x[2:], False)
    held.release()
    # A shared borrow of `x` left behind in rust-numpy would refuse this.
    peer.readwrite_while(x, lambda: None)
    assert x[0] == 1.0


def test_an_array_retyped_while_borrowed_gives_its_rust_numpy_borrow_back(rust_numpy_registry):
    # rust-numpy computes a borrow's key from the array again at the release. Python code may
    # give the array another dtype, shape or strides meanwhile: the mirror's private view of it
    # keeps the geometry the key was computed from, so the borrow is released exactly, and no
    # borrow is left behind to refuse the array, or a later array at the same address.
    def borrow_and_retype():
        x = zeros()
        held = de.hold(x, False)
        x.dtype = np.int32
        held.release()

    borrow_and_retype()
    # Arrays made afterwards (CPython's allocator usually puts one at the freed array's address,
    # which a borrow left behind in rust-numpy's registry would refuse) are free.
    for y in [zeros() for _ in range(4)]:
        assert peer.readwrite_fill(y, 3.0) == 8
        assert de.alias(y[:2], y[4:6]) == 1.0
    # The same with a view retyped while an exclusive borrow of it is held.
    x = zeros()
    v = x[:4]
    held = de.hold(v, True)
    v.dtype = np.int16
    held.release()
    peer.readwrite_while(x, lambda: None)
    assert x[0] == 1.0


def test_borrows_before_rust_numpy_published_its_registry_are_not_mirrored():
    # A fresh interpreter: no extension built on rust-numpy has borrowed yet, so its registry
    # does not exist, and a borrow of ours cannot be mirrored into it (as documented).
    import subprocess

    code = (
        "import numpy as np, dlpack_example as de, dlpack_borrow_peer as peer\n"
        "x = np.zeros(4, np.float32)\n"
        "held = de.hold(x, True)\n"
        "print('before:', peer.readonly_sum(x))\n"
        "held.release()\n"
        "held = de.hold(x, True)\n"
        "try:\n"
        "    peer.readonly_sum(x)\n"
        "except TypeError as e:\n"
        "    print('after:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before: 0.0", "after: The given array is already borrowed"]


def test_a_relay_lent_read_only_keeps_a_shared_borrow_only():
    x = zeros()
    r = de.relay(x, "write")  # its import wrote through `&mut`: an exclusive borrow
    assert x.tolist() == [5.0] * 8
    with pytest.raises(BufferError):
        de.hold(x, False)
    # Lent on read-only (a frozen pyclass, `&self`): the borrow becomes shared.
    a = np.from_dlpack(r)
    assert a.tolist() == [5.0] * 8 and not a.flags.writeable
    de.hold(x, False).release()
    with pytest.raises(BufferError):
        de.hold(x, True)
    del a, r
    gc.collect()
    de.hold(x, True).release()


def test_a_relay_of_numpy_memory_is_lent_in_rust_numpy_too(rust_numpy_registry):
    x = zeros()
    r = de.relay(x)  # holds the import, untouched: no borrow yet
    peer.readwrite_while(x, lambda: None)
    a = np.from_dlpack(r)  # lent on: rust-numpy learns of the loan
    with pytest.raises(TypeError, match="already borrowed"):
        peer.readwrite_while(x, lambda: None)
    assert peer.readonly_sum(x) == a.sum()
    del a, r
    gc.collect()
    peer.readwrite_while(x, lambda: None)
    # While a PyReadwriteArray is held, the relay cannot be lent on.
    r = de.relay(x)
    with pytest.raises(BufferError, match="rust-numpy holds a conflicting borrow"):
        peer.readwrite_while(x, lambda: np.from_dlpack(r))


def test_a_subclass_cannot_fake_the_private_view(rust_numpy_registry):
    class Sneaky(np.ndarray):
        def view(self, *args, **kwargs):
            raise AssertionError("the subclass's view must not be called")

    x = zeros().view(Sneaky)
    held = de.hold(x, True)
    with pytest.raises(TypeError, match="already borrowed"):
        peer.readonly_sum(np.asarray(x))
    held.release()
    assert peer.readonly_sum(np.asarray(x)) == 0.0
