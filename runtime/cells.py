"""Where every byte of a model's state lives in a layout: which tensors, and which slices of them,
each rank of a ``tp × pp`` replica holds (SPEC §10). Plain arithmetic on names and shapes — no
tensors — so the driver plans a transition's moves with it and the workers cut and join the
tensors by it (:mod:`~rpeg.runtime.worker.state`).

A *cell* is what one rank of one replica holds: rank ``i = p·tp + t`` of a ``tp × pp`` layout
keeps the tensors of pipeline stage ``p`` (the embedding on the first stage, blocks of
:func:`~rpeg.ir.plan.stage_layer_ranges`, the final norm and heads on the last) and of
every tensor-parallel weight the ``t``-th ``torch.chunk`` along its shard dimension (the
Megatron plan of :meth:`~rpeg.runtime.worker.model.StageModel.tp_plan`: ``q/k/v/gate/up``
projections column-wise, dimension 0; ``o/down`` row-wise, dimension 1; everything else
replicated).

:func:`cell_pieces` answers the one question every transition primitive asks: which slices of
which source cells make up a target cell. Split, Merge, Extend and the final hand-over to the
target plan's workers are all "assemble these target cells from that source unit"; the pieces
are the intersections of the target chunk ``[a, b)`` with the source chunks ``[c, d)`` along the
shard dimension, so a target cell receives exactly the bytes it keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir.plan import stage_layer_ranges

__all__ = ["Piece", "cell_names", "cell_pieces", "chunk_bounds", "owner_stage", "piece_shapes", "tp_dim"]

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
