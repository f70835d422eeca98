"""Evaluating proposals on local worker processes (``workers=N``).

Each worker process builds its own evaluators once (one per structural candidate) and then
evaluates the plans it is sent; it keeps no search state, so results do not depend on how
proposals are spread over the workers.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from ...ir.cluster import Cluster
from ...ir.plan import Plan
from ...ir.templates import Structure
from ...ir.workload import Workload
from ...scoring.evaluator import Evaluator
from .anneal import Raw, evaluate_raw

__all__ = ["ProcessEvaluator"]

_EVALUATORS: list[Evaluator] = []


def _init(
    workload: Workload, cluster: Cluster, structures: Sequence[Structure], k_eval: int, split_phases: bool
) -> None:
    global _EVALUATORS
    _EVALUATORS = [
        Evaluator(workload, cluster, y, k_eval=k_eval, split_phases=split_phases) for y in structures
    ]


def _evaluate(item: tuple[int, Plan]) -> Raw:
    si, plan = item
    return evaluate_raw(_EVALUATORS[si], plan)


class ProcessEvaluator:
    """``evaluate_many`` for :class:`~rpeg.heuristics.search.anneal.Anneal` on ``workers``
    processes (started with ``spawn``, so it is safe under threads and on every platform).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        structures: Sequence[Structure],
        *,
        k_eval: int,
        split_phases: bool,
        workers: int,
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.workers = workers
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=mp.get_context("spawn"),
            initializer=_init,
            initargs=(workload, cluster, tuple(structures), k_eval, split_phases),
        )

    def __call__(self, items: list[tuple[int, Plan]]) -> list[Raw]:
        chunk = max(1, -(-len(items) // self.workers))
        return list(self.pool.map(_evaluate, items, chunksize=chunk))

    def close(self) -> None:
        """Stop the worker processes."""
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ProcessEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
