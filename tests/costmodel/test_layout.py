"""The cost model's :class:`Layout`: a plan's strategy on nodes of ``Ng`` GPUs (``costmodel/layout.py``)."""

import pytest

from rpeg.costmodel import Layout
from rpeg.ir.plan import Strategy


def strategy(dp=1, pp=1, tp=1, mb=1, pp_tier=0, dp_tier=0):
    return Strategy((1, 1, dp * pp * tp), dp, pp, tp, mb, pp_tier, dp_tier)


def test_a_layout_is_the_plans_strategy_plus_the_node_size():
    s = Strategy((1, 2, 8), dp=2, pp=4, tp=2, mb=8, pp_tier=1, dp_tier=1)
    lay = Layout(s, gpus_per_node=8)
    assert lay.strategy is s and lay.gpus_per_node == 8
    assert lay == Layout(Strategy((1, 2, 8), 2, 4, 2, 8, 1, 1), 8)  # a value: usable as a cache key
    assert Layout(strategy()).gpus_per_node == 8  # the default node


@pytest.mark.parametrize(
    ("degrees", "ng", "boundaries"),
    [
        ({"pp": 2, "tp": 2}, 2, (0, 1)),  # one stage per node: the boundary is inter-node
        ({"pp": 4, "tp": 2, "mb": 4}, 4, (2, 1)),  # two stages per node, two nodes
        ({"pp": 2, "mb": 4}, 8, (1, 0)),  # the whole pipeline in one node
        ({"pp": 1}, 8, (0, 0)),
    ],
)
def test_pipeline_boundaries_inside_and_between_nodes(degrees, ng, boundaries):
    # n_inter = max(0, ⌈Pp/⌊Ng/Pt⌋⌉ − 1), n_intra = Pp − 1 − n_inter
    assert Layout(strategy(**degrees), ng).pp_boundaries == boundaries


def test_layout_validation_names_the_field():
    with pytest.raises(ValueError, match="dp must be a positive integer, got 0"):
        Layout(strategy(dp=0))
    with pytest.raises(ValueError, match=r"mb must be a positive integer, got 1\.5"):
        Layout(strategy(mb=1.5))
    with pytest.raises(ValueError, match="pp_tier must be a tier 0, 1 or 2, got 3"):
        Layout(strategy(pp=2, mb=2, pp_tier=3))
    with pytest.raises(ValueError, match="dp_tier"):
        Layout(strategy(dp_tier=-1))
    with pytest.raises(ValueError, match="tp=8 exceeds gpus_per_node=4"):
        Layout(strategy(tp=8), gpus_per_node=4)
    with pytest.raises(ValueError, match="gpus_per_node must be a positive integer, got 0"):
        Layout(strategy(), gpus_per_node=0)
    with pytest.raises(TypeError, match="strategy must be a Strategy, got tuple"):
        Layout((1, 1, 1, 1))
