"""A Gantt chart of a result's predicted schedule (SPEC §7), drawn with matplotlib's Agg canvas.

Rows are devices (flat ids ``((r·Nn) + n)·Ng + g``, SPEC §2), time runs left to right. Every node
of the lowered graph ``Ĝ`` (SPEC §5) is drawn on each row whose devices it reserves: OP nodes on
their allocation, COMM and RESHARD nodes on their destination allocation (the devices the list
scheduler reserves for them). Colours are per invocation (compact vertex); COMM nodes are
hatched ``////`` with a black edge and RESHARD nodes hatched ``xxxx`` with a dark-grey edge, both
tinted with the consuming invocation's colour. Response-length phases (SPEC §5 rule 1) are
labelled ``q1..qQ`` inside bars wide enough to hold the text and drawn progressively lighter.
A dashed vertical line marks the end of each RL step ``k``: the finish of its last node.

COMM and RESHARD nodes are often milliseconds long on a schedule of tens of seconds, so they are
drawn at least ``0.3 %`` of the makespan wide (starting at their true start) to stay visible.

For clusters with more than ``max_devices`` devices, devices that every node either reserves
whole or leaves alone (the scheduler's *atoms*) share one row, labelled by their id ranges
(``"GPU 0–15"``).

Only :mod:`matplotlib.figure` and the Agg canvas are used, never ``pyplot``: no display is needed
and no global backend is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..ir.lower import COMM, OP, RESHARD

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..formulations.status import Status
    from ..ir.cluster import Cluster
    from ..ir.graph import RPEG
    from ..ir.lower import ExecGraph
    from ..ir.plan import Plan
    from ..ir.templates import Structure
    from ..ir.workload import Workload
    from ..scoring.evaluator import Evaluation
    from ..scoring.scheduler import Schedule

__all__ = ["ChartedResult", "device_rows", "gantt_figure", "plot_gantt"]

MIN_WIDTH = 0.003  # COMM/RESHARD bars are drawn at least this share of the makespan wide
BAR_HEIGHT = 0.8
COMM_STYLE = {"hatch": "////", "edgecolor": "black", "linewidth": 0.6}
RESHARD_STYLE = {"hatch": "xxxx", "edgecolor": "0.3", "linewidth": 0.8}
GIDS = {OP: "gantt-op", COMM: "gantt-comm", RESHARD: "gantt-reshard"}

#: Per node kind, the bars drawn: (rectangles, face colours).
Bars = dict[int, tuple[list[list[tuple[float, float]]], list[tuple[float, float, float]]]]
#: Rows (indices into :func:`device_rows`) of a device mask.
RowsOf = Callable[[int], list[int]]


class ChartedResult(Protocol):
    """What a chart reads of a result: :class:`~rpeg.solvers.result.Result` is one. (A protocol,
    so that this module depends on nothing above the scorer and ``result.py`` may import it.)"""

    workload: Workload
    cluster: Cluster
    structure: Structure
    graph: RPEG
    plan: Plan | None
    evaluation: Evaluation | None
    status: Status
    method: str
    k_eval: int
    message: str


def device_rows(masks: list[int], num_devices: int, max_devices: int = 64) -> list[tuple[int, str]]:
    """Rows of the chart as ``(device mask, label)``, top to bottom.

    Parameters
    ----------
    masks
        Device masks of the nodes to draw (bit ``d`` set: the node reserves device ``d``).
    num_devices
        ``|D|``.
    max_devices
        Up to this many devices, one row per device (``"GPU d"``); beyond it, devices with
        identical node sets (every mask holds all of them or none) share a row labelled by its
        id ranges, e.g. ``"GPU 0–15"`` or ``"GPU 0–3, 8–11"``.

    Returns
    -------
    list of (int, str)
        Row masks (disjoint, covering all devices) in order of their lowest device, and labels.

    Raises
    ------
    ValueError
        If ``num_devices`` or ``max_devices`` is not positive.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be positive, got {num_devices!r}")
    if max_devices < 1:
        raise ValueError(f"max_devices must be positive, got {max_devices!r}")
    if num_devices <= max_devices:
        return [(1 << d, f"GPU {d}") for d in range(num_devices)]
    atoms = [(1 << num_devices) - 1]
    for m in set(masks):
        refined = []
        for a in atoms:
            inside, outside = a & m, a & ~m
            refined += [x for x in (inside, outside) if x]
        atoms = refined
    atoms.sort(key=lambda a: (a & -a).bit_length())
    return [(a, _range_label(a)) for a in atoms]


def _range_label(mask: int) -> str:
    """``"GPU 0–3, 8–11"`` for the devices of ``mask`` (at most three ranges spelt out)."""
    ranges: list[tuple[int, int]] = []
    d = 0
    while mask >> d:
        if mask >> d & 1:
            lo = d
            while mask >> (d + 1) & 1:
                d += 1
            ranges.append((lo, d))
        d += 1
    parts = [f"{lo}" if lo == hi else f"{lo}–{hi}" for lo, hi in ranges[:3]]
    more = f", … ({mask.bit_count()} GPUs)" if len(ranges) > 3 else ""
    return "GPU " + ", ".join(parts) + more


def _lighten(rgb: tuple[float, ...], amount: float) -> tuple[float, float, float]:
    """Mix ``rgb`` with white (``amount`` 0: unchanged, 1: white)."""
    return tuple(c + (1.0 - c) * amount for c in rgb[:3])  # type: ignore[return-value]


def gantt_figure(result: ChartedResult, *, title: str | None = None, max_devices: int = 64) -> Figure:
    """Draw ``result``'s predicted schedule on a new matplotlib :class:`~matplotlib.figure.Figure`.

    Parameters
    ----------
    result
        A result whose evaluation kept its graph and schedule (every method's result does).
    title
        Figure title; default names the workload, method, structure, throughput and makespan.
    max_devices
        One row per device up to this many devices; beyond it rows group devices with
        identical node sets (see :func:`device_rows`).

    Returns
    -------
    matplotlib.figure.Figure
        The figure, not yet saved. Its bars are three ``PolyCollection`` objects with gids
        ``"gantt-op"``, ``"gantt-comm"`` and ``"gantt-reshard"`` (one path per
        (node, row) pair).

    Raises
    ------
    ValueError
        If the result has no plan or no kept schedule (an infeasible result).
    """
    from matplotlib.figure import Figure

    ev = _evaluation_to_draw(result)
    g, s = ev.graph, ev.schedule
    assert g is not None and s is not None
    names = [v.name for v in result.graph.vertices]
    rows = device_rows(g.mask, result.cluster.num_devices, max_devices)
    rows_of = _row_lookup(rows)
    makespan = s.makespan if s.makespan > 0 else 1.0
    palette = _palette(len(names))
    bars, max_phase = _bars(g, s, rows_of, palette, MIN_WIDTH * makespan)

    n_rows = len(rows)
    height = min(24.0, max(3.5, 1.4 + 0.26 * n_rows))
    fig = Figure(figsize=(14, height), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    _draw_bars(ax, bars)
    _draw_axes(ax, rows, result.cluster.num_devices <= max_devices, result.cluster.gpus_per_node, makespan)
    _draw_step_ends(ax, g, s, makespan)
    ax.set_title(title if title is not None else _default_title(result, ev), fontsize=10, pad=18)
    plan = result.plan
    legend = (
        [f"{n}  {c.strategy.label()}" for n, c in zip(names, plan.choices)] if plan is not None else names
    )
    _draw_legend(ax, legend, palette, bars, max_phase)
    _label_phases(fig, ax, g, s, rows_of, palette, makespan, n_rows)
    return fig


def _evaluation_to_draw(result: ChartedResult) -> Evaluation:
    """``result.evaluation``, which must hold a plan's kept graph and schedule.

    Raises
    ------
    ValueError
        Naming the method, the status and the result's message when there is nothing to draw.
    """
    ev = result.evaluation
    if result.plan is None or ev is None or ev.graph is None or ev.schedule is None:
        why = f": {result.message}" if result.message else ""
        raise ValueError(
            f"no schedule to draw: the result (method {result.method!r}, status "
            f"{result.status.value!r}) has no plan{why}"
        )
    return ev


def _row_lookup(rows: list[tuple[int, str]]) -> RowsOf:
    """``rows_of(mask)``: the indices of the rows whose devices ``mask`` touches (cached)."""
    cache: dict[int, list[int]] = {}

    def rows_of(mask: int) -> list[int]:
        got = cache.get(mask)
        if got is None:
            got = cache[mask] = [r for r, (rm, _) in enumerate(rows) if rm & mask]
        return got

    return rows_of


def _phase_colour(palette: list[tuple[float, ...]], vertex: int, phase: int) -> tuple[float, float, float]:
    """An OP bar's colour: its invocation's, lightened by 22 % per phase after the first."""
    return _lighten(palette[vertex], 0.22 * max(0, phase - 1))


def _bars(
    g: ExecGraph, s: Schedule, rows_of: RowsOf, palette: list[tuple[float, ...]], min_width: float
) -> tuple[Bars, int]:
    """One rectangle per (node, row) pair, grouped by node kind, and the largest OP phase.

    OP bars take :func:`_phase_colour`; COMM bars the consumer's colour lightened 55 %, RESHARD
    bars 80 %, both at least ``min_width`` seconds wide.
    """
    bars: Bars = {OP: ([], []), COMM: ([], []), RESHARD: ([], [])}
    max_phase = 0
    for i in range(len(g.kind)):
        kind, v, phase = g.kind[i], g.vertex[i], g.phase[i]
        x0, x1 = s.start[i], s.finish[i]
        if kind == OP:
            face = _phase_colour(palette, v, phase)
            max_phase = max(max_phase, phase)
        else:
            face = _lighten(palette[v], 0.55 if kind == COMM else 0.8)
            x1 = max(x1, x0 + min_width)
        verts, faces = bars[kind]
        for r in rows_of(g.mask[i]):
            y0, y1 = r - BAR_HEIGHT / 2, r + BAR_HEIGHT / 2
            verts.append([(x0, y0), (x0, y1), (x1, y1), (x1, y0)])
            faces.append(face)
    return bars, max_phase


def _draw_bars(ax: Axes, bars: Bars) -> None:
    """One ``PolyCollection`` per node kind (gid :data:`GIDS`), COMM/RESHARD hatched on top."""
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import PathPatch

    for kind, (verts, faces) in bars.items():
        edges = {"edgecolor": "white", "linewidth": 0.4} if kind == OP else {"linewidth": 0.0}
        coll = PolyCollection(verts, facecolors=faces, zorder=2 if kind == OP else 3, **edges)
        coll.set_gid(GIDS[kind])
        ax.add_collection(coll)
        if kind != OP and verts:
            # Agg hatches each path of a collection separately (seconds for a few thousand
            # bars); one compound path hatches them all in a single pass
            style = COMM_STYLE if kind == COMM else RESHARD_STYLE
            ax.add_artist(PathPatch(_compound(verts), facecolor="none", zorder=3.5, **style))


def _draw_axes(
    ax: Axes, rows: list[tuple[int, str]], per_device: bool, gpus_per_node: int, makespan: float
) -> None:
    """Limits, row labels, the time grid and, with one row per device, node separators."""
    n_rows = len(rows)
    # rack/node separators help read device ids when every device has its own row
    if per_device:
        for b in range(gpus_per_node, n_rows, gpus_per_node):
            ax.axhline(b - 0.5, color="0.75", linewidth=0.6, zorder=1)
    ax.set_xlim(0, makespan * 1.005)
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_yticks(range(n_rows), [label for _, label in rows], fontsize=8 if n_rows <= 32 else 6)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", color="0.9", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)


def _draw_step_ends(ax: Axes, g: ExecGraph, s: Schedule, makespan: float) -> None:
    """A dashed line at the end of every RL step ``k`` (the finish of its last node), labelled
    ``step k`` above the axes (rotated when two ends are closer than 4.5 % of the makespan)."""
    from matplotlib.transforms import blended_transform_factory

    ends: dict[int, float] = {}
    for i in range(len(g.kind)):
        k = g.step[i]
        if s.finish[i] > ends.get(k, -1.0):
            ends[k] = s.finish[i]
    top = blended_transform_factory(ax.transData, ax.transAxes)
    xs = sorted(ends.items(), key=lambda kv: kv[1])
    gaps = [b[1] - a[1] for a, b in zip(xs, xs[1:])]
    crowded = bool(gaps) and min(gaps) < 0.045 * makespan
    for k, x in xs:
        ax.axvline(x, color="0.25", linestyle="--", linewidth=0.9, zorder=4)
        ax.text(
            x,
            1.005,
            f"step {k}",
            transform=top,
            ha="left" if crowded else "center",
            va="bottom",
            fontsize=7,
            rotation=60 if crowded else 0,
            rotation_mode="anchor",
            clip_on=False,
        )


def _default_title(result: ChartedResult, ev: Evaluation) -> str:
    """Workload, method, structure, throughput and makespan (and a warning if it does not fit)."""
    mem = "" if ev.feasible else " — DOES NOT FIT in memory"
    return (
        f"{result.workload.name} · {result.method} · {result.structure.label} · "
        f"{ev.throughput:,.0f} tokens/s · makespan {ev.makespan:.2f} s over {result.k_eval} steps{mem}"
    )


def _draw_legend(
    ax: Axes, names: list[str], palette: list[tuple[float, ...]], bars: Bars, max_phase: int
) -> None:
    """Invocation colours (each labelled with its strategy: degrees, microbatches and engine
    choices), then COMM/RESHARD (when drawn), the phases and the step line."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [
        Patch(facecolor=palette[v], edgecolor="white", label=name) for v, name in enumerate(names)
    ]
    if bars[COMM][0]:
        handles.append(Patch(facecolor="0.92", label="COMM (data/weight transfer)", **COMM_STYLE))
    if bars[RESHARD][0]:
        handles.append(Patch(facecolor="0.92", label="RESHARD (re-layout)", **RESHARD_STYLE))
    if max_phase:
        shades = "/".join(f"q{q}" for q in range(1, max_phase + 1))
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"{shades}: response-length phase"))
    handles.append(Line2D([], [], color="0.25", linestyle="--", linewidth=0.9, label="end of RL step"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _label_phases(
    fig: Figure,
    ax: Axes,
    g: ExecGraph,
    s: Schedule,
    rows_of: RowsOf,
    palette: list[tuple[float, ...]],
    makespan: float,
    n_rows: int,
) -> None:
    """Write ``q<phase>`` inside OP bars at least 18 px wide on rows at least 7 px tall, white on
    dark faces (luminance ``0.299·r + 0.587·g + 0.114·b < 0.5``), black otherwise.

    Needs the final axes size, so the figure is laid out first (``draw_without_rendering``).
    """
    fig.draw_without_rendering()
    bbox = ax.get_window_extent()
    px_per_s = bbox.width / (makespan * 1.005)
    px_per_row = bbox.height / n_rows
    for i in range(len(g.kind)):
        if g.kind[i] != OP or g.phase[i] == 0:
            continue
        if (s.finish[i] - s.start[i]) * px_per_s < 18 or px_per_row * BAR_HEIGHT < 7:
            continue
        face = _phase_colour(palette, g.vertex[i], g.phase[i])
        luminance = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2]
        x = (s.start[i] + s.finish[i]) / 2
        for r in rows_of(g.mask[i]):
            ax.text(
                x,
                r,
                f"q{g.phase[i]}",
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if luminance < 0.5 else "black",
                zorder=5,
                clip_on=True,
            )


def _compound(rects: list[list[tuple[float, float]]]) -> Any:
    """One matplotlib ``Path`` made of the closed rectangles ``rects``."""
    from matplotlib.path import Path as MplPath

    verts = [pt for r in rects for pt in (*r, r[0])]
    codes = [MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO, MplPath.CLOSEPOLY]
    return MplPath(verts, codes * len(rects))


def _palette(n: int) -> list[tuple[float, ...]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [tuple(cmap(i % cmap.N)) for i in range(n)]


def plot_gantt(
    result: ChartedResult, path: str | Path, *, title: str | None = None, max_devices: int = 64
) -> Path:
    """Draw ``result``'s predicted schedule as a Gantt chart and save it to ``path``.

    Parameters
    ----------
    result
        A result with a plan (see :func:`gantt_figure` for what is drawn).
    path
        Output file; the format follows the suffix (``.png``, ``.pdf``, ``.svg``).
    title
        Figure title (default: workload, method, structure, throughput, makespan).
    max_devices
        One row per device up to this many devices, else rows of devices grouped by identical
        node sets.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    ValueError
        If the result has no plan or schedule (infeasible).
    """
    fig = gantt_figure(result, title=title, max_devices=max_devices)
    out = Path(path)
    fig.savefig(out)
    return out
