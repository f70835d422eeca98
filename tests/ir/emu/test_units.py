"""Model-stages, EMUs and the EMU collection of a plan (``ir/emu/units.py``)."""

from __future__ import annotations

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.ir import build_graph
from rpeg.ir.emu import EMU, ModelStage, Stage, emus_of
from rpeg.ir.plan import Choice, Plan
from rpeg.ir.types import Role
from rpeg.scoring.candidates import aligned_allocations, make_strategy

GEN = ModelStage("actor", Stage.GEN, "actor_gen", 0)
INF = ModelStage("reward", Stage.INF, "reward_inf", 2)
TRAIN = ModelStage("critic", Stage.TRAIN, "critic_train", 5)
P = 16e9  # |θ| of an 8B model in BF16
OPT = 96e9  # |ω| = 12·N


def unit(ms, tp, pp, first, optim=0.0):
    return EMU(ms, tp, pp, tuple(range(first, first + tp * pp)), P, optim)


def test_emu_validates_and_sizes():
    u = unit(TRAIN, 2, 4, 8, OPT)
    assert u.size == 8 and u.layout == (2, 4)
    assert u.bytes_per_gpu == pytest.approx((P + OPT) / 8)
    assert u.param_shard_bytes == pytest.approx(P / 8) and u.optim_shard_bytes == pytest.approx(OPT / 8)
    with pytest.raises(ValueError, match="tp·pp = 4"):
        EMU(GEN, 2, 2, (0, 1, 2), P)
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        EMU(GEN, 0, 2, (), P)
    for gpus in [(3, 3), (0, -1), (0, 1.0)]:
        with pytest.raises(ValueError, match="distinct non-negative integers"):
            EMU(GEN, 2, 1, gpus, P)
    with pytest.raises(ValueError, match="param_bytes"):
        EMU(GEN, 1, 1, (0,), -1.0)
    # derived once: the GPU mask and the per-GPU bytes, also for units the DAG builder makes
    assert u.mask == sum(1 << g for g in range(8, 16)) and u.bytes_per_gpu == (P + OPT) / 8
    s = u.sub_unit(2, 2, (9, 8, 11, 10), uid=7)
    assert s.mask == 0xF00 and s.bytes_per_gpu == (P + OPT) / 4 and s.uid == 7


def test_stage_from_role_and_order():
    assert Stage.from_role(Role.GENERATION) is Stage.GEN
    assert Stage.from_role(Role.TRAINING) is Stage.TRAIN
    assert sorted([TRAIN, INF, GEN], key=lambda m: m.sort_key) == [GEN, INF, TRAIN]


# ------------------------------------------------------------------ plans → EMUs
def test_emus_of_plan_splits_allocations_in_rank_order():
    cluster = Cluster.from_shape("1x2x8", hardware_preset("h200"))
    seven = model_preset("7b")
    w = Workload("ppo", {"actor": seven, "critic": seven, "reward": seven}, 64, 1, 128, 256)
    g = build_graph(w)
    s = make_strategy(cluster, (1, 1, 8), 2, 2, 2, 2)  # dp=2, pp=2, tp=2 on 8 GPUs
    alloc = aligned_allocations(cluster, 8)[1]  # GPUs 8-15
    plan = Plan(tuple(Choice(s, alloc) for _ in g.vertices))
    units = emus_of(plan, cluster, graph=g)
    assert len(units) == 2 * len(g.vertices)
    assert units[0].gpus == (8, 9, 10, 11) and units[1].gpus == (12, 13, 14, 15)
    assert units[0].stage == ModelStage("actor", Stage.GEN, "actor_gen")
    n = seven.params
    assert units[0].param_bytes == n * 2 and units[0].optim_bytes == 0
    train = [u for u in units if u.stage.stage is Stage.TRAIN]
    assert len(train) == 4 and all(u.optim_bytes == 12 * n for u in train)
    assert [u.uid for u in units] == list(range(len(units)))
    with pytest.raises(ValueError, match="exactly one of"):
        emus_of(plan, cluster)


def test_emus_of_makes_the_units_the_validating_constructor_makes():
    """``emus_of`` checks once per vertex and builds the units past ``EMU.__post_init__``; the
    units equal the validated ones field by field, derived fields included."""
    from rpeg.ir.emu import plan_vertices

    cluster = Cluster.from_shape("1x2x8", hardware_preset("h200"))
    seven = model_preset("7b")
    g = build_graph(Workload("ppo", {"actor": seven, "critic": seven, "reward": seven}, 64, 1, 128, 256))
    layouts = [(1, 1, 4, 4), (8, 1, 2, 16), (1, 2, 2, 4), (2, 1, 1, 2), (1, 2, 4, 8), (4, 1, 2, 8)]
    choices = []
    for dp, pp, tp, size in layouts:
        s = make_strategy(cluster, cluster.shape_for_size(size), dp, pp, tp, 2 * pp if pp > 1 else 1)
        choices.append(Choice(s, aligned_allocations(cluster, size)[-1]))
    plan = Plan(tuple(choices))
    units = emus_of(plan, cluster, graph=g)
    rows = plan_vertices(plan, cluster, graph=g)
    expected = []
    for ms, s, devices, pb, ob in rows:
        assert isinstance(devices, range)  # a legal allocation is one run of ids
        rep = s.tp * s.pp
        for j in range(s.dp):
            gpus = tuple(devices[j * rep : (j + 1) * rep])
            expected.append(EMU(ms, s.tp, s.pp, gpus, pb, ob, len(expected)))
    assert units == expected
    for u, v in zip(units, expected):
        assert (u.uid, u.gpus, u.mask, u.bytes_per_gpu) == (v.uid, v.gpus, v.mask, v.bytes_per_gpu)
        assert type(u.gpus) is tuple and type(u.param_bytes) is float
    assert [(ms.vertex, ms.index) for ms, *_ in rows] == [(v.name, i) for i, v in enumerate(g.vertices)]


def test_plan_vertices_names_a_vertex_whose_allocation_does_not_fit_its_strategy():
    from rpeg.ir.emu import plan_vertices

    cluster = Cluster.from_shape("1x2x8", hardware_preset("h200"))
    seven = model_preset("7b")
    g = build_graph(Workload("ppo", {"actor": seven, "critic": seven, "reward": seven}, 64, 1, 128, 256))
    s = make_strategy(cluster, (1, 1, 8), 2, 2, 2, 2)
    plan = Plan(
        tuple(Choice(s, aligned_allocations(cluster, 16 if i == 1 else 8)[0]) for i in range(len(g.vertices)))
    )
    with pytest.raises(
        ValueError, match=r"vertex 'ref_inf' has 16 devices but its strategy .* needs dp·pp·tp = 8"
    ):
        plan_vertices(plan, cluster, graph=g)
    with pytest.raises(ValueError, match="vertex 'ref_inf' has 16 devices"):
        emus_of(plan, cluster, graph=g)
