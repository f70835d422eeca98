"""Execution plans: per vertex an allocation ``σ(v)``, degrees ``Π(v) = (Pd, Pp, Pt)`` and ``mb(v)``.

A :class:`Strategy` is everything of a choice except where it sits: shape, degrees, microbatches,
the link tiers its groups span (these depend only on the shape) and, for a training invocation,
its activation recomputation (:class:`~rpeg.ir.types.Recompute`). A :class:`Choice` adds the
:class:`~rpeg.ir.cluster.Allocation`. A :class:`Plan` is one choice per vertex, in vertex order.

Legality (:func:`check_strategy`) is SPEC §4's P1–P8 plus the attention-head rules of the engine
that runs the invocation (:func:`check_heads`): a plan is refused when vLLM or Megatron-core would
refuse to build it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .cluster import Allocation, Cluster
from .models import ModelSpec
from .types import Recompute, Role

if TYPE_CHECKING:
    from .graph import RPEG

__all__ = [
    "CP_KINDS",
    "ENGINES",
    "HEAD_RULES",
    "ZERO_STAGES",
    "Choice",
    "Plan",
    "Strategy",
    "check_heads",
    "check_plan",
    "check_strategy",
    "check_strategy_of",
    "engine_of",
    "stage_layer_ranges",
]

#: The engine that runs each role's invocations: generation on vLLM, teacher-forced inference and
#: training on Megatron-core (the torch runtime shards heads the same way).
ENGINES: dict[Role, str] = {
    Role.GENERATION: "vLLM",
    Role.INFERENCE: "Megatron-core",
    Role.TRAINING: "Megatron-core",
}

#: How context parallelism crosses the sequence split (SPEC §15.3): ring attention (Megatron-core)
#: or DeepSpeed-Ulysses AlltoAlls (verl's sequence parallelism).
CP_KINDS = ("ring", "ulysses")

#: Rule tags of the attention-head checks (:func:`check_heads`), in the order they are tested.
HEAD_RULES = ("H1", "H2")

#: The ZeRO stages each role may choose (SPEC §14.3): training 1 (Megatron's distributed
#: optimizer), 2 (ZeRO-2) or 3 (FSDP2/ZeRO-3); a forward-only invocation holds its weights
#: replicated on every data-parallel rank (2: stages 1 and 2 shard no parameters) or sharded
#: over them (3); a rollout engine holds them replicated (vLLM has no parameter sharding).
ZERO_STAGES: dict[Role, tuple[int, ...]] = {
    Role.TRAINING: (1, 2, 3),
    Role.INFERENCE: (2, 3),
    Role.GENERATION: (2,),
}


@dataclass(frozen=True, slots=True)
class Strategy:
    """Shape, parallel degrees and microbatches of one invocation's choice.

    Parameters
    ----------
    extent
        ``(dr, dn, dg)`` of the allocation.
    dp, pp, tp
        ``Pd, Pp, Pt`` with ``Pd·Pp·Pt = |σ|``.
    mb
        Microbatches per step (1 without pipelining).
    pp_tier
        Link tier of the inter-node pipeline boundaries (0 when a replica fits in one node).
    dp_tier
        Link tier spanned by a data-parallel group (the allocation's tier when ``Pd > 1``).
    recompute
        Activation recomputation (:class:`~rpeg.ir.types.Recompute`; a string is converted):
        a training invocation's choice of ``none``, ``selective`` or ``full``; every other role
        keeps the neutral ``full``, which the cost model ignores. It changes time and memory,
        not the layout: :meth:`same_layout` ignores it.
    zero
        ZeRO stage ``z`` of the model state over the ``Pd`` data-parallel ranks (SPEC §14.3,
        :data:`ZERO_STAGES`): 1, 2 (the default, SPEC §6's ZeRO-2) or 3 for training; 2
        (parameters replicated on every rank) or 3 (sharded, gathered layer by layer) for
        inference; 2 for generation. Part of the layout (:meth:`same_layout`).
    mem_fraction
        Generation only: the rollout engine's memory fraction ``u`` (vLLM's
        ``gpu_memory_utilization``, SPEC §14.5): the engine holds ``u·M_GPU`` per device, its
        weights, workspace and paged KV cache. ``0`` means the hardware's default
        (:attr:`~rpeg.ir.hardware.Hardware.kv_memory_fraction`); every other role keeps ``0``.
    logits_chunk
        Training and inference: tokens per chunk of a chunked loss (SPEC §14.6), ``0`` for the
        whole microbatch's logits at once; generation keeps ``0``.
    packing
        Training and inference: sequences packed without padding (SPEC §14.1, the default);
        ``False`` pads each to ``Lp + Lr``. Generation keeps ``True``.
    offload
        Host residency (SPEC §14.4): the invocation's persistent state (a trainer's FP32 master
        weights and Adam moments, a forward-only invocation's or a rollout engine's resident
        weights) lives in host memory between its runs and is loaded before each run and
        offloaded after it — verl's ``optimizer_offload``/``param_offload`` and the rollout
        engine's sleep mode. Time and memory only: :meth:`same_layout` ignores it.
    cp
        Context-parallel degree ``Pc`` (SPEC §15.3): training and inference split each sequence
        over ``Pc`` ranks; the allocation holds ``Pd·Pp·Pt·Pc`` devices, ranks ordered
        tensor-parallel innermost, then context-parallel, pipeline, data-parallel. Generation
        keeps ``1``.
    cp_kind
        How attention crosses the sequence split (:data:`CP_KINDS`): ``ring`` (Megatron-core's
        ring attention, KV chunks passed round the ``Pc`` ranks) or ``ulysses`` (DeepSpeed-Ulysses,
        verl's sequence parallelism: AlltoAlls that trade the sequence split for a head split).
        ``ring`` while ``cp = 1``.
    ep
        Expert-parallel degree ``Pe`` of a mixture of experts (SPEC §15.2): training and
        inference shard the routed experts over ``Pe`` ranks of the ``Pd·Pc`` data- and
        context-parallel group, each expert tensor-parallel over the ``Pt`` ranks (Megatron's
        default expert-TP); a generation's ``Pe = Pd`` makes its data-parallel replicas one
        engine whose ranks share the experts, attention data-parallel (vLLM's expert
        parallelism over ``Pd·Pt`` ranks; the cost model splits each expert over ``Pt`` as for
        training, the same bytes per device). ``1``: every rank holds every expert
        (tensor-parallel like a dense FFN).
    sp
        Megatron's sequence parallelism (SPEC §15.3): the regions outside the tensor-parallel
        GEMMs (norms, residuals, dispatch) are split over the ``Pt`` ranks by sequence and each
        AllReduce becomes a ReduceScatter and an AllGather. Training and inference with
        ``Pt > 1`` only.
    cp_tier, ep_tier
        Link tiers the context-parallel group and the expert-parallel group span
        (0 while the degree is 1).
    etp
        Expert tensor-parallel degree ``Pet`` of a mixture of experts' routed experts in
        training and inference (Megatron-core's ``expert_tensor_parallel_size``): ``None``, the
        default, splits each expert over the ``Pt`` tensor-parallel ranks like the dense FFN
        (``Pet = Pt``, Megatron's default); ``1`` keeps each expert whole on one rank and draws
        the ``Pe`` expert-parallel ranks from the ``Pt·Pd·Pc`` tensor-, data- and
        context-parallel ranks (Megatron's "MoE parallel folding", the layout Megatron-Bridge's
        recipes for Qwen3-MoE, DeepSeek-V3 and gpt-oss use with ``Pt > 1``). ``etp = tp`` is
        stored as ``None`` (one form per layout).
    ep_overlap
        Whether a training invocation's expert-parallel AlltoAlls run under another microbatch's
        compute (Megatron-core's ``overlap_moe_expert_parallel_comm``: its combined 1F1B
        schedule interleaves one microbatch's forward with another's backward so that each
        side's dispatch and combine hide behind the other's compute). Training with ``Pe > 1``
        only, not under full recomputation, and with ``Pp > 1`` only interleaved (``vp > 1``):
        rule E5 of :func:`check_strategy`, Megatron-core's ``TransformerConfig`` checks. Not part
        of the layout (no weight moves).
    flex_dispatch
        Whether the expert-parallel dispatch and combine run on Megatron-core's flex dispatcher
        (``moe_token_dispatcher_type = "flex"`` with DeepEP or HybridEP, as NVIDIA's MoE recipes
        run them) instead of its AlltoAll: a token goes once to each rank that holds one of its
        experts, not once per expert, and across nodes once to each node, forwarded inside it
        over NVLink (``docs/cost-model.md`` §10). Training and inference with ``Pe > 1`` where
        the engines have it: rule E6 of :func:`check_strategy`. Not part of the layout.
    vp
        Model chunks per pipeline stage ``Pv`` of Megatron's interleaved 1F1B schedule
        (``virtual_pipeline_model_parallel_size``; Narayanan et al., SC'21, §2.2.2): the
        ``L/Pp`` layers of a stage are ``Pv`` chunks of ``L/(Pp·Pv)``, stage ``p`` holding
        chunks ``p, p + Pp, …``, which cuts the pipeline's fill and drain ``Pv``-fold and
        multiplies its point-to-point messages by ``Pv``. Training and inference with
        ``Pp > 1`` only (rules V1–V3 of :func:`check_strategy`); ``1`` is the plain 1F1B
        schedule. Part of the layout (:meth:`same_layout`: a stage holds other layers).

    Raises
    ------
    ValueError
        If ``recompute`` is not one of ``none``, ``selective``, ``full``, or ``zero``,
        ``mem_fraction``, ``logits_chunk``, ``packing`` or ``offload`` is of the wrong type or out
        of range.
    """

    extent: tuple[int, int, int]
    dp: int
    pp: int
    tp: int
    mb: int
    pp_tier: int = 0
    dp_tier: int = 0
    recompute: Recompute = Recompute.FULL
    zero: int = 2
    mem_fraction: float = 0.0
    logits_chunk: int = 0
    packing: bool = True
    offload: bool = False
    cp: int = 1
    cp_kind: str = "ring"
    ep: int = 1
    sp: bool = False
    cp_tier: int = 0
    ep_tier: int = 0
    vp: int = 1
    etp: int | None = None
    ep_overlap: bool = False
    flex_dispatch: bool = False
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.zero, bool) or self.zero not in (1, 2, 3):
            raise ValueError(f"Strategy.zero must be a ZeRO stage 1, 2 or 3, got {self.zero!r}")
        u = self.mem_fraction
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 <= u <= 1.0:
            raise ValueError(f"Strategy.mem_fraction must be a number in [0, 1], got {u!r}")
        object.__setattr__(self, "mem_fraction", float(u))
        c = self.logits_chunk
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"Strategy.logits_chunk must be a non-negative integer, got {c!r}")
        if not isinstance(self.packing, bool):
            raise ValueError(f"Strategy.packing must be True or False, got {self.packing!r}")
        if not isinstance(self.offload, bool):
            raise ValueError(f"Strategy.offload must be True or False, got {self.offload!r}")
        for name in ("cp", "ep", "vp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Strategy.{name} must be a positive integer, got {value!r}")
        if self.cp_kind not in CP_KINDS:
            raise ValueError(f"Strategy.cp_kind must be one of {', '.join(CP_KINDS)}, got {self.cp_kind!r}")
        if self.cp == 1 and self.cp_kind != "ring":
            raise ValueError(f"Strategy.cp_kind={self.cp_kind!r} needs cp > 1 (cp=1 keeps 'ring')")
        if not isinstance(self.sp, bool):
            raise ValueError(f"Strategy.sp must be True or False, got {self.sp!r}")
        for name in ("ep_overlap", "flex_dispatch"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Strategy.{name} must be True or False, got {getattr(self, name)!r}")
        if self.etp is not None:
            e = self.etp
            if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                raise ValueError(f"Strategy.etp must be a positive integer or None, got {e!r}")
            if e == self.tp:
                object.__setattr__(self, "etp", None)  # the default: experts tensor-parallel like the FFN
            elif e != 1:
                raise ValueError(
                    f"Strategy.etp must be 1 or tp={self.tp} (Megatron's default expert-TP), got {e!r}"
                )
        if type(self.recompute) is not Recompute:
            try:
                mode = Recompute(self.recompute)
            except ValueError:
                known = ", ".join(m.value for m in Recompute)
                raise ValueError(
                    f"Strategy.recompute must be one of {known}, got {self.recompute!r}"
                ) from None
            object.__setattr__(self, "recompute", mode)
        # every cost cache is keyed by strategies: hash the fields once, not per lookup
        object.__setattr__(self, "_hash", hash(self._values()))

    def _values(self) -> tuple:
        """The fields in order, ``_hash`` aside."""
        return (
            self.extent,
            self.dp,
            self.pp,
            self.tp,
            self.mb,
            self.pp_tier,
            self.dp_tier,
            self.recompute,
            self.zero,
            self.mem_fraction,
            self.logits_chunk,
            self.packing,
            self.offload,
            self.cp,
            self.cp_kind,
            self.ep,
            self.sp,
            self.cp_tier,
            self.ep_tier,
            self.vp,
            self.etp,
            self.ep_overlap,
            self.flex_dispatch,
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # rebuilt through __init__ in the receiving process: string hashes differ per process
        return (Strategy, self._values())

    @property
    def size(self) -> int:
        """``|σ| = Pd·Pp·Pt·Pc``."""
        return self.dp * self.pp * self.tp * self.cp

    @property
    def expert_tp(self) -> int:
        """``Pet``: the tensor-parallel ranks each routed expert is split over (:attr:`etp`,
        ``Pt`` by default)."""
        return self.tp if self.etp is None else self.etp

    def expert_group_devices(self) -> list[int]:
        """The allocation indices of the first expert-parallel group's ``Pe`` ranks. Ranks sit
        tensor-parallel innermost, then context-parallel, pipeline and data-parallel (device
        ``t + Pt·(c + Pc·(p + Pp·d))``); the group takes its members from the ``Pt/Pet``
        tensor-parallel ranks of each expert shard first (all ``Pt`` with ``etp = 1``, none by
        default), then from the ``Pd·Pc`` group, context-parallel ones first: member ``j`` is
        tensor rank ``j mod (Pt/Pet)`` of data/context rank ``i = ⌊j/(Pt/Pet)⌋``,
        ``c = i mod Pc``, ``d = ⌊i/Pc⌋``."""
        return expert_group_devices(self.tp, self.expert_tp, self.cp, self.pp, self.ep)

    def label(self) -> str:
        """``(dp,pp,tp) mb=…`` for tables, with ``vp=…``, ``cp=…`` (and ``ulysses``), ``ep=…``,
        ``etp=…``, ``a2a-overlap``, ``flex`` and ``sp`` when set, ``rc=…`` when the recomputation is not ``full``, ``z=…`` when the ZeRO stage is
        not 2, ``u=…``, ``chunk=…``, ``padded`` and ``offload`` when set."""
        text = f"({self.dp},{self.pp},{self.tp}) mb={self.mb}"
        if self.vp > 1:
            text += f" vp={self.vp}"
        if self.cp > 1:
            text += f" cp={self.cp}" + (" ulysses" if self.cp_kind == "ulysses" else "")
        if self.ep > 1:
            text += f" ep={self.ep}"
        if self.etp is not None:
            text += f" etp={self.etp}"
        if self.ep_overlap:
            text += " a2a-overlap"
        if self.flex_dispatch:
            text += " flex"
        if self.sp:
            text += " sp"
        if self.recompute is not Recompute.FULL:
            text += f" rc={self.recompute.value}"
        if self.zero != 2:
            text += f" z={self.zero}"
        if self.mem_fraction:
            text += f" u={self.mem_fraction:g}"
        if self.logits_chunk:
            text += f" chunk={self.logits_chunk}"
        if not self.packing:
            text += " padded"
        if self.offload:
            text += " offload"
        return text

    def same_layout(self, other: Strategy) -> bool:
        """Whether ``other`` holds the model's weights the same way: equal shape, degrees
        (context- and expert-parallel too, the experts' tensor-parallel degree and the pipeline's
        chunks ``vp``) and ZeRO stage, whatever either's microbatches,
        :attr:`recompute`, memory fraction, loss chunking, packing, host offload, sequence
        parallelism or ring/Ulysses attention (none of them moves a weight between devices)."""
        return self is other or (
            self.dp == other.dp
            and self.pp == other.pp
            and self.tp == other.tp
            and self.cp == other.cp
            and self.ep == other.ep
            and self.etp == other.etp
            and self.vp == other.vp
            and self.zero == other.zero
            and self.extent == other.extent
        )

    def layout_key(self) -> tuple:
        """``(extent, dp, pp, tp, cp, cp_kind, ep, sp, mb, zero, vp, etp)``: what the variants of one
        layout share (they differ in recomputation, memory fraction, loss chunking, packing or
        host offload: time and memory only)."""
        return (
            self.extent,
            self.dp,
            self.pp,
            self.tp,
            self.cp,
            self.cp_kind,
            self.ep,
            self.sp,
            self.mb,
            self.zero,
            self.vp,
            self.etp,
        )

    def with_recompute(self, mode: Recompute | str) -> Strategy:
        """A copy with :attr:`recompute` set to ``mode`` (and the AlltoAlls in line under ``full``,
        which Megatron-core does not overlap: rule E5)."""
        mode = Recompute(mode)
        return replace(self, recompute=mode, ep_overlap=self.ep_overlap and mode is not Recompute.FULL)

    def variant(self, **fields: object) -> Strategy:
        """A copy with the given fields replaced (``zero``, ``mem_fraction``, ``logits_chunk``,
        ``packing``, ``offload``, ``recompute``, ``mb``), validated again."""
        return replace(self, **fields)  # type: ignore[arg-type]


def expert_group_devices(tp: int, expert_tp: int, cp: int, pp: int, ep: int) -> list[int]:
    """:meth:`Strategy.expert_group_devices` from the degrees alone (``Pt``, ``Pet``, ``Pc``,
    ``Pp``, ``Pe``): member ``j`` of the first expert-parallel group sits on device
    ``j mod (Pt/Pet) + Pt·(c + Pc·Pp·d)`` with ``i = ⌊j/(Pt/Pet)⌋``, ``c = i mod Pc``,
    ``d = ⌊i/Pc⌋``."""
    inner = tp // expert_tp
    out = []
    for j in range(ep):
        i = j // inner
        out.append(j % inner + tp * (i % cp + cp * pp * (i // cp)))
    return out


@dataclass(frozen=True, slots=True)
class Choice:
    """One vertex's full choice ``(σ, Π, mb)``."""

    strategy: Strategy
    allocation: Allocation

    @property
    def mask(self) -> int:
        """Bit mask of the devices of ``σ``."""
        return self.allocation.mask

    def to_dict(self, vertex: str) -> dict[str, object]:
        """A ``plan`` entry of the result file (SPEC §12)."""
        s = self.strategy
        return {
            "vertex": vertex,
            "origin": list(self.allocation.origin),
            "extent": list(self.allocation.extent),
            "dp": s.dp,
            "pp": s.pp,
            "tp": s.tp,
            "mb": s.mb,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """One :class:`Choice` per vertex of the graph, in the graph's vertex order."""

    choices: tuple[Choice, ...]

    def __len__(self) -> int:
        return len(self.choices)

    def __getitem__(self, i: int) -> Choice:
        return self.choices[i]

    def replace(self, i: int, choice: Choice) -> Plan:
        """A copy with vertex ``i``'s choice replaced."""
        c = list(self.choices)
        c[i] = choice
        return Plan(tuple(c))

    def key(self) -> tuple:
        """Canonical hashable form (for caches)."""
        return tuple((c.strategy, c.allocation.origin) for c in self.choices)


def engine_of(role: Role | None) -> str:
    """The engine whose head rules apply to an invocation of ``role`` (:data:`ENGINES`).

    ``None`` stands for "every engine" and yields ``"Megatron-core"``, whose rules are the
    stricter ones (a layout Megatron-core accepts, vLLM accepts too).
    """
    return "Megatron-core" if role is None else ENGINES[role]


def check_heads(model: ModelSpec, role: Role | None, tp: int) -> str | None:
    """Check that tensor parallelism ``tp`` can shard ``model``'s attention heads on the engine
    that runs ``role``; return why not (rule and engine named), or ``None``.

    * **H1** (both engines) ``tp | heads``: each tensor-parallel rank holds
      ``heads/tp`` whole query heads.
    * **H2, Megatron-core** (training and inference) ``tp | kv_heads``: the query groups
      (``num_query_groups`` = KV heads) are sharded like the heads.
    * **H2, vLLM** (generation) ``tp | kv_heads`` or ``kv_heads | tp``: vLLM shards the KV heads
      when there are at least ``tp`` of them and otherwise replicates each KV head on
      ``tp/kv_heads`` ranks, which must be an integer.

    Sources: Megatron-core ``TransformerConfig.__post_init__``
    (``megatron/core/transformer/transformer_config.py``: "num_attention_heads ... must be a
    multiple of tensor_model_parallel_size", "num_query_groups ... must be a multiple of
    tensor_model_parallel_size"); vLLM ``ModelConfig.verify_with_parallel_config``
    (``vllm/config/model.py``: "Total number of attention heads ... must be divisible by tensor
    parallel size") and ``QKVParallelLinear.__init__``
    (``vllm/model_executor/layers/linear.py``: ``num_kv_heads = divide(total_num_kv_heads,
    tp_size)`` when ``tp_size < total_num_kv_heads``, else ``num_kv_head_replicas =
    divide(tp_size, total_num_kv_heads)``, ``divide`` asserting exact division).

    Parameters
    ----------
    model
        The model: its ``heads`` and ``kv_heads``.
    role
        What the invocation does (its engine: :data:`ENGINES`); ``None`` applies the stricter
        Megatron-core rules.
    tp
        Tensor-parallel degree ``Pt``.
    """
    engine = engine_of(role)
    if model.heads % tp:
        return f"H1 ({engine}): tp={tp} does not divide heads={model.heads}"
    kv = model.kv_heads
    if engine == "vLLM":
        if kv % tp and tp % kv:
            return (
                f"H2 ({engine}): tp={tp} neither divides kv_heads={kv} nor is a multiple of it "
                f"(vLLM shards or replicates whole KV heads)"
            )
    elif kv % tp:
        return f"H2 ({engine}): tp={tp} does not divide kv_heads={kv} (query groups)"
    return None


def check_strategy(
    cluster: Cluster,
    model: ModelSpec,
    role: Role | None,
    sequences: int,
    extent: tuple[int, int, int],
    dp: int,
    pp: int,
    tp: int,
    mb: int,
    *,
    zero: int = 2,
    mem_fraction: float = 0.0,
    logits_chunk: int = 0,
    packing: bool = True,
    offload: bool = False,
    cp: int = 1,
    cp_kind: str = "ring",
    ep: int = 1,
    sp: bool = False,
    vp: int = 1,
    etp: int | None = None,
    ep_overlap: bool = False,
    recompute: Recompute | str | None = None,
    flex_dispatch: bool = False,
) -> str | None:
    """Check P1–P8 (SPEC §4, with §14.2's microbatches), the head rules H1–H2 and the engine
    choices Z1–Z2 (SPEC §14) for one choice; return why not (the message starts with the rule's
    tag), or ``None``.

    P1 ``Pt | Ng``; H1–H2 the attention heads of ``model`` split over ``Pt`` ranks on the engine
    of ``role`` (:func:`check_heads`); P2 ``Pp | L`` and ``Pp ∈ {1} ∪ even``; P3 ``Pd | B·R``;
    with ``B_local = B·R/Pd``, for a generation (vLLM microbatches only a pipeline) P4
    ``Pp = 1 ⇒ mb = 1`` and P5 ``Pp > 1 ⇒ mb | B_local, mb ≥ Pp, B_local/mb ≥ 8``; for
    training and inference (gradient accumulation, SPEC §14.2, which replaces P4–P5 there) P4
    ``1 ≤ mb ≤ B_local`` (a microbatch holds a sequence at least) and P5 ``Pp > 1 ⇒ mb ≥ Pp``;
    P6 the extent is a legal shape and a replica either fits in one node
    (``Pp·Pt | Ng``) or spans whole nodes; P8 ``s = min(Pp, ⌊Ng/Pt⌋)`` divides ``Pp`` and
    ``|σ| = Pd·Pp·Pt``; P9 a generation invocation's ``Pp ≤`` the cluster's ``generation_max_pp``
    (the rollout engine's limit, when set). (P7, the origin's alignment, is checked by
    :meth:`Cluster.allocation`.) Z1 the ZeRO stage is one the role may choose
    (:data:`ZERO_STAGES`); Z2 only a generation sets a memory fraction, only training and
    inference chunk their loss or pad (``packing=False``); Z3 the stage is at most the
    cluster's ``max_zero_stage`` (the engines' limit, when set); Z4 host offload (SPEC §14.4)
    only where the cluster's engines offer it (``host_offload``).

    SPEC §15's parallelisms (P6 and P8 then count a replica as ``Pp·Pt·Pc`` devices, stages
    per node ``max(1, ⌊Ng/(Pt·Pc)⌋)``, and ``|σ| = Pd·Pp·Pt·Pc``): S1 sequence parallelism
    only for training and inference with ``Pt > 1``, where the cluster's engines run it
    (``sequence_parallel``); C1 ``Pc > 1`` only for training and inference, where the engines
    run it (``context_parallel``); C2 Ulysses needs ``Pc | heads/Pt`` and, of the local KV
    heads ``g = kv_heads/Pt``, ``Pc | g`` or ``g | Pc`` (verl's Ulysses check: KV heads are
    repeated up to ``Pc``); C3 the ``Pt·Pc`` ranks of a context-parallel group divide ``Ng``
    or span whole nodes; E1 ``Pe > 1`` only for a mixture of experts, where the engines run it
    (``expert_parallel``), with ``Pe | E``; E2 training and inference ``Pe | Pd·Pc`` (experts
    inside the data- and context-parallel group), generation ``Pe = Pd`` (vLLM's experts over
    all the engine's ranks, attention data-parallel); E3 training and inference with ``Pe > 1`` and ``Pt > 1``
    need sequence parallelism (Megatron-core's ``TransformerConfig``: "When using expert
    parallelism and tensor parallelism, sequence parallelism must be used"); E4 the experts'
    tensor-parallel degree ``etp`` is ``Pt`` (``None``, the default) or ``1``, and ``1 < Pt``
    only for a mixture of experts in training and inference where the engines run expert
    parallelism, with sequence parallelism (each TP rank dispatches its own share of the
    tokens) — then E2 reads ``Pe | Pt·Pd·Pc`` (Megatron-core's MoE parallel folding:
    ``expert_tensor_parallel_size · expert_model_parallel_size`` divides the
    ``tensor · context · data`` ranks, ``parallel_state.initialize_model_parallel``); E5 the
    overlapped AlltoAlls (``ep_overlap``) only for training with ``Pe > 1`` where the engines
    overlap them (``expert_overlap``), not under full recomputation (``recompute``, when given)
    and with ``Pp > 1`` only interleaved (``vp > 1``; Megatron-core's ``TransformerConfig``:
    "disable full recomputation when enabling overlap_moe_expert_parallel_comm", "If enabling EP
    A2A overlap, virtual_pipeline_model_parallel_size must be specified when
    pipeline_model_parallel_size > 1"); E6 the flex dispatcher (``flex_dispatch``) only for
    training and inference with ``Pe > 1`` where the engines have it (``flex_dispatch``: DeepEP
    or HybridEP installed beside Megatron-core).

    The interleaved pipeline (``vp > 1``, Megatron-core's virtual pipeline): V1 training and
    inference with ``Pp > 1`` only, where the engines run it (``virtual_pipeline_parallel``);
    V2 ``vp | L/Pp`` (Megatron-core splits a stage's layers into ``vp`` equal chunks); V3
    ``Pp | mb`` (its schedule runs the microbatches in groups of ``Pp`` and refuses a last
    group of fewer: ``schedules.py``, ``microbatch_group_size_per_vp_stage``).

    Parameters
    ----------
    cluster
        The device space (``Ng`` and the legal shapes).
    model
        The invocation's model (``layers`` for P2, ``heads``/``kv_heads`` for H1–H2).
    role
        The invocation's role: generation runs on vLLM, inference and training on Megatron-core
        (``None``: the stricter Megatron-core rules).
    sequences
        ``B·R``, the sequences the invocation processes per step.
    extent, dp, pp, tp, mb
        The choice's shape, degrees and microbatches.
    zero, mem_fraction, logits_chunk, packing, offload
        The engine choices of :class:`Strategy` (SPEC §14).
    cp, cp_kind, ep, sp
        Context parallelism and its kind, expert parallelism and sequence parallelism
        (SPEC §15).
    vp
        Model chunks per pipeline stage of the interleaved schedule (:attr:`Strategy.vp`).

    Raises
    ------
    TypeError
        If ``model`` is not a :class:`~rpeg.ir.models.ModelSpec`.
    """
    if not isinstance(model, ModelSpec):
        raise TypeError(
            f"check_strategy: model must be a ModelSpec (its layers and heads), got {type(model).__name__}"
        )
    Ng = cluster.gpus_per_node
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("mb", mb), ("cp", cp), ("ep", ep), ("vp", vp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{name}={value!r} must be a positive integer"
    if Ng % tp:
        return f"P1: tp={tp} does not divide gpus_per_node={Ng}"
    why = check_heads(model, role, tp)
    if why is not None:
        return why
    if etp is not None and (isinstance(etp, bool) or not isinstance(etp, int) or etp < 1):
        return f"etp={etp!r} must be a positive integer or null"
    why = _check_parallelisms(cluster, model, role, dp, tp, cp, cp_kind, ep, sp, etp)
    if why is not None:
        return why
    layers = model.layers
    if layers % pp or (pp > 1 and pp % 2):
        return f"P2: pp={pp} must divide layers={layers} and be 1 or even"
    limit = cluster.generation_max_pp
    if role is Role.GENERATION and limit is not None and pp > limit:
        return f"P9: pp={pp} exceeds the rollout engine's generation_max_pp={limit} (vLLM-CPU: no pipelining)"
    if sequences % dp:
        return f"P3: dp={dp} does not divide B·R={sequences}"
    b_local = sequences // dp
    if role is Role.GENERATION:
        if pp == 1 and mb != 1:
            return f"P4: a generation with pp=1 requires mb=1 (the engine batches continuously), got mb={mb}"
        if pp > 1 and (b_local % mb or mb < pp or b_local // mb < 8):
            return f"P5: mb={mb} needs mb | B_local={b_local}, mb ≥ pp={pp} and B_local/mb ≥ 8"
    else:
        if mb > b_local:
            return f"P4: mb={mb} exceeds B_local={b_local} sequences (a microbatch holds one at least)"
        if pp > 1 and mb < pp:
            return f"P5: mb={mb} must be ≥ pp={pp} (1F1B keeps every stage busy)"
    why = _check_interleaving(cluster, role, layers, pp, mb, vp)
    if why is not None:
        return why
    why = _check_ep_overlap(cluster, role, ep, pp, vp, ep_overlap, recompute)
    if why is not None:
        return why
    why = _check_flex_dispatch(cluster, role, ep, flex_dispatch)
    if why is not None:
        return why
    why = _check_engine_choices(role, zero, mem_fraction, logits_chunk, packing)
    if why is not None:
        return why
    if not isinstance(offload, bool):
        return f"Z4: offload={offload!r} must be true or false"
    if offload and not cluster.host_offload:
        return "Z4: offload=true but the cluster's engines do not offload to the host (host_offload=false)"
    if cluster.max_zero_stage is not None and zero > cluster.max_zero_stage:
        return (
            f"Z3: zero={zero} exceeds the engines' max_zero_stage={cluster.max_zero_stage} "
            "(the bundled torch engine: 2)"
        )
    size = dp * pp * tp * cp
    what = "dp·pp·tp·cp" if cp > 1 else "dp·pp·tp"
    if cluster.shape_for_size(size) != tuple(extent):
        return f"P6: extent {list(extent)} is not the legal shape for {what}={size} devices"
    rep = pp * tp * cp
    if (rep <= Ng and Ng % rep) or (rep > Ng and rep % Ng):
        what = "pp·tp·cp" if cp > 1 else "pp·tp"
        return f"P6: a replica of {what}={rep} GPUs must fit one node evenly or span whole nodes (Ng={Ng})"
    s = min(pp, max(1, Ng // (tp * cp)))
    if pp % s:
        return f"P8: s=min(pp, Ng/tp)={s} does not divide pp={pp}"
    return None


def _check_parallelisms(
    cluster: Cluster,
    model: ModelSpec,
    role: Role | None,
    dp: int,
    tp: int,
    cp: int,
    cp_kind: str,
    ep: int,
    sp: bool,
    etp: int | None = None,
) -> str | None:
    """S1, C1–C3 and E1–E4 of :func:`check_strategy` (SPEC §15.2–15.3)."""
    generation = role is Role.GENERATION
    if not isinstance(sp, bool):
        return f"S1: sp={sp!r} must be true or false"
    if sp and (generation or tp == 1):
        return (
            "S1: sequence parallelism splits the tensor-parallel regions of training and inference (tp > 1)"
        )
    if sp and not cluster.sequence_parallel:
        return (
            "S1: sp=true but the cluster's engines do not run sequence parallelism (sequence_parallel=false)"
        )
    if cp_kind not in CP_KINDS:
        return f"C1: cp_kind={cp_kind!r} must be one of {', '.join(CP_KINDS)}"
    if cp > 1:
        if generation:
            return f"C1: cp={cp} on a generation (the rollout engine does not split sequences)"
        if not cluster.context_parallel:
            return f"C1: cp={cp} but the cluster's engines do not run context parallelism (context_parallel=false)"
        if cp_kind == "ulysses":
            heads, kv = model.heads // tp, max(1, model.kv_heads // tp)
            if heads % cp or (kv % cp and cp % kv):
                return (
                    f"C2: Ulysses cp={cp} must divide the local heads heads/tp={heads} and divide or be a "
                    f"multiple of the local KV heads {kv}"
                )
        Ng, group = cluster.gpus_per_node, tp * cp
        if (group <= Ng and Ng % group) or (group > Ng and group % Ng):
            return f"C3: a context-parallel group of tp·cp={group} GPUs must fit one node evenly or span whole nodes (Ng={Ng})"
    elif cp_kind != "ring":
        return f"C1: cp_kind={cp_kind!r} needs cp > 1"
    folded = etp is not None and etp != tp  # experts whole on a rank: Pet = 1 < Pt
    if folded:
        if etp != 1:
            return f"E4: etp={etp} must be 1 or tp={tp} (an expert whole on one rank, or split like the FFN)"
        if generation:
            return (
                "E4: etp=1 on a generation (vLLM splits the experts over the engine's tensor-parallel ranks)"
            )
        if not model.is_moe:
            return f"E4: etp=1 but {model.name} has no routed experts"
        if not cluster.expert_parallel:
            return "E4: etp=1 but the cluster's engines do not run expert parallelism (expert_parallel=false)"
        if not sp:
            return (
                f"E4: etp=1 with tp={tp} needs sequence parallelism (each TP rank dispatches its own tokens)"
            )
    if ep > 1:
        if not model.is_moe:
            return f"E1: ep={ep} but {model.name} has no routed experts"
        if not cluster.expert_parallel:
            return (
                f"E1: ep={ep} but the cluster's engines do not run expert parallelism (expert_parallel=false)"
            )
        if model.experts % ep:
            return f"E1: ep={ep} does not divide experts={model.experts}"
        if generation and ep != dp:
            return f"E2: a generation's ep={ep} must equal dp={dp} (vLLM: the engine's data-parallel ranks share the experts)"
        if not generation and not folded and (dp * cp) % ep:
            return f"E2: ep={ep} does not divide dp·cp={dp * cp} (experts inside the data- and context-parallel group)"
        if folded and (tp * dp * cp) % ep:
            return (
                f"E2: ep={ep} with etp=1 does not divide tp·dp·cp={tp * dp * cp} (experts folded into the "
                "tensor-, data- and context-parallel ranks)"
            )
        if not generation and tp > 1 and not sp:
            return f"E3: ep={ep} with tp={tp} needs sequence parallelism (Megatron-core)"
    return None


def _check_ep_overlap(
    cluster: Cluster,
    role: Role | None,
    ep: int,
    pp: int,
    vp: int,
    ep_overlap: bool,
    recompute: Recompute | str | None,
) -> str | None:
    """E5 of :func:`check_strategy`: the overlapped expert-parallel AlltoAlls."""
    if not isinstance(ep_overlap, bool):
        return f"E5: ep_overlap={ep_overlap!r} must be true or false"
    if not ep_overlap:
        return None
    if role is not Role.TRAINING or ep == 1:
        return "E5: ep_overlap overlaps a training invocation's expert-parallel AlltoAlls (needs training, ep > 1)"
    if not cluster.expert_overlap:
        return "E5: ep_overlap but the cluster's training engine runs the AlltoAlls in line (expert_overlap=false)"
    if recompute is not None and Recompute(recompute) is Recompute.FULL:
        return "E5: ep_overlap with full recomputation (Megatron-core overlaps none then)"
    if pp > 1 and vp == 1:
        return f"E5: ep_overlap with pp={pp} needs the interleaved pipeline (vp > 1)"
    return None


def _check_flex_dispatch(cluster: Cluster, role: Role | None, ep: int, flex_dispatch: bool) -> str | None:
    """E6 of :func:`check_strategy`: the flex dispatcher (DeepEP / HybridEP)."""
    if not isinstance(flex_dispatch, bool):
        return f"E6: flex_dispatch={flex_dispatch!r} must be true or false"
    if not flex_dispatch:
        return None
    if role not in (Role.TRAINING, Role.INFERENCE) or ep == 1:
        return "E6: flex_dispatch dispatches a Megatron-core pass's experts (needs training or inference, ep > 1)"
    if not cluster.flex_dispatch:
        return "E6: flex_dispatch but the cluster's engines have no flex dispatcher (flex_dispatch=false)"
    return None


def _check_interleaving(
    cluster: Cluster, role: Role | None, layers: int, pp: int, mb: int, vp: int
) -> str | None:
    """V1–V3 of :func:`check_strategy`: the interleaved pipeline's chunks ``vp``."""
    if vp == 1:
        return None
    if role is Role.GENERATION:
        return f"V1: vp={vp} on a generation (the rollout engine does not interleave its pipeline)"
    if pp == 1:
        return f"V1: vp={vp} needs pipelining (pp > 1), got pp=1"
    if not cluster.virtual_pipeline_parallel:
        return f"V1: vp={vp} but the cluster's engines do not interleave the pipeline (virtual_pipeline_parallel=false)"
    if (layers // pp) % vp:
        return f"V2: vp={vp} must divide the {layers // pp} layers of a stage (layers={layers}, pp={pp})"
    if mb % pp:
        return (
            f"V3: mb={mb} must be a multiple of pp={pp} with vp={vp} (Megatron-core's interleaved schedule)"
        )
    return None


def check_strategy_of(
    cluster: Cluster, model: ModelSpec, role: Role | None, sequences: int, strategy: Strategy
) -> str | None:
    """:func:`check_strategy` of a whole :class:`Strategy` (its shape, degrees, microbatches and
    engine choices); why not, or ``None``."""
    s = strategy
    return check_strategy(
        cluster,
        model,
        role,
        sequences,
        s.extent,
        s.dp,
        s.pp,
        s.tp,
        s.mb,
        zero=s.zero,
        mem_fraction=s.mem_fraction,
        logits_chunk=s.logits_chunk,
        packing=s.packing,
        offload=s.offload,
        cp=s.cp,
        cp_kind=s.cp_kind,
        ep=s.ep,
        sp=s.sp,
        vp=s.vp,
        etp=s.etp,
        ep_overlap=s.ep_overlap,
        recompute=s.recompute,
        flex_dispatch=s.flex_dispatch,
    )


def _check_engine_choices(
    role: Role | None, zero: int, mem_fraction: float, logits_chunk: int, packing: bool
) -> str | None:
    """Z1 (the ZeRO stage the role may choose, :data:`ZERO_STAGES`) and Z2 (a memory fraction in
    ``[0, 1]``, set by a generation only; a non-negative loss chunk and a boolean packing, only
    training and inference chunk the loss or pad)."""
    if (
        isinstance(mem_fraction, bool)
        or not isinstance(mem_fraction, (int, float))
        or not 0.0 <= mem_fraction <= 1.0
    ):
        return f"Z2: mem_fraction={mem_fraction!r} must be a number in [0, 1]"
    if isinstance(logits_chunk, bool) or not isinstance(logits_chunk, int) or logits_chunk < 0:
        return f"Z2: logits_chunk={logits_chunk!r} must be a non-negative integer"
    if not isinstance(packing, bool):
        return f"Z2: packing={packing!r} must be true or false"
    if isinstance(zero, bool) or not isinstance(zero, int):
        return f"Z1: zero={zero!r} must be a ZeRO stage 1, 2 or 3"
    stages = ZERO_STAGES[role] if role is not None else (1, 2, 3)
    if zero not in stages:
        what = role.value if role is not None else "an invocation"
        return f"Z1: zero={zero} is not a ZeRO stage {what} may use ({', '.join(map(str, stages))})"
    if role is Role.GENERATION:
        if logits_chunk or not packing:
            return "Z2: a generation neither chunks a loss nor pads (logits_chunk=0, packing=True)"
    elif mem_fraction:
        return f"Z2: mem_fraction={mem_fraction:g} is a rollout engine's (generation only)"
    return None


def check_plan(graph: RPEG, cluster: Cluster, plan: Plan) -> list[str]:
    """Every rule P1–P8, H1–H2 that ``plan`` breaks on ``graph`` (see :func:`check_strategy`), one
    message per offending vertex naming it; P7 is checked by re-deriving each allocation, and a
    non-training vertex must keep the neutral ``recompute="full"``.

    Parameters
    ----------
    graph
        The RPEG the plan is for (vertex roles, models and sequences).
    cluster
        The device space.
    plan
        One choice per vertex, in vertex order.

    Returns
    -------
    list of str
        Empty when the plan is legal.
    """
    vertices: Sequence = graph.vertices
    if len(plan) != len(vertices):
        return [f"plan has {len(plan)} choices but the graph has {len(vertices)} vertices"]
    out: list[str] = []
    for v, c in zip(vertices, plan.choices):
        s = c.strategy
        why = check_strategy_of(cluster, graph.models[v.model].spec, v.role, v.sequences, s)
        if why is None and v.role is not Role.TRAINING and s.recompute is not Recompute.FULL:
            why = f"recompute={s.recompute.value!r} on a {v.role.value} invocation (only training recomputes)"
        if why is None and tuple(c.allocation.extent) != tuple(s.extent):
            why = f"P6: allocation extent {list(c.allocation.extent)} differs from {list(s.extent)}"
        if why is None:
            try:
                alloc = cluster.allocation(tuple(c.allocation.origin), tuple(c.allocation.extent))
            except ValueError as exc:
                why = f"P7: {exc}"
            else:
                if alloc.mask != c.allocation.mask:
                    why = f"P7: the allocation at {list(alloc.origin)} does not hold its origin's devices"
        if why is not None:
            out.append(f"vertex {v.name!r} ({v.role.value} of {v.model}, {s.label()}): {why}")
    return out


def stage_layer_ranges(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges of ``stages`` pipeline stages, as even as possible:
    the layers each stage of a ``Pp = stages`` replica holds (the runtime's models and the
    Megatron-core mapping split the same way).

    The first ``layers mod stages`` stages hold one extra layer: stage ``p`` starts at
    ``p·⌊L/Pp⌋ + min(p, L mod Pp)``.

    Raises
    ------
    ValueError
        If ``stages`` is not in ``1..layers``.
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"stage_layer_ranges: stages={stages} must be between 1 and layers={layers}")
    size, extra = divmod(layers, stages)
    out, start = [], 0
    for p in range(stages):
        stop = start + size + (p < extra)
        out.append((start, stop))
        start = stop
    return out
