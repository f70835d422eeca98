"""Nereus planner (``method="dp"``): decision time of the DP vs its exact CP-SAT counterpart from
32 to 1,024 GPUs, and plan quality of ``dp`` vs greedy, concurrent and a short SA by the
evaluator's throughput.

Decision time is the selection on the same frontiers (median of ``--repeats`` runs; CP-SAT on
one thread with ``--time-limit``); frontier building (cost-model calls, shared by both) is
reported apart. The Nereus paper measures 0.17 ms (32 GPUs) to 338 ms (1,024) for its DP vs
3.4 ms to 511 s for a SCIP model.

Usage::

    python benchmarks/dp_planner.py [--repeats 5] [--time-limit 30] [--sa-seconds 20] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _bench

from rpeg import solve
from rpeg.formulations.dp_exact import solve_dp_cpsat
from rpeg.heuristics.dp_planner import LAT_UNIT, build_dp_instance, solve_dp
from rpeg.ir.templates import Structure
from rpeg.scoring import Evaluator
from rpeg.solvers import clear_caches

#: (GPUs, shape, actor, critic, reward, B): the search-speed benchmark's scaling ladder.
CONFIGS = [
    (32, "1x8x4", "13b", "7b", "7b", 512),
    (64, "2x8x4", "13b", "13b", "7b", 1024),
    (128, "2x16x4", "34b", "13b", "13b", 1024),
    (256, "4x16x4", "70b", "34b", "13b", 1024),
    (512, "8x16x4", "70b", "70b", "34b", 2048),
    (1024, "16x16x4", "175b", "70b", "34b", 2048),
]
QUALITY = ["ppo-7b-16gpu", "grpo-8b-16gpu", "ppo-13b-64gpu"]


def decision_times(repeats: int, time_limit: float) -> list[str]:
    lines = [
        "### Decision time: DP vs CP-SAT on the same frontiers",
        "",
        "| GPUs | shape | actor/critic/reward | B | model-stages | frontier points | build (ms) | "
        "DP (ms) | CP-SAT (ms) | CP-SAT status | same optimum |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for gpus, shape, a, c, r, B in CONFIGS:
        w = _bench.ppo(a, c, r, B, 512, 1024, ac_sharing=False)
        cl = _bench.cluster(shape)
        ev = Evaluator(w, cl, Structure.synchronous(w), k_eval=1)
        builds, dps, cps = [], [], []
        inst = sel = sol = None
        for _ in range(repeats):
            clear_caches()  # time the build, not a cache hit
            t0 = time.perf_counter()
            inst = build_dp_instance(Evaluator(w, cl, Structure.synchronous(w), k_eval=1).costs)
            builds.append(time.perf_counter() - t0)
            sel = solve_dp(inst)
            dps.append(sel.runtime)
        for _ in range(max(1, repeats // 2)):
            sol = solve_dp_cpsat(inst, time_limit=time_limit, threads=1)
            cps.append(sol.runtime)
        assert inst is not None and sel is not None and sol is not None
        same = "yes" if sol.objective == sel.step_latency else f"no ({sol.objective} vs {sel.step_latency})"
        points = sum(len(f.points) for f in inst.frontiers)
        lines.append(
            f"| {gpus} | {shape} | {a}/{c}/{r} | {B} | {len(inst.frontiers)} | {points} | "
            f"{1e3 * statistics.median(builds):.1f} | {1e3 * statistics.median(dps):.2f} | "
            f"{1e3 * statistics.median(cps):.1f} | {sol.status} | {same} |"
        )
        print(lines[-1], flush=True)
        del ev
    return lines


def quality(sa_seconds: float) -> list[str]:
    lines = [
        "### Plan quality (evaluator throughput, tokens/s; synchronous structure for dp/greedy/concurrent)",
        "",
        "| workload | dp predicted step (s) | dp | greedy | concurrent | "
        f"sa ({sa_seconds:g} s) | dp vs concurrent | dp vs sa | dp time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in QUALITY:
        w, cl, k = _bench.example_problem(name) if hasattr(_bench, "example_problem") else _example(name)
        res = {}
        for m, options in (
            ("dp", {}),
            ("greedy", {}),
            ("concurrent", {}),
            ("sa", {"time_limit": sa_seconds, "seed": 0}),
        ):
            clear_caches()  # each method's time includes building its own candidates
            res[m] = solve(w, cl, method=m, k_eval=k, **options)
        tp = {m: r.throughput for m, r in res.items()}
        lines.append(
            f"| {name} | {res['dp'].extra['dp']['step_latency_s']:.2f} | {_bench.fmt_tp(tp['dp'])} | "
            f"{_bench.fmt_tp(tp['greedy'])} | {_bench.fmt_tp(tp['concurrent'])} | {_bench.fmt_tp(tp['sa'])} | "
            f"{_bench.pct(tp['dp'] / tp['concurrent'] - 1 if tp['concurrent'] else None)} | "
            f"{_bench.pct(tp['dp'] / tp['sa'] - 1 if tp['sa'] else None)} | {res['dp'].runtime_s:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


def _example(name: str):
    from rpeg import Cluster, example_path, hardware_preset, load_workload

    wf = load_workload(example_path(name))
    return wf.workload, Cluster.from_shape(wf.cluster_shape, hardware_preset(wf.hardware)), wf.k_eval


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--sa-seconds", type=float, default=20.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    lines = [
        "## Nereus planner (dp): decision time and plan quality",
        "",
        f"Command: `{_bench.command('dp_planner.py', argv)}`. {_bench.machine()}.",
        "",
        "PPO workloads (Lp=512, Lr=1024, R=1) on GH200 clusters; DP selection and CP-SAT (1 thread, "
        f"time limit {args.time_limit:g} s) solve the same frontiers; medians of {args.repeats} DP runs "
        f"and {max(1, args.repeats // 2)} CP-SAT runs. Latency unit {LAT_UNIT * 1e6:g} µs.",
        "",
    ]
    lines += decision_times(args.repeats, args.time_limit)
    lines += ["", *quality(args.sa_seconds)]
    lines += ["", f"Total benchmark time {time.perf_counter() - t0:.0f} s."]
    if not args.no_write:
        _bench.write_section("dp_planner", lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
