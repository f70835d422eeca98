"""Plan diffs and the transition DAG: known diffs give the expected DAGs (``ir/emu/dag.py``)."""

from __future__ import annotations

import pytest

from rpeg.ir.emu import (
    EMU,
    Destroy,
    Extend,
    ModelStage,
    Stage,
    TransitionInfeasible,
    plan_diff,
    transition_dag,
    transition_dag_reference,
)

GEN = ModelStage("actor", Stage.GEN, "actor_gen", 0)
INF = ModelStage("reward", Stage.INF, "reward_inf", 2)
TRAIN = ModelStage("critic", Stage.TRAIN, "critic_train", 5)
P = 16e9  # |θ| of an 8B model in BF16
OPT = 96e9  # |ω| = 12·N


def unit(ms, tp, pp, first, optim=0.0, vp=1):
    return EMU(ms, tp, pp, tuple(range(first, first + tp * pp)), P, optim, vp=vp)


def kinds(dag):
    return sorted(p.kind for p in dag.primitives)


# ------------------------------------------------------------------ plan diffs
def test_plan_diff_pairs_model_stages_and_rejects_mismatch():
    cur = [unit(GEN, 1, 4, 0), unit(TRAIN, 1, 4, 4, OPT)]
    tgt = [unit(GEN, 2, 4, 0), unit(TRAIN, 1, 4, 8, OPT), unit(TRAIN, 1, 4, 12, OPT)]
    d = plan_diff(cur, tgt)
    assert list(d) == [GEN, TRAIN]
    assert d[GEN].t_sub == (1, 4, 1) and d[TRAIN].dp == (1, 2)
    assert d[TRAIN].acquired == frozenset(range(8, 16)) and d[TRAIN].released == frozenset(range(4, 8))
    with pytest.raises(ValueError, match="same model-stages"):
        plan_diff(cur, tgt[:1])
    with pytest.raises(ValueError, match="mixes layouts"):
        plan_diff([unit(GEN, 1, 4, 0), unit(GEN, 2, 2, 4)], tgt)
    with pytest.raises(ValueError, match=r"share GPUs \[2, 3\]"):
        plan_diff([unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 2)], tgt)


def test_plan_diff_groups_equal_model_stages_and_sees_unchanged_ones():
    twin = ModelStage("actor", Stage.GEN, "actor_gen", 0)  # equal to GEN, another object
    assert twin == GEN and twin is not GEN
    cur = [unit(GEN, 1, 4, 4), unit(twin, 1, 4, 0), unit(TRAIN, 1, 4, 8, OPT)]
    d = plan_diff(cur, [unit(twin, 1, 4, 0), unit(GEN, 1, 4, 4), unit(TRAIN, 2, 2, 8, OPT)])
    assert list(d) == [GEN, TRAIN] and [u.gpus[0] for u in d[GEN].current] == [0, 4]
    assert d[GEN].unchanged and not d[TRAIN].unchanged  # same GPUs, other layout
    assert not plan_diff(cur, [unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 12), cur[2]])[GEN].unchanged
    assert not plan_diff(cur, [unit(GEN, 1, 4, 0), cur[2]])[GEN].unchanged
    assert transition_dag(cur, [*cur[:2], unit(TRAIN, 1, 4, 8, OPT)]).primitives == ()


# ------------------------------------------------------------------ known diffs → expected DAGs
def test_tp_1_to_2_for_generation_is_extend_then_merge():
    """Nereus §5.1: actor generation (TP=1, PP=4, DP=2) → (TP=2, PP=4, DP=2) on a grown pool."""
    cur = [unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 4)]
    tgt = [unit(GEN, 2, 4, 0), unit(GEN, 2, 4, 8)]
    dag = transition_dag(cur, tgt)
    assert kinds(dag) == ["extend", "extend", "merge", "merge"]
    merges = [i for i, p in enumerate(dag.primitives) if p.kind == "merge"]
    extends = [i for i, p in enumerate(dag.primitives) if p.kind == "extend"]
    far = next(i for i in merges if 8 in dag.primitives[i].gpus)
    assert set(dag.predecessors[far]) == set(extends)  # both copies exist before they merge
    near = next(i for i in merges if 0 in dag.primitives[i].gpus)
    assert set(dag.predecessors[near]) == set(extends)  # sources stay intact until copied
    assert {u.key() for u in dag.apply()} == {u.key() for u in tgt}


def test_tp_change_in_place_is_one_merge():
    dag = transition_dag([unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 4)], [unit(GEN, 2, 4, 0)])
    assert kinds(dag) == ["merge"] and not dag.edges


def test_dp_2_to_4_for_critic_training_is_two_extends():
    cur = [unit(TRAIN, 1, 4, 0, OPT), unit(TRAIN, 1, 4, 4, OPT)]
    tgt = [*cur, unit(TRAIN, 1, 4, 8, OPT), unit(TRAIN, 1, 4, 12, OPT)]
    dag = transition_dag(cur, tgt)
    assert kinds(dag) == ["extend", "extend"] and not dag.edges
    assert {p.inputs[0].gpus[0] for p in dag.primitives} == {0, 4}  # one source each, in parallel


def test_moving_a_model_extends_before_destroying_the_last_copy():
    dag = transition_dag([unit(INF, 2, 1, 0)], [unit(INF, 2, 1, 2)])
    assert kinds(dag) == ["destroy", "extend"]
    e = next(i for i, p in enumerate(dag.primitives) if p.kind == "extend")
    d = next(i for i, p in enumerate(dag.primitives) if p.kind == "destroy")
    assert (e, d) in dag.edges


def test_shrinking_the_pool_destroys_replicas_and_splits():
    cur = [unit(TRAIN, 1, 2, 2 * k, OPT) for k in range(4)]
    dag = transition_dag(cur, cur[:2])
    assert kinds(dag) == ["destroy", "destroy"] and not dag.edges
    # TP 2 → 1 while keeping half the GPUs: split, then drop the sub-unit off the new pool
    dag = transition_dag([unit(GEN, 2, 1, 0), unit(GEN, 2, 1, 2)], [unit(GEN, 1, 1, 0), unit(GEN, 1, 1, 2)])
    assert kinds(dag) == ["destroy", "destroy", "split", "split"]
    for i, p in enumerate(dag.primitives):
        if p.kind == "destroy":
            assert dag.primitives[dag.predecessors[i][0]].kind == "split"
    assert {u.key() for u in dag.apply()} == {u.key() for u in [unit(GEN, 1, 1, 0), unit(GEN, 1, 1, 2)]}


def test_extend_waits_for_the_destroy_that_releases_its_gpus():
    cur = [unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 4), unit(TRAIN, 1, 4, 8, OPT)]
    tgt = [unit(GEN, 1, 4, 0), unit(TRAIN, 1, 4, 8, OPT), unit(TRAIN, 1, 4, 4, OPT)]
    dag = transition_dag(cur, tgt)
    assert len(dag.resource_edges) == 1
    d, e = dag.resource_edges[0]
    assert isinstance(dag.primitives[d], Destroy) and dag.primitives[d].stage == GEN
    assert isinstance(dag.primitives[e], Extend) and dag.primitives[e].stage == TRAIN


def test_colocated_owners_do_not_block():
    """A GPU the target shares between two model-stages needs no resource edge."""
    cur = [unit(GEN, 1, 4, 0), unit(TRAIN, 1, 4, 4, OPT)]
    tgt = [unit(GEN, 1, 4, 0), unit(TRAIN, 1, 4, 4, OPT), unit(TRAIN, 1, 4, 0, OPT)]
    dag = transition_dag(cur, tgt)
    assert kinds(dag) == ["extend"] and not dag.resource_edges


def test_swap_on_a_full_pool_is_infeasible_and_names_both_sides():
    cur = [unit(GEN, 2, 1, 0), unit(INF, 2, 1, 2)]
    tgt = [unit(GEN, 2, 1, 2), unit(INF, 2, 1, 0)]
    with pytest.raises(TransitionInfeasible) as exc:
        transition_dag(cur, tgt)
    err = exc.value
    assert isinstance(err, ValueError)
    # the second Extend closes the wait-for cycle: reward/Inf needs GPUs 0-1, which actor/Gen
    # releases only after its own Extend, which waits for reward/Inf to release GPUs 2-3
    assert err.stage == str(INF) and err.blocking == str(GEN) and err.gpus == (0, 1)
    assert "actor/Gen" in str(err) and "reward/Inf" in str(err) and "[0, 1]" in str(err)


def test_t_sub_path_split_destroy_extend_merge():
    """Nereus Fig. 6 (reward inference): (TP=4, PP=8) → (TP=8, PP=2) via four (4, 2) units."""
    cur = [EMU(INF, 4, 8, tuple(range(32)), P)]
    tgt = [EMU(INF, 8, 2, tuple(range(16)), P)]
    dag = transition_dag(cur, tgt)
    assert kinds(dag) == ["destroy", "destroy", "merge", "split"]
    assert all(u.layout == (4, 2) for p in dag.primitives if p.kind == "split" for u in p.outputs)
    assert {u.key() for u in dag.apply()} == {u.key() for u in tgt}


def test_apply_refuses_to_destroy_the_last_copy():
    dag = transition_dag([unit(INF, 2, 1, 0)], [unit(INF, 2, 1, 2)])
    d = next(i for i, p in enumerate(dag.primitives) if p.kind == "destroy")
    e = 1 - d
    dag2 = type(dag)(dag.primitives, (), (), dag.current, dag.target, dag.diffs)  # edges removed
    with pytest.raises(ValueError, match="last copy"):
        dag2.apply([d, e])
    with pytest.raises(ValueError, match="before its predecessor"):
        dag.apply([d, e])


# ------------------------------------------------------------------ the interleaved pipeline
def test_a_change_of_interleaving_alone_reshards_through_the_whole_pipeline():
    # (tp 1, pp 4, vp 1) → (tp 1, pp 4, vp 2) on the same GPUs: stage p held layers [p·L/4, …)
    # and now holds chunks p and p + 4 of 8, so T_sub is the whole pipeline (1, 1, 1)
    cur, tgt = [unit(TRAIN, 1, 4, 0, OPT)], [unit(TRAIN, 1, 4, 0, OPT, vp=2)]
    d = plan_diff(cur, tgt)[TRAIN]
    assert not d.unchanged and d.t_sub == (1, 1, 1)
    dag = transition_dag(cur, tgt)
    assert kinds(dag) == ["merge", "split"]
    (split,) = [p for p in dag.primitives if p.kind == "split"]
    assert [(u.tp, u.pp, u.vp) for u in split.parts] == [(1, 1, 1)] * 4
    assert {u.key() for u in dag.apply()} == {u.key() for u in tgt}
    assert dag == transition_dag_reference(cur, tgt)
    # alike interleavings nest: (1, 4, 2) → (1, 2, 2) keeps the coarser stages' chunks
    d = plan_diff([unit(TRAIN, 1, 4, 0, OPT, vp=2)], [unit(TRAIN, 1, 2, 0, OPT, vp=2)])[TRAIN]
    assert d.t_sub == (1, 2, 2)
    # and an unchanged one is unchanged
    assert plan_diff([unit(TRAIN, 1, 4, 0, OPT, vp=2)], [unit(TRAIN, 1, 4, 0, OPT, vp=2)])[TRAIN].unchanged


def test_an_emu_interleaves_only_a_pipeline():
    with pytest.raises(ValueError, match=r"vp=2 needs pipeline stages"):
        unit(TRAIN, 2, 1, 0, vp=2)
    assert str(unit(TRAIN, 1, 2, 0, vp=2)).endswith("pp=2 vp=2 on GPUs 0-1")
