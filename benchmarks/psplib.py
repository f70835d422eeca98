"""PSPLIB j30 (single-mode RCPSP, 480 instances): CP-SAT, the time-indexed MILP (HiGHS) and the
project list scheduler against the published optima (issue: project-scheduling core).

Protocol: the same instances for every engine, in PSPLIB order (``j301_1``, ``j301_2``, …,
``j3048_10``); a fixed seed; each exact engine gets the list scheduler's schedule as its hint (as
the package's front door does) and ``--limit`` seconds of wall clock, model building included;
``--threads`` solver threads each and ``--workers`` instances at a time. Every returned schedule is
re-checked by :func:`rpeg.formulations.project_schedule.check_project_schedule`, and a proven
optimum that differs from the published one is counted as an error.

Per engine: share of instances proven optimal, share whose makespan equals the published optimum,
mean and max gap ``(C_max - C*) / C*`` over the instances with a schedule, time per instance.

Run from the repository root::

    python benchmarks/psplib.py --limit 10 --engines cpsat,milp,list --instances 480 \\
        --milp-instances 48 --workers 1 --threads 1

The data are read from ``../shared/data/psplib`` relative to the repository root; without them
the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

from rpeg.formulations import read_mm, read_optima, read_sm, solve_cpsat, solve_milp
from rpeg.formulations.project_schedule import check_project_schedule, list_schedule_project

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "psplib"
RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- psplib:begin -->", "<!-- psplib:end -->"
SETS = {  # name: (folder, file pattern, reader, optimum file)
    "j30": ("j30.sm", "*.sm", read_sm, "optimum.csv"),
    "j20mm": ("j20.mm", "j20*_*.mm", read_mm, "j20opt.mm"),
}
ENGINES = ("cpsat", "milp", "list")


def instance_key(path: Path) -> tuple[int, int]:
    """PSPLIB order: ``j30{parameter}_{instance}`` by parameter, then instance."""
    m = re.match(r"j\d\d(\d+)_(\d+)", path.stem)
    assert m is not None, path
    return int(m.group(1)), int(m.group(2))


def run_one(task: tuple[str, str, str, float, int, int]) -> dict:
    """Solve one (engine, instance); returns one CSV row."""
    engine, set_name, path, limit, seed, threads = task
    reader = SETS[set_name][2]
    project = reader(path)
    hint = list_schedule_project(project)
    if engine == "list":
        sol = hint
    elif engine == "cpsat":
        sol = solve_cpsat(project, time_limit=limit, seed=seed, threads=threads, hint=hint)
    else:
        sol = solve_milp(project, time_limit=limit, seed=seed, threads=threads, hint=hint)
    errors = check_project_schedule(project, sol)
    return {
        "engine": engine,
        "instance": project.name,
        "status": sol.status.value,
        "makespan": sol.makespan,
        "lower_bound": sol.lower_bound,
        "runtime": sol.runtime,
        "hint": hint.makespan,
        "errors": "; ".join(errors),
    }


def summarise(rows: list[dict], optima: dict[str, int]) -> dict:
    n = len(rows)
    proven = [r for r in rows if r["status"] == "optimal"]
    wrong = [r for r in proven if r["makespan"] != optima[r["instance"]]]
    with_schedule = [r for r in rows if r["makespan"] != float("inf")]
    gaps = [(r["makespan"] - optima[r["instance"]]) / optima[r["instance"]] for r in with_schedule]
    times = [r["runtime"] for r in rows]
    return {
        "n": n,
        "proven": len(proven),
        "at_optimum": sum(1 for r in with_schedule if r["makespan"] == optima[r["instance"]]),
        "no_schedule": n - len(with_schedule),
        "time_limit": sum(1 for r in rows if r["status"] == "time_limit"),
        "wrong_optimum": len(wrong),
        "invalid": sum(1 for r in rows if r["errors"]),
        "below_optimum": sum(1 for r in with_schedule if r["makespan"] < optima[r["instance"]]),
        "mean_gap": statistics.fmean(gaps) if gaps else float("nan"),
        "max_gap": max(gaps) if gaps else float("nan"),
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "total_s": sum(times),
    }


def pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "—"


def table(summaries: dict[str, dict]) -> list[str]:
    lines = [
        "| engine | instances | proven optimal | makespan = published optimum | mean gap | max gap | "
        "no schedule | mean s | median s | max s | invalid schedules | wrong proofs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for engine, s in summaries.items():
        lines.append(
            f"| {engine} | {s['n']} | {s['proven']} ({pct(s['proven'], s['n'])}) | "
            f"{s['at_optimum']} ({pct(s['at_optimum'], s['n'])}) | {100 * s['mean_gap']:.2f}% | "
            f"{100 * s['max_gap']:.1f}% | {s['no_schedule']} | {s['mean_s']:.2f} | {s['median_s']:.2f} | "
            f"{s['max_s']:.2f} | {s['invalid']} | {s['wrong_optimum']} |"
        )
    return lines


def write_section(lines: Iterable[str]) -> None:
    """Replace (or append) this benchmark's section of RESULTS.md."""
    section = "\n".join([BEGIN, *lines, END])
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=float, default=10.0, help="seconds per instance and exact engine")
    ap.add_argument("--engines", default="cpsat,milp,list", help="comma-separated subset of cpsat,milp,list")
    ap.add_argument("--instances", type=int, default=480, help="the first N instances in PSPLIB order")
    ap.add_argument(
        "--milp-instances",
        type=int,
        default=None,
        help="MILP only on M of the N instances, evenly spaced in PSPLIB order (default: all N)",
    )
    ap.add_argument("--workers", type=int, default=1, help="instances solved at a time (processes)")
    ap.add_argument("--threads", type=int, default=1, help="solver threads per instance")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", default="j30", choices=sorted(SETS), help="instance set")
    ap.add_argument("--csv", type=Path, default=None, help="also write the per-instance rows here")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update RESULTS.md")
    args = ap.parse_args(argv)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        ap.error(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES)}")
    folder, pattern, _, opt_file = SETS[args.set]
    data = DATA / folder
    if not data.is_dir():
        print(f"PSPLIB data not found at {data}: skipping the benchmark.")
        return 0
    optima = read_optima(data / opt_file)
    files = sorted((p for p in data.glob(pattern) if p.stem in optima), key=instance_key)[: args.instances]
    milp_files = files
    if args.milp_instances is not None and args.milp_instances < len(files):
        # every (N/M)-th instance: with N = 480 and M = 48, instance 1 of every parameter set
        milp_files = [files[(k * len(files)) // args.milp_instances] for k in range(args.milp_instances)]
    n_milp = len(milp_files)
    tasks = []
    for engine in engines:
        chosen = milp_files if engine == "milp" else files
        tasks += [(engine, args.set, str(f), args.limit, args.seed, args.threads) for f in chosen]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t0 = time.perf_counter()
    rows: list[dict] = []
    if args.workers <= 1:
        for k, task in enumerate(tasks, 1):
            rows.append(run_one(task))
            r = rows[-1]
            print(
                f"[{k}/{len(tasks)}] {r['engine']:5s} {r['instance']:9s} {r['status']:10s} "
                f"{r['makespan']:>5} (opt {optima[r['instance']]}) {r['runtime']:.2f}s {r['errors']}",
                flush=True,
            )
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            rows = list(pool.map(run_one, tasks, chunksize=1))
    wall = time.perf_counter() - t0
    summaries = {e: summarise([r for r in rows if r["engine"] == e], optima) for e in engines}
    if "milp" in engines and n_milp < len(files):
        # the other engines on the MILP's instances, for a like-for-like comparison
        subset = {f.stem for f in milp_files}
        for e in engines:
            if e != "milp":
                sub = [r for r in rows if r["engine"] == e and r["instance"] in subset]
                summaries[f"{e} (MILP's {n_milp})"] = summarise(sub, optima)
    lines = table(summaries)
    print("\n".join(lines))
    print(f"wall {wall:.0f} s")
    if args.csv is not None:
        with args.csv.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.no_write:
        return 0
    cmd = "python benchmarks/psplib.py " + " ".join(sys.argv[1:] if argv is None else argv)
    unproven = {
        e: sorted(
            (r for r in rows if r["engine"] == e and r["status"] != "optimal"),
            key=lambda r: instance_key(Path(r["instance"])),
        )
        for e in engines
        if e != "list"
    }
    section = [
        f"## PSPLIB {args.set}: CP-SAT, time-indexed MILP (HiGHS) and the project list scheduler",
        "",
        f"Command: `{cmd}` — {date.today().isoformat()}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs (1-min load average "
        f"{load:.1f} at the start), {args.workers} instance(s) at a time, {args.threads} solver "
        f"thread(s) each; wall clock {wall / 60:.0f} min.",
        "",
        f"Instances: the first {len(files)} of {args.set} in PSPLIB order"
        + (
            f"; the MILP ran on {n_milp} of them, every {len(files) // n_milp}th "
            f'({", ".join(f.stem for f in milp_files[:3])}, …), and the rows marked "MILP\'s {n_milp}" '
            "restrict the other engines to the same instances"
            if "milp" in engines and n_milp < len(files)
            else ""
        )
        + f". Limit {args.limit:g} s per instance and exact engine, model building included; seed "
        f"{args.seed}; both exact engines start from the list scheduler's schedule as a hint (the "
        "MILP takes its makespan as the time horizon). Gap = (makespan − published optimum) / "
        "published optimum over the instances with a schedule; 'invalid schedules' counts the "
        "schedules the independent checker rejects and 'wrong proofs' the proven optima that differ "
        "from the published ones (both must be 0).",
        "",
        *lines,
        "",
    ]
    for e in engines:
        late = [r["runtime"] for r in rows if r["engine"] == e and r["runtime"] > args.limit + 0.5]
        if late:
            section.append(
                f"{e} ran past the limit by more than 0.5 s on {len(late)} instance(s), by at most "
                f"{max(late) - args.limit:.1f} s: the solver gets what remains of the limit after the "
                "model is built and stops at its next check."
            )
            section.append("")
    for e, rs in unproven.items():
        if rs:
            names = ", ".join(
                f"{r['instance']} ({r['status']}, {r['makespan']:g} vs {optima[r['instance']]})"
                for r in rs[:40]
            )
            more = f" and {len(rs) - 40} more" if len(rs) > 40 else ""
            section.append(f"Not proven by {e}: {names}{more}.")
            section.append("")
    write_section(section[:-1] if section[-1] == "" else section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
