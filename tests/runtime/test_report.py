"""``runtime/report.py``: per-step times from node finish times, the report's summary and the
predicted times of the scaled run (no Ray)."""

from __future__ import annotations

import math

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.runtime.binding import bind
from rpeg.runtime.report import RunReport, _step_times, predict, scaled_problem
from rpeg.runtime.trace import Trace, expected_graph, plan_hash
from tests.runtime.plans import SMALL, hand, workload


def test_step_times_are_differences_of_step_ends():
    # step k ends when its last node ends, and never before step k - 1
    steps = [0, 0, 1, 1, 2]
    finish = [1.0, 3.0, 2.5, 5.0, 4.0]
    assert _step_times(steps, finish, 3, 0.0) == [3.0, 2.0, 0.0]
    assert _step_times([], [], 2, 1.0) == [0.0, 0.0]


@pytest.fixture(scope="module")
def small_binding():
    result = hand(workload("ppo"), "1x1x2", SMALL, (("actor", 0), ("critic", 0)))
    return bind(result, expected_graph(result, 2), 2)


def test_predict_scores_the_scaled_problem_node_by_node(small_binding):
    b = small_binding
    wl, cluster = scaled_problem(b, hardware_preset("cpu"))
    assert wl.batch == b.shape.batch and wl.response_len == b.shape.response_len
    assert all(spec.dtype_bytes == 4 for spec in wl.models.values())  # the CPU runtime's float32
    assert cluster.num_devices == b.result.cluster.num_devices
    durations, finish, steps = predict(b, hardware_preset("cpu"))
    assert len(durations) == len(finish) == len(b.exec_graph)
    assert len(steps) == 2 and all(t > 0 for t in steps)
    assert sum(steps) == pytest.approx(max(finish))


def test_summary_lists_steps_and_names_the_first_problem(small_binding):
    r = small_binding.result
    trace = Trace(plan_hash(r), 2, dict(r.structure.tau), [])
    report = RunReport(trace, [0.5, math.nan], [1.0, 2.0], [0.9, 1.8], ["missing record 3"], 1.0, 3.0, 0.2)
    text = report.summary()
    assert text.splitlines()[1].split() == ["0", "0.500", "1.000", "0.900"]
    assert "trace INVALID (1): missing record 3" in text
    assert report.nodes == 0 and report.overhead_per_node_s == pytest.approx(0.2)
    report.problems = []
    assert report.summary().endswith("trace valid")


def test_predicted_memory_is_per_worker_the_models_state_and_its_largest_transient(small_binding):
    from rpeg.runtime.report import predicted_memory
    from rpeg.scoring.evaluator import Evaluator

    b = small_binding
    hw = hardware_preset("cpu")
    per_worker = predicted_memory(b, hw)
    assert set(per_worker) == {g.worker(r) for g in b.groups for r in range(g.size)}
    wl, cluster = scaled_problem(b, hw)
    report = Evaluator(wl, cluster, b.result.structure, k_eval=b.steps).memory(b.result.plan, detail=True)
    for g in b.groups:
        for rank, d in enumerate(g.devices):
            atom = next(a for a in report.detail if a.mask >> d & 1)
            want = sum(v for (m, _), v in atom.persistent.items() if m == g.model)
            want += max(atom.transient.get(v, 0.0) for v in g.vertices)
            assert per_worker[g.worker(rank)] == pytest.approx(want) and want > 0
            # one process holds no more than its device's predicted peak
            assert per_worker[g.worker(rank)] <= report.peak[report.atoms.index(atom.mask)] * (1 + 1e-9)
