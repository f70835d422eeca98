"""The four state primitives of a transition: Split, Merge, Extend, Destroy (SPEC §10, Nereus §5).

Each is a frozen dataclass that knows its byte volume, GPU sets and memory need:

* :class:`Split` ``(U, T_sub) → {U_1..U_k}``: one unit becomes ``k = |T|/|T_sub|`` replicas with
  the smaller layout on the same GPUs (consecutive rank blocks of ``|T_sub|`` GPUs); every GPU
  gathers its larger shard, ``|θ+ω|/|T_sub|`` bytes, from a group of ``k`` ranks (AllGather);
* :class:`Merge` ``({U_1..U_k}, T) → U′``: ``k`` replicas become one unit with the larger layout
  on the union of their GPUs; each GPU already holds a superset of its new shard (the runtime
  assigns target ranks so that shards nest), so nothing crosses a link;
* :class:`Extend` ``(U, R′) → {U, U′}``: a copy on new disjoint GPUs, rank ``i`` of ``U`` sending
  its shard to rank ``i`` of ``U′`` (rank-aligned broadcast); the only primitive that acquires GPUs;
* :class:`Destroy` ``(U) → ∅``: drops a redundant replica and releases its GPUs; never the last copy.

Their times are :mod:`rpeg.costmodel.transition`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .units import EMU, ModelStage, _mask

__all__ = ["Destroy", "Extend", "Merge", "Primitive", "Split"]


@dataclass(frozen=True)
class Primitive:
    """What every primitive exposes; see the subclasses for the formulas.

    Attributes
    ----------
    kind
        ``"split"``, ``"merge"``, ``"extend"`` or ``"destroy"``.
    """

    kind: ClassVar[str] = ""

    @property
    def inputs(self) -> tuple[EMU, ...]:
        """Units that must exist when it starts."""
        raise NotImplementedError

    @property
    def outputs(self) -> tuple[EMU, ...]:
        """Units it creates (resident from its start, complete at its end)."""
        raise NotImplementedError

    @property
    def consumed(self) -> tuple[EMU, ...]:
        """Units it removes (resident until its end)."""
        raise NotImplementedError

    @property
    def stage(self) -> ModelStage:
        """The model-stage it changes."""
        return self.inputs[0].stage

    @property
    def used_mask(self) -> int:
        """Bit mask of every GPU it runs on (held exclusively while it runs)."""
        m = 0
        for u in self.inputs + self.outputs:
            m |= u.mask
        return m

    @property
    def gpus(self) -> frozenset[int]:
        """GPUs it runs on."""
        return frozenset(g for u in self.inputs + self.outputs for g in u.gpus)

    @property
    def acquired(self) -> frozenset[int]:
        """GPUs the model-stage holds afterwards and did not before (Extend only)."""
        return frozenset()

    @property
    def released(self) -> frozenset[int]:
        """GPUs whose copy of the unit it drops (Destroy only)."""
        return frozenset()

    @property
    def nbytes(self) -> float:
        """Bytes each participating GPU moves (received or copied)."""
        raise NotImplementedError

    def memory_need(self, gpu: int) -> float:
        """Bytes of this primitive's units resident on ``gpu`` while it runs (sources kept until it
        ends, outputs allocated at its start): ``Σ_{u ∈ inputs ∪ outputs, gpu ∈ R_u} |u|/|R_u|``."""
        return sum(u.bytes_per_gpu for u in self.inputs + self.outputs if gpu in u.gpus)

    def label(self) -> str:
        """One line for tables and messages."""
        return f"{self.kind.capitalize()} {self.stage}"


@dataclass(frozen=True)
class Split(Primitive):
    """``Split(U, T_sub) → {U_1..U_k}`` on the same GPUs.

    Every GPU gathers its new shard of ``(|θ| + |ω|)/|T_sub|`` bytes from the ``k = |T|/|T_sub|``
    ranks that hold its parts (AllGather in the smallest enclosing group); per GPU the memory
    need is ``|U|/|T| + |U|/|T_sub|`` (the source stays until the gather ends).
    """

    source: EMU
    parts: tuple[EMU, ...]
    kind: ClassVar[str] = "split"

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("Split parts must not be empty")
        tp, pp = self.parts[0].layout
        if any(p.layout != (tp, pp) for p in self.parts):
            raise ValueError(f"Split parts must share one layout, got {[p.layout for p in self.parts]}")
        if self.source.tp % tp or self.source.pp % pp or (tp, pp) == self.source.layout:
            raise ValueError(
                f"Split needs a strictly smaller dividing layout: source {self.source.layout}, parts ({tp}, {pp})"
            )
        if (
            len(self.parts) != self.group_size
            or _mask(g for p in self.parts for g in p.gpus) != self.source.mask
        ):
            raise ValueError(
                f"Split parts must tile the source's {self.source.size} GPUs in {self.group_size} units"
            )

    @property
    def inputs(self) -> tuple[EMU, ...]:
        return (self.source,)

    @property
    def outputs(self) -> tuple[EMU, ...]:
        return self.parts

    @property
    def consumed(self) -> tuple[EMU, ...]:
        return (self.source,)

    @property
    def stage(self) -> ModelStage:
        return self.source.stage

    @property
    def used_mask(self) -> int:
        return self.source.mask  # the parts tile it

    @property
    def group_size(self) -> int:
        """``k = |T|/|T_sub|``."""
        return self.source.size // self.parts[0].size

    @property
    def nbytes(self) -> float:
        """``(|θ| + |ω|)/|T_sub|``, the gathered buffer per GPU."""
        return self.parts[0].bytes_per_gpu

    def group(self) -> tuple[int, ...]:
        """The smallest enclosing group: source ranks holding a part of rank 0's new shard
        (pipeline stages ``0..pp/pp_sub − 1``, tensor slices ``0..tp/tp_sub − 1``)."""
        s = self.source
        ktp, kpp = s.tp // self.parts[0].tp, s.pp // self.parts[0].pp
        return tuple(s.gpus[p * s.tp + t] for p in range(kpp) for t in range(ktp))


@dataclass(frozen=True)
class Merge(Primitive):
    """``Merge({U_1..U_k}, T) → U′`` on the union of their GPUs.

    Each GPU keeps the slice of its resident shard that its target rank needs (a local copy of
    ``(|θ| + |ω|)/|T|`` bytes, no link traffic); memory need per GPU ``|U|/|T_sub| + |U|/|T|``.
    """

    parts: tuple[EMU, ...]
    result: EMU
    kind: ClassVar[str] = "merge"

    def __post_init__(self) -> None:
        if len(self.parts) < 2:
            raise ValueError(f"Merge needs at least 2 parts, got {len(self.parts)}")
        tp, pp = self.parts[0].layout
        if any(p.layout != (tp, pp) for p in self.parts):
            raise ValueError(f"Merge parts must share one layout, got {[p.layout for p in self.parts]}")
        if self.result.tp % tp or self.result.pp % pp:
            raise ValueError(f"Merge result layout {self.result.layout} must be a multiple of ({tp}, {pp})")
        if (
            _mask(g for p in self.parts for g in p.gpus) != self.result.mask
            or sum(p.size for p in self.parts) != self.result.size
        ):
            raise ValueError("Merge parts must tile the result's GPUs")

    @property
    def inputs(self) -> tuple[EMU, ...]:
        return self.parts

    @property
    def outputs(self) -> tuple[EMU, ...]:
        return (self.result,)

    @property
    def consumed(self) -> tuple[EMU, ...]:
        return self.parts

    @property
    def stage(self) -> ModelStage:
        return self.parts[0].stage

    @property
    def used_mask(self) -> int:
        return self.result.mask  # the parts tile it

    @property
    def nbytes(self) -> float:
        """``(|θ| + |ω|)/|T|``, copied locally on each GPU."""
        return self.result.bytes_per_gpu


@dataclass(frozen=True)
class Extend(Primitive):
    """``Extend(U, R′) → {U, U′}``: rank ``i`` of ``U`` sends its shard to rank ``i`` of ``U′``.

    Bytes per rank pair ``(|θ| + |ω|)/|T|``; memory need: the shard on each new GPU (the source
    sends from its resident copy). ``R′`` must be disjoint from ``R``.
    """

    source: EMU
    result: EMU
    kind: ClassVar[str] = "extend"

    def __post_init__(self) -> None:
        a, b = self.source, self.result
        if (a.layout, a.vp) != (b.layout, b.vp) or a.stage != b.stage:
            raise ValueError(f"Extend copies a unit unchanged: source {self.source}, result {self.result}")
        if self.source.mask & self.result.mask:
            raise ValueError(
                f"Extend target GPUs {list(self.result.gpus)} overlap its source {list(self.source.gpus)}"
            )

    @property
    def inputs(self) -> tuple[EMU, ...]:
        return (self.source,)

    @property
    def outputs(self) -> tuple[EMU, ...]:
        return (self.result,)

    @property
    def consumed(self) -> tuple[EMU, ...]:
        return ()

    @property
    def stage(self) -> ModelStage:
        return self.source.stage

    @property
    def used_mask(self) -> int:
        return self.source.mask | self.result.mask

    @property
    def acquired(self) -> frozenset[int]:
        return frozenset(self.result.gpus)

    @property
    def nbytes(self) -> float:
        """``(|θ| + |ω|)/|T|`` per rank pair."""
        return self.source.bytes_per_gpu

    def memory_need(self, gpu: int) -> float:
        return self.result.bytes_per_gpu if gpu in self.result.gpus else 0.0


@dataclass(frozen=True)
class Destroy(Primitive):
    """``Destroy(U) → ∅``: local teardown; frees ``|U|/|T|`` bytes on each GPU at its end."""

    unit: EMU
    kind: ClassVar[str] = "destroy"

    @property
    def inputs(self) -> tuple[EMU, ...]:
        return (self.unit,)

    @property
    def outputs(self) -> tuple[EMU, ...]:
        return ()

    @property
    def consumed(self) -> tuple[EMU, ...]:
        return (self.unit,)

    @property
    def stage(self) -> ModelStage:
        return self.unit.stage

    @property
    def used_mask(self) -> int:
        return self.unit.mask

    @property
    def released(self) -> frozenset[int]:
        return frozenset(self.unit.gpus)

    @property
    def nbytes(self) -> float:
        """Nothing moves."""
        return 0.0
