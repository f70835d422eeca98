"""Checking a run's trace against the plan it claims to follow (SPEC §11).

:func:`verify` re-derives the executable graph ``Ĝ`` of the result's plan over the trace's number
of steps (:func:`~rpeg.runtime.trace.records.expected_graph`) and checks, in this order:

1. identity: the trace's plan hash and staleness budgets are the result's;
2. bindings: one record per node of ``Ĝ`` (same id, kind, vertex, source, step, phase), on the
   node's devices; an OP runs on exactly ``|σ(v)|`` workers, the same ones at every step;
3. parallel layout: each record ran with its vertex's planned ``(dp, pp, tp, mb)``;
4. dependencies: no record starts before a predecessor's record ends;
5. versions: every read of a model's weights has exactly the version the unrolled graph implies,
   hence a staleness within ``τ``; training produces the next version;
6. exclusive resources: records sharing a device do not overlap in time;
7. sanity: ``0 ≤ start ≤ end``, byte counts match the lowered payloads.

Every problem is one line that names the node id, its kind, vertex and step, and the offending
value. :func:`register_cli` adds ``rpeg verify TRACE.json RESULT.json``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ir.cluster import mask_devices
from ...ir.errors import require_file
from ...ir.graph import RPEG
from ...ir.lower import OP, ExecGraph
from ...ir.types import Role
from ...solvers.result import Result
from .records import Trace, TraceRecord, expected_graph, expected_versions, plan_hash

__all__ = ["TOLERANCE", "TraceError", "read_result", "register_cli", "verify", "verify_or_raise"]

#: Seconds by which a start may precede a predecessor's end (clock rounding).
TOLERANCE = 1e-9
#: Problems the CLI prints before summarising the rest.
CLI_SHOWN = 20
_KIND_NAMES = ("op", "comm", "reshard")
_LAYOUT_KEYS = ("dp", "pp", "tp", "mb", "cp", "ep")
#: Layout keys older traces lack: they ran without the split (degree 1).
_SPLIT_KEYS = ("cp", "ep")


class TraceError(ValueError):
    """A trace that does not follow its plan; :attr:`problems` lists every finding."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        shown = "\n  ".join(self.problems[:CLI_SHOWN])
        more = len(self.problems) - CLI_SHOWN
        tail = f"\n  … and {more} more" if more > 0 else ""
        super().__init__(f"trace invalid ({len(self.problems)} problem(s)):\n  {shown}{tail}")


@dataclass(frozen=True)
class _Plan:
    """What the checks need from the result, looked up once."""

    rpeg: RPEG
    graph: ExecGraph
    names: list[str]
    roles: list[Role]
    tau: dict[str, int]
    sizes: list[int]
    layouts: list[dict[str, int]]


def verify(trace: Trace | str | os.PathLike, result: Result | str | os.PathLike) -> list[str]:
    """All the ways ``trace`` departs from ``result``'s plan; an empty list means valid.

    Parameters
    ----------
    trace
        The run's trace, or the path of an ``rpeg.trace/1`` file (read through the strict
        schema).
    result
        The result whose plan the run executed, or the path of its ``rpeg.result/2`` (or ``/1``) file.

    Returns
    -------
    list[str]
        One message per problem, grouped by check (identity, bindings, layout, dependencies,
        versions, exclusive resources, sanity) and ordered by node id inside a check. The trace
        of a failed or interrupted run (``status: "failed"`` or ``"interrupted"``) is never valid:
        its first problem says the run stopped and how; its records (those completed before the
        stop) are checked as usual, and the nodes after the stop are not reported missing.

    Raises
    ------
    TypeError
        If ``trace`` or ``result`` is of another type (the message names the argument; the
        order is ``verify(trace, result)``).
    InputError
        If a path names a missing or invalid file.
    """
    trace = _as_trace(trace)
    result = _as_result(result)
    problems = []
    if not trace.complete:
        f = trace.failure or {}
        interrupted = trace.status == "interrupted"
        problems.append(
            f"incomplete trace: the run {'was interrupted' if interrupted else 'failed'} "
            f"({f.get('message', 'no message')}); {len(trace.records)} record(s) before the "
            f"{'interruption' if interrupted else 'failure'}"
        )
    problems += _check_identity(trace, result)
    if result.plan is None:
        return [*problems, f"result has no plan (status {result.status.value}); nothing to verify against"]
    if isinstance(trace.steps, bool) or not isinstance(trace.steps, int) or trace.steps < 1:
        return [*problems, f"trace.steps must be a positive integer, got {trace.steps!r}"]
    g = expected_graph(result, trace.steps)
    rg = result.graph
    plan = _Plan(
        rpeg=rg,
        graph=g,
        names=[v.name for v in rg.vertices],
        roles=[v.role for v in rg.vertices],
        tau=dict(rg.staleness),
        sizes=[c.allocation.size for c in result.plan.choices],
        layouts=[
            {
                "dp": c.strategy.dp,
                "pp": c.strategy.pp,
                "tp": c.strategy.tp,
                "mb": c.strategy.mb,
                "cp": c.strategy.cp,
                "ep": c.strategy.ep,
            }
            for c in result.plan.choices
        ],
    )
    matched = _check_bindings(trace.records, plan, problems, complete=trace.complete)
    _check_layouts(matched, plan, problems)
    _check_dependencies(matched, plan, problems)
    offset = trace.meta.get("version_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        problems.append(f"trace.meta version_offset must be a non-negative integer, got {offset!r}")
        offset = 0
    _check_versions(matched, plan, problems, offset)
    _check_exclusive(trace.records, problems)
    _check_sanity(trace, matched, plan, problems)
    return problems


def verify_or_raise(trace: Trace, result: Result) -> None:
    """:func:`verify`, raising instead of returning.

    Raises
    ------
    TraceError
        With every problem :func:`verify` found.
    """
    problems = verify(trace, result)
    if problems:
        raise TraceError(problems)


# ---------------------------------------------------------------------------- the checks
def _check_identity(trace: Trace, result: Result) -> list[str]:
    """Check 1: ``trace.plan_hash == plan_hash(result)`` and ``trace.staleness == τ``.

    The hash covers workload, models, cluster, structure, vertices and plan, so a trace of any
    other binding or layout is rejected here before its records are compared.
    """
    out = []
    expected = plan_hash(result)
    if trace.plan_hash != expected:
        out.append(
            f"plan hash {trace.plan_hash!r} is not the result's {expected!r}: the trace was "
            "recorded for another plan, structure or problem"
        )
    tau = result.structure.tau
    if dict(trace.staleness) != tau:
        out.append(f"trace staleness {dict(trace.staleness)} is not the result's structure staleness {tau}")
    return out


def _check_bindings(
    records: list[TraceRecord], plan: _Plan, problems: list[str], complete: bool = True
) -> dict[int, TraceRecord]:
    """Check 2: records ↔ nodes of ``Ĝ`` one to one, devices = node mask, persistent workers.

    A record matches node ``i`` when its ``node`` is ``i`` and its kind, vertex, source, step and
    phase are node ``i``'s. Every node needs exactly one matching record. Each matched record's
    devices are the node's mask (for COMM/RESHARD the destination allocation). An OP record runs on
    exactly ``|σ(v)|`` distinct workers, and every OP record of vertex ``v`` (all steps and
    phases) on the same set of workers: one persistent worker group per invocation.

    A failed run's trace (``complete=False``) is not expected to hold the nodes after the
    failure: missing records are not reported then.

    Returns
    -------
    dict[int, TraceRecord]
        The first matching record per node id, which the later checks use.
    """
    g = plan.graph
    n = len(g)
    counts = Counter(r.node for r in records)
    matched: dict[int, TraceRecord] = {}
    found: list[str] = []
    for r in records:
        if not isinstance(r.node, int) or not 0 <= r.node < n:
            found.append(f"extra record {_at(r)}: no such node in the plan's graph ({n} nodes)")
            continue
        want = _node_identity(g, r.node, plan.names)
        got = (r.kind, r.vertex, r.source, r.step, r.phase)
        if got != want:
            found.append(
                f"extra record {_at(r)}: node {r.node} of the plan's graph is {_describe(want)}, "
                f"the record says {_describe(got)}"
            )
            continue
        if r.node in matched:
            continue
        matched[r.node] = r
    for node in sorted(matched):
        if counts[node] > 1:
            found.append(f"duplicate records: {_at(matched[node])} recorded {counts[node]} times")
    for i in range(n if complete else 0):  # a failed run's trace stops at the failure
        if i not in matched:
            found.append(f"missing record for node {i} ({_describe(_node_identity(g, i, plan.names))})")
    first_workers: dict[int, TraceRecord] = {}
    for i in sorted(matched):
        r = matched[i]
        v = g.vertex[i]
        devs = mask_devices(g.mask[i])
        if sorted(r.devices) != devs:
            whose = "its allocation" if g.kind[i] == OP else "its destination allocation"
            found.append(f"{_at(r)}: devices {list(r.devices)} but {whose} σ({plan.names[v]}) is {devs}")
        if g.kind[i] != OP:
            continue
        workers = set(r.workers)
        if len(r.workers) != plan.sizes[v] or len(workers) != plan.sizes[v]:
            found.append(
                f"{_at(r)}: {len(r.workers)} worker(s) ({len(workers)} distinct) but |σ({plan.names[v]})| "
                f"= {plan.sizes[v]}"
            )
        ref = first_workers.setdefault(v, r)
        if ref is not r and workers != set(ref.workers):
            found.append(
                f"{_at(r)}: workers {sorted(workers)} differ from {sorted(ref.workers)} of {_at(ref)}; "
                f"{plan.names[v]} must keep one persistent worker group across steps"
            )
    problems.extend(found)
    return matched


def _check_layouts(matched: dict[int, TraceRecord], plan: _Plan, problems: list[str]) -> None:
    """Check 3: each record's ``layout`` has the planned ``(dp, pp, tp, mb, cp, ep)`` of its vertex
    (a record without ``cp`` or ``ep``, as every trace before those splits, has degree 1).

    For COMM/RESHARD records the vertex is the consumer, so this is the destination layout.
    Other keys are ignored.
    """
    for i in sorted(matched):
        r = matched[i]
        v = plan.graph.vertex[i]
        want = plan.layouts[v]
        got = {k: r.layout.get(k, 1 if k in _SPLIT_KEYS else None) for k in _LAYOUT_KEYS}
        if got != want:
            what = "layout" if plan.graph.kind[i] == OP else "destination layout"
            found = {k: r.layout.get(k, 1 if k in _SPLIT_KEYS else "missing") for k in _LAYOUT_KEYS}
            problems.append(f"{_at(r)}: {what} {found} but the plan has {want} for {plan.names[v]}")


def _check_dependencies(matched: dict[int, TraceRecord], plan: _Plan, problems: list[str]) -> None:
    """Check 4: ``start(i) ≥ end(p) − 1e-9`` for every predecessor ``p`` of node ``i`` in ``Ĝ``."""
    g = plan.graph
    for i in sorted(matched):
        r = matched[i]
        for p in g.preds[i]:
            q = matched.get(p)
            if q is not None and r.start < q.end - TOLERANCE:
                problems.append(
                    f"{_at(r)}: starts at {r.start!r} before its predecessor {_at(q)} ends at {q.end!r}"
                )


def _check_versions(
    matched: dict[int, TraceRecord], plan: _Plan, problems: list[str], offset: int = 0
) -> None:
    """Check 5: versions read and produced are exactly :func:`~rpeg.runtime.trace.records.expected_versions`
    (with ``offset`` updates before the run when it continues a job, ``trace.meta["version_offset"]``).

    Also, for a trainable model, ``k − version ≤ τ(m)`` (the staleness bound of SPEC §11) and
    ``version ≤ k``, each reported in its own words so a too-stale read is named as such.
    """
    for i in sorted(matched):
        r = matched[i]
        want_in, want_out = expected_versions(plan.rpeg, plan.graph, i, offset)
        k = r.step
        for m, want in want_in.items():
            got = r.versions_consumed.get(m)
            if got is None:
                problems.append(
                    f"{_at(r)}: versions_consumed has no entry for {m!r} (expected version {want})"
                )
                continue
            if got != want:
                rule = _rule(plan, i, m)
                problems.append(f"{_at(r)}: versions_consumed[{m!r}] = {got}, expected {want} ({rule})")
            if m in plan.tau and k - got > plan.tau[m]:
                problems.append(
                    f"{_at(r)}: reads {m!r} version {got} at step {k}: staleness {k - got} exceeds "
                    f"τ({m}) = {plan.tau[m]}"
                )
            elif m in plan.tau and got > k:
                problems.append(f"{_at(r)}: reads {m!r} version {got} at step {k}: no such version yet")
        extra = sorted(set(r.versions_consumed) - set(want_in))
        if extra:
            problems.append(
                f"{_at(r)}: versions_consumed names {extra}, which this node does not read "
                f"(expected {want_in})"
            )
        if dict(r.version_produced) != want_out:
            problems.append(f"{_at(r)}: version_produced {dict(r.version_produced)}, expected {want_out}")


def _rule(plan: _Plan, node: int, model: str) -> str:
    g = plan.graph
    v, k = g.vertex[node], g.step[node]
    if model not in plan.tau:
        return f"{model} is frozen"
    if plan.roles[v] is Role.TRAINING:
        return f"training at step {k} reads version k = {k}"
    return f"max(0, k − τ) = max(0, {k} − {plan.tau[model]})"


def _check_exclusive(records: list[TraceRecord], problems: list[str]) -> None:
    """Check 6: two records whose device sets intersect do not overlap in time.

    Intervals are open: ``a`` and ``b`` overlap when ``a.start < b.end − 1e-9`` and
    ``b.start < a.end − 1e-9`` (one ending exactly when the other starts is fine). A COMM or
    RESHARD occupies only its own devices, the destination allocation. Each overlapping pair is
    reported once, with the devices it shares.
    """
    by_device: dict[int, list[int]] = {}
    for j, r in enumerate(records):
        for d in set(r.devices):
            by_device.setdefault(d, []).append(j)
    clashes: dict[tuple[int, int], set[int]] = {}
    for d, js in by_device.items():
        js.sort(key=lambda j: (records[j].start, records[j].end))
        open_: list[int] = []  # records still running at the sweep's current start
        for j in js:
            r = records[j]
            open_ = [a for a in open_ if records[a].end - TOLERANCE > r.start]
            for a in open_:
                if r.start < records[a].end - TOLERANCE and records[a].start < r.end - TOLERANCE:
                    clashes.setdefault((min(a, j), max(a, j)), set()).add(d)
            open_.append(j)
    for (a, b), devs in sorted(
        clashes.items(), key=lambda kv: (records[kv[0][0]].node, records[kv[0][1]].node)
    ):
        ra, rb = records[a], records[b]
        problems.append(
            f"{_at(ra)} [{ra.start!r}, {ra.end!r}] and {_at(rb)} [{rb.start!r}, {rb.end!r}] overlap on "
            f"device(s) {sorted(devs)}"
        )


def _check_sanity(trace: Trace, matched: dict[int, TraceRecord], plan: _Plan, problems: list[str]) -> None:
    """Check 7: finite times, ``0 ≤ start ≤ end``, ``bytes ≥ 0``, ``0 ≤ in_place_bytes ≤ bytes``,
    ``worker_time ≥ 0``, bytes as lowered.

    An OP moves no bytes. A COMM/RESHARD moves ``round(nbytes)`` of its lowered node, unless
    ``trace.meta["scaled"]`` is true (scaled-down models): then any positive count is accepted.
    """
    scaled = bool(trace.meta.get("scaled", False))
    g = plan.graph
    for r in sorted(trace.records, key=lambda r: (r.node, r.start)):
        bad = [k for k in ("start", "end", "worker_time") if not math.isfinite(getattr(r, k))]
        if bad:
            problems.append(
                f"{_at(r)}: {', '.join(f'{k} {getattr(r, k)!r}' for k in bad)} not a finite number"
            )
            continue
        if r.start < 0:
            problems.append(f"{_at(r)}: start {r.start!r} is before the run started (negative)")
        if r.end < r.start:
            problems.append(f"{_at(r)}: end {r.end!r} before start {r.start!r} (negative duration)")
        if r.bytes < 0:
            problems.append(f"{_at(r)}: bytes {r.bytes} is negative")
        if not 0 <= r.in_place_bytes <= max(r.bytes, 0):
            problems.append(f"{_at(r)}: in_place_bytes {r.in_place_bytes} is not within 0..bytes ({r.bytes})")
        if r.worker_time < 0:
            problems.append(f"{_at(r)}: worker_time {r.worker_time!r} is negative")
    for i in sorted(matched):
        r = matched[i]
        if g.kind[i] == OP:
            if r.bytes != 0:
                problems.append(f"{_at(r)}: an op moves no bytes, got bytes {r.bytes}")
        elif scaled:
            if r.bytes <= 0:
                problems.append(f"{_at(r)}: a {r.kind} must move some bytes, got {r.bytes}")
        elif r.bytes != round(g.nbytes[i]):
            problems.append(f"{_at(r)}: bytes {r.bytes} but the lowered node moves {round(g.nbytes[i])}")


# ---------------------------------------------------------------------------- wording
def _node_identity(g: ExecGraph, i: int, names: list[str]) -> tuple:
    src = g.source[i]
    return (
        _KIND_NAMES[g.kind[i]],
        names[g.vertex[i]],
        names[src] if src >= 0 else None,
        g.step[i],
        g.phase[i],
    )


def _describe(ident: tuple) -> str:
    kind, vertex, source, step, phase = ident
    what = f"{kind} {vertex}" if source is None else f"{kind} {source}→{vertex}"
    return f"{what} step {step}" + (f" phase {phase}" if phase else "")


def _at(r: TraceRecord) -> str:
    return f"node {r.node} ({_describe((r.kind, r.vertex, r.source, r.step, r.phase))})"


# ---------------------------------------------------------------------------- CLI
def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add ``verify TRACE.json RESULT.json`` to the ``rpeg`` subcommands.

    The handler prints ``trace valid: N records, S steps`` and returns 0, or prints the first
    20 problems and returns 1 (``trace INCOMPLETE: …`` first for the trace of a failed run);
    either way it ends with the trace's fidelity line (predicted against measured times,
    :func:`~rpeg.runtime.trace.fidelity.trace_fidelity`). A
    missing or malformed file raises :class:`~rpeg.ir.errors.InputError` (the CLI's bad-input
    exit, 2).
    """
    p = sub.add_parser("verify", help="check a runtime trace against the plan it executed")
    p.add_argument("trace", help="an rpeg.trace/1 file written by the runtime")
    p.add_argument("result", help="the rpeg.result/2 (or /1) file whose plan was run")
    p.set_defaults(fn=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    require_file(args.trace, "trace file")
    require_file(args.result, "result file")
    trace = Trace.from_json(Path(args.trace))
    result = read_result(args.result)
    problems = verify(trace, result)
    if not problems:
        print(f"trace valid: {len(trace.records)} records, {trace.steps} steps")
        _print_fidelity(trace)
        return 0
    if not trace.complete:
        rest = problems[1:]
        print(f"trace INCOMPLETE: {problems[0]}")
        if not rest:
            print(f"  the {len(trace.records)} record(s) before the run stopped follow the plan")
        problems = rest
    else:
        print(f"trace INVALID: {len(problems)} problem(s)")
    for line in problems[:CLI_SHOWN]:
        print(f"  {line}")
    if len(problems) > CLI_SHOWN:
        print(f"  … and {len(problems) - CLI_SHOWN} more")
    _print_fidelity(trace)
    return 1


def _print_fidelity(trace: Trace) -> None:
    """The trace's predicted-against-measured figures (:mod:`~rpeg.runtime.trace.fidelity`), recomputed
    from its records; one line saying why when it has no predictions."""
    from .fidelity import trace_fidelity

    fid = trace_fidelity(trace)
    if fid is None:
        print(
            "fidelity: not available (the trace stores no per-node predictions: a cut-short segment or an older trace)"
        )
        return
    hw = trace.meta.get("hardware", "?")
    engines = trace.meta.get("engine_terms") or {}
    terms = "/".join(engines.get(r) or "-" for r in ("generation", "inference", "training"))
    print(f"{fid.summary()}; hardware {hw}, engine terms (generation/inference/training) {terms}")


def read_result(path: str | os.PathLike, what: str = "result file") -> Result:
    """:meth:`Result.from_json` of a file, every failure an :class:`~rpeg.ir.errors.InputError`
    naming the file.

    Raises
    ------
    InputError
        If the file is missing, not JSON or not a valid ``rpeg.result/2`` (or ``/1``) document.
    """
    # Result.from_json names the file in every InputError it raises (the schema gate); this
    # only puts the caller's name for the file (``--transition result file``) on a missing one
    return Result.from_json(require_file(path, what))


def _as_trace(trace: Any) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, (str, os.PathLike)):
        require_file(trace, "trace file")
        return Trace.from_json(Path(trace))
    hint = " (the order is verify(trace, result))" if isinstance(trace, Result) else ""
    raise TypeError(
        f"trace must be a Trace or the path of an rpeg.trace/1 file, got {type(trace).__name__}{hint}"
    )


def _as_result(result: Any) -> Result:
    if isinstance(result, Result):
        return result
    if isinstance(result, (str, os.PathLike)):
        return read_result(result)
    hint = " (the order is verify(trace, result))" if isinstance(result, Trace) else ""
    raise TypeError(
        f"result must be a Result or the path of an rpeg.result/2 file, got {type(result).__name__}{hint}"
    )
