"""Elastic Model Units, the four state primitives and the transition DAG (SPEC §10, Nereus §5–§6).

A **model-stage** ``M = (model, stage)`` is one model in one stage (``Gen``, ``Inf`` or ``Train``,
from the vertex role). An **EMU** is one replica of a model-stage:
``⟨M, T = tp×pp, R (|R| = tp·pp, in rank order), θ, ω⟩``. Its state is never sharded across data
parallelism, so the DP degree of ``M`` is its number of EMUs and every EMU holds a full logical
copy: parameters ``θ`` of ``N_m·sb`` bytes (the RPEG weight container ``W_m``) and, for training,
optimizer state ``ω`` of ``12·N_m`` bytes (FP32 master weights and two Adam moments). Per GPU a
unit holds ``(N_m·sb + [train]·12·N_m)/(tp·pp)`` bytes.

Primitives (each a frozen dataclass that knows its byte volume, GPU sets and memory need):

* :class:`Split` ``(U, T_sub) → {U_1..U_k}``: one unit becomes ``k = |T|/|T_sub|`` replicas with
  the smaller layout on the same GPUs (consecutive rank blocks of ``|T_sub|`` GPUs); every GPU
  gathers its larger shard, ``|θ+ω|/|T_sub|`` bytes, from a group of ``k`` ranks (AllGather);
* :class:`Merge` ``({U_1..U_k}, T) → U′``: ``k`` replicas become one unit with the larger layout
  on the union of their GPUs; each GPU already holds a superset of its new shard (the runtime
  assigns target ranks so that shards nest), so nothing crosses a link;
* :class:`Extend` ``(U, R′) → {U, U′}``: a copy on new disjoint GPUs, rank ``i`` of ``U`` sending
  its shard to rank ``i`` of ``U′`` (rank-aligned broadcast); the only primitive that acquires GPUs;
* :class:`Destroy` ``(U) → ∅``: drops a redundant replica and releases its GPUs; never the last copy.

:func:`plan_diff` pairs the current and target EMU collections per model-stage and
:func:`transition_dag` compiles the difference into the global transition DAG:

1. **Local DAG** per model-stage, in the order Split → Destroy → Extend → Merge through the
   largest common layout ``T_sub = (gcd(tp, tp*), gcd(pp, pp*))``. Units are aligned contiguous
   device ranges, so the ``|T_sub|``-blocks of the current and target units either coincide or are
   disjoint: a sub-unit on a target block is kept, the others are destroyed, the missing target
   blocks are filled by Extend (a binomial broadcast tree: each copy can serve as a source once it
   exists), and Merge assembles each target unit. When no sub-unit is kept, one *anchor* sub-unit
   (preferably one on GPUs no other model-stage wants) is destroyed only after the Extends it
   feeds, so a copy of the state exists at every prefix of the DAG.
2. **Global DAG**: the union of the local DAGs plus *resource edges*. A GPU's owners may change
   only from the current owners to the target owners: an Extend of ``M`` onto GPU ``g`` waits for
   the Destroy that releases ``g`` from every model-stage that holds ``g`` now and not in the
   target. Such an edge is added only if the Destroy does not itself depend on the blocked
   Extend; otherwise the target is infeasible (:class:`TransitionInfeasible` names the blocked and
   the blocking model-stages and the GPUs). Extends are processed in stage order Gen → Inf → Train.

Scheduling (release-before-acquire, per-GPU exclusivity and memory) is left to
:mod:`rpeg.heuristics.transition` and the exact models; costs to :mod:`rpeg.costmodel.transition`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import ClassVar

from .cluster import Cluster
from .graph import RPEG
from .plan import Plan
from .types import Role

__all__ = [
    "EMU",
    "OPTIMIZER_BYTES_PER_PARAM",
    "Destroy",
    "Extend",
    "Merge",
    "ModelStage",
    "Primitive",
    "Split",
    "Stage",
    "StageDiff",
    "TransitionDAG",
    "TransitionInfeasible",
    "emus_of",
    "plan_diff",
    "transition_dag",
]

#: FP32 master weights + two FP32 Adam moments per parameter (SPEC §6), held by training EMUs.
OPTIMIZER_BYTES_PER_PARAM = 12


class Stage(str, Enum):
    """The stage of a model-stage, ordered Gen → Inf → Train (the DAG's tie-break)."""

    GEN = "Gen"
    INF = "Inf"
    TRAIN = "Train"

    @property
    def order(self) -> int:
        """0 for Gen, 1 for Inf, 2 for Train."""
        return _STAGE_ORDER[self]

    @classmethod
    def from_role(cls, role: Role) -> Stage:
        """Generation → Gen, inference → Inf, training → Train."""
        return {Role.GENERATION: cls.GEN, Role.INFERENCE: cls.INF, Role.TRAINING: cls.TRAIN}[Role(role)]

    def __str__(self) -> str:
        return self.value


_STAGE_ORDER = {Stage.GEN: 0, Stage.INF: 1, Stage.TRAIN: 2}


@dataclass(frozen=True)
class ModelStage:
    """One model in one stage, ``M = (model, stage)``.

    Parameters
    ----------
    model
        Model name in the RPEG.
    stage
        Gen, Inf or Train.
    vertex
        The RPEG vertex it stands for; part of the identity so that two invocations of one model
        in one stage (ReMax's two generations) stay separate model-stages.
    index
        Vertex position (second tie-break after the stage; not part of the identity).
    """

    model: str
    stage: Stage
    vertex: str = ""
    index: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"ModelStage model must be a non-empty string, got {self.model!r}")
        object.__setattr__(self, "stage", Stage(self.stage))

    @property
    def sort_key(self) -> tuple[int, int, str]:
        """``(stage order, vertex index, vertex)``: Gen before Inf before Train."""
        return (self.stage.order, self.index, self.vertex)

    def __str__(self) -> str:
        base = f"{self.model}/{self.stage.value}"
        return f"{base} ({self.vertex})" if self.vertex else base


def _mask(gpus: Iterable[int]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


def _sorted_mask(gpus: Sequence[int]) -> int:
    """:func:`_mask` of ascending GPU ids, in one shift when they are consecutive."""
    if gpus[-1] - gpus[0] == len(gpus) - 1:
        return ((1 << len(gpus)) - 1) << gpus[0]
    return _mask(gpus)


def _is_pos_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


@dataclass(frozen=True)
class EMU:
    """One replica of a model-stage: ``⟨M, T = tp×pp, R, θ, ω⟩`` (SPEC §10).

    Parameters
    ----------
    stage
        The model-stage ``M``.
    tp, pp
        The layout ``T``; ``|R| = tp·pp``.
    gpus
        ``R`` in rank order (rank ``i = p·tp + t`` holds pipeline stage ``p``, tensor slice ``t``).
    param_bytes
        ``|θ|``, bytes of one full copy of the parameters (``N_m·sb``).
    optim_bytes
        ``|ω|``, bytes of one full copy of the optimizer state (``12·N_m`` for training, else 0).
    uid
        Identity inside a :class:`TransitionDAG` (not part of equality).

    Attributes
    ----------
    mask
        Bit mask of ``R`` (bit ``g`` set for GPU ``g``).
    bytes_per_gpu
        Resident bytes on each of its GPUs, ``(|θ| + |ω|)/(tp·pp)``.

    Both are derived once at construction (the DAG builder and the schedulers read them in their
    inner loops).

    Raises
    ------
    ValueError
        If a degree is not a positive integer, ``len(gpus) ≠ tp·pp``, a GPU id repeats or is
        negative, or a byte count is negative; the message names the field and the value.
    """

    stage: ModelStage
    tp: int
    pp: int
    gpus: tuple[int, ...]
    param_bytes: float
    optim_bytes: float = 0.0
    uid: int = field(default=-1, compare=False)
    mask: int = field(init=False, compare=False, repr=False)
    bytes_per_gpu: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        tp, pp, pb, ob = self.tp, self.pp, self.param_bytes, self.optim_bytes
        for name, v in (("tp", tp), ("pp", pp)):
            if not _is_pos_int(v):
                raise ValueError(f"EMU {name} must be a positive integer, got {v!r}")
        gpus = tuple(self.gpus)
        if len(gpus) != tp * pp:
            raise ValueError(f"EMU gpus must hold tp·pp = {tp * pp} GPUs, got {len(gpus)}: {list(gpus)}")
        mask = 0
        for g in gpus:
            if not isinstance(g, int) or g < 0:
                mask = -1
                break
            mask |= 1 << g
        if mask < 0 or mask.bit_count() != len(gpus):  # not an id, or an id twice
            raise ValueError(f"EMU gpus must be distinct non-negative integers, got {list(gpus)}")
        for name, v in (("param_bytes", pb), ("optim_bytes", ob)):
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"EMU {name} must be a non-negative number, got {v!r}")
        # derived fields, written past the frozen __setattr__ (EMUs are built by the thousand)
        self.__dict__.update(gpus=gpus, mask=mask, bytes_per_gpu=(pb + ob) / (tp * pp))

    @property
    def size(self) -> int:
        """``|R| = tp·pp``."""
        return self.tp * self.pp

    @property
    def layout(self) -> tuple[int, int]:
        """``(tp, pp)``."""
        return (self.tp, self.pp)

    @property
    def state_bytes(self) -> float:
        """``|θ| + |ω|``, one full logical copy."""
        return self.param_bytes + self.optim_bytes

    @property
    def param_shard_bytes(self) -> float:
        """Parameter bytes per GPU, ``|θ|/(tp·pp)``."""
        return self.param_bytes / self.size

    @property
    def optim_shard_bytes(self) -> float:
        """Optimizer bytes per GPU, ``|ω|/(tp·pp)``."""
        return self.optim_bytes / self.size

    def key(self) -> tuple[ModelStage, int, int, frozenset[int]]:
        """``(M, tp, pp, R as a set)``: what a collection comparison looks at (rank order within a
        unit is a relabelling the runtime chooses)."""
        return (self.stage, self.tp, self.pp, frozenset(self.gpus))

    def with_uid(self, uid: int) -> EMU:
        """A copy carrying ``uid``."""
        return _trusted(
            self.stage, self.tp, self.pp, self.gpus, self.param_bytes, self.optim_bytes, uid, self.mask
        )

    def sub_unit(self, tp: int, pp: int, gpus: Sequence[int], uid: int = -1) -> EMU:
        """A unit of the same model-stage and state with layout ``tp×pp`` on ``gpus``."""
        if tp * pp != len(gpus):
            raise ValueError(f"EMU gpus must hold tp·pp = {tp * pp} GPUs, got {len(gpus)}: {list(gpus)}")
        return _trusted(self.stage, tp, pp, tuple(gpus), self.param_bytes, self.optim_bytes, uid, _mask(gpus))

    def __str__(self) -> str:
        lo, hi = min(self.gpus), max(self.gpus)
        where = (
            f"GPU {lo}"
            if lo == hi
            else f"GPUs {lo}-{hi}"
            if hi - lo + 1 == self.size
            else f"GPUs {sorted(self.gpus)}"
        )
        return f"{self.stage} tp={self.tp} pp={self.pp} on {where}"


def _trusted(
    stage: ModelStage, tp: int, pp: int, gpus: tuple[int, ...], pb: float, ob: float, uid: int, mask: int
) -> EMU:
    """An EMU built from already-validated parts (the DAG builder creates thousands): the fields
    go straight into the instance dictionary, past the frozen ``__setattr__``."""
    u = object.__new__(EMU)
    d = u.__dict__
    d["stage"] = stage
    d["tp"] = tp
    d["pp"] = pp
    d["gpus"] = gpus
    d["param_bytes"] = pb
    d["optim_bytes"] = ob
    d["uid"] = uid
    d["mask"] = mask
    d["bytes_per_gpu"] = (pb + ob) / (tp * pp)
    return u


# ---------------------------------------------------------------------------------- primitives
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
        if self.source.layout != self.result.layout or self.source.stage != self.result.stage:
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


# ---------------------------------------------------------------------------------- collections
class TransitionInfeasible(ValueError):
    """No transition DAG (or schedule) reaches the target.

    Attributes
    ----------
    stage
        The blocked model-stage (as text).
    blocking
        The model-stage holding what it needs (as text; empty when memory blocks).
    gpus
        The GPUs concerned.
    """

    def __init__(
        self, message: str, *, stage: str = "", blocking: str = "", gpus: Sequence[int] = ()
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.blocking = blocking
        self.gpus = tuple(gpus)


def emus_of(
    plan: Plan,
    cluster: Cluster,
    *,
    graph: RPEG | None = None,
    workload: object | None = None,
) -> list[EMU]:
    """The EMU collection ``E(S)`` of an rpeg plan.

    Vertex ``v`` with choice ``(σ, Pd, Pp, Pt)`` becomes model-stage
    ``(µ(v), stage(r(v)))`` with ``Pd`` units; replica ``j`` takes devices
    ``σ[j·Pp·Pt : (j+1)·Pp·Pt]`` of the allocation in rank order (the layout the cost model uses).
    State per unit: ``|θ| = N_m·sb`` (the RPEG weight container ``W_m``) and, for a training
    vertex, ``|ω| = 12·N_m``.

    Parameters
    ----------
    plan
        One choice per vertex, in vertex order.
    cluster
        The device space (checks that every device exists).
    graph, workload
        The RPEG the plan is for, or a workload whose synchronous graph it is for (one of them).

    Returns
    -------
    list[EMU]
        Units with ``uid`` 0, 1, … in vertex order, then replica order.

    Raises
    ------
    ValueError
        If neither or both of ``graph``/``workload`` is given, the plan has the wrong length, or an
        allocation leaves the cluster.
    """
    if (graph is None) == (workload is None):
        raise ValueError("emus_of needs exactly one of graph= or workload=")
    if graph is None:
        from .templates import build_graph

        graph = build_graph(workload)  # type: ignore[arg-type]
    if len(plan) != len(graph.vertices):
        raise ValueError(f"plan has {len(plan)} choices but the graph has {len(graph.vertices)} vertices")
    out: list[EMU] = []
    for i, (v, c) in enumerate(zip(graph.vertices, plan.choices)):
        s = c.strategy
        devices = c.allocation.devices()
        if devices and devices[-1] >= cluster.num_devices:
            raise ValueError(
                f"plan: vertex {v.name!r} uses device {devices[-1]} outside cluster {cluster.shape_str}"
            )
        w = graph.containers[RPEG.weights_container(v.model)]
        ms = ModelStage(v.model, Stage.from_role(v.role), v.name, i)
        optim = float(OPTIMIZER_BYTES_PER_PARAM * w.count) if v.role is Role.TRAINING else 0.0
        rep = s.pp * s.tp
        for j in range(s.dp):
            out.append(
                EMU(ms, s.tp, s.pp, tuple(devices[j * rep : (j + 1) * rep]), float(w.nbytes), optim, len(out))
            )
    return out


@dataclass(frozen=True)
class StageDiff:
    """``Δ_M = (E_M → E*_M)`` of one model-stage.

    Attributes
    ----------
    stage
        ``M``.
    current, target
        Its units before and after, sorted by first GPU.
    """

    stage: ModelStage
    current: tuple[EMU, ...]
    target: tuple[EMU, ...]

    @property
    def t_sub(self) -> tuple[int, int]:
        """The largest layout both sides split into: ``(gcd(tp, tp*), gcd(pp, pp*))``."""
        a, b = self.current[0], self.target[0]
        return (math.gcd(a.tp, b.tp), math.gcd(a.pp, b.pp))

    @property
    def dp(self) -> tuple[int, int]:
        """DP degree before and after."""
        return (len(self.current), len(self.target))

    @property
    def unchanged(self) -> bool:
        """Whether the model-stage keeps exactly its units (same layout and GPU sets; the units of
        one side share a layout and are disjoint, as :func:`plan_diff` checks)."""
        a, b = self.current, self.target
        if len(a) != len(b) or not a:
            return len(a) == len(b)
        if (a[0].tp, a[0].pp) != (b[0].tp, b[0].pp):
            return False
        return {u.mask for u in a} == {u.mask for u in b}

    @property
    def released(self) -> frozenset[int]:
        """GPUs it holds now and not in the target."""
        return frozenset(g for u in self.current for g in u.gpus) - frozenset(
            g for u in self.target for g in u.gpus
        )

    @property
    def acquired(self) -> frozenset[int]:
        """GPUs it holds in the target and not now."""
        return frozenset(g for u in self.target for g in u.gpus) - frozenset(
            g for u in self.current for g in u.gpus
        )


def _check_collection(units: Sequence[EMU], name: str) -> dict[ModelStage, list[EMU]]:
    by: dict[ModelStage, list[EMU]] = {}
    # the units of a model-stage usually share one ModelStage object: hash each object once
    # (a dataclass hash is a Python call), the list of its model-stage found by identity after
    by_object: dict[int, list[EMU]] = {}
    for u in units:
        us = by_object.get(id(u.stage))
        if us is None:
            us = by_object[id(u.stage)] = by.setdefault(u.stage, [])
        us.append(u)
    for ms, us in by.items():
        if len({(u.tp, u.pp) for u in us}) != 1:
            raise ValueError(f"{name}: model-stage {ms} mixes layouts {sorted({u.layout for u in us})}")
        if len({(u.param_bytes, u.optim_bytes) for u in us}) != 1:
            raise ValueError(f"{name}: model-stage {ms} has units of different state sizes")
        seen = 0
        for u in us:
            if seen & u.mask:
                raise ValueError(
                    f"{name}: units of model-stage {ms} share GPUs {sorted(set(u.gpus) & _bits(seen))}"
                )
            seen |= u.mask
    return by


def _bits(mask: int) -> set[int]:
    """The positions of the set bits of ``mask`` (one step per set bit, not per bit position)."""
    out = set()
    while mask:
        low = mask & -mask
        out.add(low.bit_length() - 1)
        mask ^= low
    return out


def plan_diff(current: Sequence[EMU], target: Sequence[EMU]) -> dict[ModelStage, StageDiff]:
    """Pair two EMU collections per model-stage, in stage order Gen → Inf → Train.

    Raises
    ------
    ValueError
        If a model-stage is on one side only, mixes layouts, has units of different state sizes
        or units sharing GPUs, or changes its state size.
    """
    cur = _check_collection(current, "current")
    tgt = _check_collection(target, "target")
    if set(cur) != set(tgt):
        only = sorted(str(m) for m in set(cur) ^ set(tgt))
        raise ValueError(
            f"current and target plans must have the same model-stages; only on one side: {only}"
        )
    out = {}
    for ms in sorted(cur, key=lambda m: m.sort_key):
        a = tuple(sorted(cur[ms], key=lambda u: min(u.gpus)))
        b = tuple(sorted(tgt[ms], key=lambda u: min(u.gpus)))
        if a[0].state_bytes != b[0].state_bytes:
            raise ValueError(
                f"model-stage {ms} changes its state size ({a[0].state_bytes} → {b[0].state_bytes} bytes)"
            )
        out[ms] = StageDiff(ms, a, b)
    return out


# ---------------------------------------------------------------------------------- the DAG
@dataclass(frozen=True)
class TransitionDAG:
    """The global transition DAG (module docstring).

    Attributes
    ----------
    primitives
        The primitives; edges and schedules refer to them by index.
    edges
        State edges ``(i, j)``: ``j`` needs a unit ``i`` creates, or ``i`` must copy a unit before
        ``j`` consumes it (the local DAGs).
    resource_edges
        ``(destroy, extend)`` pairs added because the Extend needs GPUs the Destroy releases.
    current, target
        The collections before and after (units carry their ``uid``).
    diffs
        Per model-stage difference.
    """

    primitives: tuple[Primitive, ...]
    edges: tuple[tuple[int, int], ...]
    resource_edges: tuple[tuple[int, int], ...]
    current: tuple[EMU, ...]
    target: tuple[EMU, ...]
    diffs: dict[ModelStage, StageDiff]

    def __len__(self) -> int:
        return len(self.primitives)

    @property
    def all_edges(self) -> tuple[tuple[int, int], ...]:
        """State and resource edges."""
        return self.edges + self.resource_edges

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Per primitive, the heads of its state edges, then of its resource edges."""
        out: list[list[int]] = [[] for _ in self.primitives]
        for i, j in self.all_edges:
            out[i].append(j)
        return tuple(map(tuple, out))

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """Per primitive, the tails of its state edges, then of its resource edges."""
        out: list[list[int]] = [[] for _ in self.primitives]
        for i, j in self.all_edges:
            out[j].append(i)
        return tuple(map(tuple, out))

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        """Kahn's order, smallest index first (``0, 1, …, n−1`` when every edge points to a
        higher index, as every state edge does).

        Raises
        ------
        ValueError
            If the edges contain a cycle.
        """
        n = len(self.primitives)
        if all(i < j for i, j in self.resource_edges) and all(i < j for i, j in self.edges):
            return tuple(range(n))  # Kahn's smallest-index-first rule then takes 0, 1, 2, … in turn
        indeg = [len(p) for p in self.predecessors]
        heap = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            i = heapq.heappop(heap)
            order.append(i)
            for j in self.successors[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, j)
        if len(order) != n:
            raise ValueError(
                f"transition DAG has a cycle through primitive {min(i for i in range(n) if indeg[i])}"
            )
        return tuple(order)

    @property
    def is_acyclic(self) -> bool:
        try:
            _ = self.topological_order
        except ValueError:
            return False
        return True

    @cached_property
    def units(self) -> dict[int, EMU]:
        """Every unit that exists at some point, by ``uid``."""
        out = {u.uid: u for u in self.current}
        for p in self.primitives:
            for u in p.outputs:
                out[u.uid] = u
        return out

    @cached_property
    def creator(self) -> dict[int, int]:
        """``uid`` → index of the primitive that creates it (absent for current units)."""
        return {u.uid: i for i, p in enumerate(self.primitives) for u in p.outputs}

    @cached_property
    def consumer(self) -> dict[int, int]:
        """``uid`` → index of the primitive that removes it (absent for target units)."""
        return {u.uid: i for i, p in enumerate(self.primitives) for u in p.consumed}

    def count(self, kind: str) -> int:
        """Number of primitives of ``kind``."""
        return sum(p.kind == kind for p in self.primitives)

    def apply(self, order: Sequence[int] | None = None) -> list[EMU]:
        """Execute the primitives one at a time in ``order`` (default: topological) on the current
        collection and return the resulting collection.

        Raises
        ------
        ValueError
            If a primitive's inputs are missing, an output already exists, a Destroy would drop
            the last copy of a model-stage's state, or ``order`` breaks an edge or repeats a
            primitive.
        """
        order = list(self.topological_order if order is None else order)
        if sorted(order) != list(range(len(self.primitives))):
            raise ValueError("order must list every primitive exactly once")
        pos = {p: k for k, p in enumerate(order)}
        for i, j in self.all_edges:
            if pos[i] > pos[j]:
                raise ValueError(f"order runs primitive {j} before its predecessor {i}")
        alive = {u.uid: u for u in self.current}
        per_stage: dict[ModelStage, int] = {}
        for u in self.current:
            per_stage[u.stage] = per_stage.get(u.stage, 0) + 1
        for i in order:
            p = self.primitives[i]
            for u in p.inputs:
                if u.uid not in alive:
                    raise ValueError(f"primitive {i} ({p.label()}) needs unit {u.uid}, which does not exist")
            if isinstance(p, Destroy) and per_stage[p.stage] <= 1:
                raise ValueError(f"primitive {i} destroys the last copy of {p.stage}")
            for u in p.consumed:
                del alive[u.uid]
                per_stage[u.stage] -= 1
            for u in p.outputs:
                if u.uid in alive:
                    raise ValueError(f"primitive {i} creates unit {u.uid} twice")
                alive[u.uid] = u
                per_stage[u.stage] = per_stage.get(u.stage, 0) + 1
        return list(alive.values())


def transition_dag(current: Sequence[EMU], target: Sequence[EMU]) -> TransitionDAG:
    """Compile ``E(S) → E(S*)`` into the global transition DAG (module docstring).

    Parameters
    ----------
    current, target
        EMU collections (e.g. from :func:`emus_of`); ``uid`` values are reassigned.

    Returns
    -------
    TransitionDAG
        Acyclic; executing it (:meth:`TransitionDAG.apply`) yields ``target`` up to ``uid`` and
        the rank order inside a unit.

    Raises
    ------
    TransitionInfeasible
        When an Extend needs GPUs that another model-stage releases only after (transitively) that
        Extend: the message names both model-stages and the GPUs.
    ValueError
        When the collections do not pair up (:func:`plan_diff`).
    """
    diffs = plan_diff(current, target)
    b = _Builder(diffs)
    return b.build()


class _Builder:
    """Builds local DAGs, then the resource edges (kept out of the public API).

    Edges are kept as successor lists: a primitive's predecessors all exist when it is added, so
    every state edge points to a higher index, each list grows in index order and a repeated edge
    is always the list's last entry.
    """

    def __init__(self, diffs: dict[ModelStage, StageDiff]) -> None:
        self.diffs = diffs
        self.prims: list[Primitive] = []
        self.succ: list[list[int]] = []
        self.has_preds: list[bool] = []
        self.next_uid = 0
        self.current: list[EMU] = []
        self.final: list[EMU] = []
        # GPU owners now and in the target: mask per model-stage
        self.cur_mask = {ms: _union(d.current) for ms, d in diffs.items()}
        self.tgt_mask = {ms: _union(d.target) for ms, d in diffs.items()}
        # GPUs someone acquires: a Destroy there may unblock an Extend, so anchors avoid them
        self.wanted = {ms: 0 for ms in diffs}
        for ms in diffs:
            acq = self.tgt_mask[ms] & ~self.cur_mask[ms]
            for other in diffs:
                if other != ms:
                    self.wanted[other] |= acq
        self.destroy_of: list[tuple[EMU, int, ModelStage]] = []  # (unit, prim index, stage)
        self.extends: list[tuple[int, ModelStage]] = []

    def uid(self) -> int:
        self.next_uid += 1
        return self.next_uid - 1

    def add(self, p: Primitive, preds: Iterable[int | None] = ()) -> int:
        i = len(self.prims)
        self.prims.append(p)
        self.succ.append([])
        self.has_preds.append(False)
        for q in preds:
            if q is not None:
                s = self.succ[q]
                if not s or s[-1] != i:
                    s.append(i)
                    self.has_preds[i] = True
        return i

    def build(self) -> TransitionDAG:
        for d in self.diffs.values():
            for u in d.current:
                uid = self.uid()
                self.current.append(u if u.uid == uid else u.with_uid(uid))
        k = 0
        for d in self.diffs.values():
            n = len(d.current)
            self._local(d, self.current[k : k + n])
            k += n
        edges = tuple((i, j) for i, js in enumerate(self.succ) for j in js)  # sorted, as promised
        resource = self._resource_edges()
        dag = TransitionDAG(
            tuple(self.prims),
            edges,
            tuple(sorted(resource)),
            tuple(self.current),
            tuple(self.final),
            self.diffs,
        )
        _ = dag.topological_order  # validates acyclicity (cannot fail by construction)
        return dag

    def _local(self, d: StageDiff, current: list[EMU]) -> None:
        """Split → Destroy → Extend → Merge for one model-stage (module docstring, step 1).

        The primitives are consistent by construction (parts tile their source or result, an
        Extend's blocks are disjoint from its source), so they are built past their validation.
        """
        if d.unchanged:
            self.final.extend(current)
            return
        stp, spp = d.t_sub
        s = stp * spp
        # 1. Split every current unit down to T_sub; sub-units keyed by their block's mask
        subs: dict[int, tuple[EMU, int | None]] = {}
        for u in current:
            if u.tp == stp and u.pp == spp:
                subs[u.mask] = (u, None)
                continue
            parts = tuple(
                u.sub_unit(stp, spp, u.gpus[j * s : (j + 1) * s], self.uid()) for j in range(u.size // s)
            )
            i = self.add(_trusted_primitive(Split, source=u, parts=parts))
            for p in parts:
                subs[p.mask] = (p, i)
        # target blocks, per target unit in rank order: (mask, its |T_sub| GPUs in ascending order);
        # a unit of one block is its own block, its GPUs sorted only if it is missing
        blocks: list[list[tuple[int, tuple[int, ...] | EMU]]] = []
        for t in d.target:
            if t.size == s:
                blocks.append([(t.mask, t)])
                continue
            gs = sorted(t.gpus)
            bls = [tuple(gs[j * s : (j + 1) * s]) for j in range(t.size // s)]
            blocks.append([(_sorted_mask(bl), bl) for bl in bls])
        block_masks = {m for ms in blocks for m, _ in ms}
        kept = {m: v for m, v in subs.items() if m in block_masks}
        spare = [v for m, v in subs.items() if m not in block_masks]
        missing = [(m, bl) for ms in blocks for m, bl in ms if m not in kept]
        anchor: tuple[EMU, int | None] | None = None
        if not kept and missing:
            # the state survives on one spare sub-unit until an Extend copied it; prefer one on
            # GPUs nobody else acquires, so its late Destroy blocks no other model-stage
            wanted = self.wanted[d.stage]
            anchor = min(spare, key=lambda v: ((v[0].mask & wanted).bit_count(), min(v[0].gpus)))
        # 2. Destroy the redundant sub-units (release before acquire)
        for u, c in spare:
            if anchor is not None and u is anchor[0]:
                continue
            i = self.add(_trusted_primitive(Destroy, unit=u), (c,))
            self.destroy_of.append((u, i, d.stage))
        # 3. Extend onto the missing blocks: a binomial broadcast from the kept sub-units. Round
        # r uses every copy that exists after round r − 1 once, by (first GPU, uid): each source
        # serves again next round, next to the copy it made
        feeds: dict[int, list[int]] = {}  # uid → Extends reading it
        at: dict[int, tuple[EMU, int | None]] = dict(kept)
        now = sorted((min(v[0].gpus), v[0].uid, v) for v in (list(kept.values()) or [anchor]))  # type: ignore[list-item]
        after: list[tuple[int, int, tuple[EMU, int | None]]] = []
        k = 0
        for m, bl in missing:
            if k == len(now):
                now, after, k = sorted(after), [], 0
            first, _, (src, c) = now[k]
            k += 1
            if isinstance(bl, EMU):
                bl = tuple(sorted(bl.gpus))
            new = _trusted(src.stage, stp, spp, bl, src.param_bytes, src.optim_bytes, self.uid(), m)
            i = self.add(_trusted_primitive(Extend, source=src, result=new), (c,))
            feeds.setdefault(src.uid, []).append(i)
            self.extends.append((i, d.stage))
            at[m] = (new, i)
            after.append((first, src.uid, (src, c)))
            after.append((bl[0], new.uid, (new, i)))
        if anchor is not None:
            u, c = anchor
            i = self.add(_trusted_primitive(Destroy, unit=u), [c, *feeds.get(u.uid, [])])
            self.destroy_of.append((u, i, d.stage))
        # 4. Merge the sub-units of each target unit
        for t, ms in zip(d.target, blocks):
            if len(ms) == 1:
                self.final.append(at[ms[0][0]][0])
                continue
            parts = [at[m] for m, _ in ms]
            result = t.with_uid(self.uid())
            preds = [c for _, c in parts] + [e for u, _ in parts for e in feeds.get(u.uid, [])]
            self.add(_trusted_primitive(Merge, parts=tuple(u for u, _ in parts), result=result), preds)
            self.final.append(result)

    def _resource_edges(self) -> set[tuple[int, int]]:
        """Step 2: Destroy → Extend where the Extend acquires GPUs a leaving owner releases (or,
        within one model-stage, GPUs a destroyed unit of its own still occupies)."""
        leaving = {ms: self.cur_mask[ms] & ~self.tgt_mask[ms] for ms in self.diffs}
        by_gpu: dict[int, list[int]] = {}
        destroyed = 0
        for k, (u, _, _) in enumerate(self.destroy_of):
            destroyed |= u.mask
            for g in u.gpus:
                by_gpu.setdefault(g, []).append(k)
        out: set[tuple[int, int]] = set()
        extra: dict[int, list[int]] = {}  # resource edges added so far, for the reachability test
        has_preds = self.has_preds
        # self.extends is in (stage order, index) order: the diffs come sorted, indices only grow
        for e, ms in self.extends:
            result = self.prims[e].outputs[0]
            dest = result.mask
            if not dest & destroyed:
                continue
            for k in sorted({k for g in result.gpus for k in by_gpu.get(g, ())}):
                u, dsi, other = self.destroy_of[k]
                blocks = u.mask & dest if other == ms else u.mask & dest & leaving[other]
                if not blocks or (dsi, e) in out:
                    continue
                if has_preds[dsi] and _reaches(self.succ, extra, e, dsi):
                    gpus = sorted(_bits(blocks))
                    raise TransitionInfeasible(
                        f"transition infeasible: Extend of {ms} onto GPUs {gpus} needs GPUs that {other} "
                        f"releases only after that Extend (both model-stages wait for each other; a free "
                        f"GPU or a cheaper target is needed)",
                        stage=str(ms),
                        blocking=str(other),
                        gpus=gpus,
                    )
                out.add((dsi, e))
                extra.setdefault(dsi, []).append(e)
                has_preds[e] = True
        return out


def _union(units: Iterable[EMU]) -> int:
    """Bit mask of every GPU of ``units``."""
    m = 0
    for u in units:
        m |= u.mask
    return m


def _trusted_primitive(cls: type[Primitive], **fields: object) -> Primitive:
    """A primitive built by the DAG builder, whose parts are consistent by construction: the
    fields go straight into the instance dictionary, past ``__post_init__``."""
    p = object.__new__(cls)
    p.__dict__.update(fields)
    return p


def _reaches(succ: Sequence[Sequence[int]], extra: dict[int, list[int]], src: int, dst: int) -> bool:
    """Whether ``dst`` is reachable from ``src`` over ``succ`` plus ``extra`` (iterative DFS)."""
    stack, seen = [src], {src}
    while stack:
        i = stack.pop()
        if i == dst:
            return True
        for j in (*succ[i], *extra.get(i, ())):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return False
