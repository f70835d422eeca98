"""Elastic Model Units, the four state primitives and the transition DAG (SPEC §10, Nereus §5–§6).

The package's rooms, each documenting its part:

* :mod:`.units` — model-stages ``M = (model, stage)``, EMUs (one replica of a model-stage with
  its layout, GPUs, parameters and optimizer state) and the EMU collection of a plan;
* :mod:`.primitives` — Split, Merge, Extend, Destroy, each with its byte volume, GPU sets and
  memory need;
* :mod:`.dag` — plan diffs per model-stage and the global transition DAG with its resource edges;
* :mod:`.flat` — the same DAG as index tables, built by a compiled (numba) core, which the cost
  model and the greedy scheduler read.

Scheduling is :mod:`rpeg.heuristics.transition`'s and the exact models'; costs are
:mod:`rpeg.costmodel.transition`'s. Import from the package:
``from rpeg.ir.emu import EMU, transition_dag``.
"""

from .dag import (
    StageDiff,
    TransitionDAG,
    TransitionInfeasible,
    plan_diff,
    transition_dag,
    transition_dag_of_plans,
    transition_dag_reference,
)
from .primitives import Destroy, Extend, Merge, Primitive, Split
from .units import EMU, OPTIMIZER_BYTES_PER_PARAM, ModelStage, Stage, emus_of, plan_vertices

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
    "plan_vertices",
    "transition_dag",
    "transition_dag_of_plans",
    "transition_dag_reference",
]
