"""Execution time of OP, COMM and RESHARD nodes (SPEC §6, paper Appendix D-A to D-G).

An OP node's time is ``T = T_gemm + T_bubble + T_tp + T_pp + T_dp + T_nongemm + T_opt + T_over``
(:class:`TimeBreakdown`), computed by :func:`op_time` from the model, the invocation's role, its
parallel :class:`Layout` and the :class:`~rpeg.ir.hardware.Hardware` figures. COMM and RESHARD
nodes use :func:`comm_time` and :func:`reshard_time`; :func:`publication_bytes` is the payload of
a weight publication between two allocations. Every formula is derived in
``docs/cost-model.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.hardware import Hardware, Link
from ..ir.models import ModelSpec
from ..ir.types import Head, Recompute, Role
from .collectives import (
    allgather_time,
    allreduce_time,
    alltoall_time,
    p2p_time,
    reduce_scatter_time,
)
from .flops import decode_flops, inference_flops, prefill_flops, training_flops, training_passes
from .layout import Layout, check_tier, positive_int
from .memory import kv_width_per_device, model_params

__all__ = [
    "OPTIMIZER_TRAFFIC_BYTES",
    "TimeBreakdown",
    "comm_time",
    "op_time",
    "publication_bytes",
    "reshard_time",
]

#: Effective HBM bytes moved per parameter by one Adam update (SPEC §6, paper Appendix C-B3).
OPTIMIZER_TRAFFIC_BYTES = 18


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """The terms of an OP node's time, in seconds (SPEC §6).

    Parameters
    ----------
    gemm
        ``T_gemm = W/(P·F_eff)`` (prefill and decode summed for generation).
    bubble
        ``T_bubble = T_gemm·(mb + Pp − 1)/mb − T_gemm``, the 1F1B fill and drain.
    tp_comm, pp_comm, dp_comm
        Tensor-parallel AllReduces, pipeline P2P transfers, ZeRO-2 ReduceScatter + AllGather.
    nongemm
        ``T_nongemm``, residual non-GEMM work that tensor parallelism does not shrink.
    opt
        ``T_opt``, the bandwidth-bound Adam update.
    overhead
        ``T_over``, the engine's fixed costs (docs/cost-model.md §2 "Engine terms"): per call,
        per layer pass, per decode step, the weight sync into a generation engine, and the
        controller's dispatch; 0 with a preset's neutral terms.
    """

    gemm: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm: float
    nongemm: float
    opt: float
    overhead: float = 0.0

    @property
    def comm(self) -> float:
        """``T_comm = T_tp + T_pp + T_dp``."""
        return self.tp_comm + self.pp_comm + self.dp_comm

    @property
    def total(self) -> float:
        """``T = T_gemm + T_bubble + T_comm + T_nongemm + T_opt + T_over``."""
        return self.gemm + self.bubble + self.comm + self.nongemm + self.opt + self.overhead


class _Roofline:
    """``F_eff = min(F_peak·η, I·BW_mem)`` for one invocation (SPEC §6, paper Appendix D-A).

    ``η = (b·ℓ/(b·ℓ + γM))·(k/(k + γK))`` with ``k = min(d, dff)/Pt``; the intensity
    ``I = W_dev/(Ω_W + Ω_A)`` with ``Ω_W = (L/Pp)·W_layer·sb/Pt`` and
    ``Ω_A = 2·b·ℓ·d·sb·L/Pp`` (+ KV-cache reads for decode) per device and microbatch.
    """

    __slots__ = ("b", "eta_k", "hw", "layers", "model", "omega_w")

    def __init__(self, model: ModelSpec, layout: Layout, hw: Hardware, b: float) -> None:
        self.model = model
        self.hw = hw
        self.b = b
        s = layout.strategy
        self.layers = model.layers / s.pp
        k = min(model.hidden, model.ffn_hidden) / s.tp
        self.eta_k = k / (k + hw.gamma_k)
        self.omega_w = self.layers * model.layer_params * model.dtype_bytes / s.tp

    def flops(self, work_per_device: float, tokens: float, extra_bytes: float = 0.0) -> float:
        """``F_eff`` for ``work_per_device`` FLOPs per microbatch over ``ℓ = tokens``."""
        rows = self.b * tokens
        eta = rows / (rows + self.hw.gamma_m) * self.eta_k
        omega_a = 2.0 * rows * self.model.hidden * self.model.dtype_bytes * self.layers
        intensity = work_per_device / (self.omega_w + omega_a + extra_bytes)
        return min(self.hw.peak_flops * eta, intensity * self.hw.mem_bandwidth)


def _pp_step_time(nbytes: float, layout: Layout, hw: Hardware) -> float:
    """One pipeline transfer, boundaries apportioned by kind (paper Appendix D-D).

    ``(n_intra/(Pp−1))·P2P(M, tier 0) + (n_inter/(Pp−1))·P2P(M, tier max(pp_tier, 1))``.
    """
    n_intra, n_inter = layout.pp_boundaries
    n = layout.strategy.pp - 1
    t = n_intra / n * p2p_time(nbytes, hw.p2p[0])
    if n_inter:
        t += n_inter / n * p2p_time(nbytes, hw.p2p[max(layout.strategy.pp_tier, 1)])
    return t


def op_time(
    model: ModelSpec,
    role: Role,
    layout: Layout,
    hw: Hardware,
    *,
    sequences: float,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
    decode: tuple[int, int] | None = None,
    prefill: bool = True,
) -> TimeBreakdown:
    """Predicted time of one OP node (SPEC §6).

    With ``n = sequences``, ``b = n/(Pd·mb)``, ``P = Pd·Pp·Pt``, ``ℓ = Lp + Lr``, ``sb`` the
    model's bytes per scalar and ``N_m`` its parameters (:func:`~.memory.model_params`):

    * ``T_gemm = W/(P·F_eff)`` with ``W`` from :mod:`.flops` and ``F_eff`` the roofline
      ``min(F_peak·η, I·BW_mem)``; ``I`` uses one forward-equivalent per microbatch (training:
      ``W_T/(f·P·mb)``, ``f`` the forward-equivalents of the strategy's recomputation mode,
      :func:`~.flops.training_passes`: 4 ``full``, 3 ``none``, 3 + the attention core's share
      ``selective``). Generation sums prefill (``ℓ = Lp``) and decode (``ℓ = 1``, KV-cache
      reads ``b·c̄·2·d_kv,local·sb·L/Pp`` per step at mean context ``c̄``), each with its own
      ``F_eff``.
    * ``T_bubble = T_gemm·(Pp − 1)/mb`` (the 1F1B multiplier ``(mb + Pp − 1)/mb`` minus one).
    * ``T_tp``: ``2·(L/Pp)·mb`` AllReduces (training ``6·(L/Pp)·mb`` under
      ``full`` recomputation, ``4·(L/Pp)·mb`` under ``none``/``selective``) of ``n·ℓ·d·sb/(Pd·mb)``
      over ``Pt`` at tier 0; generation: prefill as inference at ``ℓ = Lp`` plus
      ``2·(L/Pp)·r`` decode AllReduces of ``n·d·sb/Pd``, ``r = t1 − max(t0, 1)`` (``Lr − 1`` for
      the whole response: the first response token comes out of the prefill).
    * ``T_pp`` (``Pp > 1``): ``mb + Pp − 2`` (inference, prefill) or ``mb + 2Pp − 3`` (training)
      P2P steps of ``n·ℓ·d·sb/(Pd·Pt·mb)``, each apportioned between the ``n_intra`` intra-node
      boundaries (tier 0) and the ``n_inter`` inter-node ones (tier ``max(pp_tier, 1)``);
      decode adds ``r·(mb + Pp − 2)`` steps at ``ℓ = 1``.
    * ``T_dp`` (training): ReduceScatter + AllGather of ``N_m·sb/(Pp·Pt)`` over ``Pd`` at
      ``dp_tier`` — with the training engine's own data-parallel link
      (:meth:`Hardware.data_parallel <rpeg.ir.hardware.Hardware.data_parallel>`, measured between
      the ranks of one host) for intra-node data parallelism where the hardware has one.
    * ``T_nongemm = f·(L/Pp)·c_ng·(1 − 1/Pt)·(mb·b·ℓ·d)/(B_cal·ℓ_cal·d_cal)``: the tokens·width
      one device processes over all its microbatches, relative to the calibration's; ``f`` is
      1 for inference and the forward-equivalents of the recomputation mode for training
      (:func:`~.flops.training_passes`), 0 for generation.
    * ``T_opt = 18·N_m/(P·BW_mem)`` for training.
    * ``T_over`` — the engine terms ``e`` of the node's class (:meth:`Hardware.terms
      <rpeg.ir.hardware.Hardware.terms>`; neutral in presets, so ``T_over = 0`` there):
      ``T_gemm`` is divided by ``η_e``, and inference and training add
      ``c_call + f·(mb + Pp − 1)·(L/Pp)·c_layer``; generation adds a call, ``(mb + Pp − 1)·
      (c_step + (L/Pp)·c_layer)`` per prefill and per decode step, and a weight sync
      ``α_sync + N_m·sb·β_sync`` with the prefill. Every node adds the controller's
      ``dispatch_s``.

    Parameters
    ----------
    model
        The invoked model.
    role
        Generation, inference or training.
    layout
        Parallel layout and tiers.
    hw
        Hardware figures.
    sequences
        ``n``: sequences processed by this node (``B·R``, or the still-running fraction for a
        response-length phase); may be fractional.
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s) evaluated.
    decode
        Generation only: the window ``(t0, t1)`` of response positions decoded by this node;
        default ``(0, Lr)``.
    prefill
        Generation only: whether this node also runs the prefill over ``Lp``.

    Returns
    -------
    TimeBreakdown
        The terms; ``.total`` is the node's duration in seconds.

    Raises
    ------
    ValueError
        For negative sizes, an empty teacher-forced sequence, a decode window outside
        ``[0, Lr]`` or a decode window given to a non-generation role.
    """
    role = Role(role)
    head = Head(head)
    _check_op_args(role, sequences, prompt_len, response_len, decode)
    node = _Node(model, layout, hw, sequences)
    t_dp = t_opt = t_nongemm = 0.0
    if role is Role.GENERATION:
        t0, t1 = (0, response_len) if decode is None else decode
        if not 0 <= t0 <= t1 <= response_len:
            raise ValueError(
                f"op_time: decode window must satisfy 0 ≤ t0 ≤ t1 ≤ response_len={response_len}, "
                f"got {decode!r}"
            )
        t_gemm, t_tp, t_pp, t_over = _generation_terms(node, prompt_len, (t0, t1), prefill, head)
    else:
        lengths = {"sequences": sequences, "prompt_len": prompt_len, "response_len": response_len}
        if role is Role.TRAINING:
            t_gemm, t_tp, t_pp, t_dp, t_opt = _training_terms(node, lengths, head)
        else:
            t_gemm, t_tp, t_pp = _inference_terms(node, lengths, head)
        s = layout.strategy
        ell = prompt_len + response_len
        passes = training_passes(model, s.recompute, ell, head) if role is Role.TRAINING else 1.0
        terms = hw.terms(role.value)
        t_gemm /= terms.efficiency
        t_nongemm = passes * node.layers * hw.c_nongemm * (1.0 - 1.0 / s.tp) * node.nongemm_scale(ell)
        t_over = terms.per_call_s + passes * node.slots * node.layers * terms.per_layer_s

    return TimeBreakdown(
        gemm=t_gemm,
        bubble=t_gemm * (layout.strategy.pp - 1) / layout.strategy.mb,
        tp_comm=t_tp,
        pp_comm=t_pp,
        dp_comm=t_dp,
        nongemm=t_nongemm,
        opt=t_opt,
        overhead=t_over + hw.dispatch_s,
    )


def _check_op_args(
    role: Role, sequences: float, prompt_len: int, response_len: int, decode: tuple[int, int] | None
) -> None:
    """The size and decode-window checks of :func:`op_time` (its Raises section)."""
    if not sequences >= 0:
        raise ValueError(f"op_time: sequences must be non-negative, got {sequences!r}")
    if prompt_len < 0 or response_len < 0:
        raise ValueError(
            f"op_time: prompt_len and response_len must be non-negative, got {prompt_len!r}, {response_len!r}"
        )
    if decode is not None and role is not Role.GENERATION:
        raise ValueError(f"op_time: decode window {decode!r} given for role {role.value!r}")
    ell = prompt_len + response_len
    if role is not Role.GENERATION and ell < 1:
        raise ValueError(f"op_time: {role.value} needs prompt_len + response_len ≥ 1, got {ell}")


class _Node:
    """One OP node's sizes and the three per-round costs :func:`op_time` sums (SPEC §6).

    With ``n = sequences``, ``b = n/(Pd·mb)``, ``P = Pd·Pp·Pt`` and ``L/Pp`` layers per stage:
    :meth:`gemm` is ``W/(P·F_eff)``, :meth:`tp_rounds` ``count`` AllReduces over ``Pt`` at tier 0,
    :meth:`pp_rounds` ``count`` pipeline P2P steps of ``n·ℓ·d·sb/(Pd·Pt·mb)``.
    """

    __slots__ = ("b", "hw", "layers", "layout", "model", "n_devices", "roof", "s", "sequences", "slots")

    def __init__(self, model: ModelSpec, layout: Layout, hw: Hardware, sequences: float) -> None:
        s = layout.strategy
        self.model = model
        self.layout = layout
        self.s = s
        self.hw = hw
        self.sequences = sequences
        self.n_devices = s.size
        self.layers = model.layers / s.pp
        self.b = sequences / (s.dp * s.mb)
        self.roof = _Roofline(model, layout, hw, self.b)
        self.slots = s.mb + s.pp - 1  # stage-microbatch slots on the 1F1B critical path

    def nongemm_scale(self, tokens: float) -> float:
        """``mb·b·ℓ·d/(B_cal·ℓ_cal·d_cal)``: the tokens·width one device's non-GEMM work covers,
        relative to the calibration's."""
        hw = self.hw
        return self.s.mb * self.b * tokens * self.model.hidden / (hw.b_cal * hw.l_cal * hw.d_cal)

    def gemm(self, work: float, work_per_device: float, tokens: float, extra: float = 0.0) -> float:
        """``T_gemm = W/(P·F_eff)`` of ``work`` FLOPs (0 for no work)."""
        if work <= 0.0:
            return 0.0
        return work / (self.n_devices * self.roof.flops(work_per_device, tokens, extra))

    def tp_rounds(self, count: float, nbytes: float, link: Link | None = None) -> float:
        """``count`` tensor-parallel AllReduces of ``nbytes`` over ``Pt`` at tier 0 (on ``link``
        when given: an engine's own; else the tier-0 collective link)."""
        return count * allreduce_time(self.s.tp, nbytes, link or self.hw.collective[0])

    def pp_rounds(self, count: float, tokens: float) -> float:
        """``count`` pipeline steps of ``n·tokens·d·sb/(Pd·Pt·mb)`` bytes (0 without pipelining)."""
        s = self.s
        if s.pp == 1 or count <= 0:
            return 0.0
        nbytes = self.sequences * tokens * self.model.hidden * self.model.dtype_bytes / (s.dp * s.tp * s.mb)
        return count * _pp_step_time(nbytes, self.layout, self.hw)


def _generation_terms(
    node: _Node, prompt_len: int, window: tuple[int, int], prefill: bool, head: Head
) -> tuple[float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_over)`` of a generation node: the prefill over ``Lp`` (when
    ``prefill``) plus the decode steps ``t0..t1`` (:func:`op_time`'s docstring has the formulas).

    With the engine's prefill and decode terms ``e_p, e_d`` (neutral in presets), prefill GEMMs
    run at ``η_p·F_eff`` and decode GEMMs at ``η_d·F_eff``; ``T_over`` is one call
    (``c_call,p`` with a prefill, else ``c_call,d``), plus ``(mb + Pp − 1)·(c_step + (L/Pp)·c_layer)``
    for the prefill and for each of the ``t1 − t0`` decode steps, plus, with a prefill, one weight
    sync ``α_sync + N_m·sb·β_sync`` when the engine has a sync link.
    """
    model, s, sequences = node.model, node.s, node.sequences
    P, mb, pp, dp, tp = node.n_devices, s.mb, s.pp, s.dp, s.tp
    sb, d, layers = model.dtype_bytes, model.hidden, node.layers
    t0, t1 = window
    steps = t1 - t0
    rounds = max(0, t1 - max(t0, 1))  # decode steps whose input token is a decoded one
    hw = node.hw
    pre, dec = hw.terms("prefill"), hw.terms("decode")
    tp_link = hw.tensor_parallel()  # the generation engine's own AllReduce, when calibrated
    t_gemm = t_tp = t_pp = 0.0
    t_over = pre.per_call_s if prefill else dec.per_call_s
    if prefill and prompt_len > 0:
        w = prefill_flops(model, sequences=sequences, prompt_len=prompt_len, head=head)
        t_gemm += node.gemm(w, w / (P * mb), prompt_len) / pre.efficiency
        t_over += node.slots * (pre.per_step_s + layers * pre.per_layer_s)
        sync = hw.weight_sync()
        if sync is not None:
            t_over += sync.alpha + model_params(model, head) * sb * sync.beta
        t_tp += node.tp_rounds(2 * layers * mb, sequences * prompt_len * d * sb / (dp * mb), tp_link)
        t_pp += node.pp_rounds(mb + pp - 2, prompt_len)
    if steps > 0:
        w = decode_flops(model, sequences=sequences, prompt_len=prompt_len, window=(t0, t1), head=head)
        context = prompt_len + 0.5 * (t0 + t1)
        kv_reads = node.b * context * 2 * kv_width_per_device(model, tp) * sb * layers
        t_gemm += node.gemm(w, w / (P * mb * steps), 1, kv_reads) / dec.efficiency
        t_over += steps * node.slots * (dec.per_step_s + layers * dec.per_layer_s)
        t_tp += node.tp_rounds(2 * layers * rounds, sequences * d * sb / dp, tp_link)
        t_pp += node.pp_rounds(rounds * (mb + pp - 2), 1)
    return t_gemm, t_tp, t_pp, t_over


def _inference_terms(node: _Node, lengths: dict[str, float], head: Head) -> tuple[float, float, float]:
    """``(T_gemm, T_tp, T_pp)`` of a teacher-forced inference node over ``ℓ = Lp + Lr``."""
    model, s, sequences = node.model, node.s, node.sequences
    ell = lengths["prompt_len"] + lengths["response_len"]
    w = inference_flops(model, head=head, **lengths)  # type: ignore[arg-type]
    t_gemm = node.gemm(w, w / (node.n_devices * s.mb), ell)
    t_tp = node.tp_rounds(
        2 * node.layers * s.mb, sequences * ell * model.hidden * model.dtype_bytes / (s.dp * s.mb)
    )
    t_pp = node.pp_rounds(s.mb + s.pp - 2, ell)
    return t_gemm, t_tp, t_pp


def _training_terms(
    node: _Node, lengths: dict[str, float], head: Head
) -> tuple[float, float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_dp, T_opt)`` of a training node over ``ℓ = Lp + Lr``.

    The strategy's recomputation mode sets the work ``W_T = f·W_I`` (:func:`~.flops.training_passes`;
    the intensity stays one forward-equivalent, ``W_T/(f·P·mb)``) and the TP AllReduces:
    ``6·(L/Pp)·mb`` for ``full`` (forward, recompute, backward), ``4·(L/Pp)·mb`` for ``none``
    and ``selective`` (the attention core sits between the column- and the row-parallel GEMM and
    needs no collective).
    """
    model, s, sequences, hw = node.model, node.s, node.sequences, node.hw
    P, mb, pp, tp, dp = node.n_devices, s.mb, s.pp, s.tp, s.dp
    sb = model.dtype_bytes
    ell = lengths["prompt_len"] + lengths["response_len"]
    passes = training_passes(model, s.recompute, ell, head)
    w = training_flops(model, head=head, recompute=s.recompute, **lengths)  # type: ignore[arg-type]
    t_gemm = node.gemm(w, w / (passes * P * mb), ell)
    rounds = 6 if s.recompute is Recompute.FULL else 4
    t_tp = node.tp_rounds(rounds * node.layers * mb, sequences * ell * model.hidden * sb / (dp * mb))
    t_pp = node.pp_rounds(mb + 2 * pp - 3, ell)
    n_params = model_params(model, head)
    shard = n_params * sb / (pp * tp)
    engine_dp = hw.data_parallel() if s.dp_tier == 0 else None  # measured between one host's ranks
    dp_link = engine_dp or hw.collective[s.dp_tier]
    t_dp = reduce_scatter_time(dp, shard, dp_link) + allgather_time(dp, shard, dp_link)
    t_opt = OPTIMIZER_TRAFFIC_BYTES * n_params / (P * hw.mem_bandwidth)
    return t_gemm, t_tp, t_pp, t_dp, t_opt


def _check_sizes(owner: str, **sizes: object) -> None:
    for name, value in sizes.items():
        positive_int(owner, name, value)


def comm_time(nbytes: float, src_size: int, dst_size: int, tier: int, hw: Hardware) -> float:
    """COMM node between two allocations: ``dispatch + α_p2p + M·β_p2p/min(|σu|, |σv|)`` (SPEC §6;
    ``dispatch_s`` is 0 in presets).

    The payload is split over ``min(|σu|, |σv|)`` concurrent send/receive pairs.

    Parameters
    ----------
    nbytes
        ``M = #a·s(a)``, bytes of the container moved.
    src_size, dst_size
        ``|σ(u)|`` and ``|σ(v)|``, devices of the two allocations.
    tier
        The slowest tier spanned by both allocations together.
    hw
        Hardware figures (the P2P link of ``tier``).

    Returns
    -------
    float
        Seconds.
    """
    _check_sizes("comm_time", src_size=src_size, dst_size=dst_size)
    check_tier("comm_time", "tier", tier)
    if not nbytes >= 0:
        raise ValueError(f"comm_time: nbytes must be non-negative, got {nbytes!r}")
    link: Link = hw.p2p[tier]
    return hw.dispatch_s + link.alpha + nbytes * link.beta / min(src_size, dst_size)


def reshard_time(model: ModelSpec, n_devices: int, tier: int, hw: Hardware, head: Head = Head.LM) -> float:
    """RESHARD node: AlltoAll of ``N_m·sb/|σ|`` bytes per rank over ``|σ|`` ranks (SPEC §6).

    ``dispatch + (|σ| − 1)·α + (N_m·sb/|σ|)·β`` with the collective link of ``tier`` (``dispatch_s``
    is 0 in presets); ``dispatch`` alone for one device.

    Parameters
    ----------
    model
        The model whose weights change layout.
    n_devices
        ``|σ|``, devices of the (shared) allocation.
    tier
        The tier the allocation spans.
    hw
        Hardware figures.
    head
        Output head(s) of the model (they change ``N_m``).

    Returns
    -------
    float
        Seconds.
    """
    _check_sizes("reshard_time", n_devices=n_devices)
    check_tier("reshard_time", "tier", tier)
    nbytes = model_params(model, head) * model.dtype_bytes / n_devices
    return hw.dispatch_s + alltoall_time(n_devices, nbytes, hw.collective[tier])


def publication_bytes(
    model: ModelSpec, src_size: int, dst_size: int, overlap: int, head: Head = Head.LM
) -> float:
    """Payload of a weight publication between allocations (SPEC §5.4).

    ``N_m·sb·(n_max − n_overlap)/n_max`` with ``n_max = max(|σu|, |σv|)``: devices in both
    allocations already hold their share.

    Parameters
    ----------
    model
        The published model.
    src_size, dst_size
        ``|σ(u)|`` (training) and ``|σ(v)|`` (consumer).
    overlap
        ``n_overlap = |σ(u) ∩ σ(v)|``.
    head
        Output head(s) of the model.

    Returns
    -------
    float
        Bytes.

    Raises
    ------
    ValueError
        If ``overlap`` is negative or larger than either allocation.
    """
    _check_sizes("publication_bytes", src_size=src_size, dst_size=dst_size)
    if (
        isinstance(overlap, bool)
        or not isinstance(overlap, int)
        or not (0 <= overlap <= min(src_size, dst_size))
    ):
        raise ValueError(
            f"publication_bytes: overlap must be an integer in [0, min(src_size, dst_size)], got {overlap!r}"
        )
    n_max = max(src_size, dst_size)
    return model_params(model, head) * model.dtype_bytes * (n_max - overlap) / n_max
