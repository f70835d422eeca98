"""Execution time of OP, COMM and RESHARD nodes (SPEC §6, paper Appendix D-A to D-G).

An OP node's time is ``T = T_gemm + T_bubble + T_tp + T_pp + T_dp + T_nongemm + T_opt + T_over``
(:class:`TimeBreakdown`), computed by :func:`op_time` from the model, the invocation's role, its
parallel :class:`Layout` and the :class:`~rpeg.ir.hardware.Hardware` figures. COMM and RESHARD
nodes use :func:`comm_time` and :func:`reshard_time`; :func:`publication_bytes` is the payload of
a weight publication between two allocations. Every formula is derived in
``docs/cost-model.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..ir.hardware import Hardware, Link
from ..ir.models import ModelSpec
from ..ir.plan import Strategy
from ..ir.types import Head, Recompute, Role
from ..ir.workload import LengthBucket
from .collectives import (
    allgather_time,
    allreduce_time,
    alltoall_time,
    flex_dispatch_time,
    hierarchical_alltoall_time,
    one_kernel_allreduce_time,
    p2p_time,
    reduce_scatter_time,
    untouched_share,
)
from .flops import (
    TRAINING_PASSES,
    attention_core_flops,
    decode_attention_flops,
    decode_flops_at,
    forward_flops,
    head_nongemm_scalars,
    inference_flops,
    layer_nongemm_scalars,
    prefill_flops,
    reference_nongemm_scalars,
    training_flops,
    training_passes,
)
from .layout import Layout, check_tier, positive_int
from .memory import ROLLOUT_MAX_SEQS, kv_budget_tokens, kv_scalars_per_device, model_params
from .precision import (
    block_gemm_flops,
    gemm_activation_bytes,
    gemm_peaks,
    gemm_weight_bytes,
    mixed_peak,
    quantize_scalars,
    served_weight_only,
)

__all__ = [
    "OPTIMIZER_TRAFFIC_BYTES",
    "DecodeSegment",
    "TimeBreakdown",
    "comm_time",
    "decode_schedule",
    "generation_times",
    "host_offload_time",
    "op_time",
    "overlapped_alltoall_time",
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
        ``T_bubble = T_gemm·(mb + (Pp − 1)/Pv)/mb − T_gemm``, the (interleaved) 1F1B fill and drain.
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
    ep_comm
        ``T_ep``, expert parallelism's dispatch and combine AlltoAlls (SPEC §15.2).
    cp_comm
        ``T_cp``, context parallelism's exposed ring transfers or Ulysses AlltoAlls (SPEC §15.3).
    """

    gemm: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm: float
    nongemm: float
    opt: float
    overhead: float = 0.0
    ep_comm: float = 0.0
    cp_comm: float = 0.0

    @property
    def comm(self) -> float:
        """``T_comm = T_tp + T_pp + T_dp + T_ep + T_cp``."""
        return self.tp_comm + self.pp_comm + self.dp_comm + self.ep_comm + self.cp_comm

    @property
    def total(self) -> float:
        """``T = T_gemm + T_bubble + T_comm + T_nongemm + T_opt + T_over``."""
        return self.gemm + self.bubble + self.comm + self.nongemm + self.opt + self.overhead

    def __add__(self, other: TimeBreakdown) -> TimeBreakdown:
        """Term by term: the parts of one node that runs both."""
        return TimeBreakdown(*(getattr(self, f) + getattr(other, f) for f in _TERMS))

    def scaled(self, k: float) -> TimeBreakdown:
        """Every term times ``k`` (a node's share of a stretch)."""
        return TimeBreakdown(*(getattr(self, f) * k for f in _TERMS))


_TERMS = (
    "gemm",
    "bubble",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "nongemm",
    "opt",
    "overhead",
    "ep_comm",
    "cp_comm",
)


class _Roofline:
    """``F_eff = min(F_peak·η, I·BW_mem)`` for one invocation (SPEC §6, paper Appendix D-A).

    ``η = (b·ℓ/(b·ℓ + γM))·(k/(k + γK))`` with ``k = min(d, dff)/Pt``; the intensity
    ``I = W_dev/(Ω_W + Ω_A)`` with ``Ω_W = (L/Pp)·W_read·sb/Pt`` and
    ``Ω_A = 2·b·ℓ·d·sb·L/Pp`` (+ KV-cache reads for decode) per device and microbatch, where
    ``W_read`` is :attr:`ModelSpec.layer_params` for a dense model.

    Mixture of experts (SPEC §15.1, ``docs/cost-model.md`` §9): the routed experts' share ``φ``
    of the blocks' weight-GEMM FLOPs (:attr:`~rpeg.ir.models.ModelSpec.expert_flop_share`), which
    are the share ``ψ`` of the work, runs at the expert GEMMs' efficiency
    ``η_e = (r_e/(r_e + γM))·(k_e/(k_e + γK))`` with ``k_e = min(d, d_e)/Pt`` and ``r_e`` the rows
    each expert the microbatch touches receives, ``r_e = b·ℓ·k/E_t``, ``E_t = E·(1 − (1 − k/E)^(b·ℓ))``
    (:meth:`~rpeg.ir.models.ModelSpec.experts_touched`; ``b·ℓ·k/E`` once every expert is touched,
    as in a training microbatch; about one row per touched expert in a decode step of a few
    sequences, where an untouched expert runs no GEMM); the rest at ``η``:
    ``η_MoE = 1/((1 − φψ)/η + φψ/η_e)`` (the two kinds of GEMM take their times one after the
    other). ``W_read`` counts the experts the microbatch's ``b·ℓ`` tokens touch
    (:meth:`~rpeg.ir.models.ModelSpec.layer_weights_read`). In a training or teacher-forced pass
    the expert GEMMs' compute end is the hardware's expert-layer efficiency ``ε_e``
    (:attr:`~rpeg.ir.hardware.Hardware.expert_efficiency`; ``docs/cost-model.md`` §9), their row
    knee moving with it: ``η_e = (ε_e·r_e/(r_e + ε_e·γM))·(k_e/(k_e + γK))``.

    SPEC §15: a context-parallel rank holds ``b·ℓ/Pc`` of the microbatch's rows. With ``Pe``
    expert-parallel ranks each expert receives the tokens of all of them: the rank's ``E/Pe``
    experts get ``b·ℓ·k`` assignments, ``E_t = (E/Pe)·(1 − (1 − k/E)^(b·ℓ·Pe))`` of them touched
    (``r_e = b·ℓ·k·Pe/E`` once all are), a rank reads its touched experts, and the busiest
    rank's expert GEMMs take ``λ`` times the mean (the model's
    :attr:`~rpeg.ir.models.ModelSpec.load_imbalance`, SPEC's 1.2 by default):
    ``η_MoE = 1/((1 − φψ)/η + λ·φψ/η_e)``.

    Experts whole on one rank (``etp = 1``, Megatron-core's MoE parallel folding; SPEC §15.2's
    expert-TP ``Pet``): each tensor-parallel rank dispatches its own ``b·ℓ/Pt`` rows (sequence
    parallelism splits them) instead of sharing the group's ``b·ℓ``, so ``b·ℓ`` becomes
    ``b·ℓ·Pet/Pt`` in ``E_t`` and ``r_e``; the expert GEMMs' width is ``k_e = min(d, d_e)/Pet``
    and the routed experts a rank reads are not split over ``Pt``:
    ``Ω_W = (L/Pp)·((W_read − W_routed)/Pt + W_routed/Pet)·sb``. The FLOPs per device are the
    same (``b·ℓ·k/Pt`` token-expert products at full width against ``b·ℓ·k`` at ``1/Pt``).

    FP8 (``docs/cost-model.md`` §11, :mod:`.precision`): with ``precision = "fp8"`` the share
    ``ψ`` of the work in the blocks' weight GEMMs runs at ``F_peak,8`` and the rest (attention
    core, LM head) at ``F_peak``, ``F_peak → F_mix = 1/(ψ/F_peak,8 + (1 − ψ)/F_peak)``; the
    GEMMs read 1-byte weights, ``Ω_W = (L/Pp)·W_read·1/Pt``, and move FP8 inputs and BF16
    outputs, ``Ω_A = b·ℓ·d·(1 + sb)·L/Pp``. NVFP4 (``precision = "nvfp4"``) is the same with
    ``F_peak,4`` and ``q = 0.5625`` bytes where FP8 has 1 (:attr:`~rpeg.ir.models.ModelSpec.gemm_bytes`).

    MXFP4 experts (``precision = "mxfp4"``, a generation engine's weights: ``served``): the
    touched routed experts are read at ``q_e = 0.53125`` bytes per weight
    (:attr:`~rpeg.ir.models.ModelSpec.served_expert_bytes`) and the rest at ``sb``,
    ``Ω_W = (L/Pp)·((W_read − W_routed)·sb/Pt + W_routed·q_e/Pet)``; the GEMMs dequantize in
    their tiles and run at ``F_peak`` (weight-only, W4A16) on BF16 activations, and their row
    knee is ``γM_e = γM·q_e/sb``: ``r_e/(r_e + γM)`` is a GEMM of few rows bound by reading its
    weights (``γM`` rows cost as much compute as reading the BF16 weights), and MXFP4 weights are
    read ``sb/q_e`` times faster at the same peak. Their compute-bound end is ``ε_w·F_peak``
    (the engine step's ``weight_only_efficiency``): ``η_e`` row factor ``ε_w·r_e/(r_e + ε_w·γM_e)``.

    A served FP8 or NVFP4 checkpoint on hardware without the matching tensor cores
    (:func:`~.precision.served_weight_only`: vLLM's Marlin fallback, W8A16 or W4A16) runs every
    block GEMM so: ``q``-byte weights, BF16 activations (``Ω_A`` at ``2·sb``), the BF16 peak, and
    the dense GEMMs' row factor ``ε_w·r/(r + ε_w·γM·q/sb)`` too.
    """

    __slots__ = (
        "act_bytes",
        "b",
        "e_bytes",
        "ep",
        "eps_d",
        "eps_w",
        "eta_e",
        "eta_k",
        "etp",
        "gamma_d",
        "gamma_e",
        "hw",
        "imbalance",
        "layers",
        "model",
        "omega_w",
        "peak_fp8",
        "phi",
        "served",
        "tp",
        "w_bytes",
    )

    def __init__(
        self, model: ModelSpec, layout: Layout, hw: Hardware, b: float, served: bool = False
    ) -> None:
        self.model = model
        self.hw = hw
        self.served = served
        # FP8 or NVFP4 peak; None for BF16 and a served checkpoint's weight-only GEMMs; refuses a
        # missing one outside a generation engine
        self.peak_fp8 = gemm_peaks(model, hw, served=served)[1]
        self.w_bytes = gemm_weight_bytes(model)
        self.act_bytes = gemm_activation_bytes(model)
        # a routed expert's weight bytes: the MXFP4 ones a generation engine stores, else the others'
        self.e_bytes = model.served_expert_bytes if served and model.has_mxfp4_experts else self.w_bytes
        # weight-only GEMMs (MXFP4 experts; an FP8 or NVFP4 checkpoint served without its tensor
        # cores: every block GEMM) keep the BF16 peak, and their row knee moves with the bytes
        # they read (γM·q/sb: a GEMM of few rows is bound by its weight reads) while their
        # compute-bound end is ε_w·F_peak
        eps = hw.rollout_step.weight_only_efficiency if hw.rollout_step is not None else 1.0
        self.gamma_d, self.eps_d = hw.gamma_m, 1.0  # the dense (non-expert) block GEMMs
        # the routed experts': a training or teacher-forced pass's at the hardware's expert-layer
        # efficiency ε_e (docs/cost-model.md §9), a generation engine's at the shape rule's
        self.gamma_e, self.eps_w = hw.gamma_m, 1.0 if served else hw.expert_efficiency
        if served and served_weight_only(model, hw):
            self.act_bytes = 2.0 * model.dtype_bytes  # BF16 inputs and outputs
            self.gamma_d = self.gamma_e = hw.gamma_m * self.w_bytes / model.dtype_bytes
            self.eps_d = self.eps_w = eps
        elif self.e_bytes != self.w_bytes:
            self.gamma_e, self.eps_w = hw.gamma_m * self.e_bytes / self.w_bytes, eps
        s = layout.strategy
        self.b = b / s.cp  # a context-parallel rank's share of each sequence
        self.tp = s.tp
        self.ep = s.ep
        self.etp = s.expert_tp
        self.layers = model.layers / s.pp
        k = min(model.hidden, model.ffn_hidden) / s.tp
        self.eta_k = k / (k + hw.gamma_k)
        # what does not depend on the microbatch's rows: a dense model's weights read per pass,
        # a MoE model's expert FLOP share and expert-GEMM width factor
        self.phi = model.expert_flop_share
        self.omega_w = None if model.is_moe else self.layers * model.layer_params * self.w_bytes / s.tp
        self.imbalance = model.load_imbalance if s.ep > 1 else 1.0
        k_e = min(model.hidden, model.expert_ffn) / self.etp
        self.eta_e = k_e / (k_e + hw.gamma_k) if model.is_moe else 0.0

    def flops(self, work_per_device: float, tokens: float, extra_bytes: float, block_share: float) -> float:
        """``F_eff`` for ``work_per_device`` FLOPs per microbatch over ``ℓ = tokens``;
        ``block_share`` is ``ψ``, the share of the work in the blocks' weight GEMMs
        (:func:`~.precision.block_gemm_flops`): the FP8 GEMMs of an FP8 model, and of a MoE
        model the GEMMs whose routed-expert part ``φ`` runs at the expert efficiency — the
        experts' share of the work is ``φ·ψ``, not ``φ``: the attention core and the head are
        dense work whatever the blocks' FFN."""
        m = self.model
        rows = self.b * tokens
        eta = self.eps_d * rows / (rows + self.eps_d * self.gamma_d) * self.eta_k
        omega_w = self.omega_w
        if omega_w is None:  # a mixture of experts: the expert GEMMs' efficiency, the experts touched
            # the rows each touched local expert receives: b·ℓ·k assignments reach the rank's
            # experts, of which the b·ℓ·Pe tokens touch `experts_touched` (b·ℓ·k·Pe/E once all are)
            folded = self.etp != self.tp
            sent = rows * self.etp / self.tp if folded else rows  # rows this rank dispatches
            touched = m.experts_touched(sent, self.ep)
            r_e = sent * m.experts_active / touched if touched > 0.0 else 0.0
            eta_e = self.eps_w * r_e / (r_e + self.eps_w * self.gamma_e) * self.eta_e
            phi = self.phi * min(1.0, max(0.0, block_share))
            eta = 1.0 / ((1.0 - phi) / eta + self.imbalance * phi / eta_e)
            if folded:  # the touched routed experts whole, the rest split over Pt
                routed = m.moe_layers * touched * m.expert_params / m.layers
                rest = m.layer_weights_read(sent, self.ep) - routed
                if self.e_bytes == self.w_bytes:
                    omega_w = self.layers * (rest / self.tp + routed / self.etp) * self.w_bytes
                else:  # MXFP4 experts
                    omega_w = self.layers * (rest * self.w_bytes / self.tp + routed * self.e_bytes / self.etp)
            elif self.e_bytes != self.w_bytes:  # MXFP4 experts, split over Pt like the rest
                routed = m.moe_layers * touched * m.expert_params / m.layers
                rest = m.layer_weights_read(rows, self.ep) - routed
                omega_w = self.layers * (rest * self.w_bytes + routed * self.e_bytes) / self.tp
            else:
                omega_w = self.layers * m.layer_weights_read(rows, self.ep) * self.w_bytes / self.tp
        omega_a = self.act_bytes * rows * m.hidden * self.layers  # 2·sb·b·ℓ·d·L/Pp in BF16
        intensity = work_per_device / (omega_w + omega_a + extra_bytes)
        peak = self.hw.peak_flops
        if self.peak_fp8 is not None:
            peak = mixed_peak(peak, self.peak_fp8, block_share)
        return min(peak * eta, intensity * self.hw.mem_bandwidth)


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
    tokens: float | None = None,
    tokens_sq: float | None = None,
    updates: int = 1,
    window_sq: float | None = None,
) -> TimeBreakdown:
    """Predicted time of one OP node (SPEC §6, with SPEC §14's engine choices).

    With ``n = sequences``, ``b = n/(Pd·mb)``, ``P = Pd·Pp·Pt``, ``ℓ = Lp + Lr``, ``sb`` the
    model's bytes per scalar and ``N_m`` its parameters (:func:`~.memory.model_params`):

    * ``T_gemm = W/(P·F_eff)`` with ``W`` from :mod:`.flops` and ``F_eff`` the roofline
      ``min(F_peak·η, I·BW_mem)``; ``I`` uses one forward-equivalent per microbatch (training:
      ``W_T/(f·P·mb)``, ``f`` the forward-equivalents of the strategy's recomputation mode,
      :func:`~.flops.training_passes`: 4 ``full``, 3 ``none``, 3 + the attention core's share
      ``selective``). Generation sums prefill (``ℓ = Lp``) and decode (``ℓ = 1``, KV-cache
      reads ``b·c̄·2·d_kv,local·sb·L/Pp`` per step at mean context ``c̄``), each with its own
      ``F_eff``.
    * ``T_bubble = T_gemm·(Pp − 1)/(Pv·mb)`` (the 1F1B multiplier ``(mb + Pp − 1)/mb`` minus one;
      Megatron's interleaved schedule with ``Pv`` chunks per stage fills and drains in chunk
      slots of ``1/Pv`` of a stage, Narayanan et al. SC'21 §2.2.2: ``Pv = 1`` is plain 1F1B).
    * ``T_tp``: ``2·(L/Pp)·mb`` AllReduces (training ``6·(L/Pp)·mb`` under
      ``full`` recomputation, ``4·(L/Pp)·mb`` under ``none``/``selective``) of ``n·ℓ·d·sb/(Pd·mb)``
      over ``Pt`` at tier 0; generation: prefill as inference at ``ℓ = Lp`` plus
      ``2·(L/Pp)·r`` decode AllReduces of ``n·d·sb/Pd``, ``r = t1 − max(t0, 1)`` (``Lr − 1`` for
      the whole response: the first response token comes out of the prefill).
    * ``T_pp`` (``Pp > 1``): ``Pv·mb + Pp − 2`` (inference, prefill) or ``Pv·mb + 2Pp − 3``
      (training) P2P steps of ``n·ℓ·d·sb/(Pd·Pt·mb)`` (an interleaved stage sends each
      microbatch on once per chunk, ``Pv`` times), each apportioned between the ``n_intra`` intra-node
      boundaries (tier 0) and the ``n_inter`` inter-node ones (tier ``max(pp_tier, 1)``);
      decode adds ``r·(mb + Pp − 2)`` steps at ``ℓ = 1``.
    * ``T_dp`` (SPEC §14.3), over ``Pd`` at ``dp_tier``: training with ZeRO stage 1 or 2, one
      ReduceScatter of the gradients and one AllGather of the weights, ``N_m·sb/(Pp·Pt)`` each,
      per step; with stage 3, an AllGather of the weights per microbatch in the forward and in
      the backward (one more under ``full`` recomputation), of which only the part the GEMMs do
      not hide counts, ``max(0, T_gather − T_gemm)`` (FSDP prefetches), and one ReduceScatter
      per step; inference with stage 3, one AllGather per microbatch, hidden the same way —
      with the training engine's own
      data-parallel link
      (:meth:`Hardware.data_parallel <rpeg.ir.hardware.Hardware.data_parallel>`, measured between
      the ranks of one host) for intra-node data parallelism where the hardware has one.
    * ``T_nongemm = f·(L/Pp)·c_ng·(1 − 1/Pt)·(mb·b·ℓ·d)/(B_cal·ℓ_cal·d_cal)``: the tokens·width
      one device processes over all its microbatches, relative to the calibration's; ``f`` is
      1 for inference and the forward-equivalents of the recomputation mode for training
      (:func:`~.flops.training_passes`), 0 for generation.
    * ``T_opt = 18·N_m/(P·BW_mem)`` for training.
    * Packed sequences (SPEC §14.1): with ``tokens = E[ℓ]`` and ``tokens_sq = E[ℓ²]`` the work
      is ``n·W_fwd(E[ℓ], E[ℓ²])`` and every per-token term (``η``'s rows ``b·E[ℓ] = T_mb``,
      the TP and PP messages, the non-GEMM work) uses ``E[ℓ]``; ``None`` pads to ``Lp + Lr``.
    * Sliding-window blocks (SPEC §15.1, ``docs/cost-model.md`` §9): the attention core's
      ``ℓ²`` and decode contexts ``c̄`` are the blocks' averages with ``s_W(ℓ)`` and
      ``E[min(c, W)]`` (:mod:`.flops`), and so are the decode steps' KV-cache reads.
    * A chunked loss (``logits_chunk > 0``, SPEC §14.6) recomputes the LM head's forward per
      chunk in the backward: training adds ``n·E[ℓ]·2·d·V`` FLOPs.
    * ``U = updates`` optimizer updates per step (PPO mini-batches, SPEC §14.2): training pays
      ``T_dp``'s per-step collectives and ``T_opt`` once per update, and with pipelining one
      fill and drain per update, ``T_bubble = T_gemm·(Pp − 1)·min(U, mb)/(Pv·mb)``.
    * Expert, context and sequence parallelism (SPEC §15, ``docs/cost-model.md`` §10):
      ``P = Pd·Pp·Pt·Pc`` and every per-token term uses a device's ``b·ℓ/Pc`` tokens; ``T_ep``
      the dispatch and combine AlltoAlls of the MoE layers, ``T_cp`` a ring's exposed KV
      transfers or Ulysses' AlltoAlls (``_split_terms``); sequence parallelism runs each TP
      AllReduce as a ReduceScatter and an AllGather and leaves no replicated non-GEMM work;
      ZeRO's collectives run over ``Pd·Pc`` ranks (routed experts over ``Pd·Pc/Pe``).
    * ``T_over`` — the engine terms ``e`` of the node's class (:meth:`Hardware.terms
      <rpeg.ir.hardware.Hardware.terms>`; neutral in presets, so ``T_over = 0`` there):
      ``T_gemm`` is divided by ``η_e``, and inference and training add
      ``c_call + f·(mb + (Pp − 1)/Pv)·(L/Pp)·c_layer``; generation adds a call, ``(mb + Pp − 1)·
      (c_step + (L/Pp)·c_layer)`` per prefill and per decode step, and a weight sync
      ``α_sync + N_m·sb·β_sync`` with the prefill. Every node adds the controller's
      ``dispatch_s``.
    * The rollout engine's step (a GPU preset's :class:`~rpeg.ir.hardware.EngineStep`;
      ``docs/cost-model.md`` §8, "The engine step"): the prefill runs in ``k_p = ⌈b·Lp/B⌉``
      chunks of the token budget ``B``, each at its own roofline, and every prefill chunk and
      decode step adds ``(mb + Pp − 1)·c_step`` (a decode step without CUDA graphs also
      ``(L/Pp)·c_launch``); none without one (``k_p = 1``).

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
    tokens, tokens_sq
        Inference and training: ``E[ℓ]`` and ``E[ℓ²]`` of the node's packed sequences;
        ``None`` pads each to ``Lp + Lr``.
    updates
        Training: optimizer updates per step ``U`` (default 1).
    window_sq
        Inference and training with sliding-window blocks: ``E[s_W(ℓ)] = E[ℓ² − (ℓ − W)₊²]`` of
        the packed sequences; ``None``: from ``tokens`` and ``tokens_sq``
        (:meth:`~rpeg.ir.models.ModelSpec.attended_square`: exact for one length).

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
    node = _Node(model, layout, hw, sequences, served=role is Role.GENERATION)
    t_dp = t_opt = t_nongemm = 0.0
    flushes = 1  # pipeline fills and drains per step
    if role is Role.GENERATION:
        t0, t1 = (0, response_len) if decode is None else decode
        if not 0 <= t0 <= t1 <= response_len:
            raise ValueError(
                f"op_time: decode window must satisfy 0 ≤ t0 ≤ t1 ≤ response_len={response_len}, "
                f"got {decode!r}"
            )
        t_gemm, t_tp, t_pp, t_over, t_ep = _generation_terms(node, prompt_len, (t0, t1), prefill, head)
        t_cp = 0.0
    else:
        ell = float(prompt_len + response_len) if tokens is None else float(tokens)
        lengths = {
            "sequences": sequences,
            "prompt_len": prompt_len,
            "response_len": response_len,
            "tokens": ell,
            "tokens_sq": ell * ell if tokens_sq is None else float(tokens_sq),
            "window_sq": window_sq,
        }
        if role is Role.TRAINING:
            t_gemm, t_tp, t_pp, t_dp, t_opt = _training_terms(node, lengths, head, updates)
            flushes = min(updates, layout.strategy.mb)
        else:
            t_gemm, t_tp, t_pp, t_dp = _inference_terms(node, lengths, head)
        s = layout.strategy
        passes = (
            training_passes(model, s.recompute, ell, head, lengths["tokens_sq"], window_sq)
            if role is Role.TRAINING
            else 1.0
        )
        terms = hw.terms(role.value)
        t_gemm /= terms.efficiency
        t_ep, t_cp = _split_terms(node, role, lengths, head, t_gemm, passes)
        t_nongemm = passes * node.nongemm(ell, head) + node.fp8_casts(ell, role is Role.TRAINING)
        t_over = terms.per_call_s + passes * node.slots * node.layers * terms.per_layer_s
        if s.ep_overlap and role is Role.TRAINING:
            t_ep = overlapped_alltoall_time(t_ep, t_gemm + t_nongemm, s.mb * s.vp)

    return TimeBreakdown(
        gemm=t_gemm,
        bubble=t_gemm * (layout.strategy.pp - 1) * flushes / (layout.strategy.vp * layout.strategy.mb),
        tp_comm=t_tp,
        pp_comm=t_pp,
        dp_comm=t_dp,
        nongemm=t_nongemm,
        opt=t_opt,
        overhead=t_over + hw.dispatch_s,
        ep_comm=t_ep,
        cp_comm=t_cp,
    )


def overlapped_alltoall_time(alltoall: float, compute: float, units: int) -> float:
    """The exposed seconds of a training node's expert-parallel AlltoAlls run under another
    microbatch's compute (``Strategy.ep_overlap``, Megatron-core's combined 1F1B;
    ``docs/cost-model.md`` §10):

    ``T_ep' = T_ep/n + (n − 1)/n·(max(0, T_ep/2 − 2C/3) + max(0, T_ep/2 − C/3))``

    with ``T_ep`` the in-line AlltoAll time, ``C`` the node's compute (GEMMs and the
    memory-bound work) and ``n = mb·vp`` the microbatch chunks. In the steady state one
    microbatch's forward runs beside another's backward: the forward's dispatch and combine
    (half of ``T_ep``) hide behind the backward's compute (two thirds of ``C``: a backward does
    twice a forward's work), the backward's behind the forward's (one third); what does not fit
    is exposed. The first forward and the last backward have no partner: one chunk's share
    ``T_ep/n`` stays exposed. ``T_ep' ≤ T_ep`` always.

    Parameters
    ----------
    alltoall
        ``T_ep``, seconds.
    compute
        ``C``, seconds.
    units
        ``n = mb·vp``.

    Returns
    -------
    float
        Exposed seconds.
    """
    if alltoall <= 0.0:
        return 0.0
    half = alltoall / 2.0
    hidden_past = max(0.0, half - 2.0 * compute / 3.0) + max(0.0, half - compute / 3.0)
    return alltoall / units + (units - 1) / units * hidden_past


def _split_terms(
    node: _Node,
    role: Role,
    lengths: dict[str, float | None],
    head: Head,
    t_gemm: float,
    forward_passes: float,
) -> tuple[float, float]:
    """``(T_ep, T_cp)`` of a training or inference node (SPEC §15.2–15.3).

    ``T_ep``: per MoE layer and microbatch 2 AlltoAlls in the forward (dispatch, combine), 2 in
    the backward and, under ``full`` recomputation, 2 more (:meth:`_Node.ep_rounds`). ``T_cp``
    (:meth:`_Node.cp_rounds`): a ring passes KV chunks in the forward (1), keys, values and
    their gradients in the backward (2) and again where the core is recomputed (``full`` or
    ``selective``: 1), overlapped
    with the attention core, whose time is ``T_gemm`` times the core's share of the work
    (``L·2·d_q·E[ℓ²]/W_fwd`` per forward-equivalent, :func:`~.flops.attention_core_flops`; 3
    of the ``f = forward_passes`` forward-equivalents in training, 4 with recomputation);
    Ulysses runs its 4 AlltoAlls per layer in the forward,
    the backward and a ``full`` recomputation."""
    s, model = node.s, node.model
    if s.ep == 1 and s.cp == 1:
        return 0.0, 0.0
    ell = lengths["tokens"]
    tokens = node.rank_tokens(ell)
    training = role is Role.TRAINING
    again = 1 if training and s.recompute is Recompute.FULL else 0
    t_ep = node.ep_rounds((4 + 2 * again if training else 2) * s.mb, tokens)
    t_cp = 0.0
    if s.cp > 1:
        if s.cp_kind == "ulysses":  # the core's inputs are kept: only a full recomputation repeats them
            passes = 2 + again if training else 1
        else:  # recomputing the core (full or selective) passes the KV chunks round again
            core_again = 0 if s.recompute is Recompute.NONE else 1
            passes = 3 + core_again if training else 1
        core_passes = 3 + (0 if s.recompute is Recompute.NONE else 1) if training else 1
        sq, window_sq = lengths["tokens_sq"], lengths["window_sq"]
        share = attention_core_flops(model, ell, sq, window_sq) / forward_flops(
            model, ell, head, sq, window_sq
        )
        core = (
            node.core_s
            if node.core_s is not None
            else t_gemm * min(1.0, share * core_passes / forward_passes)
        )
        t_cp = node.cp_rounds(passes, tokens, core)
    return t_ep, t_cp


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
    :meth:`pp_rounds` ``count`` pipeline P2P steps of ``n·ℓ·d·sb/(Pd·Pt·mb)``. ``served``: the
    node is a generation engine's, whose GEMMs read the weights the engine stores (MXFP4
    experts under ``precision = "mxfp4"``, :class:`_Roofline`).
    """

    __slots__ = (
        "b",
        "core_s",
        "hw",
        "layers",
        "layout",
        "model",
        "n_devices",
        "roof",
        "s",
        "sequences",
        "slots",
    )

    def __init__(
        self, model: ModelSpec, layout: Layout, hw: Hardware, sequences: float, served: bool = False
    ) -> None:
        s = layout.strategy
        self.model = model
        self.layout = layout
        self.s = s
        self.hw = hw
        self.sequences = sequences
        self.n_devices = s.size
        self.layers = model.layers / s.pp
        self.b = sequences / (s.dp * s.mb)
        self.roof = _Roofline(model, layout, hw, self.b, served)
        # stage-microbatch slots on the 1F1B critical path; interleaved, vp·mb + Pp − 1 chunk slots
        # of 1/vp of a stage each
        self.slots = s.mb + (s.pp - 1) / s.vp
        self.core_s: float | None = None  # the attention core's seconds, where the hardware rates it

    def nongemm(self, tokens: float, head: Head) -> float:
        """One forward-equivalent's non-GEMM time on one device (``docs/cost-model.md`` §2):
        ``T·((L/Pp)·σ_layer + σ_head)·κ`` with ``T = mb·b·ℓ/Pc`` the tokens the device
        processes over all its microbatches, ``σ`` the scalars the memory-bound kernels move per
        token (:func:`~.flops.layer_nongemm_scalars`, :func:`~.flops.head_nongemm_scalars`: what
        tensor parallelism splits and what it replicates unless sequence parallelism splits it
        too) and ``κ = c_ng/(B_cal·ℓ_cal·σ_ref(d_cal))`` the hardware's seconds per scalar: its
        ``c_ng`` timed the reference block (:func:`~.flops.reference_nongemm_scalars`) over
        ``B_cal·ℓ_cal`` tokens."""
        s = self.s
        per_token = _nongemm_seconds(self.model, self.hw, s.tp, s.pp, s.sp, head)
        return s.mb * self.b * tokens / s.cp * per_token

    def fp8_casts(self, tokens: float, training: bool) -> float:
        """The FP8 or NVFP4 quantize kernels' time on one device (``docs/cost-model.md`` §11, "The
        quantize kernels"): ``T·(L/Pp)·σ_cast·κ`` with ``T = mb·b·ℓ/Pc`` and ``σ_cast``
        :func:`~.precision.quantize_scalars` of a training step (twice the forward's under full
        recomputation) or of a teacher-forced forward; 0 for a BF16 model."""
        s = self.s
        sigma = quantize_scalars(
            self.model, s.tp, s.sp, training=training, recomputed=training and s.recompute is Recompute.FULL
        )
        if sigma == 0.0:
            return 0.0
        return s.mb * self.b * tokens / s.cp * self.layers * sigma * _nongemm_kappa(self.hw)

    @property
    def tp_layers(self) -> float:
        """The stage's layers as tensor-parallel collective pairs: ``L/Pp``, each block's
        attention and FFN closing with one AllReduce (or ReduceScatter and AllGather) each; with
        experts whole on one rank (``etp = 1``) a MoE block's FFN has none — its tokens reach
        the experts by the AlltoAll — so ``(L/Pp)·(1 − L_moe/(2L))``."""
        s, m = self.s, self.model
        if s.etp is None:
            return self.layers
        return self.layers * (1.0 - m.moe_layers / (2.0 * m.layers))

    def rank_tokens(self, tokens: float) -> float:
        """``T = b·ℓ/Pc``: one microbatch's tokens on one device (a context-parallel rank's
        share of each sequence)."""
        return self.b * tokens / self.s.cp

    def gemm(
        self, work: float, work_per_device: float, tokens: float, extra: float, block_work: float
    ) -> float:
        """``T_gemm = W/(P·F_eff)`` of ``work`` FLOPs (0 for no work), ``block_work`` of them in
        the blocks' weight GEMMs (``ψ = block_work/work``: FP8 for an FP8 model, the routed
        experts' share ``φ`` of them at the expert efficiency for a MoE model)."""
        if work <= 0.0:
            return 0.0
        return work / (self.n_devices * self.roof.flops(work_per_device, tokens, extra, block_work / work))

    def tp_rounds(self, count: float, nbytes: float, link: Link | None = None) -> float:
        """``count`` tensor-parallel AllReduces of ``nbytes`` over ``Pt`` at tier 0 (on ``link``
        when given: an engine's own; else the tier-0 collective link); with sequence
        parallelism each is a ReduceScatter plus an AllGather of the same buffer (SPEC §15.3)."""
        link = link or self.hw.collective[0]
        tp = self.s.tp
        if self.s.sp:
            return count * (reduce_scatter_time(tp, nbytes, link) + allgather_time(tp, nbytes, link))
        return count * allreduce_time(tp, nbytes, link)

    def engine_tp_rounds(self, count: float, nbytes: float) -> float:
        """``count`` tensor-parallel AllReduces of ``nbytes`` inside a generation engine: on
        the engine's measured link where the hardware has one (:meth:`Hardware.tensor_parallel
        <rpeg.ir.hardware.Hardware.tensor_parallel>`, the ring formula), else on the engine
        step's one-kernel all-reduce when the buffer fits it
        (:meth:`EngineStep.allreduce_link <rpeg.ir.hardware.EngineStep.allreduce_link>`,
        :func:`~.collectives.one_kernel_allreduce_time`), else as :meth:`tp_rounds` on the
        tier-0 ring (docs/cost-model.md §8, "The engine's all-reduce")."""
        measured = self.hw.tensor_parallel()
        if measured is not None:
            return self.tp_rounds(count, nbytes, measured)
        step = self.hw.rollout_step
        kernel = step.allreduce_link(self.s.tp, nbytes) if step is not None and not self.s.sp else None
        if kernel is None:
            return self.tp_rounds(count, nbytes)
        return count * one_kernel_allreduce_time(self.s.tp, nbytes, kernel)

    def pp_rounds(self, count: float, tokens: float) -> float:
        """``count`` pipeline steps of ``n·tokens·d·sb/(Pd·Pt·Pc·mb)`` bytes (0 without pipelining)."""
        s = self.s
        if s.pp == 1 or count <= 0:
            return 0.0
        nbytes = (
            self.sequences * tokens * self.model.hidden * self.model.dtype_bytes / (s.dp * s.tp * s.cp * s.mb)
        )
        return count * _pp_step_time(nbytes, self.layout, self.hw)

    def ep_rounds(self, per_layer: float, tokens: float) -> float:
        """``T_ep`` (SPEC §15.2): ``per_layer`` AlltoAlls per MoE layer of the stage, each of
        ``T·k·d·sb·(Pe − 1)/Pe`` bytes per rank, ``T`` = ``tokens`` dispatched by one device
        (``/Pt`` under sequence parallelism: each TP rank dispatches its share), over ``Pe`` ranks
        at ``ep_tier``, the ``g_e − 1`` peers on the rank's own node over the intra-node link
        (:func:`~.collectives.hierarchical_alltoall_time`, ``g_e`` =
        :attr:`Layout.ep_ranks_per_node <rpeg.costmodel.layout.Layout.ep_ranks_per_node>`);
        on the flex dispatcher (``Strategy.flex_dispatch``) each token once per rank, and across
        a network hop once per node, that holds one of its experts
        (:func:`~.collectives.flex_dispatch_time`); 0 with ``Pe = 1``."""
        s, m = self.s, self.model
        if s.ep == 1 or per_layer <= 0 or not m.is_moe:
            return 0.0
        dispatched = tokens / s.tp if s.sp else tokens
        moe_layers = m.moe_layers / s.pp
        local = s.ep if s.ep_tier == 0 else min(s.ep, self.layout.ep_ranks_per_node)
        if s.flex_dispatch:
            links = self.hw.collective
            per_rank, per_node = m.experts // s.ep, m.experts // s.ep * local
            one = flex_dispatch_time(
                s.ep,
                local,
                dispatched * m.hidden * m.dtype_bytes,
                1.0 - untouched_share(m.experts, per_rank, m.experts_active),
                1.0 - untouched_share(m.experts, per_node, m.experts_active),
                links[0],
                links[s.ep_tier],
            )
            return per_layer * moe_layers * one
        nbytes = dispatched * m.experts_active * m.hidden * m.dtype_bytes * (s.ep - 1) / s.ep
        return per_layer * moe_layers * self._alltoall(s.ep, s.ep_tier, local, nbytes)

    def _alltoall(self, p: int, tier: int, local: int, nbytes: float) -> float:
        """One AlltoAll of ``nbytes`` per rank over ``p`` ranks at ``tier``, ``local`` of them per
        node: all over tier 0 inside a node, else split between the node's link and the tier's."""
        links = self.hw.collective
        if tier == 0:
            return alltoall_time(p, nbytes, links[0])
        return hierarchical_alltoall_time(p, min(p, local), nbytes, links[0], links[tier])

    def cp_rounds(self, passes: float, tokens: float, core: float) -> float:
        """``T_cp`` (SPEC §15.3) of ``passes`` forward-equivalents of attention over the stage's
        layers and the node's microbatches, with ``T = tokens`` per device and microbatch.

        Ring: ``Pc − 1`` P2P steps per layer and pass of the KV chunk, ``T·c_kv·sb`` bytes
        (``c_kv`` the local K and V widths, :func:`_ring_kv_scalars`), at ``cp_tier``,
        overlapped with the attention core's ``core`` seconds: only ``max(0, comm − core)`` is
        exposed. Ulysses: four AlltoAlls per layer and pass of ``T·d·sb/Pt`` bytes over ``Pc``
        ranks, not overlapped, split between the node's link and ``cp_tier``'s like the EP
        group's (:meth:`_alltoall`). 0 with ``Pc = 1``."""
        s, m = self.s, self.model
        if s.cp == 1 or passes <= 0:
            return 0.0
        rounds = passes * self.layers * s.mb
        if s.cp_kind == "ulysses":
            nbytes = tokens * m.hidden * m.dtype_bytes / s.tp
            return 4.0 * rounds * self._alltoall(s.cp, s.cp_tier, self.layout.cp_ranks_per_node, nbytes)
        nbytes = tokens * _ring_kv_scalars(m, s.tp) * m.dtype_bytes
        ring = rounds * (s.cp - 1) * p2p_time(nbytes, self.hw.p2p[s.cp_tier])
        return max(0.0, ring - core)


def _nongemm_kappa(hw: Hardware) -> float:
    """``κ = c_ng/(B_cal·ℓ_cal·σ_ref(d_cal))``: the hardware's seconds per scalar a memory-bound
    kernel moves (its ``c_ng`` timed the reference block over ``B_cal·ℓ_cal`` tokens)."""
    return hw.c_nongemm / (hw.b_cal * hw.l_cal * reference_nongemm_scalars(hw.d_cal))


def _nongemm_seconds(model: ModelSpec, hw: Hardware, tp: int, pp: int, sp: bool, head: Head) -> float:
    """``((L/Pp)·σ_layer + σ_head)·κ``: one device's non-GEMM seconds per token and forward
    (:meth:`_Node.nongemm`, :func:`_nongemm_kappa`)."""
    kappa = _nongemm_kappa(hw)
    sigma = model.layers / pp * layer_nongemm_scalars(model, tp, sp) + head_nongemm_scalars(
        model, head, tp, sp
    )
    return sigma * kappa


def _ring_kv_scalars(model: ModelSpec, tp: int) -> float:
    """Scalars per token and layer a ring-attention step passes on: the local keys and values,
    ``2·d_kv,local`` (:func:`~.memory.kv_scalars_per_device`); with latent attention the
    up-projected heads, ``heads·(qk_nope + qk_rope + v_head)/Pt`` (Megatron-core's MLA passes
    whole keys and values round the ring, not the latent)."""
    if model.is_mla:
        return model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) / tp
    return kv_scalars_per_device(model, tp)


def _generation_terms(
    node: _Node, prompt_len: int, window: tuple[int, int], prefill: bool, head: Head
) -> tuple[float, float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_over, T_ep)`` of a generation node: the prefill over ``Lp`` (when
    ``prefill``) plus the decode steps ``t0..t1`` (:func:`op_time`'s docstring has the formulas);
    with expert parallelism one dispatch and one combine AlltoAll per MoE layer and microbatch
    in the prefill and in each decode step that decodes a decoded token (SPEC §15.2).

    With the engine's prefill and decode terms ``e_p, e_d`` (neutral in presets), prefill GEMMs
    run at ``η_p·F_eff`` and decode GEMMs at ``η_d·F_eff``; ``T_over`` is one call
    (``c_call,p`` with a prefill, else ``c_call,d``), plus ``(mb + Pp − 1)·(c_step + (L/Pp)·c_layer)``
    for the prefill and for each of the ``t1 − t0`` decode steps, plus, with a prefill, one weight
    sync ``α_sync + N_m·sb·β_sync`` when the engine has a sync link.
    """
    hw = node.hw
    pre, dec = hw.terms("prefill"), hw.terms("decode")
    t0, t1 = window
    t_gemm = t_tp = t_pp = t_ep = 0.0
    t_over = pre.per_call_s if prefill else dec.per_call_s
    mb = node.s.mb
    if prefill and prompt_len > 0:
        t_gemm, t_tp, t_pp, over = _prefill_terms(node, prompt_len, head)
        t_over += over
        t_ep = node.ep_rounds(2 * mb, node.rank_tokens(prompt_len))
    if t1 - t0 > 0:
        rounds = max(0, t1 - max(t0, 1))  # decode steps whose input token is a decoded one
        model = node.model
        windowed = model.windowed_mean(prompt_len + t0, prompt_len + t1) if model.is_windowed else None
        context = prompt_len + 0.5 * (t0 + t1)
        d_gemm, d_tp, d_pp, d_over = _decode_terms(node, context, t1 - t0, rounds, head, windowed)
        t_gemm += d_gemm
        t_tp += d_tp
        t_pp += d_pp
        t_over += d_over
        t_ep += node.ep_rounds(2 * mb * rounds, node.rank_tokens(1))
    return t_gemm, t_tp, t_pp, t_over, t_ep


def _engine_core_rate(node: _Node, intensity: float = math.inf) -> float:
    """The FLOP/s of a GPU rollout engine's attention kernel (``docs/cost-model.md`` §8, "The
    attention core on the engine"): the hardware's fused-attention forward rate at the model's
    head width where it rates one (:meth:`~rpeg.ir.hardware.Hardware.attention_rates`), else
    the BF16 ``F_peak``, times the engine's ``ε_s`` for a model with attention sinks
    (:attr:`~rpeg.ir.hardware.EngineStep.sink_attention_efficiency`: vLLM's Triton kernel on
    Ampere); capped by ``I·BW_mem`` for a kernel of intensity ``I`` FLOPs per byte
    (a decode step's core reads the KV cache of its running sequences). No row efficiency
    ``η``: the kernel's tiles are query positions (prefill) or the query heads sharing a KV
    head (decode), not the step's sequences."""
    hw, model = node.hw, node.model
    rates = hw.attention_rates(model.attention_width / model.heads) if hw.attention else None
    peak = rates[0] if rates is not None else hw.peak_flops
    step = hw.rollout_step
    if model.attention_sinks and step is not None:  # a kernel of its own for sinks (ε_s)
        peak *= step.sink_attention_efficiency
    return min(peak, intensity * hw.mem_bandwidth)


def _prefill_chunks(node: _Node, prompt_len: int) -> int:
    """``k_p``: the scheduler steps one microbatch's prefill takes on one replica. With the
    hardware's :class:`~rpeg.ir.hardware.EngineStep` of token budget ``B``,
    ``k_p = ⌈b·Lp/B⌉`` (``b = n/(Pd·mb)``; vLLM's chunked prefill fills each step up to ``B``
    tokens); without one, 1 (the calibrated CPU meaning: the prefill is one step)."""
    step = node.hw.rollout_step
    if step is None:
        return 1
    return max(1, math.ceil(node.b * prompt_len / step.token_budget - 1e-9))


def _prefill_terms(node: _Node, prompt_len: int, head: Head) -> tuple[float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_over)`` of a generation's prefill over ``Lp`` for the node's
    sequences (the call overhead aside; the weight sync into the engine included).

    The prefill runs in ``k_p`` steps (:func:`_prefill_chunks`) of ``b·Lp/k_p`` tokens per
    replica and microbatch: each step's GEMMs run at the roofline of its own rows and read the
    weights once (``F_eff`` of a microbatch of ``b/k_p`` sequences), each step's tensor-parallel
    AllReduces carry its tokens (``2·(L/Pp)·mb·k_p`` of ``n·Lp·d·sb/(Pd·mb·k_p)``), and each
    step pays the engine step's ``c_step`` (``T_over += (mb + Pp − 1)·k_p·c_step``; under
    asynchronous scheduling ``min(c_w, c_step) + max(0, c_step − c_w − t_GPU)``,
    ``t_GPU = (T_gemm + T_tp)/((mb + Pp − 1)·k_p)`` one chunk's GPU seconds). With
    ``k_p = 1`` (no :class:`~rpeg.ir.hardware.EngineStep`, or ``b·Lp ≤ B``) this is the whole
    prefill as one pass. With an ``EngineStep`` the prompts' causal attention core runs as a
    kernel of its own (:func:`_engine_core_rate`), the roofline covering the rest; the engine's
    prefill efficiency ``η_p`` divides the roofline's part only, ``T_gemm = T_roof/η_p + T_core``
    (the kernel's rate is its own figure, not the GEMMs')."""
    model, s, sequences, hw = node.model, node.s, node.sequences, node.hw
    P, mb, pp, dp = node.n_devices, s.mb, s.pp, s.dp
    sb, d, layers = model.dtype_bytes, model.hidden, node.layers
    pre = hw.terms("prefill")
    w = prefill_flops(model, sequences=sequences, prompt_len=prompt_len, head=head)
    blocks = block_gemm_flops(model, sequences * prompt_len)
    chunks = _prefill_chunks(node, prompt_len)
    # the GPU engine (an EngineStep) runs the attention core as a kernel of its own
    core = sequences * attention_core_flops(model, prompt_len) if hw.rollout_step is not None else 0.0
    t_core = core / (P * _engine_core_rate(node)) if core > 0.0 else 0.0
    rest = w - core
    if rest <= 0.0:
        t_gemm = t_core
    else:
        roof = (
            node.roof if chunks == 1 else _Roofline(model, node.layout, hw, node.b / chunks, node.roof.served)
        )
        flops = roof.flops(rest / (P * mb * chunks), prompt_len, 0.0, blocks / rest)
        t_gemm = rest / (P * flops) / pre.efficiency + t_core
    t_tp = node.engine_tp_rounds(
        2 * layers * mb * chunks, sequences * prompt_len * d * sb / (dp * mb * chunks)
    )
    t_pp = node.pp_rounds(mb + pp - 2, prompt_len)
    t_over = node.slots * (pre.per_step_s + layers * pre.per_layer_s)
    if hw.rollout_step is not None:
        gpu = (t_gemm + t_tp) / (node.slots * chunks)  # one chunk's GPU seconds (async scheduling)
        t_over += node.slots * chunks * hw.rollout_step.exposed_step_s(gpu)
    sync = hw.weight_sync()
    if sync is not None:
        t_over += sync.alpha + model_params(model, head) * sb * sync.beta
    return t_gemm, t_tp, t_pp, t_over


def _decode_terms(
    node: _Node, context: float, steps: float, rounds: float, head: Head, windowed: float | None = None
) -> tuple[float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_over)`` of ``steps`` decode steps of the node's sequences at
    mean context ``c̄ = context``: one token per sequence and step, KV-cache reads
    ``b·c̄·2·d_kv,local·sb·L/Pp`` per step; ``rounds`` of the steps decode a decoded token (TP
    AllReduces and PP transfers; the first response token comes out of the prefill). With
    sliding-window blocks ``c̄`` in the attention FLOPs and the KV reads is the blocks' average
    (:meth:`~rpeg.ir.models.ModelSpec.attended`), ``windowed`` the windowed blocks' mean context
    ``E[min(c, W)]`` (``None``: ``min(c̄, W)``). With the hardware's
    :class:`~rpeg.ir.hardware.EngineStep` every step also pays its fixed seconds,
    ``T_over += steps·(mb + Pp − 1)·(c_step + [no CUDA graphs] (L/Pp)·c_launch)`` (under
    asynchronous scheduling ``min(c_w, c_step) + max(0, c_step − c_w − t_GPU)`` for ``c_step``,
    ``t_GPU`` one slot-step's GPU seconds: :func:`_decode_step_gpu_s`), and the
    attention core (:func:`~.flops.decode_attention_flops`) is a kernel of its own after the
    weight GEMMs, bound by its KV reads (:func:`_engine_core_rate`), ``T_gemm = T_roof/η_d +
    T_core``; without one, one roofline covers all the work and the KV reads (SPEC §6)."""
    model, s, sequences, hw = node.model, node.s, node.sequences, node.hw
    P, mb, pp, dp, tp = node.n_devices, s.mb, s.pp, s.dp, s.tp
    sb, d, layers = model.dtype_bytes, model.hidden, node.layers
    dec = hw.terms("decode")
    w = decode_flops_at(
        model, sequences=sequences, steps=steps, context=context, head=head, windowed=windowed
    )
    kv_reads = node.b * model.attended(context, windowed) * kv_scalars_per_device(model, tp) * sb * layers
    blocks = block_gemm_flops(model, sequences * steps)
    if hw.rollout_step is None:  # one roofline over all of it (SPEC §6; calibrated CPU files)
        t_gemm = node.gemm(w, w / (P * mb * steps), 1, kv_reads, blocks) / dec.efficiency
    else:  # the GPU engine: the weight GEMMs at the running batch, then the attention kernel
        core = decode_attention_flops(
            model, sequences=sequences, steps=steps, context=context, windowed=windowed
        )
        rest = w - core
        per_step = core / (P * mb * steps)  # the core's FLOPs per device and step
        rate = _engine_core_rate(node, per_step / kv_reads if kv_reads > 0.0 else math.inf)
        t_core = core / (P * rate) if core > 0.0 else 0.0
        t_gemm = node.gemm(rest, rest / (P * mb * steps), 1, 0.0, blocks) / dec.efficiency + t_core
    t_tp = node.engine_tp_rounds(2 * layers * rounds, sequences * d * sb / dp)
    t_pp = node.pp_rounds(rounds * (mb + pp - 2), 1)
    t_over = steps * node.slots * (dec.per_step_s + layers * dec.per_layer_s)
    if hw.rollout_step is not None:
        gpu = _decode_step_gpu_s(node, t_gemm + t_tp + t_pp, steps)
        t_over += steps * node.slots * hw.rollout_step.decode_step_s(layers, gpu)
    return t_gemm, t_tp, t_pp, t_over


def _decode_step_gpu_s(node: _Node, gpu_total: float, steps: float) -> float:
    """``t_GPU`` of one decode step of one pipeline slot: the stretch's GPU seconds
    (``T_gemm + T_tp + T_pp``) over its ``steps·(mb + Pp − 1)`` slot-steps; what an engine
    with asynchronous scheduling hides its host seconds behind
    (:meth:`~rpeg.ir.hardware.EngineStep.exposed_step_s`)."""
    return gpu_total / (steps * node.slots) if steps > 0 else 0.0


def _dp_link(node: _Node) -> Link:
    """The data-parallel link: the training engine's own (measured between one host's ranks)
    for intra-node data parallelism where the hardware has one, else the tier's collective; the
    tier is the slower of the data- and the context-parallel group's (ZeRO shards over both)."""
    tier = max(node.s.dp_tier, node.s.cp_tier)
    engine_dp = node.hw.data_parallel() if tier == 0 else None
    return engine_dp or node.hw.collective[tier]


def _zero_groups(node: _Node, head: Head) -> list[tuple[int, float]]:
    """``(ranks, bytes)`` of each group ZeRO's collectives run over (SPEC §14.3, §15.2): the
    non-expert weights ``(N_m − N_e)·sb/(Pp·Pt)`` over the ``Pd·Pc`` data- and context-parallel
    ranks, and a mixture of experts' routed experts ``N_e·sb/(Pp·Pet·Pe)`` over the
    ``Pt·Pd·Pc/(Pet·Pe)`` ranks holding the same experts (``Pd·Pc/Pe`` with the default
    ``Pet = Pt``; ``N_e = L·W_exp``)."""
    s, model = node.s, node.model
    sb = model.dtype_bytes
    experts = model.layers * model.expert_weights
    group = s.dp * s.cp
    out = [(group, (model_params(model, head) - experts) * sb / (s.pp * s.tp))]
    if experts:
        pet = s.expert_tp
        out.append((s.tp * group // (pet * s.ep), experts * sb / (s.pp * pet * s.ep)))
    return out


def _zero_collective(node: _Node, head: Head) -> float:
    """One ZeRO AllGather of the weight shards over their groups (:func:`_zero_groups`); a
    ReduceScatter of the gradient shards takes as long (the ring moves the same bytes)."""
    link = _dp_link(node)
    return sum(allgather_time(p, nbytes, link) for p, nbytes in _zero_groups(node, head))


def _gemm_and_core(
    node: _Node,
    work: float,
    passes: float,
    tokens: float,
    lengths: dict[str, float | None],
    forwards: int,
    backwards: int,
    block_work: float,
) -> float:
    """``T_gemm`` of ``work`` FLOPs, ``passes`` forward-equivalents per microbatch, whose attention
    core runs ``forwards`` forward and ``backwards`` backward passes (``docs/cost-model.md`` §2
    "The attention core"); ``block_work`` of the FLOPs are the blocks' weight GEMMs (FP8 for an FP8
    model, the core staying BF16; a MoE model's experts among them: :meth:`_Node.gemm`).

    Where the hardware rates its fused attention kernel (:meth:`Hardware.attention_rates
    <rpeg.ir.hardware.Hardware.attention_rates>` at the head width ``d_att/H``), the core runs at
    those rates and the rest at the roofline:
    ``T = (W − (n_f + 2·n_b)·n·A)/(P·F_eff) + (n·A/P)·(n_f/r_fwd + 2.5·n_b/r_bwd)``, ``A`` one
    sequence's forward core (:func:`~.flops.attention_core_flops`; rpeg counts a backward as two
    forwards, the kernel benchmarks' ``r_bwd`` as 2.5); ``node.core_s`` keeps the core's
    seconds. Otherwise the whole work runs at the roofline (SPEC's model)."""
    model, s = node.model, node.s
    per_device = node.n_devices * s.mb
    rates = node.hw.attention_rates(model.attention_width / model.heads) if node.hw.attention else None
    if rates is None:
        return node.gemm(work, work / (passes * per_device), tokens, 0.0, block_work)
    core = node.sequences * attention_core_flops(model, tokens, lengths["tokens_sq"], lengths["window_sq"])
    rest = max(0.0, work - (forwards + 2 * backwards) * core)
    node.core_s = core / node.n_devices * (forwards / rates[0] + 2.5 * backwards / rates[1])
    return node.gemm(rest, rest / (passes * per_device), tokens, 0.0, block_work) + node.core_s


def _inference_terms(
    node: _Node, lengths: dict[str, float | None], head: Head
) -> tuple[float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_dp)`` of a teacher-forced inference node over ``ℓ = E[ℓ]``
    (``Lp + Lr`` padded); ``T_dp`` is ZeRO-3's AllGather of ``N_m·sb/(Pp·Pt)`` per microbatch."""
    model, s = node.model, node.s
    ell = lengths["tokens"]
    w = inference_flops(model, head=head, **lengths)  # type: ignore[arg-type]
    blocks = block_gemm_flops(model, lengths["sequences"] * ell)  # type: ignore[operator]
    t_gemm = _gemm_and_core(node, w, 1.0, ell, lengths, 1, 0, block_work=blocks)
    t_tp = node.tp_rounds(2 * node.tp_layers * s.mb, node.rank_tokens(ell) * model.hidden * model.dtype_bytes)
    t_pp = node.pp_rounds(s.vp * s.mb + s.pp - 2, ell)
    t_dp = 0.0
    if s.zero == 3:
        t_dp = _exposed(s.mb * _zero_collective(node, head), t_gemm)
    return t_gemm, t_tp, t_pp, t_dp


def _exposed(gathers: float, compute: float) -> float:
    """The part of ZeRO-3's weight AllGathers that the compute does not hide,
    ``max(0, T_gather − T_gemm)``: FSDP prefetches the next unit's parameters while the current
    one computes (``docs/decisions.md``, "ZeRO-3 gathers overlap the compute")."""
    return max(0.0, gathers - compute)


def _training_terms(
    node: _Node, lengths: dict[str, float | None], head: Head, updates: int = 1
) -> tuple[float, float, float, float, float]:
    """``(T_gemm, T_tp, T_pp, T_dp, T_opt)`` of a training node over ``ℓ = Lp + Lr``.

    The strategy's recomputation mode sets the work ``W_T = f·W_I`` (:func:`~.flops.training_passes`;
    the intensity stays one forward-equivalent, ``W_T/(f·P·mb)``) and the TP AllReduces:
    ``6·(L/Pp)·mb`` for ``full`` (forward, recompute, backward), ``4·(L/Pp)·mb`` for ``none``
    and ``selective`` (the attention core sits between the column- and the row-parallel GEMM and
    needs no collective).
    """
    model, s, sequences, hw = node.model, node.s, node.sequences, node.hw
    P, mb, pp = node.n_devices, s.mb, s.pp
    sb = model.dtype_bytes
    ell = lengths["tokens"]
    passes = training_passes(model, s.recompute, ell, head, lengths["tokens_sq"])
    w = training_flops(model, head=head, recompute=s.recompute, **lengths)  # type: ignore[arg-type]
    if s.logits_chunk and head is not Head.SCALAR:  # the chunked loss recomputes the LM head
        w += sequences * ell * 2.0 * model.hidden * model.vocab
    # the weight GEMMs run in the forward, the backward's two (and a full recomputation's forward)
    gemm_passes = TRAINING_PASSES if s.recompute is Recompute.FULL else 3
    blocks = gemm_passes * block_gemm_flops(model, sequences * ell)
    core_forwards = 1 if s.recompute is Recompute.NONE else 2  # selective and full recompute the core
    t_gemm = _gemm_and_core(node, w, passes, ell, lengths, core_forwards, 1, block_work=blocks)
    rounds = 6 if s.recompute is Recompute.FULL else 4
    t_tp = node.tp_rounds(rounds * node.tp_layers * mb, node.rank_tokens(ell) * model.hidden * sb)
    t_pp = node.pp_rounds(s.vp * mb + 2 * pp - 3, ell)
    n_params = model_params(model, head)
    one = _zero_collective(node, head)
    if s.zero == 3:  # FSDP: gather per microbatch in the forward, the backward (and recompute)
        gathers = mb * (3 if s.recompute is Recompute.FULL else 2)
        t_dp = updates * one + _exposed(gathers * one, t_gemm)
    else:
        t_dp = updates * 2.0 * one  # a ReduceScatter of the gradients and an AllGather of the weights
    t_opt = updates * OPTIMIZER_TRAFFIC_BYTES * n_params / (P * hw.mem_bandwidth)
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


def host_offload_time(nbytes: float, hw: Hardware) -> tuple[float, float]:
    """Seconds to load an offloaded invocation's state before it runs and to offload it after
    (SPEC §14.4): ``(nbytes/BW_host, nbytes/BW_host)``, every device of the invocation moving
    its own ``nbytes`` over its own host link at once.

    Parameters
    ----------
    nbytes
        Bytes per device that live in host memory between runs: a trainer's ``12·N_s/Pd``
        (FP32 master weights and Adam moments), a forward pass's or a rollout engine's resident
        weights (:class:`~rpeg.scoring.costs.VertexMemory`).
    hw
        Supplies ``BW_host`` (:attr:`~rpeg.ir.hardware.Hardware.host_bandwidth`).

    Returns
    -------
    tuple[float, float]
        ``(load, offload)`` seconds.
    """
    if not nbytes >= 0:
        raise ValueError(f"host_offload_time: nbytes must be non-negative, got {nbytes!r}")
    t = nbytes / hw.host_bandwidth
    return t, t


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


def _overhead(seconds: float) -> TimeBreakdown:
    """A breakdown of fixed costs alone."""
    return TimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, seconds)


def _engine_part(terms: tuple[float, float, float, float], s: Strategy) -> TimeBreakdown:
    """The breakdown of a prefill's or a decode stretch's ``(T_gemm, T_tp, T_pp, T_over)``,
    with the pipeline's fill and drain ``T_gemm·(Pp − 1)/mb``."""
    gemm, tp, pp, over = terms
    return TimeBreakdown(gemm, gemm * (s.pp - 1) / s.mb, tp, pp, 0.0, 0.0, 0.0, over)


_ZERO = _overhead(0.0)


@dataclass(frozen=True, slots=True)
class DecodeSegment:
    """A stretch of a rollout engine's decode schedule (:func:`decode_schedule`).

    Attributes
    ----------
    running
        Sequences decoding in each step, over all data-parallel replicas.
    steps
        Decode steps of the stretch.
    rounds
        Of them, the steps whose input is a decoded token (the first comes out of the prefill).
    context
        Mean context of the running sequences, tokens.
    done
        The share of all the invocation's sequences that finish during the stretch.
    windowed
        With sliding-window blocks, their mean context ``E[min(c, W)]`` over the running
        sequences; ``None`` without a window.
    """

    running: float
    steps: float
    rounds: float
    context: float
    done: float
    windowed: float | None = None


def decode_schedule(
    *,
    sequences: float,
    dp: int,
    prompt_len: int,
    buckets: Sequence[LengthBucket],
    kv_tokens: float,
    model: ModelSpec | None = None,
    max_seqs: int = ROLLOUT_MAX_SEQS,
) -> list[DecodeSegment]:
    """A continuous-batching engine's decode schedule as stretches of constant running batch
    (SPEC §14.5), per data-parallel replica of ``n_r = n/Pd`` sequences whose cache holds
    ``C = kv_tokens`` tokens, with responses drawn from ``buckets`` (``Ē = Σ s_q·E[r]_q``):

    * the running batch is capped at ``b_cap = max(1, min(S, C/c̄_ss))``, ``S`` the engine's
      ``max_num_seqs`` and ``c̄_ss = Lp + E[r²]/(2·Ē)`` the mean context of a full engine in
      steady state (a running sequence's age is uniform over its length, and a sequence runs
      in proportion to its length);
    * when ``n_r > b_cap``, a **capped** stretch runs ``b_cap`` sequences at ``c̄_ss`` for
      ``(n_r − b_cap)·Ē/b_cap`` steps, admitting a waiting sequence whenever one finishes; it
      finishes the share ``1 − b_cap/n_r`` of the sequences;
    * then the last ``b_0 = min(n_r, b_cap)`` sequences **drain**, one stretch per bucket ``q``
      (steps ``t_{q−1}..t_q``): ``b_0·(1 − (F_{q−1} + F_q)/2)`` running (the bucket's mean; the
      CDF ``F`` is linear inside a bucket) at context ``Lp + (t_{q−1} + t_q)/2``, finishing
      ``(b_0/n_r)·s_q`` of the sequences. (The drained sequences are taken as fresh: their
      ages are not tracked, an overestimate of at most one bucket's steps.)

    The number of steps therefore exceeds ``Lr`` exactly when the cache bounds the batch.

    Sliding-window blocks (``model`` with a window ``W``; SPEC §15.1) cache at most ``W`` tokens
    of a sequence, so a running sequence at context ``c`` takes ``attended(c)`` of the cache's
    tokens (:meth:`~rpeg.ir.models.ModelSpec.attended`), and each stretch carries the windowed
    blocks' mean context ``E[min(c, W)]``: in steady state ``c̄_ss,W = c̄_ss − (E[(r − u)₊²] −
    (−u)₊²)/(2·Ē)`` with ``u = W − Lp`` (a running sequence's age ``a`` has density
    ``P(r > a)/Ē``, and ``∫₀^r (a − u)₊ da = ((r − u)₊² − (−u)₊²)/2``), so
    ``b_cap = max(1, min(S, C/attended(c̄_ss)))``; a drain stretch's is
    :meth:`~rpeg.ir.models.ModelSpec.windowed_mean` over its contexts.

    Parameters
    ----------
    sequences
        ``n``, sequences the invocation generates (all replicas).
    dp
        ``Pd``, the engine's data-parallel replicas.
    prompt_len
        ``Lp``.
    buckets
        The response-length distribution (:attr:`~rpeg.ir.workload.Workload.buckets`).
    kv_tokens
        ``C``, tokens one replica's KV cache holds (:func:`~.memory.kv_budget_tokens`).
    model
        The generated model, for its sliding-window blocks; ``None`` (or a model without a
        window): every block caches the whole context.
    max_seqs
        ``S``, the engine's sequences per step (default :data:`~.memory.ROLLOUT_MAX_SEQS`, verl's
        ``max_num_seqs``; a hardware's :class:`~rpeg.ir.hardware.EngineStep` names its own).

    Returns
    -------
    list of DecodeSegment
        The capped stretch (when there is one), then the drain's stretches, in order.
    """
    n_r = sequences / dp
    mean = sum(b.share * b.mean for b in buckets)
    mean_sq = sum(b.share * b.mean_square for b in buckets)
    c_ss = prompt_len + (mean_sq / (2.0 * mean) if mean > 0 else 0.0)
    windowed = model is not None and model.is_windowed
    c_ss_w = held = None
    if windowed:
        u = model.sliding_window - prompt_len
        before = max(0.0, -u) ** 2
        excess = sum(b.share * b.mean_excess_square(u) for b in buckets)
        c_ss_w = (
            c_ss - (excess - before) / (2.0 * mean)
            if mean > 0
            else float(min(prompt_len, model.sliding_window))
        )
        held = model.attended(c_ss, c_ss_w)
    b_cap = max(1.0, min(float(max_seqs), kv_tokens / (c_ss if held is None else held)))
    out: list[DecodeSegment] = []
    b0 = n_r
    if n_r > b_cap:
        steps = (n_r - b_cap) * mean / b_cap
        out.append(DecodeSegment(b_cap * dp, steps, steps, c_ss, 1.0 - b_cap / n_r, c_ss_w))
        b0 = b_cap
    below = 0.0
    for b in buckets:
        steps = b.hi - b.lo
        rounds = max(0, b.hi - max(b.lo, 1))
        running = b0 * (1.0 - below - 0.5 * b.share) * dp
        lo, hi = prompt_len + b.lo, prompt_len + b.hi
        drain_w = model.windowed_mean(lo, hi) if windowed else None
        out.append(
            DecodeSegment(
                running, steps, rounds, prompt_len + 0.5 * (b.lo + b.hi), b0 / n_r * b.share, drain_w
            )
        )
        below += b.share
    return out


def generation_times(
    model: ModelSpec,
    layout: Layout,
    hw: Hardware,
    *,
    sequences: float,
    prompt_len: int,
    buckets: Sequence[LengthBucket],
    head: Head = Head.LM,
    split: bool = False,
    host_s: float = 0.0,
) -> tuple[TimeBreakdown, ...]:
    """Time of a generation on a paged, continuously batching rollout engine (SPEC §14.5),
    whatever its placement: the prefill of all ``n`` prompts, then the decode stretches of
    :func:`decode_schedule` with the replica's cache ``C = K/κ``
    (:func:`~.memory.kv_budget_tokens`, the strategy's memory fraction), each priced as
    :func:`op_time`'s decode terms at its running batch and mean context.

    Unsplit, one :class:`TimeBreakdown`: one call, the prefill, every stretch, ``host_s``.
    Split into the ``Q`` response-length phases of SPEC §5 (rule 1), phase ``q`` ends when the
    share ``f_q`` of the sequences has finished: the stretches' times are laid end to end, the
    finished share grows linearly inside each, and each phase takes the part of each stretch
    between ``f_{q−1}`` and ``f_q``; phase 1 adds the call and the prefill, later phases a
    call each, and the last phase ``host_s``. With an unbounded cache the phases are the
    buckets' stretches exactly.

    With the hardware's :class:`~rpeg.ir.hardware.EngineStep` (GPU presets) the prefill runs in
    ``k_p`` chunks of the token budget and every chunk and decode step pays ``c_step``
    (:func:`_prefill_terms`, :func:`_decode_terms`); the running batch is capped at its
    ``max_seqs``; and the capped stretch, which admits the share ``1 − b_cap/n_r`` of the
    sequences, carries their chunks in ``min(S_c, k_p·(1 − b_cap/n_r))`` of its steps, which pay
    one ``c_step`` (and no eager launches), not two (``docs/cost-model.md`` §8).

    Parameters
    ----------
    model, layout, hw
        The model, the generation's layout (its memory fraction) and the hardware.
    sequences
        ``n``.
    prompt_len
        ``Lp``.
    buckets
        The response-length distribution.
    head
        Output head(s).
    split
        One breakdown per bucket (phase nodes) instead of one.
    host_s
        Host seconds after the last token (a rule reward, SPEC §14.8), charged to the last
        node.

    Returns
    -------
    tuple of TimeBreakdown
        One, or ``Q`` when ``split``.
    """
    s = layout.strategy
    pre, dec = hw.terms("prefill"), hw.terms("decode")
    step = hw.rollout_step
    kv = kv_budget_tokens(model, layout, hw, head)
    segments = decode_schedule(
        sequences=sequences,
        dp=s.dp,
        prompt_len=prompt_len,
        buckets=buckets,
        kv_tokens=kv,
        model=model,
        max_seqs=ROLLOUT_MAX_SEQS if step is None else step.max_seqs,
    )
    prefill = _ZERO
    chunks = 0
    if prompt_len > 0:
        whole = _Node(model, layout, hw, sequences, served=True)
        prefill = _engine_part(_prefill_terms(whole, prompt_len, head), s)
        chunks = _prefill_chunks(whole, prompt_len)
    parts = []
    for i, seg in enumerate(segments):
        if seg.steps <= 0 or seg.running <= 0:
            parts.append((_ZERO, seg.done))
            continue
        node = _Node(model, layout, hw, seg.running, served=True)
        bd = _engine_part(_decode_terms(node, seg.context, seg.steps, seg.rounds, head, seg.windowed), s)
        if step is not None and i == 0 and len(segments) > len(buckets):
            # the capped stretch admits the other sequences: their prefill chunks ride in its
            # decode steps (one step, one c_step; the chunk hides an eager step's launches)
            shared = min(seg.steps, chunks * seg.done)
            gpu = _decode_step_gpu_s(node, bd.gemm + bd.tp_comm + bd.pp_comm, seg.steps)
            bd = bd + _overhead(-shared * node.slots * step.decode_step_s(node.layers, gpu))
        parts.append((bd, seg.done))
    call = _overhead(pre.per_call_s + hw.dispatch_s)
    host = _overhead(host_s)
    if not split:
        total = call + prefill
        for bd, _ in parts:
            total = total + bd
        return (total + host,)
    bounds, f = [], 0.0
    for b in buckets:
        f += b.share
        bounds.append(f)
    bounds[-1] = 1.0
    phases = [call + prefill] + [_overhead(dec.per_call_s + hw.dispatch_s) for _ in buckets[1:]]
    lo = 0.0
    for bd, done in parts:
        hi = lo + done
        for q in range(len(buckets)):
            a = max(lo, bounds[q - 1] if q else 0.0)
            b = min(hi, bounds[q])
            if b > a and hi > lo:
                phases[q] = phases[q] + bd.scaled((b - a) / (hi - lo))
        lo = hi
    phases[-1] = phases[-1] + host
    return tuple(phases)
