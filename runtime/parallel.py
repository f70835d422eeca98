"""Parallel building blocks of a worker group: process groups, ZeRO-style Adam, weight shards.

Everything here runs inside one worker process (one rank of one group) and uses PyTorch itself:
``torch.distributed`` process groups (gloo on CPU, NCCL on GPU), DTensor tensor parallelism and
point-to-point sends between pipeline stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Mesh", "ShardedAdam", "assemble", "local", "publication", "shard_of"]


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of a DTensor (the tensor itself otherwise)."""
    return t.to_local() if hasattr(t, "to_local") else t


def shard_dim(p: torch.Tensor) -> int | None:
    """Dimension a DTensor parameter is sharded on over the TP mesh (``None``: replicated)."""
    placements = getattr(p, "placements", None)
    if not placements:
        return None
    pl = placements[0]
    return pl.dim if hasattr(pl, "dim") else None


@dataclass
class Mesh:
    """This rank's coordinates and process groups in a ``(dp, pp, tp)`` group.

    ``rank = d·(Pp·Pt) + p·Pt + t``; :attr:`tp_mesh` is the DTensor device mesh of the TP
    dimension, :attr:`dp_group` the gloo/NCCL group of the ranks holding the same shard.
    """

    rank: int
    dp: int
    pp: int
    tp: int
    d: int
    p: int
    t: int
    tp_mesh: object
    dp_group: object
    pp_group: object

    def global_rank(self, d: int, p: int, t: int) -> int:
        """Rank of coordinates ``(d, p, t)``."""
        return d * self.pp * self.tp + p * self.tp + t

    @property
    def first(self) -> bool:
        """First pipeline stage."""
        return self.p == 0

    @property
    def last(self) -> bool:
        """Last pipeline stage."""
        return self.p == self.pp - 1

    def next_rank(self) -> int:
        """Same DP/TP coordinate on the next stage."""
        return self.global_rank(self.d, self.p + 1, self.t)

    def prev_rank(self) -> int:
        """Same DP/TP coordinate on the previous stage."""
        return self.global_rank(self.d, self.p - 1, self.t)

    def first_rank(self) -> int:
        """Same DP/TP coordinate on the first stage."""
        return self.global_rank(self.d, 0, self.t)

    def last_rank(self) -> int:
        """Same DP/TP coordinate on the last stage."""
        return self.global_rank(self.d, self.pp - 1, self.t)


def make_mesh(rank: int, dp: int, pp: int, tp: int, device_type: str) -> Mesh:
    """Create the ``(dp, pp, tp)`` device mesh of an initialised default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    d, p, t = rank // (pp * tp), (rank // tp) % pp, rank % tp
    return Mesh(rank, dp, pp, tp, d, p, t, mesh["tp"], mesh.get_group("dp"), mesh.get_group("pp"))


class ShardedAdam:
    """Adam with optimizer state sharded over the data-parallel group (ZeRO-2 style).

    Gradients are summed over the ``Pd`` ranks (losses are already divided by the global token
    count, so the sum is the global-batch gradient); rank ``d`` keeps Adam moments only for its
    ``⌈N/Pd⌉`` slice of the flattened local parameters, updates that slice and all-gathers the
    updated slices back (gloo has no ReduceScatter, so the gradient reduction is an AllReduce;
    the optimizer-state memory is still ``1/Pd``). The update is standard Adam::

        m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²,
        θ ← θ − lr·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε)

    Parameters
    ----------
    params
        Parameters of this rank (DTensor or plain).
    group
        The DP process group.
    lr, betas, eps
        Adam hyper-parameters.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        group: object,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = params
        self.group = group
        self.lr, self.betas, self.eps = lr, betas, eps
        self.world = dist.get_world_size(group)
        self.index = dist.get_rank(group)
        self.numel = sum(local(p).numel() for p in params)
        self.chunk = math.ceil(self.numel / self.world)
        self.lo = min(self.numel, self.index * self.chunk)
        self.hi = min(self.numel, self.lo + self.chunk)
        n = self.hi - self.lo
        self.m = torch.zeros(n)
        self.v = torch.zeros(n)
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        """One update from the accumulated ``.grad`` fields; gradients are zeroed after."""
        grads = []
        for p in self.params:
            g = p.grad
            grads.append(torch.zeros(local(p).numel()) if g is None else local(g).reshape(-1).float())
        flat_g = torch.cat(grads)
        if self.world > 1:
            dist.all_reduce(flat_g, group=self.group)
        flat = torch.cat([local(p).detach().reshape(-1) for p in self.params])
        self.t += 1
        b1, b2 = self.betas
        g = flat_g[self.lo : self.hi]
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        mhat = self.m / (1 - b1**self.t)
        vhat = self.v / (1 - b2**self.t)
        seg = flat[self.lo : self.hi] - self.lr * mhat / (vhat.sqrt() + self.eps)
        if self.world > 1:
            flat = self._gather(seg)
        else:
            flat[self.lo : self.hi] = seg
        off = 0
        for p in self.params:
            lp = local(p)
            k = lp.numel()
            lp.copy_(flat[off : off + k].view_as(lp))
            off += k
            p.grad = None

    def _gather(self, seg: torch.Tensor) -> torch.Tensor:
        """The flat vector whose slice ``[lo, hi)`` each DP rank holds as ``seg`` (AllGather of
        the slices padded to ``⌈N/Pd⌉``)."""
        if self.world == 1:
            return seg.clone()
        padded = torch.zeros(self.chunk)
        padded[: seg.numel()] = seg
        parts = [torch.zeros(self.chunk) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat(parts)[: self.numel]

    def full_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` and ``v`` of all ``N`` local parameter elements (a collective over the DP group:
        every rank calls it)."""
        return self._gather(self.m), self._gather(self.v)

    def load_full_moments(self, m: torch.Tensor, v: torch.Tensor, t: int) -> None:
        """Keep this rank's slice ``[lo, hi)`` of full moments and set the step counter."""
        self.m.copy_(m[self.lo : self.hi])
        self.v.copy_(v[self.lo : self.hi])
        self.t = int(t)

    def state(self) -> dict[str, object]:
        """Moments and step counter of this rank's slice (for checkpoints)."""
        return {"m": self.m.clone(), "v": self.v.clone(), "t": self.t, "lo": self.lo, "hi": self.hi}

    def load_state(self, state: dict[str, object]) -> None:
        """Restore :meth:`state` (same layout only)."""
        if (state["lo"], state["hi"]) != (self.lo, self.hi):
            raise ValueError(
                f"optimizer shard [{state['lo']}, {state['hi']}) does not match this rank's "
                f"[{self.lo}, {self.hi}); resuming needs the same training layout"
            )
        self.m.copy_(state["m"])  # type: ignore[arg-type]
        self.v.copy_(state["v"])  # type: ignore[arg-type]
        self.t = int(state["t"])  # type: ignore[arg-type]


def publication(
    model: torch.nn.Module, *, include_replicated: bool, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, tuple[torch.Tensor, int | None]]:
    """This rank's weights as ``name → (local tensor copy, TP shard dim or None)``.

    Replicated tensors are included only when ``include_replicated`` (TP rank 0), so a
    publication of a group carries every byte of the model exactly once per DP replica.
    ``weights`` (local tensors by name, e.g. a kept snapshot) replace the model's current ones.
    """
    out = {}
    for name, p in model.state_dict().items():
        dim = shard_dim(p)
        if dim is None and not include_replicated:
            continue
        out[name] = ((local(p).detach() if weights is None else weights[name]).clone(), dim)
    return out


def assemble(pubs: list[tuple[int, dict[str, tuple[torch.Tensor, int | None]]]]) -> dict[str, torch.Tensor]:
    """Full tensors from the publications of one DP replica: TP shards concatenated along their
    shard dimension in TP-rank order; pipeline stages contribute disjoint names.

    Parameters
    ----------
    pubs
        ``(tp_rank, publication)`` pairs.
    """
    pieces: dict[str, list[tuple[int, torch.Tensor, int | None]]] = {}
    for t, pub in pubs:
        for name, (tensor, dim) in pub.items():
            pieces.setdefault(name, []).append((t, tensor, dim))
    full = {}
    for name, ps in pieces.items():
        ps.sort(key=lambda x: x[0])
        dim = ps[0][2]
        full[name] = ps[0][1] if dim is None else torch.cat([x[1] for x in ps], dim=dim)
    return full


def shard_of(full: torch.Tensor, p: torch.Tensor, tp: int, t: int) -> torch.Tensor:
    """The slice of ``full`` that parameter ``p`` holds on TP rank ``t`` (``torch.chunk``
    semantics, as DTensor's ``Shard``)."""
    dim = shard_dim(p)
    return full if dim is None else torch.chunk(full, tp, dim=dim)[t]
