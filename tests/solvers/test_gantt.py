"""Tests for ``solvers/gantt.py``: the Gantt chart of a result's predicted schedule.

The chart is checked through matplotlib's own objects: one bar per (node, device row) pair,
one legend entry per invocation with its strategy, COMM/RESHARD entries in the legend exactly
when the plan has such nodes, one dashed line per RL step at the finish of its last node.
"""

from __future__ import annotations

import re

import pytest

from rpeg import solve
from rpeg.ir.lower import COMM, OP, RESHARD
from rpeg.solvers.gantt import device_rows, gantt_figure, plot_gantt

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GIDS = ("gantt-op", "gantt-comm", "gantt-reshard")


@pytest.fixture(scope="module")
def results(problem_of):
    workload, cluster, k_eval = problem_of("ppo-7b-16gpu")
    return {
        "greedy": solve(workload, cluster, "greedy", k_eval=k_eval),
        "sa": solve(workload, cluster, "sa", k_eval=k_eval, max_evaluations=200),
    }


def bars(fig) -> dict[str, int]:
    """Bars drawn per collection gid."""
    (ax,) = fig.axes
    return {c.get_gid(): len(c.get_paths()) for c in ax.collections if c.get_gid() in GIDS}


def legend_texts(fig) -> list[str]:
    (ax,) = fig.axes
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("method", ["greedy", "sa"])
def test_result_gantt_writes_a_png(results, tmp_path, method):
    path = results[method].gantt(tmp_path / f"{method}.png")
    assert path == tmp_path / f"{method}.png"
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_infeasible_result_raises(ppo_70b, a100_1x1x8, tmp_path):
    result = solve(ppo_70b, a100_1x1x8, "greedy")
    assert not result.feasible
    with pytest.raises(ValueError, match="no plan"):
        result.gantt(tmp_path / "none.png")
    with pytest.raises(ValueError, match="infeasible"):
        plot_gantt(result, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


@pytest.mark.parametrize("method", ["greedy", "sa"])
def test_one_bar_per_node_and_device(results, method):
    result = results[method]
    g = result.evaluation.graph
    fig = gantt_figure(result)
    want = {gid: 0 for gid in GIDS}
    for kind, mask in zip(g.kind, g.mask):
        want[GIDS[kind]] += mask.bit_count()  # 16 devices: one row each
    assert bars(fig) == want
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"GPU {d}" for d in range(16)]


@pytest.mark.parametrize("method", ["greedy", "sa"])
def test_legend_names_invocations_and_comm_reshard_when_present(results, method):
    result = results[method]
    g = result.evaluation.graph
    texts = legend_texts(gantt_figure(result))
    # "name  strategy": degrees, microbatches and the engine choices (a generation's memory fraction)
    labels = [f"{v.name}  {c.strategy.label()}" for v, c in zip(result.graph.vertices, result.plan.choices)]
    assert texts[: len(labels)] == labels
    assert any("COMM" in t for t in texts) == (COMM in g.kind)
    assert any("RESHARD" in t for t in texts) == (RESHARD in g.kind)
    assert any("phase" in t for t in texts) == any(p > 0 for p in g.phase)


def test_the_plans_exercise_comm_reshard_and_phases(results):
    # so that the legend test above checks both branches
    sa, greedy = results["sa"].evaluation.graph, results["greedy"].evaluation.graph
    assert COMM in sa.kind and any(p > 0 for p in sa.phase)
    assert RESHARD in greedy.kind and COMM not in greedy.kind


def test_step_boundaries_at_the_last_finish_of_each_step(results):
    result = results["sa"]
    g, s = result.evaluation.graph, result.evaluation.schedule
    (ax,) = gantt_figure(result).axes
    dashed = sorted(line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--")
    ends = sorted(max(s.finish[i] for i in range(len(g)) if g.step[i] == k) for k in range(result.k_eval))
    assert dashed == pytest.approx(ends)
    labels = {t.get_text() for t in ax.texts}
    assert {f"step {k}" for k in range(result.k_eval)} <= labels
    assert any(re.fullmatch(r"q\d", t) for t in labels)  # phase numbers on wide phase bars


def test_grouped_rows_for_large_clusters(results):
    result = results["sa"]
    g = result.evaluation.graph
    fig = gantt_figure(result, max_devices=4)
    rows = device_rows(g.mask, 16, max_devices=4)
    # rows partition the devices, and every node reserves each row whole or not at all
    union = 0
    for m, _ in rows:
        assert union & m == 0
        union |= m
    assert union == (1 << 16) - 1
    for mask in set(g.mask):
        assert all(m & mask in (0, m) for m, _ in rows)
    want = {gid: 0 for gid in GIDS}
    for kind, mask in zip(g.kind, g.mask):
        want[GIDS[kind]] += sum(1 for m, _ in rows if m & mask)
    assert bars(fig) == want
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [label for _, label in rows]
    assert len(rows) < 16


def test_device_rows_labels():
    assert device_rows([0b11], 3) == [(1, "GPU 0"), (2, "GPU 1"), (4, "GPU 2")]
    rows = device_rows([0x0F, 0xF0, 0xFF], 10, max_devices=4)
    assert rows == [(0x0F, "GPU 0–3"), (0xF0, "GPU 4–7"), (0x300, "GPU 8–9")]
    rows = device_rows([0x0F0F], 16, max_devices=8)
    assert [label for _, label in rows] == ["GPU 0–3, 8–11", "GPU 4–7, 12–15"]
    with pytest.raises(ValueError, match="max_devices"):
        device_rows([1], 4, max_devices=0)


def test_op_bars_follow_the_schedule(results):
    # an OP bar spans exactly [start, finish] of its node on its row
    result = results["sa"]
    g, s = result.evaluation.graph, result.evaluation.schedule
    (ax,) = gantt_figure(result).axes
    (op,) = [c for c in ax.collections if c.get_gid() == "gantt-op"]
    spans = sorted(
        (round(p.vertices[:, 0].min(), 9), round(p.vertices[:, 0].max(), 9)) for p in op.get_paths()
    )
    want = sorted(
        (round(s.start[i], 9), round(s.finish[i], 9))
        for i in range(len(g))
        if g.kind[i] == OP
        for _ in range(g.mask[i].bit_count())
    )
    assert spans == want
