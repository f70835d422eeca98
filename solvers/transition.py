"""``plan_transition``: the front door of transition planning (SPEC §10, Nereus §5–§6).

``plan_transition(current, target, cluster, workload=w, method="greedy")`` compiles the global
transition DAG of the two EMU collections (:func:`~rpeg.ir.emu.transition_dag_of_plans` for two
plans, read per vertex; :func:`~rpeg.ir.emu.transition_dag` for EMU collections), prices every primitive
(:mod:`rpeg.costmodel.transition`) and schedules the DAG with one of

* ``"greedy"`` — the Nereus list order (:func:`~rpeg.heuristics.transition.greedy_schedule`) in
  seconds; its bound is the critical path, so it reports ``optimal`` when it meets it;
* ``"cpsat"`` — :func:`~rpeg.formulations.transition_cpsat.solve_transition_cpsat`;
* ``"milp"`` — :func:`~rpeg.formulations.transition_milp.solve_transition_milp` (Pyomo, HiGHS).

A target an engine would refuse to build is refused first (:func:`check_target`: the
attention-head rules H1–H2 of :func:`~rpeg.ir.plan.check_heads`), naming the vertex and the rule.

The exact engines work on integer ticks of ``resolution`` seconds, durations rounded up, so their
``l_tran`` is the optimum of the rounded problem (at most one tick per primitive on the critical
path above the exact seconds); the greedy schedule on the same ticks is their hint and, when
they find nothing better in time, their answer (status ``time_limit``). Default resolution:
1 ms for CP-SAT; for the MILP, whose variables grow with the horizon, the larger of 1 ms and
1/100 of the greedy schedule's length.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..costmodel.transition import (
    DEFAULT_SETUP_S,
    DEFAULT_TEARDOWN_S,
    check_capacity,
    critical_path,
    gpu_capacities,
    primitive_times,
    primitive_times_array,
)
from ..formulations.status import Status
from ..heuristics.transition import TransitionSchedule, check_transition_schedule, greedy_schedule
from ..ir.cluster import Cluster
from ..ir.emu import (
    EMU,
    TransitionDAG,
    TransitionInfeasible,
    emus_of,
    transition_dag,
    transition_dag_of_plans,
)
from ..ir.errors import InputError, check_positive_int, check_seconds, check_seed, check_type
from ..ir.graph import RPEG
from ..ir.plan import Plan, check_heads
from ..ir.templates import build_graph
from ..ir.types import Role
from ..ir.workload import Workload

__all__ = ["TRANSITION_METHODS", "TransitionPlan", "check_target", "plan_transition"]

#: Scheduling methods ``plan_transition`` knows.
TRANSITION_METHODS = ("greedy", "cpsat", "milp")

DEFAULT_RESOLUTION_S = 1e-3
MILP_TICKS = 100


@dataclass(frozen=True)
class TransitionPlan:
    """A scheduled transition.

    Attributes
    ----------
    dag
        The global transition DAG.
    durations
        Seconds of every primitive (the cost model's, before any rounding).
    starts, ends
        Schedule in seconds (empty when there is none).
    status
        ``optimal`` / ``feasible`` / ``time_limit`` / ``infeasible`` (a :class:`Status`).
    l_tran
        Schedule length ``max_i E_i`` in seconds (``inf`` without a schedule).
    bound
        Proven lower bound on the length in seconds (the critical path at least).
    critical_path
        Longest DAG path with the cost model's durations (resources ignored).
    method, runtime
        The scheduling method and the wall-clock seconds of the whole call.
    resolution
        Seconds per tick of the exact engines (``None`` for the greedy).
    capacity
        ``cap_g`` per GPU in bytes.
    """

    dag: TransitionDAG
    durations: tuple[float, ...]
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    status: Status
    l_tran: float
    bound: float
    critical_path: float
    method: str
    runtime: float
    resolution: float | None = None
    capacity: Mapping[int, float] = field(default_factory=dict, repr=False)

    @property
    def has_schedule(self) -> bool:
        return math.isfinite(self.l_tran)

    @property
    def gap(self) -> float:
        """``(L_tran − bound)/L_tran`` (0 when optimal, ``inf`` without a schedule)."""
        if not self.has_schedule:
            return math.inf
        return 0.0 if self.l_tran == 0 else (self.l_tran - self.bound) / self.l_tran

    def check(self) -> list[str]:
        """Violated invariants of the schedule (:func:`check_transition_schedule`); empty if valid."""
        if not self.has_schedule:
            return []
        return check_transition_schedule(self.dag, self.starts, self.ends, self.capacity)

    def table(self) -> str:
        """The schedule, one primitive per line, by start."""
        lines = [f"{'start':>9} {'end':>9}  primitive"]
        for i in sorted(range(len(self.starts)), key=lambda i: (self.starts[i], i)):
            p = self.dag.primitives[i]
            units = " + ".join(str(u) for u in (p.outputs or p.inputs))
            lines.append(f"{self.starts[i]:9.3f} {self.ends[i]:9.3f}  {p.kind:<7} {units}")
        lines.append(f"L_tran = {self.l_tran:.3f} s ({self.status}, bound {self.bound:.3f} s)")
        return "\n".join(lines)


def _collection(
    x: Plan | Sequence[EMU], cluster: Cluster, graph: RPEG | None, workload: Workload | None, name: str
):
    if isinstance(x, Plan):
        if graph is None and workload is None:
            raise ValueError(f"{name} is a Plan: plan_transition needs graph= or workload= to read it")
        return emus_of(x, cluster, graph=graph, workload=None if graph is not None else workload)
    return list(x)


_ROLE_OF_STAGE = {"Gen": Role.GENERATION, "Inf": Role.INFERENCE, "Train": Role.TRAINING}


def check_target(
    target: Plan | Sequence[EMU], cluster: Cluster, graph: RPEG | None, workload: Workload | None
) -> None:
    """Refuse a transition target that an engine would refuse to build: every vertex's (or
    unit's) ``tp`` must shard its model's attention heads on the engine of its stage — H1–H2 of
    :func:`~rpeg.ir.plan.check_heads`, vLLM for Gen, Megatron-core for Inf and Train.

    A :class:`~rpeg.ir.plan.Plan` target is judged on ``graph`` (or the workload's synchronous
    graph); an EMU collection when ``graph`` or ``workload`` names its models (otherwise there is
    nothing to judge it on). SPEC §4's planner rules P1–P8 are not re-checked here: a hand-made
    target may, say, use fewer microbatches than P5 asks, which every engine runs.

    Raises
    ------
    InputError
        Naming the vertex (or unit), its layout, the rule and the engine.
    """
    if graph is None and workload is not None:
        graph = build_graph(workload)
    if graph is None:
        return
    if isinstance(target, Plan):
        if len(target) != len(graph.vertices):
            return  # emus_of names the mismatch
        for v, c in zip(graph.vertices, target.choices):
            why = check_heads(graph.models[v.model].spec, v.role, c.strategy.tp)
            if why is not None:
                raise InputError(
                    f"target plan is illegal: vertex {v.name!r} ({v.role.value} of {v.model}, "
                    f"{c.strategy.label()}): {why}",
                    source="target",
                )
        return
    for u in target:
        inst = graph.models.get(u.stage.model)
        if inst is None:
            continue
        why = check_heads(inst.spec, _ROLE_OF_STAGE[str(u.stage.stage)], u.tp)
        if why is not None:
            raise InputError(
                f"target unit {u.stage.model}/{u.stage.stage} (tp={u.tp}, pp={u.pp}) is illegal: {why}",
                source="target",
            )


def plan_transition(
    current: Plan | Sequence[EMU],
    target: Plan | Sequence[EMU],
    cluster: Cluster,
    *,
    graph: RPEG | None = None,
    workload: Workload | None = None,
    method: str = "greedy",
    time_limit: float | None = 30.0,
    seed: int = 0,
    threads: int | None = 1,
    resolution: float | None = None,
    capacity: float | None = None,
    setup: float = DEFAULT_SETUP_S,
    teardown: float = DEFAULT_TEARDOWN_S,
    solver: str = "highs",
    engine_start: float = 0.0,
) -> TransitionPlan:
    """Plan the move from ``current`` to ``target`` (module docstring).

    Parameters
    ----------
    current, target
        Plans of the same graph, or EMU collections.
    cluster
        Device space and hardware figures.
    graph, workload
        What the plans are for (one of them; the workload's synchronous graph otherwise).
    method
        ``"greedy"``, ``"cpsat"`` or ``"milp"``.
    time_limit
        Seconds for an exact engine (``None``: until proven).
    seed, threads
        Passed to the exact engines.
    resolution
        Seconds per tick for the exact engines (default: module docstring).
    capacity
        Per-GPU memory bound in bytes before the endpoint rule (default ``M_eff``; ``inf``: none; see
        :func:`~rpeg.costmodel.transition.gpu_capacities`).
    setup, teardown
        Communicator set-up and Destroy teardown seconds of the cost model.
    solver
        Pyomo solver for ``"milp"``.
    engine_start
        Seconds to start the rollout engine of each generation replica a primitive creates
        (``c_engine`` of :mod:`~rpeg.costmodel.transition`; 0: generation needs no engine).

    Returns
    -------
    TransitionPlan

    Raises
    ------
    TypeError, ValueError
        For an unknown ``method`` (listing the known ones), a figure that is not a finite number
        in range (``setup``, ``teardown``, ``engine_start`` ≥ 0; ``resolution``, ``capacity`` >
        0; checked whatever the transition, an empty one included), or plans that do not pair
        up; each names the argument.
    InputError
        For a plan made for another workload (its length) or cluster (its allocations), naming
        ``current`` or ``target`` and what differs, before anything is read; for a target an
        engine would refuse (:func:`check_target`: the rule is named).
    TransitionInfeasible
        When no DAG reaches the target (GPUs two model-stages wait on), or, for ``"greedy"``, when
        the list order runs out of memory.
    """
    t0 = time.perf_counter()
    time_limit = _check_arguments(
        current, target, cluster, graph, workload, method, time_limit, seed, threads
    )
    # every figure, whatever the transition (an empty one never reads them)
    _check_figures(setup, teardown, engine_start, resolution, capacity, solver)
    graph_of = "graph" if graph is not None or workload is None else f"graph of workload {workload.name!r}"
    if graph is None and workload is not None:
        graph = build_graph(workload)  # once, for the checks, the target's rules and the DAG
    for name, plan in (("current", current), ("target", target)):
        if isinstance(plan, Plan):
            _check_plan(name, plan, cluster, graph, graph_of)
    check_target(target, cluster, graph, None)
    if isinstance(current, Plan) and isinstance(target, Plan):
        # both plans: the DAG's tables straight from their vertices, units made only if read
        dag = transition_dag_of_plans(current, target, cluster, graph=graph)
    else:
        cur = _collection(current, cluster, graph, None, "current")
        tgt = _collection(target, cluster, graph, None, "target")
        dag = transition_dag(cur, tgt)
    caps = gpu_capacities(dag, cluster, capacity)
    if dag.flat is not None:  # the compiled cores read one float array
        dur = primitive_times_array(dag, cluster, setup=setup, teardown=teardown, engine_start=engine_start)
        durations = dur.tolist()
    else:
        durations = dur = primitive_times(
            dag, cluster, setup=setup, teardown=teardown, engine_start=engine_start
        )
    cp = critical_path(dag, dur)
    if method == "greedy":
        sched = greedy_schedule(dag, dur, caps)
        length = sched.length
        status = Status.OPTIMAL if length <= cp * (1 + 1e-12) else Status.FEASIBLE
        return TransitionPlan(
            dag, tuple(durations), sched.starts, sched.ends, status, length, cp, cp, method,
            time.perf_counter() - t0, None, caps,
        )  # fmt: skip
    return _exact_plan(
        dag, durations, caps, cp, method, t0,
        time_limit=time_limit, seed=seed, threads=threads, resolution=resolution, solver=solver,
    )  # fmt: skip


def _check_arguments(
    current: object,
    target: object,
    cluster: object,
    graph: object,
    workload: object,
    method: object,
    time_limit: object,
    seed: object,
    threads: object,
) -> float | None:
    """Types and ranges of :func:`plan_transition`'s arguments; returns ``time_limit`` as a float.

    Raises
    ------
    TypeError, ValueError
        Naming the argument (an unknown ``method`` lists the known ones).
    """
    for name, value in (("current", current), ("target", target)):
        if not isinstance(value, Plan) and (
            isinstance(value, (str, bytes))
            or not isinstance(value, Sequence)
            or not all(isinstance(u, EMU) for u in value)
        ):
            raise TypeError(f"{name} must be a Plan or a sequence of EMUs, got {type(value).__name__}")
    check_type("cluster", cluster, Cluster, "a rpeg.Cluster")
    if graph is not None:
        check_type("graph", graph, RPEG, "an RPEG")
    if workload is not None:
        check_type("workload", workload, Workload, "a rpeg.Workload")
    check_type("method", method, str, "a transition method name (str)")
    seconds = check_seconds("time_limit", time_limit)
    check_seed("seed", seed)
    if threads is not None:
        check_positive_int("threads", threads)
    if method not in TRANSITION_METHODS:
        raise ValueError(f"unknown transition method {method!r}; known: {', '.join(TRANSITION_METHODS)}")
    return seconds


def _check_figures(
    setup: object,
    teardown: object,
    engine_start: object,
    resolution: object,
    capacity: object,
    solver: object,
) -> None:
    """The cost model's figures of :func:`plan_transition`: finite seconds ``≥ 0`` (``setup``,
    ``teardown``, ``engine_start``), finite and positive (``resolution``), positive
    (``capacity`` in bytes, ``inf`` for no bound, or ``None``), and a solver name.

    Raises
    ------
    TypeError, ValueError
        Naming the argument and the value.
    """
    for name, value in (("setup", setup), ("teardown", teardown), ("engine_start", engine_start)):
        check_seconds(name, value, allow_none=False, allow_zero=True)
    check_seconds("resolution", resolution)
    check_capacity("capacity", capacity)
    check_type("solver", solver, str, "a Pyomo solver name (str)")


def _check_plan(name: str, plan: Plan, cluster: Cluster, graph: RPEG | None, graph_of: str) -> None:
    """Refuse a plan made for another problem before reading it, naming the argument: one of
    another workload (its length is not the graph's) or of another cluster (an allocation that
    is not the same devices on ``cluster``).

    Raises
    ------
    ValueError
        Without ``graph`` (a plan is read on one); :class:`InputError` naming ``name``, the
        vertex and what differs.
    """
    if graph is None:
        raise ValueError(f"{name} is a Plan: plan_transition needs graph= or workload= to read it")
    if len(plan) != len(graph.vertices):
        raise InputError(
            f"{name} has {len(plan)} choices but the {graph_of} has {len(graph.vertices)} vertices "
            f"({', '.join(v.name for v in graph.vertices)}): {name} was made for another workload",
            source=name,
        )
    for v, c in zip(graph.vertices, plan.choices):
        a = c.allocation
        inside = all(o >= 0 and o + e <= n for o, e, n in zip(a.origin, a.extent, cluster.shape))
        if not inside or a.mask != _mask_on(cluster, a.origin, a.extent):
            ids = a.devices()
            devices = f" (devices {ids[0]}..{ids[-1]})" if ids else ""
            raise InputError(
                f"{name}: vertex {v.name!r} is placed at origin {list(a.origin)} extent {list(a.extent)}"
                f"{devices}, which are not those devices on cluster "
                f"{cluster.shape_str} ({cluster.num_devices} devices): {name} was made for another cluster",
                source=name,
            )


def _mask_on(cluster: Cluster, origin: tuple[int, int, int], extent: tuple[int, int, int]) -> int:
    """Bit mask of the devices ``D(origin, extent)`` denotes on ``cluster`` (flat ids)."""
    mask, run = 0, (1 << extent[2]) - 1
    for r in range(origin[0], origin[0] + extent[0]):
        for n in range(origin[1], origin[1] + extent[1]):
            mask |= run << cluster.flat_id(r, n, origin[2])
    return mask


def _exact_plan(
    dag: TransitionDAG,
    durations: list[float],
    caps: Mapping[int, float],
    cp: float,
    method: str,
    t0: float,
    *,
    time_limit: float | None,
    seed: int,
    threads: int | None,
    resolution: float | None,
    solver: str,
) -> TransitionPlan:
    """Schedule ``dag`` with ``"cpsat"`` or ``"milp"`` on integer ticks of ``resolution`` seconds.

    Durations are rounded up to ``⌈d/resolution⌉`` ticks. The greedy schedule on the same ticks
    is the engine's hint and, when the engine ends without an incumbent of its own (and has not
    proven infeasibility), the answer with status ``time_limit``. The reported bound is
    ``max(critical path, engine bound · resolution)``, capped by the length found.
    """
    # exact engines on integer ticks, the greedy schedule on the same ticks as hint and fallback
    greedy_s: TransitionSchedule | None
    try:
        greedy_s = greedy_schedule(dag, durations, caps)
    except TransitionInfeasible:
        greedy_s = None
    if resolution is None:
        resolution = DEFAULT_RESOLUTION_S
        if method == "milp" and greedy_s is not None:
            resolution = max(resolution, greedy_s.length / MILP_TICKS)
    ticks = [math.ceil(d / resolution - 1e-9) for d in durations]
    hint = None
    try:
        hs = greedy_schedule(dag, ticks, caps)
        hint = [int(s) for s in hs.starts]
    except TransitionInfeasible:
        pass
    remaining = None if time_limit is None else max(0.01, time_limit - (time.perf_counter() - t0))
    if method == "cpsat":
        from ..formulations.transition_cpsat import solve_transition_cpsat

        sol = solve_transition_cpsat(
            dag, ticks, caps, time_limit=remaining, seed=seed, threads=threads, hint=hint
        )
    else:
        from ..formulations.transition_milp import solve_transition_milp

        sol = solve_transition_milp(
            dag, ticks, caps, solver=solver, time_limit=remaining, seed=seed, threads=threads, hint=hint
        )
    status = sol.status
    bound = max(cp, sol.lower_bound * resolution) if math.isfinite(sol.lower_bound) else math.inf
    if sol.has_schedule:
        starts = tuple(s * resolution for s in sol.starts)
        ends = tuple((s + t) * resolution for s, t in zip(sol.starts, ticks))
        length = sol.makespan * resolution
    elif hint is not None and status is not Status.INFEASIBLE:
        # out of time without an incumbent of its own: the greedy schedule on the same ticks
        starts = tuple(s * resolution for s in hint)
        ends = tuple((s + t) * resolution for s, t in zip(hint, ticks))
        length = max(ends, default=0.0)
        status = Status.TIME_LIMIT
    else:
        starts, ends, length = (), (), math.inf
        if status is not Status.INFEASIBLE:
            status = Status.TIME_LIMIT if status in (Status.UNKNOWN, Status.TIME_LIMIT) else status
    if status is Status.INFEASIBLE:
        bound = math.inf
    return TransitionPlan(
        dag, tuple(durations), starts, ends, status, length, min(bound, length) if math.isfinite(length) else bound,
        cp, method, time.perf_counter() - t0, resolution, caps,
    )  # fmt: skip
