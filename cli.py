"""The ``rpeg`` command line.

::

    rpeg examples
    rpeg solve WORKLOAD.toml|EXAMPLE [--cluster RxNxG] [--hardware PRESET|FILE.json]
               [--method greedy|concurrent|sa|dp|cpsat|milp] [--json OUT.json] [--gantt PLAN.png]
               [--seed N] [--time-limit S] [--k-eval N] [--objective O] [--delta D]
               [--max-evaluations N] [--workers N] [--ablate a,b,...] [--t-init T] [--t-warm T]
               [--no-progress] [--no-compare]                              (sa)
               [--candidates K] [--threads N] [--warm-start P] [--solver NAME] (cpsat, milp)
    rpeg evaluate WORKLOAD.toml|EXAMPLE --plan PLAN.json [--cluster ...] [--hardware ...]
               [--json OUT.json] [--gantt PLAN.png]
    rpeg project INSTANCE.sm|.mm [--method cpsat|milp|list] ...
    rpeg run | verify | calibrate ...     (the runtime's and the calibration's sub-commands)

``--method sa`` shows live progress on stderr (when it is a terminal) and ends with a table
comparing its plan with the greedy and concurrent baselines on the same workload and cluster.
Ctrl-C during ``sa``, ``cpsat`` or ``milp`` stops the search with the best plan so far (status
``time_limit``; for the exact methods at least their warm-start plan). Every method returns
within ``--time-limit`` plus a small overshoot (``benchmarks/RESULTS.md``), model building
included.

Bad input ends with exit status 2 and one line naming the field and value; a result without a
plan (status ``infeasible``, ``time_limit``, ``unknown`` or ``error``) ends with exit status 3
after the summary says why (for ``infeasible``: which invocation does not fit). When the reader
of the output leaves early (``rpeg examples | head -1``) the command ends quietly with status 141,
as a POSIX tool killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .costmodel.hardware import load_hardware
from .examples import example_names, example_path
from .heuristics.search import ABLATIONS
from .ir.cluster import PARALLELISM_SWITCHES, Cluster, parse_shape
from .ir.errors import InputError, check_output, read_json, require_file, seed_flag, writing_output
from .ir.workload import WorkloadFile, load_workload
from .scoring.evaluator import Evaluator
from .solvers.result import (
    READ_FORMATS,
    Result,
    Status,
    check_plan_document,
    plan_from_entries,
    problem_from_dict,
)
from .solvers.solve import METHODS, solve

__all__ = ["main"]

EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130  # Ctrl-C before any plan existed (the shell's 128 + SIGINT)
#: ``rpeg calibrate --in-situ``: steps per calibration plan when ``--in-situ-steps`` is not given.
IN_SITU_STEPS = 3
EXIT_BROKEN_PIPE = 141  # the reader of stdout left (`rpeg examples | head -1`): 128 + SIGPIPE, no message
GIB = 2**30

#: ``solve`` flags that only some methods take: option name → (flag, methods taking it).
METHOD_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "max_evaluations": ("--max-evaluations", ("sa",)),
    "workers": ("--workers", ("sa",)),
    "ablate": ("--ablate", ("sa",)),
    "t_init": ("--t-init", ("sa",)),
    "t_warm": ("--t-warm", ("sa",)),
    "candidates": ("--candidates", ("cpsat", "milp")),
    "threads": ("--threads", ("cpsat", "milp")),
    "solver": ("--solver", ("milp",)),
    "warm_start": ("--warm-start", ("cpsat", "milp")),
}
#: Methods the ``sa`` comparison table runs next to the search's plan.
BASELINES = ("greedy", "concurrent")


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (``--k-eval 0`` is an error, not "use the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """argparse type: a positive finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number of seconds, got {text!r}")
    return value


#: What ``--gantt`` can draw (matplotlib's vector and raster writers).
GANTT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps")


def _workload_file(arg: str) -> WorkloadFile:
    path = Path(arg)
    if path.suffix == ".toml" or path.is_file() or "/" in arg or path.is_dir():
        return load_workload(path)
    try:
        return load_workload(example_path(arg))
    except ValueError as exc:
        raise InputError(f"workload {arg!r} is neither a TOML file nor a bundled example ({exc})") from None


def _cluster(wf: WorkloadFile, args: argparse.Namespace) -> Cluster:
    """The cluster of ``solve``/``evaluate``: ``--cluster`` and ``--hardware`` (else the workload
    file's; ``--rollout-scheduling`` sets its rollout engine's scheduling), with the engine
    limits ``--generation-max-pp``, ``--max-zero-stage``, ``--no-host-offload`` and the
    parallelism switches ``--no-…-parallel``, ``--no-expert-overlap``,
    ``--no-flex-dispatch``."""
    shape = args.cluster if args.cluster is not None else wf.cluster_shape
    hardware = args.hardware if args.hardware is not None else wf.hardware
    if shape is None:
        raise InputError("no cluster shape: pass --cluster RxNxG (the workload file names none)")
    if hardware is None:
        raise InputError("no hardware: pass --hardware PRESET|FILE.json (the workload file names none)")
    try:
        dims = parse_shape(shape)
    except ValueError as exc:
        raise InputError(f"--cluster: {exc}", source="--cluster") from None
    hw = load_hardware(hardware)
    scheduling = args.rollout_scheduling
    if scheduling is not None:
        try:
            hw = hw.with_rollout_scheduling(scheduling == "async")
        except ValueError as exc:
            raise InputError(
                f"--rollout-scheduling {scheduling}: {exc}", source="--rollout-scheduling"
            ) from None
    return Cluster.from_shape(
        dims,
        hw,
        generation_max_pp=args.generation_max_pp,
        max_zero_stage=args.max_zero_stage,
        host_offload=args.host_offload,
        **{name: getattr(args, name) for name in PARALLELISM_SWITCHES},
    )


def _check_outputs(args: argparse.Namespace) -> None:
    check_output(getattr(args, "json", None), "--json", (".json",))
    check_output(getattr(args, "gantt", None), "--gantt", GANTT_SUFFIXES)


def _cmd_examples(args: argparse.Namespace) -> int:
    for name in example_names():
        wf = load_workload(example_path(name))
        print(f"{name}\t{wf.description}")
    return 0


def _finish(result: Result, args: argparse.Namespace, after_summary: Callable[[], None] | None = None) -> int:
    """Print the summary (then whatever ``after_summary`` prints) and write ``--json``/``--gantt``."""
    print(result.summary())
    if after_summary is not None:
        after_summary()
    if args.json:
        with writing_output(args.json, "--json"):
            result.to_json(args.json)
        print(f"\nwrote {args.json}")
    if args.gantt:
        if result.plan is None or result.evaluation is None:
            print(f"rpeg: no plan, so no Gantt chart written to {args.gantt}", file=sys.stderr)
        else:
            with writing_output(args.gantt, "--gantt"):
                written = result.gantt(args.gantt)
            print(f"wrote {written}")
    return EXIT_INFEASIBLE if result.plan is None else 0


# ---------------------------------------------------------------------------- solve
def _ablations(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ValueError(
            f"--ablate: unknown ablation(s) {', '.join(repr(n) for n in unknown)}; "
            f"known: {', '.join(ABLATIONS)}"
        )
    return names


def _method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The method-specific options given on the command line, checked against ``--method``
    (``solve`` rejects options a method does not take, so they are never passed to it)."""
    given = {k: getattr(args, k) for k in METHOD_FLAGS if getattr(args, k) is not None}
    wrong = [k for k in given if args.method not in METHOD_FLAGS[k][1]]
    if wrong:
        takers = sorted({m for k in wrong for m in METHOD_FLAGS[k][1]})
        flags = ", ".join(METHOD_FLAGS[k][0] for k in wrong)
        raise ValueError(
            f"{flags} only appl{'ies' if len(wrong) == 1 else 'y'} to --method "
            f"{' or '.join(takers)}, not {args.method!r}"
        )
    if given.get("warm_start") == "none":
        given["warm_start"] = None
    if given.get("candidates") == 0:  # --candidates 0: the whole directories
        given["candidates"] = None
    elif "candidates" in given and given["candidates"] < 0:
        raise ValueError(f"--candidates must be ≥ 0 (0 = all strategies), got {given['candidates']}")
    for key in ("max_evaluations", "workers", "threads"):
        if key in given and given[key] < 1:
            raise ValueError(f"{METHOD_FLAGS[key][0]} must be a positive integer, got {given[key]}")
    for key in ("t_init", "t_warm"):
        if key in given and not given[key] > 0:
            raise ValueError(f"{METHOD_FLAGS[key][0]} must be positive, got {given[key]}")
    if "ablate" in given:
        given["ablate"] = _ablations(given["ablate"])
    return given


def _problem_kwargs(args: argparse.Namespace, wf: WorkloadFile) -> dict[str, Any]:
    """The settings every method shares (so the comparison scores plans on equal terms)."""
    kwargs = {
        "time_limit": args.time_limit,
        "seed": args.seed,
        "k_eval": args.k_eval if args.k_eval is not None else wf.k_eval,
        "objective": args.objective,
    }
    if args.delta is not None:  # only with --objective throughput-util (_only_with); else solve's δ
        kwargs["delta"] = args.delta
    return kwargs


def _only_with(flag: str, given: bool, ok: bool, needs: str, got: str = "") -> None:
    """Refuse ``flag`` when it was given without the setting it only matters with: ``needs``
    (another flag and its value), ``got`` what was given instead. Such a flag would do nothing.

    Raises
    ------
    InputError
        ``"--delta only applies with --objective throughput-util, not --objective throughput"``.
    """
    if given and not ok:
        raise InputError(f"{flag} only applies with {needs}" + (f", not {got}" if got else ""), source=flag)


@contextmanager
def _live_progress(enabled: bool) -> Iterator[Callable[[dict[str, Any]], None] | None]:
    """A ``progress`` callback drawing a rich progress display on stderr, or ``None`` when off.

    Two lines: a bar over the larger used share of the time and evaluation budgets with the
    budget spent and the elapsed time; then the structural candidate being searched,
    evaluations/s and the best throughput so far.
    """
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    stats = Text("  building the search spaces…", style="dim")

    class _SearchProgress(Progress):
        def get_renderables(self):  # the bar, then one line of live figures under it
            yield self.make_tasks_table(self.tasks)
            yield stats

    progress = _SearchProgress(
        SpinnerColumn(),
        TextColumn("[bold]sa[/]"),
        BarColumn(bar_width=30),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[budget]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        refresh_per_second=4,
    )
    task = progress.add_task("sa", total=1.0, budget="")

    def update(p: dict[str, Any]) -> None:
        seconds, evaluations = p.get("time_limit"), p.get("max_evaluations")
        done, parts = 0.0, []
        if seconds:
            done = max(done, p["elapsed"] / seconds)
            parts.append(f"{p['elapsed']:.1f}/{seconds:g} s")
        if evaluations:
            done = max(done, p["evaluations"] / evaluations)
            parts.append(f"{p['evaluations']:,}/{evaluations:,} evals")
        else:
            parts.append(f"{p['evaluations']:,} evals")
        progress.update(task, completed=min(1.0, done), budget=" · ".join(parts))
        best = p.get("best_throughput") or 0.0
        stats.plain = ""
        stats.style = ""
        stats.append(f"  {p.get('structure') or '…'}", style="cyan")
        stats.append(f" · {p.get('evals_per_s', 0.0):,.0f} evals/s · best ")
        stats.append(f"{best:,.0f} tokens/s" if best else "—", style="bold green")

    with progress:
        yield update


def _comparison(result: Result, wf: WorkloadFile, cluster: Cluster, args: argparse.Namespace) -> None:
    """Print the baselines and ``result`` side by side: a rich table on stdout (plain when piped)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    rows: list[tuple[str, Result]] = []
    try:
        for name in BASELINES:
            rows.append((name, solve(wf.workload, cluster, method=name, **_problem_kwargs(args, wf))))
    except KeyboardInterrupt:
        print("\n(comparison interrupted)")
    rows.append((result.method, result))
    concurrent = next((r for n, r in rows if n == "concurrent" and r.feasible), None)

    table = Table(
        title=f"comparison on {cluster.shape_str} × {cluster.hardware.name}, k_eval={result.k_eval}",
        caption=f"peak: fullest GPU; M_eff {cluster.hardware.m_eff / GIB:.1f} GiB; conc. = concurrent",
        box=box.SIMPLE_HEAVY,
        show_edge=False,
        pad_edge=False,
    )
    # two-line headers keep the table inside 80 columns with every cell whole
    table.add_column("method", no_wrap=True)
    for head in ("tokens/s", "vs\nconc.", "makespan\ns", "util.", "peak\nGiB", "of\nM_eff"):
        table.add_column(head, justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for name, r in rows:
        ev = r.evaluation
        if r.plan is None or ev is None:
            table.add_row(name, "—", "—", "—", "—", "—", "—", "no feasible plan")
            continue
        table.add_row(
            name,
            f"{ev.throughput:,.0f}",
            f"{ev.throughput / concurrent.throughput - 1:+.1%}" if concurrent else "—",
            f"{ev.makespan:.3f}",
            f"{ev.utilization:.1%}",
            f"{ev.memory.max_peak / GIB:.1f}",
            f"{ev.memory.ratio:.0%}",
            r.status.value,
        )
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 100)
    console.print()
    console.print(table)


def _cmd_solve(args: argparse.Namespace) -> int:
    _check_outputs(args)
    if args.method not in METHODS:
        raise InputError(f"--method: unknown method {args.method!r}; known: {', '.join(sorted(METHODS))}")
    objective, util = f"--objective {args.objective}", args.objective == "throughput-util"
    _only_with("--delta", args.delta is not None, util, "--objective throughput-util", objective)
    for flag, given in (("--no-progress", args.no_progress), ("--no-compare", args.no_compare)):
        _only_with(flag, given, args.method == "sa", "--method sa", f"--method {args.method}")
    wf = _workload_file(args.workload)
    cluster = _cluster(wf, args)
    options = _method_options(args)
    searching = args.method == "sa"
    with _live_progress(searching and not args.no_progress and sys.stderr.isatty()) as progress:
        if progress is not None:
            options["progress"] = progress
        # Ctrl-C inside the search ends it with the best plan so far (status time_limit)
        result = solve(wf.workload, cluster, method=args.method, **_problem_kwargs(args, wf), **options)
    if not searching or args.no_compare:
        return _finish(result, args)
    return _finish(result, args, lambda: _comparison(result, wf, cluster, args))


# ---------------------------------------------------------------------------- evaluate
def _mismatch(plan_doc: dict[str, Any], wf: WorkloadFile, cluster: Cluster) -> str | None:
    """The first field in which the plan file's workload or cluster differs from the one asked for."""
    mine = wf.workload.to_dict()
    theirs = plan_doc.get("workload", {})
    for key, value in mine.items():
        if key != "name" and key in theirs and theirs[key] != value:
            return f"workload.{key} is {_brief(theirs[key])} in the plan file but {_brief(value)} in {wf.workload.name!r}"
    c = plan_doc.get("cluster", {})
    shape = (c.get("racks"), c.get("nodes_per_rack"), c.get("gpus_per_node"))
    if None not in shape and shape != cluster.shape:
        return f"the plan file's cluster is {'x'.join(map(str, shape))}, not {cluster.shape_str}"
    return None


def _hardware_differences(plan_hw: Any, hw: Any, shown: int = 3) -> str:
    """The figures in which the plan file's hardware differs from ``hw``, each with both values
    (``"peak_flops is 1e+14 in the plan file but 6.93e+14 here"``; notes and sources aside)."""

    def walk(a: Any, b: Any, path: str) -> list[str]:
        if isinstance(a, dict) and isinstance(b, dict):
            keys = list(a) + [k for k in b if k not in a]
            return [d for k in keys for d in walk(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))]
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return [d for i, (x, y) in enumerate(zip(a, b)) for d in walk(x, y, f"{path}[{i}]")]
        return [] if a == b else [f"{path} is {_brief(a)} in the plan file but {_brief(b)} here"]

    mine, theirs = hw.to_dict(), plan_hw.to_dict()
    for key in ("notes", "sources"):  # not figures (Hardware's equality leaves them out too)
        mine.pop(key, None)
        theirs.pop(key, None)
    found = walk(theirs, mine, "")
    more = f" (and {len(found) - shown} more)" if len(found) > shown else ""
    return ", ".join(found[:shown]) + more if found else "the same figures"


def _brief(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cmd_evaluate(args: argparse.Namespace) -> int:
    _check_outputs(args)
    wf = _workload_file(args.workload)
    doc = read_json(args.plan, "--plan file")
    if not isinstance(doc, dict) or "plan" not in doc:
        raise InputError(f"--plan {args.plan}: missing field 'plan'", source=args.plan, field="plan")
    if "format" in doc and doc["format"] not in READ_FORMATS:
        raise InputError(
            f"--plan {args.plan}: field 'format' must be one of {', '.join(map(repr, READ_FORMATS))}, "
            f"got {doc['format']!r}"
        )
    check_plan_document(doc, f"--plan {args.plan}")  # its blocks' form, before _mismatch reads them
    cluster = _cluster(wf, args)
    why = _mismatch(doc, wf, cluster)
    if why:
        raise InputError(
            f"--plan {args.plan} was made for another problem: {why}; solve {args.workload} again, "
            "or evaluate the plan against the workload and cluster it was made for",
            source=args.plan,
        )
    hardware_note = ""
    if {"structure", "cluster"} <= doc.keys():
        _, plan_cluster, structure = problem_from_dict(doc, source=f"--plan {args.plan}")
        if plan_cluster.hardware != cluster.hardware:
            diff = _hardware_differences(plan_cluster.hardware, cluster.hardware)
            if args.hardware is None and args.rollout_scheduling is None:
                raise InputError(
                    f"--plan {args.plan} was made for other hardware than the workload's "
                    f"{cluster.hardware.name!r}: {diff}; pass --hardware (or --rollout-scheduling) to "
                    "re-score it deliberately",
                    source=args.plan,
                )
            hardware_note = (
                f"re-scored on {cluster.hardware.name}; the plan was made for "
                f"{plan_cluster.hardware.name} ({diff})"
            )
    else:
        structure = problem_from_dict(doc, source=f"--plan {args.plan}")[2] if "structure" in doc else None
    k_eval = args.k_eval if args.k_eval is not None else doc.get("k_eval", wf.k_eval)
    if isinstance(k_eval, bool) or not isinstance(k_eval, int) or k_eval < 1:
        raise InputError(f"--plan {args.plan}: field 'k_eval' must be a positive integer, got {k_eval!r}")
    ev = Evaluator(wf.workload, cluster, structure, k_eval=k_eval)
    try:
        plan = plan_from_entries(ev, doc["plan"])
    except ValueError as exc:
        raise InputError(f"--plan {args.plan}: {exc}", source=args.plan, field="plan") from None
    evaluation = ev.evaluate(plan, keep=True)
    status = Status.FEASIBLE if evaluation.feasible else Status.INFEASIBLE
    notes = [hardware_note] if hardware_note else []
    if not evaluation.feasible:
        notes.append("the plan exceeds M_eff on some GPU (see peak mem)")
    result = Result.scored(
        ev, plan, status, "evaluate", runtime_s=0.0, evaluation=evaluation, message="; ".join(notes)
    )
    return _finish(result, args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .runtime.calibrate.measure import calibrate

    def say(msg: str) -> None:
        print(f"calibrate: {msg}", file=sys.stderr, flush=True)

    check_output(args.out, "--out", (".json",))  # before minutes of measuring, not after
    check_output(args.raw, "--raw", (".json",))
    load_hardware(args.base)  # a bad --base is named now, too
    if args.max_ranks < 2:
        raise InputError(f"--max-ranks must be at least 2, got {args.max_ranks}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be a positive integer, got {args.threads}")
    asked = {n.strip() for n in args.engines.split(",") if n.strip()} - {"none"}
    if args.in_situ and not asked:
        raise InputError(
            "--in-situ scales the engine terms: it needs --engines torch or torch,vllm, not none"
        )
    if args.in_situ and "torch" not in asked:
        raise InputError(
            f"--in-situ runs the runtime's torch engine for inference and training: --engines {args.engines} "
            "must include torch"
        )
    _only_with("--in-situ-steps", args.in_situ_steps is not None, args.in_situ, "--in-situ")
    _only_with(
        "--alone", args.alone, bool(asked), "--engines torch or torch,vllm", f"--engines {args.engines}"
    )
    in_situ_steps = IN_SITU_STEPS if args.in_situ_steps is None else args.in_situ_steps
    if in_situ_steps < 2:
        raise InputError(f"--in-situ-steps must be at least 2 (step 0 is warm-up), got {in_situ_steps}")
    engines = _calibration_engines(args.engines, args.device)
    report = calibrate(
        device=args.device,
        base=args.base,
        quick=args.quick,
        max_ranks=args.max_ranks,
        seed=args.seed,
        threads=args.threads,
        progress=None if args.no_progress else say,
    )
    print(report.summary() if args.brief else report.table())
    hardware, raw = report.hardware, report.to_dict()
    if engines:
        from .runtime.calibrate.engine_terms import calibrate_engines
        from .runtime.driver.engine_output import engine_output_to

        log = Path(args.out).with_suffix(".engines.log")
        insitu = None
        with engine_output_to(log) as console:

            def tell(msg: str) -> None:
                print(f"calibrate: {msg}", file=console, flush=True)

            engine_report = calibrate_engines(
                hardware,
                engines=engines,
                quick=args.quick,
                seed=args.seed,
                load=not args.alone,
                progress=None if args.no_progress else tell,
            )
            if args.in_situ:
                from .runtime.calibrate.insitu import calibrate_in_situ

                insitu = calibrate_in_situ(
                    engine_report.hardware,
                    steps=in_situ_steps,
                    seed=args.seed,
                    devices=min(2, _usable_cores()),
                    progress=None if args.no_progress else tell,
                )
        gap = "" if args.brief else "\n"
        print(f"{gap}what the engines printed (vLLM, torch, Ray): {log}{gap}")
        print(engine_report.summary() if args.brief else engine_report.table())
        hardware, raw["engines"] = engine_report.hardware, engine_report.to_dict()
        if insitu is not None:
            print(insitu.summary() if args.brief else f"\n{insitu.table()}")
            hardware, raw["in_situ"] = insitu.hardware, insitu.to_dict()
    with writing_output(args.out, "--out"):
        hardware.save(args.out)
    print(f"{'' if args.brief else chr(10)}wrote {args.out}")
    if args.raw:
        with writing_output(args.raw, "--raw"):
            Path(args.raw).write_text(json.dumps(raw, indent=2, default=float) + "\n")
        print(f"wrote {args.raw}")
    return 0


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one, else the count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _calibration_engines(value: str, device: str) -> tuple[str, ...]:
    """``--engines``: a comma list of ``torch`` and ``vllm``, or ``none``.

    Raises
    ------
    InputError
        For another name, an engine with ``--device cuda`` (the engine runs are CPU-only here), or
        ``vllm`` when vLLM is not installed (naming the extra to install).
    """
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in ("torch", "vllm")]
    if bad or not names:
        raise InputError(f"--engines: expected 'none' or a comma list of torch, vllm; got {value!r}")
    if device != "cpu":
        raise InputError(
            f"--engines {value}: the engine calibration runs the CPU runtime's workers; with --device "
            f"{device} pass --engines none (GPU engine calibration is not implemented)"
        )
    if "vllm" in names:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise InputError(
                "--engines includes vllm, but vLLM is not installed (pip install 'rpeg[engines]'); "
                "pass --engines torch to calibrate without it"
            )
    return names


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    """Add ``rpeg calibrate --out HW.json [--quick] [--device cpu|cuda] [--base PRESET]
    [--max-ranks N] [--seed N] [--threads N] [--engines torch,vllm|none] [--alone] [--in-situ]
    [--in-situ-steps N] [--raw RAW.json] [--no-progress] [--brief]`` to ``sub`` (the measuring:
    :mod:`rpeg.runtime.calibrate.measure` and
    :mod:`rpeg.runtime.calibrate.engine_terms`, :mod:`rpeg.runtime.calibrate.insitu`; the fits:
    :mod:`rpeg.costmodel.fit`)."""
    from .runtime.calibrate.measure import DEVICES

    c = sub.add_parser("calibrate", help="measure this machine and write a hardware JSON file")
    c.add_argument(
        "--out",
        required=True,
        metavar="HW.json",
        help="hardware file to write (rpeg.hardware/2); what the engines print while they are timed "
        "goes to HW.engines.log beside it",
    )
    c.add_argument("--quick", action="store_true", help="reduced sweep that runs in seconds")
    c.add_argument(
        "--device", default="cpu", choices=list(DEVICES), help="cpu (gloo) or cuda (NCCL, untested)"
    )
    c.add_argument(
        "--base",
        default="cpu",
        metavar="PRESET|FILE.json",
        help="figures not measurable here (tiers 1-2, CPU memory); with --device cuda pass the GPU's preset",
    )
    c.add_argument(
        "--max-ranks", type=int, default=4, metavar="N", help="collectives for p = 2..N (default 4)"
    )
    c.add_argument("--seed", type=seed_flag, default=0)
    c.add_argument("--threads", type=int, metavar="N", help="torch threads while measuring (CPU default 1)")
    c.add_argument(
        "--engines",
        default="torch,vllm",
        metavar="LIST",
        help="time the runtime's engines too and fit their terms: a comma list of torch, vllm, or none "
        "(default torch,vllm; minutes)",
    )
    c.add_argument(
        "--alone",
        action="store_true",
        help="time the engines with the other cores idle (default: a training loop on each other core, "
        "as when every device of a plan computes)",
    )
    c.add_argument(
        "--in-situ",
        action="store_true",
        help="after the engine stage, run two calibration plans through the runtime (Ray workers, the "
        "engines) and scale each operation class's engine terms to what they measured "
        "(rpeg.runtime.calibrate.insitu; minutes)",
    )
    c.add_argument(
        "--in-situ-steps",
        type=int,
        default=None,
        metavar="N",
        help=f"with --in-situ: steps per calibration plan (default {IN_SITU_STEPS}; the first is warm-up)",
    )
    c.add_argument("--raw", metavar="RAW.json", help="also write every sample and fit (rpeg.calibration/1)")
    c.add_argument("--no-progress", action="store_true", help="no stage messages on stderr")
    c.add_argument(
        "--brief",
        action="store_true",
        help="a few summary lines instead of the tables (every figure is in OUT, every sample in --raw)",
    )
    c.set_defaults(fn=_cmd_calibrate)


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
        sp.add_argument("--json", metavar="OUT.json", help="write the rpeg.result/2 file here")
        sp.add_argument("--gantt", metavar="PLAN.png", help="draw the predicted schedule (.png, .pdf, .svg)")
        sp.add_argument(
            "--k-eval",
            type=positive_int,
            default=None,
            help="steps to unroll when scoring (default: the workload file's k_eval, else 8)",
        )
        sp.add_argument(
            "--generation-max-pp",
            type=positive_int,
            default=None,
            metavar="N",
            help="largest pipeline degree of generation (1 for vLLM's CPU build: rpeg run --rollout-engine vllm)",
        )
        sp.add_argument(
            "--max-zero-stage",
            type=int,
            choices=[1, 2, 3],
            default=None,
            metavar="Z",
            help="largest ZeRO stage of training and forward passes (2 for the bundled torch engine: rpeg run)",
        )
        sp.add_argument(
            "--rollout-scheduling",
            choices=["async", "sync"],
            default=None,
            help="the rollout engine's scheduling on GPU hardware: async (the bundled vLLM's default, "
            "the presets') or sync (an older vLLM's loop, which exposes every step's host time); "
            "default: the hardware's",
        )
        sp.add_argument(
            "--no-host-offload",
            dest="host_offload",
            action="store_false",
            help="the engines cannot keep state in host memory between runs (the bundled CPU engines: rpeg run)",
        )
        for name, what in (
            ("sequence", "split the non-tensor-parallel regions over the TP ranks (Megatron SP)"),
            ("context", "split sequences over ranks (ring or Ulysses attention)"),
            ("expert", "shard a mixture of experts' routed experts over ranks"),
            ("virtual-pipeline", "interleave the pipeline (vp model chunks per stage, Megatron-core)"),
        ):
            sp.add_argument(
                f"--no-{name}-parallel",
                dest=f"{name.replace('-', '_')}_parallel",
                action="store_false",
                help=f"the engines do not {what} (the bundled torch engine: rpeg run)",
            )
        sp.add_argument(
            "--no-expert-overlap",
            dest="expert_overlap",
            action="store_false",
            help="the training engine runs the expert-parallel AlltoAlls in line, not under another "
            "microbatch's compute (Megatron-core overlaps them; the bundled torch engine: rpeg run)",
        )
        sp.add_argument(
            "--no-flex-dispatch",
            dest="flex_dispatch",
            action="store_false",
            help="the training engine dispatches tokens to the experts with AlltoAlls only, once per expert "
            "(without DeepEP or HybridEP, Megatron-core's flex dispatcher; the bundled torch engine: rpeg run)",
        )

    s = sub.add_parser("solve", help="plan a workload")
    common(s)
    s.add_argument("--method", default="concurrent", help=f"one of {', '.join(sorted(METHODS))}")
    s.add_argument("--time-limit", type=seconds, default=None, help="seconds, for searching methods")
    s.add_argument("--seed", type=seed_flag, default=0)
    s.add_argument("--objective", default="throughput", choices=["throughput", "throughput-util"])
    s.add_argument(
        "--delta", type=float, default=None, help="δ ∈ (0, 1] of the throughput-util objective (default 0.1)"
    )
    s.add_argument("--max-evaluations", type=int, metavar="N", help="sa: budget in uncached plan evaluations")
    s.add_argument("--workers", type=int, metavar="N", help="sa: processes evaluating proposals (default 1)")
    s.add_argument(
        "--ablate", metavar="a,b,...", help=f"sa: mechanisms to switch off: {', '.join(ABLATIONS)}"
    )
    s.add_argument(
        "--t-init", type=float, metavar="T", help="sa: temperature of each structure's first chain"
    )
    s.add_argument("--t-warm", type=float, metavar="T", help="sa: temperature of warm-restarted chains")
    s.add_argument(
        "--candidates",
        type=int,
        metavar="K",
        help="cpsat/milp: the K fastest strategies per invocation at every origin (0 = all; default 3)",
    )
    s.add_argument("--threads", type=int, metavar="N", help="cpsat/milp: solver threads")
    s.add_argument("--solver", metavar="NAME", help="milp: highs (default), cbc, scip, gurobi, ...")
    s.add_argument(
        "--warm-start",
        choices=["concurrent", "sa", "none"],
        help="cpsat/milp: plan that hints the solver (default concurrent)",
    )
    s.add_argument("--no-progress", action="store_true", help="sa: no live progress bar on stderr")
    s.add_argument("--no-compare", action="store_true", help="sa: skip the greedy/concurrent comparison")
    s.set_defaults(fn=_cmd_solve)

    e = sub.add_parser("evaluate", help="score a given plan")
    common(e)
    e.add_argument("--plan", required=True, help="a result JSON file (its plan and structure are used)")
    e.set_defaults(fn=_cmd_evaluate)

    from .runtime.cli import register_cli as _run_cli
    from .runtime.trace.verify import register_cli as _verify_cli

    _run_cli(sub)
    _verify_cli(sub)
    _add_calibrate(sub)

    j = sub.add_parser(
        "project", help="solve a project-scheduling instance (PSPLIB .sm/.mm) exactly or greedily"
    )
    j.add_argument("instance", help="PSPLIB file: .sm (single mode) or .mm (multi mode)")
    j.add_argument("--method", default="cpsat", choices=["cpsat", "milp", "list"])
    j.add_argument("--solver", default=None, help="milp: highs (default), cbc, scip, gurobi, ...")
    j.add_argument("--time-limit", type=seconds, default=None, help="seconds (default: until proven)")
    j.add_argument("--threads", type=positive_int, default=None, help="cpsat/milp: solver threads")
    j.add_argument("--seed", type=seed_flag, default=0)
    j.set_defaults(fn=_cmd_project)
    return p


def _cmd_project(args: argparse.Namespace) -> int:
    from .formulations import read_mm, read_sm, solve_cpsat, solve_milp
    from .formulations.project_schedule import check_project_schedule, list_schedule_project

    method = f"--method {args.method}"
    _only_with("--solver", args.solver is not None, args.method == "milp", "--method milp", method)
    _only_with("--threads", args.threads is not None, args.method != "list", "--method cpsat or milp", method)
    path = require_file(args.instance, "instance file")
    if path.suffix not in (".sm", ".mm"):
        raise ValueError(f"instance {args.instance!r}: expected a PSPLIB .sm or .mm file")
    project = read_sm(path) if path.suffix == ".sm" else read_mm(path)
    common = {"time_limit": args.time_limit, "seed": args.seed, "threads": args.threads}
    if args.method == "cpsat":
        sol = solve_cpsat(project, **common)
    elif args.method == "milp":
        sol = solve_milp(project, solver=args.solver or "highs", **common)
    else:
        sol = list_schedule_project(project)
    print(f"instance   {path.name} ({len(project.activities)} activities)")
    print(f"method     {sol.solver}   status {sol.status}   {sol.runtime:.2f} s")
    gap = ""
    if sol.has_schedule and sol.lower_bound and sol.makespan > sol.lower_bound:
        gap = f"   gap {(sol.makespan - sol.lower_bound) / sol.makespan:.1%}"
    print(f"makespan   {sol.makespan}   lower bound {sol.lower_bound}{gap}")
    if sol.message:
        print(f"note       {sol.message}")
    if sol.has_schedule:
        problems = check_project_schedule(project, sol)
        print("schedule   " + ("valid" if not problems else "INVALID: " + "; ".join(problems[:3])))
    return 0 if sol.has_schedule else EXIT_INFEASIBLE


def main(argv: list[str] | None = None) -> int:
    """Run the CLI.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status: 0 a plan was found, 2 bad input, 3 no memory-feasible plan, 4 a run failed
        (``rpeg run``: a lost worker; the trace is written up to the failure), 130 interrupted
        before any plan existed (``rpeg run``: interrupted by SIGINT, 143 by SIGTERM; the trace
        is written up to the interruption), 141 the reader of standard output left before the end (as a
        POSIX tool killed by SIGPIPE, but quietly: a closed pipe is not an error).
    """
    try:
        try:
            args = _parser().parse_args(argv)
        finally:
            sys.stdout.flush()  # argparse's --help: a reader that left shows here, not at exit
        status = args.fn(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:  # before OSError: `rpeg examples | head -1`
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except ValueError as exc:  # InputError and every other value a user gave wrongly
        print(f"rpeg: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # a path the user named: unreadable, a folder, a full disk
        print(f"rpeg: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rpeg: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _drop_stdout() -> None:
    """Point standard output at the null device once its reader has left, so that what is still
    buffered does not fail again at exit (the recipe of Python's ``signal`` documentation,
    "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
