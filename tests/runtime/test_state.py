"""Cell arithmetic of transitions (runtime/worker/state.py): any layout's cells reassemble any other's."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from rpeg.ir import ModelSpec  # noqa: E402
from rpeg.ir.types import Head  # noqa: E402
from rpeg.runtime.cells import cell_names, cell_pieces, chunk_bounds, owner_stage, tp_dim  # noqa: E402
from rpeg.runtime.worker.state import CellState, assemble_cell, full_shapes  # noqa: E402

# three layers: pipeline splits are uneven ([0, 2), [2, 3) for two stages)
SPEC = ModelSpec("t", 3, 32, 64, 16, 4, 4)


def cells_of(full: dict, moments: bool, tp: int, pp: int) -> dict[int, CellState]:
    """Cut full tensors into the cells of a tp×pp layout the way the workers hold them."""
    out = {}
    for p, t in itertools.product(range(pp), range(tp)):
        names = cell_names({k: v.shape for k, v in full.items()}, SPEC.layers, pp, p)

        def cut(x: torch.Tensor, name: str, t: int = t) -> torch.Tensor:
            dim = tp_dim(name)
            return x if dim is None else torch.chunk(x, tp, dim=dim)[t]

        params = {n: cut(full[n], n) for n in names}
        m = {n: cut(-full[n], n) for n in names} if moments else None
        v = {n: cut(2 * full[n], n) for n in names} if moments else None
        out[p * tp + t] = CellState(params, m, v, step=7)
    return out


def test_chunk_bounds_match_torch_chunk():
    for size, parts in [(8, 2), (7, 3), (4, 3), (1, 2)]:
        got = chunk_bounds(size, parts)
        chunks = torch.chunk(torch.arange(size), parts)
        for i, (a, b) in enumerate(got):
            expect = chunks[i].tolist() if i < len(chunks) else []
            assert list(range(a, b)) == expect


def test_owner_stage_and_tp_dim():
    assert owner_stage("model.embed_tokens.weight", SPEC.layers, 2) == 0
    assert owner_stage("lm_head.weight", SPEC.layers, 2) == 1
    assert owner_stage("model.layers.1.self_attn.q_proj.weight", 2, 2) == 1
    assert [owner_stage(f"model.layers.{i}.mlp.up_proj.weight", 3, 2) for i in range(3)] == [0, 0, 1]
    assert tp_dim("model.layers.0.self_attn.q_proj.weight") == 0
    assert tp_dim("model.layers.0.mlp.down_proj.weight") == 1
    assert tp_dim("model.layers.0.input_layernorm.weight") is None
    with pytest.raises(ValueError, match="layer 9"):
        owner_stage("model.layers.9.self_attn.q_proj.weight", 2, 2)


@pytest.mark.parametrize("moments", [False, True])
def test_every_layout_reassembles_every_other(moments):
    shapes = full_shapes(SPEC, Head.BOTH)
    gen = torch.Generator().manual_seed(0)
    full = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    layouts = [(tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 3)]
    for src, dst in itertools.product(layouts, layouts):
        source = cells_of(full, moments, *src)
        expect = cells_of(full, moments, *dst)
        for p, t in itertools.product(range(dst[1]), range(dst[0])):
            target = (dst[0], dst[1], p, t)
            pieces = cell_pieces(shapes, SPEC.layers, src, target)
            received = {}
            for r, pcs in pieces.items():
                parts = source[r].tensors(pcs)
                k = len(pcs)
                received[r] = CellState(
                    {pc.name: parts[j] for j, pc in enumerate(pcs)},
                    {pc.name: parts[k + j] for j, pc in enumerate(pcs)} if moments else None,
                    {pc.name: parts[2 * k + j] for j, pc in enumerate(pcs)} if moments else None,
                    step=source[r].step,
                )
            names = cell_names(shapes, SPEC.layers, dst[1], p)
            cell = assemble_cell(names, received, pieces)
            want = expect[p * dst[0] + t]
            assert set(cell.params) == set(want.params), (src, dst)
            for n in names:
                assert torch.equal(cell.params[n], want.params[n]), (src, dst, n)
                if moments:
                    assert torch.equal(cell.m[n], want.m[n]) and torch.equal(cell.v[n], want.v[n])
            assert cell.step == 7
            # a target cell receives exactly what it keeps, no more
            sent = sum(t.numel() for r in received for t in received[r].params.values())
            assert sent == sum(t.numel() for t in want.params.values())


def test_assemble_refuses_missing_pieces_and_mixed_counters():
    shapes = full_shapes(SPEC, Head.LM)
    names = cell_names(shapes, SPEC.layers, 1, 0)
    with pytest.raises(RuntimeError, match="no source holds"):
        assemble_cell(names, {}, {})
    a = CellState({"x": torch.zeros(1)}, step=1)
    b = CellState({"y": torch.zeros(1)}, step=2)
    with pytest.raises(RuntimeError, match="update counter"):
        assemble_cell([], {0: a, 1: b}, {0: [], 1: []})
