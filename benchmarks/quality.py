"""Plan quality: SA against the greedy and concurrent baselines (SPEC §8, §13; RPEG paper §VIII-B).

Weak scaling (RPEG paper Fig. 6, Appendix B): three sweeps on the GH200 preset —

- *actor*: actor 7/13/34/70B on 8/16/32/64 GPUs, critic and reward 7B;
- *critic*: critic and reward 7/13/34/70B on 8/16/32/64 GPUs, actor 7B;
- *both*: actor and critic 7/13/34/70B, reward 7/7/13/13B on 16/32/64/128 GPUs;

each at (B, Lr) ∈ {(512, 128), (256, 384), (128, 896)}, Lp = 128 (36 cases). Strong scaling
(Fig. 8): 13B actor/critic/reward, B = 1024, Lp = 128, Lr = 384 on 8/16/32/64/128 GPUs.
Topologies: 8 = 1x2x4, 16 = 1x4x4, 32 = 1x8x4, 64 = 2x8x4, 128 = 2x16x4.

For every case: ``solve(method="greedy")``, ``solve(method="concurrent")`` and
``solve(method="sa", max_evaluations=E, seed=S)``; a method with no memory-feasible plan is
``OOM``. Evaluation budgets make every run deterministic and independent of machine load, so
``--jobs`` only changes the wall time. Figures are the cost model's predictions with the
preset's nominal hardware figures, not measurements on GPUs.

Run from the repository root::

    python benchmarks/quality.py [--evaluations 3000] [--seed 0] [--jobs 1] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _bench

import rpeg
from rpeg.solvers import clear_caches

SHAPES = {8: "1x2x4", 16: "1x4x4", 32: "1x8x4", 64: "2x8x4", 128: "2x16x4"}
SIZES = ("7b", "13b", "34b", "70b")
REGIMES = ((512, 128), (256, 384), (128, 896))  # (B, Lr)
LP = 128
PLOT = Path(__file__).with_name("quality.png")


def cases() -> list[dict]:
    out = []
    for sweep in ("actor", "critic", "both"):
        gpus = (16, 32, 64, 128) if sweep == "both" else (8, 16, 32, 64)
        for B, Lr in REGIMES:
            for i, n in enumerate(gpus):
                s = SIZES[i]
                if sweep == "actor":
                    acr = (s, "7b", "7b")
                elif sweep == "critic":
                    acr = ("7b", s, s)
                else:
                    acr = (s, s, ("7b", "7b", "13b", "13b")[i])
                out.append({"sweep": sweep, "gpus": n, "acr": acr, "B": B, "Lr": Lr})
    for n in (8, 16, 32, 64, 128):
        out.append({"sweep": "strong", "gpus": n, "acr": ("13b", "13b", "13b"), "B": 1024, "Lr": 384})
    return out


def run_case(job: tuple[dict, int, int]) -> dict:
    case, evaluations, seed = job
    a, c, r = case["acr"]
    w = _bench.ppo(a, c, r, case["B"], LP, case["Lr"])
    cl = _bench.cluster(SHAPES[case["gpus"]])
    out = dict(case)
    t0 = time.perf_counter()
    for method in ("greedy", "concurrent"):
        clear_caches()  # timed: each method builds its own candidates
        res = rpeg.solve(w, cl, method=method)
        out[method] = res.throughput if res.feasible else None
    clear_caches()
    res = rpeg.solve(w, cl, method="sa", max_evaluations=evaluations, seed=seed)
    out["sa"] = res.throughput if res.feasible else None
    out["structure"] = _label(res.structure)
    out["seconds"] = time.perf_counter() - t0
    return out


def _label(st) -> str:
    tau = ",".join(f"{m}:{t}" for m, t in st.staleness)
    return f"{'AC-shared, ' if st.ac_sharing else ''}τ {tau}"


def gain(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b - 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evaluations", type=int, default=3000, help="SA evaluation budget (default 3000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="cases run in parallel processes (default 1)")
    ap.add_argument("--quick", action="store_true", help="1000 evaluations per SA run")
    ap.add_argument(
        "--no-write", action="store_true", help="print only; do not update RESULTS.md or the plot"
    )
    args = ap.parse_args(argv)
    evaluations = 1000 if args.quick else args.evaluations
    t0 = time.perf_counter()
    rows = _bench.pmap(run_case, [(c, evaluations, args.seed) for c in cases()], args.jobs)
    wall = time.perf_counter() - t0

    header = (
        "| sweep | GPUs | A/C/R | B | Lr | greedy tok/s | concurrent tok/s | SA tok/s | SA vs concurrent | "
        "SA vs greedy | SA structure |"
    )
    lines = [header, "|" + "---|" * 11]
    only_sa = []
    for r in rows:
        g_c, g_g = gain(r["sa"], r["concurrent"]), gain(r["sa"], r["greedy"])
        r["gain_c"], r["gain_g"] = g_c, g_g
        lines.append(
            f"| {r['sweep']} | {r['gpus']} | {'/'.join(x.upper() for x in r['acr'])} | {r['B']} | {r['Lr']} | "
            f"{_bench.fmt_tp(r['greedy'])} | {_bench.fmt_tp(r['concurrent'])} | {_bench.fmt_tp(r['sa'])} | "
            f"{_bench.pct(g_c)} | {_bench.pct(g_g)} | {r['structure'] if r['sa'] else '—'} |"
        )
        missing = [m for m in ("greedy", "concurrent") if r[m] is None]
        if r["sa"] and missing:
            only_sa.append(
                f"{r['sweep']} {r['gpus']} GPUs {'/'.join(x.upper() for x in r['acr'])} B={r['B']} Lr={r['Lr']}: "
                f"SA {r['sa']:,.0f} tok/s, {' and '.join(missing)} OOM"
            )
    print("\n".join(lines))

    # summaries
    weak = [r for r in rows if r["sweep"] != "strong"]
    sa_oom = [r for r in rows if r["sa"] is None]
    by_lr = {}
    for _, Lr in REGIMES:
        gs = [r["gain_c"] for r in weak if r["Lr"] == Lr and r["gain_c"] is not None]
        by_lr[Lr] = gs
    weak_c = [r["gain_c"] for r in weak if r["gain_c"] is not None]
    strong = [r for r in rows if r["sweep"] == "strong"]
    strong_g = [r["gain_g"] for r in strong if r["gain_g"] is not None]
    summary = [
        f"Weak scaling ({len(weak)} cases): SA over concurrent "
        + (f"{100 * min(weak_c):+.1f}% to {100 * max(weak_c):+.1f}% " if weak_c else "n/a ")
        + f"where concurrent is feasible ({len(weak_c)} cases; paper: +5% to +60%); by response length: "
        + "; ".join(
            f"Lr={Lr}: mean {100 * sum(g) / len(g):+.1f}% (min {100 * min(g):+.1f}%, max {100 * max(g):+.1f}%)"
            for Lr, g in by_lr.items()
            if g
        )
        + f". SA found no feasible plan in {len(sa_oom)} of {len(rows)} cases.",
        "Shape against the paper: "
        + (
            f"{sum(g > 0.60 for g in weak_c)} of {len(weak_c)} weak-scaling gains over concurrent lie above the "
            f"paper's 60% and {sum(g < 0.05 for g in weak_c)} below its 5%; "
            if weak_c
            else ""
        )
        + "mean gain over concurrent by Lr "
        + " → ".join(f"{100 * sum(g) / len(g):+.1f}%" for g in by_lr.values() if g)
        + (
            " (grows with the response length, as in the paper)"
            if all(
                sum(a) / len(a) <= sum(b) / len(b)
                for a, b in zip(list(by_lr.values()), list(by_lr.values())[1:])
                if a and b
            )
            else " (does not grow monotonically with the response length, unlike the paper)"
        )
        + ".",
        "Strong scaling 13B: "
        + ", ".join(f"{r['gpus']} GPUs {_bench.fmt_tp(r['sa'])} tok/s" for r in strong)
        + " (paper: 8,966 on 8 GPUs with both baselines OOM, 104,930 on 128); SA over greedy "
        + (f"{100 * min(strong_g):+.1f}% to {100 * max(strong_g):+.1f}%" if strong_g else "n/a")
        + " where greedy is feasible (paper: +20% to +49% on 16–128 GPUs).",
    ]
    print("\n" + "\n".join(summary))
    print("SA feasible, a baseline OOM:\n" + ("\n".join(only_sa) or "none"))
    print(f"wall time {wall:.0f} s")
    if not args.no_write:
        plot(rows)
    if not args.no_write:
        _bench.write_section(
            "quality",
            [
                "## Plan quality: SA vs greedy and concurrent baselines",
                "",
                f"Command: `{_bench.command('quality.py', argv)}` — {_bench.machine()}; wall time {wall:.0f} s.",
                "",
                f"GH200 preset (96 GB, nominal derated vendor figures, not calibrated), PPO, Lp = {LP}, Keval = 8. "
                f'SA: `solve(method="sa", max_evaluations={evaluations}, seed={args.seed})` — an evaluation '
                "budget, so the figures do not depend on the load of the shared 2-core machine. Greedy and "
                "concurrent: SPEC §8 baselines (synchronous structure). OOM = no memory-feasible plan. Gains "
                "are SA throughput / baseline throughput − 1. Sweeps as in the RPEG paper's Appendix B "
                "(actor: actor grows, critic/reward 7B; critic: critic and reward grow, actor 7B; both: "
                "actor/critic grow, reward 7/7/13/13B); topologies 8 = 1x2x4, 16 = 1x4x4, 32 = 1x8x4, "
                "64 = 2x8x4, 128 = 2x16x4. Predicted throughput with nominal hardware figures, so absolute "
                "numbers are not comparable with the paper's calibrated ones; the shape is. AC sharing is "
                "tried only where actor and critic are the same model (commit 2986d29). Plot (solid: vs "
                "concurrent, dashed: vs greedy): "
                f"`benchmarks/{PLOT.name}`.",
                "",
                *lines,
                "",
                *summary,
                "",
                "Cases where SA finds a plan and a baseline does not: "
                + ("; ".join(only_sa) if only_sa else "none")
                + ".",
            ],
        )
    return 0


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 5.2))
    titles = {
        "actor": "weak: actor grows",
        "critic": "weak: critic+reward grow",
        "both": "weak: both grow",
        "strong": "strong: 13B, B=1024, Lr=384",
    }
    colors = {128: "tab:blue", 384: "tab:orange", 896: "tab:red"}
    for ax, sweep in zip(axes, titles):
        sel = [r for r in rows if r["sweep"] == sweep]
        for B, Lr in REGIMES if sweep != "strong" else ((1024, 384),):
            rs = [r for r in sel if r["Lr"] == Lr and r["B"] == B]
            for key, style, name in (("gain_c", "-o", "vs concurrent"), ("gain_g", "--s", "vs greedy")):
                xs = [r["gpus"] for r in rs if r[key] is not None]
                ys = [100 * r[key] for r in rs if r[key] is not None]
                ax.plot(xs, ys, style, color=colors[Lr], label=f"B={B}, Lr={Lr} {name}")
            for r in rs:  # baselines OOM: mark at 0
                for key, m in (("concurrent", "x"), ("greedy", "+")):
                    if r[key] is None and r["sa"]:
                        ax.plot([r["gpus"]], [0], m, color=colors[Lr], markersize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["gpus"] for r in sel}))
        ax.set_xticklabels([str(x) for x in sorted({r["gpus"] for r in sel})])
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title(titles[sweep])
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("SA gain over baseline (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)  # one legend for the weak sweeps
    axes[3].legend(fontsize=7, loc="best")
    fig.suptitle("SA throughput gain over baselines (x at 0: concurrent OOM, + at 0: greedy OOM)")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    print(f"wrote {PLOT}")


if __name__ == "__main__":
    sys.exit(main())
