"""Search speed: uncached plan evaluations per second of the whole SA search (SPEC §8, §13), and
what the compiled evaluator buys in plan quality (issue 15).

The RPEG optimizer (``solve(..., method="sa")``) runs for fixed wall-clock budgets (default 10 s
and 60 s) on the five configurations of the RPEG paper's Table X (GH200 preset, PPO, Lp = 128,
Lr = 384), with each evaluator backend (``RPEG_EVALUATOR=compiled`` and ``=python``, the
pure-Python reference; both score every plan identically, so only the speed differs) and each
worker count (default ``workers=1``: one process, the per-core figure; ``workers=2`` is the
driver plus two evaluating processes on this 2-core machine, per core = total / 2). An
evaluation is one uncached plan evaluation as counted by the search budget (cache hits are not
counted); the rate is evaluations / the search's whole runtime (set-up, chains, polish, and the
worker start-up with ``workers=2``). Paper: ~220K/200K/160K/105K/75K evaluations in 600 s on 6
cores, i.e. that / 3,600 per core-second. Target: ≥ 10× the paper per core.

This figure is about time, so it uses time budgets and depends on the machine's load; the load
average is printed with every row.

Run from the repository root::

    python benchmarks/search_speed.py [--seconds 10 60] [--backends compiled python] [--workers 1]
                                      [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import _bench

import rpeg
from rpeg.solvers import clear_caches

CONFIGS = [  # (GPUs, topology, actor, critic, reward, B), RPEG paper Table X; Lp = 128, Lr = 384
    (64, "2x8x4", "13b", "13b", "7b", 1024),
    (128, "2x16x4", "34b", "13b", "13b", 1024),
    (256, "4x16x4", "70b", "34b", "13b", 1024),
    (512, "8x16x4", "70b", "70b", "34b", 2048),
    (1024, "16x16x4", "175b", "70b", "34b", 2048),
]
PAPER_EVALS_600S = {64: 220_000, 128: 200_000, 256: 160_000, 512: 105_000, 1024: 75_000}
PAPER_CORE_SECONDS = 600 * 6
TARGET_FACTOR = 10
MACHINE_CORES = 2


def cpu_seconds() -> float:
    """CPU seconds used by this process and its finished children (the evaluating workers are
    joined when the search closes its pool, so their time is counted)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seconds", type=float, nargs="+", default=[10.0, 60.0], help="time limits (default 10 60)"
    )
    ap.add_argument("--backends", nargs="+", default=["compiled", "python"], choices=["compiled", "python"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1], help="worker counts (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10 s per search, compiled only")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = ap.parse_args(argv)
    limits = [10.0] if args.quick else args.seconds
    backends = ["compiled"] if args.quick else args.backends
    header = (
        "| GPUs | topology | A/C/R | B | evaluator | limit s | workers | runtime s | evaluations | evals/s total | "
        "evals/s per core | paper per core | ours / paper per core | target ≥ 10× | CPU s | evals per CPU-s | "
        "best tok/s | load (1 min) |"
    )
    lines = [header, "|" + "---|" * 18]
    print(header, flush=True)
    t_start = time.perf_counter()
    ratios: dict[tuple, list[float]] = {}
    rows: dict[tuple, tuple[float, float]] = {}  # (gpus, limit, workers, backend) -> (evals/s, best)
    before = os.environ.get("RPEG_EVALUATOR")
    try:
        for gpus, shape, a, c, r, B in CONFIGS:
            w = _bench.ppo(a, c, r, B, 128, 384, name=f"tableX-{gpus}")
            cl = _bench.cluster(shape)
            paper = PAPER_EVALS_600S[gpus] / PAPER_CORE_SECONDS
            for seconds in limits:
                for workers in args.workers:
                    for backend in backends:
                        os.environ["RPEG_EVALUATOR"] = backend  # read by every evaluator, workers too
                        clear_caches()  # every run prepares its own search
                        cpu0 = cpu_seconds()
                        res = rpeg.solve(
                            w, cl, method="sa", time_limit=seconds, seed=args.seed, workers=workers
                        )
                        cpu = cpu_seconds() - cpu0
                        total = res.evaluations / res.runtime_s
                        per_core = total / min(workers, MACHINE_CORES)
                        ratio = per_core / paper
                        ratios.setdefault((backend, workers), []).append(ratio)
                        rows[(gpus, seconds, workers, backend)] = (total, res.throughput)
                        line = (
                            f"| {gpus} | {shape} | {a}/{c}/{r} | {B} | {backend} | {seconds:g} | {workers} | "
                            f"{res.runtime_s:.1f} | {res.evaluations:,} | {total:,.0f} | {per_core:,.0f} | "
                            f"{paper:.0f} | {ratio:.1f}× | {'met' if ratio >= TARGET_FACTOR else 'not met'} | "
                            f"{cpu:.1f} | {res.evaluations / cpu:,.0f} | {res.throughput:,.0f} | "
                            f"{_bench.load().split('/')[0]} |"
                        )
                        print(line, flush=True)
                        lines.append(line)
    finally:
        if before is None:
            os.environ.pop("RPEG_EVALUATOR", None)
        else:
            os.environ["RPEG_EVALUATOR"] = before
    wall = time.perf_counter() - t_start
    summary = []
    for (backend, workers), rs in ratios.items():
        met = sum(x >= TARGET_FACTOR for x in rs)
        summary.append(
            f"{backend}, workers={workers}: {min(rs):.1f}×–{max(rs):.1f}× the paper per core "
            f"(target ≥ 10× met on {met}/{len(rs)} runs)"
        )
    gains = []
    if {"compiled", "python"} <= set(backends):
        gains = [
            "| GPUs | limit s | workers | evals/s compiled / python | best tok/s compiled / python |",
            "|---|---|---|---|---|",
        ]
        for gpus, *_ in CONFIGS:
            for seconds in limits:
                for workers in args.workers:
                    (ec, bc), (ep, bp) = (
                        rows[(gpus, seconds, workers, "compiled")],
                        rows[(gpus, seconds, workers, "python")],
                    )
                    gains.append(
                        f"| {gpus} | {seconds:g} | {workers} | {ec / ep:.2f}× | {bc / bp - 1:+.2%} |"
                    )
    print("\n" + "\n".join([*summary, "", *gains]) + f"\nwall time {wall:.0f} s")
    if not args.no_write:
        _bench.write_section(
            "search_speed",
            [
                "## Search speed (evaluations per second of the whole SA search), compiled vs pure-Python evaluator",
                "",
                f"Command: `{_bench.command('search_speed.py', argv)}` — {_bench.machine()}; "
                f"wall time {wall:.0f} s.",
                "",
                f'`solve(..., method="sa", time_limit=T, seed={args.seed}, workers=N)` on the five '
                "RPEG-paper Table X configurations (PPO, Lp = 128, Lr = 384, GH200 preset), with the compiled "
                "evaluator and with the pure-Python reference (`RPEG_EVALUATOR`), one run after the other. "
                "Both score every plan identically; a search is deterministic in its seed for a given number "
                "of evaluations, so under a time limit the backend decides only how many evaluations fit. "
                "Evaluations = uncached plan evaluations counted by the search budget; rate = evaluations / "
                "whole runtime (set-up, chains, polish). Paper per core = evaluations in 600 s / (600 s × 6 "
                "cores). **Core contention:** the 2 cores are shared with other work (load average column, "
                "1 min, after each run); evaluations per CPU-second depend much less on it.",
                "",
                *lines,
                "",
                "Target (≥ 10× the paper's evaluations per core-second): " + "; ".join(summary) + ".",
                "",
                "What the compiled evaluator buys, per configuration and limit (same run):",
                "",
                *gains,
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
