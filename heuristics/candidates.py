"""Candidate directories ``Xcand(v)``: every legal ``(σ, Π, mb)`` of an invocation (SPEC §4).

A directory lists the legal :class:`~rpeg.ir.plan.Strategy` objects of a vertex (shape, degrees,
microbatches) that pass P1–P8 and whose isolated memory fits ``M_eff``, sorted by estimated
isolated time; each strategy can sit at any aligned origin of its shape (P7), which
:meth:`Directory.choices` enumerates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.cluster import Allocation, Cluster
from ..ir.plan import Choice, Strategy, check_strategy
from .costs import Costs

__all__ = ["Directory", "aligned_allocations", "build_directories", "enumerate_strategies", "make_strategy"]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_strategies(cluster: Cluster, layers: int, sequences: int) -> list[Strategy]:
    """All strategies passing P1–P8 for a model of ``layers`` layers and ``sequences`` = B·R.

    For each legal allocation size, every ``Pt | Ng``, ``Pp ∈ {1} ∪ even divisors of L`` and
    ``Pd = |σ|/(Pp·Pt)``; ``mb = 1`` when ``Pp = 1``, else every divisor ``mb`` of
    ``B_local = B·R/Pd`` with ``mb ≥ Pp`` and ``B_local/mb ≥ 8``. Tiers: the pipeline's
    inter-node boundaries span the tier of one replica's devices; the DP group spans the
    allocation's tier.
    """
    Ng = cluster.gpus_per_node
    tps = _divisors(Ng)
    pps = [p for p in _divisors(layers) if p == 1 or p % 2 == 0]
    out: list[Strategy] = []
    for size in cluster.legal_sizes:
        extent = cluster.shape_for_size(size)
        assert extent is not None
        for tp in tps:
            for pp in pps:
                if size % (tp * pp):
                    continue
                dp = size // (tp * pp)
                if sequences % dp:
                    continue
                b_local = sequences // dp
                mbs = [1] if pp == 1 else [m for m in _divisors(b_local) if m >= pp and b_local // m >= 8]
                for mb in mbs:
                    if check_strategy(cluster, layers, sequences, extent, dp, pp, tp, mb) is None:
                        out.append(make_strategy(cluster, extent, dp, pp, tp, mb))
    return out


def make_strategy(
    cluster: Cluster, extent: tuple[int, int, int], dp: int, pp: int, tp: int, mb: int
) -> Strategy:
    """A :class:`Strategy` with its link tiers: the pipeline's inter-node boundaries span the
    tier of one replica's ``Pp·Pt`` consecutive devices; the DP group spans the allocation's tier.
    (Tiers depend only on the shape, so the first aligned origin stands for all.)"""
    first = aligned_allocations(cluster, dp * pp * tp)[0]
    rep_mask = 0
    for d in first.devices()[: pp * tp]:
        rep_mask |= 1 << d
    pp_tier = cluster.tier_of_mask(rep_mask)
    dp_tier = first.tier if dp > 1 else 0
    return Strategy(tuple(extent), dp, pp, tp, mb, pp_tier, dp_tier)  # type: ignore[arg-type]


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
        How many legal strategies the isolated-memory filter removed.
    smallest_isolated
        The least isolated memory among all legal strategies (bytes): how close the vertex
        comes to fitting when the directory is empty.
    """

    vertex: int
    strategies: list[Strategy]
    times: list[float]
    dropped: int
    smallest_isolated: float

    def __len__(self) -> int:
        return len(self.strategies)

    def of_size(self, size: int) -> list[int]:
        """Indices of the strategies with ``|σ| = size`` (still sorted by time)."""
        return [i for i, s in enumerate(self.strategies) if s.size == size]

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


def build_directories(costs: Costs) -> list[Directory]:
    """Build ``Xcand(v)`` for every vertex of ``costs.graph`` (SPEC §4).

    Drops strategies whose isolated memory exceeds ``M_eff`` (joint infeasibility is left to the
    penalty) and sorts the rest by the unsplit OP time of the cost model.
    """
    cluster = costs.cluster
    m_eff = cluster.hardware.m_eff
    out = []
    by_shape: dict[tuple[int, int], list[Strategy]] = {}
    for vi, v in enumerate(costs.graph.vertices):
        spec = costs.graph.models[v.model].spec
        key = (spec.layers, v.sequences)
        if key not in by_shape:
            by_shape[key] = enumerate_strategies(cluster, spec.layers, v.sequences)
        kept: list[tuple[float, int, Strategy]] = []
        smallest = float("inf")
        dropped = 0
        for j, s in enumerate(by_shape[key]):
            iso = costs.memory(vi, s).isolated
            smallest = min(smallest, iso)
            if iso > m_eff:
                dropped += 1
                continue
            kept.append((costs.op_time(vi, s), j, s))
        kept.sort(key=lambda x: (x[0], x[1]))
        out.append(Directory(vi, [s for _, _, s in kept], [t for t, _, _ in kept], dropped, smallest))
    return out
