"""Tests for ``rpeg solve --method sa`` on the command line: budget and search flags, the
comparison with the baselines, live progress, Ctrl-C, and ``--gantt`` (run in-process).

Result files are judged by the independent checker ``tests/tools/check_result.py``.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from rpeg.cli import EXIT_BAD_INPUT, EXIT_INFEASIBLE, main
from rpeg.heuristics.search import ABLATIONS, Anneal

from .test_cli import TOML_70B

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    """``main(argv)`` → (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def comparison_rows(out: str) -> dict[str, list[str]]:
    """The comparison table's rows after its title, by method: the cells as whitespace-split."""
    assert "comparison on" in out, out
    table = out[out.index("comparison on") :]
    rows = {}
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0] in ("greedy", "concurrent", "sa"):
            rows[cells[0]] = cells
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_sa_solve_prints_comparison_and_writes_checked_result_and_gantt(capsys, tmp_path, checker):
    out_json, png = tmp_path / "out.json", tmp_path / "g.png"
    status, out, err = run(
        capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--max-evaluations", "300",
        "--json", str(out_json), "--gantt", str(png),
    )  # fmt: skip
    assert status == 0, err
    assert "method     sa   status feasible" in out  # the usual summary comes first
    assert out.index("throughput") < out.index("comparison on")

    rows = comparison_rows(out)
    assert set(rows) == {"greedy", "concurrent", "sa"}
    tput = {m: number(cells[1]) for m, cells in rows.items()}
    assert all(t > 0 for t in tput.values())
    assert tput["sa"] >= tput["concurrent"]
    assert all(cells[-1] == "feasible" for cells in rows.values())

    doc = json.loads(out_json.read_text())
    assert checker.check(doc) == []
    assert doc["method"] == "sa" and doc["evaluations"] <= 300
    assert f"{doc['throughput']:,.0f}" == rows["sa"][1]
    assert f"wrote {out_json}" in out and f"wrote {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_sa_flags_reach_the_search(capsys, tmp_path):
    path = tmp_path / "r.json"
    status, out, err = run(
        capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--max-evaluations", "200",
        "--ablate", "polish, staleness", "--t-init", "0.004", "--t-warm", "0.02", "--no-compare",
        "--no-progress", "--json", str(path),
    )  # fmt: skip
    assert status == 0, err
    assert "comparison on" not in out
    doc = json.loads(path.read_text())
    assert doc["evaluations"] <= 200
    # the staleness ablation searches only τ = 0 structures
    assert all(t == 0 for t in doc["structure"]["staleness"].values())


def _bad(capsys, *argv) -> str:
    status, _, err = run(capsys, *argv)
    assert status == EXIT_BAD_INPUT == 2
    assert err.startswith("rpeg: error: ")
    assert len(err.strip().splitlines()) == 1
    return err


def test_unknown_ablation_is_named(capsys):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--ablate", "polish,nonsense")
    assert "'nonsense'" in err
    assert "'polish'" not in err
    assert all(name in err for name in ABLATIONS)  # lists the known ones


@pytest.mark.parametrize("method", ["greedy", "concurrent"])
@pytest.mark.parametrize(
    "flag, value",
    [("--workers", "2"), ("--max-evaluations", "10"), ("--ablate", "polish"), ("--t-init", "0.1")],
)
def test_sa_only_flags_are_refused_for_other_methods(capsys, method, flag, value):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--method", method, flag, value)
    assert flag in err and "--method sa" in err and repr(method) in err


@pytest.mark.parametrize(
    "flag, value", [("--max-evaluations", "0"), ("--workers", "0"), ("--t-init", "0"), ("--t-warm", "-1")]
)
def test_bad_sa_values(capsys, flag, value):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--method", "sa", flag, value)
    assert flag in err and value in err


def test_ctrl_c_during_the_search_keeps_the_best_plan(capsys, tmp_path, monkeypatch, checker):
    calls = {"n": 0}
    evaluate = Anneal.evaluate

    def interrupted(self, si, plans):
        calls["n"] += 1
        if calls["n"] > 20:
            raise KeyboardInterrupt
        return evaluate(self, si, plans)

    monkeypatch.setattr(Anneal, "evaluate", interrupted)
    path = tmp_path / "r.json"
    status, out, err = run(
        capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--time-limit", "60", "--json", str(path)
    )
    assert status == 0, err
    assert calls["n"] == 21
    assert "status time_limit" in out
    assert "tokens/s (predicted)" in out and "invocation" in out  # the summary with its plan
    assert comparison_rows(out)["sa"][-1] == "time_limit"
    doc = json.loads(path.read_text())
    assert doc["status"] == "time_limit"
    assert checker.check(doc) == []


def test_live_progress_when_stderr_is_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    status, _, err = run(
        capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--max-evaluations", "300", "--no-compare"
    )
    assert status == 0
    assert "300/300 evals" in err and "evals/s" in err and "tokens/s" in err
    assert re.search(r"ppo ac=\d", err)  # the structure being searched

    status, _, err = run(
        capsys, "solve", "ppo-7b-16gpu", "--method", "sa", "--max-evaluations", "50", "--no-compare",
        "--no-progress",
    )  # fmt: skip
    assert status == 0 and "evals/s" not in err


def test_gantt_for_evaluate(capsys, tmp_path):
    path, png = tmp_path / "r.json", tmp_path / "plan.png"
    assert run(capsys, "solve", "ppo-7b-16gpu", "--method", "concurrent", "--json", str(path))[0] == 0
    status, out, _ = run(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path), "--gantt", str(png))
    assert status == 0 and f"wrote {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_infeasible_sa_shows_no_feasible_plan_and_draws_nothing(capsys, tmp_path):
    toml = tmp_path / "ppo-70b.toml"
    toml.write_text(TOML_70B)
    png = tmp_path / "g.png"
    status, out, err = run(
        capsys, "solve", str(toml), "--method", "sa", "--max-evaluations", "50", "--gantt", str(png)
    )
    assert status == EXIT_INFEASIBLE == 3
    assert "NO FEASIBLE PLAN" in out
    table = out[out.index("comparison on") :]
    for method in ("greedy", "concurrent", "sa"):
        assert re.search(rf"^{method}\b.*no feasible plan$", table, flags=re.M), table
    assert not png.exists() and "no Gantt chart" in err
