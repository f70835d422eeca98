"""Shared helpers of the plan-search benchmarks (not a benchmark itself).

Each benchmark script imports this module (``benchmarks/`` is on ``sys.path`` when a script is
run as ``python benchmarks/NAME.py``) for: the exact command line, a one-line note on the
machine and its load, workload/cluster construction, a process pool for runs that are
deterministic (evaluation budgets), and replacing the script's marked section of
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

from rpeg import Cluster, Workload, hardware_preset, model_preset

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


def command(script: str, argv: list[str] | None) -> str:
    """The command that was run, as typed from the repository root."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join([f"python benchmarks/{script}", *args])


def load() -> str:
    """Load averages (1, 5, 15 min) as a short string."""
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> str:
    """One sentence on the machine this ran on and how loaded it was."""
    return (
        f"{date.today().isoformat()}, Python {platform.python_version()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other work "
        f"(load average 1/5/15 min at the end: {load()})"
    )


def ppo(
    actor: str, critic: str, reward: str, B: int, Lp: int, Lr: int, name: str = "", ac_sharing: bool = True
) -> Workload:
    """PPO with model presets for actor (and reference), critic and reward."""
    return Workload(
        "ppo",
        {"actor": model_preset(actor), "critic": model_preset(critic), "reward": model_preset(reward)},
        B,
        1,
        Lp,
        Lr,
        name=name or f"ppo-{actor}-{critic}-{reward}",
        ac_sharing=ac_sharing,
    )


def cluster(shape: str, hardware: Any = None) -> Cluster:
    """``Cluster.from_shape`` on the GH200 preset (or the given hardware)."""
    return Cluster.from_shape(shape, hardware if hardware is not None else hardware_preset("gh200"))


def pmap(fn: Callable[[Any], Any], items: Iterable[Any], jobs: int) -> list[Any]:
    """``[fn(x) for x in items]``, on ``jobs`` processes when ``jobs > 1`` (order kept)."""
    items = list(items)
    if jobs <= 1:
        return [fn(x) for x in items]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(fn, items))


def write_section(name: str, lines: list[str]) -> None:
    """Replace (or append) the ``<!-- name:begin -->``…``<!-- name:end -->`` section of
    RESULTS.md with ``lines``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = "\n".join([begin, *lines, end])
    text = (
        RESULTS.read_text()
        if RESULTS.exists()
        else "# Benchmark results\n\nMeasured figures, each with the command that produced it.\n"
    )
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(text)
    print(f"\nwrote {RESULTS} (section {name})")


def plan_labels(result: Any) -> str:
    """``vertex GPUs strategy`` of each vertex of a :class:`rpeg.Result`'s plan (``—`` without
    one)."""
    if result.plan is None:
        return "—"
    return "; ".join(
        f"{v.name} {c.allocation.size} GPUs {c.strategy.label()}"
        for v, c in zip(result.graph.vertices, result.plan.choices)
    )


def fmt_tp(tp: float | None) -> str:
    """Throughput in tokens/s, or ``OOM`` for no memory-feasible plan."""
    return "OOM" if not tp else f"{tp:,.0f}"


def pct(x: float | None) -> str:
    """A signed percentage, or an em dash."""
    return "—" if x is None else f"{100 * x:+.1f}%"


def learning_cells(curves: list[list[float]]) -> str:
    """Markdown cells of a set of runs' per-step mean rewards: the mean and the smallest final
    reward, the mean gain ``last − first`` and how many runs had a step falling by more than 0.1."""
    finals = [c[-1] for c in curves]
    gain = sum(c[-1] - c[0] for c in curves) / len(curves)
    falls = sum(any(b < a - 0.1 for a, b in zip(c, c[1:])) for c in curves)
    return f"{sum(finals) / len(finals):.3f} | {min(finals):.3f} | {gain:+.3f} | {falls}/{len(curves)}"
