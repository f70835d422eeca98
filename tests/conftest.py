"""Shared fixtures: small GH200 clusters, a tiny PPO workload, the 70B workload that cannot fit
on one A100 node, the bundled examples, and the independent result checker."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rpeg import Cluster, Workload, example_path, hardware_preset, load_workload, model_preset

TESTS = Path(__file__).parent

# Modules that load torch into the test process (and start Ray) run last, after the fast
# planning tests. (They were moved there when HiGHS returned "unknown" on small MILPs on a fresh
# clone; the cause turned out to be HiGHS's process-wide thread pool — a run whose ``threads``
# differs from the pool's size fails — now handled in formulations/pyomo_backend.py, with a test.)
TORCH_MODULES = ("tests/runtime/",)


WHEEL_TEST = "tests/test_wheel.py"


class WheelCheck:
    """``.ci/check-wheel`` running in the background, its output in a temporary file.

    It starts when the test is collected (about 45 s, mostly installing the dependencies) and
    runs beside the tests collected with it (``make test``: the runtime tests; plain ``pytest``:
    the planning tests, which keep one core busy). ``tests/test_wheel.py`` runs last and waits for
    it (no deadline: it is making progress or it has exited)."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read after the process ends
        # the interpreter the test venv was made from: the fresh venv starts from the same Python
        env = dict(os.environ, PYTHON=getattr(sys, "_base_executable", sys.executable))
        self.proc = subprocess.Popen(
            ["bash", str(TESTS.parent / ".ci" / "check-wheel")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=TESTS.parent,
        )

    def result(self) -> tuple[int, str]:
        """Exit status and output of the script, once it has ended."""
        status = self.proc.wait()
        self.log.seek(0)
        return status, self.log.read()


_wheel: list[WheelCheck] = []


def wheel_check() -> WheelCheck:
    """The background wheel check, started now if collection did not start it."""
    if not _wheel:
        _wheel.append(WheelCheck())
    return _wheel[0]


@pytest.fixture(scope="session")
def background_wheel_check() -> WheelCheck:
    """The wheel check started at collection. (A fixture, not an import: this conftest is
    imported under a name derived from the checkout's folder, and ``import tests.conftest``
    would load a second copy with a check of its own.)"""
    return wheel_check()


def pytest_unconfigure(config) -> None:
    """A session that ends early (``-x``, Ctrl-C) stops the background wheel check with it."""
    for check in _wheel:
        if check.proc.poll() is None:
            check.proc.terminate()
            check.proc.wait()


def pytest_collection_modifyitems(config, items) -> None:
    """Keep collection order, but move the torch-loading modules after everything else and the
    wheel check to the very end; when the wheel check is selected, start it now."""
    root = Path(str(config.rootpath))

    def rel(item) -> str:
        return Path(str(item.fspath)).resolve().relative_to(root.resolve()).as_posix()

    items.sort(key=lambda item: (rel(item) == WHEEL_TEST, rel(item).startswith(TORCH_MODULES)))
    if any(rel(item) == WHEEL_TEST for item in items) and not config.option.collectonly:
        wheel_check()


def load_checker():
    """``tests/tools/check_result.py`` imported from its path (works under plain ``pytest``)."""
    name = "rpeg_check_result"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, TESTS / "tools" / "check_result.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported from its path, once per process (the scripts are not a
    package): for tests of what a benchmark can run on CPU."""
    mod_name = f"rpeg_benchmark_{name}"
    mod = sys.modules.get(mod_name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(mod_name, TESTS.parent / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
    return mod


def tiny_ppo_workload(**overrides) -> Workload:
    """PPO with Llama-2 7B actor/critic/reward/reference, B=64, R=1, Lp=128, Lr=256."""
    seven = model_preset("7b")
    kw = {
        "algorithm": "ppo",
        "models": {"actor": seven, "critic": seven, "reward": seven},
        "batch": 64,
        "rollouts": 1,
        "prompt_len": 128,
        "response_len": 256,
        "name": "tiny-ppo",
    }
    kw.update(overrides)
    return Workload(**kw)


def ppo_70b_workload() -> Workload:
    """PPO with a Llama-2 70B actor (and reference), 7B critic and reward: too big for 8×A100-40GB."""
    return Workload(
        algorithm="ppo",
        models={
            "actor": model_preset("llama2-70b"),
            "critic": model_preset("7b"),
            "reward": model_preset("7b"),
        },
        batch=64,
        rollouts=1,
        prompt_len=128,
        response_len=256,
        name="ppo-70b-8gpu",
    )


def example_problem(name: str) -> tuple[Workload, Cluster, int]:
    """Workload, cluster and ``k_eval`` of the bundled example ``name``."""
    wf = load_workload(example_path(name))
    assert wf.cluster_shape is not None and wf.hardware is not None
    return wf.workload, Cluster.from_shape(wf.cluster_shape, hardware_preset(wf.hardware)), wf.k_eval


@pytest.fixture(scope="session")
def gh200():
    return hardware_preset("gh200")


@pytest.fixture(scope="session")
def cluster_1x2x4(gh200):
    """Two GH200 nodes of four GPUs in one rack (8 devices)."""
    return Cluster.from_shape("1x2x4", gh200)


@pytest.fixture(scope="session")
def cluster_1x1x4(gh200):
    """One GH200 node of four GPUs."""
    return Cluster.from_shape("1x1x4", gh200)


@pytest.fixture(scope="session")
def cluster_2x1x4(gh200):
    """Two racks of one GH200 node each (8 devices, inter-rack links between the halves)."""
    return Cluster.from_shape("2x1x4", gh200)


@pytest.fixture(scope="session")
def tiny_ppo():
    return tiny_ppo_workload()


@pytest.fixture(scope="session")
def ppo_70b():
    return ppo_70b_workload()


@pytest.fixture(scope="session")
def a100_1x1x8():
    return Cluster.from_shape("1x1x8", hardware_preset("a100-40gb"))


@pytest.fixture(scope="session")
def checker():
    """The independent ``rpeg.result/1`` checker module (``checker.check(doc) -> list[str]``)."""
    return load_checker()


@pytest.fixture(scope="session")
def make_ppo():
    """``make_ppo(**overrides)``: the tiny PPO workload with some fields replaced."""
    return tiny_ppo_workload


@pytest.fixture(scope="session")
def problem_of():
    """``problem_of(name)``: workload, cluster and ``k_eval`` of a bundled example."""
    return example_problem
