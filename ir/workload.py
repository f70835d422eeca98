"""Workloads: the RL algorithm, its models, batch and sequence sizes and allowed structures.

A :class:`Workload` is the user's input of SPEC §2: algorithm (``ppo``, ``grpo``, ``remax``,
``dpo``), one :class:`~rpeg.ir.models.ModelSpec` per role, ``B`` prompts per step, ``R`` rollouts
per prompt, prompt length ``Lp``, response length ``Lr``, response-length quantiles
``[(f1, t1) .. (fQ, tQ)]`` with ``fQ = 1``, ``tQ = Lr``, the staleness budgets allowed per trainable
model and whether actor–critic sharing may be tried. Workloads load from TOML files
(:func:`load_workload`); the bundled ones live in ``examples/``.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic import Strict as StrictType

from .cluster import parse_shape
from .errors import InputError, Strict, require_file, tagged, validate
from .models import MAX_LOAD_IMBALANCE, ModelSpec, ModelSpecFile, model_preset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

__all__ = [
    "ALGORITHMS",
    "REWARD_KINDS",
    "ROLES",
    "LengthBucket",
    "Workload",
    "WorkloadFile",
    "load_workload",
    "max_entropy_quantiles",
    "quantile_buckets",
    "with_response_len",
]

#: Algorithms and the model roles each one needs.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ppo": ("actor", "critic", "reward", "reference"),
    "grpo": ("actor", "reward", "reference"),
    "remax": ("actor", "reward", "reference"),
    "dpo": ("actor", "reference"),
}
ROLES = ("actor", "critic", "reward", "reference")
TRAINABLE_ROLES = ("actor", "critic")
#: Where rewards come from (SPEC §14.8): a reward model's inference, or a rule run on the host.
REWARD_KINDS = ("model", "rule")
#: KL coefficient of the online algorithms when the workload does not say (SPEC §11).
DEFAULT_KL_COEF = 0.01
#: The largest host time per sequence of a rule reward a workload may state, seconds.
MAX_REWARD_COST_S = 3600.0
#: Where the old policy's log-probs come from (SPEC §14.8).
OLD_LOGPROB_SOURCES = ("rollout", "trainer")

#: Bounds on the sizes rpeg plans for: far beyond any RL post-training job, small enough that
#: enumerating divisors and candidate strategies stays instantaneous.
MAX_PROMPTS = 1_000_000
MAX_ROLLOUTS = 1_024
MAX_TOKENS = 1_048_576
MAX_STALENESS = 64
MAX_K_EVAL = 64
#: Least responses per prompt of GRPO: its advantage is a response's reward against its group's
#: mean (and spread), which is identically zero for a group of one.
MIN_GRPO_ROLLOUTS = 2


def _is_int(value: object) -> bool:
    """An integer of any kind (NumPy's included), never a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A real number of any kind (NumPy's included), never a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class LengthBucket:
    """One piece of the piecewise-uniform response-length distribution (SPEC §14.1).

    A share ``share = f_q − f_{q−1}`` of the responses is uniform on ``(lo, hi]`` tokens
    (``lo = t_{q−1}``, ``hi = t_q``, ``t_0 = 0``).
    """

    share: float
    lo: int
    hi: int

    @property
    def mean(self) -> float:
        """``E[r] = (lo + hi)/2``."""
        return 0.5 * (self.lo + self.hi)

    @property
    def mean_square(self) -> float:
        """``E[r²] = (lo² + lo·hi + hi²)/3`` of the uniform law on ``(lo, hi]``."""
        return (self.lo * self.lo + self.lo * self.hi + self.hi * self.hi) / 3.0

    def mean_excess_square(self, u: float) -> float:
        """``E[(r − u)₊²] = ((hi − u)₊³ − (lo − u)₊³)/(3·(hi − lo))`` of the uniform law on
        ``(lo, hi]`` (``(hi − u)₊²`` when ``lo = hi``): what a sliding window ``W`` takes off
        ``E[ℓ²]`` of ``ℓ = Lp + r`` tokens at ``u = W − Lp`` (SPEC §15.1)."""
        a, b = max(0.0, self.lo - u), max(0.0, self.hi - u)
        if self.hi <= self.lo:
            return b * b
        return (b * b * b - a * a * a) / (3.0 * (self.hi - self.lo))


def default_quantiles(response_len: int) -> tuple[tuple[float, int], ...]:
    """SPEC §2 default: ``[(0.50, Lr/4), (0.85, Lr/2), (1.0, Lr)]`` (lengths rounded, ≥ 1)."""
    return (
        (0.50, max(1, response_len // 4)),
        (0.85, max(1, response_len // 2)),
        (1.0, response_len),
    )


def quantile_buckets(quantiles: Sequence[tuple[float, int]]) -> tuple[LengthBucket, ...]:
    """The piecewise-uniform law of response-length quantiles ``((f_1, t_1), …, (f_Q, t_Q))``
    (SPEC §14.1): a share ``f_q − f_{q−1}`` uniform on ``(t_{q−1}, t_q]``, ``t_0 = f_0 = 0``."""
    out, prev_f, prev_t = [], 0.0, 0
    for f, t in quantiles:
        out.append(LengthBucket(f - prev_f, prev_t, t))
        prev_f, prev_t = f, t
    return tuple(out)


#: Pieces of :func:`max_entropy_quantiles` when a workload file gives ``response_mean``: each
#: piece is a phase of a split generation (SPEC §5, rule 1), so few; a benchmark pricing one
#: generation may ask for more.
MAX_ENTROPY_PIECES = 8
#: The least share a piece of :func:`max_entropy_quantiles` keeps (quantile fractions must rise).
_SLIVER = 1e-9


def _truncated_exponential_cdf(x: float, theta: float, cap: float) -> float:
    """``F(x) = (1 − e^(−θx))/(1 − e^(−θ·cap))`` of the density ``∝ e^(−θr)`` on ``[0, cap]``
    (``x/cap`` at ``θ = 0``; for ``θ < 0`` by the mirror ``1 − F_{−θ}(cap − x)``, which keeps
    every exponent negative)."""
    if abs(theta * cap) < 1e-12:
        return x / cap
    if theta < 0.0:
        return 1.0 - _truncated_exponential_cdf(cap - x, -theta, cap)
    return math.expm1(-theta * x) / math.expm1(-theta * cap)


def max_entropy_quantiles(
    mean: float, response_len: int, pieces: int = MAX_ENTROPY_PIECES
) -> tuple[tuple[float, int], ...]:
    """The response-length quantiles of the least informative law on ``(0, Lr]`` with a given
    mean: the maximum-entropy density on ``[0, Lr]`` whose mean is ``Ē`` is the truncated
    exponential ``p(r) ∝ e^(−θr)`` (``θ > 0`` below ``Lr/2``, uniform at it, ``θ < 0`` above),
    the law of a response that ends after each token with the same probability and is cut at
    ``Lr`` (``docs/decisions.md``, "Response lengths from a mean").

    The quantiles sit at ``pieces`` lengths of equal spacing, ``t_i = round(i·Lr/pieces)``, with
    ``f_i = F_θ(t_i)``, and ``θ`` is solved (bisection) so that the piecewise-uniform law the
    quantiles define (SPEC §14.1) has mean ``Σ (f_i − f_{i−1})·(t_{i−1} + t_i)/2 = Ē``: the
    workload's real tokens are the stated ones (to ``pieces·10⁻⁹·Lr``). A piece whose share
    underflows keeps a sliver of ``10⁻⁹``: the fractions must rise strictly.

    Parameters
    ----------
    mean
        ``Ē``, the mean response length in tokens.
    response_len
        ``Lr``, the longest response (the cap).
    pieces
        Number of equal-width pieces (at most ``Lr``); each is a phase of a split generation.

    Returns
    -------
    tuple of (float, int)
        ``((f_1, t_1), …, (1.0, Lr))``.

    Raises
    ------
    ValueError
        If ``response_len`` or ``pieces`` is not a positive integer, or ``mean`` is not strictly
        inside ``(w/2, Lr − w/2)`` with ``w = Lr/pieces`` the narrowest piece's width (a mean
        outside puts all the responses in the first or the last piece; more pieces reach further).
    """
    if not _is_int(response_len) or not 1 <= response_len <= MAX_TOKENS:
        raise ValueError(f"response_len must be an integer in [1, {MAX_TOKENS:,}], got {response_len!r}")
    if not _is_int(pieces) or pieces < 1:
        raise ValueError(f"pieces must be a positive integer, got {pieces!r}")
    cap = int(response_len)
    n = min(int(pieces), cap)
    edges = [round(cap * i / n) for i in range(n + 1)]  # strictly rising: pieces are ≥ 1 token wide
    lo_mean, hi_mean = edges[1] / 2.0, (cap + edges[-2]) / 2.0
    if not _is_number(mean) or not math.isfinite(mean) or not lo_mean < mean < hi_mean:
        raise ValueError(
            f"response_mean must be a number of tokens in ({lo_mean:g}, {hi_mean:g}) for response_len = "
            f"{cap} in {n} pieces, got {mean!r}"
        )

    def shares(theta: float) -> list[float]:
        cdf = [_truncated_exponential_cdf(float(t), theta, cap) for t in edges]
        return [b - a for a, b in zip(cdf, cdf[1:])]

    def piecewise_mean(theta: float) -> float:
        return sum(s * (a + b) / 2.0 for s, a, b in zip(shares(theta), edges, edges[1:]))

    # the piecewise mean falls from near Lr − w/2 to near w/2 as θ runs over ±bound
    lo, hi = -4000.0 / cap, 4000.0 / cap
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if piecewise_mean(mid) > mean:
            lo = mid
        else:
            hi = mid
    out: list[tuple[float, int]] = []
    f = 0.0
    for i, (share, t) in enumerate(zip(shares(0.5 * (lo + hi)), edges[1:]), start=1):
        # fractions must rise strictly: a piece whose share underflows keeps a sliver
        f = min(max(f + share, f + _SLIVER), 1.0 - _SLIVER * (n - i))
        out.append((f, t))
    out[-1] = (1.0, cap)
    return tuple(out)


@dataclass(frozen=True)
class Workload:
    """One RL post-training job to plan.

    Parameters
    ----------
    algorithm
        ``"ppo"``, ``"grpo"``, ``"remax"`` or ``"dpo"``.
    models
        Model spec per role; the roles :data:`ALGORITHMS` lists for the algorithm are required.
        ``reference`` defaults to the actor's spec.
    batch
        ``B``, prompts per RL step.
    rollouts
        ``R``, responses per prompt (DPO: 2, the chosen and the rejected answer).
    prompt_len, response_len
        ``Lp`` and ``Lr`` in tokens.
    quantiles
        ``((f1, t1), …, (fQ, tQ))``: the fraction ``f_q`` of responses finished by length ``t_q``;
        increasing in both, ``fQ = 1`` and ``tQ = Lr``. ``None`` gives the SPEC §2 default;
        :func:`max_entropy_quantiles` builds them from a mean response length.
    staleness
        Allowed staleness budgets per trainable role (default ``{0, 1}`` each).
    ac_sharing
        Whether the actor–critic shared structure may be tried (only with both models).
    name
        Label for messages and result files.
    reward
        ``"model"`` (a reward model's inference, the ``reward`` role) or ``"rule"`` (a host
        function, no reward model: SPEC §14.8). Not for ``dpo``.
    reward_cost_s
        ``c_r``, host seconds per sequence of a rule reward (default 0; only with
        ``reward = "rule"``).
    kl_coef
        The KL coefficient ``β`` of ``ppo``, ``grpo`` and ``remax`` (default
        :data:`DEFAULT_KL_COEF`); ``0`` drops the reference model and its inference (DAPO,
        Dr. GRPO). ``dpo`` always has a reference and takes no ``kl_coef``.
    old_logprob
        Where the old policy's log-probs of the sampled tokens come from (SPEC §14.8):
        ``"rollout"`` (the rollout engine returns them, the default) or ``"trainer"`` (a
        teacher-forced log-prob pass of the actor, ``actor_logp``, as verl and OpenRLHF run by
        default). Not for ``dpo``.
    mini_batches
        ``U``, optimizer updates per RL step (PPO mini-batches, SPEC §14.2): each pays the
        gradient reduction, the weight gather and the optimizer; default 1.

    Integers may be Python's or NumPy's (``np.int64(64)``); they are stored as ``int``.

    Raises
    ------
    ValueError
        On a bad field; the message names the field and the value (``grpo`` needs
        ``rollouts ≥ 2``: its group-relative advantages are zero for a group of one).
    """

    algorithm: str
    models: dict[str, ModelSpec]
    batch: int
    rollouts: int
    prompt_len: int
    response_len: int
    quantiles: tuple[tuple[float, int], ...] | None = None
    staleness: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ac_sharing: bool = True
    name: str = "workload"
    reward: str = "model"
    reward_cost_s: float = 0.0
    kl_coef: float | None = None
    old_logprob: str = "rollout"
    mini_batches: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, str) or self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"workload.algorithm: unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}"
            )
        bounds = {
            "batch": MAX_PROMPTS,
            "rollouts": MAX_ROLLOUTS,
            "prompt_len": MAX_TOKENS,
            "response_len": MAX_TOKENS,
        }
        for fname, top in bounds.items():
            value = getattr(self, fname)
            if not _is_int(value):
                raise TypeError(f"workload.{fname} must be a positive integer, got {value!r}")
            value = int(value)
            object.__setattr__(self, fname, value)  # a NumPy integer stored as an int
            if not 1 <= value <= top:
                raise ValueError(f"workload.{fname} must be an integer in [1, {top:,}], got {value!r}")
        if self.algorithm == "dpo" and self.rollouts != 2:
            raise ValueError(
                f"workload.rollouts must be 2 for dpo (a chosen and a rejected response), got {self.rollouts}"
            )
        if not isinstance(self.models, Mapping):
            raise TypeError(
                f"workload.models must be a mapping of role to ModelSpec, got {type(self.models).__name__}"
            )
        if not isinstance(self.ac_sharing, bool):
            raise TypeError(f"workload.ac_sharing must be True or False, got {self.ac_sharing!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"workload.name must be a string, got {self.name!r}")
        self._check_reward_and_kl()
        models = dict(self.models)
        if self.kl_coef == 0.0:
            if "reference" in models:
                raise ValueError(
                    "workload.models.reference: kl_coef = 0 drops the reference model; remove it "
                    "or give a non-zero kl_coef"
                )
        elif "actor" in models and "reference" not in models:
            models["reference"] = models["actor"]
        if self.reward == "rule" and "reward" in models:
            raise ValueError(
                'workload.models.reward: reward = "rule" computes rewards on the host; remove the '
                'reward model or set reward = "model"'
            )
        for role, spec in models.items():
            if role not in ROLES:
                raise ValueError(f"workload.models: unknown role {role!r}; roles are {', '.join(ROLES)}")
            if not isinstance(spec, ModelSpec):
                raise TypeError(f"workload.models.{role} must be a ModelSpec, got {type(spec).__name__}")
        needed = self.roles
        for role in needed:
            if role not in models:
                raise ValueError(
                    f"workload.models: algorithm {self.algorithm!r} needs a model for role {role!r}"
                )
        extra = [role for role in models if role not in needed]
        if extra:
            raise ValueError(
                f"workload.models: algorithm {self.algorithm!r} has no {', '.join(map(repr, extra))} model "
                f"(roles: {', '.join(needed)})"
            )
        models = {role: models[role] for role in needed}
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "quantiles", self._checked_quantiles())
        object.__setattr__(self, "staleness", self._checked_staleness(models))
        if self.algorithm == "grpo" and self.rollouts < MIN_GRPO_ROLLOUTS:
            raise ValueError(
                f"workload.rollouts must be at least {MIN_GRPO_ROLLOUTS} for grpo (its advantages are "
                f"relative to the group of a prompt's responses: with one response they are always zero), "
                f"got {self.rollouts}"
            )

    def _check_reward_and_kl(self) -> None:
        """``reward``, ``reward_cost_s`` and ``kl_coef`` (their Raises in the class docstring);
        sets the default ``kl_coef``."""
        if not isinstance(self.reward, str) or self.reward not in REWARD_KINDS:
            raise ValueError(
                f"workload.reward must be one of {', '.join(map(repr, REWARD_KINDS))}, got {self.reward!r}"
            )
        if self.algorithm == "dpo" and self.reward != "model":
            raise ValueError("workload.reward: dpo is offline and has no reward; leave reward unset")
        cost = self.reward_cost_s
        if not _is_number(cost) or not 0.0 <= cost <= MAX_REWARD_COST_S:
            raise ValueError(
                f"workload.reward_cost_s must be a number of seconds in [0, {MAX_REWARD_COST_S:g}], got {cost!r}"
            )
        if cost and self.reward != "rule":
            raise ValueError(
                f'workload.reward_cost_s = {cost!r} applies to reward = "rule" only (a reward model\'s '
                "time comes from the cost model)"
            )
        object.__setattr__(self, "reward_cost_s", float(cost))
        if self.old_logprob not in OLD_LOGPROB_SOURCES:
            raise ValueError(
                f"workload.old_logprob must be one of {', '.join(map(repr, OLD_LOGPROB_SOURCES))}, "
                f"got {self.old_logprob!r}"
            )
        if self.algorithm == "dpo" and self.old_logprob != "rollout":
            raise ValueError("workload.old_logprob: dpo is offline and has no rollout; leave it unset")
        u = self.mini_batches
        if not _is_int(u) or not 1 <= u <= self.batch * self.rollouts:
            raise ValueError(
                f"workload.mini_batches must be an integer in [1, B·R={self.batch * self.rollouts}], got {u!r}"
            )
        object.__setattr__(self, "mini_batches", int(u))
        kl = self.kl_coef
        if self.algorithm == "dpo":
            if kl is not None:
                raise ValueError(
                    f"workload.kl_coef: dpo always uses its reference model (its β is part of the loss), "
                    f"got kl_coef = {kl!r}"
                )
            return
        if kl is None:
            kl = DEFAULT_KL_COEF
        if not _is_number(kl) or not (math.isfinite(kl) and kl >= 0):
            raise ValueError(f"workload.kl_coef must be a non-negative number, got {kl!r}")
        object.__setattr__(self, "kl_coef", float(kl))

    @property
    def roles(self) -> tuple[str, ...]:
        """The model roles this workload has: :data:`ALGORITHMS`' roles of the algorithm, without
        ``reward`` for a rule reward and without ``reference`` when ``kl_coef = 0``."""
        return tuple(
            r
            for r in ALGORITHMS[self.algorithm]
            if not (r == "reward" and self.reward == "rule")
            and not (r == "reference" and self.kl_coef == 0.0)
        )

    def _checked_quantiles(self) -> tuple[tuple[float, int], ...]:
        if self.quantiles is None:
            return default_quantiles(self.response_len)
        try:
            q = [tuple(item) for item in self.quantiles]
        except TypeError:
            raise TypeError(
                f"workload.quantiles must be a sequence of (fraction, length) pairs, got {self.quantiles!r}"
            ) from None
        if not q:
            raise ValueError("workload.quantiles must not be empty (omit it for the default)")
        out = []
        prev_f, prev_t = 0.0, 0
        for i, item in enumerate(q):
            if len(item) != 2:
                raise ValueError(
                    f"workload.quantiles[{i}] must be a (fraction, length) pair, got {list(item)!r}"
                )
            f, t = item
            if not _is_number(f) or not math.isfinite(f):
                raise ValueError(f"workload.quantiles[{i}]: fraction must be a number in (0, 1], got {f!r}")
            if not _is_int(t):
                raise ValueError(
                    f"workload.quantiles[{i}]: length must be a whole number of tokens, got {t!r}"
                )
            if not (prev_f < f <= 1.0) or not (prev_t < t <= self.response_len):
                raise ValueError(
                    f"workload.quantiles[{i}] = ({f}, {t}) must increase in fraction (0, 1] and length "
                    f"(0, Lr={self.response_len}]"
                )
            prev_f, prev_t = f, t
            out.append((float(f), int(t)))
        if out[-1][0] != 1.0 or out[-1][1] != self.response_len:
            raise ValueError(f"workload.quantiles must end with (1.0, Lr={self.response_len}), got {out[-1]}")
        return tuple(out)

    def _checked_staleness(self, models: dict[str, ModelSpec]) -> dict[str, tuple[int, ...]]:
        trainable = [r for r in TRAINABLE_ROLES if r in models]
        if not isinstance(self.staleness, Mapping):
            raise TypeError(
                f"workload.staleness must be a mapping of role to budgets, got {self.staleness!r}"
            )
        stale = {}
        for role, values in self.staleness.items():
            if role not in trainable:
                raise ValueError(
                    f"workload.staleness: {role!r} is not a trainable model of {self.algorithm} "
                    f"(trainable: {', '.join(trainable)})"
                )
            if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
                raise ValueError(f"workload.staleness.{role} must be a list of budgets, got {values!r}")
            values = list(values)
            bad = [v for v in values if not _is_int(v) or not 0 <= v <= MAX_STALENESS]
            if not values or bad:
                raise ValueError(
                    f"workload.staleness.{role} must be a non-empty list of integers in [0, {MAX_STALENESS}], "
                    f"got {values!r}"
                )
            stale[role] = tuple(sorted({int(v) for v in values}))
        for role in trainable:
            stale.setdefault(role, (0, 1))
        return stale

    @property
    def sequences(self) -> int:
        """Sequences per step, ``B·R``."""
        return self.batch * self.rollouts

    @property
    def seq_len(self) -> int:
        """``ℓ = Lp + Lr``."""
        return self.prompt_len + self.response_len

    @property
    def buckets(self) -> tuple[LengthBucket, ...]:
        """The response-length distribution as :class:`LengthBucket` pieces (SPEC §14.1,
        :func:`quantile_buckets`)."""
        return quantile_buckets(self.quantiles)  # type: ignore[arg-type]

    @property
    def mean_response(self) -> float:
        """``Ē = Σ_q (f_q − f_{q−1})·(t_{q−1} + t_q)/2`` tokens (SPEC §14.1)."""
        return sum(b.share * b.mean for b in self.buckets)

    @property
    def tokens_per_step(self) -> float:
        """``B·R·(Lp + Ē)``, the real tokens of one step: the work unit of the throughput score
        (SPEC §14.1, replacing §7's padded ``B·R·(Lp + Lr)``)."""
        return self.sequences * (self.prompt_len + self.mean_response)

    @property
    def padded_tokens_per_step(self) -> int:
        """``B·R·(Lp + Lr)``: every response padded to ``Lr`` (SPEC §7's work unit)."""
        return self.sequences * self.seq_len

    @property
    def trainable(self) -> tuple[str, ...]:
        """Trainable roles present in this workload."""
        return tuple(r for r in TRAINABLE_ROLES if r in self.models)

    @property
    def can_share_actor_critic(self) -> bool:
        """Actor–critic sharing is tried only when both exist (S1), the user allows it, and both
        have the same architecture: a shared backbone *is* the actor's network, so sharing a 70B
        actor with a 7B critic would silently train a different critic (``docs/decisions.md``)."""
        return (
            self.ac_sharing
            and "actor" in self.models
            and "critic" in self.models
            and self.models["actor"] == self.models["critic"]
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``workload`` block of a result file (SPEC §12)."""
        return {
            "name": self.name,
            "algorithm": self.algorithm,
            "B": self.batch,
            "R": self.rollouts,
            "Lp": self.prompt_len,
            "Lr": self.response_len,
            "quantiles": [[f, t] for f, t in self.quantiles],  # type: ignore[union-attr]
            "models": {role: spec.to_dict() for role, spec in self.models.items()},
            "staleness_choices": {role: list(v) for role, v in self.staleness.items()},
            "ac_sharing_allowed": self.ac_sharing,
            "reward": self.reward,
            "reward_cost_s": self.reward_cost_s,
            "kl_coef": self.kl_coef,
            "old_logprob": self.old_logprob,
            "mini_batches": self.mini_batches,
        }


def with_response_len(workload: Workload, response_len: int) -> Workload:
    """``workload`` with ``Lr = response_len`` and its quantile lengths scaled by ``Lr'/Lr``
    (fractions kept; the SPEC §2 default quantiles when scaling breaks monotonicity).

    Raises
    ------
    ValueError
        If ``response_len`` is not a positive integer.
    """
    if not _is_int(response_len) or response_len < 1:
        raise ValueError(f"response_len must be a positive integer, got {response_len!r}")
    if response_len == workload.response_len:
        return workload
    scale = response_len / workload.response_len
    q = [(f, max(1, round(t * scale))) for f, t in workload.quantiles]  # type: ignore[union-attr]
    q[-1] = (1.0, response_len)
    ok = all(a[1] < b[1] for a, b in zip(q, q[1:]))
    return replace(
        workload, response_len=response_len, quantiles=tuple(q) if ok else default_quantiles(response_len)
    )


@dataclass(frozen=True)
class WorkloadFile:
    """A workload read from TOML plus the cluster defaults the file names.

    Parameters
    ----------
    workload
        The workload.
    cluster_shape
        ``"RxNxG"`` or ``None`` if the file does not say.
    hardware
        Hardware preset name or JSON path, or ``None``.
    k_eval
        Steps to unroll when scoring (default 8).
    description
        One line for ``rpeg examples``.
    """

    workload: Workload
    cluster_shape: str | None
    hardware: str | None
    k_eval: int
    description: str


# ---------------------------------------------------------------------------- the TOML file
PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
#: ``[fraction, length]``: a TOML/JSON list read as a pair whose items keep their exact types.
QuantilePair = Annotated[
    tuple[Annotated[Fraction, StrictType()], Annotated[PositiveInt, StrictType()]], StrictType(False)
]


class _BatchTable(Strict):
    prompts: Annotated[int, Field(ge=1, le=MAX_PROMPTS)]
    rollouts: Annotated[int, Field(ge=1, le=MAX_ROLLOUTS)] | None = None
    prompt_len: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    response_len: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    quantiles: Annotated[list[QuantilePair], Field(min_length=1)] | None = None
    response_mean: Annotated[float, Field(gt=0.0, le=MAX_TOKENS)] | None = None


ModelEntry = tagged(
    {"name": Annotated[str, Field(min_length=1)], "table": ModelSpecFile},
    lambda v: "name" if isinstance(v, str) else "table" if isinstance(v, dict) else None,
    "a model is a preset name, a config.json path or an inline table",
)


class _ModelsTable(Strict):
    actor: ModelEntry | None = None
    critic: ModelEntry | None = None
    reward: ModelEntry | None = None
    reference: ModelEntry | None = None


class _StructureTable(Strict):
    staleness: dict[
        str, Annotated[list[Annotated[int, Field(ge=0, le=MAX_STALENESS)]], Field(min_length=1)]
    ] = Field(default_factory=dict)
    ac_sharing: bool = True


class _ClusterTable(Strict):
    shape: str | None = None
    hardware: Annotated[str, Field(min_length=1)] | None = None
    k_eval: Annotated[int, Field(ge=1, le=MAX_K_EVAL)] = 8


class _WorkloadFileSchema(Strict):
    """Schema of a workload TOML file; every key is known, every type exact."""

    name: str | None = None
    description: str = ""
    algorithm: Literal["ppo", "grpo", "remax", "dpo"]
    reward: Literal["model", "rule"] = "model"
    reward_cost_s: Annotated[float, Field(ge=0.0, le=MAX_REWARD_COST_S)] = 0.0
    kl_coef: Annotated[float, Field(ge=0.0)] | None = None
    old_logprob: Literal["rollout", "trainer"] = "rollout"
    mini_batches: Annotated[int, Field(ge=1)] = 1
    precision: Literal["bf16", "fp8", "nvfp4", "mxfp4"] | None = None
    load_imbalance: Annotated[float, Field(ge=1.0, le=MAX_LOAD_IMBALANCE)] | None = None
    batch: _BatchTable
    models: _ModelsTable
    structure: _StructureTable = Field(default_factory=_StructureTable)
    cluster: _ClusterTable = Field(default_factory=_ClusterTable)


def _looks_like_path(text: str) -> bool:
    return text.endswith(".json") or "/" in text or "\\" in text or text.startswith(".")


def _model(value: str | ModelSpecFile, where: str, base: Path | None) -> ModelSpec:
    """One ``[models]`` entry: a preset name, a ``config.json`` path (or a checkpoint folder
    holding one), or an inline table."""
    if isinstance(value, ModelSpecFile):
        try:
            return ModelSpec(**value.model_dump())
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
    path = Path(value)
    if base is not None and not path.is_absolute():
        path = base / path
    if _looks_like_path(value) or path.exists():
        try:
            return ModelSpec.from_hf_config(path)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    try:
        return model_preset(value)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None


def _with_setting(
    models: dict[str, ModelSpec], entries: _ModelsTable, name: str, value: object, where: str
) -> dict[str, ModelSpec]:
    """A workload file's top-level model setting (``precision``, ``load_imbalance``) given to every
    model it applies to (``load_imbalance`` and ``precision = "mxfp4"``: the mixtures of experts;
    the dense models have no experts to balance or store in MXFP4); an inline table that names
    another value is an error naming the file, the field and both values."""
    out = {}
    for role, spec in models.items():
        entry = getattr(entries, role)
        if value == "mxfp4" and not spec.is_moe:  # a dense model has no experts to store in MXFP4
            out[role] = spec
            continue
        if (
            isinstance(entry, ModelSpecFile)
            and name in entry.model_fields_set
            and getattr(entry, name) != value
        ):
            raise InputError(
                f"{where}: field 'models.{role}.{name}' = {getattr(entry, name)!r} contradicts the "
                f"top-level '{name}' = {value!r}; give one of them",
                source=where,
                field=f"models.{role}.{name}",
            )
        if name == "load_imbalance" and not spec.is_moe:
            out[role] = spec
            continue
        try:
            out[role] = replace(spec, **{name: value})
        except ValueError as exc:
            raise InputError(f"{where}: models.{role}: {exc}", source=where, field=name) from None
    return out


def _toml_error(path: Path, text: str, exc: Exception) -> InputError:
    """An :class:`InputError` for a TOML syntax error naming the file, the line and, for a key
    given twice, the key (``tomllib`` says only "Cannot overwrite a value (at line 6, column 14)")."""
    message = str(exc)
    found = re.search(r"\(at line (\d+), column (\d+)\)", message)
    if found is None:
        return InputError(f"{path}: not valid TOML ({message})", source=str(path))
    number = int(found.group(1))
    lines = text.splitlines()
    line = lines[number - 1].strip() if 0 < number <= len(lines) else ""
    what = message[: found.start()].strip()
    if what.startswith("Cannot overwrite a value") and "=" in line:
        key = line.split("=", 1)[0].strip()
        what = f"key {key!r} is set twice (or inside a value set before); each key may be set once"
    return InputError(
        f"{path}, line {number}: not valid TOML: {what}" + (f" (the line reads {line!r})" if line else ""),
        source=str(path),
        field=None,
    )


def load_workload(path: str | Path) -> WorkloadFile:
    """Read a workload TOML file, strictly.

    The file has top-level ``name``, ``description``, ``algorithm``, optional ``reward``
    (``"model"`` or ``"rule"``), ``reward_cost_s`` (host seconds per sequence of a rule reward)
    , ``kl_coef`` (0 drops the reference), ``old_logprob`` (``"rollout"`` or ``"trainer"``)
    , ``mini_batches`` (optimizer updates per step) and ``precision`` (``"bf16"``, ``"fp8"`` or
    ``"nvfp4"``, given to every model, or ``"mxfp4"``, given to every mixture of experts:
    :attr:`~rpeg.ir.models.ModelSpec.precision`; an inline
    model table may set its own instead), ``load_imbalance`` (``λ ≥ 1`` of every mixture of
    experts, :attr:`~rpeg.ir.models.ModelSpec.load_imbalance`; likewise); a ``[batch]`` table with
    ``prompts``, ``rollouts``, ``prompt_len``, ``response_len`` and optional ``quantiles``
    (a list of ``[fraction, length]``) or ``response_mean`` (the mean response length: the
    quantiles of :func:`max_entropy_quantiles` in :data:`MAX_ENTROPY_PIECES` pieces); a ``[models]`` table mapping roles to preset names,
    ``config.json`` paths (or folders holding one) or inline tables; an optional
    ``[structure]`` table with ``staleness = {actor = [0, 1], ...}`` and ``ac_sharing``; and an
    optional ``[cluster]`` table with ``shape = "RxNxG"``, ``hardware`` and ``k_eval``. Unknown
    keys, wrong types (``ac_sharing = "no"``, ``k_eval = true``, a length of ``95.7``) and
    out-of-range values are errors, never defaults. The file is UTF-8; a byte-order mark at its
    start (some Windows editors write one) is dropped.

    Raises
    ------
    TypeError
        If ``path`` is not a ``str`` or a path object (``None``).
    InputError
        If the file is missing or unreadable, not valid TOML (the line, and the key given twice
        for a duplicate), or a field is missing, unknown or bad; the message names the file, the
        field and the value (and a close known key for a misspelt one).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"load_workload: path must be the path of a workload TOML file (str or pathlib.Path), got "
            f"{type(path).__name__} {path!r}"
        )
    path = require_file(path, "workload file")
    try:
        # "utf-8-sig": a byte-order mark that some editors write first is dropped, not an error
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"workload file {str(path)!r} cannot be read ({exc})", source=str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(path, text, exc) from None
    where = str(path)
    doc = validate(_WorkloadFileSchema, data, where)
    models = {
        role: _model(entry, f"{where}: models.{role}", path.parent)
        for role in ROLES
        if (entry := getattr(doc.models, role)) is not None
    }
    if doc.precision == "mxfp4" and not any(spec.is_moe for spec in models.values()):
        raise InputError(
            f"{where}: field 'precision' = 'mxfp4' but no model has experts (MXFP4 stores a "
            "mixture of experts' routed experts; use 'bf16', 'fp8' or 'nvfp4')",
            source=where,
            field="precision",
        )
    if doc.load_imbalance is not None and not any(spec.is_moe for spec in models.values()):
        raise InputError(
            f"{where}: field 'load_imbalance' = {doc.load_imbalance!r} but no model has experts "
            "(it is the expert-parallel load imbalance of a mixture of experts)",
            source=where,
            field="load_imbalance",
        )
    for setting in ("precision", "load_imbalance"):
        if getattr(doc, setting) is not None:
            models = _with_setting(models, doc.models, setting, getattr(doc, setting), where)
    batch = doc.batch
    rollouts = batch.rollouts if batch.rollouts is not None else (2 if doc.algorithm == "dpo" else 1)
    quantiles = tuple((f, t) for f, t in batch.quantiles) if batch.quantiles is not None else None
    if batch.response_mean is not None:
        if quantiles is not None:
            raise InputError(
                f"{where}: fields 'batch.quantiles' and 'batch.response_mean' both describe the "
                "response lengths; give one",
                source=where,
                field="batch.response_mean",
            )
        try:
            quantiles = max_entropy_quantiles(batch.response_mean, batch.response_len)
        except ValueError as exc:
            raise InputError(
                f"{where}: field 'batch.response_mean' {str(exc).removeprefix('response_mean ')}",
                source=where,
                field="batch.response_mean",
            ) from None
    try:
        workload = Workload(
            algorithm=doc.algorithm,
            models=models,
            batch=batch.prompts,
            rollouts=rollouts,
            prompt_len=batch.prompt_len,
            response_len=batch.response_len,
            quantiles=quantiles,
            staleness={k: tuple(v) for k, v in doc.structure.staleness.items()},
            ac_sharing=doc.structure.ac_sharing,
            name=doc.name if doc.name is not None else path.stem,
            reward=doc.reward,
            reward_cost_s=doc.reward_cost_s,
            kl_coef=doc.kl_coef,
            old_logprob=doc.old_logprob,
            mini_batches=doc.mini_batches,
        )
    except ValueError as exc:
        if str(exc).startswith("workload.rollouts must be at least"):  # GRPO: name the file's field
            given = f"got {rollouts}" if batch.rollouts is not None else "got none (the default is 1)"
            raise InputError(
                f"{where}: field 'batch.rollouts' must be at least {MIN_GRPO_ROLLOUTS} for grpo (its "
                "advantages are relative to the group of a prompt's responses: with one response they are "
                f"always zero), {given}",
                source=where,
                field="batch.rollouts",
            ) from None
        raise InputError(f"{where}: {exc}", source=where) from None
    if doc.cluster.shape is not None:
        try:
            parse_shape(doc.cluster.shape)
        except ValueError as exc:
            raise InputError(f"{where}: cluster.shape: {exc}", source=where, field="cluster.shape") from None
    return WorkloadFile(
        workload=workload,
        cluster_shape=doc.cluster.shape,
        hardware=doc.cluster.hardware,
        k_eval=doc.cluster.k_eval,
        description=doc.description,
    )
