"""Expert parallelism of the torch engine (SPEC §15.2): each rank of an EP group holds ``E/Pe``
experts of every mixture-of-experts layer and tokens travel to their experts by AlltoAll.

:class:`ParallelExperts` takes the place of a ``transformers`` MoE layer's ``mlp.experts`` module
(Qwen3-MoE's ``Qwen3MoeExperts``: stacked ``gate_up_proj [E, 2·d_e, d]`` and
``down_proj [E, d, d_e]``) with the same call — hidden states ``[T, d]``, the router's top-``k``
expert ids and weights ``[T, k]`` — and the same parameter names, holding rows
``e·E/Pe … (e + 1)·E/Pe − 1`` (EP rank ``e``). Its forward is the dispatch/combine of Megatron's
AlltoAll token dispatcher:

1. each of the ``T·k`` (token, expert) assignments goes to the rank holding the expert; the
   assignments are sorted by that rank and the counts exchanged (one AlltoAll of ``Pe`` integers);
2. *dispatch*: one AlltoAll sends each assignment's hidden state (and, beside it, the local
   expert index) to its rank;
3. each local expert ``j`` runs its SiLU-gated FFN ``down_j(silu(gate_j x) ⊙ up_j x)`` on the
   rows sent to it;
4. *combine*: one AlltoAll returns the rows in the order they came, and each token sums its ``k``
   results weighted by the router's weights.

The two data AlltoAlls are ``torch.distributed._functional_collectives.all_to_all_single_autograd``
(the backward runs the reverse exchange), so an expert's gradient collects every EP rank's tokens routed
to it, and the router's gradient stays local. Every rank of the EP group must run the same passes
in the same order (the callers run all of a node's microbatches on every rank, an empty one as a
dummy sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["EXPERT_SHARD", "ExpertGroup", "ParallelExperts", "expert_shard"]

#: Attribute of a parameter sharded over the EP group: ``(Pe, e)``.
EXPERT_SHARD = "_rpeg_expert_shard"


def expert_shard(p: Tensor) -> tuple[int, int] | None:
    """``(Pe, e)`` of a parameter that EP rank ``e`` of ``Pe`` holds a dim-0 block of, else ``None``."""
    return getattr(p, EXPERT_SHARD, None)


@dataclass(frozen=True)
class ExpertGroup:
    """One rank's expert-parallel group: ``size`` ranks (``Pe``), this one ``index``, and the
    group of the ranks that hold the same experts (the expert-data-parallel group, ``None`` when
    ``Pd·Pc = Pe``) whose gradients are summed after a backward."""

    group: Any
    size: int
    index: int
    replicas: Any = None


class ParallelExperts(nn.Module):
    """The experts of one EP rank of one MoE layer (module docstring).

    Parameters
    ----------
    experts
        The layer's ``transformers`` experts module (its shapes and activation; its tensors are
        not kept).
    ep
        This rank's :class:`ExpertGroup`.

    Raises
    ------
    ValueError
        If ``Pe`` does not divide the layer's experts.
    """

    def __init__(self, experts: nn.Module, ep: ExpertGroup) -> None:
        super().__init__()
        total = experts.num_experts
        if total % ep.size:
            raise ValueError(f"ParallelExperts: ep={ep.size} does not divide the layer's {total} experts")
        self.num_experts, self.ep = total, ep
        self.local = total // ep.size
        self.first = ep.index * self.local
        self.act_fn = experts.act_fn
        rows = slice(self.first, self.first + self.local)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[rows].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[rows].clone())
        for p in (self.gate_up_proj, self.down_proj):
            setattr(p, EXPERT_SHARD, (ep.size, ep.index))

    def _expert(self, j: int, x: Tensor) -> Tensor:
        """Local expert ``j``'s FFN on rows ``x``: ``down(silu(gate x) ⊙ up x)``."""
        gate, up = nn.functional.linear(x, self.gate_up_proj[j]).chunk(2, dim=-1)
        return nn.functional.linear(self.act_fn(gate) * up, self.down_proj[j])

    def forward(self, hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        """``Σ_k w_{t,k}·FFN_{e(t,k)}(x_t)`` for each token ``t``, the experts on their EP ranks."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        group, size = self.ep.group, self.ep.size
        tokens, k = top_k_index.shape
        expert = top_k_index.reshape(-1)
        token = torch.arange(tokens, device=hidden.device).repeat_interleave(k)
        weight = top_k_weights.reshape(-1)
        dest = torch.div(expert, self.local, rounding_mode="floor")
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        rows = sum(recv_sizes)
        x = all_to_all_single_autograd(hidden[token[order]], recv_sizes, send_sizes, group)
        local_expert = torch.empty(rows, dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(
            local_expert,
            (expert[order] - dest[order] * self.local).contiguous(),
            output_split_sizes=recv_sizes,
            input_split_sizes=send_sizes,
            group=group,
        )
        y = x.new_zeros(x.shape)
        for j in range(self.local):
            mine = torch.nonzero(local_expert == j).squeeze(1)
            if len(mine):
                y = y.index_add(0, mine, self._expert(j, x[mine]))
        back = all_to_all_single_autograd(y, send_sizes, recv_sizes, group)
        out = hidden.new_zeros(hidden.shape)
        return out.index_add(0, token[order], back * weight[order, None].to(back.dtype))

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """Sum this rank's expert gradients over the ranks holding the same experts (after an
        update's last backward; no-op without such ranks). A gradient no token produced counts 0."""
        if self.ep.replicas is None:
            return
        for p in (self.gate_up_proj, self.down_proj):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.ep.replicas)
