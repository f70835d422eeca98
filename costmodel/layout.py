"""What the cost model prices: a plan's :class:`~rpeg.ir.plan.Strategy` on nodes of ``Ng`` GPUs.

A strategy carries the degrees ``Π = (Pd, Pp, Pt)``, the microbatches and the link tiers of one
invocation; where its pipeline boundaries fall (inside a node or between nodes) also depends on
``Ng``, the GPUs per node. :class:`Layout` is the pair, validated once; both :mod:`.time` and
:mod:`.memory` take it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.plan import Strategy

__all__ = ["N_TIERS", "Layout", "check_tier", "positive_int"]

#: Link tiers of the hardware: 0 inside a node, 1 inside a rack, 2 across racks.
N_TIERS = 3


def positive_int(owner: str, name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``owner``, ``name`` and ``value`` unless it is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")


def check_tier(owner: str, name: str, value: object) -> None:
    """Raise ``ValueError`` naming ``owner``, ``name`` and ``value`` unless it is a tier 0, 1 or 2."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < N_TIERS:
        raise ValueError(f"{owner}: {name} must be a tier 0, 1 or 2, got {value!r}")


@dataclass(frozen=True, slots=True)
class Layout:
    """One invocation's strategy ``(Π = (Pd, Pp, Pt), mb, tiers)`` on nodes of ``Ng`` GPUs.

    Parameters
    ----------
    strategy
        The plan's choice of degrees, microbatches and tiers (its ``extent`` is not used here):
        ``dp, pp, tp`` = ``Pd, Pp, Pt``; ``mb`` microbatches per pipeline pass; ``pp_tier`` the
        tier of the inter-node pipeline boundaries (``0`` when a replica fits in a node; an
        inter-node boundary is costed at tier ``max(pp_tier, 1)`` whatever is given); ``dp_tier``
        the tier spanned by the data-parallel group (the allocation's tier).
    gpus_per_node
        ``Ng``; tensor parallelism stays inside a node, so ``tp ≤ gpus_per_node``.

    Raises
    ------
    ValueError
        If a degree, ``mb`` or ``gpus_per_node`` is not a positive integer, a tier is not 0, 1 or
        2, or ``tp > gpus_per_node``; the message names the field and its value.
    TypeError
        If ``strategy`` is not a :class:`~rpeg.ir.plan.Strategy`.

    Examples
    --------
    >>> lay = Layout(Strategy((1, 1, 8), dp=1, pp=4, tp=2, mb=4), gpus_per_node=4)
    >>> lay.pp_boundaries
    (2, 1)
    """

    strategy: Strategy
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        s = self.strategy
        if not isinstance(s, Strategy):
            raise TypeError(f"Layout: strategy must be a Strategy, got {type(s).__name__}")
        for name in ("dp", "pp", "tp", "mb"):
            positive_int("Layout", name, getattr(s, name))
        positive_int("Layout", "gpus_per_node", self.gpus_per_node)
        for name in ("pp_tier", "dp_tier", "cp_tier", "ep_tier"):
            check_tier("Layout", name, getattr(s, name))
        if s.tp > self.gpus_per_node:
            raise ValueError(
                f"Layout: tp={s.tp} exceeds gpus_per_node={self.gpus_per_node} "
                "(tensor parallelism stays inside a node)"
            )

    @property
    def ep_ranks_per_node(self) -> int:
        """``g_e``: the expert-parallel group's ranks on one node. The group is the first ``Pe``
        ranks of the ``Pd·Pc`` group, context-parallel ones first, and with ``etp = 1`` the
        tensor-parallel ranks of each of them (``docs/cost-model.md`` §10,
        :meth:`Strategy.expert_group_devices <rpeg.ir.plan.Strategy.expert_group_devices>`):
        the count of those on the first node (allocations start on a node boundary)."""
        devices = self.strategy.expert_group_devices()
        return max(1, sum(1 for dev in devices if dev < self.gpus_per_node))

    @property
    def cp_ranks_per_node(self) -> int:
        """``g_c``: the context-parallel group's ranks on one node, ``min(Pc, max(1, ⌊Ng/Pt⌋))``
        (the group is ``Pc`` ranks ``Pt`` devices apart, SPEC §15.3)."""
        s = self.strategy
        return min(s.cp, max(1, self.gpus_per_node // s.tp))

    @property
    def pp_boundaries(self) -> tuple[int, int]:
        """``(n_intra, n_inter)`` pipeline stage boundaries inside / between nodes.

        ``n_inter = max(0, ⌈Pp/s⌉ − 1)`` and ``n_intra = Pp − 1 − n_inter`` with
        ``s = max(1, ⌊Ng/(Pt·Pc)⌋)`` stages per node (SPEC §6; a stage's ``Pt·Pc`` tensor- and
        context-parallel ranks are consecutive, SPEC §15.3).
        """
        s = self.strategy
        stages_per_node = max(1, self.gpus_per_node // (s.tp * s.cp))
        n_inter = max(0, math.ceil(s.pp / stages_per_node) - 1)
        return s.pp - 1 - n_inter, n_inter
