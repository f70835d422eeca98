"""Fidelity of a run: the cost model's predicted times against what the workers measured.

A trace (``rpeg.trace/1``) stores, per executed node, the worker's own seconds (``worker_time``)
and, in ``meta``, the cost model's predicted duration of every node of the run's DAG
(``predicted_durations``, scored on the scaled problem with the run's hardware), the controller's
dispatch term of that hardware (``dispatch_s``) and each vertex's role (``vertex_roles``). From
these :func:`fidelity` computes

* per step and per operation class (generation, inference, training, transfer — COMM and
  RESHARD nodes), the predicted and the measured seconds summed over the step's nodes;
* over the OP nodes of the steps after the first (step 0 pays warm-up: allocations, first
  compilations, the engine's first batch), the time MAPE ``mean |p − m|/m`` and Spearman's ρ of
  predicted ``p`` (less ``dispatch_s``, which ``worker_time`` does not contain) against measured
  ``m = worker_time − publish_s`` (a training node that publishes its weights spends
  ``publish_s`` handing them over, which the cost model prices as the publication's COMM nodes;
  those seconds count as ``transfer``);
* over the same steps, the MAPE of the predicted against the measured step makespans.

:func:`spearman` and :func:`mape` are the two statistics, shared with the fidelity benchmark.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CLASSES",
    "Fidelity",
    "compared_steps",
    "fidelity",
    "mape",
    "spearman",
    "trace_fidelity",
    "worker_peaks",
]

#: Operation classes of the per-step comparison.
CLASSES = ("generation", "inference", "training", "transfer")


def worker_peaks(records: Sequence[Any], kind: str = "memory") -> dict[str, float]:
    """Per worker (``"g{group}/r{rank}"``), the largest figure of field ``kind`` its OP records
    report, bytes (a record's figure is the peak so far, so the largest is the run's):
    ``"memory"``, the process's private-memory peak less its footprint before the model, or
    ``"memory_live"``, its live-C-heap peak less the live heap before the model
    (:class:`~rpeg.runtime.trace.records.TraceRecord`).

    Raises
    ------
    ValueError
        For another ``kind``.
    """
    if kind not in ("memory", "memory_live"):
        raise ValueError(f"worker_peaks: kind must be 'memory' or 'memory_live', got {kind!r}")
    out: dict[str, float] = {}
    for r in records:
        for w, b in (getattr(r, kind, None) or {}).items():
            out[w] = max(out.get(w, 0.0), float(b))
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ: the Pearson correlation of the ranks (average ranks for ties); ``nan`` for
    fewer than two points or a constant side."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} and {len(b)} values")
    if len(a) < 2:
        return float("nan")

    def ranks(x: Sequence[float]) -> np.ndarray:
        vals = np.asarray(x, dtype=float)
        order = np.argsort(vals, kind="stable")
        r = np.empty(len(vals))
        r[order] = np.arange(len(vals))
        for v in np.unique(vals):
            idx = vals == v
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """``100·mean |p − m|/m`` over the pairs with ``m > 0`` (``nan`` when there are none)."""
    pairs = [(p, m) for p, m in zip(predicted, measured) if m > 0]
    if not pairs:
        return float("nan")
    return 100.0 * statistics.fmean(abs(p - m) / m for p, m in pairs)


@dataclass
class Fidelity:
    """Predicted against measured times of one trace (module docstring).

    Attributes
    ----------
    per_step
        Per step: class → ``{"predicted_s", "measured_s", "nodes"}``.
    step_predicted, step_measured
        Per step makespans (seconds).
    op_predicted, op_measured, op_class
        The compared OP nodes (steps ≥ ``first_step``): predicted seconds less dispatch, worker
        seconds, class.
    first_step
        The first step compared (1 when the run has more than one step, else 0).
    stop_step
        The makespans compared are those of steps ``first_step`` to ``stop_step − 1``; ``None``:
        to the last. :func:`fidelity` leaves the last step out of a run of three or more
        (:func:`compared_steps`).
    """

    per_step: list[dict[str, dict[str, float]]]
    step_predicted: list[float]
    step_measured: list[float]
    op_predicted: list[float] = field(default_factory=list)
    op_measured: list[float] = field(default_factory=list)
    op_class: list[str] = field(default_factory=list)
    first_step: int = 1
    stop_step: int | None = None

    @property
    def compared(self) -> slice:
        """The steps whose makespans are compared."""
        return slice(self.first_step, self.stop_step)

    @property
    def op_mape(self) -> float:
        """Operator time MAPE (percent)."""
        return mape(self.op_predicted, self.op_measured)

    @property
    def op_spearman(self) -> float:
        """Spearman's ρ over the compared operators."""
        return spearman(self.op_predicted, self.op_measured)

    @property
    def step_mape(self) -> float:
        """Step makespan MAPE over the compared steps (percent)."""
        return mape(self.step_predicted[self.compared], self.step_measured[self.compared])

    def class_mape(self) -> dict[str, float]:
        """Operator MAPE per class."""
        out = {}
        for cls in CLASSES:
            pairs = [
                (p, m) for p, m, c in zip(self.op_predicted, self.op_measured, self.op_class) if c == cls
            ]
            if pairs:
                out[cls] = mape([p for p, _ in pairs], [m for _, m in pairs])
        return out

    def to_dict(self) -> dict[str, Any]:
        """The summary figures stored in a trace's ``meta["fidelity"]``."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 6)

        return {
            "first_step": self.first_step,
            "stop_step": self.stop_step,
            "op_nodes": len(self.op_measured),
            "op_mape_pct": num(self.op_mape),
            "op_spearman": num(self.op_spearman),
            "step_mape_pct": num(self.step_mape),
            "class_mape_pct": {k: num(v) for k, v in self.class_mape().items()},
        }

    def summary(self) -> str:
        """One line: ``fidelity (steps ≥ k, n OP nodes): operator MAPE …, ρ …, step MAPE …``."""

        def pct(x: float) -> str:
            return "n/a" if math.isnan(x) else f"{x:.1f}%"

        rho = self.op_spearman
        per_class = ", ".join(f"{k} {pct(v)}" for k, v in self.class_mape().items())
        return (
            f"fidelity (steps ≥ {self.first_step}, {len(self.op_measured)} OP nodes): operator time MAPE "
            f"{pct(self.op_mape)} ({per_class}), Spearman ρ {'n/a' if math.isnan(rho) else f'{rho:.3f}'}, "
            f"step makespan MAPE {pct(self.step_mape)}"
            + ("" if self.stop_step is None else f" (steps {self.first_step}–{self.stop_step - 1})")
        )

    def table(self) -> str:
        """Per step and class: predicted / measured seconds."""
        present = [c for c in CLASSES if any(c in s for s in self.per_step)]
        lines = [f"{'step':>4} " + " ".join(f"{c + ' pred/meas s':>24}" for c in present)]
        for k, row in enumerate(self.per_step):
            cells = []
            for c in present:
                d = row.get(c)
                cells.append(f"{d['predicted_s']:>11.4g} / {d['measured_s']:<10.4g}" if d else f"{'-':>24}")
            lines.append(f"{k:>4} " + " ".join(cells))
        return "\n".join(lines)


def _class(kind: str, vertex: str, roles: Mapping[str, str]) -> str:
    if kind != "op":
        return "transfer"
    return roles.get(vertex, "inference")


def compared_steps(steps: int) -> tuple[int, int | None]:
    """The steps ``[first, stop)`` whose makespans a run of ``steps`` steps compares
    (``stop = None``: to the last).

    Step 0 is left out (warm-up: engine start, first compilations) when there are two or more,
    and the last step when there are three or more: step ``k``'s time ends with its last node,
    and a schedule may run that node after step ``k + 1``'s first ones (the evaluator's list
    schedule puts step ``k``'s critic update after step ``k + 1``'s generation, which does not
    need it), so every step but the last carries some of its successor's work and the last
    carries none — measured 9.7 s predicted for the last step of the fidelity benchmark's
    colocated plan against 16.0 s for the steps before it, with the same total. The operators
    of every step from ``first`` on are compared (their durations do not depend on the order).
    """
    first = 1 if steps > 1 else 0
    return first, (steps - 1 if steps >= 3 else None)


def fidelity(
    records: Sequence[Any],
    predicted: Sequence[float],
    roles: Mapping[str, str],
    steps: int,
    step_predicted: Sequence[float],
    step_measured: Sequence[float],
    dispatch_s: float = 0.0,
) -> Fidelity:
    """Compare a run's records with the cost model's predictions (module docstring).

    Parameters
    ----------
    records
        Executed nodes (``node``, ``kind``, ``vertex``, ``step``, ``worker_time``).
    predicted
        Predicted duration per node id of the run's DAG (empty: nothing to compare).
    roles
        Vertex → ``"generation"``, ``"inference"`` or ``"training"``.
    steps
        Steps of the run.
    step_predicted, step_measured
        Per-step makespans.
    dispatch_s
        The hardware's dispatch term, part of ``predicted`` but not of ``worker_time``.

    Returns
    -------
    Fidelity
    """
    per_step: list[dict[str, dict[str, float]]] = [{} for _ in range(steps)]
    first, stop = compared_steps(steps)
    out = Fidelity(per_step, list(step_predicted), list(step_measured), first_step=first, stop_step=stop)
    if not predicted:
        return out
    for r in records:
        if not (0 <= r.node < len(predicted)) or not (0 <= r.step < steps):
            continue
        cls = _class(r.kind, r.vertex, roles)
        p = max(0.0, predicted[r.node] - dispatch_s)
        pub = float(getattr(r, "publish_s", 0.0))
        m = float(r.worker_time) - pub  # a publication is priced as COMM nodes, not in the OP
        d = per_step[r.step].setdefault(cls, {"predicted_s": 0.0, "measured_s": 0.0, "nodes": 0})
        d["predicted_s"] += p
        d["measured_s"] += m
        d["nodes"] += 1
        if pub > 0:
            t = per_step[r.step].setdefault("transfer", {"predicted_s": 0.0, "measured_s": 0.0, "nodes": 0})
            t["measured_s"] += pub
        if r.kind == "op" and r.step >= first:
            out.op_predicted.append(p)
            out.op_measured.append(m)
            out.op_class.append(cls)
    return out


def trace_fidelity(trace: Any) -> Fidelity | None:
    """:func:`fidelity` of a trace from what it stores (``None`` when it lacks the predictions:
    a trace cut short, or one written before rpeg stored ``vertex_roles``)."""
    meta = trace.meta
    predicted = meta.get("predicted_durations") or []
    roles = meta.get("vertex_roles")
    if not predicted or roles is None:
        return None
    sm = trace.step_metrics
    return fidelity(
        trace.records,
        predicted,
        roles,
        len(sm),
        [m["predicted_step_time_s"] for m in sm],
        [m["step_time_s"] for m in sm],
        float(meta.get("dispatch_s", 0.0)),
    )
