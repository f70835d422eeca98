"""Measured cost of executed transitions on this machine, per primitive (issue: adaptation).

Runs PPO plans on local Ray CPU workers (gloo) and moves the running job to another plan after
one step with ``rpeg.run(..., transitions=[(1, target)])``: parameters, Adam moments and counters
travel through the transition DAG's Split / Merge / Extend / Destroy. Reports, per primitive
kind, the count, the mean measured seconds and bytes, and the cost model's seconds for the same
primitives at the *scaled* state size with the ``cpu`` hardware preset (and the full-size
prediction on the plan's cluster), plus the phases around the primitives (weight
synchronisation, export with the ZeRO gather, hand-over to the target plan's workers). Writes
the ``executed-transitions`` section of ``benchmarks/RESULTS.md``.

    python benchmarks/executed_transitions.py [--scales tiny,small] [--no-write]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from _bench import command, machine, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the hand-written test plans

from rpeg import hardware_preset
from rpeg.costmodel.transition import primitive_times
from rpeg.ir import Cluster
from rpeg.ir.emu import EMU, transition_dag
from rpeg.ir.types import Role
from tests.runtime.plans import AFTER, BEFORE, COLOCATED, DISAGG, hand, workload

SYNC = (("actor", 0), ("critic", 0))
CASES = {
    "gen TP 1→2, critic train DP 2→4": (BEFORE, AFTER),
    "every vertex re-laid out": (DISAGG, COLOCATED),
}


def scaled_predictions(current, target, scale: str) -> list[float]:
    """Cost-model seconds of each primitive with the runtime's scaled state (float32 parameters,
    two float32 Adam moments) on a cluster of the plan's shape with the ``cpu`` preset."""
    from rpeg.runtime.binding import bind, run_specs
    from rpeg.runtime.driver.transition import physical_units
    from rpeg.runtime.trace.records import expected_graph
    from rpeg.runtime.worker.state import full_shapes

    specs = run_specs([current, target], scale=scale)
    groups = bind(current, expected_graph(current, 1), 1, scale=scale, specs=specs).groups
    counts = {g.model: sum(math.prod(s) for s in full_shapes(g.spec, g.head).values()) for g in groups}
    roles = {v.name: v.role for v in current.graph.vertices}

    def scaled(units: list[EMU]) -> list[EMU]:
        out = []
        for u in units:
            n = counts[u.stage.model]
            opt = 8.0 * n if roles[u.stage.vertex] is Role.TRAINING else 0.0
            out.append(EMU(u.stage, u.tp, u.pp, u.gpus, 4.0 * n, opt))
        return out

    cpu = Cluster.from_shape(current.cluster.shape_str, hardware_preset("cpu"))
    dag = transition_dag(
        scaled(physical_units(current, current.graph, 0)), scaled(physical_units(target, target.graph, 0))
    )
    return primitive_times(dag, cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="tiny,small", help="model scales to run (comma separated)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    import ray

    from rpeg.runtime.driver.runner import run, start_local_ray

    start_local_ray(4, num_cpus=2)  # workers at the driver's priority, not niced
    rows, phases = [], []
    t_all = time.perf_counter()
    try:
        for scale in args.scales.split(","):
            for case, (before, after) in CASES.items():
                wl = workload("ppo")
                current, target = hand(wl, "1x1x4", before, SYNC), hand(wl, "1x1x4", after, SYNC)
                report = run(current, steps=2, scale=scale, transitions=[(1, target)])
                if report.problems:
                    raise RuntimeError(f"{case}: trace invalid: {report.problems[:2]}")
                (rec,) = report.transitions
                pred = scaled_predictions(current, target, scale)
                kinds = rec.per_kind()
                scaled: dict[str, float] = {}
                for p in rec.primitives:
                    scaled[p["kind"]] = scaled.get(p["kind"], 0.0) + pred[p["index"]]
                for kind in ("split", "merge", "extend", "destroy"):
                    if kind in kinds:
                        d, n = kinds[kind], kinds[kind]["count"]
                        rows.append(
                            f"| {scale} | {case} | {kind} | {int(n)} | {1e3 * d['mean_s']:.1f} | "
                            f"{d['bytes'] / n / 1e6:.3f} | {1e3 * scaled[kind] / n:.1f} | "
                            f"{1e3 * d['predicted_s'] / n:.1f} |"
                        )
                phases.append(
                    f"| {scale} | {case} | {len(rec.primitives)} | {1e3 * rec.sync_s:.0f} | {1e3 * rec.join_s:.0f} | "
                    f"{1e3 * rec.export_s:.0f} | "
                    f"{1e3 * rec.primitives_s:.0f} | {1e3 * rec.handover_s:.0f} | {rec.handover_bytes / 1e6:.2f} | "
                    f"{1e3 * rec.total_s:.0f} | {1e3 * rec.predicted_s:.0f} |"
                )
                print(phases[-1], flush=True)
    finally:
        ray.shutdown()
    text = "\n".join(
        [
            "## Executed transitions on this machine (runtime, CPU workers, per primitive)",
            "",
            f"Command: `{command('executed_transitions.py', argv)}`  ",
            f"Machine: {machine()}.  ",
            "PPO with three 1B-shaped models scaled down (`tiny`: 2 layers, hidden 64; `small`: 4 layers, "
            "hidden 128; float32 parameters and Adam moments), 4 CPU devices (Ray actors, gloo); the job runs "
            "one step on the first plan, moves with `rpeg.run(..., transitions=[(1, target)])`, and runs one "
            f"more step on the target. Total wall time {time.perf_counter() - t_all:.0f} s.",
            "",
            "Per primitive kind (means per primitive; bytes = sent over the transition group; predictions "
            "are the transition cost model's seconds for the same primitive — at the scaled state with the "
            "`cpu` preset, and at full size on the plan's GH200 cluster):",
            "",
            "| scale | transition | primitive | count | measured ms | MB sent | model ms (scaled, cpu) "
            "| model ms (full size, GH200) |",
            "|---|---|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Phases (ms): weight synchronisation, forming the gloo group over both plans' workers (store and "
            "full mesh of connections), export (parameters and ZeRO-gathered moments into EMU cells), "
            "the primitives (concurrent where the DAG allows), hand-over (target workers load their cells; "
            "MB copied between the two plans' workers on the same device):",
            "",
            "| scale | transition | primitives | sync | group | export | primitives | hand-over | hand-over MB "
            "| total | L_tran full size |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *phases,
            "",
            "Reading: on these CPU workers a primitive costs tens of milliseconds whatever its size — Ray "
            "calls, Python packing and gloo set-up per message dominate the few hundred kB moved; the cost "
            "model's fixed communicator set-up (0.1 s per Split/Merge/Extend, a GPU/NCCL figure) overestimates "
            "them, and its bandwidth terms are negligible at this size. Forming the gloo group over both plans' "
            "workers took 0.06–0.6 s in the three-primitive case and 5.1 s in the re-layout case (29 processes): "
            "with plain multiprocessing and no Ray, creating a gloo group took 0.02–0.14 s for 8–28 processes "
            "and 5.1–5.2 s for 29 and 32 on this VM, a connection-setup cliff of the machine, not of the "
            "transition. The first transition of a process also pays one-off imports (total minus the phases). The hand-over "
            "exists because this runtime starts the target plan's workers as new processes (a GPU runtime would "
            "re-configure the same process per device); it is reported apart from the DAG.",
        ]
    )
    print(text)
    if not args.no_write:
        write_section("executed-transitions", text.splitlines())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
