"""Execution traces (``rpeg.trace/1``) and the executable graph a run must follow (SPEC §11).

A run realises a :class:`~rpeg.solvers.result.Result`'s plan over some number of RL steps: it
unrolls the compact graph over those steps, lowers it under the plan exactly as the evaluator
does (:func:`expected_graph`), binds every node to workers and GPUs and records one
:class:`TraceRecord` per executed node. The :class:`Trace` carries the plan's fingerprint
(:func:`plan_hash`) so that :mod:`rpeg.runtime.verify` can tell which plan it claims to follow.

The file format is described in ``docs/trace-format.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..heuristics.costs import Costs
from ..ir.graph import RPEG
from ..ir.lower import OP, RESHARD, ExecGraph, lower
from ..ir.types import Role
from ..ir.unroll import unroll
from ..solvers.result import Result

__all__ = [
    "FORMAT",
    "HASHED_BLOCKS",
    "Trace",
    "TraceRecord",
    "expected_graph",
    "expected_versions",
    "plan_hash",
]

FORMAT = "rpeg.trace/1"
#: Blocks of the ``rpeg.result/1`` document that identify a plan (SPEC §12).
HASHED_BLOCKS = ("workload", "models", "cluster", "structure", "vertices", "plan")
KINDS = ("op", "comm", "reshard")


# ---------------------------------------------------------------------------- the plan side
def expected_graph(result: Result, steps: int) -> ExecGraph:
    """The executable DAG ``Ĝ`` a run of ``result``'s plan over ``steps`` RL steps must follow.

    Unrolls ``result.graph`` over ``steps`` steps (SPEC §5, :func:`~rpeg.ir.unroll.unroll`) and
    lowers it under ``result.plan`` with the evaluator's cost provider
    (:class:`~rpeg.heuristics.costs.Costs`), the workload's response-length quantiles and the same
    phase-splitting setting, through the same :func:`~rpeg.ir.lower.lower` the evaluator calls.
    Node ids are a topological order and are the ids a runtime and its trace use; the graph for
    ``steps`` is a prefix of the graph for any larger number of steps.

    Phase splitting (rule 1) is on unless the result's kept schedule shows it was lowered without
    it: a kept graph with no phase node means splitting was off or never applied, and lowering
    without it then gives that same graph.

    Parameters
    ----------
    result
        A result with a plan.
    steps
        Number of RL steps ``≥ 1`` to unroll (need not equal ``result.k_eval``).

    Returns
    -------
    ExecGraph
        Nodes with kind, vertex, source, step, phase, device mask, payload, predicted duration
        and predecessors.

    Raises
    ------
    ValueError
        If the result has no plan or ``steps < 1``.
    """
    if result.plan is None:
        raise ValueError(f"result has no plan (status {result.status.value}): nothing to run")
    kept = result.evaluation.graph if result.evaluation is not None else None
    split = True if kept is None else any(p > 0 for p in kept.phase)
    costs = Costs(result.graph, result.workload, result.cluster)
    return lower(
        unroll(result.graph, steps),
        result.plan,
        result.workload.quantiles,
        costs,  # type: ignore[arg-type]
        split_phases=split,
    )


def plan_hash(result: Result) -> str:
    """Fingerprint of the plan a trace claims to follow.

    ``sha256`` (hex) of the canonical JSON (``sort_keys=True``, no whitespace) of the result
    document's ``workload``, ``models``, ``cluster``, ``structure``, ``vertices`` and ``plan``
    blocks (:data:`HASHED_BLOCKS`), so any change of problem, binding or layout changes the hash,
    while scores, schedule and method do not enter it.
    """
    doc = result.to_dict()
    blocks = {k: doc[k] for k in HASHED_BLOCKS}
    text = json.dumps(blocks, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def expected_versions(
    graph: RPEG, lowered: ExecGraph, node: int, offset: int = 0
) -> tuple[dict[str, int], dict[str, int]]:
    """``(versions_consumed, version_produced)`` a record of ``lowered`` node ``node`` must carry.

    With ``k`` the node's step, ``m`` the model of its vertex ``v`` (the consumer for
    COMM/RESHARD) and version ``n`` meaning "after ``n`` training updates" (initial weights: 0):

    - OP of a training vertex: consumes ``{m: k}`` and produces ``{m: k + 1}`` (training at step
      ``k`` follows the chain ``t(k−1) → t(k)``);
    - OP of another vertex of a trainable ``m``: consumes ``{m: max(0, k − τ(m))}``, the version
      the publication edge from training at step ``k − τ(m) − 1`` installs (SPEC §5), or the
      initial weights while ``k ≤ τ(m)``;
    - OP of a frozen model: consumes ``{m: 0}``;
    - a weight transfer (every RESHARD, and every COMM whose source is a training vertex, i.e.
      publications and same-model pair transfers) carries the version its consumer ``v`` reads
      at step ``k``, ``{m: version}`` as above; a publication COMM at step ``k`` thus carries
      ``k − τ(m)``, the version training at step ``k − τ(m) − 1`` produced;
    - a data COMM moves no weights: ``{}``.

    COMM and RESHARD nodes produce no version.

    Parameters
    ----------
    graph
        The compact RPEG (``result.graph``).
    lowered
        Its lowering (:func:`expected_graph`).
    node
        A node id of ``lowered``.
    offset
        Updates before this run when it continues a job (a transition target): versions count
        from the weights it starts with and older ones are negative, ``max(−offset, k − τ(m))``.
    """
    vertices = graph.vertices
    v, k = lowered.vertex[node], lowered.step[node]
    m = vertices[v].model
    training = vertices[v].role is Role.TRAINING
    if m not in graph.staleness:
        version = 0
    elif training:
        version = k
    else:
        version = max(-offset, k - graph.staleness[m])
    if lowered.kind[node] == OP:
        return {m: version}, ({m: k + 1} if training else {})
    moves_weights = lowered.kind[node] == RESHARD or vertices[lowered.source[node]].role is Role.TRAINING
    return ({m: version} if moves_weights else {}), {}


# ---------------------------------------------------------------------------- the run side
@dataclass
class TraceRecord:
    """One executed node of ``Ĝ``.

    Attributes
    ----------
    node
        Node id in :func:`expected_graph`.
    kind
        ``"op"``, ``"comm"`` or ``"reshard"``.
    vertex
        Vertex name (the consumer for COMM/RESHARD).
    source
        Producing vertex name for COMM/RESHARD, ``None`` for OP.
    step, phase
        RL step; response-length phase (0 unsplit, else ``1..Q``).
    workers
        Worker ids ``"g{group}/r{rank}"`` that executed it.
    devices
        Flat device ids it used (COMM/RESHARD: the destination allocation).
    layout
        ``{"dp", "pp", "tp", "mb"}`` as executed (COMM/RESHARD: the destination's).
    start, end
        Seconds on the controller clock since the run started.
    versions_consumed
        Model name → parameter version read (version ``v`` = after ``v`` training updates).
    version_produced
        Training nodes: model name → the new version; empty otherwise.
    bytes
        Bytes moved (COMM/RESHARD); 0 for OP.
    worker_time
        Seconds the workers spent on it (maximum over ranks).
    """

    node: int
    kind: str
    vertex: str
    source: str | None
    step: int
    phase: int
    workers: list[str]
    devices: list[int]
    layout: dict[str, int]
    start: float
    end: float
    versions_consumed: dict[str, int] = field(default_factory=dict)
    version_produced: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    worker_time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON object (fields in declaration order)."""
        return {
            "node": self.node,
            "kind": self.kind,
            "vertex": self.vertex,
            "source": self.source,
            "step": self.step,
            "phase": self.phase,
            "workers": list(self.workers),
            "devices": list(self.devices),
            "layout": dict(self.layout),
            "start": self.start,
            "end": self.end,
            "versions_consumed": dict(self.versions_consumed),
            "version_produced": dict(self.version_produced),
            "bytes": self.bytes,
            "worker_time": self.worker_time,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str = "record") -> TraceRecord:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            Naming ``where`` and the missing or malformed field.
        """
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: must be an object, got {type(doc).__name__}")
        kind = _str(_need(doc, "kind", where), where, "kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: field 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        source = _need(doc, "source", where)
        return cls(
            node=_int(_need(doc, "node", where), where, "node"),
            kind=kind,
            vertex=_str(_need(doc, "vertex", where), where, "vertex"),
            source=None if source is None else _str(source, where, "source"),
            step=_int(_need(doc, "step", where), where, "step"),
            phase=_int(_need(doc, "phase", where), where, "phase"),
            workers=_list(_need(doc, "workers", where), where, "workers", _str),
            devices=_list(_need(doc, "devices", where), where, "devices", _int),
            layout=_mapping(_need(doc, "layout", where), where, "layout", _int),
            start=_float(_need(doc, "start", where), where, "start"),
            end=_float(_need(doc, "end", where), where, "end"),
            versions_consumed=_mapping(
                _need(doc, "versions_consumed", where), where, "versions_consumed", _int
            ),
            version_produced=_mapping(_need(doc, "version_produced", where), where, "version_produced", _int),
            bytes=_int(_need(doc, "bytes", where), where, "bytes"),
            worker_time=_float(_need(doc, "worker_time", where), where, "worker_time"),
        )


@dataclass
class Trace:
    """What a run did: one :class:`TraceRecord` per executed node plus run-level facts.

    Attributes
    ----------
    plan_hash
        :func:`plan_hash` of the result the run executed.
    steps
        RL steps run (the trace covers :func:`expected_graph` ``(result, steps)``).
    staleness
        ``τ(m)`` per trainable model the run applied.
    records
        Executed nodes.
    step_metrics
        Per step: ``step``, ``reward``, ``step_time_s``, ``predicted_step_time_s``, ….
    groups
        Worker-group id → ``{"models", "vertices", "devices", "layout", "workers"}``.
    meta
        Seed, scale, host, Ray address, start time, torch version, backend, and ``scaled``
        (``True`` when the run used scaled-down models, so byte counts differ from the plan's).
    """

    format: ClassVar[str] = FORMAT

    plan_hash: str
    steps: int
    staleness: dict[str, int]
    records: list[TraceRecord] = field(default_factory=list)
    step_metrics: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``rpeg.trace/1`` document."""
        return {
            "format": FORMAT,
            "plan_hash": self.plan_hash,
            "steps": self.steps,
            "staleness": dict(self.staleness),
            "records": [r.to_dict() for r in self.records],
            "step_metrics": [dict(m) for m in self.step_metrics],
            "groups": {k: dict(v) for k, v in self.groups.items()},
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Trace:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ValueError
            If the document is not ``rpeg.trace/1`` or a field is missing or malformed (the
            message names the field, and the record index for a record's field).
        """
        if not isinstance(doc, dict):
            raise ValueError(f"trace: must be a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise ValueError(f"trace: field 'format' must be {FORMAT!r}, got {doc.get('format')!r}")
        records = _need(doc, "records", "trace")
        if not isinstance(records, list):
            raise ValueError(f"trace: field 'records' must be a list, got {type(records).__name__}")
        metrics = doc.get("step_metrics", [])
        if not isinstance(metrics, list) or not all(isinstance(m, dict) for m in metrics):
            raise ValueError("trace: field 'step_metrics' must be a list of objects")
        groups = doc.get("groups", {})
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise ValueError("trace: field 'groups' must be an object of objects")
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"trace: field 'meta' must be an object, got {type(meta).__name__}")
        return cls(
            plan_hash=_str(_need(doc, "plan_hash", "trace"), "trace", "plan_hash"),
            steps=_int(_need(doc, "steps", "trace"), "trace", "steps"),
            staleness=_mapping(_need(doc, "staleness", "trace"), "trace", "staleness", _int),
            records=[TraceRecord.from_dict(r, f"trace.records[{i}]") for i, r in enumerate(records)],
            step_metrics=[dict(m) for m in metrics],
            groups={str(k): dict(v) for k, v in groups.items()},
            meta=dict(meta),
        )

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise to JSON; also write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> Trace:
        """Read a trace from a path or from the JSON text itself.

        Raises
        ------
        ValueError
            If the text is not JSON or not a valid ``rpeg.trace/1`` document.
        """
        text = str(source)
        if not text.lstrip().startswith("{"):
            path = Path(source)
            if not path.is_file():
                raise ValueError(f"trace file {str(source)!r} does not exist")
            text = path.read_text()
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"trace: not valid JSON ({exc})") from None
        return cls.from_dict(doc)


# ---------------------------------------------------------------------------- field readers
def _need(doc: dict[str, Any], key: str, where: str) -> Any:
    if key not in doc:
        raise ValueError(f"{where}: missing field {key!r}")
    return doc[key]


def _int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: field {key!r} must be an integer, got {value!r}")
    return value


def _float(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: field {key!r} must be a number, got {value!r}")
    return float(value)


def _str(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} must be a string, got {value!r}")
    return value


def _list(value: Any, where: str, key: str, item: Callable[[Any, str, str], Any]) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{where}: field {key!r} must be a list, got {value!r}")
    return [item(x, where, f"{key}[{i}]") for i, x in enumerate(value)]


def _mapping(value: Any, where: str, key: str, item: Callable[[Any, str, str], Any]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: field {key!r} must be an object, got {value!r}")
    return {str(k): item(v, where, f"{key}.{k}") for k, v in value.items()}
