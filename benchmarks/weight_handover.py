"""Weight versions between colocated roles: in place in the device's process, or through Ray's
object store (``rpeg.run(..., weight_handover=...)``, docs/runtime.md "Weights between
colocated roles, in place").

Two hand-written plans, each run once per route on the same machine, one after the other:

* ``dp-trainer``: GRPO on 2 devices, the actor trainer data-parallel (DP 2) and its generation
  tensor-parallel (TP 2) on the same devices — each device holds the whole model, so in place
  nothing crosses a process;
* ``pp-trainer``: PPO on 4 devices (the runtime tests' DISAGG plan), the actor trainer pipelined
  (PP 2) under its TP-2 generation on devices 0–1 — in place, one stage's share crosses the trainer's process group (gloo); the
  critic's copy on another device reads the object store on every route.

Per run: the actor's weight transfers (count, bytes, bytes read in place), the install's worker
seconds (median and maximum over the run's transfers), the training nodes' ``publish_s``
(median: packing the kept share, or copying the publication that goes to the store), the DAG's
seconds, the rewards, and the largest difference of the final weights to the ``store`` run's
(0: the same bits). What ``auto`` picks is the route shown beside it.

    python benchmarks/weight_handover.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from _bench import command, load, machine, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the hand-written test plans

PLANS = ("dp-trainer", "pp-trainer")
MODES = ("store", "in_place", "auto")


def _result(name: str) -> Any:
    """The runtime tests' plans (``tests/runtime/plans.py``): ``DP_TRAINER`` for GRPO on 2
    devices, ``DISAGG`` for PPO on 4."""
    from tests.runtime.plans import DISAGG, DP_TRAINER, hand, workload

    if name == "dp-trainer":
        return hand(workload("grpo"), "1x1x2", DP_TRAINER, (("actor", 0),))
    return hand(workload("ppo"), "1x1x4", DISAGG, (("actor", 0), ("critic", 0)))


def measure(name: str, mode: str, steps: int, scale: str) -> tuple[dict[str, Any], Any]:
    """Run plan ``name`` with ``weight_handover=mode``; its row and the final weights."""
    import rpeg

    report = rpeg.run(
        _result(name), steps=steps, scale=scale, batch=8, weight_handover=mode, return_weights=True
    )
    recs = report.trace.records
    actor = [r for r in recs if r.kind != "op" and "actor" in r.versions_consumed and r.bytes > 1000]
    publish = [r.publish_s for r in recs if r.kind == "op" and r.vertex == "actor_train"]
    row = {
        "plan": name,
        "mode": mode,
        "transfers": len(actor),
        "mb": round(max(r.bytes for r in actor) / 1e6, 1),
        "in_place_mb": round(max(r.in_place_bytes for r in actor) / 1e6, 1),
        "install_ms_median": round(1e3 * statistics.median(r.worker_time for r in actor), 1),
        "install_ms_max": round(1e3 * max(r.worker_time for r in actor), 1),
        "publish_ms_median": round(1e3 * statistics.median(publish), 1),
        "dag_s": round(report.wall_s, 2),
        "rewards": [round(x, 4) for x in report.rewards],
        "problems": len(report.problems),
        "load": load(),
    }
    return row, report.weights


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--scale", default="medium", help="model scale of the runs (default medium: 84 MB)")
    ap.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    rows = []
    for name in args.plans.split(","):
        weights = {}
        for mode in MODES:
            row, weights[mode] = measure(name, mode, args.steps, args.scale)
            row["max_weight_diff"] = max(
                float((weights[mode][m][k] - weights["store"][m][k]).abs().max())
                for m in weights["store"]
                for k in weights["store"][m]
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.no_write:
        return
    lines = [
        "## Weight hand-over between colocated roles: in place vs the object store",
        "",
        f"Command: `{command('weight_handover.py', argv)}`  ",
        f"Machine: {machine()}.  ",
        f"Scale `{args.scale}`, {args.steps} steps, 8 prompts per step; the three routes of a plan run "
        "one after the other in one process (a local Ray instance each). *MB*: one actor version; "
        "*in place MB*: what one reading rank took from its own process; *install*: the transfer's "
        "worker seconds (median / max over the run's actor transfers); *publish*: the actor "
        "trainer's `publish_s` (median); *Δw*: largest difference of the final weights to the "
        "`store` run's.",
        "",
        "| plan | route | transfers | MB | in place MB | install ms (median / max) | publish ms | DAG s | rewards | Δw | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['plan']} | {r['mode']} | {r['transfers']} | {r['mb']} | {r['in_place_mb']} | "
            f"{r['install_ms_median']} / {r['install_ms_max']} | {r['publish_ms_median']} | {r['dag_s']} | "
            f"{', '.join(f'{v:.3f}' for v in r['rewards'])} | {r['max_weight_diff']:.1e} | {r['load']} |"
        )
    lines.append("")
    write_section("weight-handover", lines)


if __name__ == "__main__":
    main()
