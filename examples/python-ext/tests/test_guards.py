"""Borrows scoped to guards: a read's borrow ends with its block, so one array can be read
through one argument and then written through another.

`read_then_write(a, b)` sums `a` under `readonly()`, drops that guard, then writes the sum into
every element of `b` under `readwrite()`. `read_while_write(a, b)` keeps `a`'s guard alive while
it writes `b`: refused with `BufferError` exactly when the two views share a byte.
"""

import numpy as np
import pytest

import dlpack_example as de


def arange(n=8):
    return np.arange(n, dtype=np.float32)


def test_read_then_write_the_same_array():
    x = arange()
    assert de.read_then_write(x, x) == 28.0
    np.testing.assert_array_equal(x, np.full(8, 28.0, np.float32))
    # Nothing stays borrowed: the same call again reads what the first wrote.
    assert de.read_then_write(x, x) == 8 * 28.0
    np.testing.assert_array_equal(x, np.full(8, 8 * 28.0, np.float32))


def test_read_then_write_overlapping_views():
    x = arange()
    # Reads x[0:4] = 0, 1, 2, 3, then writes the sum into x[2:8].
    assert de.read_then_write(x[:4], x[2:]) == 6.0
    np.testing.assert_array_equal(x, np.array([0, 1, 6, 6, 6, 6, 6, 6], np.float32))


@pytest.mark.parametrize(
    "views",
    [
        lambda x: (x, x),
        lambda x: (x[:4], x[2:]),
        lambda x: (x[::-1], x[7:]),
        lambda x: (x[::2], x[2::4]),
    ],
    ids=["x,x", "x[:4],x[2:]", "x[::-1],x[7:]", "x[::2],x[2::4]"],
)
def test_reading_while_writing_overlapping_views_is_refused(views):
    x = arange()
    a, b = views(x)
    with pytest.raises(BufferError, match=r"cannot borrow bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\) .*exclusive"):
        de.read_while_write(a, b)
    # Refused before anything was written, and no borrow outlives the call.
    np.testing.assert_array_equal(x, arange())
    total = float(a.sum())
    assert de.read_then_write(a, b) == total
    np.testing.assert_array_equal(b, np.full(b.shape, total, np.float32))


@pytest.mark.parametrize(
    "views, written",
    [
        # x[::2] = 0, 2, 4, 6 (sum 12) written into x[1::2].
        (lambda x: (x[::2], x[1::2]), [0, 12, 2, 12, 4, 12, 6, 12]),
        # x[:4] = 0, 1, 2, 3 (sum 6) written into x[4:].
        (lambda x: (x[:4], x[4:]), [0, 1, 2, 3, 6, 6, 6, 6]),
    ],
    ids=["x[::2],x[1::2]", "x[:4],x[4:]"],
)
def test_reading_while_writing_disjoint_views_works(views, written):
    x = arange()
    a, b = views(x)
    total = float(a.sum())
    assert de.read_while_write(a, b) == total
    np.testing.assert_array_equal(x, np.array(written, np.float32))


def test_distinct_arrays_are_read_and_written():
    x, y = arange(), np.zeros(3, np.float32)
    assert de.read_while_write(x, y) == 28.0
    np.testing.assert_array_equal(y, np.full(3, 28.0, np.float32))
    np.testing.assert_array_equal(x, arange())


def test_read_only_arrays_are_refused_for_writing():
    x = arange()
    x.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        de.read_then_write(x, x)
    np.testing.assert_array_equal(x, arange())
