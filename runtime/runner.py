"""``rpeg.run``: execute a plan for a few RL steps on Ray workers and verify the trace (SPEC §11).

::

    result = rpeg.solve(workload, cluster, method="sa")
    report = rpeg.run(result, steps=4)          # local Ray instance, tiny models on CPU
    print(report.summary())
    report.trace.to_json("trace.json")          # rpeg verify trace.json result.json

The run executes the *plan* — placement, DP/PP/TP layout, microbatches, structure (sharing,
staleness) and the lowered DAG — on scaled-down models (``scale="tiny"``) with a synthetic task,
so CPU processes can run it; the predicted times it reports come from the same cost model
evaluated on the scaled problem with the given hardware file (``rpeg calibrate`` writes one for
the machine at hand).
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..ir.cluster import Cluster
from ..ir.errors import (
    InputError,
    check_output,
    check_output_dir,
    check_positive_int,
    check_seconds,
    check_type,
)
from ..ir.hardware import Hardware
from ..ir.workload import Workload
from ..solvers.result import Result
from .binding import Binding, bind, check_specs, run_specs
from .liveness import DEFAULT_STALL_S, RunError
from .rl import RLConfig
from .trace import Trace, expected_graph, plan_hash

__all__ = ["RunConfig", "RunReport", "predict", "run", "start_local_ray"]


@dataclass(frozen=True)
class RunConfig:
    """How to run a plan (see :func:`run` for the fields)."""

    steps: int = 4
    seed: int = 0
    scale: str | dict = "tiny"
    batch: int | None = None
    prompt_len: int = 8
    response_len: int = 8
    vocab: int = 16
    max_rollouts: int = 4
    rl: RLConfig = field(default_factory=RLConfig)
    address: str | None = None
    devices_per_node: int | None = None
    use_gpu: bool = False
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    fail_at: tuple | None = None
    step_offset: int = 0
    recover: bool = False
    keep_versions: int = 0
    stall_s: float = DEFAULT_STALL_S

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        if self.devices_per_node is not None and self.devices_per_node < 1:
            raise ValueError(f"devices_per_node must be a positive integer, got {self.devices_per_node!r}")


@dataclass
class RunReport:
    """What a run measured.

    Attributes
    ----------
    trace
        The verified trace (``rpeg.trace/1``).
    rewards
        Mean task reward of each step's rollouts.
    step_times, predicted_step_times
        Measured and predicted seconds per step (step ``k`` ends when its last node ends).
    problems
        Verifier findings (empty: the execution matches the plan).
    setup_s, wall_s
        Worker start-up and DAG execution seconds.
    overhead_s
        Controller seconds not spent waiting for workers (dispatch overhead).
    node_overhead_s
        Per record, ``(end − start) − worker_time``: what dispatch, Ray and the object store add.
    weights
        Final full weights per trained model (``return_weights=True``).
    segments
        One verified trace per plan the run executed (``trace`` is the first); a run without
        transitions has one.
    transitions
        A :class:`~rpeg.runtime.transition.TransitionRecord` per executed transition (planned
        ones and those of the urgent path).
    recoveries
        One line per worker loss the run survived (lost devices, intact units, the replan).
    """

    trace: Trace
    rewards: list[float]
    step_times: list[float]
    predicted_step_times: list[float]
    problems: list[str]
    setup_s: float
    wall_s: float
    overhead_s: float
    node_overhead_s: list[float] = field(default_factory=list)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    segments: list[Trace] = field(default_factory=list)
    transitions: list[Any] = field(default_factory=list)
    recoveries: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        """Records in all segments."""
        return sum(len(t.records) for t in self.segments) if self.segments else len(self.trace.records)

    @property
    def overhead_per_node_s(self) -> float:
        """Mean controller time per node."""
        return self.overhead_s / max(1, self.nodes)

    def summary(self) -> str:
        """A few lines: per step reward, measured and predicted time; verification."""
        lines = [f"{'step':>4} {'reward':>8} {'time s':>8} {'pred s':>8}"]
        for k, (r, t, p) in enumerate(zip(self.rewards, self.step_times, self.predicted_step_times)):
            lines.append(f"{k:>4} {r:>8.3f} {t:>8.3f} {p:>8.3f}")
        lines.append(
            f"setup {self.setup_s:.1f} s, run {self.wall_s:.2f} s, dispatch overhead "
            f"{1e3 * self.overhead_per_node_s:.2f} ms/node over {self.nodes} nodes"
        )
        for line in self.recoveries:
            lines.append(f"recovered: {line}")
        for rec in self.transitions:
            kinds = ", ".join(f"{int(d['count'])} {k}" for k, d in sorted(rec.per_kind().items()))
            lines.append(
                f"transition at step {rec.step}: {kinds or 'no primitive'} in {rec.total_s:.2f} s "
                f"(primitives {rec.primitives_s:.2f} s, hand-over {rec.handover_bytes / 1e6:.1f} MB); "
                f"cost model {rec.predicted_s:.3f} s at full size"
            )
        lines.append(
            "trace valid"
            if not self.problems
            else f"trace INVALID ({len(self.problems)}): {self.problems[0]}"
        )
        return "\n".join(lines)


def scaled_problem(binding: Binding, hardware: Hardware) -> tuple[Workload, Cluster]:
    """The workload the runtime executes (scaled specs, batch and lengths) on a cluster of the
    plan's shape with ``hardware`` — what :func:`predict` scores."""
    r = binding.result
    wl = r.workload
    sh = binding.shape
    specs = binding.specs
    actor = "actor_critic" if "actor_critic" in specs else "actor"
    models = {}
    for role in wl.models:
        name = actor if role == "critic" and "critic" not in specs else role
        name = actor if role == "actor" else name
        models[role] = replace(specs[name], dtype_bytes=4)  # the CPU runtime computes in float32
    quantiles = tuple(zip(sh.phase_fractions, sh.phase_lengths))
    scaled = Workload(
        wl.algorithm,
        models,
        sh.batch,
        sh.rollouts,
        sh.prompt_len,
        sh.response_len,
        quantiles=quantiles,
        ac_sharing=wl.ac_sharing,
        name=f"{wl.name}-scaled",
    )
    return scaled, Cluster.from_shape(r.cluster.shape, hardware)


def predict(binding: Binding, hardware: Hardware) -> tuple[list[float], list[float], list[float]]:
    """Predicted node durations, node finish times and per-step times of the scaled run.

    The plan is re-scored by the shared evaluator on :func:`scaled_problem` over ``steps``
    steps; node ids agree with the runtime's DAG because lowering depends only on the plan's
    allocations, strategies and phase count. Step ``k``'s time is the finish of its last node
    minus that of step ``k − 1``.
    """
    from ..scoring.evaluator import Evaluator

    workload, cluster = scaled_problem(binding, hardware)
    r = binding.result
    ev = Evaluator(workload, cluster, r.structure, k_eval=binding.steps)
    assert r.plan is not None
    evaluation = ev.evaluate(r.plan, keep=True)
    g, sched = evaluation.graph, evaluation.schedule
    assert g is not None and sched is not None
    if len(g) != len(binding.exec_graph):
        raise RuntimeError("the scaled lowering differs from the executed DAG (a bug)")
    return list(g.duration), list(sched.finish), _step_times(g.step, sched.finish, binding.steps, 0.0)


def _step_times(steps: list[int], finish: list[float], n: int, origin: float) -> list[float]:
    ends = [origin] * n
    for k, f in zip(steps, finish):
        ends[k] = max(ends[k], f)
    for k in range(1, n):
        ends[k] = max(ends[k], ends[k - 1])
    return [ends[k] - (ends[k - 1] if k else origin) for k in range(n)]


def run(
    result: Result,
    steps: int = 4,
    *,
    address: str | None = None,
    seed: int = 0,
    scale: str | dict = "tiny",
    batch: int | None = None,
    prompt_len: int = 8,
    response_len: int = 8,
    rl: RLConfig | None = None,
    devices_per_node: int | None = None,
    hardware: Hardware | str | None = None,
    checkpoint_dir: str | Path | None = None,
    resume_from: str | Path | None = None,
    trace_path: str | Path | None = None,
    progress: Callable[[str, dict], None] | None = None,
    fail_at: tuple | None = None,
    return_weights: bool = False,
    transitions: Sequence[tuple[int, Result]] = (),
    transition_method: str = "greedy",
    on_worker_lost: str = "stop",
    replan_method: str = "greedy",
    stall_timeout_s: float = DEFAULT_STALL_S,
) -> RunReport:
    """Execute ``result``'s plan for ``steps`` RL steps and verify the trace against it.

    Parameters
    ----------
    result
        A PPO or GRPO result with a plan.
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
        PPO/GRPO hyper-parameters (defaults: GAE γ = 1, λ = 0.95, clip 0.2, KL 0.01).
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
        Callback ``(event, payload)``; events ``"setup"`` (payload ``seconds``, ``groups``,
        ``segment``, ``workers``: worker id → ``pid``, ``host``, ``device``), ``"node"``,
        ``"transition"``, ``"recovery"``.
    fail_at
        Testing hook ``(worker id, vertex, step)``: that worker of the first plan raises in that
        node; ``(worker id, vertex, step, "exit")``: its process exits there (a lost device).
    return_weights
        Gather every trained model's final full weights into :attr:`RunReport.weights`.
    transitions
        ``(k, target)`` pairs: after ``k`` steps in all, move the running job to ``target``'s plan
        (same workload and devices) with its state — parameters, Adam moments and counters, data
        position — through the transition DAG's Split/Merge/Extend/Destroy
        (:mod:`rpeg.runtime.transition`), and continue there. ``0 < k < steps``, increasing.
    transition_method
        Scheduler of each transition DAG (``plan_transition``'s ``method``).
    on_worker_lost
        ``"stop"``: a lost worker stops the run with :class:`RunError`. ``"replan"``: the urgent
        path (:mod:`rpeg.runtime.recovery`) — roll the survivors back to the failed step's
        boundary, replan on the surviving devices with ``replan_method``, move the intact state
        there and re-run the step; it still stops, naming the state, when the last copy of some
        state is gone. Training workers then keep a copy of their state from before each update.
        Transitions planned after the loss are dropped. A worker that *raises* always stops the
        run.
    replan_method
        ``rpeg.solve`` method of the urgent replan.
    stall_timeout_s
        Seconds without any progress (no result arrives and no worker computes) after which a
        wait gives up (:mod:`rpeg.runtime.liveness`); there are no other deadlines, so a slow or
        loaded machine only makes the run slower.

    Returns
    -------
    RunReport

    Raises
    ------
    TypeError
        An argument of the wrong type (the message names it), e.g. ``run(None)``.
    ValueError
        Bad input (no plan, unsupported algorithm, shape, Ray resources, transition step or
        target of another job, an argument out of range); :class:`~rpeg.ir.errors.InputError`
        for a path that cannot be written or a missing or corrupt checkpoint.
    RunError
        A worker raised, died or stalled; the message names the node, its step, the worker and
        its device. Its ``trace`` (and the file ``trace_path``) holds the trace up to the
        failure.
    """
    _check_arguments(
        result,
        steps,
        address=address,
        seed=seed,
        scale=scale,
        batch=batch,
        prompt_len=prompt_len,
        response_len=response_len,
        rl=rl,
        devices_per_node=devices_per_node,
        hardware=hardware,
        checkpoint_dir=checkpoint_dir,
        resume_from=resume_from,
        trace_path=trace_path,
        progress=progress,
        fail_at=fail_at,
        return_weights=return_weights,
        transitions=transitions,
        transition_method=transition_method,
        on_worker_lost=on_worker_lost,
        replan_method=replan_method,
    )
    stall_s = check_seconds("stall_timeout_s", stall_timeout_s, allow_none=False)
    import ray
    import torch

    from ..costmodel import hardware_preset, load_hardware
    from ..solvers.transition import plan_transition
    from .checkpoint import check_checkpoint
    from .controller import Controller
    from .recovery import urgent_replan
    from .transition import check_compatible, execute_transition, physical_units
    from .verify import verify

    rl = rl or RLConfig()
    plans = _segments(result, steps, transitions)
    if transitions and (checkpoint_dir is not None or resume_from is not None):
        raise ValueError(
            "transitions cannot be combined with checkpoint_dir/resume_from (checkpoints are per plan)"
        )
    trace_files = [_segment_path(Path(trace_path), i) for i in range(len(plans))] if trace_path else []
    for i, f in enumerate(trace_files):
        check_output(f, "trace_path" if i == 0 else f"trace_path (segment {i})")
    if checkpoint_dir is not None:
        check_output_dir(checkpoint_dir, "checkpoint_dir")
    for _, target in transitions:
        check_compatible(result, target)
    if isinstance(hardware, Hardware):
        hw = hardware
    elif hardware is None:
        hw = hardware_preset("cpu")
    elif os.path.exists(str(hardware)):
        hw = load_hardware(str(hardware))
    else:
        hw = hardware_preset(str(hardware))
    specs = run_specs([res for res, _ in plans], scale=scale)  # one model shape for the whole run
    bindings = []
    for res, n in plans:
        graph = expected_graph(res, n)
        bindings.append(
            bind(
                res,
                graph,
                n,
                scale=scale,
                batch=batch,
                prompt_len=prompt_len,
                response_len=response_len,
                seed=seed,
                specs=specs,
            )
        )
    # the checkpoint to resume from is verified (schema, plan, every file's size and SHA-256)
    # before any worker starts
    resume = None
    offset = 0
    if resume_from is not None:
        trainers = {g.gid: g.size for g in bindings[0].groups if g.trains}
        resume = check_checkpoint(resume_from, plan_hash(result), trainers)
        offset = resume.global_step + 1
    cfg = RunConfig(
        steps=steps,
        seed=seed,
        scale=scale,
        batch=batch,
        prompt_len=prompt_len,
        response_len=response_len,
        rl=rl,
        address=address,
        devices_per_node=devices_per_node,
        use_gpu=False,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir is not None else None,
        resume_from=str(resume_from) if resume_from is not None else None,
        fail_at=fail_at,
        step_offset=offset,
        stall_s=stall_s,
    )
    # planned up front (full-size state, the plans' hardware): an infeasible move fails before any work
    tplans = [
        plan_transition(
            a.result.plan, b.result.plan, a.result.cluster, graph=a.graph, method=transition_method
        )
        for a, b in zip(bindings, bindings[1:])
    ]
    started = False
    if not ray.is_initialized():
        n = result.cluster.num_devices
        if address is None:
            start_local_ray(n)
        else:
            ray.init(address=address, log_to_driver=False)
        started = True
    use_gpu = (
        ray.cluster_resources().get("GPU", 0) >= result.cluster.num_devices and torch.cuda.is_available()
    )
    # trainers keep the past versions a later, asynchronous plan of the run still reads
    keep = max((t for r, _ in plans[1:] for t in r.structure.tau.values()), default=0)
    cfg = replace(cfg, use_gpu=use_gpu, recover=on_worker_lost == "replan", keep_versions=keep)
    done: list[tuple[Any, int, Result, int]] = []  # (controller, global offset, plan, complete steps)
    records: list[Any] = []
    recoveries: list[str] = []
    ctl = None
    running: tuple[Any, Result, int] | None = None  # the segment under way: controller, plan, offset
    failed: RunError | None = None
    weights: dict[str, dict[str, Any]] = {}
    queue = [
        (res, binding, tplans[i - 1] if i else None)
        for i, ((res, _), binding) in enumerate(zip(plans, bindings))
    ]
    started_ctls: list[Any] = []
    try:
        seg_offset, base, alias, current_units, old_steps = offset, 0, {}, None, 0
        seg = 0
        while queue:
            res, binding, tplan = queue.pop(0)
            seg_cfg = replace(
                cfg, steps=binding.steps, step_offset=seg_offset, fail_at=fail_at if seg == 0 else None
            )
            binding.version_offset = seg_offset - offset  # updates before it in this run
            nxt = Controller(binding, seg_cfg, progress)
            if cfg.checkpoint_dir:
                nxt.on_saved = _manifest_writer(Path(cfg.checkpoint_dir), result)
            running = (nxt, res, seg_offset)
            started_ctls.append(nxt)
            if ctl is None:
                nxt.start(device_base=base)
            else:
                nxt.start(placement=ctl.placement, per_node=ctl.per_node, device_base=base)
            if progress:
                progress(
                    "setup",
                    {
                        "seconds": nxt.setup_s,
                        "groups": len(binding.groups),
                        "segment": seg,
                        "workers": nxt.workers(),
                    },
                )
            if ctl is not None:
                if tplan is None:  # after a device loss: from the intact units to the new plan
                    tplan = plan_transition(
                        current_units,
                        physical_units(res, binding.graph, base),
                        result.cluster,
                        method=transition_method,
                    )
                rec = execute_transition(ctl, nxt, tplan, seg_offset, alias, old_steps)
                records.append(rec)
                if progress:
                    progress("transition", rec.to_dict())
                nxt.owns_placement, ctl.owns_placement = True, False
                ctl.stop()
            ctl = nxt
            seg += 1
            if seg == 1 and resume is not None:
                _restore(ctl, resume)
            try:
                ctl.execute()
            except RunError:
                if not (cfg.recover and ctl.failure and ctl.failure["lost"]):
                    raise
                rcv = urgent_replan(
                    ctl, res, method=replan_method, seed=seed, accept=lambda r: check_specs(r, specs)
                )
                recoveries.append(rcv.message)
                if progress:
                    progress("recovery", {"message": rcv.message, "lost_devices": rcv.lost_devices})
                if rcv.step > 0:
                    done.append((ctl, seg_offset, res, rcv.step))
                running = None
                seg_offset += rcv.step
                old_steps = rcv.step
                left = steps - (seg_offset - offset)
                graph = expected_graph(rcv.target, left)
                target_binding = bind(
                    rcv.target,
                    graph,
                    left,
                    scale=scale,
                    batch=batch,
                    prompt_len=prompt_len,
                    response_len=response_len,
                    seed=seed,
                    specs=specs,
                )
                queue = [(rcv.target, target_binding, None)]  # planned transitions after a loss are dropped
                base, alias, current_units = rcv.device_base, rcv.alias, rcv.current
                continue
            done.append((ctl, seg_offset, res, binding.steps))
            running = None
            seg_offset += binding.steps
            old_steps = binding.steps
            alias, current_units = {}, physical_units(res, binding.graph, base)
        weights = ctl.final_weights() if return_weights and ctl is not None else {}
    except RunError as exc:
        failed = exc
    finally:
        for c in reversed(started_ctls):
            c.stop()
        if started:
            ray.shutdown()
    if failed is not None:
        _fail_with_trace(failed, done, running, hw, use_gpu, address, trace_files)
    traces, rewards, step_times, predicted_steps, problems, overheads = [], [], [], [], [], []
    for i, (c, off, res, n) in enumerate(done):
        trace, seg_rewards, seg_times, seg_pred = _segment_trace(c, res, off, hw, use_gpu, address, n)
        traces.append(trace)
        rewards += seg_rewards
        step_times += seg_times
        predicted_steps += seg_pred
        found = verify(trace, res)
        problems += [f"segment {i}: {p}" for p in found] if len(done) > 1 else found
        overheads += [max(0.0, (r.end - r.start) - r.worker_time) for r in trace.records]
        if trace_files:
            trace.to_json(_segment_path(Path(trace_files[0]), i))
    return RunReport(
        traces[0],
        rewards,
        step_times,
        predicted_steps,
        problems,
        sum(d[0].setup_s for d in done),
        sum(d[0].wall_s for d in done),
        sum(d[0].overhead_s for d in done),
        overheads,
        weights,
        traces,
        records,
        recoveries,
    )


def start_local_ray(devices: int, num_cpus: int | None = None) -> None:
    """Start a local Ray instance for a run on ``devices`` devices: one ``rpeg_device`` resource
    per device, no dashboard, and worker processes at the driver's priority.

    Ray starts its worker processes with niceness 15 by default; the runtime's workers *are*
    the job, and niced they starve behind any other load on the machine (a loaded 2-core host
    ran a 2-step run for minutes), so they run at niceness 0 here. A cluster joined with
    ``address`` keeps its own setting (``RAY_worker_niceness`` when it was started).

    Parameters
    ----------
    devices
        Devices of the plan (``rpeg_device`` resources).
    num_cpus
        CPUs Ray may schedule (default: the machine's, at least 2).
    """
    import ray

    ray.init(
        num_cpus=num_cpus or max(2, os.cpu_count() or 2),
        resources={"rpeg_device": devices},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config={"worker_niceness": 0},
    )


def _segment_path(path: Path, i: int) -> Path:
    """Segment ``i``'s trace file: ``path`` itself, then ``<stem>.seg<i><suffix>``."""
    return path if i == 0 else path.with_name(f"{path.stem}.seg{i}{path.suffix}")


def _check_arguments(result: Any, steps: Any, **kw: Any) -> None:
    """``TypeError`` / ``ValueError`` naming the first bad argument of :func:`run` (before any
    work: no torch.distributed, no Ray)."""
    check_type("result", result, Result, "a Result (rpeg.solve(...) or rpeg.Result.from_json('result.json'))")
    check_positive_int("steps", steps)
    check_type("seed", kw["seed"], int)
    check_type("scale", kw["scale"], (str, dict))
    for name in ("prompt_len", "response_len"):
        check_positive_int(name, kw[name])
    for name in ("batch", "devices_per_node"):
        if kw[name] is not None:
            check_positive_int(name, kw[name])
    if kw["address"] is not None:
        check_type("address", kw["address"], str)
    if kw["rl"] is not None:
        check_type("rl", kw["rl"], RLConfig)
    if kw["hardware"] is not None:
        check_type(
            "hardware", kw["hardware"], (Hardware, str, os.PathLike), "a Hardware, a preset name or a path"
        )
    for name in ("checkpoint_dir", "resume_from", "trace_path"):
        if kw[name] is not None:
            check_type(name, kw[name], (str, os.PathLike), "a path (str or os.PathLike)")
    if kw["resume_from"] is not None and not Path(kw["resume_from"]).is_dir():
        what = (
            "is a file, not a checkpoint directory" if Path(kw["resume_from"]).exists() else "does not exist"
        )
        raise InputError(f"resume_from {str(kw['resume_from'])!r} {what}", source="resume_from")
    if kw["progress"] is not None and not callable(kw["progress"]):
        raise TypeError(
            f"progress must be a callable (event, payload) or None, got {type(kw['progress']).__name__}"
        )
    if kw["fail_at"] is not None:
        check_type("fail_at", kw["fail_at"], tuple)
    check_type("return_weights", kw["return_weights"], bool)
    if isinstance(kw["transitions"], (str, bytes)) or not isinstance(kw["transitions"], Sequence):
        raise TypeError(
            f"transitions must be a sequence of (step, Result) pairs, got {type(kw['transitions']).__name__}"
        )
    for name in ("transition_method", "replan_method", "on_worker_lost"):
        check_type(name, kw[name], str)
    if kw["on_worker_lost"] not in ("stop", "replan"):
        raise ValueError(f"on_worker_lost must be 'stop' or 'replan', got {kw['on_worker_lost']!r}")


def _fail_with_trace(
    exc: RunError,
    done: list[tuple[Any, int, Result, int]],
    running: tuple[Any, Result, int] | None,
    hw: Hardware,
    use_gpu: bool,
    address: str | None,
    trace_files: list[Path],
) -> None:
    """Write the traces up to the failure (completed segments, then the failed one with status
    ``"failed"``), attach the failed one to ``exc`` and raise it."""
    traces = []
    for c, off, res, n in done:
        traces.append(_segment_trace(c, res, off, hw, use_gpu, address, n)[0])
    if running is not None:
        c, res, off = running
        if exc.node is None and c.failure:  # e.g. the urgent path stopped: the loss that started it
            f = c.failure
            exc.node, exc.step, exc.vertex = f["node"], f["step"], f["vertex"]
            if exc.worker is None:
                exc.worker, exc.device, exc.lost = f["worker"], f["device"], f["lost"]
        failure = {
            "message": str(exc),
            "node": exc.node,
            "step": exc.step,
            "vertex": exc.vertex,
            "worker": exc.worker,
            "device": exc.device,
            "lost": bool(exc.lost),
        }
        traces.append(_segment_trace(c, res, off, hw, use_gpu, address, c.b.steps, failure=failure)[0])
    if traces:
        exc.trace = traces[-1]
    if trace_files and traces:
        for i, t in enumerate(traces):
            t.to_json(_segment_path(trace_files[0], i))
        exc.trace_path = str(_segment_path(trace_files[0], len(traces) - 1))
    raise exc


def _segments(
    result: Result, steps: int, transitions: Sequence[tuple[int, Result]]
) -> list[tuple[Result, int]]:
    """``(plan, steps)`` per segment of a run with transitions after the given step counts."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    out, last, current = [], 0, result
    for n, pair in enumerate(transitions):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"transitions[{n}] must be a (step, result) pair, got {pair!r}")
        k, target = pair
        if not isinstance(k, int) or not last < k < steps:
            raise ValueError(
                f"transitions[{n}]: step {k!r} must be an integer in {last + 1}..{steps - 1} "
                "(after the previous transition, before the last step)"
            )
        if not isinstance(target, Result) or target.plan is None:
            raise ValueError(
                f"transitions[{n}]: target must be a Result with a plan, got {type(target).__name__}"
            )
        out.append((current, k - last))
        last, current = k, target
    out.append((current, steps - last))
    return out


def _segment_trace(
    ctl: Any,
    result: Result,
    offset: int,
    hw: Hardware,
    use_gpu: bool,
    address: str | None,
    steps: int,
    failure: dict[str, Any] | None = None,
) -> tuple[Trace, list[float], list[float], list[float]]:
    """The trace and per-step figures of one executed plan's first ``steps`` complete steps (all of
    them, or those before a lost worker's step: the rest are dropped and the node ids renumbered
    to the ``steps``-step graph). With ``failure`` the segment stopped: the trace keeps every
    record completed before it (node ids of the segment's graph), status ``"failed"``, and
    step metrics for the steps before the failed one."""
    import torch

    binding = ctl.b
    durations, _, predicted_steps = predict(binding, hw)
    records = sorted(ctl.records, key=lambda r: r.node)
    if failure is None and steps < binding.steps:
        records = _renumber([r for r in records if r.step < steps], result, steps)
        durations = []  # per node of the full segment graph; not meaningful for a cut-short one
        predicted_steps = predicted_steps[:steps]
    step_times = _step_times([r.step for r in records], [r.end for r in records], steps, 0.0)
    rewards = []
    for k in range(steps):
        parts = ctl.rewards.get(k, [])
        total = sum(c for _, c in parts)
        rewards.append(sum(s for s, _ in parts) / total if total else float("nan"))
    shown = steps
    if failure is not None:
        shown = failure["step"] if failure.get("step") is not None else 0
    step_metrics = [
        {
            "step": k + offset,
            "reward": rewards[k] if math.isfinite(rewards[k]) else None,
            "step_time_s": step_times[k],
            "predicted_step_time_s": predicted_steps[k],
            "losses": ctl.losses.get(k, {}),
        }
        for k in range(min(shown, steps))
    ]
    cfg = ctl.cfg
    trace = Trace(
        plan_hash=plan_hash(result),
        steps=steps,
        staleness=dict(result.structure.tau),
        records=records,
        step_metrics=step_metrics,
        groups=ctl.group_info,
        meta={
            "scaled": True,
            "seed": cfg.seed,
            "scale": cfg.scale,
            "step_offset": offset,
            "version_offset": binding.version_offset,
            "host": platform.node(),
            "ray_address": address or "local",
            "torch": torch.__version__,
            "backend": "nccl" if use_gpu else "gloo",
            "hardware": hw.name,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "predicted_durations": durations,
            "setup_s": ctl.setup_s,
            "wall_s": ctl.wall_s,
            "dispatch_overhead_s": ctl.overhead_s,
            "stall_timeout_s": cfg.stall_s,
        },
        status="complete" if failure is None else "failed",
        failure=failure,
    )
    return trace, rewards, step_times, predicted_steps


def _renumber(records: list[Any], result: Result, steps: int) -> list[Any]:
    """Records of the first ``steps`` steps with the node ids of the ``steps``-step graph."""
    from dataclasses import replace as copy_with

    from ..ir.lower import OP

    g = expected_graph(result, steps)
    names = [v.name for v in result.graph.vertices]
    kinds = ("op", "comm", "reshard")
    ids = {}
    for i in range(len(g)):
        src = None if g.kind[i] == OP else names[g.source[i]]
        ids[(kinds[g.kind[i]], names[g.vertex[i]], src, g.step[i], g.phase[i])] = i
    out = []
    for r in records:
        key = (r.kind, r.vertex, r.source, r.step, r.phase)
        out.append(copy_with(r, node=ids.get(key, -1)))
    return sorted(out, key=lambda r: r.node)


# ---------------------------------------------------------------------------- checkpoints
def _manifest_writer(root: Path, result: Result) -> Callable[[Any], None]:
    """The controller's ``on_saved`` hook: rewrite ``root/manifest.json`` with every step whose
    training ranks have all written their files (:mod:`rpeg.runtime.checkpoint`)."""
    from .checkpoint import write_manifest

    digest = plan_hash(result)

    def write(ctl: Any) -> None:
        trainers = [g for g in ctl.b.groups if g.trains]
        want = {f"g{g.gid}-r{r}.pt" for g in trainers for r in range(g.size)}
        complete = {k: files for k, files in ctl.saved.items() if want <= set(files)}
        write_manifest(root, digest, [g.gid for g in trainers], complete)

    return write


def _restore(ctl: Any, resume: Any) -> None:
    """Load the training groups' files of the verified checkpoint step ``resume``
    (:class:`~rpeg.runtime.checkpoint.Resume`) and install those weights on every other group of
    the same model (their version 0 of this run)."""
    b = ctl.b
    loads = [
        ((g.gid, r), a.call.remote("load", str(resume.step_dir / f"g{g.gid}-r{r}.pt")))
        for g in b.groups
        if g.trains
        for r, a in enumerate(ctl.actors[g.gid])
    ]
    ctl.get(loads, f"loading checkpoint step {resume.global_step} from {str(resume.step_dir)!r}")
    for g in b.groups:
        if g.trains:
            pubs = [a.call.remote("publish") for a in ctl.actors[g.gid]]
            for other in b.groups:
                if other.model == g.model and not other.trains:
                    calls = [
                        ((other.gid, r), a.call.remote("install", pubs, 0))
                        for r, a in enumerate(ctl.actors[other.gid])
                    ]
                    ctl.get(calls, f"installing the checkpoint's {g.model} weights")
