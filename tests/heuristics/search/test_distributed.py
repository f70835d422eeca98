"""Tests for ``heuristics/search/distributed.py``: independent annealing chains on a local Ray
instance (``solve(..., method="sa", backend="ray")``), the budget split and the merge."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")

import rpeg  # noqa: E402
from rpeg.heuristics.search.distributed import (  # noqa: E402
    MISSING_RAY,
    merge,
    run_chain,
    split_budget,
)
from rpeg.solvers import Problem, Status, solve  # noqa: E402
from rpeg.solvers.sa import _build_chain  # noqa: E402

EXAMPLE = "ppo-7b-16gpu"


@functools.cache
def problem() -> tuple[rpeg.Workload, rpeg.Cluster]:
    """The bundled PPO 7B example on 16 GH200 (1x4x4)."""
    wf = rpeg.load_workload(rpeg.example_path(EXAMPLE))
    return wf.workload, rpeg.Cluster.from_shape("1x4x4", rpeg.hardware_preset("gh200"))


def test_without_a_connection_a_local_instance_is_started_and_stopped():
    # runs before the module's fixture connects (tests run in file order)
    if ray.is_initialized():
        pytest.skip("this process already holds a Ray connection")
    workload, cluster = problem()
    result = solve(workload, cluster, method="sa", backend="ray", chains=2, max_evaluations=100, seed=3)
    assert result.feasible
    assert len(result.extra["chains"]) == 2
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance with two CPUs for the module's tests."""
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_result(local_ray):
    workload, cluster = problem()
    return solve(workload, cluster, method="sa", backend="ray", chains=2, max_evaluations=600, seed=1)


def test_ray_search_is_feasible_and_beats_the_concurrent_baseline(ray_result, checker):
    workload, cluster = problem()
    baseline = solve(workload, cluster, method="concurrent")
    assert ray_result.status is Status.FEASIBLE
    assert ray_result.throughput >= baseline.throughput
    assert checker.check(json.loads(ray_result.to_json())) == []


def test_chains_are_reported_and_their_evaluations_counted(ray_result):
    chains = ray_result.extra["chains"]
    assert [c["index"] for c in chains] == [0, 1]
    assert [c["seed"] for c in chains] == [1, 2]
    # each chain: ⌊(600 − 60) / 2⌋ evaluations at most; the driver spends the rest on the merge
    assert all(0 < c["evaluations"] <= 270 for c in chains)
    assert ray_result.evaluations > sum(c["evaluations"] for c in chains)
    # the merged best is at least as good as every chain's best
    assert ray_result.throughput >= max(c["best_throughput"] for c in chains)


def test_same_seed_and_chains_give_the_same_plan(ray_result):
    workload, cluster = problem()
    again = solve(workload, cluster, method="sa", backend="ray", chains=2, max_evaluations=600, seed=1)
    assert again.plan == ray_result.plan
    assert again.structure == ray_result.structure
    assert again.evaluations == ray_result.evaluations


def test_address_of_the_current_connection_is_used(local_ray):
    workload, cluster = problem()
    result = solve(
        workload, cluster, method="sa", backend="ray", address=local_ray, chains=2, max_evaluations=100
    )
    assert result.feasible
    assert ray.is_initialized()  # a connection the caller holds is left open


def test_progress_counts_chains_then_the_driver(local_ray):
    workload, cluster = problem()
    seen = []
    result = solve(
        workload,
        cluster,
        method="sa",
        backend="ray",
        chains=2,
        max_evaluations=200,
        progress=lambda figures: seen.append((figures["structure"], figures["evaluations"])),
    )
    counts = [n for _, n in seen]
    assert counts == sorted(counts)  # the driver's figures continue the chains'
    assert seen[-1] == ("merge and polish", result.evaluations)
    assert any(label == "2/2 chains done" for label, _ in seen)


def test_another_address_than_the_current_connection_is_rejected(local_ray):
    workload, cluster = problem()
    with pytest.raises(ValueError, match="already connected"):
        solve(workload, cluster, method="sa", backend="ray", address="10.0.0.1:6379", max_evaluations=10)


def test_another_process_joins_the_cluster_by_address(local_ray):
    code = textwrap.dedent(
        f"""
        import rpeg
        wf = rpeg.load_workload(rpeg.example_path({EXAMPLE!r}))
        cluster = rpeg.Cluster.from_shape("1x4x4", rpeg.hardware_preset("gh200"))
        r = rpeg.solve(wf.workload, cluster, method="sa", backend="ray", address={local_ray!r},
                       chains=2, max_evaluations=100)
        print(r.status.value, len(r.extra["chains"]))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["feasible", "2"]


def test_unknown_backend_lists_the_known_ones():
    workload, cluster = problem()
    with pytest.raises(ValueError, match=r"'local', 'ray'"):
        solve(workload, cluster, method="sa", backend="dask", max_evaluations=10)


@pytest.mark.parametrize(
    "kw",
    [
        {"backend": "ray", "workers": 2},
        {"backend": "local", "chains": 2},
        {"backend": "local", "address": "auto"},
    ],
)
def test_options_of_the_other_backend_are_rejected(kw):
    workload, cluster = problem()
    with pytest.raises(ValueError):
        solve(workload, cluster, method="sa", max_evaluations=10, **kw)


def test_missing_ray_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    workload, cluster = problem()
    with pytest.raises(ImportError, match=r"pip install 'rpeg\[ray\]'"):
        solve(workload, cluster, method="sa", backend="ray", max_evaluations=10)
    assert "rpeg[ray]" in MISSING_RAY


def test_budget_split():
    s = split_budget(10.0, 600, 2, 0.1)
    assert (s.chain_seconds, s.chain_evaluations) == (9.0, 270)
    assert s.polish_seconds == pytest.approx(1.0)
    assert s.polish_evaluations == 60
    assert split_budget(None, 3, 8, 0.0).chain_evaluations == 1  # every chain gets at least one
    with pytest.raises(ValueError, match="chains"):
        split_budget(10.0, None, 0, 0.1)
    with pytest.raises(ValueError, match="time_limit or max_evaluations"):
        split_budget(None, None, 2, 0.1)


def test_merge_keeps_the_best_plan_of_all_chains_in_process():
    workload, cluster = problem()
    build = functools.partial(_build_chain, Problem(workload, cluster), {})
    results = [run_chain(build, i, 5 + i, None, 150) for i in range(2)]
    assert all(r.best is not None for r in results)
    distinct = {(s, p.key()) for r in results for s, p in r.plans()}
    search = build(seed=5, seconds=None, evaluations=len(distinct), polish=False, progress=None)
    assert merge(search, results) == len(distinct)
    assert search.budget.used == len(distinct)  # every plan offered was evaluated once, here
    best = max(r.best[2].throughput for r in results)
    assert search.best is not None
    assert search.best[3].throughput == pytest.approx(best)
