"""Time limits that hold for every plan method, counting model building, and Ctrl-C.

Before the deadline work: ``milp`` on ``ppo-13b-64gpu`` with ``time_limit=3`` built Pyomo models
for minutes (about 27 s and 380,000 rows per structure, outside the limit) before returning;
``cpsat`` with a small limit returned no plan although its warm start existed; Ctrl-C during
``milp`` escaped as ``KeyboardInterrupt`` and during ``cpsat`` only ended one structure's search.
Bounds are generous (``1.1·limit + 1 s`` measured with ``time.monotonic``) so that a loaded
2-core machine does not make them flaky; a watchdog (SIGALRM) turns a run that overshoots by far
into a quick failure instead of a hang.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from rpeg import solve
from rpeg.solvers import clear_caches
from rpeg.solvers.result import Status
from tests.conftest import example_problem


class Overran(Exception):
    """The watchdog fired: the method ran far past its limit."""


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise :class:`Overran` in the test if the block runs longer than ``seconds``."""

    def fire(signum, frame):
        raise Overran(f"still running after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def ctrl_c_after(seconds: float) -> Iterator[None]:
    """Send this process SIGINT after ``seconds`` (as Ctrl-C does); a signal arriving after the
    block is ignored, and a ``KeyboardInterrupt`` escaping the block fails the test.

    The garbage collector's callbacks are set aside meanwhile: hypothesis (loaded by other test
    modules) registers one, and an exception raised by a signal handler that happens to run
    inside a gc callback is swallowed by Python ("Exception ignored in ... gc_callback")."""
    armed = [True]
    callbacks = gc.callbacks[:]
    gc.callbacks.clear()

    def interrupt(signum, frame):
        if armed[0]:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, interrupt)
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the method instead of ending it with the best plan so far")
    finally:
        armed[0] = False
        timer.cancel()
        signal.signal(signal.SIGINT, old)
        gc.callbacks[:] = callbacks


def bound(limit: float) -> float:
    """The overshoot the tests allow: 10% of the limit plus one second."""
    return 1.1 * limit + 1.0


@pytest.fixture(scope="module")
def ppo13b():
    return example_problem("ppo-13b-64gpu")


def run(problem, method: str, limit: float, **options):
    workload, cluster, k_eval = problem
    t0 = time.monotonic()
    with watchdog(3 * limit + 10):
        r = solve(workload, cluster, method=method, time_limit=limit, k_eval=k_eval, **options)
    return r, time.monotonic() - t0


def test_milp_returns_the_warm_start_in_time_from_a_cold_start(ppo13b):
    """The limit counts everything from a fresh process's start: the solver libraries' import,
    each structure's evaluator and directories (about 1 s apiece at 64 GPUs here) and the model.
    Which of them the 4 s run out in depends on the machine's speed and load (on CI, a loaded
    run spent them preparing the structure), so this test asks only for the warm start in time;
    the next one makes the model the part that runs out."""
    from rpeg.ir.templates import structures

    clear_caches()  # directories built here, as in a fresh process, not from the process's cache
    r, elapsed = run(ppo13b, "milp", 4, structure=structures(ppo13b[0])[0])
    assert elapsed <= bound(4), f"milp took {elapsed:.2f} s on a 4-s limit"
    assert r.status is Status.TIME_LIMIT and r.plan is not None and r.evaluation.feasible
    assert "returned the warm-start plan" in r.message and r.extra["returned"] == "warm_start"


@pytest.mark.parametrize("method", ["greedy", "concurrent", "sa", "dp"])
def test_every_method_on_the_64_gpu_example_ends_within_a_short_limit_from_a_cold_cache(ppo13b, method):
    """The full candidate directories of ``ppo-13b-64gpu`` take about 3 s to build here and its
    DP frontiers 4 s (then 2.5 s of DP): before the build watched the deadline, every method
    overran a 1-s limit by 1.7-4.3 s and dp a 3-s one by 2.9 s, sa by 1.4 s
    (benchmarks/RESULTS.md, overshoot, 2026-12-06). Past the deadline the vertices not built
    get lean directories (frontiers), and the result says so. 3 s, not 1: beside another test
    (``-n 2`` on two cores) everything runs about twice as slow, and the lean floor of this
    example is about 1.2 s alone; the 1-s figures are the benchmark's."""
    clear_caches()
    r, elapsed = run(ppo13b, method, 3.0)
    assert elapsed <= bound(3.0), f"{method} took {elapsed:.2f} s on a 3-s limit"
    assert r.plan is not None and r.evaluation.feasible
    if r.status is Status.TIME_LIMIT:
        assert "left no time to build the full" in r.message, r.message


def test_milp_returns_the_warm_start_in_time_when_its_model_is_too_large(ppo13b):
    """With the solver libraries loaded and the structure's directories cached, the 4 s go to
    the model, which is far too large for them (380,000 rows; 26 s to build on this machine):
    the build stops at the deadline and the warm start is returned, saying so."""
    import pyomo.contrib.appsi.solvers.highs  # what milp's loader waits for
    import pyomo.environ  # noqa: F401

    from rpeg.ir.templates import structures

    structure = structures(ppo13b[0])[0]
    run(ppo13b, "milp", 0.5, structure=structure)  # prepares and caches the directories
    r, elapsed = run(ppo13b, "milp", 4, structure=structure)
    assert elapsed <= bound(4), f"milp took {elapsed:.2f} s on a 4-s limit"
    assert r.status is Status.TIME_LIMIT and r.plan is not None and r.evaluation.feasible
    assert "model too large to build in" in r.message and "warm-start plan" in r.message, r.message
    assert r.extra["returned"] == "warm_start"


def test_cpsat_on_a_tiny_limit_returns_at_least_its_warm_start():
    """A 0.5-s limit. The first structure's evaluator and directories are always prepared (lean
    ones past a quarter of a second: about a third of the full build's 0.7-1.1 s here), more
    beside another test: a first run prepares them, and the second is timed, its limit spent in
    the engine."""
    problem = example_problem("ppo-7b-16gpu")
    run(problem, "cpsat", 0.5)  # prepares and caches the first structure's directories
    r, elapsed = run(problem, "cpsat", 0.5)
    assert elapsed <= bound(0.5), f"cpsat took {elapsed:.2f} s on a 0.5-s limit"
    assert r.status is Status.TIME_LIMIT and r.plan is not None and r.evaluation.feasible
    workload, cluster, k_eval = problem
    # the synchronous concurrent plan over the same (lean, kept) directories is the first
    # structure's warm start: never worse than it
    concurrent = solve(workload, cluster, method="concurrent", k_eval=k_eval, time_limit=1e-3)
    assert "left no time to build the full" in concurrent.message
    assert r.evaluation.throughput >= concurrent.evaluation.throughput * (1 - 1e-9)


@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_an_expired_limit_prepares_one_structure_and_skips_the_rest(method, monkeypatch):
    """Ranking the structures prepares each one's evaluator and directories (about 0.2 s apiece
    at 16 GPUs on this machine): once the limit has passed with a fallback in hand, the rest are
    not prepared, so six structures do not overrun a short limit six times over (before: a
    0.5-s limit took 2.1 s under load; the test above times it). The first structure's
    concurrent plan is returned."""
    import rpeg.solvers.exact as exact

    built = []
    real = exact.build_directories
    monkeypatch.setattr(
        exact,
        "build_directories",
        lambda costs, deadline=None, **kw: built.append(1) or real(costs, deadline, **kw),
    )
    problem = example_problem("ppo-7b-16gpu")
    r, _ = run(problem, method, 1e-3)  # the engine's first import alone outlasts this limit
    assert r.status is Status.TIME_LIMIT and r.plan is not None and r.evaluation.feasible
    assert "returned the warm-start plan" in r.message
    outcomes = r.extra["structures"]
    assert len(outcomes) > 1 and len(built) == 1
    assert all(o["status"] == "skipped" and o["reason"] == "no time left" for o in outcomes)


@pytest.mark.parametrize(
    ("method", "problem", "delay"), [("milp", "ppo-1b-4gpu", 2.5), ("cpsat", "ppo-7b-16gpu", 3.0)]
)
def test_ctrl_c_ends_an_exact_method_with_the_best_plan_so_far(method, problem, delay):
    # the six structures are prepared in about 1 s (ppo-1b-4gpu) and 1.5 s (ppo-7b-16gpu;
    # ppo-13b-64gpu's take 6 s), so Ctrl-C comes while an engine runs (MILP build, CP-SAT
    # search), with structures still to go. CP-SAT proves ppo-1b-4gpu optimal in about 1.4 s
    # since generation's tensor-parallel AllReduces run on vLLM's kernel (before: over 10 s);
    # on ppo-7b-16gpu four of its six structures still run to a 15-s limit
    workload, cluster, k_eval = example_problem(problem)
    t0 = time.monotonic()
    with watchdog(60), ctrl_c_after(delay):
        r = solve(workload, cluster, method=method, time_limit=120, k_eval=k_eval)
    elapsed = time.monotonic() - t0
    assert elapsed <= delay + 3, f"{method} took {elapsed:.2f} s to stop after Ctrl-C"
    assert r.status is Status.TIME_LIMIT and r.plan is not None and r.evaluation.feasible
    assert r.message.startswith("interrupted (Ctrl-C)") and r.extra["interrupted"]


def test_dp_plans_structures_only_while_time_is_left():
    # the first structure is always planned: about 0.2 s here (5 s for ppo-13b-64gpu) with its
    # frontiers built, not taken from the process's cache
    clear_caches()
    r, _ = run(example_problem("ppo-1b-4gpu"), "dp", 1e-3, structure="all")
    assert r.status is Status.TIME_LIMIT and r.plan is not None
    assert r.extra["dp"]["structures_planned"] == 1 < r.extra["dp"]["structures"]
    assert "time limit: planned 1 of" in r.message


def test_sa_prepares_structures_only_while_time_is_left():
    """Each structure SA prepares costs an evaluator and, for a new sharing choice, directories
    (0.4–0.7 s at 16 GPUs here): once the limit has passed, the rest are skipped and the message
    says so (before: all six were prepared first, 4.4 s on a 1.5-s limit under load). The
    directories are built, not taken from the process's cache (which other tests filled): with
    them cached, preparing a structure takes under a millisecond."""
    clear_caches()
    r, _ = run(example_problem("ppo-7b-16gpu"), "sa", 1e-3, seed=0)
    assert r.plan is not None and r.evaluation.feasible
    assert r.extra["structures_searched"] == 1
    assert "searched 1 of 6 structures (the time limit ran out while preparing the rest)" in r.message


@pytest.mark.parametrize("method", ["greedy", "concurrent", "sa", "dp"])
def test_the_heuristics_end_within_the_limit(method):
    r, elapsed = run(example_problem("grpo-8b-16gpu"), method, 1)
    assert elapsed <= bound(1) and r.plan is not None


SLOW_IMPORT = """\
import importlib.abc, json, sys, time

class SlowImport(importlib.abc.MetaPathFinder):
    \"\"\"Makes the first import of {package!r} take {delay} s once armed (a cold disk cache after
    memory pressure: the issue saw 8.5-29.9 s).\"\"\"

    armed = False

    def find_spec(self, name, path=None, target=None):
        if self.armed and name == {package!r}:
            type(self).armed = False
            time.sleep({delay})
        return None

sys.meta_path.insert(0, SlowImport())
import rpeg

wf = rpeg.load_workload(rpeg.example_path("ppo-1b-4gpu"))
cluster = rpeg.Cluster.from_shape(wf.cluster_shape, rpeg.load_hardware(wf.hardware))
assert {package!r} not in sys.modules
SlowImport.armed = True
t0 = time.monotonic()
r = rpeg.solve(wf.workload, cluster, method={method!r}, time_limit={limit}, k_eval=1)
print(json.dumps({{"elapsed": time.monotonic() - t0, "status": r.status.value, "message": r.message,
                  "plan": r.plan is not None, "feasible": r.evaluation is not None and r.evaluation.feasible}}))
"""


@pytest.mark.parametrize(("method", "package"), [("milp", "pyomo"), ("cpsat", "ortools")])
def test_an_engine_import_slower_than_the_limit_returns_the_warm_start_in_time(tmp_path, method, package):
    """issue 33: ``solve(method="milp", time_limit=0.001)`` took 1.09 s, and 8.5-29.9 s after
    memory pressure: the engine's first import ran inside the call but outside the limit. Now it
    runs in the background while the structures are prepared, and a limit it outlasts returns the
    concurrent warm start with status ``time_limit``, saying why (here the import is made 20 s)."""
    import json
    import subprocess
    import sys

    limit = 0.5
    script = tmp_path / "slow_import.py"
    script.write_text(SLOW_IMPORT.format(package=package, delay=20, method=method, limit=limit))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["elapsed"] < limit + 2.0, got  # 2 s of slack: preparing the structures, scoring the plan
    assert got["status"] == "time_limit" and got["plan"] and got["feasible"], got
    assert (
        f"{method}'s solver libraries did not finish loading within the time limit (0.5 s)" in got["message"]
    )
    assert "returned the warm-start plan" in got["message"]


def test_an_exact_method_builds_only_the_first_structures_floor_past_its_build_share():
    """With a fallback pooled, a structure whose vertices have no directory yet is not given lean
    ones past the build share of the limit (``TimeUp``: skipped); without one, its floor is built
    whatever the time."""
    from rpeg.ir.templates import structures
    from rpeg.scoring.candidates import TimeUp
    from rpeg.solvers.exact import _Search
    from rpeg.solvers.solve import Problem

    workload, cluster, k_eval = example_problem("ppo-7b-16gpu")
    clear_caches()
    problem = Problem(workload, cluster, k_eval, time_limit=1.0)
    search = _Search(problem, None, 3, "concurrent", None, {}, build_at=time.monotonic() - 1.0)
    shared = next(y for y in structures(workload) if y.ac_sharing)
    ev = problem.evaluator(shared)
    search.pool.append((1.0, 1, 0, ev, None, None))  # a fallback in hand
    with pytest.raises(TimeUp):
        search.directories(1, ev)
    search.pool.clear()
    dirs = search.directories(1, ev)
    assert dirs and all(d.lean for d in dirs) and 1 in search.lean
