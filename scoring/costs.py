"""Cached per-(vertex, strategy) costs: the bridge between the IR and the cost model.

Every duration and memory figure of an OP node depends only on its vertex and its
:class:`~rpeg.ir.plan.Strategy` (shape, degrees, microbatches, tiers), not on where the
allocation sits, so each is computed once per pair and reused by every evaluation. COMM and
RESHARD durations depend on the tier spanned by the allocations involved and are cached by
``(bytes, sizes, tier)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costmodel.layout import Layout
from ..costmodel.memory import (
    kv_budget_tokens,
    transient_bytes,
    weight_bytes,
    zero_state_bytes,
)
from ..costmodel.precision import check_precision
from ..costmodel.time import comm_time, generation_times, host_offload_time, op_time, reshard_time
from ..ir.cluster import Cluster
from ..ir.graph import RPEG
from ..ir.plan import Choice, Strategy
from ..ir.types import Role
from ..ir.workload import LengthBucket, Workload

__all__ = ["Costs", "VertexMemory"]

COMM_CACHE = 100_000  # COMM durations kept, keyed by (bytes, source mask, destination mask)


@dataclass(frozen=True, slots=True)
class VertexMemory:
    """Per-device memory of one vertex under one strategy (bytes, SPEC §6).

    Attributes
    ----------
    transient
        ``A(v)`` without serving weights: activations (+ KV cache; training also its BF16
        weights and gradients).
    weights
        The model's resident serving copy under this strategy: ``W_shard·sb``, or
        ``W_shard·sb/Pd`` sharded by ZeRO-3 (SPEC §14.3; a serving or shadow copy); 0 for a
        forward-only vertex that offloads it (its copy is in ``transient``).
    train_state
        ``12·W_shard/Pd`` for a training vertex, else 0; 0 for a trainer that offloads it.
    trains
        Whether the vertex is a training one (its ``weights`` are then the BF16 copy counted in
        ``transient``, not a resident copy).

    With host offload (SPEC §14.4, ``Strategy.offload``) the state that would persist lives in
    host memory between runs and on the device only while the vertex runs, so it moves into
    ``transient``: every rule that adds up a device's peak (``Σ persistent + max transient``)
    then gives the maximum over the vertices of that device of each one's resident set.
    """

    transient: float
    weights: float
    train_state: float
    trains: bool = False

    @property
    def isolated(self) -> float:
        """Peak if the vertex ran alone on its devices: training state + transient, or a
        serving copy of the weights + transient."""
        if self.trains:
            return self.train_state + self.transient
        return self.weights + self.transient


class Costs:
    """Cost provider for :func:`~rpeg.ir.lower.lower` and the memory check.

    Parameters
    ----------
    graph
        The compact RPEG (vertex indices refer to ``graph.vertices``).
    workload
        Supplies ``Lp``, ``Lr`` and the response-length quantiles.
    cluster
        Supplies the hardware figures and the tier of a device set.

    Raises
    ------
    ValueError
        For a model whose precision the hardware cannot run in a trainer or a teacher-forced
        pass (``"fp8"`` without an FP8 peak, :func:`~rpeg.costmodel.precision.check_precision`;
        a generation engine serves such a checkpoint as weight-only GEMMs).
    """

    def __init__(self, graph: RPEG, workload: Workload, cluster: Cluster) -> None:
        self.graph = graph
        self.workload = workload
        self.cluster = cluster
        self.hw = cluster.hardware
        self._op: dict[tuple, tuple[float, ...]] = {}
        self._mem: dict[tuple, VertexMemory] = {}
        self._comm: dict[tuple, float] = {}
        self._reshard: dict[tuple, float] = {}
        self._layout: dict[Strategy, Layout] = {}
        self._resident: dict[Strategy, Strategy] = {}
        self._specs = [graph.models[v.model].spec for v in graph.vertices]
        for spec, v in zip(self._specs, graph.vertices):  # a generation may serve weight-only GEMMs
            check_precision(spec, self.hw, served=v.role is Role.GENERATION)
        self._model_heads = [graph.models[v.model].head for v in graph.vertices]
        self._buckets = workload.buckets
        self._stats: dict[LengthBucket | None, tuple[float, float]] = {}
        self._window_stats: dict[tuple[LengthBucket | None, int], float] = {}

    def layout(self, s: Strategy) -> Layout:
        """The cost model's :class:`Layout` of a strategy."""
        lay = self._layout.get(s)
        if lay is None:
            lay = Layout(s, self.cluster.gpus_per_node)
            self._layout[s] = lay
        return lay

    def resident(self, s: Strategy) -> Strategy:
        """``s`` without host offload (``s`` itself when it does not offload; cached: a
        directory asks for the twin of each offloading variant three times)."""
        if not s.offload:
            return s
        twin = self._resident.get(s)
        if twin is None:
            twin = self._resident[s] = s.variant(offload=False)
        return twin

    # ------------------------------------------------------------------ times
    def op_phases(self, vertex: int, choice: Choice, split: bool) -> tuple[float, ...]:
        """Seconds of the vertex's OP node, or of each of its ``Q`` phase nodes when ``split``
        (:meth:`phases` of the choice's strategy)."""
        return self.phases(vertex, choice.strategy, split)

    def phases(self, vertex: int, strategy: Strategy, split: bool) -> tuple[float, ...]:
        """Seconds of the OP node, or of each of the ``Q`` phase nodes when ``split`` (cached).

        Generation phase ``q`` decodes steps ``t_{q−1}..t_q`` for the ``(1 − f_{q−1})`` share of
        sequences still running (phase 1 also prefills); inference phase ``q`` processes the
        share ``f_q − f_{q−1}``. Unsplit nodes process everything (SPEC §5, §6).
        """
        key = (vertex, strategy, split)
        hit = self._op.get(key)
        if hit is None:
            hit = self._op[key] = self._op_phases(vertex, strategy, split)
        return hit

    def op_time(self, vertex: int, strategy: Strategy) -> float:
        """Seconds of the unsplit OP node (the directory's sort key)."""
        return self.phases(vertex, strategy, False)[0]

    def _op_phases(self, vertex: int, s: Strategy, split: bool) -> tuple[float, ...]:
        """Generation: the continuous-batching engine (:func:`~rpeg.costmodel.time.generation_times`,
        SPEC §14.5) with a rule reward's host time after the last token (SPEC §14.8); inference
        and training: packed sequences at their ``E[ℓ]``, ``E[ℓ²]`` (all of them, or phase
        ``q``'s bucket; SPEC §14.1) and, for a model with sliding-window blocks, ``E[s_W(ℓ)]``
        (:meth:`_window_square`), or padded to ``Lp + Lr`` (``packing=False``). With host
        offload (SPEC §14.4) the first node also loads the offloaded state and the last one
        offloads it again (:func:`~rpeg.costmodel.time.host_offload_time`)."""
        if s.offload:
            phases = list(self.phases(vertex, self.resident(s), split))
            load, offload = host_offload_time(self.offloaded_bytes(vertex, s), self.hw)
            phases[0] += load
            phases[-1] += offload
            return tuple(phases)
        v = self.graph.vertices[vertex]
        if v.role is Role.INFERENCE and s.logits_chunk:  # chunking a forward's loss takes no time
            return self.phases(vertex, s.variant(logits_chunk=0), split)
        w = self.workload
        spec = self._specs[vertex]
        lay = self.layout(s)
        if v.role is Role.GENERATION:
            host = w.reward_cost_s * v.sequences if w.reward == "rule" else 0.0
            bds = generation_times(
                spec,
                lay,
                self.hw,
                sequences=v.sequences,
                prompt_len=w.prompt_len,
                buckets=self._buckets,
                head=v.head,
                split=split,
                host_s=host,
            )
            return tuple(bd.total for bd in bds)
        common = {"prompt_len": w.prompt_len, "response_len": w.response_len, "head": v.head}
        buckets = self._buckets if split else (None,)
        out = []
        for bucket in buckets:
            share = 1.0 if bucket is None else bucket.share
            stats = self._token_stats(bucket) if s.packing else (None, None)
            window_sq = (
                self._window_square(bucket, spec.sliding_window) if s.packing and spec.is_windowed else None
            )
            bd = op_time(
                spec,
                v.role,
                lay,
                self.hw,
                sequences=v.sequences * share,
                tokens=stats[0],
                tokens_sq=stats[1],
                updates=w.mini_batches if v.role is Role.TRAINING else 1,
                window_sq=window_sq,
                **common,
            )
            out.append(bd.total)
        return tuple(out)

    def _token_stats(self, bucket: LengthBucket | None) -> tuple[float, float]:
        """``(E[ℓ], E[ℓ²])`` of packed sequences ``ℓ = Lp + r``: over every bucket (``None``)
        or one, ``E[ℓ] = Lp + E[r]``, ``E[ℓ²] = Lp² + 2·Lp·E[r] + E[r²]`` (cached)."""
        hit = self._stats.get(bucket)
        if hit is None:
            lp = self.workload.prompt_len
            buckets = self._buckets if bucket is None else (bucket,)
            total = sum(b.share for b in buckets)
            mean = sum(b.share * b.mean for b in buckets) / total
            mean_sq = sum(b.share * b.mean_square for b in buckets) / total
            hit = self._stats[bucket] = (lp + mean, lp * lp + 2.0 * lp * mean + mean_sq)
        return hit

    def _window_square(self, bucket: LengthBucket | None, window: int) -> float:
        """``E[s_W(ℓ)] = E[ℓ²] − E[(ℓ − W)₊²]`` of packed sequences ``ℓ = Lp + r`` (over every
        bucket, or one), the attention core's ``ℓ²`` in a block with a sliding window ``W``
        (SPEC §15.1): ``(ℓ − W)₊ = (r − u)₊`` with ``u = W − Lp``, whose square's mean each
        bucket gives in closed form (:meth:`~rpeg.ir.workload.LengthBucket.mean_excess_square`;
        cached)."""
        key = (bucket, window)
        hit = self._window_stats.get(key)
        if hit is None:
            u = window - self.workload.prompt_len
            buckets = self._buckets if bucket is None else (bucket,)
            total = sum(b.share for b in buckets)
            excess = sum(b.share * b.mean_excess_square(u) for b in buckets) / total
            hit = self._window_stats[key] = self._token_stats(bucket)[1] - excess
        return hit

    def comm(self, nbytes: float, src: Choice, dst: Choice) -> float:
        """``α_p2p + bytes·β_p2p / min(|σu|, |σv|)`` at the tier spanned by both allocations."""
        a, b = src.allocation, dst.allocation
        key = (nbytes, a.mask, b.mask)  # the masks fix the sizes and the tier
        hit = self._comm.get(key)
        if hit is None:
            if len(self._comm) >= COMM_CACHE:  # mask pairs are many on big clusters: start afresh
                self._comm.clear()
            tier = a.tier if a.mask == b.mask else self.cluster.tier_of_mask(a.mask | b.mask)
            hit = self._comm[key] = comm_time(nbytes, a.size, b.size, tier, self.hw)
        return hit

    def reshard(self, model: str, dst: Choice) -> float:
        """AlltoAll of ``N_m·sb/|σ|`` over the ``|σ|`` ranks of the destination allocation."""
        a = dst.allocation
        key = (model, a.size, a.tier)
        hit = self._reshard.get(key)
        if hit is None:
            inst = self.graph.models[model]
            hit = self._reshard[key] = reshard_time(inst.spec, a.size, a.tier, self.hw, inst.head)
        return hit

    # ------------------------------------------------------------------ memory
    def runnable(self, vertex: int, s: Strategy) -> bool:
        """Whether the engine can start with strategy ``s`` (SPEC §14.5): a generation's cache
        must hold one sequence at full length, ``K/κ ≥ Lp + Lr``
        (:func:`~rpeg.costmodel.memory.kv_budget_tokens`; with sliding-window blocks the
        sequence's :meth:`~rpeg.ir.models.ModelSpec.attended` ``(Lp + Lr)`` tokens); every other
        strategy can."""
        v = self.graph.vertices[vertex]
        if v.role is not Role.GENERATION:
            return True
        w = self.workload
        spec = self._specs[vertex]
        tokens = kv_budget_tokens(spec, self.layout(s), self.hw, self._model_heads[vertex])
        return tokens >= spec.attended(w.prompt_len + w.response_len)

    def offloaded_bytes(self, vertex: int, s: Strategy) -> float:
        """Bytes per device that host offload keeps in host memory between the vertex's runs
        (SPEC §14.4): what would persist without it, a trainer's ``12·N_s/Pd`` or a forward
        pass's resident weights (0 when ``s`` does not offload)."""
        if not s.offload:
            return 0.0
        kept = self.memory(vertex, self.resident(s))
        return kept.train_state if self.graph.vertices[vertex].role is Role.TRAINING else kept.weights

    def memory(self, vertex: int, s: Strategy) -> VertexMemory:
        """Per-device memory figures of ``vertex`` under strategy ``s`` (cached); with host
        offload the state that would persist joins the transient (:class:`VertexMemory`)."""
        key = (vertex, s)
        hit = self._mem.get(key)
        if hit is None and s.offload:
            kept = self.memory(vertex, self.resident(s))
            moved = self.offloaded_bytes(vertex, s)
            if self.graph.vertices[vertex].role is Role.TRAINING:
                hit = VertexMemory(kept.transient + moved, kept.weights, 0.0, True)
            else:
                hit = VertexMemory(kept.transient + moved, 0.0, 0.0)
            self._mem[key] = hit
        if hit is None:
            v = self.graph.vertices[vertex]
            spec = self._specs[vertex]
            head = self._model_heads[vertex]  # storage: what the model's weights carry
            lay = self.layout(s)
            w = self.workload
            trans = transient_bytes(
                spec,
                v.role,
                lay,
                sequences=v.sequences,
                prompt_len=w.prompt_len,
                response_len=w.response_len,
                head=v.head,
                tokens=self._token_stats(None)[0] if s.packing else None,
                hardware=self.hw,
            )
            state = zero_state_bytes(spec, v.role, lay, head).persistent
            if v.role is Role.TRAINING:  # the optimizer state; the BF16 weights are transient
                wb, ts = weight_bytes(spec, lay, head), state
            else:  # the resident serving copy
                wb, ts = state, 0.0
            hit = self._mem[key] = VertexMemory(trans, wb, ts, v.role is Role.TRAINING)
        return hit
