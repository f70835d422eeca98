"""Executing a transition between two running plans with real state (SPEC §10, Nereus §5).

At a safe boundary — every node of the current plan finished (the end of an RL step; an
asynchronous plan drains its pipeline) — the job moves from the current plan's worker groups to
the target plan's, which the caller has already started on the same devices:

1. **weight synchronisation**: every serving group of a trained model installs its training
   group's current weights, so every model-stage of one model holds the same version;
2. **export**: every current worker hands its state to the transition as EMU cells (one per
   unit and rank, :mod:`~rpeg.runtime.worker.state`); training workers first all-gather their ZeRO
   slices of the Adam moments over their DP group (an EMU carries a full optimizer copy);
3. **primitives**: the transition DAG's Split / Merge / Extend / Destroy run in dependency
   order, each on the workers that hold its units — a target cell receives exactly the slices of
   the source cells it keeps (gloo point-to-point in a process group spanning both plans'
   workers), a Destroy drops cells. A primitive starts once its DAG predecessors have ended;
   independent primitives run concurrently;
4. **hand-over**: each target worker assembles its cell of the final unit of each vertex it
   serves (a local move when the final unit already lives in it, a copy from the current
   plan's worker on the same device otherwise) and loads parameters, its ZeRO slice of the
   moments and the update counter.

*Where a unit lives.* A cell of unit ``U`` on device ``g`` is held by the current plan's worker
of ``U``'s vertex on ``g`` if ``U`` is a current unit or the target plan has no worker of that
vertex on ``g``, and by the target plan's worker otherwise — each intermediate unit lies on
devices one of the two plans gives its vertex (the DAG only creates units on source or target
devices).

*What carries over.* Parameters, Adam moments and counter (inside the cells); the data position
and every sampling draw (the global step offset: prompts and Gumbel noise are functions of the
seed, the global step and the sample id, not of the layout); the global batch (both plans belong
to one workload; :func:`check_compatible`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ...ir.emu import EMU, Destroy, Extend, Merge, Split
from ...ir.types import Role
from ..cells import cell_names, cell_pieces, piece_shapes
from .group import call_worker

__all__ = ["TransitionRecord", "check_compatible", "execute_transition", "physical_units"]


@dataclass
class TransitionRecord:
    """What an executed transition measured.

    Attributes
    ----------
    step
        Global step boundary (the target plan runs from this step on).
    method, predicted_s, bound_s
        The schedule's method, its length ``L_tran`` and lower bound under the cost model.
    primitives
        One entry per executed primitive: ``kind``, ``label``, ``start``/``end`` (seconds from
        the transition's start), ``bytes`` sent over the transition group, ``predicted_s``.
    sync_s, join_s, export_s, primitives_s, handover_s, total_s
        Seconds of each phase — weight synchronisation, forming the transition process group,
        export, the primitives, hand-over — and of the whole transition.
    handover_bytes
        Bytes copied between the two plans' workers in the hand-over.
    engine_start_predicted_s, engine_start_s
        With vLLM rollouts: the engine start-up the transition plan charged each new generation
        replica (``c_engine``, measured on the current plan's engines), and the longest start-up
        of the target's engines, measured. The target's engines start with its workers, before
        the primitives run, so :attr:`total_s` does not include it. 0 without engines.
    """

    step: int
    method: str
    predicted_s: float
    bound_s: float
    primitives: list[dict[str, Any]] = field(default_factory=list)
    sync_s: float = 0.0
    join_s: float = 0.0
    export_s: float = 0.0
    primitives_s: float = 0.0
    handover_s: float = 0.0
    total_s: float = 0.0
    handover_bytes: int = 0
    engine_start_predicted_s: float = 0.0
    engine_start_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)

    def per_kind(self) -> dict[str, dict[str, float]]:
        """Count, mean measured seconds and bytes per primitive kind."""
        out: dict[str, dict[str, float]] = {}
        for p in self.primitives:
            d = out.setdefault(p["kind"], {"count": 0, "seconds": 0.0, "bytes": 0, "predicted_s": 0.0})
            d["count"] += 1
            d["seconds"] += p["end"] - p["start"]
            d["bytes"] += p["bytes"]
            d["predicted_s"] += p["predicted_s"]
        for d in out.values():
            d["mean_s"] = d["seconds"] / d["count"]
        return out


def check_compatible(current: Any, target: Any) -> None:
    """Refuse a transition between results of different jobs (the state would not fit).

    Raises
    ------
    ValueError
        Naming the field that differs: algorithm, global batch, models, invocations (graph
        vertices and their models) or cluster.
    """
    a, b = current.workload, target.workload
    for name in ("algorithm", "batch"):
        if getattr(a, name) != getattr(b, name):
            raise ValueError(
                f"transition target: workload {name} {getattr(b, name)!r} differs from the running "
                f"job's {getattr(a, name)!r} (a transition keeps the job, global batch included)"
            )
    if dict(a.models) != dict(b.models):
        raise ValueError(
            f"transition target: models {sorted(b.models)} differ from the running job's {sorted(a.models)}"
        )
    va = [(v.name, v.model) for v in current.graph.vertices]
    vb = [(v.name, v.model) for v in target.graph.vertices]
    if va != vb:
        raise ValueError(
            f"transition target: its graph's invocations {vb} differ from the running job's {va} "
            "(e.g. actor-critic sharing changed); a transition keeps the models and invocations"
        )
    if current.cluster.num_devices != target.cluster.num_devices:
        raise ValueError(
            f"transition target: cluster {target.cluster.shape_str} differs from the running "
            f"{current.cluster.shape_str} (both plans must address the same devices)"
        )


class _Holders:
    """Which actor holds cell ``i`` of unit ``U`` (module docstring), as transition ranks.

    Device ids are physical (``plan device + controller.device_base``); lost workers
    (``controller.dead``) take no part; ``alias`` maps a re-seeded vertex to the training vertex
    whose current workers hold its cells (:mod:`~rpeg.runtime.driver.recovery`).
    """

    def __init__(self, old: Any, new: Any, current_uids: set[int], alias: dict[str, str]) -> None:
        self.old, self.new, self.current, self.alias = old, new, current_uids, alias
        self.actors: list[Any] = []
        self.owners: list[Any] = []  # transition rank → liveness.Owner
        self.device: list[int] = []  # transition rank → physical device
        self.xrank: dict[tuple[str, int, int], int] = {}  # (plan, gid, rank) → transition rank
        self.where: dict[tuple[str, str, int], tuple[int, int]] = {}  # (plan, vertex, device) → (gid, rank)
        for tag, ctl in (("old", old), ("new", new)):
            for g in ctl.b.groups:
                for r, a in enumerate(ctl.actors[g.gid]):
                    if (g.gid, r) in ctl.dead:
                        continue
                    dev = g.devices[r] + ctl.device_base
                    self.xrank[(tag, g.gid, r)] = len(self.actors)
                    self.actors.append(a)
                    self.owners.append(ctl.owners[(g.gid, r)])
                    self.device.append(dev)
                    for v in g.vertices:
                        self.where[(tag, v, dev)] = (g.gid, r)

    def of(self, u: EMU, i: int) -> int:
        v, dev = u.stage.vertex, u.gpus[i]
        if u.uid in self.current:
            tag, v = "old", self.alias.get(v, v)
        else:
            tag = "new" if ("new", v, dev) in self.where else "old"
        if (tag, v, dev) not in self.where:
            raise RuntimeError(f"no live worker of {v!r} on device {dev} in either plan holds {u}")
        gid, rank = self.where[(tag, v, dev)]
        return self.xrank[(tag, gid, rank)]


def execute_transition(
    old: Any,
    new: Any,
    tplan: Any,
    step: int,
    alias: dict[str, str] | None = None,
    old_steps: int | None = None,
) -> TransitionRecord:
    """Move the job's state from ``old``'s workers to ``new``'s along ``tplan`` (module docstring).

    Parameters
    ----------
    old, new
        Started :class:`~rpeg.runtime.driver.controller.Controller` of the current and the target plan
        (``old`` has finished executing).
    tplan
        The scheduled transition (:func:`~rpeg.solvers.transition.plan_transition`) between the
        two plans' EMU collections; primitives run in its DAG order, earliest scheduled start
        first among the ready ones.
    step
        Global step boundary (recorded).
    alias
        Re-seeded vertex → training vertex holding its cells (the urgent path).
    old_steps
        Steps ``old`` completed (default: all of its binding's). With ``new.b.version_offset``
        they say which past versions an asynchronous target still reads.

    Returns
    -------
    TransitionRecord

    Raises
    ------
    RunError
        A worker failed; the message names the phase and the worker.
    """
    from .controller import torch_timeout_s

    dag = tplan.dag
    rec = TransitionRecord(step, tplan.method, tplan.l_tran, tplan.bound)
    t_start = time.perf_counter()
    names = [v.name for v in old.b.graph.vertices]
    if names != [v.name for v in new.b.graph.vertices]:
        raise ValueError(f"transition: the plans' graphs differ ({names} vs new)")
    alias = dict(alias or {})
    holders = _Holders(old, new, {u.uid for u in dag.current}, alias)
    calls = _Calls(old.watch, step)
    live = {(gid, r) for gid, r, _ in old.live_actors()}

    t0 = time.perf_counter()
    _synchronise_weights(old, calls)
    rec.sync_s = time.perf_counter() - t0

    # the transition group: every worker of both plans; rank 0 opens the group's store on a
    # port the OS picks, then every rank joins
    t0 = time.perf_counter()
    world = len(holders.actors)
    torch_s = torch_timeout_s(old.watch.stall_s)
    (master,) = calls.get(
        [calls.call(holders.owners[0], "xfer_host", world, torch_s)], "opening the transition group"
    )
    calls.get(
        [calls.call(o, "xfer_join", master, r, world, torch_s) for r, o in enumerate(holders.owners)],
        "joining the transition group",
    )
    rec.join_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    _export(dag, holders, live, alias, calls)
    rec.export_s = time.perf_counter() - t0

    shapes = _shapes(old, new, calls)
    tags = iter(range(1, 1 << 30))
    t0 = time.perf_counter()
    rec.primitives = _run_primitives(tplan, holders, shapes, tags, calls, t0)
    rec.primitives_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    rec.handover_bytes = _hand_over(dag, new, holders, shapes, tags, calls)
    _past_versions(old, new, old.b.steps if old_steps is None else old_steps, calls)
    rec.handover_s = time.perf_counter() - t0
    rec.total_s = time.perf_counter() - t_start
    return rec


class _Calls:
    """Worker calls of one transition, each remembered with its worker so that every wait is
    progress-checked (:class:`~rpeg.runtime.driver.liveness.Watchdog`) and a failure names the phase,
    the worker and its device."""

    def __init__(self, watch: Any, step: int) -> None:
        self.watch, self.step = watch, step
        self.ref_owner: dict[Any, Any] = {}

    def call(self, owner: Any, method: str, *args: Any) -> Any:
        """Submit ``owner``'s ``worker.<method>(*args)`` (a rank method,
        :func:`~rpeg.runtime.driver.group.call_worker`); returns the ref."""
        ref = call_worker(owner, method, *args)
        self.ref_owner[ref] = owner
        return ref

    def group(self, ctl: Any, gid: int, method: str, *args: Any) -> list:
        """Submit ``method(*args)`` to every live rank of ``ctl``'s group ``gid``
        (:meth:`~rpeg.runtime.driver.group.WorkerGroup.all`); returns the refs."""
        refs = []
        for key, ref in ctl.groups[gid].all(method, *args):
            self.ref_owner[ref] = ctl.owners[key]
            refs.append(ref)
        return refs

    def get(self, refs: list, what: str) -> list:
        """Results by progress; a failure names the phase, the worker and its device."""
        return self.watch.get_all(refs, self.ref_owner.__getitem__, f"transition at step {self.step}: {what}")


def _synchronise_weights(old: Any, calls: _Calls) -> None:
    """Step 1: every live serving worker of a trained model installs its training group's
    current weights (version ``old.b.steps``), so every model-stage holds the same version."""
    refs = []
    for g in old.b.groups:
        if g.trains:
            pubs = calls.group(old, g.gid, "publish")
            for other in old.b.groups:
                if other.model == g.model and not other.trains:
                    refs += calls.group(old, other.gid, "install", pubs, old.b.steps)
    calls.get(refs, "weight synchronisation")


def _export(
    dag: Any, holders: _Holders, live: set[tuple[int, int]], alias: dict[str, str], calls: _Calls
) -> None:
    """Step 2: every live current worker hands its cells of the current units to the transition
    (a re-seeded vertex's cells come from its training vertex's workers)."""
    cells: dict[int, list] = defaultdict(list)
    for u in dag.current:
        for i in range(u.size):
            v = alias.get(u.stage.vertex, u.stage.vertex)
            cells[holders.of(u, i)].append((u.uid, v, i, u.optim_bytes > 0))
    exporters = {holders.xrank[("old", gid, r)] for gid, r in live}
    calls.get(
        [calls.call(holders.owners[x], "xfer_export", cells.get(x, [])) for x in sorted(exporters)], "export"
    )


def _run_primitives(
    tplan: Any, holders: _Holders, shapes: dict, tags: Any, calls: _Calls, t0: float
) -> list[dict[str, Any]]:
    """Step 3: the DAG's primitives, each started once its predecessors ended (earliest
    scheduled start first), independent ones concurrently. Returns one record per primitive
    (``index``, ``kind``, ``label``, ``start``/``end`` from ``t0``, ``bytes`` sent,
    ``predicted_s``) in the order they ended.

    Raises
    ------
    RunError
        A worker's process is gone (named with the primitive).
    """
    from .controller import RunError

    dag, watch, step = tplan.dag, calls.watch, calls.step
    n = len(dag.primitives)
    preds = [set(p) for p in dag.predecessors]
    order = sorted(range(n), key=lambda i: (tplan.starts[i] if tplan.starts else 0.0, i))
    started: dict[int, float] = {}
    waiting: dict[int, set] = {}  # primitive → refs not yet finished
    refs_of: dict[int, list] = {}
    ref_of: dict[Any, int] = {}
    done: set[int] = set()
    out: list[dict[str, Any]] = []
    while len(done) < n:
        for i in order:
            if i in started or not preds[i] <= done:
                continue
            jobs = _primitive_calls(dag.primitives[i], holders, shapes, tags)
            prefs = [calls.call(holders.owners[x], m, arg) for x, (m, arg) in sorted(jobs.items())]
            started[i] = time.perf_counter() - t0
            refs_of[i], waiting[i] = prefs, set(prefs)
            for r in prefs:
                ref_of[r] = i
        finished = [i for i, rs in waiting.items() if not rs]  # a primitive with no worker call
        if not finished:
            pending = [r for rs in waiting.values() for r in rs]
            if not pending:
                raise RuntimeError(f"transition DAG stalled with {n - len(done)} primitives left (a cycle?)")
            ready, dead = watch.wait_any(
                pending, calls.ref_owner.__getitem__, lambda: f"transition at step {step}: primitives"
            )
            if dead:
                gone = calls.ref_owner[dead[0]]
                raise RunError(
                    f"transition at step {step}: {dag.primitives[ref_of[dead[0]]].label()} failed on "
                    f"{gone.label()}: worker process lost ({watch.dead(gone)})",
                    worker=gone.worker,
                    device=gone.device,
                    lost=True,
                )
            i = ref_of[ready[0]]
            waiting[i].discard(ready[0])
            if waiting[i]:
                continue
        else:
            i = finished[0]
        del waiting[i]
        prim = dag.primitives[i]
        outs = calls.get(refs_of[i], prim.label())
        out.append(
            {
                "index": i,
                "kind": prim.kind,
                "label": prim.label(),
                "start": started[i],
                "end": time.perf_counter() - t0,
                "bytes": sum(o.get("sent", 0) for o in outs if isinstance(o, dict)),
                "predicted_s": tplan.durations[i],
            }
        )
        done.add(i)
    return out


def _hand_over(dag: Any, new: Any, holders: _Holders, shapes: dict, tags: Any, calls: _Calls) -> int:
    """Step 4: each target worker assembles its cell of the final unit of every vertex it serves
    and loads it (parameters, its ZeRO slice of the moments, the counter). Returns the bytes
    copied between the two plans' workers."""
    final = {u.key(): u for u in _final_units(dag)}
    trainers = {v.name for v in new.b.graph.vertices if v.role is Role.TRAINING}
    entries: dict[int, list] = defaultdict(list)
    adopt: dict[int, dict[str, Any]] = defaultdict(dict)
    for g in new.b.groups:
        rep = g.pp * g.tp
        train = next((v for v in g.vertices if v in trainers), None)
        for v in g.vertices:
            for d in range(g.dp):
                devs = [x + new.device_base for x in g.devices[d * rep : (d + 1) * rep]]
                ms = next((u.stage for u in final.values() if u.stage.vertex == v), None)
                key = (ms, g.tp, g.pp, frozenset(devs), 1)  # the runtime runs plain 1F1B (vp = 1)
                if ms is None or key not in final:
                    raise RuntimeError(
                        f"transition: no final unit of {v!r} on devices {list(devs)} (plan and DAG disagree)"
                    )
                u = final[key]
                for i in range(rep):
                    x = holders.xrank[("new", g.gid, d * rep + i)]
                    dst = ("adopt", v)
                    e = _entry(u, (g.tp, g.pp, i // g.tp, i % g.tp), x, dst, [u], holders, shapes, tags)
                    for h in {x, *(s["holder"] for s in e["sources"].values())}:
                        entries[h].append(e)
                    adopt[x].setdefault("cells", {})[v] = dst
                    adopt[x]["train"] = train
    outs = calls.get(
        [calls.call(holders.owners[x], "xfer_run", es) for x, es in sorted(entries.items())], "hand-over copy"
    )
    calls.get(
        [calls.call(holders.owners[x], "xfer_adopt", keys) for x, keys in sorted(adopt.items())], "adoption"
    )
    return sum(o["sent"] for o in outs)


def _past_versions(old: Any, new: Any, done: int, calls: _Calls) -> None:
    """Hand the target the weight versions it reads before its own first update.

    An asynchronous target (``τ(m) > 0``) reads, at its step ``s ≤ τ``, version
    ``max(−offset, s − τ)`` counted from the weights it starts with — what an uninterrupted run
    would read; the lowered graph has no weight transfer for those steps (a fresh run reads its
    initial weights there), so every serving group of ``m`` receives them as snapshots in its
    layout up front. They are the old plan's versions ``done + v`` (``v < 0``): kept snapshots of
    its training workers (:meth:`Worker.publish_version`), or, further back, the ones the old plan
    was itself given (``old.initial_pubs``, passed on for a later transition).
    """
    import ray

    graph = new.b.graph
    tau = graph.staleness
    offset = new.b.version_offset
    refs = []
    for m, t in tau.items():
        versions = range(max(-offset, -t), 0)
        if not versions:
            continue
        trainer = next(g for g in old.b.groups if g.trains and g.model == m)
        for v in versions:
            v_old = done + v
            if v_old < 0:
                pub = old.initial_pubs.get((m, v_old))
                if pub is None:
                    raise RuntimeError(f"version {v_old} of {m} is not available to the transition target")
            else:  # fetched now and re-put by the driver: the old workers stop after the transition
                got = calls.get(calls.group(old, trainer.gid, "publish_version", v_old), "publish")
                pub = [ray.put(x) for x in got]
            new.initial_pubs[(m, v)] = pub
            for g in new.b.groups:
                serves = any(graph.vertices[graph.index[n]].role is not Role.TRAINING for n in g.vertices)
                if g.model == m and serves:
                    refs += [
                        calls.call(new.owners[(g.gid, r)], "install_snapshot", pub, v) for r in range(g.size)
                    ]
    calls.get(refs, "handing over past weight versions")


def physical_units(result: Any, graph: Any, base: int) -> list[EMU]:
    """The EMU collection of ``result``'s plan on physical devices ``base + d``."""
    from ...ir.emu import emus_of

    units = emus_of(result.plan, result.cluster, graph=graph)
    return (
        units
        if base == 0
        else [u.sub_unit(u.tp, u.pp, tuple(d + base for d in u.gpus), vp=u.vp) for u in units]
    )


def _final_units(dag: Any) -> list[EMU]:
    """The units alive after every primitive (the target collection with the DAG's uids)."""
    alive = {u.uid: u for u in dag.current}
    for prim in dag.primitives:
        for u in prim.consumed:
            alive.pop(u.uid, None)
        for u in prim.outputs:
            alive[u.uid] = u
    return list(alive.values())


def _shapes(old: Any, new: Any, calls: _Calls) -> dict[str, tuple[dict[str, tuple[int, ...]], int]]:
    """Full parameter shapes and layer count per vertex of ``old``'s groups. Each distinct model
    is asked of rank 0 of a group of ``new`` — the target's workers, all just started, hold every
    model of the same graph — (:meth:`~rpeg.runtime.worker.core.Worker.full_shapes`): the driver
    builds no model."""
    asked: dict[tuple, Any] = {}
    for g in new.b.groups:
        if (g.spec, g.head) not in asked:
            asked[(g.spec, g.head)] = calls.call(new.owners[(g.gid, 0)], "full_shapes")
    got = dict(zip(asked, calls.get(list(asked.values()), "reading the models' parameter shapes")))
    out = {}
    for g in old.b.groups:
        if (g.spec, g.head) not in got:
            raise ValueError(f"transition: the target plan holds no copy of {g.model} (group g{g.gid})")
        for v in g.vertices:
            out[v] = (got[(g.spec, g.head)], g.spec.layers)
    return out


def _entry(
    result: EMU,
    cell: tuple[int, int, int, int],
    holder: int,
    dst: Any,
    sources: list[EMU],
    holders: _Holders,
    shapes: dict,
    tags: Any,
) -> dict[str, Any]:
    """One target cell assembled from the source unit (of ``sources``) whose pieces are most local
    to ``holder``."""
    full, layers = shapes[result.stage.vertex]
    device = holders.device[holder]
    best = None
    for src in sources:
        pieces = cell_pieces(full, layers, src.layout, cell)
        # elements from other devices first, then from other workers on the same device
        cost = [0, 0]
        for r, pcs in pieces.items():
            x = holders.of(src, r)
            n = sum(math.prod(s) for s in piece_shapes(full, pcs))
            if holders.device[x] != device:
                cost[0] += n
            elif x != holder:
                cost[1] += n
        if best is None or cost < best[0]:
            best = (cost, src, pieces)
    assert best is not None
    _, src, pieces = best
    moments = result.optim_bytes > 0
    return {
        "key": (dst, cell[2] * cell[0] + cell[3]),
        "holder": holder,
        "names": cell_names(full, layers, cell[1], cell[2]),
        "moments": moments,
        "sources": {
            r: {
                "holder": holders.of(src, r),
                "key": (src.uid, r),
                "pieces": pcs,
                "shapes": piece_shapes(full, pcs),
                "tag": next(tags),
            }
            for r, pcs in pieces.items()
        },
    }


def _primitive_calls(prim: Any, holders: _Holders, shapes: dict, tags: Any) -> dict[int, tuple[str, Any]]:
    """Per transition rank, the worker call that executes its part of ``prim``."""
    if isinstance(prim, Destroy):
        keys: dict[int, list] = defaultdict(list)
        for i in range(prim.unit.size):
            keys[holders.of(prim.unit, i)].append((prim.unit.uid, i))
        return {x: ("xfer_drop", ks) for x, ks in keys.items()}
    if isinstance(prim, Split):
        jobs = [(part, [prim.source]) for part in prim.parts]
    elif isinstance(prim, Merge):
        jobs = [(prim.result, list(prim.parts))]
    elif isinstance(prim, Extend):
        jobs = [(prim.result, [prim.source])]
    else:  # pragma: no cover - the DAG has four kinds
        raise TypeError(f"unknown primitive {prim!r}")
    entries: dict[int, list] = defaultdict(list)
    for out, sources in jobs:
        for i in range(out.size):
            x = holders.of(out, i)
            e = _entry(
                out, (out.tp, out.pp, i // out.tp, i % out.tp), x, out.uid, sources, holders, shapes, tags
            )
            for h in {x, *(s["holder"] for s in e["sources"].values())}:
                entries[h].append(e)
    return {x: ("xfer_run", es) for x, es in entries.items()}
