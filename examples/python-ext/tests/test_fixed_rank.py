"""Derived consumers of fixed rank (`[usize; 1]` shape and `[isize; 1]` strides) as pyfunction
arguments: values read and written in place, borrows checked as for the views of any rank, and a
tensor of another rank refused at extraction (`BufferError`) with both ranks named. The rust-numpy functions of
any rank (`PyReadonlyArrayDyn`, `PyReadwriteArrayDyn`) that the benchmarks set beside the views
of any rank are checked here too, so that the timed calls compute what they claim to.
"""

import numpy as np
import pytest

import dlpack_borrow_peer as peer
import dlpack_example as de


def test_total_1d_reads_in_logical_order():
    assert de.total_1d(np.arange(10.0)) == 45.0
    assert de.total_1d(np.arange(10.0)[::-2]) == 25.0  # 9 + 7 + 5 + 3 + 1
    assert de.total_1d(np.arange(12.0).reshape(3, 4)[:, 1]) == 1.0 + 5.0 + 9.0
    assert de.total_1d(np.zeros(0)) == 0.0


@pytest.mark.parametrize("shape", [(), (2, 3), (1, 1, 1)])
def test_another_rank_is_refused_at_extraction(shape):
    x = np.ones(shape)
    with pytest.raises(BufferError) as info:
        de.total_1d(x)
    assert str(info.value) == f"tensor has ndim {len(shape)}, expected 1"
    assert info.value.__notes__ == ["while processing 'x'"]


def test_fill_1d_writes_in_place():
    x = np.zeros(5, np.float32)
    assert de.fill_1d(x, 2.5) == 5
    assert x.tolist() == [2.5] * 5


def test_fill_1d_refuses_a_strided_vector():
    x = np.zeros(6, np.float32)
    with pytest.raises(BufferError, match="is not C-contiguous") as info:
        de.fill_1d(x[::2], 1.0)
    assert info.value.__notes__ == ["while processing 'out'"]
    assert x.tolist() == [0.0] * 6


def test_alias_1d_writes_both_or_refuses_overlap():
    a, b = np.zeros(3, np.float32), np.zeros(3, np.float32)
    assert de.alias_1d(a, b) == 1.0
    assert (a[0], b[0]) == (1.0, 2.0)
    x = np.zeros(8, np.float32)
    with pytest.raises(BufferError) as info:
        de.alias_1d(x, x[1:])
    assert getattr(info.value, "__notes__", []) == ["while processing 'b'"]
    assert x.tolist() == [0.0] * 8
    assert de.alias_1d(x[:4], x[4:]) == 1.0
    assert (x[0], x[4]) == (1.0, 2.0)


def test_rust_numpy_functions_of_any_rank():
    assert peer.readonly_sum_dyn(np.arange(6.0).reshape(2, 3)) == 15.0
    assert peer.readonly_sum_dyn(np.arange(6.0)[::-1]) == 15.0
    x = np.zeros((2, 3), np.float32)
    assert peer.readwrite_fill_dyn(x, 1.5) == 6
    assert x.tolist() == [[1.5] * 3] * 2
    a, b = np.zeros(2, np.float32), np.zeros(2, np.float32)
    assert peer.readwrite_pair_dyn(a, b) == 1.0
    assert (a[0], b[0]) == (1.0, 2.0)
