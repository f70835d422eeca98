"""PPO with actor–critic sharing: how the value-loss weight ``c_v`` of the shared backbone
(``RLConfig.value_coef``) decides whether the reward keeps rising.

The plans are CP-SAT's (``candidates=2, k_eval=2``) and SA's (20 s, seed 0) for the toy PPO
workload of ``tests/runtime/plans.py`` on 1x1x2 GH200; both share one backbone between actor and
critic, SA's with staleness 1. Each ``c_v`` runs
``--seeds`` seeds of ``--steps`` steps on the torch engine at scale ``base``, batch 32, every
other hyper-parameter at its default; the section ``value-coef`` of ``benchmarks/RESULTS.md``
gets, per ``c_v``, the mean and the smallest final reward and how many runs had a step whose
mean reward fell by more than 0.1. All runs share one :class:`~rpeg.runtime.driver.pool.WorkerPool`.

    python benchmarks/value_coef.py [--coefs 1,0.5,0.25,0.1] [--seeds 8] [--steps 5] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _bench import command, learning_cells, machine, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the hand-written test plans


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coefs", default="1,0.5,0.25,0.1")
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
    plans = {}
    for method, options in (("cpsat", {"candidates": 2, "k_eval": 2}), ("sa", {})):
        clear_caches()  # time-limited: neither is handed the other's candidates
        plans[method] = solve(workload("ppo"), cluster, method, time_limit=20, seed=0, **options)
    rows = [
        "| plan | structure | c_v | final reward, mean | final reward, smallest | mean reward gain, last − first | runs with a step falling > 0.1 |",
        "|---|---|---|---|---|---|---|",
    ]
    with WorkerPool(devices=cluster.num_devices):
        for method, result in plans.items():
            st = result.structure
            where = f"ac={int(st.ac_sharing)} " + " ".join(f"τ({m})={t}" for m, t in st.staleness)
            for coef in (float(c) for c in args.coefs.split(",")):
                curves = [
                    run(
                        result, args.steps, scale="base", batch=32, rl=RLConfig(value_coef=coef), seed=seed
                    ).rewards
                    for seed in range(args.seeds)
                ]
                row = f"| {method} | {where} | {coef:g} | {learning_cells(curves)} |"
                print(row, flush=True)
                rows.append(row)
    lines = [
        "## PPO with a shared actor–critic backbone: the value-loss weight",
        "",
        f"`{command('value_coef.py', argv)}` — {machine()}.",
        "",
        f"The CP-SAT and SA plans for the toy PPO workload on 1x1x2 (both share one backbone between "
        f"actor and critic), {args.steps} steps × {args.seeds} seeds per weight, torch engine, scale `base`, "
        "batch 32, lr 1e-2; the shared model minimises `L_policy + c_v·L_value`.",
        "",
        *rows,
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("value-coef", lines)


if __name__ == "__main__":
    main()
