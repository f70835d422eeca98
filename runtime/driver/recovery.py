"""The urgent path: a worker lost mid-run (SPEC §10, Nereus §4 "GPU failure").

When a worker's process disappears (its device is gone) the controller stops dispatching and
:func:`urgent_replan` decides, from what survives, whether the job can go on:

1. **lost devices**: the failed worker's device and that of every worker that is dead or no
   longer answers (alive but silent for the stall window, :mod:`~rpeg.runtime.driver.liveness`);
   every worker on a lost device is treated as lost (killed if still running);
2. **drain and roll back**: in-flight nodes are awaited by progress (they finish or fail), then every
   survivor returns to the boundary before the failed step (segment-local ``s``): data and
   gradients of the step are dropped and a training worker that already applied the step's
   update restores its copy from before it (kept because the run enables recovery);
3. **intact state**, per model-stage (EMU view, :func:`~rpeg.ir.emu.emus_of`): a unit survives
   when none of its devices is lost. A training group that lost any rank stops the run — its
   Adam moments are ZeRO-sharded over the DP group, so a slice of them had a single copy; a
   serving model-stage (generation/inference) with no surviving unit is re-seeded from its
   model's training units (after the boundary weight synchronisation they hold the same
   version), and stops the run when the model is not trained (the last copy of a frozen model's
   weights is gone; a deployment would reload it from its checkpoint, this runtime says so and
   stops);
4. **replan** on the largest aligned block of surviving devices (:func:`surviving_pools`) with
   ``method`` (default ``"greedy"``) — a smaller block when no plan fits or the run's scaled
   models cannot take the plan's layouts — and hand the survivors' units, the re-seeded units and the
   new plan to :func:`~rpeg.runtime.driver.transition.execute_transition`.

Every stop is a :class:`~rpeg.runtime.driver.controller.RunError` that names the lost device(s) and the
state whose last copy was there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...ir.cluster import Cluster
from ...ir.emu import EMU, Stage
from ...ir.types import Role
from ...solvers.result import Result

__all__ = ["Recovery", "surviving_pools", "urgent_replan"]


@dataclass
class Recovery:
    """What :func:`urgent_replan` decided.

    Attributes
    ----------
    step
        Segment-local step to re-run (the failed one).
    lost_devices
        Physical device ids lost.
    target
        The new plan (a result on the surviving pool's cluster).
    device_base
        Physical device of the new plan's device 0.
    current
        The surviving units plus re-seeded ones, physical device ids.
    alias
        Re-seeded vertex → the training vertex whose workers hold its cells.
    message
        One line for the report.
    """

    step: int
    lost_devices: list[int]
    target: Result
    device_base: int
    current: list[EMU]
    alias: dict[str, str] = field(default_factory=dict)
    message: str = ""


def surviving_pools(cluster: Cluster, lost: set[int]) -> list[tuple[int, Cluster]]:
    """Pools of consecutive flat device ids without a lost device that are clusters of their
    own — part of one node, whole nodes of one rack, or whole racks (as
    :func:`~rpeg.ir.cluster.pool_cluster`), starting at a node boundary unless inside one
    node — largest first, then lowest first device.

    Returns
    -------
    list[tuple[int, Cluster]]
        ``(first device, cluster of the pool)`` pairs; empty when every device is lost.
    """
    from ...ir.cluster import pool_cluster

    n_all, ng = cluster.num_devices, cluster.gpus_per_node
    out = []
    for n in range(n_all, 0, -1):
        try:
            pool = pool_cluster(cluster, n)
        except ValueError:
            continue
        for base in range(0, n_all - n + 1):
            same_node = base // ng == (base + n - 1) // ng
            if not (same_node if n <= ng else base % ng == 0):
                continue
            if not lost.intersection(range(base, base + n)):
                out.append((base, pool))
    return out


def urgent_replan(
    ctl: Any,
    result: Result,
    *,
    method: str = "greedy",
    seed: int = 0,
    time_limit: float | None = 30.0,
    accept: Callable[[Result], None] | None = None,
) -> Recovery:
    """Decide the urgent path after ``ctl`` stopped on a lost worker (module docstring).

    Parameters
    ----------
    ctl
        The stopped :class:`~rpeg.runtime.driver.controller.Controller` (its ``failure`` says what was
        lost).
    result
        The plan ``ctl`` ran.
    method, seed, time_limit
        The replanning call (``rpeg.solve``).
    accept
        Raises ``ValueError`` for a plan the run cannot execute (the runtime's scaled models are
        fixed for the whole run, so a layout they cannot shard is refused); the next pool is
        tried then.

    Returns
    -------
    Recovery

    Raises
    ------
    RunError
        When the last copy of some state is gone, no plan fits the surviving devices, or the
        survivors cannot return to the boundary; the message names the devices and the state.
        Survivors are waited for by progress (:class:`~rpeg.runtime.driver.liveness.Watchdog`): one
        that is alive and computing is waited for, one that is dead or silent for the stall
        window counts as lost.
    """
    from .controller import RunError

    f = ctl.failure
    step = int(f["step"])
    lost = _lost_devices(ctl)
    where = f"device(s) {sorted(lost)}"
    _check_trainers(ctl, step, where)
    # return to the boundary before the failed step
    survivors = [call for grp in ctl.groups.values() for call in grp.all("rollback", step)]
    try:
        ctl.get(survivors, f"returning to step {step}'s boundary")
    except RunError as exc:
        raise RunError(
            f"after losing {where}: survivors could not return to step {step}'s boundary: {exc}"
        ) from exc
    units, intact, current, alias = _surviving_units(ctl, result, lost, where)
    base, pool, target, refused = _replan(result, lost, method, seed, time_limit, accept, where)
    msg = (
        f"lost {where} at step {step}; {len(intact)} of {len(units)} units intact"
        + (f", re-seeded {sorted(alias)} from training" if alias else "")
        + f"; replanned with {method!r} on {pool.shape_str} from device {base}"
        + (f" (refused: {'; '.join(refused)})" if refused else "")
    )
    return Recovery(step, sorted(lost), target, base, current, alias, msg)


def _lost_devices(ctl: Any) -> set[int]:
    """Step 1 of the urgent path: the failed worker's physical device and that of every worker
    that is dead or silent for the stall window — in-flight work is let settle first (results,
    errors or dead workers, waited for by progress), then every survivor is asked. Every worker
    on a lost device counts as lost (killed if still running, added to ``ctl.dead``)."""
    import ray

    b, base = ctl.b, ctl.device_base
    lost = {ctl.failure["device"] + base}

    def drop_lost() -> None:
        for g in b.groups:
            for r, dev in enumerate(g.devices):
                if dev + base in lost and (g.gid, r) not in ctl.dead:
                    ctl.dead.add((g.gid, r))
                    with contextlib.suppress(Exception):
                        ray.kill(ctl.actors[g.gid][r])

    def lose(owners: list) -> None:
        for o in owners:
            ctl.dead.add((o.gid, o.rank))
            lost.add(o.device + base)
        drop_lost()

    drop_lost()
    in_flight = [r for r in ctl.in_flight if r in ctl.ref_owner]
    dead, stuck = ctl.watch.settle(in_flight, ctl.ref_owner.__getitem__)
    lose(dead + stuck)
    probes = {ref: ctl.owners[key] for grp in ctl.groups.values() for key, ref in grp.all("info")}
    dead, stuck = ctl.watch.settle(list(probes), probes.__getitem__)
    lose(dead + stuck)
    return lost


def _check_trainers(ctl: Any, step: int, where: str) -> None:
    """Stop when a training group lost a rank: its ZeRO slice of the optimizer state had a
    single copy."""
    from .controller import RunError

    for g in ctl.b.groups:
        gone = [r for r in range(g.size) if (g.gid, r) in ctl.dead]
        if g.trains and gone:
            raise RunError(
                f"worker {g.worker(gone[0])} on device {g.devices[gone[0]] + ctl.device_base} held a ZeRO "
                f"slice of {g.model}'s optimizer state, whose last copy is gone with {where}; the run "
                "cannot continue (restart from a checkpoint: run(..., checkpoint_dir=...))",
                step=step,
                worker=g.worker(gone[0]),
                device=g.devices[gone[0]],
                lost=True,
            )


def _surviving_units(
    ctl: Any, result: Result, lost: set[int], where: str
) -> tuple[list[EMU], list[EMU], list[EMU], dict[str, str]]:
    """Step 3: ``(units, intact, current, alias)`` — the plan's units on physical devices, those
    without a lost device, the intact ones plus serving model-stages with no intact unit
    re-seeded from their model's training units, and re-seeded vertex → training vertex.

    Raises
    ------
    RunError
        When the last copy of a model-stage's state is gone (a training stage, or a model that
        is not trained).
    """
    from .controller import RunError
    from .transition import physical_units

    graph = ctl.b.graph
    units = physical_units(result, graph, ctl.device_base)
    intact = [u for u in units if not lost.intersection(u.gpus)]
    roles = {v.name: v.role for v in graph.vertices}
    trains = {v.model: v.name for v in graph.vertices if v.role is Role.TRAINING}
    alias: dict[str, str] = {}
    current = list(intact)
    for stage in dict.fromkeys(u.stage for u in units):
        if any(u.stage == stage for u in intact):
            continue
        train = trains.get(stage.model)
        if stage.stage is Stage.TRAIN or train is None:
            kind = "optimizer state and weights" if roles[stage.vertex] is Role.TRAINING else "weights"
            raise RunError(
                f"the last copy of {stage.model}'s {kind} ({stage.vertex}) was on lost {where}; "
                "the run cannot continue (restart from a checkpoint)"
            )
        alias[stage.vertex] = train
        for u in intact:
            if u.stage.vertex == train:
                seeded = EMU(stage, u.tp, u.pp, u.gpus, u.param_bytes, 0.0, vp=u.vp)
                current.append(seeded)
    return units, intact, current, alias


def _replan(
    result: Result,
    lost: set[int],
    method: str,
    seed: int,
    time_limit: float | None,
    accept: Callable[[Result], None] | None,
    where: str,
) -> tuple[int, Cluster, Result, list[str]]:
    """Step 4: ``(first device, pool, plan, refused pools)`` — the first pool of
    :func:`surviving_pools` (largest first) with a plan ``accept`` takes.

    Raises
    ------
    RunError
        When no pool has such a plan (the message lists why each was refused).
    """
    from ...solvers import solve
    from .controller import RunError

    refused = []
    for base, pool in surviving_pools(result.cluster, lost):
        target = solve(result.workload, pool, method, seed=seed, time_limit=time_limit)
        if target.plan is None:
            refused.append(f"{pool.shape_str} from device {base}: {target.message}")
            continue
        try:
            if accept is not None:
                accept(target)
        except ValueError as exc:
            refused.append(f"{pool.shape_str} from device {base}: {exc}")
            continue
        return base, pool, target, refused
    raise RunError(
        f"after losing {where} no plan of {result.workload.algorithm} fits the surviving devices"
        + (": " + "; ".join(refused) if refused else "")
    )
