"""Tests of :func:`rpeg.ir.cluster.pool_cluster`: the cluster of a pool of the first ``n``
devices (part of a node, whole nodes of one rack, whole racks)."""

from __future__ import annotations

import pytest

from rpeg import Cluster, hardware_preset
from rpeg.ir.cluster import pool_cluster


def test_pool_cluster_shapes_and_validation():
    cl = Cluster.from_shape("1x4x8", hardware_preset("h100"))
    assert pool_cluster(cl, 16).shape == (1, 2, 8)
    assert pool_cluster(cl, 4).shape == (1, 1, 4)
    assert pool_cluster(cl, 32).shape == (1, 4, 8)
    assert pool_cluster(cl, 8).hardware == cl.hardware
    with pytest.raises(ValueError, match=r"devices must be an integer in 1\.\.32, got 64"):
        pool_cluster(cl, 64)
    with pytest.raises(ValueError, match="12 devices"):
        pool_cluster(cl, 12)
    with pytest.raises(ValueError, match="got True"):
        pool_cluster(cl, True)


def test_pools_of_whole_racks():
    cl = Cluster.from_shape("4x2x4", hardware_preset("h100"))
    assert pool_cluster(cl, 16).shape == (2, 2, 4)
    assert pool_cluster(cl, 24).shape == (3, 2, 4)
    with pytest.raises(ValueError, match="12 devices"):
        pool_cluster(cl, 12)  # more than one rack's nodes, fewer than two racks
