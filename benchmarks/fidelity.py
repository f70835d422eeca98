"""Cost-model fidelity on this machine: predicted vs measured operator and step times.

Calibrates the machine (``rpeg.runtime.measure.calibrate``, or takes ``--hardware hw.json``), then runs
several plans of one small PPO workload on 1x1x4 CPU "devices" with the runtime — colocated
(greedy), disaggregated (hand plan, τ = 0) and asynchronous (the same placement, τ(actor) = 1) —
and compares, for every OP node after the warm-up step, the worker-measured time with the cost
model's prediction on the scaled problem (MAPE, Spearman ρ), the per-step makespans, and whether
the predicted ranking of the plans matches the measured one. Also reports the controller's
dispatch overhead per node. Writes the ``fidelity`` section of ``benchmarks/RESULTS.md``.

    python benchmarks/fidelity.py                 # quick calibration, tiny-ish models
    python benchmarks/fidelity.py --hardware hw.json --steps 6
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
from _bench import command, machine, write_section

from rpeg import Cluster, ModelSpec, Structure, Workload, hardware_preset, solve
from rpeg.solvers.result import Result, result_for_plan

TOY = ModelSpec("toy-1b", 16, 2048, 5504, 32000, 16, 16)
# two CPU "devices" for a 2-core machine: one device per core, so that what the cost model
# assumes (each device computes on its own) holds; actor on device 0, everything else on 1
DISAGG = {
    "actor_gen": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "ref_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "reward_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "critic_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "critic_train": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
}


NOTE = (
    "Reading: the cost model (SPEC §6) has no fixed per-kernel term; on CPU a tiny model's operators are "
    "dominated by per-layer Python and dispatch overhead (tens of µs per op, thousands of ops per decode loop), "
    "so every prediction is too fast by a similar factor (ρ stays high while MAPE is large), and plans whose "
    "predicted times differ by < 10% can swap places. The ≤ 15% target is **not met** here; a per-op overhead "
    "term fitted by calibration is the next step. GPU fidelity was not measured (no GPU in this session)."
)


def hand(wl: Workload, cluster: Cluster, table: dict, staleness: tuple) -> Result:
    return result_for_plan(wl, cluster, Structure(wl.algorithm, False, staleness), table)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's ρ: Pearson correlation of the ranks (average ranks for ties)."""

    def ranks(x: list[float]) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        vals = np.asarray(x)
        for v in np.unique(vals):
            idx = vals == v
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def mape(pred: list[float], meas: list[float]) -> float:
    """``mean |p − m| / m`` in percent."""
    return 100.0 * statistics.fmean(abs(p - m) / m for p, m in zip(pred, meas) if m > 0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", help="calibrated hardware JSON (default: run a quick calibration)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scale", default='{"layers": 4, "hidden": 256, "heads": 8}')
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    import ray

    from rpeg.costmodel import load_hardware
    from rpeg.runtime.runner import run, start_local_ray

    if args.hardware:
        hw = load_hardware(args.hardware)
        calib = f"`{args.hardware}`"
    else:
        from rpeg.runtime.measure import calibrate

        t0 = time.perf_counter()
        hw = calibrate(quick=True, max_ranks=2, seed=args.seed).hardware
        calib = f"quick calibration in {time.perf_counter() - t0:.0f} s"
    print(
        f"hardware: F_peak {hw.peak_flops / 1e9:.0f} GFLOP/s, BW_mem {hw.mem_bandwidth / 1e9:.1f} GB/s ({calib})"
    )
    scale = json.loads(args.scale)
    wl = Workload("ppo", {"actor": TOY, "critic": TOY, "reward": TOY}, 64, 1, 256, 256)
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"))
    plans = {
        "colocated (greedy)": solve(wl, cluster, "greedy"),
        "disaggregated τ=0": hand(wl, cluster, DISAGG, (("actor", 0), ("critic", 0))),
        "asynchronous τ(actor)=1": hand(wl, cluster, DISAGG, (("actor", 1), ("critic", 0))),
    }
    start_local_ray(2, num_cpus=2)  # workers at the driver's priority, not niced
    rows, all_pred, all_meas, summary = [], [], [], {}
    overheads, node_over = [], []
    try:
        for name, result in plans.items():
            rep = run(
                result,
                args.steps,
                seed=args.seed,
                scale=scale,
                batch=args.batch,
                prompt_len=args.prompt_len,
                response_len=args.response_len,
                hardware=hw,
            )
            assert not rep.problems, rep.problems[:3]
            pred_d = rep.trace.meta["predicted_durations"]
            ops = [r for r in rep.trace.records if r.kind == "op" and r.step >= 1]
            pred = [pred_d[r.node] for r in ops]
            meas = [r.worker_time for r in ops]
            all_pred += pred
            all_meas += meas
            step_meas = statistics.fmean(rep.step_times[1:])
            step_pred = statistics.fmean(rep.predicted_step_times[1:])
            summary[name] = (step_pred, step_meas)
            overheads.append(rep.overhead_per_node_s)
            node_over += rep.node_overhead_s
            rows.append(
                f"| {name} | {len(ops)} | {mape(pred, meas):.1f}% | {spearman(pred, meas):.3f} | "
                f"{step_pred * 1e3:.1f} | {step_meas * 1e3:.1f} | {abs(step_pred - step_meas) / step_meas:.1%} | "
                f"{', '.join(f'{x:.2f}' for x in rep.rewards)} |"
            )
            print(rows[-1])
    finally:
        ray.shutdown()
    pred_rank = sorted(summary, key=lambda k: summary[k][0])
    meas_rank = sorted(summary, key=lambda k: summary[k][1])
    step_mape = mape([p for p, _ in summary.values()], [m for _, m in summary.values()])
    lines = [
        "## Cost-model fidelity on this machine (runtime, CPU workers)",
        "",
        f"Command: `{command('fidelity.py', argv)}`  ",
        f"Machine: {machine()}.  ",
        f"Hardware file: {calib}; F_peak {hw.peak_flops / 1e9:.0f} GFLOP/s, γM {hw.gamma_m:.1f}, "
        f"γK {hw.gamma_k:.1f}, BW_mem {hw.mem_bandwidth / 1e9:.1f} GB/s, c_ng {hw.c_nongemm * 1e3:.2f} ms.  ",
        f"Workload: PPO, three 1B-shaped models scaled to {scale} (float32), batch {args.batch}, "
        f"Lp={args.prompt_len}, Lr={args.response_len}, on 1x1x2 CPU devices (one per core); {args.steps} steps per plan, "
        "step 0 (warm-up: pipelining shape inference, first allocations) excluded.",
        "",
        "| plan | OP nodes | operator time MAPE | Spearman ρ | predicted step ms | measured step ms | step error | reward per step |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"All OP nodes of the three plans: time MAPE **{mape(all_pred, all_meas):.1f}%**, Spearman ρ "
        f"**{spearman(all_pred, all_meas):.3f}** (n = {len(all_pred)}); per-step makespan MAPE "
        f"**{step_mape:.1f}%**. Paper (GH200): 15.5% MAPE, ρ = 0.990; target here ≤ 15%.  ",
        f"Predicted ranking (fastest first): {' < '.join(pred_rank)}; measured: {' < '.join(meas_rank)} — "
        f"**{'same' if pred_rank == meas_rank else 'different'}**.  ",
        f"Dispatch overhead: controller time not spent waiting for workers {1e3 * statistics.fmean(overheads):.2f} "
        f"ms per node (mean over plans); per node, (end − start) − worker time (Ray submission, object "
        f"store, result return) median {1e3 * statistics.median(node_over):.2f} ms, "
        f"p90 {1e3 * sorted(node_over)[int(0.9 * len(node_over))]:.2f} ms.",
    ]
    lines.append(NOTE)
    print("\n".join(lines))
    if not args.no_write:
        write_section("fidelity", lines)
    if math.isnan(spearman(all_pred, all_meas)):
        sys.exit(1)


if __name__ == "__main__":
    main()
