#!/usr/bin/env python3
"""Independent checker for ``rpeg.result/1`` files.

This module re-derives, from the result file alone, the properties that SPEC.md §12 says anyone
can verify without rpeg's code: the format, precedence, device exclusivity, makespan, the
throughput formula, plan legality P1–P8 (§4) with the attention-head rules H1–H2 of vLLM
and Megatron-core, the binding of nodes to allocations (§5, §7) and
the memory flag (§6). It uses only the Python standard library and imports nothing from rpeg, so
a bug in the package cannot hide itself by also being in the checker.

Each ``check_*`` function takes the parsed JSON object and returns a list of human-readable
violation strings, each prefixed by the check's tag (``[precedence] ...``). An empty list means
the check passed. The checks never raise on malformed input: what cannot be examined is skipped
and left to :func:`check_format` to report.

Usage::

    python tests/tools/check_result.py RESULT.json [RESULT2.json ...]

prints ``OK <path>`` for a clean file, or one ``<path>: <violation>`` line per violation, and
exits with status 1 if any file has a violation (2 on bad usage).

See ``docs/result-format.md`` for the format field by field.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

FORMAT = "rpeg.result/2"
"""The format this checker checks in full (SPEC.md §12 with §14's engine choices)."""

FORMATS = ("rpeg.result/1", FORMAT)
"""Format strings this checker accepts: ``/1`` (padded tokens, SPEC.md §4's P4–P5 for every
role, no engine choices) and ``/2`` (real tokens, §14.2's microbatch rules for training and
inference, the engine fields ``zero``, ``mem_fraction``, ``logits_chunk``, ``packing``)."""

REL_TOL = 1e-9
"""Relative tolerance on times (precedence, exclusivity, makespan)."""

ABS_TOL = 1e-12
"""Absolute tolerance (seconds) on times, added to the relative one."""

THROUGHPUT_REL_TOL = 1e-6
"""Relative tolerance on the throughput formula."""

MEMORY_REL_TOL = 1e-9
"""Relative slack on the memory bound ``peak <= (1 - eps) * M_GPU``."""

BETA_OOM = 40.0
"""Memory-penalty steepness of SPEC.md §7 (used only for memory-infeasible results)."""

NODE_KINDS = ("op", "comm", "reshard")
ROLES = ("generation", "inference", "training")

TOP_LEVEL_KEYS = (
    "format",
    "workload",
    "models",
    "cluster",
    "structure",
    "vertices",
    "k_eval",
    "plan",
    "nodes",
    "makespan",
    "throughput",
    "utilization",
    "peak_memory",
    "memory_feasible",
    "method",
    "status",
    "objective_bound",
    "runtime_s",
    "evaluations",
)

Result = dict[str, Any]
Check = Callable[[Result], list[str]]


# ---------------------------------------------------------------------------------------------
# Small typed accessors. JSON booleans are Python ints, so every integer test excludes bool.
# ---------------------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    """Return True for a JSON integer (not a bool, not a float with integral value)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    """Return True for a finite JSON number (int or float, not bool, not NaN/Infinity)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return math.isfinite(x)


def _tol(a: float, b: float, rel: float = REL_TOL) -> float:
    """Tolerance for comparing ``a`` and ``b``: ``rel * max(|a|, |b|) + ABS_TOL``."""
    return rel * max(abs(a), abs(b)) + ABS_TOL


def _le(a: float, b: float, rel: float = REL_TOL) -> bool:
    """``a <= b`` up to :func:`_tol`."""
    return a <= b + _tol(a, b, rel)


def _close(a: float, b: float, rel: float = REL_TOL) -> bool:
    """``a == b`` up to :func:`_tol`."""
    return abs(a - b) <= _tol(a, b, rel)


def _fmt(x: Any) -> str:
    """Format a number compactly for a message."""
    if _is_num(x) and not _is_int(x):
        return f"{x:.12g}"
    return repr(x)


def _dict(result: Result, key: str) -> dict[str, Any]:
    """``result[key]`` if it is a JSON object, else an empty dict."""
    value = result.get(key) if isinstance(result, dict) else None
    return value if isinstance(value, dict) else {}


def _list(result: Result, key: str) -> list[Any]:
    """``result[key]`` if it is a JSON array, else an empty list."""
    value = result.get(key) if isinstance(result, dict) else None
    return value if isinstance(value, list) else []


def _dims(result: Result) -> tuple[int, int, int] | None:
    """Cluster shape ``(Nr, Nn, Ng)``, or None when it is missing or not positive integers."""
    cluster = _dict(result, "cluster")
    dims = tuple(cluster.get(k) for k in ("racks", "nodes_per_rack", "gpus_per_node"))
    if all(_is_int(d) and d > 0 for d in dims):
        return dims  # type: ignore[return-value]
    return None


def _workload_ints(result: Result) -> dict[str, int] | None:
    """``{"B", "R", "Lp", "Lr"}`` as positive integers, or None when any is unusable."""
    workload = _dict(result, "workload")
    values = {k: workload.get(k) for k in ("B", "R", "Lp", "Lr")}
    if all(_is_int(v) and v > 0 for v in values.values()):
        return values  # type: ignore[return-value]
    return None


def _nodes(result: Result) -> list[dict[str, Any]]:
    """The node objects of ``result["nodes"]`` (non-objects dropped)."""
    return [n for n in _list(result, "nodes") if isinstance(n, dict)]


def is_planless(result: Result) -> bool:
    """True for a "no feasible plan" result: ``plan`` and ``nodes`` are both empty lists.

    Such a file reports that a method found nothing (one of :data:`PLANLESS_STATUSES`:
    ``"infeasible"``, ``"time_limit"`` when it ran out of time before finding a plan,
    ``"unknown"`` or ``"error"`` when its engine could not tell or failed); it has no
    schedule to check, ``makespan`` may be null and ``peak_memory`` empty.
    """
    return isinstance(result, dict) and result.get("plan") == [] and result.get("nodes") == []


def _node_label(node: dict[str, Any]) -> str:
    """Short description of a node for messages: ``node 7 (comm critic_inf step 0 phase 1)``."""
    return (
        f"node {node.get('id')!r} ({node.get('kind')} {node.get('vertex')} "
        f"step {node.get('step')} phase {node.get('phase')})"
    )


def _timed(node: dict[str, Any]) -> bool:
    """True when the node has numeric ``start`` and ``finish``."""
    return _is_num(node.get("start")) and _is_num(node.get("finish"))


def _node_devices(node: dict[str, Any]) -> list[int]:
    """The integer device ids a node reserves (malformed entries dropped)."""
    devices = node.get("devices")
    if not isinstance(devices, list):
        return []
    return [d for d in devices if _is_int(d)]


def _geometry(entry: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """``(origin, extent)`` of a plan entry: three integers ``>= 0`` and ``>= 1``, else None."""
    origin, extent = entry.get("origin"), entry.get("extent")
    ok = _int_triple(origin, 0) and _int_triple(extent, 1)
    return (origin, extent) if ok else None  # type: ignore[return-value]


def flat_devices(origin: Sequence[int], extent: Sequence[int], dims: tuple[int, int, int]) -> set[int]:
    """Flat device ids of the hyper-rectangle ``D(origin, extent)``.

    Parameters
    ----------
    origin, extent
        ``[r, n, g]`` corner and ``[dr, dn, dg]`` size of the allocation.
    dims
        Cluster shape ``(Nr, Nn, Ng)``.

    Returns
    -------
    set of int
        ``{((r·Nn) + n)·Ng + g}`` over the rectangle (SPEC.md §2); coordinates outside the
        cluster are included as computed, so an out-of-range allocation yields ids that no
        legal node can match.

    Examples
    --------
    >>> sorted(flat_devices([0, 1, 2], [1, 1, 2], (1, 2, 4)))
    [6, 7]
    """
    _, Nn, Ng = dims
    return {
        (r * Nn + n) * Ng + g
        for r in range(origin[0], origin[0] + extent[0])
        for n in range(origin[1], origin[1] + extent[1])
        for g in range(origin[2], origin[2] + extent[2])
    }


def _allocations(result: Result) -> dict[str, set[int]]:
    """Flat device set per vertex name, for plan entries whose geometry is readable."""
    dims = _dims(result)
    out: dict[str, set[int]] = {}
    if dims is None:
        return out
    for entry in _list(result, "plan"):
        if not isinstance(entry, dict) or not isinstance(entry.get("vertex"), str):
            continue
        geometry = _geometry(entry)
        if geometry is not None and entry["vertex"] not in out:
            out[entry["vertex"]] = flat_devices(*geometry, dims)
    return out


# ---------------------------------------------------------------------------------------------
# 1. Format
# ---------------------------------------------------------------------------------------------


def _pos_int(x: Any) -> bool:
    return _is_int(x) and x > 0


def _nonneg_int(x: Any) -> bool:
    return _is_int(x) and x >= 0


def _nonneg_num(x: Any) -> bool:
    return _is_num(x) and x >= 0


def _int_triple(x: Any, minimum: int) -> bool:
    return isinstance(x, list) and len(x) == 3 and all(_is_int(v) and v >= minimum for v in x)


Kind = tuple[Callable[[Any], bool], str]
"""A field type: a predicate and its description for messages."""

STR: Kind = (lambda x: isinstance(x, str), "a string")
NONEMPTY_STR: Kind = (lambda x: isinstance(x, str) and x != "", "a non-empty string")
BOOL: Kind = (lambda x: isinstance(x, bool), "a bool")
POS_INT: Kind = (_pos_int, "a positive integer")
NONNEG_INT: Kind = (_nonneg_int, "a non-negative integer")
NUM: Kind = (_is_num, "a finite number")
POS_NUM: Kind = (lambda x: _is_num(x) and x > 0, "a positive finite number")
NONNEG_NUM: Kind = (_nonneg_num, "a non-negative finite number")

WORKLOAD_FIELDS: dict[str, Kind] = {
    "algorithm": STR,
    "B": POS_INT,
    "R": POS_INT,
    "Lp": POS_INT,
    "Lr": POS_INT,
}
MODEL_FIELDS: dict[str, Kind] = {
    "layers": POS_INT,
    "hidden": POS_INT,
    "params": POS_NUM,
    "trainable": BOOL,
}
CLUSTER_FIELDS: dict[str, Kind] = {
    "racks": POS_INT,
    "nodes_per_rack": POS_INT,
    "gpus_per_node": POS_INT,
    "gpu_memory_bytes": POS_NUM,
    "memory_headroom": (lambda x: _is_num(x) and 0 <= x < 1, "a number in [0, 1)"),
}
STRUCTURE_FIELDS: dict[str, Kind] = {
    "algorithm": STR,
    "ac_sharing": BOOL,
    "staleness": (
        lambda x: isinstance(x, dict) and all(_nonneg_int(v) for v in x.values()),
        "an object of non-negative integers",
    ),
}
VERTEX_FIELDS: dict[str, Kind] = {
    "name": STR,
    "role": (lambda x: x in ROLES, f"one of {ROLES}"),
    "model": STR,
}
PLAN_FIELDS: dict[str, Kind] = {
    "vertex": STR,
    "origin": (lambda x: _int_triple(x, 0), "3 integers >= 0"),
    "extent": (lambda x: _int_triple(x, 1), "3 integers >= 1"),
    "dp": POS_INT,
    "pp": POS_INT,
    "tp": POS_INT,
    "mb": POS_INT,
}
NODE_FIELDS: dict[str, Kind] = {
    "id": NONNEG_INT,
    "kind": (lambda x: x in NODE_KINDS, f"one of {NODE_KINDS}"),
    "vertex": STR,
    "step": NONNEG_INT,
    "phase": NONNEG_INT,
    "devices": (
        lambda x: isinstance(x, list) and all(_nonneg_int(d) for d in x),
        "a list of non-negative integer device ids",
    ),
    "start": NUM,
    "finish": NUM,
    "preds": (lambda x: isinstance(x, list) and all(_is_int(p) for p in x), "a list of ids"),
}
RESULT_FIELDS: dict[str, Kind] = {
    "k_eval": POS_INT,
    "makespan": POS_NUM,
    "throughput": NONNEG_NUM,
    "utilization": (lambda x: _is_num(x) and 0 <= x <= 1 + REL_TOL, "a number in [0, 1]"),
    "peak_memory": (
        lambda x: isinstance(x, list) and all(_nonneg_num(v) for v in x),
        "a list of non-negative finite numbers",
    ),
    "memory_feasible": BOOL,
    "method": NONEMPTY_STR,
    "status": NONEMPTY_STR,
    "objective_bound": (lambda x: x is None or _is_num(x), "null or a finite number"),
    "runtime_s": NONNEG_NUM,
    "evaluations": NONNEG_INT,
}

STATUSES = ("optimal", "feasible", "time_limit", "infeasible", "unknown", "error")
"""How a method may end (the ``status`` vocabulary)."""

PLAN_STATUSES = ("optimal", "feasible", "time_limit")
"""The statuses of a result whose method found a plan (``"infeasible"`` is allowed as well for a
plan that does not fit in memory, e.g. one given by hand and re-scored)."""

PLANLESS_STATUSES = ("infeasible", "time_limit", "unknown", "error")
"""The statuses a result without a plan may have (see :func:`is_planless`)."""

PLANLESS_FIELDS: dict[str, Kind] = {
    "makespan": (lambda x: x is None or (_is_num(x) and x > 0), "null or a positive number"),
}
"""Relaxations of :data:`RESULT_FIELDS` for a result without a plan (see :func:`is_planless`)."""


def _check_fields(errors: list[str], where: str, obj: dict[str, Any], fields: dict[str, Kind]) -> None:
    """Append a ``[format]`` violation for every field of ``fields`` missing or mistyped."""
    for key, (test, what) in fields.items():
        if key not in obj:
            errors.append(f"[format] {where}: missing key {key!r}")
        elif not test(obj[key]):
            errors.append(f"[format] {where}.{key} = {obj[key]!r} is not {what}")


def _check_object(
    errors: list[str], result: Result, key: str, fields: dict[str, Kind]
) -> dict[str, Any] | None:
    """Check ``result[key]`` is an object with ``fields``; return it, or None if unusable."""
    if key not in result:
        return None  # reported as a missing top-level key
    obj = result[key]
    if not isinstance(obj, dict):
        errors.append(f"[format] {key} is not an object")
        return None
    _check_fields(errors, key, obj, fields)
    return obj


def _check_collection(
    errors: list[str], result: Result, key: str, fields: dict[str, Kind], mapping: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """Check each member of the list (or, with ``mapping``, object) ``result[key]``.

    Returns the ``(where, member)`` pairs whose member is an object.
    """
    if key not in result:
        return []
    value = result[key]
    if mapping:
        if not isinstance(value, dict) or not value:
            errors.append(f"[format] {key} is not a non-empty object")
            return []
        members = [(f"{key}[{k!r}]", v) for k, v in value.items()]
    else:
        if not isinstance(value, list):
            errors.append(f"[format] {key} is not a list")
            return []
        members = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    out = []
    for where, member in members:
        if not isinstance(member, dict):
            errors.append(f"[format] {where} is not an object")
            continue
        _check_fields(errors, where, member, fields)
        out.append((where, member))
    return out


def _check_quantiles(errors: list[str], workload: dict[str, Any]) -> None:
    """Quantiles ``[[f1, t1], ..., [fQ, tQ]]``: 0 < f increasing to 1, t non-decreasing to Lr."""
    quantiles = workload.get("quantiles")
    if not isinstance(quantiles, list) or not quantiles:
        errors.append(f"[format] workload.quantiles = {quantiles!r} is not a non-empty list")
        return
    for q in quantiles:
        if not (isinstance(q, list) and len(q) == 2 and all(_is_num(v) for v in q)):
            errors.append(f"[format] workload.quantiles entry {q!r} is not a pair of numbers")
            return
    fractions = [q[0] for q in quantiles]
    lengths = [q[1] for q in quantiles]
    if fractions[0] <= 0 or any(b <= a for a, b in itertools.pairwise(fractions)):
        errors.append(f"[format] workload.quantiles fractions {fractions} must increase from > 0")
    if not _close(fractions[-1], 1.0):
        errors.append(f"[format] workload.quantiles last fraction {fractions[-1]!r} is not 1")
    if lengths[0] < 0 or any(b < a for a, b in itertools.pairwise(lengths)):
        errors.append(f"[format] workload.quantiles lengths {lengths} must be non-decreasing")
    Lr = workload.get("Lr")
    if _is_num(Lr) and not _close(lengths[-1], Lr):
        errors.append(f"[format] workload.quantiles last length {lengths[-1]!r} is not Lr = {Lr}")


def _check_node_extras(errors: list[str], where: str, node: dict[str, Any]) -> None:
    """Node rules beyond field types: ≥ 1 distinct device, ``bytes`` on COMM/RESHARD."""
    devices = node.get("devices")
    if isinstance(devices, list):
        if not devices:
            errors.append(f"[format] {where} reserves no device (devices is empty)")
        elif len(set(map(repr, devices))) != len(devices):
            errors.append(f"[format] {where}.devices {devices} lists a device twice")
    if node.get("kind") in ("comm", "reshard"):
        _check_fields(errors, where, node, {"bytes": NONNEG_NUM})
    if "source" in node and not isinstance(node["source"], str):
        errors.append(f"[format] {where}.source = {node['source']!r} is not a string")


def check_format(result: Result) -> list[str]:
    """Check the format string, the required keys and the types of every field.

    Integers (``B``, ``layers``, ``dp``, ``step``, device ids, ...) must be JSON integers;
    quantities (times, bytes, memory) finite numbers; unknown extra keys are allowed. Vertex
    models must be keys of ``models``, node ids unique, and every node must reserve at least
    one device; COMM/RESHARD nodes carry ``bytes``. A planless result (:func:`is_planless`)
    may have a null ``makespan`` but must say a status of :data:`PLANLESS_STATUSES`
    (``"infeasible"``, ``"time_limit"``, ``"unknown"`` or ``"error"``),
    ``memory_feasible = false`` and ``throughput = 0``.

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[format]`` violations.
    """
    if not isinstance(result, dict):
        return [f"[format] the result is a {type(result).__name__}, not a JSON object"]
    errors: list[str] = []
    if result.get("format") not in FORMATS:
        errors.append(f"[format] format = {result.get('format')!r}, expected one of {FORMATS!r}")
    errors.extend(f"[format] missing top-level key {k!r}" for k in TOP_LEVEL_KEYS if k not in result)

    workload = _check_object(errors, result, "workload", WORKLOAD_FIELDS)
    if workload is not None:
        _check_quantiles(errors, workload)
    _check_object(errors, result, "cluster", CLUSTER_FIELDS)
    structure = _check_object(errors, result, "structure", STRUCTURE_FIELDS)
    if structure is not None and workload is not None:
        ours, theirs = structure.get("algorithm"), workload.get("algorithm")
        if isinstance(ours, str) and isinstance(theirs, str) and ours != theirs:
            errors.append(f"[format] structure.algorithm {ours!r} differs from workload.algorithm {theirs!r}")
    _check_collection(errors, result, "models", MODEL_FIELDS, mapping=True)
    models = _dict(result, "models")
    vertices = _check_collection(errors, result, "vertices", VERTEX_FIELDS)
    if "vertices" in result and not vertices:
        errors.append("[format] vertices holds no vertex")
    for where, vertex in vertices:
        if "sequences" in vertex and not _pos_int(vertex["sequences"]):
            errors.append(f"[format] {where}.sequences = {vertex['sequences']!r} is not a positive integer")
        if isinstance(vertex.get("model"), str) and vertex["model"] not in models:
            errors.append(f"[format] {where}.model {vertex['model']!r} is not a key of models")
    _check_collection(errors, result, "plan", PLAN_FIELDS)
    ids: dict[int, str] = {}
    for where, node in _check_collection(errors, result, "nodes", NODE_FIELDS):
        _check_node_extras(errors, where, node)
        node_id = node.get("id")
        if _is_int(node_id):
            if node_id in ids:
                errors.append(f"[format] {where}: id {node_id} already used by {ids[node_id]}")
            else:
                ids[node_id] = where
    fields = dict(RESULT_FIELDS)
    if is_planless(result):
        fields.update(PLANLESS_FIELDS)
    for key, (test, what) in fields.items():
        if key in result and not test(result[key]):
            errors.append(f"[format] {key} = {result[key]!r} is not {what}")
    _check_status(errors, result)
    if is_planless(result):
        if result.get("status") not in PLANLESS_STATUSES:
            errors.append(
                f"[format] a result without plan and nodes must have status 'infeasible' (proven or "
                f"explained), 'time_limit' (nothing found in time), 'unknown' or 'error' (the engine "
                f"could not tell, or failed), not {result.get('status')!r}"
            )
        for key, want in (("memory_feasible", False), ("throughput", 0)):
            if key in result and result[key] != want:
                errors.append(
                    f"[format] a result without plan and nodes must have {key} = {want!r}, "
                    f"not {result[key]!r}"
                )
    return errors


def _check_status(errors: list[str], result: Result) -> None:
    """``status`` is one of :data:`STATUSES`; with a plan, one of :data:`PLAN_STATUSES`, or
    ``"infeasible"`` when ``memory_feasible`` is false (the planless rule is in the caller)."""
    status = result.get("status")
    if not isinstance(status, str) or not status:
        return  # reported by the field check
    if status not in STATUSES:
        errors.append(f"[format] status = {status!r} is not one of {STATUSES}")
        return
    plan = result.get("plan")
    if not isinstance(plan, list) or not plan or status in PLAN_STATUSES:
        return
    if status != "infeasible" or result.get("memory_feasible") is not False:
        errors.append(
            f"[format] a result with a plan must have status {' / '.join(PLAN_STATUSES)} (or "
            f"'infeasible' for a plan that does not fit in memory), not {status!r}"
        )


# ---------------------------------------------------------------------------------------------
# 2. Precedence
# ---------------------------------------------------------------------------------------------


def _find_cycle(remaining: set[int], preds: dict[int, list[int]]) -> list[int]:
    """One cycle among ``remaining`` ids, each of which has a pred inside ``remaining``."""
    start = min(remaining)
    order: list[int] = []
    seen: dict[int, int] = {}
    current = start
    while current not in seen:
        seen[current] = len(order)
        order.append(current)
        current = next(p for p in preds[current] if p in remaining)
    cycle = order[seen[current] :]
    cycle.reverse()  # pred → succ order reads more naturally
    return cycle


def check_precedence(result: Result) -> list[str]:
    """Check the predecessor graph and that no node starts before a predecessor finishes.

    Verified: ``0 <= start <= finish``; every pred id names an existing node; the pred graph is
    acyclic; ``start(v) >= finish(u)`` for every pred ``u`` of ``v`` (up to a relative 1e-9
    plus absolute 1e-12 tolerance); and ``step(u) <= step(v)`` (unrolling only adds edges within
    a step or towards later steps, SPEC.md §5).

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[precedence]`` violations.
    """
    errors: list[str] = []
    nodes = _nodes(result)
    by_id: dict[int, dict[str, Any]] = {}
    for node in nodes:
        if _is_int(node.get("id")):
            by_id.setdefault(node["id"], node)

    for node in nodes:
        if not _timed(node):
            continue
        start, finish = node["start"], node["finish"]
        if start < 0:
            errors.append(f"[precedence] {_node_label(node)} starts at {_fmt(start)} < 0")
        if finish < start:
            errors.append(
                f"[precedence] {_node_label(node)} finishes at {_fmt(finish)} before its start {_fmt(start)}"
            )

    preds: dict[int, list[int]] = {}
    for node_id, node in by_id.items():
        known = []
        raw = node.get("preds")
        for p in raw if isinstance(raw, list) else []:
            if not _is_int(p):
                continue
            if p not in by_id:
                errors.append(f"[precedence] {_node_label(node)} has unknown pred id {p}")
                continue
            known.append(p)
            pred = by_id[p]
            if _timed(node) and _timed(pred) and not _le(pred["finish"], node["start"]):
                errors.append(
                    f"[precedence] {_node_label(node)} starts at {_fmt(node['start'])} before "
                    f"pred {p} finishes at {_fmt(pred['finish'])}"
                )
            steps = (pred.get("step"), node.get("step"))
            if all(_is_int(s) for s in steps) and steps[0] > steps[1]:
                errors.append(f"[precedence] {_node_label(node)} has pred {p} from a later step {steps[0]}")
        preds[node_id] = known

    # Kahn's algorithm; whatever cannot be ordered lies on or behind a cycle.
    indegree = {v: len(ps) for v, ps in preds.items()}
    succs: dict[int, list[int]] = {v: [] for v in preds}
    for v, ps in preds.items():
        for p in ps:
            succs[p].append(v)
    ready = [v for v, d in indegree.items() if d == 0]
    while ready:
        v = ready.pop()
        for s in succs[v]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    remaining = {v for v, d in indegree.items() if d > 0}
    if remaining:
        cycle = _find_cycle(remaining, preds)
        path = " -> ".join(str(v) for v in [*cycle, cycle[0]])
        errors.append(
            f"[precedence] the pred graph has a cycle ({path}); {len(remaining)} node(s) cannot be ordered"
        )
    return errors


# ---------------------------------------------------------------------------------------------
# 3. Device exclusivity
# ---------------------------------------------------------------------------------------------


def check_device_exclusivity(result: Result) -> list[str]:
    """Check that the nodes reserving a device never overlap in time on it.

    Every node reserves the devices it lists for ``[start, finish)``. On each device the
    intervals of positive length must be pairwise disjoint: two intervals conflict when their
    common part ``min(finish) - max(start)`` exceeds the tolerance (1e-9 relative + 1e-12
    absolute); zero-length intervals never conflict. Device ids must lie in ``[0, Nr·Nn·Ng)``.

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[exclusivity]`` violations, one per overlapping pair found by a sweep.
    """
    errors: list[str] = []
    dims = _dims(result)
    n_devices = math.prod(dims) if dims else None
    per_device: dict[int, list[tuple[float, float, dict[str, Any]]]] = {}
    for node in _nodes(result):
        devices = _node_devices(node)
        if n_devices is not None:
            bad = [d for d in devices if not 0 <= d < n_devices]
            if bad:
                errors.append(
                    f"[exclusivity] {_node_label(node)} reserves device(s) {bad} outside 0..{n_devices - 1}"
                )
        if not _timed(node) or node["finish"] <= node["start"]:
            continue
        for d in set(devices):
            per_device.setdefault(d, []).append((node["start"], node["finish"], node))

    for device in sorted(per_device):
        intervals = sorted(per_device[device], key=lambda iv: (iv[0], iv[1]))
        holder: tuple[float, float, dict[str, Any]] | None = None
        for interval in intervals:
            start, finish, node = interval
            # The earlier interval reaching furthest right has the longest common part with
            # this one; a common part no longer than the tolerance is rounding, not a clash.
            shared_end = min(finish, holder[1]) if holder is not None else start
            if holder is not None and shared_end - start > _tol(shared_end, start):
                errors.append(
                    f"[exclusivity] device {device}: {_node_label(node)} "
                    f"[{_fmt(start)}, {_fmt(finish)}) overlaps {_node_label(holder[2])} "
                    f"[{_fmt(holder[0])}, {_fmt(holder[1])})"
                )
            if holder is None or finish > holder[1]:
                holder = interval
    return errors


# ---------------------------------------------------------------------------------------------
# 4. Makespan, 5. Throughput
# ---------------------------------------------------------------------------------------------


def check_makespan(result: Result) -> list[str]:
    """Check ``makespan == max finish`` over all nodes (relative tolerance 1e-9).

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[makespan]`` violations.
    """
    makespan = result.get("makespan") if isinstance(result, dict) else None
    finishes = [n["finish"] for n in _nodes(result) if _is_num(n.get("finish"))]
    if not finishes or not _is_num(makespan):
        return []
    latest = max(finishes)
    if not _close(makespan, latest):
        return [f"[makespan] makespan {_fmt(makespan)} != max node finish {_fmt(latest)}"]
    return []


def _mean_response(result: Result) -> float | None:
    """``Ē = Σ_q (f_q − f_{q−1})·(t_{q−1} + t_q)/2`` from the workload's quantiles (SPEC.md
    §14.1), or None when they are unusable."""
    quantiles = _dict(result, "workload").get("quantiles")
    if not isinstance(quantiles, list) or not quantiles:
        return None
    mean, prev_f, prev_t = 0.0, 0.0, 0
    for pair in quantiles:
        if not (isinstance(pair, list) and len(pair) == 2 and _is_num(pair[0]) and _is_num(pair[1])):
            return None
        f, t = pair
        mean += (f - prev_f) * (prev_t + t) / 2
        prev_f, prev_t = f, t
    return mean


def check_throughput(result: Result) -> list[str]:
    """Check ``throughput == k_eval·B·R·(Lp + Ē) / makespan`` (tokens/s, relative 1e-6), with
    ``Ē`` the mean response of the quantiles (SPEC.md §14.1; a ``/1`` file: ``Lr``, padded).

    For a result with ``memory_feasible = false`` the memory-penalised score of SPEC.md §7,
    ``raw·exp(-40·max(0, max(peak_memory)/M_eff - 1))``, is accepted as well.

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[throughput]`` violations.
    """
    if not isinstance(result, dict):
        return []
    work = _workload_ints(result)
    k_eval, makespan, throughput = (result.get(k) for k in ("k_eval", "makespan", "throughput"))
    if work is None or not _is_int(k_eval) or not _is_num(throughput):
        return []
    if not _is_num(makespan) or makespan <= 0:
        return []
    response = work["Lr"] if result.get("format") == "rpeg.result/1" else _mean_response(result)
    if response is None:
        return []
    tokens = k_eval * work["B"] * work["R"] * (work["Lp"] + response)
    expected = tokens / makespan
    if _close(throughput, expected, THROUGHPUT_REL_TOL):
        return []
    if result.get("memory_feasible") is False:
        cluster = _dict(result, "cluster")
        peaks = [p for p in _list(result, "peak_memory") if _is_num(p)]
        m_gpu, eps = cluster.get("gpu_memory_bytes"), cluster.get("memory_headroom")
        if peaks and _is_num(m_gpu) and _is_num(eps) and m_gpu * (1 - eps) > 0:
            excess = max(0.0, max(peaks) / (m_gpu * (1 - eps)) - 1)
            if _close(throughput, expected * math.exp(-BETA_OOM * excess), THROUGHPUT_REL_TOL):
                return []
    rel = abs(throughput - expected) / max(abs(expected), ABS_TOL)
    return [
        f"[throughput] throughput {_fmt(throughput)} != k_eval·B·R·(Lp+Ē)/makespan = "
        f"{tokens}/{_fmt(makespan)} = {_fmt(expected)} (relative error {rel:.3g})"
    ]


# ---------------------------------------------------------------------------------------------
# 6. Plan legality P1–P8, H1–H2
# ---------------------------------------------------------------------------------------------


def _legal_shape(extent: Sequence[int], dims: tuple[int, int, int]) -> bool:
    """Legal shape: ``(1,1,e)``, ``e|Ng``; ``(1,k,Ng)``, ``k|Nn``; ``(j,Nn,Ng)``, ``j|Nr``."""
    Nr, Nn, Ng = dims
    dr, dn, dg = extent
    if dr == 1 and dn == 1 and Ng % dg == 0:
        return True
    if dr == 1 and dg == Ng and Nn % dn == 0:
        return True
    return dn == Nn and dg == Ng and Nr % dr == 0


def _check_entry(
    entry: dict[str, Any],
    L: int | None,
    BR: int | None,
    dims: tuple[int, int, int],
    batch: str = "B·R",
    role: Any = "generation",
) -> list[str]:
    """P1–P8 for one plan entry; ``L``/``BR`` None skip the rules that need them.

    ``BR`` is the number of sequences the vertex processes and ``batch`` its name in messages.
    P4–P5 are SPEC.md §4's for a generation (and for every vertex of a ``/1`` file, passed as
    ``role="generation"``); for training and inference SPEC.md §14.2's: ``1 ≤ mb ≤ B_local``
    and ``pp > 1 ⇒ mb ≥ pp``.
    """
    Nr, Nn, Ng = dims
    dp, pp, tp, mb = (entry[k] for k in ("dp", "pp", "tp", "mb"))
    who = f"[plan] {entry['vertex']} (dp={dp} pp={pp} tp={tp} mb={mb})"
    errors: list[str] = []
    # SPEC §15 (absent in files before it): cp splits sequences, ep shards experts, sp with TP
    cp, ep, sp = entry.get("cp", 1), entry.get("ep", 1), entry.get("sp", False)
    if not (_pos_int(cp) and _pos_int(ep) and isinstance(sp, bool)):
        return [f"{who}: cp={cp!r} and ep={ep!r} must be positive integers and sp={sp!r} a boolean"]
    if entry.get("cp_kind", "ring") not in ("ring", "ulysses") or (
        cp == 1 and entry.get("cp_kind", "ring") != "ring"
    ):
        errors.append(f"{who}: C1 cp_kind={entry.get('cp_kind')!r} must be 'ring' or (with cp > 1) 'ulysses'")
    forward_only = role not in ("training", "inference")
    if cp > 1 and forward_only:
        errors.append(f"{who}: C1 cp={cp} on a {role} vertex (only training and inference split sequences)")
    if sp and (forward_only or tp == 1):
        errors.append(f"{who}: S1 sp needs tp > 1 on a training or inference vertex")
    # the experts' tensor-parallel degree (absent in files before it): null = tp, or 1
    etp = entry.get("etp")
    folded = etp is not None and etp != tp
    if folded and (etp != 1 or forward_only or not sp):
        errors.append(f"{who}: E4 etp={etp!r} must be null, tp or (training, inference, with sp) 1")
    group = tp * dp * cp if folded else dp * cp
    if ep > 1 and ((forward_only and ep != dp) or (not forward_only and group % ep)):
        errors.append(
            f"{who}: E2 ep={ep} must divide dp·cp (tp·dp·cp with etp=1; training, inference) or equal "
            "dp (generation)"
        )
    # the overlapped expert-parallel AlltoAlls (absent in files before it)
    if entry.get("ep_overlap", False):
        if role != "training" or ep == 1:
            errors.append(f"{who}: E5 ep_overlap needs a training vertex with ep > 1")
        if entry.get("recompute") == "full":
            errors.append(f"{who}: E5 ep_overlap with full recomputation")
        if pp > 1 and entry.get("vp", 1) == 1:
            errors.append(f"{who}: E5 ep_overlap with pp={pp} needs an interleaved pipeline (vp > 1)")
    # the flex dispatcher (absent in files before it)
    if entry.get("flex_dispatch", False) and (forward_only or ep == 1):
        errors.append(f"{who}: E6 flex_dispatch needs a training or inference vertex with ep > 1")
    # the interleaved pipeline (absent in files before it): vp chunks per stage
    vp = entry.get("vp", 1)
    if not _pos_int(vp):
        errors.append(f"{who}: vp={vp!r} must be a positive integer")
    elif vp > 1:
        if forward_only or pp == 1:
            errors.append(f"{who}: V1 vp={vp} needs pp > 1 on a training or inference vertex")
        elif L is not None and L % pp == 0 and (L // pp) % vp:
            errors.append(f"{who}: V2 vp={vp} does not divide the {L // pp} layers of a stage")
        if pp > 1 and mb % pp:
            errors.append(f"{who}: V3 mb={mb} is not a multiple of pp={pp} (interleaved schedule)")
    # P1: tensor parallelism stays inside a node.
    if Ng % tp:
        errors.append(f"{who}: P1 tp={tp} does not divide gpus_per_node={Ng}")
    # P2: pipeline stages split the layers evenly; pp is 1 or even.
    if L is not None and L % pp:
        errors.append(f"{who}: P2 pp={pp} does not divide layers={L}")
    if pp != 1 and pp % 2:
        errors.append(f"{who}: P2 pp={pp} is odd (must be 1 or even)")
    # P3, P4, P5: batch split over replicas and microbatches.
    if BR is not None and BR % dp:
        errors.append(f"{who}: P3 dp={dp} does not divide {batch}={BR}")
    if role in ("training", "inference"):
        if BR is not None and BR % dp == 0 and mb > BR // dp:
            errors.append(f"{who}: P4 mb={mb} exceeds B_local={BR // dp}")
        if pp > 1 and mb < pp:
            errors.append(f"{who}: P5 mb={mb} < pp={pp}")
    elif pp == 1 and mb != 1:
        errors.append(f"{who}: P4 pp=1 requires mb=1")
    if pp > 1 and BR is not None and role not in ("training", "inference"):
        if BR % dp:
            errors.append(f"{who}: P5 B_local = {batch}/dp = {BR}/{dp} is not an integer")
        else:
            b_local = BR // dp
            if b_local % mb:
                errors.append(f"{who}: P5 mb={mb} does not divide B_local={b_local}")
            if mb < pp:
                errors.append(f"{who}: P5 mb={mb} < pp={pp}")
            if b_local < 8 * mb:
                errors.append(f"{who}: P5 B_local/mb = {b_local}/{mb} < 8")
    geometry = _geometry(entry)
    if geometry is None:
        return errors
    origin, extent = geometry
    size = math.prod(extent)
    # P6/P8: the allocation holds exactly dp·pp·tp·cp devices.
    if size != dp * pp * tp * cp:
        degrees = "dp·pp·tp·cp" if cp > 1 else "dp·pp·tp"
        errors.append(f"{who}: P6/P8 extent {extent} has {size} devices, {degrees} = {dp * pp * tp * cp}")
    # P6: legal shape and replica layout.
    if not _legal_shape(extent, dims):
        errors.append(
            f"{who}: P6 extent {extent} is not (1,1,e) with e|{Ng}, (1,k,{Ng}) with k|{Nn}, "
            f"or (j,{Nn},{Ng}) with j|{Nr}"
        )
    replica = pp * tp * cp
    if not ((replica <= Ng and Ng % replica == 0) or replica % Ng == 0):
        errors.append(
            f"{who}: P6 a replica of {'pp·tp·cp' if cp > 1 else 'pp·tp'}={replica} GPUs neither fits a node evenly nor spans "
            f"whole nodes of {Ng}"
        )
    # P7: aligned origin inside the cluster.
    for axis, (o, e, n) in enumerate(zip(origin, extent, dims, strict=True)):
        name = ("rack", "node", "gpu")[axis]
        if o % e:
            errors.append(f"{who}: P7 origin {origin} not aligned to extent {extent} ({name} axis)")
        if o + e > n:
            errors.append(
                f"{who}: P7 origin {origin} + extent {extent} leaves the cluster ({name} axis, size {n})"
            )
    # P8: exact packing of stages into nodes.
    s = min(pp, max(1, Ng // (tp * cp)))
    if pp % s:
        per_node = "max(1, Ng//(tp·cp))" if cp > 1 else "Ng//tp"
        errors.append(f"{who}: P8 s = min(pp, {per_node}) = {s} does not divide pp={pp}")
    return errors


def _model_heads(model: Any) -> tuple[int, int] | None:
    """``(heads, kv_heads)`` of a ``models`` entry: its own ``heads``/``kv_heads`` keys, else
    those of its ``spec`` object (``kv_heads`` defaults to ``heads``); None when absent."""
    if not isinstance(model, dict):
        return None
    for src in (model, model.get("spec")):
        if isinstance(src, dict) and _pos_int(src.get("heads")):
            kv = src.get("kv_heads", src["heads"])
            if _pos_int(kv):
                return src["heads"], kv
    return None


def _check_heads(entry: dict[str, Any], heads: int, kv_heads: int, role: Any) -> list[str]:
    """H1–H2 for one plan entry: the engine running the vertex must be able to shard the heads.

    Generation runs on vLLM, inference and training on Megatron-core:

    - H1 (both) ``heads % tp == 0`` — Megatron-core ``TransformerConfig.__post_init__``
      (megatron/core/transformer/transformer_config.py), vLLM
      ``ModelConfig.verify_with_parallel_config`` (vllm/config/model.py);
    - H2 Megatron-core ``kv_heads % tp == 0`` (``num_query_groups``, same ``__post_init__``);
    - H2 vLLM ``kv_heads % tp == 0 or tp % kv_heads == 0`` (``QKVParallelLinear`` in
      vllm/model_executor/layers/linear.py replicates KV heads when ``tp > kv_heads``).
    """
    tp = entry["tp"]
    engine = "vLLM" if role == "generation" else "Megatron-core"
    who = f"[plan] {entry['vertex']} (dp={entry['dp']} pp={entry['pp']} tp={tp} mb={entry['mb']})"
    if heads % tp:
        return [f"{who}: H1 ({engine}) tp={tp} does not divide heads={heads}"]
    if engine == "vLLM":
        if kv_heads % tp and tp % kv_heads:
            return [
                f"{who}: H2 ({engine}) tp={tp} neither divides kv_heads={kv_heads} nor is a multiple of it"
            ]
    elif kv_heads % tp:
        return [f"{who}: H2 ({engine}) tp={tp} does not divide kv_heads={kv_heads} (query groups)"]
    return []


def check_plan_legality(result: Result) -> list[str]:
    """Check rules P1–P8 of SPEC.md §4 and the head rules H1–H2 for every plan entry.

    With ``L`` the layers of the entry's model, ``B·R`` the sequences the vertex processes
    and ``(Nr, Nn, Ng)`` the cluster:

    - P1 ``tp | Ng``; P2 ``pp | L`` and ``pp ∈ {1} ∪ even``; P3 ``dp | B·R``;
    - P4 ``pp = 1 ⇒ mb = 1``; P5 ``pp > 1 ⇒`` ``B_local = B·R/dp`` integral, ``mb | B_local``,
      ``mb ≥ pp``, ``B_local/mb ≥ 8``;
    - P6 ``|extent| = dp·pp·tp``, extent ``(1,1,e)``, ``e | Ng``, or ``(1,k,Ng)``, ``k | Nn``,
      or ``(j,Nn,Ng)``, ``j | Nr``; a replica of ``pp·tp`` GPUs fits a node evenly
      (``pp·tp | Ng``) or spans whole nodes (``Ng | pp·tp``);
    - P7 ``origin[i] % extent[i] == 0`` and ``origin + extent`` inside the cluster;
    - P8 ``s = min(pp, ⌊Ng/tp⌋)`` divides ``pp``;
    - SPEC.md §15 (fields absent in older files): the allocation holds ``dp·pp·tp·cp`` devices,
      a replica ``pp·tp·cp`` and ``s = min(pp, max(1, ⌊Ng/(tp·cp)⌋))``; C1 ``cp > 1`` and S1
      ``sp`` only on training and inference (``sp`` with ``tp > 1``); E2 ``ep | dp·cp``
      (training, inference) or ``ep = dp`` (generation);
    - the interleaved pipeline (``vp``, absent in older files): V1 ``vp > 1`` only on training
      and inference with ``pp > 1``, V2 ``vp | L/pp``, V3 ``pp | mb``;
    - ``recompute`` (optional): one of ``none``, ``selective``, ``full`` for a training vertex,
      ``null`` for the others (:func:`_check_recompute`);
    - H1 ``tp | heads``; H2 ``tp | kv_heads`` for inference and training (Megatron-core),
      ``tp | kv_heads`` or ``kv_heads | tp`` for generation (vLLM) — see :func:`_check_heads`.
      ``heads``/``kv_heads`` come from the model entry (or its ``spec``); without them H1–H2
      are skipped.

    ``B·R`` is the workload's ``B·R``, unless the vertex states its own ``sequences`` (an
    optional positive integer the package writes: a ReMax reward inference scores the ``B·R``
    sampled and the ``B`` greedy responses, a greedy-baseline generation produces ``B``).

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[plan]`` violations naming the rule (``P1`` ... ``P8``, ``H1``, ``H2``).
    """
    dims = _dims(result)
    if dims is None:
        return []
    work = _workload_ints(result)
    BR = work["B"] * work["R"] if work else None
    models = _dict(result, "models")
    named = [v for v in _list(result, "vertices") if isinstance(v, dict) and isinstance(v.get("name"), str)]
    vertex_model = {v["name"]: v.get("model") for v in named}
    # a role of the wrong type is reported by check_format; here it reads as unknown
    vertex_role = {v["name"]: v.get("role") if isinstance(v.get("role"), str) else None for v in named}
    vertex_sequences = {v["name"]: v["sequences"] for v in named if _pos_int(v.get("sequences"))}
    errors: list[str] = []
    for entry in _list(result, "plan"):
        if not isinstance(entry, dict) or not isinstance(entry.get("vertex"), str):
            continue
        if not all(_pos_int(entry.get(k)) for k in ("dp", "pp", "tp", "mb")):
            continue  # reported by check_format
        model_name = vertex_model.get(entry["vertex"])
        model = models.get(model_name) if isinstance(model_name, str) else None
        layers = model.get("layers") if isinstance(model, dict) else None
        L = layers if _pos_int(layers) else None
        role = vertex_role.get(entry["vertex"]) if result.get("format") == FORMAT else "generation"
        if entry["vertex"] in vertex_sequences:
            sequences = vertex_sequences[entry["vertex"]]
            errors.extend(_check_entry(entry, L, sequences, dims, "sequences", role))
        else:
            errors.extend(_check_entry(entry, L, BR, dims, role=role))
        errors.extend(_check_engine_fields(entry, vertex_role.get(entry["vertex"])))
        heads = _model_heads(model)
        if heads is not None:
            errors.extend(_check_heads(entry, heads[0], heads[1], vertex_role.get(entry["vertex"])))
        errors.extend(_check_recompute(entry, vertex_role.get(entry["vertex"])))
    return errors


ZERO_STAGES = {"training": (1, 2, 3), "inference": (2, 3), "generation": (2,)}
"""ZeRO stages each role may use (SPEC.md §14.3; rule Z1)."""


def _check_engine_fields(entry: dict[str, Any], role: Any) -> list[str]:
    """Z1–Z2, Z4 (SPEC.md §14): ``zero`` a stage the role may use; ``mem_fraction`` in [0, 1] and
    non-zero only for a generation; ``logits_chunk`` a non-negative integer and ``packing`` a
    boolean, a generation keeping 0 and true; ``offload`` a boolean (SPEC.md §14.4). Absent or
    ``null`` fields (a ``/1`` entry) pass."""
    who = f"[plan] {entry['vertex']}"
    errors: list[str] = []
    zero, u = entry.get("zero"), entry.get("mem_fraction")
    chunk, packing = entry.get("logits_chunk"), entry.get("packing")
    if zero is not None and (not _is_int(zero) or zero not in ZERO_STAGES.get(role, (1, 2, 3))):
        errors.append(f"{who}: Z1 zero={zero!r} is not a ZeRO stage a {role} vertex may use")
    if u is not None and (not _is_num(u) or not 0 <= u <= 1 or (u and role != "generation")):
        errors.append(f"{who}: Z2 mem_fraction={u!r} must be in [0, 1] and 0 unless a generation")
    if chunk is not None and (not _is_int(chunk) or chunk < 0 or (chunk and role == "generation")):
        errors.append(f"{who}: Z2 logits_chunk={chunk!r} must be a non-negative integer, 0 for a generation")
    if packing is not None and (not isinstance(packing, bool) or (not packing and role == "generation")):
        errors.append(f"{who}: Z2 packing={packing!r} must be true or false, true for a generation")
    offload = entry.get("offload")
    if offload is not None and not isinstance(offload, bool):
        errors.append(f"{who}: Z4 offload={offload!r} must be true or false")
    return errors


RECOMPUTE_MODES = ("none", "selective", "full")
"""Activation-recomputation modes of a training plan entry (its optional ``recompute`` key)."""


def _check_recompute(entry: dict[str, Any], role: Any) -> list[str]:
    """``recompute`` of a plan entry: absent or ``null`` (a training entry then means ``"full"``),
    one of :data:`RECOMPUTE_MODES` for a training vertex, ``null`` for any other role."""
    value = entry.get("recompute")
    if value is None:
        return []
    who = f"[plan] {entry['vertex']}"
    if role != "training":
        return [f"{who}: recompute={value!r} on a {role} vertex (only training recomputes; must be null)"]
    if value not in RECOMPUTE_MODES:
        return [f"{who}: recompute={value!r} is not one of {', '.join(RECOMPUTE_MODES)}"]
    return []


# ---------------------------------------------------------------------------------------------
# 7. Bindings: nodes ↔ vertices ↔ allocations
# ---------------------------------------------------------------------------------------------


def check_bindings(result: Result) -> list[str]:
    """Check that nodes are bound to the plan and that every vertex runs in every step.

    Verified: vertex names are unique; each vertex has exactly one plan entry and each plan
    entry names a vertex; every node names a known ``vertex`` (and ``source``, when present),
    has ``0 <= step < k_eval`` and ``0 <= phase <= Q`` (Q = number of quantiles); an OP node
    reserves exactly the flat devices of its vertex's allocation, a COMM/RESHARD node exactly
    those of its destination (its ``vertex``); a node with a ``source`` has a direct pred
    belonging to that source vertex; every vertex has at least one OP node in each step
    ``0..k_eval-1``, with distinct phases, never mixing the unsplit phase 0 with split phases
    (waived, with the plan-entry rule, for a planless result, :func:`is_planless`).

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[bindings]`` violations.
    """
    errors: list[str] = []
    names: list[str] = [
        v["name"] for v in _list(result, "vertices") if isinstance(v, dict) and isinstance(v.get("name"), str)
    ]
    vertex_set = set(names)
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"[bindings] vertex name {name!r} appears more than once")

    planned: list[str] = [
        e["vertex"] for e in _list(result, "plan") if isinstance(e, dict) and isinstance(e.get("vertex"), str)
    ]
    for name in sorted(set(planned)):
        if name not in vertex_set:
            errors.append(f"[bindings] plan entry for unknown vertex {name!r}")
        if planned.count(name) > 1:
            errors.append(f"[bindings] vertex {name!r} has {planned.count(name)} plan entries")
    planless = is_planless(result)
    for name in names:
        if name not in planned and not planless:
            errors.append(f"[bindings] vertex {name!r} has no plan entry")

    allocations = _allocations(result)
    k_eval = result.get("k_eval") if isinstance(result, dict) else None
    quantiles = _dict(result, "workload").get("quantiles")
    Q = len(quantiles) if isinstance(quantiles, list) else None
    nodes = _nodes(result)
    by_id = {n["id"]: n for n in nodes if _is_int(n.get("id"))}
    op_phases: dict[tuple[str, int], list[int]] = {}

    for node in nodes:
        vertex, step, phase = node.get("vertex"), node.get("step"), node.get("phase")
        if isinstance(vertex, str) and vertex not in vertex_set:
            errors.append(f"[bindings] {_node_label(node)} names unknown vertex {vertex!r}")
        source = node.get("source")
        if isinstance(source, str) and source not in vertex_set:
            errors.append(f"[bindings] {_node_label(node)} names unknown source {source!r}")
        if _is_int(step) and _is_int(k_eval) and not 0 <= step < k_eval:
            errors.append(f"[bindings] {_node_label(node)} step {step} outside 0..{k_eval - 1}")
        if _is_int(phase) and Q is not None and not 0 <= phase <= Q:
            errors.append(f"[bindings] {_node_label(node)} phase {phase} outside 0..{Q}")
        if isinstance(vertex, str) and vertex in allocations and node.get("kind") in NODE_KINDS:
            want = allocations[vertex]
            have = set(_node_devices(node))
            if have != want:
                role = "its vertex's" if node["kind"] == "op" else "its destination's"
                errors.append(
                    f"[bindings] {_node_label(node)} reserves devices {sorted(have)}, but "
                    f"{role} allocation is {sorted(want)}"
                )
        if isinstance(source, str) and source in vertex_set:
            raw = node.get("preds")
            pred_vertices = [
                by_id[p].get("vertex")
                for p in (raw if isinstance(raw, list) else [])
                if _is_int(p) and p in by_id
            ]
            if source not in pred_vertices:
                errors.append(
                    f"[bindings] {_node_label(node)} moves data from {source!r} but has no "
                    f"pred of that vertex"
                )
        if node.get("kind") == "op" and isinstance(vertex, str) and _is_int(step) and _is_int(phase):
            op_phases.setdefault((vertex, step), []).append(phase)

    if _is_int(k_eval) and not planless:
        for name in dict.fromkeys(names):
            missing = [k for k in range(k_eval) if (name, k) not in op_phases]
            if missing:
                errors.append(f"[bindings] vertex {name!r} has no op node in step(s) {missing}")
    for (vertex, step), phases in sorted(op_phases.items()):
        if len(set(phases)) != len(phases):
            errors.append(f"[bindings] vertex {vertex!r} step {step} has repeated op phases {sorted(phases)}")
        elif 0 in phases and len(phases) > 1:
            errors.append(
                f"[bindings] vertex {vertex!r} step {step} mixes unsplit phase 0 with split "
                f"phases {sorted(phases)}"
            )
    return errors


# ---------------------------------------------------------------------------------------------
# 8. Memory
# ---------------------------------------------------------------------------------------------


def check_memory(result: Result) -> list[str]:
    """Check the per-device peak memory list against the memory flag.

    ``peak_memory`` has one entry per flat device (``Nr·Nn·Ng``). With
    ``M_eff = (1 - memory_headroom)·gpu_memory_bytes`` (SPEC.md §6), ``memory_feasible = true``
    requires ``max(peak_memory) <= M_eff·(1 + 1e-9)`` and ``memory_feasible = false`` requires
    some device above ``M_eff``.

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object.

    Returns
    -------
    list of str
        ``[memory]`` violations.
    """
    errors: list[str] = []
    peaks = _list(result, "peak_memory")
    dims = _dims(result)
    planless_empty = is_planless(result) and peaks == []
    if dims is not None and "peak_memory" in result and len(peaks) != math.prod(dims) and not planless_empty:
        errors.append(
            f"[memory] peak_memory has {len(peaks)} entries, the cluster has {math.prod(dims)} devices"
        )
    cluster = _dict(result, "cluster")
    m_gpu, eps = cluster.get("gpu_memory_bytes"), cluster.get("memory_headroom")
    values = [p for p in peaks if _is_num(p)]
    if not values or not _is_num(m_gpu) or not _is_num(eps):
        return errors
    m_eff = (1 - eps) * m_gpu
    worst = max(values)
    device = values.index(worst)
    feasible = result.get("memory_feasible")
    fits = worst <= m_eff * (1 + MEMORY_REL_TOL)
    if feasible is True and not fits:
        errors.append(
            f"[memory] memory_feasible is true but device {device} peaks at {_fmt(worst)} bytes "
            f"> M_eff = (1 - {_fmt(eps)})·{_fmt(m_gpu)} = {_fmt(m_eff)}"
        )
    if feasible is False and fits:
        errors.append(
            f"[memory] memory_feasible is false but every peak fits M_eff = {_fmt(m_eff)} "
            f"(max {_fmt(worst)} bytes)"
        )
    return errors


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    check_format,
    check_precedence,
    check_device_exclusivity,
    check_makespan,
    check_throughput,
    check_plan_legality,
    check_bindings,
    check_memory,
)
"""All checks, in the order :func:`check` runs them."""


def check(result: Result, checks: Iterable[Check] = CHECKS) -> list[str]:
    """Run every check on a parsed result and collect the violations.

    Parameters
    ----------
    result
        Parsed ``rpeg.result/1`` object (``json.load`` of a result file).
    checks
        The checks to run; all of :data:`CHECKS` by default.

    Returns
    -------
    list of str
        All violations, grouped by check; empty when the result is valid.

    Examples
    --------
    >>> check({"format": "rpeg.result/0"})[0]
    "[format] format = 'rpeg.result/0', expected 'rpeg.result/1'"
    """
    errors: list[str] = []
    for fn in checks:
        try:
            errors.extend(fn(result))
        except Exception as exc:  # a checker must report, never crash, on odd input
            errors.append(f"[{fn.__name__}] could not run: {type(exc).__name__}: {exc}")
    return errors


def check_file(path: str) -> list[str]:
    """Load a result file and :func:`check` it.

    Parameters
    ----------
    path
        Path of a JSON ``rpeg.result/1`` file.

    Returns
    -------
    list of str
        Violations; a file that cannot be read or parsed yields one ``[file]`` violation.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            result = json.load(fh)
    except (OSError, ValueError) as exc:
        return [f"[file] cannot read {path}: {exc}"]
    return check(result)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point.

    Parameters
    ----------
    argv
        Arguments (without the program name); ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        0 when every file is valid, 1 when any file has a violation.
    """
    parser = argparse.ArgumentParser(
        description=f"Check {FORMAT} result files without rpeg's code (SPEC.md §12)."
    )
    parser.add_argument("paths", nargs="+", metavar="RESULT.json", help="result file(s)")
    parser.add_argument(
        "--max-violations",
        type=int,
        default=0,
        metavar="N",
        help="print at most N violations per file (0: all)",
    )
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        errors = check_file(path)
        if not errors:
            print(f"OK {path}")
            continue
        status = 1
        shown = errors[: args.max_violations] if args.max_violations > 0 else errors
        for error in shown:
            print(f"{path}: {error}")
        if len(shown) < len(errors):
            print(f"{path}: ... and {len(errors) - len(shown)} more violation(s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
