"""A cell's state as tensors, and how to join it from pieces (SPEC §10; the layout arithmetic —
cells, pieces, shapes — is :mod:`~rpeg.runtime.cells`).

A cell's *state* is its parameters, and for a training replica the Adam moments ``m``, ``v`` of
the same shapes and the update counter: one full logical copy per replica (the EMU view of
SPEC §10; the training workers' ZeRO slices are gathered into it before a transition and
sliced out of it after).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ...ir.types import Head
from ...ir.workload import ModelSpec
from ..cells import Piece
from .model import StageModel

__all__ = ["CellState", "assemble_cell", "full_shapes"]


def full_shapes(spec: ModelSpec, head: Head) -> dict[str, tuple[int, ...]]:
    """Shape of every parameter of the whole model (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = StageModel(spec, head, seed=0)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


@dataclass
class CellState:
    """One cell's state: parameters by name, Adam moments (training) and the update counter."""

    params: dict[str, torch.Tensor]
    m: dict[str, torch.Tensor] | None = None
    v: dict[str, torch.Tensor] | None = None
    step: int = 0
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes held (parameters and moments)."""
        total = sum(t.numel() * t.element_size() for t in self.params.values())
        for d in (self.m, self.v):
            if d:
                total += sum(t.numel() * t.element_size() for t in d.values())
        return total

    def tensors(self, pieces: list[Piece]) -> list[torch.Tensor]:
        """The slices ``pieces`` name, parameters first then ``m`` then ``v`` (when held)."""
        out = []
        for group in (self.params, self.m, self.v):
            if group is None:
                continue
            for pc in pieces:
                t = group[pc.name]
                out.append(t if pc.dim is None else t.narrow(pc.dim, pc.lo, pc.hi - pc.lo))
        return out


def assemble_cell(
    names: list[str], received: Mapping[int, CellState], pieces: Mapping[int, list[Piece]]
) -> CellState:
    """Join the pieces received from each source rank into a target cell holding ``names``.

    ``received[r]`` holds, under each piece's name, the slice source rank ``r`` sent (in its
    ``params``/``m``/``v``); the pieces of one tensor are concatenated along its shard dimension
    in source-rank order (a replicated tensor arrives whole from one rank).

    Raises
    ------
    RuntimeError
        If a name has no piece or the sources disagree on the update counter.
    """
    with_moments = bool(pieces) and all(received[r].m is not None for r in pieces)
    out = CellState({}, {} if with_moments else None, {} if with_moments else None)
    steps = {received[r].step for r in pieces}
    if len(steps) > 1:
        raise RuntimeError(f"source ranks disagree on the update counter: {sorted(steps)}")
    out.step = steps.pop() if steps else 0
    by_name: dict[str, list[tuple[int, Piece]]] = {}
    for r in sorted(pieces):
        for pc in pieces[r]:
            by_name.setdefault(pc.name, []).append((r, pc))
    for name in names:
        parts = by_name.get(name)
        if not parts:
            raise RuntimeError(f"no source holds {name!r}")
        dim = parts[0][1].dim
        for attr in ("params", "m", "v"):
            dest = getattr(out, attr)
            if dest is None:
                continue
            ts = [getattr(received[r], attr)[name] for r, _ in parts]
            dest[name] = ts[0].clone() if dim is None else torch.cat(ts, dim=dim)
    return out
