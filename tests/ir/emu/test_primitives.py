"""The four primitives: bytes, GPU sets and memory needs (``ir/emu/primitives.py``)."""

from __future__ import annotations

import pytest

from rpeg.ir.emu import EMU, Destroy, Extend, Merge, ModelStage, Split, Stage

GEN = ModelStage("actor", Stage.GEN, "actor_gen", 0)
TRAIN = ModelStage("critic", Stage.TRAIN, "critic_train", 5)
P = 16e9  # |θ| of an 8B model in BF16
OPT = 96e9  # |ω| = 12·N


def unit(ms, tp, pp, first, optim=0.0):
    return EMU(ms, tp, pp, tuple(range(first, first + tp * pp)), P, optim)


def test_split_bytes_group_and_memory():
    src = unit(TRAIN, 2, 2, 0, OPT)  # GPUs 0-3: ranks (p, t) = (0,0) (0,1) (1,0) (1,1)
    parts = tuple(EMU(TRAIN, 1, 2, (g, g + 1), P, OPT) for g in (0, 2))
    s = Split(src, parts)
    assert s.group_size == 2
    assert s.nbytes == pytest.approx((P + OPT) / 2)  # the new shard each GPU gathers
    assert s.group() == (0, 1)  # a TP group: the ranks holding parts of rank 0's new shard
    assert s.gpus == frozenset(range(4)) and not s.acquired and not s.released
    assert s.memory_need(0) == pytest.approx((P + OPT) / 4 + (P + OPT) / 2)
    pp_split = Split(unit(GEN, 1, 4, 0), tuple(EMU(GEN, 1, 2, (g, g + 1), P) for g in (0, 2)))
    assert pp_split.group() == (0, 1)  # stages 0 and 1 hold rank 0's new stage
    with pytest.raises(ValueError, match="tile"):
        Split(src, parts[:1])


def test_merge_extend_destroy_bytes_and_gpu_sets():
    a, b = unit(GEN, 1, 4, 0), unit(GEN, 1, 4, 4)
    m = Merge((a, b), EMU(GEN, 2, 4, tuple(range(8)), P))
    assert m.nbytes == pytest.approx(P / 8) and m.gpus == frozenset(range(8)) and not m.acquired
    e = Extend(a, unit(GEN, 1, 4, 16))
    assert e.nbytes == pytest.approx(P / 4)
    assert e.acquired == frozenset(range(16, 20)) and e.gpus == frozenset(range(4)) | frozenset(range(16, 20))
    assert e.memory_need(16) == pytest.approx(P / 4) and e.memory_need(0) == 0.0
    d = Destroy(b)
    assert (
        d.released == frozenset(range(4, 8)) and d.nbytes == 0.0 and d.memory_need(4) == pytest.approx(P / 4)
    )
    with pytest.raises(ValueError, match="overlap"):
        Extend(a, unit(GEN, 1, 4, 2))
