"""α–β collective costs against hand-computed values (SPEC §6)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rpeg.costmodel.collectives import (
    allgather_time,
    allreduce_time,
    alltoall_time,
    p2p_time,
    reduce_scatter_time,
)
from rpeg.ir.hardware import Link

LINK = Link(alpha=1e-5, beta=1e-9)  # 10 µs, 1 GB/s
COLLECTIVES = (allreduce_time, allgather_time, reduce_scatter_time, alltoall_time)


def test_hand_computed_four_ranks_one_megabyte():
    # p = 4, M = 1e6 B, α = 1e-5 s, β = 1e-9 s/B
    assert allreduce_time(4, 1e6, LINK) == pytest.approx(2 * 3 * 1e-5 + 2 * 0.75 * 1e6 * 1e-9)
    assert allreduce_time(4, 1e6, LINK) == pytest.approx(1.56e-3)
    assert allgather_time(4, 1e6, LINK) == pytest.approx(3e-5 + 0.75e-3)
    assert reduce_scatter_time(4, 1e6, LINK) == pytest.approx(7.8e-4)
    assert alltoall_time(4, 1e6, LINK) == pytest.approx(3e-5 + 1e-3)
    assert p2p_time(1e6, LINK) == pytest.approx(1e-5 + 1e-3)


def test_two_ranks():
    # p = 2: AllReduce 2α + M·β, AllGather α + M·β/2
    assert allreduce_time(2, 2000.0, LINK) == pytest.approx(2e-5 + 2000 * 1e-9)
    assert allgather_time(2, 2000.0, LINK) == pytest.approx(1e-5 + 1000 * 1e-9)


@pytest.mark.parametrize("fn", COLLECTIVES)
def test_single_rank_costs_nothing(fn):
    assert fn(1, 1e9, LINK) == 0.0


@pytest.mark.parametrize("fn", COLLECTIVES)
@pytest.mark.parametrize("p", [0, -2, 1.5, True])
def test_bad_rank_count(fn, p):
    with pytest.raises(ValueError, match="p must be a positive integer"):
        fn(p, 10.0, LINK)


@pytest.mark.parametrize("fn", COLLECTIVES)
def test_negative_message(fn):
    with pytest.raises(ValueError, match="nbytes"):
        fn(4, -1.0, LINK)
    with pytest.raises(ValueError, match="nbytes"):
        p2p_time(math.nan, LINK)


@given(
    p=st.integers(2, 512),
    m=st.floats(0, 1e11, allow_nan=False),
    extra=st.floats(1, 1e9),
)
def test_monotone_in_message_and_ranks(p, m, extra):
    for fn in COLLECTIVES:
        assert fn(p, m + extra, LINK) > fn(p, m, LINK) >= fn(p - 1, m, LINK)
    # A ring AllReduce is a ReduceScatter followed by an AllGather.
    assert allreduce_time(p, m, LINK) == pytest.approx(
        reduce_scatter_time(p, m, LINK) + allgather_time(p, m, LINK)
    )
