"""Time of the transition primitives and the transition cost ``L_tran`` (SPEC §10, Nereus §4.2, §6).

Every primitive costs its state movement over the α–β links of the cluster's
:class:`~rpeg.ir.hardware.Hardware` (the same figures as the step cost model, SPEC §6) plus, for
those that build new process groups, a communicator set-up constant ``c_setup``:

* **Split** ``U → k × T_sub``: ``c_setup + AllGather(k, M = (|θ|+|ω|)/|T_sub|)`` at the collective
  link of the tier spanned by the smallest enclosing group (the ``k`` source ranks that hold the
  parts of one new shard), ``AllGather(p, M) = (p−1)·α + ((p−1)/p)·M·β``;
* **Extend** ``U → U′``: ``c_setup + α + M·β`` with ``M = (|θ|+|ω|)/|T|`` at the point-to-point link
  of the tier spanned by ``R ∪ R′`` (all rank pairs send at once);
* **Merge** ``k × T_sub → T``: ``c_setup + (|θ|+|ω|)/|T| / BW_mem`` (a local copy of the slice each
  GPU keeps; the new unit's TP/PP groups need communicators);
* **Destroy**: ``c_teardown`` (local release, no collective).

A primitive that creates a *target* replica of a generation model-stage also starts that
replica's rollout engine when generation runs on one (vLLM: processes, model load, KV cache,
warm-up, then the weights pushed in): ``+ c_engine`` per such primitive (the parts of a Split
start their engines at once, on their own devices). Intermediate units (an Extend's copy that a
Merge then joins) serve no rollouts and start none. ``c_engine`` defaults to 0 (the torch engine
generates on the worker's own model); the runtime passes the engine start-up it measured
(:func:`rpeg.runtime.driver.runner.run`, ``rollout_engine="vllm"``); :func:`primitive_times` adds it.

``c_setup`` defaults to :data:`DEFAULT_SETUP_S` = 0.1 s and ``c_teardown`` to
:data:`DEFAULT_TEARDOWN_S` = 1 ms. Neither is a hardware-file figure: NCCL communicator creation
is dominated by the bootstrap (a TCP exchange of unique ids and a ring/tree search), typically
tens to hundreds of milliseconds, roughly independent of the GPU model; both are arguments.

Memory (Nereus §6, "safe concurrent execution"): a unit is resident on its GPUs from the start of
the primitive that creates it (time 0 for a current unit) to the end of the one that removes it
(for ever for a target unit), so sources, intermediate units and buffers are all counted while a
primitive runs. At every instant ``Σ_{u resident on g} (|θ_u|+|ω_u|)/|R_u| ≤ cap_g`` with
``cap_g = max(M_eff, usage_g(current), usage_g(target))`` (:func:`gpu_capacities`): the plans at
both ends were admitted by the planner's own memory model (SPEC §6, where optimizer state is
ZeRO-2-sharded and serving copies may be materialised on demand), which the EMU's unsharded state
can exceed; the transition may not need more than ``M_eff`` or than either end already holds.

``L_tran`` of a schedule is its length ``max_i E_i``; the critical path
``CP = max over DAG paths of Σ d_i`` (no resource limits) is a lower bound on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..ir.cluster import Cluster
from ..ir.emu import EMU, Destroy, Extend, Merge, Primitive, Split, Stage, TransitionDAG
from ..ir.emu.flat import EXTEND, MERGE, SPLIT, FlatDAG
from ..ir.errors import check_seconds, check_type
from ..ir.hardware import Hardware
from .collectives import allgather_time, p2p_time

__all__ = [
    "DEFAULT_SETUP_S",
    "DEFAULT_TEARDOWN_S",
    "GpuCapacities",
    "check_capacity",
    "creates_generation",
    "critical_path",
    "gpu_capacities",
    "peak_possible",
    "primitive_time",
    "primitive_times",
    "primitive_times_array",
]

#: Communicator set-up per primitive that builds process groups (seconds).
DEFAULT_SETUP_S = 0.1
#: Local teardown of a destroyed unit (seconds).
DEFAULT_TEARDOWN_S = 1e-3


def _mask(gpus: Sequence[int]) -> int:
    m = 0
    for g in gpus:
        m |= 1 << g
    return m


def primitive_time(
    prim: Primitive,
    cluster: Cluster,
    *,
    setup: float = DEFAULT_SETUP_S,
    teardown: float = DEFAULT_TEARDOWN_S,
) -> float:
    """Seconds one primitive takes, its engine start aside (module docstring).

    Parameters
    ----------
    prim
        A :class:`~rpeg.ir.emu.Split`, :class:`~rpeg.ir.emu.Merge`,
        :class:`~rpeg.ir.emu.Extend` or :class:`~rpeg.ir.emu.Destroy`.
    cluster
        Supplies the link tiers and the hardware's α–β figures and ``BW_mem``.
    setup
        ``c_setup`` in seconds (≥ 0).
    teardown
        ``c_teardown`` in seconds (≥ 0).

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    ValueError
        For a negative or non-finite ``setup``/``teardown`` (``TypeError`` for a non-number) or an
        unknown primitive.
    """
    check_seconds("setup", setup, allow_none=False, allow_zero=True)
    check_seconds("teardown", teardown, allow_none=False, allow_zero=True)
    hw = cluster.hardware
    if isinstance(prim, Split):
        return _split_time(hw, cluster.tier_of_mask(_mask(prim.group())), prim.group_size, prim.nbytes, setup)
    if isinstance(prim, Extend):
        return _extend_time(hw, cluster.tier_of_mask(prim.source.mask | prim.result.mask), prim.nbytes, setup)
    if isinstance(prim, Merge):
        return _merge_time(hw, prim.nbytes, setup)
    if isinstance(prim, Destroy):
        return teardown
    raise ValueError(f"unknown primitive {prim!r}")


# one formula per kind, shared by primitive_time and the table path of primitive_times
def _split_time(hw: Hardware, tier: int, k: int, nbytes: float, setup: float) -> float:
    return setup + allgather_time(k, nbytes, hw.collective[tier])


def _extend_time(hw: Hardware, tier: int, nbytes: float, setup: float) -> float:
    return setup + p2p_time(nbytes, hw.p2p[tier])


def _merge_time(hw: Hardware, nbytes: float, setup: float) -> float:
    return setup + nbytes / hw.mem_bandwidth


def primitive_times(
    dag: TransitionDAG,
    cluster: Cluster,
    *,
    setup: float = DEFAULT_SETUP_S,
    teardown: float = DEFAULT_TEARDOWN_S,
    engine_start: float = 0.0,
) -> list[float]:
    """:func:`primitive_time` of every primitive of ``dag``, in index order (cached per shape),
    plus ``engine_start`` (``c_engine``, ≥ 0) for each primitive that creates a target
    generation replica (:func:`creates_generation`).

    On a DAG with index tables (``dag.flat``) one time is computed per class (kind, model-stage,
    tier of the link group) with the same formulas and looked up for every primitive; the result
    is the same list.

    Raises
    ------
    ValueError
        For a negative or non-finite ``setup``/``teardown``/``engine_start`` (``TypeError`` for a
        non-number).
    """
    check_seconds("engine_start", engine_start, allow_none=False, allow_zero=True)
    if dag.flat is not None:
        return _flat_times(dag.flat, cluster, setup, teardown, engine_start).tolist()
    targets = set(dag.target) if engine_start > 0 else set()
    cache: dict[tuple, float] = {}
    out = []
    for p in dag.primitives:
        if isinstance(p, Extend):  # the most common primitive first
            key: tuple = ("e", p.nbytes, cluster.tier_of_mask(p.source.mask | p.result.mask))
        elif isinstance(p, Split):
            key = (
                "s",
                p.source.layout,
                p.parts[0].layout,
                p.nbytes,
                cluster.tier_of_mask(_mask(p.group())),
            )
        elif isinstance(p, Merge):
            key = ("m", p.nbytes)
        else:
            key = ("d",)
        t = cache.get(key)
        if t is None:
            t = cache[key] = primitive_time(p, cluster, setup=setup, teardown=teardown)
        out.append(t + engine_start if targets and creates_generation(p, targets) else t)
    return out


def primitive_times_array(
    dag: TransitionDAG,
    cluster: Cluster,
    *,
    setup: float = DEFAULT_SETUP_S,
    teardown: float = DEFAULT_TEARDOWN_S,
    engine_start: float = 0.0,
) -> np.ndarray:
    """:func:`primitive_times` as a float64 array, which the compiled cores read as it is (on a
    DAG with index tables it is computed as one; same values, same errors)."""
    if dag.flat is not None:
        check_seconds("engine_start", engine_start, allow_none=False, allow_zero=True)
        return _flat_times(dag.flat, cluster, setup, teardown, engine_start)
    return np.asarray(
        primitive_times(dag, cluster, setup=setup, teardown=teardown, engine_start=engine_start), np.float64
    )


def _flat_times(
    flat: FlatDAG, cluster: Cluster, setup: float, teardown: float, engine_start: float
) -> np.ndarray:
    """:func:`primitive_times` on the index tables: the time of a primitive depends only on its
    kind, its model-stage (layouts and bytes) and the tier of its link group, so one time per
    such class is computed with the same formulas and looked up for every primitive."""
    check_seconds("setup", setup, allow_none=False, allow_zero=True)
    check_seconds("teardown", teardown, allow_none=False, allow_zero=True)
    hw = cluster.hardware
    n_stages = len(flat.stages)
    # classes carry the tier as Cluster.tier_of_mask numbers it (node 0, rack 1, cluster 2)
    code, example = flat.link_classes(cluster.gpus_per_node, cluster.nodes_per_rack)
    table = np.zeros(len(example))
    for c in np.flatnonzero(example >= 0).tolist():
        i = int(example[c])
        k, t = divmod(c, 3)
        k //= n_stages
        x = int(flat.p_in[flat.p_iptr[i]])
        if k == SPLIT:
            y = int(flat.p_out[flat.p_optr[i]])
            group = int(flat.u_tp[x] * flat.u_pp[x]) // int(flat.u_tp[y] * flat.u_pp[y])
            table[c] = _split_time(hw, t, group, float(flat.u_bpg[y]), setup)
        elif k == EXTEND:
            table[c] = _extend_time(hw, t, float(flat.u_bpg[x]), setup)
        elif k == MERGE:
            table[c] = _merge_time(hw, float(flat.u_bpg[int(flat.p_out[flat.p_optr[i]])]), setup)
        else:
            table[c] = teardown
    out = table[code]
    if engine_start > 0:
        final = np.zeros(flat.n_units, bool)
        final[flat.final] = True
        owner = np.repeat(np.arange(flat.n_prims), np.diff(flat.p_optr))
        creates = np.zeros(flat.n_prims, bool)
        creates[owner[final[flat.p_out]]] = True
        creates &= flat.generation_stages()[flat.p_stage]
        out[creates] += engine_start
    return out


def creates_generation(prim: Primitive, targets: set[EMU] | frozenset[EMU]) -> bool:
    """Whether ``prim`` creates a unit of ``targets`` (the transition's target collection) of a
    generation model-stage: a replica that will serve rollouts, so it starts a rollout engine."""
    return not isinstance(prim, Destroy) and any(
        u.stage.stage is Stage.GEN and u in targets for u in prim.outputs
    )


class GpuCapacities(Mapping[int, float]):
    """A read-only map GPU id → ``cap_g`` held as two arrays, GPU ids ascending and their bounds.

    The compiled scheduler reads the arrays (:attr:`gpus`, :attr:`caps`); the mapping interface
    (a ``dict`` made on first use) serves everyone else. It equals a ``dict`` of the same items.
    """

    __slots__ = ("_dict", "caps", "gpus")

    def __init__(self, gpus: np.ndarray, caps: np.ndarray) -> None:
        self.gpus = np.asarray(gpus, dtype=np.int64)
        self.caps = np.asarray(caps, dtype=np.float64)
        if self.gpus.shape != self.caps.shape:
            raise ValueError(f"GpuCapacities: {self.gpus.shape[0]} GPUs but {self.caps.shape[0]} bounds")
        self.gpus.flags.writeable = False
        self.caps.flags.writeable = False
        self._dict: dict[int, float] | None = None

    def _map(self) -> dict[int, float]:
        if self._dict is None:
            self._dict = dict(zip(self.gpus.tolist(), self.caps.tolist()))
        return self._dict

    def __getitem__(self, gpu: int) -> float:
        return self._map()[gpu]

    def __iter__(self) -> Iterator[int]:
        return iter(self._map())

    def __len__(self) -> int:
        return self.gpus.shape[0]

    def __repr__(self) -> str:
        return f"GpuCapacities({self._map()!r})"


def check_capacity(name: str, value: object) -> None:
    """Check a per-GPU transition memory bound: ``None`` (``M_eff``) or a positive number of bytes,
    ``inf`` meaning no bound (as the adaptation benchmark and tests use it).

    Raises
    ------
    TypeError
        If ``value`` is not a number (``bool`` is not).
    ValueError
        If it is not positive (NaN included), naming ``name`` and the value.
    """
    if value is None:
        return
    check_type(name, value, (int, float), "a positive number of bytes")
    if not value > 0:
        raise ValueError(f"{name} must be a positive number of bytes (inf: no bound), got {value!r}")


def gpu_capacities(dag: TransitionDAG, cluster: Cluster, capacity: float | None = None) -> GpuCapacities:
    """Per-GPU memory bound ``cap_g = max(C, usage_g(current), usage_g(target))`` (module
    docstring) for every GPU any unit touches, in GPU order; ``C = capacity`` or ``M_eff`` of the
    cluster. On a DAG with index tables the usages are the per-GPU sums its builder took in
    collection order.

    Raises
    ------
    TypeError, ValueError
        For a ``capacity`` that is not a positive number of bytes (:func:`check_capacity`).
    """
    check_capacity("capacity", capacity)
    base = cluster.hardware.m_eff if capacity is None else float(capacity)
    if dag.flat is not None:
        flat = dag.flat
        gpus = np.flatnonzero(flat.held)
        return GpuCapacities(gpus, np.maximum(np.maximum(base, flat.cur_bytes[gpus]), flat.tgt_bytes[gpus]))
    cur = _per_gpu_bytes(dag.current)
    tgt = _per_gpu_bytes(dag.target)
    # every unit lives on GPUs of the current collection (Split/Merge outputs) or the target (Extend)
    gpus = sorted(cur.keys() | tgt.keys())
    return GpuCapacities(
        np.array(gpus, np.int64), np.array([max(base, cur.get(g, 0.0), tgt.get(g, 0.0)) for g in gpus])
    )


def peak_possible(dag: TransitionDAG) -> dict[int, float]:
    """Per GPU, the bytes of every unit that is ever resident on it: if this is within
    ``cap_g`` the memory constraint of ``g`` cannot bind and every engine skips it."""
    return _per_gpu_bytes(dag.units.values())


def _per_gpu_bytes(units: Iterable[EMU]) -> dict[int, float]:
    """``Σ_{u ∋ g} |u|/|R_u|`` per GPU, GPUs in order of first appearance, each sum taken in the
    order of ``units`` (so that every caller gets bit-identical figures)."""
    out: dict[int, float] = {}
    for u in units:
        b = u.bytes_per_gpu
        for g in u.gpus:
            out[g] = out.get(g, 0.0) + b
    return out


def critical_path(dag: TransitionDAG, durations: Sequence[float]) -> float:
    """Longest path of the DAG with ``durations``: ``CP = max_i (EF_i)``,
    ``EF_i = d_i + max_{(j,i)} EF_j`` (0 for an empty DAG); on the index tables when the DAG
    has them (:meth:`~rpeg.ir.emu.flat.FlatDAG.critical_path`)."""
    if len(durations) != len(dag):
        raise ValueError(f"durations has {len(durations)} entries for {len(dag)} primitives")
    if dag.flat is not None:
        return dag.flat.critical_path(np.asarray(durations, dtype=np.float64))
    ef = [0.0] * len(durations)
    for i in dag.topological_order:
        ef[i] = durations[i] + max((ef[j] for j in dag.predecessors[i]), default=0.0)
    return max(ef, default=0.0)
