"""The ``rpeg`` command line.

::

    rpeg examples
    rpeg solve WORKLOAD.toml|EXAMPLE [--cluster RxNxG] [--hardware PRESET|FILE.json]
               [--method greedy|concurrent] [--json OUT.json] [--seed N] [--time-limit S]
    rpeg evaluate WORKLOAD.toml|EXAMPLE --plan PLAN.json [--cluster ...] [--hardware ...] [--json OUT.json]

Bad input ends with exit status 2 and one line naming the field and value; a problem with no
memory-feasible plan ends with exit status 3 after saying which invocation does not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .costmodel.hardware import load_hardware
from .examples import example_names, example_path
from .heuristics.evaluator import Evaluator
from .ir.cluster import Cluster
from .ir.workload import WorkloadFile, load_workload
from .solvers.result import Result, Status, plan_from_entries, problem_from_dict
from .solvers.solve import METHODS, solve

__all__ = ["main"]

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3


def _workload_file(arg: str) -> WorkloadFile:
    path = Path(arg)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ValueError(f"workload file {arg!r} does not exist")
        return load_workload(path)
    return load_workload(example_path(arg))


def _cluster(wf: WorkloadFile, shape: str | None, hardware: str | None) -> Cluster:
    shape = shape or wf.cluster_shape
    hardware = hardware or wf.hardware
    if shape is None:
        raise ValueError("no cluster shape: pass --cluster RxNxG (the workload file names none)")
    if hardware is None:
        raise ValueError("no hardware: pass --hardware PRESET|FILE.json (the workload file names none)")
    return Cluster.from_shape(shape, load_hardware(hardware))


def _cmd_examples(args: argparse.Namespace) -> int:
    for name in example_names():
        wf = load_workload(example_path(name))
        print(f"{name}\t{wf.description}")
    return 0


def _finish(result: Result, json_out: str | None) -> int:
    print(result.summary())
    if json_out:
        result.to_json(json_out)
        print(f"\nwrote {json_out}")
    return EXIT_INFEASIBLE if result.status is Status.INFEASIBLE else 0


def _cmd_solve(args: argparse.Namespace) -> int:
    wf = _workload_file(args.workload)
    cluster = _cluster(wf, args.cluster, args.hardware)
    result = solve(
        wf.workload,
        cluster,
        method=args.method,
        time_limit=args.time_limit,
        seed=args.seed,
        k_eval=args.k_eval or wf.k_eval,
        objective=args.objective,
        delta=args.delta,
    )
    return _finish(result, args.json)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    wf = _workload_file(args.workload)
    plan_path = Path(args.plan)
    if not plan_path.is_file():
        raise ValueError(f"--plan file {args.plan!r} does not exist")
    try:
        doc = json.loads(plan_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--plan {args.plan}: not valid JSON ({exc})") from None
    if "plan" not in doc:
        raise ValueError(f"--plan {args.plan}: missing field 'plan'")
    if "structure" in doc and "cluster" in doc and not (args.cluster or args.hardware):
        _, cluster, structure = problem_from_dict(doc)
    else:
        cluster = _cluster(wf, args.cluster, args.hardware)
        structure = problem_from_dict(doc)[2] if "structure" in doc else None
    k_eval = args.k_eval or int(doc.get("k_eval", wf.k_eval))
    ev = Evaluator(wf.workload, cluster, structure, k_eval=k_eval)
    plan = plan_from_entries(ev, doc["plan"])
    evaluation = ev.evaluate(plan, keep=True)
    status = Status.FEASIBLE if evaluation.feasible else Status.INFEASIBLE
    message = "" if evaluation.feasible else "the plan exceeds M_eff on some GPU (see peak mem)"
    result = Result(
        wf.workload,
        cluster,
        ev.structure,
        ev.graph,
        plan,
        evaluation,
        status,
        "evaluate",
        0.0,
        ev.evaluations,
        k_eval,
        message=message,
    )
    return _finish(result, args.json)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpeg", description="Plan RL post-training pipelines on GPU clusters.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("examples", help="list bundled example workloads").set_defaults(fn=_cmd_examples)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("workload", help="workload TOML file or bundled example name")
        sp.add_argument(
            "--cluster", help="cluster shape RACKSxNODESxGPUS, e.g. 1x4x4 (default: from the file)"
        )
        sp.add_argument("--hardware", help="hardware preset or JSON file (default: from the file)")
        sp.add_argument("--json", metavar="OUT.json", help="write the rpeg.result/1 file here")
        sp.add_argument("--k-eval", type=int, default=None, help="steps to unroll when scoring (default 8)")

    s = sub.add_parser("solve", help="plan a workload")
    common(s)
    s.add_argument("--method", default="concurrent", help=f"one of {', '.join(sorted(METHODS))}")
    s.add_argument("--time-limit", type=float, default=None, help="seconds, for searching methods")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--objective", default="throughput", choices=["throughput", "throughput-util"])
    s.add_argument("--delta", type=float, default=0.10, help="δ of the throughput-util objective")
    s.set_defaults(fn=_cmd_solve)

    e = sub.add_parser("evaluate", help="score a given plan")
    common(e)
    e.add_argument("--plan", required=True, help="a result JSON file (its plan and structure are used)")
    e.set_defaults(fn=_cmd_evaluate)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as exc:
        print(f"rpeg: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
