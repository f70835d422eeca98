"""Tests for ``solvers/transition.py``, the front door of transition planning: argument checks,
the greedy schedule's status against its critical-path bound, and the exact engines' ticks.
(The engines themselves: ``tests/formulations/test_transition_exact.py``; illegal targets:
``test_legality.py``.)"""

from __future__ import annotations

import math
from functools import cache

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset, plan_transition, solve
from rpeg.formulations.status import Status
from rpeg.ir.errors import InputError


@cache
def _two_plans():
    """A GRPO job on one 8-GPU node and two different plans of its synchronous graph."""
    seven = model_preset("7b")
    w = Workload("grpo", {"actor": seven, "reward": seven}, 16, 4, 128, 256, name="grpo-7b-8gpu")
    c = Cluster.from_shape("1x1x8", hardware_preset("h100"))
    a, b = (solve(w, c, m, k_eval=1) for m in ("greedy", "concurrent"))
    assert a.plan is not None and b.plan is not None and a.plan != b.plan
    return w, c, a.plan, b.plan


def test_staying_put_costs_nothing_and_is_optimal():
    w, c, plan, _ = _two_plans()
    tp = plan_transition(plan, plan, c, workload=w)
    assert (tp.l_tran, tp.bound, tp.status, tp.gap) == (0.0, 0.0, Status.OPTIMAL, 0.0)
    assert tp.check() == []


def test_greedy_is_optimal_exactly_when_it_meets_the_critical_path():
    w, c, cur, tgt = _two_plans()
    tp = plan_transition(cur, tgt, c, workload=w)
    assert tp.check() == [] and tp.resolution is None
    assert tp.bound == tp.critical_path <= tp.l_tran * (1 + 1e-12)
    meets = tp.l_tran <= tp.critical_path * (1 + 1e-12)
    assert tp.status is (Status.OPTIMAL if meets else Status.FEASIBLE)


def test_cpsat_schedules_on_ticks_no_longer_than_the_rounded_greedy():
    w, c, cur, tgt = _two_plans()
    greedy = plan_transition(cur, tgt, c, workload=w)
    tp = plan_transition(cur, tgt, c, workload=w, method="cpsat", time_limit=10, resolution=1e-3)
    assert tp.resolution == 1e-3 and tp.check() == []
    assert tp.status in (Status.OPTIMAL, Status.TIME_LIMIT, Status.FEASIBLE)
    assert tp.critical_path <= tp.bound <= tp.l_tran
    # durations round up by at most one tick per primitive
    assert tp.l_tran <= greedy.l_tran + len(tp.durations) * 1e-3 + 1e-9
    assert all(math.isclose(e / 1e-3, round(e / 1e-3), abs_tol=1e-6) for e in tp.ends)


@pytest.mark.parametrize(
    ("kw", "exc", "pattern"),
    [
        ({"resolution": 0}, ValueError, r"resolution must be a positive finite number of seconds, got 0"),
        ({"seed": 1.5}, TypeError, r"seed must be an integer"),
        ({"threads": 0}, ValueError, r"threads must be a positive integer"),
        ({"method": 3}, TypeError, r"method must be a transition method name"),
        ({"graph": "g"}, TypeError, r"graph must be an RPEG"),
        (
            {"engine_start": -1.0},
            ValueError,
            r"engine_start must be a non-negative finite number of seconds, got -1.0",
        ),
        (
            {"engine_start": math.nan},
            ValueError,
            r"engine_start must be a non-negative finite number of seconds, got nan",
        ),
    ],
)
def test_bad_arguments_are_named(kw, exc, pattern):
    w, c, cur, tgt = _two_plans()
    with pytest.raises(exc, match=pattern):
        plan_transition(cur, tgt, c, **{"workload": w, **kw})


FIGURES = [
    ("setup", -1.0, ValueError, r"setup must be a non-negative finite number of seconds, got -1\.0"),
    ("setup", math.inf, ValueError, r"setup must be a non-negative finite number of seconds, got inf"),
    ("teardown", math.nan, ValueError, r"teardown must be a non-negative finite number of seconds, got nan"),
    ("teardown", "1", TypeError, r"teardown must be a non-negative finite number of seconds, got str"),
    ("engine_start", math.inf, ValueError, r"engine_start must be a non-negative finite number of seconds, got inf"),
    ("resolution", math.inf, ValueError, r"resolution must be a positive finite number of seconds, got inf"),
    ("capacity", math.nan, ValueError, r"capacity must be a positive number of bytes \(inf: no bound\), got nan"),
    ("capacity", -1.0, ValueError, r"capacity must be a positive number of bytes \(inf: no bound\), got -1\.0"),
    ("solver", 3, TypeError, r"solver must be a Pyomo solver name \(str\), got int"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "exc", "pattern"), FIGURES)
def test_every_figure_is_checked_even_when_the_transition_is_empty(name, value, exc, pattern):
    """issue 33: staying put (no primitive reads the figures) accepted ``setup=-1.0``,
    ``teardown=nan``, ``engine_start=inf``."""
    w, c, plan, _ = _two_plans()
    with pytest.raises(exc, match=pattern):
        plan_transition(plan, plan, c, workload=w, **{name: value})
    with pytest.raises(exc, match=pattern):  # the EMU collections' path too
        plan_transition([], [], c, **{name: value})


@cache
def _other_plans():
    """The same job on two 8-GPU nodes, and a PPO job on the 8-GPU node of :func:`_two_plans`."""
    w, _, _, _ = _two_plans()
    big = solve(w, Cluster.from_shape("1x2x8", hardware_preset("h100")), "greedy", k_eval=1)
    ppo = Workload(
        "ppo", {m: model_preset("7b") for m in ("actor", "critic", "reward")}, 16, 1, 128, 256, name="ppo-7b"
    )
    other = solve(ppo, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy", k_eval=1)
    assert big.plan is not None and other.plan is not None
    return big.plan, other.plan


@pytest.mark.parametrize("side", ["current", "target"])
def test_a_plan_of_another_workload_or_cluster_is_named(side):
    """issue 33: a target plan made for another workload said "uses device 15 outside
    cluster" — neither the argument nor why."""
    w, c, plan, _ = _two_plans()
    big, other = _other_plans()

    def call(wrong):
        pair = (wrong, plan) if side == "current" else (plan, wrong)
        return plan_transition(*pair, c, workload=w)

    n = len(plan)
    with pytest.raises(InputError, match=(
        rf"^{side} has {len(other)} choices but the graph of workload 'grpo-7b-8gpu' has {n} vertices "
        rf"\(.*\): {side} was made for another workload$"
    )):  # fmt: skip
        call(other)
    with pytest.raises(InputError, match=(
        rf"^{side}: vertex '\w+' is placed at origin \[\d, \d, \d\] extent \[\d, \d, \d\] \(devices \d+\.\.\d+\), "
        rf"which are not those devices on cluster 1x1x8 \(8 devices\): {side} was made for another cluster$"
    )):  # fmt: skip
        call(big)


def test_engine_start_is_charged_to_each_primitive_that_creates_a_generation_replica():
    from rpeg.costmodel.transition import creates_generation
    from tests.runtime.plans import AFTER, BEFORE, hand, workload

    # generation TP 1 → 2 and critic training DP 2 → 4 (the runtime's transition example)
    w = workload("ppo")
    a, b = (
        hand(w, "1x1x4", BEFORE, (("actor", 0), ("critic", 0))),
        hand(w, "1x1x4", AFTER, (("actor", 0), ("critic", 0))),
    )
    c, cur, tgt = a.cluster, a.plan, b.plan
    plain = plan_transition(cur, tgt, c, workload=w)
    started = plan_transition(cur, tgt, c, workload=w, engine_start=30.0)
    gen = [creates_generation(p, set(plain.dag.target)) for p in plain.dag.primitives]
    assert any(gen) and not all(gen)  # the plans differ in generation and in something else
    for is_gen, a, b in zip(gen, plain.durations, started.durations):
        assert b == pytest.approx(a + 30.0 if is_gen else a)
    assert started.l_tran >= plain.l_tran + 30.0 - 1e-9 and started.check() == []
    # staying put starts nothing
    assert plan_transition(cur, cur, c, workload=w, engine_start=30.0).l_tran == 0.0
