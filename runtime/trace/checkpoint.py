"""Checkpoint directories: the manifest a run writes and the checks a resume makes first.

Layout of ``checkpoint_dir``::

    manifest.json              rpeg.checkpoint/1 (schema: runtime/trace/schema.py::ManifestDoc)
    step00002/g3-r0.pt         one file per training rank and global step (Worker.save)
    step00002/g3-r1.pt

Each training rank writes its file (to a temporary name, then renamed) and reports its SHA-256
and size; the manifest is rewritten (atomically) each time a step has every training rank's
file, so a run that stops part-way leaves a manifest of the steps it completed. Before any
worker starts, :func:`check_checkpoint` validates the manifest's schema and plan hash and the
presence, size and SHA-256 of every file of the step a run resumes from: a corrupt or truncated
checkpoint is an :class:`~rpeg.ir.errors.InputError` naming the file, not a failure on a worker.

A manifest without a ``format`` key (written before checksums existed) is accepted: its schema
is checked (:class:`~rpeg.runtime.trace.schema.LegacyManifestDoc`) and its files must be present and
non-empty, but their contents can only be checked when the workers load them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ir.errors import InputError, read_json, validate
from .schema import (
    CHECKPOINT_FORMAT,
    LegacyManifestDoc,
    LegacyStepMeta,
    ManifestDoc,
)

__all__ = ["MANIFEST", "Resume", "check_checkpoint", "file_digest", "step_dir_name", "write_manifest"]

MANIFEST = "manifest.json"


def step_dir_name(global_step: int) -> str:
    """``"step00002"``: the directory of a global step's files."""
    return f"step{global_step:05d}"


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    """``{"sha256": hex digest, "bytes": size}`` of the file at ``path``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return {"sha256": h.hexdigest(), "bytes": size}


def write_manifest(
    root: str | os.PathLike, plan_hash: str, trainers: list[int], steps: dict[int, dict[str, dict[str, Any]]]
) -> Path:
    """Write ``root/manifest.json`` listing ``steps`` (global step → file name → ``{"sha256",
    "bytes"}``, every training rank's file of the step), atomically.

    Steps of an existing ``rpeg.checkpoint/1`` manifest of the same plan that ``steps`` does not
    mention are kept (a resumed run writing into the directory it resumed from).

    Returns
    -------
    Path
        The manifest's path.
    """
    root = Path(root)
    entries: dict[int, dict[str, Any]] = {}
    path = root / MANIFEST
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            if old.get("format") == CHECKPOINT_FORMAT and old.get("plan_hash") == plan_hash:
                entries = {int(e["global_step"]): e for e in old["steps"]}
        except (ValueError, KeyError, TypeError, AttributeError):  # an unreadable manifest is replaced
            entries = {}
    for k, files in steps.items():
        entries[k] = {"global_step": k, "dir": step_dir_name(k), "files": dict(sorted(files.items()))}
    doc = {
        "format": CHECKPOINT_FORMAT,
        "plan_hash": plan_hash,
        "trainers": sorted(trainers),
        "complete_steps": sorted(entries),
        "steps": [entries[k] for k in sorted(entries)],
    }
    tmp = path.with_name(f".{MANIFEST}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Resume:
    """Where a resumed run starts.

    Attributes
    ----------
    root
        The checkpoint directory.
    global_step
        The last complete step; the run continues with ``global_step + 1``.
    step_dir
        The directory holding that step's files.
    verified
        ``True`` when every file's size and SHA-256 were checked (``False``: a legacy manifest,
        presence only).
    """

    root: Path
    global_step: int
    step_dir: Path
    verified: bool


def check_checkpoint(root: str | os.PathLike, plan_hash: str, trainers: dict[int, int]) -> Resume:
    """Validate a checkpoint directory before any worker starts.

    Parameters
    ----------
    root
        The ``resume_from`` directory.
    plan_hash
        :func:`~rpeg.runtime.trace.records.plan_hash` of the plan to resume (must be the manifest's).
    trainers
        Training group id → number of ranks, of the plan's binding: every rank's file must be
        there.

    Returns
    -------
    Resume

    Raises
    ------
    InputError
        The directory or its manifest is missing, the manifest is not valid JSON or breaks its
        schema, was written for another plan or layout, lists no complete step, or a file of
        the step to resume from is missing, has another size or another SHA-256. The message
        names the file.
    """
    root = Path(root)
    if not root.exists():
        raise InputError(f"resume_from {str(root)!r} does not exist", source=str(root))
    if not root.is_dir():
        raise InputError(f"resume_from {str(root)!r} is a file, not a checkpoint directory", source=str(root))
    path = root / MANIFEST
    if not path.is_file():
        raise InputError(
            f"resume_from {str(root)!r} holds no {MANIFEST} (not a checkpoint directory, or no step completed)",
            source=str(path),
        )
    doc = read_json(path, "checkpoint manifest")
    source = str(path)
    if isinstance(doc, dict) and "format" in doc:
        if doc["format"] != CHECKPOINT_FORMAT:
            raise InputError(
                f"{source}: format {doc['format']!r} is not {CHECKPOINT_FORMAT!r}",
                source=source,
                field="format",
            )
        manifest: ManifestDoc | LegacyManifestDoc = validate(ManifestDoc, doc, source)
    else:
        manifest = validate(LegacyManifestDoc, doc, source)
    if manifest.plan_hash != plan_hash:
        raise InputError(
            f"resume_from {str(root)!r} was written for another plan (hash {manifest.plan_hash[:12]}…); "
            "resuming needs the same plan",
            source=source,
            field="plan_hash",
        )
    if sorted(manifest.trainers) != sorted(trainers):
        raise InputError(
            f"{source}: training groups {sorted(manifest.trainers)} differ from the plan's {sorted(trainers)}",
            source=source,
            field="trainers",
        )
    if not manifest.complete_steps:
        raise InputError(
            f"resume_from {str(root)!r} holds no complete step", source=source, field="complete_steps"
        )
    step = max(manifest.complete_steps)
    want = [f"g{gid}-r{r}.pt" for gid in sorted(trainers) for r in range(trainers[gid])]
    if isinstance(manifest, ManifestDoc):
        entry = next(e for e in manifest.steps if e.global_step == step)
        step_dir = root / entry.dir
        for name in want:
            if name not in entry.files:
                raise InputError(
                    f"{source}: step {step} lists no file {name!r} (written by another layout?)",
                    source=source,
                    field="steps",
                )
        for name, meta in sorted(entry.files.items()):
            f = step_dir / name
            if not f.is_file():
                raise InputError(f"checkpoint file {str(f)!r} is missing", source=str(f))
            size = f.stat().st_size
            if size != meta.bytes:
                raise InputError(
                    f"checkpoint file {str(f)!r} has {size} bytes, the manifest says {meta.bytes} "
                    "(truncated or replaced)",
                    source=str(f),
                )
            digest = file_digest(f)["sha256"]
            if digest != meta.sha256:
                raise InputError(
                    f"checkpoint file {str(f)!r} is corrupt: SHA-256 {digest[:12]}… but the manifest says "
                    f"{meta.sha256[:12]}…",
                    source=str(f),
                )
        return Resume(root, step, step_dir, True)
    # legacy: the step directory is the one whose meta.json names the step; presence only
    step_dir = None
    for d in sorted(root.glob("step*")):
        meta = d / "meta.json"
        if (
            meta.is_file()
            and validate(LegacyStepMeta, read_json(meta, "step meta"), str(meta)).global_step == step
        ):
            step_dir = d
    if step_dir is None:
        raise InputError(f"{source}: no step directory of step {step} (no meta.json names it)", source=source)
    for name in want:
        f = step_dir / name
        if not f.is_file() or f.stat().st_size == 0:
            raise InputError(f"checkpoint file {str(f)!r} is missing or empty", source=str(f))
    return Resume(root, step, step_dir, False)
