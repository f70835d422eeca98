"""One world per run, one process per device (``worker/parallel.py`` ``plan_groups``, ``make_mesh``):
groups that share devices get process groups of their own inside the world, every rank's mesh
coordinates and subgroups are its group's, and collectives, pipeline sends, DTensor TP and FSDP2
run inside each group without touching the others."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 4
#: (gid, world ranks, dp, pp, tp): a 2×2 group over every device, a 2-stage pipeline on devices 1
#: and 3, a DP-2 group on devices 2 and 3
LAYOUTS = [(0, [0, 1, 2, 3], 2, 1, 2), (1, [1, 3], 1, 2, 1), (2, [2, 3], 2, 1, 1)]


def _rank(rank: int, init_file: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from rpeg.runtime.worker.parallel import local, make_mesh, plan_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        groups = plan_groups(LAYOUTS, rank)
        assert sorted(groups) == [g for g, ranks, *_ in LAYOUTS if rank in ranks]
        for gid, ranks, dp, pp, tp in LAYOUTS:
            if gid not in groups:
                continue
            m = make_mesh(groups[gid], dp, pp, tp, "cpu")
            assert m.rank == ranks.index(rank) and dist.get_rank(m.group) == m.rank
            assert (m.d, m.p, m.t) == (m.rank // (pp * tp), (m.rank // tp) % pp, m.rank % tp)
            # a collective over the group sees its ranks only
            x = torch.tensor([float(rank)])
            dist.all_reduce(x, group=m.group)
            assert x.item() == sum(ranks)
            if pp > 1:  # pipeline sends name ranks of the group
                t = torch.tensor([float(rank)])
                if m.first:
                    dist.send(t, group=m.group, group_dst=m.next_rank())
                else:
                    dist.recv(t, group=m.group, group_src=m.prev_rank())
                    assert t.item() == ranks[m.prev_rank()]
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False)
            )
            full = [p.detach().clone() for p in model.parameters()]
            if tp > 1:
                parallelize_module(model, m.tp_mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
                assert local(model[0].weight).shape == (16 // tp, 8)
            if dp > 1:
                fully_shard(model, mesh=m.dp_mesh)
            out = model(torch.ones(2, 8))
            want = torch.ones(2, 8) @ full[0].T @ full[1].T
            torch.testing.assert_close(local(out).detach(), want, atol=1e-5, rtol=1e-5)
    finally:
        dist.destroy_process_group()


def test_groups_sharing_devices_run_in_one_world(tmp_path):
    mp.start_processes(_rank, args=(str(tmp_path / "rendezvous"),), nprocs=WORLD, start_method="fork")


def test_a_group_with_two_ranks_on_one_device_or_out_of_order_is_refused():
    from rpeg.runtime.worker.parallel import plan_groups

    with pytest.raises(ValueError, match=r"group g5: world ranks \[0, 0\] are not 1·1·2 distinct ranks"):
        plan_groups([(5, [0, 0], 1, 1, 2)], 0)
    with pytest.raises(ValueError, match="in increasing order"):  # group rank r must be member r
        plan_groups([(5, [1, 0], 1, 1, 2)], 0)


def test_meshes_of_groups_on_the_same_devices_or_of_earlier_worlds_never_compare_equal(tmp_path):
    """DTensor caches sharding decisions under meshes compared by ranks, layout and dimension
    names; a mesh equal to another group's (same devices) or to an earlier run's in a pooled
    process would hand its ops that mesh's process groups. Every group's mesh is told apart."""
    from rpeg.runtime.worker.parallel import make_mesh, plan_groups

    def world(n: int) -> list:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'w{n}'}", rank=0, world_size=1)
        try:
            groups = plan_groups([(0, [0], 1, 1, 1), (1, [0], 1, 1, 1)], 0)
            return [make_mesh(groups[g], 1, 1, 1, "cpu") for g in (0, 1)]
        finally:
            dist.destroy_process_group()

    first, second = world(0), world(1)
    meshes = [m for pair in (first, second) for m in pair]
    for i, a in enumerate(meshes):
        for b in meshes[i + 1 :]:
            assert a.tp_mesh != b.tp_mesh and a.dp_mesh != b.dp_mesh
