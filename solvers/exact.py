"""``method="cpsat"`` and ``method="milp"``: exact plan selection + scheduling (SPEC §9).

For every structural candidate (or the one given as ``structure=``) the candidate set ``C(v)``
is built from the directories — the strategies of the ``candidates`` fastest layouts of each
invocation (a training invocation's in each of its recomputation modes) at every aligned origin (``None``: the whole directory), plus the strategies of the
concurrent and greedy plans at every origin (as SA's ``candidates=k`` restriction keeps them), plus
the warm start's choices — and the exact
model of :mod:`rpeg.formulations.plan_model` is solved with the time left, split evenly over the
structures still to solve, in the order of their concurrent plans' makespans (the likely best
first), each with the shortest makespan known so far as its ``cutoff`` (a structure with no plan
shorter is "cut off"); the time left after the last one goes, once more and split the same way,
to the structures their share stopped without settling them. When every structure is settled — solved to optimality (or proven
infeasible), or stopped with a proven lower bound ``LB_y ≥ min_y' MS_y'``, the smallest model
makespan found over all structures (no plan of ``y`` can beat it; such structures are listed in
``extra["settled_by_bound"]``) — the result is ``optimal`` and its plan the one with the smallest
model makespan; otherwise it is the best plan found by the evaluator's
score — the engines' solutions and the warm starts alike. Like every method's, it is scored by
the evaluator (list scheduler), so its ``throughput`` is comparable with the heuristics'. The model's own makespan, its lower bound and the per-structure
outcomes are kept in ``Result.extra``; ``objective_bound`` is the throughput bound
``Keval·B·R·(Lp+Lr)/LB`` with ``LB`` the smallest lower bound over the structures.

"Optimal" means optimal over the candidate sets (and the time rounding of the engine); the
message says which candidate sets were used.

**Time limits.** One :class:`~rpeg.formulations.deadline.Deadline` is computed from
:func:`~rpeg.solvers.solve.solve`'s entry (:attr:`Problem.started`). The engine's libraries (OR-Tools,
Pyomo and HiGHS: a second on an idle machine, tens of seconds after memory pressure) are imported
in a background thread while the structures are prepared and their concurrent plans pooled as
fallbacks; the method waits for them only as long as the limit allows, and when they are not
loaded in time it returns the best fallback with status ``time_limit`` and a message saying
so. Each structure gets the time left divided by the structures still to do, and *everything*
it does counts against that share: the warm start, the candidate pairs, building the model (the
builders check the deadline as they go), handing it to the solver, and the solve (the engine is
given only what is left). Every memory-feasible warm start is kept as a fallback, compared with
the engines' solutions (its evaluator makespan bounds its model makespan from above), so the
method always returns at least its best warm start: with status ``time_limit`` when a model was
too large to build in its share ("model too large to build in N s; returned the warm-start
plan"), when the engine found nothing better in time, or after Ctrl-C (which stops the method
with the best plan so far, as ``sa`` does). The candidate directories may take half of the
limit (:data:`~rpeg.scoring.candidates.BUILD_SHARE`): a vertex whose directory is not built by
then gets a lean one (:func:`~rpeg.scoring.candidates.lean_directory`), and a structure solved
over lean candidates is neither optimal nor proven infeasible: the result has status
``time_limit`` and says which directories were lean.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..formulations.deadline import BuildTimeout, Deadline
from ..formulations.plan_cpsat import solve_plan_cpsat
from ..formulations.plan_model import PlanSolution, build_plan_instance, candidate_sets
from ..formulations.pyomo_backend import MILP_SOLVERS, SolverUnavailableError
from ..heuristics.baselines import Infeasible, check_directories, concurrent_plan, greedy_plan
from ..ir.errors import check_type
from ..ir.plan import Choice, Plan
from ..ir.templates import Structure, build_graph
from ..ir.templates import structures as all_structures
from ..scoring.candidates import BUILD_SHARE, Directory, TimeUp, build_directories, lean_message
from ..scoring.evaluator import Evaluator
from .result import Result, Status
from .solve import Problem, check_structure_arg, register, solve

__all__ = ["DEFAULT_TIME_LIMIT", "solve_exact"]

DEFAULT_TIME_LIMIT = 60.0
#: Least share of the time limit left for a second pass over the structures their share stopped.
REVISIT_SHARE = 0.1


class _Interrupted(Exception):
    """Ctrl-C reached the method (inside an engine, or in the warm start's own search)."""


def solve_exact(
    problem: Problem,
    engine: str,
    engine_fn: Callable[..., PlanSolution],
    *,
    candidates: int | Sequence[Sequence[Choice]] | None = 3,
    structure: Structure | None = None,
    warm_start: str | Plan | None = "concurrent",
    threads: int | None = None,
    engine_options: dict[str, Any] | None = None,
) -> Result:
    """Run an exact plan-selection engine over the structures (see the module docstring).

    Parameters
    ----------
    problem
        Workload, cluster, ``k_eval``, seed and time limit (default 60 s), which covers
        everything from the warm start to the last solve.
    engine
        Method name for the result (``"cpsat"`` or ``"milp"``).
    engine_fn
        ``engine_fn(instance, time_limit=, seed=, threads=, hint=, deadline=, **engine_options)``.
    candidates
        The strategies of the ``k`` fastest layouts per invocation (each in every recomputation
        mode the directory kept; at every origin), ``None`` for all, or explicit
        candidate lists per vertex (only with one ``structure``).
    structure
        Solve only this structural candidate.
    warm_start
        ``"concurrent"``, ``"sa"`` (a short SA run restricted to the structure, 20% of its
        time), a :class:`Plan`, or ``None``; its choices join the candidate sets and hint the
        engine, and a memory-feasible warm start is the fallback returned when the engine has
        nothing better in time.
    threads
        Engine threads.
    engine_options
        Further keyword arguments of ``engine_fn`` (``unit``, ``solver``).

    Returns
    -------
    Result
        Status ``optimal`` (proven over the candidate sets), ``time_limit`` (the best plan
        found — at least the best memory-feasible warm start — when the limit or Ctrl-C stopped
        an engine or a model could not be built in time; ``Result.message`` says which),
        ``feasible`` (a plan, but an engine stopped without a proof before the limit), or,
        without a plan: ``infeasible`` (proven), ``time_limit``, ``error`` (an engine failed) or
        ``unknown`` (an engine stopped with neither a plan nor a proof).

    Raises
    ------
    ValueError
        For a bad option (the message names it).
    """
    _check_options(problem, candidates, structure, warm_start, threads, engine, engine_options or {})
    t0 = problem.started  # solve()'s entry: what came before this call counts too
    limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT
    deadline = Deadline(limit, start=t0)
    # the engine's import (a second or more) runs while the structures are prepared
    loader = _EngineLoader(engine, (engine_options or {}).get("solver"))
    ys = [structure] if structure is not None else all_structures(problem.workload)
    search = _Search(
        problem,
        engine_fn,
        candidates,
        warm_start,
        threads,
        engine_options or {},
        build_at=t0 + BUILD_SHARE * limit,  # past it, the directories not built stay lean
    )
    try:
        order = search.order(ys, deadline)
        if not loader.wait(deadline.remaining()):
            search.unloaded = (
                f"{engine}'s solver libraries did not finish loading within the time limit ({limit:g} s)"
            )
        for n, i in enumerate(order):
            y = ys[i]
            if deadline.expired() and search.pool:
                search._outcome({"structure": y.label, "status": "skipped", "reason": "no time left"})
                search.bounds[i] = 0.0
                continue
            search.structure(i, y, deadline.within(deadline.remaining() / (len(ys) - n)))
        # the time the others left over goes to the structures their share stopped, once more
        # (not when less than a tenth of the limit is left: the evaluator, directories and warm
        # start of a structure are built before its share is first checked)
        again = search.unsettled(order, ys)
        for n, i in enumerate(again):
            if deadline.remaining() < REVISIT_SHARE * limit:
                break
            search.structure(i, ys[i], deadline.within(deadline.remaining() / (len(again) - n)))
    except (KeyboardInterrupt, _Interrupted):
        search.interrupted = True
    rank = {y.label: i for i, y in enumerate(ys)}
    search.outcomes.sort(key=lambda o: rank[o["structure"]])  # reported in the structures' order
    cand_note = _candidates_note(candidates)
    extra: dict[str, Any] = {
        "structures": search.outcomes,
        "candidates": cand_note,
        "time_limit_s": limit,
        "interrupted": search.interrupted,
    }
    done = len(search.outcomes) == len(ys) and not search.interrupted
    if not search.pool:
        return _without_plan(problem, ys[0], search, done, engine, cand_note, limit, extra, t0)
    return _best_plan(problem, search, done, len(ys), engine, cand_note, limit, extra, t0)


def _check_options(
    problem: Problem,
    candidates: object,
    structure: object,
    warm_start: object,
    threads: object,
    engine: str,
    engine_options: dict[str, Any],
) -> None:
    """Types and values of :func:`solve_exact`'s options, before any work.

    Raises
    ------
    TypeError, ValueError
        Naming the option and the value.
    SolverUnavailableError
        For a MILP ``solver`` that is known but not installed (what to install).
    """
    if structure is not None:
        check_structure_arg("structure", structure, problem.workload)
    if isinstance(warm_start, str):
        if warm_start not in ("concurrent", "sa"):
            raise ValueError(f"warm_start must be 'concurrent', 'sa', a Plan or None, got {warm_start!r}")
    elif warm_start is not None:
        check_type("warm_start", warm_start, Plan, "'concurrent', 'sa', a rpeg.Plan or None")
        if structure is not None and len(warm_start) != len(
            build_graph(problem.workload, structure).vertices
        ):
            raise ValueError(
                f"warm_start plan has {len(warm_start)} choices, structure {structure.label} has "
                f"{len(build_graph(problem.workload, structure).vertices)} vertices"
            )
    if threads is not None:
        check_type("threads", threads, int, "a positive integer or None")
    if isinstance(candidates, (bool, float, str, bytes)) or (
        candidates is not None and not isinstance(candidates, (int, Sequence))
    ):
        raise TypeError(
            f"candidates must be a positive integer, None or candidate lists, got "
            f"{type(candidates).__name__} {candidates!r}"
        )
    unit = engine_options.get("unit")
    if unit is not None:
        check_type("unit", unit, (int, float), "a positive number of seconds or None")
        if not (math.isfinite(unit) and unit > 0):
            raise ValueError(f"unit must be a positive finite number of seconds, got {unit!r}")
    if engine == "milp":
        solver = engine_options.get("solver", "highs")
        check_type("solver", solver, str, "a MILP solver name such as 'highs'")
        known = MILP_SOLVERS.get(solver.lower())
        if known is not None and not (backend := known()).available():
            raise SolverUnavailableError(
                f"MILP solver {solver!r} is not available; to use it, {backend.install}."
            )
    if candidates is not None and not isinstance(candidates, int) and structure is None:
        raise ValueError("explicit candidate lists need structure= (they belong to one graph)")
    if isinstance(candidates, int) and candidates < 1:
        raise ValueError(
            f"candidates must be a positive integer, None or candidate lists, got {candidates!r}"
        )


def _candidates_note(candidates: int | Sequence[Sequence[Choice]] | None) -> str:
    """Which candidate sets were used, for the messages."""
    if candidates is None:
        return "whole directories"
    if isinstance(candidates, int):
        return (
            f"the {candidates} fastest strategies per invocation and the concurrent and greedy plans' "
            "strategies at every origin (layouts, in each recomputation mode)"
        )
    return "the given candidate lists"


#: ``(evaluator makespan, 0 = engine solution | 1 = warm start, structure index, evaluator, plan,
#: the engine's solution or None)``
_Entry = tuple[float, int, int, Evaluator, Plan, PlanSolution | None]


@dataclass
class _Search:
    """What :func:`solve_exact` gathers structure by structure."""

    problem: Problem
    engine_fn: Callable[..., PlanSolution]
    candidates: int | Sequence[Sequence[Choice]] | None
    warm_start: str | Plan | None
    threads: int | None
    engine_options: dict[str, Any]
    #: per structure: its label, status word, and what the engine reported
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    #: the engines' solutions and the memory-feasible warm starts
    pool: list[_Entry] = field(default_factory=list)
    #: the engines' lower bounds on the makespan per structure index (0 where nothing was proven)
    bounds: dict[int, float] = field(default_factory=dict)
    #: "model too large to build" messages
    too_large: dict[int, str] = field(default_factory=dict)
    interrupted: bool = False
    #: why no engine ran: its libraries did not load within the time limit ("" when they did)
    unloaded: str = ""
    #: structure index → (evaluator, directories) built by :meth:`order`
    prepared: dict[int, tuple[Evaluator, list[Directory]]] = field(default_factory=dict)
    #: the ``time.monotonic()`` instant past which directories not yet built stay lean
    build_at: float | None = None
    #: structure index → what its lean directories leave out (:func:`lean_message`; only those with some)
    lean: dict[int, str] = field(default_factory=dict)

    def directories(self, i: int, ev: Evaluator) -> list[Directory]:
        """Structure ``i``'s directories (lean ones past :attr:`build_at`, noted in :attr:`lean`).

        Raises
        ------
        TimeUp
            When a fallback is pooled already and :attr:`build_at` passes before the lean
            directories of ``i``'s new vertices are built: only the first structure's floor is
            built whatever the time (:func:`~rpeg.scoring.candidates.build_directories`).
        """
        dirs = build_directories(ev.costs, self.build_at, floor=not self.pool)
        note = lean_message(ev.costs, dirs)
        if note:
            self.lean[i] = note
        else:
            self.lean.pop(i, None)
        return dirs

    def order(self, ys: list[Structure], deadline: Deadline) -> list[int]:
        """The order to solve the structures in: by the evaluator's makespan of their concurrent
        plan (infeasible ones last), so that the likely best structure is solved first and its
        makespan cuts the others off (:meth:`cutoff`). Each structure's evaluator and
        directories are kept for :meth:`structure`, and each memory-feasible concurrent plan
        joins the pool of fallbacks.

        Preparing a structure takes a fraction of a second at 16 GPUs (its evaluator and
        directories); once ``deadline`` has expired with a fallback pooled, the structures not yet
        prepared are ranked last in their own order (the caller then skips them), so a short
        limit is not overrun by preparing all of them first. A single structure is prepared too:
        its concurrent plan is the fallback while the engine's libraries load."""
        ranks = [math.inf] * len(ys)
        for i, y in enumerate(ys):
            if self.pool and deadline.expired():
                break
            ev = self.problem.evaluator(y)
            try:
                dirs = self.directories(i, ev)
            except TimeUp:  # past the build share: ranked last with the rest, and skipped
                break
            self.prepared[i] = (ev, dirs)
            try:
                plan = concurrent_plan(ev, dirs)
                r = ev.evaluate(plan)
            except Infeasible:
                continue
            ranks[i] = r.makespan if r.feasible else math.inf
            if r.feasible:  # a fallback from the start (Ctrl-C may come before any engine runs)
                self.pool.append((r.makespan, 1, i, ev, plan, None))
        return sorted(range(len(ys)), key=lambda i: (ranks[i], i))

    def _outcome(self, outcome: dict[str, Any]) -> None:
        """Record a structure's outcome, replacing an earlier one of the same structure."""
        self.outcomes = [o for o in self.outcomes if o["structure"] != outcome["structure"]]
        self.outcomes.append(outcome)

    def unsettled(self, order: list[int], ys: list[Structure]) -> list[int]:
        """The structures (in ``order``) that their share stopped (status ``time_limit`` or
        ``skipped``) with a lower bound below the shortest makespan found: worth the time left."""
        known = self.cutoff()
        by_label = {o["structure"]: o for o in self.outcomes}
        out = []
        for i in order:
            o = by_label.get(ys[i].label)
            if o is None or o.get("status") not in (Status.TIME_LIMIT.value, "skipped"):
                continue
            if known is not None and o.get("lower_bound", 0.0) >= known * (1 - 1e-9):
                continue
            out.append(i)
        return out

    def cutoff(self) -> float | None:
        """The shortest makespan known so far: an engine's model makespan, or a warm start's
        evaluator makespan (``None`` before any). A later structure needs no plan longer than
        this; its engine takes it as its horizon."""
        known = [e[5].makespan if e[1] == 0 else e[0] for e in self.pool]
        return min(known) if known else None

    def structure(self, i: int, y: Structure, share: Deadline) -> None:
        """Warm start, candidate sets, instance and engine run of structure ``i`` (``y``), all
        within ``share``.

        Raises
        ------
        _Interrupted
            When Ctrl-C stopped the warm start or the engine (what they found is pooled first).
        """
        problem = self.problem
        cutoff = self.cutoff()
        if i in self.prepared:
            ev, dirs = self.prepared.pop(i)
        else:
            ev = problem.evaluator(y)
            try:
                dirs = self.directories(i, ev)
            except TimeUp:
                why = "no time left to build its candidates (past the build share of the limit)"
                self._outcome({"structure": y.label, "status": "skipped", "reason": why})
                self.bounds[i] = 0.0
                return
        try:
            check_directories(ev, dirs)  # a lean directory is empty only when the full one is
        except Infeasible as exc:
            self._outcome({"structure": y.label, "status": "infeasible", "reason": str(exc)})
            return
        hint, stopped = _warm_start(problem, ev, dirs, y, self.warm_start, share)
        if hint is not None:
            hint_ms = ev.evaluate(hint)
            if hint_ms.feasible:
                self.pool.append((hint_ms.makespan, 1, i, ev, hint, None))
        if stopped:
            raise _Interrupted
        outcome: dict[str, Any] = {"structure": y.label}
        if i in self.lean:
            outcome["lean"] = self.lean[i]
        self._outcome(outcome)
        self.too_large.pop(i, None)
        if share.expired() or self.unloaded:
            why = self.unloaded or "no time left after the warm start"
            outcome.update(status="skipped", reason=why)
            self.bounds[i] = 0.0
            return
        try:
            if self.candidates is None or isinstance(self.candidates, int):
                cands = candidate_sets(
                    ev, dirs, self.candidates, include=hint, everywhere=_baselines(ev, dirs)
                )
            else:
                cands = [list(c) for c in self.candidates]
            inst = build_plan_instance(ev, cands, share)
        except BuildTimeout as exc:
            outcome.update(status="time_limit", reason=str(exc))
            self.too_large[i] = str(exc)
            self.bounds[i] = 0.0
            return
        sol = self.engine_fn(
            inst,
            time_limit=share.limit(),
            seed=problem.seed,
            threads=self.threads,
            hint=hint,
            deadline=share,
            cutoff=cutoff,
            **self.engine_options,
        )
        self._record(outcome, sol, cands, i, ev)
        if sol.interrupted:
            raise _Interrupted

    def _record(self, outcome: dict[str, Any], sol: PlanSolution, cands: list, i: int, ev: Evaluator) -> None:
        """Keep the engine's outcome, its bound and its plan."""
        outcome.update(
            {
                "status": "cut off" if sol.cut_off else Status(sol.status).value,
                "makespan": sol.makespan if math.isfinite(sol.makespan) else None,  # JSON has no inf
                "lower_bound": sol.lower_bound,
                "runtime_s": sol.runtime,
                "time_to_first_s": sol.time_to_first,
                "candidates": [len(c) for c in cands],
            }
        )
        if sol.message:
            outcome["reason"] = sol.message
            if sol.message.startswith("model too large"):
                self.too_large[i] = sol.message
        if sol.status != Status.INFEASIBLE or sol.cut_off:
            self.bounds[i] = sol.lower_bound
        if sol.plan is not None:
            self.pool.append((ev.evaluate(sol.plan).makespan, 0, i, ev, sol.plan, sol))

    def limited(self) -> bool:
        """Whether the time limit or Ctrl-C stopped some part of the search."""
        return (
            self.interrupted
            or bool(self.too_large)
            or bool(self.lean)
            or any(o.get("status") in (Status.TIME_LIMIT.value, "skipped") for o in self.outcomes)
        )

    def engine_statuses(self) -> list[str]:
        """The engines' status words other than ``optimal`` and ``infeasible``, in order, once each."""
        out: list[str] = []
        for o in self.outcomes:
            st = o.get("status")
            if st is not None and st not in ("optimal", "infeasible", "cut off") and st not in out:
                out.append(st)
        return out


def _without_plan(
    problem: Problem,
    y: Structure,
    search: _Search,
    done: bool,
    engine: str,
    cand_note: str,
    limit: float,
    extra: dict[str, Any],
    t0: float,
) -> Result:
    """The result when neither an engine nor a warm start gave a plan: ``INFEASIBLE`` when every
    structure was proven infeasible, ``TIME_LIMIT`` when the limit or Ctrl-C stopped the search,
    else ``ERROR`` (an engine failed) or ``UNKNOWN``."""
    outcomes = search.outcomes
    runtime = time.monotonic() - t0
    # over lean candidates (the directories the time limit cut short) nothing is proven
    proven = done and not search.lean and all(o.get("status") == "infeasible" for o in outcomes)
    reasons = [o["reason"] for o in outcomes if o.get("status") == "infeasible" and "reason" in o]
    statuses = search.engine_statuses()
    if proven:
        status = Status.INFEASIBLE
        msg = (
            reasons[0]
            if reasons and len(reasons) == len(outcomes)
            else "no memory-feasible plan exists within " + cand_note
        )
    elif search.interrupted:
        status, msg = Status.TIME_LIMIT, "interrupted (Ctrl-C) before any plan was found"
    elif search.limited():
        status, msg = Status.TIME_LIMIT, f"no plan found within the time limit ({limit:g} s) over {cand_note}"
        if search.lean:
            msg += "; " + next(iter(search.lean.values()))
    else:
        status = Status.ERROR if Status.ERROR.value in statuses else Status.UNKNOWN
        why = next((o["reason"] for o in outcomes if o.get("status") == status.value and "reason" in o), "")
        msg = f"{engine} ended with status {status.value} and no plan over {cand_note}" + (
            f": {why}" if why else ""
        )
    return Result.infeasible(
        problem.evaluator(y), engine, msg, runtime_s=runtime, status=status, evaluations=0, extra=extra
    )


def _best_plan(
    problem: Problem,
    search: _Search,
    done: bool,
    n_structures: int,
    engine: str,
    cand_note: str,
    limit: float,
    extra: dict[str, Any],
    t0: float,
) -> Result:
    """The result with a plan: the model's proven optimum when every structure was solved to
    optimality or is settled by its lower bound (module docstring), else the best plan in the pool by the evaluator's score (``TIME_LIMIT`` when the
    limit or Ctrl-C stopped the search, ``FEASIBLE`` when an engine stopped without a proof)."""
    pool, outcomes = search.pool, search.outcomes
    work = problem.k_eval * problem.workload.tokens_per_step
    bounds = list(search.bounds.values())
    bound = work / min(bounds) if done and bounds and min(bounds) > 0 else None
    # a structure is settled when its engine proved it (optimal, infeasible, or no plan shorter
    # than the cutoff it was given: a makespan achieved before), or when its proven lower bound
    # is no smaller than the best model makespan of any structure (none of its plans can beat it)
    settled = ("optimal", "infeasible", "cut off")
    best = min((e[5].makespan for e in pool if e[1] == 0), default=math.inf)
    by_bound = [
        o["structure"]
        for o in outcomes
        if o.get("status") not in settled and o.get("lower_bound", 0.0) >= best * (1 - 1e-9)
    ]
    all_optimal = (
        done
        and not search.lean  # optimal over lean candidates is not optimal over the directories
        and math.isfinite(best)
        and all(o.get("status") in settled or o["structure"] in by_bound for o in outcomes)
    )
    if all_optimal and by_bound:
        extra["settled_by_bound"] = by_bound
    if all_optimal:  # the proven optimum of the model, whatever the evaluator makes of it
        _, source, _, ev, plan, sol = min((e for e in pool if e[1] == 0), key=lambda e: (e[5].makespan, e[2]))
        status = Status.OPTIMAL
    else:  # unproven: the best plan by the evaluator's score, never worse than a warm start
        _, source, _, ev, plan, sol = min(pool, key=lambda e: e[:3])
        status = Status.TIME_LIMIT if search.limited() else Status.FEASIBLE
    evaluation = ev.evaluate(plan, keep=True)
    if sol is not None:
        extra.update(
            {
                "model_makespan": sol.makespan,
                "model_throughput": work / sol.makespan if sol.makespan > 0 else math.inf,
            }
        )
        evaluation = _follow_model(ev, plan, sol, evaluation, extra)
    extra["returned"] = "engine" if source == 0 else "warm_start"
    msg = _message(status, source, search, limit, n_structures, engine, cand_note)
    if search.lean:
        msg += "; " + next(iter(search.lean.values()))
    return Result.scored(
        ev,
        plan,
        status,
        engine,
        runtime_s=time.monotonic() - t0,
        evaluation=evaluation,
        evaluations=ev.evaluations,  # the evaluator scored the warm starts and the final plan
        objective_bound=bound,
        message=msg,
        extra=extra,
    )


def _follow_model(ev: Any, plan: Any, sol: Any, evaluation: Any, extra: dict[str, Any]) -> Any:
    """The evaluation the result reports: the plan list-scheduled in the order of the engine's
    own schedule (``Evaluator.evaluate(..., starts=sol.starts)``; it finishes no later than the
    model's, whose durations are rounded up to ticks) when that is shorter than the EST-first
    list schedule, which would otherwise lose part of the proven gain silently. ``extra`` records
    both makespans (``list_makespan``, ``followed_makespan``), which one the result reports
    (``schedule``: ``"model"`` or ``"list"``) and, for ``"model"``, the starts followed
    (``model_starts``: ``[kind, vertex, source, step, phase, start]`` per node), which
    :meth:`Result.from_json` follows again."""
    extra["list_makespan"] = evaluation.makespan
    extra["schedule"] = "list"
    if not sol.starts:
        return evaluation
    try:
        followed = ev.evaluate(plan, keep=True, starts=sol.starts)
    except ValueError as exc:  # the model left a node of the lowering out: keep the list schedule
        extra["schedule_note"] = str(exc)
        return evaluation
    extra["followed_makespan"] = followed.makespan
    if followed.makespan >= evaluation.makespan:
        return evaluation
    extra["schedule"] = "model"
    extra["model_starts"] = [[*k, v] for k, v in sorted(sol.starts.items(), key=lambda kv: (kv[1], kv[0]))]
    return followed


def _baselines(ev: Evaluator, dirs: list[Directory]) -> list[Plan]:
    """The concurrent and the greedy plan over ``dirs`` (those that exist): their strategies join
    the candidate sets at every origin, as SA's ``candidates=k`` restriction keeps them, so that
    ``candidates=k`` means the same space for both."""
    plans = []
    for baseline in (concurrent_plan, greedy_plan):
        with contextlib.suppress(Infeasible):
            plans.append(baseline(ev, dirs))
    return plans


#: The modules each engine imports on first use.
_ENGINE_MODULES = {
    "cpsat": ("ortools.sat.python.cp_model",),
    "milp": ("pyomo.environ", "pyomo.contrib.appsi.solvers.highs"),
}


def _preload(engine: str, solver: str | None = None) -> None:
    """Import the engine's libraries (OR-Tools CP-SAT pulls in pandas: about a second on a
    loaded machine; Pyomo and highspy about half that) and, for ``milp``, check that ``solver``
    is one Pyomo can run."""
    import importlib

    for name in _ENGINE_MODULES.get(engine, ()):
        importlib.import_module(name)
    if engine == "milp":
        from ..formulations.pyomo_backend import backend

        backend(solver or "highs")


class _EngineLoader:
    """:func:`_preload` in a background thread (none when the modules are already imported),
    so that the import runs while the structures are prepared and a time limit shorter than
    the import is still kept (module docstring, "Time limits").

    The thread is a daemon: a process that got its result before the import finished does not
    wait for it at exit.
    """

    def __init__(self, engine: str, solver: str | None) -> None:
        self.error: BaseException | None = None
        self._done = threading.Event()
        if all(name in sys.modules for name in _ENGINE_MODULES.get(engine, ())):
            self._run(engine, solver)  # only the solver check is left: a few milliseconds
            return
        threading.Thread(
            target=self._run, args=(engine, solver), name=f"rpeg-load-{engine}", daemon=True
        ).start()

    def _run(self, engine: str, solver: str | None) -> None:
        try:
            _preload(engine, solver)
        except BaseException as exc:  # handed to the caller by wait()
            self.error = exc
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        """Whether the libraries loaded within ``seconds``.

        Raises
        ------
        Exception
            What the import or the solver check raised (an unknown or missing MILP solver).
        """
        done = self._done.wait(None if math.isinf(seconds) else max(0.0, seconds))
        if done and self.error is not None:
            raise self.error
        return done


def _message(
    status: Status,
    source: int,
    search: _Search,
    limit: float,
    n_structures: int,
    engine: str,
    cand_note: str,
) -> str:
    """The result's message: what was proven, or why the method stopped and what it returned."""
    if status is Status.OPTIMAL:
        return f"proven optimal over {cand_note}"
    what = "the best plan so far" if source == 0 else "returned the warm-start plan"
    if search.interrupted:
        return f"interrupted (Ctrl-C); {what}"
    if search.unloaded:
        return f"{search.unloaded}; {what}"
    if search.too_large:
        # "model too large to build in N s (stopped while …)": keep the first, count the rest
        first = next(iter(search.too_large.values())).split(" (")[0]
        many = f" for {len(search.too_large)} of {n_structures} structures" if n_structures > 1 else ""
        return f"{first}{many} (time limit {limit:g} s); {what}"
    if status is Status.FEASIBLE:
        statuses = ", ".join(search.engine_statuses()) or "no plan"
        return f"{engine} stopped without proving optimality over {cand_note} (status {statuses}); {what}"
    if source == 1:
        if search.outcomes and all(o.get("status") == "skipped" for o in search.outcomes):
            return (
                f"the time limit ({limit:g} s) ran out while the structures were prepared, before "
                f"{engine} built a model; returned the warm-start plan"
            )
        return (
            f"{engine} found no better plan within the time limit ({limit:g} s); returned the warm-start plan"
        )
    return f"time limit ({limit:g} s) reached before proving optimality over {cand_note}; best plan so far"


def _warm_start(
    problem: Problem,
    ev: Evaluator,
    dirs: list[Directory],
    y: Structure,
    how: str | Plan | None,
    share: Deadline,
) -> tuple[Plan | None, bool]:
    """The warm-start plan of structure ``y`` (``None``: none), within ``share``, and whether
    Ctrl-C stopped it (the SA warm start then returns its best plan so far with status
    ``time_limit``; the caller stops after pooling that plan)."""
    if how is None:
        return None, False
    if isinstance(how, Plan):
        if len(how) != len(ev.graph.vertices):
            raise ValueError(
                f"warm_start plan has {len(how)} choices, structure {y.label} has "
                f"{len(ev.graph.vertices)} vertices"
            )
        return how, False
    if how == "concurrent":
        try:
            return concurrent_plan(ev, dirs), False
        except Infeasible:
            return None, False
    left = share.remaining()
    seconds = 10.0 if math.isinf(left) else max(0.05, min(max(0.2, 0.2 * left), left))
    r = solve(
        problem.workload,
        problem.cluster,
        method="sa",
        time_limit=seconds,
        seed=problem.seed,
        k_eval=problem.k_eval,
        structures=[y],
    )
    return r.plan, r.status is Status.TIME_LIMIT  # SA says time_limit only when Ctrl-C stopped it


@register("cpsat")
def _cpsat(problem: Problem, **options: Any) -> Result:
    """Exact plan selection with OR-Tools CP-SAT (options: see :func:`solve_exact`; ``unit``)."""
    engine_options = {k: options.pop(k) for k in ("unit",) if k in options}
    _check(options, "cpsat")
    return solve_exact(problem, "cpsat", solve_plan_cpsat, engine_options=engine_options, **options)


def _check(options: dict[str, Any], name: str) -> None:
    known = {"candidates", "structure", "warm_start", "threads"}
    unknown = set(options) - known
    if unknown:
        extra = {"cpsat": {"unit"}, "milp": {"solver"}}[name]
        raise ValueError(
            f"method {name!r} takes no option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known | extra))}"
        )


@register("milp")
def _milp(problem: Problem, **options: Any) -> Result:
    """Exact plan selection as a Pyomo MILP (options: see :func:`solve_exact`; ``solver``, default
    ``"highs"``)."""
    from ..formulations.plan_milp import solve_plan_milp

    engine_options = {"solver": options.pop("solver", "highs")}
    _check(options, "milp")
    return solve_exact(problem, "milp", solve_plan_milp, engine_options=engine_options, **options)
