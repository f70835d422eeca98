"""What a run measured: :class:`RunReport`, the predicted times of the scaled run and the
``rpeg.trace/1`` trace of each executed plan (SPEC §11).

:func:`predict` re-scores the plan with the shared evaluator on the problem the runtime actually
executes (:func:`scaled_problem`); :func:`segment_trace` turns one controller's records into a
:class:`~rpeg.runtime.trace.records.Trace` with per-step rewards, measured and predicted step times.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ...ir.cluster import Cluster
from ...ir.hardware import Hardware
from ...ir.plan import Plan
from ...ir.types import Role
from ...ir.workload import Workload
from ...solvers.result import Result
from ..binding import Binding
from .fidelity import Fidelity, fidelity, trace_fidelity
from .records import Trace, expected_graph, plan_hash

__all__ = ["RunReport", "predict", "scaled_problem", "segment_trace"]


@dataclass
class RunReport:
    """What a run measured.

    Attributes
    ----------
    trace
        The verified trace (``rpeg.trace/1``).
    rewards
        Mean task reward of each step's rollouts (DPO, which has none: the mean implicit reward
        margin ``β·(h_w − h_l)`` of the step's preference pairs).
    step_times, predicted_step_times
        Measured and predicted seconds per step (step ``k`` ends when its last node ends).
    problems
        Verifier findings (empty: the execution matches the plan).
    setup_s, wall_s
        Worker start-up and DAG execution seconds.
    overhead_s
        Controller seconds not spent waiting for workers (dispatch overhead).
    node_overhead_s
        Per record, ``(end − start) − worker_time``: what dispatch, Ray and the object store add.
    weights
        Final full weights per trained model (``return_weights=True``).
    segments
        One verified trace per plan the run executed (``trace`` is the first); a run without
        transitions has one.
    transitions
        A :class:`~rpeg.runtime.driver.transition.TransitionRecord` per executed transition (planned
        ones and those of the urgent path).
    recoveries
        One line per worker loss the run survived (lost devices, intact units, the replan).
    """

    trace: Trace
    rewards: list[float]
    step_times: list[float]
    predicted_step_times: list[float]
    problems: list[str]
    setup_s: float
    wall_s: float
    overhead_s: float
    node_overhead_s: list[float] = field(default_factory=list)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    segments: list[Trace] = field(default_factory=list)
    transitions: list[Any] = field(default_factory=list)
    recoveries: list[str] = field(default_factory=list)

    def _per_step(self, key: str) -> list[float | None]:
        traces = self.segments or [self.trace]
        return [m.get(key) for t in traces for m in t.step_metrics]

    @property
    def logprob_gaps(self) -> list[float | None]:
        """Per step, ``max |log π_rollout − log π_trainer|`` over the step's generated tokens
        where both were computed with the same weights (``None`` where no training node could
        compare them: a stale rollout or no generation)."""
        return self._per_step("logprob_gap")

    @property
    def weight_sync_s(self) -> list[float | None]:
        """Per step, seconds the rollout engines spent taking new weights (``None``: no engine sync)."""
        return self._per_step("weight_sync_s")

    @property
    def nodes(self) -> int:
        """Records in all segments."""
        return sum(len(t.records) for t in self.segments) if self.segments else len(self.trace.records)

    @property
    def fidelity(self) -> Fidelity | None:
        """Predicted against measured times over all segments (:mod:`~rpeg.runtime.trace.fidelity`):
        each segment's first step is left out of the operator and makespan figures, and its last
        step of the makespan figures (:func:`~rpeg.runtime.trace.fidelity.compared_steps`)."""
        parts = [f for f in (trace_fidelity(t) for t in (self.segments or [self.trace])) if f is not None]
        if len(parts) <= 1:
            return parts[0] if parts else None
        out = Fidelity([], [], [], first_step=0)  # the step lists hold the compared steps only
        for f in parts:
            out.per_step += f.per_step
            out.step_predicted += f.step_predicted[f.compared]
            out.step_measured += f.step_measured[f.compared]
            out.op_predicted += f.op_predicted
            out.op_measured += f.op_measured
            out.op_class += f.op_class
        return out

    @property
    def overhead_per_node_s(self) -> float:
        """Mean controller time per node."""
        return self.overhead_s / max(1, self.nodes)

    def summary(self) -> str:
        """A few lines: per step reward, measured and predicted time (with a rollout engine also the
        log-prob gap and the weight-sync seconds); verification."""
        gaps, syncs = self.logprob_gaps, self.weight_sync_s
        engine = any(g is not None for g in gaps) or any(x is not None for x in syncs)
        head = f"{'step':>4} {'reward':>8} {'time s':>8} {'pred s':>8}"
        lines = [head + (f" {'logp gap':>9} {'sync s':>7}" if engine else "")]
        for k, (r, t, p) in enumerate(zip(self.rewards, self.step_times, self.predicted_step_times)):
            line = f"{k:>4} {r:>8.3f} {t:>8.3f} {p:>8.3f}"
            if engine:
                g = gaps[k] if k < len(gaps) else None
                x = syncs[k] if k < len(syncs) else None
                line += f" {g:>9.1e}" if g is not None else f" {'-':>9}"
                line += f" {x:>7.3f}" if x is not None else f" {'-':>7}"
            lines.append(line)
        lines.append(
            f"setup {self.setup_s:.1f} s, run {self.wall_s:.2f} s, dispatch overhead "
            f"{1e3 * self.overhead_per_node_s:.2f} ms/node over {self.nodes} nodes"
        )
        fid = self.fidelity
        if fid is not None:
            lines.append("predicted / measured seconds per step and operation class (worker time):")
            lines += ["  " + row for row in fid.table().splitlines()]
            lines.append(fid.summary())
        for line in self.recoveries:
            lines.append(f"recovered: {line}")
        for rec in self.transitions:
            kinds = ", ".join(f"{int(d['count'])} {k}" for k, d in sorted(rec.per_kind().items()))
            lines.append(
                f"transition at step {rec.step}: {kinds or 'no primitive'} in {rec.total_s:.2f} s "
                f"(primitives {rec.primitives_s:.2f} s, hand-over {rec.handover_bytes / 1e6:.1f} MB); "
                f"cost model {rec.predicted_s:.3f} s at full size"
            )
        lines.append(
            "trace valid"
            if not self.problems
            else f"trace INVALID ({len(self.problems)}): {self.problems[0]}"
        )
        return "\n".join(lines)


def scaled_problem(binding: Binding, hardware: Hardware) -> tuple[Workload, Cluster]:
    """The workload the runtime executes (scaled specs, batch and lengths; the workload's reward,
    KL coefficient, log-prob source and updates per step, with a rule reward's host time 0) on a
    cluster of the plan's shape with ``hardware`` — what :func:`predict` scores."""
    r = binding.result
    wl = r.workload
    sh = binding.shape
    specs = binding.specs
    actor = "actor_critic" if "actor_critic" in specs else "actor"
    models = {}
    for role in wl.models:
        name = actor if role == "critic" and "critic" not in specs else role
        name = actor if role == "actor" else name
        models[role] = replace(specs[name], dtype_bytes=4)  # the CPU runtime computes in float32
    quantiles = tuple(zip(sh.phase_fractions, sh.phase_lengths))
    scaled = Workload(
        wl.algorithm,
        models,
        sh.batch,
        sh.rollouts,
        sh.prompt_len,
        sh.response_len,
        quantiles=quantiles,
        ac_sharing=wl.ac_sharing,
        name=f"{wl.name}-scaled",
        # the job's SPEC §14 choices; the runtime's rule (SyntheticTask) costs microseconds, so
        # its host time per sequence is 0 here, not the workload's c_r
        reward=wl.reward,
        kl_coef=wl.kl_coef,
        old_logprob=wl.old_logprob,
        mini_batches=wl.mini_batches,
    )
    return scaled, Cluster.from_shape(r.cluster.shape, hardware)


def predict(binding: Binding, hardware: Hardware) -> tuple[list[float], list[float], list[float]]:
    """Predicted node durations, node finish times and per-step times of the scaled run.

    The plan is re-scored by the shared evaluator on :func:`scaled_problem` over ``steps``
    steps, as :func:`executed_plan`: with the sequences padded as the torch engine runs them.
    Node ids agree with the runtime's DAG because lowering depends only on the plan's
    allocations, strategies and phase count. Step ``k``'s time is the finish of its last node
    minus that of step ``k − 1``.
    """
    from ...scoring.evaluator import Evaluator

    workload, cluster = scaled_problem(binding, hardware)
    r = binding.result
    ev = Evaluator(workload, cluster, r.structure, k_eval=binding.steps)
    assert r.plan is not None
    evaluation = ev.evaluate(executed_plan(binding), keep=True)
    g, sched = evaluation.graph, evaluation.schedule
    assert g is not None and sched is not None
    if len(g) != len(binding.exec_graph):
        raise RuntimeError("the scaled lowering differs from the executed DAG (a bug)")
    return list(g.duration), list(sched.finish), _step_times(g.step, sched.finish, binding.steps, 0.0)


def executed_plan(binding: Binding) -> Plan:
    """The bound plan as the runtime executes it: the torch engine pads every training and
    inference batch to ``Lp + Lr`` (it has no packed-sequence kernels on CPU), so those vertices
    are scored with ``packing = false`` (SPEC §14.1) whatever the plan chose; generation is
    scored as planned. Predicting the packed plan would credit the run with work it does not
    skip, and the calibration's in-situ factors would absorb the difference."""
    plan = binding.result.plan
    assert plan is not None
    choices = []
    for v, c in zip(binding.graph.vertices, plan.choices):
        padded = v.role is not Role.GENERATION and c.strategy.packing
        choices.append(replace(c, strategy=c.strategy.variant(packing=False)) if padded else c)
    return Plan(tuple(choices))


#: Bytes per parameter of a float32 master copy: part of SPEC's ``12·W/Pd`` training state that a
#: one-rank trainer does not hold apart (its registered parameters are the masters).
MASTER_BYTES = 4


def runtime_activation_width(model: Any, tp: int) -> float:
    """Scalars one decoder layer of the runtime's torch engine keeps per token for its backward
    (recomputation ``none``): ``a_run = a + 2d + ⌈h/Pt⌉ + 2``, with ``a`` SPEC's
    :func:`~rpeg.costmodel.memory.stored_activation_width`.

    The engine runs ``transformers``' own Llama/Qwen2/Mistral layers (``runtime.model``), and
    autograd keeps, per layer and token (counted by storage, ``saved_tensors_hooks``, on the
    fidelity benchmark's 8 × 512 Llama, float32, 2026-12-03):

    * what SPEC's ``a`` counts: each RMSNorm's input and output (``4d``; the output is the QKV or
      gate/up GEMMs' input), the rotated ``Q`` and ``K``, ``V`` and the attention output that feeds
      ``o_proj`` (``(2·d_q + 2·d_kv)/Pt``), and the gated FFN's gate, up, ``SiLU(gate)`` and their
      product (``4·dff/Pt``);
    * beyond it, each RMSNorm's normalised input ``x̂ = x·rsqrt(mean(x²) + ε)``, which the
      unfused module keeps for the gradient of its weight (``weight·x̂``): ``2d`` (replicated
      under TP); its ``rsqrt`` (1 per norm: 2); and the flash kernel's log-sum-exp per local
      head (``⌈h/Pt⌉``).

    CPU SDPA runs the flash kernel (``ScaledDotProductFlashAttentionForCpu``): it keeps no
    ``ℓ × ℓ`` score matrix — the kept bytes per token are the same at ``ℓ = 256`` and ``512``
    (SPEC §14.7 holds for this engine). Measured: 73.70 MiB for one sequence of 256 tokens, 9434.1
    scalars per token and layer over the stage: ``a_run = 9226`` (SPEC's ``a = 8192``) plus the
    stage terms of :func:`runtime_training_activation_bytes` (``2·h_d + 3d + 1 = 1665``) over its
    8 layers.
    """
    from ...costmodel.memory import stored_activation_width

    return stored_activation_width(model, tp) + 2.0 * model.hidden + math.ceil(model.heads / tp) + 2.0


def runtime_training_activation_bytes(
    model: Any, layout: Any, *, sequences: float, tokens: float, head: Any, stage: int | None = None
) -> float:
    """Activations a training microbatch keeps on the runtime's torch engine, bytes.

    Recomputation ``none``: ``sb·min(mb, Pp)·b·ℓ·((L/Pp)·a_run + 2·h_d + 3d + 1)``
    (:func:`runtime_activation_width`; ``b = n/(Pd·mb)``, ``ℓ = tokens/Pc``, a context-parallel
    rank's positions; ``ℓ = tokens`` for the logits, which it scatters to full length) — per stage the rotary
    embedding's ``cos`` and ``sin`` (``2·h_d``, shared by its layers) and, on the last stage, the
    final RMSNorm's input (the last layer's output), ``x̂``, output and ``rsqrt`` (``3d + 1``;
    charged to the worst stage) — plus, with an LM head, the float32 logits and their gradient,
    ``2·4·b·ℓ·V`` (SPEC §14.6's :func:`~rpeg.costmodel.memory.logits_bytes`; the runtime's heads are replicated over
    the TP ranks and its training loss is not chunked). Under ``full`` (every decoder layer
    checkpointed) the activations are SPEC's
    :func:`~rpeg.costmodel.memory.training_activation_bytes` (not measured on this engine), the
    logits as above.

    ``stage`` (``0 … Pp − 1``) asks for one pipeline stage's instead of the worst stage's: its
    own layers (:func:`~rpeg.ir.plan.stage_layer_ranges`), ``min(mb, Pp − p)`` microbatches alive
    in 1F1B's warm-up, and the final norm and the logits on the last stage only.
    """
    from ...costmodel.memory import LOGIT_BYTES, training_activation_bytes
    from ...ir.types import Head, Recompute

    s = layout.strategy
    b = sequences / (s.dp * s.mb)
    own = tokens / s.cp  # a context-parallel rank's positions (its logits are scattered to full length)
    last = stage is None or stage == s.pp - 1
    alive = min(s.mb, s.pp if stage is None else s.pp - stage)
    if s.recompute is Recompute.NONE:
        per_token = (
            _stage_layers(model, s.pp, stage) * runtime_activation_width(model, s.tp)
            + 2.0 * model.head_dim
            + (3.0 * model.hidden + 1.0 if last else 0.0)
        )
        act = model.dtype_bytes * alive * b * own * per_token
    else:  # SPEC's count: uniform L/Pp, linear in the microbatches alive
        worst = training_activation_bytes(model, layout, sequences=sequences, tokens=tokens)
        act = worst * alive / min(s.mb, s.pp)
    logits = 0.0 if head is Head.SCALAR or not last else 2.0 * LOGIT_BYTES * b * tokens * model.vocab
    return act + logits


def _stage_layers(model: Any, pp: int, stage: int | None) -> float:
    """Decoder layers of pipeline stage ``stage`` (:func:`~rpeg.ir.plan.stage_layer_ranges`);
    ``L/Pp`` for ``None``, the worst stage as SPEC counts it."""
    from ...ir.plan import stage_layer_ranges

    if stage is None:
        return model.layers / pp
    lo, hi = stage_layer_ranges(model.layers, pp)[stage]
    return float(hi - lo)


def stage_params(model: Any, pp: int, tp: int, head: Any, stage: int) -> float:
    """Parameters one TP rank of pipeline stage ``stage`` holds on the runtime: its layers
    (:func:`~rpeg.ir.plan.stage_layer_ranges`) over ``Pt``, the embedding on the first stage and
    the head(s) on the last (replicated over the TP ranks) —
    :func:`~rpeg.costmodel.memory.weight_shard_params` is the largest of these over the stages
    when the layers split evenly. ``Pp = 1`` is :func:`~rpeg.costmodel.memory.weight_shard_params`
    (a tied LM head stored once)."""
    from ...costmodel.memory import head_params, weight_shard_params

    if pp == 1:
        return weight_shard_params(model, 1, tp, head)
    params = _stage_layers(model, pp, stage) * model.layer_params / tp
    if stage == 0:
        params += model.embedding_params
    if stage == pp - 1:
        params += head_params(model, head)
    return float(params)


def training_transient_bytes(
    model: Any,
    layout: Any,
    *,
    sequences: float,
    tokens: float,
    head: Any,
    stage: int | None = None,
) -> float:
    """A training node's tensors alive at once on the runtime (CPU torch engine, gloo), over its
    persistent parameters and optimizer state, bytes: what ``torch.cuda.max_memory_allocated``
    counts on a GPU, and on the CPU runtime the worker's private memory, since its workers serve
    every allocation of 128 KiB and more by ``mmap`` (:func:`~rpeg.runtime.trace.fidelity.
    map_large_blocks`). ``G = W·sb`` are the stage's (TP-local) gradients, ``A``
    :func:`runtime_training_activation_bytes`.

    * ``Pd = 1`` (plain Adam): ``A + G``.
    * FSDP2, ZeRO-2 (``Pd > 1``): ``max(A + G, (2 + 1/Pd)·G)``. The backward holds ``A + G``
      (the unsharded gradients accumulate over the update's microbatches, the activations of the
      running one). After the last backward FSDP2's ``foreach_reduce`` copies the gradients into
      a flat ReduceScatter input (``G``) and frees them, allocates the output (``G/Pd``, which
      stays as the sharded gradients until the optimizer step), and gloo's
      ``reduce_scatter_tensor`` holds a copy of its input while it runs (``G``; measured,
      2026-12-03: +80 MiB during the call for an 80 MiB input): ``2G + G/Pd`` at once, after the
      activations are gone. Measured on the fidelity benchmark's critic (``b = 1``, 4
      microbatches, 2026-12-03): live tensors peak at 202 MiB over the state (``2G + G/Pd`` = 200).
    * FSDP2, ZeRO-3 (``Pd > 1``): only the shards are registered, and they are the masters (in
      the persistent state), so SPEC's weight shard is not transient here. A pass holds the
      gathered root and two layers (``N_g``, as :func:`~rpeg.costmodel.memory.zero_state_bytes`).
      With ``mb > 1`` the runtime reduces once per update (``FSDPAdam.sync_gradients``): the
      earlier microbatches' backwards accumulate the full unsharded gradients (``G``; measured
      80.4 MiB after the first backward for ``G`` = 80.1); with ``mb = 1`` each unit's gradients
      are reduced as they are made and only the shards accumulate (``G/Pd``). The ReduceScatter
      of the largest unit, ``U`` parameters, adds its flat input and output, ``(1 + 1/Pd)·U·sb``,
      gloo's copy of the input taking the place of the unsharded gradients freed after the copy:
      ``A + N_g·sb + grads + (1 + 1/Pd)·U·sb`` (measured: live peak 184 MiB over the state, this
      189; in the benchmark's FSDP2 plan 2026-12-05, 316–322 MiB live and 312–313 private against
      309 predicted).

    ``stage`` asks for one pipeline stage's figure (its parameters, :func:`stage_params`, and
    activations, :func:`runtime_training_activation_bytes`) instead of the worst stage's.
    """
    from ...costmodel.memory import weight_shard_params

    s = layout.strategy
    sb = model.dtype_bytes
    w = (
        weight_shard_params(model, s.pp, s.tp, head, s.ep)
        if stage is None
        else stage_params(model, s.pp, s.tp, head, stage)
    )
    grads = w * sb
    act = runtime_training_activation_bytes(
        model, layout, sequences=sequences, tokens=tokens, head=head, stage=stage
    )
    replicas = s.dp * s.cp  # FSDP2 shards over the data- and context-parallel ranks
    if replicas == 1:
        return act + grads
    if s.zero != 3:
        return max(act + grads, (2.0 + 1.0 / replicas) * grads)
    layer = model.layer_params / s.tp
    root = w - _stage_layers(model, s.pp, stage) * layer
    gathered = (2.0 * layer + root) * sb
    unit = max(layer, root) * sb
    held = grads if s.mb > 1 else grads / replicas
    return act + gathered + held + (1.0 + 1.0 / replicas) * unit


def node_sequences(binding: Binding) -> dict[str, int]:
    """The most sequences one OP node of each vertex processes: ``n = B'·R'``, or for a vertex
    the plan splits into response-length phases (rule 1, SPEC §4) the largest phase's share,
    ``max_q |{i : ℓ_i = t'_q}|`` over the run's response lengths
    (:meth:`~rpeg.runtime.binding.RunShape.response_lengths`)."""
    from collections import Counter

    eg, sh = binding.exec_graph, binding.shape
    largest_phase = max(Counter(sh.response_lengths()).values())
    split = {eg.vertex[i] for i in range(len(eg.vertex)) if eg.phase[i] > 0}
    return {
        v.name: largest_phase if i in split else sh.sequences for i, v in enumerate(binding.graph.vertices)
    }


def predicted_memory(
    binding: Binding, rollout_engine: str = "torch", *, forward_factor: float = 1.0, live: bool = False
) -> dict[str, float]:
    """Predicted peak bytes per worker process (``"g{group}/r{rank}"``) of the scaled run: the
    cost model's memory terms (SPEC §6, :mod:`rpeg.costmodel.memory`) laid out as the runtime's
    processes hold them (docs/runtime.md, "Memory per worker").

    With ``W`` the group's worst-stage parameter shard (:func:`~rpeg.costmodel.memory.
    weight_shard_params`), ``sb`` its bytes per scalar (float32 here), ``n`` the step's sequences
    and ``ℓ = Lp + Lr``, a worker holds ``P + max_v A(v)``:

    * ``P = W·sb`` — every worker keeps its stage's parameters registered (the serving copy; a
      trainer's full parameters, which FSDP2 keeps unsharded between updates) — plus, in a
      training group, SPEC's state ``12·W/Pd`` (:func:`~rpeg.costmodel.memory.
      training_state_bytes`: FSDP2's master shard and Adam's moments), less the ``4·W`` master
      with ``Pd = 1`` (the registered parameters are the masters);
    * training: :func:`training_transient_bytes` — the activations the engine's layers keep
      (:func:`runtime_training_activation_bytes`: SPEC's count plus what the unfused RMSNorm and
      the flash kernel keep, and the logits), the gradients ``W·sb``, and with FSDP2 (``Pd > 1``)
      the ReduceScatter's flat buffers and gloo's copy — where SPEC's ZeRO-2 charges ``W·sb/Pd``;
    * a pipelined trainer (``Pp > 1``): each rank its own stage's figure — its parameters
      (:func:`stage_params`: its layers, the embedding on the first stage, the head on the last)
      and training activations (``min(mb, Pp − p)`` microbatches alive in 1F1B's warm-up, the
      logits on the last stage; :func:`runtime_training_activation_bytes`) — where SPEC's device
      model charges every device the worst stage's;
    * a ZeRO-3 trainer (``Pd > 1``) registers only its shards, which are the masters: ``P`` is
      SPEC's state ``12·W/Pd`` alone; training holds the gathered root and two layers, the
      gradients (full and unsharded while the update's microbatches accumulate them) and one
      unit's ReduceScatter (:func:`training_transient_bytes`); gathering the stage for a
      publication, snapshot or checkpoint holds ``W·sb`` at once;
    * a frozen ZeRO-3 model (``Pd > 1``, :class:`~rpeg.runtime.worker.parallel.FSDPShards`) registers
      ``W·sb/Pd``; each forward pass adds the gathered root and two layers (``sb·N_g``,
      :func:`~rpeg.costmodel.memory.zero_state_bytes`) to its activations, and a third layer,
      ``sb·N_ℓ/Pt``: FSDP2 over gloo frees a layer's flat all-gather output only after the layer
      has run, while the next layer is already being gathered; and where another
      group trains the model, installing a version gathers the stage (``W·sb``);
    * inference: ``μ`` times the forward activations at ``ℓ`` of the node's sequences
      (:func:`node_sequences`: a phase node holds its phase's sequences only);
    * generation on the torch engine: ``μ`` times the prefill's activations, and the KV cache; on a vLLM
      engine (``rollout_engine="vllm"``) the activations and the KV cache live in vLLM's own
      processes, and the worker's peak is the weight push: every rank of the replica gathers the
      full model (``N_m·sb``); the engine's rank writes it to the file the engine reloads from
      the tensors' own memory (safetensors 0.8, installed here, writes through pointers: no
      serialised copy);
    * a group serving a model that another group trains installs each new version: it maps the
      publication from Ray's object store (numpy views, shared pages: not private) and keeps its
      shard; only when the trainer is tensor parallel does it concatenate the shards into the full
      model (``N_m·sb``).

    ``μ`` (``forward_factor``, the hardware's ``memory_factor`` of the inference engine) is the
    private memory a no-grad forward pass of the torch engine takes per byte of SPEC's forward
    activations, which counts the widest layer's tensors only (docs/runtime.md, "Memory per
    worker"). ``rpeg calibrate --in-situ`` fits it from the workers' private peaks; 1 is SPEC's
    count.

    With ``live`` ``μ`` is not applied: SPEC's own count, which the fidelity benchmark compares
    with the workers' live C heap (``TraceRecord.memory_live``), the CPU analogue of a GPU's
    ``max_memory_allocated``. Everything else is the same: a CPU worker's private memory is the
    memory its tensors hold (:func:`~rpeg.runtime.worker.memory.map_large_blocks`).

    Raises
    ------
    ValueError
        If ``forward_factor`` is not positive and finite.
    """
    if not (
        isinstance(forward_factor, (int, float)) and math.isfinite(forward_factor) and forward_factor > 0
    ):
        raise ValueError(
            f"predicted_memory: forward_factor must be positive and finite, got {forward_factor!r}"
        )
    from ...costmodel.layout import Layout
    from ...costmodel.memory import (
        inference_activation_bytes,
        kv_cache_bytes,
        model_params,
        training_state_bytes,
        weight_shard_params,
        zero_state_bytes,
    )
    from ...ir.plan import Strategy

    sh = binding.shape
    n, lp, lr = sh.sequences, sh.prompt_len, sh.response_len
    roles = {v.name: v.role for v in binding.graph.vertices}
    per_node = node_sequences(binding)
    mu = 1.0 if live else float(forward_factor)
    out: dict[str, float] = {}
    for g in binding.groups:
        spec = replace(g.spec, dtype_bytes=4)  # the CPU runtime computes in float32
        sb = spec.dtype_bytes
        sharded = g.zero == 3 and g.replicas > 1
        lay = Layout(
            Strategy(
                (1, 1, g.size),
                g.dp,
                g.pp,
                g.tp,
                g.mb,
                recompute=g.recompute_run,
                zero=3 if sharded else 2,
                cp=g.cp,
                cp_kind=g.cp_kind,
                ep=g.ep,
            )
        )
        w = weight_shard_params(spec, g.pp, g.tp, g.head, g.ep)
        persistent = w * sb
        if g.trains:
            persistent += training_state_bytes(spec, lay, g.head) - (
                MASTER_BYTES * w if g.replicas == 1 else 0.0
            )
        role = Role.TRAINING if g.trains else Role.INFERENCE
        zero3 = zero_state_bytes(spec, role, lay, g.head) if sharded else None
        if zero3 is not None:  # the registered shards (a trainer's masters): SPEC's state alone
            persistent = zero3.persistent
        full = model_params(spec, g.head) * sb
        # a new version arrives from the training group as numpy views of the object store
        # (shared pages); only a tensor-parallel trainer's shards are concatenated into a copy
        trainer = next((h for h in binding.groups if h.model == g.model and h.trains), None)
        installs = g.trainable and not g.trains and trainer is not None and trainer.tp > 1
        # forward passes and generation: the same on every rank; a frozen ZeRO-3 model gathers
        # its root and a layer or two for each pass (SPEC's N_g; a trainer's is in its transient)
        forward = full if installs else 0.0
        gather = 0.0
        if zero3 is not None and not g.trains:
            # FSDP2 over gloo also keeps the running layer's flat all-gather output until the
            # layer has run: a third layer beside SPEC's two (counted by storage at each layer's
            # forward, 2026-12-04: the unsharded layer and its 10 MiB flat output visible, the
            # prefetched next layer's 10 MiB only in the C heap)
            gather = zero3.transient + spec.layer_params / g.tp * sb
        for name in g.vertices:
            role = roles[name]
            if role is Role.INFERENCE:
                a = mu * inference_activation_bytes(
                    spec, lay, sequences=per_node[name], tokens=lp + lr, head=g.head
                )
            elif role is Role.GENERATION:
                a = (
                    full  # every rank of the replica gathers the full model
                    if rollout_engine == "vllm"
                    else mu * inference_activation_bytes(spec, lay, sequences=n, tokens=lp, head=g.head)
                    + kv_cache_bytes(spec, lay, sequences=n, prompt_len=lp, response_len=lr)
                )
            else:
                continue
            forward = max(forward, a + gather)
        # training: a pipelined trainer's stages hold different layers and microbatches
        stages = range(g.pp) if g.trains and g.pp > 1 else (None,)
        by_stage: dict[int | None, float] = {}
        for stage in stages:
            scale = 1.0 if stage is None else stage_params(spec, g.pp, g.tp, g.head, stage) / w
            transient = forward
            if zero3 is not None and (g.trains or trainer is not None):
                # publications, snapshots and installs of new weights gather the stage
                transient = max(transient, scale * w * sb)
            if g.trains:
                transient = max(
                    transient,
                    training_transient_bytes(
                        spec, lay, sequences=n, tokens=lp + lr, head=g.head, stage=stage
                    ),
                )
            by_stage[stage] = scale * persistent + transient
        for rank in range(g.size):
            out[g.worker(rank)] = float(by_stage[(rank // g.tp) % g.pp if None not in by_stage else None])
    return out


def _step_times(steps: list[int], finish: list[float], n: int, origin: float) -> list[float]:
    ends = [origin] * n
    for k, f in zip(steps, finish):
        ends[k] = max(ends[k], f)
    for k in range(1, n):
        ends[k] = max(ends[k], ends[k - 1])
    return [ends[k] - (ends[k - 1] if k else origin) for k in range(n)]


def _sync_seconds(records: list[Any], step: int) -> float | None:
    """Seconds the rollout engines spent taking new weights in ``step`` (the longest replica's
    push per node, summed over the step's nodes); ``None`` without a rollout engine sync."""
    total, seen = 0.0, False
    for r in records:
        if r.step != step or not r.engine:
            continue
        facts = r.engine.get("replicas", [r.engine])
        syncs = [f["weight_sync_s"] for f in facts if "weight_sync_s" in f]
        if syncs:
            total, seen = total + max(syncs), True
    return total if seen else None


def segment_trace(
    ctl: Any,
    result: Result,
    offset: int,
    hw: Hardware,
    use_gpu: bool,
    address: str | None,
    steps: int,
    failure: dict[str, Any] | None = None,
    status: str = "failed",
) -> tuple[Trace, list[float], list[float], list[float]]:
    """The trace and per-step figures of one executed plan's first ``steps`` complete steps (all of
    them, or those before a lost worker's step: the rest are dropped and the node ids renumbered
    to the ``steps``-step graph). With ``failure`` the segment stopped: the trace keeps every
    record completed before it (node ids of the segment's graph), ``status`` (``"failed"``, or
    ``"interrupted"`` by a signal), and step metrics for the steps before ``failure["step"]``."""
    from importlib.metadata import version

    binding = ctl.b
    durations, _, predicted_steps = predict(binding, hw)
    records = sorted(ctl.records, key=lambda r: r.node)
    if failure is None and steps < binding.steps:
        records = _renumber([r for r in records if r.step < steps], result, steps)
        durations = []  # per node of the full segment graph; not meaningful for a cut-short one
        predicted_steps = predicted_steps[:steps]
    step_times = _step_times([r.step for r in records], [r.end for r in records], steps, 0.0)
    rewards = []
    for k in range(steps):
        parts = ctl.rewards.get(k, [])
        total = sum(c for _, c in parts)
        rewards.append(sum(s for s, _ in parts) / total if total else float("nan"))
    shown = steps
    if failure is not None:
        shown = failure["step"] if failure.get("step") is not None else 0
    roles = {v.name: v.role.value for v in binding.graph.vertices}
    fid = fidelity(records, durations, roles, steps, predicted_steps, step_times, hw.dispatch_s)
    step_metrics = [
        {
            "step": k + offset,
            "reward": rewards[k] if math.isfinite(rewards[k]) else None,
            "step_time_s": step_times[k],
            "predicted_step_time_s": predicted_steps[k],
            "losses": ctl.losses.get(k, {}),
            "logprob_gap": getattr(ctl, "gaps", {}).get(k),
            "weight_sync_s": _sync_seconds(records, k),
            "op_classes": fid.per_step[k],
        }
        for k in range(min(shown, steps))
    ]
    cfg = ctl.cfg
    trace = Trace(
        plan_hash=plan_hash(result),
        steps=steps,
        staleness=dict(result.structure.tau),
        records=records,
        step_metrics=step_metrics,
        groups=ctl.group_info,
        meta={
            "scaled": True,
            "seed": cfg.seed,
            "scale": cfg.scale,
            "step_offset": offset,
            "version_offset": binding.version_offset,
            "host": platform.node(),
            "ray_address": address or "local",
            "torch": version("torch"),  # the installed distribution (the driver imports no torch)
            "backend": "nccl" if use_gpu else "gloo",
            "hardware": hw.name,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "predicted_durations": durations,
            "vertex_roles": roles,
            "predicted_memory": predicted_memory(
                binding,
                getattr(cfg, "rollout_engine", "torch"),
                forward_factor=hw.terms("inference").memory_factor,
            ),
            "dispatch_s": hw.dispatch_s,
            "engine_terms": dict(zip(("generation", "inference", "training"), hw.engine_for)),
            "fidelity": fid.to_dict(),
            "setup_s": ctl.setup_s,
            "wall_s": ctl.wall_s,
            "dispatch_overhead_s": ctl.overhead_s,
            "stall_timeout_s": cfg.stall_s,
            "rollout_engine": getattr(cfg, "rollout_engine", "torch"),
        },
        status="complete" if failure is None else status,
        failure=failure,
    )
    return trace, rewards, step_times, predicted_steps


def _renumber(records: list[Any], result: Result, steps: int) -> list[Any]:
    """Records of the first ``steps`` steps with the node ids of the ``steps``-step graph."""
    from dataclasses import replace as copy_with

    from ...ir.lower import OP

    g = expected_graph(result, steps)
    names = [v.name for v in result.graph.vertices]
    kinds = ("op", "comm", "reshard")
    ids = {}
    for i in range(len(g)):
        src = None if g.kind[i] == OP else names[g.source[i]]
        ids[(kinds[g.kind[i]], names[g.vertex[i]], src, g.step[i], g.phase[i])] = i
    out = []
    for r in records:
        key = (r.kind, r.vertex, r.source, r.step, r.phase)
        out.append(copy_with(r, node=ids.get(key, -1)))
    return sorted(out, key=lambda r: r.node)
