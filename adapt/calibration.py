"""Online calibration of the step-latency prediction (SPEC §10 "Online calibration").

:class:`Calibration` keeps one factor ``f_c = 1/η_c`` per operation class ``c`` ∈ {``gemm``,
``nongemm``, ``collective/<tier>``}, which multiplies the uncalibrated prediction:
``L̂ = L₀·Σ_c w_c·f_c`` with ``w_c`` the plan's class shares (:func:`class_shares`). With only a
step-level measurement ``T`` the classes are not identifiable, so the error ratio ``r = T/L̂`` is
attributed to every class present in proportion to its share:
``f_c ← f_c·(1 + α·(w_c/max_c w_c)·(r − 1))`` (``α = 0.3``): the dominant class moves by the full
EMA step, a class with a small share hardly moves. If every step runs ``k`` times slower than
the uncalibrated model on one class mix, ``L̂/T → 1`` geometrically, and each factor → ``k`` when
the classes have equal shares. Per-class timings (kernel/collective instrumentation) update each
class by its own ratio instead (:meth:`Calibration.observe_classes`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..costmodel.time import op_time
from ..ir.hardware import TIER_NAMES
from ..ir.plan import Plan
from ..scoring.evaluator import Evaluator

__all__ = ["CALIB_ALPHA", "Calibration", "class_shares"]

CALIB_ALPHA = 0.3


def class_shares(evaluator: Evaluator, plan: Plan) -> dict[str, float]:
    """Operation-class shares ``w_c`` of ``plan``'s OP time (SPEC §6 terms, summed over vertices).

    ``gemm`` = ``T_gemm + T_bubble`` (attention FLOPs are part of ``W``: the cost model has no
    separate attention term, so attention shares the GEMM efficiency); ``nongemm`` =
    ``T_nongemm + T_opt``; ``collective/<tier>``: ``T_tp`` at the intra-node tier, ``T_pp`` at
    ``pp_tier``, ``T_dp`` at ``dp_tier``. Shares sum to 1 (``{"gemm": 1}`` for a plan with no time).
    """
    g, w, hw = evaluator.graph, evaluator.workload, evaluator.cluster.hardware
    costs = evaluator.costs
    acc: dict[str, float] = {}
    for v, c in zip(g.vertices, plan.choices):
        s = c.strategy
        bd = op_time(
            g.models[v.model].spec,
            v.role,
            costs.layout(s),
            hw,
            sequences=v.sequences,
            prompt_len=w.prompt_len,
            response_len=w.response_len,
            head=v.head,
        )
        for key, t in (
            ("gemm", bd.gemm + bd.bubble),
            ("nongemm", bd.nongemm + bd.opt + bd.overhead),  # fixed engine costs drift like the residual
            (f"collective/{TIER_NAMES[0]}", bd.tp_comm),
            (f"collective/{TIER_NAMES[s.pp_tier]}", bd.pp_comm),
            (f"collective/{TIER_NAMES[s.dp_tier]}", bd.dp_comm),
        ):
            if t > 0:
                acc[key] = acc.get(key, 0.0) + t
    total = sum(acc.values())
    if total <= 0:
        return {"gemm": 1.0}
    return {k: v / total for k, v in sorted(acc.items())}


class Calibration:
    """Per-class efficiency factors ``f_c = 1/η_c`` (module docstring).

    Parameters
    ----------
    alpha
        EMA weight in ``(0, 1]``.
    initial
        Starting factors (unseen classes start at 1: the hardware file's derated peak).
    """

    def __init__(self, alpha: float = CALIB_ALPHA, initial: Mapping[str, float] | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"Calibration.alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.factors: dict[str, float] = dict(initial or {})
        for k, f in self.factors.items():
            if not f > 0:
                raise ValueError(f"Calibration.initial[{k!r}] must be positive, got {f!r}")

    def factor(self, shares: Mapping[str, float]) -> float:
        """``Σ_c w_c·f_c``."""
        return sum(w * self.factors.get(c, 1.0) for c, w in shares.items())

    def predict(self, base: float, shares: Mapping[str, float]) -> float:
        """Calibrated prediction ``L̂ = L₀·Σ_c w_c·f_c``."""
        return base * self.factor(shares)

    def observe_step(self, base: float, shares: Mapping[str, float], measured: float) -> float:
        """Update from one step: ``r = T/L̂``, ``f_c ← f_c·(1 + α·(w_c/max w)·(r − 1))``; returns ``r``.

        Raises
        ------
        ValueError
            If ``base`` or ``measured`` is not positive.
        """
        if not base > 0 or not measured > 0:
            raise ValueError(
                f"observe_step needs positive base and measured seconds, got {base!r}, {measured!r}"
            )
        r = measured / self.predict(base, shares)
        w_max = max(shares.values())
        for c, w in shares.items():
            if w > 0:
                f = self.factors.get(c, 1.0)
                self.factors[c] = f * (1.0 + self.alpha * (w / w_max) * (r - 1.0))
        return r

    def observe_classes(self, predicted: Mapping[str, float], measured: Mapping[str, float]) -> None:
        """Update each class from its own timing: ``f_c ← (1 − α)·f_c + α·T_c/T₀_c`` (``T₀_c``
        uncalibrated)."""
        for c, t in measured.items():
            p = predicted.get(c, 0.0)
            if p > 0 and t > 0:
                f = self.factors.get(c, 1.0)
                self.factors[c] = (1 - self.alpha) * f + self.alpha * t / p
