"""Choosing the search temperatures ``t_init`` and ``t_warm`` by experiment.

Grid over ``t_init < t_warm`` on three workloads (bundled ``ppo-13b-64gpu``, ``grpo-8b-16gpu``,
and the RPEG paper's memory-tight scenario: PPO 13B/13B/13B on 16 GH200 capped at 50 GB), a
fixed evaluation budget per run and several seeds. Each run's throughput is divided by the best
throughput any run found on that workload; the table reports the mean of that ratio over
workloads and seeds. Evaluation budgets make every run deterministic and independent of machine
speed.

Run from the repository root::

    python benchmarks/tune_temperature.py [--evaluations 2000] [--seeds 3] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time

from _bench import command, write_section

import rpeg
from rpeg import Cluster, Workload, hardware_preset, model_preset

T_INITS = (0.0005, 0.002, 0.01, 0.03)
T_WARMS = (0.002, 0.01, 0.03, 0.1)


def workloads() -> list[tuple[str, Workload, Cluster]]:
    out = []
    for name in ("ppo-13b-64gpu", "grpo-8b-16gpu"):
        wf = rpeg.load_workload(rpeg.example_path(name))
        out.append((name, wf.workload, Cluster.from_shape(wf.cluster_shape, hardware_preset(wf.hardware))))
    m13 = model_preset("13b")
    tight = Workload("ppo", {"actor": m13, "critic": m13, "reward": m13}, 512, 1, 128, 384, name="mem-tight")
    hw = dataclasses.replace(hardware_preset("gh200"), name="gh200-50GB", gpu_memory_bytes=50e9)
    out.append(("mem-tight-16gpu-50GB", tight, Cluster.from_shape("1x4x4", hw)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evaluations", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    grid = [(a, b) for a, b in itertools.product(T_INITS, T_WARMS) if b > a]
    wls = workloads()
    raw: dict[tuple[float, float], list[tuple[str, float]]] = {g: [] for g in grid}
    best: dict[str, float] = {}
    t0 = time.perf_counter()
    for name, w, cluster in wls:
        for (ti, tw), seed in itertools.product(grid, range(args.seeds)):
            r = rpeg.solve(
                w, cluster, method="sa", max_evaluations=args.evaluations, seed=seed, t_init=ti, t_warm=tw
            )
            raw[(ti, tw)].append((name, r.throughput))
            best[name] = max(best.get(name, 0.0), r.throughput)
        print(f"{name}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    rows = []
    for g in grid:
        ratios = [tp / best[name] for name, tp in raw[g]]
        per_wl = {
            name: sum(tp for n, tp in raw[g] if n == name) / args.seeds / best[name] for name, _, _ in wls
        }
        rows.append((sum(ratios) / len(ratios), min(ratios), g, per_wl))
    rows.sort(key=lambda r: -r[0])
    header = "| t_init | t_warm | mean of best-ratio | worst run | " + " | ".join(n for n, _, _ in wls) + " |"
    lines = [header, "|" + "---|" * (4 + len(wls))]
    for mean, worst, (ti, tw), per_wl in rows:
        lines.append(
            f"| {ti} | {tw} | {mean:.4f} | {worst:.4f} | "
            + " | ".join(f"{per_wl[n]:.4f}" for n, _, _ in wls)
            + " |"
        )
    print("\n".join(lines))
    if not args.no_write:
        write_section(
            "temperature",
            [
                "## Search temperatures (t_init, t_warm)",
                "",
                f"Command: `{command('tune_temperature.py', argv)}` — {args.evaluations} evaluations per run, "
                f"seeds 0..{args.seeds - 1}, {len(grid)} temperature pairs × {len(wls)} workloads; ratio = run "
                "throughput / best throughput any run found on that workload (1.0 = best). Sorted by the mean.",
                "",
                *lines,
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
