"""Elastic Model Units, the four state primitives and the transition DAG (SPEC §10, Nereus §5–§6).

A **model-stage** ``M = (model, stage)`` is one model in one stage (``Gen``, ``Inf`` or ``Train``,
from the vertex role). An **EMU** is one replica of a model-stage:
``⟨M, T = tp×pp, R (|R| = tp·pp, in rank order), θ, ω⟩``. Its state is never sharded across data
parallelism, so the DP degree of ``M`` is its number of EMUs and every EMU holds a full logical
copy: parameters ``θ`` of ``N_m·sb`` bytes (the RPEG weight container ``W_m``) and, for training,
optimizer state ``ω`` of ``12·N_m`` bytes (FP32 master weights and two Adam moments). Per GPU a
unit holds ``(N_m·sb + [train]·12·N_m)/(tp·pp)`` bytes.

Primitives (each a frozen dataclass that knows its byte volume, GPU sets and memory need):

* :class:`Split` ``(U, T_sub) → {U_1..U_k}``: one unit becomes ``k = |T|/|T_sub|`` replicas with
  the smaller layout on the same GPUs (consecutive rank blocks of ``|T_sub|`` GPUs); every GPU
  gathers its larger shard, ``|θ+ω|/|T_sub|`` bytes, from a group of ``k`` ranks (AllGather);
* :class:`Merge` ``({U_1..U_k}, T) → U′``: ``k`` replicas become one unit with the larger layout
  on the union of their GPUs; each GPU already holds a superset of its new shard (the runtime
  assigns target ranks so that shards nest), so nothing crosses a link;
* :class:`Extend` ``(U, R′) → {U, U′}``: a copy on new disjoint GPUs, rank ``i`` of ``U`` sending
  its shard to rank ``i`` of ``U′`` (rank-aligned broadcast); the only primitive that acquires GPUs;
* :class:`Destroy` ``(U) → ∅``: drops a redundant replica and releases its GPUs; never the last copy.

:func:`plan_diff` pairs the current and target EMU collections per model-stage and
:func:`transition_dag` compiles the difference into the global transition DAG:

1. **Local DAG** per model-stage, in the order Split → Destroy → Extend → Merge through the
   largest common layout ``T_sub = (gcd(tp, tp*), gcd(pp, pp*))``. Units are aligned contiguous
   device ranges, so the ``|T_sub|``-blocks of the current and target units either coincide or are
   disjoint: a sub-unit on a target block is kept, the others are destroyed, the missing target
   blocks are filled by Extend (a binomial broadcast tree: each copy can serve as a source once it
   exists), and Merge assembles each target unit. When no sub-unit is kept, one *anchor* sub-unit
   (preferably one on GPUs no other model-stage wants) is destroyed only after the Extends it
   feeds, so a copy of the state exists at every prefix of the DAG.
2. **Global DAG**: the union of the local DAGs plus *resource edges*. A GPU's owners may change
   only from the current owners to the target owners: an Extend of ``M`` onto GPU ``g`` waits for
   the Destroy that releases ``g`` from every model-stage that holds ``g`` now and not in the
   target. Such an edge is added only if the Destroy does not itself depend on the blocked
   Extend; otherwise the target is infeasible (:class:`TransitionInfeasible` names the blocked and
   the blocking model-stages and the GPUs). Extends are processed in stage order Gen → Inf → Train.

Scheduling (release-before-acquire, per-GPU exclusivity and memory) is left to
:mod:`rpeg.heuristics.transition` and the exact models; costs to :mod:`rpeg.costmodel.transition`.

The package's rooms: :mod:`.units` (model-stages, EMUs and the EMU collection of a plan),
:mod:`.primitives` (Split, Merge, Extend, Destroy) and :mod:`.dag` (plan diffs, the transition
DAG and its builder). Import from the package: ``from rpeg.ir.emu import EMU, transition_dag``.
"""

from .dag import StageDiff, TransitionDAG, TransitionInfeasible, plan_diff, transition_dag
from .primitives import Destroy, Extend, Merge, Primitive, Split
from .units import EMU, OPTIMIZER_BYTES_PER_PARAM, ModelStage, Stage, emus_of

__all__ = [
    "EMU",
    "OPTIMIZER_BYTES_PER_PARAM",
    "Destroy",
    "Extend",
    "Merge",
    "ModelStage",
    "Primitive",
    "Split",
    "Stage",
    "StageDiff",
    "TransitionDAG",
    "TransitionInfeasible",
    "emus_of",
    "plan_diff",
    "transition_dag",
]
