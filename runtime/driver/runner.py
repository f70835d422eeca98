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

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...ir.errors import (
    check_output,
    check_output_dir,
    check_type,
)
from ...ir.hardware import Hardware
from ...ir.types import Role
from ...solvers.result import Result
from ..binding import Binding, bind, check_specs, run_specs, update_microbatches
from ..config import DEFAULT_STALL_S, RLConfig, RunConfig
from ..trace.records import expected_graph, plan_hash
from ..trace.report import RunReport, predict, scaled_problem, segment_trace
from .liveness import RunError, RunInterrupted, interrupt_on_sigterm
from .pool import start_local_ray

__all__ = ["RunConfig", "RunReport", "predict", "run", "scaled_problem", "start_local_ray"]


@dataclass(frozen=True)
class _Settings:
    """What the run works with, settled from the :class:`~rpeg.runtime.config.RunConfig` (its
    fields, resolved: ``rl`` with the workload's KL coefficient, paths as text, the stall
    window) and, once Ray runs, from the cluster and the segments (``use_gpu``,
    ``keep_versions``, ``step_offset`` of a resumed run). Handed to every controller."""

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
    rollout_engine: str = "torch"
    weight_handover: str = "auto"


def run(
    result: Result,
    steps: int | None = None,
    *,
    config: RunConfig | None = None,
    **options: Any,
) -> RunReport:
    """Execute ``result``'s plan for ``steps`` RL steps and verify the trace against it.

    Parameters
    ----------
    result
        A PPO, GRPO, ReMax or DPO result with a plan.
    steps
        RL steps to run (default: ``config``'s, 4).
    config
        The run's options (:class:`~rpeg.runtime.config.RunConfig`, where each is documented);
        default: its defaults.
    **options
        Any field of :class:`~rpeg.runtime.config.RunConfig` by name (``seed=``, ``hardware=``,
        ``trace_path=``, ``rollout_engine=``, …), replacing ``config``'s.

    Returns
    -------
    RunReport

    Raises
    ------
    TypeError
        An argument of the wrong type (the message names it), e.g. ``run(None)``.
    ValueError
        Bad input (no plan, unsupported algorithm, shape, Ray resources, transition step or
        target of another job, an argument out of range, a plan choice the engines do not run
        (:func:`check_engine_choices`), ``rl.kl_coef > 0`` without a reference);
        :class:`~rpeg.ir.errors.InputError`
        for a path that cannot be written or a missing or corrupt checkpoint.
    RunError
        A worker raised, died or stalled; the message names the node, its step, the worker and
        its device. Its ``trace`` (and the file ``trace_path``) holds the trace up to the
        failure.
    RunInterrupted
        Ctrl-C (SIGINT) or SIGTERM stopped the run (in the main thread, SIGTERM is handled as
        SIGINT while the run lasts: :func:`~rpeg.runtime.driver.liveness.interrupt_on_sigterm`). The
        workers are stopped; its ``trace`` (and the file ``trace_path``) holds the records up to
        the interruption, status ``"interrupted"``, and ``step`` the first step not completed. A
        subclass of ``KeyboardInterrupt``.
    """
    check_type("result", result, Result, "a Result (rpeg.solve(...) or rpeg.Result.from_json('result.json'))")
    opts = _options(steps, config, options)
    _check_transitions(result, opts)
    import ray

    cfg = _Settings(
        steps=opts.steps,
        seed=opts.seed,
        scale=opts.scale,
        batch=opts.batch,
        prompt_len=opts.prompt_len,
        response_len=opts.response_len,
        rl=rl_config(result, opts.rl),
        address=opts.address,
        devices_per_node=opts.devices_per_node,
        checkpoint_dir=str(opts.checkpoint_dir) if opts.checkpoint_dir is not None else None,
        resume_from=str(opts.resume_from) if opts.resume_from is not None else None,
        fail_at=opts.fail_at,
        recover=opts.on_worker_lost == "replan",
        stall_s=float(opts.stall_timeout_s),
        rollout_engine=opts.rollout_engine,
        weight_handover=opts.weight_handover,
    )
    plan = _prepare(
        result,
        cfg,
        hardware=opts.hardware,
        trace_path=opts.trace_path,
        transitions=opts.transitions,
        transition_method=opts.transition_method,
    )
    with interrupt_on_sigterm() as claim_sigterm:
        started, session = _start_ray(result, opts.address)
        if session and opts.progress:
            opts.progress("ray", {"session_dir": session, "logs": os.path.join(session, "logs")})
        claim_sigterm()  # ray.init installs a SIGTERM handler of its own
        plan.cfg = replace(plan.cfg, use_gpu=_use_gpu(result), keep_versions=_kept_versions(plan.segments))
        state = _RunState(offset=plan.cfg.step_offset)
        failed: RunError | None = None
        interrupted: RunInterrupted | None = None
        ran = False
        try:
            _run_segments(
                plan,
                state,
                progress=opts.progress,
                transition_method=opts.transition_method,
                replan_method=opts.replan_method,
                return_weights=opts.return_weights,
            )
            ran = True
        except RunError as exc:
            failed = exc
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (RunInterrupted)
            interrupted = exc if isinstance(exc, RunInterrupted) else RunInterrupted(signal.SIGINT)
        finally:
            for c in reversed(state.controllers):
                c.finished = c.finished and ran  # a stopped run's workers are never pooled
                c.stop()
            if started:
                ray.shutdown()
        stopped = failed or interrupted
        if stopped is not None:
            _stop_with_trace(
                stopped,
                state.done,
                state.running,
                plan.hardware,
                plan.cfg.use_gpu,
                opts.address,
                plan.trace_files,
            )
    return _report(plan, state)


@dataclass
class _RunPlan:
    """What :func:`run` settles before any worker starts (:func:`_prepare`).

    Attributes
    ----------
    result
        The plan the run starts with.
    segments
        ``(plan, steps)`` per segment (:func:`_segments`).
    bindings
        One :class:`~rpeg.runtime.binding.Binding` per segment, all with the same scaled ``specs``.
    transition_plans
        The scheduled transition from segment ``i`` to ``i + 1``.
    specs
        Scaled model spec per model, fixed for the whole run (an urgent replan must fit them).
    hardware
        Hardware of the predicted times.
    trace_files
        Trace file per segment (empty without ``trace_path``).
    resume
        The verified checkpoint step to start from (:class:`~rpeg.runtime.trace.checkpoint.Resume`), or
        ``None``.
    cfg
        The run's configuration; ``step_offset`` is the global step the run starts at.
    """

    result: Result
    segments: list[tuple[Result, int]]
    bindings: list[Binding]
    transition_plans: list[Any]
    specs: dict[str, Any]
    hardware: Hardware
    trace_files: list[Path]
    resume: Any
    cfg: _Settings


@dataclass
class _RunState:
    """Where the segment loop of :func:`run` stands (what the report, or the failure's trace, is
    built from).

    Attributes
    ----------
    offset
        Global step the next segment starts at.
    done
        ``(controller, global offset, plan, complete steps)`` per finished segment.
    running
        The segment under way: ``(controller, plan, global offset)``, or ``None``.
    controllers
        Every started controller (all stopped when the run ends).
    current
        The latest segment's controller (the source of the next transition).
    segment
        Segments started.
    device_base
        Physical device of the current plan's device 0 (moves after a device loss).
    alias
        Re-seeded vertex → training vertex holding its cells (after a device loss).
    units
        The current plan's units on physical devices: the source of an unplanned transition.
    old_steps
        Steps the previous segment completed.
    transitions, recoveries, weights
        What :class:`~rpeg.runtime.trace.report.RunReport` reports.
    """

    offset: int
    done: list[tuple[Any, int, Result, int]] = field(default_factory=list)
    running: tuple[Any, Result, int] | None = None
    controllers: list[Any] = field(default_factory=list)
    current: Any = None
    segment: int = 0
    device_base: int = 0
    alias: dict[str, str] = field(default_factory=dict)
    units: list[Any] | None = None
    old_steps: int = 0
    transitions: list[Any] = field(default_factory=list)
    recoveries: list[str] = field(default_factory=list)
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)


def _prepare(
    result: Result,
    cfg: _Settings,
    *,
    hardware: Hardware | str | None,
    trace_path: str | Path | None,
    transitions: Sequence[tuple[int, Result]],
    transition_method: str,
) -> _RunPlan:
    """Everything that can be refused before any worker starts, in this order: the segments, a
    checkpoint with transitions, the output paths, the transition targets, the hardware, the
    bindings, the checkpoint to resume from (schema, plan, every file's size and SHA-256) and
    the transition schedules (full-size state on the plans' hardware: an infeasible move fails
    before any work)."""
    from ...solvers.transition import plan_transition
    from ..engines import require
    from ..engines.checks import check_rollout_layout
    from ..trace.checkpoint import check_checkpoint
    from .transition import check_compatible

    require("transformers", purpose="the runtime's models (rpeg.run)")
    segments = _segments(result, cfg.steps, transitions)
    if transitions and (cfg.checkpoint_dir is not None or cfg.resume_from is not None):
        raise ValueError(
            "transitions cannot be combined with checkpoint_dir/resume_from (checkpoints are per plan)"
        )
    trace_files = [_segment_path(Path(trace_path), i) for i in range(len(segments))] if trace_path else []
    for i, f in enumerate(trace_files):
        check_output(f, "trace_path" if i == 0 else f"trace_path (segment {i})")
    if cfg.checkpoint_dir is not None:
        check_output_dir(cfg.checkpoint_dir, "checkpoint_dir")
    for _, target in transitions:
        check_compatible(result, target)
    # the engines this run uses: their calibrated terms, where the hardware file has them
    hw = _hardware(hardware).using(generation=cfg.rollout_engine, inference="torch", training="torch")
    for res, _ in segments:
        check_engine_choices(res, moves_state=bool(transitions) or cfg.recover)
    specs = run_specs([res for res, _ in segments], scale=cfg.scale)  # one model shape for the whole run
    bindings = [_bind(res, n, cfg, specs) for res, n in segments]
    for b in bindings:
        check_rollout_layout(b.groups, cfg.rollout_engine)
    resume = None
    if cfg.resume_from is not None:
        trainers = {g.gid: g.size for g in bindings[0].groups if g.trains}
        resume = check_checkpoint(cfg.resume_from, plan_hash(result), trainers)
        cfg = replace(cfg, step_offset=resume.global_step + 1)
    tplans = [
        plan_transition(
            a.result.plan, b.result.plan, a.result.cluster, graph=a.graph, method=transition_method
        )
        for a, b in zip(bindings, bindings[1:])
    ]
    return _RunPlan(result, segments, bindings, tplans, specs, hw, trace_files, resume, cfg)


def check_engine_choices(result: Result, *, moves_state: bool = False) -> None:
    """Refuse, before any worker starts, a plan whose SPEC §14 choices the bundled engines do not
    execute yet (``docs/runtime.md``, "Real job shapes").

    The torch engine trains with FSDP2 at ZeRO stage 2 (full parameters kept between updates) or
    3 (parameters sharded too, one FSDP2 unit per decoder layer), holds a forward-only copy
    replicated (stage 2) or sharded the same way (stage 3, :class:`~rpeg.runtime.worker.parallel.
    FSDPShards`), and runs a chunked loss (``logits_chunk``) as planned: a forward pass applies
    the head to ``c`` tokens at a time, training does so under activation checkpointing. A
    stage-3 model's state does not move between plans yet: with ``moves_state`` (transitions,
    or replanning after a lost worker) it is refused. The workload's choices of SPEC §14.2 and
    §14.8 run: a rule reward (the generation scores its rollouts with the task's rule), no
    reference (``kl_coef = 0``: no KL term), the old log-probs from the trainer's own pass
    (``actor_logp``) and ``U = mini_batches`` optimizer updates per step, each over a contiguous
    mini-batch of the step's samples in ``⌈mb/U⌉`` microbatches. Pipelined
    training runs one 1F1B schedule of ``⌈mb/U⌉`` microbatches per update, so that count must
    reach ``Pp``. Microbatches (gradient accumulation), recomputation and packing run as planned;
    a generation's memory fraction sizes a GPU rollout engine's cache, while the vLLM CPU build
    runs with its own ``VLLM_CPU_KVCACHE_SPACE`` (1 GiB, enough for every sequence of the scaled
    runs). Host offload (SPEC §14.4) is refused: a CPU worker's device memory is host memory,
    and the vLLM CPU build has no sleep mode (``ModelConfig``: "Sleep mode is not supported on
    current platform").

    Mixture-of-experts models run as scaled Qwen3-MoE models (SPEC §15.1); refused, naming the
    model: shared experts (Qwen3-MoE has none), latent attention (the runtime builds standard
    attention), MXFP4 experts (``precision = "mxfp4"``: the engines serve BF16 weights) and, for a MoE model, a move of state between plans; tensor parallelism of a MoE
    model outside generation (the torch engine does not split experts). Sequence parallelism is
    refused, and so are an interleaved pipeline (``vp > 1``: the engines run plain 1F1B) and
    overlapped expert-parallel AlltoAlls (``ep_overlap``: the torch engine runs them in line), the
    flex dispatcher (``flex_dispatch``: the torch engine's are AlltoAlls), and context and expert
    parallelism where the engines do not run them
    (:func:`_context_parallel_refusal`, :func:`_expert_parallel_refusal`): the message names the
    ``rpeg solve`` switch that plans without them.

    Raises
    ------
    ValueError
        Naming the vertex (or model), the choice and what to plan instead.
    """
    assert result.plan is not None
    for name, inst in result.graph.models.items():
        spec = inst.spec
        if spec.is_moe and spec.shared_experts:
            raise ValueError(
                f"model {name!r} ({spec.name}) has {spec.shared_experts} shared expert(s): the bundled "
                "runtime builds mixture-of-experts models as Qwen3-MoE, which has none, and does not "
                "run it (plans for it are made and scored; docs/runtime.md)"
            )
        if spec.is_moe and moves_state:
            raise ValueError(
                f"model {name!r} ({spec.name}) is a mixture-of-experts model: moving its state between "
                "plans (transitions, replanning after a lost worker) is not run yet (docs/runtime.md)"
            )
        if spec.has_mxfp4_experts:
            raise ValueError(
                f"model {name!r} ({spec.name}) has precision 'mxfp4': the bundled runtime serves the "
                "seeded or local BF16 weights it trains, not MXFP4 experts (plans for it are made and "
                "scored; give the model precision 'bf16' to run it; docs/runtime.md)"
            )
        if spec.is_mla:
            raise ValueError(
                f"model {name!r} ({spec.name}) has multi-head latent attention (kv_lora_rank = "
                f"{spec.kv_lora_rank}): the bundled runtime builds standard attention only and does not "
                "run it (plans for it are made and scored; docs/runtime.md)"
            )
    U = result.workload.mini_batches
    for v, c in zip(result.graph.vertices, result.plan.choices):
        s = c.strategy
        if s.offload:
            what = (
                "the vLLM CPU build has no sleep mode"
                if v.role is Role.GENERATION
                else "a CPU worker's device memory is host memory: there is nowhere to offload to"
            )
            raise ValueError(
                f"vertex {v.name!r}: host offload (offload=true) is planned but {what}; plan for the "
                "bundled engines with Cluster(..., host_offload=False) (rpeg solve --no-host-offload)"
            )
        cp_why = _context_parallel_refusal(result, s, moves_state=moves_state)
        ep_why = _expert_parallel_refusal(v.role, s)
        if result.graph.models[v.model].spec.is_moe and s.tp > 1 and v.role is not Role.GENERATION:
            raise ValueError(
                f"vertex {v.name!r}: tp={s.tp} of a mixture-of-experts model is planned, but the torch "
                "engine does not split experts over tensor-parallel ranks (docs/runtime.md); plan its "
                "experts over data-parallel ranks with expert parallelism instead"
            )
        for flag, what, planned, why in (
            (
                "--no-sequence-parallel",
                f"sequence parallelism (sp, tp={s.tp})",
                s.sp,
                "the bundled engines do not run it yet",
            ),
            ("--no-context-parallel", f"context parallelism (cp={s.cp}, {s.cp_kind})", s.cp > 1, cp_why),
            ("--no-expert-parallel", f"expert parallelism (ep={s.ep})", s.ep > 1, ep_why),
            (
                "--no-virtual-pipeline-parallel",
                f"an interleaved pipeline (vp={s.vp}, pp={s.pp})",
                s.vp > 1,
                "the bundled engines run plain 1F1B",
            ),
            (
                "--no-expert-overlap",
                f"expert-parallel AlltoAlls under another microbatch's compute (ep_overlap, ep={s.ep})",
                s.ep_overlap,
                "the torch engine runs them in line",
            ),
            (
                "--no-flex-dispatch",
                f"the flex dispatcher for the experts' tokens (flex_dispatch, ep={s.ep})",
                s.flex_dispatch,
                "the torch engine dispatches them with AlltoAlls",
            ),
        ):
            if planned and why:
                raise ValueError(
                    f"vertex {v.name!r}: {what} is planned but {why} (docs/runtime.md); plan for "
                    f"them with rpeg solve {flag} (Cluster(..., {flag[5:].replace('-', '_')}=False))"
                )
        runs = (2, 3) if v.role is not Role.GENERATION and not moves_state else (2,)
        if s.zero not in runs:
            what = (
                "a stage-3 model's state does not move between plans yet (transitions, replanning)"
                if s.zero == 3 and v.role is not Role.GENERATION
                else "the torch engine trains at stages 2 and 3 and holds forward-only copies at "
                "stage 2 (replicated) or 3 (sharded)"
            )
            raise ValueError(
                f"vertex {v.name!r}: ZeRO stage {s.zero} is planned but {what}; plan for it with "
                "Cluster(..., max_zero_stage=2) (rpeg solve --max-zero-stage 2)"
            )
        if v.role is Role.TRAINING and s.pp > 1 and update_microbatches(s.mb, U) < s.pp:
            raise ValueError(
                f"vertex {v.name!r}: pp={s.pp} training runs one 1F1B schedule per optimizer update, but "
                f"mb={s.mb} microbatches over U={U} updates (workload.mini_batches) give "
                f"⌈mb/U⌉ = {update_microbatches(s.mb, U)} per update, fewer than pp={s.pp}; plan "
                f"mb >= {s.pp * U} or fewer mini_batches"
            )


def _context_parallel_refusal(result: Result, s: Any, *, moves_state: bool) -> str:
    """Why the torch engine cannot run strategy ``s``'s context parallelism in ``result`` (``""``:
    it can). It runs ring and Ulysses attention for training and log-prob or value passes
    (:mod:`~rpeg.runtime.worker.context`) of one pipeline stage, with token-summed losses; not
    with pipeline stages (a stage would pass split hidden states), DPO (its loss is a nonlinear
    function of each sequence's summed log-ratio, which a rank holding part of the positions
    cannot form alone) or a move between plans (untested)."""
    if s.cp == 1:
        return ""
    if s.pp > 1:
        return f"the torch engine runs it with one pipeline stage only (pp={s.pp})"
    if result.workload.algorithm == "dpo":
        return "DPO's sequence-level loss needs each sequence's whole log-ratio on one rank"
    if moves_state:
        return "moving a context-parallel group's state between plans is not run yet"
    return ""


def _expert_parallel_refusal(role: Role, s: Any) -> str:
    """Why the bundled engines cannot run strategy ``s``'s expert parallelism for a vertex of
    ``role`` (``""``: they can). The torch engine runs it for training and log-prob passes over
    plain data-parallel ranks at ZeRO stage 2 (:mod:`~rpeg.runtime.worker.experts`); not for a
    generation (vLLM's CPU build crashes a worker with ``enable_expert_parallel``, measured in
    benchmarks/RESULTS.md "vllm-moe", and the torch engine's generation does not exchange tokens),
    nor beside tensor, pipeline or context parallelism or ZeRO-3 (not built)."""
    if s.ep == 1:
        return ""
    if role is Role.GENERATION:
        return "no bundled engine generates with it (vLLM-CPU's expert parallelism crashes a worker)"
    if s.tp > 1 or s.pp > 1 or s.cp > 1:
        return f"the torch engine runs it over data-parallel ranks only (tp={s.tp}, pp={s.pp}, cp={s.cp})"
    if s.zero == 3:
        return "the torch engine runs it at ZeRO stage 2 only"
    return ""


def rl_config(result: Result, rl: RLConfig | None) -> RLConfig:
    """The RL hyper-parameters of a run of ``result``: ``rl``, or by default
    :class:`~rpeg.runtime.worker.rl.RLConfig` with the workload's ``kl_coef`` (PPO, GRPO, ReMax; DPO
    keeps its own ``dpo_beta`` and has no ``kl_coef``).

    Raises
    ------
    ValueError
        If ``rl.kl_coef > 0`` for a workload without a reference model (``kl_coef = 0``), naming
        both values.
    """
    wl = result.workload
    if rl is None:
        return RLConfig() if wl.kl_coef is None else RLConfig(kl_coef=wl.kl_coef)
    if wl.kl_coef == 0.0 and rl.kl_coef > 0:
        raise ValueError(
            f"rl.kl_coef = {rl.kl_coef!r} but the workload has kl_coef = 0 (no reference model to take "
            "a KL term against); pass RLConfig(kl_coef=0.0) or plan the workload with a non-zero kl_coef"
        )
    return rl


def _hardware(hardware: Hardware | str | None) -> Hardware:
    """The hardware of the predicted times: given, a JSON file, or a preset (default ``"cpu"``)."""
    from ...costmodel import hardware_preset, load_hardware

    if isinstance(hardware, Hardware):
        return hardware
    if hardware is None:
        return hardware_preset("cpu")
    if os.path.exists(str(hardware)):
        return load_hardware(str(hardware))
    return hardware_preset(str(hardware))


def _bind(result: Result, steps: int, cfg: _Settings, specs: dict[str, Any]) -> Binding:
    """``result``'s ``steps``-step DAG bound to worker groups in the run's shape."""
    return bind(
        result,
        expected_graph(result, steps),
        steps,
        scale=cfg.scale,
        batch=cfg.batch,
        prompt_len=cfg.prompt_len,
        response_len=cfg.response_len,
        seed=cfg.seed,
        specs=specs,
    )


def _start_ray(result: Result, address: str | None) -> tuple[bool, str | None]:
    """Join ``address`` or start a local instance unless Ray already runs in this process.
    Returns whether this call started it (the run then shuts it down) and the Ray session's
    directory when it did (``None`` otherwise): the workers' output is in its ``logs/``, not on
    the terminal (``log_to_driver=False``)."""
    import ray

    if ray.is_initialized():
        return False, None
    if address is None:
        return True, start_local_ray(result.cluster.num_devices)
    context = ray.init(address=address, log_to_driver=False)
    return True, context.address_info.get("session_dir")


def _use_gpu(result: Result) -> bool:
    """Whether the Ray cluster offers a GPU per device of the plan. The driver imports no torch:
    a worker on a GPU whose torch has no CUDA refuses to start, saying so
    (:class:`~rpeg.runtime.worker.core.Worker`)."""
    import ray

    return ray.cluster_resources().get("GPU", 0) >= result.cluster.num_devices


def _kept_versions(segments: list[tuple[Result, int]]) -> int:
    """Past versions trainers keep: the largest staleness of a later, asynchronous plan of the
    run (it still reads them after a transition)."""
    return max((t for r, _ in segments[1:] for t in r.structure.tau.values()), default=0)


def _run_segments(
    plan: _RunPlan,
    state: _RunState,
    *,
    progress: Callable[[str, dict], None] | None,
    transition_method: str,
    replan_method: str,
    return_weights: bool,
) -> None:
    """Run the segments in order: start each plan's workers and move the job into them
    (:func:`_start_segment`), execute its DAG; a lost worker under ``recover`` replaces the
    remaining segments by the urgent replan's (:func:`_recover`; planned transitions after a
    loss are dropped). Fills ``state``."""
    from .transition import physical_units

    queue = [
        (res, binding, plan.transition_plans[i - 1] if i else None)
        for i, ((res, _), binding) in enumerate(zip(plan.segments, plan.bindings))
    ]
    while queue:
        res, binding, tplan = queue.pop(0)
        ctl = _start_segment(plan, state, res, binding, tplan, progress, transition_method)
        try:
            ctl.execute()
        except RunError:
            if not (plan.cfg.recover and ctl.failure and ctl.failure["lost"]):
                raise
            queue = [_recover(plan, state, ctl, res, progress, replan_method)]
            continue
        state.done.append((ctl, state.offset, res, binding.steps))
        state.running = None
        state.offset += binding.steps
        state.old_steps = binding.steps
        state.alias, state.units = {}, physical_units(res, binding.graph, state.device_base)
    if return_weights and state.current is not None:
        state.weights = state.current.final_weights()


def _start_segment(
    plan: _RunPlan,
    state: _RunState,
    res: Result,
    binding: Binding,
    tplan: Any,
    progress: Callable[[str, dict], None] | None,
    transition_method: str,
) -> Any:
    """Start the workers of the next segment (after the first, on the previous segment's
    placement groups, beside its workers), report ``"setup"``, move the job's state into them
    with ``tplan`` — or, after a device loss (``tplan is None``), a transition planned from the
    intact units — and stop the previous workers; the first segment of a resumed run loads the
    checkpoint. Returns the segment's controller."""
    from ...solvers.transition import plan_transition
    from .controller import Controller
    from .transition import execute_transition, physical_units

    cfg, prev, seg = plan.cfg, state.current, state.segment
    seg_cfg = replace(
        cfg, steps=binding.steps, step_offset=state.offset, fail_at=cfg.fail_at if seg == 0 else None
    )
    binding.version_offset = state.offset - cfg.step_offset  # updates before it in this run
    ctl = Controller(binding, seg_cfg, progress)
    if cfg.checkpoint_dir:
        ctl.on_saved = _manifest_writer(Path(cfg.checkpoint_dir), plan.result)
    state.running = (ctl, res, state.offset)
    state.controllers.append(ctl)
    if prev is None:
        ctl.start(device_base=state.device_base)
    else:
        ctl.start(beside=prev, device_base=state.device_base)
    if progress:
        progress(
            "setup",
            {
                "seconds": ctl.setup_s,
                "groups": len(binding.groups),
                "processes": len(ctl.procs),
                "segment": seg,
                "workers": ctl.workers(),
                "nodes": ctl.placement_nodes(),
            },
        )
    if prev is not None:
        # a new generation replica starts a rollout engine: the transition cost counts the start-up
        # the current plan's engines took (measured), c_engine of costmodel.transition
        engine_s = _engine_start_s(prev)
        if tplan is None:  # after a device loss: from the intact units to the new plan
            tplan = plan_transition(
                state.units,
                physical_units(res, binding.graph, state.device_base),
                plan.result.cluster,
                method=transition_method,
                engine_start=engine_s or 0.0,
            )
        elif engine_s:
            tplan = plan_transition(
                prev.b.result.plan,
                res.plan,
                plan.result.cluster,
                graph=prev.b.graph,
                method=transition_method,
                engine_start=engine_s,
            )
        rec = execute_transition(prev, ctl, tplan, state.offset, state.alias, state.old_steps)
        rec.engine_start_predicted_s = engine_s or 0.0
        rec.engine_start_s = _engine_start_s(ctl) or 0.0
        state.transitions.append(rec)
        if progress:
            progress("transition", rec.to_dict())
        ctl.owns_placement, prev.owns_placement = True, False
        prev.stop()
    state.current = ctl
    state.segment += 1
    if seg == 0 and plan.resume is not None:
        _restore(ctl, plan.resume)
    return ctl


def _engine_start_s(ctl: Any) -> float | None:
    """Longest start-up (seconds) of the rollout engines a controller's workers started — vLLM's
    processes, model load, KV cache and warm-up, measured on the worker — or ``None`` when none
    runs (``rollout_engine="torch"``)."""
    starts = [
        float(r["rollout_engine"]["start_s"])
        for g in ctl.group_info.values()
        for r in g["ranks"]
        if r.get("rollout_engine")
    ]
    return max(starts) if starts else None


def _recover(
    plan: _RunPlan,
    state: _RunState,
    ctl: Any,
    res: Result,
    progress: Callable[[str, dict], None] | None,
    replan_method: str,
) -> tuple[Result, Binding, None]:
    """The urgent path after ``ctl`` lost a worker (:func:`~rpeg.runtime.driver.recovery.urgent_replan`):
    keep the steps completed before the failed one, report ``"recovery"`` and return the
    segment that re-runs the failed step and the rest on the surviving devices."""
    from .recovery import urgent_replan

    cfg = plan.cfg
    rcv = urgent_replan(
        ctl, res, method=replan_method, seed=cfg.seed, accept=lambda r: _accept(r, plan.specs)
    )
    state.recoveries.append(rcv.message)
    if progress:
        progress("recovery", {"message": rcv.message, "lost_devices": rcv.lost_devices})
    if rcv.step > 0:
        state.done.append((ctl, state.offset, res, rcv.step))
    state.running = None
    state.offset += rcv.step
    state.old_steps = rcv.step
    left = cfg.steps - (state.offset - cfg.step_offset)
    state.device_base, state.alias, state.units = rcv.device_base, rcv.alias, rcv.current
    return rcv.target, _bind(rcv.target, left, cfg, plan.specs), None


def _accept(result: Result, specs: dict[str, Any]) -> None:
    """An urgent replan must run the run's model shapes on the engines (``ValueError`` if not)."""
    check_specs(result, specs)
    check_engine_choices(result, moves_state=True)


def _report(plan: _RunPlan, state: _RunState) -> RunReport:
    """Verify each finished segment's trace against its plan, write the trace files and gather
    the figures of every segment into one :class:`RunReport`."""
    from ..trace.verify import verify

    cfg, done = plan.cfg, state.done
    traces, rewards, step_times, predicted_steps, problems, overheads = [], [], [], [], [], []
    for i, (c, off, res, n) in enumerate(done):
        trace, seg_rewards, seg_times, seg_pred = segment_trace(
            c, res, off, plan.hardware, cfg.use_gpu, cfg.address, n
        )
        traces.append(trace)
        rewards += seg_rewards
        step_times += seg_times
        predicted_steps += seg_pred
        found = verify(trace, res)
        problems += [f"segment {i}: {p}" for p in found] if len(done) > 1 else found
        overheads += [max(0.0, (r.end - r.start) - r.worker_time) for r in trace.records]
        if plan.trace_files:
            trace.to_json(_segment_path(Path(plan.trace_files[0]), i))
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
        state.weights,
        traces,
        state.transitions,
        state.recoveries,
    )


def _segment_path(path: Path, i: int) -> Path:
    """Segment ``i``'s trace file: ``path`` itself, then ``<stem>.seg<i><suffix>``."""
    return path if i == 0 else path.with_name(f"{path.stem}.seg{i}{path.suffix}")


def _options(steps: int | None, config: RunConfig | None, options: dict[str, Any]) -> RunConfig:
    """The run's :class:`~rpeg.runtime.config.RunConfig`: ``config`` (or the defaults) with
    ``options`` and ``steps`` replacing its fields, checked once; a name that is no option is a
    ``TypeError`` naming it and the options."""
    if config is not None:
        check_type("config", config, RunConfig, "a RunConfig or None")
    unknown = sorted(set(options) - set(RunConfig.options()))
    if unknown:
        raise TypeError(
            f"run() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"its options are RunConfig's: {', '.join(RunConfig.options())}"
        )
    if steps is not None:
        options = {**options, "steps": steps}
    return replace(config, **options) if config is not None else RunConfig(**options)


def _check_transitions(result: Result, opts: RunConfig) -> None:
    """The transitions' steps and targets, before any work: the same job (state must fit), a
    plan to move to (:func:`_segments`, :func:`~rpeg.runtime.driver.transition.check_compatible`)."""
    _segments(result, opts.steps, opts.transitions)
    if opts.transitions:
        from .transition import check_compatible

        for _, target in opts.transitions:
            check_compatible(result, target)


def _stop_with_trace(
    exc: RunError | RunInterrupted,
    done: list[tuple[Any, int, Result, int]],
    running: tuple[Any, Result, int] | None,
    hw: Hardware,
    use_gpu: bool,
    address: str | None,
    trace_files: list[Path],
) -> None:
    """Write the traces up to the stop (completed segments, then the stopped one with status
    ``"failed"`` for a :class:`RunError`, ``"interrupted"`` for a :class:`RunInterrupted`),
    attach the stopped one to ``exc`` and raise it."""
    traces = []
    for c, off, res, n in done:
        traces.append(segment_trace(c, res, off, hw, use_gpu, address, n)[0])
    if running is not None:
        c, res, off = running
        if isinstance(exc, RunInterrupted):  # a signal names no node: only where the run stood
            exc.step = off + _first_open_step(c)
            failure = {
                "message": str(exc),
                "node": None,
                "step": exc.step - off,
                "vertex": None,
                "worker": None,
                "device": None,
                "lost": False,
            }
            status = "interrupted"
        else:
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
            status = "failed"
        traces.append(segment_trace(c, res, off, hw, use_gpu, address, c.b.steps, failure, status)[0])
    if traces:
        exc.trace = traces[-1]
    if trace_files and traces:
        for i, t in enumerate(traces):
            t.to_json(_segment_path(trace_files[0], i))
        exc.trace_path = str(_segment_path(trace_files[0], len(traces) - 1))
    raise exc


def _first_open_step(ctl: Any) -> int:
    """The first step of ``ctl``'s segment with a node not executed yet (its step count when
    every node ran)."""
    eg = ctl.b.exec_graph
    ran = {r.node for r in ctl.records}
    return min((eg.step[i] for i in range(len(eg)) if i not in ran), default=ctl.b.steps)


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


# ---------------------------------------------------------------------------- checkpoints
def _manifest_writer(root: Path, result: Result) -> Callable[[Any], None]:
    """The controller's ``on_saved`` hook: rewrite ``root/manifest.json`` with every step whose
    training ranks have all written their files (:mod:`rpeg.runtime.trace.checkpoint`)."""
    from ..trace.checkpoint import write_manifest

    digest = plan_hash(result)

    def write(ctl: Any) -> None:
        trainers = [g for g in ctl.b.groups if g.trains]
        want = {f"g{g.gid}-r{r}.pt" for g in trainers for r in range(g.size)}
        complete = {k: files for k, files in ctl.saved.items() if want <= set(files)}
        write_manifest(root, digest, [g.gid for g in trainers], complete)

    return write


def _restore(ctl: Any, resume: Any) -> None:
    """Load the training groups' files of the verified checkpoint step ``resume``
    (:class:`~rpeg.runtime.trace.checkpoint.Resume`) and install those weights on every other group of
    the same model (their version 0 of this run)."""
    b = ctl.b
    loads = [
        ctl.groups[g.gid].rank(r, "load", str(resume.step_dir / f"g{g.gid}-r{r}.pt"))
        for g in b.groups
        if g.trains
        for r in range(g.size)
    ]
    ctl.get(loads, f"loading checkpoint step {resume.global_step} from {str(resume.step_dir)!r}")
    for g in b.groups:
        if g.trains:
            pubs = ctl.groups[g.gid].publish()
            for other in b.groups:
                if other.model == g.model and not other.trains:
                    calls = ctl.groups[other.gid].install(pubs, 0)
                    ctl.get(calls, f"installing the checkpoint's {g.model} weights")
