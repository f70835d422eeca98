"""The two baseline planners of SPEC §8 and the memory repair they share.

* **greedy** — every invocation on all GPUs with its fastest strategy, one after another (the
  list scheduler serialises them because they share every device).
* **concurrent** — invocations with no data dependency between them (one topological level of
  the data edges) run side by side on disjoint shares of the devices; for every level the
  partition with the least estimated time (the slowest member's isolated time) is chosen.

Both then make the plan memory-feasible if they can (:func:`repair_memory`: move one vertex at a
time to the strategy that lowers the worst device peak at the least extra time) and otherwise
explain which invocation does not fit and by how much (:class:`Infeasible`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..ir.cluster import Allocation, Cluster
from ..ir.plan import Choice, Plan
from ..scoring.candidates import (
    Directory,
    TimeUp,
    aligned_allocations,
    build_directories,
    enumerate_strategies,
    explain_illegal,
    head_exclusions,
    lean_message,
    past_deadline,
)
from ..scoring.costs import Costs
from ..scoring.evaluator import Evaluator

__all__ = [
    "FLOOR_NOTE",
    "Infeasible",
    "TimeUp",
    "baselines_in_time",
    "concurrent_plan",
    "greedy_plan",
    "levels",
    "repair_memory",
]

GIB = 2**30


@dataclass
class Infeasible(Exception):
    """No memory-feasible plan was found; :attr:`reason` says which invocation and by how much."""

    reason: str
    vertex: str | None = None
    excess_bytes: float = 0.0

    def __str__(self) -> str:
        return self.reason


def _heads_note(ev: Evaluator, vertex: int) -> str:
    """``"; tp=… excluded by …"`` when the heads rules H1–H2 ruled out in-node tensor-parallel
    degrees of ``vertex`` (so a memory message does not hide a legality cause)."""
    v = ev.graph.vertices[vertex]
    spec = ev.graph.models[v.model].spec
    excluded = head_exclusions(ev.cluster, spec, v.role)
    if not excluded:
        return ""
    return f"; the attention heads exclude the other tensor-parallel degrees ({'; '.join(excluded)})"


def check_directories(ev: Evaluator, dirs: list[Directory], size: int | None = None) -> None:
    """Raise :class:`Infeasible` naming the first invocation with no strategy (of ``size`` GPUs,
    when given).

    The message says why: no legal layout at all (of that size), naming the rules that excluded
    the candidates (P1–P8, H1–H2; :func:`~rpeg.scoring.candidates.explain_illegal`); or legal
    layouts exist but the leanest isolated footprint among them exceeds ``M_eff`` by how many GiB
    (always a positive excess), with the tensor-parallel degrees the heads excluded.
    """
    m_eff = ev.cluster.hardware.m_eff
    for d in dirs:
        ok = d.of_size(size) if size is not None else d.strategies
        if ok:
            continue
        v = ev.graph.vertices[d.vertex]
        spec = ev.graph.models[v.model].spec
        who = f"invocation {v.name!r} ({v.role.value} of {v.model})"
        where = f"on {size} GPUs" if size is not None else "in any legal layout"
        if size is None:
            legal = enumerate_strategies(ev.cluster, spec, v.sequences, v.role)
        else:
            legal = [s for s in enumerate_strategies(ev.cluster, spec, v.sequences, v.role) if s.size == size]
        if not legal:
            sizes = None if size is None else [size]
            span = f"of {size} GPUs" if size is not None else "of any size"
            why = explain_illegal(ev.cluster, spec, v.role, v.sequences, sizes)
            raise Infeasible(
                f"{who} has no legal parallel layout {span} on cluster {ev.cluster.shape_str}: {why}",
                v.name,
            )
        smallest = min(ev.costs.memory(d.vertex, s).isolated for s in legal)
        # a trainer's in every mode and ZeRO stage; an interleaved twin counts with its layout
        layouts = len({replace(s, vp=1).layout_key() for s in legal})
        excess = max(0.0, smallest - m_eff)
        hw = ev.cluster.hardware
        if excess > 0.0:
            fit = (
                f"its smallest isolated footprint among the {layouts} legal layouts is "
                f"{smallest / GIB:.1f} GiB per GPU, {excess / GIB:.1f} GiB over M_eff={m_eff / GIB:.1f} GiB "
                f"({hw.gpu_memory_bytes / GIB:.1f} GiB GPUs, {hw.memory_headroom:.0%} headroom)"
            )
        else:  # legal and fitting layouts were removed by a caller's restriction of the directory
            fit = f"none of its {layouts} legal layouts is left in its candidate directory"
        raise Infeasible(f"{who} does not fit {where}: {fit}{_heads_note(ev, d.vertex)}", v.name, excess)


def explain_memory(ev: Evaluator, plan: Plan) -> Infeasible:
    """Describe the worst device of an infeasible plan: its peak, the excess, who sits there."""
    mem = ev.memory(plan)
    worst = max(range(len(mem.peak)), key=mem.peak.__getitem__)
    atom = mem.atoms[worst]
    names = [ev.graph.vertices[v].name for v, c in enumerate(plan.choices) if c.allocation.mask & atom]
    first = (atom & -atom).bit_length() - 1
    excess = mem.peak[worst] - mem.m_eff
    return Infeasible(
        f"no memory-feasible plan found: GPU {first} (and {atom.bit_count() - 1} like it) needs "
        f"{mem.peak[worst] / GIB:.2f} GiB, {excess / GIB:.2f} GiB over M_eff={mem.m_eff / GIB:.2f} GiB; "
        f"co-resident invocations: {', '.join(names)}",
        names[0] if names else None,
        excess,
    )


def _side_by_side(ev: Evaluator, group: list[int], smallest: list[int]) -> Infeasible:
    """Explain why a level's invocations cannot run side by side: the one needing the most GPUs
    does not fit its isolated memory on what the others leave, by how many GiB."""
    cluster = ev.cluster
    worst = max(range(len(group)), key=smallest.__getitem__)
    v = group[worst]
    vert = ev.graph.vertices[v]
    avail = cluster.num_devices - sum(m for i, m in enumerate(smallest) if i != worst)
    if avail < 1:  # the others alone fill the cluster: judge it on an even share instead
        avail = max(s for s in cluster.legal_sizes if s <= max(1, cluster.num_devices // len(group)))
    spec = ev.graph.models[vert.model].spec
    footprints = [
        ev.costs.memory(v, s).isolated
        for s in enumerate_strategies(cluster, spec, vert.sequences, vert.role)
        if s.size <= avail
    ]
    m_eff = cluster.hardware.m_eff
    others = ", ".join(
        f"{ev.graph.vertices[u].name} ≥ {m} GPUs"
        for i, (u, m) in enumerate(zip(group, smallest))
        if i != worst
    )
    over = 0.0
    if footprints and min(footprints) > m_eff:
        over = min(footprints) - m_eff
        detail = (
            f"on {avail} GPUs (beside {others}) its smallest isolated footprint is "
            f"{min(footprints) / GIB:.2f} GiB per GPU, {over / GIB:.2f} GiB over M_eff={m_eff / GIB:.2f} GiB"
            f"{_heads_note(ev, v)}"
        )
    elif footprints:  # layouts that fit exist, but no aligned blocks hold them beside the others
        detail = (
            f"its layouts that fit in memory on at most {avail} GPUs do not pack into aligned blocks "
            f"beside {others}"
        )
    else:
        why = explain_illegal(
            cluster, spec, vert.role, vert.sequences, [s for s in cluster.legal_sizes if s <= avail]
        )
        detail = f"no legal layout fits on {avail} GPUs (beside {others}): {why}"
    return Infeasible(
        f"invocation {vert.name!r} cannot run side by side with the rest of its level on cluster "
        f"{cluster.shape_str}: {detail} (it needs ≥ {smallest[worst]} GPUs)",
        vert.name,
        over,
    )


def repair_memory(
    ev: Evaluator, dirs: list[Directory], plan: Plan, max_moves: int = 200, deadline: float | None = None
) -> Plan:
    """Make ``plan`` memory-feasible by changing strategies in place (allocations kept).

    Each move switches one vertex to another strategy of the same shape that strictly lowers the
    worst device's peak ratio, choosing the one that adds the least estimated time (ties: the
    larger drop). Stops when feasible or when no move helps.

    A device's peak is ``Σ persistent + max transient`` over its vertices (SPEC §6), so it never
    falls when one vertex's ``(transient, weights, train_state)``
    (:class:`~rpeg.scoring.costs.VertexMemory`) falls in no component, and never rises when it
    rises in none. So a move scores, per vertex, only the strategies whose triple is below the
    current one's in some component and not at or above the triple of a strategy listed before it
    (which is no slower and, its ratio being no larger, wins or ties first): the move the full
    scan would pick, without scoring the others.

    Raises
    ------
    Infeasible
        When no sequence of such moves reaches feasibility.
    TimeUp
        When ``deadline`` (a ``time.monotonic()`` instant) passes first.
    """
    costs = ev.costs
    ratio = ev.memory(plan).ratio
    moves = 0
    fronts: dict[tuple[int, int], list[tuple[int, tuple[float, float, float]]]] = {}
    while ratio > 1.0 + 1e-9 and moves < max_moves:
        best = None
        for d in dirs:
            cur = plan.choices[d.vertex]
            t_cur = costs.op_time(d.vertex, cur.strategy)
            m_cur = costs.memory(d.vertex, cur.strategy)
            now = (m_cur.transient, m_cur.weights, m_cur.train_state)
            at = (d.vertex, cur.allocation.size)
            if at not in fronts:
                fronts[at] = _memory_front(costs, d, cur.allocation.size)
            for i, triple in fronts[at]:
                if triple[0] >= now[0] and triple[1] >= now[1] and triple[2] >= now[2]:
                    continue  # no device's peak can fall (the current strategy among them)
                if past_deadline(deadline, 0):
                    raise TimeUp("the time limit passed while a baseline was repaired for memory")
                trial = plan.replace(d.vertex, Choice(d.strategies[i], cur.allocation))
                r = ev.memory(trial).ratio
                if r < ratio - 1e-12:
                    key = (d.times[i] - t_cur, r)
                    if best is None or key < best[0]:
                        best = (key, trial, r)
        if best is None:
            break
        _, plan, ratio = best
        moves += 1
    if ratio > 1.0 + 1e-9:
        raise explain_memory(ev, plan)
    return plan


def _memory_front(costs: Costs, d: Directory, size: int) -> list[tuple[int, tuple[float, float, float]]]:
    """The strategies of ``d`` on ``size`` GPUs with their ``(transient, weights, train_state)``
    (:class:`~rpeg.scoring.costs.VertexMemory`), less each one whose triple is at or above a
    strategy's listed before it (no slower, and no higher on any device wherever it runs)."""
    front: list[tuple[int, tuple[float, float, float]]] = []
    for i in d.of_size(size):  # sorted by time
        m = costs.memory(d.vertex, d.strategies[i])
        t = (m.transient, m.weights, m.train_state)
        if not any(f[0] <= t[0] and f[1] <= t[1] and f[2] <= t[2] for _, f in front):
            front.append((i, t))
    return front


def greedy_plan(ev: Evaluator, dirs: list[Directory], deadline: float | None = None) -> Plan:
    """SPEC §8 greedy baseline: all GPUs, fastest strategy per invocation, repaired for memory.

    Raises
    ------
    Infeasible
        If some invocation has no strategy on all GPUs, or the co-resident state cannot fit.
    TimeUp
        When ``deadline`` (a ``time.monotonic()`` instant) passes during the repair.
    """
    cluster = ev.cluster
    n = cluster.num_devices
    check_directories(ev, dirs)
    check_directories(ev, dirs, n)
    alloc = aligned_allocations(cluster, n)[0]
    plan = Plan(tuple(Choice(d.strategies[d.of_size(n)[0]], alloc) for d in dirs))
    return repair_memory(ev, dirs, plan, deadline=deadline)


def levels(ev: Evaluator) -> list[list[int]]:
    """Group vertices by longest-path depth in the data-edge DAG (no dependency inside a group)."""
    g = ev.graph
    depth = [0] * len(g.vertices)
    # vertex order is topological, so visiting edges by destination order settles each depth
    for e in sorted(g.data_edges, key=lambda e: g.index[e.dst]):
        depth[g.index[e.dst]] = max(depth[g.index[e.dst]], depth[g.index[e.src]] + 1)
    out: dict[int, list[int]] = {}
    for v, k in enumerate(depth):
        out.setdefault(k, []).append(v)
    return [out[k] for k in sorted(out)]


def _pack(cluster: Cluster, sizes: list[int]) -> list[Allocation] | None:
    """Place blocks of ``sizes`` (largest first) at the first free aligned origins."""
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    used = 0
    out: list[Allocation | None] = [None] * len(sizes)
    for i in order:
        for a in aligned_allocations(cluster, sizes[i]):
            if not a.mask & used:
                out[i] = a
                used |= a.mask
                break
        else:
            return None
    return out  # type: ignore[return-value]


def concurrent_plan(
    ev: Evaluator, dirs: list[Directory], *, alternatives: int = 8, deadline: float | None = None
) -> Plan:
    """SPEC §8 concurrent baseline: independent invocations side by side on disjoint devices.

    For each topological level, every assignment of legal sizes to its members that packs into
    the cluster is scored by its slowest member's fastest isolated time; the best is taken. If
    the result is memory-infeasible, strategies are repaired first, then the levels' next-best
    partitions (up to ``alternatives`` each) are tried in order.

    Raises
    ------
    Infeasible
        When no tried partition can be made memory-feasible.
    TimeUp
        When ``deadline`` (a ``time.monotonic()`` instant) passes during a repair.
    """
    cluster = ev.cluster
    check_directories(ev, dirs)
    ranked: list[list[tuple[float, list[tuple[int, Choice]]]]] = []
    for group in levels(ev):
        options: list[tuple[float, list[tuple[int, Choice]]]] = []
        per_member = [sorted({dirs[v].strategies[i].size for i in range(len(dirs[v]))}) for v in group]
        for sizes in itertools.product(*per_member):
            if sum(sizes) > cluster.num_devices:
                continue
            allocs = _pack(cluster, list(sizes))
            if allocs is None:
                continue
            choice = []
            t = 0.0
            for v, size, a in zip(group, sizes, allocs):
                i = dirs[v].of_size(size)[0]
                t = max(t, dirs[v].times[i])
                choice.append((v, Choice(dirs[v].strategies[i], a)))
            options.append((t, choice))
        if not options:
            raise _side_by_side(ev, group, [min(sizes) for sizes in per_member])
        options.sort(key=lambda o: o[0])
        ranked.append(options[:alternatives])

    def build(picks: tuple[int, ...]) -> Plan:
        choices: list[Choice | None] = [None] * len(dirs)
        for level, k in zip(ranked, picks):
            for v, c in level[k][1]:
                choices[v] = c
        return Plan(tuple(choices))  # type: ignore[arg-type]

    combos = sorted(
        itertools.product(*(range(len(r)) for r in ranked)),
        key=lambda p: (sum(r[k][0] for r, k in zip(ranked, p)), p),
    )
    first_error: Infeasible | None = None
    for picks in combos[: max(1, alternatives * len(ranked))]:
        try:
            return repair_memory(ev, dirs, build(picks), deadline=deadline)
        except Infeasible as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


#: What a result says when a baseline over the full candidates did not finish by the deadline
#: and the one over the lean candidates (:func:`baselines_in_time`) stands in for it.
FLOOR_NOTE = (
    "the time limit passed before a baseline over the full candidate directories was complete: "
    "its plan over the lean ones, built first, stands in for it"
)


def baselines_in_time(
    ev: Evaluator,
    planners: Sequence[Callable[..., Plan]],
    deadline: float | None,
    narrow: Callable[[list[Directory]], None] | None = None,
) -> tuple[list[Directory], list[Plan | Infeasible], str]:
    """Candidate directories and each of ``planners``' plans over them (or its
    :class:`Infeasible`), with what a result must say, finishing by ``deadline`` where the work
    allows it.

    Without a deadline: the full directories (:func:`~rpeg.scoring.candidates.build_directories`)
    and each planner over them; the message is ``""``.

    With one (a ``time.monotonic()`` instant), the *floor* comes first: every vertex's kept
    directory, or its lean one (:func:`~rpeg.scoring.candidates.lean_directory`), and each planner
    over those, without a deadline — the least work that yields a plan, so it is done even when
    it overruns. Then the full directories are built until the deadline, and each planner runs
    again over them, stopping at the deadline (:class:`TimeUp`); a planner that did not finish
    keeps its floor plan and the message says so (:data:`FLOOR_NOTE`). When the floor has no lean
    directory, or the deadline came before any full one was built, the floor is the result. The
    message also names the vertices left lean (:func:`~rpeg.scoring.candidates.lean_message`).
    ``narrow`` (in place) is applied to every directory list before a planner sees it (an
    ablation's restriction).

    The floor's plans may use a strategy the full directory leaves out (a dominated lean pick):
    it is legal and fits, so a search may start from it.
    """
    narrow = narrow or (lambda dirs: None)

    def attempt(
        planner: Callable[..., Plan], dirs: list[Directory], until: float | None
    ) -> Plan | Infeasible:
        try:
            return planner(ev, dirs, deadline=until)
        except Infeasible as exc:
            return exc

    if deadline is None:
        dirs = build_directories(ev.costs)
        narrow(dirs)
        return dirs, [attempt(p, dirs, None) for p in planners], ""
    floor = build_directories(ev.costs, -math.inf)  # kept full ones, else lean
    narrow(floor)
    floor_plans = [attempt(p, floor, None) for p in planners]
    if not any(d.lean for d in floor):
        return floor, floor_plans, ""
    dirs = build_directories(ev.costs, deadline)
    if [d.lean for d in dirs] == [d.lean for d in floor]:  # no full one was built in time: the
        # floor's directories again, so its plans are the plans
        return floor, floor_plans, lean_message(ev.costs, floor)
    narrow(dirs)
    plans: list[Plan | Infeasible] = []
    stood_in = False
    for planner, fallback in zip(planners, floor_plans):
        if past_deadline(deadline, 0):
            plans.append(fallback)
            stood_in = True
            continue
        try:
            plans.append(attempt(planner, dirs, deadline))
        except TimeUp:
            plans.append(fallback)
            stood_in = True
    notes = [lean_message(ev.costs, dirs), FLOOR_NOTE if stood_in else ""]
    return dirs, plans, "; ".join(n for n in notes if n)
