"""Tests of ``ir/plan.py`` helpers not covered elsewhere: the pipeline stages' layer split."""

from __future__ import annotations

import pytest

from rpeg.ir.plan import stage_layer_ranges


def test_stage_layer_ranges():
    assert stage_layer_ranges(5, 2) == [(0, 3), (3, 5)]
    assert stage_layer_ranges(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert stage_layer_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ValueError, match="stages=3"):
        stage_layer_ranges(2, 3)
