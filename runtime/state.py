"""Where every byte of a model's state lives in a layout, and how to move it (SPEC §10).

A *cell* is what one rank of one replica holds: rank ``i = p·tp + t`` of a ``tp × pp`` layout
keeps the tensors of pipeline stage ``p`` (the embedding on the first stage, blocks of
:func:`~rpeg.ir.plan.stage_layer_ranges`, the final norm and heads on the last) and of
every tensor-parallel weight the ``t``-th ``torch.chunk`` along its shard dimension (the
Megatron plan of :meth:`~rpeg.runtime.model.StageModel.tp_plan`: ``q/k/v/gate/up`` projections
column-wise, dimension 0; ``o/down`` row-wise, dimension 1; everything else replicated).

A cell's *state* is its parameters, and for a training replica the Adam moments ``m``, ``v`` of
the same shapes and the update counter: one full logical copy per replica (the EMU view of
SPEC §10; the training workers' ZeRO slices are gathered into it before a transition and
sliced out of it after).

:func:`cell_pieces` answers the one question every transition primitive asks: which slices of
which source cells make up a target cell. Split, Merge, Extend and the final hand-over to the
target plan's workers are all "assemble these target cells from that source unit"; the pieces
are the intersections of the target chunk ``[a, b)`` with the source chunks ``[c, d)`` along the
shard dimension, so a target cell receives exactly the bytes it keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..ir.plan import stage_layer_ranges
from ..ir.types import Head
from ..ir.workload import ModelSpec
from .model import StageModel

__all__ = [
    "CellState",
    "Piece",
    "assemble_cell",
    "cell_names",
    "cell_pieces",
    "chunk_bounds",
    "full_shapes",
    "owner_stage",
    "piece_shapes",
    "tp_dim",
]

_COL = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_ROW = re.compile(r"\.(o_proj|down_proj)\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def tp_dim(name: str) -> int | None:
    """Shard dimension of parameter ``name`` under tensor parallelism (``None``: replicated).

    Column-parallel projections split their output features (dimension 0 of ``weight`` and of
    Qwen2's ``bias``), row-parallel ones their input features (dimension 1), as in
    ``StageModel.tp_plan``.
    """
    if _COL.search(name):
        return 0
    if _ROW.search(name):
        return 1
    return None


def owner_stage(name: str, layers: int, pp: int) -> int:
    """Pipeline stage of ``pp`` that holds parameter ``name`` (embedding first, heads last)."""
    m = _LAYER.match(name)
    if m is None:
        return 0 if name.startswith("model.embed_tokens.") else pp - 1
    i = int(m.group(1))
    for p, (lo, hi) in enumerate(stage_layer_ranges(layers, pp)):
        if lo <= i < hi:
            return p
    raise ValueError(f"parameter {name!r}: layer {i} is outside 0..{layers - 1}")


def chunk_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of the ``parts`` chunks ``torch.chunk`` makes of ``size`` elements
    (``⌈size/parts⌉`` each, the tail shorter; chunks past the end are empty)."""
    step = -(-size // parts)
    return [(min(size, i * step), min(size, (i + 1) * step)) for i in range(parts)]


def full_shapes(spec: ModelSpec, head: Head) -> dict[str, tuple[int, ...]]:
    """Shape of every parameter of the whole model (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = StageModel(spec, head, seed=0)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def cell_names(shapes: Mapping[str, tuple[int, ...]], layers: int, pp: int, p: int) -> list[str]:
    """Parameters held by pipeline stage ``p`` of ``pp``, in model order."""
    return [n for n in shapes if owner_stage(n, layers, pp) == p]


@dataclass(frozen=True)
class Piece:
    """Slice ``[lo, hi)`` along ``dim`` of the source cell's local tensor ``name`` (``dim`` is
    ``None`` for a whole replicated tensor)."""

    name: str
    dim: int | None
    lo: int
    hi: int


def cell_pieces(
    shapes: Mapping[str, tuple[int, ...]],
    layers: int,
    source: tuple[int, int],
    target: tuple[int, int, int, int],
) -> dict[int, list[Piece]]:
    """Pieces of a source replica of layout ``source = (tp, pp)`` that make up the target cell
    ``target = (tp', pp', p', t')``, keyed by source rank ``p·tp + t``.

    For a sharded tensor of size ``D`` along its shard dimension the target keeps chunk ``t'`` of
    ``tp'``, ``[a, b)``; source rank ``t`` holds ``[c, d)`` (chunk ``t`` of ``tp``) and contributes
    ``[max(a, c) − c, min(b, d) − c)`` of its local tensor when that is not empty; concatenated
    in source-rank order the pieces are exactly ``[a, b)``. A replicated tensor comes whole from
    tensor rank 0 of its owning stage.
    """
    tp, pp = source
    tp2, pp2, p2, t2 = target
    out: dict[int, list[Piece]] = {}
    for name in cell_names(shapes, layers, pp2, p2):
        ps = owner_stage(name, layers, pp)
        dim = tp_dim(name)
        if dim is None:
            out.setdefault(ps * tp, []).append(Piece(name, None, 0, 0))
            continue
        size = shapes[name][dim]
        a, b = chunk_bounds(size, tp2)[t2]
        for t, (c, d) in enumerate(chunk_bounds(size, tp)):
            lo, hi = max(a, c), min(b, d)
            if lo < hi:
                out.setdefault(ps * tp + t, []).append(Piece(name, dim, lo - c, hi - c))
    return out


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


def piece_shapes(shapes: Mapping[str, tuple[int, ...]], pieces: list[Piece]) -> list[tuple[int, ...]]:
    """Shapes of the slices ``pieces`` name (one group of :meth:`CellState.tensors`): the full
    shape with the shard dimension cut to ``hi − lo``."""
    out = []
    for pc in pieces:
        shape = list(shapes[pc.name])
        if pc.dim is not None:
            shape[pc.dim] = pc.hi - pc.lo
        out.append(tuple(shape))
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
