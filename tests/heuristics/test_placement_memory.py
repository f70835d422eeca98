"""Persistent vs transient weight memory in the five placement cases of the RPEG paper's Figure 3
(the critic on two GPUs; every other invocation on both GPUs)."""

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir import Choice, Cluster, Plan, Strategy, Structure, Workload, model_preset
from rpeg.scoring import Evaluator

SMALL = model_preset("7b").scaled(layers=4, hidden=512, heads=8, vocab=1000)
G0, G1, BOTH = ((0, 0, 0), (1, 1, 1)), ((0, 0, 1), (1, 1, 1)), ((0, 0, 0), (1, 1, 2))


def case(tau, inf, train, inf_tp=1):
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"))
    w = Workload("ppo", {"actor": SMALL, "critic": SMALL, "reward": SMALL}, 32, 1, 64, 64)
    ev = Evaluator(w, cluster, Structure("ppo", False, (("actor", 0), ("critic", tau))), k_eval=3)

    def choice(place, tp=1):
        size = place[1][2]
        return Choice(Strategy(place[1], size // tp, 1, tp, 1), cluster.allocation(*place))

    chosen = {"critic_inf": choice(inf, inf_tp), "critic_train": choice(train)}
    plan = Plan(tuple(chosen.get(v.name, choice(BOTH)) for v in ev.graph.vertices))
    report = ev.memory(plan, detail=True)
    by_gpu = {}
    for d in report.detail:
        for gpu in (0, 1):
            if d.mask >> gpu & 1:
                by_gpu[gpu] = d
    inf_mem = ev.costs.memory(
        ev.graph.index["critic_inf"], plan.choices[ev.graph.index["critic_inf"]].strategy
    )
    return report, by_gpu, inf_mem


def test_case1_sync_disjoint_inference_holds_weights_transiently():
    _report, gpu, m = case(0, G0, G1)
    assert ("critic", "copy") not in gpu[0].persistent
    assert gpu[0].transient["critic_inf"] == pytest.approx(m.transient + m.weights)
    assert ("critic", "train") in gpu[1].persistent and "critic_inf" not in gpu[1].transient


def test_case2_async_disjoint_keeps_a_shadow_copy():
    _report, gpu, m = case(1, G0, G1)
    assert gpu[0].persistent[("critic", "copy")] == pytest.approx(m.weights)
    assert gpu[0].transient["critic_inf"] == pytest.approx(m.transient)
    assert ("critic", "train") in gpu[1].persistent


def test_case3_partial_overlap_shadow_only_off_the_training_gpu():
    _report, gpu, m = case(1, BOTH, G0)
    assert ("critic", "train") in gpu[0].persistent and ("critic", "copy") not in gpu[0].persistent
    assert gpu[0].transient["critic_inf"] == pytest.approx(m.transient + m.weights)
    assert gpu[1].persistent[("critic", "copy")] == pytest.approx(m.weights)


def test_case4_complementary_overlap():
    _report, gpu, m = case(1, G0, BOTH)
    assert ("critic", "train") in gpu[0].persistent and ("critic", "copy") not in gpu[0].persistent
    assert gpu[0].transient["critic_inf"] == pytest.approx(m.transient + m.weights)
    assert ("critic", "train") in gpu[1].persistent and "critic_inf" not in gpu[1].transient


def test_case5_full_colocation_no_copy_anywhere():
    _report, gpu, _m = case(1, BOTH, BOTH, inf_tp=2)
    for d in (0, 1):
        assert ("critic", "copy") not in gpu[d].persistent
        assert ("critic", "train") in gpu[d].persistent


def test_peak_is_persistent_sum_plus_worst_transient():
    report, _gpu, _ = case(1, G0, G1)
    for i, d in enumerate(report.detail):
        assert report.peak[i] == pytest.approx(sum(d.persistent.values()) + max(d.transient.values()))
