"""Real job shapes (issue: plan the jobs people run, SPEC §14): the planners on the RL jobs
reasoning teams run every day, and public recipes' layouts scored by the same cost model.

Workloads are files in ``benchmarks/real_jobs/`` (one TOML each, every field a reader can check):

1. GRPO Qwen2.5-7B, 512 × 8, Lp 1,024, Lr 8,192, rule reward, on 1x1x8, 1x2x8, 1x4x8 H100;
2. the same at Lr 16,384 and 32,768 on 1x4x8;
3. PPO Llama-3.1-8B actor and critic, rule reward, 1,024 prompts, Lp 512, Lr 2,048 on 1x4x8;
4. GRPO Qwen2.5-32B, 512 × 8, Lr 8,192 on 4 nodes of 8 H100;
5. GRPO Llama-3.3-70B (the Llama-3.1-70B shape), 256 × 8, Lr 4,096 on 8 nodes of 8 H100;
6. DAPO-style GRPO (no reference, rule reward, old log-probs on the trainer, 16 mini-batches)
   Qwen2.5-Math-7B, 512 × 16, Lp 2,048, Lr 28,672 on 32, 64 and 128 H20;
7. (issue 30, section ``real-jobs-moe``) GRPO Qwen3-30B-A3B, 512 × 8, Lr 8,192 on 2 nodes of 8
   H100; GRPO Qwen3-235B-A22B, 512 × 8, Lr 8,192 on 8 nodes; GRPO DeepSeek-V3, 512 × 4,
   Lr 2,048 on 64 nodes; GRPO Qwen2.5-7B at Lr 32,768 and 65,536 on 4 nodes. Planned with
   expert, context and sequence parallelism (SPEC §15) and, in the same run, without them.

For each: greedy, concurrent and sa (``--time-limit`` seconds, default 60, seed 0): status,
predicted step time, real-token throughput, peak memory against ``M_eff`` and the chosen
strategies. Then the public layouts, written as plans (``result_for_plan``) and scored:

* (1) on 1x1x8 — verl's FSDP recipe: all 8 GPUs shared; rollouts TP 2 × DP 4 at memory fraction
  0.6; training and reference DP 8, FSDP (ZeRO-3), a 24,576-token budget per GPU
  (``ppo_max_token_len_per_gpu``), gradient checkpointing;
* (6) — verl's colocated FSDP2 + vLLM DAPO run (``recipe/fully_async_policy/exp/
  qwen2-7B-math_*/fsdp2_colocate``): all GPUs shared; rollouts TP 4 at memory fraction 0.8;
  training FSDP over every GPU with a 61,440-token budget (``actor_ppo_max_token_len``), 16
  mini-batches, gradient checkpointing, parameter and optimizer offload (``offload=True``:
  rpeg's host offload of the trainer and of the old-log-prob pass, SPEC §14.4); the
  old-log-prob pass FSDP with a 92,160-token budget.
  Beside verl's published colocated step (``docs/advance/fully_async.md``, "Asynchronous
  Training on 7B Model": step, gen, old_log_prob, update_actor on 32/64/128 H20) — a
  comparison to report, not a number to fit: the H20 preset is the vendor's figures derated
  as every preset, and the response-length distribution is an assumption (the runs publish
  none; ``dapo-qwen2.5-math-7b.toml`` states it). What rpeg cannot express of that run yet is
  said in the output: HSDP (``fsdp_size=2``) and Ulysses sequence parallelism (``sp_size=4``).

8. (issue 31, section ``real-jobs-mxfp4``) GRPO gpt-oss-20b as verl's example runs it
   (256 × 5, Lp 512, Lr 8,192 on 8 H100) and GRPO gpt-oss-120b (512 × 8, Lr 8,192 on 4 nodes of
   8 H100), each planned in the same run with BF16 rollouts (the BF16 copy verl's recipe
   trains and serves) and with the rollouts served from MXFP4 experts (``precision = "mxfp4"``,
   ``docs/cost-model.md`` §11), training BF16 in both.

9. (issue 31, section ``real-jobs-async``) jobs 1, 3 and 7's Qwen3-30B-A3B planned in the same run
   with the synchronous engine loop and with the presets' asynchronous scheduling
   (``EngineStep.async_scheduling``: the bundled vLLM's default; ``docs/decisions.md``).

Run from the repository root::

    python benchmarks/real_jobs.py [--time-limit 60] [--only NAME,...] [--no-write]
    python benchmarks/real_jobs.py --moe [--time-limit 60]      # the jobs of 7
    python benchmarks/real_jobs.py --mxfp4 [--time-limit 60]    # the jobs of 8
    python benchmarks/real_jobs.py --async-scheduling [--time-limit 60]   # the jobs of 9
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from _bench import command, machine, plan_labels, write_section

import rpeg
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.templates import Structure
from rpeg.solvers import clear_caches
from rpeg.solvers.result import result_for_plan

HERE = Path(__file__).resolve().parent / "real_jobs"
GIB = 2**30
#: The H20's dense BF16 peak, FLOP/s (the vendor's figure; costmodel/presets/h20.json sources)
H20_DENSE_PEAK = 148e12

#: ``(workload file stem, cluster shapes)`` in the issue's order
JOBS = [
    ("grpo-qwen2.5-7b-8k", ["1x1x8", "1x2x8", "1x4x8"]),
    ("grpo-qwen2.5-7b-16k", ["1x4x8"]),
    ("grpo-qwen2.5-7b-32k", ["1x4x8"]),
    ("ppo-llama3.1-8b", ["1x4x8"]),
    ("grpo-qwen2.5-32b", ["1x4x8"]),
    ("grpo-llama3.3-70b", ["1x8x8"]),
    ("dapo-qwen2.5-math-7b", ["1x4x8", "1x8x8", "2x8x8"]),
]

#: Issue 30's jobs (mixture of experts, long responses), written to their own section
MOE_JOBS = [
    ("grpo-qwen3-30b-a3b", ["1x2x8"]),
    ("grpo-qwen3-235b-a22b", ["1x8x8"]),
    ("grpo-deepseek-v3", ["8x8x8"]),
    ("grpo-qwen2.5-7b-32k", ["1x4x8"]),
    ("grpo-qwen2.5-7b-64k", ["1x4x8"]),
]

#: Issue 31's gpt-oss jobs, each planned with BF16 and with MXFP4-expert rollouts
MXFP4_JOBS = [
    ("grpo-gpt-oss-20b", ["1x1x8"]),
    ("grpo-gpt-oss-120b", ["1x4x8"]),
]

#: Jobs planned with the synchronous rollout engine and with the presets' asynchronous scheduling
ASYNC_JOBS = [
    ("grpo-qwen2.5-7b-8k", ["1x1x8"]),
    ("ppo-llama3.1-8b", ["1x4x8"]),
    ("grpo-qwen3-30b-a3b", ["1x2x8"]),
]

#: verl's published colocated synchronous step of job (6) on H20, seconds per step:
#: ``(GPUs, step, gen, old_log_prob, update_actor)`` (docs/advance/fully_async.md, added in verl
#: b25bb7d4f of 2025-10-17, whose setup.py pinned ``vllm>=0.7.3,<=0.9.1``: vLLM's synchronous
#: engine loop, asynchronous scheduling being opt-in before PR #27614).
VERL_DAPO_COLOCATED = [
    (32, 790.10, 357.41, 107.71, 313.81),
    (64, 365.28, 150.72, 70.26, 133.41),
    (128, 356.30, 177.85, 53.92, 113.81),
]


@dataclass
class Row:
    """One method's plan on one job and cluster."""

    job: str
    shape: str
    method: str
    status: str
    step_s: float
    throughput: float
    peak_gib: float
    m_eff_gib: float
    strategies: str
    seconds: float


def _row(job: str, shape: str, method: str, result: rpeg.Result, seconds: float) -> Row:
    ev = result.evaluation
    m_eff = result.cluster.hardware.m_eff / GIB
    if ev is None:
        why = (result.message or "—").replace("|", "/")  # what the planner says, in the table
        return Row(job, shape, method, result.status.value, math.inf, 0.0, math.nan, m_eff, why, seconds)
    return Row(
        job,
        shape,
        method,
        result.status.value,
        ev.makespan / result.k_eval,
        ev.throughput,
        ev.memory.max_peak / GIB,
        m_eff,
        plan_labels(result),
        seconds,
    )


def _sa_feasible(rows: list[Row]) -> tuple[int, int]:
    """sa's memory-feasible plans among ``rows``, and sa's runs (``sa`` with or without the splits)."""
    sa = [r for r in rows if r.method.split(",")[0] == "sa"]
    return sum(r.status in ("feasible", "optimal", "time_limit") and r.throughput > 0 for r in sa), len(sa)


def _table(rows: list[Row]) -> list[str]:
    """The rows as a Markdown table: job, cluster, method, status, step, throughput, memory,
    strategies, solve time."""
    out = [
        "| job | cluster | method | status | step s | tokens/s | peak / M_eff GiB | strategies | solve s |",
        "|---|---|---|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.job} | {r.shape} | {r.method} | {r.status} | {r.step_s:,.1f} | {r.throughput:,.0f} | "
            f"{r.peak_gib:.1f} / {r.m_eff_gib:.1f} | {r.strategies} | {r.seconds:.1f} |"
        )
    return out


def run_job(
    stem: str,
    shape: str,
    time_limit: float,
    splits: bool = True,
    precision: str | None = None,
    async_scheduling: bool | None = None,
) -> list[Row]:
    """greedy, concurrent and sa on one workload file and cluster shape (``splits``: with SPEC
    §15's expert, context and sequence parallelism in the plan space; ``precision``: given to
    every mixture of experts of the workload, as a workload file's top-level setting would;
    ``async_scheduling``: the rollout engine's, in place of the preset's)."""
    wf = rpeg.load_workload(HERE / f"{stem}.toml")
    if precision is not None:
        models = {
            role: replace(spec, precision=precision) if spec.is_moe else spec
            for role, spec in wf.workload.models.items()
        }
        wf = replace(wf, workload=replace(wf.workload, models=models))
    hw = rpeg.hardware_preset(wf.hardware or "h100")
    if async_scheduling is not None:
        hw = hw.with_rollout_scheduling(async_scheduling)
    cluster = rpeg.Cluster.from_shape(shape, hw, **({} if splits else NO_SPLITS))
    rows = []
    for method, kwargs in (
        ("greedy", {}),
        ("concurrent", {}),
        ("sa", {"time_limit": time_limit, "seed": 0}),
    ):
        clear_caches()  # each method builds its own candidates, as in a fresh process
        t0 = time.perf_counter()
        result = rpeg.solve(wf.workload, cluster, method=method, k_eval=wf.k_eval, **kwargs)
        label = method if splits else f"{method}, no EP/CP/SP"
        if precision is not None:
            label = f"{method}, {precision} rollouts"
        if async_scheduling is not None:
            label = f"{method}, {'asynchronous' if async_scheduling else 'synchronous'} engine"
        rows.append(_row(stem, shape, label, result, time.perf_counter() - t0))
        r = rows[-1]
        print(
            f"{stem:<22} {shape:<6} {method:<10} {r.status:<10} step {r.step_s:9.1f} s  "
            f"{r.throughput:>10,.0f} tok/s  peak {r.peak_gib:5.1f}/{r.m_eff_gib:.1f} GiB  ({r.seconds:.1f} s)",
            flush=True,
        )
    return rows


def _local_microbatches(workload: rpeg.Workload, dp: int, budget: int, updates: int = 1) -> int:
    """``mb`` a dynamic batcher with a token budget per GPU forms: per update,
    ``⌈B_local·E[ℓ]/(U·budget)⌉`` microbatches, times ``U`` updates."""
    ell = workload.prompt_len + workload.mean_response
    per_update = workload.sequences / dp / updates * ell
    return updates * max(1, math.ceil(per_update / budget))


def verl_fsdp_recipe(time_limit: float) -> list[str]:
    """Job (1) on 1x1x8 with verl's FSDP layout, scored; with whole-microbatch logits and with
    a chunked loss (verl's fused kernels never hold FP32 logits of a whole microbatch)."""
    wf = rpeg.load_workload(HERE / "grpo-qwen2.5-7b-8k.toml")
    w = wf.workload
    cluster = rpeg.Cluster.from_shape("1x1x8", rpeg.hardware_preset("h100"))
    mb = _local_microbatches(w, 8, 24_576)
    lines = []
    for chunk in (0, 4096):
        engine = {"zero": 3, "logits_chunk": chunk}
        table = {
            "actor_gen": ((0, 0, 0), (1, 1, 8), 4, 1, 2, 1, None, {"mem_fraction": 0.6}),
            "ref_inf": ((0, 0, 0), (1, 1, 8), 8, 1, 1, mb, None, engine),
            "actor_train": ((0, 0, 0), (1, 1, 8), 8, 1, 1, mb, "full", engine),
        }
        res = result_for_plan(
            w, cluster, Structure.synchronous(w), table, k_eval=wf.k_eval, method="verl-fsdp"
        )
        ev = res.evaluation
        assert ev is not None
        lines.append(
            f"| (1) 1x1x8 verl FSDP recipe, {'chunked loss' if chunk else 'whole-microbatch logits'} | "
            f"{'fits' if ev.feasible else 'DOES NOT FIT'} | {ev.makespan / res.k_eval:,.1f} | "
            f"{ev.throughput:,.0f} | {ev.memory.max_peak / GIB:.1f} / {ev.memory.m_eff / GIB:.1f} | "
            f"{plan_labels(res)} |"
        )
        print(lines[-1], flush=True)
    return lines


def verl_dapo_colocated() -> list[str]:
    """Job (6) with verl's colocated FSDP2 + vLLM layout on 32/64/128 H20, scored, beside the
    published step and its parts; the rollouts priced on the synchronous engine loop that run's
    vLLM had (:data:`VERL_DAPO_COLOCATED`), not the preset's asynchronous scheduling."""
    wf = rpeg.load_workload(HERE / "dapo-qwen2.5-math-7b.toml")
    w = wf.workload
    lines = []
    for (gpus, step, gen, logp, update), shape in zip(VERL_DAPO_COLOCATED, ["1x4x8", "1x8x8", "2x8x8"]):
        cluster = rpeg.Cluster.from_shape(shape, rpeg.hardware_preset("h20").with_rollout_scheduling(False))
        extent = cluster.shape_for_size(gpus)
        train_mb = _local_microbatches(w, gpus, 61_440, w.mini_batches)
        logp_mb = _local_microbatches(w, gpus, 92_160)
        table = {
            "actor_gen": ((0, 0, 0), extent, gpus // 4, 1, 4, 1, None, {"mem_fraction": 0.8}),
            "actor_logp": (
                (0, 0, 0),
                extent,
                gpus,
                1,
                1,
                logp_mb,
                None,
                {"zero": 3, "logits_chunk": 4096, "offload": True},
            ),
            "actor_train": (
                (0, 0, 0),
                extent,
                gpus,
                1,
                1,
                train_mb,
                "full",
                {"zero": 3, "logits_chunk": 4096, "offload": True},
            ),
        }
        res = result_for_plan(
            w, cluster, Structure.synchronous(w), table, k_eval=wf.k_eval, method="verl-colocated"
        )
        ev = res.evaluation
        assert ev is not None and ev.graph is not None
        per = {v.name: 0.0 for v in res.graph.vertices}
        for i, kind in enumerate(ev.graph.kind):
            if kind == 0:
                per[res.graph.vertices[ev.graph.vertex[i]].name] += ev.graph.duration[i] / res.k_eval
        # the mean tokens per sequence the published update_actor allows at the H20's dense BF16
        # peak (148 TFLOP/s, the vendor's figure), 8 FLOPs per parameter and token (forward 2,
        # backward 4, the checkpointed forward again 2), attention left out: an upper bound
        implied = update * gpus * H20_DENSE_PEAK / (8 * w.models["actor"].params * w.sequences)
        lines.append(
            f"| {gpus} H20 ({shape}) | {'fits' if ev.feasible else 'DOES NOT FIT'} "
            f"{ev.memory.max_peak / GIB:.1f} / {ev.memory.m_eff / GIB:.1f} GiB | "
            f"{ev.makespan / res.k_eval:,.1f} / {step:,.1f} | {per['actor_gen']:,.1f} / {gen:,.1f} | "
            f"{per['actor_logp']:,.1f} / {logp:,.1f} | {per['actor_train']:,.1f} / {update:,.1f} | "
            f"train mb={train_mb}, log-prob mb={logp_mb} | {implied:,.0f} / "
            f"{w.prompt_len + w.mean_response:,.0f} |"
        )
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="SA seconds per job and cluster")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    ap.add_argument(
        "--moe", action="store_true", help="issue 30's MoE and long-response jobs (section real-jobs-moe)"
    )
    ap.add_argument(
        "--mxfp4",
        action="store_true",
        help="issue 31's gpt-oss jobs with BF16 and MXFP4-expert rollouts (section real-jobs-mxfp4)",
    )
    ap.add_argument(
        "--async-scheduling",
        action="store_true",
        help="jobs planned with a synchronous and an asynchronous rollout engine (section real-jobs-async)",
    )
    args = ap.parse_args(argv)
    if args.async_scheduling:
        return async_jobs(args, argv)
    if args.moe:
        return moe_jobs(args, argv)
    if args.mxfp4:
        return mxfp4_jobs(args, argv)
    only = {s for s in args.only.split(",") if s}
    rows: list[Row] = []
    for stem, shapes in JOBS:
        if only and stem not in only:
            continue
        for shape in shapes:
            rows.extend(run_job(stem, shape, args.time_limit))
    public = verl_fsdp_recipe(args.time_limit) if not only or "grpo-qwen2.5-7b-8k" in only else []
    dapo = verl_dapo_colocated() if not only or "dapo-qwen2.5-math-7b" in only else []

    feasible, sa_runs = _sa_feasible(rows)
    out = [
        "## Real job shapes (SPEC §14)",
        "",
        f"Command: `{command('real_jobs.py', argv)}`. Machine: {machine()}.",
        "",
        f"Every job and cluster with a memory-feasible sa plan: **{feasible}/{sa_runs}**. Step time is "
        "predicted (`makespan/k_eval`); throughput counts real tokens, `B·R·(Lp + Ē)` per step.",
        "",
        *_table(rows),
    ]
    if public:
        out += [
            "",
            "Public layouts scored by rpeg:",
            "",
            "| layout | memory | step s | tokens/s | peak / M_eff GiB | strategies |",
            "|---|---|---:|---:|---|---|",
            *public,
        ]
    if dapo:
        out += [
            "",
            "Job (6), verl's colocated synchronous layout: rpeg's prediction / verl's published figure "
            "(seconds per step). Not expressible in rpeg yet, so left out of the scored layout: HSDP "
            "(`fsdp_size=2`; scored as FSDP over every GPU), Ulysses sequence parallelism (`sp_size=4`; "
            "scored without it). Its parameter and optimizer offload (`offload=True`) is scored as rpeg's "
            "host offload of the trainer and of the old-log-prob pass (SPEC §14.4: loaded before each "
            "run and offloaded after it over PCIe 5.0, 50.4 GB/s). Its rollouts are priced on vLLM's "
            "synchronous engine loop, the one that run had (verl pinned vLLM ≤ 0.9.1 when it published "
            "the table, before asynchronous scheduling became vLLM's default); the planned rows above "
            "use the preset's asynchronous scheduling. The response-length distribution is "
            "assumed (the workload file states it).",
            "",
            "The last column bounds the published runs' sequences: the mean tokens per sequence that "
            "verl's update_actor time allows at the H20's dense BF16 peak (148 TFLOP/s, 8 FLOPs per "
            "parameter and token with gradient checkpointing, attention left out), beside the "
            "assumed workload's `Lp + Ē`.",
            "",
            "| GPUs | memory | step | gen | old_log_prob | update_actor | microbatches | tokens/seq: at most / assumed |",
            "|---|---|---:|---:|---:|---:|---|---|",
            *dapo,
        ]
    return _publish("real-jobs", out, args)


def moe_jobs(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Issue 30's jobs, planned by greedy, concurrent and sa, into the section ``real-jobs-moe``."""
    rows, _ = _paired(MOE_JOBS, args.time_limit, {}, {"splits": False})
    with_splits = [r for r in rows if "no EP" not in r.method]
    feasible, sa_runs = _sa_feasible(with_splits)
    before, _ = _sa_feasible([r for r in rows if "no EP" in r.method])
    used = [
        r.job
        for r in with_splits
        if r.method == "sa" and any(w in r.strategies for w in (" ep=", " cp=", " sp"))
    ]
    out = [
        "## Mixture-of-experts and long-response jobs, with and without expert and context parallelism (issue 30)",
        "",
        f"Command: `{command('real_jobs.py', argv)}`. Machine: {machine()}.",
        "",
        "The models as their config.json files describe them (`docs/cost-model.md` §9: FLOPs count the "
        "active experts, memory every expert, DeepSeek-V3's KV cache its latent). Each job is planned "
        "twice in the same run: with SPEC §15's expert, context (ring, Ulysses) and sequence "
        "parallelism in the plan space (`docs/cost-model.md` §10), and without them (`no EP/CP/SP`: "
        "every rank holds all the experts of its stage and every sequence whole). An infeasible "
        "row's strategies column holds the planner's reason. "
        f"Memory-feasible sa plans: **{feasible}/{sa_runs}** with the splits, {before}/{sa_runs} "
        f"without; sa plans that use one of them: {len(used)}/{sa_runs} ({', '.join(used) or 'none'}). "
        "Step time is predicted "
        "(`makespan/k_eval`); throughput counts real tokens.",
        "",
        *_table(rows),
    ]
    return _publish("real-jobs-moe", out, args)


def _paired(
    jobs: list[tuple[str, list[str]]], time_limit: float, first: dict[str, Any], second: dict[str, Any]
) -> tuple[list[Row], list[tuple[str, str, Row, Row]]]:
    """Each job of ``jobs`` on each of its shapes planned twice in the same run,
    :func:`run_job` with ``first`` and then ``second``: every row, and per job and shape the two
    sa rows ``(job, shape, sa with first, sa with second)`` (sa is :func:`run_job`'s last)."""
    rows: list[Row] = []
    pairs = []
    for stem, shapes in jobs:
        for shape in shapes:
            a = run_job(stem, shape, time_limit, **first)
            b = run_job(stem, shape, time_limit, **second)
            rows += a + b
            pairs.append((stem, shape, a[-1], b[-1]))
    return rows, pairs


def _publish(section: str, out: list[str], args: argparse.Namespace) -> int:
    """Write ``out`` as RESULTS.md's ``section`` (unless ``--no-write``) and print it."""
    if not args.no_write:
        write_section(section, out)
    print("\n".join(out))
    return 0


def mxfp4_jobs(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Issue 31's gpt-oss jobs, planned by greedy, concurrent and sa with BF16 rollouts and with
    MXFP4-expert rollouts, into the section ``real-jobs-mxfp4``."""
    rows, pairs = _paired(MXFP4_JOBS, args.time_limit, {"precision": "bf16"}, {"precision": "mxfp4"})
    gains = [
        f"{stem} on {shape} {mx.throughput / bf16.throughput:.2f} ×"
        for stem, shape, bf16, mx in pairs
        if bf16.throughput > 0 and mx.throughput > 0
    ]
    out = [
        "## gpt-oss jobs with BF16 and with MXFP4-expert rollouts (issue 31)",
        "",
        f"Command: `{command('real_jobs.py', argv)}`. Machine: {machine()}.",
        "",
        "Each job is planned twice in the same run: with BF16 rollouts (the model RL trains; verl's "
        "gpt-oss recipe dequantizes the checkpoint with `Mxfp4Config(dequantize=True)` and serves that "
        "copy) and with the rollout engine serving the routed experts from MXFP4 weights, as vLLM "
        'serves gpt-oss\'s published checkpoint (`precision = "mxfp4"`: 0.53125 bytes per expert weight, '
        "weight-only expert GEMMs at the presets' fitted efficiency; training, the reference's pass and "
        "the weight sync stay BF16; docs/cost-model.md §11). Step time is predicted (`makespan/k_eval`); "
        f"throughput counts real tokens. sa's throughput with MXFP4 rollouts over BF16: {', '.join(gains) or 'n/a'}.",
        "",
        *_table(rows),
    ]
    return _publish("real-jobs-mxfp4", out, args)


def async_jobs(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Jobs planned by greedy, concurrent and sa with the synchronous rollout engine loop and with
    the presets' asynchronous scheduling, into the section ``real-jobs-async``."""
    rows, pairs = _paired(
        ASYNC_JOBS, args.time_limit, {"async_scheduling": False}, {"async_scheduling": True}
    )
    ratios = [
        f"{stem} on {shape} {asyn.step_s / sync.step_s:.2f}"
        for stem, shape, sync, asyn in pairs
        if math.isfinite(sync.step_s) and math.isfinite(asyn.step_s)
    ]
    out = [
        "## Real jobs with a synchronous and an asynchronous rollout engine (issue 31)",
        "",
        f"Command: `{command('real_jobs.py', argv)}`. Machine: {machine()}.",
        "",
        "Each job is planned twice in the same run on its preset: with the synchronous engine loop "
        "(5.5 ms of host time per step, docs/cost-model.md §8; vLLM before asynchronous scheduling "
        "became its default, and a hardware file with `async_scheduling = false`) and as the presets "
        "price the rollout engine, with asynchronous scheduling (`EngineStep.async_scheduling`: "
        "`min(c_w, c_step) + max(0, c_step − c_w − t_GPU)` of a step's host seconds exposed, "
        f"`c_w` = {rpeg.hardware_preset('h100').rollout_step.async_host_s * 1e3:.2f} ms; the bundled "
        "vLLM's default). "
        "Step time is predicted (`makespan/k_eval`). sa's step, asynchronous over synchronous: "
        f"{', '.join(ratios) or 'n/a'}.",
        "",
        *_table(rows),
    ]
    return _publish("real-jobs-async", out, args)


if __name__ == "__main__":
    sys.exit(main())
