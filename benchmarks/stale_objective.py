"""Stale rollouts: the coupled PPO objective against the decoupled one (``RLConfig.stale_objective``).

The plans are SA's (20 s, seed 0) for the toy PPO, GRPO and ReMax workloads of
``tests/runtime/plans.py`` on 1x1x2 GH200; each has staleness 1 on its trained policy (PPO's also
shares one backbone between actor and critic). Each objective (and, for the decoupled one, each
truncation ``w̄`` of the importance weights) runs ``--seeds`` seeds of ``--steps`` steps on the
torch engine at scale ``base``, batch 32, every other hyper-parameter at its default. The section
``stale-objective`` of ``benchmarks/RESULTS.md`` gets, per plan and objective, the mean and the
smallest final reward, the mean gain and how many runs had a step whose mean reward fell by more
than 0.1. All runs share one :class:`~rpeg.runtime.driver.pool.WorkerPool`.

    python benchmarks/stale_objective.py [--algorithms ppo,grpo,remax] [--seeds 8] [--steps 5] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _bench import command, learning_cells, machine, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the hand-written test plans

#: (objective, truncation w̄) pairs run on every plan
VARIANTS = (("coupled", None), ("decoupled", None), ("decoupled", 5.0), ("decoupled", 2.0))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithms", default="ppo,grpo,remax")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = ap.parse_args(argv)

    from rpeg import solve
    from rpeg.costmodel import hardware_preset
    from rpeg.ir.cluster import NO_SPLITS, Cluster
    from rpeg.runtime.config import RLConfig
    from rpeg.runtime.driver.pool import WorkerPool
    from rpeg.runtime.driver.runner import run
    from rpeg.solvers import clear_caches
    from tests.runtime.plans import workload

    cluster = Cluster.from_shape(
        "1x1x2",
        hardware_preset("gh200"),
        generation_max_pp=1,
        max_zero_stage=2,
        host_offload=False,
        **NO_SPLITS,
    )
    rows = [
        "| algorithm | structure | objective | w̄ | final reward, mean | final reward, smallest | "
        "mean gain, last − first | runs with a step falling > 0.1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with WorkerPool(devices=cluster.num_devices):
        for algorithm in args.algorithms.split(","):
            clear_caches()  # a time-limited search: each prepares its own candidates
            result = solve(workload(algorithm), cluster, "sa", time_limit=20, seed=0)
            st = result.structure
            where = f"ac={int(st.ac_sharing)} " + " ".join(f"τ({m})={t}" for m, t in st.staleness)
            for objective, cap in VARIANTS:
                cfg = RLConfig(stale_objective=objective, behavior_weight_cap=cap)
                curves = [
                    run(result, args.steps, scale="base", batch=32, rl=cfg, seed=seed).rewards
                    for seed in range(args.seeds)
                ]
                row = (
                    f"| {algorithm} | {where} | {objective} | {'—' if cap is None else f'{cap:g}'} | "
                    f"{learning_cells(curves)} |"
                )
                print(row, flush=True)
                rows.append(row)
    lines = [
        "## Stale rollouts: coupled against decoupled PPO",
        "",
        f"`{command('stale_objective.py', argv)}` — {machine()}.",
        "",
        f"SA's plans for the toy workloads on 1x1x2, staleness 1 on the trained policy; {args.steps} "
        f"steps × {args.seeds} seeds per objective, torch engine, scale `base`, batch 32, lr 1e-2. "
        "Coupled: PPO's ratio against the sampling policy μ. Decoupled: the ratio against the "
        "weights before the update π_prox, each token weighted by w = min(π_prox/μ, w̄) (ReMax: "
        "REINFORCE weighted by w).",
        "",
        *rows,
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("stale-objective", lines)


if __name__ == "__main__":
    main()
