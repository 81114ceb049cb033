"""Borrow conflicts of arguments that borrow at extraction (`#[dlpack(borrow = "...")]`).

`alias`, `set_both` and `scale_into` take views that borrow their memory while pyo3 extracts
the arguments, as rust-numpy's `PyReadonlyArray` and `PyReadwriteArray` do. A conflict is then
a `BufferError` raised by the extraction, which pyo3 notes with the parameter's name
(`e.__notes__`, printed by tracebacks since Python 3.11), and whose message says what to do.
It is the same exception whichever registry refused: this crate's (two imports of ours) or
rust-numpy's (a `PyReadwriteArray` held by `dlpack_borrow_peer.readwrite_while`).

Borrows of NumPy memory are taken in rust-numpy's registry first once an extension built on
rust-numpy has published it, and that lasts for the process; a conflict between two imports of
ours is still reported by our registry, with both byte ranges. So the conflicts are provoked in
fresh interpreters: without rust-numpy's registry, and with it.
"""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import dlpack_example as de

RANGE = r"bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) \(\d+ bytes\) of host memory"
# What a refusal tells the user to do.
HINT = (
    "pass memory that does not overlap (a copy), take the borrows in turn "
    "(drop a readonly() guard before readwrite(), or drop the other "
)
HINT_END = "or give the other back with release_borrow()"
# Who holds the other borrow in rust-numpy's registry.
RUST_NUMPY_HOLDERS = (
    "the other borrow is held there by another live import of the same array through this "
    "crate, which records its borrows there too (an earlier argument of this call, or an import "
    "kept elsewhere), or by a PyReadonlyArray or PyReadwriteArray of an extension built on "
    "rust-numpy"
)

PRELUDE = """
import json
import numpy as np
import dlpack_example as de

def outcome(call):
    try:
        call()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "notes": getattr(e, "__notes__", [])}
    return None

def publish_rust_numpy_registry():
    import dlpack_borrow_peer as peer
    # rust-numpy publishes its registry at the first borrow an extension built on it takes.
    assert peer.readonly_sum(np.ones(2, np.float32)) == 2.0
    return peer

x, y = np.zeros(8, np.float32), np.zeros(8, np.float32)
"""


def isolated(body):
    """Runs `body` after `PRELUDE` in a fresh interpreter; what it printed last, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + body], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def assert_refused(outcome, parameter):
    """`outcome` is a `BufferError` raised while extracting `parameter`, telling what to do."""
    assert outcome is not None, "the call was not refused"
    assert outcome["type"] == "BufferError", outcome
    assert outcome["notes"] == [f"while processing '{parameter}'"], outcome
    message = outcome["message"]
    assert message.startswith("cannot import: cannot borrow bytes [0x"), message
    assert HINT in message and message.endswith(HINT_END), message
    return message


# (call, the parameter refused, how it asks, how the other holds)
CASES = {
    "alias(x,x)": ("de.alias(x, x)", "b", "exclusively", "exclusively"),
    "alias(x,x[1:])": ("de.alias(x, x[1:])", "b", "exclusively", "exclusively"),
    "set_both(x,x)": ("de.set_both(x, x, 1.0, 2.0)", "b", "exclusively", "exclusively"),
    "set_both(x[::2],x[2::2])": (
        "de.set_both(x[::2], x[2::2], 1.0, 2.0)", "b", "exclusively", "exclusively"
    ),
    "scale_into(x,x)": ("de.scale_into(x, x)", "dst", "exclusively", "shared"),
    "scale_into(x[:4],x[3:7])": ("de.scale_into(x[:4], x[3:7])", "dst", "exclusively", "shared"),
}


@pytest.mark.parametrize("rust_numpy", [False, True], ids=["alone", "rust-numpy published"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_our_registry_names_the_argument_and_the_fix(case, rust_numpy):
    # Once rust-numpy's registry is published, our borrows of NumPy memory are mirrored into it
    # first, and it refuses first: our registry's own conflict, which names the other import's
    # bytes, is still the one reported.
    call, parameter, requested, held = case
    publish = "publish_rust_numpy_registry()" if rust_numpy else ""
    refused, before, after = isolated(f"""
{publish}
refused = outcome(lambda: {call})
before = x.tolist()
# Nothing stays borrowed: the first argument's borrow ended with the call.
de.set_both(x, y, 3.0, 4.0)
print(json.dumps([refused, before, x.tolist()]))
""")
    message = assert_refused(refused, parameter)
    expected = (
        rf"^cannot import: cannot borrow {RANGE} {requested}: another live import of the same "
        rf"memory \(an earlier argument of this call, or an import kept elsewhere\) holds "
        rf"{RANGE} {held}, and an exclusive borrow may overlap no other; "
    )
    assert re.search(expected, message), message
    assert before == [0.0] * 8 and after == [3.0] * 8


def test_the_first_argument_is_named_when_it_is_refused():
    refused, result = isolated("""
held = de.hold(x, True)
refused = outcome(lambda: de.scale_into(x, y))
held.release()
de.scale_into(x + 1, x)
print(json.dumps([refused, x.tolist()]))
""")
    message = assert_refused(refused, "src")
    assert re.search(rf"{RANGE} shared: another live import .* holds {RANGE} exclusively", message)
    assert result == [2.0] * 8


# Calls made while rust-numpy holds a PyReadwriteArray of `x` or `y` (`readwrite_while(a, f)`
# holds one of `a` while it calls `f`), with the parameter refused.
RUST_NUMPY_CASES = {
    "alias(x[:2],x[4:])": ("peer.readwrite_while(x, lambda: de.alias(x[:2], x[4:]))", "a"),
    "set_both(x,y)": ("peer.readwrite_while(y, lambda: de.set_both(x, y, 1.0, 2.0))", "b"),
    "scale_into(x[4:],y)": ("peer.readwrite_while(x, lambda: de.scale_into(x[4:], y))", "src"),
    "scale_into(x,y[::2])": ("peer.readwrite_while(y, lambda: de.scale_into(x, y[::2]))", "dst"),
}


@pytest.mark.parametrize("case", RUST_NUMPY_CASES.values(), ids=RUST_NUMPY_CASES.keys())
def test_rust_numpy_registry_names_the_argument_and_the_fix(case):
    call, parameter = case
    refused, lows, highs = isolated(f"""
peer = publish_rust_numpy_registry()
refused = outcome(lambda: {call})
# Free again once the PyReadwriteArray is gone.
de.set_both(x[:4], y[4:], 5.0, 6.0)
print(json.dumps([refused, x[:4].tolist(), y[4:].tolist()]))
""")
    message = assert_refused(refused, parameter)
    assert re.search(
        rf"^cannot import: cannot borrow {RANGE} (shared|exclusively): rust-numpy holds a "
        r"conflicting borrow of the same NumPy array",
        message,
    ), message
    assert RUST_NUMPY_HOLDERS in message, message
    assert lows == [5.0] * 4 and highs == [6.0] * 4


def test_rust_numpy_extraction_raises_its_own_type_error():
    # The other way round: rust-numpy's own extraction refuses an array we hold exclusively,
    # with its own error type.
    refused, total = isolated("""
peer = publish_rust_numpy_registry()
held = de.hold(x, True)
refused = outcome(lambda: peer.readonly_sum(x))
held.release()
print(json.dumps([refused, float(peer.readonly_sum(x + 1))]))
""")
    assert refused == {
        "type": "TypeError",
        "message": "The given array is already borrowed",
        "notes": ["while processing 'x'"],
    }
    assert total == 8.0


def test_disjoint_views_are_written():
    x = np.zeros(8, np.float32)
    assert de.alias(x[:4], x[4:]) == 1.0
    assert x.tolist() == [1.0, 0, 0, 0, 2.0, 0, 0, 0]

    x = np.zeros(8, np.float32)
    de.set_both(x[::2], x[1::2], 1.0, 2.0)
    assert x.tolist() == [1.0, 2.0] * 4
    de.set_both(x[:4], x[4:], 3.0, 4.0)
    assert x.tolist() == [3.0] * 4 + [4.0] * 4

    x = np.arange(8, dtype=np.float32)
    de.scale_into(x[::2], x[1::2])
    assert x.tolist() == [0, 0, 2, 4, 4, 8, 6, 12]
    de.scale_into(x[:4], x[4:], 10.0)
    assert x.tolist() == [0, 0, 2, 4, 0, 0, 20, 40]
    # Two shared borrows never conflict, and a distinct output is written.
    y = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    de.scale_into(y, out, 3.0)
    assert out.tolist() == [0, 3, 6, 9]


def test_disjoint_views_are_written_with_rust_numpy_registry():
    values = isolated("""
peer = publish_rust_numpy_registry()
# rust-numpy compares borrows of one base array by range and stride gcd: halves of `x` are
# disjoint there too, and other memory is free while it holds `x`.
de.set_both(x[:4], x[4:], 1.0, 2.0)
peer.readwrite_while(x, lambda: de.set_both(y[::2], y[1::2], 3.0, 4.0))
print(json.dumps([x.tolist(), y.tolist()]))
""")
    assert values == [[1.0] + [1.0] * 3 + [2.0] * 4, [3.0, 4.0] * 4]
