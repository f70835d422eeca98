"""Parallel building blocks of a worker group: process groups, data-parallel optimizers, weight shards.

Everything here runs inside one worker process (one rank of one group) and uses PyTorch itself:
``torch.distributed`` process groups (gloo on CPU, NCCL on GPU), DTensor tensor parallelism,
FSDP2 (``fully_shard``) for the data-parallel optimizer state and point-to-point sends between
pipeline stages.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .experts import expert_shard

__all__ = [
    "FSDPAdam",
    "FSDPShards",
    "Mesh",
    "PackedShare",
    "RankGroups",
    "assemble",
    "local",
    "make_mesh",
    "plan_groups",
    "publication",
    "shard_of",
    "shareable",
    "world_mesh",
]


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of a DTensor (the tensor itself otherwise)."""
    return t.to_local() if hasattr(t, "to_local") else t


def shard_dim(p: torch.Tensor) -> int | None:
    """Dimension a DTensor parameter is sharded on over the TP mesh (``None``: replicated); 0 for
    stacked experts an EP rank holds a block of (:func:`~rpeg.runtime.worker.experts.expert_shard`)."""
    if expert_shard(p) is not None:
        return 0
    placements = getattr(p, "placements", None)
    if not placements:
        return None
    pl = placements[0]
    return pl.dim if hasattr(pl, "dim") else None


@dataclass
class Mesh:
    """This rank's coordinates and process groups in a ``(dp, pp, tp)`` group.

    ``rank = d·(Pp·Pt) + p·Pt + t`` is the rank in the group (:attr:`group`); the group is a
    subgroup of the run's world (one rank per device process, :func:`plan_groups`).
    :attr:`tp_mesh` is the DTensor device mesh of the TP dimension, :attr:`dp_group` the gloo/NCCL
    group of the ranks holding the same shard. :meth:`next_rank` and the others name ranks of
    :attr:`group` (``group_dst``/``group_src`` of a point-to-point send).
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
    dp_mesh: object = None
    group: object = None
    cp: int = 1
    cp_group: object = None
    ep: int = 1
    ep_group: object = None
    ep_replicas_group: object = None

    @property
    def e(self) -> int:
        """The rank's expert-parallel index ``d mod Pe`` (EP groups are blocks of ``Pe``
        consecutive weight replicas)."""
        return self.d % self.ep

    @property
    def data_rank(self) -> int:
        """The rank's data-parallel index ``d // Pc``: context-parallel ranks (``cp > 1``) count
        as weight replicas in :attr:`d` (replica ``d = data_rank·Pc + c``) but share sequences."""
        return self.d // self.cp

    @property
    def c(self) -> int:
        """The rank's context-parallel index ``d mod Pc``."""
        return self.d % self.cp

    def global_rank(self, d: int, p: int, t: int) -> int:
        """Rank of coordinates ``(d, p, t)`` in the group."""
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


@dataclass
class RankGroups:
    """One rank's process groups in one worker group (:func:`plan_groups`): the whole group and,
    per mesh dimension ``dp``, ``pp``, ``tp``, the subgroup of the ranks that differ from it in
    that coordinate only; ``mesh`` is the group's world ranks as a ``(dp, pp, tp)`` tensor and
    ``tag`` names the group's mesh dimensions apart from every other mesh of the process
    (:func:`make_mesh`)."""

    rank: int
    whole: object
    dims: dict[str, object]
    mesh: torch.Tensor
    tag: str


#: Worlds this process has made process groups in (:func:`plan_groups`), for :attr:`RankGroups.tag`.
_WORLDS = itertools.count()


def plan_groups(
    layouts: list[tuple[int, ...]], world_rank: int, timeout: Any = None
) -> dict[int, RankGroups]:
    """Create the process groups of every worker group of a run, as subgroups of its world.

    The world is one rank per device process; a worker group with world ranks ``ranks`` (rank
    ``r`` of the group runs in the process of world rank ``ranks[r]``) and degrees ``(dp, pp, tp)``
    gets a group of all its ranks and one subgroup per line of its ``(dp, pp, tp)`` rank tensor
    along each dimension. ``torch.distributed.new_group`` needs every process of the world to call
    it for every group, in the same order, members or not (a non-member's call only counts the
    group; no barrier is taken): every process calls this with the same ``layouts``, ``(gid,
    ranks, dp, pp, tp)`` in gid order. ``timeout`` (a ``datetime.timedelta``; ``None``: the
    world's) bounds the groups' rendezvous and collectives.

    A sixth element ``cp`` (context parallelism, 1 by default) makes the group's ``dp`` weight
    replicas ``dp/cp`` data-parallel ranks of ``cp`` context-parallel ones each (replica
    ``d·cp + c``): a subgroup ``"cp"`` per line of the ``(dp/cp, cp, pp, tp)`` rank tensor along
    its second dimension is made too. A seventh, ``ep`` (expert parallelism), groups the replicas
    in blocks of ``ep`` consecutive ones, each holding all experts between them: subgroups
    ``"ep"`` along the second dimension of the ``(dp/ep, ep, pp, tp)`` rank tensor and
    ``"ep_replicas"`` (the ranks holding the same experts) along its first, where longer than 1.

    Returns
    -------
    dict
        gid → :class:`RankGroups` of the groups this process (``world_rank``) belongs to.

    A group's ranks must be increasing world ranks: ``new_group`` numbers a group's members in
    world order, and rank ``r`` of the group must be member ``r`` (a plan's allocations are
    ascending device ids, and the world ranks follow the devices).

    Raises
    ------
    ValueError
        A group whose ranks are not ``dp·pp·tp`` distinct, increasing world ranks.
    """
    out: dict[int, RankGroups] = {}
    world = next(_WORLDS)
    for gid, ranks, dp, pp, tp, *rest in layouts:
        cp = rest[0] if rest else 1
        ep = rest[1] if len(rest) > 1 else 1
        if dp % cp or dp % ep:
            raise ValueError(f"group g{gid}: {dp} weight replicas are not a multiple of cp={cp} and ep={ep}")
        if len(ranks) != dp * pp * tp or list(ranks) != sorted(set(ranks)):
            raise ValueError(
                f"group g{gid}: world ranks {list(ranks)} are not {dp}·{pp}·{tp} distinct ranks in increasing "
                "order (torch.distributed numbers a group's ranks in world order)"
            )
        whole = dist.new_group(list(ranks), timeout=timeout)
        mesh = torch.tensor(ranks, dtype=torch.int).view(dp, pp, tp)
        dims: dict[str, object] = {}
        for dim, name in enumerate(("dp", "pp", "tp")):
            lines = mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist()
            for line in lines:
                sub = dist.new_group(line, timeout=timeout)
                if world_rank in line:
                    dims[name] = sub
        if cp > 1:
            for line in mesh.view(dp // cp, cp, pp, tp).movedim(1, -1).reshape(-1, cp).tolist():
                sub = dist.new_group(line, timeout=timeout)
                if world_rank in line:
                    dims["cp"] = sub
        if ep > 1:  # EP groups: blocks of ep replicas; their "replicas" lines hold the same experts
            blocks = mesh.view(dp // ep, ep, pp, tp)
            for dim, name in ((1, "ep"), (0, "ep_replicas")):
                if blocks.shape[dim] == 1:
                    continue
                for line in blocks.movedim(dim, -1).reshape(-1, blocks.shape[dim]).tolist():
                    sub = dist.new_group(line, timeout=timeout)
                    if world_rank in line:
                        dims[name] = sub
        if world_rank in ranks:
            out[gid] = RankGroups(list(ranks).index(world_rank), whole, dims, mesh, f"g{gid}w{world}")
    return out


def make_mesh(
    groups: RankGroups, dp: int, pp: int, tp: int, device_type: str, cp: int = 1, ep: int = 1
) -> Mesh:
    """The ``(dp, pp, tp)`` device mesh of one rank of a worker group, over the process groups
    :func:`plan_groups` made (``DeviceMesh.from_group``: no group is created here).

    The mesh dimensions are named ``dp.<tag>``, ``pp.<tag>``, ``tp.<tag>`` with the group's
    :attr:`RankGroups.tag`: ``DeviceMesh`` compares equal by ranks, layout and dimension names
    alone, and DTensor caches sharding decisions (its sharding propagator's ``lru_cache``) under
    specs that hold such meshes, whose process groups are found by name. Without the tag, two
    groups on the same devices, or a group of an earlier run in the same process (a
    :class:`~rpeg.runtime.driver.pool.WorkerPool`'s), have equal meshes, and a cached decision
    can hand one group's ops the other's groups. Seen in the suite before the tag, twice: a
    pooled process's tensor-parallel generation hung in its first all-reduce after a transition;
    with it, two full runs of the runtime tests did not hang.
    """
    from torch.distributed.device_mesh import DeviceMesh

    names = tuple(f"{dim}.{groups.tag}" for dim in ("dp", "pp", "tp"))
    mesh = DeviceMesh.from_group(
        [groups.dims["dp"], groups.dims["pp"], groups.dims["tp"]],
        device_type,
        mesh=groups.mesh,
        mesh_dim_names=names,
    )
    rank = groups.rank
    d, p, t = rank // (pp * tp), (rank // tp) % pp, rank % tp
    tp_mesh, dp_mesh = mesh[names[2]], mesh[names[0]]
    return Mesh(
        rank,
        dp,
        pp,
        tp,
        d,
        p,
        t,
        tp_mesh,
        mesh.get_group(names[0]),
        mesh.get_group(names[1]),
        dp_mesh,
        groups.whole,
        cp,
        groups.dims.get("cp"),
        ep,
        groups.dims.get("ep"),
        groups.dims.get("ep_replicas"),
    )


def world_mesh(rank: int, dp: int, pp: int, tp: int, device_type: str) -> Mesh:
    """The mesh of rank ``rank`` of one group spanning the whole world (``dp·pp·tp`` processes):
    :func:`plan_groups` of that one group, then :func:`make_mesh`. Every rank of the world must
    call it (it creates the groups)."""
    groups = plan_groups([(0, list(range(dp * pp * tp)), dp, pp, tp)], rank)[0]
    return make_mesh(groups, dp, pp, tp, device_type)


def _dim0_chunk(full: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    """Part ``index`` of ``torch.chunk(full, parts, dim=0)``, empty where ``chunk`` returns fewer
    parts (FSDP2's split of a parameter over the DP ranks)."""
    chunks = torch.chunk(full, parts, dim=0)
    return chunks[index] if index < len(chunks) else full.new_empty((0, *full.shape[1:]))


class FSDPShards:
    """The parameters of one rank's stage sharded over its data-parallel group by FSDP2
    (``torch.distributed.fsdp.fully_shard``), without an optimizer: a frozen model's ZeRO stage 3
    (SPEC §14.3), and the base of :class:`FSDPAdam`.

    With ``zero = 3`` each module of ``units`` (the decoder layers) is an FSDP2 unit of its own
    and the root holds the rest (embedding, norm, heads); between operations only the dim-0
    shards stay registered, a forward gathers a layer before it runs and frees it after
    (``reshard_after_forward``), and the root stays gathered through a pass (FSDP2 never reshards
    the root after forward: :meth:`release` does, for a model no backward follows). Reading or
    writing the full weights (publications, installs, snapshots, checkpoints) happens inside
    :meth:`gathered`; :meth:`set_masters` writes the shards. With ``zero = 2`` the full
    parameters stay registered between passes. With ``Pd = 1`` nothing is sharded and the model
    is not wrapped.

    Every DP rank must run the same forwards in the same order while sharded (each gathers).

    Parameters
    ----------
    model
        This rank's stage (TP already applied); wrapped in place when ``Pd > 1``.
    mesh
        The DP device mesh (a sub-mesh of the same root as the TP mesh).
    group
        The DP process group.
    zero
        ZeRO stage: 2 or 3.
    units
        ``zero = 3``: the modules sharded as units of their own (the decoder layers).
    experts
        Expert-parallel experts (:class:`~rpeg.runtime.worker.experts.ParallelExperts`, stage 2
        only): FSDP2 leaves their parameters alone (``ignored_params``) — each EP rank holds its
        own experts, the ranks holding the same ones sum their gradients
        (:meth:`~rpeg.runtime.worker.experts.ParallelExperts.sum_gradients`) — and Adam updates
        them whole.

    Raises
    ------
    ValueError
        For a stage other than 2 or 3.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        mesh: object,
        group: object,
        *,
        zero: int = 2,
        units: tuple[torch.nn.Module, ...] = (),
        experts: tuple[Any, ...] = (),
    ) -> None:
        if zero not in (2, 3):
            raise ValueError(f"{type(self).__name__}: zero={zero!r} must be 2 or 3")
        if experts and zero == 3:
            raise ValueError(f"{type(self).__name__}: expert-parallel experts run at ZeRO stage 2 only")
        self.experts = experts
        ignored = {p for m in experts for p in m.parameters()}
        self.model = model
        self.group = group
        self.world = dist.get_world_size(group)
        self.index = dist.get_rank(group)
        self.sharded = self.world > 1
        self.zero = zero if self.sharded else 2  # one rank shards nothing
        self.units: list[Any] = []  # every FSDP2 module, the root last
        self._gathered = False
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            if self.zero == 3:
                self.units = [fully_shard(u, mesh=mesh, reshard_after_forward=True) for u in units]
            self.units.append(
                fully_shard(
                    model, mesh=mesh, reshard_after_forward=self.zero == 3, ignored_params=ignored or None
                )
            )
        self.masters = dict(model.named_parameters())  # the dim-0 shards (DTensors) under FSDP2
        self._ignored = {name for name, p in self.masters.items() if p in ignored}

    @property
    def resharded(self) -> bool:
        """Whether only the shards are registered now (``zero = 3`` outside :meth:`gathered`)."""
        return self.zero == 3 and not self._gathered

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """``zero = 3``: every unit gathered (one AllGather each) and kept so through forwards for
        the block, then resharded; with stage 2 the full parameters are already there. Nested
        blocks gather once."""
        if not self.resharded:
            yield
            return
        for unit in self.units:
            unit.unshard()
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
        self._gathered = True
        try:
            yield
        finally:
            self._gathered = False
            for unit in self.units:
                unit.set_reshard_after_forward(unit is not self.model, recurse=False)
                unit.reshard()

    def release(self) -> None:
        """``zero = 3`` outside :meth:`gathered`: free the root's gathered parameters (embedding,
        norm, heads), which FSDP2 keeps after a forward for the backward that a frozen model's
        forward never has. Local: no collective."""
        if self.resharded:
            self.model.reshard()

    @torch.no_grad()
    def set_masters(self, weights: dict[str, torch.Tensor]) -> None:
        """Make ``weights`` (full TP-local tensors by parameter name) the registered shards
        (``Pd = 1``: the parameters are the masters, already written)."""
        if not self.sharded:
            return
        for name, master in self.masters.items():
            if name not in self._ignored:  # an EP rank's experts are their own masters
                local(master).copy_(_dim0_chunk(weights[name], self.world, self.index))


class FSDPAdam(FSDPShards):
    """Data-parallel training with FSDP2 (:class:`FSDPShards`) and ``torch.optim.Adam`` on its
    dim-0 shards: ZeRO-2 as SPEC §6 charges it, or ZeRO-3.

    ``fully_shard`` over the DP mesh makes each parameter's FP32 master and Adam moments a
    ``1/Pd`` dim-0 shard (a 2-D DTensor under TP); the backward of a rank's last microbatch
    reduce-scatters the gradient sum (gloo has no pre-scaled sum, so the reduction is a plain
    ``SUM``: losses are already divided by the global token count), Adam updates the shards and
    one AllGather refreshes the full parameters. Between updates the model keeps its full
    (TP-local) parameters registered — ``reshard_after_forward`` and ``reshard_after_backward``
    off — so inference, generation, publications, snapshots and checkpoints read them without a
    collective, and DP ranks may run different numbers of forwards. A write of new weights must go
    through :meth:`set_masters` too, or the next update starts from the old shards.

    ``zero = 3`` (FSDP2 full sharding, SPEC §14.3): the units of :class:`FSDPShards`; the
    backward gathers each layer again and reduce-scatters its gradient, and the update needs no
    AllGather afterwards.

    With ``Pd = 1`` nothing is sharded: the model is not wrapped and Adam updates its parameters.
    Adam is ``torch.optim.Adam``: ``m ← β1·m + (1−β1)·g``, ``v ← β2·v + (1−β2)·g²``,
    ``θ ← θ − lr·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε)``.

    Parameters
    ----------
    model, mesh, group, zero, units, experts
        As :class:`FSDPShards`.
    lr, betas, eps
        Adam hyper-parameters.

    Raises
    ------
    ValueError
        For a stage other than 2 or 3.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        mesh: object,
        group: object,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        zero: int = 2,
        units: tuple[torch.nn.Module, ...] = (),
        experts: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(model, mesh, group, zero=zero, units=units, experts=experts)
        if self.sharded:
            if self.zero == 2:
                model.set_reshard_after_backward(False)
            for unit in self.units:  # both settings are per unit
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)
        self.adam = torch.optim.Adam(list(self.masters.values()), lr=lr, betas=betas, eps=eps)
        self.t = 0
        if self.sharded and self.zero == 2:
            model.unshard()

    def sync_gradients(self, last: bool) -> None:
        """Reduce-scatter the accumulated gradients in the coming backward only when ``last``
        (each rank calls it before each microbatch's backward; one reduction per update)."""
        if self.sharded:
            self.model.set_requires_gradient_sync(last)

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of the shards, then (stage 2) one AllGather of the updated full
        parameters; under stage 3 the next forward gathers them layer by layer. Expert-parallel
        experts first sum their gradients over the ranks holding the same experts."""
        for experts in self.experts:
            experts.sum_gradients()
        self.adam.step()
        self.adam.zero_grad(set_to_none=True)
        self.t += 1
        if self.sharded and self.zero == 2:
            self.model.reshard()
            self.model.unshard()
        if self.sharded:
            self.model.set_requires_gradient_sync(True)

    def zero_grad(self) -> None:
        """Drop accumulated gradients, full and sharded (after a failed step), and re-arm the
        reduction for the next backward."""
        for p in self.model.parameters():
            p.grad = None
        self.adam.zero_grad(set_to_none=True)
        if self.sharded:
            self.model.set_requires_gradient_sync(True)

    def _moment(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        master = self.masters[name]
        st = self.adam.state.get(master)
        if not st:
            zero = torch.zeros_like(local(master))
            return zero, zero
        return local(st["exp_avg"]), local(st["exp_avg_sq"])

    def _gather0(self, shard: torch.Tensor, rows: int) -> torch.Tensor:
        """The full dim-0 tensor of ``rows`` rows whose chunks the DP ranks hold as ``shard``."""
        if self.world == 1:
            return shard.clone()
        size = math.ceil(rows / self.world) if rows else 0
        padded = shard.new_zeros((size, *shard.shape[1:]))
        padded[: len(shard)] = shard
        parts = [torch.zeros_like(padded) for _ in range(self.world)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat(parts)[:rows]

    @torch.no_grad()
    def full_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` and ``v`` of all the rank's full (TP-local) parameter elements, flat in parameter
        order (AllGathers over the DP group: every rank calls it)."""
        with self.gathered():  # stage 3: the full shapes
            full = {name: local(p).shape for name, p in self.model.named_parameters()}
        ms, vs = [], []
        for name in self.masters:
            rows = full[name][0]
            m, v = self._moment(name)
            ms.append(self._gather0(m, rows).reshape(-1))
            vs.append(self._gather0(v, rows).reshape(-1))
        return torch.cat(ms), torch.cat(vs)

    @torch.no_grad()
    def load_full_moments(self, m: torch.Tensor, v: torch.Tensor, t: int) -> None:
        """Keep this rank's dim-0 chunks of full flat moments and set the step counter."""
        with self.gathered():  # stage 3: the full shapes
            full = {name: local(p).shape for name, p in self.model.named_parameters()}
        self.t = int(t)
        off = 0
        for name, master in self.masters.items():
            shape = full[name]
            k = math.prod(shape)
            mine = [_dim0_chunk(flat[off : off + k].view(shape), self.world, self.index) for flat in (m, v)]
            self._set_moments(master, *mine)
            off += k

    def state(self) -> dict[str, object]:
        """Moments and step counter of this rank's shards (for checkpoints)."""
        moments = [self._moment(name) for name in self.masters]
        return {
            "m": [m.clone() for m, _ in moments],
            "v": [v.clone() for _, v in moments],
            "t": self.t,
            "shards": [tuple(local(p).shape) for p in self.masters.values()],
        }

    @torch.no_grad()
    def load_state(self, state: dict[str, object]) -> None:
        """Restore :meth:`state` (same layout only)."""
        shards = [tuple(local(p).shape) for p in self.masters.values()]
        if state.get("shards") != shards:
            raise ValueError(
                "optimizer shards of the checkpoint do not match this rank's; resuming needs the "
                "same training layout"
            )
        self.t = int(state["t"])  # type: ignore[arg-type]
        for master, m, v in zip(self.masters.values(), state["m"], state["v"]):  # type: ignore[call-overload]
            self._set_moments(master, m, v)

    def _set_moments(self, master: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
        """Adam's state of one shard: local moments ``m``, ``v`` at step :attr:`t` (none at 0)."""
        if self.t == 0:
            self.adam.state.pop(master, None)
            return
        state: dict[str, torch.Tensor] = {"step": torch.tensor(float(self.t))}
        for key, value in (("exp_avg", m), ("exp_avg_sq", v)):
            moment = torch.zeros_like(master)
            local(moment).copy_(value)
            state[key] = moment
        self.adam.state[master] = state


def publication(
    model: torch.nn.Module, *, include_replicated: bool, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, tuple[torch.Tensor, int | None]]:
    """This rank's weights as ``name → (local tensor copy, TP shard dim or None)``.

    Replicated tensors are included only when ``include_replicated`` (TP rank 0), so a
    publication of a group carries every byte of the model exactly once per DP replica.
    ``weights`` (local tensors by name, e.g. a kept snapshot) replace the model's current ones.
    """
    out = {}
    for name, p in model.named_parameters():  # not state_dict: FSDP2 would give the DP shards
        dim = shard_dim(p)
        if dim is None and not include_replicated:
            continue
        out[name] = ((local(p).detach() if weights is None else weights[name]).clone(), dim)
    return out


@dataclass
class PackedShare:
    """A rank's publication packed into one flat buffer per dtype, so that it crosses a process
    group in one broadcast per dtype (:meth:`~rpeg.runtime.worker.transfers.WorkerTransfers.shares_in_place`).

    ``entries`` are ``(name, shape, dtype, TP shard dim or None, offset)`` in parameter order;
    ``sizes`` the elements of each dtype's buffer; ``flats`` the buffers (on a receiving rank,
    empty until they arrive).
    """

    entries: list[tuple[str, tuple[int, ...], torch.dtype, int | None, int]]
    sizes: dict[torch.dtype, int]
    flats: dict[torch.dtype, torch.Tensor]

    @classmethod
    def of(cls, model: torch.nn.Module, *, include_replicated: bool) -> PackedShare:
        """This rank's weights as :func:`publication` selects them, copied once into the buffers."""
        items = [
            (name, local(p).detach(), shard_dim(p))
            for name, p in model.named_parameters()
            if include_replicated or shard_dim(p) is not None
        ]
        sizes: dict[torch.dtype, int] = {}
        entries = []
        for name, t, dim in items:
            entries.append((name, tuple(t.shape), t.dtype, dim, sizes.get(t.dtype, 0)))
            sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        device = items[0][1].device if items else None
        flats = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()}
        for (_, _, dt, _, off), (_, t, _) in zip(entries, items, strict=True):
            flats[dt][off : off + t.numel()].copy_(t.reshape(-1))
        return cls(entries, sizes, flats)

    @classmethod
    def receiving(
        cls, header: tuple[list, dict[torch.dtype, int]], device: torch.device | None
    ) -> PackedShare:
        """Empty buffers for a share described by ``header`` (another rank's :attr:`header`)."""
        entries, sizes = header
        return cls(entries, sizes, {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()})

    @property
    def header(self) -> tuple[list, dict[torch.dtype, int]]:
        """What a receiver needs to allocate the buffers: ``(entries, sizes)``."""
        return self.entries, self.sizes

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers."""
        return sum(t.nbytes for t in self.flats.values())

    def buffers(self) -> list[torch.Tensor]:
        """The buffers in one order every rank agrees on (by dtype name)."""
        return [self.flats[dt] for dt in sorted(self.flats, key=str)]

    def pieces(self, wanted: set[str] | None = None) -> dict[str, tuple[torch.Tensor, int | None]]:
        """``name → (tensor, TP shard dim)`` as views of the buffers (no copy), for the names in
        ``wanted`` (``None``: all)."""
        return {
            name: (self.flats[dt][off : off + math.prod(shape)].view(shape), dim)
            for name, shape, dt, dim, off in self.entries
            if wanted is None or name in wanted
        }


#: Tensor dtypes a publication ships as numpy arrays (:func:`shareable`).
_NUMPY_DTYPES = frozenset(
    {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.uint8}
)


def shareable(pub: dict[str, tuple[torch.Tensor, int | None]]) -> dict[str, tuple[Any, int | None]]:
    """A publication as it crosses Ray's object store: CPU tensors of a numpy dtype as numpy
    arrays (views, no copy). Ray stores a numpy array's buffer out of band and a reader maps it
    from the object store read-only; a torch tensor pickles its bytes in band, so a reader holds
    them twice while it unpickles (measured: 160 MiB private on a worker receiving an 80 MiB
    model). :func:`assemble` takes either form."""
    return {
        name: (t.numpy() if t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES else t, dim)
        for name, (t, dim) in pub.items()
    }


def _tensor(x: Any) -> torch.Tensor:
    """A received piece as a tensor: a numpy array from the object store is wrapped read-only
    (no copy; :func:`assemble`'s callers copy what they keep)."""
    if isinstance(x, torch.Tensor):
        return x
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x)


def assemble(pubs: list[tuple[int, dict[str, tuple[Any, int | None]]]]) -> dict[str, torch.Tensor]:
    """Full tensors from the publications of one DP replica: TP shards concatenated along their
    shard dimension in TP-rank order; pipeline stages contribute disjoint names. A piece may be a
    numpy array (:func:`shareable`); a full tensor received whole is returned without a copy, so it
    may be a read-only view of the object store: copy what you keep or write.

    Parameters
    ----------
    pubs
        ``(tp_rank, publication)`` pairs.
    """
    pieces: dict[str, list[tuple[int, torch.Tensor, int | None]]] = {}
    for t, pub in pubs:
        for name, (tensor, dim) in pub.items():
            pieces.setdefault(name, []).append((t, _tensor(tensor), dim))
    full = {}
    for name, ps in pieces.items():
        ps.sort(key=lambda x: x[0])
        dim = ps[0][2]
        # one piece is the full tensor already: no copy (an install would hold the received
        # publication and its copy at once)
        full[name] = ps[0][1] if dim is None or len(ps) == 1 else torch.cat([x[1] for x in ps], dim=dim)
    return full


def shard_of(full: torch.Tensor, p: torch.Tensor, tp: int, t: int) -> torch.Tensor:
    """The slice of ``full`` that parameter ``p`` holds on TP rank ``t`` (``torch.chunk``
    semantics, as DTensor's ``Shard``); for stacked experts, EP rank ``e``'s block of ``Pe``."""
    expert = expert_shard(p)
    if expert is not None:
        return torch.chunk(full, expert[0], dim=0)[expert[1]]
    dim = shard_dim(p)
    return full if dim is None else torch.chunk(full, tp, dim=dim)[t]
