"""Candidate directories ``Xcand(v)``: every legal ``(σ, Π, mb)`` of an invocation (SPEC §4).

A directory lists the legal :class:`~rpeg.ir.plan.Strategy` objects of a vertex (shape, degrees,
microbatches and, for a training vertex, each activation-recomputation mode
:class:`~rpeg.ir.types.Recompute`) that pass P1–P8 and the head rules H1–H2 of the vertex's engine
(:func:`~rpeg.ir.plan.check_heads`), and whose isolated memory fits ``M_eff``, sorted by estimated
isolated time; each strategy can sit at any aligned origin of its shape (P7), which
:meth:`Directory.choices` enumerates. When a vertex has no legal layout (of some size),
:func:`explain_illegal` says which rules excluded the candidates.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..ir.cluster import Allocation, Cluster
from ..ir.models import ModelSpec
from ..ir.plan import (
    CP_KINDS,
    Choice,
    Strategy,
    check_heads,
    check_strategy,
    engine_of,
    expert_group_devices,
)
from ..ir.types import Recompute, Role
from .costs import Costs
from .memo import KeyedCache

__all__ = [
    "BUILD_SHARE",
    "DIRECTORY_CACHE",
    "Directory",
    "TimeUp",
    "aligned_allocations",
    "build_directories",
    "clear_directory_cache",
    "degree_group",
    "directory_key",
    "enumerate_strategies",
    "expert_degrees",
    "expert_layouts",
    "explain_illegal",
    "fastest_interleaving",
    "head_exclusions",
    "interleavings",
    "lean_directory",
    "lean_groups",
    "lean_message",
    "lean_note",
    "lean_picks",
    "make_strategy",
    "past_deadline",
    "recompute_modes",
    "scan_interleavings",
]

#: Order of the legality rules as :func:`~rpeg.ir.plan.check_strategy` tests them.
RULE_ORDER = ("P1", "H1", "H2", "P2", "P3", "P4", "P5", "P6", "P8")
#: What each rule asks, for messages.
RULE_TEXT = {
    "P1": "tp | gpus_per_node",
    "H1": "tp | heads",
    "H2": "tp vs kv_heads",
    "P2": "pp | layers, pp 1 or even",
    "P3": "dp | B·R",
    "P4": "generation: pp = 1 ⇒ mb = 1; else mb ≤ B_local",
    "P5": "generation: mb | B_local, mb ≥ pp, B_local/mb ≥ 8; else mb ≥ pp",
    "P6": "legal shape and replica layout",
    "P8": "s = min(pp, Ng/tp) | pp",
}


def _divisors(n: int) -> list[int]:
    """The divisors of ``n ≥ 1``, ascending, in ``O(√n)`` (pairs ``d, n/d`` with ``d ≤ √n``)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _as_model(cluster: Cluster, model: ModelSpec | int) -> ModelSpec:
    """``model``, or for a bare layer count a stand-in with ``Ng`` heads and KV heads (every
    ``tp | Ng`` passes H1–H2, so only P1–P8 decide)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, bool) or not isinstance(model, int):
        raise TypeError(f"model must be a ModelSpec (or a layer count), got {type(model).__name__}")
    Ng = cluster.gpus_per_node
    return ModelSpec(f"{model}-layers", model, Ng, 1, 1, Ng, Ng)


#: Memory fractions ``u`` a generation's directory lists (SPEC §14.5), up to the hardware's
#: :attr:`~rpeg.ir.hardware.Hardware.kv_memory_fraction` (which is always listed).
MEMORY_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Tokens per chunk of a chunked loss when a directory lists one (SPEC §14.6): the chunk size
#: of fused linear-cross-entropy kernels is of this order; the memory is ``c·V/Pt·4`` bytes.
LOSS_CHUNK = 4096
#: ZeRO stages a training directory lists: stage 1 is legal in a plan but never leaner nor
#: faster than stage 2 in this cost model (same traffic, full gradients), so it is not searched.
SEARCHED_TRAINING_STAGES = (2, 3)


def microbatch_counts(role: Role | None, pp: int, b_local: int) -> list[int]:
    """The microbatch counts a directory lists for one layout (SPEC §14.2).

    Generation (P4–P5 of vLLM): ``1`` without pipelining, else every divisor ``mb`` of
    ``B_local`` with ``mb ≥ Pp`` and ``B_local/mb ≥ 8``. Training and inference (gradient
    accumulation): the powers of two ``≤ B_local`` and ``≥ Pp``, plus, with pipelining, those
    divisors (SPEC §6's choices), so halving the token budget per microbatch is always an
    option.
    """
    piped = [m for m in _divisors(b_local) if m >= pp and b_local // m >= 8] if pp > 1 else [1]
    if role is Role.GENERATION:
        return piped
    powers, m = [], 1
    while m <= b_local:
        if m >= pp:
            powers.append(m)
        m *= 2
    return sorted(set(powers) | set(piped if pp > 1 else []))


def engine_variants(
    base: Strategy,
    role: Role | None,
    max_fraction: float,
    offload: bool = False,
    ep_overlap: bool = False,
) -> list[Strategy]:
    """The engine choices a directory lists for one layout (SPEC §14): per training layout
    every recomputation mode × ZeRO stage 2 or 3 × whole or chunked loss
    (:data:`SEARCHED_TRAINING_STAGES`, :data:`LOSS_CHUNK`); per inference layout ZeRO stage 2
    or 3 × whole or chunked loss (stage 3 only with ``Pd·Pc > 1``: one rank shards nothing); per
    generation layout each memory fraction of :data:`MEMORY_FRACTIONS` up to ``max_fraction``
    (and ``max_fraction`` itself). With ``offload`` (the engines offload to the host, SPEC
    §14.4) each of them also with host offload. With ``ep_overlap`` (the training engine
    overlaps the expert-parallel AlltoAlls) a training layout with ``Pe > 1`` whose pipeline
    allows it (``Pp = 1`` or ``vp > 1``, rule E5) lists its modes other than ``full`` with the
    AlltoAlls overlapped only: the overlap never costs more in the model (the exposed AlltoAll
    time is at most the in-line one, ``docs/cost-model.md`` §10), so the in-line twin is never
    the better pick."""
    out = _engine_variants(base, role, max_fraction)
    if ep_overlap and role is Role.TRAINING and base.ep > 1 and (base.pp == 1 or base.vp > 1):
        out = [s if s.recompute is Recompute.FULL else s.variant(ep_overlap=True) for s in out]
    if offload and role is not None:
        out += [s.variant(offload=True) for s in out]
    return out


def _engine_variants(base: Strategy, role: Role | None, max_fraction: float) -> list[Strategy]:
    """:func:`engine_variants` without host offload."""
    if role is Role.GENERATION:
        fractions = sorted({u for u in MEMORY_FRACTIONS if u <= max_fraction} | {max_fraction})
        return [base.variant(mem_fraction=u) for u in fractions]
    if role is None:
        return [base]
    out = []
    stages = SEARCHED_TRAINING_STAGES if role is Role.TRAINING else (2, 3)
    if base.dp * base.cp == 1:  # one data- and context-parallel rank shards nothing
        stages = (2,)
    for z in stages:
        for chunk in (0, LOSS_CHUNK):
            for mode in recompute_modes(role):
                out.append(base.variant(zero=z, logits_chunk=chunk, recompute=mode))
    return out


def recompute_modes(role: Role | None) -> tuple[Recompute, ...]:
    """The recomputation modes a directory lists for a vertex of ``role``: ``none`` and
    ``full`` for training, the neutral ``full`` alone for every other role (no backward pass).

    ``selective`` stays legal in a plan, but with fused attention (SPEC §14.7) it keeps what
    ``none`` keeps and recomputes the attention core besides, so it is never the better pick
    and is not listed (``docs/cost-model.md`` §4)."""
    if role is Role.TRAINING:
        return (Recompute.NONE, Recompute.FULL)
    return (Recompute.FULL,)


def enumerate_strategies(
    cluster: Cluster,
    model: ModelSpec | int,
    sequences: int,
    role: Role | None = None,
    *,
    offload: bool | None = None,
    interleave: bool = True,
) -> list[Strategy]:
    """All strategies passing P1–P8, H1–H2, Z1–Z2 and V1–V3 for ``model`` and ``sequences`` =
    B·R, each layout with its engine choices (:func:`engine_variants`: recomputation, ZeRO stage,
    loss chunking, memory fraction) and its interleavings (:func:`interleavings`); an
    expert-parallel training or inference layout on the flex dispatcher where the cluster's
    engines have it (``flex_dispatch``, rule E6: never dearer than the AlltoAll in the model).

    For each legal allocation size, every ``Pt | Ng`` that shards the heads on the engine of
    ``role`` (H1 ``Pt | heads``; H2 ``Pt | kv_heads`` on Megatron-core, ``Pt | kv_heads`` or
    ``kv_heads | Pt`` on vLLM), ``Pp ∈ {1} ∪ even divisors of L`` and ``Pd = |σ|/(Pp·Pt)``;
    microbatch counts from :func:`microbatch_counts`. Tiers: the pipeline's inter-node
    boundaries span the tier of one replica's devices; the DP group spans the allocation's
    tier.

    Parameters
    ----------
    cluster
        The device space.
    model
        The invocation's model; a bare layer count ``L`` checks P1–P8 only (no head rules — for
        structural tests that have no model).
    sequences
        ``B·R``.
    role
        The invocation's role (its engine, :data:`~rpeg.ir.plan.ENGINES`); ``None`` applies the
        stricter Megatron-core head rules.
    offload
        Whether to list the host-offload variants too (default ``cluster.host_offload``).
    interleave
        Whether to list the interleaved twins (``vp > 1``) too; ``False`` lists plain 1F1B only
        (:func:`build_directories` adds each one's fastest twin, :func:`fastest_interleaving`).
    """
    spec = _as_model(cluster, model)
    offload = cluster.host_offload if offload is None else offload
    max_fraction = cluster.hardware.kv_memory_fraction
    Ng = cluster.gpus_per_node
    tps = [t for t in _divisors(Ng) if check_heads(spec, role, t) is None]
    pps = [p for p in _divisors(spec.layers) if p == 1 or p % 2 == 0]
    generation = role is Role.GENERATION
    splits_sequences = cluster.context_parallel and not generation
    overlap = cluster.expert_overlap
    # the flex dispatcher never costs more than the AlltoAll in the model (docs/cost-model.md
    # §10): where the engines have it, an expert-parallel Megatron-core layout lists it only
    flex = cluster.flex_dispatch and role in (Role.TRAINING, Role.INFERENCE)
    out: list[Strategy] = []
    for size in cluster.legal_sizes:
        extent = cluster.shape_for_size(size)
        assert extent is not None
        for tp in tps:
            # sequence parallelism is never worse where it is legal (docs/cost-model.md §10)
            sp = tp > 1 and not generation and cluster.sequence_parallel
            for pp in pps:
                if size % (tp * pp):
                    continue
                for cp in _divisors(size // (tp * pp)) if splits_sequences else [1]:
                    dp = size // (tp * pp * cp)
                    if sequences % dp:
                        continue
                    b_local = sequences // dp
                    layouts = [
                        (kind, ep, etp)
                        for kind in (CP_KINDS if cp > 1 else ("ring",))
                        for ep, etp in expert_layouts(cluster, spec, role, dp, cp, tp)
                    ]
                    twins = {
                        kind: _twin_microbatches(
                            cluster, spec, role, sequences, extent, dp, pp, tp, cp, kind, sp
                        )
                        for kind in {kind for kind, _, _ in layouts}
                    }
                    for mb in microbatch_counts(role, pp, b_local):
                        for kind, ep, etp in layouts:
                            if ep == 1 and mb in twins[kind]:
                                continue  # a twin with less context parallelism is listed, never worse
                            why = check_strategy(
                                cluster, spec, role, sequences, extent, dp, pp, tp, mb,
                                cp=cp, cp_kind=kind, ep=ep, sp=sp, etp=etp,
                            )  # fmt: skip
                            if why is not None:
                                continue
                            base = make_strategy(
                                cluster, extent, dp, pp, tp, mb, cp=cp, cp_kind=kind, ep=ep, sp=sp, etp=etp,
                                flex_dispatch=flex and ep > 1,
                            )  # fmt: skip
                            for vp in interleavings(cluster, spec, role, pp, mb) if interleave else [1]:
                                out.extend(
                                    s
                                    for s in engine_variants(
                                        base.variant(vp=vp), role, max_fraction, offload, overlap
                                    )
                                    if cluster.max_zero_stage is None or s.zero <= cluster.max_zero_stage
                                )
    return out


def interleavings(cluster: Cluster, model: ModelSpec, role: Role | None, pp: int, mb: int) -> list[int]:
    """The chunks per stage ``vp`` a directory lists for one layout (rules V1–V3): ``1``, and
    for training and inference with ``Pp > 1`` on engines that interleave the pipeline, every
    ``vp > 1`` dividing the ``L/Pp`` layers of a stage when ``Pp | mb``. None is dominated:
    a larger ``vp`` shortens the fill and drain ``(Pp − 1)/(vp·mb)`` but sends ``vp`` times the
    point-to-point messages, and keeps ``min(mb, Pp + (Pp − 1)/vp)`` stages' activations alive
    against plain 1F1B's ``min(mb, Pp)`` (``docs/cost-model.md`` §12)."""
    if pp == 1 or role is Role.GENERATION or not cluster.virtual_pipeline_parallel or mb % pp:
        return [1]
    return _divisors(model.layers // pp)


def _twin_microbatches(
    cluster: Cluster,
    model: ModelSpec,
    role: Role | None,
    sequences: int,
    extent: tuple[int, int, int],
    dp: int,
    pp: int,
    tp: int,
    cp: int,
    kind: str,
    sp: bool,
) -> set[int]:
    """The microbatch counts ``mb`` at which a context-parallel layout ``(Pd, Pp, Pt, Pc)`` of
    ``kind`` without expert parallelism is dominated by a twin the directory lists:
    ``(Pd·k, Pp, Pt, Pc/k)`` of the same kind (plain data parallelism for ``k = Pc``), ``k > 1``,
    legal at the same ``mb``. Empty for ``Pc = 1``, and for ``Pd = 1`` with ``Pp > 1``.

    Both put ``T = n·ℓ/(Pd·Pc·mb)`` tokens of each microbatch on a device, so their GEMMs, TP
    and PP messages, non-GEMM work, activations and logits are equal, and so is each device's
    attention core (``T·ℓ``-proportional: a CP rank computes ``1/Pc`` of the core of its
    ``n/(Pd·mb)`` sequences); ZeRO shards over the same ``Pd·Pc`` ranks. The context-parallel
    traffic grows with the degree (a ring's ``Pc − 1`` steps of ``T·c_kv`` bytes, Ulysses'
    latency ``(Pc − 1)·α`` at equal bytes; none without). With ``Pd > 1`` or ``Pp = 1`` the
    twin's groups span no slower tiers (its replicas of ``Pp·Pt·Pc/k`` devices sit inside the
    ``Pp·Pt·Pc`` ones, its data-parallel group spans the allocation either way). So each
    microbatch count keeps its least context parallelism, and context parallelism is listed only
    where it buys something: fewer sequences per microbatch than ``Pc`` ranks, where no layout
    with less reaches as few tokens per device (``docs/cost-model.md`` §10).
    """
    if cp == 1 or (dp == 1 and pp > 1):
        return set()
    out: set[int] = set()
    for k in _divisors(cp)[1:]:
        twin_dp, twin_cp = dp * k, cp // k
        if sequences % twin_dp:
            continue
        twin_kind = kind if twin_cp > 1 else "ring"
        out.update(
            mb
            for mb in microbatch_counts(role, pp, sequences // twin_dp)
            if mb not in out
            and check_strategy(
                cluster,
                model,
                role,
                sequences,
                extent,
                twin_dp,
                pp,
                tp,
                mb,
                cp=twin_cp,
                cp_kind=twin_kind,
                sp=sp,
            )
            is None
        )
    return out


def expert_degrees(cluster: Cluster, model: ModelSpec, role: Role | None, dp: int, cp: int) -> list[int]:
    """The expert-parallel degrees a directory lists for one layout (SPEC §15.2, rules E1–E2):
    ``1``, and for a mixture of experts on engines that run expert parallelism every ``Pe > 1``
    dividing both ``E`` and ``Pd·Pc`` (training, inference), or ``Pe = Pd`` when it divides
    ``E`` (generation: the engine's data-parallel ranks share the experts)."""
    if not (model.is_moe and cluster.expert_parallel):
        return [1]
    if role is Role.GENERATION:
        return [1] + ([dp] if dp > 1 and model.experts % dp == 0 else [])
    return [e for e in _divisors(dp * cp) if e == 1 or model.experts % e == 0]


def expert_layouts(
    cluster: Cluster, model: ModelSpec, role: Role | None, dp: int, cp: int, tp: int
) -> list[tuple[int, int | None]]:
    """The ``(Pe, etp)`` pairs a directory lists for one layout (SPEC §15.2, rules E1–E4): every
    degree of :func:`expert_degrees` with the experts split like the FFN (``etp`` ``None``), and
    for a mixture of experts in training or inference with ``Pt > 1`` on engines that run expert
    and sequence parallelism every ``Pe > 1`` dividing ``E`` and ``Pt·Pd·Pc`` with each expert whole on one
    rank (``etp = 1``, Megatron-core's MoE parallel folding). ``etp = 1`` at ``Pe = 1`` is legal
    (every tensor-parallel rank holds every expert whole) but not listed: it stores ``Pt`` times
    the routed experts of the default for the MoE blocks' tensor-parallel collectives, which
    ``Pe = Pt`` with ``etp = 1`` saves too at the default's expert memory."""
    out: list[tuple[int, int | None]] = [(ep, None) for ep in expert_degrees(cluster, model, role, dp, cp)]
    if tp == 1 or role is Role.GENERATION or not (model.is_moe and cluster.expert_parallel):
        return out
    if not cluster.sequence_parallel:  # rule E4: folded experts need each TP rank's own tokens
        return out
    return out + [(e, 1) for e in _divisors(tp * dp * cp) if e > 1 and model.experts % e == 0]


def head_exclusions(cluster: Cluster, model: ModelSpec, role: Role | None) -> list[str]:
    """The H1–H2 messages of every ``tp | Ng`` that ``model``'s heads exclude on the engine of
    ``role`` (empty when the heads allow every in-node degree)."""
    out = []
    for tp in _divisors(cluster.gpus_per_node):
        why = check_heads(model, role, tp)
        if why is not None:
            out.append(why)
    return out


def _rule(why: str) -> str:
    tag = why.split(":", 1)[0].split(" ", 1)[0]
    return tag if tag in RULE_TEXT else "other"


def explain_illegal(
    cluster: Cluster,
    model: ModelSpec,
    role: Role | None,
    sequences: int,
    sizes: Iterable[int] | None = None,
) -> str:
    """Why no layout of ``sizes`` GPUs (default: every legal allocation size) passes the rules.

    Every raw candidate ``(Pd, Pp, Pt, mb)`` with ``Pd·Pp·Pt = |σ|`` (``Pt``, ``Pp`` every divisor,
    ``mb`` every divisor of ``B_local`` or ``Pp`` when none qualifies) is checked with
    :func:`~rpeg.ir.plan.check_strategy`; the text counts the first rule each one breaks (in the
    order P1, H1, H2, P2, P3, P4, P5, P6, P8) and quotes the candidate that got furthest. Only for
    messages: it is not on the search path.

    Parameters
    ----------
    cluster
        The device space.
    model, role
        The invocation's model and role (its engine's head rules).
    sequences
        ``B·R``.
    sizes
        Allocation sizes to consider (a size with no legal shape counts as one P6 candidate).

    Returns
    -------
    str
        E.g. ``"all 4 candidates (dp,pp,tp,mb) break a rule: H1 (tp | heads) ×1, P2 (pp | layers,
        pp 1 or even) ×2, P3 (dp | B·R) ×1; nearest: (3,1,1) mb=1 — P3: dp=3 does not divide
        B·R=64"``; or ``""`` when some candidate is legal.
    """
    size_list = list(cluster.legal_sizes if sizes is None else sizes)
    counts: Counter[str] = Counter()
    nearest: tuple[int, str, str] | None = None
    for size in size_list:
        extent = cluster.shape_for_size(size)
        if extent is None:
            counts["P6"] += 1
            continue
        for tp in _divisors(size):
            for pp in _divisors(size // tp):
                dp = size // (tp * pp)
                mbs = [pp] if sequences % dp else microbatch_counts(role, pp, sequences // dp) or [pp]
                for mb in mbs:
                    why = check_strategy(cluster, model, role, sequences, extent, dp, pp, tp, mb)
                    if why is None:
                        return ""
                    rule = _rule(why)
                    counts[rule] += 1
                    rank = RULE_ORDER.index(rule) if rule in RULE_ORDER else -1
                    if nearest is None or rank > nearest[0]:
                        nearest = (rank, f"({dp},{pp},{tp}) mb={mb}", why)
    order = {r: i for i, r in enumerate(RULE_ORDER)}
    parts = [
        f"{r} ({RULE_TEXT[r]}) ×{n}" if r in RULE_TEXT else f"{r} ×{n}"
        for r, n in sorted(counts.items(), key=lambda rn: order.get(rn[0], len(order)))
    ]
    text = f"all {sum(counts.values())} candidates (dp,pp,tp,mb) break a rule: " + ", ".join(parts)
    if nearest is not None:
        text += f"; nearest: {nearest[1]} — {nearest[2]}"
    return text


def make_strategy(
    cluster: Cluster,
    extent: tuple[int, int, int],
    dp: int,
    pp: int,
    tp: int,
    mb: int,
    recompute: Recompute | str = Recompute.FULL,
    *,
    cp: int = 1,
    cp_kind: str = "ring",
    ep: int = 1,
    sp: bool = False,
    vp: int = 1,
    etp: int | None = None,
    ep_overlap: bool = False,
    flex_dispatch: bool = False,
) -> Strategy:
    """A :class:`Strategy` with its link tiers. Ranks are ordered tensor-parallel innermost,
    then context-parallel, pipeline and data-parallel (device ``t + Pt·(c + Pc·(p + Pp·d))`` of
    the allocation): the pipeline's inter-node boundaries span the tier of one replica's
    ``Pp·Pt·Pc`` consecutive devices; the DP group spans the allocation's tier; the CP group
    the tier of ``Pt·Pc`` consecutive devices; the EP group its ``Pe`` ranks of the ``Pd·Pc``
    group (context-parallel ones first), with ``etp = 1`` each one's tensor-parallel ranks too
    (:meth:`~rpeg.ir.plan.Strategy.expert_group_devices`). (Tiers depend only on the shape, so the first aligned
    origin stands for all.) ``recompute`` is the activation recomputation (default the neutral
    ``full``); ``cp``, ``cp_kind``, ``ep`` and ``sp`` are SPEC §15's parallelisms, ``etp`` the
    experts' tensor-parallel degree, ``ep_overlap`` whether the AlltoAlls overlap compute,
    ``flex_dispatch`` whether the flex dispatcher carries them, ``vp`` the interleaved pipeline's
    chunks per stage."""
    first = aligned_allocations(cluster, dp * pp * tp * cp)[0]
    devices = first.devices()

    def tier(indices: Iterable[int]) -> int:
        mask = 0
        for i in indices:
            mask |= 1 << devices[i]
        return cluster.tier_of_mask(mask)

    pp_tier = tier(range(pp * tp * cp))
    dp_tier = first.tier if dp > 1 else 0
    cp_tier = tier(range(tp * cp)) if cp > 1 else 0
    ep_tier = tier(expert_group_devices(tp, tp if etp is None else etp, cp, pp, ep)) if ep > 1 else 0
    return Strategy(
        tuple(extent),  # type: ignore[arg-type]
        dp,
        pp,
        tp,
        mb,
        pp_tier,
        dp_tier,
        Recompute(recompute),
        cp=cp,
        cp_kind=cp_kind,
        ep=ep,
        sp=sp,
        cp_tier=cp_tier,
        ep_tier=ep_tier,
        vp=vp,
        etp=etp,
        ep_overlap=ep_overlap,
        flex_dispatch=flex_dispatch,
    )


@dataclass
class Directory:
    """``Xcand(v)`` of one vertex.

    Attributes
    ----------
    vertex
        Vertex index.
    strategies
        Legal, isolated-memory-feasible strategies sorted by estimated isolated time.
    times
        Estimated isolated time of each strategy (seconds).
    dropped
        How many legal strategies the isolated-memory filter removed (with the generations
        whose memory fraction leaves no room for one sequence).
    smallest_isolated
        The least isolated memory among all legal strategies (bytes): how close the vertex
        comes to fitting when the directory is empty.
    dominated
        How many memory-feasible strategies were left out because another variant of the same
        degrees and ZeRO stage is at least as fast with no more transient memory (one of them
        strictly, or listed first).
    lean
        Whether this is a lean directory (:func:`lean_directory`): built because a deadline left
        no time for the full one, so the plans drawn from it are the best found in time, not
        over every candidate.
    """

    vertex: int
    strategies: list[Strategy]
    times: list[float]
    dropped: int
    smallest_isolated: float
    dominated: int = 0
    lean: bool = False

    def __len__(self) -> int:
        return len(self.strategies)

    def of_size(self, size: int) -> list[int]:
        """Indices of the strategies with ``|σ| = size`` (still sorted by time; memoised per
        strategy list, which the search replaces rather than edits when it restricts one)."""
        memo = self.__dict__.get("_of_size")
        if memo is None or memo[0] is not self.strategies:
            memo = self.__dict__["_of_size"] = (self.strategies, {})
        hit = memo[1].get(size)
        if hit is None:
            hit = memo[1][size] = [i for i, s in enumerate(self.strategies) if s.size == size]
        return list(hit)

    def fastest_layouts(self, k: int | None) -> list[int]:
        """Indices (still sorted by time) of the strategies whose layout
        (:meth:`~rpeg.ir.plan.Strategy.layout_key`: degrees, microbatches, ZeRO stage) is among
        the ``k`` fastest distinct layouts (all when ``k`` is ``None``): a layout comes with
        every engine variant the directory kept (recomputation, loss chunking, memory
        fraction, host offload), so restricting to ``k`` candidates never trades a layout for a variant of a
        faster one."""
        if k is None:
            return list(range(len(self.strategies)))
        ranked: dict[tuple, int] = {}
        for s in self.strategies:
            key = s.layout_key()
            if key not in ranked and len(ranked) < k:
                ranked[key] = len(ranked)
        return [i for i, s in enumerate(self.strategies) if s.layout_key() in ranked]

    def choices(self, cluster: Cluster, index: int) -> list[Choice]:
        """The strategy ``index`` at every aligned origin."""
        s = self.strategies[index]
        return [Choice(s, a) for a in aligned_allocations(cluster, s.size)]


_ALLOC_CACHE: dict[tuple, list[Allocation]] = {}


def aligned_allocations(cluster: Cluster, size: int) -> list[Allocation]:
    """Every aligned allocation of ``size`` devices on ``cluster`` (memoised per cluster shape)."""
    key = (cluster.shape, size)
    hit = _ALLOC_CACHE.get(key)
    if hit is None:
        hit = _ALLOC_CACHE[key] = cluster.allocations_of_size(size)
    return hit


#: Vertex directories :func:`build_directories` keeps for the process (least recently used out):
#: a vertex of a 64-GPU cluster lists about 4,000 strategies, about 1 MB (250 B a strategy).
DIRECTORY_CACHE = 64
_DIRECTORIES: KeyedCache[Directory] = KeyedCache(DIRECTORY_CACHE)


def directory_key(costs: Costs, vertex: int) -> tuple:
    """What the directory of ``vertex`` depends on: ``(cluster, model spec, model head, role,
    head, sequences, Lp, Lr, quantiles, reward, c_r, U)`` — every input of the legality rules
    (:func:`enumerate_strategies`) and of :class:`~rpeg.scoring.costs.Costs`' time, memory and
    runnability of one vertex."""
    v = costs.graph.vertices[vertex]
    inst = costs.graph.models[v.model]
    w = costs.workload
    return (
        costs.cluster,
        inst.spec,
        inst.head,
        v.role,
        v.head,
        v.sequences,
        w.prompt_len,
        w.response_len,
        w.quantiles,
        w.reward,
        w.reward_cost_s,
        w.mini_batches,
    )


def clear_directory_cache() -> None:
    """Forget the directories :func:`build_directories` kept."""
    _DIRECTORIES.clear()


def build_directories(costs: Costs, deadline: float | None = None, *, floor: bool = True) -> list[Directory]:
    """Build ``Xcand(v)`` for every vertex of ``costs.graph`` (SPEC §4, §14).

    The legal strategies (P1–P8, H1–H2 for the vertex's model on its engine, Z1–Z2; each layout
    with its engine variants, :func:`engine_variants`) are enumerated once per distinct
    ``(layers, heads, kv_heads, engine, B·R, training or not)``. Drops strategies the engine
    cannot start (a generation whose cache holds no full-length sequence,
    :meth:`~rpeg.scoring.costs.Costs.runnable`) or whose isolated memory exceeds ``M_eff``
    (joint infeasibility is left to the penalty); then every variant another variant of the
    same degrees and ZeRO stage dominates (time ``≤`` and transient memory ``≤``, one strictly
    or listed first: it can never be the better pick); adds, for each plain-1F1B strategy kept,
    its fastest interleaved twin (:func:`fastest_interleaving`, ``vp > 1``; the twins of one
    ``vp`` filtered the same way among themselves); and sorts the rest by the unsplit OP time
    of the cost model. A slower variant that needs less memory is kept: whether it is needed
    depends on what else shares the devices.

    Host-offload variants (``cluster.host_offload``, SPEC §14.4) are not enumerated and
    filtered like the rest: each is its resident twin with ``S`` bytes moved from persistent
    to transient memory and ``2·S/BW_host`` of transfers, ``S`` fixed by the twin's degrees and
    ZeRO stage. So its isolated footprint and runnability are the twin's, and within one
    group it is dominated exactly when its twin is: the directory lists the offloading twin of
    every resident variant it keeps (``dropped`` and ``dominated`` count both): what enumerating
    both and filtering would keep, but for ties the rounding of the shifted sums could decide,
    for half the work.

    A vertex's directory depends only on :func:`directory_key` (the cluster, the vertex's
    model, role, head and sequences, and the workload's lengths, reward and updates), so the
    last :data:`DIRECTORY_CACHE` built are kept for the process and every later call with the
    same key gets a copy (the baselines, each structure of a search and the exact models of one
    ``solve`` ask for the same vertices; :func:`clear_directory_cache` empties it).

    With a ``deadline`` (a ``time.monotonic()`` instant: a method's time limit), every vertex
    whose directory is not kept first gets its *lean* directory (:func:`lean_directory`: a few
    strategies per parallel layout, no interleaved twins; a third to two thirds of the work), so
    that each vertex has candidates whatever the time; then the full
    directories are built one vertex after another, each replacing its lean one, until the
    deadline passes (a build it interrupts is dropped). Lean directories are marked
    (:attr:`Directory.lean`) and kept too, so the other structures of one ``solve`` share
    them; a later call with time left (or without a deadline) replaces a kept lean directory
    with the full one. Without a deadline every directory is full.

    The lean directories are the *floor*: built whatever the time, so that a plan exists. With
    ``floor=False`` they stop at the deadline too (:class:`TimeUp`): for a caller with
    candidates already (a search's later structures), for which a late floor is not worth
    overrunning the limit.

    Raises
    ------
    TimeUp
        With ``floor=False``, when ``deadline`` passes before every vertex has a directory.
    """
    n = len(costs.graph.vertices)
    keys = [directory_key(costs, vi) for vi in range(n)]
    by_shape: dict[tuple, list[Strategy]] = {}
    found: dict[tuple, Directory] = {}
    for key in keys:
        if key not in found and (hit := _DIRECTORIES.peek(key)) is not None:
            found[key] = hit
    # each key once, at its first vertex: those without a full directory yet
    missing = [
        (vi, key)
        for vi, key in enumerate(keys)
        if keys.index(key) == vi and (key not in found or found[key].lean)
    ]
    if deadline is not None:
        for vi, key in missing:
            if key not in found:
                found[key] = lean_directory(costs, vi, by_shape, None if floor else deadline)
                _DIRECTORIES.put(key, found[key])
    for vi, key in missing:
        if past_deadline(deadline, 0):
            break  # the rest keep their lean directories
        full = _build_directory(costs, vi, by_shape, deadline)
        if full is None:  # the deadline passed while it was built
            break
        found[key] = full
        _DIRECTORIES.put(key, full)
    # the caller's own copy, for its vertex (the search restricts its lists in place)
    return [
        dataclasses.replace(
            found[key], vertex=vi, strategies=list(found[key].strategies), times=list(found[key].times)
        )
        for vi, key in enumerate(keys)
    ]


def lean_message(costs: Costs, dirs: Iterable[Directory]) -> str:
    """What a result says when some of ``dirs`` are lean (:attr:`Directory.lean`), naming their
    vertices (:func:`lean_note`); ``""`` when none is."""
    return lean_note([costs.graph.vertices[d.vertex].name for d in dirs if d.lean])


def lean_note(names: Sequence[str], what: str = "candidate directories") -> str:
    """What a result says when the time limit left ``names`` (vertices, or the DP's
    model-stages with ``what="frontiers"``) with lean candidates; ``""`` when none."""
    if not names:
        return ""
    return (
        f"the time limit left no time to build the full {what} of {', '.join(names)}: they hold only "
        "a few strategies per parallel layout (the leanest that fits, the fast-end engine variant at the "
        "fewest and the most microbatches that fit, a generation's memory fractions; no interleaved "
        "pipelines), so the plan is the best found over those, not over every candidate"
    )


#: Share of the time limit of ``cpsat`` and ``milp`` that their candidate directories may take:
#: past it, the vertices not yet built keep lean directories (:func:`build_directories`), so
#: the engine has at least the other half for its model. ``greedy``, ``concurrent`` and ``sa``
#: give the directories the whole limit, ``dp`` its frontiers 80 %
#: (:data:`~rpeg.solvers.dp.FRONTIER_SHARE`).
BUILD_SHARE = 0.5

#: Strategies a directory build scores between two looks at the clock (a strategy takes about
#: 0.1 ms: a look every few milliseconds).
DEADLINE_STRIDE = 64


class TimeUp(Exception):
    """A deadline passed before a piece of work that has no partial result was complete (a
    directory, a baseline's memory repair): not a verdict on feasibility."""


def past_deadline(deadline: float | None, i: int) -> bool:
    """Whether ``deadline`` has passed, looked at on every :data:`DEADLINE_STRIDE`-th ``i``."""
    return deadline is not None and i % DEADLINE_STRIDE == 0 and time.monotonic() >= deadline


def _legal(costs: Costs, vi: int, by_shape: dict[tuple, list[Strategy]]) -> list[Strategy]:
    """The legal strategies of vertex ``vi`` (plain 1F1B, resident), enumerated once per shape
    of one :func:`build_directories` call (``by_shape``)."""
    v = costs.graph.vertices[vi]
    spec = costs.graph.models[v.model].spec
    # inference and training share an engine but not the recomputation modes
    key = (
        spec.layers,
        spec.heads,
        spec.kv_heads,
        spec.experts,
        engine_of(v.role),
        v.sequences,
        v.role is Role.TRAINING,
    )
    if key not in by_shape:
        by_shape[key] = enumerate_strategies(
            costs.cluster, spec, v.sequences, v.role, offload=False, interleave=False
        )
    return by_shape[key]


def _build_directory(
    costs: Costs, vi: int, by_shape: dict[tuple, list[Strategy]], deadline: float | None = None
) -> Directory | None:
    """The directory of vertex ``vi`` (:func:`build_directories`, uncached); ``by_shape`` keeps
    the legal strategies of each shape for the other vertices of the same call. ``None`` when
    ``deadline`` passed before it was complete."""
    cluster = costs.cluster
    m_eff = cluster.hardware.m_eff
    kept: list[tuple[float, int, Strategy]] = []
    smallest = float("inf")
    dropped = 0
    for j, s in enumerate(_legal(costs, vi, by_shape)):
        if past_deadline(deadline, j):
            return None
        iso = costs.memory(vi, s).isolated
        smallest = min(smallest, iso)
        if iso > m_eff or not costs.runnable(vi, s):
            dropped += 1  # its interleaved twins keep at least its activations
            continue
        kept.append((costs.op_time(vi, s), 2 * j, s))
    kept, dominated = _undominated_modes(costs, vi, kept)
    # each undominated plain-1F1B strategy's fastest interleaved twin, listed after it
    twins = []
    for i, (_, j, s) in enumerate(kept):
        if past_deadline(deadline, i):
            return None
        if twin := fastest_interleaving(costs, vi, s):
            twins.append((twin[0], j + 1, twin[1]))
    if twins:
        twins, more = _undominated_modes(costs, vi, twins)
        kept += twins
        dominated += more
    return _directory(costs, vi, kept, dropped, smallest, dominated, lean=False)


def _directory(
    costs: Costs,
    vi: int,
    kept: list[tuple[float, int, Strategy]],
    dropped: int,
    smallest: float,
    dominated: int,
    lean: bool,
) -> Directory:
    """The :class:`Directory` of ``kept`` ``(time, order, strategy)`` with each one's
    host-offload twin where the engines offload (SPEC §14.4; counts doubled), sorted by time."""
    if costs.cluster.host_offload:
        dropped, dominated = 2 * dropped, 2 * dominated
        twins = [(j, s.variant(offload=True)) for _, j, s in kept]
        kept += [(costs.op_time(vi, s), j, s) for j, s in twins]
    kept.sort(key=lambda x: (x[0], x[1], x[2].offload))
    return Directory(vi, [s for _, _, s in kept], [t for t, _, _ in kept], dropped, smallest, dominated, lean)


def degree_group(s: Strategy) -> tuple:
    """What the strategies of one parallel layout share whatever their microbatch count and
    engine variant (:func:`engine_variants`: ZeRO stage, recomputation, loss chunking, memory
    fraction, AlltoAll overlap, host offload): shape, degrees, context-parallel kind,
    expert tensor parallelism, sequence parallelism, chunks per stage and the dispatcher."""
    return (s.extent, s.dp, s.pp, s.tp, s.cp, s.cp_kind, s.ep, s.etp, s.sp, s.vp, s.flex_dispatch)


def lean_groups(strategies: list[Strategy]) -> list[list[int]]:
    """The indices of ``strategies`` grouped by :func:`degree_group`, groups in first-listed
    order, indices ascending."""
    groups: dict[tuple, list[int]] = {}
    for j, s in enumerate(strategies):
        groups.setdefault(degree_group(s), []).append(j)
    return list(groups.values())


def lean_picks(fitting: list[tuple[float, int, int]], generation: bool) -> list[int]:
    """The indices a lean directory keeps of one group of degrees (:func:`lean_groups`), given
    its strategies that fit as ``(memory, mb, index)`` in listed order: the one of least memory
    (the first listed of equals) and, at the fewest and at the most microbatches that fit, the
    variant at the fast end of :func:`engine_variants`' order (no recomputation, whole loss,
    ZeRO 2 first). A generation keeps every memory fraction that fits at its fewest
    microbatches instead (the fraction is what lets it share devices). None when none fits."""
    if not fitting:
        return []
    least = min(fitting, key=lambda x: (x[0], x[2]))[2]
    fewest = min(mb for _, mb, _ in fitting)
    if generation:
        return sorted({least} | {j for _, mb, j in fitting if mb == fewest})
    most = max(mb for _, mb, _ in fitting)
    ends = {next(j for _, mb, j in fitting if mb == n) for n in (fewest, most)}
    return sorted({least} | ends)


def lean_directory(
    costs: Costs, vi: int, by_shape: dict[tuple, list[Strategy]] | None = None, deadline: float | None = None
) -> Directory:
    """The lean directory of vertex ``vi``: what :func:`build_directories` lists while a
    deadline leaves no time for the full one (:attr:`Directory.lean`).

    Per group of degrees (:func:`degree_group`: extent, ``Pd``, ``Pp``, ``Pt``, ``Pc`` and its
    kind, ``Pe``, ``Pet``, sequence parallelism), of its strategies that fit ``M_eff`` alone and
    start, those :func:`lean_picks` keeps: the one of least isolated memory, and at the fewest
    and at the most microbatches that fit, the variant at the fast end (no recomputation, whole
    loss, ZeRO 2); for a generation, every memory fraction at its fewest microbatches. No
    interleaved twins. So the lean directory is empty only when the full one is, and wherever
    degrees of the full one fit alone, so does a lean strategy of the same degrees. Every
    strategy's memory is computed, the time of a few per group of degrees (the full build times
    every strategy that fits and scans the interleavings). ``dropped`` counts the strategies
    that do not fit or start; ``dominated`` is 0.

    Raises
    ------
    TimeUp
        When ``deadline`` (a ``time.monotonic()`` instant; ``None``: none) passes first.
    """
    m_eff = costs.cluster.hardware.m_eff
    legal = _legal(costs, vi, by_shape if by_shape is not None else {})
    generation = costs.graph.vertices[vi].role is Role.GENERATION
    smallest = float("inf")
    dropped = 0
    kept: list[tuple[float, int, Strategy]] = []
    for k, group in enumerate(lean_groups(legal)):
        if past_deadline(deadline, k):
            raise TimeUp(f"the deadline passed while the lean directory of vertex {vi} was built")
        fitting: list[tuple[float, int, int]] = []
        for j in group:
            iso = costs.memory(vi, legal[j]).isolated
            smallest = min(smallest, iso)
            if iso <= m_eff and costs.runnable(vi, legal[j]):
                fitting.append((iso, legal[j].mb, j))
            else:
                dropped += 1
        for j in lean_picks(fitting, generation):
            kept.append((costs.op_time(vi, legal[j]), 2 * j, legal[j]))
    return _directory(costs, vi, kept, dropped, smallest, 0, lean=True)


def fastest_interleaving(costs: Costs, vertex: int, plain: Strategy) -> tuple[float, Strategy] | None:
    """The interleaved twin (``vp > 1``, :func:`interleavings`) of a plain-1F1B strategy that a
    directory lists: the fastest that fits ``M_eff`` alone and starts, with its time; ``None``
    when none does (or the layout has no interleaving) — :func:`scan_interleavings` with the
    vertex's OP time.
    """
    v = costs.graph.vertices[vertex]
    m_eff = costs.cluster.hardware.m_eff

    def time_if_it_fits(s: Strategy) -> float | None:
        if costs.memory(vertex, s).isolated > m_eff or not costs.runnable(vertex, s):
            return None
        return costs.op_time(vertex, s)

    return scan_interleavings(costs.cluster, costs.graph.models[v.model].spec, v.role, plain, time_if_it_fits)


def scan_interleavings(
    cluster: Cluster,
    model: ModelSpec,
    role: Role | None,
    plain: Strategy,
    time_of: Callable[[Strategy], float | None],
) -> tuple[float, Strategy] | None:
    """The interleaved twin of ``plain`` of least ``time_of`` (``None``: it does not fit or
    start) and that time, scanning :func:`interleavings` in ascending ``vp``; ``None`` when none
    fits.

    The twins of one strategy hold the same weights; with ``Pv`` chunks per stage the time is
    ``A + B/Pv + C·Pv`` (the fill and drain and the per-layer slots shrink, the pipeline's
    messages grow), convex in ``Pv``, so the scan stops at the first that is not faster. Their
    activations, ``min(Pv·mb, (Pv + 1)·Pp − 1)/Pv`` stages' worth
    (:func:`~rpeg.costmodel.memory.pipeline_alive`), do not grow with ``Pv``, so a twin that does
    not fit is skipped, not a stop; a larger ``Pv`` than the fastest saves at most
    ``(Pp − 1)/Pv`` stages' worth of activations (a fraction ``(Pp − 1)/(Pp·Pv)`` of plain
    1F1B's) for more time, and is not listed (``docs/cost-model.md`` §12).
    """
    best: tuple[float, Strategy] | None = None
    for vp in interleavings(cluster, model, role, plain.pp, plain.mb)[1:]:
        s = plain.variant(vp=vp)
        t = time_of(s)
        if t is None:
            continue
        if best is not None and t >= best[0]:
            break
        best = (t, s)
    return best


def _undominated_modes(
    costs: Costs, vertex: int, kept: list[tuple[float, int, Strategy]]
) -> tuple[list[tuple[float, int, Strategy]], int]:
    """``kept`` without the variants another variant of the same degrees, ZeRO stage and host
    offload dominates in ``(time, transient memory)``, and how many were removed.

    Variants of one ``(extent, Pd, Pp, Pt, Pc, Pe, Pv, z, offload)`` (microbatches, recomputation,
    ring or Ulysses attention, loss
    chunking, memory fraction, packing) hold the same persistent state and layers (``Pv`` is part
    of the layout: two vertices of one model at different ``Pv`` reshard), so the one with no more
    time and no more transient memory is never the worse pick wherever it sits; of variants
    equal in both, the first listed stays."""
    by_group: dict[tuple, list[tuple[float, float, int]]] = {}
    for t, j, s in kept:
        key = (s.extent, s.dp, s.pp, s.tp, s.cp, s.ep, s.vp, s.zero, s.offload)
        by_group.setdefault(key, []).append((t, costs.memory(vertex, s).transient, j))
    out = []
    for item in kept:
        t, j, s = item
        m = costs.memory(vertex, s).transient
        rivals = by_group[(s.extent, s.dp, s.pp, s.tp, s.cp, s.ep, s.vp, s.zero, s.offload)]
        if any(t2 <= t and m2 <= m and (t2 < t or m2 < m or j2 < j) for t2, m2, j2 in rivals if j2 != j):
            continue
        out.append(item)
    return out, len(kept) - len(out)
