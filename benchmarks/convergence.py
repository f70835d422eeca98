"""Convergence and run-to-run stability of the SA search (SPEC §13; RPEG paper §VIII-D, Fig. 12).

*Convergence.* PPO with actor = critic = reward of one size on the GH200 preset, Lp = 128,
Lr = 384: 7B on 256 GPUs (4x16x4, B = 1024), 13B on 512 (8x16x4, B = 1024), 34B on 1,024
(16x16x4, B = 2048), 70B on 2,048 (32x16x4, B = 2048). One search per configuration with a
wall-clock budget (``--horizon``; one configuration may get a longer ``--long-horizon``);
``result.extra["history"]`` gives the best throughput each time it improved, turned into the best
predicted makespan relative to the first plan of the search (the concurrent baseline, evaluated
first). Target: the best plan after 60 s within 2% of the long-horizon result. Because the search
shares its budget over the structural variants by successive halving, a reading of a long
run's curve at 60 s is not what a 60 s search would find; so each configuration also gets a
separate search whose whole budget is ``--checkpoint`` seconds, which decides the target; both are reported.

*Stability.* ``--stability-seeds`` seeds (default 20) of one configuration with an evaluation
budget (deterministic per seed, independent of load): coefficient of variation of the throughput
and the worst gap to the best seed. Targets (issue 15): CV ≤ 2% below 30,000 evaluations per run,
≤ 1% at 30,000. ``--stability-previous`` budgets also run the search as it was before issue 15
(``ablate=["structure_halving", "adaptive_moves"]``) in the same run, for comparison.

Time budgets make the convergence figures depend on the machine's load (printed).

Run from the repository root::

    python benchmarks/convergence.py [--part all|convergence|stability] [--horizon 120]
        [--long-horizon S] [--long-config 70B/2048] [--checkpoint 60]
        [--stability-evaluations 5000 [30000 ...]] [--stability-previous 5000 ...]
        [--stability-seeds 20] [--jobs 1]
        [--quick] [--no-write]

The convergence part writes the ``convergence`` section of RESULTS.md, the stability part the
``stability`` section.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _bench

import rpeg
from rpeg.ir import structures
from rpeg.solvers import clear_caches

CONFIGS = [  # label, topology, size, B; Lp = 128, Lr = 384
    ("7B/256", "4x16x4", "7b", 1024),
    ("13B/512", "8x16x4", "13b", 1024),
    ("34B/1024", "16x16x4", "34b", 2048),
    ("70B/2048", "32x16x4", "70b", 2048),
]
READINGS = (1, 10, 30, 60, 120, 300, 600, 1800, 3600)
PLOT = Path(__file__).with_name("convergence.png")
STAB_PLOT = Path(__file__).with_name("stability.png")


def problem(label: str):
    _, shape, size, B = next(c for c in CONFIGS if c[0] == label)
    return _bench.ppo(size, size, size, B, 128, 384, name=f"conv-{label}"), _bench.cluster(shape)


def best_at(history: list, t: float) -> float:
    """Best throughput found by time ``t`` (0 when nothing yet)."""
    tp = 0.0
    for s, _, x in history:
        if s <= t:
            tp = max(tp, x)
    return tp


#: What the "previous search" rows switch off: the budget allocation and move weighting the search
#: had before issue 15 (one turn per structure, the prior move weights).
PREVIOUS = ("structure_halving", "adaptive_moves")


def stability_target(evaluations: int) -> float:
    """Issue 15's CV target: 1% at 30,000 evaluations per run and more, 2% below."""
    return 0.01 if evaluations >= 30_000 else 0.02


def stability_run(job: tuple[str, int, int, tuple[str, ...]]) -> tuple[int, float, float]:
    label, seed, evaluations, ablate = job
    w, cl = problem(label)
    clear_caches()  # timed: as in a fresh process
    t0 = time.perf_counter()
    res = rpeg.solve(w, cl, method="sa", max_evaluations=evaluations, seed=seed, ablate=list(ablate))
    return seed, res.throughput if res.feasible else 0.0, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "convergence", "stability"), default="all")
    ap.add_argument(
        "--horizon", type=float, default=120.0, help="seconds per convergence search (default 120)"
    )
    ap.add_argument(
        "--long-horizon", type=float, default=None, help="seconds for --long-config (default: --horizon)"
    )
    ap.add_argument("--long-config", default="70B/2048", choices=[c[0] for c in CONFIGS])
    ap.add_argument(
        "--checkpoint", type=float, default=60.0, help="budget of the short searches (default 60)"
    )
    ap.add_argument("--configs", nargs="+", default=[c[0] for c in CONFIGS], choices=[c[0] for c in CONFIGS])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stability-config", default="7B/256", choices=[c[0] for c in CONFIGS])
    ap.add_argument(
        "--stability-evaluations", type=int, nargs="+", default=[5000], help="one or more budgets"
    )
    ap.add_argument("--stability-seeds", type=int, default=20)
    ap.add_argument(
        "--stability-previous",
        type=int,
        nargs="*",
        default=[5000],
        help="budgets at which the previous search (ablate=PREVIOUS) also runs, for a same-run comparison",
    )
    ap.add_argument(
        "--jobs", type=int, default=1, help="stability seeds run in parallel processes (default 1)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="30 s horizon, 10 s checkpoint, 1500-evaluation seeds"
    )
    ap.add_argument(
        "--no-write", action="store_true", help="print only; do not update RESULTS.md or the plots"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.horizon, args.checkpoint, args.stability_evaluations = 30.0, 10.0, [1500]
        args.long_horizon = None
    t_start = time.perf_counter()
    if args.part in ("all", "convergence"):
        convergence(args, argv)
    if args.part in ("all", "stability"):
        stability(args, argv)
    print(f"wall time {time.perf_counter() - t_start:.0f} s")
    return 0


def convergence_summary(gaps: list[tuple], reductions: list[float], checkpoint: float) -> str:
    """The plain sentence on the convergence target from the measured gaps
    ``(label, horizon, curve gap, separate-search gap, k, n)`` and makespan reductions."""
    if not gaps:
        return "no convergence runs"
    met = [g for g in gaps if g[3] is not None and g[3] <= 0.02]
    return (
        f"Convergence target (a search given {checkpoint:g} s within 2% of the horizon result; the horizon here "
        f"is what this machine allowed, not the paper's 3,600 s): met on {len(met)}/{len(gaps)} configurations ("
        + "; ".join(f"{g[0]} vs its {g[1]:g} s run: {_bench.pct(g[3])}" for g in gaps)
        + f"). Reading the long run's own curve at {checkpoint:g} s gives "
        + "; ".join(f"{g[0]} {_bench.pct(g[2])}" for g in gaps)
        + ": the search shares its budget over the structural variants by successive halving (its first "
        "round searches each once, in order, the later rounds the better half); the best plan's variant "
        "is "
        + ", ".join(f"variant {g[4]} of {g[5]}" for g in gaps)
        + " (same order as the configurations). Makespan "
        f"reduction against the first plan: {100 * min(reductions):.1f}–{100 * max(reductions):.1f}% "
        "(paper: 14–19% after 3,600 s)."
    )


def convergence(args, argv) -> None:
    t_start = time.perf_counter()
    conv = []
    for label in args.configs:
        w, cl = problem(label)
        horizon = args.long_horizon if (args.long_horizon and label == args.long_config) else args.horizon
        clear_caches()  # time-limited: each search prepares its own candidates
        res = rpeg.solve(w, cl, method="sa", time_limit=horizon, seed=args.seed)
        load_long = _bench.load().split("/")[0]
        hist = res.extra["history"]
        clear_caches()
        short = rpeg.solve(w, cl, method="sa", time_limit=args.checkpoint, seed=args.seed)
        row = {
            "label": label,
            "horizon": horizon,
            "history": hist,
            "tp0": hist[0][2] if hist else 0.0,
            "tp": res.throughput,
            "evals": res.evaluations,
            "runtime": res.runtime_s,
            "short_tp": short.throughput,
            "short_evals": short.evaluations,
            "load": f"{load_long}/{_bench.load().split('/')[0]}",
            "structure": res.structure.label,
            "k": [y.label for y in structures(w)].index(res.structure.label) + 1,
            "n": len(structures(w)),
        }
        conv.append(row)
        print(
            f"{label}: {horizon:g} s → {res.throughput:,.0f} tok/s ({res.evaluations:,} evals); "
            f"{args.checkpoint:g} s search → {short.throughput:,.0f}; first plan {row['tp0']:,.0f}",
            flush=True,
        )
    readings = [t for t in READINGS if any(t <= r["horizon"] for r in conv)]
    header = (
        "| config | topology | B | horizon s | evaluations | first plan tok/s | best tok/s | makespan vs first | "
        + " | ".join(f"at {t} s" for t in readings)
        + f" | curve at {args.checkpoint:g} s: gap to end | separate {args.checkpoint:g} s search tok/s | "
        "its gap to the horizon result | target ≤ 2% | best plan's structure (variant k of n) | "
        "load 1 min (long/short run) |"
    )
    lines = [header, "|" + "---|" * (14 + len(readings))]
    gaps = []
    for r in conv:
        _, shape, _, B = next(c for c in CONFIGS if c[0] == r["label"])
        cells = []
        for t in readings:
            if t > r["horizon"]:
                cells.append("—")
            else:
                b = best_at(r["history"], t)
                cells.append(f"{r['tp0'] / b:.3f}" if b else "no plan yet")
        at_cp = best_at(r["history"], args.checkpoint)
        curve_gap = r["tp"] / at_cp - 1 if at_cp else None
        sep_gap = r["tp"] / r["short_tp"] - 1 if r["short_tp"] else None
        gaps.append((r["label"], r["horizon"], curve_gap, sep_gap, r["k"], r["n"]))
        ok = sep_gap is not None and sep_gap <= 0.02
        lines.append(
            f"| {r['label']} | {shape} | {B} | {r['horizon']:g} | {r['evals']:,} | {r['tp0']:,.0f} | "
            f"{r['tp']:,.0f} | {r['tp0'] / r['tp']:.3f} | "
            + " | ".join(cells)
            + f" | {_bench.pct(curve_gap)} | {_bench.fmt_tp(r['short_tp'])} | {_bench.pct(sep_gap)} | "
            f"{'met' if ok else 'not met'} | {r['structure']} ({r['k']}/{r['n']}) | {r['load']} |"
        )
    print("\n".join(lines), flush=True)
    reductions = [1 - r["tp0"] / r["tp"] for r in conv if r["tp"]]
    target_line = convergence_summary(gaps, reductions, args.checkpoint)
    wall = time.perf_counter() - t_start
    print(target_line)
    if not args.no_write:
        plot_convergence(conv, args)
    if not args.no_write:
        _bench.write_section(
            "convergence",
            [
                "## Convergence of the search",
                "",
                f"Command: `{_bench.command('convergence.py', argv)}` — {_bench.machine()}; wall time of the "
                f"convergence part {wall:.0f} s.",
                "",
                "PPO, actor = critic = reward of the size shown, Lp = 128, Lr = 384, GH200 preset. Convergence: "
                f'`solve(method="sa", time_limit=horizon, seed={args.seed})`, best predicted makespan from '
                '`result.extra["history"]` relative to the search\'s first plan (the concurrent baseline); '
                'columns "at t s" are that ratio at t seconds (1.000 = no gain yet). The search shares its '
                "time over 6 structural variants by successive halving (rounds of 6, 3, 2 and 1 variants, "
                "each round a quarter of the budget); the separate "
                f"{args.checkpoint:g} s search (same seed, whole budget {args.checkpoint:g} s) "
                'is the fair "what 60 s buys" figure and decides the target column. '
                "**Core contention:** the 2 cores are shared with other work (load column); time-budget "
                "figures are what this loaded machine gave. Plot: "
                f"`benchmarks/{PLOT.name}`.",
                "",
                *lines,
                "",
                target_line,
            ],
        )


def stability(args, argv) -> None:
    t_start = time.perf_counter()
    header = (
        "| config | search | seeds | evaluations per run | s per run | mean tok/s | best | worst | CV | "
        "target CV | worst gap to best seed |"
    )
    lines = [header, "|" + "---|" * 11]
    results = []
    runs = [(e, ()) for e in args.stability_evaluations]
    runs += [(e, PREVIOUS) for e in args.stability_previous]
    for evaluations, ablate in runs:
        stab = _bench.pmap(
            stability_run,
            [(args.stability_config, s, evaluations, ablate) for s in range(args.stability_seeds)],
            args.jobs,
        )
        tps = [t for _, t, _ in stab]
        best, mean = max(tps), statistics.mean(tps)
        cv = statistics.stdev(tps) / mean if len(tps) > 1 and mean else 0.0
        worst_gap = 1 - min(tps) / best if best else 0.0
        target = stability_target(evaluations)
        search = "previous (`ablate=" + str(list(ablate)) + "`)" if ablate else "current"
        if not ablate:
            results.append((evaluations, tps, cv, worst_gap))
        line = (
            f"| {args.stability_config} | {search} | {len(tps)} | {evaluations:,} | "
            f"{statistics.mean(s for *_, s in stab):.1f} | {mean:,.0f} | {best:,.0f} | {min(tps):,.0f} | "
            f"{100 * cv:.2f}% | ≤ {100 * target:g}%: {'met' if cv <= target else 'not met'} | "
            f"{100 * worst_gap:.2f}% |"
        )
        lines.append(line)
        print(line, flush=True)
    wall = time.perf_counter() - t_start
    summary = (
        "Stability targets (CV ≤ 2% below 30,000 evaluations per run, ≤ 1% at 30,000), current search: "
        + "; ".join(
            f"{e:,} evaluations per run: CV {100 * cv:.2f}% "
            f"({'met' if cv <= stability_target(e) else 'not met'}), worst gap {100 * g:.2f}%"
            for e, _, cv, g in results
        )
        + ". Paper: CV 0.27–2.31% over 200 seeds of 600 s on 6 cores; all runs within 6% of the best at "
        "64–512 GPUs, 11% at 1,024."
    )
    print(summary)
    if not args.no_write:
        plot_stability(results, args)
    if not args.no_write:
        _bench.write_section(
            "stability",
            [
                "## Run-to-run stability of the search",
                "",
                f"Command: `{_bench.command('convergence.py', argv)}` — {_bench.machine()}; wall time of the "
                f"stability part {wall:.0f} s.",
                "",
                f"{args.stability_config} (PPO, actor = critic = reward, Lp = 128, Lr = 384, GH200 preset), "
                f'`solve(method="sa", max_evaluations=E, seed=s)` for seeds 0..{args.stability_seeds - 1}: '
                "evaluation budgets, so each run is deterministic and independent of the machine's load "
                f"(`--jobs {args.jobs}` runs seeds in parallel; s per run is wall time under that load). CV = "
                "sample standard deviation / mean of the throughput; gap = 1 − run / best run. Plot: "
                f"`benchmarks/{STAB_PLOT.name}`.",
                "",
                *lines,
                "",
                summary,
            ],
        )


def plot_convergence(conv: list[dict], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, a1 = plt.subplots(figsize=(7.5, 4.5))
    for r in conv:
        h = r["history"]
        if not h:
            continue
        xs, ys = [], []
        for s, _, tp in h:
            xs.append(max(s, 1e-2))
            ys.append(r["tp0"] / tp)
        xs.append(r["horizon"])
        ys.append(ys[-1])
        a1.step(xs, ys, where="post", label=f"{r['label']} ({r['horizon']:g} s)")
        if r["short_tp"]:
            a1.plot([args.checkpoint], [r["tp0"] / r["short_tp"]], "o", color=a1.lines[-1].get_color())
    a1.set_xscale("log")
    a1.set_xlabel("search time (s)")
    a1.set_ylabel("best makespan / first plan's")
    a1.set_title(f"Convergence (dots: separate {args.checkpoint:g} s searches)")
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {PLOT}")


def plot_stability(results: list, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, a2 = plt.subplots(figsize=(7.5, 4.5))
    for evaluations, tps, cv, _ in results:
        tps = sorted(tps, reverse=True)
        best = tps[0] if tps else 1.0
        gaps = [100 * (1 - t / best) for t in tps]
        a2.plot(
            gaps,
            [100 * (i + 1) / len(gaps) for i in range(len(gaps))],
            "-o",
            label=f"{evaluations:,} evaluations (CV {100 * cv:.2f}%)",
        )
    a2.set_xlabel("gap to best seed (%)")
    a2.set_ylabel("runs within gap (%)")
    a2.set_title(f"Stability: {args.stability_config}, {args.stability_seeds} seeds")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(STAB_PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {STAB_PLOT}")


if __name__ == "__main__":
    sys.exit(main())
