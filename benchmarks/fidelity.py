"""Cost-model fidelity on the real engines: predicted against measured times (and memory) per
operation and per step, for seven plans of one PPO workload, after ``rpeg calibrate``.

The workload: PPO with three 21M-parameter Llama models (the runtime's ``medium`` scale: 8 layers,
width 512), batch 8, ``Lp = Lr = 128``, on two CPU "devices" (``1x1x2``, one core each), with
vLLM (CPU build) rollouts and the torch engine's inference and training — what ``rpeg run
--rollout-engine vllm --scale medium`` runs. Seven hand-written plans, 5 steps each:

* colocated — every invocation on both devices, data parallel 2;
* disaggregated τ = 0 — the actor's generation and training on device 0, the rest on device 1;
* asynchronous τ = 1 — the same placement, the actor one step stale;
* generation TP 2 — generation tensor parallel over both devices, the rest colocated;
* training PP 2 — both trainings pipelined over the two devices (2 microbatches), the rest
  colocated;
* gradient accumulation — colocated, each DP rank's sequences in 4 training microbatches and 2
  forward-only ones (SPEC §14.2);
* FSDP2 full sharding — the same with both trainers and the three frozen copies at ZeRO stage 3
  (SPEC §14.3).

Predictions are the shared evaluator's on the scaled problem with the calibrated hardware file
(``--hardware``, written by ``rpeg calibrate --engines torch,vllm`` on this machine). Reported:
per-operation time MAPE and Spearman ρ (worker seconds, every OP node after each run's first
step), per-step makespan MAPE, the predicted against the measured ranking of the plans, and per
device the predicted peak memory against the measured one (the sum over the device's worker
processes of peak RSS less the RSS before the worker built its model; vLLM's engine processes
are outside it). Writes the ``fidelity`` section of ``benchmarks/RESULTS.md`` and
``benchmarks/fidelity.png`` (predicted against measured per operation, log–log, one colour per
role).

    rpeg calibrate --out benchmarks/hw-this-machine.json --raw benchmarks/hw-this-machine.raw.json \
        --max-ranks 2 --in-situ
    python benchmarks/fidelity.py --hardware benchmarks/hw-this-machine.json

``--in-situ`` fits the calibration's per-class factors on two runs of its own plans and model
(:mod:`rpeg.runtime.calibrate.insitu`: 6 layers × 384, ``Lp = 64``, ``Lr = 96``), not on this benchmark's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

from _bench import HERE, command, machine, write_section

from rpeg import Cluster, ModelSpec, Structure, Workload, hardware_preset
from rpeg.costmodel import load_hardware
from rpeg.runtime.trace.fidelity import CLASSES, mape, spearman
from rpeg.solvers.result import Result, result_for_plan

TOY = ModelSpec("toy-1b", 16, 2048, 5504, 32000, 16, 16)
BOTH, D0, D1 = ((0, 0, 0), (1, 1, 2)), ((0, 0, 0), (1, 1, 1)), ((0, 0, 1), (1, 1, 1))
TRAIN = ("none",)  # the runtime trains without activation recomputation


def _entry(where: tuple, dp: int, pp: int, tp: int, mb: int, train: bool = False, zero: int = 2) -> tuple:
    return (*where, dp, pp, tp, mb, *((*TRAIN, {"zero": zero}) if train else (None, {"zero": zero})))


COLOCATED = {
    "actor_gen": _entry(BOTH, 2, 1, 1, 1),
    "ref_inf": _entry(BOTH, 2, 1, 1, 1),
    "reward_inf": _entry(BOTH, 2, 1, 1, 1),
    "critic_inf": _entry(BOTH, 2, 1, 1, 1),
    "actor_train": _entry(BOTH, 2, 1, 1, 1, True),
    "critic_train": _entry(BOTH, 2, 1, 1, 1, True),
}
DISAGG = {
    "actor_gen": _entry(D0, 1, 1, 1, 1),
    "ref_inf": _entry(D1, 1, 1, 1, 1),
    "reward_inf": _entry(D1, 1, 1, 1, 1),
    "critic_inf": _entry(D1, 1, 1, 1, 1),
    "actor_train": _entry(D0, 1, 1, 1, 1, True),
    "critic_train": _entry(D1, 1, 1, 1, 1, True),
}
GEN_TP2 = COLOCATED | {"actor_gen": _entry(BOTH, 1, 1, 2, 1)}
TRAIN_PP2 = COLOCATED | {
    "actor_train": _entry(BOTH, 1, 2, 1, 2, True),
    "critic_train": _entry(BOTH, 1, 2, 1, 2, True),
}
# gradient accumulation (SPEC §14.2): each DP rank's 4 sequences in 4 training microbatches (one
# optimizer update), and the forward-only passes in 2
GRAD_ACC = COLOCATED | {
    "ref_inf": _entry(BOTH, 2, 1, 1, 2),
    "reward_inf": _entry(BOTH, 2, 1, 1, 2),
    "critic_inf": _entry(BOTH, 2, 1, 1, 2),
    "actor_train": _entry(BOTH, 2, 1, 1, 4, True),
    "critic_train": _entry(BOTH, 2, 1, 1, 4, True),
}
# the same with every model fully sharded (FSDP2, ZeRO-3, SPEC §14.3): the trainers' groups and
# the frozen copies (reference, reward model, the critic's serving copy) keep only shards between
# operations, so the generation and the critic's inference get their weights by publication
FULL_SHARD = GRAD_ACC | {
    "ref_inf": _entry(BOTH, 2, 1, 1, 2, zero=3),
    "reward_inf": _entry(BOTH, 2, 1, 1, 2, zero=3),
    "critic_inf": _entry(BOTH, 2, 1, 1, 2, zero=3),
    "actor_train": _entry(BOTH, 2, 1, 1, 4, True, zero=3),
    "critic_train": _entry(BOTH, 2, 1, 1, 4, True, zero=3),
}
SYNC = (("actor", 0), ("critic", 0))
PLANS = {
    "colocated": (COLOCATED, SYNC),
    "disaggregated τ=0": (DISAGG, SYNC),
    "asynchronous τ=1": (DISAGG, (("actor", 1), ("critic", 0))),
    "generation TP 2": (GEN_TP2, SYNC),
    "training PP 2": (TRAIN_PP2, SYNC),
    "gradient accumulation": (GRAD_ACC, SYNC),
    "FSDP2 full sharding": (FULL_SHARD, SYNC),
}
NOTE = (
    "What the figures cover: per-operation times are worker seconds (`worker_time`, less a training node's "
    "`publish_s` where the trace records it) against the prediction "
    "less the dispatch term; step makespans include dispatch, transfers and the controller on both sides. "
    "Not modelled: an idle vLLM engine's workers spin 50 ms after each message (docs/engines.md, "
    '"Idle engines spin, briefly"; with vLLM\'s own 1 s a colocated DP-2 training node took '
    "3.6 s next to two engines, in an earlier run, against 2.8 s with the torch engine's rollouts); the "
    "weight sync is charged "
    "at the generation node while the "
    "runtime pays it at the weight COMM in disaggregated plans (docs/decisions.md); the memory prediction is "
    "the GPU one's terms in the runtime's layout (above). A vLLM generation's phase node decodes its own "
    'phase: the engine is paused between the nodes (docs/engines.md, "Phases are real"). '
    "No plan has run on a GPU (one H200's single-GPU passes: "
    "section gpu-check)."
)
TARGETS = {"op_mape": 25.0, "step_mape": 20.0, "rho": 0.9, "memory": 25.0}
COLOURS = {"generation": "tab:blue", "inference": "tab:green", "training": "tab:red"}


def plan_result(table: dict, staleness: tuple, wl: Workload) -> Result:
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"))
    return result_for_plan(wl, cluster, Structure("ppo", False, staleness), table)


def worker_vertices(trace) -> dict[str, str]:
    """Worker id → the vertices its group runs (from the trace's groups)."""
    out = {}
    for g in trace.groups.values():
        for w in g.get("workers", []):
            out[w] = "+".join(v.replace("_", " ") for v in g.get("vertices", []))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--hardware", required=True, help="hardware JSON written by `rpeg calibrate` on this machine"
    )
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scale", default="medium")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", default=",".join(PLANS), help="comma list of plan names (default: all seven)")
    ap.add_argument("--traces", metavar="DIR", help="also write each run's trace into DIR")
    ap.add_argument(
        "--from-traces",
        metavar="DIR",
        help="run nothing: recompute every figure from the traces a run with --traces DIR wrote "
        "(same --hardware and shape flags)",
    )
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    import ray

    from rpeg.runtime.binding import bind
    from rpeg.runtime.driver.runner import run, start_local_ray
    from rpeg.runtime.trace.fidelity import trace_fidelity, worker_peaks
    from rpeg.runtime.trace.records import Trace, expected_graph
    from rpeg.runtime.trace.report import predicted_memory

    hw = load_hardware(args.hardware)
    mu = hw.using(inference="torch").terms("inference").memory_factor
    if args.traces:
        Path(args.traces).mkdir(parents=True, exist_ok=True)
    in_situ = dict(hw.sources).get("engines.in_situ", "")
    names = [n.strip() for n in args.plans.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLANS]
    if unknown:
        sys.exit(f"unknown plan(s) {unknown}; plans: {', '.join(PLANS)}")
    wl = Workload("ppo", {"actor": TOY, "critic": TOY, "reward": TOY}, 64, 1, 256, 256)
    engines = "/".join(e or "-" for e in hw.engine_for)
    print(
        f"hardware {args.hardware}: engine terms (generation/inference/training) {engines}, dispatch {hw.dispatch_s * 1e3:.2f} ms"
    )
    rows, per_plan, points, mem_rows, mem_errs, live_errs = [], {}, [], [], [], []

    def analyse(name: str, trace: Trace, result: Result) -> None:
        """The plan's row, its OP points and its workers' memory rows, from its trace."""
        fid = trace_fidelity(trace)
        assert fid is not None, f"{name}: the trace stores no predictions"
        step_p = statistics.fmean(fid.step_predicted[fid.compared])
        step_m = statistics.fmean(fid.step_measured[fid.compared])
        per_plan[name] = (step_p, step_m)
        points.extend(zip(fid.op_predicted, fid.op_measured, fid.op_class))
        cls = fid.class_mape()
        rewards = [m["reward"] for m in trace.step_metrics]
        rows.append(
            f"| {name} | {len(fid.op_measured)} | {fid.op_mape:.1f}% | {fid.op_spearman:.3f} | "
            + " | ".join(f"{cls[c]:.1f}%" if c in cls else "–" for c in CLASSES[:3])
            + f" | {step_p:.2f} | {step_m:.2f} | {fid.step_mape:.1f}% | "
            f"{', '.join(f'{x:.2f}' for x in rewards)} |"
        )
        print(rows[-1], flush=True)
        binding = bind(
            result,
            expected_graph(result, args.steps),
            args.steps,
            scale=args.scale,
            batch=args.batch,
            prompt_len=args.prompt_len,
            response_len=args.response_len,
            seed=args.seed,
        )
        pred_mem = predicted_memory(binding, rollout_engine="vllm", forward_factor=mu)
        meas_mem = worker_peaks(trace.records)
        meas_live = worker_peaks(trace.records, "memory_live")
        pred_live = predicted_memory(binding, rollout_engine="vllm", live=True)
        what = worker_vertices(trace)
        for w in sorted(meas_mem):
            p, m, live, p_live = pred_mem.get(w), meas_mem[w], meas_live.get(w, 0.0), pred_live.get(w)
            if p and m > 0:
                mem_errs.append(100 * abs(p - m) / m)
                live_cells = "– | – | –"
                if live > 0 and p_live:
                    live_errs.append(100 * abs(p_live - live) / live)
                    live_cells = f"{p_live / 2**20:.0f} | {live / 2**20:.0f} | {live_errs[-1]:.1f}%"
                mem_rows.append(
                    f"| {name} | {w} | {what.get(w, '?')} | {p / 2**20:.0f} | {m / 2**20:.0f} | {mem_errs[-1]:.1f}% | "
                    f"{live_cells} |"
                )

    def trace_file(i: int, name: str) -> Path | None:
        folder = args.from_traces or args.traces
        return Path(folder) / f"fidelity-{name.split()[0]}-{i}.trace.json" if folder else None

    started = time.perf_counter()
    if args.from_traces:
        for i, name in enumerate(names):
            table, staleness = PLANS[name]
            analyse(name, Trace.from_json(trace_file(i, name)), plan_result(table, staleness, wl))
    else:
        start_local_ray(2, num_cpus=2)
        try:
            for i, name in enumerate(names):
                table, staleness = PLANS[name]
                result = plan_result(table, staleness, wl)
                rep = run(
                    result,
                    args.steps,
                    seed=args.seed,
                    scale=args.scale,
                    batch=args.batch,
                    prompt_len=args.prompt_len,
                    response_len=args.response_len,
                    hardware=hw,
                    rollout_engine="vllm",
                    trace_path=trace_file(i, name),
                )
                if rep.problems:
                    sys.exit(f"{name}: trace invalid: {rep.problems[:3]}")
                analyse(name, rep.trace, result)
        finally:
            ray.shutdown()
    elapsed = time.perf_counter() - started
    all_p, all_m = [p for p, _, _ in points], [m for _, m, _ in points]
    op_mape, rho = mape(all_p, all_m), spearman(all_p, all_m)
    step_mape = mape([p for p, _ in per_plan.values()], [m for _, m in per_plan.values()])
    pred_rank = sorted(per_plan, key=lambda n: per_plan[n][0])
    meas_rank = sorted(per_plan, key=lambda n: per_plan[n][1])
    # the ranking must agree wherever the predictions differ by more than 10%
    disagree = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = per_plan[a][0], per_plan[b][0]
            if abs(pa - pb) / min(pa, pb) > 0.10 and (pa < pb) != (per_plan[a][1] < per_plan[b][1]):
                disagree.append(f"{a} vs {b}")

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = [
        "## Cost-model fidelity on the real engines (vLLM rollouts + torch engine, CPU workers)",
        "",
        f"Command: `{command('fidelity.py', argv)}`"
        + (
            f" (the traces were written by the same command with `--traces {args.from_traces}` in place of "
            "`--from-traces`)  "
            if args.from_traces
            else "  "
        ),
        f"Machine: {machine()}; "
        + (
            f"figures recomputed from the traces in `{args.from_traces}`.  "
            if args.from_traces
            else f"the {len(names)} runs took {elapsed / 60:.1f} min.  "
        ),
        f"Calibration: `{args.hardware}` (`rpeg calibrate --out {args.hardware} --max-ranks 2"
        + (" --in-situ" if in_situ else "")
        + f"`, engine terms generation/inference/training = {engines}, dispatch {hw.dispatch_s * 1e3:.2f} ms; "
        f"F_peak {hw.peak_flops / 1e9:.0f} GFLOP/s, γM {hw.gamma_m:.1f}, γK {hw.gamma_k:.1f}, "
        f"BW_mem {hw.mem_bandwidth / 1e9:.1f} GB/s; the engine fits are printed by `rpeg calibrate`"
        + (f"; {in_situ}" if in_situ else "; no in-situ factors")
        + ").  ",
        f"Workload: PPO, actor/critic/reward 21M-parameter Llamas (scale {args.scale!r}), batch {args.batch}, "
        f"Lp = {args.prompt_len}, Lr = {args.response_len}, on 1x1x2 CPU devices (one core each), "
        f"{args.steps} steps per plan; each run's step 0 (warm-up) is left out, and its last step of the "
        "step makespans (`rpeg.runtime.trace.fidelity.compared_steps`: a step's time ends with its last node, which "
        "a schedule may run after the next step's first ones, and the last step has no next one).",
        "",
        "| plan | OP nodes | op time MAPE | Spearman ρ | generation MAPE | inference MAPE | training MAPE | "
        "predicted step s | measured step s | step MAPE | reward per step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"All plans: operator time MAPE **{op_mape:.1f}%** (target ≤ {TARGETS['op_mape']:.0f}%: "
        f"{met(op_mape <= TARGETS['op_mape'])}), Spearman ρ **{rho:.3f}** (target ≥ {TARGETS['rho']}: "
        f"{met(rho >= TARGETS['rho'])}) over n = {len(points)} OP nodes; step makespan MAPE "
        f"**{step_mape:.1f}%** (target ≤ {TARGETS['step_mape']:.0f}%: {met(step_mape <= TARGETS['step_mape'])}).  ",
        f"Predicted ranking (fastest first): {' < '.join(pred_rank)}; measured: {' < '.join(meas_rank)}; "
        f"pairs predicted more than 10% apart that swap: {', '.join(disagree) or 'none'} "
        f"({met(not disagree)}).",
        "",
        "Peak memory per worker process: predicted — the cost model's memory terms (SPEC §6) laid out as "
        "the runtime's processes hold them (`rpeg.runtime.trace.report.predicted_memory`, docs/runtime.md "
        '"Memory per worker": registered float32 parameters, Adam moments and FSDP2 master shards, '
        "activations, gradients as FSDP2 stages them, a vLLM replica's weight push; a no-grad forward pass's "
        f"activations times the calibrated μ = {mu:.3f}, for the sequences of one node: a length phase's "
        "share where the plan splits the vertex) — against measured: the "
        "peak of the process's private resident memory (resident less shared pages, sampled every 5 ms) "
        "less its private resident memory once the process group and the libraries were loaded, before it "
        "built its model (what the OP records' `memory` holds; every CPU worker serves allocations of "
        "128 KiB and more by `mmap`, so that freed tensors leave its resident set: "
        "`runtime.worker.memory.map_large_blocks`); and the peak of its live C heap (glibc's "
        "`mallinfo2`: chunks in use plus mmap-served blocks, sampled with it; the CPU analogue of "
        "`torch.cuda.max_memory_allocated`) less the live heap then "
        "(`memory_live`), against the same layout with SPEC's forward activations without μ "
        "(`predicted_memory(..., live=True)`). vLLM's engine processes (their "
        "weights and the KV-cache space they reserve) are separate processes and outside every figure.",
        "",
        "| plan | worker | vertices | predicted resident MiB | measured resident MiB | error | "
        "predicted live MiB | measured live MiB | error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
        *mem_rows,
        "",
        (
            f"Memory: mean error {statistics.fmean(mem_errs):.1f}%, worst {max(mem_errs):.1f}% "
            f"(target ≤ {TARGETS['memory']:.0f}% per worker: {met(max(mem_errs) <= TARGETS['memory'])})."
            if mem_errs
            else "Memory: no prediction to compare."
        ),
        (
            f"Against the live heap: mean error {statistics.fmean(live_errs):.1f}%, worst {max(live_errs):.1f}% "
            f"(the same target: {met(max(live_errs) <= TARGETS['memory'])})."
            if live_errs
            else "Live heap: not measured (no glibc `mallinfo2`, or traces written before rpeg recorded it)."
        ),
        "",
        "![predicted vs measured per operation](fidelity.png)",
        "",
        NOTE,
    ]
    print("\n".join(lines))
    if not args.no_write:  # the figure belongs to the section: neither is written with --no-write
        plot(points, HERE / "fidelity.png")
        write_section("fidelity", lines)
    if math.isnan(rho):
        sys.exit(1)


def plot(points: list[tuple[float, float, str]], path: Path) -> None:
    """Predicted against measured seconds per operation, log–log, one colour per role."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for cls, colour in COLOURS.items():
        xs = [m for p, m, c in points if c == cls and p > 0 and m > 0]
        ys = [p for p, m, c in points if c == cls and p > 0 and m > 0]
        if xs:
            ax.scatter(xs, ys, s=14, alpha=0.7, color=colour, label=cls)
    vals = [v for p, m, _ in points for v in (p, m) if v > 0]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
    ax.fill_between(
        [lo, hi], [lo / 1.25, hi / 1.25], [lo * 1.25, hi * 1.25], color="grey", alpha=0.12, label="±25%"
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50) if lo <= t <= hi]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_ticks(ticks)
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured seconds (worker time)")
    ax.set_ylabel("predicted seconds (cost model, calibrated)")
    ax.set_title("rpeg cost model vs vLLM + torch engine, per operation")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
