"""Schemas of the runtime's files: the trace (``rpeg.trace/1``) and the checkpoint manifest
(``rpeg.checkpoint/1``, and the older manifest without a format tag).

Every file the runtime reads passes through these :class:`~rpeg.ir.errors.Strict` pydantic
models (unknown keys refused, no coercion, no NaN or infinity) via
:func:`~rpeg.ir.errors.validate`, so a bad file ends in one :class:`~rpeg.ir.errors.InputError`
naming the file, the field path and the value. The field tables are in ``docs/trace-format.md``
and ``docs/runtime.md``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from ...ir.errors import Strict

__all__ = [
    "CHECKPOINT_FORMAT",
    "TRACE_FORMAT",
    "CheckpointFile",
    "CheckpointStep",
    "FailureDoc",
    "LegacyManifestDoc",
    "LegacyStepMeta",
    "ManifestDoc",
    "RecordDoc",
    "TraceDoc",
]

TRACE_FORMAT = "rpeg.trace/1"
CHECKPOINT_FORMAT = "rpeg.checkpoint/1"

NonNegInt = Annotated[int, Field(ge=0)]
#: Seconds on the controller clock: finite (Strict refuses NaN/inf) and not negative.
Seconds = Annotated[float, Field(ge=0.0)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _plain_name(name: str) -> str:
    if name in (".", ".."):
        raise ValueError("must name a file or directory inside the checkpoint directory")
    return name


#: A plain file or directory name (no path separators, not ``.`` or ``..``).
FileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200), AfterValidator(_plain_name)]


def _json_value(value: Any, where: str) -> None:
    """Free-form blocks hold JSON values with finite numbers only."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} holds {value!r}; only finite numbers are allowed")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-string key {k!r}")
            _json_value(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _json_value(v, f"{where}[{i}]")
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"{where} holds a {type(value).__name__}, not a JSON value")


class RecordDoc(Strict):
    """One executed node (``docs/trace-format.md``, "A record")."""

    node: NonNegInt
    kind: Literal["op", "comm", "reshard"]
    vertex: str
    source: str | None
    step: NonNegInt
    phase: NonNegInt
    workers: list[str]
    devices: list[NonNegInt]
    layout: dict[str, int]
    start: Seconds
    end: Seconds
    versions_consumed: dict[str, int]
    version_produced: dict[str, int]
    bytes: NonNegInt
    in_place_bytes: NonNegInt = 0
    worker_time: Seconds
    publish_s: Seconds = 0.0
    engine: dict[str, Any] = Field(default_factory=dict)
    memory: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    memory_live: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)


class FailureDoc(Strict):
    """What stopped a run (a trace with ``status: "failed"``)."""

    message: str
    node: NonNegInt | None = None
    step: NonNegInt | None = None
    vertex: str | None = None
    worker: str | None = None
    device: NonNegInt | None = None
    lost: bool = False


class TraceDoc(Strict):
    """The ``rpeg.trace/1`` document (``docs/trace-format.md``, "Top level")."""

    format: Literal["rpeg.trace/1"]
    plan_hash: str
    steps: Annotated[int, Field(ge=1)]
    staleness: dict[str, NonNegInt]
    records: list[RecordDoc]
    step_metrics: list[dict[str, Any]] = Field(default_factory=list)
    groups: dict[str, dict[str, Any]] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)
    status: Literal["complete", "failed", "interrupted"] = "complete"
    failure: FailureDoc | None = None

    @field_validator("step_metrics", "groups", "meta")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        _json_value(value, str(info.field_name))
        return value

    @model_validator(mode="after")
    def _failure_iff_failed(self) -> TraceDoc:
        if (self.status != "complete") != (self.failure is not None):
            raise ValueError(
                "a trace has a 'failure' object exactly when its status is 'failed' or 'interrupted'"
            )
        return self


class CheckpointFile(Strict):
    """One file of a checkpointed step: its SHA-256 and size."""

    sha256: Sha256
    bytes: NonNegInt


class CheckpointStep(Strict):
    """One complete step: the directory (relative to the checkpoint directory) and its files."""

    global_step: NonNegInt
    dir: FileName
    files: dict[FileName, CheckpointFile]


class ManifestDoc(Strict):
    """``manifest.json`` of a checkpoint directory (``rpeg.checkpoint/1``)."""

    format: Literal["rpeg.checkpoint/1"]
    plan_hash: str
    trainers: list[NonNegInt]
    complete_steps: list[NonNegInt]
    steps: list[CheckpointStep]

    @model_validator(mode="after")
    def _steps_match(self) -> ManifestDoc:
        listed = sorted(s.global_step for s in self.steps)
        if listed != sorted(self.complete_steps):
            raise ValueError(
                f"complete_steps {sorted(self.complete_steps)} differ from the steps listed {listed}"
            )
        return self


class LegacyManifestDoc(Strict):
    """A manifest written before checksums (no ``format`` key): accepted, files only checked for
    presence (``docs/runtime.md``)."""

    plan_hash: str
    complete_steps: list[NonNegInt]
    trainers: list[NonNegInt]


class LegacyStepMeta(Strict):
    """``meta.json`` of a step directory of a legacy checkpoint."""

    global_step: NonNegInt
