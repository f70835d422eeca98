"""The transition DAG as flat arrays, built by a numba core, its objects made on demand.

:func:`flat_dag` runs the same steps as the reference builder (:mod:`.dag`, module docstring) on
index tables: every unit that ever exists is a row (its ``uid``), its GPUs a slice of one array
in rank order; every primitive a row with its kind, model-stage, input and output ``uid`` s. The
schedulers and the cost model read these tables (:mod:`rpeg.costmodel.transition`,
:mod:`rpeg.heuristics.transition`); the :class:`~rpeg.ir.emu.EMU` and
:class:`~rpeg.ir.emu.Primitive` objects, the edge tuples and the plan diff of a
:class:`~rpeg.ir.emu.TransitionDAG` are made from them on first access (:meth:`FlatDAG.objects`),
equal to what the reference builder makes (``tests/ir/emu/test_flat.py`` checks it on random
transitions).

numba compiles the core once per installation (about 20 s) and caches the machine code on disk;
later processes load it in a fraction of a second. :func:`warm_up` does either in a background
thread, started by the first :func:`~rpeg.ir.emu.transition_dag` of a process; until it is done
(:func:`ready`) :func:`~rpeg.ir.emu.transition_dag` builds with the reference (an equal DAG,
without tables), so a transition planned during a running job never waits for the compiler. Nor
does a process that ends first: a compile still running at exit is finished by a detached process
(:class:`~rpeg.ir.warmup.WarmUp`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, groupby
from operator import attrgetter

import numpy as np

from ..cluster import Cluster
from ..graph import RPEG
from ..plan import Plan
from ..warmup import WarmUp
from .primitives import Destroy, Extend, Merge, Primitive, Split
from .units import EMU, ModelStage, Stage, _mask, _trusted, emus_of, plan_vertices, sub_layout

__all__ = [
    "DESTROY",
    "EXTEND",
    "MERGE",
    "SPLIT",
    "FlatDAG",
    "flat_dag",
    "flat_dag_of_plans",
    "ready",
    "warm_up",
    "warm_up_pair",
]

#: Primitive kinds in :attr:`FlatDAG.p_kind`.
SPLIT, MERGE, EXTEND, DESTROY = 0, 1, 2, 3
# unit origins in FlatDAG.u_origin (as in _build_kernel)
_CURRENT, _PART, _COPY, _MERGED = 0, 1, 2, 3

_stage_of = attrgetter("stage")
_gpus_of = attrgetter("gpus")
_tp = attrgetter("tp")
_pp = attrgetter("pp")
_vp = attrgetter("vp")
_pb = attrgetter("param_bytes")
_ob = attrgetter("optim_bytes")


@dataclass(frozen=True, eq=False)
class FlatDAG:
    """A transition DAG as index tables (module docstring).

    Attributes
    ----------
    source
        The current units, then the target units, as given; or a function that makes them (a DAG
        built from two plans makes its units only when :attr:`inputs` is read).
    n_current
        How many of ``inputs`` are current.
    stages
        The model-stages in diff order (Gen → Inf → Train); ``u_stage``/``p_stage`` index it.
    u_origin, u_src
        Per unit: 0 a current unit (``u_src`` its row in ``inputs``), 1 a Split part (``u_src``
        the split unit), 2 an Extend copy (``u_src`` its source), 3 a Merge result (``u_src`` the
        target unit's row in ``inputs``). Current units are ``uid`` 0, 1, … in diff order.
    u_stage, u_tp, u_pp, u_bpg
        Per unit: model-stage, layout and bytes per GPU ``(|θ|+|ω|)/(tp·pp)``.
    u_ptr, u_gpus
        GPUs of unit ``u`` in rank order: ``u_gpus[u_ptr[u]:u_ptr[u+1]]``.
    p_kind, p_stage
        Per primitive: :data:`SPLIT`, :data:`MERGE`, :data:`EXTEND` or :data:`DESTROY`, and its
        model-stage.
    p_iptr, p_in, p_optr, p_out
        ``uid`` s of its inputs and outputs (CSR); it consumes its inputs unless it is an Extend.
    p_lo, p_hi
        Lowest and highest GPU of the group whose link it uses: a Split's smallest enclosing
        group, an Extend's ``R ∪ R′`` (0 for Merge and Destroy).
    edge_src, edge_dst, res_src, res_dst
        State and resource edges, each sorted.
    final
        ``uid`` s of the target collection, in the builder's order.
    target_rows
        Rows of ``inputs`` of the target units, per model-stage sorted by lowest GPU.
    cur_bytes, tgt_bytes, held
        Per GPU id: ``Σ_{u ∋ g} |u|/|R_u|`` over the current and over the target collection,
        each summed in collection order, and whether any unit of either is on it.
    input_stage
        Model-stage of each row of ``inputs``.
    """

    source: list[EMU] | Callable[[], list[EMU]]
    n_current: int
    stages: tuple[ModelStage, ...]
    u_origin: np.ndarray
    u_src: np.ndarray
    u_stage: np.ndarray
    u_tp: np.ndarray
    u_pp: np.ndarray
    u_bpg: np.ndarray
    u_ptr: np.ndarray
    u_gpus: np.ndarray
    p_kind: np.ndarray
    p_stage: np.ndarray
    p_iptr: np.ndarray
    p_in: np.ndarray
    p_optr: np.ndarray
    p_out: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    res_src: np.ndarray
    res_dst: np.ndarray
    final: np.ndarray
    target_rows: np.ndarray
    p_lo: np.ndarray
    p_hi: np.ndarray
    cur_bytes: np.ndarray
    tgt_bytes: np.ndarray
    held: np.ndarray
    input_stage: np.ndarray

    @cached_property
    def inputs(self) -> list[EMU]:
        """The current units, then the target units (:attr:`source`, made on first access)."""
        return self.source() if callable(self.source) else self.source

    @property
    def n_prims(self) -> int:
        """Number of primitives."""
        return self.p_kind.shape[0]

    @property
    def n_units(self) -> int:
        """Number of units that exist at some point."""
        return self.u_origin.shape[0]

    @property
    def n_gpus(self) -> int:
        """One more than the highest GPU id of any unit (the length of the per-GPU tables)."""
        return self.held.shape[0]

    @cached_property
    def stage_class(self) -> tuple[np.ndarray, int]:
        """Per model-stage its rank among the distinct :attr:`~rpeg.ir.emu.ModelStage.sort_key`
        s, and how many there are: a primitive's class in the greedy list order is its
        model-stage's rank, plus that count unless it is a Destroy (Destroys first)."""
        keys = [ms.sort_key for ms in self.stages]
        key_rank = {k: r for r, k in enumerate(sorted(set(keys)))}
        return np.array([key_rank[k] for k in keys], np.int64), len(key_rank)

    def critical_path(self, durations: np.ndarray) -> float:
        """``CP = max_i EF_i``, ``EF_i = d_i + max_{(j,i)} EF_j`` over state and resource edges."""
        from . import _build_kernel as kernel

        return float(
            kernel.longest_path(
                self.n_prims, self.edge_src, self.edge_dst, self.res_src, self.res_dst, durations
            )
        )

    def link_classes(self, gpus_per_node: int, nodes_per_rack: int) -> tuple[np.ndarray, np.ndarray]:
        """Per primitive its class ``(kind·S + model-stage)·3 + tier`` (``S`` model-stages; the
        tier of the GPUs ``p_lo..p_hi`` its link group spans: 0 one node, 1 one rack, 2 more) and,
        per class, one of its primitives (−1 for an empty class)."""
        from . import _build_kernel as kernel

        return kernel.link_classes(
            self.p_kind, self.p_stage, self.p_lo, self.p_hi, len(self.stages), gpus_per_node, nodes_per_rack
        )

    def generation_stages(self) -> np.ndarray:
        """Per model-stage, whether it is a generation stage."""
        return np.array([ms.stage is Stage.GEN for ms in self.stages], dtype=bool)

    def objects(self) -> dict[str, object]:
        """The fields of the equal :class:`~rpeg.ir.emu.TransitionDAG`: ``primitives``, ``edges``,
        ``resource_edges``, ``current``, ``target`` and ``diffs`` (a dict of model-stage →
        ``(current, target)`` unit tuples, which the DAG wraps as ``StageDiff`` s)."""
        units = self._units()
        n_cur = self.n_current
        kind, ip, ii, op, oo = (
            a.tolist() for a in (self.p_kind, self.p_iptr, self.p_in, self.p_optr, self.p_out)
        )
        prims: list[Primitive] = []
        for i, k in enumerate(kind):
            if k == EXTEND:
                prims.append(_trusted_primitive(Extend, source=units[ii[ip[i]]], result=units[oo[op[i]]]))
            elif k == DESTROY:
                prims.append(_trusted_primitive(Destroy, unit=units[ii[ip[i]]]))
            elif k == SPLIT:
                parts = tuple(units[u] for u in oo[op[i] : op[i + 1]])
                prims.append(_trusted_primitive(Split, source=units[ii[ip[i]]], parts=parts))
            else:
                parts = tuple(units[u] for u in ii[ip[i] : ip[i + 1]])
                prims.append(_trusted_primitive(Merge, parts=parts, result=units[oo[op[i]]]))
        inputs = self.inputs
        diffs: dict[ModelStage, tuple[tuple[EMU, ...], tuple[EMU, ...]]] = {}
        cur_rows = self.u_src[:n_cur].tolist()
        stage_of_row = self.u_stage[:n_cur].tolist()
        tgt_rows = self.target_rows.tolist()
        tgt_stage = self.input_stage[self.target_rows].tolist()
        for s, ms in enumerate(self.stages):
            diffs[ms] = (
                tuple(inputs[r] for r, q in zip(cur_rows, stage_of_row) if q == s),
                tuple(inputs[r] for r, q in zip(tgt_rows, tgt_stage) if q == s),
            )
        return {
            "primitives": tuple(prims),
            "edges": tuple(zip(self.edge_src.tolist(), self.edge_dst.tolist())),
            "resource_edges": tuple(zip(self.res_src.tolist(), self.res_dst.tolist())),
            "current": tuple(units[:n_cur]),
            "target": tuple(units[u] for u in self.final.tolist()),
            "diffs": diffs,
        }

    def _units(self) -> list[EMU]:
        """Every unit by ``uid``, as the reference builder makes it."""
        inputs = self.inputs
        out: list[EMU] = []
        origin, src, tp, pp = (a.tolist() for a in (self.u_origin, self.u_src, self.u_tp, self.u_pp))
        ptr, gpus = self.u_ptr.tolist(), self.u_gpus.tolist()
        for uid, o in enumerate(origin):
            if o == _CURRENT:
                u = inputs[src[uid]]
                out.append(u if u.uid == uid else u.with_uid(uid))
            elif o == _MERGED:
                out.append(inputs[src[uid]].with_uid(uid))
            else:
                # a part takes its GPUs in the split unit's rank order, a copy its block sorted; a
                # T_sub unit interleaves as its source while it keeps several stages (sub_layout)
                s = out[src[uid]]
                g = tuple(gpus[ptr[uid] : ptr[uid + 1]])
                vp = s.vp if pp[uid] > 1 else 1
                out.append(
                    _trusted(s.stage, tp[uid], pp[uid], g, s.param_bytes, s.optim_bytes, uid, _mask(g), vp)
                )
        return out


def _runs(units: Sequence[EMU], row: int, side: bool) -> list[tuple[ModelStage, int, int, bool]]:
    """Maximal runs of consecutive units of one model-stage, ``(model-stage, first row, end row,
    side)``, rows counted from ``row``. :func:`itertools.groupby` compares neighbours with
    ``==``, an identity test in C for the model-stage object a plan's units share."""
    out = []
    for ms, g in groupby(map(_stage_of, units)):
        k = len(list(g))
        out.append((ms, row, row + k, side))
        row += k
    return out


def _trusted_primitive(cls: type[Primitive], **fields: object) -> Primitive:
    """A primitive whose parts are consistent by construction, past ``__post_init__``."""
    p = object.__new__(cls)
    p.__dict__.update(fields)
    return p


def flat_dag(current: Sequence[EMU], target: Sequence[EMU]) -> FlatDAG | None:
    """The transition DAG of ``current → target`` as tables (module docstring), or ``None`` when
    the collections do not pair up or the DAG is infeasible: the reference builder then raises
    the error with its message.

    The inputs are read with one C-level ``map``/``attrgetter`` pass per field (model-stage,
    ``tp``, ``pp``, ``|θ|``, ``|ω|``, GPUs); the checks of :func:`~rpeg.ir.emu.plan_diff` run per
    run of consecutive units of one model-stage (:func:`_runs`), then per model-stage, and the
    disjointness test in the compiled :func:`validate`. Model-stages are numbered in diff order
    (sorted by :attr:`ModelStage.sort_key`, ties in order of first appearance among the current
    units), as :func:`~rpeg.ir.emu.plan_diff` orders them.
    """
    from . import _build_kernel as kernel

    units = [*current, *target]
    n_cur = len(current)
    n = len(units)
    if not n_cur or n == n_cur:
        return None
    runs = _runs(current, 0, False) + _runs(target, n_cur, True)  # (model-stage, rows a:b, side)
    stage_objs = [ms for ms, _, _, _ in runs]
    lens = [b - a for _, a, b, _ in runs]
    layouts = [list(map(get, units)) for get in (_tp, _pp, _pb, _ob, _vp)]
    # per run one layout and state size (compared in C), then per model-stage and side
    for values in layouts:
        for _, a, b, _ in runs:
            if values[a:b].count(values[a]) != b - a:
                return None
    tp_l, pp_l, pb_l, ob_l, vp_l = layouts
    number: dict[ModelStage, int] = {}  # model-stage → first-appearance number
    first_of: dict[tuple[int, bool], int] = {}  # (model-stage, side) → a row
    for ms, a, _, side in runs:
        k = number.setdefault(ms, len(number))
        r = first_of.setdefault((k, side), a)
        if (tp_l[r], pp_l[r], pb_l[r], ob_l[r], vp_l[r]) != (tp_l[a], pp_l[a], pb_l[a], ob_l[a], vp_l[a]):
            return None
    by_number = list(number)
    if any((k, side) not in first_of for k in range(len(by_number)) for side in (False, True)):
        return None  # a model-stage on one side only
    order = sorted(range(len(by_number)), key=lambda k: by_number[k].sort_key)  # ties: first seen
    stages = tuple(by_number[k] for k in order)
    cur_row = [first_of[k, False] for k in order]
    tgt_row = [first_of[k, True] for k in order]
    if any(pb_l[a] + ob_l[a] != pb_l[b] + ob_l[b] for a, b in zip(cur_row, tgt_row)):
        return None  # a model-stage changes its state size
    rank = {k: r for r, k in enumerate(order)}
    stage = np.repeat(np.array([rank[number[ms]] for ms in stage_objs], np.int64), lens)
    starts = [a for _, a, _, _ in runs]
    tp = np.repeat(np.array([tp_l[a] for a in starts], np.int64), lens)
    pp = np.repeat(np.array([pp_l[a] for a in starts], np.int64), lens)
    vp = np.repeat(np.array([vp_l[a] for a in starts], np.int64), lens)
    # bytes per GPU exactly as EMU computes them, (|θ| + |ω|)/(tp·pp); a T_sub unit of
    # model-stage s holds (|θ| + |ω|)/|T_sub| (sub_layout)
    bpg = np.repeat(np.array([(pb_l[a] + ob_l[a]) / (tp_l[a] * pp_l[a]) for a in starts]), lens)
    sub_bpg = np.array(
        [
            (pb_l[a] + ob_l[a]) / math.prod(sub_layout(units[a], units[b])[:2])
            for a, b in zip(cur_row, tgt_row)
        ]
    )
    gptr = np.zeros(n + 1, np.int64)
    np.cumsum(tp * pp, out=gptr[1:])
    gpus = np.fromiter(chain.from_iterable(map(_gpus_of, units)), np.int64, int(gptr[-1]))
    if kernel.validate(len(stages), n_cur, stage, gptr, gpus):
        return None  # units of one model-stage and side share a GPU
    status, t = kernel.build(len(stages), n_cur, stage, tp, pp, bpg, gptr, gpus, sub_bpg, vp)
    if status:
        return None
    return FlatDAG(units, n_cur, stages, *t, stage)


def flat_dag_of_plans(
    current: Plan,
    target: Plan,
    cluster: Cluster,
    *,
    graph: RPEG,
) -> FlatDAG | None:
    """:func:`flat_dag` of ``emus_of(current)`` and ``emus_of(target)``, read per vertex instead
    of per unit.

    A plan's units are its vertices' replicas in vertex order (:func:`~rpeg.ir.emu.emus_of`), so
    every per-unit table :func:`flat_dag` reads is a vertex's value repeated ``dp`` times, and a
    unit's GPUs are the next ``tp·pp`` devices of its vertex's allocation. Each vertex is its own
    model-stage; the checks :func:`flat_dag` makes on arbitrary collections hold by construction
    (one layout and state size per vertex and plan, disjoint replicas). The units themselves
    (:attr:`FlatDAG.inputs`) are made by :func:`~rpeg.ir.emu.emus_of` only when read. Returns
    ``None`` when the DAG is infeasible (the reference builder then raises the error).

    Raises
    ------
    ValueError
        As :func:`~rpeg.ir.emu.emus_of`: a plan whose length is not the graph's, an allocation
        outside the cluster or of the wrong size.
    """
    from . import _build_kernel as kernel

    sides = [plan_vertices(p, cluster, graph=graph) for p in (current, target)]
    stages = [ms for ms, *_ in sides[0]]
    nv = len(stages)
    order = sorted(range(nv), key=lambda k: stages[k].sort_key)
    rank = [0] * nv
    for r, k in enumerate(order):
        rank[k] = r
    rows = [row for side in sides for row in side]  # current vertices, then target vertices
    status, t, stage, n_cur = kernel.build_from_vertices(
        nv,
        np.array(rank + rank, np.int64),
        np.array([s.dp * s.cp for _, s, *_ in rows], np.int64),  # weight replicas
        np.array([s.tp for _, s, *_ in rows], np.int64),
        np.array([s.pp for _, s, *_ in rows], np.int64),
        np.array([s.vp for _, s, *_ in rows], np.int64),
        np.array([pb + ob for _, _, _, pb, ob in rows]),  # |θ| + |ω|
        np.concatenate(
            [
                np.arange(d.start, d.stop, dtype=np.int64)
                if isinstance(d, range)
                else np.asarray(d, np.int64)
                for _, _, d, _, _ in rows
            ]
        ),
    )
    if status:
        return None

    def units() -> list[EMU]:
        return [*emus_of(current, cluster, graph=graph), *emus_of(target, cluster, graph=graph)]

    return FlatDAG(units, n_cur, tuple(stages[k] for k in order), *t, stage)


# ---------------------------------------------------------------------------- warm-up
def warm_up_pair() -> tuple[list[EMU], list[EMU]]:
    """Two TP-2 replicas on GPUs 0–3 grown into two TP-4 replicas on GPUs 0–7 (two Extends, two
    Merges): the tiny transition the warm-ups compile the kernels on."""
    ms = ModelStage("actor", Stage.GEN, "actor_gen", 0)
    cur = [EMU(ms, 2, 1, (0, 1), 8e9), EMU(ms, 2, 1, (2, 3), 8e9)]
    tgt = [EMU(ms, 4, 1, (0, 1, 2, 3), 8e9), EMU(ms, 4, 1, (4, 5, 6, 7), 8e9)]
    return cur, tgt


def _compile() -> bool:
    """:func:`flat_dag`, the per-vertex core of :func:`flat_dag_of_plans`,
    :meth:`FlatDAG.critical_path` and :meth:`FlatDAG.link_classes` on :func:`warm_up_pair`: the
    real entry points, or the arrays they pass, so the compiled specialisations (argument types
    and array layouts) are the ones real calls use."""
    from . import _build_kernel as kernel

    flat = flat_dag(*warm_up_pair())
    if flat is None:
        raise RuntimeError("the warm-up transition did not build")
    # the same pair given per vertex, as flat_dag_of_plans passes it
    i64 = np.int64
    one = kernel.build_from_vertices(
        1, np.zeros(2, i64), np.array([2, 2], i64), np.array([2, 4], i64), np.ones(2, i64),
        np.ones(2, i64), np.array([8e9, 8e9]), np.concatenate((np.arange(4), np.arange(8))),
    )  # fmt: skip
    if one[0] or one[3] != 2:
        raise RuntimeError("the warm-up transition did not build from its vertices")
    flat.critical_path(np.ones(flat.n_prims))
    flat.link_classes(8, 16)
    return True


_WARM_UP = WarmUp(
    "rpeg-compile-transition-dag",
    _compile,
    "the compiled transition-DAG builder",
    "transition DAGs are built by the pure-Python reference (same DAGs, slower)",
)


def ready() -> bool:
    """Whether the builder's compiled kernels are loaded in this process (:func:`warm_up` has
    finished)."""
    return _WARM_UP.ready()


def warm_up(wait: bool = False) -> bool:
    """Load or compile the builder's kernels in a background thread, once per process
    (:class:`~rpeg.ir.warmup.WarmUp`).

    Parameters
    ----------
    wait
        Block until the thread has finished.

    Returns
    -------
    bool
        :func:`ready`. ``False`` after waiting means the kernels could not be compiled (a
        warning says why); :func:`~rpeg.ir.emu.transition_dag` then keeps the reference.
    """
    return _WARM_UP.start(wait)
