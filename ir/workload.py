"""Workloads: the RL algorithm, its models, batch and sequence sizes and allowed structures.

A :class:`Workload` is the user's input of SPEC §2: algorithm (``ppo``, ``grpo``, ``remax``,
``dpo``), one :class:`~rpeg.ir.models.ModelSpec` per role, ``B`` prompts per step, ``R`` rollouts
per prompt, prompt length ``Lp``, response length ``Lr``, response-length quantiles
``[(f1, t1) .. (fQ, tQ)]`` with ``fQ = 1``, ``tQ = Lr``, the staleness budgets allowed per trainable
model and whether actor–critic sharing may be tried. Workloads load from TOML files
(:func:`load_workload`); the bundled ones live in ``examples/``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import ModelSpec, model_preset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

__all__ = ["ALGORITHMS", "ROLES", "Workload", "WorkloadFile", "load_workload"]

#: Algorithms and the model roles each one needs.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ppo": ("actor", "critic", "reward", "reference"),
    "grpo": ("actor", "reward", "reference"),
    "remax": ("actor", "reward", "reference"),
    "dpo": ("actor", "reference"),
}
ROLES = ("actor", "critic", "reward", "reference")
TRAINABLE_ROLES = ("actor", "critic")


def default_quantiles(response_len: int) -> tuple[tuple[float, int], ...]:
    """SPEC §2 default: ``[(0.50, Lr/4), (0.85, Lr/2), (1.0, Lr)]`` (lengths rounded, ≥ 1)."""
    return (
        (0.50, max(1, response_len // 4)),
        (0.85, max(1, response_len // 2)),
        (1.0, response_len),
    )


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
        increasing in both, ``fQ = 1`` and ``tQ = Lr``. ``None`` gives the SPEC §2 default.
    staleness
        Allowed staleness budgets per trainable role (default ``{0, 1}`` each).
    ac_sharing
        Whether the actor–critic shared structure may be tried (only with both models).
    name
        Label for messages and result files.

    Raises
    ------
    ValueError
        On a bad field; the message names the field and the value.
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

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"workload.algorithm: unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}"
            )
        for fname in ("batch", "rollouts", "prompt_len", "response_len"):
            value = getattr(self, fname)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"workload.{fname} must be a positive integer, got {value!r}")
        if self.algorithm == "dpo" and self.rollouts != 2:
            raise ValueError(
                f"workload.rollouts must be 2 for dpo (a chosen and a rejected response), got {self.rollouts}"
            )
        models = dict(self.models)
        if "actor" in models and "reference" not in models:
            models["reference"] = models["actor"]
        needed = ALGORITHMS[self.algorithm]
        for role in needed:
            if role not in models:
                raise ValueError(
                    f"workload.models: algorithm {self.algorithm!r} needs a model for role {role!r}"
                )
        for role, spec in models.items():
            if role not in ROLES:
                raise ValueError(f"workload.models: unknown role {role!r}; roles are {', '.join(ROLES)}")
            if not isinstance(spec, ModelSpec):
                raise ValueError(f"workload.models.{role} must be a ModelSpec, got {type(spec).__name__}")
        models = {role: models[role] for role in needed}
        object.__setattr__(self, "models", models)

        q = self.quantiles if self.quantiles is not None else default_quantiles(self.response_len)
        q = tuple((float(f), int(t)) for f, t in q)
        if not q:
            raise ValueError("workload.quantiles must not be empty")
        prev_f, prev_t = 0.0, 0
        for i, (f, t) in enumerate(q):
            if not (prev_f < f <= 1.0) or not (prev_t < t <= self.response_len):
                raise ValueError(
                    f"workload.quantiles[{i}] = ({f}, {t}) must increase in fraction (0, 1] and length "
                    f"(0, Lr={self.response_len}]"
                )
            prev_f, prev_t = f, t
        if q[-1][0] != 1.0 or q[-1][1] != self.response_len:
            raise ValueError(f"workload.quantiles must end with (1.0, Lr={self.response_len}), got {q[-1]}")
        object.__setattr__(self, "quantiles", q)

        trainable = [r for r in TRAINABLE_ROLES if r in models]
        stale = {}
        for role, values in (self.staleness or {}).items():
            if role not in trainable:
                raise ValueError(
                    f"workload.staleness: {role!r} is not a trainable model of {self.algorithm} "
                    f"(trainable: {', '.join(trainable)})"
                )
            vals = tuple(sorted({int(v) for v in values}))
            if not vals or vals[0] < 0:
                raise ValueError(f"workload.staleness.{role} must be non-negative integers, got {values!r}")
            stale[role] = vals
        for role in trainable:
            stale.setdefault(role, (0, 1))
        object.__setattr__(self, "staleness", stale)

    @property
    def sequences(self) -> int:
        """Sequences per step, ``B·R``."""
        return self.batch * self.rollouts

    @property
    def seq_len(self) -> int:
        """``ℓ = Lp + Lr``."""
        return self.prompt_len + self.response_len

    @property
    def tokens_per_step(self) -> int:
        """``B·R·(Lp + Lr)``, the work unit of the throughput score (SPEC §7)."""
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
        }


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


def _model(value: Any, where: str, base: Path | None) -> ModelSpec:
    if isinstance(value, str):
        if value.endswith(".json") or value.endswith("/"):
            path = Path(value)
            if base is not None and not path.is_absolute():
                path = base / path
            return ModelSpec.from_hf_config(path)
        try:
            return model_preset(value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if isinstance(value, dict):
        try:
            return ModelSpec(**value)
        except TypeError as exc:
            raise ValueError(f"{where}: bad model table ({exc})") from None
    raise ValueError(f"{where}: a model is a preset name, a config.json path or a table, got {value!r}")


def load_workload(path: str | Path) -> WorkloadFile:
    """Read a workload TOML file.

    The file has top-level ``name``, ``description``, ``algorithm``; a ``[batch]`` table with
    ``prompts``, ``rollouts``, ``prompt_len``, ``response_len`` and optional ``quantiles``
    (a list of ``[fraction, length]``); a ``[models]`` table mapping roles to preset names,
    ``config.json`` paths or inline tables; an optional ``[structure]`` table with
    ``staleness = {actor = [0, 1], ...}`` and ``ac_sharing``; and an optional ``[cluster]`` table
    with ``shape = "RxNxG"``, ``hardware`` and ``k_eval``.

    Raises
    ------
    ValueError
        If the file is missing a field or has a bad value; the message names the file and field.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    where = str(path)

    def need(table: dict[str, Any], key: str, prefix: str) -> Any:
        if key not in table:
            raise ValueError(f"{where}: missing field {prefix}{key}")
        return table[key]

    batch = need(data, "batch", "")
    models_raw = need(data, "models", "")
    if not isinstance(models_raw, dict):
        raise ValueError(f"{where}: [models] must be a table, got {models_raw!r}")
    models = {role: _model(v, f"{where}: models.{role}", path.parent) for role, v in models_raw.items()}
    structure = data.get("structure", {})
    cluster = data.get("cluster", {})
    quantiles = batch.get("quantiles")
    try:
        workload = Workload(
            algorithm=str(need(data, "algorithm", "")),
            models=models,
            batch=need(batch, "prompts", "batch."),
            rollouts=batch.get("rollouts", 2 if data.get("algorithm") == "dpo" else 1),
            prompt_len=need(batch, "prompt_len", "batch."),
            response_len=need(batch, "response_len", "batch."),
            quantiles=tuple((f, t) for f, t in quantiles) if quantiles else None,
            staleness={k: tuple(v) for k, v in structure.get("staleness", {}).items()},
            ac_sharing=bool(structure.get("ac_sharing", True)),
            name=str(data.get("name", path.stem)),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    k_eval = cluster.get("k_eval", 8)
    if not isinstance(k_eval, int) or k_eval < 1:
        raise ValueError(f"{where}: cluster.k_eval must be a positive integer, got {k_eval!r}")
    return WorkloadFile(
        workload=workload,
        cluster_shape=cluster.get("shape"),
        hardware=cluster.get("hardware"),
        k_eval=k_eval,
        description=str(data.get("description", "")),
    )
