"""The RPEG plan search (SPEC §8) built from small pluggable pieces: acceptance rules,
temperature schedules, move kernels, budgets, and the annealing driver."""

from .acceptance import Acceptance, Greedy, Metropolis
from .anneal import (
    ABLATIONS,
    T_INIT,
    T_WARM,
    Anneal,
    MoveWeights,
    Outcome,
    Raw,
    SearchSpace,
    default_moves,
    evaluate_raw,
    halving_rounds,
)
from .moves import Move, MoveContext, PairMove, SingleMove, SplitMove, VariantMove
from .parallel import ProcessEvaluator
from .stop import Budget
from .temperature import Constant, Geometric, Temperature

__all__ = [
    "ABLATIONS",
    "T_INIT",
    "T_WARM",
    "Acceptance",
    "Anneal",
    "Budget",
    "Constant",
    "Geometric",
    "Greedy",
    "Metropolis",
    "Move",
    "MoveContext",
    "MoveWeights",
    "Outcome",
    "PairMove",
    "ProcessEvaluator",
    "Raw",
    "SearchSpace",
    "SingleMove",
    "SplitMove",
    "Temperature",
    "VariantMove",
    "default_moves",
    "evaluate_raw",
    "halving_rounds",
]
