"""Calibration through the engines the runtime runs: the engine terms of a hardware file.

The microbenchmarks of :mod:`rpeg.runtime.calibrate.measure` time bare GEMMs, copies and collectives. What a
plan's nodes take on a real engine also holds fixed costs the roofline has no term for — Python
and kernel launches per layer, the decode loop's scheduler and sampler per step, the engine's
entry per call — and kernels that reach only part of the roofline. This module times the
runtime's own operations and fits, per engine and operation class, the :class:`~rpeg.ir.hardware.
OpTerms` the cost model adds (docs/cost-model.md §2 "Engine terms"):

* **torch engine** — the runtime's :class:`~rpeg.runtime.worker.core.Worker` in this process (one
  device, one thread, as a worker runs), on a one-device PPO plan, over a grid of model sizes and
  run shapes: generation nodes (prefill + decode), inference nodes (reference, reward and critic)
  and training nodes (actor and critic).
* **vLLM** (CPU build) — the worker's :class:`~rpeg.runtime.engines.vllm_engine.RolloutEngine`:
  generations of ``max_tokens = N`` responses over a grid of batches, prompt lengths and ``N``,
  and the weight pushes of each model size (the sync link ``α + bytes·β``).
* **torch engine, data parallel** — two gloo ranks of the runtime's FSDP2 optimizer
  (:class:`~rpeg.runtime.worker.parallel.FSDPAdam`) per model size: the gradient ReduceScatter (a
  backward that reduces less one that does not) and the parameter AllGather (``reshard`` +
  ``unshard``, what each update ends with), as FSDP2 runs them on this host. They give the
  engine's ``data_parallel`` link (``T_dp``'s ``α``, ``β``).
* **Ray dispatch** — the round trip of an empty actor call: ``dispatch_s``.

Each fit is a least-squares problem in the cost model's own features: for a sample the cost
model (with the microbenchmarked hardware and neutral engine terms) gives the GEMM time of the
prefill ``G_p`` and of the decode ``G_d`` (generation) or of the node ``G`` (inference and
training); the measured seconds ``t`` are fitted to

* generation: ``t = G_p/η_p + G_d/η_d + c_call + L·c_layer,p + N·(c_step,d + L·c_layer,d)``,
* inference and training: ``t − T_rest = G/η + c_call + f·L·c_layer`` (``T_rest`` the node's
  other SPEC terms, ``f`` its forward-equivalents),

and data parallelism, one update's ReduceScatter + AllGather over ``p`` ranks of ``M`` bytes (the
ring formulas of :mod:`rpeg.costmodel.collectives`, as ``T_dp`` charges them):
``t = 2·(p − 1)·α + 2·((p − 1)/p)·M·β``,

with non-negative coefficients (:func:`nnls`), each sample weighted by ``1/t`` so that the fit
minimises relative errors — the figure fidelity is judged by.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ...costmodel.layout import Layout
from ...costmodel.time import op_time
from ...ir.cluster import NO_SPLITS
from ...ir.hardware import FIGURE_RANGES, EngineTerms, Hardware, Link, OpTerms
from ...ir.models import ModelSpec
from ...ir.types import Head, Recompute, Role
from ..protocol import NodeCall

__all__ = [
    "CALIBRATION_SCALES",
    "EngineCalibration",
    "EngineFit",
    "EngineSample",
    "calibrate_engines",
    "fit_engine_terms",
    "local_worker",
    "measure_data_parallel",
    "measure_vllm_tp",
    "nnls",
    "op_node",
]

Progress = Callable[[str], None]

#: Model sizes timed (``scale_spec`` fields): two depths so that per-layer and per-call costs
#: separate, two widths so that the efficiency is not one width's. Neither is the 8-layer,
#: 512-wide "medium" model of ``rpeg run --scale medium``.
CALIBRATION_SCALES: tuple[dict[str, int], ...] = (
    {"layers": 2, "hidden": 512, "heads": 8},
    {"layers": 6, "hidden": 384, "heads": 6},
)

#: (batch, prompt length, response length) of the torch engine's one-device runs.
TORCH_SHAPES: tuple[tuple[int, int, int], ...] = ((2, 32, 32), (8, 32, 32), (4, 96, 64), (8, 64, 128))
TORCH_SHAPES_QUICK: tuple[tuple[int, int, int], ...] = ((2, 32, 16), (8, 64, 32))

#: vLLM grid: batches × prompt lengths × response lengths ``N``.
VLLM_GRID = ((2, 8, 16), (32, 128), (1, 16, 64))
VLLM_GRID_QUICK = ((2, 8), (32,), (1, 16))


# ---------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class EngineSample:
    """One timed operation (median of its repeats).

    Parameters
    ----------
    engine
        ``"torch"`` or ``"vllm"``.
    op_class
        ``"generation"`` (prefill + ``response_len`` decode steps), ``"inference"``,
        ``"training"``, ``"sync"`` (a weight push of ``nbytes``) or ``"data_parallel"`` (one
        update's ReduceScatter + AllGather of ``nbytes`` over ``ranks`` ranks).
    spec
        The timed model.
    head
        Its output head(s).
    sequences, prompt_len, response_len
        The node's size.
    seconds
        Median measured seconds.
    nbytes
        Bytes pushed (``"sync"``) or reduced / gathered (``"data_parallel"``).
    ranks
        Ranks of a ``"data_parallel"`` collective.
    recompute
        The activation recomputation mode a training sample ran with (its forward-equivalents
        ``f`` in the fit).
    tp
        Tensor-parallel ranks of a generation (1: the engine's terms; more: its AllReduce link).
    """

    engine: str
    op_class: str
    spec: ModelSpec
    head: str
    sequences: int
    prompt_len: int
    response_len: int
    seconds: float
    nbytes: int = 0
    recompute: str = "none"
    ranks: int = 1
    tp: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the spec as its fields)."""
        d = asdict(self)
        d["spec"] = asdict(self.spec)
        return d


@dataclass(frozen=True)
class EngineFit:
    """The fitted terms of one engine and operation class, with the fit's relative errors."""

    engine: str
    op_class: str
    terms: dict[str, float]
    samples: int
    mape: float
    max_error: float


@dataclass
class EngineCalibration:
    """What :func:`calibrate_engines` measured and fitted."""

    hardware: Hardware
    samples: list[EngineSample]
    fits: list[EngineFit]
    dispatch_samples: list[float] = field(default_factory=list)
    elapsed: float = 0.0

    def table(self) -> str:
        """The fits as a small text table."""
        lines = [f"{'engine':7} {'class':13} {'n':>3} {'fit MAPE':>8}  terms"]
        for f in self.fits:
            terms = ", ".join(
                f"{k} {v:.3g}"
                if "efficiency" in k
                else (f"{k} {v:.3g}" if "per_B" in k else f"{k} {v * 1e3:.3g} ms")
                for k, v in f.terms.items()
            )
            lines.append(f"{f.engine:7} {f.op_class:13} {f.samples:3d} {f.mape:7.1f}%  {terms}")
        if self.dispatch_samples:
            lines.append(
                f"Ray dispatch (empty actor call): {statistics.median(self.dispatch_samples) * 1e3:.2f} ms"
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """The fits' MAPE per engine and class on one line (:meth:`table` has the terms)."""
        engines: dict[str, list[str]] = {}
        for f in self.fits:
            engines.setdefault(f.engine, []).append(f"{f.op_class} {f.mape:.1f}%")
        return "engine terms fitted, MAPE: " + "; ".join(f"{e} {', '.join(c)}" for e, c in engines.items())

    def to_dict(self) -> dict[str, Any]:
        """Every sample and fit (``rpeg.engine-calibration/1``)."""
        return {
            "format": "rpeg.engine-calibration/1",
            "samples": [s.to_dict() for s in self.samples],
            "fits": [asdict(f) for f in self.fits],
            "dispatch_samples": self.dispatch_samples,
            "elapsed": self.elapsed,
        }


# ---------------------------------------------------------------------------------------------- fitting
def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares ``argmin_{x ≥ 0} ‖A·x − b‖₂`` for a few columns, exactly.

    Every support set of the columns is solved by unconstrained least squares; the best solution
    whose coefficients are all non-negative wins (the optimum of a convex problem is one of them:
    the KKT point's free coefficients solve least squares on their support). ``2^n`` solves, so
    for ``n ≤ 8`` columns.

    Raises
    ------
    ValueError
        For more than 8 columns or mismatched shapes.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.ndim != 2 or b.shape != (a.shape[0],):
        raise ValueError(f"nnls: A must be (m, n) and b (m,), got {a.shape} and {b.shape}")
    n = a.shape[1]
    if n > 8:
        raise ValueError(f"nnls: at most 8 columns, got {n}")
    best, best_res = np.zeros(n), float(np.sum(b**2))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = a[:, cols]
            x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((sub @ x - b) ** 2))
            if res < best_res - 1e-18:
                best = np.zeros(n)
                best[list(cols)] = x
                best_res = res
    return best


def _one_device() -> Layout:
    from ...ir.plan import Strategy

    return Layout(Strategy((1, 1, 1), 1, 1, 1, 1))


def _neutral(hw: Hardware) -> Hardware:
    return replace(hw, engines=(), engine_for=("", "", ""), dispatch_s=0.0)


def _generation_features(s: EngineSample, hw: Hardware) -> list[float]:
    """``[G_p, G_d, 1, L, N, N·L]`` of a generation sample (module docstring)."""
    lay, head = _one_device(), Head(s.head)
    size = {"sequences": s.sequences, "prompt_len": s.prompt_len, "response_len": s.response_len}
    g_p = op_time(s.spec, Role.GENERATION, lay, hw, **size, head=head, decode=(0, 0)).gemm
    g_d = op_time(s.spec, Role.GENERATION, lay, hw, **size, head=head, prefill=False).gemm
    n, layers = s.response_len, s.spec.layers
    return [g_p, g_d, 1.0, float(layers), float(n), float(n * layers)]


def _tp_generation(s: EngineSample, hw: Hardware, link: Link) -> float:
    """A ``tp``-rank generation sample's predicted seconds on ``hw`` with the generation engine's
    tensor-parallel link set to ``link``."""
    from ...ir.plan import Strategy

    eng = hw.engine("generation")
    assert eng is not None
    tp_hw = hw.with_engine(replace(eng, tensor_parallel=link))
    lay = Layout(Strategy((1, 1, s.tp), 1, 1, s.tp, 1))
    size = {"sequences": s.sequences, "prompt_len": s.prompt_len, "response_len": s.response_len}
    return op_time(s.spec, Role.GENERATION, lay, tp_hw, **size, head=Head(s.head)).total


def _tp_features(s: EngineSample, hw: Hardware) -> tuple[list[float], float]:
    """``([∂t/∂α, ∂t/∂β], T_rest)`` of a ``tp``-rank generation sample on ``hw`` (the fitted
    one-rank terms): the generation's AllReduces (``2·L`` per prefill microbatch and per decoded
    token, ring formula) are linear in the link, and ``T_rest`` is the rest of the prediction."""
    rest = _tp_generation(s, hw, Link(0.0, 0.0))
    # β probed at the slowest link a Hardware holds (1 MB/s; FIGURE_RANGES), not at 1 s/byte
    beta = FIGURE_RANGES["beta"][1]
    d_beta = (_tp_generation(s, hw, Link(0.0, beta)) - rest) / beta
    return [_tp_generation(s, hw, Link(1.0, 0.0)) - rest, d_beta], rest


def _op_features(s: EngineSample, hw: Hardware) -> tuple[list[float], float]:
    """``([G, 1, f·L], T_rest)`` of an inference or training sample (module docstring)."""
    from ...costmodel.flops import training_passes

    role = Role.TRAINING if s.op_class == "training" else Role.INFERENCE
    lay, head = _one_device(), Head(s.head)
    if role is Role.TRAINING:
        lay = Layout(lay.strategy.with_recompute(s.recompute))
    t = op_time(
        s.spec,
        role,
        lay,
        hw,
        sequences=s.sequences,
        prompt_len=s.prompt_len,
        response_len=s.response_len,
        head=head,
    )
    ell = s.prompt_len + s.response_len
    passes = training_passes(s.spec, Recompute(s.recompute), ell, head) if role is Role.TRAINING else 1.0
    return [t.gemm, 1.0, passes * s.spec.layers], t.total - t.gemm


def _dp_features(s: EngineSample) -> list[float]:
    """``[∂t/∂α, ∂t/∂β]`` of a data-parallel sample: the ReduceScatter + AllGather that ``T_dp``
    charges (:mod:`rpeg.costmodel.collectives`) over ``ranks`` ranks of ``nbytes``, at unit
    ``α`` and at unit ``β`` — the cost model's own formula, which is linear in both."""
    from ...costmodel.collectives import allgather_time, reduce_scatter_time

    def update(link: Link) -> float:
        return reduce_scatter_time(s.ranks, s.nbytes, link) + allgather_time(s.ranks, s.nbytes, link)

    return [update(Link(1.0, 0.0)), update(Link(0.0, 1.0))]


def _weighted_fit(rows: list[list[float]], y: list[float], t: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """NNLS of ``rows·x ≈ y`` with rows weighted by ``1/t``; returns ``(x, relative errors of t)``."""
    a = np.asarray(rows)
    w = 1.0 / np.asarray(t)
    x = nnls(a * w[:, None], np.asarray(y) * w)
    pred = a @ x + (np.asarray(t) - np.asarray(y))
    return x, np.abs(pred - np.asarray(t)) / np.asarray(t)


def _efficiency(inv: float) -> float:
    """``η = 1/x`` of a fitted GEMM coefficient. A zero coefficient means the fixed costs absorbed
    the GEMM time (it does not grow with the samples' work); ``η = 1e6`` then makes ``T_gemm/η``
    negligible, as the fit found, while keeping ``η`` finite for the hardware file."""
    return 1.0 / inv if inv > 1e-6 else 1e6


def fit_engine_terms(
    samples: Sequence[EngineSample], hw: Hardware
) -> tuple[list[EngineTerms], list[EngineFit]]:
    """Fit every engine's :class:`~rpeg.ir.hardware.OpTerms` to ``samples`` (module docstring).

    Parameters
    ----------
    samples
        Timed operations of one or more engines.
    hw
        The microbenchmarked hardware whose roofline gives the GEMM features (its own engine
        terms are ignored).

    Returns
    -------
    (list[EngineTerms], list[EngineFit])
        One :class:`EngineTerms` per engine (classes without samples stay unset), and each fit's
        figures.
    """
    base = _neutral(hw)
    engines: list[EngineTerms] = []
    fits: list[EngineFit] = []
    for engine in sorted({s.engine for s in samples}):
        mine = [s for s in samples if s.engine == engine]
        terms: dict[str, Any] = {}
        gen = [s for s in mine if s.op_class == "generation" and s.tp == 1]
        if gen:
            rows = [_generation_features(s, base) for s in gen]
            t = [s.seconds for s in gen]
            x, err = _weighted_fit(rows, t, t)
            terms["prefill"] = OpTerms(_efficiency(x[0]), per_call_s=x[2], per_layer_s=x[3])
            terms["decode"] = OpTerms(_efficiency(x[1]), per_step_s=x[4], per_layer_s=x[5])
            fits.append(
                EngineFit(
                    engine,
                    "generation",
                    {
                        "prefill efficiency": _efficiency(x[0]),
                        "decode efficiency": _efficiency(x[1]),
                        "per_call_s": x[2],
                        "prefill per_layer_s": x[3],
                        "decode per_step_s": x[4],
                        "decode per_layer_s": x[5],
                    },
                    len(gen),
                    100 * float(err.mean()),
                    100 * float(err.max()),
                )
            )
        for cls in ("inference", "training"):
            group = [s for s in mine if s.op_class == cls]
            if not group:
                continue
            feats = [_op_features(s, base) for s in group]
            t = [s.seconds for s in group]
            y = [s.seconds - rest for s, (_, rest) in zip(group, feats)]
            x, err = _weighted_fit([f for f, _ in feats], y, t)
            terms[cls] = OpTerms(_efficiency(x[0]), per_call_s=x[1], per_layer_s=x[2])
            fits.append(
                EngineFit(
                    engine,
                    cls,
                    {"efficiency": _efficiency(x[0]), "per_call_s": x[1], "per_layer_s": x[2]},
                    len(group),
                    100 * float(err.mean()),
                    100 * float(err.max()),
                )
            )
        # links: a weight push α + bytes·β; a data-parallel update as T_dp prices it
        for cls, field_name, features in (
            ("sync", "weight_sync", lambda s: [1.0, float(s.nbytes)]),
            ("data_parallel", "data_parallel", _dp_features),
        ):
            group = [s for s in mine if s.op_class == cls]
            if not group:
                continue
            t = [s.seconds for s in group]
            x, err = _weighted_fit([features(s) for s in group], t, t)
            terms[field_name] = Link(float(x[0]), float(x[1]))
            fits.append(
                EngineFit(
                    engine,
                    cls,
                    {"alpha_s": x[0], "beta_s_per_B": x[1]},
                    len(group),
                    100 * float(err.mean()),
                    100 * float(err.max()),
                )
            )
        # tensor parallelism: the one-rank terms fixed, the AllReduce link fitted to the rest
        multi = [s for s in mine if s.op_class == "generation" and s.tp > 1]
        if multi and "prefill" in terms:
            fitted = replace(
                base,
                engines=(EngineTerms(engine, prefill=terms["prefill"], decode=terms["decode"]),),
                engine_for=(engine, "", ""),
            )
            feats = [_tp_features(s, fitted) for s in multi]
            t = [s.seconds for s in multi]
            y = [s.seconds - rest for s, (_, rest) in zip(multi, feats)]
            x, err = _weighted_fit([f for f, _ in feats], y, t)
            terms["tensor_parallel"] = Link(float(x[0]), float(x[1]))
            fits.append(
                EngineFit(
                    engine,
                    "tensor_parallel",
                    {"alpha_s": x[0], "beta_s_per_B": x[1]},
                    len(multi),
                    100 * float(err.mean()),
                    100 * float(err.max()),
                )
            )
        engines.append(EngineTerms(engine, **terms))
    return engines, fits


# ---------------------------------------------------------------------------------------------- workers
@contextlib.contextmanager
def local_worker(binding: Any, vertex: str, **kwargs: Any) -> Iterator[Any]:
    """The :class:`~rpeg.runtime.worker.core.Worker` (rank 0 of a one-rank gloo group, in this process,
    no Ray) of ``vertex``'s group of a one-device plan; it leaves its process group afterwards and
    torch's thread count is restored (a worker sets it to 1).

    Raises
    ------
    ValueError
        If ``vertex``'s group has more than one rank.
    """
    import torch
    import torch.distributed as dist

    from ..config import RLConfig
    from ..worker.core import Worker
    from ..worker.memory import PrivatePeak
    from ..worker.parallel import plan_groups

    group = next(g for g in binding.groups if vertex in g.vertices)
    if group.size != 1:
        raise ValueError(
            f"local_worker: {vertex!r}'s group has {group.size} ranks; it runs one-rank groups only"
        )
    threads = torch.get_num_threads()
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
    sampler = PrivatePeak(active=False)
    try:
        groups = plan_groups([(group.gid, [0], 1, 1, 1)], 0)[group.gid]
        worker = Worker(group, 0, groups, binding.shape, RLConfig(), 0, sampler=sampler, **kwargs)
        try:
            yield worker
        finally:
            worker.shutdown()
    finally:
        sampler.stop()
        dist.destroy_process_group()
        torch.set_num_threads(threads)


def op_node(binding: Any, vertex: str, step: int = 0, **extra: Any) -> NodeCall:
    """The OP node the controller sends for ``vertex`` at ``step`` (phase 0), with the group's
    microbatches and no logits chunk (what the engine terms are timed with), and ``extra``
    fields replaced (:class:`~rpeg.runtime.protocol.NodeCall`)."""
    node = binding.node_call(binding.graph.index[vertex], step)
    return replace(node, **({"mb": None, "logits_chunk": 0} | extra))


#: The recomputation mode the timed training nodes run with.
RECOMPUTE = "none"

_PPO_VERTICES = ("actor_gen", "ref_inf", "reward_inf", "critic_inf", "actor_train", "critic_train")


def _binding(scale: dict[str, int], batch: int, prompt_len: int, response_len: int, seed: int) -> Any:
    """A one-device PPO plan's one-step binding at the given model scale and run shape."""
    from ...costmodel import hardware_preset
    from ...ir import Cluster, Structure, Workload
    from ...solvers.result import result_for_plan
    from ..binding import bind
    from ..trace.records import expected_graph

    toy = ModelSpec("calibration-1b", 16, 2048, 5504, 32000, 16, 16)
    wl = Workload("ppo", {"actor": toy, "critic": toy, "reward": toy}, 64, 1, 256, 256)
    one = ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1)
    table = {v: one + ((RECOMPUTE,) if v.endswith("_train") else ()) for v in _PPO_VERTICES}
    result = result_for_plan(
        wl,
        Cluster.from_shape(
            "1x1x1", hardware_preset("cpu"), max_zero_stage=2, host_offload=False, **NO_SPLITS
        ),
        Structure("ppo", False, (("actor", 0), ("critic", 0))),
        table,
        k_eval=1,
    )
    return bind(
        result,
        expected_graph(result, 1),
        1,
        scale=scale,
        batch=batch,
        prompt_len=prompt_len,
        response_len=response_len,
        max_rollouts=1,
        seed=seed,
    )


def _time_op(w: Any, binding: Any, vertex: str, inbox: dict[str, Any], repeats: int) -> tuple[float, Any]:
    """Median worker seconds of ``repeats`` runs of ``vertex``'s node after one warm-up run, fed
    ``inbox`` (source vertex → its output) each time; also the last run's output."""
    times, out = [], None
    for _ in range(repeats + 1):
        for src, part in inbox.items():
            w.inbox[(vertex, 0, src, 0)] = [part]
        node = op_node(binding, vertex)
        if node.role is Role.TRAINING:  # each update moves the worker one version on
            node = replace(node, version=w.version, rollout_version=w.version)
        meta, out, _ = w.op(node, {src: [] for src in inbox})
        times.append(meta["worker_time"])
    return statistics.median(times[1:]), out


def _sources(binding: Any, vertex: str) -> list[str]:
    """The vertices whose data containers ``vertex`` reads."""
    g = binding.graph
    v = g.vertices[g.index[vertex]]
    wanted = {c for c in v.inputs if g.containers[c].weights_of is None}
    return [u.name for u in g.vertices if u.name != vertex and wanted & set(u.outputs)]


def _group_spec(binding: Any, vertex: str) -> ModelSpec:
    return next(g.spec for g in binding.groups if vertex in g.vertices)


def measure_torch_engine(
    *,
    quick: bool = False,
    repeats: int = 3,
    seed: int = 0,
    progress: Progress | None = None,
    scales: Sequence[dict[str, int]] = CALIBRATION_SCALES,
    shapes: Sequence[tuple[int, int, int]] | None = None,
) -> list[EngineSample]:
    """Time the runtime's generation, inference and training nodes on the torch engine (module
    docstring): one-device PPO plans over ``scales`` × ``shapes`` (batch, prompt length, response
    length; default :data:`TORCH_SHAPES`, or :data:`TORCH_SHAPES_QUICK` with ``quick``)."""
    say = progress or (lambda _m: None)
    if shapes is None:
        shapes = TORCH_SHAPES_QUICK if quick else TORCH_SHAPES
    out: list[EngineSample] = []
    for scale, (batch, lp, lr) in itertools.product(scales, shapes):
        say(f"torch engine: {scale}, batch {batch}, Lp {lp}, Lr {lr}")
        b = _binding(scale, batch, lp, lr, seed)
        n = b.shape.sequences
        produced: dict[str, Any] = {}
        with local_worker(b, "actor_gen") as w:
            t, produced["actor_gen"] = _time_op(w, b, "actor_gen", {}, repeats)
        steps = int(produced["actor_gen"]["mask"].sum(1).max())
        out.append(EngineSample("torch", "generation", _group_spec(b, "actor_gen"), "lm", n, lp, steps, t))
        for vertex, head in (("ref_inf", "lm"), ("reward_inf", "scalar"), ("critic_inf", "scalar")):
            with local_worker(b, vertex) as w:
                t, produced[vertex] = _time_op(w, b, vertex, {"actor_gen": produced["actor_gen"]}, repeats)
            out.append(EngineSample("torch", "inference", _group_spec(b, vertex), head, n, lp, lr, t))
        for vertex, head in (("actor_train", "lm"), ("critic_train", "scalar")):
            inbox = {src: produced[src] for src in _sources(b, vertex)}
            with local_worker(b, vertex) as w:
                t, _ = _time_op(w, b, vertex, inbox, repeats)
            out.append(
                EngineSample(
                    "torch", "training", _group_spec(b, vertex), head, n, lp, lr, t, recompute=RECOMPUTE
                )
            )
    return out


def _time_generate(engine: Any, prompts: list[list[int]], n: int, repeats: int) -> float:
    """Median seconds of ``engine.generate`` of ``n`` tokens per prompt, after one warm-up."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        engine.generate(prompts, max_tokens=[n] * len(prompts), seeds=list(range(len(prompts))))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _time_grid(
    engine: Any,
    spec: ModelSpec,
    vocab: int,
    grid: tuple[Sequence[int], Sequence[int], Sequence[int]],
    repeats: int,
    seed: int,
    say: Progress,
    label: str,
    tp: int = 1,
) -> list[EngineSample]:
    """One vLLM generation sample per (batch, prompt length, ``N``) of ``grid``: seeded random
    prompts, :func:`_time_generate`'s median; ``say`` hears ``label`` and the shape first."""
    out = []
    for batch, lp, n in itertools.product(*grid):
        say(f"{label}, batch {batch}, Lp {lp}, N {n}")
        rng = np.random.default_rng([seed, batch, lp, n] + ([tp] if tp > 1 else []))
        ids = rng.integers(0, vocab, size=(batch, lp)).tolist()
        t = _time_generate(engine, ids, n, repeats)
        out.append(EngineSample("vllm", "generation", spec, "lm", batch, lp, n, t, tp=tp))
    return out


def measure_vllm(
    *, quick: bool = False, repeats: int = 3, seed: int = 0, progress: Progress | None = None
) -> list[EngineSample]:
    """Time vLLM generations and weight pushes through the worker's engine (module docstring)."""
    say = progress or (lambda _m: None)
    batches, prompts, lengths = VLLM_GRID_QUICK if quick else VLLM_GRID
    out: list[EngineSample] = []
    for scale in CALIBRATION_SCALES:
        b = _binding(scale, max(batches), max(prompts), max(lengths), seed)
        spec = _group_spec(b, "actor_gen")
        say(f"vLLM: starting an engine for {scale}")
        with local_worker(b, "actor_gen", rollout_engine="vllm") as w:
            grid = (batches, prompts, lengths)
            out += _time_grid(
                w.rollouts.engine, spec, b.shape.vocab, grid, repeats, seed, say, f"vLLM: {scale}"
            )
            pushes = [w.rollouts.sync(version) for version in range(1, repeats + 2)]
            t = statistics.median(p["weight_sync_s"] for p in pushes[1:])
            out.append(EngineSample("vllm", "sync", spec, "lm", 0, 0, 0, t, nbytes=int(pushes[-1]["bytes"])))
    return out


#: vLLM tensor-parallel grid (2 ranks): batches × prompt lengths × response lengths ``N``.
VLLM_TP_GRID = ((2, 16), (32, 128), (16, 64))
VLLM_TP_GRID_QUICK = ((8,), (32,), (16,))


def measure_vllm_tp(
    *,
    tp: int = 2,
    quick: bool = False,
    repeats: int = 3,
    seed: int = 0,
    scales: Sequence[dict[str, int]] = CALIBRATION_SCALES,
    progress: Progress | None = None,
) -> list[EngineSample]:
    """Time vLLM generations on a ``tp``-rank engine (one core per rank, vLLM's own thread
    binding), per model of ``scales`` (default :data:`CALIBRATION_SCALES`), started from that
    model's seeded weights:
    what a generation replica's tensor parallelism costs beyond the one-rank terms (its
    AllReduces; the fit is :func:`fit_engine_terms`'s ``tensor_parallel`` link). Nothing when
    fewer than ``tp`` cores are allowed. Run it outside :func:`neighbour_load`: the engine takes
    every core it is given."""
    import os
    import tempfile
    from pathlib import Path

    from ..engines.hf_models import save_checkpoint
    from ..engines.vllm_engine import RolloutEngine

    if len(os.sched_getaffinity(0)) < tp:
        return []
    say = progress or (lambda _m: None)
    batches, prompts, lengths = VLLM_TP_GRID_QUICK if quick else VLLM_TP_GRID
    out: list[EngineSample] = []
    for scale in scales:
        b = _binding(scale, max(batches), max(prompts), max(lengths), seed)
        spec = _group_spec(b, "actor_gen")
        say(f"vLLM TP {tp}: starting an engine for {scale}")
        with local_worker(b, "actor_gen") as w, tempfile.TemporaryDirectory(prefix="rpeg-vllm-tp-") as d:
            save_checkpoint(
                w.rollouts.full_state(), w.group.spec, Path(d), max_positions=max(prompts) + max(lengths)
            )
            engine = RolloutEngine(d, tp=tp, max_model_len=max(prompts) + max(lengths), seed=seed)
            try:
                grid = (batches, prompts, lengths)
                out += _time_grid(
                    engine, spec, b.shape.vocab, grid, repeats, seed, say, f"vLLM TP {tp}: {scale}", tp
                )
            finally:
                engine.shutdown()
    return out


#: Model sizes of the data-parallel measurement: :data:`CALIBRATION_SCALES` and a larger one, so
#: that the gathered bytes span 20–95 MB (none is the benchmark's 8-layer, 512-wide model).
DP_SCALES: tuple[dict[str, int], ...] = (*CALIBRATION_SCALES, {"layers": 4, "hidden": 768, "heads": 12})


def _timed_backward(model: Any, opt: Any, x: Any, sync: bool) -> float:
    """Seconds of one backward of an FSDP2 model from fresh gradients, reducing (``sync``) or
    not; both DP ranks start it together (a barrier)."""
    import torch.distributed as dist

    opt.zero_grad()
    opt.sync_gradients(sync)
    loss = model(x).float().logsumexp(-1).mean()
    dist.barrier(group=opt.group)
    t0 = time.perf_counter()
    loss.backward()
    return time.perf_counter() - t0


def _timed_gather(model: Any, group: Any) -> float:
    """Seconds of FSDP2's parameter AllGather after an update (``reshard`` + ``unshard``)."""
    import torch.distributed as dist

    dist.barrier(group=group)
    t0 = time.perf_counter()
    model.reshard()
    model.unshard()
    return time.perf_counter() - t0


def _dp_rank(
    rank: int, world: int, init_file: str, specs: list[ModelSpec], repeats: int, seed: int, queue: Any
) -> None:
    """One rank of :func:`measure_data_parallel` (a spawned process): per spec, the median
    seconds of the FSDP2 update's ReduceScatter and AllGather on this rank, put on ``queue`` as
    ``(rank, [(reduce_scatter_s, all_gather_s, nbytes), ...])``, or ``(rank, error text)``."""
    import datetime
    import os

    import torch
    import torch.distributed as dist

    from ..worker.model import StageModel
    from ..worker.parallel import FSDPAdam, world_mesh

    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=600),
        )
        mesh = world_mesh(rank, world, 1, 1, "cpu")
        out = []
        for spec in specs:
            model = StageModel(spec, Head.LM, seed=seed)
            nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            opt = FSDPAdam(model, mesh.dp_mesh, mesh.dp_group, lr=1e-4)
            x = torch.randint(0, spec.vocab, (2, 32), generator=torch.Generator().manual_seed(seed + rank))

            rs, ag = [], []
            for _ in range(repeats + 1):
                rs.append(_timed_backward(model, opt, x, True) - _timed_backward(model, opt, x, False))
                ag.append(_timed_gather(model, mesh.dp_group))
            opt.zero_grad()
            out.append((max(0.0, statistics.median(rs[1:])), statistics.median(ag[1:]), nbytes))
        queue.put((rank, out))
    except BaseException as exc:  # reported to the parent, which raises
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def measure_data_parallel(
    *,
    quick: bool = False,
    repeats: int = 3,
    seed: int = 0,
    world: int = 2,
    progress: Progress | None = None,
    timeout_s: float = 900.0,
) -> list[EngineSample]:
    """Time the torch engine's data-parallel update (module docstring) on ``world`` gloo ranks,
    one spawned process each, bound to one core each (round robin over the allowed cores).

    One ``"data_parallel"`` sample per model size (:data:`DP_SCALES`; the first two with
    ``quick``): the slowest rank's ReduceScatter + AllGather seconds, ``nbytes`` the model's full
    parameter bytes, ``ranks = world``.

    Raises
    ------
    ValueError
        For ``world < 2`` or ``repeats < 1``.
    RuntimeError
        If a rank fails or does not answer within ``timeout_s``.
    """
    import multiprocessing
    import queue as queue_mod
    import tempfile
    from pathlib import Path

    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"measure_data_parallel: world must be an integer >= 2, got {world!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"measure_data_parallel: repeats must be a positive integer, got {repeats!r}")
    say = progress or (lambda _m: None)
    scales = DP_SCALES[:2] if quick else DP_SCALES
    specs = [_group_spec(_binding(scale, 2, 8, 8, seed), "actor_train") for scale in scales]
    say(f"torch engine, data parallel: FSDP2 over {world} gloo ranks, {len(specs)} model sizes")
    ctx = multiprocessing.get_context("spawn")
    results: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rpeg-dp-") as tmp:
        q = ctx.Queue()
        init_file = str(Path(tmp) / "rendezvous")
        procs = [
            ctx.Process(target=_dp_rank, args=(r, world, init_file, specs, repeats, seed, q), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world:
                try:
                    rank, got = q.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except queue_mod.Empty:
                    dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results]
                    if dead or time.monotonic() > deadline:
                        why = (
                            f"rank(s) {dead} exited without a result"
                            if dead
                            else f"no answer in {timeout_s:.0f} s"
                        )
                        raise RuntimeError(f"measure_data_parallel: {why}") from None
                    continue
                if isinstance(got, str):
                    raise RuntimeError(f"measure_data_parallel: rank {rank} failed: {got}")
                results[rank] = got
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
    out = []
    for i, spec in enumerate(specs):
        rs = max(results[r][i][0] for r in range(world))
        ag = max(results[r][i][1] for r in range(world))
        out.append(
            EngineSample(
                "torch",
                "data_parallel",
                spec,
                "lm",
                0,
                0,
                0,
                rs + ag,
                nbytes=int(results[0][i][2]),
                ranks=world,
            )
        )
    return out


def measure_dispatch(samples: int = 40) -> list[float]:
    """Round-trip seconds of an empty Ray actor call (local Ray, started and stopped here when
    none is running)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        class _Echo:
            def call(self, x: Any = None) -> Any:
                return x

        actor = _Echo.remote()
        ray.get(actor.call.remote())
        out = []
        for _ in range(samples):
            t0 = time.perf_counter()
            ray.get(actor.call.remote({"node": 0}))
            out.append(time.perf_counter() - t0)
        ray.kill(actor)
        return out
    finally:
        if started:
            ray.shutdown()


def _load_loop(core: int, stop: Any, seed: int) -> None:
    """A neighbour device's work until ``stop`` is set: forward and backward passes of a
    512-wide two-layer transformer over 4 × 256 tokens, one thread, on ``core``."""
    import os

    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(512, 8, 1024, dropout=0.0, batch_first=True), num_layers=2
    )
    x = torch.randn(4, 256, 512)
    while not stop.is_set():
        layer(x).square().mean().backward()
        layer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def neighbour_load(enabled: bool = True, progress: Progress | None = None) -> Iterator[int]:
    """Pin this process to its first allowed core and keep the other allowed cores busy with
    :func:`_load_loop` (one process each) for the duration; yields how many cores are loaded
    (0 when disabled or when only one core is allowed). The affinity is restored afterwards.

    The runtime's one-rank vLLM engines bind to their device's core (device 0: the first allowed
    core), so an engine timed here computes on this process's core, next to the load.
    """
    import multiprocessing
    import os

    allowed = sorted(os.sched_getaffinity(0))
    if not enabled or len(allowed) < 2:
        yield 0
        return
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [
        ctx.Process(target=_load_loop, args=(c, stop, i), daemon=True) for i, c in enumerate(allowed[1:])
    ]
    for p in procs:
        p.start()
    os.sched_setaffinity(0, {allowed[0]})
    if progress is not None:
        progress(f"measuring on core {allowed[0]} with a training loop on core(s) {allowed[1:]}")
    try:
        yield len(procs)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
        os.sched_setaffinity(0, set(allowed))


def calibrate_engines(
    hw: Hardware,
    *,
    engines: Sequence[str] = ("torch", "vllm"),
    quick: bool = False,
    repeats: int = 3,
    seed: int = 0,
    dispatch: bool = True,
    load: bool = True,
    progress: Progress | None = None,
) -> EngineCalibration:
    """Measure the runtime's engines on this machine and return ``hw`` with their terms.

    Parameters
    ----------
    hw
        The microbenchmarked hardware (:func:`rpeg.runtime.calibrate.measure.calibrate`); its roofline gives
        the fits' GEMM features.
    engines
        ``"torch"`` and/or ``"vllm"``.
    quick
        A reduced grid (for tests and a first look).
    repeats
        Timed repeats per sample after one warm-up (the median is kept).
    seed
        Seeds models, prompts and requests.
    dispatch
        Also time Ray's dispatch (``dispatch_s``).
    load
        Measure as a device computes when the others do too (:func:`neighbour_load`): this
        process and the engine on the first allowed core, one training loop on each other core.
        CPU "devices" share the host's memory bandwidth and caches; timed alone, an operation ran
        about 40% faster than in a plan where every device is busy (docs/cost-model.md §7,
        "Under load"). ``False`` times alone.
    progress
        Called with a short message before each measurement.

    Returns
    -------
    EngineCalibration
        ``hardware``: ``hw`` with ``engines``, ``engine_for`` (generation on vLLM when measured,
        else torch; inference and training on torch) and ``dispatch_s``.

    Raises
    ------
    ValueError
        For an unknown engine name or ``repeats < 1``.
    """
    unknown = sorted(set(engines) - {"torch", "vllm"})
    if unknown or not engines:
        raise ValueError(f"calibrate_engines: engines must be 'torch' and/or 'vllm', got {list(engines)!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"calibrate_engines: repeats must be a positive integer, got {repeats!r}")
    started = time.perf_counter()
    samples: list[EngineSample] = []
    with neighbour_load(load, progress) as loaded:
        if "torch" in engines:
            samples += measure_torch_engine(quick=quick, repeats=repeats, seed=seed, progress=progress)
        if "vllm" in engines:
            samples += measure_vllm(quick=quick, repeats=repeats, seed=seed, progress=progress)
    if "torch" in engines:  # its two ranks load each other's cores: outside the neighbour load
        samples += measure_data_parallel(quick=quick, repeats=repeats, seed=seed, progress=progress)
    if "vllm" in engines:  # a 2-rank engine takes both cores: outside the neighbour load too
        samples += measure_vllm_tp(quick=quick, repeats=repeats, seed=seed, progress=progress)
    dispatch_samples = measure_dispatch(15 if quick else 40) if dispatch else []
    terms, fits = fit_engine_terms(samples, hw)
    names = {e.name for e in terms}
    gen = "vllm" if "vllm" in names else ("torch" if "torch" in names else "")
    other = "torch" if "torch" in names else ""
    sources = dict(hw.sources)
    sources["engines"] = (
        f"rpeg calibrate through the engines ({', '.join(sorted(names))}): "
        f"{len(samples)} timed operations, {'quick' if quick else 'full'} grid, "
        + (f"with a training loop on each of the {loaded} other core(s)" if loaded else "timed alone")
    )
    if dispatch_samples:
        sources["dispatch_s"] = f"median of {len(dispatch_samples)} empty Ray actor calls"
    out = replace(
        hw,
        engines=tuple(terms),
        engine_for=(gen, other, other),
        dispatch_s=float(statistics.median(dispatch_samples)) if dispatch_samples else hw.dispatch_s,
        sources=tuple(sources.items()),
    )
    return EngineCalibration(out, samples, fits, dispatch_samples, time.perf_counter() - started)
