"""Tests for ``scoring/scheduler.py`` (list scheduling, SPEC §7) and ``scoring/check.py``.

Tiny hand-built executable graphs with schedules worked out by hand pin down the EST rule and
every tie-break; a property test compares the scheduler with a naive device-by-device
re-implementation of SPEC §7 on random DAGs and checks validity with ``check_schedule``.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.ir.lower import COMM, OP, RESHARD, ExecGraph
from rpeg.scoring.check import check_schedule
from rpeg.scoring.scheduler import Schedule, atoms_of, list_schedule

D0, D1, D2, D3 = 1, 2, 4, 8  # one-device masks


def graph(*nodes) -> ExecGraph:
    """``nodes``: ``(kind, vertex, step, mask, duration, preds)`` tuples, in id order."""
    g = ExecGraph()
    for kind, vertex, step, mask, dur, preds in nodes:
        g.add(kind, vertex, -1 if kind == OP else 0, step, 0, mask, 0.0, float(dur), list(preds))
    return g


def order(s: Schedule) -> list[int]:
    """Node ids by start time (ids break ties, only used where starts differ)."""
    return sorted(range(len(s.start)), key=lambda i: (s.start[i], i))


# ---------------------------------------------------------------------------- EST rule
def test_node_waits_for_its_predecessors_and_its_devices():
    # n0 (dev0, 2 s) and n1 (dev1, 5 s) start at 0; n2 on dev0 waits for its pred n1 (5), not
    # for dev0 (free at 2); n3 on dev0+dev1 waits for its pred n0 (2) and both devices:
    # dev1 is free at 5 and dev0 at 6 (after n2), so n3 starts at 6.
    g = graph(
        (OP, 0, 0, D0, 2, []),
        (OP, 1, 0, D1, 5, []),
        (OP, 2, 0, D0, 1, [1]),
        (OP, 3, 0, D0 | D1, 1, [0]),
    )
    s = list_schedule(g)
    assert s.start == [0.0, 0.0, 5.0, 6.0]
    assert s.finish == [2.0, 5.0, 6.0, 7.0]
    assert s.makespan == 7.0
    assert check_schedule(g, s) == []
    # blockers: n2 by its predecessor n1, n3 by n2 (the last user of dev0); n0, n1 start at 0
    assert s.blocker == [-1, -1, 1, 2]
    assert s.critical_path() == [1, 2, 3]


def test_earliest_start_wins_over_every_tie_break():
    # n0 (rank 105) goes first and makes the COMM n1 ready, with EST 4. The COMM then beats the
    # OP n2 on every tie-break (kind, rank 101 vs 3, vertex order) but n2's EST is 0, so n2
    # runs at 0 on dev0 and the COMM at 4.
    g = graph(
        (OP, 0, 0, D1, 4, []),
        (COMM, 1, 0, D0, 1, [0]),
        (OP, 2, 0, D0, 3, []),
        (OP, 1, 0, D0, 100, [1]),
    )
    s = list_schedule(g)
    assert s.start == [0.0, 4.0, 0.0, 5.0]
    assert check_schedule(g, s) == []


# ---------------------------------------------------------------------------- tie-breaks
@pytest.mark.parametrize("kind", [COMM, RESHARD])
def test_ties_go_to_comm_and_reshard_before_op(kind):
    # Both ready at 0 on dev0. The OP has the larger downstream rank (10 vs 1) and the smaller
    # vertex index, yet the COMM/RESHARD goes first.
    g = graph(
        (OP, 0, 0, D0, 10, []),
        (kind, 1, 0, D0, 1, []),
    )
    s = list_schedule(g)
    assert s.start == [1.0, 0.0]
    assert s.finish == [11.0, 1.0]
    assert s.makespan == 11.0


def test_ties_between_transfers_go_by_rank():
    # A COMM and a RESHARD tie on EST and on "not an OP"; the larger rank (the RESHARD, whose
    # successor is long) goes first even though its vertex index is larger.
    g = graph(
        (COMM, 0, 0, D0, 1, []),
        (RESHARD, 5, 0, D0, 1, []),
        (OP, 5, 0, D1, 9, [1]),
    )
    s = list_schedule(g)
    assert s.start == [1.0, 0.0, 1.0]


def test_ties_go_to_larger_downstream_rank():
    # n0: rank 1 + 5 (its successor n2) = 6; n1: rank 3. n0 goes first although vertex order
    # (5 vs 0) prefers n1.
    g = graph(
        (OP, 5, 0, D0, 1, []),
        (OP, 0, 0, D0, 3, []),
        (OP, 1, 0, D1, 5, [0]),
    )
    s = list_schedule(g)
    assert s.start == [0.0, 1.0, 1.0]
    assert s.makespan == 6.0
    # the reverse order would have been worse: n1 0..3, n0 3..4, n2 4..9


def test_rank_is_own_time_plus_longest_successor_rank():
    # n0 -> n2 (2 s) and n0 -> n3 (1 s) -> n4 (3 s): rank(n0) = 1 + max(2, 1 + 3) = 5.
    # n1 has rank 4.5 and competes with n0 for dev0, so n0 goes first only because rank(n0)
    # follows the longest chain (not the first or the shortest successor).
    g = graph(
        (OP, 3, 0, D0, 1, []),
        (OP, 0, 0, D0, 4.5, []),
        (OP, 4, 0, D1, 2, [0]),
        (OP, 4, 0, D2, 1, [0]),
        (OP, 4, 0, D2, 3, [3]),
    )
    s = list_schedule(g)
    assert s.start[0] == 0.0
    assert s.start[1] == 1.0


def test_ties_go_to_vertex_order_then_step_then_id():
    # Equal EST, kind and rank: vertex order first, then step, then node id.
    g = graph(
        (OP, 3, 0, D0, 1, []),  # n0
        (OP, 1, 1, D0, 1, []),  # n1
        (OP, 1, 0, D0, 1, []),  # n2
        (OP, 2, 2, D0, 1, []),  # n3
        (OP, 1, 0, D0, 1, []),  # n4: same vertex and step as n2, larger id
    )
    s = list_schedule(g)
    assert order(s) == [2, 4, 1, 3, 0]
    assert s.start == [4.0, 2.0, 0.0, 3.0, 1.0]


def _phase_case(inherit: bool) -> ExecGraph:
    # n0, n1: phases 1 and 2 of vertex 1 (n1 after n0); n2: an unrelated OP of vertex 0, 1.5 s.
    # Own ranks: n0 = 2, n1 = 1, n2 = 1.5. n0 beats n2 at time 0 (rank 2 > 1.5). At time 1
    # n1 and n2 tie on EST: with inheritance n1 carries rank 2 and goes first; without it
    # n2 (rank 1.5 > 1) goes first.
    g = graph(
        (OP, 1, 0, D0, 1, []),
        (OP, 1, 0, D0, 1, [0]),
        (OP, 0, 0, D0, 1.5, []),
    )
    g.phase[0], g.phase[1] = 1, 2
    if inherit:
        g.first_phase[1] = 0
    return g


def test_phase_nodes_inherit_the_first_phase_rank():
    s = list_schedule(_phase_case(inherit=True))
    assert s.start == [0.0, 1.0, 2.0]
    assert s.makespan == 3.5


def test_without_first_phase_the_own_rank_decides():
    s = list_schedule(_phase_case(inherit=False))
    assert s.start == [0.0, 2.5, 1.0]
    assert s.makespan == 3.5


# ---------------------------------------------------------------------------- atoms
def test_atoms_of_known_partitions():
    assert atoms_of([0b0011, 0b0110, 0b1111]) == [0b0001, 0b0010, 0b0100, 0b1000]
    assert atoms_of([0b1100, 0b0011, 0b1111]) == [0b0011, 0b1100]
    assert atoms_of({0b1111}) == [0b1111]
    assert atoms_of([0b0101, 0b0101, 0]) == [0b0101]
    assert atoms_of([]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**10 - 1), max_size=8))
def test_atoms_partition_the_union_of_the_masks(masks):
    atoms = atoms_of(masks)
    union = 0
    for m in masks:
        union |= m
    assert all(a > 0 for a in atoms)
    # disjoint, and together exactly the union
    total = 0
    for a in atoms:
        assert total & a == 0
        total |= a
    assert total == union
    # every mask is a union of atoms (each atom lies inside or outside it)
    for m in masks:
        inside = [a for a in atoms if a & m]
        assert all(a & m == a for a in inside)
        assert sum(inside) == m
    # maximal: no two atoms lie in exactly the same masks (they would be one atom)
    signatures = [tuple(bool(a & m) for m in masks) for a in atoms]
    assert len(set(signatures)) == len(atoms)


def test_busy_time_is_counted_per_device():
    g = graph(
        (OP, 0, 0, D0 | D1 | D2, 2, []),
        (COMM, 1, 0, D1, 3, [0]),
        (OP, 1, 0, D1 | D3, 0.5, [1]),
    )
    s = list_schedule(g)
    # 2 s on three devices + 3 s on one + 0.5 s on two
    assert s.busy_device_seconds() == pytest.approx(2 * 3 + 3 * 1 + 0.5 * 2)
    assert sorted(s.atoms) == sorted(atoms_of(g.mask))


# ---------------------------------------------------------------------------- critical path
def test_critical_path_ends_at_the_last_node_and_follows_blockers():
    # Two independent chains on dev0/dev1 joined through a shared-device node:
    # n0 (dev0, 3) -> n2 (dev0+dev1, 2); n1 (dev1, 1) -> n3 (dev1, 4) and n2 waits for n0.
    g = graph(
        (OP, 0, 0, D0, 3, []),
        (OP, 1, 0, D1, 1, []),
        (OP, 2, 0, D0 | D1, 2, [0]),
        (OP, 3, 0, D1, 4, [1]),
        (OP, 4, 0, D2, 1, [1]),
    )
    s = list_schedule(g)
    # n0 0..3, n1 0..1, n3 1..5 (dev1), n4 1..2, n2 waits for dev1: 5..7
    assert s.start == [0.0, 0.0, 5.0, 1.0, 1.0]
    assert s.makespan == 7.0
    path = s.critical_path()
    assert path == [1, 3, 2]
    assert path[-1] == max(range(len(g)), key=s.finish.__getitem__)
    for a, b in itertools.pairwise(path):
        assert s.finish[a] == s.start[b]
        assert a in g.preds[b] or g.mask[a] & g.mask[b]
    assert s.start[path[0]] == 0.0


def test_empty_graph():
    s = list_schedule(ExecGraph())
    assert s.makespan == 0.0
    assert s.critical_path() == []
    assert check_schedule(ExecGraph(), s) == []


def test_cycle_raises_value_error():
    g = ExecGraph()
    g.add(OP, 0, -1, 0, 0, D0, 0.0, 1.0, [2])
    g.add(OP, 1, -1, 0, 0, D1, 0.0, 1.0, [])
    g.add(OP, 2, -1, 0, 0, D0, 0.0, 1.0, [0, 1])
    with pytest.raises(ValueError, match="cycle"):
        list_schedule(g)


# ---------------------------------------------------------------------------- check_schedule
@pytest.fixture
def small():
    g = graph(
        (OP, 0, 0, D0, 2, []),
        (OP, 1, 0, D1, 5, []),
        (OP, 2, 0, D0, 1, [1]),
        (OP, 3, 0, D0 | D1, 1, [0]),
    )
    return g, list_schedule(g)


def _move(s: Schedule, i: int, start: float, g: ExecGraph) -> Schedule:
    t = copy.deepcopy(s)
    t.start[i] = start
    t.finish[i] = start + g.duration[i]
    return t


def test_check_schedule_catches_a_precedence_violation(small):
    g, s = small
    bad = _move(s, 2, 4.0, g)  # n2 now starts before its pred n1 finishes (5)
    errors = check_schedule(g, bad)
    assert any(e.startswith("precedence: node 2") and "pred 1" in e for e in errors)


def test_check_schedule_catches_a_device_overlap(small):
    g, s = small
    bad = _move(s, 3, 5.5, g)  # n3 (dev0+dev1) 5.5..6.5 overlaps n2 (dev0) 5..6
    bad.makespan = max(bad.finish)
    errors = check_schedule(g, bad)
    assert errors == [f"device 0: node 3 starts at 5.5 while node 2 runs until {s.finish[2]}"]


def test_check_schedule_catches_a_wrong_makespan_and_duration(small):
    g, s = small
    bad = copy.deepcopy(s)
    bad.makespan = 6.5
    assert [e for e in check_schedule(g, bad) if "makespan" in e]
    bad = copy.deepcopy(s)
    bad.finish[0] = 2.5  # no longer start + duration
    assert any(e.startswith("node 0: finish - start") for e in check_schedule(g, bad))
    bad = _move(s, 0, -1.0, g)
    assert any("starts at -1.0 < 0" in e for e in check_schedule(g, bad))


def test_check_schedule_reports_a_cycle():
    g = graph((OP, 0, 0, D0, 1, [1]), (OP, 1, 0, D1, 1, [0]))
    s = Schedule([0.0, 1.0], [1.0, 2.0], 2.0, [D0, D1], [1.0, 1.0], [-1, -1])
    assert any("cycle" in e for e in check_schedule(g, s))


# ---------------------------------------------------------------------------- property test
def reference_schedule(g: ExecGraph) -> list[float]:
    """SPEC §7 done naively: device by device, every ready node's EST recomputed each round."""
    n = len(g)
    devices = [[d for d in range(g.mask[i].bit_length()) if g.mask[i] >> d & 1] for i in range(n)]
    succ = [[j for j in range(n) if i in g.preds[j]] for i in range(n)]
    rank = [0.0] * n
    for i in reversed(range(n)):
        rank[i] = g.duration[i] + max((rank[j] for j in succ[i]), default=0.0)
    rank = [rank[g.first_phase[i]] for i in range(n)]
    free: dict[int, float] = {}
    start: list[float | None] = [None] * n
    finish = [0.0] * n
    for _ in range(n):
        ready = [i for i in range(n) if start[i] is None and all(start[p] is not None for p in g.preds[i])]

        def est(i):
            return max([finish[p] for p in g.preds[i]] + [free.get(d, 0.0) for d in devices[i]] + [0.0])

        i = min(ready, key=lambda i: (est(i), g.kind[i] == OP, -rank[i], g.vertex[i], g.step[i], i))
        start[i] = est(i)
        finish[i] = start[i] + g.duration[i]
        for d in devices[i]:
            free[d] = finish[i]
    return start  # type: ignore[return-value]


@st.composite
def random_graphs(draw):
    n = draw(st.integers(1, 14))
    g = ExecGraph()
    for i in range(n):
        preds = sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
        kind = draw(st.sampled_from([OP, OP, OP, COMM, RESHARD]))
        mask = draw(st.integers(1, 2**8 - 1))
        dur = float(draw(st.integers(0, 4)))  # small integers: many ties
        g.add(kind, draw(st.integers(0, 3)), -1, draw(st.integers(0, 2)), 0, mask, 0.0, dur, preds)
        # a later phase of an OP pred's vertex instance
        op_preds = [p for p in preds if g.kind[p] == OP]
        if kind == OP and op_preds and draw(st.booleans()):
            g.first_phase[i] = g.first_phase[op_preds[0]]
    return g


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_random_dags_schedule_validly_and_as_specified(g):
    s = list_schedule(g)
    assert check_schedule(g, s) == []
    assert s.makespan == max(s.finish)
    assert s.start == reference_schedule(g)
    # every node starts at 0 or exactly when its blocker (a pred or a device sharer) finishes
    for i in range(len(g)):
        b = s.blocker[i]
        if b < 0:
            assert s.start[i] == 0.0
        else:
            assert s.start[i] == s.finish[b]
            assert b in g.preds[i] or g.mask[b] & g.mask[i]
    busy = sum(g.duration[i] * g.mask[i].bit_count() for i in range(len(g)))
    assert s.busy_device_seconds() == pytest.approx(busy)


@settings(max_examples=60, deadline=None)
@given(random_graphs(), st.randoms(use_true_random=False))
def test_following_a_schedules_order_starts_no_node_later(g, rnd):
    """The serial scheme over an activity list sorted by a valid schedule's starts (here: the
    EST-first schedule with every duration stretched, as an exact model's ticks round up; ties:
    zero-length nodes first, as ``start_order``) starts every node no later than that schedule;
    any permutation still gives a valid schedule."""
    stretched = copy.deepcopy(g)
    stretched.duration = [d + rnd.choice([0.0, 0.5, 1.0]) for d in g.duration]
    model = list_schedule(stretched)
    order = sorted(range(len(g)), key=lambda i: (model.start[i], g.duration[i], i))  # as start_order
    s = list_schedule(g, order)
    assert check_schedule(g, s) == []
    assert all(a <= b + 1e-12 for a, b in zip(s.start, model.start))
    assert s.makespan <= model.makespan + 1e-12
    shuffled = list(range(len(g)))
    rnd.shuffle(shuffled)
    assert check_schedule(g, list_schedule(g, shuffled)) == []


def test_an_order_must_list_every_node_once():
    g = ExecGraph()
    g.add(OP, 0, -1, 0, 0, 1, 0.0, 1.0, [])
    g.add(OP, 1, -1, 0, 0, 1, 0.0, 1.0, [0])
    with pytest.raises(ValueError, match="bad or repeated id 0"):
        list_schedule(g, [0, 0])
    with pytest.raises(ValueError, match="lists 1 of the graph's 2 nodes"):
        list_schedule(g, [1])
    with pytest.raises(ValueError, match="bad or repeated id 5"):
        list_schedule(g, [0, 5])
