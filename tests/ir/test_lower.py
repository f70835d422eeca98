"""SPEC §5 lowering rules on small graphs, one case per rule, and the five placement cases of the
RPEG paper's Figure 3 (one trainable model, the critic, on two GPUs)."""

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir import (
    Choice,
    Cluster,
    Plan,
    Strategy,
    Structure,
    Workload,
    build_graph,
    lower,
    model_preset,
    unroll,
)
from rpeg.ir.lower import COMM, OP, RESHARD

M7 = model_preset("7b")
Q3 = ((0.5, 32), (0.85, 64), (1.0, 128))


class UnitCosts:
    """Every OP phase, COMM and RESHARD takes 1 s (lowering is about structure, not time)."""

    def op_phases(self, vertex, choice, split):
        return (1.0,) * (3 if split else 1)

    def comm(self, nbytes, src, dst):
        return 1.0

    def reshard(self, model, dst):
        return 1.0


def at(cluster, origin, extent, tp=1):
    size = extent[0] * extent[1] * extent[2]
    return Choice(Strategy(extent, size // tp, 1, tp, 1), cluster.allocation(origin, extent))


def setup(algorithm, structure, placements, k=2, shape="1x1x4"):
    cluster = Cluster.from_shape(shape, hardware_preset("gh200"))
    models = {"actor": M7, "reward": M7} | ({"critic": M7} if algorithm == "ppo" else {})
    w = Workload(
        algorithm,
        models,
        32,
        4,
        64,
        128,
        quantiles=Q3,
        staleness={m: (0, 1) for m in models if m in ("actor", "critic")},
    )
    g = build_graph(w, structure)
    plan = Plan(tuple(at(cluster, *placements[v.name]) for v in g.vertices))
    eg = lower(unroll(g, k), plan, w.quantiles, UnitCosts())
    return g, eg


def nodes(g, eg, kind=None, vertex=None, step=None, source=None):
    names = [v.name for v in g.vertices]
    out = []
    for i in range(len(eg)):
        if kind is not None and eg.kind[i] != kind:
            continue
        if vertex is not None and names[eg.vertex[i]] != vertex:
            continue
        if step is not None and eg.step[i] != step:
            continue
        if source is not None and (eg.source[i] < 0 or names[eg.source[i]] != source):
            continue
        out.append(i)
    return out


GRPO_SYNC = Structure("grpo", False, (("actor", 0),))
ALL4 = ((0, 0, 0), (1, 1, 4))
LEFT2, RIGHT2 = ((0, 0, 0), (1, 1, 2)), ((0, 0, 2), (1, 1, 2))


def test_colocated_pipeline_has_no_comm_and_no_phases():
    g, eg = setup(
        "grpo",
        GRPO_SYNC,
        dict.fromkeys(["actor_gen", "ref_inf", "reward_inf", "actor_train"], ALL4),
    )
    assert set(eg.kind) == {OP}
    assert set(eg.phase) == {0}
    assert len(eg) == 2 * 4
    ref = nodes(g, eg, OP, "ref_inf", 0)[0]
    gen = nodes(g, eg, OP, "actor_gen", 0)[0]
    assert eg.preds[ref] == [gen]  # same allocation: a plain precedence edge


def test_disjoint_generation_and_inference_split_into_phases():
    place = {"actor_gen": LEFT2, "ref_inf": RIGHT2, "reward_inf": LEFT2, "actor_train": LEFT2}
    g, eg = setup("grpo", GRPO_SYNC, place, k=1)
    gen = nodes(g, eg, OP, "actor_gen")
    ref = nodes(g, eg, OP, "ref_inf")
    assert [eg.phase[i] for i in gen] == [1, 2, 3]
    assert [eg.phase[i] for i in ref] == [1, 2, 3]
    # phases are chained and inherit the first phase for ranking
    assert eg.preds[gen[1]] == [gen[0]] and eg.first_phase[gen[2]] == gen[0]
    comms = nodes(g, eg, COMM, "ref_inf", source="actor_gen")
    assert len(comms) == 3
    Y = g.containers["completions"].nbytes
    assert [eg.nbytes[c] for c in comms] == pytest.approx([Y * 0.5, Y * 0.35, Y * 0.15])
    for q, c in enumerate(comms):
        assert eg.preds[c] == [gen[q]]  # gen phase q → COMM(q) → inference phase q
        assert c in eg.preds[ref[q]]
        assert eg.mask[c] == eg.mask[ref[q]]  # COMM reserves the destination allocation
    # the overlapping reward inference is not split and waits for the whole generation
    rw = nodes(g, eg, OP, "reward_inf")
    assert len(rw) == 1 and eg.phase[rw[0]] == 0 and eg.preds[rw[0]] == [gen[-1]]
    # a consumer of the split inference waits for its last phase (through a COMM: disjoint)
    c = nodes(g, eg, COMM, "actor_train", source="ref_inf")
    assert eg.preds[c[0]] == [ref[-1]]


def test_partially_overlapping_data_edge_is_a_comm_without_split():
    place = {"actor_gen": ALL4, "ref_inf": RIGHT2, "reward_inf": ALL4, "actor_train": ALL4}
    g, eg = setup("grpo", GRPO_SYNC, place, k=1)
    assert set(eg.phase) == {0}
    comms = nodes(g, eg, COMM, "ref_inf", source="actor_gen")
    assert len(comms) == 1 and eg.nbytes[comms[0]] == g.containers["completions"].nbytes


def test_consecutive_same_model_vertices():
    # same allocation, other strategy → RESHARD between generation and training in a step
    cluster = Cluster.from_shape("1x1x4", hardware_preset("gh200"))
    w = Workload("grpo", {"actor": M7, "reward": M7}, 32, 4, 64, 128, quantiles=Q3)
    g = build_graph(w, GRPO_SYNC)
    a = cluster.allocation(*ALL4)
    tp2 = Choice(Strategy((1, 1, 4), 2, 1, 2, 1), a)
    dp4 = Choice(Strategy((1, 1, 4), 4, 1, 1, 1), a)
    plan = Plan((tp2, dp4, dp4, dp4))
    eg = lower(unroll(g, 2), plan, w.quantiles, UnitCosts())
    rs = nodes(g, eg, RESHARD, "actor_train", step=0)
    assert len(rs) == 1 and eg.nbytes[rs[0]] == M7.weight_bytes
    assert eg.preds[rs[0]] == nodes(g, eg, OP, "actor_gen", 0)
    # the publication into step 1 re-lays-out the trained weights too
    pub = nodes(g, eg, RESHARD, "actor_gen", step=1)
    assert len(pub) == 1 and eg.preds[pub[0]] == nodes(g, eg, OP, "actor_train", 0)
    # same strategy everywhere → no RESHARD at all
    eg2 = lower(unroll(g, 2), Plan((dp4,) * 4), w.quantiles, UnitCosts())
    assert RESHARD not in eg2.kind


def test_publication_reuses_an_installed_version():
    # shared actor–critic backbone: the trained weights go to generation and value inference;
    # both sit on the same allocation with one layout, so one COMM installs the version for both
    y = Structure("ppo", True, (("actor_critic", 0),))
    place = {
        "actor_gen": LEFT2,
        "ref_inf": LEFT2,
        "reward_inf": LEFT2,
        "critic_inf": LEFT2,
        "actor_critic_train": RIGHT2,
    }
    g, eg = setup("ppo", y, place, k=2)
    pub = nodes(g, eg, COMM, step=1, source="actor_critic_train")
    assert len(pub) == 1
    gen1 = nodes(g, eg, OP, "actor_gen", 1)[0]
    crit1 = nodes(g, eg, OP, "critic_inf", 1)[0]
    assert pub[0] in eg.preds[gen1] and pub[0] in eg.preds[crit1]


def test_nodes_are_emitted_in_topological_order():
    place = {"actor_gen": LEFT2, "ref_inf": RIGHT2, "reward_inf": RIGHT2, "actor_train": LEFT2}
    _g, eg = setup("grpo", Structure("grpo", False, (("actor", 1),)), place, k=4)
    for i, ps in enumerate(eg.preds):
        assert all(p < i for p in ps)


# --------------------------------------------------------------------------- Figure 3
def critic_case(tau, inf, train, other=ALL4):
    y = Structure("ppo", False, (("actor", 0), ("critic", tau)))
    place = {
        "actor_gen": other,
        "ref_inf": other,
        "reward_inf": other,
        "actor_train": other,
        "critic_inf": inf,
        "critic_train": train,
    }
    return setup("ppo", y, place, k=3, shape="1x1x2")


G0, G1, BOTH = ((0, 0, 0), (1, 1, 1)), ((0, 0, 1), (1, 1, 1)), ((0, 0, 0), (1, 1, 2))


def test_fig3_case1_sync_disjoint_weights_arrive_by_comm():
    g, eg = critic_case(0, G0, G1, other=BOTH)
    # step k reads the weights trained at step k − 1 through a COMM of the full model
    pubs = nodes(g, eg, COMM, "critic_inf", source="critic_train")
    assert [eg.step[i] for i in pubs] == [1, 2]
    assert all(eg.nbytes[i] == M7.weight_bytes for i in pubs)
    # τ = 0 and disjoint: inference and training of a step stay ordered (no shadow pair)
    inf0 = nodes(g, eg, OP, "critic_inf", 0)[0]
    tr0 = nodes(g, eg, OP, "critic_train", 0)[0]
    assert any(inf0 in eg.preds[c] for c in nodes(g, eg, COMM, "critic_train", step=0, source="critic_inf"))
    assert tr0 > inf0


def test_fig3_case2_async_disjoint_is_a_shadow_pair():
    g, eg = critic_case(1, G0, G1, other=BOTH)
    pubs = nodes(g, eg, COMM, "critic_inf", source="critic_train")
    assert [eg.step[i] for i in pubs] == [2]  # τ = 1: training at step 0 feeds inference at step 2
    # inference of step 1 does not wait for training of step 0
    inf1 = nodes(g, eg, OP, "critic_inf", 1)[0]
    tr0 = nodes(g, eg, OP, "critic_train", 0)[0]
    assert tr0 not in eg.preds[inf1]


def test_fig3_cases3_and_4_partial_overlap_send_only_the_missing_share():
    for inf, train in ((BOTH, G0), (G0, BOTH)):
        g, eg = critic_case(1, inf, train, other=BOTH)
        pubs = nodes(g, eg, COMM, "critic_inf", source="critic_train")
        # n_max = 2, n_overlap = 1: half of N·sb travels
        assert [eg.nbytes[i] for i in pubs] == [M7.weight_bytes * (2 - 1) / 2]


def test_fig3_case5_full_colocation_reshards():
    y = Structure("ppo", False, (("actor", 0), ("critic", 0)))
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"))
    w = Workload("ppo", {"actor": M7, "critic": M7, "reward": M7}, 32, 4, 64, 128, quantiles=Q3)
    g = build_graph(w, y)
    a = cluster.allocation(*BOTH)
    dp2 = Choice(Strategy((1, 1, 2), 2, 1, 1, 1), a)
    tp2 = Choice(Strategy((1, 1, 2), 1, 1, 2, 1), a)
    plan = Plan(tuple(tp2 if v.name == "critic_inf" else dp2 for v in g.vertices))
    eg = lower(unroll(g, 2), plan, w.quantiles, UnitCosts())
    names = [v.name for v in g.vertices]
    rs = [
        (names[eg.source[i]], names[eg.vertex[i]], eg.step[i])
        for i in range(len(eg))
        if eg.kind[i] == RESHARD
    ]
    assert ("critic_inf", "critic_train", 0) in rs  # inference layout → training layout
    assert ("critic_train", "critic_inf", 1) in rs  # trained weights → inference layout
    assert COMM not in eg.kind
