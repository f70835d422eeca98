"""Evaluator throughput: plan evaluations per second on one core (issue: foundation).

One evaluation = lower (the unrolled graph is cached per structure, as in the search) + cost
(per-(vertex, strategy) cache, filled on first use and counted in the timing) + list schedule +
memory + score, with no plan-level cache. Workload: PPO, ``Keval = 8``, three response-length
phases ``(0.50, Lr/4), (0.85, Lr/2), (1.0, Lr)``, ``τ = 1`` for actor and critic, on the five
configurations of the RPEG paper's Table X (GH200 preset, 64–1,024 GPUs). Plans are drawn
uniformly from the candidate directories (random strategy, random aligned origin) with a fixed
seed, so every evaluation is of a different plan and phase splitting occurs whenever a generation
and an inference land on disjoint GPUs.

Run from the repository root::

    python benchmarks/evaluator.py [--plans 3000] [--seed 0] [--no-write]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from _bench import command, machine, write_section

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.ir import Plan, structures, unroll
from rpeg.scoring import Evaluator, build_directories

CONFIGS = [  # (GPUs, topology, actor, critic, reward, B, Lp, Lr), RPEG paper Table X
    (64, "2x8x4", "13b", "13b", "7b", 1024, 128, 384),
    (128, "2x16x4", "34b", "13b", "13b", 1024, 128, 384),
    (256, "4x16x4", "70b", "34b", "13b", 1024, 128, 384),
    (512, "8x16x4", "70b", "70b", "34b", 2048, 128, 384),
    (1024, "16x16x4", "175b", "70b", "34b", 2048, 128, 384),
]
PAPER_PER_CORE = {
    64: 220_000 / 600 / 6,
    128: 200_000 / 600 / 6,
    256: 160_000 / 600 / 6,
    512: 105_000 / 600 / 6,
    1024: 75_000 / 600 / 6,
}
TARGET = {64: 600, 1024: 200}


def run_config(cfg: tuple, n_plans: int, seed: int) -> dict:
    gpus, shape, a, c, r, B, Lp, Lr = cfg
    cluster = Cluster.from_shape(shape, hardware_preset("gh200"))
    w = Workload(
        "ppo",
        {"actor": model_preset(a), "critic": model_preset(c), "reward": model_preset(r)},
        B,
        1,
        Lp,
        Lr,
        name=f"tableX-{gpus}",
    )
    y = next(s for s in structures(w) if not s.ac_sharing and dict(s.staleness) == {"actor": 1, "critic": 1})
    ev = Evaluator(w, cluster, y, k_eval=8)
    t0 = time.perf_counter()
    dirs = build_directories(ev.costs)
    t_dirs = time.perf_counter() - t0
    rng = random.Random(seed)
    plans = []
    for _ in range(n_plans):
        choices = []
        for d in dirs:
            s = rng.randrange(len(d))
            options = d.choices(cluster, s)
            choices.append(options[rng.randrange(len(options))])
        plans.append(Plan(tuple(choices)))
    split = nodes = feasible = 0
    t0 = time.perf_counter()
    for p in plans:
        e = ev.evaluate(p)
        feasible += e.feasible
    elapsed = time.perf_counter() - t0
    # strict variant: unroll again for every evaluation (drops the per-structure caches too)
    t0 = time.perf_counter()
    for p in plans:
        ev.unrolled = unroll(ev.graph, ev.k_eval)
        ev.evaluate(p)
    elapsed_unroll = time.perf_counter() - t0
    for p in plans[:200]:  # graph statistics, outside the timed loop
        e = ev.evaluate(p, keep=True)
        nodes += len(e.graph)
        split += any(e.graph.phase)
    return {
        "gpus": gpus,
        "shape": shape,
        "models": f"{a}/{c}/{r}",
        "B": B,
        "evals_per_s": n_plans / elapsed,
        "ms_per_eval": 1000 * elapsed / n_plans,
        "evals_per_s_unroll": n_plans / elapsed_unroll,
        "dirs_s": t_dirs,
        "dir_sizes": [len(d) for d in dirs],
        "mean_nodes": nodes / 200,
        "split_share": split / 200,
        "feasible_share": feasible / n_plans,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = ap.parse_args(argv)
    rows = []
    header = (
        "| GPUs | topology | A/C/R | B | evals/s (1 core) | ms/eval | evals/s, unrolling every time | "
        "paper evals/s per core | target | nodes/plan | plans with phase split | directory build s |"
    )
    print(header)
    lines = [header, "|" + "---|" * 12]
    for cfg in CONFIGS:
        r = run_config(cfg, args.plans, args.seed)
        rows.append(r)
        target = TARGET.get(r["gpus"])
        line = (
            f"| {r['gpus']} | {r['shape']} | {r['models']} | {r['B']} | {r['evals_per_s']:,.0f} | "
            f"{r['ms_per_eval']:.2f} | {r['evals_per_s_unroll']:,.0f} | {PAPER_PER_CORE[r['gpus']]:.0f} | "
            f"{'≥ ' + str(target) if target else '—'} | {r['mean_nodes']:.0f} | {r['split_share']:.0%} | "
            f"{r['dirs_s']:.2f} |"
        )
        print(line, flush=True)
        lines.append(line)
    if not args.no_write:
        write_section(
            "evaluator",
            [
                "## Evaluator throughput (one core)",
                "",
                f"Command: `{command('evaluator.py', argv)}` — {machine()}; one process (the evaluator is pure "
                "Python and single-threaded).",
                "",
                f"{args.plans} distinct random plans per configuration (seed {args.seed}); PPO, Keval = 8, "
                "three response-length phases, τ = 1 for actor and critic; GH200 preset. An evaluation is "
                "lower + cost + schedule + memory + score with no plan cache (the unrolled graph is cached per "
                "structure, as the search does; the third column unrolls again for every plan); "
                "per-(vertex, strategy) costs are cached and their first computation is inside the timing. "
                "Paper figure: evaluations in 600 s on 6 cores divided by 3,600 core-seconds.",
                "",
                *lines,
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
