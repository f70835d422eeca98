"""What every method returns: :class:`Result`, and the ``rpeg.result/2`` file format (SPEC §12).

A result recomputes its figures from its own data: :meth:`Result.from_json` rebuilds workload,
cluster, structure and plan from the file and re-scores the plan with the evaluator, so a file
read back and written again is the same file, and any method's numbers can be re-derived.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ..formulations.status import Status  # the one status vocabulary (re-exported as rpeg.Status)
from ..ir.cluster import Cluster
from ..ir.errors import InputError, Strict, key_hint, read_json, validate
from ..ir.graph import RPEG, Vertex
from ..ir.hardware import Hardware
from ..ir.models import ModelSpec, ModelSpecFile
from ..ir.plan import Choice, Plan, Strategy, check_strategy
from ..ir.templates import Structure, build_graph, structures
from ..ir.types import Recompute, Role
from ..ir.workload import QuantilePair, Workload
from ..scoring.candidates import make_strategy
from ..scoring.evaluator import Evaluation, Evaluator
from .gantt import plot_gantt  # matplotlib itself is imported only when a chart is drawn

__all__ = [
    "FORMAT",
    "PLAN_KEYS",
    "PLAN_STATUSES",
    "Result",
    "Status",
    "check_plan_document",
    "check_structure",
    "plan_from_entries",
    "result_for_plan",
]

FORMAT = "rpeg.result/2"
#: Formats :meth:`Result.from_dict` reads: ``/1`` (before SPEC §14's engine choices; its plan
#: entries read with the defaults: ZeRO-2, the hardware's memory fraction, whole-microbatch
#: logits, packed sequences; its workload with a reward model and ``kl_coef`` 0.01) and ``/2``.
READ_FORMATS = ("rpeg.result/1", FORMAT)
GIB = 2**30
#: The statuses of a method that found a plan; a planless result is ``INFEASIBLE``,
#: ``TIME_LIMIT`` (nothing found in time), ``UNKNOWN`` or ``ERROR``.
PLAN_STATUSES = (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT)


def _count(n: int) -> str:
    """A parameter count for a summary: ``30.5B``, ``125M``, ``393K``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if unit == "B" else f"{n / scale:.0f}{unit}"
    return str(n)


@dataclass
class Result:
    """A plan, its score and how it was found.

    Attributes
    ----------
    workload, cluster, structure
        The problem and the chosen structural candidate.
    graph
        The compact RPEG of that structure.
    plan
        One choice per vertex, or ``None`` when no feasible plan was found.
    evaluation
        The evaluator's verdict on ``plan`` (schedule kept), or ``None``.
    status
        :class:`Status`: ``optimal``, ``feasible`` or ``time_limit`` with a plan; without one
        ``infeasible`` (proven, or none found), ``time_limit`` (none found in time),
        ``unknown`` (the engine could not tell) or ``error`` (the engine failed). A plan given
        by hand that does not fit in memory is ``infeasible`` too (:meth:`scored`).
    method
        Name of the method that produced it.
    runtime_s
        Wall-clock seconds the method took.
    evaluations
        Plan evaluations the method performed.
    k_eval
        Steps unrolled for scoring.
    objective_bound
        Best proven bound on the throughput (exact methods), else ``None``.
    message
        Why the result is infeasible, or notes from the method.
    """

    workload: Workload
    cluster: Cluster
    structure: Structure
    graph: RPEG
    plan: Plan | None
    evaluation: Evaluation | None
    status: Status
    method: str
    runtime_s: float = 0.0
    evaluations: int = 0
    k_eval: int = 8
    objective_bound: float | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def scored(
        cls,
        ev: Evaluator,
        plan: Plan,
        status: Status,
        method: str,
        *,
        runtime_s: float,
        evaluation: Evaluation | None = None,
        evaluations: int | None = None,
        objective_bound: float | None = None,
        message: str = "",
        extra: dict[str, Any] | None = None,
    ) -> Result:
        """The result of a method that found ``plan``, scored by ``ev`` (whose workload,
        cluster, structure, graph and ``k_eval`` it carries).

        Parameters
        ----------
        ev
            The evaluator of the plan's structure.
        plan
            The plan found.
        status
            ``OPTIMAL``, ``FEASIBLE`` or ``TIME_LIMIT`` (a plan is attached); ``INFEASIBLE`` only
            for a plan that does not fit in memory (one given by hand, ``rpeg evaluate``).
        method
            The method's name.
        runtime_s
            Wall-clock seconds the method took.
        evaluation
            ``ev.evaluate(plan, keep=True)`` when the caller has it already (else computed here).
        evaluations
            Plan evaluations the method performed (default ``ev.evaluations``).
        objective_bound, message, extra
            See the class attributes.

        Raises
        ------
        ValueError
            If ``status`` says no plan was found (``UNKNOWN``, ``ERROR``), or ``INFEASIBLE`` for a
            plan that fits.
        """
        if evaluation is None:
            evaluation = ev.evaluate(plan, keep=True)
        if status not in PLAN_STATUSES and not (status is Status.INFEASIBLE and not evaluation.feasible):
            raise ValueError(f"a result with a plan cannot have status {status.value!r}")
        return cls._of(
            ev, plan, evaluation, status, method, runtime_s, evaluations, objective_bound, message, extra
        )

    @classmethod
    def infeasible(
        cls,
        ev: Evaluator,
        method: str,
        message: str,
        *,
        runtime_s: float,
        status: Status = Status.INFEASIBLE,
        evaluations: int | None = None,
        objective_bound: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Result:
        """The result of a method that ended without a plan, ``message`` saying why.

        Parameters
        ----------
        ev
            The evaluator of the structure the method reports (its problem and graph).
        method
            The method's name.
        message
            Why there is no plan (the user reads it).
        runtime_s
            Wall-clock seconds the method took.
        status
            ``INFEASIBLE`` (proven, or none found — the message says which), ``TIME_LIMIT``
            (nothing found in time), ``UNKNOWN`` or ``ERROR``.
        evaluations
            Plan evaluations the method performed (default ``ev.evaluations``).
        objective_bound, extra
            See the class attributes.

        Raises
        ------
        ValueError
            If ``status`` is one that needs a plan.
        """
        if status in (Status.OPTIMAL, Status.FEASIBLE):
            raise ValueError(f"a result without a plan cannot have status {status.value!r}")
        return cls._of(
            ev, None, None, status, method, runtime_s, evaluations, objective_bound, message, extra
        )

    @classmethod
    def _of(
        cls,
        ev: Evaluator,
        plan: Plan | None,
        evaluation: Evaluation | None,
        status: Status,
        method: str,
        runtime_s: float,
        evaluations: int | None,
        objective_bound: float | None,
        message: str,
        extra: dict[str, Any] | None,
    ) -> Result:
        """The one place a Result takes its problem, graph and ``k_eval`` from an evaluator."""
        return cls(
            ev.workload,
            ev.cluster,
            ev.structure,
            ev.graph,
            plan,
            evaluation,
            status,
            method,
            runtime_s,
            ev.evaluations if evaluations is None else evaluations,
            ev.k_eval,
            objective_bound,
            message,
            dict(extra or {}),
        )

    # ------------------------------------------------------------------ figures
    @property
    def feasible(self) -> bool:
        """Whether a memory-feasible plan is present."""
        return self.plan is not None and self.evaluation is not None and self.evaluation.feasible

    @property
    def throughput(self) -> float:
        """Predicted tokens/s, ``Keval·B·R·(Lp+Lr)/MS`` (0 when infeasible)."""
        return self.evaluation.throughput if self.evaluation else 0.0

    @property
    def makespan(self) -> float:
        """Predicted seconds for ``Keval`` steps (``inf`` when infeasible)."""
        return self.evaluation.makespan if self.evaluation else math.inf

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The ``rpeg.result/2`` document (SPEC §12; ``docs/result-format.md``)."""
        g = self.graph
        names = [v.name for v in g.vertices]
        models = {
            m: {
                "layers": inst.spec.layers,
                "hidden": inst.spec.hidden,
                "params": inst.spec.params,
                "active_params": inst.spec.active_params,
                "trainable": inst.trainable,
                "head": inst.head.value,
                "spec": inst.spec.to_dict(),
            }
            for m, inst in g.models.items()
        }
        doc: dict[str, Any] = {
            "format": FORMAT,
            "workload": self.workload.to_dict(),
            "models": models,
            "cluster": self.cluster.to_dict(),
            "structure": self.structure.to_dict(),
            "vertices": [
                {"name": v.name, "role": v.role.value, "model": v.model, "sequences": v.sequences}
                for v in g.vertices
            ],
            "k_eval": self.k_eval,
            "plan": [_plan_entry(v, c) for v, c in zip(g.vertices, self.plan.choices)] if self.plan else [],
            "nodes": [],
            "makespan": None,
            "throughput": 0.0,
            "utilization": 0.0,
            "peak_memory": [],
            "memory_feasible": False,
            "method": self.method,
            "status": self.status.value,
            "objective_bound": self.objective_bound,
            "runtime_s": self.runtime_s,
            "evaluations": self.evaluations,
            "message": self.message,
        }
        ev = self.evaluation
        if ev is not None:
            doc["makespan"] = ev.makespan
            doc["throughput"] = ev.throughput
            doc["utilization"] = ev.utilization
            doc["peak_memory"] = ev.memory.per_device(self.cluster.num_devices)
            doc["memory_feasible"] = ev.memory.feasible
            if ev.graph is not None and ev.schedule is not None:
                doc["nodes"] = _nodes(ev, names, self.cluster)
        if self.extra:
            doc["extra"] = self.extra
        return doc

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise to JSON; also write it to ``path`` when given.

        Raises
        ------
        ValueError
            If a number of the document is NaN or infinite (nothing is written): the format holds
            finite numbers only, and a non-finite time comes from an input out of range or a bug;
            the message names the field and the value.
        """
        doc = self.to_dict()
        try:
            text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
        except ValueError:
            found = _non_finite(doc)
            if found is None:
                raise
            where, value = found
            raise ValueError(
                f"cannot write the result of {self.method!r}: field {where!r} is {value!r}, and a result "
                "file holds finite numbers only (check the hardware and model figures, else report a bug)"
            ) from None
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> Result:
        """Read a result written by :meth:`to_json` (a path or the JSON text) and re-score it.

        Raises
        ------
        InputError
            If the file is missing or not JSON, the document is not ``rpeg.result/1``, or a
            field is missing, malformed or illegal (the message names the file and the field).
        TypeError
            If ``source`` is neither a path nor a string.
        """
        if not isinstance(source, (str, Path)):
            raise TypeError(f"source must be a path or JSON text, got {type(source).__name__}")
        text = str(source)
        if isinstance(source, str) and text.lstrip().startswith("{"):
            try:
                doc = json.loads(text, parse_constant=_no_json_constant)
            except ValueError as exc:
                raise InputError(f"result JSON text: not valid JSON ({exc})") from None
            return cls.from_dict(doc, source="result JSON text")
        return cls.from_dict(read_json(source, "result file"), source=str(source))

    @classmethod
    def from_dict(cls, doc: Any, source: str = "result") -> Result:
        """Inverse of :meth:`to_dict` (re-scores the plan).

        Raises
        ------
        InputError
            If the document fails the ``rpeg.result/1`` schema or its plan is illegal; the
            message starts with ``source``.
        """
        fmt = doc.get("format") if isinstance(doc, dict) else None
        if fmt not in READ_FORMATS:
            raise InputError(
                f"{source}: field 'format' must be one of {', '.join(map(repr, READ_FORMATS))}, got {fmt!r}",
                source=source,
                field="format",
            )
        checked = validate(_ResultFile, doc, source)
        workload, cluster, structure = _problem(checked, source)
        ev = Evaluator(workload, cluster, structure, k_eval=checked.k_eval)
        try:
            plan = plan_from_entries(ev, doc["plan"]) if checked.plan else None
        except ValueError as exc:
            raise InputError(f"{source}: {exc}", source=source, field="plan") from None
        extra = dict(doc.get("extra", {}))
        try:
            evaluation = (
                ev.evaluate(plan, keep=True, starts=_followed_starts(extra, source))
                if plan is not None
                else None
            )
        except ValueError as exc:  # the starts do not cover this plan's lowering
            raise InputError(
                f"{source}: field 'extra.model_starts': {exc}", source=source, field="extra"
            ) from None
        return cls(
            workload=workload,
            cluster=cluster,
            structure=structure,
            graph=ev.graph,
            plan=plan,
            evaluation=evaluation,
            status=Status(checked.status),
            method=checked.method,
            runtime_s=checked.runtime_s,
            evaluations=checked.evaluations,
            k_eval=checked.k_eval,
            objective_bound=checked.objective_bound,
            message=checked.message,
            extra=extra,
        )

    # ------------------------------------------------------------------ chart
    def gantt(self, path: str | Path, **kwargs: Any) -> Path:
        """Draw the predicted schedule as a Gantt chart and save it to ``path``.

        Delegates to :func:`rpeg.solvers.gantt.plot_gantt` (keywords ``title``, ``max_devices``).

        Returns
        -------
        pathlib.Path
            The file written.

        Raises
        ------
        ValueError
            If the result has no plan or schedule (infeasible).
        """
        return plot_gantt(self, path, **kwargs)

    # ------------------------------------------------------------------ text
    def _models_line(self) -> str:
        """``models`` line of :meth:`summary`: each model's name and parameters; a mixture of
        experts also its active parameters, experts per token and load imbalance ``λ``, latent
        attention said, a
        sliding window's width and layers, and a precision other than BF16."""
        parts = []
        for m, inst in self.graph.models.items():
            spec = inst.spec
            text = f"{m} {spec.name} {_count(spec.params)}"
            if spec.is_moe:
                text += (
                    f" ({_count(spec.active_params)} active: {spec.experts_active} of {spec.experts} "
                    f"experts per token, load imbalance {spec.load_imbalance:g})"
                )
            if spec.is_mla:
                text += " latent attention"
            if spec.is_windowed:
                text += f" {spec.sliding_window}-token window on {len(spec.sliding_layers)} of {spec.layers} layers"
            if spec.has_mxfp4_experts:
                text += " MXFP4 experts in generation"
            elif spec.precision != "bf16":
                text += f" {spec.precision.upper()} GEMMs"
            parts.append(text)
        return "models     " + "; ".join(parts)

    def _cluster_line(self) -> str:
        """``cluster`` line of :meth:`summary`: shape, hardware, GPUs and their memory, and on
        hardware with a rollout engine step (the GPU presets) whether that engine schedules
        asynchronously (vLLM's default: its host seconds per step hidden behind the GPU's) or
        on the synchronous loop (docs/cost-model.md §8, "The engine step")."""
        hw = self.cluster.hardware
        text = (
            f"cluster    {self.cluster.shape_str} × {hw.name} "
            f"({self.cluster.num_devices} GPUs, {hw.gpu_memory_bytes / GIB:.1f} GiB each"
        )
        if hw.rollout_step is not None:
            loop = "asynchronous scheduling" if hw.rollout_step.async_scheduling else "synchronous loop"
            text += f"; rollout engine: {loop}"
        return text + ")"

    def summary(self) -> str:
        """A readable report: the workload, its models (parameters; a mixture of experts also
        its active parameters and experts per token), throughput, makespan, peak memory vs
        capacity, and per invocation
        its allocation, ``(dp, pp, tp)``, ``mb``, tokens per microbatch (``tok/mb``), the engine
        choices (SPEC §14: recomputation and ZeRO stage, loss chunking, padding, a rollout
        engine's memory fraction) and time; without a plan, a headline saying
        why (``NO FEASIBLE PLAN``, or ``NO PLAN`` with the engine's ``unknown``/``error``) and
        the message."""
        lines = [
            f"workload   {self.workload.name} ({self.workload.algorithm}, B={self.workload.batch}, "
            f"R={self.workload.rollouts}, Lp={self.workload.prompt_len}, Lr={self.workload.response_len})",
            self._models_line(),
            self._cluster_line(),
            f"method     {self.method}   status {self.status.value}   "
            f"{self.runtime_s:.2f} s, {self.evaluations} evaluations",
            f"structure  {self.structure.label}",
        ]
        if self.plan is None or self.evaluation is None:
            lines.append(f"{_NO_PLAN.get(self.status, 'NO FEASIBLE PLAN')}: {self.message}")
            return "\n".join(lines)
        ev = self.evaluation
        mem = ev.memory
        lines += [
            f"throughput {ev.throughput:,.0f} tokens/s (predicted)",
            f"makespan   {ev.makespan:.3f} s for {self.k_eval} steps ({ev.makespan / self.k_eval:.3f} s/step)",
            f"utilization {ev.utilization:.1%}",
            f"peak mem   {mem.max_peak / GIB:.1f} GiB of M_eff {mem.m_eff / GIB:.1f} GiB per GPU "
            f"({mem.ratio:.0%}) — {'fits' if mem.feasible else 'DOES NOT FIT'}",
        ]
        x = self.extra
        if "list_makespan" in x and "model_makespan" in x:  # an exact method: which schedule is this
            which = "the model's order" if x.get("schedule") == "model" else "EST-first list"
            lines.append(
                f"schedule   {which} (model {x['model_makespan']:.3f} s, EST-first list {x['list_makespan']:.3f} s)"
            )
        if self.objective_bound is not None:
            lines.append(f"bound      {self.objective_bound:,.0f} tokens/s")
        if self.message:
            lines.append(f"note       {self.message}")
        lines.append("")
        width = max([16, *(len(_degrees(c.strategy)) for c in self.plan.choices)])
        header = (
            f"{'invocation':<20} {'role':<10} {'GPUs':>5} {'allocation (origin+extent)':<28} "
            f"{'(dp,pp,tp) split':<{width}} {'mb':>4} {'tok/mb':>7} {'engine choices':<26} {'time/step s':>11}"
        )
        lines.append(header)
        lines.append("-" * len(header))
        times = _per_vertex_time(ev, len(self.graph.vertices), self.k_eval)
        for i, (v, c) in enumerate(zip(self.graph.vertices, self.plan.choices)):
            a, s = c.allocation, c.strategy
            alloc = f"{list(a.origin)}+{list(a.extent)}"
            lines.append(
                f"{v.name:<20} {v.role.value:<10} {a.size:>5} {alloc:<28} "
                f"{_degrees(s):<{width}} {s.mb:>4} {_tokens_per_mb(self.workload, v, s):>7} "
                f"{_engine_choices(self.cluster, v, s):<26} {times[i]:>11.3f}"
            )
        return "\n".join(lines)


def _non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The path (``"nodes[3].finish"``) and value of the first NaN or infinity in ``value``, or
    ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(top level)", value
    items: Any = ()
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    for path, item in items:
        found = _non_finite(item, path)
        if found is not None:
            return found
    return None


def _degrees(s: Strategy) -> str:
    """The summary's degrees: ``(dp,pp,tp)``, the interleaved pipeline's ``vp=…`` and SPEC
    §15's splits when set — ``sp``,
    ``cp=… ring|ulysses``, ``ep=…``, ``etp=…``, ``a2a-overlap``, ``flex``."""
    words = [f"({s.dp},{s.pp},{s.tp})"]
    if s.vp > 1:
        words.append(f"vp={s.vp}")
    if s.sp:
        words.append("sp")
    if s.cp > 1:
        words.append(f"cp={s.cp} {s.cp_kind}")
    if s.ep > 1:
        words.append(f"ep={s.ep}")
    if s.etp is not None:
        words.append(f"etp={s.etp}")
    if s.ep_overlap:
        words.append("a2a-overlap")
    if s.flex_dispatch:
        words.append("flex")
    return " ".join(words)


def _tokens_per_mb(workload: Workload, vertex: Vertex, s: Strategy) -> str:
    """``T_mb = B_local·ℓ/mb`` tokens per microbatch and data-parallel rank (SPEC §14.2; ``ℓ``
    the mean packed length, or ``Lp + Lr`` padded), ``-`` for a generation."""
    if vertex.role is Role.GENERATION:
        return "-"
    ell = workload.prompt_len + (workload.mean_response if s.packing else workload.response_len)
    return f"{vertex.sequences / (s.dp * s.mb) * ell:,.0f}"


def _engine_choices(cluster: Cluster, vertex: Vertex, s: Strategy) -> str:
    """The summary's words for a strategy's engine choices (SPEC §14): recomputation and ZeRO
    stage of a trainer, the ZeRO stage of a forward pass, the memory fraction of a rollout
    engine, loss chunking, padding and host offload (a rollout engine's: ``sleeps``)."""
    if vertex.role is Role.GENERATION:
        u = s.mem_fraction or cluster.hardware.kv_memory_fraction
        return f"kv u={u:g}" + (" sleeps" if s.offload else "")
    words = [f"rc={s.recompute.value}"] if vertex.role is Role.TRAINING else []
    words.append(f"zero-{s.zero}" if s.zero != 2 or vertex.role is Role.TRAINING else "replicated")
    if s.logits_chunk:
        words.append(f"chunk={s.logits_chunk}")
    if not s.packing:
        words.append("padded")
    if s.offload:
        words.append("offload")
    return " ".join(words)


#: The headline of a planless summary, by status (``infeasible``, ``time_limit``: no feasible plan).
_NO_PLAN = {
    Status.UNKNOWN: "NO PLAN (the engine ended with status unknown)",
    Status.ERROR: "NO PLAN (the engine failed)",
}


def _per_vertex_time(ev: Evaluation, n: int, k_eval: int) -> list[float]:
    """Mean OP seconds per step of each vertex (phases summed)."""
    out = [0.0] * n
    g = ev.graph
    if g is None:
        return out
    for i in range(len(g.kind)):
        if g.kind[i] == 0:
            out[g.vertex[i]] += g.duration[i]
    return [t / k_eval for t in out]


def _nodes(ev: Evaluation, names: list[str], cluster: Cluster) -> list[dict[str, Any]]:
    g, s = ev.graph, ev.schedule
    assert g is not None and s is not None
    dev_cache: dict[int, list[int]] = {}
    out = []
    for i in range(len(g.kind)):
        m = g.mask[i]
        devs = dev_cache.get(m)
        if devs is None:
            devs = dev_cache[m] = [d for d in range(cluster.num_devices) if m >> d & 1]
        node: dict[str, Any] = {
            "id": i,
            "kind": g.kind_of(i).value,
            "vertex": names[g.vertex[i]],
            "step": g.step[i],
            "phase": g.phase[i],
            "devices": devs,
            "start": s.start[i],
            "finish": s.finish[i],
            "preds": list(g.preds[i]),
        }
        if g.kind[i]:
            node["source"] = names[g.source[i]]
            node["bytes"] = g.nbytes[i]
        out.append(node)
    return out


# ---------------------------------------------------------------------------- the JSON file
# The blocks a reader rebuilds the problem from (workload, cluster, structure, and each plan
# entry: plan_from_entries) are checked strictly: exact types, no NaN, and no unknown key (a
# misspelt one would read as its default). The top level ignores keys rpeg does not read (the
# figures it re-derives, and what later versions add), as docs/result-format.md says.
class _Read(Strict):
    model_config = ConfigDict(extra="ignore")


class _WorkloadBlock(Strict):
    name: str = "workload"
    algorithm: Literal["ppo", "grpo", "remax", "dpo"]
    B: Annotated[int, Field(ge=1)]
    R: Annotated[int, Field(ge=1)]
    Lp: Annotated[int, Field(ge=1)]
    Lr: Annotated[int, Field(ge=1)]
    quantiles: Annotated[list[QuantilePair], Field(min_length=1)]
    models: dict[Literal["actor", "critic", "reward", "reference"], ModelSpecFile]
    staleness_choices: dict[str, Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]] = Field(
        default_factory=dict
    )
    ac_sharing_allowed: bool = True
    reward: Literal["model", "rule"] = "model"
    reward_cost_s: Annotated[float, Field(ge=0)] = 0.0
    kl_coef: Annotated[float, Field(ge=0)] | None = None
    old_logprob: Literal["rollout", "trainer"] = "rollout"
    mini_batches: Annotated[int, Field(ge=1)] = 1


class _ClusterBlock(Strict):
    racks: Annotated[int, Field(ge=1)]
    nodes_per_rack: Annotated[int, Field(ge=1)]
    gpus_per_node: Annotated[int, Field(ge=1)]
    hardware: dict[str, Any]
    # copies of cluster.hardware's figures for checkers that read no hardware block; they must agree
    gpu_memory_bytes: float | None = None
    memory_headroom: float | None = None
    generation_max_pp: Annotated[int, Field(ge=1)] | None = None
    max_zero_stage: Literal[1, 2, 3] | None = None
    host_offload: bool = True
    sequence_parallel: bool = True
    context_parallel: bool = True
    expert_parallel: bool = True
    virtual_pipeline_parallel: bool = True
    expert_overlap: bool = True
    flex_dispatch: bool = True


class _StructureBlock(Strict):
    algorithm: Literal["ppo", "grpo", "remax", "dpo"]
    ac_sharing: bool
    staleness: dict[Literal["actor", "critic", "actor_critic"], Annotated[int, Field(ge=0)]]


class _ResultFile(_Read):
    """What :meth:`Result.from_dict` reads of an ``rpeg.result/1`` document."""

    format: Literal["rpeg.result/1", "rpeg.result/2"]
    workload: _WorkloadBlock
    cluster: _ClusterBlock
    structure: _StructureBlock
    k_eval: Annotated[int, Field(ge=1)]
    plan: list[dict[str, Any]]
    status: Literal["optimal", "feasible", "time_limit", "infeasible", "unknown", "error"]
    method: str
    runtime_s: Annotated[float, Field(ge=0)] = 0.0
    evaluations: Annotated[int, Field(ge=0)] = 0
    objective_bound: float | None = None
    message: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)


def _no_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _followed_starts(extra: dict[str, Any], source: str) -> dict[tuple, float] | None:
    """The exact model's starts a result's schedule follows (``extra.schedule == "model"``,
    ``extra.model_starts``; :func:`rpeg.solvers.exact._follow_model`), else ``None``.

    Raises
    ------
    InputError
        ``model_starts`` is not a list of ``[kind, vertex, source, step, phase, start]``.
    """
    if extra.get("schedule") != "model":
        return None
    rows = extra.get("model_starts")
    ok = isinstance(rows, list) and all(
        isinstance(r, list)
        and len(r) == 6
        and all(isinstance(x, int) and not isinstance(x, bool) for x in r[:5])
        and isinstance(r[5], (int, float))
        and not isinstance(r[5], bool)
        for r in rows
    )
    if not ok:
        raise InputError(
            f"{source}: field 'extra.model_starts' must be a list of [kind, vertex, source, step, phase, start] "
            f"when extra.schedule is 'model'",
            source=source,
            field="extra.model_starts",
        )
    return {tuple(r[:5]): float(r[5]) for r in rows}


def _problem(doc: _ResultFile, source: str) -> tuple[Workload, Cluster, Structure]:
    w = doc.workload
    try:
        models = {role: ModelSpec(**spec.model_dump()) for role, spec in w.models.items()}
        workload = Workload(
            algorithm=w.algorithm,
            models=models,
            batch=w.B,
            rollouts=w.R,
            prompt_len=w.Lp,
            response_len=w.Lr,
            quantiles=tuple(w.quantiles),
            staleness={k: tuple(v) for k, v in w.staleness_choices.items()},
            ac_sharing=w.ac_sharing_allowed,
            name=w.name,
            reward=w.reward,
            reward_cost_s=w.reward_cost_s,
            kl_coef=w.kl_coef,
            old_logprob=w.old_logprob,
            mini_batches=w.mini_batches,
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: field 'workload': {exc}", source=source, field="workload") from None
    c = doc.cluster
    hw = Hardware.from_dict(c.hardware, source=f"{source}: cluster.hardware")
    for key in ("gpu_memory_bytes", "memory_headroom"):
        given, figure = getattr(c, key), getattr(hw, key)
        if given is not None and given != figure:
            raise InputError(
                f"{source}: field 'cluster.{key}' is {given!r} but cluster.hardware.{key} is {figure!r}; "
                "the first is a copy for checkers, the scorer reads cluster.hardware: edit both",
                source=source,
                field=f"cluster.{key}",
            )
    try:
        cluster = Cluster(
            c.racks,
            c.nodes_per_rack,
            c.gpus_per_node,
            hw,
            c.generation_max_pp,
            c.max_zero_stage,
            c.host_offload,
            c.sequence_parallel,
            c.context_parallel,
            c.expert_parallel,
            c.virtual_pipeline_parallel,
            c.expert_overlap,
            c.flex_dispatch,
        )
    except ValueError as exc:
        raise InputError(f"{source}: field 'cluster': {exc}", source=source, field="cluster") from None
    st = doc.structure
    # keep the graph's own trainable-model order for a stable label
    order = [m for m in ("actor", "actor_critic", "critic") if m in st.staleness]
    structure = Structure(st.algorithm, st.ac_sharing, tuple((m, st.staleness[m]) for m in order))
    try:
        build_graph(workload, structure)
        check_structure(workload, structure)
    except ValueError as exc:
        raise InputError(f"{source}: field 'structure': {exc}", source=source, field="structure") from None
    return workload, cluster, structure


def check_structure(workload: Workload, structure: Structure) -> None:
    """Refuse a structure the workload does not allow: one of its candidates ``Ycand``
    (:func:`~rpeg.ir.templates.structures`: sharing only where allowed, each ``τ(m)`` among the
    workload's staleness choices) or the synchronous one the baselines plan (no sharing, ``τ = 0``).
    The result builder (:func:`result_for_plan`) and the reader (:meth:`Result.from_dict`) both
    apply it.

    Raises
    ------
    ValueError
        Naming the field (``structure.staleness.actor``), its value and what the workload allows.
    """
    if structure.tau == Structure.synchronous(workload).tau and not structure.ac_sharing:
        return
    if any(y.ac_sharing == structure.ac_sharing and y.tau == structure.tau for y in structures(workload)):
        return
    if structure.ac_sharing and not workload.can_share_actor_critic:
        raise ValueError(
            "structure.ac_sharing is true, but the workload does not allow actor-critic sharing "
            "(ac_sharing_allowed is false, or actor and critic differ)"
        )
    stale = workload.staleness
    for m, t in structure.staleness:
        if m == "actor_critic":
            allowed = sorted(set(stale["actor"]) & set(stale["critic"])) or list(stale["actor"])
            where = "both staleness_choices.actor and staleness_choices.critic"
        else:
            allowed, where = list(stale.get(m, ())), f"staleness_choices.{m}"
        if t not in allowed:
            raise ValueError(
                f"structure.staleness.{m} is {t!r}, but the workload allows {allowed} ({where}; "
                "0 everywhere, the synchronous structure, is always allowed)"
            )
    raise ValueError(f"structure {structure.label!r} is not one the workload allows")


def problem_from_dict(doc: dict[str, Any], source: str = "result") -> tuple[Workload, Cluster, Structure]:
    """Rebuild workload, cluster and structure from a result document.

    Raises
    ------
    InputError
        If a block fails the ``rpeg.result/1`` schema; the message names ``source`` and the field.
    """
    return _problem(validate(_ResultFile, doc, source), source)


class _PlanDocument(_Read):
    """What ``rpeg evaluate --plan`` reads: a result file, or a hand-written document with its
    ``plan`` and any of the blocks. A block that is absent is not compared; one that is present
    (``null`` included: the ``None`` defaults are never validated) is checked as in a result file."""

    workload: _WorkloadBlock = None  # type: ignore[assignment]
    cluster: _ClusterBlock = None  # type: ignore[assignment]
    structure: _StructureBlock = None  # type: ignore[assignment]
    plan: list[Any]


def check_plan_document(doc: Any, source: str) -> dict[str, Any]:
    """``doc`` if every block it holds has the form of a result file's (a ``plan`` list, and the
    ``workload``, ``cluster`` and ``structure`` blocks where present), before anything compares
    them with the problem asked for.

    Raises
    ------
    InputError
        Naming ``source``, the field and the value (``"workload": null``, ``"cluster": "1x1x4"``).
    """
    validate(_PlanDocument, doc, source)
    return doc


def plan_from_entries(ev: Evaluator, entries: list[dict[str, Any]]) -> Plan:
    """Build and validate a :class:`Plan` from ``plan`` entries of a result document.

    Every entry is checked against P1–P8 and the cluster's device space; a key that is not one of
    :data:`PLAN_KEYS` is an error (a misspelt ``"recomput"`` would otherwise read as the default).

    Raises
    ------
    ValueError
        Naming the vertex and the offending field when an entry is missing, unknown or illegal.
    """
    g = ev.graph
    by_name = {}
    if not isinstance(entries, list):
        raise ValueError(f"plan must be a list of entries, got {type(entries).__name__}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"plan[{i}] must be an object with a 'vertex' field, got {e!r}")
        name = e.get("vertex")
        unknown = [str(k) for k in e if k not in PLAN_KEYS]
        if unknown:
            which = f"plan entry for {name!r}" if isinstance(name, str) else f"plan[{i}]"
            raise ValueError(f"{which}: unknown key {unknown[0]!r}{key_hint(unknown[0], PLAN_KEYS)}")
        if not isinstance(name, str) or name not in g.index:
            raise ValueError(f"plan[{i}]: unknown vertex {name!r}; the graph has {', '.join(g.index)}")
        if name in by_name:
            raise ValueError(f"plan[{i}]: a second entry for vertex {name!r}")
        by_name[name] = e
    missing = [v.name for v in g.vertices if v.name not in by_name]
    if missing:
        raise ValueError(f"plan: no entry for vertex(es) {', '.join(missing)}")
    choices = []
    for v in g.vertices:
        e = by_name[v.name]
        for key in ("origin", "extent", "dp", "pp", "tp", "mb"):
            if key not in e:
                raise ValueError(f"plan entry for {v.name!r}: missing field {key!r}")
        origin = _int_triple(e["origin"], v.name, "origin")
        extent = _int_triple(e["extent"], v.name, "extent")
        dp, pp, tp, mb = (_int_field(e[k], v.name, k) for k in ("dp", "pp", "tp", "mb"))
        recompute = _recompute_field(e.get("recompute"), v)
        engine = _typed_fields(e, v, _ENGINE_FIELDS)
        parallel = _typed_fields(e, v, _PARALLEL_FIELDS)
        try:
            alloc = ev.cluster.allocation(origin, extent)
        except ValueError as exc:
            raise ValueError(f"plan entry for {v.name!r}: {exc}") from None
        strategy = _legal_strategy(ev, v, extent, dp, pp, tp, mb, recompute, engine, parallel)
        choices.append(Choice(strategy, alloc))
    return Plan(tuple(choices))


def _legal_strategy(
    ev: Evaluator,
    v: Vertex,
    extent: tuple[int, int, int],
    dp: int,
    pp: int,
    tp: int,
    mb: int,
    recompute: Recompute,
    engine: dict[str, Any],
    parallel: dict[str, Any] | None = None,
) -> Strategy:
    """The strategy of one plan entry after the one legality check every reader and builder
    applies (:func:`~rpeg.ir.plan.check_strategy`: P1–P8, H1–H2, Z1–Z4, S1, C1–C3, E1–E5, V1–V3);
    ``parallel`` holds SPEC §15's ``cp``, ``cp_kind``, ``ep``, ``sp`` and ``etp`` and the interleaving ``vp``.

    Raises
    ------
    ValueError
        Naming the vertex and the rule it breaks.
    """
    spec = ev.graph.models[v.model].spec
    parallel = parallel or {}
    why = check_strategy(
        ev.cluster,
        spec,
        v.role,
        v.sequences,
        extent,
        dp,
        pp,
        tp,
        mb,
        **engine,
        **parallel,
        recompute=recompute,
    )
    if why:
        raise ValueError(f"plan entry for {v.name!r} is illegal: {why}")
    base = make_strategy(ev.cluster, extent, dp, pp, tp, mb, recompute, **parallel)
    return base.variant(**engine) if engine else base


#: The engine fields of a plan entry (SPEC §14) with their types and defaults (a ``/1`` entry
#: has none of them).
_ENGINE_FIELDS: dict[str, tuple[type, Any]] = {
    "zero": (int, 2),
    "mem_fraction": (float, 0.0),
    "logits_chunk": (int, 0),
    "packing": (bool, True),
    "offload": (bool, False),
}

#: SPEC §15's parallelisms of a plan entry with their types and defaults (files written before
#: them have none: no context, expert or sequence parallelism).
_PARALLEL_FIELDS: dict[str, tuple[type, Any]] = {
    "cp": (int, 1),
    "cp_kind": (str, "ring"),
    "ep": (int, 1),
    "sp": (bool, False),
    "vp": (int, 1),
    "etp": (int, None),
    "ep_overlap": (bool, False),
    "flex_dispatch": (bool, False),
}

#: The keys of a ``plan`` entry (:func:`_plan_entry` writes them all; a ``/1`` entry lacks the
#: engine fields, an older one ``recompute``).
PLAN_KEYS: tuple[str, ...] = (
    "vertex",
    "origin",
    "extent",
    "dp",
    "pp",
    "tp",
    "mb",
    "recompute",
    *_ENGINE_FIELDS,
    *_PARALLEL_FIELDS,
)


def _typed_fields(
    entry: dict[str, Any], vertex: Vertex, fields: dict[str, tuple[type, Any]]
) -> dict[str, Any]:
    """The ``fields`` of a plan entry — the engine choices (``zero``, ``mem_fraction``,
    ``logits_chunk``, ``packing``, ``offload``: :data:`_ENGINE_FIELDS`) or the parallelisms
    (``cp``, ``cp_kind``, ``ep``, ``sp``: :data:`_PARALLEL_FIELDS`) — each absent or ``null``
    read as its default; a wrong type is an error."""
    out = {}
    for key, (kind, default) in fields.items():
        value = entry.get(key)
        if value is None:
            out[key] = default
            continue
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is str:
            ok = isinstance(value, str)
        else:
            ok = not isinstance(value, bool) and isinstance(value, (kind, int))
        if not ok:
            raise ValueError(
                f"plan entry for {vertex.name!r}: field {key!r} must be {kind.__name__}, got {value!r}"
            )
        out[key] = value
    return out


def _plan_entry(vertex: Vertex, choice: Choice) -> dict[str, Any]:
    """A ``plan`` entry: :meth:`Choice.to_dict` plus ``recompute`` — the training invocation's
    mode, ``null`` for the others (they have no backward pass) — and the engine choices of
    SPEC §14 (``zero``, ``mem_fraction``, ``logits_chunk``, ``packing``, ``offload``) and the
    parallelisms of SPEC §15 (``cp``, ``cp_kind``, ``ep``, ``sp``)."""
    s = choice.strategy
    entry = choice.to_dict(vertex.name)
    entry["recompute"] = s.recompute.value if vertex.role is Role.TRAINING else None
    entry["zero"] = s.zero
    entry["mem_fraction"] = s.mem_fraction
    entry["logits_chunk"] = s.logits_chunk
    entry["packing"] = s.packing
    entry["offload"] = s.offload
    entry["cp"] = s.cp
    entry["cp_kind"] = s.cp_kind
    entry["ep"] = s.ep
    entry["sp"] = s.sp
    entry["vp"] = s.vp
    entry["etp"] = s.etp
    entry["ep_overlap"] = s.ep_overlap
    entry["flex_dispatch"] = s.flex_dispatch
    return entry


def _recompute_field(value: Any, vertex: Vertex) -> Recompute:
    """The ``recompute`` of a plan entry: for a training vertex ``"none"``, ``"selective"`` or
    ``"full"``, and absent or ``null`` reads as ``"full"`` (files written before the field,
    whose cost model always recomputed in full); for any other vertex absent or ``null``."""
    if vertex.role is not Role.TRAINING:
        if value is not None:
            raise ValueError(
                f"plan entry for {vertex.name!r}: field 'recompute' must be null for a "
                f"{vertex.role.value} invocation (only training recomputes), got {value!r}"
            )
        return Recompute.FULL
    if value is None:
        return Recompute.FULL
    if not isinstance(value, str) or value not in {m.value for m in Recompute}:
        known = ", ".join(repr(m.value) for m in Recompute)
        raise ValueError(
            f"plan entry for {vertex.name!r}: field 'recompute' must be one of {known}, got {value!r}"
        )
    return Recompute(value)


def _int_field(value: Any, vertex: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"plan entry for {vertex!r}: field {key!r} must be an integer, got {value!r}")
    return value


def _int_triple(value: Any, vertex: str, key: str) -> tuple[int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(
            f"plan entry for {vertex!r}: field {key!r} must be 3 integers [r, n, g], got {value!r}"
        )
    return tuple(_int_field(x, vertex, key) for x in value)  # type: ignore[return-value]


def result_for_plan(
    workload: Workload,
    cluster: Cluster,
    structure: Structure,
    table: dict[str, tuple],
    *,
    k_eval: int = 3,
    method: str = "hand",
) -> Result:
    """A scored :class:`Result` for a plan written by hand.

    Parameters
    ----------
    workload, cluster, structure
        The problem.
    table
        Per vertex name ``(origin, extent, dp, pp, tp, mb)`` with ``origin``/``extent`` as
        ``(r, n, g)`` triples, optionally followed by a training vertex's recomputation mode
        (``"none"``, ``"selective"``, ``"full"``; default ``"full"``; ``None`` for any other
        vertex) and a mapping of engine choices (``zero``, ``mem_fraction``, ``logits_chunk``,
        ``packing``, ``offload``; SPEC §14) and parallelisms (``cp``, ``cp_kind``, ``ep``,
        ``sp``; SPEC §15).
    k_eval
        Steps to unroll when scoring.
    method
        Label for the result.

    Raises
    ------
    ValueError
        A vertex missing from ``table`` or unknown to the graph (named), a malformed entry or
        engine choice, an illegal allocation, a structure the workload does not allow
        (:func:`check_structure`), or an entry breaking a rule of
        :func:`~rpeg.ir.plan.check_strategy` — the same checks that read the result file back
        (:meth:`Result.from_dict`, :func:`plan_from_entries`), so whatever this builds, a reader
        accepts.
    """
    ev = Evaluator(workload, cluster, structure, k_eval=k_eval)
    check_structure(workload, ev.structure)
    g = ev.graph
    unknown = [str(k) for k in table if k not in g.index]
    if unknown:
        raise ValueError(f"table: unknown vertex {unknown[0]!r}; the graph has {', '.join(g.index)}")
    choices = []
    for v in g.vertices:
        if v.name not in table:
            raise ValueError(f"table has no entry for vertex {v.name!r}")
        row = table[v.name]
        if not isinstance(row, (tuple, list)) or not 6 <= len(row) <= 8:
            raise ValueError(
                f"table entry for {v.name!r} must be (origin, extent, dp, pp, tp, mb[, recompute[, "
                f"engine choices]]), got {row!r}"
            )
        origin = _int_triple(row[0], v.name, "origin")
        extent = _int_triple(row[1], v.name, "extent")
        dp, pp, tp, mb = (_int_field(x, v.name, k) for x, k in zip(row[2:6], ("dp", "pp", "tp", "mb")))
        recompute = _recompute_field(row[6] if len(row) > 6 else None, v)
        choices_of = dict(row[7]) if len(row) > 7 else {}
        known = (*_ENGINE_FIELDS, *_PARALLEL_FIELDS)
        bad = [str(k) for k in choices_of if k not in known]
        if bad:
            raise ValueError(
                f"table entry for {v.name!r}: unknown engine choice {bad[0]!r}{key_hint(bad[0], known)}"
            )
        engine = _typed_fields(choices_of, v, _ENGINE_FIELDS)
        parallel = _typed_fields(choices_of, v, _PARALLEL_FIELDS)
        strategy = _legal_strategy(ev, v, extent, dp, pp, tp, mb, recompute, engine, parallel)
        try:
            alloc = cluster.allocation(origin, extent)
        except ValueError as exc:
            raise ValueError(f"table entry for {v.name!r}: {exc}") from None
        choices.append(Choice(strategy, alloc))
    plan = Plan(tuple(choices))
    evaluation = ev.evaluate(plan, keep=True)
    status = Status.FEASIBLE if evaluation.feasible else Status.INFEASIBLE
    return Result.scored(ev, plan, status, method, runtime_s=0.0, evaluation=evaluation, evaluations=0)
