"""Unrolling the compact RPEG over ``Keval`` steps (SPEC §5).

Every vertex and data edge is copied per step. For each publication edge of model ``m`` and each
step ``k ≥ 1`` with ``k > τ(m)`` the training vertex of step ``k − τ(m) − 1`` feeds the consumer at
step ``k``; earlier steps read the initial weights. Each training vertex is also chained to its own
next step (``t(k−1) → t(k)``), so updates stay ordered. The result is acyclic because every edge
goes forward in ``(step, vertex order)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .graph import RPEG
from .types import Role

__all__ = ["EdgeKind", "UEdge", "Unrolled", "unroll"]


class EdgeKind(str, Enum):
    """Kinds of unrolled edge."""

    DATA = "data"  # within one step
    PUB = "pub"  # weight publication across steps
    CHAIN = "chain"  # t(k−1) → t(k)


@dataclass(frozen=True, slots=True)
class UEdge:
    """An edge between vertex instances ``(src, src_step) → (dst, dst_step)``.

    ``src`` and ``dst`` are vertex indices of the compact graph; ``ref`` is the index of the
    compact data or publication edge it copies (``-1`` for chain edges).
    """

    kind: EdgeKind
    src: int
    src_step: int
    dst: int
    dst_step: int
    ref: int


@dataclass(frozen=True)
class Unrolled:
    """The unrolled graph: ``k_eval`` copies of the compact vertices plus :attr:`edges`.

    Instance ``(v, k)`` is vertex ``v`` at step ``k``. Edges are grouped by destination step
    and, within a step, listed in compact-edge order.
    """

    graph: RPEG
    k_eval: int
    edges: tuple[UEdge, ...]

    def edge_set(self, kind: EdgeKind | None = None) -> set[tuple[str, int, str, int]]:
        """Edges as ``(src name, src step, dst name, dst step)`` (for tests and debugging)."""
        names = [v.name for v in self.graph.vertices]
        return {
            (names[e.src], e.src_step, names[e.dst], e.dst_step)
            for e in self.edges
            if kind is None or e.kind is kind
        }


def unroll(graph: RPEG, k_eval: int) -> Unrolled:
    """Unroll ``graph`` over ``k_eval`` steps.

    Parameters
    ----------
    graph
        A validated compact RPEG with staleness budgets ``τ``.
    k_eval
        Number of steps ``Keval ≥ 1``.

    Returns
    -------
    Unrolled
        Data edges ``(u,k) → (v,k)`` for every step; publication edges
        ``(t, k − τ(m) − 1) → (c, k)`` for ``k > τ(m)``; chain edges ``(t, k−1) → (t, k)``.

    Raises
    ------
    ValueError
        If ``k_eval < 1``.
    """
    if not isinstance(k_eval, int) or k_eval < 1:
        raise ValueError(f"k_eval must be a positive integer, got {k_eval!r}")
    idx = graph.index
    trainers = [i for i, v in enumerate(graph.vertices) if v.role is Role.TRAINING]
    edges: list[UEdge] = []
    for k in range(k_eval):
        for j, e in enumerate(graph.data_edges):
            edges.append(UEdge(EdgeKind.DATA, idx[e.src], k, idx[e.dst], k, j))
        for j, e in enumerate(graph.pub_edges):
            tau = graph.staleness[e.model]
            if k > tau:
                edges.append(UEdge(EdgeKind.PUB, idx[e.src], k - tau - 1, idx[e.dst], k, j))
        if k >= 1:
            for t in trainers:
                edges.append(UEdge(EdgeKind.CHAIN, t, k - 1, t, k, -1))
    return Unrolled(graph, k_eval, tuple(edges))
