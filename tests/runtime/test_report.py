"""``runtime/trace/report.py``: per-step times from node finish times, the report's summary and the
predicted times of the scaled run (no Ray)."""

from __future__ import annotations

import math

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.runtime.binding import bind
from rpeg.runtime.trace.records import Trace, expected_graph, plan_hash
from rpeg.runtime.trace.report import RunReport, _step_times, predict, scaled_problem
from tests.runtime.plans import SMALL, hand, workload


def test_step_times_are_differences_of_step_ends():
    # step k ends when its last node ends, and never before step k - 1
    steps = [0, 0, 1, 1, 2]
    finish = [1.0, 3.0, 2.5, 5.0, 4.0]
    assert _step_times(steps, finish, 3, 0.0) == [3.0, 2.0, 0.0]
    assert _step_times([], [], 2, 1.0) == [0.0, 0.0]


@pytest.fixture(scope="module")
def small_binding():
    result = hand(workload("ppo"), "1x1x2", SMALL, (("actor", 0), ("critic", 0)))
    return bind(result, expected_graph(result, 2), 2)


def test_predict_scores_the_scaled_problem_node_by_node(small_binding):
    b = small_binding
    wl, cluster = scaled_problem(b, hardware_preset("cpu"))
    assert wl.batch == b.shape.batch and wl.response_len == b.shape.response_len
    assert all(spec.dtype_bytes == 4 for spec in wl.models.values())  # the CPU runtime's float32
    assert cluster.num_devices == b.result.cluster.num_devices
    durations, finish, steps = predict(b, hardware_preset("cpu"))
    assert len(durations) == len(finish) == len(b.exec_graph)
    assert len(steps) == 2 and all(t > 0 for t in steps)
    assert sum(steps) == pytest.approx(max(finish))


def test_predictions_score_training_and_inference_padded_as_the_torch_engine_runs_them(small_binding):
    """The plan packs its sequences (SPEC §14.1's default); the torch engine pads every batch to
    ``Lp + Lr``, so the prediction scores training and inference unpacked and generation as
    planned — and padded passes take longer than packed ones."""
    from rpeg.ir.types import Role
    from rpeg.runtime.trace.report import executed_plan
    from rpeg.scoring.evaluator import Evaluator

    b = small_binding
    plan = b.result.plan
    assert all(c.strategy.packing for c in plan.choices)
    run_plan = executed_plan(b)
    for v, c in zip(b.graph.vertices, run_plan.choices):
        assert c.strategy.packing is (v.role is Role.GENERATION)
    wl, cluster = scaled_problem(b, hardware_preset("cpu"))
    ev = Evaluator(wl, cluster, b.result.structure, k_eval=b.steps)
    packed = ev.evaluate(plan, keep=True).graph.duration
    durations, _, _ = predict(b, hardware_preset("cpu"))
    assert list(ev.evaluate(run_plan, keep=True).graph.duration) == durations
    roles = [b.graph.vertices[x].role for x in b.exec_graph.vertex]
    for role in (Role.TRAINING, Role.INFERENCE):  # their OP nodes among the nodes of the vertices
        nodes = [i for i, r in enumerate(roles) if r is role]
        assert sum(durations[i] for i in nodes) > sum(packed[i] for i in nodes)
    generated = [i for i, r in enumerate(roles) if r is Role.GENERATION]
    assert [durations[i] for i in generated] == [packed[i] for i in generated]


def test_summary_lists_steps_and_names_the_first_problem(small_binding):
    r = small_binding.result
    trace = Trace(plan_hash(r), 2, dict(r.structure.tau), [])
    report = RunReport(trace, [0.5, math.nan], [1.0, 2.0], [0.9, 1.8], ["missing record 3"], 1.0, 3.0, 0.2)
    text = report.summary()
    assert text.splitlines()[1].split() == ["0", "0.500", "1.000", "0.900"]
    assert "trace INVALID (1): missing record 3" in text
    assert report.nodes == 0 and report.overhead_per_node_s == pytest.approx(0.2)
    report.problems = []
    assert report.summary().endswith("trace valid")


def test_predicted_memory_lays_the_cost_models_terms_out_as_the_runtime_holds_them(small_binding):
    """Per worker ``P + max_v A(v)`` by hand for the small plan's groups: a TP-2 generation group,
    an inference group, a DP-1 critic (inference + training) and a DP-2 (FSDP2) actor trainer;
    on vLLM the generation group's peak is the weight push (two full copies on the engine's rank,
    one on the other)."""
    from dataclasses import replace

    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import (
        inference_activation_bytes,
        kv_cache_bytes,
        model_params,
        training_activation_bytes,
        weight_shard_params,
    )
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Head
    from rpeg.runtime.trace.report import predicted_memory, stage_params, training_transient_bytes

    b = small_binding
    n, lp, lr = b.shape.sequences, b.shape.prompt_len, b.shape.response_len
    torch_run, vllm_run = predicted_memory(b), predicted_memory(b, rollout_engine="vllm")
    assert set(torch_run) == set(vllm_run) == {g.worker(r) for g in b.groups for r in range(g.size)}
    g = {grp.gid: grp for grp in b.groups}
    spec = replace(g[0].spec, dtype_bytes=4)

    def lay(grp):
        return Layout(Strategy((1, 1, grp.size), grp.dp, grp.pp, grp.tp, grp.mb, recompute=grp.recompute_run))

    # g0: actor generation, TP 2 — each rank holds half the blocks and the replicated embedding/head
    w0 = weight_shard_params(spec, 1, 2, Head.LM)
    gen = inference_activation_bytes(spec, lay(g[0]), sequences=n, tokens=lp) + kv_cache_bytes(
        spec, lay(g[0]), sequences=n, prompt_len=lp, response_len=lr
    )
    full = 4 * model_params(spec, Head.LM)
    # a new version arrives from the actor's trainer (g4, TP 1) as views of the object store: no
    # private copy; a tensor-parallel trainer's shards would be concatenated into one
    assert torch_run["g0/r0"] == pytest.approx(4 * w0 + gen)
    tp_trainer = replace(b, groups=[replace(x, tp=2, dp=1) if x.gid == 4 else x for x in b.groups])
    assert predicted_memory(tp_trainer)["g0/r0"] == pytest.approx(4 * w0 + max(gen, full))
    # a pipelined trainer: rank p holds stage p's parameters, Adam state and activations
    pp_trainer = replace(b, groups=[replace(x, pp=2, dp=1, mb=2) if x.gid == 4 else x for x in b.groups])
    g4 = next(x for x in pp_trainer.groups if x.gid == 4)
    for rank in (0, 1):
        stage_w = stage_params(spec, 2, 1, g4.head, rank)
        transient = training_transient_bytes(
            spec, lay(g4), sequences=n, tokens=lp + lr, head=g4.head, stage=rank
        )
        assert predicted_memory(pp_trainer)[f"g4/r{rank}"] == pytest.approx(12 * stage_w + transient)
    # a weight push: every rank gathers the full model; the engine's rank writes the file from it
    assert vllm_run["g0/r0"] == vllm_run["g0/r1"] == pytest.approx(4 * w0 + full)
    # g1: reference inference — its parameters and the forward's activations
    w1 = weight_shard_params(spec, 1, 1, Head.LM)
    act = inference_activation_bytes(spec, lay(g[1]), sequences=n, tokens=lp + lr, head=Head.LM)
    assert torch_run["g1/r0"] == vllm_run["g1/r0"] == pytest.approx(4 * w1 + act)
    # g3: critic, DP 1 — parameters (the masters) + Adam's moments; the larger of its inference
    # and its training (activations + one gradient copy)
    critic = replace(g[3].spec, dtype_bytes=4)
    w3 = weight_shard_params(critic, 1, 1, Head.SCALAR)
    train = training_activation_bytes(critic, lay(g[3]), sequences=n, tokens=lp + lr) + 4 * w3
    inf = inference_activation_bytes(critic, lay(g[3]), sequences=n, tokens=lp + lr, head=Head.SCALAR)
    assert torch_run["g3/r0"] == pytest.approx(4 * w3 + 8 * w3 + max(train, inf))
    # g4: actor training, DP 2 (FSDP2) — full parameters, master and moment shards (12·W/Pd);
    # the backward's activations (full recomputation: SPEC's), float32 logits and their gradient,
    # and the gradients, or the ReduceScatter's input, output and gloo's copy (2G + G/Pd; this
    # model's buffers are far below 32 MiB: heap blocks, so the larger of the two phases)
    b_mb = n / (g[4].dp * g[4].mb)
    logits = 2 * 4 * b_mb * (lp + lr) * spec.vocab
    grads = 4 * w1
    act = training_activation_bytes(spec, lay(g[4]), sequences=n, tokens=lp + lr) + logits
    train = max(act + grads, 2 * grads + grads / 2)
    for r in (0, 1):
        assert torch_run[f"g4/r{r}"] == pytest.approx(4 * w1 + 12 * w1 / 2 + train)
    # the same trainer at ZeRO stage 3: its shards are the masters (12·W/Pd, nothing full kept);
    # training holds the gathered root and two layers, the gradient shards (one microbatch: each
    # unit reduced as it is made) and one unit's ReduceScatter less its freed gradients
    from rpeg.costmodel.memory import zero_state_bytes
    from rpeg.ir.types import Role

    sharded = replace(b, groups=[replace(x, zero=3) if x.gid == 4 else x for x in b.groups])
    lay3 = Layout(Strategy((1, 1, 2), 2, 1, 1, g[4].mb, recompute=g[4].recompute_run, zero=3))
    z3 = zero_state_bytes(spec, Role.TRAINING, lay3, Head.LM)
    assert z3.persistent == pytest.approx(12 * w1 / 2)
    layer = spec.layer_params
    root = w1 - spec.layers * layer
    unit = 4 * max(layer, root)
    train3 = act + 4 * (2 * layer + root) + grads / 2 + 1.5 * unit
    assert predicted_memory(sharded)["g4/r0"] == pytest.approx(12 * w1 / 2 + max(train3, 4 * w1))
    assert predicted_memory(sharded)["g4/r0"] < torch_run["g4/r0"]
    # a frozen copy at ZeRO stage 3 (the reference, DP 2 over both devices): its shard, and each
    # forward's activations beside the gathered root and three layers — SPEC's two plus the
    # running layer's flat all-gather output, which FSDP2 over gloo frees only after the layer
    frozen = replace(
        b, groups=[replace(x, zero=3, dp=2, devices=g[4].devices) if x.gid == 1 else x for x in b.groups]
    )
    f1 = next(x for x in frozen.groups if x.gid == 1)
    lay_f = Layout(Strategy((1, 1, 2), 2, 1, 1, f1.mb, recompute=f1.recompute_run, zero=3))
    zf = zero_state_bytes(spec, Role.INFERENCE, lay_f, Head.LM)
    assert zf.transient == pytest.approx(4 * (2 * layer + root))
    act_f = inference_activation_bytes(spec, lay(f1), sequences=n, tokens=lp + lr, head=Head.LM)
    for r in (0, 1):
        assert predicted_memory(frozen)[f"g1/r{r}"] == pytest.approx(
            4 * w1 / 2 + act_f + zf.transient + 4 * layer
        )


def test_training_memory_is_what_the_torch_engine_and_fsdp2_on_gloo_hold():
    """The fidelity benchmark's 8 × 512 Llama trainer (float32, measured 2026-12-03, docs/runtime.md
    "Memory per worker"): one 256-token sequence keeps 73.70 MiB for its backward where SPEC's
    ``a`` counts 64 (the unfused RMSNorm's ``x̂`` and ``rsqrt``, the flash kernel's log-sum-exp;
    no ``ℓ²`` buffer); FSDP2 on gloo holds ``2G + G/Pd`` during the ReduceScatter, buffers of
    32 MiB and more mapped on top of the heap the backward left resident; ZeRO-3 with several
    microbatches accumulates the full unsharded gradients. The runtime layout's former count
    (SPEC's activations + ``2G``) was 424 MiB for the gradient-accumulation critic (measured
    live 406, private 631–683) and 284 for the ZeRO-3 one (live 307)."""
    from dataclasses import replace

    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import stored_activation_width, weight_shard_params
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Head
    from rpeg.runtime.binding import scale_spec
    from rpeg.runtime.trace.report import (
        runtime_activation_width,
        runtime_training_activation_bytes,
        training_transient_bytes,
    )
    from tests.runtime.plans import TOY

    spec = replace(scale_spec(TOY, "medium", vocab=16), dtype_bytes=4)
    d, dff, h, hd = spec.hidden, spec.ffn_hidden, spec.heads, spec.head_dim
    assert (d, dff, h, spec.layers) == (512, 1024, 8, 8)
    assert stored_activation_width(spec, 1) == 8 * d + 4 * dff == 8192
    assert runtime_activation_width(spec, 1) == 10 * d + 4 * dff + h + 2 == 9226

    def lay(dp: int, mb: int, zero: int = 2) -> Layout:
        return Layout(Strategy((1, 1, dp), dp, 1, 1, mb, recompute="none", zero=zero))

    def act(layout: Layout, n: int, tokens: int = 256, head: Head = Head.SCALAR) -> float:
        return runtime_training_activation_bytes(spec, layout, sequences=n, tokens=tokens, head=head)

    one = act(lay(2, 4), 8)  # b = 1 sequence per microbatch
    assert one == 4 * 256 * (8 * 9226 + 2 * hd + 3 * d + 1)
    assert one / 2**20 == pytest.approx(73.70, abs=0.01)
    assert act(lay(2, 4), 8, tokens=512) == 2 * one  # no ℓ² buffer
    assert act(lay(2, 4), 8, head=Head.LM) - one == 2 * 4 * 256 * spec.vocab  # float32 logits + grad

    g = 4 * weight_shard_params(spec, 1, 1, Head.SCALAR)  # 80 MiB

    def transient(layout: Layout, n: int) -> float:
        return training_transient_bytes(spec, layout, sequences=n, tokens=256, head=Head.SCALAR)

    assert transient(lay(1, 4), 4) == pytest.approx(one + g)  # plain Adam
    # ZeRO-2: the ReduceScatter's input G, output G/2 and gloo's copy G replace the backward's
    # activations and gradients: here they are the peak (2.5·G > A + G)
    assert one + g < 2.5 * g
    assert transient(lay(2, 4), 8) == pytest.approx(2.5 * g)
    assert (12 * g / 4 / 2 + g + transient(lay(2, 4), 8)) / 2**20 == pytest.approx(400, abs=1)  # 406-411 live
    # more sequences per microbatch: the backward is the peak
    assert transient(lay(2, 1), 8) == pytest.approx(act(lay(2, 1), 8) + g)
    # ZeRO-3, 4 microbatches: full unsharded gradients; one microbatch: their shards; and the
    # largest unit's ReduceScatter input and output, (1 + 1/Pd)·U
    layer = 4 * spec.layer_params
    root = g - 8 * layer
    gathered = 2 * layer + root
    assert transient(lay(2, 4, zero=3), 8) == pytest.approx(one + gathered + g + 1.5 * layer)
    assert transient(lay(2, 1, zero=3), 2) == pytest.approx(one + gathered + g / 2 + 1.5 * layer)


def test_forward_factor_scales_only_no_grad_forward_activations(small_binding):
    """``μ`` multiplies the activations of inference and torch-engine prefill, not parameters,
    training or a vLLM weight push; it must be positive."""
    from dataclasses import replace

    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import inference_activation_bytes
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Head
    from rpeg.runtime.trace.report import predicted_memory

    b = small_binding
    g1 = next(g for g in b.groups if g.gid == 1)  # the reference model's inference group
    lay = Layout(Strategy((1, 1, g1.size), g1.dp, g1.pp, g1.tp, g1.mb))
    spec = replace(g1.spec, dtype_bytes=4)
    act = inference_activation_bytes(
        spec, lay, sequences=b.shape.sequences, tokens=b.shape.prompt_len + b.shape.response_len, head=Head.LM
    )
    base, scaled = predicted_memory(b), predicted_memory(b, forward_factor=2.5)
    assert scaled["g1/r0"] - base["g1/r0"] == pytest.approx(1.5 * act)
    assert scaled["g0/r0"] > base["g0/r0"]  # torch-engine generation: the prefill's activations
    for w in ("g4/r0", "g4/r1"):  # training: no forward-only pass
        assert scaled[w] == base[w]
    vllm, vllm_scaled = predicted_memory(b, "vllm"), predicted_memory(b, "vllm", forward_factor=2.5)
    assert vllm_scaled["g0/r0"] == vllm["g0/r0"]  # the peak is the weight push
    assert predicted_memory(b, forward_factor=2.5, live=True) == base  # live tensors: SPEC's count
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="forward_factor must be positive"):
            predicted_memory(b, forward_factor=bad)


def test_a_phase_node_holds_its_phase_s_sequences_only():
    """Where the plan splits a vertex into length phases (a generation feeding inference on
    another device), its nodes' activations are those of the largest phase's sequences."""
    from collections import Counter

    from rpeg.runtime.calibrate.insitu import insitu_plan
    from rpeg.runtime.trace.report import node_sequences, predicted_memory

    shape = {"scale": "tiny", "batch": 8, "prompt_len": 8, "response_len": 16}
    split, spread = insitu_plan("split"), insitu_plan("spread")
    b_split = bind(split, expected_graph(split, 2), 2, **shape)
    b_spread = bind(spread, expected_graph(spread, 2), 2, **shape)
    n = b_split.shape.sequences
    largest = max(Counter(b_split.shape.response_lengths()).values())
    assert 0 < largest < n  # the run shape has several length phases
    assert node_sequences(b_split)["ref_inf"] == largest
    assert node_sequences(b_split)["actor_train"] == n  # training is never split
    assert set(node_sequences(b_spread).values()) == {n}  # colocated: no phases
    # the reference worker's activations scale with the phase's sequences, not the step's
    ref = next(g for g in b_split.groups if "ref_inf" in g.vertices).worker(0)
    one, two = predicted_memory(b_split), predicted_memory(b_split, forward_factor=2.0)
    act = two[ref] - one[ref]
    ref_spread = next(g for g in b_spread.groups if "ref_inf" in g.vertices).worker(0)
    act_spread = (
        predicted_memory(b_spread, forward_factor=2.0)[ref_spread] - predicted_memory(b_spread)[ref_spread]
    )
    # spread: DP 2, n/2 sequences per rank; split: DP 1, one phase's
    assert act / act_spread == pytest.approx(largest / (n / 2))


def test_a_pipelined_trainer_s_stages_are_predicted_each_its_own():
    """Stage ``p`` holds its own layers, the embedding (first) or the head (last), and
    ``min(mb, Pp − p)`` microbatches' activations; the last stage alone holds the final norm and
    the logits. Without ``stage`` the figure is the worst stage's (SPEC's device model)."""
    from dataclasses import replace

    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import head_params, weight_shard_params
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Head
    from rpeg.runtime.binding import scale_spec
    from rpeg.runtime.trace.report import (
        runtime_activation_width,
        runtime_training_activation_bytes,
        stage_params,
        training_transient_bytes,
    )
    from tests.runtime.plans import TOY

    spec = replace(scale_spec(TOY, "medium", vocab=16), dtype_bytes=4)
    d, hd, L = spec.hidden, spec.head_dim, spec.layers
    lay = Layout(Strategy((1, 1, 2), 1, 2, 1, 4, recompute="none"))
    first = stage_params(spec, 2, 1, Head.LM, 0)
    last = stage_params(spec, 2, 1, Head.LM, 1)
    assert first == L // 2 * spec.layer_params + spec.embedding_params
    assert last == L // 2 * spec.layer_params + head_params(spec, Head.LM)
    assert max(first, last) == weight_shard_params(spec, 2, 1, Head.LM)
    assert stage_params(spec, 1, 1, Head.LM, 0) == weight_shard_params(spec, 1, 1, Head.LM)

    def act(stage: int | None) -> float:
        return runtime_training_activation_bytes(
            spec, lay, sequences=8, tokens=256, head=Head.LM, stage=stage
        )

    width = L // 2 * runtime_activation_width(spec, 1) + 2 * hd
    b_tokens = 2 * 256  # b = 8/(1·4) sequences of 256 tokens per microbatch
    assert act(0) == pytest.approx(4 * 2 * b_tokens * width)  # two microbatches alive, no logits
    logits = 2 * 4 * b_tokens * spec.vocab
    assert act(1) == pytest.approx(4 * 1 * b_tokens * (width + 3 * d + 1) + logits)
    assert act(None) == pytest.approx(4 * 2 * b_tokens * (width + 3 * d + 1) + logits)  # worst of each
    full = Layout(Strategy((1, 1, 2), 1, 2, 1, 4, recompute="full"))
    spec_full = runtime_training_activation_bytes(spec, full, sequences=8, tokens=256, head=Head.SCALAR)
    assert runtime_training_activation_bytes(
        spec, full, sequences=8, tokens=256, head=Head.SCALAR, stage=1
    ) == pytest.approx(spec_full / 2)
    one = training_transient_bytes(spec, lay, sequences=8, tokens=256, head=Head.LM, stage=1)
    assert one == pytest.approx(act(1) + 4 * last)  # plain Adam: its own stage's gradients
