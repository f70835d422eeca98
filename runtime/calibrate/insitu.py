"""In-situ calibration: the engine terms refitted to the runtime's own calibration runs.

:mod:`rpeg.runtime.calibrate.engine_terms` times each operation in one process, beside a training
loop on every other core. A plan's nodes run in Ray worker processes next to vLLM's engine
processes, Ray's own daemons and the other groups' workers, and data-parallel ranks wait for
each other at every update; on the 2-core machine of ``benchmarks/RESULTS.md`` the same
training node took 3.3 s timed as the calibration times it and 4.1–4.7 s inside a plan
(docs/cost-model.md §7). This module measures that gap where it arises: it runs calibration plans
through the runtime itself (:func:`rpeg.runtime.driver.runner.run`, real engines, a model and run shape
that are not the fidelity benchmark's) and fits one factor per operation class to their traces.

The model. A node's predicted seconds are linear in its class's engine terms ``(1/η, c_call,
c_layer, c_step)`` and in the data-parallel link ``(α_dp, β_dp)`` (docs/cost-model.md §2,
"Engine terms"). Scaling a class's terms by ``κ`` — ``η ← η/κ``, ``c_* ← κ·c_*`` — scales the part
of the prediction they produce:

    p_i(κ) = R_i + κ_c(i)·E_i + κ_dp·D_i

with ``E_i`` the seconds node ``i`` owes to its class's engine terms and ``D_i`` those it owes to the
data-parallel link, both read off the cost model as exact finite differences (the prediction
with the terms doubled less the prediction as calibrated), and ``R_i`` the rest (tensor and
pipeline transfers, the optimizer, dispatch). The classes are generation (the rollout engine's
prefill and decode terms), inference and training. The factors minimise the relative error the
fidelity figures judge,

    min_{κ ≥ 0} Σ_i ((p_i(κ) − m_i)/m_i)²

(non-negative least squares, :func:`~rpeg.runtime.calibrate.engine_terms.nnls`), over every OP node
after each run's first (warm-up) step, with ``m_i`` the node's worker seconds less a
publication's (as :mod:`rpeg.runtime.trace.fidelity` compares them). A generation node that pushed new
weights into its engine is compared without the push on both sides: the measured push
(``weight_sync_s``) and the predicted sync (the weight-sync link's finite difference) are taken
off, so the sync link keeps its microbenchmarked value.

The same runs fit the inference engine's forward-memory factor ``μ`` (``OpTerms.memory_factor``,
:func:`fit_memory_factor`): a worker whose predicted peak is a no-grad forward pass is predicted
``P_w + μ·A_w`` (:func:`memory_samples`), fitted to its measured peak by least squares on the
relative error.

The calibration plans (:data:`INSITU_PLANS`) cover both ways a 2-device host runs a PPO step: every
invocation data parallel over both devices (``spread``), and one device per model group
(``split``: the actor on device 0, reference, reward and critic on device 1), whose length
phases overlap across devices. On one device only the latter's placement exists and
``split`` runs everything on device 0.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...ir.cluster import NO_SPLITS
from ...ir.hardware import Hardware, Link, OpTerms
from .engine_terms import nnls

__all__ = [
    "INSITU_CLASSES",
    "INSITU_PLANS",
    "INSITU_SHAPE",
    "InsituCalibration",
    "InsituSample",
    "MemorySample",
    "apply_factors",
    "apply_memory_factor",
    "calibrate_in_situ",
    "fit_factors",
    "fit_memory_factor",
    "insitu_plan",
    "insitu_samples",
    "memory_samples",
]

Progress = Callable[[str], None]

#: The fitted factors, in order: one per operation class, then the data-parallel link.
INSITU_CLASSES: tuple[str, ...] = ("generation", "inference", "training", "data_parallel")

#: The calibration runs' model and shape: a 6-layer, 384-wide Llama (one of the microbenchmarks'
#: ``CALIBRATION_SCALES``; the fidelity benchmark runs 8 layers at 512), 8 sequences,
#: ``Lp = 64``, ``Lr = 96`` (the benchmark: 128 and 128).
INSITU_SHAPE: dict[str, Any] = {
    "scale": {"layers": 6, "hidden": 384, "heads": 6},
    "batch": 8,
    "prompt_len": 64,
    "response_len": 96,
}

#: Calibration plan names (:func:`insitu_plan`).
INSITU_PLANS: tuple[str, ...] = ("spread", "split")

_VERTICES = ("actor_gen", "ref_inf", "reward_inf", "critic_inf", "actor_train", "critic_train")
_RECOMPUTE = "none"  # the runtime trains without activation recomputation


# ---------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class InsituSample:
    """One compared OP node of a calibration run.

    Attributes
    ----------
    plan, vertex, op_class
        Where it ran and its class (``"generation"``, ``"inference"``, ``"training"``).
    step
        Its step.
    measured
        ``m_i``: worker seconds less a publication and less an engine weight push.
    rest
        ``R_i``: predicted seconds that no fitted term scales (dispatch and the predicted sync
        already taken off).
    engine
        ``E_i``: predicted seconds owed to the class's engine terms.
    data_parallel
        ``D_i``: predicted seconds owed to the data-parallel link.
    """

    plan: str
    vertex: str
    op_class: str
    step: int
    measured: float
    rest: float
    engine: float
    data_parallel: float = 0.0

    def predicted(self, factors: dict[str, float]) -> float:
        """``R_i + κ_c·E_i + κ_dp·D_i`` under ``factors`` (missing ones are 1)."""
        return (
            self.rest
            + factors.get(self.op_class, 1.0) * self.engine
            + factors.get("data_parallel", 1.0) * self.data_parallel
        )


@dataclass(frozen=True)
class MemorySample:
    """One worker of a calibration run whose predicted peak is linear in ``μ``: ``P_w + μ·A_w``.

    Attributes
    ----------
    plan, worker
        Where it ran (``"g{group}/r{rank}"``).
    measured
        ``m_w``: its private-memory peak less its footprint before the model, bytes.
    rest
        ``P_w``: predicted bytes that ``μ`` does not scale (parameters, training state).
    forward
        ``A_w``: SPEC's forward-activation bytes of its largest no-grad forward pass.
    """

    plan: str
    worker: str
    measured: float
    rest: float
    forward: float

    def predicted(self, mu: float) -> float:
        """``P_w + μ·A_w``."""
        return self.rest + mu * self.forward


@dataclass
class InsituCalibration:
    """What :func:`calibrate_in_situ` ran and fitted.

    Attributes
    ----------
    hardware
        The input hardware with the factors applied (:func:`apply_factors`).
    factors
        ``κ`` per entry of :data:`INSITU_CLASSES` that the runs could determine (a class with no
        sample, or an engine with no terms for it, keeps 1 and is absent).
    samples
        Every compared OP node.
    mape_before, mape_after
        Operator MAPE (percent) of the samples with the microbenchmarked terms and with the
        factors.
    plans
        Plan name → mean step seconds after the first step: measured, and predicted with the
        microbenchmarked terms and with the factors.
    undetermined
        Classes the runs could not determine, kept at 1 (:func:`fit_factors`).
    elapsed
        Seconds the runs and the fit took.
    memory_factor
        ``μ`` of the inference engine (:func:`fit_memory_factor`); ``None`` when no worker's
        peak depends on it (it stays at the hardware's value).
    memory_samples
        The workers it was fitted to.
    """

    hardware: Hardware
    factors: dict[str, float]
    samples: list[InsituSample]
    mape_before: float
    mape_after: float
    plans: dict[str, dict[str, float]] = field(default_factory=dict)
    undetermined: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    memory_factor: float | None = None
    memory_samples: list[MemorySample] = field(default_factory=list)

    def memory_mape(self, mu: float) -> float:
        """Memory MAPE (percent) of :attr:`memory_samples` with ``μ = mu`` (NaN without samples)."""
        if not self.memory_samples:
            return float("nan")
        return 100.0 * statistics.fmean(
            abs(s.predicted(mu) - s.measured) / s.measured for s in self.memory_samples
        )

    def table(self) -> str:
        """The factors and the samples' MAPE before and after, as text."""
        counts = {c: sum(s.op_class == c for s in self.samples) for c in INSITU_CLASSES[:3]}
        counts["data_parallel"] = sum(s.data_parallel > 0 for s in self.samples)
        lines = [f"{'in-situ factor':15} {'κ':>6} {'nodes':>5}"]
        lines += [f"{c:15} {k:6.3f} {counts.get(c, 0):5d}" for c, k in self.factors.items()]
        lines += [f"{c:15} {'1 (not determined)':>6} {counts.get(c, 0):5d}" for c in self.undetermined]
        for name, p in self.plans.items():
            lines.append(
                f"plan {name!r}: measured {p['measured_step_s']:.2f} s per step, predicted "
                f"{p['predicted_step_s_before']:.2f} s before, {p['predicted_step_s_after']:.2f} s after"
            )
        lines.append(
            f"operator MAPE of the calibration runs: {self.mape_before:.1f}% with the microbenchmarked "
            f"terms, {self.mape_after:.1f}% with the factors ({len(self.samples)} OP nodes)"
        )
        if self.memory_factor is None:
            lines.append("forward memory factor μ: not determined (no worker's peak depends on it)")
        else:
            lines.append(
                f"forward memory factor μ {self.memory_factor:.3f}: memory MAPE of "
                f"{len(self.memory_samples)} workers {self.memory_mape(1.0):.1f}% with μ = 1, "
                f"{self.memory_mape(self.memory_factor):.1f}% fitted"
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """The factors and the MAPE before and after on one line (:meth:`table` has the runs)."""
        factors = ", ".join(f"{c} {k:.3g}" for c, k in self.factors.items())
        mu = "not determined" if self.memory_factor is None else f"{self.memory_factor:.3g}"
        return (
            f"in-situ factors κ: {factors}; operator MAPE {self.mape_before:.1f}% → {self.mape_after:.1f}% "
            f"({len(self.samples)} OP nodes); forward memory factor μ {mu}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The factors, the runs' figures and every sample (``rpeg.insitu-calibration/1``)."""
        from dataclasses import asdict

        return {
            "format": "rpeg.insitu-calibration/1",
            "shape": INSITU_SHAPE,
            "factors": self.factors,
            "undetermined": self.undetermined,
            "mape_before_pct": self.mape_before,
            "mape_after_pct": self.mape_after,
            "plans": self.plans,
            "samples": [asdict(s) for s in self.samples],
            "memory_factor": self.memory_factor,
            "memory_samples": [asdict(s) for s in self.memory_samples],
            "elapsed": self.elapsed,
        }


# ---------------------------------------------------------------------------------------------- plans
def insitu_plan(name: str, devices: int = 2) -> Any:
    """The calibration plan ``name`` (:data:`INSITU_PLANS`) of a PPO step on ``devices`` (1 or 2)
    CPU devices, as a :class:`~rpeg.solvers.result.Result`.

    Raises
    ------
    ValueError
        For another name, or ``devices`` not 1 or 2; for ``"spread"`` on one device.
    """
    from ...costmodel import hardware_preset
    from ...ir import Cluster, ModelSpec, Structure, Workload
    from ...solvers.result import result_for_plan

    if name not in INSITU_PLANS:
        raise ValueError(f"insitu_plan: unknown plan {name!r}; plans: {', '.join(INSITU_PLANS)}")
    if devices not in (1, 2):
        raise ValueError(f"insitu_plan: devices must be 1 or 2, got {devices!r}")
    if name == "spread" and devices == 1:
        raise ValueError("insitu_plan: 'spread' needs 2 devices")
    both, d0, d1 = ((0, 0, 0), (1, 1, 2)), ((0, 0, 0), (1, 1, 1)), ((0, 0, 1), (1, 1, 1))
    if devices == 1:
        d1 = d0
    table = {}
    for v in _VERTICES:
        train = (_RECOMPUTE,) if v.endswith("_train") else ()
        if name == "spread":
            table[v] = (*both, 2, 1, 1, 1, *train)
        else:
            table[v] = (*(d0 if v.startswith("actor") else d1), 1, 1, 1, 1, *train)
    spec = ModelSpec("calibration-1b", 16, 2048, 5504, 32000, 16, 16)  # scaled by INSITU_SHAPE
    wl = Workload("ppo", {"actor": spec, "critic": spec, "reward": spec}, 64, 1, 256, 256)
    cluster = Cluster.from_shape(
        f"1x1x{devices}", hardware_preset("cpu"), max_zero_stage=2, host_offload=False, **NO_SPLITS
    )
    return result_for_plan(wl, cluster, Structure("ppo", False, (("actor", 0), ("critic", 0))), table)


# ---------------------------------------------------------------------------------------------- features
def _scaled_terms(terms: OpTerms | None, k: float) -> OpTerms | None:
    if terms is None:
        return None
    return replace(
        terms,
        efficiency=terms.efficiency / k,
        per_call_s=terms.per_call_s * k,
        per_layer_s=terms.per_layer_s * k,
        per_step_s=terms.per_step_s * k,
    )


def _scaled_link(link: Link | None, k: float) -> Link | None:
    return None if link is None else Link(link.alpha * k, link.beta * k)


def apply_factors(hw: Hardware, factors: dict[str, float]) -> Hardware:
    """``hw`` with each class's engine terms scaled by its factor ``κ``: ``η ← η/κ`` and
    ``c_call, c_layer, c_step ← κ·c`` of the engine that runs the class (generation: its prefill
    and decode terms), and ``(α_dp, β_dp) ← κ_dp·(α_dp, β_dp)`` of the training engine's
    data-parallel link. An engine that runs several classes gets each class's factor on that
    class's terms only. Missing factors are 1.

    Raises
    ------
    ValueError
        For an unknown class or a factor that is not positive and finite.
    """
    bad = sorted(set(factors) - set(INSITU_CLASSES))
    if bad:
        raise ValueError(f"apply_factors: unknown class(es) {bad}; classes: {', '.join(INSITU_CLASSES)}")
    for c, k in factors.items():
        if not (isinstance(k, (int, float)) and np.isfinite(k) and k > 0):
            raise ValueError(f"apply_factors: the factor of {c} must be positive and finite, got {k!r}")
    engines = []
    for eng in hw.engines:
        changes: dict[str, Any] = {}
        for c, k in factors.items():
            role = "training" if c == "data_parallel" else c
            if hw.engine(role) is None or hw.engine(role).name != eng.name:
                continue
            if c == "generation":
                changes["prefill"] = _scaled_terms(eng.prefill, k)
                changes["decode"] = _scaled_terms(eng.decode, k)
            elif c == "data_parallel":
                changes["data_parallel"] = _scaled_link(eng.data_parallel, k)
            else:
                changes[c] = _scaled_terms(getattr(eng, c), k)
        engines.append(replace(eng, **changes))
    return replace(hw, engines=tuple(engines))


def apply_memory_factor(hw: Hardware, mu: float) -> Hardware:
    """``hw`` with the inference engine's ``memory_factor`` set to ``mu`` (its inference terms
    created neutral, :data:`~rpeg.ir.hardware.NEUTRAL` but for ``μ``, where it has none).

    Raises
    ------
    ValueError
        If ``mu`` is not positive and finite, or no engine runs inference (``engine_for``).
    """
    if not (isinstance(mu, (int, float)) and np.isfinite(mu) and mu > 0):
        raise ValueError(f"apply_memory_factor: μ must be positive and finite, got {mu!r}")
    eng = hw.engine("inference")
    if eng is None:
        raise ValueError("apply_memory_factor: the hardware names no inference engine (engine_for)")
    return hw.with_engine(
        replace(eng, inference=replace(eng.inference or OpTerms(), memory_factor=float(mu)))
    )


def _sync_doubled(hw: Hardware) -> Hardware:
    eng = hw.engine("generation")
    if eng is None or eng.weight_sync is None:
        return hw
    return hw.with_engine(replace(eng, weight_sync=_scaled_link(eng.weight_sync, 2.0)))


def _roles(binding: Any) -> dict[str, str]:
    return {v.name: v.role.value for v in binding.graph.vertices}


def insitu_samples(plan: str, binding: Any, records: Sequence[Any], hw: Hardware) -> list[InsituSample]:
    """The compared OP nodes of one calibration run, with their cost-model parts (module
    docstring): ``E_i``, ``D_i`` and the predicted sync from :func:`~rpeg.runtime.trace.report.predict`
    with the terms doubled, less the prediction with ``hw``.

    Parameters
    ----------
    plan
        The plan's name (kept in the samples).
    binding
        The run's binding (its plan, graph and run shape).
    records
        The run's trace records.
    hw
        The hardware the prediction uses (microbenchmarked engine terms).
    """
    from ..trace.report import predict

    base = predict(binding, hw)[0]
    doubled = {c: predict(binding, apply_factors(hw, {c: 2.0}))[0] for c in INSITU_CLASSES}
    sync = predict(binding, _sync_doubled(hw))[0]
    roles = _roles(binding)
    out = []
    for r in records:
        if r.kind != "op" or r.step < 1 or not (0 <= r.node < len(base)):
            continue
        i = r.node
        cls = roles.get(r.vertex, "inference")
        facts = (r.engine or {}).get("replicas", [r.engine or {}])
        pushed = max((float(f.get("weight_sync_s", 0.0)) for f in facts), default=0.0)
        measured = float(r.worker_time) - float(getattr(r, "publish_s", 0.0)) - pushed
        predicted = base[i] - hw.dispatch_s - (sync[i] - base[i])  # generation without its sync
        engine = doubled[cls][i] - base[i]
        dp = doubled["data_parallel"][i] - base[i] if cls == "training" else 0.0
        if measured <= 0:
            continue
        out.append(InsituSample(plan, r.vertex, cls, r.step, measured, predicted - engine - dp, engine, dp))
    return out


def memory_samples(
    plan: str, binding: Any, records: Sequence[Any], rollout_engine: str
) -> list[MemorySample]:
    """The workers of one calibration run whose predicted peak is ``P_w + μ·A_w``
    (:func:`~rpeg.runtime.trace.report.predicted_memory`): read off the prediction at ``μ = 1, 2, 3``
    as exact differences, ``A_w = p(2) − p(1)``, ``P_w = p(1) − A_w``, kept where ``A_w > 0`` and
    ``p(3) − p(2) = A_w`` (the forward pass is the worker's peak at every ``μ`` tried: workers
    whose peak is a training step or a weight gather do not depend on ``μ``). Measured: the
    records' peaks (:func:`~rpeg.runtime.trace.fidelity.worker_peaks`)."""
    from ..trace.fidelity import worker_peaks
    from ..trace.report import predicted_memory

    p1, p2, p3 = (predicted_memory(binding, rollout_engine, forward_factor=k) for k in (1.0, 2.0, 3.0))
    peaks = worker_peaks(records)
    out = []
    for w in sorted(p1):
        a = p2[w] - p1[w]
        if a > 0 and abs((p3[w] - p2[w]) - a) <= 1e-9 * p3[w] and peaks.get(w, 0.0) > 0:
            out.append(MemorySample(plan, w, peaks[w], p1[w] - a, a))
    return out


def fit_memory_factor(samples: Sequence[MemorySample]) -> float | None:
    """``μ`` minimising the relative error of the workers' predicted peaks,

        min_μ Σ_w ((P_w + μ·A_w − m_w)/m_w)²  ⇒  μ = Σ_w A_w·(m_w − P_w)/m_w² / Σ_w A_w²/m_w²,

    or ``None`` without samples or when that is not positive (the measured peaks lie below the
    parameters alone: nothing to scale)."""
    if not samples:
        return None
    num = sum(s.forward * (s.measured - s.rest) / s.measured**2 for s in samples)
    den = sum(s.forward**2 / s.measured**2 for s in samples)
    mu = num / den
    return float(mu) if mu > 0 else None


# ---------------------------------------------------------------------------------------------- fit
def _mape(samples: Sequence[InsituSample], factors: dict[str, float]) -> float:
    return 100.0 * statistics.fmean(abs(s.predicted(factors) - s.measured) / s.measured for s in samples)


def fit_factors(samples: Sequence[InsituSample]) -> tuple[dict[str, float], list[str]]:
    """The factors ``κ ≥ 0`` minimising ``Σ ((R_i + κ_c·E_i + κ_dp·D_i − m_i)/m_i)²`` (module
    docstring).

    A class no sample depends on (``E_i = 0``, or ``D_i = 0``, for all) is left out. A class whose
    factor fits to 0 is not determined by the runs (the other terms absorb its seconds): it is
    fixed at 1 — its microbenchmarked terms stand — and the others are refitted.

    Returns
    -------
    tuple[dict[str, float], list[str]]
        The fitted factors (all positive), and the classes fixed at 1 as undetermined.

    Raises
    ------
    ValueError
        Without samples.
    """
    if not samples:
        raise ValueError("fit_factors: no samples")
    m = np.array([s.measured for s in samples])
    columns = {}
    for c in INSITU_CLASSES:
        if c == "data_parallel":
            col = np.array([s.data_parallel for s in samples])
        else:
            col = np.array([s.engine if s.op_class == c else 0.0 for s in samples])
        if np.any(col > 0):
            columns[c] = col
    fixed: list[str] = []
    while True:
        free = [c for c in columns if c not in fixed]
        rest = np.array([s.rest for s in samples]) + sum((columns[c] for c in fixed), np.zeros(len(m)))
        if not free:
            return {}, fixed
        a = np.stack([columns[c] for c in free], axis=1)
        x = nnls(a / m[:, None], (m - rest) / m)
        zero = [c for c, k in zip(free, x) if not k > 0]
        if not zero:
            return {c: float(k) for c, k in zip(free, x)}, fixed
        fixed += zero


def calibrate_in_situ(
    hw: Hardware,
    *,
    rollout_engine: str | None = None,
    steps: int = 3,
    seed: int = 0,
    devices: int = 2,
    shape: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> InsituCalibration:
    """Run the calibration plans through the runtime and fit the in-situ factors (module
    docstring).

    Parameters
    ----------
    hw
        Hardware with engine terms (``rpeg calibrate``'s engine stage); its ``engine_for`` names
        the engines the factors scale.
    rollout_engine
        ``"vllm"`` or ``"torch"``: the runs' rollouts; default the hardware's generation engine
        (``engine_for``), which must be this one.
    steps
        Steps per plan (the first is warm-up and not fitted); at least 2.
    seed
        The runs' seed.
    devices
        CPU devices of the runs, 1 or 2 (2 runs both plans; 1 only ``split``, on one device).
    shape
        The runs' ``scale``, ``batch``, ``prompt_len``, ``response_len`` (default
        :data:`INSITU_SHAPE`).
    progress
        Called with a short message before each run.

    Returns
    -------
    InsituCalibration

    Raises
    ------
    ValueError
        For ``steps < 2``, a rollout engine other than the hardware's generation engine, or
        hardware without engine terms.
    RuntimeError
        When a calibration run's trace does not verify.
    """
    import ray

    from ..binding import bind
    from ..driver.pool import start_local_ray
    from ..driver.runner import run
    from ..trace.records import expected_graph
    from ..trace.report import predict

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(
            f"calibrate_in_situ: steps must be an integer ≥ 2 (step 0 is warm-up), got {steps!r}"
        )
    if not hw.engines:
        raise ValueError(
            "calibrate_in_situ: the hardware has no engine terms to scale (run the engine stage first)"
        )
    gen = hw.engine_for[0] or "torch"
    rollout_engine = rollout_engine or gen
    if rollout_engine not in ("vllm", "torch") or rollout_engine != gen:
        raise ValueError(
            f"calibrate_in_situ: rollout_engine must be the hardware's generation engine {gen!r} "
            f"('vllm' or 'torch'), got {rollout_engine!r}"
        )
    # the engines a run predicts with (rpeg.runtime.driver.runner)
    hw = hw.using(generation=rollout_engine, inference="torch", training="torch")
    shape = dict(INSITU_SHAPE if shape is None else shape)
    names = INSITU_PLANS if devices == 2 else ("split",)
    started = time.perf_counter()
    samples: list[InsituSample] = []
    mem_samples: list[MemorySample] = []
    plans: dict[str, dict[str, float]] = {}
    bindings = {}
    own_ray = not ray.is_initialized()
    if own_ray:
        start_local_ray(devices, num_cpus=max(2, devices))
    try:
        for name in names:
            if progress:
                progress(f"in situ: plan {name!r}, {steps} steps ({rollout_engine} rollouts)")
            result = insitu_plan(name, devices)
            rep = run(result, steps, seed=seed, hardware=hw, rollout_engine=rollout_engine, **shape)
            if rep.problems:
                raise RuntimeError(
                    f"calibrate_in_situ: the {name!r} run's trace does not verify: {rep.problems[:3]}"
                )
            binding = bind(result, expected_graph(result, steps), steps, seed=seed, **shape)
            stored = rep.trace.meta.get("predicted_durations") or []
            if not np.allclose(predict(binding, hw)[0], stored, rtol=1e-9, atol=1e-12):
                raise RuntimeError(
                    f"calibrate_in_situ: the {name!r} run's stored predictions differ from the "
                    "binding's (a bug: the features would not be the run's)"
                )
            bindings[name] = (binding, rep)
            samples += insitu_samples(name, binding, rep.trace.records, hw)
            mem_samples += memory_samples(name, binding, rep.trace.records, rollout_engine)
    finally:
        if own_ray:
            ray.shutdown()
    factors, undetermined = fit_factors(samples)
    fitted = apply_factors(hw, factors)
    mu = fit_memory_factor(mem_samples)
    if mu is not None:
        fitted = apply_memory_factor(fitted, mu)
    for name, (binding, rep) in bindings.items():
        after = predict(binding, fitted)[2]
        plans[name] = {
            "measured_step_s": statistics.fmean(rep.step_times[1:]),
            "predicted_step_s_before": statistics.fmean(predict(binding, hw)[2][1:]),
            "predicted_step_s_after": statistics.fmean(after[1:]),
        }
    sources = dict(fitted.sources)
    sources["engines.in_situ"] = (
        f"in-situ factors from {len(samples)} OP nodes of {len(names)} calibration run(s) "
        f"({', '.join(names)}; {steps} steps, {rollout_engine} rollouts): "
        + ", ".join(f"{c} {k:.3f}" for c, k in factors.items())
        + (f"; not determined, kept at 1: {', '.join(undetermined)}" if undetermined else "")
        + (
            f"; forward memory factor {mu:.3f} from {len(mem_samples)} workers' peaks"
            if mu is not None
            else "; forward memory factor not determined"
        )
    )
    fitted = replace(fitted, sources=tuple(sources.items()))
    return InsituCalibration(
        fitted,
        factors,
        samples,
        _mape(samples, {}),
        _mape(samples, factors),
        plans,
        undetermined,
        time.perf_counter() - started,
        mu,
        mem_samples,
    )
