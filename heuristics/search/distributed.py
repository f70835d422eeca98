"""Independent annealing chains on a Ray cluster (``backend="ray"``), merged on the driver.

For searches bigger than one machine. Each chain is one Ray task that builds its own
:class:`~rpeg.heuristics.search.anneal.Anneal` (seed ``seed + i``, its share of the budget, no
polish), runs it and sends back plain data only: its best plan and its elite plans, each with the
structure it belongs to. The driver offers these plans, in chain order, to a fresh local search
(seed ``seed``) by evaluating them there, so every score comes from one scorer, and then polishes
the best with the share of the budget held back for it.

Budget split for a time limit ``T``, an evaluation budget ``E``, a polish share ``p`` and ``C``
chains (SPEC §8 reserves ``p`` of the budget for the polish in the same way)::

    each chain    T·(1 − p) seconds,  max(1, ⌊(E − ⌊p·E⌋) / C⌋) evaluations
    the driver    T·p seconds,        ⌊p·E⌋ evaluations for the polish,
                                      plus one per distinct plan the chains sent back

With an evaluation budget (and no binding time limit) the same seed and number of chains give the
same plan: each chain is deterministic, and chains are merged in index order, so between plans of
equal score the one from the lower chain index is kept.

Ray is imported only when a search runs here; every node must have ``rpeg`` installed (the same
version as the driver).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...ir.plan import Plan
from ...ir.templates import Structure
from .anneal import Anneal, Outcome, Raw
from .stop import Budget

__all__ = ["BudgetShare", "ChainResult", "merge", "ray_search", "run_chain", "split_budget"]

#: ``build(seed=, seconds=, evaluations=, polish=, progress=) -> Anneal``; it travels to the Ray
#: workers, so it must pickle (a ``functools.partial`` of a module-level function does).
Build = Callable[..., Anneal]

MISSING_RAY = "backend='ray' needs the ray package: pip install 'rpeg[ray]'"


@dataclass(frozen=True)
class ChainResult:
    """What one chain sends back to the driver: plain, picklable data and no search state.

    Attributes
    ----------
    index, seed
        The chain's position and the seed of its search.
    evaluations
        Uncached evaluations it spent.
    seconds
        Wall-clock seconds it ran (building its search included).
    host
        Name of the machine it ran on.
    best
        ``(structure, plan, raw)`` of its best memory-feasible plan, or ``None``.
    elites
        ``(structure, plan)`` of its elite plans, per vertex set, best first.
    reason
        Why it found nothing feasible (empty otherwise).
    """

    index: int
    seed: int
    evaluations: int
    seconds: float
    host: str
    best: tuple[Structure, Plan, Raw] | None
    elites: tuple[tuple[Structure, Plan], ...]
    reason: str = ""

    def plans(self) -> list[tuple[Structure, Plan]]:
        """The plans to merge, in order: the best first, then the elites."""
        head = [] if self.best is None else [(self.best[0], self.best[1])]
        return head + list(self.elites)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary for ``Result.extra["chains"]``."""
        return {
            "index": self.index,
            "seed": self.seed,
            "evaluations": self.evaluations,
            "seconds": round(self.seconds, 3),
            "host": self.host,
            "best_throughput": None if self.best is None else self.best[2].throughput,
            "structure": None if self.best is None else self.best[0].label,
        }


@dataclass(frozen=True)
class BudgetShare:
    """How a budget is divided between the chains and the driver's polish (module docstring).

    ``None`` means unlimited in that dimension.
    """

    chain_seconds: float | None
    chain_evaluations: int | None
    polish_seconds: float | None
    polish_evaluations: int | None


def split_budget(
    seconds: float | None, evaluations: int | None, chains: int, polish_share: float
) -> BudgetShare:
    """Divide ``seconds`` and ``evaluations`` between ``chains`` chains and a polish.

    Each chain gets ``(1 − p)·T`` seconds and ``max(1, ⌊(E − ⌊p·E⌋) / C⌋)`` evaluations; the
    polish gets ``p·T`` seconds and ``⌊p·E⌋`` evaluations, with ``p = polish_share`` (``0`` when
    the polish is off).

    Raises
    ------
    ValueError
        If ``chains`` is not a positive integer, ``polish_share`` is outside ``[0, 1)``, or the
        budget is empty in both dimensions.
    """
    if not isinstance(chains, int) or chains < 1:
        raise ValueError(f"chains must be a positive integer, got {chains!r}")
    if not 0.0 <= polish_share < 1.0:
        raise ValueError(f"polish_share must be in [0, 1), got {polish_share!r}")
    if seconds is None and evaluations is None:
        raise ValueError("a search budget needs time_limit or max_evaluations")
    chain_s = polish_s = None
    if seconds is not None:
        chain_s, polish_s = seconds * (1.0 - polish_share), seconds * polish_share
    chain_e = polish_e = None
    if evaluations is not None:
        polish_e = int(polish_share * evaluations)
        chain_e = max(1, (evaluations - polish_e) // chains)
    return BudgetShare(chain_s, chain_e, polish_s, polish_e)


def run_chain(
    build: Build, index: int, seed: int, seconds: float | None, evaluations: int | None
) -> ChainResult:
    """Build one independent search with ``build`` (no polish), run it and keep plain data.

    This is the body of a Ray task; it also runs in-process, which the tests use.
    """
    t0 = time.perf_counter()
    search = build(seed=seed, seconds=seconds, evaluations=evaluations, polish=False, progress=None)
    outcome = search.run()
    best = None
    if search.best is not None:
        _, si, plan, raw = search.best
        best = (search.spaces[si].structure, plan, raw)
    elites = tuple(
        (search.spaces[si].structure, plan)
        for entries in search.elites.values()
        for _, _, plan, si in entries
    )
    return ChainResult(
        index,
        seed,
        outcome.evaluations,
        time.perf_counter() - t0,
        socket.gethostname(),
        best,
        elites,
        outcome.reason,
    )


def _positions(search: Anneal, results: Sequence[ChainResult]) -> list[tuple[int, Plan]]:
    index = {sp.structure: i for i, sp in enumerate(search.spaces)}
    out = []
    for r in results:
        for structure, plan in r.plans():
            if structure not in index:
                raise ValueError(f"chain {r.index} searched {structure.label!r}, unknown to the driver")
            out.append((index[structure], plan))
    return out


def merge(search: Anneal, results: Sequence[ChainResult]) -> int:
    """Offer every chain's best and elite plans to ``search`` by evaluating them there.

    Chains are taken in the order given (the driver passes them by index); a plan already seen
    is answered from the cache. ``search.budget`` must allow one evaluation per distinct plan.

    Returns
    -------
    int
        The number of distinct plans offered.
    """
    positions = _positions(search, results)
    for si, plan in positions:
        search.evaluate(si, [plan])
    return len({(si, plan.key()) for si, plan in positions})


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(MISSING_RAY) from exc
    return ray


@contextlib.contextmanager
def connect(address: str | None) -> Iterator[Any]:
    """The ``ray`` module, connected for the duration of the ``with`` block.

    A connection this process already holds (``ray.init`` called by the caller, for example
    with a ``runtime_env``) is used as it is and left open. Otherwise ``address=None`` starts a
    local Ray instance with this machine's CPUs and an address joins that cluster; either is
    shut down (disconnected) on leaving.

    Raises
    ------
    ImportError
        If Ray is not installed (the message says what to install).
    ValueError
        If this process is already connected to a different cluster than ``address``.
    """
    ray = _import_ray()
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address not in (None, "auto", current):
            raise ValueError(
                f"this process is already connected to the Ray cluster at {current}, not {address!r}; "
                "pass address=None to use it, or call ray.shutdown() first"
            )
        yield ray
        return
    if address is None:
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level=logging.WARNING)
    else:
        ray.init(address=address, logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()


def _report(
    progress: Callable[[dict[str, Any]], None] | None,
    start: float,
    done: dict[int, ChainResult],
    chains: int,
    seconds: float | None,
    evaluations: int | None,
) -> None:
    if progress is None:
        return
    elapsed = time.perf_counter() - start
    used = sum(r.evaluations for r in done.values())
    best = [r.best[2].throughput for r in done.values() if r.best is not None]
    progress(
        {
            "elapsed": elapsed,
            "evaluations": used,
            "evals_per_s": used / elapsed if elapsed > 0 else 0.0,
            "best_throughput": max(best, default=0.0),
            "structure": f"{len(done)}/{chains} chains done",
            "time_limit": seconds,
            "max_evaluations": evaluations,
        }
    )


def ray_search(
    build: Build,
    *,
    seed: int,
    seconds: float | None,
    evaluations: int | None,
    polish: bool = True,
    polish_share: float = 0.1,
    chains: int | None = None,
    address: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Anneal, Outcome, list[ChainResult]]:
    """Run ``chains`` independent searches as Ray tasks, merge them and polish the best.

    Parameters
    ----------
    build
        Builds a search: ``build(seed=, seconds=, evaluations=, polish=, progress=)``.
    seed
        Seed of the driver's search; chain ``i`` uses ``seed + i``.
    seconds, evaluations
        The whole budget (split as in the module docstring); at least one is set.
    polish, polish_share
        Whether the driver polishes the merged best, and the share of the budget held for it.
    chains
        Number of chains (default: the cluster's CPUs, at least 2). Chains beyond the cluster's
        CPUs wait for a free one.
    address
        Ray cluster to join (``None``: the connection this process holds, else a new local
        instance).
    progress
        Called about twice a second while the chains run, then by the driver's search.

    Returns
    -------
    tuple
        The driver's search (its ``budget`` covers the whole run), its :class:`Outcome` (whose
        ``evaluations`` count the chains' and the driver's) and the chains' results by index.
        ``KeyboardInterrupt`` stops early: finished chains are merged and the outcome is marked
        interrupted.

    Raises
    ------
    ImportError
        If Ray is not installed.
    ValueError
        For a bad ``chains``, budget or option (raised before Ray starts where possible).
    """
    start = time.perf_counter()
    overall = Budget(seconds, evaluations)
    polish = polish and polish_share > 0.0
    if chains is not None:
        split_budget(seconds, evaluations, chains, polish_share)  # fail before starting Ray
    driver_progress = _DriverProgress(progress, seconds, evaluations)
    # built first so that bad options fail before Ray starts; its budget is set after the chains
    search = build(
        seed=seed,
        seconds=None,
        evaluations=1,
        polish=polish,
        progress=None if progress is None else driver_progress,
    )
    with connect(address) as ray:
        if chains is None:
            chains = max(2, int(ray.cluster_resources().get("CPU", 0)))
        count = chains  # an int from here on, for the report below
        share = split_budget(seconds, evaluations, count, polish_share if polish else 0.0)
        results, interrupted = _run_chains(
            ray,
            build,
            seed,
            count,
            share,
            lambda done: _report(progress, start, done, count, seconds, evaluations),
        )
    offset_s, offset_e = time.perf_counter() - start, sum(r.evaluations for r in results)
    driver_progress.offset_s, driver_progress.offset_e = offset_s, offset_e
    interrupted = _merge_and_polish(search, results, share, polish and not interrupted) or interrupted
    driver_progress(
        {
            "elapsed": search.budget.elapsed(),
            "evaluations": search.budget.used,
            "best_throughput": 0.0 if search.best is None else search.best[3].throughput,
        }
    )  # the final figures, which the driver's rate-limited reports may have skipped
    overall.spend(offset_e + search.budget.used)
    history = [(offset_s + t, offset_e + n, thr) for t, n, thr in search.history]
    search.budget = overall
    if search.best is None:
        reason = results[0].reason if results else "interrupted before any chain finished"
        return search, Outcome(None, None, None, overall.used, interrupted, reason, history), results
    _, si, plan, raw = search.best
    outcome = Outcome(search.spaces[si], plan, raw, overall.used, interrupted, "", history)
    return search, outcome, results


class _DriverProgress:
    """The driver's progress callback: its search's figures shifted by the seconds and
    evaluations the chains spent before the merge (``offset_s``, ``offset_e``)."""

    def __init__(
        self,
        progress: Callable[[dict[str, Any]], None] | None,
        seconds: float | None,
        evaluations: int | None,
    ) -> None:
        self.progress, self.seconds, self.evaluations = progress, seconds, evaluations
        self.offset_s, self.offset_e = 0.0, 0

    def __call__(self, figures: dict[str, Any]) -> None:
        if self.progress is None:
            return
        elapsed, used = figures["elapsed"] + self.offset_s, figures["evaluations"] + self.offset_e
        self.progress(
            {
                **figures,
                "elapsed": elapsed,
                "evaluations": used,
                "evals_per_s": used / elapsed if elapsed > 0 else 0.0,
                "structure": "merge and polish",
                "time_limit": self.seconds,
                "max_evaluations": self.evaluations,
            }
        )


def _run_chains(
    ray: Any,
    build: Build,
    seed: int,
    chains: int,
    share: BudgetShare,
    report: Callable[[dict[int, ChainResult]], None],
) -> tuple[list[ChainResult], bool]:
    """Run chain ``i`` (seed ``seed + i``) as a Ray task for ``i < chains``, calling ``report``
    with the finished ones about twice a second.

    Returns
    -------
    tuple
        The finished chains' results by index, and whether ``KeyboardInterrupt`` stopped the wait
        (the pending chains are then cancelled).
    """
    task = ray.remote(run_chain).options(num_cpus=1)
    shared = ray.put(build)  # the problem travels to the object store once, not per chain
    pending = {
        task.remote(shared, i, seed + i, share.chain_seconds, share.chain_evaluations): i
        for i in range(chains)
    }
    done: dict[int, ChainResult] = {}
    interrupted = False
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                done[pending.pop(ref)] = ray.get(ref)
            report(done)
    except KeyboardInterrupt:
        interrupted = True
        for ref in pending:
            ray.cancel(ref, force=True)
    return [done[i] for i in sorted(done)], interrupted


def _merge_and_polish(
    search: Anneal, results: Sequence[ChainResult], share: BudgetShare, polish: bool
) -> bool:
    """Give ``search`` the budget of the merge (one evaluation per distinct plan the chains sent
    back) and, with ``polish``, of the polish; merge the chains into it and polish its best.

    Returns
    -------
    bool
        Whether ``KeyboardInterrupt`` stopped the merge or the polish.
    """
    distinct = len({(si, plan.key()) for si, plan in _positions(search, results)})
    if polish:
        extra = share.polish_evaluations
        search.budget = Budget(share.polish_seconds, None if extra is None else max(1, extra + distinct))
    else:
        search.budget = Budget(None, max(1, distinct))
    try:
        merge(search, results)
        if polish:
            search.polish()
    except KeyboardInterrupt:
        return True
    return False
