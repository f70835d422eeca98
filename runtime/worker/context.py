"""Context parallelism of the torch engine (SPEC §15.3): ring and Ulysses attention over a CP group.

A context-parallel group of ``Pc`` ranks splits every sequence of a training or log-prob pass along
its positions. The split is Megatron's load-balanced *zigzag* one: the ``S`` positions are cut into
``2·Pc`` equal chunks and rank ``c`` holds chunks ``c`` and ``2·Pc − 1 − c``, so under a causal mask
every rank attends over the same number of (query, key) pairs (:func:`zigzag_positions`). Every
layer but attention is position-wise and runs on the local positions as it is; attention needs the
keys and values of the others' positions, exchanged in one of two ways (``Strategy.cp_kind``):

``ring``
    Ring attention (Liu et al., 2023; Megatron's ``cp_comm_type="p2p"``): ``Pc`` steps; at step
    ``k`` a rank attends its queries over the key/value block of rank ``c − k`` (its own at step 0)
    while it passes that block on to rank ``c + 1`` (:class:`_Rotate`, a point-to-point send and
    receive whose backward sends the gradient the other way). The blocks' partial results merge by
    the online softmax: with ``m`` the running row maximum of the scores, ``l`` the running sum of
    ``exp(s − m)`` and ``a`` the running ``Σ exp(s − m)·v``, a block with row maximum ``m_k``
    updates ``m' = max(m, m_k)``, ``l' = l·e^{m − m'} + l_k·e^{m_k − m'}``,
    ``a' = a·e^{m − m'} + a_k·e^{m_k − m'}``, and the output is ``a/l`` — the same softmax as one
    pass over all keys, without ever holding more than one block's scores.
``ulysses``
    DeepSpeed-Ulysses (Jacobs et al., 2023; Megatron's ``"a2a"``): one AlltoAll turns ``q, k, v``
    from ``[heads, local positions]`` into ``[heads/Pc, all positions]``, attention runs on whole
    sequences for a ``1/Pc`` share of the heads, and one AlltoAll turns the output back. Needs
    ``Pc | heads``; key/value heads that ``Pc`` does not divide are repeated to the query heads
    first (exact; more bytes than verl's repeat to ``Pc``).

The attention function is registered with ``transformers``' attention interface as
:data:`ATTENTION` and finds the group on the attention module it is called for
(:meth:`ContextParallel.attach` sets it on every layer's), so the decoder layers of every family
run it unmodified, in the forward and in a recomputing backward alike. The causal
mask is built from the positions, not from the layout of the local tensor. Collectives are
``torch.distributed``'s (gloo on CPU, NCCL on GPU); the autograd-aware AlltoAll is
``torch.distributed._functional_collectives.all_to_all_single_autograd`` (the public
``torch.distributed.nn.functional.all_to_all_single`` is deprecated in its favour).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ...ir.plan import CP_KINDS  # the exchanges ContextParallel runs (Strategy.cp_kind)

__all__ = [
    "ATTENTION",
    "ContextParallel",
    "register",
    "zigzag_positions",
]

#: Name of the attention implementation in ``transformers``' ``AttentionInterface``.
ATTENTION = "rpeg_context_parallel"


#: Attribute of an attention module that holds its :class:`ContextParallel`.
_ATTR = "rpeg_context"


def zigzag_positions(length: int, size: int, index: int) -> Tensor:
    """Positions of rank ``index`` of ``size`` in a sequence of ``length``: chunks ``index`` and
    ``2·size − 1 − index`` of ``2·size`` equal ones (Megatron's load-balanced causal split).

    Raises
    ------
    ValueError
        If ``2·size`` does not divide ``length``, or ``index`` is not a rank of ``size``.
    """
    if size < 1 or not 0 <= index < size:
        raise ValueError(f"zigzag_positions: index={index!r} is not a rank of size={size!r}")
    if length % (2 * size):
        raise ValueError(
            f"context parallelism over {size} ranks cuts each sequence into 2·{size} = {2 * size} equal "
            f"chunks; the sequence length {length} is not a multiple of {2 * size}"
        )
    chunk = length // (2 * size)
    first = torch.arange(index * chunk, (index + 1) * chunk)
    mirror = 2 * size - 1 - index
    return torch.cat([first, torch.arange(mirror * chunk, (mirror + 1) * chunk)])


@dataclass
class ContextParallel:
    """One rank's context-parallel group: ``size`` ranks, this one ``index``, exchanging by ``kind``.

    Parameters
    ----------
    group
        The process group of the ``Pc`` ranks that hold the same sequences (rank ``c`` of the
        group is CP rank ``c``).
    size, index
        ``Pc`` and this rank's ``c``.
    kind
        ``"ring"`` or ``"ulysses"``.
    """

    group: Any
    size: int
    index: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in CP_KINDS:
            raise ValueError(f"ContextParallel: kind={self.kind!r} is not one of {', '.join(CP_KINDS)}")

    def positions(self, length: int, index: int | None = None) -> Tensor:
        """Positions of CP rank ``index`` (this one by default) in a sequence of ``length``."""
        return zigzag_positions(length, self.size, self.index if index is None else index)

    def attach(self, model: torch.nn.Module) -> None:
        """Make every attention module of ``model`` (those with a ``q_proj``) exchange over this
        group; the model's config must name :data:`ATTENTION` as its implementation."""
        register()
        for module in model.modules():
            if hasattr(module, "q_proj"):
                setattr(module, _ATTR, self)

    # ------------------------------------------------------------------ attention
    def attention(self, q: Tensor, k: Tensor, v: Tensor, scaling: float) -> Tensor:
        """Causal attention of this rank's queries over the whole sequence's keys.

        ``q`` is ``[b, h, s, hd]``, ``k`` and ``v`` ``[b, h_kv, s, hd]`` at this rank's positions
        (``s = S/Pc``); returns ``[b, s, h, hd]`` (``transformers``' layout after attention).
        """
        length = self.size * q.shape[2]
        if self.kind == "ring":
            out = self._ring(q, k, v, scaling, length)
        else:
            out = self._ulysses(q, k, v, scaling, length)
        return out.transpose(1, 2).contiguous()

    def _ring(self, q: Tensor, k: Tensor, v: Tensor, scaling: float, length: int) -> Tensor:
        groups = q.shape[1] // k.shape[1]
        q_pos = self.positions(length).to(q.device)
        acc = total = peak = None
        for step in range(self.size):
            if step:  # pass the block on: it came from rank c − step
                k, v = _Rotate.apply(k, self.group), _Rotate.apply(v, self.group)
            source = (self.index - step) % self.size
            k_pos = self.positions(length, source).to(q.device)
            visible = q_pos[:, None] >= k_pos[None, :]  # [s, s]
            kk, vv = (
                (k, v) if groups == 1 else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
            )
            scores = (q @ kk.transpose(-1, -2)) * scaling
            scores = scores.masked_fill(~visible, float("-inf"))
            block_max = scores.amax(dim=-1, keepdim=True)
            if peak is None:  # step 0: the own block, where every query sees at least itself
                exp = torch.exp(scores - block_max)
                peak, total, acc = block_max, exp.sum(-1, keepdim=True), exp @ vv
                continue
            # a row that sees nothing of this block keeps the running maximum (its exp terms are 0)
            block_max = torch.where(torch.isinf(block_max), peak, block_max)
            new_peak = torch.maximum(peak, block_max)
            exp = torch.exp(scores - block_max)
            old_w, new_w = torch.exp(peak - new_peak), torch.exp(block_max - new_peak)
            total = total * old_w + exp.sum(-1, keepdim=True) * new_w
            acc = acc * old_w + (exp @ vv) * new_w
            peak = new_peak
        assert acc is not None and total is not None
        return acc / total

    def _ulysses(self, q: Tensor, k: Tensor, v: Tensor, scaling: float, length: int) -> Tensor:
        heads, kv_heads = q.shape[1], k.shape[1]
        if heads % self.size:
            raise ValueError(
                f"Ulysses context parallelism over {self.size} ranks needs the local query heads "
                f"({heads}) divisible by {self.size}"
            )
        if kv_heads % self.size:  # repeat to the query heads (exact)
            k = k.repeat_interleave(heads // kv_heads, 1)
            v = v.repeat_interleave(heads // kv_heads, 1)
        q, k, v = (self._heads_to_sequence(x) for x in (q, k, v))
        pos = torch.cat([self.positions(length, r) for r in range(self.size)]).to(q.device)
        visible = pos[:, None] >= pos[None, :]
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scaling)
        return self._sequence_to_heads(out)

    def _heads_to_sequence(self, x: Tensor) -> Tensor:
        """``[b, h, s, hd]`` at local positions → ``[b, h/Pc, Pc·s, hd]``, the positions of CP rank 0
        first (one AlltoAll)."""
        b, h, s, hd = x.shape
        send = x.reshape(b, self.size, h // self.size, s, hd).transpose(0, 1).contiguous()
        recv = _all_to_all(send, self.group)  # [source rank, b, h/Pc, s, hd]
        return recv.permute(1, 2, 0, 3, 4).reshape(b, h // self.size, self.size * s, hd)

    def _sequence_to_heads(self, x: Tensor) -> Tensor:
        """The inverse of :meth:`_heads_to_sequence`: ``[b, h/Pc, Pc·s, hd]`` → ``[b, h, s, hd]``."""
        b, hg, total, hd = x.shape
        s = total // self.size
        send = x.reshape(b, hg, self.size, s, hd).permute(2, 0, 1, 3, 4).contiguous()
        recv = _all_to_all(send, self.group)  # [head group, b, h/Pc, s, hd]
        return recv.transpose(0, 1).reshape(b, self.size * hg, s, hd)


def _all_to_all(x: Tensor, group: Any) -> Tensor:
    """AlltoAll of the dim-0 blocks of ``x`` (block ``r`` to rank ``r``), with autograd."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(x, None, None, group)


def _exchange(x: Tensor, group: Any, shift: int) -> Tensor:
    """Send ``x`` to rank ``c + shift`` of ``group`` and return what rank ``c − shift`` sent."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    ops = [
        dist.P2POp(dist.isend, x, group=group, group_peer=(rank + shift) % size),
        dist.P2POp(dist.irecv, out, group=group, group_peer=(rank - shift) % size),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return out


class _Rotate(torch.autograd.Function):
    """One ring step: a block moves from rank ``c`` to rank ``c + 1``; its gradient moves back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _exchange(x, group, +1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _exchange(grad, ctx.group, -1), None


def _attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **_: object,
) -> tuple[Tensor, None]:
    """``transformers``' attention-function protocol over the module's CP group (causal)."""
    cp = getattr(module, _ATTR, None)
    if cp is None:
        raise RuntimeError(
            f"{ATTENTION}: attention module {type(module).__name__} has no context-parallel group"
        )
    if dropout:
        raise ValueError(f"{ATTENTION}: attention dropout {dropout} is not supported")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    return cp.attention(query, key, value, scale), None


_REGISTERED = False


def register() -> None:
    """Register :data:`ATTENTION` with ``transformers.AttentionInterface`` (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)
    _REGISTERED = True
