"""Plans an engine would refuse: tensor parallelism against the attention heads (H1–H2), the
microbatches each role may use (P4–P5) and the engine choices (Z1–Z2, SPEC §14).

vLLM (generation) needs ``tp | heads`` and ``tp | kv_heads`` or ``kv_heads | tp``; Megatron-core
(inference, training) needs ``tp | heads`` and ``tp | kv_heads`` (``rpeg.ir.plan.check_heads``).
A generation keeps SPEC §4's microbatches; training and inference accumulate gradients
(``1 ≤ mb ≤ B_local``, ``pp > 1 ⇒ mb ≥ pp``). Every method must plan only layouts both the
package and the independent checker (``tests/tools/check_result.py``) accept; a hand-written
plan, a result file and a transition target that break a head rule are refused with the rule
named.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg import Cluster, ModelSpec, Workload, hardware_preset, plan_transition, solve
from rpeg.ir import Choice, Plan, Role, Structure, build_graph
from rpeg.ir.emu import emus_of
from rpeg.ir.errors import InputError
from rpeg.ir.plan import check_heads, check_plan, check_strategy
from rpeg.scoring.candidates import build_directories, enumerate_strategies, explain_illegal, make_strategy
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers import Result
from rpeg.solvers.result import plan_from_entries
from tests.conftest import example_problem, load_checker

cr = load_checker()

METHODS: dict[str, dict] = {
    "greedy": {},
    "concurrent": {},
    "sa": {"max_evaluations": 60},
    "dp": {},
    "cpsat": {"candidates": 1, "time_limit": 1.0},
    "milp": {"candidates": 1, "time_limit": 1.0},
}


def _options(method: str, workload: Workload, seconds: float) -> dict:
    """``METHODS[method]``; the exact ones solve the synchronous structure for ``seconds``."""
    options = dict(METHODS[method])
    if method in ("cpsat", "milp"):
        options.update(structure=Structure.synchronous(workload), time_limit=seconds)
    return options


def _spec(heads: int, kv_heads: int, head_dim: int, layers: int) -> ModelSpec:
    hidden = heads * head_dim
    return ModelSpec(
        f"h{heads}kv{kv_heads}d{head_dim}L{layers}", layers, hidden, 2 * hidden, 512, heads, kv_heads
    )


def _assert_checked(result: Result, tmp_path, name: str) -> list[str]:
    """Write ``result`` as ``rpeg.result/2`` and re-check it with the independent checker."""
    path = tmp_path / f"{name}.json"
    result.to_json(path)
    errors = cr.check_file(str(path))
    assert errors == [], (name, errors)
    if result.plan is not None:
        assert check_plan(result.graph, result.cluster, result.plan) == []
    return errors


# ---------------------------------------------------------------------------- the rules
@pytest.mark.parametrize(
    ("heads", "kv_heads", "role", "tp", "rule"),
    [
        (16, 16, Role.GENERATION, 3, "H1 (vLLM): tp=3 does not divide heads=16"),
        (12, 12, Role.TRAINING, 8, "H1 (Megatron-core): tp=8 does not divide heads=12"),
        (32, 8, Role.TRAINING, 16, "H2 (Megatron-core): tp=16 does not divide kv_heads=8 (query groups)"),
        (32, 8, Role.INFERENCE, 16, "H2 (Megatron-core)"),
        (32, 8, Role.GENERATION, 16, None),  # vLLM replicates each KV head on 2 ranks
        (12, 4, Role.GENERATION, 6, "H2 (vLLM): tp=6 neither divides kv_heads=4"),
        (64, 8, Role.TRAINING, 8, None),
        (40, 8, Role.GENERATION, 1, None),
    ],
)
def test_head_rules_name_rule_and_engine(heads, kv_heads, role, tp, rule):
    why = check_heads(_spec(heads, kv_heads, 8, 2), role, tp)
    if rule is None:
        assert why is None
    else:
        assert why is not None and why.startswith(rule), why


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    heads=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 20, 32, 40, 52, 64, 96]),
    data=st.data(),
    role=st.sampled_from(list(Role)),
    tp=st.integers(1, 64),
)
def test_package_and_checker_agree_on_the_head_rules(heads, data, role, tp):
    kv = data.draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    mine = check_heads(_spec(heads, kv, 2, 2), role, tp)
    theirs = cr._check_heads({"vertex": "v", "dp": 1, "pp": 1, "tp": tp, "mb": 1}, heads, kv, role.value)
    assert (mine is None) == (theirs == []), (heads, kv, role, tp, mine, theirs)
    if mine is not None:
        assert mine.split(":")[0] in theirs[0]


def test_check_strategy_wants_the_model():
    c = Cluster.from_shape("1x1x4", hardware_preset("h100"))
    with pytest.raises(TypeError, match="ModelSpec"):
        check_strategy(c, 4, Role.TRAINING, 16, (1, 1, 4), 1, 1, 4, 1)  # type: ignore[arg-type]


def test_directories_share_one_enumeration_per_engine():
    """Inference and training vertices of one model run on Megatron-core: same strategies;
    the generation (vLLM) may allow more (replicated KV heads)."""
    c = Cluster.from_shape("1x1x8", hardware_preset("h100"))
    m = _spec(32, 2, 64, 4)
    w = Workload("ppo", {"actor": m, "critic": m, "reward": m}, 16, 1, 32, 32)
    ev = Evaluator(w, c, k_eval=1)
    dirs = build_directories(ev.costs)
    tps = {v.role: set() for v in ev.graph.vertices}
    for v, d in zip(ev.graph.vertices, dirs):
        tps[v.role] |= {s.tp for s in d.strategies}
    assert tps[Role.TRAINING] <= {1, 2} and tps[Role.INFERENCE] <= {1, 2}
    assert 8 in tps[Role.GENERATION]  # vLLM: 8 = 4 × kv_heads, each KV head on 4 ranks
    gen = enumerate_strategies(c, m, 16, Role.GENERATION)
    assert {s.tp for s in gen} == {1, 2, 4, 8}
    assert {s.tp for s in enumerate_strategies(c, m, 16, Role.TRAINING)} == {1, 2}


# ---------------------------------------------------------------------------- 1x1x3, 16 heads
@cache
def _sixteen_heads_on_three(algorithm: str):
    """The ``ppo-1b-4gpu`` example (16 heads) on 3 GPUs; ``"grpo"``: its model in a GRPO job
    (4 invocations: small enough for the MILP to prove optimality in a few seconds)."""
    workload, _, _ = example_problem("ppo-1b-4gpu")
    if algorithm == "grpo":
        m = workload.models["actor"]
        workload = Workload("grpo", {"actor": m, "reward": m}, 32, 2, 256, 256, name="grpo-1b-3gpu")
    return workload, Cluster.from_shape("1x1x3", hardware_preset("h100"))


@pytest.mark.parametrize("method", list(METHODS))
def test_tp3_is_never_planned_for_16_heads_on_1x1x3(method, tmp_path):
    # before H1, concurrent, sa, dp and cpsat put actor_gen on (1,1,3)
    workload, cluster = _sixteen_heads_on_three("grpo" if method == "milp" else "ppo")
    assert {m.heads for m in workload.models.values()} == {16}
    r = solve(workload, cluster, method, k_eval=1, **_options(method, workload, 20.0))
    if r.plan is None:
        # greedy puts every invocation on all 3 GPUs: only tp=3 or dp=3 could fill them
        assert method == "greedy", r.message
        assert "no legal parallel layout of 3 GPUs" in r.message
        assert "H1 (tp | heads)" in r.message and "M_eff" not in r.message
    else:
        assert all(c.strategy.tp != 3 for c in r.plan.choices), r.plan
    _assert_checked(r, tmp_path, method)


def test_no_legal_layout_names_the_rules_and_never_a_negative_excess():
    workload, _, _ = example_problem("ppo-7b-16gpu")
    big = Cluster.from_shape("64x32x8", hardware_preset("gh200"))
    r = solve(workload, big, "greedy", k_eval=1)
    assert r.plan is None
    assert "no legal parallel layout of 16384 GPUs" in r.message
    assert "exceeds M_eff" not in r.message and "P5" in r.message
    # a 32-head 7B model on 3 GPUs: only tp=1 is legal, and one GPU does not hold its training
    # (the rollout engine sizes its KV cache to the memory fraction, so the generation fits;
    # without context parallelism, which would split the sequences over all three)
    small = Cluster.from_shape("1x1x3", hardware_preset("h100"), context_parallel=False)
    for method in ("greedy", "concurrent", "dp"):
        msg = solve(workload, small, method, k_eval=1).message
        over = re.search(r"(-?[0-9.]+) GiB over M_eff", msg)
        assert over is not None and float(over.group(1)) > 0, msg
        assert "actor_train" in msg, msg
        assert "H1 (Megatron-core): tp=3 does not divide heads=32" in msg, msg


def test_explain_illegal_counts_the_rules():
    c = Cluster.from_shape("1x1x3", hardware_preset("h100"))
    why = explain_illegal(c, _spec(16, 16, 64, 16), Role.GENERATION, 64, [3])
    assert why.startswith("all 4 candidates (dp,pp,tp,mb) break a rule")
    assert "H1 (tp | heads) ×1" in why and "P3 (dp | B·R) ×1" in why
    assert explain_illegal(c, _spec(16, 16, 64, 16), Role.GENERATION, 64, [1]) == ""


# ---------------------------------------------------------------------------- microbatches, engine choices
_C8 = Cluster.from_shape("1x1x8", hardware_preset("h100"))
_M8 = _spec(32, 8, 64, 8)


def _why(role: Role, dp: int, pp: int, mb: int, sequences: int = 64, **engine) -> str | None:
    """``check_strategy`` for tp=1 on ``dp·pp`` GPUs of one 8-GPU node."""
    return check_strategy(_C8, _M8, role, sequences, (1, 1, dp * pp), dp, pp, 1, mb, **engine)


# (role, dp, pp, mb, engine choices, the message's start or None); B·R = 64
RULES = [
    # training and inference: gradient accumulation, 1 ≤ mb ≤ B_local, pp > 1 ⇒ mb ≥ pp
    (Role.TRAINING, 4, 1, 4, {}, None),
    (Role.TRAINING, 4, 1, 16, {}, None),
    (Role.TRAINING, 4, 1, 17, {}, "P4: mb=17 exceeds B_local=16 sequences"),
    (Role.INFERENCE, 2, 1, 3, {}, None),  # 3 ∤ 32: the last microbatch is smaller
    (Role.INFERENCE, 4, 2, 4, {}, None),  # B_local/mb = 4 < 8: SPEC §4's P5 refused it
    (Role.TRAINING, 4, 2, 1, {}, "P5: mb=1 must be ≥ pp=2"),
    (Role.INFERENCE, 1, 4, 2, {}, "P5: mb=2 must be ≥ pp=4"),
    # a generation keeps SPEC §4's rules
    (Role.GENERATION, 4, 1, 2, {}, "P4: a generation with pp=1 requires mb=1"),
    (Role.GENERATION, 4, 2, 4, {}, "P5: mb=4 needs mb | B_local=16, mb ≥ pp=2 and B_local/mb ≥ 8"),
    (Role.GENERATION, 2, 2, 4, {}, None),
    # Z1: the ZeRO stage a role may use
    (Role.TRAINING, 4, 1, 1, {"zero": 1}, None),
    (Role.TRAINING, 4, 1, 1, {"zero": 3}, None),
    (Role.INFERENCE, 4, 1, 1, {"zero": 3}, None),
    (Role.INFERENCE, 4, 1, 1, {"zero": 1}, "Z1: zero=1 is not a ZeRO stage inference may use (2, 3)"),
    (Role.GENERATION, 4, 1, 1, {"zero": 3}, "Z1: zero=3 is not a ZeRO stage generation may use (2)"),
    # Z2: a memory fraction only for a generation; loss chunks and padding only for the others
    (Role.GENERATION, 4, 1, 1, {"mem_fraction": 0.5}, None),
    (Role.TRAINING, 4, 1, 1, {"mem_fraction": 0.5}, "Z2: mem_fraction=0.5 is a rollout engine's"),
    (Role.INFERENCE, 4, 1, 1, {"mem_fraction": 0.9}, "Z2: mem_fraction=0.9"),
    (Role.TRAINING, 4, 1, 1, {"logits_chunk": 4096, "packing": False}, None),
    (Role.INFERENCE, 4, 1, 1, {"logits_chunk": 2048, "packing": False}, None),
    (Role.GENERATION, 4, 1, 1, {"logits_chunk": 4096}, "Z2: a generation neither chunks a loss nor pads"),
    (Role.GENERATION, 4, 1, 1, {"packing": False}, "Z2: a generation neither chunks a loss nor pads"),
]  # fmt: skip


@pytest.mark.parametrize(("role", "dp", "pp", "mb", "engine", "rule"), RULES)
def test_microbatch_and_engine_rules_by_role(role, dp, pp, mb, engine, rule):
    why = _why(role, dp, pp, mb, **engine)
    if rule is None:
        assert why is None
    else:
        assert why is not None and why.startswith(rule), why
    # the independent checker judges a /2 entry the same way
    entry = {"vertex": "v", "origin": [0, 0, 0], "extent": [1, 1, dp * pp], "dp": dp, "pp": pp, "tp": 1}
    entry.update(mb=mb, **engine)
    theirs = cr._check_entry(entry, 8, 64, (1, 1, 8), "sequences", role.value)
    theirs += cr._check_engine_fields(entry, role.value)
    assert (theirs == []) == (rule is None), theirs
    if rule is not None:
        assert any(f" {rule[:2]} " in m for m in theirs), theirs


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    role=st.sampled_from(list(Role)),
    dp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4, 8]),
    mb=st.integers(1, 40),
    sequences=st.sampled_from([8, 24, 48, 64, 96]),
    zero=st.sampled_from([1, 2, 3]),
    mem_fraction=st.sampled_from([0.0, 0.3]),
    logits_chunk=st.sampled_from([0, 4096]),
    packing=st.booleans(),
)
def test_package_and_checker_agree_on_microbatches_and_engine_choices(
    role, dp, pp, mb, sequences, zero, mem_fraction, logits_chunk, packing
):
    if dp * pp > 8:
        return
    engine = {"zero": zero, "mem_fraction": mem_fraction, "logits_chunk": logits_chunk, "packing": packing}
    mine = _why(role, dp, pp, mb, sequences, **engine)
    entry = {"vertex": "v", "origin": [0, 0, 0], "extent": [1, 1, dp * pp], "dp": dp, "pp": pp, "tp": 1}
    entry.update(mb=mb, **engine)
    theirs = cr._check_entry(entry, 8, sequences, (1, 1, 8), "sequences", role.value)
    theirs += cr._check_engine_fields(entry, role.value)
    assert (mine is None) == (theirs == []), (role, dp, pp, mb, sequences, engine, mine, theirs)
    if mine is not None:
        assert any(f" {mine.split(':')[0]} " in m for m in theirs), (mine, theirs)


# ---------------------------------------------------------------------------- plan files
@cache
def _twelve_heads():
    m = _spec(12, 12, 64, 4)
    w = Workload("grpo", {"actor": m, "reward": m}, 8, 2, 32, 32, name="twelve-heads")
    c = Cluster.from_shape("1x1x8", hardware_preset("h100"))
    return w, c, solve(w, c, "concurrent", k_eval=1)


@pytest.mark.parametrize(("vertex", "engine"), [("actor_gen", "vLLM"), ("actor_train", "Megatron-core")])
def test_plan_entries_refuse_tp8_for_12_heads(vertex, engine):
    w, c, base = _twelve_heads()
    entries = copy.deepcopy(base.to_dict()["plan"])
    e = next(x for x in entries if x["vertex"] == vertex)
    e.update(origin=[0, 0, 0], extent=[1, 1, 8], dp=1, pp=1, tp=8, mb=1)  # P1–P8 hold
    ev = Evaluator(w, c, base.structure, k_eval=1)
    with pytest.raises(
        ValueError, match=rf"'{vertex}' is illegal: H1 \({engine}\): tp=8 does not divide heads=12"
    ):
        plan_from_entries(ev, entries)
    doc = base.to_dict()
    doc["plan"] = entries
    with pytest.raises(ValueError, match=rf"H1 \({engine}\)"):
        Result.from_json(json.dumps(doc))
    # the checker refuses the same file
    assert any(f"H1 ({engine})" in m for m in cr.check_plan_legality(doc))


def _tp8(plan: Plan, graph, cluster: Cluster, vertex: str) -> Plan:
    i = graph.index[vertex]
    alloc = cluster.allocation((0, 0, 0), (1, 1, 8))
    return plan.replace(i, Choice(make_strategy(cluster, (1, 1, 8), 1, 1, 8, 1), alloc))


def test_transition_to_an_illegal_target_is_refused():
    w, c, base = _twelve_heads()
    graph = build_graph(w)
    assert base.graph.vertices == graph.vertices  # the synchronous structure
    legal = plan_transition(base.plan, base.plan, c, workload=w)
    assert legal.l_tran == 0.0
    bad = _tp8(base.plan, graph, c, "actor_gen")
    with pytest.raises(InputError, match=r"target plan is illegal: vertex 'actor_gen'.*H1 \(vLLM\): tp=8"):
        plan_transition(base.plan, bad, c, workload=w)
    with pytest.raises(InputError, match=r"H1 \(vLLM\)"):
        plan_transition(base.plan, bad, c, graph=graph, method="cpsat")
    # EMU collections: the graph names the models, so the units' tp are checked too
    cur, tgt = emus_of(base.plan, c, graph=graph), emus_of(bad, c, graph=graph)
    with pytest.raises(InputError, match=r"target unit actor/Gen \(tp=8, pp=1\) is illegal: H1 \(vLLM\)"):
        plan_transition(cur, tgt, c, graph=graph)
    # the current plan is what runs now: only the target is judged
    plan_transition(bad, base.plan, c, workload=w)


def test_exact_methods_refuse_an_illegal_warm_start():
    w, c, base = _twelve_heads()
    bad = _tp8(base.plan, base.graph, c, "actor_train")
    with pytest.raises(ValueError, match=r"'actor_train' candidate .* is illegal: H1 \(Megatron-core\)"):
        solve(w, c, "cpsat", k_eval=1, candidates=1, structure=base.structure, warm_start=bad, time_limit=1.0)


# ---------------------------------------------------------------------------- every method
HEADS = {
    12: [1, 2, 3, 4, 6, 12],
    20: [1, 2, 4, 5, 10, 20],
    40: [1, 2, 4, 5, 8, 40],
    52: [1, 2, 4, 13, 52],
    64: [1, 2, 4, 8, 64],
}
SHAPES = ["1x1x3", "1x2x4", "1x1x6", "1x2x8"]


@st.composite
def models(draw):
    heads = draw(st.sampled_from(sorted(HEADS)))
    kv = draw(st.sampled_from(HEADS[heads]))
    return _spec(heads, kv, draw(st.sampled_from([64, 128])), draw(st.sampled_from([2, 4, 6])))


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    actor=models(),
    other=models(),
    algorithm=st.sampled_from(["grpo", "ppo"]),
    shape=st.sampled_from(SHAPES),
    hardware=st.sampled_from(["h100", "a100-40gb", "h200"]),
    batch=st.sampled_from([8, 16]),
)
def test_every_method_plans_only_what_the_engines_accept(
    tmp_path, actor, other, algorithm, shape, hardware, batch
):
    models_ = (
        {"actor": actor, "reward": other}
        if algorithm == "grpo"
        else {"actor": actor, "critic": other, "reward": other}
    )
    b, r = (batch // 2, 2) if algorithm == "grpo" else (batch, 1)  # GRPO needs R ≥ 2 (same B·R)
    w = Workload(algorithm, models_, b, r, 32, 32, name="legality")
    c = Cluster.from_shape(shape, hardware_preset(hardware))
    for method in METHODS:
        r = solve(w, c, method, k_eval=1, seed=0, **_options(method, w, 1.0))
        _assert_checked(r, tmp_path, method)
        if r.plan is None:
            assert r.message and not re.search(r"-[0-9.]+ GiB", r.message), r.message
        else:
            for v, ch in zip(r.graph.vertices, r.plan.choices):
                assert check_heads(r.graph.models[v.model].spec, v.role, ch.strategy.tp) is None
