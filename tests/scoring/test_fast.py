"""The compiled evaluator (``scoring/fast.py``) against the pure-Python reference.

Property: on thousands of random plans over four algorithms, every structural candidate
(staleness, actor–critic sharing), one and three response-length phases, phase splitting on and
off and clusters from 4 to 64 GPUs, the compiled lowering creates the reference's graph node for
node, the compiled list scheduler its schedule (starts, finishes, blockers, busy time) float for
float, and the compiled evaluator the reference's score, makespan, utilisation, critical seconds
and memory peaks.
"""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import pytest

from rpeg import Cluster, ModelSpec, Workload, hardware_preset, model_preset
from rpeg.ir import Plan, structures
from rpeg.ir.lower import apply_rules, lower
from rpeg.scoring import fast
from rpeg.scoring.candidates import build_directories
from rpeg.scoring.evaluator import Evaluator
from rpeg.scoring.scheduler import list_schedule

SEVEN, ONE = model_preset("13b"), model_preset("7b")
Q3 = ((0.5, 64), (0.85, 128), (1.0, 256))
WORKLOADS = {
    "ppo": Workload("ppo", {"actor": SEVEN, "critic": ONE, "reward": ONE}, 64, 1, 128, 256, quantiles=Q3),
    "ppo-q1": Workload(
        "ppo", {"actor": SEVEN, "critic": SEVEN, "reward": SEVEN}, 64, 1, 128, 256, quantiles=((1.0, 256),)
    ),
    "grpo": Workload("grpo", {"actor": SEVEN, "reward": ONE}, 32, 4, 128, 256, quantiles=Q3),
    "remax": Workload("remax", {"actor": SEVEN, "reward": ONE}, 64, 1, 128, 256, quantiles=Q3),
    "dpo": Workload("dpo", {"actor": SEVEN}, 64, 2, 128, 256),
    # a mixture of experts: the MoE FLOP, weight and roofline terms (SPEC §15.1)
    # latent attention and shared experts (DeepSeek-V2-Lite's shape): the MLA KV and attention terms
    "grpo-mla": Workload(
        "grpo",
        {
            "actor": ModelSpec(
                "deepseek-v2-lite",
                27,
                2048,
                10944,
                102400,
                16,
                16,
                experts=64,
                experts_active=6,
                expert_ffn=1408,
                shared_experts=2,
                shared_ffn=1408,
                dense_layers=(0,),
                kv_lora_rank=512,
                qk_nope_head_dim=128,
                qk_rope_head_dim=64,
                v_head_dim=128,
            ),
            "reward": ONE,
        },
        32,
        4,
        128,
        256,
        quantiles=Q3,
    ),
    "grpo-moe": Workload(
        "grpo", {"actor": model_preset("qwen3-30b-a3b"), "reward": ONE}, 32, 4, 128, 256, quantiles=Q3
    ),
    # sliding-window layers (gpt-oss-20b: W = 128 on half the blocks) beside a Gemma-2-like dense
    # critic whose 192-token window falls inside the responses (contexts 128..384): the windowed
    # FLOP, packed-moment, KV-budget and decode-schedule terms (SPEC §15.1)
    "ppo-swa": Workload(
        "ppo",
        {
            "actor": model_preset("gpt-oss-20b"),
            "critic": ModelSpec(
                "gemma2-like",
                26,
                2304,
                9216,
                256000,
                8,
                4,
                head_dim=256,
                tied_embeddings=True,
                sliding_window=192,
                sliding_layers=tuple(range(0, 26, 2)),
            ),
            "reward": ONE,
        },
        32,
        2,
        128,
        256,
        quantiles=Q3,
    ),
}
CASES = [  # (workload, cluster shape, split_phases, plans per structure)
    ("ppo", "1x2x4", True, 120),
    ("ppo", "2x2x4", True, 80),
    ("ppo", "1x1x4", False, 60),
    ("ppo-q1", "1x2x4", True, 60),
    ("grpo", "1x2x4", True, 100),
    ("remax", "1x4x4", True, 80),
    ("dpo", "1x2x4", True, 60),
    ("grpo-moe", "1x2x4", True, 60),
    ("grpo-mla", "1x2x4", True, 40),
    ("ppo-swa", "1x2x4", True, 40),
    ("ppo", "2x4x8", True, 60),
]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    """Every test here runs with the kernels loaded (the evaluator takes the reference path
    until they are; a comparison before that would compare the reference with itself)."""
    assert fast.warm_up(wait=True)


@cache
def _evaluators(name: str, shape: str, split: bool) -> list[tuple[Evaluator, Evaluator, list]]:
    w = WORKLOADS[name]
    cluster = Cluster.from_shape(shape, hardware_preset("h100"))
    out = []
    for y in structures(w):
        ref = Evaluator(w, cluster, y, k_eval=4, split_phases=split, backend="python")
        compiled = Evaluator(w, cluster, y, k_eval=4, split_phases=split, backend="compiled")
        out.append((ref, compiled, build_directories(ref.costs)))
    return out


def _plans(ev: Evaluator, dirs: list, rng: random.Random, count: int) -> list[Plan]:
    """Uniform random plans, and every third one colocated: each vertex that has a strategy of
    the first vertex's shape takes one on the first vertex's allocation (same-allocation data
    edges, reshards and shared installs are otherwise rare on the larger clusters)."""
    plans = []
    for i in range(count):
        choices = []
        for d in dirs:
            options = d.choices(ev.cluster, rng.randrange(len(d)))
            choices.append(options[rng.randrange(len(options))])
        if i % 3 == 2:
            first = choices[0].allocation
            for v, d in enumerate(dirs[1:], start=1):
                same = [s for s, st in enumerate(d.strategies) if st.extent == first.extent]
                if same:
                    options = d.choices(ev.cluster, rng.choice(same))
                    choices[v] = next(c for c in options if c.allocation.mask == first.mask)
        plans.append(Plan(tuple(choices)))
    return plans


def _kernel_schedule(f: fast.FastLowering, plan: Plan):
    """The compiled lowering and schedule of ``plan``, as arrays."""
    rules = apply_rules(f.unrolled, plan, f.quantiles, f.costs, f.split_phases)
    ints, secs = f.pack(rules, plan)
    kind, vertex, _, step, _, first_phase, dur, psrc, pdst, nn, ne = fast.emit_kernel(
        f._dims, *f._static, ints, secs
    )
    ptr, idx, indeg = fast._successors(nn, ne, psrc, pdst)
    atoms, vptr, vidx = fast.vertex_atoms([c.allocation.mask for c in plan.choices])
    return fast.schedule_kernel(
        dur[:nn].copy(),
        ptr,
        idx,
        indeg,
        first_phase[:nn].copy(),
        (kind[:nn] == 0).astype(np.int64),
        vertex[:nn].copy(),
        step[:nn].copy(),
        vptr,
        vidx,
        len(atoms),
        len(plan),
    )


@pytest.mark.parametrize(("name", "shape", "split", "count"), CASES)
def test_compiled_equals_reference_on_random_plans(name, shape, split, count):
    rng = random.Random(f"{name}-{shape}-{split}")
    checked = split_seen = shared = 0
    splits: set[str] = set()
    for ref, compiled, dirs in _evaluators(name, shape, split):
        for plan in _plans(ref, dirs, rng, count):
            g = lower(ref.unrolled, plan, ref.workload.quantiles, ref.costs, split_phases=split)
            sched = list_schedule(g)
            # the graph, node for node (the compiled lowering carries no payloads)
            h = compiled.fast.lower(plan)
            assert h.nbytes == [0.0] * len(h)
            h.nbytes = g.nbytes
            assert h == g
            # the schedule, float for float
            start, finish, blocker, busy, done, _critical, makespan = _kernel_schedule(compiled.fast, plan)
            assert done == len(g)
            assert start.tolist() == sched.start
            assert finish.tolist() == sched.finish
            assert blocker.tolist() == sched.blocker
            assert busy.tolist() == sched.atom_busy
            assert makespan == sched.makespan
            # the evaluation: score, makespan, utilisation, critical seconds, memory peaks
            a, b = compiled.evaluate(plan), ref.evaluate(plan)
            assert (a.score, a.throughput, a.makespan, a.utilization) == (
                b.score,
                b.throughput,
                b.makespan,
                b.utilization,
            )
            assert a.critical == b.critical
            assert (a.memory.atoms, a.memory.peak, a.feasible) == (b.memory.atoms, b.memory.peak, b.feasible)
            checked += 1
            split_seen += any(g.phase)
            masks = [c.allocation.mask for c in plan.choices]
            shared += len(set(masks)) < len(masks)
            for c in plan.choices:  # SPEC §15's splits, in both evaluators' cost tables
                splits.update(k for k, on in (("ep", c.strategy.ep > 1), ("cp", c.strategy.cp > 1)) if on)
    assert checked >= count * 2
    assert shared >= checked // 3  # colocated placements were exercised
    if name == "grpo-moe":  # expert and context parallelism were exercised
        assert splits == {"ep", "cp"}
    if split and name not in ("ppo-q1", "dpo"):  # DPO generates nothing; Q = 1 never splits
        assert split_seen > 0  # the phase-wise lowering was exercised
    else:
        assert split_seen == 0


def test_the_property_covers_thousands_of_plans():
    total = sum(count * len(structures(WORKLOADS[name])) for name, _, _, count in CASES)
    assert total >= 2000


def test_evaluate_takes_the_compiled_path_once_loaded(tiny_ppo, cluster_1x2x4, monkeypatch):
    import rpeg.scoring.evaluator as evaluator_module

    ev = Evaluator(tiny_ppo, cluster_1x2x4)
    dirs = build_directories(ev.costs)
    plan = Plan(tuple(d.choices(ev.cluster, 0)[0] for d in dirs))
    expected = Evaluator(tiny_ppo, cluster_1x2x4, backend="python").evaluate(plan)

    def no_reference(*args, **kwargs):
        raise AssertionError("the compiled evaluator called the reference lowering")

    monkeypatch.setattr(evaluator_module, "lower", no_reference)
    got = ev.evaluate(plan)
    assert (got.score, got.makespan, got.memory.peak) == (
        expected.score,
        expected.makespan,
        expected.memory.peak,
    )
    # before the kernels are loaded, the same evaluator takes the reference path
    monkeypatch.setattr(evaluator_module, "ready", lambda: False)
    with pytest.raises(AssertionError, match="called the reference lowering"):
        ev.evaluate(plan)


def test_keep_and_starts_take_the_reference_path(tiny_ppo, cluster_1x2x4):
    ev = Evaluator(tiny_ppo, cluster_1x2x4)
    dirs = build_directories(ev.costs)
    plan = Plan(tuple(d.choices(ev.cluster, 0)[0] for d in dirs))
    kept = ev.evaluate(plan, keep=True)
    assert kept.graph is not None and kept.schedule is not None
    assert ev.evaluate(plan).makespan == kept.makespan


def test_backend_is_checked(tiny_ppo, cluster_1x2x4, monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of 'compiled', 'python', got 'numba'"):
        Evaluator(tiny_ppo, cluster_1x2x4, backend="numba")
    monkeypatch.delenv("RPEG_EVALUATOR", raising=False)
    assert Evaluator(tiny_ppo, cluster_1x2x4).backend == "compiled"
    monkeypatch.setenv("RPEG_EVALUATOR", "python")
    assert Evaluator(tiny_ppo, cluster_1x2x4).backend == "python"
    assert Evaluator(tiny_ppo, cluster_1x2x4, backend="compiled").backend == "compiled"
    monkeypatch.setenv("RPEG_EVALUATOR", "fast")
    with pytest.raises(ValueError, match=r"environment variable RPEG_EVALUATOR must be one of .* got .fast."):
        Evaluator(tiny_ppo, cluster_1x2x4)


def test_replacing_the_unrolled_graph_rebuilds_the_compiled_lowering(tiny_ppo, cluster_1x2x4):
    from rpeg.ir import unroll

    ev = Evaluator(tiny_ppo, cluster_1x2x4, k_eval=4)
    dirs = build_directories(ev.costs)
    plan = Plan(tuple(d.choices(ev.cluster, 0)[0] for d in dirs))
    four = ev.evaluate(plan).makespan
    ev.unrolled = unroll(ev.graph, 2)
    ev.k_eval = 2
    assert ev.evaluate(plan).makespan < four
    assert ev.fast.unrolled is ev.unrolled


def test_a_plan_of_the_wrong_length_is_refused(tiny_ppo, cluster_1x2x4):
    ev = Evaluator(tiny_ppo, cluster_1x2x4)
    dirs = build_directories(ev.costs)
    plan = Plan(tuple(d.choices(ev.cluster, 0)[0] for d in dirs[:-1]))
    with pytest.raises(ValueError, match="plan has"):
        ev.evaluate(plan)
