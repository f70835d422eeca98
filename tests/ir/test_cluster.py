import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir import TIER_CLUSTER, TIER_NODE, TIER_RACK, Cluster
from rpeg.ir.cluster import pool_cluster

HW = hardware_preset("gh200")


def test_flat_ids_follow_spec_formula():
    c = Cluster.from_shape("2x3x4", HW)
    assert c.num_devices == 24
    # ((r·Nn) + n)·Ng + g
    assert c.flat_id(1, 2, 3) == ((1 * 3) + 2) * 4 + 3 == 23
    assert c.coords(23) == (1, 2, 3)
    assert all(c.flat_id(*c.coords(i)) == i for i in range(24))


@pytest.mark.parametrize(
    ("size", "extent"),
    [
        (1, (1, 1, 1)),
        (2, (1, 1, 2)),
        (3, None),
        (4, (1, 1, 4)),
        (8, (1, 2, 4)),
        (12, None),
        (16, (1, 4, 4)),
        (32, (2, 4, 4)),
        (48, None),
        (64, (4, 4, 4)),
        (128, None),
    ],
)
def test_legal_shapes(size, extent):
    c = Cluster.from_shape("4x4x4", HW)
    assert c.shape_for_size(size) == extent


def test_allocation_alignment_and_bounds_errors_name_the_problem():
    c = Cluster.from_shape("1x4x4", HW)
    a = c.allocation((0, 2, 0), (1, 2, 4))
    assert a.devices() == list(range(8, 16))
    assert a.tier == TIER_RACK
    with pytest.raises(ValueError, match="not aligned"):
        c.allocation((0, 1, 0), (1, 2, 4))
    with pytest.raises(ValueError, match="leaves the cluster"):
        c.allocation((0, 4, 0), (1, 1, 4))
    with pytest.raises(ValueError, match="not a legal shape"):
        c.allocation((0, 0, 0), (1, 3, 4))
    with pytest.raises(ValueError, match="not aligned"):
        c.allocation((0, 0, 1), (1, 1, 2))


def test_tiers_of_device_sets():
    c = Cluster.from_shape("2x2x4", HW)
    assert c.tier_of_mask(0b1) == TIER_NODE
    assert c.tier_of_mask(0b1111) == TIER_NODE
    assert c.tier_of_mask((1 << 0) | (1 << 4)) == TIER_RACK
    assert c.tier_of_mask((1 << 0) | (1 << 8)) == TIER_CLUSTER
    assert c.allocation((0, 0, 0), (2, 2, 4)).tier == TIER_CLUSTER


def test_allocations_of_size_tile_the_device_space():
    c = Cluster.from_shape("2x4x4", HW)
    for size in c.legal_sizes:
        allocs = c.allocations_of_size(size)
        assert len(allocs) * size == c.num_devices
        union = 0
        for a in allocs:
            assert not union & a.mask
            union |= a.mask
        assert union == c.all_mask


@pytest.mark.parametrize("bad", ["4x4", "ax2x2", "", "1x0x4"])
def test_bad_shapes_are_rejected(bad):
    with pytest.raises(ValueError):
        Cluster.from_shape(bad, HW)


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


def test_mask_devices_reads_runs_in_one_step_and_other_masks_bit_by_bit():
    from rpeg.ir.cluster import mask_devices, mask_range

    assert mask_range(0b1111_0000) == range(4, 8) and mask_devices(0b1111_0000) == [4, 5, 6, 7]
    assert mask_range(1 << 1000) == range(1000, 1001)
    wide = ((1 << 512) - 1) << 512
    assert mask_range(wide) == range(512, 1024) and mask_devices(wide) == list(range(512, 1024))
    for mask in (0b1011, 0b1_0000_0001, (1 << 700) | 1):  # not one run
        assert mask_range(mask) is None
        assert mask_devices(mask) == [i for i in range(mask.bit_length()) if mask >> i & 1]
    assert mask_range(0) is None and mask_devices(0) == []
    c = Cluster.from_shape("2x4x8", HW)
    for size in (1, 2, 4, 8, 16, 32, 64):  # every legal allocation is one run
        for a in c.allocations_of_size(size):
            assert mask_range(a.mask) == range(a.devices()[0], a.devices()[0] + size)


# ---------------------------------------------------------------------------- issue 33 (third round)
@pytest.mark.parametrize(
    ("shape", "exc", "pattern"),
    [
        ((1, 4), ValueError, r"Cluster\.from_shape: shape must be 'RACKSxNODESxGPUS' \(e\.g\. '1x2x4'\) or a \(racks, nodes_per_rack, gpus_per_node\) tuple; got 2 entries \(1, 4\)"),
        ((1, 4, 4, 2), ValueError, r"shape must be .*; got 4 entries \(1, 4, 4, 2\)"),
        ([1, 0, 4], ValueError, r"shape \(1, 0, 4\) must hold three positive integers \(racks, nodes_per_rack, gpus_per_node\); 0 is not one"),
        ((1, 2.0, 4), ValueError, r"shape \(1, 2\.0, 4\) must hold three positive integers .*; 2\.0 is not one"),
        (16, TypeError, r"Cluster\.from_shape: shape must be 'RACKSxNODESxGPUS' .* tuple, got int 16"),
        (None, TypeError, r"shape must be .*, got NoneType None"),
        (b"1x1x4", TypeError, r"shape must be .*, got bytes"),
    ],
)  # fmt: skip
def test_from_shape_names_a_shape_of_the_wrong_form(shape, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Cluster.from_shape(shape, HW)


def test_numpy_integers_are_taken_and_stored_as_int():
    np = pytest.importorskip("numpy")
    c = Cluster(
        np.int64(1), np.int32(2), np.int64(4), HW, generation_max_pp=np.int64(1), max_zero_stage=np.int8(2)
    )
    assert c.shape == (1, 2, 4) and all(type(x) is int for x in c.shape)
    assert type(c.generation_max_pp) is int and type(c.max_zero_stage) is int
    assert Cluster.from_shape((np.int64(1), np.int64(1), np.int64(8)), HW).shape == (1, 1, 8)
    assert Cluster.from_shape([1, 2, 4], HW).num_devices == 8
    with pytest.raises(
        ValueError, match=r"racks must be a positive integer, got np\.True_|racks must be a positive integer"
    ):
        Cluster(np.bool_(True), 1, 4, HW)
