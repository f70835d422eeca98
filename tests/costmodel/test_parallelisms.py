"""Expert, context and sequence parallelism (SPEC §15.2–15.3, docs/cost-model.md §10): the
legality rules, each time and memory term by hand, the directory's choices, and a plan with
them through the result file, the summary and the runtime's refusal."""

from __future__ import annotations

import dataclasses

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.costmodel.collectives import allreduce_time, alltoall_time, p2p_time
from rpeg.costmodel.flops import (
    attention_core_flops,
    forward_flops,
    head_nongemm_scalars,
    layer_nongemm_scalars,
    reference_nongemm_scalars,
    training_passes,
)
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import (
    stored_activation_width,
    training_activation_bytes,
    training_state_bytes,
    transient_bytes,
    weight_shard_params,
    zero_shard_params,
)
from rpeg.costmodel.time import op_time
from rpeg.ir import Recompute, Role
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.hardware import Link
from rpeg.ir.models import DEFAULT_LOAD_IMBALANCE
from rpeg.ir.plan import check_strategy
from rpeg.ir.types import Head
from rpeg.scoring.candidates import build_directories, enumerate_strategies, make_strategy
from rpeg.scoring.evaluator import Evaluator

QWEN3_MOE = model_preset("qwen3-30b-a3b")  # 128 experts, 8 per token, 48 layers, 32 heads, 4 KV heads
DENSE = model_preset("qwen2.5-7b")  # 28 heads, 4 KV heads
H100 = hardware_preset("h100")
NODE = Cluster.from_shape("1x1x8", H100)
TWO_NODES = Cluster.from_shape("1x2x8", H100)


def _check(model, role, sequences, dp, pp, tp, mb, *, cluster=NODE, **split):
    size = dp * pp * tp * split.get("cp", 1)
    extent = cluster.shape_for_size(size)
    return check_strategy(cluster, model, role, sequences, extent, dp, pp, tp, mb, **split)


# ---------------------------------------------------------------------------- legality
def test_each_split_is_refused_where_the_engines_do_not_run_it():
    T, G, I = Role.TRAINING, Role.GENERATION, Role.INFERENCE  # noqa: E741
    assert _check(DENSE, T, 64, 1, 1, 2, 4, sp=True) is None
    assert _check(DENSE, T, 64, 1, 1, 1, 4, sp=True).startswith("S1")  # no TP to split
    assert _check(DENSE, G, 64, 1, 1, 2, 1, sp=True).startswith("S1")
    assert _check(DENSE, T, 64, 1, 1, 1, 4, cp=4) is None
    assert _check(DENSE, G, 64, 1, 1, 1, 1, cp=2).startswith("C1")
    assert _check(DENSE, I, 64, 1, 1, 1, 1, cp_kind="ulysses").startswith("C1")  # needs cp > 1
    # Ulysses: cp | heads/tp = 28/2 = 14 and the local KV heads 4/2 = 2 divide or are divided
    assert _check(DENSE, T, 64, 1, 1, 2, 4, cp=2, cp_kind="ulysses", sp=True) is None
    assert _check(DENSE, T, 64, 1, 1, 2, 4, cp=4, cp_kind="ulysses", sp=True).startswith("C2")
    # C3: a context-parallel group of tp·cp = 6 ranks does not tile a node of 8
    why = _check(DENSE, T, 64, 1, 1, 2, 4, cp=3, sp=True, cluster=Cluster.from_shape("1x3x8", H100))
    assert why is not None and why.startswith(("C3", "P6"))
    # experts
    assert _check(DENSE, T, 64, 2, 1, 1, 4, ep=2).startswith("E1")
    assert _check(QWEN3_MOE, T, 64, 8, 1, 1, 4, ep=8) is None
    assert _check(QWEN3_MOE, T, 64, 8, 1, 1, 4, ep=3) is not None  # 3 ∤ 128 (and ∤ dp)
    assert _check(QWEN3_MOE, T, 64, 2, 1, 4, 4, ep=2).startswith("E3")  # TP and EP need SP
    assert _check(QWEN3_MOE, T, 64, 2, 1, 4, 4, ep=2, sp=True) is None
    assert _check(QWEN3_MOE, T, 64, 2, 1, 1, 4, cp=4, ep=8) is None  # EP inside DP×CP
    assert _check(QWEN3_MOE, T, 64, 2, 1, 1, 4, cp=2, ep=8).startswith("E2")
    assert _check(QWEN3_MOE, G, 64, 4, 1, 2, 1, ep=4) is None  # the engine's DP ranks
    assert _check(QWEN3_MOE, G, 64, 4, 1, 2, 1, ep=2).startswith("E2")
    off = dataclasses.replace(NODE, **NO_SPLITS)
    assert "sequence_parallel=false" in _check(DENSE, T, 64, 1, 1, 2, 4, sp=True, cluster=off)
    assert "context_parallel=false" in _check(DENSE, T, 64, 1, 1, 1, 4, cp=2, cluster=off)
    assert "expert_parallel=false" in _check(QWEN3_MOE, T, 64, 8, 1, 1, 4, ep=8, cluster=off)


def test_tiers_follow_the_rank_order():
    """Ranks are ordered t + Pt·(c + Pc·(p + Pp·d)): a CP group of Pt·Pc consecutive devices, the
    EP group's CP ranks first."""
    s = make_strategy(TWO_NODES, (1, 2, 8), 2, 1, 4, 4, cp=2, ep=4, sp=True)
    assert (s.cp_tier, s.ep_tier, s.dp_tier) == (0, 1, 1)  # CP inside a node, EP across both
    s = make_strategy(TWO_NODES, (1, 2, 8), 1, 1, 2, 4, cp=8, sp=True)
    assert s.cp_tier == 1 and s.size == 16


# ---------------------------------------------------------------------------- memory
def test_experts_shard_over_the_expert_parallel_ranks():
    m = QWEN3_MOE
    experts = m.layers * m.expert_weights  # every routed expert of every block
    whole = weight_shard_params(m, 1, 1)
    assert weight_shard_params(m, 1, 1, ep=8) == pytest.approx(whole - experts * 7 / 8)
    assert weight_shard_params(m, 1, 2, ep=4) == pytest.approx(
        (whole - experts) / 2 + (m.embedding_params + m.vocab * m.hidden) / 2 + experts / 8
    )
    # ZeRO: the rest over Pd·Pc, an expert's state over the Pd·Pc/Pe ranks that hold it
    lay = Layout(make_strategy(NODE, (1, 1, 8), 4, 1, 1, 4, cp=2, ep=8).variant(recompute="none"))
    shard = weight_shard_params(m, 1, 1, ep=8)
    owned = (shard - experts / 8) / 8 + (experts / 8) * 8 / 8
    assert zero_shard_params(m, lay) == pytest.approx(owned)
    assert training_state_bytes(m, lay) == pytest.approx(12 * owned)


def test_dense_weights_without_experts_are_unchanged_by_ep_one():
    for tp in (1, 2, 4):
        assert weight_shard_params(DENSE, 2, tp, ep=1) == weight_shard_params(DENSE, 2, tp)


def test_context_parallelism_splits_the_activations_and_sp_the_replicated_widths():
    base = make_strategy(NODE, (1, 1, 4), 1, 1, 2, 8).variant(recompute="none")
    cp2 = make_strategy(NODE, (1, 1, 8), 1, 1, 2, 8, cp=2).variant(recompute="none")
    kw = {"sequences": 64.0, "tokens": 8192.0}
    assert training_activation_bytes(DENSE, Layout(cp2), **kw) == pytest.approx(
        training_activation_bytes(DENSE, Layout(base), **kw) / 2
    )
    d = DENSE.hidden
    plain, split = stored_activation_width(DENSE, 2), stored_activation_width(DENSE, 2, sp=True)
    assert plain - split == pytest.approx(4 * d / 2)  # 4d replicated → 4d/Pt
    # the whole transient of an SP layout: the smaller activations, the same weights
    sp = base.variant(sp=True)
    args = {"sequences": 64.0, "prompt_len": 1024, "response_len": 7168}
    assert transient_bytes(DENSE, Role.TRAINING, Layout(sp), **args) < transient_bytes(
        DENSE, Role.TRAINING, Layout(base), **args
    )


# ---------------------------------------------------------------------------- time
def _hw(**links):
    """H100 with every collective and P2P link set to ``Link(alpha, beta)``."""
    link = Link(*links.get("link", (1e-5, 1e-10)))
    return dataclasses.replace(H100, collective=(link,) * 3, p2p=(link,) * 3)


def test_expert_parallel_alltoalls_by_hand():
    hw = _hw()
    s = make_strategy(NODE, (1, 1, 8), 8, 1, 1, 4, ep=8).variant(recompute="none")
    t = op_time(QWEN3_MOE, Role.TRAINING, Layout(s), hw, sequences=64, prompt_len=512, response_len=512)
    m = QWEN3_MOE
    tokens = 64 / (8 * 4) * 1024  # per device and microbatch
    nbytes = tokens * m.experts_active * m.hidden * m.dtype_bytes * 7 / 8
    # 2 forward + 2 backward AlltoAlls per MoE layer and microbatch
    assert t.ep_comm == pytest.approx(4 * 4 * m.moe_layers * alltoall_time(8, nbytes, hw.collective[0]))
    full = op_time(
        m,
        Role.TRAINING,
        Layout(s.variant(recompute="full")),
        hw,
        sequences=64,
        prompt_len=512,
        response_len=512,
    )
    assert full.ep_comm == pytest.approx(t.ep_comm * 6 / 4)
    assert t.total == pytest.approx(t.gemm + t.bubble + t.comm + t.nongemm + t.opt + t.overhead)
    # no EP, no AlltoAll
    s1 = make_strategy(NODE, (1, 1, 8), 8, 1, 1, 4).variant(recompute="none")
    assert (
        op_time(m, Role.TRAINING, Layout(s1), hw, sequences=64, prompt_len=512, response_len=512).ep_comm == 0
    )


def test_load_imbalance_slows_the_expert_gemms_of_an_expert_parallel_layout():
    """``η_MoE = 1/((1 − φψ)/η + λ·φψ/η_e)``: in a compute-bound step the GEMM time is affine in
    the model's ``λ`` (SPEC's 1.2 by default), and without expert parallelism ``λ`` does nothing
    (one rank holds every expert)."""
    assert QWEN3_MOE.load_imbalance == DEFAULT_LOAD_IMBALANCE == 1.2
    s = make_strategy(NODE, (1, 1, 8), 8, 1, 1, 4, ep=8).variant(recompute="none")
    args = {"sequences": 64, "prompt_len": 512, "response_len": 512}

    def gemm(lam: float, strategy=s) -> float:
        spec = dataclasses.replace(QWEN3_MOE, load_imbalance=lam)
        return op_time(spec, Role.TRAINING, Layout(strategy), H100, **args).gemm

    even, default, twice = gemm(1.0), gemm(1.2), gemm(2.0)
    assert even < default < twice
    assert twice - even == pytest.approx(5.0 * (default - even), rel=1e-9)
    assert op_time(QWEN3_MOE, Role.TRAINING, Layout(s), H100, **args).gemm == default
    no_ep = make_strategy(NODE, (1, 1, 8), 8, 1, 1, 4).variant(recompute="none")
    assert gemm(1.0, no_ep) == gemm(2.0, no_ep)


def test_ring_attention_is_exposed_only_beyond_the_attention_core():
    m, L = DENSE, DENSE.layers
    args = {"sequences": 8, "prompt_len": 1024, "response_len": 31744}
    s = make_strategy(NODE, (1, 1, 8), 1, 1, 2, 8, cp=4, sp=True).variant(recompute="none")
    # a link slower than the attention core, which runs at the roofline (no measured kernel rates;
    # test_nongemm_attention.py has the rated core)
    slow = dataclasses.replace(_hw(link=(1e-3, 1e-8)), attention=())
    t = op_time(m, Role.TRAINING, Layout(s), slow, **args)
    ell = 32768.0
    tokens = 8 / 8 * ell / 4  # one sequence per microbatch, a quarter on each CP rank
    kv = 2 * (m.kv_heads // 2) * m.head_dim  # local K and V
    ring = 3 * L * 8 * 3 * p2p_time(tokens * kv * m.dtype_bytes, slow.p2p[0])
    share = attention_core_flops(m, ell) / forward_flops(m, ell, Head.LM)
    passes = training_passes(m, Recompute.NONE, ell, Head.LM)
    assert t.cp_comm == pytest.approx(ring - t.gemm * share * 3 / passes, rel=1e-9)
    fast = op_time(m, Role.TRAINING, Layout(s), _hw(link=(1e-7, 1e-13)), **args)
    assert fast.cp_comm == 0.0  # hidden behind the core


def test_ulysses_runs_four_alltoalls_per_layer_and_pass():
    m, hw = DENSE, _hw()
    s = make_strategy(NODE, (1, 1, 8), 1, 1, 2, 8, cp=2, cp_kind="ulysses", sp=True).variant(recompute="full")
    t = op_time(m, Role.TRAINING, Layout(s), hw, sequences=8, prompt_len=1024, response_len=7168)
    tokens = 8 / 8 * 8192 / 2
    one = alltoall_time(2, tokens * m.hidden * m.dtype_bytes / 2, hw.collective[0])
    assert t.cp_comm == pytest.approx(4 * 3 * m.layers * 8 * one)  # forward, backward, recompute


def test_sequence_parallelism_costs_the_allreduce_and_drops_the_replicated_work():
    hw = dataclasses.replace(_hw(), c_nongemm=1e-3)
    base = make_strategy(NODE, (1, 1, 4), 1, 1, 4, 8).variant(recompute="none")
    args = {"sequences": 64, "prompt_len": 512, "response_len": 512}
    plain = op_time(DENSE, Role.TRAINING, Layout(base), hw, **args)
    split = op_time(DENSE, Role.TRAINING, Layout(base.variant(sp=True)), hw, **args)
    assert split.tp_comm == pytest.approx(plain.tp_comm)  # ReduceScatter + AllGather = AllReduce
    # SP splits the norms and residual adds over the 4 TP ranks too: each rank does a quarter of
    # one device's unsplit work, 3 forward-equivalents of its 64·1024 tokens
    one_device = DENSE.layers * layer_nongemm_scalars(DENSE) + head_nongemm_scalars(DENSE)
    kappa = hw.c_nongemm / (hw.b_cal * hw.l_cal * reference_nongemm_scalars(hw.d_cal))
    assert split.nongemm == pytest.approx(3 * 64 * 1024 * one_device / 4 * kappa)
    assert plain.nongemm > split.nongemm > 0  # without SP the replicated part stays whole
    tokens = 64 / 8 * 1024
    one = allreduce_time(4, tokens * DENSE.hidden * DENSE.dtype_bytes, hw.collective[0])
    assert plain.tp_comm == pytest.approx(4 * DENSE.layers * 8 * one)


def test_generation_dispatches_per_moe_layer_and_decode_step():
    hw = _hw()
    s = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 1, ep=4)
    args = {"sequences": 64, "prompt_len": 128, "response_len": 256}
    t = op_time(QWEN3_MOE, Role.GENERATION, Layout(s), hw, **args)
    m = QWEN3_MOE

    def a2a(tokens):
        return alltoall_time(
            4, tokens * m.experts_active * m.hidden * m.dtype_bytes * 3 / 4, hw.collective[0]
        )

    b = 64 / 4
    expected = 2 * m.moe_layers * (a2a(b * 128) + 255 * a2a(b))
    assert t.ep_comm == pytest.approx(expected)


def test_a_context_parallel_layout_never_beats_its_data_parallel_twin():
    """The directory's exclusion (docs/cost-model.md §10): at equal tokens per device the twin
    is as fast and as lean."""
    w = Workload("grpo", {"actor": DENSE, "reward": DENSE}, 16, 4, 512, 3584)
    ev = Evaluator(w, NODE)
    train = next(i for i, v in enumerate(ev.graph.vertices) if v.role is Role.TRAINING)
    for cp, dp in ((2, 1), (4, 2), (8, 1)):
        for kind in ("ring", "ulysses"):
            if kind == "ulysses" and (28 // 1) % cp:
                continue
            c = make_strategy(NODE, (1, 1, 8), dp, 1, 1, 8, cp=cp, cp_kind=kind).variant(recompute="none")
            twin = make_strategy(NODE, (1, 1, 8), dp * cp, 1, 1, 8).variant(recompute="none")
            assert ev.costs.op_time(train, twin) <= ev.costs.op_time(train, c)
            a, b = ev.costs.memory(train, twin), ev.costs.memory(train, c)
            assert b.transient == pytest.approx(a.transient) and b.train_state == pytest.approx(a.train_state)


# ---------------------------------------------------------------------------- the plan space
def test_directories_list_the_splits_where_they_can_pay():
    long_job = Workload("grpo", {"actor": DENSE}, 4, 8, 1024, 31744, reward="rule")
    ev = Evaluator(long_job, TWO_NODES)
    dirs = build_directories(ev.costs)
    train = next(d for d in dirs if ev.graph.vertices[d.vertex].role is Role.TRAINING)
    assert any(s.cp > 1 for s in train.strategies)
    assert {s.cp_kind for s in train.strategies if s.cp > 1} <= {"ring", "ulysses"}
    assert all(s.sp == (s.tp > 1) for s in train.strategies)  # SP wherever TP (never worse)
    legal = enumerate_strategies(TWO_NODES, DENSE, 32, Role.TRAINING)
    listed = {(s.extent, s.dp, s.pp, s.tp, s.cp, s.cp_kind, s.mb) for s in legal}
    for s in legal:
        if s.cp > 1 and (s.dp > 1 or s.pp == 1):  # only where no layout with less CP is listed
            assert s.mb > 32 // (s.dp * s.cp)
            for k in (2, 4, 8, 16):
                if s.cp % k == 0:
                    kind = s.cp_kind if s.cp > k else "ring"
                    assert (s.extent, s.dp * k, s.pp, s.tp, s.cp // k, kind, s.mb) not in listed, s.label()
    moe = Workload("grpo", {"actor": QWEN3_MOE}, 32, 8, 512, 1536, reward="rule")
    legal = enumerate_strategies(TWO_NODES, QWEN3_MOE, 256, Role.TRAINING)
    assert {s.ep for s in legal} >= {1, 2, 4, 8, 16}
    gen = enumerate_strategies(TWO_NODES, QWEN3_MOE, 256, Role.GENERATION)
    assert all(s.ep in (1, s.dp) for s in gen) and any(s.ep > 1 for s in gen)
    assert moe.models["actor"].is_moe


# ---------------------------------------------------------------------------- a plan with them
def _split_plan():
    """A GRPO plan by hand on one node: generation DP 2 × TP 4 (experts over the 2 engines,
    ep = 2), training DP 1 × TP 2 × CP 4 ring with SP and EP 4."""
    from rpeg import Structure
    from rpeg.solvers.result import result_for_plan

    small = QWEN3_MOE.scaled(layers=8, hidden=512, heads=8, vocab=4096)
    small = dataclasses.replace(small, kv_heads=4)
    w = Workload("grpo", {"actor": small}, 16, 4, 512, 3584, reward="rule", kl_coef=0.0)
    every = ((0, 0, 0), (1, 1, 8))
    table = {
        "actor_gen": (*every, 2, 1, 4, 1, None, {"ep": 2}),
        "actor_train": (*every, 1, 1, 2, 16, "none", {"cp": 4, "ep": 4, "sp": True}),
    }
    return result_for_plan(w, NODE, Structure("grpo", False, (("actor", 0),)), table)


def test_a_split_plan_round_trips_and_the_summary_names_its_splits(tmp_path):
    from rpeg import Result

    result = _split_plan()
    train = result.plan.choices[1].strategy
    assert (train.cp, train.cp_kind, train.ep, train.sp, train.size) == (4, "ring", 4, True, 8)
    doc = result.to_dict()
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    assert (entry["cp"], entry["cp_kind"], entry["ep"], entry["sp"]) == (4, "ring", 4, True)
    back = Result.from_dict(doc)
    assert back.plan == result.plan
    assert back.evaluation.makespan == result.evaluation.makespan
    text = result.summary()
    assert "(1,1,2) sp cp=4 ring ep=4" in text and "(2,1,4) ep=2" in text
    # a misspelt or mistyped field is refused, named
    bad = dict(entry, cp="4")
    doc["plan"] = [bad if e["vertex"] == "actor_train" else e for e in doc["plan"]]
    with pytest.raises(Exception, match=r"actor_train.*'cp' must be int"):
        Result.from_dict(doc)


def test_the_runtime_refuses_the_splits_naming_the_switch():
    pytest.importorskip("torch")
    from rpeg.runtime.driver.runner import check_engine_choices

    result = _split_plan()
    with pytest.raises(ValueError, match=r"'actor_gen': expert parallelism \(ep=2\).*--no-expert-parallel"):
        check_engine_choices(result)
    dense = dataclasses.replace(result.workload.models["actor"], experts=0, experts_active=0, expert_ffn=0)
    from rpeg import Structure
    from rpeg.solvers.result import result_for_plan

    w = dataclasses.replace(result.workload, models={"actor": dense})
    every = ((0, 0, 0), (1, 1, 8))
    table = {
        "actor_gen": (*every, 2, 1, 4, 1),
        "actor_train": (*every, 2, 1, 2, 16, "none", {"cp": 2, "sp": True}),
    }
    plan = result_for_plan(w, NODE, Structure("grpo", False, (("actor", 0),)), table)
    with pytest.raises(
        ValueError, match=r"vertex 'actor_train': sequence parallelism .* --no-sequence-parallel"
    ):
        check_engine_choices(plan)
