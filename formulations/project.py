"""The project-scheduling data every exact model and the project list scheduler read (SPEC §9).

A project is a set of activities ``i ∈ A``, each run in exactly one of its modes ``m ∈ M_i``; mode
``m`` takes ``d_im`` time units and holds ``r_imk`` units of each resource ``k``:

- a **renewable** resource (capacity ``R_k`` at every instant) is held while the activity runs:
  ``Σ_{i running at t} r_{i m_i k} ≤ R_k`` for every ``t``; a renewable resource flagged
  ``unary`` has capacity 1 and is a device (no two activities that use it overlap);
- a **non-renewable** resource is a budget for the whole project: ``Σ_i r_{i m_i k} ≤ R_k``.

Precedences ``(i, j, ℓ)`` are finish-to-start with a lag: ``S_j ≥ S_i + d_{i m_i} + ℓ`` (``ℓ`` may be
negative; the precedence graph must be acyclic). The makespan is ``C_max = max_i (S_i + d_{i m_i})``.
All data are integers, as in PSPLIB, so the CP-SAT and time-indexed models need no scaling; every
duration, lag, demand and capacity is at most :data:`MAX_VALUE` in size, so sums over a project
stay within CP-SAT's 64-bit integers.

Objects are frozen and validate themselves once (``ValueError`` naming the field and the value);
derived lookups (successors, topological order, time windows, bounds) are built on first use.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

__all__ = ["MAX_VALUE", "Activity", "Mode", "Project", "Resource", "find_cycle"]

#: Largest duration, |lag|, demand or capacity a project takes (10¹²): a million activities of
#: this size still sum below 2⁶³, the range of CP-SAT's integers.
MAX_VALUE = 10**12


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_amount(what: str, x: object) -> None:
    """Refuse anything but an integer in ``0 … MAX_VALUE`` (``what`` names the field)."""
    if not _is_int(x) or x < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {x!r}.")
    if x > MAX_VALUE:
        raise ValueError(f"{what} must be at most {MAX_VALUE:,} (MAX_VALUE), got {x!r}.")


def find_cycle(n: int, edges: Sequence[tuple[int, int]]) -> list[int] | None:
    """The indices into ``edges`` of one directed cycle among nodes ``0 … n-1`` (``None`` if
    there is none), in path order, starting at the cycle's smallest node; the last edge closes
    the cycle. A self-loop ``(i, i)`` is a cycle of one edge.

    Examples
    --------
    >>> find_cycle(3, [(0, 1), (1, 2), (2, 1)])
    [1, 2]
    """
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e, (i, j) in enumerate(edges):
        out[i].append((j, e))
    color = [0] * n  # 0 unseen, 1 on the current path, 2 done
    for root in range(n):
        if color[root]:
            continue
        # iterative depth-first search; path[k] = (node, index of its next out-edge, edge into it)
        path: list[list[int]] = [[root, 0, -1]]
        color[root] = 1
        while path:
            top = path[-1]
            node, k = top[0], top[1]
            if k == len(out[node]):
                color[node] = 2
                path.pop()
                continue
            top[1] += 1
            j, e = out[node][k]
            if color[j] == 0:
                color[j] = 1
                path.append([j, 0, e])
            elif color[j] == 1:  # back edge: the path from j to node, then e, is a cycle
                at = next(p for p, step in enumerate(path) if step[0] == j)
                cycle = [step[2] for step in path[at + 1 :]] + [e]
                nodes = [edges[c][0] for c in cycle]
                first = nodes.index(min(nodes))
                return cycle[first:] + cycle[:first]
    return None


@dataclass(frozen=True)
class Mode:
    """One way of running an activity.

    Parameters
    ----------
    duration
        ``0 ≤ d_im ≤ MAX_VALUE`` time units.
    demands
        ``0 ≤ r_imk ≤ MAX_VALUE`` per resource, in the order of :attr:`Project.resources`.
    """

    duration: int
    demands: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_amount("Mode duration", self.duration)
        demands = tuple(self.demands)
        for k, r in enumerate(demands):
            _check_amount(f"Mode demands[{k}]", r)
        object.__setattr__(self, "demands", demands)


@dataclass(frozen=True)
class Activity:
    """An activity with one or more modes (exactly one is chosen).

    Parameters
    ----------
    modes
        The alternatives ``M_i`` (at least one).
    name
        Label for messages and plots.
    """

    modes: tuple[Mode, ...]
    name: str = ""

    def __post_init__(self) -> None:
        modes = tuple(self.modes)
        if not modes:
            raise ValueError(f"Activity modes must not be empty (activity {self.name!r}).")
        for m, mode in enumerate(modes):
            if not isinstance(mode, Mode):
                raise ValueError(f"Activity modes[{m}] must be a Mode, got {mode!r}.")
        object.__setattr__(self, "modes", modes)


@dataclass(frozen=True)
class Resource:
    """A renewable (per-instant) or non-renewable (whole-project) resource.

    Parameters
    ----------
    capacity
        ``0 ≤ R_k ≤ MAX_VALUE``.
    renewable
        True for a capacity at every instant, False for a budget over the project.
    unary
        A device: renewable with capacity 1, modelled as a no-overlap constraint rather than a
        cumulative one (demands on it must then be 0 or 1).
    name
        Label for messages.
    """

    capacity: int
    renewable: bool = True
    unary: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        _check_amount("Resource capacity", self.capacity)
        if self.unary and not self.renewable:
            raise ValueError(f"Resource unary=True needs renewable=True (resource {self.name!r}).")
        if self.unary and self.capacity != 1:
            raise ValueError(f"Resource unary=True needs capacity 1, got capacity={self.capacity!r}.")


@dataclass(frozen=True)
class Project:
    """Activities, resources and lagged precedences; see the module docstring for the semantics.

    Parameters
    ----------
    activities
        The activities, indexed ``0 … n-1`` in this order.
    resources
        The resources, indexed ``0 … K-1``; every mode lists one demand per resource.
    precedences
        ``(pred, succ, lag)`` triples: ``S_succ ≥ S_pred + d_pred + lag``. A pair ``(pred, succ)``
        is read as lag 0.
    name
        Instance name (the PSPLIB file stem for read instances).

    Raises
    ------
    ValueError
        On a demand vector of the wrong length, a demand above 1 on a unary resource, a
        precedence naming an unknown activity or itself, a non-integer lag or one above
        :data:`MAX_VALUE` in size, or a cycle (the message lists it, 0-based).
    """

    activities: tuple[Activity, ...]
    resources: tuple[Resource, ...] = ()
    precedences: tuple[tuple[int, int, int], ...] = ()
    name: str = ""
    _order: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        acts = tuple(self.activities)
        res = tuple(self.resources)
        n, K = len(acts), len(res)
        for i, a in enumerate(acts):
            if not isinstance(a, Activity):
                raise ValueError(f"Project activities[{i}] must be an Activity, got {a!r}.")
            for m, mode in enumerate(a.modes):
                if len(mode.demands) != K:
                    raise ValueError(
                        f"Project activities[{i}].modes[{m}].demands has {len(mode.demands)} entries, "
                        f"expected one per resource ({K})."
                    )
                for k, r in enumerate(res):
                    if r.unary and mode.demands[k] > 1:
                        raise ValueError(
                            f"Project activities[{i}].modes[{m}].demands[{k}] = {mode.demands[k]} on "
                            f"unary resource {k} ({r.name!r}); a unary resource takes 0 or 1."
                        )
        for k, r in enumerate(res):
            if not isinstance(r, Resource):
                raise ValueError(f"Project resources[{k}] must be a Resource, got {r!r}.")
        precs = []
        for e, p in enumerate(self.precedences):
            p = tuple(p)
            if len(p) == 2:
                p = (*p, 0)
            if len(p) != 3 or not all(_is_int(x) for x in p):
                raise ValueError(f"Project precedences[{e}] must be (pred, succ, lag) integers, got {p!r}.")
            i, j, lag = p
            if abs(lag) > MAX_VALUE:
                raise ValueError(
                    f"Project precedences[{e}] = {p!r}: the lag must be at most {MAX_VALUE:,} "
                    "(MAX_VALUE) in size."
                )
            if not (0 <= i < n and 0 <= j < n):
                raise ValueError(f"Project precedences[{e}] = {p!r} names an activity outside 0..{n - 1}.")
            if i == j:
                raise ValueError(f"Project precedences[{e}] = {p!r} links activity {i} to itself.")
            precs.append(p)
        object.__setattr__(self, "activities", acts)
        object.__setattr__(self, "resources", res)
        object.__setattr__(self, "precedences", tuple(precs))
        object.__setattr__(self, "_order", self._topological_order())

    # ------------------------------------------------------------------ structure
    @property
    def num_activities(self) -> int:
        return len(self.activities)

    @property
    def num_resources(self) -> int:
        return len(self.resources)

    @cached_property
    def successors(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per activity, its ``(succ, lag)`` pairs."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.activities]
        for i, j, lag in self.precedences:
            out[i].append((j, lag))
        return tuple(tuple(s) for s in out)

    @cached_property
    def predecessors(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per activity, its ``(pred, lag)`` pairs."""
        out: list[list[tuple[int, int]]] = [[] for _ in self.activities]
        for i, j, lag in self.precedences:
            out[j].append((i, lag))
        return tuple(tuple(p) for p in out)

    @property
    def topological_order(self) -> tuple[int, ...]:
        """Activities so that every predecessor comes before its successors (smallest index first)."""
        return self._order

    def _topological_order(self) -> tuple[int, ...]:
        import heapq

        n = len(self.activities)
        indeg = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        for i, j, _ in self.precedences:
            indeg[j] += 1
            succ[i].append(j)
        heap = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            i = heapq.heappop(heap)
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, j)
        if len(order) != n:
            cycle = find_cycle(n, [(i, j) for i, j, _ in self.precedences]) or []
            path = [self.precedences[e][0] for e in cycle]
            shown = " → ".join(str(i) for i in [*path, path[0]])
            raise ValueError(
                f"Project precedences contain a cycle (through activity {path[0]}): {shown} "
                f"(entries {', '.join(str(e) for e in cycle)} of precedences)."
            )
        return tuple(order)

    @cached_property
    def renewable(self) -> tuple[int, ...]:
        """Indices of the renewable resources."""
        return tuple(k for k, r in enumerate(self.resources) if r.renewable)

    @cached_property
    def nonrenewable(self) -> tuple[int, ...]:
        """Indices of the non-renewable resources."""
        return tuple(k for k, r in enumerate(self.resources) if not r.renewable)

    def mode_fits(self, i: int, m: int) -> bool:
        """Whether mode ``m`` of activity ``i`` fits every capacity on its own (``r_imk ≤ R_k`` ∀k).

        A mode that does not fit can never be chosen; the models drop it.
        """
        d = self.activities[i].modes[m].demands
        return all(d[k] <= r.capacity for k, r in enumerate(self.resources))

    @cached_property
    def usable_modes(self) -> tuple[tuple[int, ...], ...]:
        """Per activity, the modes that :meth:`mode_fits` (may be empty: then no schedule exists)."""
        return tuple(
            tuple(m for m in range(len(a.modes)) if self.mode_fits(i, m))
            for i, a in enumerate(self.activities)
        )

    # ------------------------------------------------------------------ bounds and windows
    @cached_property
    def min_durations(self) -> tuple[int, ...]:
        """``d_i^min = min_{m usable} d_im`` (the smallest duration over all modes if none is usable)."""
        out = []
        for i, a in enumerate(self.activities):
            ms = self.usable_modes[i] or range(len(a.modes))
            out.append(min(a.modes[m].duration for m in ms))
        return tuple(out)

    @cached_property
    def earliest_starts(self) -> tuple[int, ...]:
        """Forward CPM with minimal durations: ``ES_j = max(0, max_{(i,j,ℓ)} ES_i + d_i^min + ℓ)``."""
        es = [0] * len(self.activities)
        d = self.min_durations
        for j in self._order:
            for i, lag in self.predecessors[j]:
                es[j] = max(es[j], es[i] + d[i] + lag)
        return tuple(es)

    @cached_property
    def tails(self) -> tuple[int, ...]:
        """Time that must still pass after ``S_i + d_i`` before the makespan:
        ``q_i = max(0, max_{(i,j,ℓ)} ℓ + d_j^min + q_j)``."""
        q = [0] * len(self.activities)
        d = self.min_durations
        for i in reversed(self._order):
            for j, lag in self.successors[i]:
                q[i] = max(q[i], lag + d[j] + q[j])
        return tuple(q)

    def critical_path_bound(self) -> int:
        """The longest path with minimal durations: ``LB_cp = max_i ES_i + d_i^min + q_i``.

        Every schedule has ``C_max ≥ LB_cp`` (resources are ignored).
        """
        d = self.min_durations
        return max((e + di + q for e, di, q in zip(self.earliest_starts, d, self.tails)), default=0)

    def energy_bound(self) -> int:
        """``LB_res = max_{k renewable, R_k>0} ⌈Σ_i min_m d_im·r_imk / R_k⌉`` (resource work / capacity)."""
        best = 0
        for k in self.renewable:
            cap = self.resources[k].capacity
            if cap <= 0:
                continue
            work = 0
            for i, a in enumerate(self.activities):
                ms = self.usable_modes[i] or range(len(a.modes))
                work += min(a.modes[m].duration * a.modes[m].demands[k] for m in ms)
            best = max(best, math.ceil(work / cap))
        return best

    def lower_bound(self) -> int:
        """``max(LB_cp, LB_res)``, the bound every engine starts from (STYLE: a critical-path bound)."""
        return max(self.critical_path_bound(), self.energy_bound())

    def trivial_horizon(self) -> int:
        """An upper bound on the optimal makespan: run the activities one at a time in topological
        order, each in its longest mode and after its largest positive incoming lag,

        ``H = Σ_i (max_m d_im + max(0, max_{(p,i,ℓ)} ℓ))``,

        which is feasible whenever some mode assignment is (no two activities ever overlap).
        """
        h = 0
        for i, a in enumerate(self.activities):
            lag = max((lag for _, lag in self.predecessors[i]), default=0)
            h += max(m.duration for m in a.modes) + max(0, lag)
        return h

    def latest_start(self, i: int, m: int, horizon: int) -> int:
        """``LS_im = H - d_im - q_i``: the latest start of ``i`` in mode ``m`` within horizon ``H``."""
        return horizon - self.activities[i].modes[m].duration - self.tails[i]

    # ------------------------------------------------------------------ schedules
    def makespan(self, starts: Sequence[int], modes: Sequence[int]) -> int:
        """``C_max = max_i S_i + d_{i m_i}`` of a schedule (0 for an empty project)."""
        acts = self.activities
        return max((s + acts[i].modes[m].duration for i, (s, m) in enumerate(zip(starts, modes))), default=0)

    @classmethod
    def single_mode(
        cls,
        durations: Iterable[int],
        demands: Iterable[Iterable[int]],
        capacities: Iterable[int],
        precedences: Iterable[tuple[int, ...]] = (),
        *,
        unary: Iterable[int] = (),
        name: str = "",
    ) -> Project:
        """Build a single-mode project from plain lists (``demands[i][k]``; ``unary`` lists the
        resource indices to treat as devices)."""
        unary = set(unary)
        res = tuple(Resource(c, unary=k in unary) for k, c in enumerate(capacities))
        acts = tuple(Activity((Mode(d, tuple(r)),)) for d, r in zip(durations, demands))
        return cls(acts, res, tuple(tuple(p) for p in precedences), name)  # type: ignore[arg-type]
