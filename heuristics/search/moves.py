"""Move kernels: each proposes up to ``k`` neighbouring plans of the current one (SPEC §8).

* :class:`SingleMove` — pick one invocation (from the critical path in proportion to its time
  there with probability ``p_cp``, else uniformly) and resample its choice ``k`` times: a strategy
  drawn uniformly from ``Xcand(v)`` at a random aligned origin.
* :class:`PairMove` — pick a donor in proportion to its GPU count and a receiver among the
  invocations whose allocation overlaps it; the donor shrinks to a smaller legal allocation inside
  its current one and the receiver is resampled, preferring origins that reach the freed GPUs.
* :class:`SplitMove` — pick a donor as the pair move does; it shrinks inside its allocation
  and every invocation that still overlaps it moves into the GPUs it freed, all in one step.
* :class:`VariantMove` — pick an invocation whose directory holds another variant of its current
  degrees (microbatches, recomputation, ZeRO stage, loss chunking, memory fraction; SPEC §14)
  and switch to it, keeping the degrees and the allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Protocol

from ...ir.cluster import Allocation, Cluster
from ...ir.plan import Choice, Plan, Strategy
from ...scoring.candidates import Directory, aligned_allocations

__all__ = ["Move", "MoveContext", "PairMove", "SingleMove", "SplitMove", "VariantMove"]


@dataclass
class MoveContext:
    """What a move may look at: the directories, the cluster and the current plan's bottlenecks.

    Attributes
    ----------
    dirs
        ``Xcand(v)`` per vertex.
    cluster
        The device space.
    critical
        Per vertex, its OP seconds on the current plan's critical path.
    """

    dirs: list[Directory]
    cluster: Cluster
    critical: list[float]

    def allocations(self, size: int) -> list[Allocation]:
        """All aligned allocations of ``size`` devices."""
        return aligned_allocations(self.cluster, size)


class Move(Protocol):
    """``propose(rng, plan, ctx, k)`` returns up to ``k`` plans that differ from ``plan``."""

    def propose(self, rng: Random, plan: Plan, ctx: MoveContext, k: int) -> list[Plan]: ...


def _weighted(rng: Random, weights: list[float]) -> int:
    total = sum(weights)
    x = rng.random() * total
    for i, w in enumerate(weights):
        x -= w
        if x < 0.0:
            return i
    return len(weights) - 1


def _of_size(rng: Random, d: Directory, size: int) -> Strategy:
    """A strategy of ``size`` devices from ``d``: its fastest (isolated time) with probability
    ½, else one drawn uniformly among that size's."""
    idx = d.of_size(size)
    return d.strategies[idx[0] if rng.random() < 0.5 else idx[rng.randrange(len(idx))]]


def _donors(ctx: MoveContext, masks: list[int], sizes: list[int]) -> list[int]:
    """Invocations that can shrink (a smaller strategy in their directory) and share a GPU
    with another invocation, given the plan's allocation ``masks`` and ``sizes``."""
    return [
        v
        for v, d in enumerate(ctx.dirs)
        if any(s.size < sizes[v] for s in d.strategies)
        and any(u != v and masks[u] & masks[v] for u in range(len(masks)))
    ]


def _random_choice(rng: Random, d: Directory, ctx: MoveContext) -> Choice:
    s = d.strategies[rng.randrange(len(d.strategies))]
    allocs = ctx.allocations(s.size)
    return Choice(s, allocs[rng.randrange(len(allocs))])


class SingleMove:
    """Resample one invocation's choice (critical-path biased).

    Parameters
    ----------
    p_cp
        Probability of choosing the invocation from the critical path in proportion to its time
        there (SPEC: 0.6); ``0`` is the ablation "no critical-path selection".
    """

    def __init__(self, p_cp: float = 0.6) -> None:
        if not 0.0 <= p_cp <= 1.0:
            raise ValueError(f"SingleMove.p_cp must be in [0, 1], got {p_cp!r}")
        self.p_cp = p_cp

    def pick(self, rng: Random, ctx: MoveContext) -> int:
        """The invocation to change."""
        movable = [
            i for i, d in enumerate(ctx.dirs) if len(d) > 1 or len(ctx.allocations(d.strategies[0].size)) > 1
        ]
        if not movable:
            movable = list(range(len(ctx.dirs)))
        if rng.random() < self.p_cp:
            weights = [ctx.critical[i] for i in movable]
            if sum(weights) > 0.0:
                return movable[_weighted(rng, weights)]
        return movable[rng.randrange(len(movable))]

    def propose(self, rng: Random, plan: Plan, ctx: MoveContext, k: int) -> list[Plan]:
        v = self.pick(rng, ctx)
        d = ctx.dirs[v]
        out = []
        for _ in range(k):
            c = _random_choice(rng, d, ctx)
            if c != plan.choices[v]:
                out.append(plan.replace(v, c))
        return out


class PairMove:
    """Move GPUs from a donor to a receiver in one step (SPEC §8 donor–receiver kernel).

    Falls back to ``fallback`` when no donor can shrink or no receiver overlaps it.
    """

    def __init__(self, fallback: SingleMove | None = None) -> None:
        self.fallback = fallback or SingleMove()

    def propose(self, rng: Random, plan: Plan, ctx: MoveContext, k: int) -> list[Plan]:
        masks = [c.allocation.mask for c in plan.choices]
        sizes = [c.allocation.size for c in plan.choices]
        donors = _donors(ctx, masks, sizes)
        if not donors:
            return self.fallback.propose(rng, plan, ctx, k)
        donor = donors[_weighted(rng, [float(sizes[v]) for v in donors])]
        receivers = [u for u in range(len(masks)) if u != donor and masks[u] & masks[donor]]
        receiver = receivers[rng.randrange(len(receivers))]
        smaller = [s for s in ctx.dirs[donor].strategies if s.size < sizes[donor]]
        out = []
        for _ in range(k):
            s = smaller[rng.randrange(len(smaller))]
            inside = [a for a in ctx.allocations(s.size) if a.mask & ~masks[donor] == 0]
            new_donor = Choice(s, inside[rng.randrange(len(inside))])
            freed = masks[donor] & ~new_donor.allocation.mask
            rd = ctx.dirs[receiver]
            rs = rd.strategies[rng.randrange(len(rd.strategies))]
            allocs = ctx.allocations(rs.size)
            reach = [a for a in allocs if a.mask & freed]
            pool = reach if reach and rng.random() < 0.75 else allocs
            new_receiver = Choice(rs, pool[rng.randrange(len(pool))])
            p = plan.replace(donor, new_donor).replace(receiver, new_receiver)
            if p != plan:
                out.append(p)
        return out


class SplitMove:
    """Separate a donor from every invocation that shares its GPUs, in one step.

    The donor (drawn as the pair move draws it: in proportion to its GPU count among the
    invocations that can shrink and overlap another) takes a smaller size ``z`` among its
    directory's, drawn ``∝ z`` (a moderate shrink is likelier than a drastic one), a strategy of
    that size (:func:`_of_size`: the fastest with probability ½) and an aligned allocation
    inside its current one (uniform). With ``F`` the GPUs it freed, every invocation ``u`` that
    still overlaps it takes a size among its directory's sizes that have an aligned allocation
    inside ``F``, drawn ``∝`` size (filling ``F`` is likelier), a strategy of that size the same
    way, and such an allocation (uniform); an invocation with none keeps its choice.

    Why a kernel of its own (SPEC §8 has the pair and single moves only): when a generation
    shares its GPUs with several trainings, moving them apart one at a time passes through
    plans where some still overlap it (slower, or over memory), which an annealing chain
    rarely accepts; docs/decisions.md, "The split move", gives the measured case. Falls back
    to ``fallback`` when no invocation can be a donor.
    """

    def __init__(self, fallback: SingleMove | None = None) -> None:
        self.fallback = fallback or SingleMove()

    def propose(self, rng: Random, plan: Plan, ctx: MoveContext, k: int) -> list[Plan]:
        masks = [c.allocation.mask for c in plan.choices]
        sizes = [c.allocation.size for c in plan.choices]
        donors = _donors(ctx, masks, sizes)
        if not donors:
            return self.fallback.propose(rng, plan, ctx, k)
        donor = donors[_weighted(rng, [float(sizes[v]) for v in donors])]
        d = ctx.dirs[donor]
        smaller = sorted({s.size for s in d.strategies if s.size < sizes[donor]})
        out = []
        for _ in range(k):
            size = smaller[_weighted(rng, [float(z) for z in smaller])]
            inside = [a for a in ctx.allocations(size) if a.mask & ~masks[donor] == 0]
            new_donor = Choice(_of_size(rng, d, size), inside[rng.randrange(len(inside))])
            kept = new_donor.allocation.mask
            freed = masks[donor] & ~kept
            p = plan.replace(donor, new_donor)
            for u in range(len(masks)):
                if u == donor or not masks[u] & kept:
                    continue
                du = ctx.dirs[u]
                places = {
                    z: fit
                    for z in {s.size for s in du.strategies}
                    if (fit := [a for a in ctx.allocations(z) if a.mask & ~freed == 0])
                }
                if places:
                    fits = sorted(places)
                    z = fits[_weighted(rng, [float(z) for z in fits])]
                    fit = places[z]
                    p = p.replace(u, Choice(_of_size(rng, du, z), fit[rng.randrange(len(fit))]))
            if p != plan:
                out.append(p)
        return out


class VariantMove:
    """Switch one invocation to another variant of its current degrees (SPEC §14's engine
    choices: microbatches, activation recomputation, ZeRO stage, loss chunking, memory
    fraction), keeping ``(extent, Pd, Pp, Pt)`` and the allocation: the other variants its
    directory holds.

    Which invocation: from the critical path in proportion to its time there with probability
    ``p_cp``, else uniformly among those with another variant. Proposes up to ``k`` of the
    other variants. Falls back to ``fallback`` when no invocation has one.
    """

    def __init__(self, fallback: SingleMove | None = None, p_cp: float = 0.6) -> None:
        if not 0.0 <= p_cp <= 1.0:
            raise ValueError(f"VariantMove.p_cp must be in [0, 1], got {p_cp!r}")
        self.fallback = fallback or SingleMove()
        self.p_cp = p_cp
        self._modes: dict[int, tuple[list[Strategy], dict[tuple, list[Strategy]]]] = {}

    def _by_degrees(self, d: Directory) -> dict[tuple, list[Strategy]]:
        """The directory's strategies grouped by ``(extent, Pd, Pp, Pt)`` (cached while its
        list is unchanged)."""
        hit = self._modes.get(id(d))
        if hit is None or hit[0] is not d.strategies:
            groups: dict[tuple, list[Strategy]] = {}
            for s in d.strategies:
                groups.setdefault((s.extent, s.dp, s.pp, s.tp), []).append(s)
            hit = self._modes[id(d)] = (d.strategies, groups)
        return hit[1]

    def alternatives(self, plan: Plan, ctx: MoveContext, v: int) -> list[Strategy]:
        """The other variants of vertex ``v``'s current degrees in its directory."""
        cur = plan.choices[v].strategy
        same = self._by_degrees(ctx.dirs[v]).get((cur.extent, cur.dp, cur.pp, cur.tp), [])
        return [s for s in same if s != cur]

    def propose(self, rng: Random, plan: Plan, ctx: MoveContext, k: int) -> list[Plan]:
        options = {v: alts for v in range(len(ctx.dirs)) if (alts := self.alternatives(plan, ctx, v))}
        if not options:
            return self.fallback.propose(rng, plan, ctx, k)
        flippable = list(options)
        v = flippable[rng.randrange(len(flippable))]
        if rng.random() < self.p_cp:
            weights = [ctx.critical[u] for u in flippable]
            if sum(weights) > 0.0:
                v = flippable[_weighted(rng, weights)]
        alts = list(options[v])
        rng.shuffle(alts)
        alloc = plan.choices[v].allocation
        return [plan.replace(v, Choice(s, alloc)) for s in alts[:k]]
