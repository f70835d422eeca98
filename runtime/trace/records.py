"""Execution traces (``rpeg.trace/1``) and the executable graph a run must follow (SPEC §11).

A run realises a :class:`~rpeg.solvers.result.Result`'s plan over some number of RL steps: it
unrolls the compact graph over those steps, lowers it under the plan exactly as the evaluator
does (:func:`expected_graph`), binds every node to workers and GPUs and records one
:class:`TraceRecord` per executed node. The :class:`Trace` carries the plan's fingerprint
(:func:`plan_hash`) so that :mod:`rpeg.runtime.trace.verify` can tell which plan it claims to follow.

The file format is described in ``docs/trace-format.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...ir.errors import InputError, read_json, validate
from ...ir.graph import RPEG
from ...ir.lower import OP, RESHARD, ExecGraph, lower
from ...ir.types import Role
from ...ir.unroll import unroll
from ...scoring.costs import Costs
from ...solvers.result import Result
from .schema import RecordDoc, TraceDoc

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
#: Blocks of the ``rpeg.result/2`` document that identify a plan (SPEC §12).
HASHED_BLOCKS = ("workload", "models", "cluster", "structure", "vertices", "plan")
KINDS = ("op", "comm", "reshard")


# ---------------------------------------------------------------------------- the plan side
def expected_graph(result: Result, steps: int) -> ExecGraph:
    """The executable DAG ``Ĝ`` a run of ``result``'s plan over ``steps`` RL steps must follow.

    Unrolls ``result.graph`` over ``steps`` steps (SPEC §5, :func:`~rpeg.ir.unroll.unroll`) and
    lowers it under ``result.plan`` with the evaluator's cost provider
    (:class:`~rpeg.scoring.costs.Costs`), the workload's response-length quantiles and the same
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
    in_place_bytes
        A weight COMM/RESHARD between groups on the same devices, handed over in place (the
        trainer keeps its shares in its device's process, :class:`~rpeg.runtime.config.RunConfig`
        ``weights_in_place``): the most bytes one reading rank took from its own process without
        a copy (the rest of ``bytes`` came over the trainer's process group). 0 for a transfer
        through the object store, for OP nodes, and in traces written before rpeg recorded it.
    worker_time
        Seconds the workers spent on it (maximum over ranks).
    engine
        What a rollout engine reported for this node (``rollout_engine="vllm"``): on a weight
        COMM/RESHARD into a generating group, or a generation node that synced first, the weight
        push (``weight_sync_s``, the whole push as the worker paid it, ``gathered`` (false where
        an install pushed the tensors it received) and its parts ``gather_s``, ``checksum_s``, ``engine_s`` (the engine's write and reload) with ``write_s``;
        ``bytes``, ``checksum`` sent, ``rank_checksums`` loaded by every vLLM rank,
        ``checksums_match``); on a generation node ``generate_s`` and ``tokens``. With
        several DP replicas: ``{"replicas": [...]}``. Empty otherwise.
    publish_s
        Training OP nodes that publish their new weights: the seconds of ``worker_time`` spent
        gathering and handing them over (the cost model prices the publication as COMM nodes);
        0 otherwise and in traces written before rpeg recorded it.
    memory
        OP nodes: worker id → bytes of that process's peak private resident memory so far (resident
        less shared pages, sampled: :class:`~rpeg.runtime.worker.memory.PrivatePeak`) less its private
        resident memory before it built its model; empty otherwise. Older traces hold the whole
        resident set's peak (``VmHWM``, shared pages included) less the resident set then.
    memory_live
        OP nodes: worker id → bytes of that process's peak live C heap so far (glibc's
        ``mallinfo2``, sampled: :func:`~rpeg.runtime.worker.memory.heap_live_bytes`, the CPU analogue
        of ``torch.cuda.max_memory_allocated``) less its live heap before it built its model;
        empty where the C library has no ``mallinfo2``, otherwise, and in older traces.
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
    in_place_bytes: int = 0
    worker_time: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    publish_s: float = 0.0
    memory_live: dict[str, float] = field(default_factory=dict)

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
            "in_place_bytes": self.in_place_bytes,
            "worker_time": self.worker_time,
            "publish_s": self.publish_s,
            "engine": dict(self.engine),
            "memory": dict(self.memory),
            "memory_live": dict(self.memory_live),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str = "record") -> TraceRecord:
        """Inverse of :meth:`to_dict`, through the strict schema (:class:`~rpeg.runtime.trace.schema.RecordDoc`).

        Raises
        ------
        InputError
            Naming ``where``, the field and the value: a missing or unknown field, a wrong type,
            a negative or non-finite time, a negative id or byte count.
        """
        return cls._from_doc(validate(RecordDoc, doc, where))

    @classmethod
    def _from_doc(cls, d: RecordDoc) -> TraceRecord:
        return cls(
            node=d.node,
            kind=d.kind,
            vertex=d.vertex,
            source=d.source,
            step=d.step,
            phase=d.phase,
            workers=list(d.workers),
            devices=list(d.devices),
            layout=dict(d.layout),
            start=float(d.start),
            end=float(d.end),
            versions_consumed=dict(d.versions_consumed),
            version_produced=dict(d.version_produced),
            bytes=d.bytes,
            in_place_bytes=d.in_place_bytes,
            worker_time=float(d.worker_time),
            publish_s=float(d.publish_s),
            engine=dict(d.engine),
            memory={k: float(v) for k, v in d.memory.items()},
            memory_live={k: float(v) for k, v in d.memory_live.items()},
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
    status
        ``"complete"``; ``"failed"``: the run stopped and the trace holds the records of the
        nodes that completed before (:attr:`failure` says what stopped it); or
        ``"interrupted"``: a signal (SIGINT, SIGTERM) stopped it, likewise.
    failure
        ``{"message", "node", "step", "vertex", "worker", "device", "lost"}`` of a failed or
        interrupted run (an interruption names only its message and the first step not
        completed), else ``None``.
    """

    format: ClassVar[str] = FORMAT

    plan_hash: str
    steps: int
    staleness: dict[str, int]
    records: list[TraceRecord] = field(default_factory=list)
    step_metrics: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "complete"
    failure: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        """Whether the run finished (``status == "complete"``)."""
        return self.status == "complete"

    def to_dict(self) -> dict[str, Any]:
        """The ``rpeg.trace/1`` document (``failure`` only when the run failed or was interrupted)."""
        doc = {
            "format": FORMAT,
            "plan_hash": self.plan_hash,
            "steps": self.steps,
            "staleness": dict(self.staleness),
            "status": self.status,
            "records": [r.to_dict() for r in self.records],
            "step_metrics": [dict(m) for m in self.step_metrics],
            "groups": {k: dict(v) for k, v in self.groups.items()},
            "meta": dict(self.meta),
        }
        if self.failure is not None:
            doc["failure"] = dict(self.failure)
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "trace") -> Trace:
        """Inverse of :meth:`to_dict`, through the strict schema (:class:`~rpeg.runtime.trace.schema.TraceDoc`).

        Parameters
        ----------
        doc
            The parsed JSON document.
        source
            What to call it in messages (the file name).

        Raises
        ------
        InputError
            If the document is not ``rpeg.trace/1`` (the message names the format it has) or a
            field is missing, unknown, of the wrong type, negative or non-finite (the message
            names the field path, e.g. ``records[3].end``, and the value).
        """
        if not isinstance(doc, dict):
            raise InputError(f"{source}: a trace is a JSON object, got {type(doc).__name__}", source=source)
        fmt = doc.get("format")
        if fmt != FORMAT:
            hint = (
                " (a result file? `rpeg verify` takes TRACE.json RESULT.json)"
                if isinstance(fmt, str) and fmt.startswith("rpeg.result/")
                else ""
            )
            raise InputError(
                f"{source}: format {fmt!r} is not {FORMAT!r}{hint}"
                if "format" in doc
                else f"{source}: missing field 'format'",
                source=source,
                field="format",
            )
        d = validate(TraceDoc, doc, source)
        return cls(
            plan_hash=d.plan_hash,
            steps=d.steps,
            staleness=dict(d.staleness),
            records=[TraceRecord._from_doc(r) for r in d.records],
            step_metrics=[dict(m) for m in d.step_metrics],
            groups={k: dict(v) for k, v in d.groups.items()},
            meta=dict(d.meta),
            status=d.status,
            failure=d.failure.model_dump() if d.failure is not None else None,
        )

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise to JSON (numbers must be finite); also write it to ``path`` when given
        (atomically: a temporary file in the same directory, then renamed)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"
        if path is not None:
            p = Path(path)
            tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, p)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> Trace:
        """Read a trace from a path or from the JSON text itself (text starts with ``{``).

        Raises
        ------
        InputError
            If the file is missing or unreadable, the text is not JSON (NaN and Infinity
            literals are refused) or not a valid ``rpeg.trace/1`` document (:meth:`from_dict`).
        """
        text = str(source)
        if isinstance(source, str) and text.lstrip().startswith("{"):
            try:
                doc = json.loads(text, parse_constant=_no_constant)
            except ValueError as exc:
                raise InputError(f"trace: not valid JSON ({exc})", source="trace") from None
            return cls.from_dict(doc, "trace")
        return cls.from_dict(read_json(source, "trace file"), text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")
