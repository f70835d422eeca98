"""Adaptation: replan a running RL job when its GPU pool or response lengths drift (SPEC §10;
Nereus paper §4, §7.3.3).

This floor sits above :mod:`rpeg.solvers` (it calls the planner and
:func:`~rpeg.solvers.transition.plan_transition`); nothing below imports it, and the runtime
does not either. One room per piece:

* :mod:`.monitor` — the :class:`Monitor`, its triggers (:class:`Trigger`) and the horizons ``H_x``;
* :mod:`.admission` — the payback rule :func:`admit` (Nereus Eq. 2);
* :mod:`.policies` — when to replan and what to admit: :class:`Payback` and the baselines;
* :mod:`.calibration` — per-operation-class efficiency factors learnt from measured steps;
* :mod:`.plan_cache` — the memoised planner / evaluator / transition oracle and its fallback
  targets;
* :mod:`.controller` — the :class:`AdaptController` that ties them together at each boundary;
* :mod:`.simulate` — trace-driven replay of policies over a :class:`DriftTrace`.

``pool_cluster`` and ``with_response_len`` live in :mod:`rpeg.ir.cluster` and
:mod:`rpeg.ir.workload`; they are re-exported here because the controller's callers use them.
"""

from ..ir.cluster import pool_cluster
from ..ir.workload import with_response_len
from .admission import GAMMA, Admission, admit
from .calibration import CALIB_ALPHA, Calibration, class_shares
from .controller import RESTART_S, AdaptConfig, AdaptController, Decision
from .monitor import DELTA_LEN, H_ALPHA, Horizon, Monitor, Signal, Trigger
from .plan_cache import NoPlan, PlanCache, PlanPoint, PlanScore
from .policies import AlwaysAdapt, AnyPositiveGain, EveryK, Payback, Policy, Static, default_policies
from .simulate import DriftTrace, PolicyReport, StepRecord, gpu_trace, length_trace, simulate

__all__ = [
    "CALIB_ALPHA",
    "DELTA_LEN",
    "GAMMA",
    "H_ALPHA",
    "RESTART_S",
    "AdaptConfig",
    "AdaptController",
    "Admission",
    "AlwaysAdapt",
    "AnyPositiveGain",
    "Calibration",
    "Decision",
    "DriftTrace",
    "EveryK",
    "Horizon",
    "Monitor",
    "NoPlan",
    "Payback",
    "PlanCache",
    "PlanPoint",
    "PlanScore",
    "Policy",
    "PolicyReport",
    "Signal",
    "Static",
    "StepRecord",
    "Trigger",
    "admit",
    "class_shares",
    "default_policies",
    "gpu_trace",
    "length_trace",
    "pool_cluster",
    "simulate",
    "with_response_len",
]
