"""Model-stages and Elastic Model Units: the state a plan places on GPUs (SPEC §10, Nereus §5).

A **model-stage** ``M = (model, stage)`` is one model in one stage (``Gen``, ``Inf`` or ``Train``,
from the vertex role). An **EMU** is one replica of a model-stage:
``⟨M, T = tp×pp, R (|R| = tp·pp, in rank order), θ, ω⟩``. Its state is never sharded across data
parallelism, so the DP degree of ``M`` is its number of EMUs and every EMU holds a full logical
copy: parameters ``θ`` of ``N_m·sb`` bytes (the RPEG weight container ``W_m``) and, for training,
optimizer state ``ω`` of ``12·N_m`` bytes (FP32 master weights and two Adam moments). Per GPU a
unit holds ``(N_m·sb + [train]·12·N_m)/(tp·pp)`` bytes. :func:`emus_of` is the EMU collection of
an rpeg plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..cluster import Cluster, mask_range
from ..graph import RPEG
from ..models import OPTIMIZER_BYTES_PER_PARAM
from ..plan import Plan, Strategy
from ..types import Role

__all__ = [
    "EMU",
    "OPTIMIZER_BYTES_PER_PARAM",
    "ModelStage",
    "Stage",
    "emus_of",
    "plan_vertices",
    "sub_layout",
]


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
        return _STAGE_OF_ROLE[Role(role)]

    def __str__(self) -> str:
        return self.value


_STAGE_ORDER = {Stage.GEN: 0, Stage.INF: 1, Stage.TRAIN: 2}
_STAGE_OF_ROLE = {Role.GENERATION: Stage.GEN, Role.INFERENCE: Stage.INF, Role.TRAINING: Stage.TRAIN}


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
    vp
        Model chunks per pipeline stage (Megatron-core's interleaved pipeline,
        :attr:`Strategy.vp <rpeg.ir.plan.Strategy.vp>`): stage ``p`` holds chunks
        ``p, p + pp, …`` of ``pp·vp``, so two units of one ``tp×pp`` hold other layers per GPU
        when their ``vp`` differ (:func:`sub_layout`). ``1`` (plain) when ``pp = 1``.

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
    vp: int = 1
    mask: int = field(init=False, compare=False, repr=False)
    bytes_per_gpu: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        tp, pp, pb, ob = self.tp, self.pp, self.param_bytes, self.optim_bytes
        for name, v in (("tp", tp), ("pp", pp), ("vp", self.vp)):
            if not _is_pos_int(v):
                raise ValueError(f"EMU {name} must be a positive integer, got {v!r}")
        if self.vp > 1 and pp == 1:
            raise ValueError(f"EMU vp={self.vp} needs pipeline stages to interleave (pp > 1), got pp=1")
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

    def key(self) -> tuple[ModelStage, int, int, frozenset[int], int]:
        """``(M, tp, pp, R as a set, vp)``: what a collection comparison looks at (rank order
        within a unit is a relabelling the runtime chooses)."""
        return (self.stage, self.tp, self.pp, frozenset(self.gpus), self.vp)

    def with_uid(self, uid: int) -> EMU:
        """A copy carrying ``uid``."""
        return _trusted(
            self.stage,
            self.tp,
            self.pp,
            self.gpus,
            self.param_bytes,
            self.optim_bytes,
            uid,
            self.mask,
            self.vp,
        )

    def sub_unit(self, tp: int, pp: int, gpus: Sequence[int], uid: int = -1, vp: int = 1) -> EMU:
        """A unit of the same model-stage and state with layout ``tp×pp`` (``vp`` chunks per
        stage) on ``gpus``."""
        if tp * pp != len(gpus):
            raise ValueError(f"EMU gpus must hold tp·pp = {tp * pp} GPUs, got {len(gpus)}: {list(gpus)}")
        return _trusted(
            self.stage, tp, pp, tuple(gpus), self.param_bytes, self.optim_bytes, uid, _mask(gpus), vp
        )

    def __str__(self) -> str:
        lo, hi = min(self.gpus), max(self.gpus)
        where = (
            f"GPU {lo}"
            if lo == hi
            else f"GPUs {lo}-{hi}"
            if hi - lo + 1 == self.size
            else f"GPUs {sorted(self.gpus)}"
        )
        vp = f" vp={self.vp}" if self.vp > 1 else ""
        return f"{self.stage} tp={self.tp} pp={self.pp}{vp} on {where}"


def sub_layout(a: EMU, b: EMU) -> tuple[int, int, int]:
    """``T_sub = (tp, pp, vp)``, the largest layout both ``a`` and ``b`` split into: each of its
    shards holds the shards of the ``a`` and ``b`` ranks on its GPUs.

    ``(gcd(tp_a, tp_b), gcd(pp_a, pp_b), vp)`` when both interleave alike (``vp_a = vp_b``:
    consecutive stages of either side hold the chunks of one coarser stage), and ``vp = 1`` once
    ``gcd(pp) = 1``; ``(gcd(tp_a, tp_b), 1, 1)`` when they interleave differently — a stage of
    one side holds layers of every stage of the other, so only the whole pipeline contains both
    (``docs/cost-model.md`` §12).
    """
    tp = math.gcd(a.tp, b.tp)
    if a.vp != b.vp:
        return tp, 1, 1
    pp = math.gcd(a.pp, b.pp)
    return tp, pp, a.vp if pp > 1 else 1


def _trusted(
    stage: ModelStage,
    tp: int,
    pp: int,
    gpus: tuple[int, ...],
    pb: float,
    ob: float,
    uid: int,
    mask: int,
    vp: int = 1,
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
    d["vp"] = vp
    d["mask"] = mask
    d["bytes_per_gpu"] = (pb + ob) / (tp * pp)
    return u


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
        allocation leaves the cluster or does not hold ``dp·pp·tp`` devices.
    """
    out: list[EMU] = []
    for ms, s, devices, pb, ob in plan_vertices(plan, cluster, graph=graph, workload=workload):
        tp, pp = s.tp, s.pp
        rep = tp * pp
        for j in range(s.dp * s.cp):  # context-parallel ranks hold whole replicas, as data-parallel ones
            gpus = tuple(devices[j * rep : (j + 1) * rep])
            # checked once per vertex: positive degrees, distinct ascending devices
            out.append(_trusted(ms, tp, pp, gpus, pb, ob, len(out), _sorted_mask(gpus), s.vp))
    return out


def replica_order(devices: Sequence[int], s: Strategy) -> tuple[int, ...]:
    """``devices`` (in rank order ``t + Pt·(c + Pc·(p + Pp·d))``, SPEC §15.3) regrouped so that
    each of the ``Pd·Pc`` weight replicas' ``Pp·Pt`` devices are consecutive: replica ``(d, c)``
    holds ``t + Pt·(c + Pc·(p + Pp·d))`` for its stages ``p`` and TP ranks ``t``. A
    context-parallel rank holds the same weights as a data-parallel one, so transitions treat
    both alike."""
    tp, cp, pp = s.tp, s.cp, s.pp
    return tuple(
        devices[t + tp * (c + cp * (p + pp * d))]
        for d in range(s.dp)
        for c in range(cp)
        for p in range(pp)
        for t in range(tp)
    )


def plan_vertices(
    plan: Plan,
    cluster: Cluster,
    *,
    graph: RPEG | None = None,
    workload: object | None = None,
) -> list[tuple[ModelStage, Strategy, Sequence[int], float, float]]:
    """Per vertex of ``plan``: its model-stage, strategy, devices in rank order (a ``range`` when
    they are contiguous, as every legal allocation's are; with context parallelism regrouped by
    weight replica, :func:`replica_order`), ``|θ|`` and ``|ω|`` — what :func:`emus_of` cuts into
    units, checked once per vertex.

    A mixture of experts' expert-parallel layout (``ep > 1``) is cut like any other: each unit
    is priced as holding its stage's every expert, an upper bound on the bytes a transition
    moves (``docs/decisions.md``, "Expert and context parallelism").

    Vertex ``i`` = ``v`` becomes ``ModelStage(µ(v), stage(r(v)), v, i)``; ``|θ| = N_m·sb`` (the
    weight container ``W_m``), ``|ω| = 12·N_m`` for a training vertex and 0 otherwise.

    Raises
    ------
    ValueError
        If neither or both of ``graph``/``workload`` is given, the plan has the wrong length, an
        allocation leaves the cluster or does not hold ``dp·pp·tp`` devices.
    """
    if (graph is None) == (workload is None):
        raise ValueError("emus_of needs exactly one of graph= or workload=")
    if graph is None:
        from ..templates import build_graph

        graph = build_graph(workload)  # type: ignore[arg-type]
    if len(plan) != len(graph.vertices):
        raise ValueError(f"plan has {len(plan)} choices but the graph has {len(graph.vertices)} vertices")
    out = []
    for i, (v, c) in enumerate(zip(graph.vertices, plan.choices)):
        s = c.strategy
        devices = mask_range(c.allocation.mask) or c.allocation.devices()
        if devices and devices[-1] >= cluster.num_devices:
            raise ValueError(
                f"plan: vertex {v.name!r} uses device {devices[-1]} outside cluster {cluster.shape_str}"
            )
        if len(devices) != s.size:
            raise ValueError(
                f"plan: vertex {v.name!r} has {len(devices)} devices but its strategy "
                f"{s.label()} needs {'dp·pp·tp·cp' if s.cp > 1 else 'dp·pp·tp'} = {s.size}"
            )
        if s.cp > 1:
            devices = replica_order(devices, s)
        w = graph.containers[RPEG.weights_container(v.model)]
        # a graph's vertex names and models are checked strings: the model-stage goes together
        # past its __post_init__ (this runs per vertex of every planned transition)
        ms = object.__new__(ModelStage)
        ms.__dict__.update(model=v.model, stage=_STAGE_OF_ROLE[v.role], vertex=v.name, index=i)
        optim = float(OPTIMIZER_BYTES_PER_PARAM * w.count) if v.role is Role.TRAINING else 0.0
        out.append((ms, s, devices, float(w.nbytes), optim))
    return out
