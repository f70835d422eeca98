"""Tests of :func:`rpeg.ir.workload.with_response_len`: a workload at another response length,
quantile lengths scaled with it."""

from __future__ import annotations

import pytest

from rpeg import Workload, model_preset
from rpeg.ir.workload import default_quantiles, with_response_len


def _workload(**kw) -> Workload:
    m = model_preset("llama2-7b")
    return Workload("ppo", {"actor": m, "critic": m, "reward": m}, 128, 1, 256, 1024, name="ppo-7b", **kw)


def test_quantiles_scale_with_the_response_length():
    w = _workload()
    w2 = with_response_len(w, 2048)
    assert w2.response_len == 2048 and w2.quantiles[-1] == (1.0, 2048)
    assert [f for f, _ in w2.quantiles] == [f for f, _ in w.quantiles]
    assert [t for _, t in w2.quantiles] == [2 * t for _, t in w.quantiles]
    assert w2.prompt_len == w.prompt_len and w2.name == w.name
    assert with_response_len(w, 1024) is w
    with pytest.raises(ValueError, match="response_len"):
        with_response_len(w, 0)
    with pytest.raises(ValueError, match="response_len"):
        with_response_len(w, 10.5)


def test_defaults_when_scaling_breaks_monotonicity():
    w = _workload(quantiles=((0.5, 1000), (0.9, 1010), (1.0, 1024)))
    # scaled to 8 tokens the first two lengths collide: the SPEC §2 defaults apply
    assert with_response_len(w, 8).quantiles == default_quantiles(8)
