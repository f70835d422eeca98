"""Execution plans: per vertex an allocation ``σ(v)``, degrees ``Π(v) = (Pd, Pp, Pt)`` and ``mb(v)``.

A :class:`Strategy` is everything of a choice except where it sits: shape, degrees, microbatches
and the link tiers its groups span (these depend only on the shape). A :class:`Choice` adds the
:class:`~rpeg.ir.cluster.Allocation`. A :class:`Plan` is one choice per vertex, in vertex order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Allocation, Cluster

__all__ = ["Choice", "Plan", "Strategy", "check_strategy"]


@dataclass(frozen=True, slots=True)
class Strategy:
    """Shape, parallel degrees and microbatches of one invocation's choice.

    Parameters
    ----------
    extent
        ``(dr, dn, dg)`` of the allocation.
    dp, pp, tp
        ``Pd, Pp, Pt`` with ``Pd·Pp·Pt = |σ|``.
    mb
        Microbatches per step (1 without pipelining).
    pp_tier
        Link tier of the inter-node pipeline boundaries (0 when a replica fits in one node).
    dp_tier
        Link tier spanned by a data-parallel group (the allocation's tier when ``Pd > 1``).
    """

    extent: tuple[int, int, int]
    dp: int
    pp: int
    tp: int
    mb: int
    pp_tier: int = 0
    dp_tier: int = 0

    @property
    def size(self) -> int:
        """``|σ| = Pd·Pp·Pt``."""
        return self.dp * self.pp * self.tp

    def label(self) -> str:
        """``dp×pp×tp/mb`` for tables."""
        return f"({self.dp},{self.pp},{self.tp}) mb={self.mb}"


@dataclass(frozen=True, slots=True)
class Choice:
    """One vertex's full choice ``(σ, Π, mb)``."""

    strategy: Strategy
    allocation: Allocation

    @property
    def mask(self) -> int:
        """Bit mask of the devices of ``σ``."""
        return self.allocation.mask

    def to_dict(self, vertex: str) -> dict[str, object]:
        """A ``plan`` entry of the result file (SPEC §12)."""
        s = self.strategy
        return {
            "vertex": vertex,
            "origin": list(self.allocation.origin),
            "extent": list(self.allocation.extent),
            "dp": s.dp,
            "pp": s.pp,
            "tp": s.tp,
            "mb": s.mb,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """One :class:`Choice` per vertex of the graph, in the graph's vertex order."""

    choices: tuple[Choice, ...]

    def __len__(self) -> int:
        return len(self.choices)

    def __getitem__(self, i: int) -> Choice:
        return self.choices[i]

    def replace(self, i: int, choice: Choice) -> Plan:
        """A copy with vertex ``i``'s choice replaced."""
        c = list(self.choices)
        c[i] = choice
        return Plan(tuple(c))

    def key(self) -> tuple:
        """Canonical hashable form (for caches)."""
        return tuple((c.strategy, c.allocation.origin) for c in self.choices)


def check_strategy(
    cluster: Cluster,
    layers: int,
    sequences: int,
    extent: tuple[int, int, int],
    dp: int,
    pp: int,
    tp: int,
    mb: int,
) -> str | None:
    """Check P1–P8 (SPEC §4) for one choice's shape and degrees; return why not, or ``None``.

    P1 ``Pt | Ng``; P2 ``Pp | L`` and ``Pp ∈ {1} ∪ even``; P3 ``Pd | B·R``; P4 ``Pp = 1 ⇒ mb = 1``;
    P5 ``Pp > 1 ⇒ mb | B_local, mb ≥ Pp, B_local/mb ≥ 8`` with ``B_local = B·R/Pd``; P6 the extent
    is a legal shape and a replica either fits in one node (``Pp·Pt | Ng``) or spans whole nodes;
    P8 ``s = min(Pp, ⌊Ng/Pt⌋)`` divides ``Pp`` and ``|σ| = Pd·Pp·Pt``. (P7, the origin's alignment,
    is checked by :meth:`Cluster.allocation`.)
    """
    Ng = cluster.gpus_per_node
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("mb", mb)):
        if not isinstance(value, int) or value < 1:
            return f"{name}={value!r} must be a positive integer"
    if Ng % tp:
        return f"P1: tp={tp} does not divide gpus_per_node={Ng}"
    if layers % pp or (pp > 1 and pp % 2):
        return f"P2: pp={pp} must divide layers={layers} and be 1 or even"
    if sequences % dp:
        return f"P3: dp={dp} does not divide B·R={sequences}"
    if pp == 1 and mb != 1:
        return f"P4: pp=1 requires mb=1, got mb={mb}"
    if pp > 1:
        b_local = sequences // dp
        if b_local % mb or mb < pp or b_local // mb < 8:
            return f"P5: mb={mb} needs mb | B_local={b_local}, mb ≥ pp={pp} and B_local/mb ≥ 8"
    size = dp * pp * tp
    if cluster.shape_for_size(size) != tuple(extent):
        return f"P6: extent {list(extent)} is not the legal shape for dp·pp·tp={size} devices"
    rep = pp * tp
    if (rep <= Ng and Ng % rep) or (rep > Ng and rep % Ng):
        return f"P6: a replica of pp·tp={rep} GPUs must fit one node evenly or span whole nodes (Ng={Ng})"
    s = min(pp, Ng // tp)
    if pp % s:
        return f"P8: s=min(pp, Ng/tp)={s} does not divide pp={pp}"
    return None
